//! EKS managed node groups (CreateNodegroup, DescribeNodegroup, ListNodegroups,
//! UpdateNodegroupConfig, DeleteNodegroup): CREATING → ACTIVE, UPDATING and DELETING on
//! the sim's clock, on an ACTIVE cluster only, with subnets in the cluster's VPC and a
//! node role that moto must know, refused with EKS's error codes and messages.

use std::collections::BTreeMap;

use axum::Router;
use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Json, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::{Value, json};

use super::{Transition, check_name, hex_id, phase_status, status_word};
use crate::world::{ACCOUNT, Aws, AwsError, Phase, Shared};

pub const NODEGROUP_CREATE_SECS: f64 = 300.0;
pub const NODEGROUP_UPDATE_SECS: f64 = 180.0;
pub const NODEGROUP_DELETE_SECS: f64 = 300.0;

const CAPACITY_TYPES: &[&str] = &["ON_DEMAND", "SPOT", "CAPACITY_BLOCK"];
const AMI_TYPES: &[&str] = &[
    "AL2_x86_64",
    "AL2_x86_64_GPU",
    "AL2_ARM_64",
    "AL2023_x86_64_STANDARD",
    "AL2023_x86_64_NVIDIA",
    "AL2023_x86_64_NEURON",
    "AL2023_ARM_64_STANDARD",
    "AL2023_ARM_64_NVIDIA",
    "BOTTLEROCKET_x86_64",
    "BOTTLEROCKET_x86_64_NVIDIA",
    "BOTTLEROCKET_ARM_64",
    "BOTTLEROCKET_ARM_64_NVIDIA",
];

#[derive(Clone, Debug, Deserialize, serde::Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Scaling {
    min_size: i64,
    max_size: i64,
    desired_size: i64,
}

#[derive(Clone, Debug)]
pub struct Nodegroup {
    name: String,
    cluster: String,
    region: String,
    version: String,
    scaling: Scaling,
    instance_types: Vec<String>,
    subnets: Vec<String>,
    ami_type: String,
    capacity_type: String,
    node_role: String,
    disk_size: i64,
    labels: BTreeMap<String, String>,
    taints: Vec<Value>,
    tags: Value,
    created: f64,
    modified: f64,
    transition: Option<Transition>,
}

impl Nodegroup {
    fn arn(&self) -> String {
        format!(
            "arn:aws:eks:{}:{ACCOUNT}:nodegroup/{}/{}/{}",
            self.region,
            self.cluster,
            self.name,
            uuid_like(&format!("{}/{}/{}", self.cluster, self.name, self.created))
        )
    }

    fn status(&self) -> &'static str {
        status_word(&self.transition)
    }

    fn to_json(&self, w: &Aws) -> Value {
        let asg = format!(
            "eks-{}-{}",
            self.name,
            uuid_like(&format!("{}/{}", self.cluster, self.name))
        );
        json!({
            "nodegroupName": self.name,
            "nodegroupArn": self.arn(),
            "clusterName": self.cluster,
            "version": self.version,
            "releaseVersion": format!("{}.0-20251120", self.version),
            "createdAt": w.clock.epoch(self.created),
            "modifiedAt": w.clock.epoch(self.modified),
            "status": self.status(),
            "capacityType": self.capacity_type,
            "scalingConfig": self.scaling,
            "instanceTypes": self.instance_types,
            "subnets": self.subnets,
            "amiType": self.ami_type,
            "nodeRole": self.node_role,
            "labels": self.labels,
            "taints": self.taints,
            "resources": { "autoScalingGroups": [{ "name": asg }] },
            "diskSize": self.disk_size,
            "health": { "issues": [] },
            "updateConfig": { "maxUnavailable": 1 },
            "tags": self.tags,
        })
    }
}

/// An id shaped like the UUID AWS puts in node group ARNs, stable per seed.
fn uuid_like(seed: &str) -> String {
    let h = hex_id(seed, 32).to_lowercase();
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

impl Aws {
    /// Applies the finished transitions of cluster `cluster`'s node groups.
    fn settle_nodegroups(&mut self, cluster: &str) {
        let now = self.clock.now();
        let stuck_create = self.stuck("eks", "CreateNodegroup");
        let stuck_update = self.stuck("eks", "UpdateNodegroupConfig");
        let stuck_delete = self.stuck("eks", "DeleteNodegroup");
        let secs = |p| match p {
            Phase::Creating => NODEGROUP_CREATE_SECS,
            Phase::Updating => NODEGROUP_UPDATE_SECS,
            Phase::Deleting => NODEGROUP_DELETE_SECS,
        };
        let stuck = |p| match p {
            Phase::Creating => stuck_create,
            Phase::Updating => stuck_update,
            Phase::Deleting => stuck_delete,
        };
        self.eks.nodegroups.retain(|(c, _), n| {
            if c != cluster {
                return true;
            }
            let phase = n.transition.as_ref().map(|t| t.phase);
            !(phase == Some(Phase::Deleting)
                && phase_status(&n.transition, now, secs, stuck(Phase::Deleting)).is_none())
        });
        let of_cluster = self
            .eks
            .nodegroups
            .iter_mut()
            .filter(|((c, _), _)| c == cluster)
            .map(|(_, n)| n);
        for n in of_cluster {
            let Some(phase) = n.transition.as_ref().map(|t| t.phase) else {
                continue;
            };
            if phase != Phase::Deleting
                && phase_status(&n.transition, now, secs, stuck(phase)).is_none()
            {
                n.transition = None;
            }
        }
    }

    fn nodegroup(&mut self, cluster: &str, name: &str) -> Result<&mut Nodegroup, AwsError> {
        self.cluster(cluster)?;
        self.settle_nodegroups(cluster);
        self.eks
            .nodegroups
            .get_mut(&(cluster.to_owned(), name.to_owned()))
            .ok_or_else(|| AwsError::not_found(format!("No node group found for name: {name}.")))
    }

    /// Whether a cluster still has node groups, which keeps it from being deleted.
    pub(super) fn has_nodegroups(&mut self, cluster: &str) -> bool {
        self.settle_nodegroups(cluster);
        self.eks.nodegroups.keys().any(|(c, _)| c == cluster)
    }
}

fn check_nodegroup_name(name: &str) -> Result<(), AwsError> {
    check_name("Nodegroup name", name, 63)
}

fn check_scaling(s: &Scaling) -> Result<(), AwsError> {
    if s.min_size < 0 || s.desired_size < 0 || s.max_size < 1 {
        return Err(AwsError::invalid_parameter(
            "Minimum and desired sizes must be at least 0 and maximum size at least 1",
        ));
    }
    if s.min_size > s.desired_size {
        return Err(AwsError::invalid_parameter(format!(
            "Minimum capacity {} can't be greater than desired size {}",
            s.min_size, s.desired_size
        )));
    }
    if s.desired_size > s.max_size {
        return Err(AwsError::invalid_parameter(format!(
            "Desired capacity {} can't be greater than max size {}",
            s.desired_size, s.max_size
        )));
    }
    Ok(())
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct CreateBody {
    nodegroup_name: String,
    scaling_config: Option<Scaling>,
    disk_size: Option<i64>,
    #[serde(default)]
    subnets: Vec<String>,
    instance_types: Option<Vec<String>>,
    ami_type: Option<String>,
    node_role: String,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default)]
    taints: Vec<Value>,
    #[serde(default)]
    tags: Value,
    capacity_type: Option<String>,
    version: Option<String>,
}

async fn create(
    State(state): State<Shared>,
    Path(cluster): Path<String>,
    body: axum::body::Bytes,
) -> Response {
    let body: CreateBody = match serde_json::from_slice(&body) {
        Ok(b) => b,
        Err(e) => {
            return AwsError::invalid_parameter(format!("invalid request: {e}")).into_response();
        }
    };
    // moto is asked outside the lock, about the cluster's region and VPC.
    let moto = state.moto.clone();
    let cluster_facts = state
        .aws
        .lock()
        .await
        .cluster(&cluster)
        .ok()
        .map(|c| (c.region.clone(), c.vpc_id.clone()));
    let checked = async {
        check_nodegroup_name(&body.nodegroup_name)?;
        if body.subnets.is_empty() {
            return Err(AwsError::invalid_parameter(
                "Subnets are required to create a nodegroup",
            ));
        }
        if let (Some(moto), Some((region, vpc_id))) = (&moto, &cluster_facts) {
            let subnets = moto.subnets(region, &body.subnets).await?;
            if let Some(s) = subnets
                .iter()
                .find(|s| !vpc_id.is_empty() && s.vpc_id != *vpc_id)
            {
                return Err(AwsError::invalid_parameter(format!(
                    "Subnet {} is not in the VPC of cluster {cluster} ({vpc_id})",
                    s.id
                )));
            }
            if !moto.role_exists(region, &body.node_role).await? {
                return Err(AwsError::invalid_parameter(format!(
                    "The provided role doesn't exist: {}",
                    body.node_role
                )));
            }
        }
        Ok(())
    }
    .await;
    call!(state, "CreateNodegroup", |w| {
        let c = w.active_cluster(&cluster)?.clone();
        checked?;
        let scaling = body.scaling_config.clone().unwrap_or(Scaling {
            min_size: 1,
            max_size: 2,
            desired_size: 2,
        });
        check_scaling(&scaling)?;
        let capacity_type = body.capacity_type.clone().unwrap_or("ON_DEMAND".into());
        if !CAPACITY_TYPES.contains(&capacity_type.as_str()) {
            return Err(AwsError::invalid_parameter(format!(
                "Invalid capacityType {capacity_type}; valid values: {}",
                CAPACITY_TYPES.join(", ")
            )));
        }
        let ami_type = body
            .ami_type
            .clone()
            .unwrap_or("AL2023_x86_64_STANDARD".into());
        // Amazon Linux 2 AMIs stop at Kubernetes 1.32.
        let minor: u32 = c
            .version
            .split('.')
            .nth(1)
            .and_then(|m| m.parse().ok())
            .unwrap_or(0);
        if ami_type.starts_with("AL2_") && minor >= 33 {
            return Err(AwsError::invalid_parameter(format!(
                "AMI type {ami_type} is not supported for Kubernetes version {}; use an AL2023 or Bottlerocket AMI type",
                c.version
            )));
        }
        if !AMI_TYPES.contains(&ami_type.as_str()) {
            return Err(AwsError::invalid_parameter(format!(
                "Invalid amiType {ami_type}"
            )));
        }
        let version = body.version.clone().unwrap_or(c.version.clone());
        if version != c.version {
            return Err(AwsError::invalid_parameter(format!(
                "Requested Nodegroup version {version} is invalid. The Nodegroup version must match the cluster version {}",
                c.version
            )));
        }
        w.settle_nodegroups(&cluster);
        let key = (cluster.clone(), body.nodegroup_name.clone());
        if w.eks.nodegroups.contains_key(&key) {
            return Err(AwsError::in_use(format!(
                "NodeGroup already exists with name {} and cluster name {cluster}",
                body.nodegroup_name
            )));
        }
        let now = w.clock.now();
        let ng = Nodegroup {
            name: body.nodegroup_name.clone(),
            cluster: cluster.clone(),
            region: c.region.clone(),
            version,
            scaling,
            instance_types: body
                .instance_types
                .clone()
                .unwrap_or_else(|| vec!["t3.medium".into()]),
            subnets: body.subnets.clone(),
            ami_type,
            capacity_type,
            node_role: body.node_role.clone(),
            disk_size: body.disk_size.unwrap_or(20),
            labels: body.labels.clone(),
            taints: body.taints.clone(),
            tags: if body.tags.is_object() {
                body.tags.clone()
            } else {
                json!({})
            },
            created: now,
            modified: now,
            transition: Some(Transition {
                since: now,
                phase: Phase::Creating,
            }),
        };
        let out = json!({ "nodegroup": ng.to_json(w) });
        w.eks.nodegroups.insert(key, ng);
        Ok(out)
    })
}

async fn describe(
    State(state): State<Shared>,
    Path((cluster, name)): Path<(String, String)>,
) -> Response {
    call!(state, "DescribeNodegroup", |w| {
        let ng = w.nodegroup(&cluster, &name)?.clone();
        Ok(json!({ "nodegroup": ng.to_json(w) }))
    })
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ListQuery {
    max_results: Option<usize>,
    next_token: Option<String>,
}

async fn list(
    State(state): State<Shared>,
    Path(cluster): Path<String>,
    Query(q): Query<ListQuery>,
) -> Response {
    call!(state, "ListNodegroups", |w| {
        w.cluster(&cluster)?;
        w.settle_nodegroups(&cluster);
        let max = q.max_results.unwrap_or(100);
        if !(1..=100).contains(&max) {
            return Err(AwsError::invalid_parameter(
                "maxResults must be between 1 and 100",
            ));
        }
        let start: usize = q
            .next_token
            .as_deref()
            .and_then(|t| t.parse().ok())
            .unwrap_or(0);
        let names: Vec<&String> = w
            .eks
            .nodegroups
            .keys()
            .filter(|(c, _)| *c == cluster)
            .map(|(_, n)| n)
            .collect();
        let page: Vec<&&String> = names.iter().skip(start).take(max).collect();
        let next = (start + max < names.len()).then(|| (start + max).to_string());
        Ok(json!({ "nodegroups": page, "nextToken": next }))
    })
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct LabelsPayload {
    #[serde(default)]
    add_or_update_labels: BTreeMap<String, String>,
    #[serde(default)]
    remove_labels: Vec<String>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct TaintsPayload {
    #[serde(default)]
    add_or_update_taints: Vec<Value>,
    #[serde(default)]
    remove_taints: Vec<Value>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct UpdateConfigBody {
    labels: Option<LabelsPayload>,
    taints: Option<TaintsPayload>,
    scaling_config: Option<PartialScaling>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PartialScaling {
    min_size: Option<i64>,
    max_size: Option<i64>,
    desired_size: Option<i64>,
}

async fn update_config(
    State(state): State<Shared>,
    Path((cluster, name)): Path<(String, String)>,
    Json(body): Json<UpdateConfigBody>,
) -> Response {
    call!(state, "UpdateNodegroupConfig", |w| {
        let now = w.clock.now();
        let update_id = w.eks.next_update_id();
        let epoch = w.clock.epoch(now);
        let ng = w.nodegroup(&cluster, &name)?;
        if ng.transition.is_some() {
            return Err(AwsError::in_use(format!(
                "Nodegroup {name} is currently {}; wait until it is ACTIVE",
                ng.status()
            )));
        }
        if body.labels.is_none() && body.taints.is_none() && body.scaling_config.is_none() {
            return Err(AwsError::invalid_parameter(
                "No changes needed for the nodegroup config",
            ));
        }
        let mut params = Vec::new();
        if let Some(s) = &body.scaling_config {
            let scaling = Scaling {
                min_size: s.min_size.unwrap_or(ng.scaling.min_size),
                max_size: s.max_size.unwrap_or(ng.scaling.max_size),
                desired_size: s.desired_size.unwrap_or(ng.scaling.desired_size),
            };
            check_scaling(&scaling)?;
            for (kind, value) in [
                ("MinSize", scaling.min_size),
                ("MaxSize", scaling.max_size),
                ("DesiredSize", scaling.desired_size),
            ] {
                params.push(json!({ "type": kind, "value": value.to_string() }));
            }
            ng.scaling = scaling;
        }
        if let Some(l) = &body.labels {
            for k in &l.remove_labels {
                ng.labels.remove(k);
            }
            ng.labels.extend(l.add_or_update_labels.clone());
            if !l.add_or_update_labels.is_empty() {
                params.push(json!({ "type": "LabelsToAdd", "value": serde_json::to_string(&l.add_or_update_labels).unwrap_or_default() }));
            }
            if !l.remove_labels.is_empty() {
                params.push(json!({ "type": "LabelsToRemove", "value": serde_json::to_string(&l.remove_labels).unwrap_or_default() }));
            }
        }
        if let Some(t) = &body.taints {
            let key = |v: &Value| (v.get("key").cloned(), v.get("effect").cloned());
            ng.taints.retain(|x| {
                !t.remove_taints.iter().any(|r| key(r) == key(x))
                    && !t.add_or_update_taints.iter().any(|a| key(a) == key(x))
            });
            ng.taints.extend(t.add_or_update_taints.clone());
            if !t.add_or_update_taints.is_empty() {
                params.push(json!({ "type": "TaintsToAdd", "value": Value::Array(t.add_or_update_taints.clone()).to_string() }));
            }
            if !t.remove_taints.is_empty() {
                params.push(json!({ "type": "TaintsToRemove", "value": Value::Array(t.remove_taints.clone()).to_string() }));
            }
        }
        ng.modified = now;
        ng.transition = Some(Transition {
            since: now,
            phase: Phase::Updating,
        });
        Ok(json!({
            "update": { "id": update_id, "status": "InProgress", "type": "ConfigUpdate", "params": params, "createdAt": epoch, "errors": [] }
        }))
    })
}

async fn delete(
    State(state): State<Shared>,
    Path((cluster, name)): Path<(String, String)>,
) -> Response {
    call!(state, "DeleteNodegroup", |w| {
        let now = w.clock.now();
        let ng = w.nodegroup(&cluster, &name)?;
        if ng
            .transition
            .as_ref()
            .is_some_and(|t| t.phase == Phase::Deleting)
        {
            return Err(AwsError::in_use(format!(
                "Nodegroup {name} is already being deleted"
            )));
        }
        ng.transition = Some(Transition {
            since: now,
            phase: Phase::Deleting,
        });
        ng.modified = now;
        let ng = ng.clone();
        Ok(json!({ "nodegroup": ng.to_json(w) }))
    })
}

pub fn routes() -> Router<Shared> {
    Router::new()
        .route("/clusters/{name}/node-groups", post(create).get(list))
        .route(
            "/clusters/{name}/node-groups/{nodegroup}",
            get(describe).delete(delete),
        )
        .route(
            "/clusters/{name}/node-groups/{nodegroup}/update-config",
            post(update_config),
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scaling_rules() {
        let s = |min, desired, max| Scaling {
            min_size: min,
            max_size: max,
            desired_size: desired,
        };
        assert!(check_scaling(&s(1, 2, 3)).is_ok());
        assert!(check_scaling(&s(0, 0, 1)).is_ok());
        assert!(
            check_scaling(&s(3, 2, 4))
                .unwrap_err()
                .message
                .contains("Minimum capacity 3")
        );
        assert!(check_scaling(&s(1, 5, 4)).is_err());
        assert!(check_scaling(&s(0, 0, 0)).is_err());
        assert!(check_nodegroup_name("gpu_nodes-1").is_ok());
        assert!(check_nodegroup_name("-gpu").is_err());
        assert!(check_nodegroup_name(&"a".repeat(64)).is_err());
    }
}
