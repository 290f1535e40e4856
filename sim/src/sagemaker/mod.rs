//! SageMaker HyperPod, as the `aws-sdk-sagemaker` client sees it (JSON 1.1: `POST /`
//! with `X-Amz-Target: SageMaker.<Operation>`): the dispatch and what every part shares.
//! Clusters on an EKS orchestrator take minutes to come InService (`clusters`), their
//! instance groups' nodes launch and pass health checks on the sim's clock (`groups`,
//! `placement`, `instances`), updates refuse to change what AWS keeps immutable, and
//! per-type quotas a test can set hold them back. Cluster-level settings (autoscaling
//! with its cluster role, tiered storage) are checked together (`settings`), since AWS
//! ties them to each other and to the orchestrator. Node actions and software updates
//! (`nodes`), managed Karpenter's calls (`autoscaling`), what the Kubernetes emulator
//! reads (`kubernetes`), training plans, MLflow tracking servers, the public model hub's
//! JumpStart catalogue (`hub_contents`) and the instance-type table live in submodules.
//! The data types live here, so every submodule reads them the same way.

use std::collections::BTreeMap;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Json, Response};
use serde_json::Value;

use crate::world::{Aws, AwsError, Phase, Shared, region_of};

mod autoscaling;
mod clusters;
mod groups;
pub mod hub_contents;
pub mod instance_types;
mod instances;
mod kubernetes;
mod lookups;
mod mlflow;
mod mlflow_server;
mod nodes;
mod paging;
mod placement;
mod settings;
#[cfg(test)]
mod tests;
pub mod training_plans;

use autoscaling::AutoScaling;
pub use autoscaling::AutoscaledGroup;
pub use kubernetes::{Features, Instance};
use lookups::Lookups;
use nodes::NodeAction;
pub use nodes::{HealthFault, Recovery};
use paging::{Order, page};
use placement::Placement;

pub const CLUSTER_CREATE_SECS: f64 = 900.0;
pub const CLUSTER_UPDATE_SECS: f64 = 300.0;
pub const CLUSTER_DELETE_SECS: f64 = 300.0;
pub const NODE_BOOT_SECS: f64 = 300.0;
pub const DEEP_HEALTH_CHECK_SECS: f64 = 600.0;
/// How long HyperPod takes to install (AutoScaling Creating) or remove (Deleting) its
/// managed Karpenter; AWS publishes no figure, so this is the sim's.
pub const AUTOSCALING_SECS: f64 = 120.0;

/// Default "cluster usage" quotas per instance type, from the instance-type table;
/// `PUT /_sim/sagemaker/quotas` changes them.
pub fn default_quotas() -> BTreeMap<String, u32> {
    instance_types::default_table()
        .into_iter()
        .map(|(t, facts)| (t, facts.default_quota))
        .collect()
}

fn validation(message: impl Into<String>) -> AwsError {
    AwsError::new(400, "ValidationException", message)
}

#[derive(Clone, Debug)]
struct Node {
    id: String,
    /// Stays with the node's slot through replacements, as AWS's NodeLogicalId does.
    logical_id: String,
    launched: f64,
    /// The HyperPod image release the node runs.
    release: String,
    action: Option<NodeAction>,
    /// When a platform software update last finished on this instance.
    software_updated: Option<f64>,
    /// A recovery HyperPod owes the node (health-agent fault or a user's label).
    health: Option<nodes::Health>,
    /// Reboots this instance has been through: a rebooted Node reports a new bootID.
    boots: u32,
    /// When its latest reboot ended: a fault it recovered from is over since then.
    rebooted: Option<f64>,
}

#[derive(Clone, Debug)]
struct Group {
    name: String,
    instance_type: String,
    target: u32,
    spec: Value,
    deep_health_checks: bool,
    nodes: Vec<Node>,
    release: String,
    desired_release: String,
    placement: Placement,
    /// The group's `KubernetesConfig` before the latest UpdateCluster: what its nodes
    /// are reported to carry (`Current…`) until that update is over.
    previous_kubernetes: Value,
}

#[derive(Clone, Debug)]
pub struct Cluster {
    name: String,
    region: String,
    created: f64,
    phase: Option<(Phase, f64)>,
    orchestrator: Value,
    vpc: Value,
    /// Where groups without an `OverrideVpcConfig` run.
    placement: Placement,
    node_recovery: String,
    provisioning: Option<String>,
    groups: Vec<Group>,
    /// An UpdateClusterSoftware is rolling over the nodes.
    system_update: bool,
    /// `Tags` given at creation, as `[{Key, Value}]`; read back with ListTags.
    tags: Value,
    /// The IAM role HyperPod assumes to add and remove nodes for autoscaling.
    cluster_role: Option<String>,
    auto_scaling: Option<AutoScaling>,
    /// `TieredStorageConfig` as last requested, and as it was before the latest
    /// UpdateCluster: what the nodes run until that update is over.
    tiered: Option<Value>,
    tiered_before: Option<Value>,
}

#[derive(Default)]
pub struct SageMaker {
    clusters: BTreeMap<String, Cluster>,
    pub quotas: BTreeMap<String, u32>,
    pub instance_types: BTreeMap<String, instance_types::InstanceType>,
    pub training_plans: training_plans::TrainingPlans,
    pub mlflow: mlflow::Mlflow,
    nodes: u64,
}

impl SageMaker {
    pub fn new() -> Self {
        Self {
            quotas: default_quotas(),
            instance_types: instance_types::default_table(),
            training_plans: training_plans::TrainingPlans::new(),
            ..Self::default()
        }
    }
}

impl SageMaker {
    /// Forgets the HyperPod clusters orchestrated by EKS cluster `eks_name`.
    pub fn forget_on_eks(&mut self, eks_name: &str) {
        self.clusters.retain(|_, c| !on_eks(c, eks_name));
    }

    /// The EKS cluster that HyperPod cluster `name` (its name or ARN) runs on, if any.
    pub fn orchestrator_of(&self, name: &str) -> Option<String> {
        let key = name.rsplit('/').next().unwrap_or(name);
        let c = self
            .clusters
            .values()
            .find(|c| c.name == key || c.name.eq_ignore_ascii_case(key))?;
        let arn = c.orchestrator["Eks"]["ClusterArn"].as_str()?;
        Some(arn.rsplit_once(":cluster/")?.1.to_owned())
    }
}

fn check_name(name: &str, what: &str) -> Result<(), AwsError> {
    check_hyphenated(name, what, 63, "^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$")
}

/// SageMaker's rule for names of the `[a-zA-Z0-9](-*[a-zA-Z0-9]){0,n}` kind: 1 to `max`
/// alphanumerics and hyphens, alphanumeric at both ends. The message quotes `pattern` as
/// the API reference spells it for that field.
fn check_hyphenated(name: &str, what: &str, max: usize, pattern: &str) -> Result<(), AwsError> {
    let ok = (1..=max).contains(&name.len())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric());
    if ok {
        Ok(())
    } else {
        Err(validation(format!(
            "1 validation error detected: Value '{name}' at '{what}' failed to satisfy constraint: Member must satisfy regular expression pattern: {pattern}"
        )))
    }
}

fn str_field<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key).and_then(Value::as_str)
}

/// Whether HyperPod cluster `c` is orchestrated by EKS cluster `eks_name`.
fn on_eks(c: &Cluster, eks_name: &str) -> bool {
    c.orchestrator["Eks"]["ClusterArn"]
        .as_str()
        .and_then(|arn| arn.rsplit_once(":cluster/"))
        .is_some_and(|(_, name)| name == eks_name)
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
    // moto is asked before EKS and SageMaker are locked.
    let moto = state.moto.clone();
    let lookups = match Lookups::gather(moto.as_ref(), &region, &op, &body).await {
        Ok(l) => l,
        Err(e) => return e.into_response(),
    };
    let fault = crate::world::injected(&state, "sagemaker", &op).await;
    let lost = matches!(fault, Some(crate::world::FaultKind::Lost));
    if let Some(e) = fault.filter(|_| !lost).and_then(crate::world::aws_error) {
        return e.into_response();
    }
    let mut guard = state.aws.lock().await;
    let w: &mut Aws = &mut guard;
    let result = match op.as_str() {
        "CreateCluster" => clusters::create_cluster(w, &region, &body, &lookups),
        "DescribeCluster" => clusters::describe_cluster(w, &body),
        "ListClusters" => clusters::list_clusters(w, &region),
        "UpdateCluster" => clusters::update_cluster(w, &body, &lookups),
        "DeleteCluster" => clusters::delete_cluster(w, &body),
        "ListClusterNodes" => instances::list_nodes(w, &body),
        "DescribeClusterNode" => instances::describe_node(w, &body),
        "ListTags" => clusters::list_tags(w, &body),
        "BatchDeleteClusterNodes" => nodes::batch_delete(w, &body),
        "BatchRebootClusterNodes" => nodes::batch_reboot(w, &body),
        "BatchReplaceClusterNodes" => nodes::batch_replace(w, &body),
        "UpdateClusterSoftware" => nodes::update_software(w, &body),
        "SearchTrainingPlanOfferings" => training_plans::search(w, &body),
        "CreateTrainingPlan" => training_plans::create(w, &region, &body),
        "DescribeTrainingPlan" => training_plans::describe(w, &body),
        "ListTrainingPlans" => training_plans::list(w, &region, &body),
        "CreateMlflowTrackingServer" => mlflow::create(w, &region, &body, &lookups),
        "DescribeMlflowTrackingServer" => mlflow::describe(w, &body),
        "ListMlflowTrackingServers" => mlflow::list(w, &region, &body),
        "UpdateMlflowTrackingServer" => mlflow::update(w, &body),
        "DeleteMlflowTrackingServer" => mlflow::delete(w, &body),
        "CreatePresignedMlflowTrackingServerUrl" => mlflow::presigned_url(w, &body),
        "DescribeHubContent" => hub_contents::describe(&region, &body),
        "ListHubContents" => hub_contents::list(&region, &body),
        other => Err(AwsError::new(
            400,
            "UnknownOperationException",
            format!("hypd-sim does not implement SageMaker.{other}"),
        )),
    };
    // A call that may have changed a HyperPod cluster wakes the controllers of the EKS
    // cluster it runs on, which read its nodes and features.
    if !(op.starts_with("Describe") || op.starts_with("List"))
        && let Some(eks) =
            str_field(&body, "ClusterName").and_then(|c| w.sagemaker.orchestrator_of(c))
    {
        w.kube.wake(&eks);
    }
    if lost {
        return crate::world::aws_error(crate::world::FaultKind::Lost)
            .map(IntoResponse::into_response)
            .unwrap_or_default();
    }
    match result {
        Ok(v) => Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}
