//! Amazon EKS, as the `aws-sdk-eks` client sees it (REST-JSON): clusters that take
//! minutes to become ACTIVE and to go away, access entries and access policies, add-ons
//! with their own transitions and a version catalogue, pod identity associations, and
//! managed node groups (in `nodegroups`). Inputs are checked the way EKS checks them
//! (names, versions, subnets in two zones, a role that exists — asked of moto) and
//! refused with EKS's error codes.

use std::collections::BTreeMap;

use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Json, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::clock::reached;
use crate::moto::distinct_zones;
use crate::world::{ACCOUNT, Aws, AwsError, Phase, Shared, fnv1a, fnv1a_extend, region_of};

/// Simulated seconds each transition takes (AWS's typical figures).
pub const CLUSTER_CREATE_SECS: f64 = 600.0;
pub const CLUSTER_DELETE_SECS: f64 = 300.0;
pub const ADDON_CREATE_SECS: f64 = 60.0;
pub const ADDON_UPDATE_SECS: f64 = 45.0;
pub const ADDON_DELETE_SECS: f64 = 30.0;

pub const KUBERNETES_VERSIONS: &[&str] = &["1.30", "1.31", "1.32", "1.33", "1.34"];
pub const DEFAULT_KUBERNETES_VERSION: &str = "1.33";

/// The add-on catalogue: name, versions (newest first), and the default.
pub const ADDONS: &[(&str, &[&str])] = &[
    ("vpc-cni", &["v1.20.4-eksbuild.1", "v1.19.6-eksbuild.1"]),
    ("coredns", &["v1.12.2-eksbuild.4", "v1.11.4-eksbuild.14"]),
    ("kube-proxy", &["v1.33.3-eksbuild.4", "v1.32.6-eksbuild.8"]),
    (
        "eks-pod-identity-agent",
        &["v1.3.8-eksbuild.2", "v1.3.7-eksbuild.2"],
    ),
    (
        "aws-mountpoint-s3-csi-driver",
        &["v2.1.0-eksbuild.1", "v1.15.0-eksbuild.1"],
    ),
    (
        "aws-fsx-csi-driver",
        &["v1.6.0-eksbuild.1", "v1.5.0-eksbuild.1"],
    ),
    (
        "cert-manager",
        &["v1.18.2-eksbuild.2", "v1.17.2-eksbuild.1"],
    ),
    (
        "metrics-server",
        &["v0.8.0-eksbuild.2", "v0.7.2-eksbuild.4"],
    ),
    (
        "amazon-cloudwatch-observability",
        &["v4.3.0-eksbuild.1", "v4.2.0-eksbuild.1"],
    ),
    (
        "amazon-sagemaker-hyperpod-training-operator",
        &["v1.1.0-eksbuild.1", "v1.0.1-eksbuild.1"],
    ),
    (
        "amazon-sagemaker-hyperpod-inference",
        &["v1.0.0-eksbuild.1"],
    ),
    (
        "amazon-sagemaker-hyperpod-taskgovernance",
        &["v1.2.0-eksbuild.1", "v1.1.2-eksbuild.1"],
    ),
];

#[derive(Clone, Debug)]
struct Transition {
    /// Simulated second the current phase started.
    since: f64,
    phase: Phase,
}

#[derive(Clone, Debug)]
pub struct Cluster {
    name: String,
    region: String,
    version: String,
    role_arn: String,
    subnet_ids: Vec<String>,
    security_group_ids: Vec<String>,
    vpc_id: String,
    authentication_mode: String,
    endpoint_public: bool,
    endpoint_private: bool,
    tags: Value,
    created: f64,
    transition: Option<Transition>,
    /// The health issue (code, message) its creation ends FAILED with, if it does.
    failure: Option<(String, String)>,
    oidc_id: String,
    access_entries: BTreeMap<String, AccessEntry>,
    addons: BTreeMap<String, Addon>,
    pod_identities: BTreeMap<String, PodIdentity>,
}

#[derive(Clone, Debug)]
struct PodIdentity {
    id: String,
    namespace: String,
    service_account: String,
    role_arn: String,
    created: f64,
    modified: f64,
}

#[derive(Clone, Debug)]
struct AccessEntry {
    principal_arn: String,
    kind: String,
    username: String,
    groups: Vec<String>,
    created: f64,
    modified: f64,
    policies: BTreeMap<String, (Value, f64)>,
}

#[derive(Clone, Debug)]
struct Addon {
    name: String,
    version: String,
    service_account_role_arn: Option<String>,
    configuration_values: Option<String>,
    created: f64,
    modified: f64,
    transition: Option<Transition>,
    tags: Value,
}

#[derive(Default)]
pub struct Eks {
    clusters: BTreeMap<String, Cluster>,
    updates: u64,
    associations: u64,
    nodegroups: BTreeMap<(String, String), nodegroups::Nodegroup>,
}

/// EKS's word for a cluster's, add-on's or node group's status in `t` (none: ACTIVE).
fn status_word(t: &Option<Transition>) -> &'static str {
    match t.as_ref().map(|t| t.phase) {
        Some(Phase::Creating) => "CREATING",
        Some(Phase::Updating) => "UPDATING",
        Some(Phase::Deleting) => "DELETING",
        None => "ACTIVE",
    }
}

impl Eks {
    /// A fresh id for an Update* call's `update`, unique across clusters as AWS's are.
    fn next_update_id(&mut self) -> String {
        self.updates += 1;
        format!("{:08x}-0000-4000-8000-{:012x}", self.updates, self.updates)
    }
}

/// EKS's rule for cluster and node group names: 1 to `max` alphanumerics, hyphens and
/// underscores, starting with an alphanumeric; `what` starts the message as AWS's does.
fn check_name(what: &str, name: &str, max: usize) -> Result<(), AwsError> {
    let ok = (1..=max).contains(&name.len())
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if ok {
        Ok(())
    } else {
        Err(AwsError::invalid_parameter(format!(
            "{what} {name:?} is invalid: it must be 1-{max} characters, start with an alphanumeric character and contain only alphanumeric characters, hyphens and underscores"
        )))
    }
}

/// A resource's status now, given its transition and whether a stuck fault holds it.
fn phase_status(
    t: &Option<Transition>,
    now: f64,
    secs: impl Fn(Phase) -> f64,
    stuck: bool,
) -> Option<Phase> {
    let t = t.as_ref()?;
    (stuck || !reached(now, t.since + secs(t.phase))).then_some(t.phase)
}

fn hex_id(seed: &str, len: usize) -> String {
    // Deterministic per name, like an id AWS would hand out once; each further 16 digits
    // hash the seed again with what came before, so longer ids do not repeat themselves.
    let mut h = fnv1a("");
    let mut out = String::new();
    while out.len() < len {
        h = fnv1a_extend(fnv1a_extend(h, seed.as_bytes()), out.as_bytes());
        out.push_str(&format!("{h:016X}"));
    }
    out.truncate(len);
    out
}

impl Aws {
    /// Forgets EKS cluster `name` at once, with its node groups, every HyperPod cluster
    /// it orchestrates and its API server, as if it had been deleted long ago; whether
    /// it existed. For tests sharing one world: a case done with its cluster takes it out
    /// of every later controller pass and listing.
    pub fn forget_eks_cluster(&mut self, name: &str) -> bool {
        let existed = self.eks.clusters.remove(name).is_some();
        self.eks
            .nodegroups
            .retain(|(cluster, _), _| cluster != name);
        self.sagemaker.forget_on_eks(name);
        self.kube.stop(name);
        existed
    }

    /// Applies the finished transitions of cluster `name` and its add-ons: a finished
    /// deletion takes the cluster and its API server away. Only the cluster read or
    /// changed is settled, so a call costs the same however many clusters there are.
    fn settle_eks(&mut self, name: &str) {
        let now = self.clock.now();
        let stuck_create = self.stuck("eks", "CreateCluster");
        let stuck_delete = self.stuck("eks", "DeleteCluster");
        let stuck_addon = self.stuck("eks", "CreateAddon") || self.stuck("eks", "UpdateAddon");
        let stuck_addon_delete = self.stuck("eks", "DeleteAddon");
        let Some(c) = self.eks.clusters.get_mut(name) else {
            return;
        };
        let gone = matches!(&c.transition, Some(t) if t.phase == Phase::Deleting)
            && phase_status(&c.transition, now, |_| CLUSTER_DELETE_SECS, stuck_delete).is_none();
        if gone {
            self.eks.clusters.remove(name);
            self.kube.stop(name);
            return;
        }
        if let Some(t) = &c.transition
            && t.phase == Phase::Creating
            && phase_status(&c.transition, now, |_| CLUSTER_CREATE_SECS, stuck_create).is_none()
        {
            c.transition = None;
        }
        c.addons.retain(|_, a| {
            !(matches!(&a.transition, Some(t) if t.phase == Phase::Deleting)
                && phase_status(
                    &a.transition,
                    now,
                    |_| ADDON_DELETE_SECS,
                    stuck_addon_delete,
                )
                .is_none())
        });
        for a in c.addons.values_mut() {
            let secs = |p| {
                if p == Phase::Creating {
                    ADDON_CREATE_SECS
                } else {
                    ADDON_UPDATE_SECS
                }
            };
            if matches!(&a.transition, Some(t) if t.phase != Phase::Deleting)
                && phase_status(&a.transition, now, secs, stuck_addon).is_none()
            {
                a.transition = None;
            }
        }
    }

    fn cluster(&mut self, name: &str) -> Result<&mut Cluster, AwsError> {
        self.settle_eks(name);
        self.eks
            .clusters
            .get_mut(name)
            .ok_or_else(|| AwsError::not_found(format!("No cluster found for name: {name}.")))
    }

    /// The ACTIVE add-ons of a cluster, for the Kubernetes emulator's workloads.
    pub fn eks_active_addons(&mut self, name: &str) -> Vec<String> {
        self.cluster(name)
            .map(|c| {
                c.addons
                    .values()
                    .filter(|a| a.transition.is_none())
                    .map(|a| a.name.clone())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The configuration (`configurationValues`, parsed) of add-on `addon`, if it has one.
    pub fn eks_addon_configuration(&mut self, name: &str, addon: &str) -> Option<Value> {
        let c = self.cluster(name).ok()?;
        let values = c.addons.get(addon)?.configuration_values.as_deref()?;
        serde_json::from_str(values).ok()
    }

    /// For other services (HyperPod) that need an ACTIVE EKS cluster.
    pub fn eks_cluster_active(&mut self, name: &str) -> bool {
        self.cluster(name).is_ok_and(|c| c.active())
    }

    fn active_cluster(&mut self, name: &str) -> Result<&mut Cluster, AwsError> {
        let c = self.cluster(name)?;
        if !c.active() {
            return Err(AwsError::new(
                400,
                "InvalidRequestException",
                format!("Cluster {name} is not ACTIVE; wait until it is"),
            ));
        }
        Ok(c)
    }
}

impl Cluster {
    fn arn(&self) -> String {
        format!(
            "arn:aws:eks:{}:{ACCOUNT}:cluster/{}",
            self.region, self.name
        )
    }

    fn status(&self) -> &'static str {
        match (&self.transition, &self.failure) {
            (None, Some(_)) => "FAILED",
            (t, _) => status_word(t),
        }
    }

    /// ACTIVE: created, and not failed.
    fn active(&self) -> bool {
        self.transition.is_none() && self.failure.is_none()
    }

    fn to_json(&self, w: &Aws) -> Value {
        let issuer = format!(
            "https://oidc.eks.{}.amazonaws.com/id/{}",
            self.region, self.oidc_id
        );
        // The cluster's own Kubernetes API server (see `kube`), revealed once ACTIVE.
        let (endpoint, ca) = w.kube.connection(&self.name).unzip();
        let active = self.active();
        let issues: Vec<Value> = self
            .failure
            .iter()
            .filter(|_| self.transition.is_none())
            .map(|(code, message)| json!({ "code": code, "message": message, "resourceIds": [] }))
            .collect();
        json!({
            "name": self.name,
            "arn": self.arn(),
            "createdAt": w.clock.epoch(self.created),
            "version": self.version,
            "endpoint": if active { endpoint } else { None },
            "roleArn": self.role_arn,
            "resourcesVpcConfig": {
                "subnetIds": self.subnet_ids,
                "securityGroupIds": self.security_group_ids,
                "vpcId": self.vpc_id,
                "endpointPublicAccess": self.endpoint_public,
                "endpointPrivateAccess": self.endpoint_private,
                "publicAccessCidrs": ["0.0.0.0/0"]
            },
            "kubernetesNetworkConfig": { "serviceIpv4Cidr": "172.20.0.0/16", "ipFamily": "ipv4" },
            "identity": { "oidc": { "issuer": issuer } },
            "status": self.status(),
            "certificateAuthority": if active { json!({ "data": ca }) } else { json!({}) },
            "platformVersion": "eks.1",
            "accessConfig": { "authenticationMode": self.authentication_mode },
            "health": { "issues": issues },
            "tags": self.tags,
        })
    }
}

impl AccessEntry {
    fn to_json(&self, cluster: &Cluster, w: &Aws) -> Value {
        json!({
            "clusterName": cluster.name,
            "principalArn": self.principal_arn,
            "kubernetesGroups": self.groups,
            "accessEntryArn": format!(
                "arn:aws:eks:{}:{ACCOUNT}:access-entry/{}/{}",
                cluster.region, cluster.name, hex_id(&self.principal_arn, 16).to_lowercase()
            ),
            "createdAt": w.clock.epoch(self.created),
            "modifiedAt": w.clock.epoch(self.modified),
            "tags": {},
            "username": self.username,
            "type": self.kind,
        })
    }
}

impl Addon {
    fn status(&self) -> &'static str {
        status_word(&self.transition)
    }

    fn to_json(&self, cluster: &Cluster, w: &Aws) -> Value {
        json!({
            "addonName": self.name,
            "clusterName": cluster.name,
            "status": self.status(),
            "addonVersion": self.version,
            "health": { "issues": [] },
            "addonArn": format!(
                "arn:aws:eks:{}:{ACCOUNT}:addon/{}/{}/{}",
                cluster.region, cluster.name, self.name, hex_id(&self.name, 8).to_lowercase()
            ),
            "createdAt": w.clock.epoch(self.created),
            "modifiedAt": w.clock.epoch(self.modified),
            "serviceAccountRoleArn": self.service_account_role_arn,
            "configurationValues": self.configuration_values,
            "tags": self.tags,
        })
    }
}

/// Runs a handler body with EKS and SageMaker locked, after any injected fault for `op`: a
/// refusal answers instead of the body, a lost answer after it.
macro_rules! call {
    ($state:expr, $op:literal, |$w:ident| $body:expr) => {{
        let fault = crate::world::injected(&$state, "eks", $op).await;
        let mut guard = $state.aws.lock().await;
        let $w: &mut Aws = &mut guard;
        let lost = matches!(fault, Some(crate::world::FaultKind::Lost));
        match fault.filter(|_| !lost).and_then(crate::world::aws_error) {
            Some(e) => e.into_response(),
            None => {
                // Stands in for a try block: `?` and `return` stay inside the body.
                #[allow(clippy::redundant_closure_call)]
                let result = (|| -> Result<Value, AwsError> { $body })();
                match (result, lost) {
                    (_, true) => crate::world::aws_error(crate::world::FaultKind::Lost)
                        .map(IntoResponse::into_response)
                        .unwrap_or_default(),
                    (Ok(v), false) => Json(v).into_response(),
                    (Err(e), false) => e.into_response(),
                }
            }
        }
    }};
}

// Declared after `call!` so the node group handlers can use it.
mod nodegroups;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct CreateClusterBody {
    name: String,
    version: Option<String>,
    role_arn: String,
    resources_vpc_config: VpcConfig,
    access_config: Option<AccessConfig>,
    #[serde(default)]
    tags: Value,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct VpcConfig {
    #[serde(default)]
    subnet_ids: Vec<String>,
    #[serde(default)]
    security_group_ids: Vec<String>,
    endpoint_public_access: Option<bool>,
    endpoint_private_access: Option<bool>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct AccessConfig {
    authentication_mode: Option<String>,
}

async fn create_cluster(
    State(state): State<Shared>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let region = region_of(&headers);
    let body: CreateClusterBody = match serde_json::from_slice(&body) {
        Ok(b) => b,
        Err(e) => {
            return AwsError::invalid_parameter(format!("invalid request: {e}")).into_response();
        }
    };
    // moto is asked outside the lock; the answers are checked again under it.
    let moto = state.moto.clone();
    let checked = async {
        check_name("The cluster name", &body.name, 100)?;
        let version = body
            .version
            .clone()
            .unwrap_or_else(|| DEFAULT_KUBERNETES_VERSION.to_owned());
        if !KUBERNETES_VERSIONS.contains(&version.as_str()) {
            return Err(AwsError::invalid_parameter(format!(
                "unsupported Kubernetes version {version}. Supported versions: {}",
                KUBERNETES_VERSIONS.join(", ")
            )));
        }
        let mode = body
            .access_config
            .as_ref()
            .and_then(|a| a.authentication_mode.clone())
            .unwrap_or_else(|| "CONFIG_MAP".to_owned());
        if !["API", "API_AND_CONFIG_MAP", "CONFIG_MAP"].contains(&mode.as_str()) {
            return Err(AwsError::invalid_parameter(format!(
                "invalid authenticationMode {mode}"
            )));
        }
        let vpc = &body.resources_vpc_config;
        if vpc.subnet_ids.len() < 2 {
            return Err(AwsError::invalid_parameter(
                "Subnets specified must be in at least two different AZs",
            ));
        }
        let mut vpc_id = String::new();
        if let Some(moto) = &moto {
            let subnets = moto.subnets(&region, &vpc.subnet_ids).await?;
            if distinct_zones(&subnets) < 2 {
                return Err(AwsError::invalid_parameter(
                    "Subnets specified must be in at least two different AZs",
                ));
            }
            vpc_id = subnets[0].vpc_id.clone();
            if subnets.iter().any(|s| s.vpc_id != vpc_id) {
                return Err(AwsError::invalid_parameter(
                    "Subnets must all be in the same VPC",
                ));
            }
            if !moto.role_exists(&region, &body.role_arn).await? {
                return Err(AwsError::invalid_parameter(format!(
                    "Role with arn: {}, does not exist",
                    body.role_arn
                )));
            }
        }
        Ok((version, mode, vpc_id))
    }
    .await;
    call!(state, "CreateCluster", |w| {
        let (version, mode, vpc_id) = checked?;
        w.settle_eks(&body.name);
        if w.eks.clusters.contains_key(&body.name) {
            return Err(AwsError::in_use(format!(
                "Cluster already exists with name: {}",
                body.name
            )));
        }
        let now = w.clock.now();
        let vpc = body.resources_vpc_config;
        let cluster = Cluster {
            oidc_id: hex_id(&format!("{region}/{}/{now}", body.name), 32),
            name: body.name.clone(),
            region,
            version,
            role_arn: body.role_arn,
            subnet_ids: vpc.subnet_ids,
            security_group_ids: vpc.security_group_ids,
            vpc_id,
            authentication_mode: mode,
            endpoint_public: vpc.endpoint_public_access.unwrap_or(true),
            endpoint_private: vpc.endpoint_private_access.unwrap_or(false),
            tags: if body.tags.is_object() {
                body.tags
            } else {
                json!({})
            },
            created: now,
            transition: Some(Transition {
                since: now,
                phase: Phase::Creating,
            }),
            failure: w.failing("eks", "CreateCluster"),
            access_entries: BTreeMap::new(),
            addons: BTreeMap::new(),
            pod_identities: BTreeMap::new(),
        };
        let epoch = w.clock.epoch(now);
        w.kube
            .start(
                &body.name,
                &cluster.version,
                &cluster.region,
                state.clone(),
                epoch,
            )
            .map_err(|e| AwsError::new(500, "ServerException", e))?;
        let out = json!({ "cluster": cluster.to_json(w) });
        w.eks.clusters.insert(body.name, cluster);
        Ok(out)
    })
}

async fn describe_cluster(State(state): State<Shared>, Path(name): Path<String>) -> Response {
    call!(state, "DescribeCluster", |w| {
        let c = w.cluster(&name)?.clone();
        Ok(json!({ "cluster": c.to_json(w) }))
    })
}

async fn list_clusters(State(state): State<Shared>, headers: HeaderMap) -> Response {
    let region = region_of(&headers);
    call!(state, "ListClusters", |w| {
        let listed: Vec<String> = w
            .eks
            .clusters
            .values()
            .filter(|c| c.region == region)
            .map(|c| c.name.clone())
            .collect();
        for name in &listed {
            w.settle_eks(name);
        }
        let names: Vec<&String> = w
            .eks
            .clusters
            .values()
            .filter(|c| c.region == region)
            .map(|c| &c.name)
            .collect();
        Ok(json!({ "clusters": names }))
    })
}

async fn delete_cluster(State(state): State<Shared>, Path(name): Path<String>) -> Response {
    call!(state, "DeleteCluster", |w| {
        let now = w.clock.now();
        let c = w.cluster(&name)?;
        if c.transition
            .as_ref()
            .is_some_and(|t| t.phase == Phase::Creating)
        {
            return Err(AwsError::in_use(format!(
                "Cannot delete because cluster {name} currently has an update in progress"
            )));
        }
        if w.has_nodegroups(&name) {
            return Err(AwsError::in_use(format!(
                "Cluster has nodegroups attached: delete the nodegroups of {name} first"
            )));
        }
        let c = w.cluster(&name)?;
        if !c.addons.is_empty() && c.addons.values().any(|a| a.transition.is_some()) {
            return Err(AwsError::in_use(format!(
                "Cluster {name} has add-ons in transition"
            )));
        }
        c.transition = Some(Transition {
            since: now,
            phase: Phase::Deleting,
        });
        let c = c.clone();
        // Its controllers learn when the deletion is over, and stop its server then.
        w.kube.wake(&name);
        Ok(json!({ "cluster": c.to_json(w) }))
    })
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct CreateAccessEntryBody {
    principal_arn: String,
    #[serde(default)]
    kubernetes_groups: Vec<String>,
    username: Option<String>,
    #[serde(rename = "type")]
    kind: Option<String>,
}

async fn create_access_entry(
    State(state): State<Shared>,
    Path(name): Path<String>,
    Json(body): Json<CreateAccessEntryBody>,
) -> Response {
    call!(state, "CreateAccessEntry", |w| {
        let now = w.clock.now();
        let c = w.active_cluster(&name)?;
        if c.authentication_mode == "CONFIG_MAP" {
            return Err(AwsError::invalid_parameter(
                "The cluster's authentication mode must be set to one of [API, API_AND_CONFIG_MAP] to perform this operation.",
            ));
        }
        if !body.principal_arn.starts_with("arn:aws:iam::") {
            return Err(AwsError::invalid_parameter(format!(
                "The specified principalArn is invalid: {}",
                body.principal_arn
            )));
        }
        if c.access_entries.contains_key(&body.principal_arn) {
            return Err(AwsError::in_use(format!(
                "The specified access entry resource is already in use on this cluster: {}",
                body.principal_arn
            )));
        }
        let entry = AccessEntry {
            username: body.username.unwrap_or_else(|| body.principal_arn.clone()),
            principal_arn: body.principal_arn.clone(),
            kind: body.kind.unwrap_or_else(|| "STANDARD".to_owned()),
            groups: body.kubernetes_groups,
            created: now,
            modified: now,
            policies: BTreeMap::new(),
        };
        c.access_entries.insert(body.principal_arn, entry.clone());
        let c = c.clone();
        Ok(json!({ "accessEntry": entry.to_json(&c, w) }))
    })
}

async fn list_access_entries(State(state): State<Shared>, Path(name): Path<String>) -> Response {
    call!(state, "ListAccessEntries", |w| {
        let c = w.cluster(&name)?;
        Ok(json!({ "accessEntries": c.access_entries.keys().collect::<Vec<_>>() }))
    })
}

fn entry<'a>(c: &'a mut Cluster, principal: &str) -> Result<&'a mut AccessEntry, AwsError> {
    c.access_entries.get_mut(principal).ok_or_else(|| {
        AwsError::not_found(format!(
            "The specified access entry resource could not be found: {principal}"
        ))
    })
}

async fn describe_access_entry(
    State(state): State<Shared>,
    Path((name, principal)): Path<(String, String)>,
) -> Response {
    call!(state, "DescribeAccessEntry", |w| {
        let c = w.cluster(&name)?;
        let e = entry(c, &principal)?.clone();
        let c = c.clone();
        Ok(json!({ "accessEntry": e.to_json(&c, w) }))
    })
}

async fn delete_access_entry(
    State(state): State<Shared>,
    Path((name, principal)): Path<(String, String)>,
) -> Response {
    call!(state, "DeleteAccessEntry", |w| {
        let c = w.cluster(&name)?;
        entry(c, &principal)?;
        c.access_entries.remove(&principal);
        Ok(json!({}))
    })
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct AssociateBody {
    policy_arn: String,
    access_scope: Value,
}

async fn associate_access_policy(
    State(state): State<Shared>,
    Path((name, principal)): Path<(String, String)>,
    Json(body): Json<AssociateBody>,
) -> Response {
    call!(state, "AssociateAccessPolicy", |w| {
        let now = w.clock.now();
        if !body
            .policy_arn
            .starts_with("arn:aws:eks::aws:cluster-access-policy/")
        {
            return Err(AwsError::invalid_parameter(format!(
                "The specified policyArn is invalid: {}",
                body.policy_arn
            )));
        }
        let scope_type = body
            .access_scope
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if !["cluster", "namespace"].contains(&scope_type) {
            return Err(AwsError::invalid_parameter(
                "accessScope.type must be cluster or namespace",
            ));
        }
        let c = w.cluster(&name)?;
        let e = entry(c, &principal)?;
        e.policies
            .insert(body.policy_arn.clone(), (body.access_scope.clone(), now));
        e.modified = now;
        let epoch = w.clock.epoch(now);
        Ok(json!({
            "clusterName": name,
            "principalArn": principal,
            "associatedAccessPolicy": {
                "policyArn": body.policy_arn,
                "accessScope": body.access_scope,
                "associatedAt": epoch,
                "modifiedAt": epoch,
            }
        }))
    })
}

async fn list_associated_access_policies(
    State(state): State<Shared>,
    Path((name, principal)): Path<(String, String)>,
) -> Response {
    call!(state, "ListAssociatedAccessPolicies", |w| {
        let c = w.cluster(&name)?;
        let e = entry(c, &principal)?.clone();
        let policies: Vec<Value> = e
            .policies
            .iter()
            .map(|(arn, (scope, at))| {
                json!({ "policyArn": arn, "accessScope": scope, "associatedAt": w.clock.epoch(*at), "modifiedAt": w.clock.epoch(*at) })
            })
            .collect();
        Ok(
            json!({ "clusterName": name, "principalArn": principal, "associatedAccessPolicies": policies }),
        )
    })
}

async fn disassociate_access_policy(
    State(state): State<Shared>,
    Path((name, principal, policy)): Path<(String, String, String)>,
) -> Response {
    call!(state, "DisassociateAccessPolicy", |w| {
        let c = w.cluster(&name)?;
        let e = entry(c, &principal)?;
        if e.policies.remove(&policy).is_none() {
            return Err(AwsError::not_found(format!(
                "The access policy {policy} is not associated with {principal}"
            )));
        }
        Ok(json!({}))
    })
}

/// The top-level keys of the inference operator add-on's configuration schema, and those
/// it requires (AWS's Helm-to-add-on migration script sets exactly these).
const INFERENCE_CONFIGURATION: &[&str] = &[
    "executionRoleArn",
    "tlsCertificateS3Bucket",
    "hyperpodClusterArn",
    "jumpstartGatedModelDownloadRoleArn",
    "alb",
    "keda",
];
const INFERENCE_REQUIRED: &[&str] = &[
    "executionRoleArn",
    "tlsCertificateS3Bucket",
    "hyperpodClusterArn",
];

/// `configurationValues` checked as EKS checks them against the add-on's JSON schema:
/// a JSON object, and for the inference operator (whose schema the sim knows) only its
/// keys, with the required ones present. Other add-ons' schemas are not modelled.
fn check_configuration(addon: &str, values: Option<&str>) -> Result<(), AwsError> {
    let Some(values) = values else {
        return Ok(());
    };
    let refuse = |why: String| {
        AwsError::invalid_parameter(format!(
            "ConfigurationValue provided in request is not supported: Json schema validation failed with error: [{why}]"
        ))
    };
    let parsed: Value =
        serde_json::from_str(values).map_err(|e| refuse(format!("$: is not valid JSON ({e})")))?;
    let Some(object) = parsed.as_object() else {
        return Err(refuse("$: object expected".to_owned()));
    };
    if addon == "amazon-sagemaker-hyperpod-inference" {
        if let Some(k) = object
            .keys()
            .find(|k| !INFERENCE_CONFIGURATION.contains(&k.as_str()))
        {
            return Err(refuse(format!(
                "$.{k}: is not defined in the schema and the schema does not allow additional properties"
            )));
        }
        if let Some(k) = INFERENCE_REQUIRED
            .iter()
            .find(|k| !object.contains_key(**k))
        {
            return Err(refuse(format!("$.{k}: is missing but it is required")));
        }
    }
    Ok(())
}

fn addon_versions(name: &str) -> Option<&'static [&'static str]> {
    ADDONS.iter().find(|(n, _)| *n == name).map(|(_, v)| *v)
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct CreateAddonBody {
    addon_name: String,
    addon_version: Option<String>,
    service_account_role_arn: Option<String>,
    configuration_values: Option<String>,
    #[serde(default)]
    tags: Value,
}

async fn create_addon(
    State(state): State<Shared>,
    Path(name): Path<String>,
    Json(body): Json<CreateAddonBody>,
) -> Response {
    call!(state, "CreateAddon", |w| {
        let now = w.clock.now();
        let c = w.active_cluster(&name)?;
        let Some(versions) = addon_versions(&body.addon_name) else {
            return Err(AwsError::invalid_parameter(format!(
                "Addon {} specified is not supported in {} kubernetes version",
                body.addon_name, c.version
            )));
        };
        let version = body.addon_version.unwrap_or_else(|| versions[0].to_owned());
        if !versions.contains(&version.as_str()) {
            return Err(AwsError::invalid_parameter(format!(
                "Addon version specified is not supported: {version} (supported: {})",
                versions.join(", ")
            )));
        }
        check_configuration(&body.addon_name, body.configuration_values.as_deref())?;
        if c.addons.contains_key(&body.addon_name) {
            return Err(AwsError::in_use(format!(
                "Addon already exists: {}",
                body.addon_name
            )));
        }
        let addon = Addon {
            name: body.addon_name.clone(),
            version,
            service_account_role_arn: body.service_account_role_arn,
            configuration_values: body.configuration_values,
            created: now,
            modified: now,
            transition: Some(Transition {
                since: now,
                phase: Phase::Creating,
            }),
            tags: if body.tags.is_object() {
                body.tags
            } else {
                json!({})
            },
        };
        c.addons.insert(body.addon_name, addon.clone());
        let c = c.clone();
        w.kube.wake(&name);
        Ok(json!({ "addon": addon.to_json(&c, w) }))
    })
}

fn addon<'a>(c: &'a mut Cluster, name: &str) -> Result<&'a mut Addon, AwsError> {
    let cluster = c.name.clone();
    c.addons
        .get_mut(name)
        .ok_or_else(|| AwsError::not_found(format!("No addon: {name} found in cluster: {cluster}")))
}

async fn describe_addon(
    State(state): State<Shared>,
    Path((name, addon_name)): Path<(String, String)>,
) -> Response {
    call!(state, "DescribeAddon", |w| {
        let c = w.cluster(&name)?;
        let a = addon(c, &addon_name)?.clone();
        let c = c.clone();
        Ok(json!({ "addon": a.to_json(&c, w) }))
    })
}

async fn list_addons(State(state): State<Shared>, Path(name): Path<String>) -> Response {
    call!(state, "ListAddons", |w| {
        let c = w.cluster(&name)?;
        Ok(json!({ "addons": c.addons.keys().collect::<Vec<_>>() }))
    })
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct UpdateAddonBody {
    addon_version: Option<String>,
    service_account_role_arn: Option<String>,
    configuration_values: Option<String>,
}

async fn update_addon(
    State(state): State<Shared>,
    Path((name, addon_name)): Path<(String, String)>,
    Json(body): Json<UpdateAddonBody>,
) -> Response {
    call!(state, "UpdateAddon", |w| {
        let now = w.clock.now();
        let update_id = w.eks.next_update_id();
        let c = w.cluster(&name)?;
        let a = addon(c, &addon_name)?;
        if a.transition.is_some() {
            return Err(AwsError::in_use(format!(
                "Addon {addon_name} is already in transition"
            )));
        }
        if let Some(v) = &body.addon_version {
            let supported = addon_versions(&addon_name).unwrap_or_default();
            if !supported.contains(&v.as_str()) {
                return Err(AwsError::invalid_parameter(format!(
                    "Addon version specified is not supported: {v}"
                )));
            }
            a.version = v.clone();
        }
        if body.service_account_role_arn.is_some() {
            a.service_account_role_arn = body.service_account_role_arn;
        }
        check_configuration(&addon_name, body.configuration_values.as_deref())?;
        if body.configuration_values.is_some() {
            a.configuration_values = body.configuration_values;
        }
        a.modified = now;
        a.transition = Some(Transition {
            since: now,
            phase: Phase::Updating,
        });
        w.kube.wake(&name);
        let epoch = w.clock.epoch(now);
        Ok(json!({
            "update": { "id": update_id, "status": "InProgress", "type": "AddonUpdate", "params": [], "createdAt": epoch, "errors": [] }
        }))
    })
}

async fn delete_addon(
    State(state): State<Shared>,
    Path((name, addon_name)): Path<(String, String)>,
) -> Response {
    call!(state, "DeleteAddon", |w| {
        let now = w.clock.now();
        let c = w.cluster(&name)?;
        let a = addon(c, &addon_name)?;
        a.transition = Some(Transition {
            since: now,
            phase: Phase::Deleting,
        });
        let a = a.clone();
        let c = c.clone();
        w.kube.wake(&name);
        Ok(json!({ "addon": a.to_json(&c, w) }))
    })
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct VersionsQuery {
    addon_name: Option<String>,
    kubernetes_version: Option<String>,
}

async fn describe_addon_versions(
    State(state): State<Shared>,
    Query(q): Query<VersionsQuery>,
) -> Response {
    call!(state, "DescribeAddonVersions", |_w| {
        let k8s = q
            .kubernetes_version
            .unwrap_or_else(|| DEFAULT_KUBERNETES_VERSION.to_owned());
        let addons: Vec<Value> = ADDONS
            .iter()
            .filter(|(n, _)| q.addon_name.as_deref().is_none_or(|want| want == *n))
            .map(|(name, versions)| {
                let versions: Vec<Value> = versions
                    .iter()
                    .enumerate()
                    .map(|(i, v)| {
                        json!({
                            "addonVersion": v,
                            "architecture": ["amd64", "arm64"],
                            "compatibilities": [{ "clusterVersion": k8s, "platformVersions": ["*"], "defaultVersion": i == 0 }],
                            "requiresConfiguration": false
                        })
                    })
                    .collect();
                json!({ "addonName": name, "type": "infra-management", "addonVersions": versions, "owner": "aws", "publisher": "eks" })
            })
            .collect();
        Ok(json!({ "addons": addons }))
    })
}

impl PodIdentity {
    fn to_json(&self, cluster: &Cluster, w: &Aws) -> Value {
        json!({
            "clusterName": cluster.name,
            "namespace": self.namespace,
            "serviceAccount": self.service_account,
            "roleArn": self.role_arn,
            "associationArn": format!(
                "arn:aws:eks:{}:{ACCOUNT}:podidentityassociation/{}/{}",
                cluster.region, cluster.name, self.id
            ),
            "associationId": self.id,
            "tags": {},
            "createdAt": w.clock.epoch(self.created),
            "modifiedAt": w.clock.epoch(self.modified),
        })
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct CreatePodIdentityBody {
    namespace: String,
    service_account: String,
    role_arn: String,
}

async fn create_pod_identity(
    State(state): State<Shared>,
    headers: HeaderMap,
    Path(name): Path<String>,
    Json(body): Json<CreatePodIdentityBody>,
) -> Response {
    let region = region_of(&headers);
    let moto = state.moto.clone();
    let role_ok = match &moto {
        Some(m) => m.role_exists(&region, &body.role_arn).await,
        None => Ok(true),
    };
    call!(state, "CreatePodIdentityAssociation", |w| {
        if !role_ok? {
            return Err(AwsError::invalid_parameter(format!(
                "Role {} does not exist",
                body.role_arn
            )));
        }
        let now = w.clock.now();
        w.eks.associations += 1;
        let id = format!("a-{:017x}", w.eks.associations);
        let c = w.active_cluster(&name)?;
        if c.pod_identities
            .values()
            .any(|p| p.namespace == body.namespace && p.service_account == body.service_account)
        {
            return Err(AwsError::in_use(format!(
                "Association already exists for {}/{}",
                body.namespace, body.service_account
            )));
        }
        let association = PodIdentity {
            id: id.clone(),
            namespace: body.namespace,
            service_account: body.service_account,
            role_arn: body.role_arn,
            created: now,
            modified: now,
        };
        c.pod_identities.insert(id, association.clone());
        let c = c.clone();
        Ok(json!({ "association": association.to_json(&c, w) }))
    })
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PodIdentityQuery {
    namespace: Option<String>,
    service_account: Option<String>,
}

async fn list_pod_identities(
    State(state): State<Shared>,
    Path(name): Path<String>,
    Query(q): Query<PodIdentityQuery>,
) -> Response {
    call!(state, "ListPodIdentityAssociations", |w| {
        let c = w.cluster(&name)?.clone();
        let list: Vec<Value> = c
            .pod_identities
            .values()
            .filter(|p| q.namespace.as_deref().is_none_or(|n| n == p.namespace))
            .filter(|p| {
                q.service_account
                    .as_deref()
                    .is_none_or(|s| s == p.service_account)
            })
            .map(|p| {
                let mut v = p.to_json(&c, w);
                if let Some(o) = v.as_object_mut() {
                    o.retain(|k, _| {
                        [
                            "clusterName",
                            "namespace",
                            "serviceAccount",
                            "associationArn",
                            "associationId",
                        ]
                        .contains(&k.as_str())
                    });
                }
                v
            })
            .collect();
        Ok(json!({ "associations": list }))
    })
}

fn pod_identity<'a>(c: &'a mut Cluster, id: &str) -> Result<&'a mut PodIdentity, AwsError> {
    c.pod_identities
        .get_mut(id)
        .ok_or_else(|| AwsError::not_found(format!("Association {id} not found")))
}

async fn describe_pod_identity(
    State(state): State<Shared>,
    Path((name, id)): Path<(String, String)>,
) -> Response {
    call!(state, "DescribePodIdentityAssociation", |w| {
        let c = w.cluster(&name)?;
        let p = pod_identity(c, &id)?.clone();
        let c = c.clone();
        Ok(json!({ "association": p.to_json(&c, w) }))
    })
}

async fn delete_pod_identity(
    State(state): State<Shared>,
    Path((name, id)): Path<(String, String)>,
) -> Response {
    call!(state, "DeletePodIdentityAssociation", |w| {
        let c = w.cluster(&name)?;
        let p = pod_identity(c, &id)?.clone();
        c.pod_identities.remove(&id);
        let c = c.clone();
        Ok(json!({ "association": p.to_json(&c, w) }))
    })
}

pub fn routes() -> Router<Shared> {
    Router::new()
        .route("/clusters", post(create_cluster).get(list_clusters))
        .route(
            "/clusters/{name}",
            get(describe_cluster).delete(delete_cluster),
        )
        .route(
            "/clusters/{name}/access-entries",
            post(create_access_entry).get(list_access_entries),
        )
        .route(
            "/clusters/{name}/access-entries/{principal}",
            get(describe_access_entry).delete(delete_access_entry),
        )
        .route(
            "/clusters/{name}/access-entries/{principal}/access-policies",
            post(associate_access_policy).get(list_associated_access_policies),
        )
        .route(
            "/clusters/{name}/access-entries/{principal}/access-policies/{policy}",
            axum::routing::delete(disassociate_access_policy),
        )
        .route(
            "/clusters/{name}/addons",
            post(create_addon).get(list_addons),
        )
        .route(
            "/clusters/{name}/addons/{addon}",
            get(describe_addon).delete(delete_addon),
        )
        .route("/clusters/{name}/addons/{addon}/update", post(update_addon))
        .route("/addons/supported-versions", get(describe_addon_versions))
        .route(
            "/clusters/{name}/pod-identity-associations",
            post(create_pod_identity).get(list_pod_identities),
        )
        .route(
            "/clusters/{name}/pod-identity-associations/{id}",
            get(describe_pod_identity).delete(delete_pod_identity),
        )
        .merge(nodegroups::routes())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster(w: &Aws, name: &str, phase: Phase) -> Cluster {
        let now = w.clock.now();
        Cluster {
            name: name.to_owned(),
            region: "us-east-1".to_owned(),
            version: DEFAULT_KUBERNETES_VERSION.to_owned(),
            role_arn: String::new(),
            subnet_ids: Vec::new(),
            security_group_ids: Vec::new(),
            vpc_id: String::new(),
            authentication_mode: "API".to_owned(),
            endpoint_public: true,
            endpoint_private: false,
            tags: json!({}),
            created: now,
            transition: Some(Transition { since: now, phase }),
            failure: None,
            oidc_id: hex_id(name, 32),
            access_entries: BTreeMap::new(),
            addons: BTreeMap::new(),
            pod_identities: BTreeMap::new(),
        }
    }

    #[test]
    fn reading_a_cluster_settles_that_cluster_only() {
        let mut w = Aws::standalone(0.0);
        for name in ["a", "b"] {
            let c = cluster(&w, name, Phase::Deleting);
            w.eks.clusters.insert(name.to_owned(), c);
        }
        let mut creating = cluster(&w, "c", Phase::Creating);
        creating.addons.insert(
            "coredns".to_owned(),
            Addon {
                name: "coredns".to_owned(),
                version: "v1.12.2-eksbuild.4".to_owned(),
                service_account_role_arn: None,
                configuration_values: None,
                created: 0.0,
                modified: 0.0,
                transition: Some(Transition {
                    since: 0.0,
                    phase: Phase::Creating,
                }),
                tags: json!({}),
            },
        );
        w.eks.clusters.insert("c".to_owned(), creating);
        w.clock.advance(CLUSTER_CREATE_SECS);
        assert!(!w.eks_cluster_active("a"));
        assert!(!w.eks.clusters.contains_key("a"));
        assert!(w.eks.clusters.contains_key("b"), "b is gone once read");
        assert!(w.eks.clusters["c"].transition.is_some());
        assert_eq!(w.eks_active_addons("c"), ["coredns"]);
        assert!(w.eks.clusters["c"].active());
        assert!(w.cluster("b").is_err());
        assert_eq!(w.eks.clusters.len(), 1);
    }

    #[test]
    fn reading_a_cluster_says_when_it_or_an_add_on_changes_next() {
        use crate::clock::recording;
        let mut w = Aws::standalone(0.0);
        let mut c = cluster(&w, "c", Phase::Creating);
        let addon = Addon {
            name: "coredns".to_owned(),
            version: "v1.12.2-eksbuild.4".to_owned(),
            service_account_role_arn: None,
            configuration_values: None,
            created: 0.0,
            modified: 0.0,
            transition: Some(Transition {
                since: 0.0,
                phase: Phase::Creating,
            }),
            tags: json!({}),
        };
        c.addons.insert("coredns".to_owned(), addon);
        w.eks.clusters.insert("c".to_owned(), c);
        let due = |w: &mut Aws| recording(|| w.eks_active_addons("c")).1;
        assert_eq!(due(&mut w), ADDON_CREATE_SECS);
        w.clock.advance(ADDON_CREATE_SECS);
        assert_eq!(due(&mut w), CLUSTER_CREATE_SECS - ADDON_CREATE_SECS);
        w.clock.advance(CLUSTER_CREATE_SECS);
        assert_eq!(due(&mut w), f64::INFINITY);
        w.cluster("c").unwrap().transition = Some(Transition {
            since: w.clock.now(),
            phase: Phase::Deleting,
        });
        assert_eq!(due(&mut w), CLUSTER_DELETE_SECS);
    }
}
