//! SageMaker HyperPod, as the `aws-sdk-sagemaker` client sees it (JSON 1.1: `POST /`
//! with `X-Amz-Target: SageMaker.<Operation>`): clusters on an EKS orchestrator that take
//! minutes to come InService, instance groups whose nodes launch and pass health checks
//! on the sim's clock, updates that refuse to change what AWS keeps immutable, and
//! per-type quotas a test can set.

use std::collections::BTreeMap;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Json, Response};
use serde_json::{Value, json};

use crate::world::{ACCOUNT, AwsError, Phase, Shared, World, region_of};

pub const CLUSTER_CREATE_SECS: f64 = 900.0;
pub const CLUSTER_UPDATE_SECS: f64 = 300.0;
pub const CLUSTER_DELETE_SECS: f64 = 300.0;
pub const NODE_BOOT_SECS: f64 = 300.0;
pub const DEEP_HEALTH_CHECK_SECS: f64 = 600.0;

/// Default "cluster usage" quotas per instance type; `PUT /_sim/sagemaker/quotas`
/// changes them.
pub fn default_quotas() -> BTreeMap<String, u32> {
    [
        ("ml.p5.48xlarge", 4),
        ("ml.p5e.48xlarge", 2),
        ("ml.p5en.48xlarge", 2),
        ("ml.p4d.24xlarge", 4),
        ("ml.p4de.24xlarge", 2),
        ("ml.p6-b200.48xlarge", 2),
        ("ml.g6e.48xlarge", 4),
        ("ml.g6e.12xlarge", 8),
        ("ml.g5.8xlarge", 8),
        ("ml.g5.48xlarge", 4),
        ("ml.trn1.32xlarge", 4),
        ("ml.m5.2xlarge", 16),
        ("ml.t3.medium", 16),
    ]
    .into_iter()
    .map(|(t, n)| (t.to_owned(), n))
    .collect()
}

fn validation(message: impl Into<String>) -> AwsError {
    AwsError::new(400, "ValidationException", message)
}

#[derive(Clone, Debug)]
struct Node {
    id: String,
    launched: f64,
}

#[derive(Clone, Debug)]
struct Group {
    name: String,
    instance_type: String,
    target: u32,
    spec: Value,
    deep_health_checks: bool,
    nodes: Vec<Node>,
}

#[derive(Clone, Debug)]
pub struct Cluster {
    name: String,
    region: String,
    created: f64,
    phase: Option<(Phase, f64)>,
    orchestrator: Value,
    vpc: Value,
    node_recovery: String,
    provisioning: Option<String>,
    groups: Vec<Group>,
}

#[derive(Default)]
pub struct SageMaker {
    clusters: BTreeMap<String, Cluster>,
    pub quotas: BTreeMap<String, u32>,
    nodes: u64,
}

impl SageMaker {
    pub fn new() -> Self {
        Self {
            quotas: default_quotas(),
            ..Self::default()
        }
    }
}

impl Cluster {
    fn arn(&self) -> String {
        format!(
            "arn:aws:sagemaker:{}:{ACCOUNT}:cluster/{}",
            self.region,
            self.name.to_lowercase()
        )
    }

    fn status(&self, now: f64, stuck: bool) -> &'static str {
        match &self.phase {
            Some((Phase::Creating, since)) if stuck || now - since < CLUSTER_CREATE_SECS => {
                "Creating"
            }
            Some((Phase::Updating, since)) if stuck || now - since < CLUSTER_UPDATE_SECS => {
                "Updating"
            }
            Some((Phase::Deleting, _)) => "Deleting",
            _ => "InService",
        }
    }
}

fn node_status(node: &Node, group: &Group, now: f64) -> &'static str {
    let age = now - node.launched;
    if age < NODE_BOOT_SECS {
        "Pending"
    } else if group.deep_health_checks && age < NODE_BOOT_SECS + DEEP_HEALTH_CHECK_SECS {
        "DeepHealthCheckInProgress"
    } else {
        "Running"
    }
}

impl World {
    fn settle_sagemaker(&mut self) {
        let now = self.clock.now();
        let stuck_delete = self.stuck("sagemaker", "DeleteCluster");
        self.sagemaker.clusters.retain(|_, c| {
            !matches!(&c.phase, Some((Phase::Deleting, since)) if !stuck_delete && now - since >= CLUSTER_DELETE_SECS)
        });
    }

    fn hyperpod(&mut self, name: &str) -> Result<&mut Cluster, AwsError> {
        self.settle_sagemaker();
        // HyperPod accepts the name or the ARN.
        let key = name.rsplit('/').next().unwrap_or(name).to_owned();
        self.sagemaker
            .clusters
            .values_mut()
            .find(|c| c.name == key || c.name.eq_ignore_ascii_case(&key))
            .ok_or_else(|| {
                AwsError::new(400, "ResourceNotFound", format!("Cluster {name} not found"))
            })
    }

    fn launch(&mut self, group: &mut Group, now: f64) {
        while (group.nodes.len() as u32) < group.target {
            self.sagemaker.nodes += 1;
            group.nodes.push(Node {
                id: format!("i-{:017x}", 0x0ab0_0000 + self.sagemaker.nodes),
                launched: now,
            });
        }
        group.nodes.truncate(group.target as usize);
    }

    fn cluster_json(&self, c: &Cluster) -> Value {
        let now = self.clock.now();
        let status = c.status(
            now,
            self.stuck("sagemaker", "CreateCluster") || self.stuck("sagemaker", "UpdateCluster"),
        );
        let groups: Vec<Value> = c
            .groups
            .iter()
            .map(|g| {
                let running = g
                    .nodes
                    .iter()
                    .filter(|n| node_status(n, g, now) == "Running")
                    .count();
                let mut v = g.spec.clone();
                if let Some(o) = v.as_object_mut() {
                    o.insert("CurrentCount".into(), json!(running));
                    o.insert("TargetCount".into(), json!(g.target));
                    o.insert(
                        "Status".into(),
                        json!(match status {
                            "Creating" => "Creating",
                            "Updating" => "Updating",
                            "Deleting" => "Deleting",
                            _ if running < g.target as usize => "Degraded",
                            _ => "InService",
                        }),
                    );
                    o.remove("InstanceCount");
                }
                v
            })
            .collect();
        json!({
            "ClusterArn": c.arn(),
            "ClusterName": c.name,
            "ClusterStatus": status,
            "CreationTime": self.clock.epoch(c.created),
            "InstanceGroups": groups,
            "VpcConfig": c.vpc,
            "Orchestrator": c.orchestrator,
            "NodeRecovery": c.node_recovery,
            "NodeProvisioningMode": c.provisioning,
        })
    }
}

fn check_name(name: &str, what: &str) -> Result<(), AwsError> {
    let ok = (1..=63).contains(&name.len())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric());
    if ok {
        Ok(())
    } else {
        Err(validation(format!(
            "1 validation error detected: Value '{name}' at '{what}' failed to satisfy constraint: Member must satisfy regular expression pattern: ^[a-zA-Z0-9](-*[a-zA-Z0-9]){{0,62}}$"
        )))
    }
}

fn str_field<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key).and_then(Value::as_str)
}

/// Checks one instance group of a request and returns its stored form.
fn parse_group(g: &Value, index: usize, quotas: &BTreeMap<String, u32>) -> Result<Group, AwsError> {
    let at = |field: &str| format!("instanceGroups.{}.member.{field}", index + 1);
    let name = str_field(g, "InstanceGroupName")
        .ok_or_else(|| validation(format!("{} is required", at("instanceGroupName"))))?;
    check_name(name, &at("instanceGroupName"))?;
    let instance_type = str_field(g, "InstanceType").unwrap_or_default();
    if !quotas.contains_key(instance_type) {
        return Err(validation(format!(
            "1 validation error detected: Value '{instance_type}' at '{}' failed to satisfy constraint: Member must be one of the supported HyperPod instance types",
            at("instanceType")
        )));
    }
    let count = g.get("InstanceCount").and_then(Value::as_u64).unwrap_or(0);
    let target = u32::try_from(count)
        .map_err(|_| validation(format!("{} is too large", at("instanceCount"))))?;
    if str_field(g, "ExecutionRole").is_none() {
        return Err(validation(format!("{} is required", at("executionRole"))));
    }
    let lifecycle = g.get("LifeCycleConfig");
    let uri = lifecycle
        .and_then(|l| str_field(l, "SourceS3Uri"))
        .unwrap_or_default();
    if !uri.starts_with("s3://")
        || lifecycle
            .and_then(|l| str_field(l, "OnCreate"))
            .unwrap_or_default()
            .is_empty()
    {
        return Err(validation(format!(
            "{} needs SourceS3Uri (s3://…) and OnCreate",
            at("lifeCycleConfig")
        )));
    }
    let deep_health_checks = g
        .get("OnStartDeepHealthChecks")
        .and_then(Value::as_array)
        .is_some_and(|a| !a.is_empty());
    Ok(Group {
        name: name.to_owned(),
        instance_type: instance_type.to_owned(),
        target,
        spec: g.clone(),
        deep_health_checks,
        nodes: Vec::new(),
    })
}

/// Instances of `instance_type` across every cluster, excluding `except` cluster.
fn in_use(w: &World, instance_type: &str, except: Option<&str>) -> u32 {
    w.sagemaker
        .clusters
        .values()
        .filter(|c| Some(c.name.as_str()) != except)
        .flat_map(|c| c.groups.iter())
        .filter(|g| g.instance_type == instance_type)
        .map(|g| g.target)
        .sum()
}

fn check_quotas(w: &World, groups: &[Group], except: Option<&str>) -> Result<(), AwsError> {
    let mut wanted: BTreeMap<&str, u32> = BTreeMap::new();
    for g in groups {
        *wanted.entry(g.instance_type.as_str()).or_default() += g.target;
    }
    for (t, n) in wanted {
        let quota = w.sagemaker.quotas.get(t).copied().unwrap_or(0);
        let used = in_use(w, t, except);
        if used + n > quota {
            return Err(AwsError::new(
                400,
                "ResourceLimitExceeded",
                format!(
                    "The account-level service limit '{t} for cluster usage' is {quota} Instances, with current utilization of {used} Instances and a request delta of {n} Instances. Please use AWS Service Quotas to request an increase for this quota."
                ),
            ));
        }
    }
    Ok(())
}

/// The fields of an instance group AWS refuses to change after creation.
const IMMUTABLE: &[&str] = &[
    "InstanceType",
    "TrainingPlanArn",
    "ThreadsPerCore",
    "CapacityRequirements",
];

fn create_cluster(
    w: &mut World,
    region: &str,
    body: &Value,
    role_exists: &[(String, bool)],
) -> Result<Value, AwsError> {
    let name = str_field(body, "ClusterName").unwrap_or_default();
    check_name(name, "clusterName")?;
    w.settle_sagemaker();
    if w.sagemaker.clusters.values().any(|c| c.name == name) {
        return Err(AwsError::new(
            400,
            "ResourceInUse",
            format!("Cluster {name} already exists"),
        ));
    }
    let groups_in = body
        .get("InstanceGroups")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if groups_in.is_empty() {
        return Err(validation(
            "InstanceGroups must contain at least one instance group",
        ));
    }
    let mut groups = Vec::new();
    for (i, g) in groups_in.iter().enumerate() {
        let group = parse_group(g, i, &w.sagemaker.quotas)?;
        if groups.iter().any(|x: &Group| x.name == group.name) {
            return Err(validation(format!(
                "Duplicate instance group name {}",
                group.name
            )));
        }
        groups.push(group);
    }
    if let Some((role, _)) = role_exists.iter().find(|(_, exists)| !exists) {
        return Err(validation(format!(
            "Execution role {role} does not exist or cannot be assumed"
        )));
    }
    let orchestrator = body.get("Orchestrator").cloned().unwrap_or(Value::Null);
    if let Some(eks_arn) = orchestrator
        .pointer("/Eks/ClusterArn")
        .and_then(Value::as_str)
    {
        let eks_name = eks_arn.rsplit('/').next().unwrap_or_default();
        if !w.eks_cluster_active(eks_name) {
            return Err(validation(format!(
                "The EKS cluster {eks_arn} does not exist or is not ACTIVE"
            )));
        }
    }
    let node_recovery = str_field(body, "NodeRecovery")
        .unwrap_or("Automatic")
        .to_owned();
    if !["Automatic", "None"].contains(&node_recovery.as_str()) {
        return Err(validation("NodeRecovery must be Automatic or None"));
    }
    check_quotas(w, &groups, None)?;
    let now = w.clock.now();
    for g in &mut groups {
        w.launch(g, now);
    }
    let cluster = Cluster {
        name: name.to_owned(),
        region: region.to_owned(),
        created: now,
        phase: Some((Phase::Creating, now)),
        orchestrator,
        vpc: body.get("VpcConfig").cloned().unwrap_or(Value::Null),
        node_recovery,
        provisioning: str_field(body, "NodeProvisioningMode").map(str::to_owned),
        groups,
    };
    let arn = cluster.arn();
    w.sagemaker.clusters.insert(name.to_owned(), cluster);
    Ok(json!({ "ClusterArn": arn }))
}

fn update_cluster(w: &mut World, body: &Value) -> Result<Value, AwsError> {
    let name = str_field(body, "ClusterName")
        .unwrap_or_default()
        .to_owned();
    let now = w.clock.now();
    let quotas = w.sagemaker.quotas.clone();
    let cluster = w.hyperpod(&name)?.clone();
    if cluster.status(now, false) != "InService" {
        return Err(validation(format!(
            "Cluster {name} is {}; it can be updated only when InService",
            cluster.status(now, false)
        )));
    }
    let to_delete: Vec<&str> = body
        .get("InstanceGroupsToDelete")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let mut groups = Vec::new();
    for (i, g) in body
        .get("InstanceGroups")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
        .iter()
        .enumerate()
    {
        let mut group = parse_group(g, i, &quotas)?;
        if let Some(old) = cluster.groups.iter().find(|o| o.name == group.name) {
            for field in IMMUTABLE {
                if old.spec.get(*field) != g.get(*field) {
                    return Err(validation(format!(
                        "{field} of instance group {} cannot be updated (was {}, requested {})",
                        group.name,
                        old.spec.get(*field).unwrap_or(&Value::Null),
                        g.get(*field).unwrap_or(&Value::Null)
                    )));
                }
            }
            group.nodes = old.nodes.clone();
        }
        groups.push(group);
    }
    // Groups neither listed nor deleted stay as they are (UpdateCluster takes the whole
    // list; omitting a group without deleting it is refused, as AWS does).
    for old in &cluster.groups {
        if !groups.iter().any(|g| g.name == old.name) && !to_delete.contains(&old.name.as_str()) {
            return Err(validation(format!(
                "Instance group {} is missing from InstanceGroups; list every group, or name it in InstanceGroupsToDelete",
                old.name
            )));
        }
    }
    check_quotas(w, &groups, Some(&cluster.name))?;
    for g in &mut groups {
        w.launch(g, now);
    }
    let c = w.hyperpod(&name)?;
    c.groups = groups;
    if let Some(nr) = str_field(body, "NodeRecovery") {
        c.node_recovery = nr.to_owned();
    }
    c.phase = Some((Phase::Updating, now));
    Ok(json!({ "ClusterArn": c.arn() }))
}

/// A node as ListClusterNodes and DescribeClusterNode report it.
fn node_json(clock: &crate::world::Clock, g: &Group, n: &Node, now: f64) -> Value {
    json!({
        "InstanceGroupName": g.name,
        "InstanceId": n.id,
        "InstanceType": g.instance_type,
        "LaunchTime": clock.epoch(n.launched),
        "InstanceStatus": { "Status": node_status(n, g, now), "Message": "" },
    })
}

fn list_nodes(w: &mut World, body: &Value) -> Result<Value, AwsError> {
    let now = w.clock.now();
    let c = w
        .hyperpod(str_field(body, "ClusterName").unwrap_or_default())?
        .clone();
    let filter = str_field(body, "InstanceGroupNameContains").unwrap_or_default();
    let clock = &w.clock;
    let nodes: Vec<Value> = c
        .groups
        .iter()
        .filter(|g| g.name.contains(filter))
        .flat_map(|g| g.nodes.iter().map(move |n| node_json(clock, g, n, now)))
        .collect();
    Ok(json!({ "ClusterNodeSummaries": nodes }))
}

fn describe_node(w: &mut World, body: &Value) -> Result<Value, AwsError> {
    let now = w.clock.now();
    let c = w
        .hyperpod(str_field(body, "ClusterName").unwrap_or_default())?
        .clone();
    let id = str_field(body, "NodeId").unwrap_or_default();
    for g in &c.groups {
        if let Some(n) = g.nodes.iter().find(|n| n.id == id) {
            let mut details = node_json(&w.clock, g, n, now);
            if let Some(o) = details.as_object_mut() {
                o.insert(
                    "LifeCycleConfig".into(),
                    g.spec
                        .get("LifeCycleConfig")
                        .cloned()
                        .unwrap_or(Value::Null),
                );
                o.insert(
                    "ThreadsPerCore".into(),
                    g.spec.get("ThreadsPerCore").cloned().unwrap_or(Value::Null),
                );
            }
            return Ok(json!({ "NodeDetails": details }));
        }
    }
    Err(AwsError::new(
        400,
        "ResourceNotFound",
        format!("Node {id} not found in cluster {}", c.name),
    ))
}

/// `POST /` with `X-Amz-Target: SageMaker.<Operation>`.
pub async fn dispatch(State(state): State<Shared>, headers: HeaderMap, body: Bytes) -> Response {
    let Some(op) = headers
        .get("x-amz-target")
        .and_then(|v| v.to_str().ok())
        .and_then(|t| t.strip_prefix("SageMaker."))
        .map(str::to_owned)
    else {
        return AwsError::new(400, "UnknownOperationException", "missing X-Amz-Target")
            .into_response();
    };
    let region = region_of(&headers);
    let body: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => return validation(format!("invalid JSON: {e}")).into_response(),
    };
    // Roles are asked of moto before the world is locked.
    let moto = state.lock().await.moto.clone();
    let mut roles = Vec::new();
    if op == "CreateCluster"
        && let Some(moto) = &moto
    {
        for g in body
            .get("InstanceGroups")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if let Some(role) = str_field(g, "ExecutionRole") {
                let exists = match moto.role_exists(&region, role).await {
                    Ok(e) => e,
                    Err(e) => return e.into_response(),
                };
                roles.push((role.to_owned(), exists));
            }
        }
    }
    let mut guard = state.lock().await;
    let w: &mut World = &mut guard;
    if let Some(e) = w.take_fault("sagemaker", &op) {
        return e.into_response();
    }
    let result = match op.as_str() {
        "CreateCluster" => create_cluster(w, &region, &body, &roles),
        "DescribeCluster" => w
            .hyperpod(str_field(&body, "ClusterName").unwrap_or_default())
            .map(|c| c.clone())
            .map(|c| w.cluster_json(&c)),
        "ListClusters" => {
            w.settle_sagemaker();
            let now = w.clock.now();
            let summaries: Vec<Value> = w
                .sagemaker
                .clusters
                .values()
                .filter(|c| c.region == region)
                .map(|c| {
                    json!({
                        "ClusterArn": c.arn(),
                        "ClusterName": c.name,
                        "CreationTime": w.clock.epoch(c.created),
                        "ClusterStatus": c.status(now, false),
                    })
                })
                .collect();
            Ok(json!({ "ClusterSummaries": summaries }))
        }
        "UpdateCluster" => update_cluster(w, &body),
        "DeleteCluster" => {
            let now = w.clock.now();
            w.hyperpod(str_field(&body, "ClusterName").unwrap_or_default())
                .map(|c| {
                    c.phase = Some((Phase::Deleting, now));
                    json!({ "ClusterArn": c.arn() })
                })
        }
        "ListClusterNodes" => list_nodes(w, &body),
        "DescribeClusterNode" => describe_node(w, &body),
        other => Err(AwsError::new(
            400,
            "UnknownOperationException",
            format!("hypd-sim does not implement SageMaker.{other}"),
        )),
    };
    match result {
        Ok(v) => Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

/// A HyperPod instance as the Kubernetes emulator sees it (it becomes a Node).
pub struct Instance {
    pub id: String,
    pub instance_type: String,
    pub group: String,
    pub cluster: String,
    /// `Pending`, `DeepHealthCheckInProgress` or `Running`.
    pub status: &'static str,
    /// Simulated second the instance was launched.
    pub launched: f64,
}

impl World {
    /// The instances of HyperPod clusters orchestrated by EKS cluster `eks_name`.
    pub fn hyperpod_instances(&mut self, eks_name: &str) -> Vec<Instance> {
        self.settle_sagemaker();
        let now = self.clock.now();
        let suffix = format!(":cluster/{eks_name}");
        self.sagemaker
            .clusters
            .values()
            .filter(|c| {
                c.orchestrator["Eks"]["ClusterArn"]
                    .as_str()
                    .is_some_and(|arn| arn.ends_with(&suffix))
            })
            .flat_map(|c| {
                c.groups.iter().flat_map(move |g| {
                    g.nodes.iter().map(move |n| Instance {
                        id: n.id.clone(),
                        instance_type: g.instance_type.clone(),
                        group: g.name.clone(),
                        cluster: c.name.clone(),
                        status: node_status(n, g, now),
                        launched: n.launched,
                    })
                })
            })
            .collect()
    }
}
