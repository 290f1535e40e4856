//! Reading the clusters hypd manages. These answer from hypd's store (fast, no AWS
//! call); the cluster's live state is refreshed by the operations that change it.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::command::{Command, CommandSpec, Effect, HttpMethod, Role};
use super::error::{ApiError, FieldError};
use super::inspect::efa_only_allowed;
use super::operations::OperationRef;
use super::values::{
    AzName, BucketName, Cidr, ClusterName, EksClusterName, IdempotencyKey, InstanceCount,
    KubernetesVersion, MlInstanceType, Region, TrainingPlanArn, VpcId,
};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ClusterSummary {
    pub name: String,
    pub region: String,
    /// hypd's view: `creating`, `active`, `failed`, `deleting`, `imported`.
    pub status: String,
    pub kubernetes_version: Option<String>,
    pub eks_cluster_arn: Option<String>,
    pub hyperpod_cluster_arn: Option<String>,
    pub created_at: String,
    pub updated_at: String,
    /// HyperPod node health as hypd last saw it (when a creation finished, and on every
    /// `describe_cluster`); absent until first seen. Listing never asks AWS.
    #[serde(default)]
    pub nodes: Option<ObservedNodes>,
}

/// Node counts by health, as of `observed_at` (RFC 3339, UTC).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ObservedNodes {
    pub counts: NodeCounts,
    pub observed_at: String,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListClusters {}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ClusterList {
    pub clusters: Vec<ClusterSummary>,
}

impl Command for ListClusters {
    type Output = ClusterList;
    const SPEC: CommandSpec = CommandSpec {
        name: "list_clusters",
        summary: "List the clusters hypd manages (created or imported)",
        description: "Returns every cluster hypd manages with its region, status, Kubernetes version and the EKS and HyperPod ARNs. Call it before creating a cluster: the name may be taken, or an existing cluster may already fit.",
        effect: Effect::ReadOnly,
        role: Role::Viewer,
        idempotent: true,
        status_command: None,
        method: HttpMethod::Get,
        path: "/api/v1/clusters",
    };
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GetCluster {
    pub name: ClusterName,
}

impl Command for GetCluster {
    type Output = ClusterSummary;
    const SPEC: CommandSpec = CommandSpec {
        name: "get_cluster",
        summary: "Show one managed cluster",
        description: "Returns one managed cluster by name: region, status, Kubernetes version, EKS and HyperPod ARNs. Fails with not_found for a cluster hypd does not manage.",
        effect: Effect::ReadOnly,
        role: Role::Viewer,
        idempotent: true,
        status_command: None,
        method: HttpMethod::Get,
        path: "/api/v1/clusters/{name}",
    };
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DescribeCluster {
    /// A managed cluster's name (imported EKS clusters may contain underscores).
    pub name: EksClusterName,
}

/// One managed cluster as AWS and Kubernetes report it now: unlike `get_cluster`, which
/// answers from hypd's store, this asks EKS and SageMaker on every call.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ClusterDescription {
    /// hypd's record of the cluster.
    pub cluster: ClusterSummary,
    /// The EKS control plane; `None` while it does not exist (early in a creation).
    pub eks: Option<EksInfo>,
    /// The HyperPod cluster; `None` for an EKS cluster without one.
    pub hyperpod: Option<HyperPodInfo>,
    pub instance_groups: Vec<InstanceGroupInfo>,
    pub nodes: Vec<NodeInfo>,
    /// The nodes counted by health.
    pub node_counts: NodeCounts,
    /// EKS add-ons with their versions and states.
    pub addons: Vec<AddonInfo>,
    /// What runs inside the cluster (operators, device plugins, schedulers), read from
    /// Kubernetes by the module that installs them; empty until it does.
    pub components: Vec<ComponentStatus>,
    /// Shared storage as mounted in the cluster (buckets, PVCs), read from Kubernetes by
    /// the module that provisions it; empty until it does.
    pub storage: Vec<StorageStatus>,
    /// When AWS was asked (RFC 3339, UTC).
    pub fetched_at: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct EksInfo {
    pub arn: Option<String>,
    /// `CREATING`, `ACTIVE`, `UPDATING`, `DELETING`, `FAILED`.
    pub status: Option<String>,
    pub kubernetes_version: Option<String>,
    pub platform_version: Option<String>,
    pub endpoint: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct HyperPodInfo {
    pub name: Option<String>,
    pub arn: Option<String>,
    /// `Creating`, `InService`, `Updating`, `SystemUpdating`, `Failed`, `Deleting`, …
    pub status: Option<String>,
    /// `Automatic` replaces or reboots faulty nodes without a request.
    pub node_recovery: Option<String>,
    pub failure_message: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct InstanceGroupInfo {
    pub name: String,
    /// The HyperPod instance type, e.g. `ml.p5.48xlarge`.
    pub instance_type: Option<String>,
    /// Instances running now.
    pub current_count: u32,
    /// Instances asked for.
    pub target_count: u32,
    /// `InService`, `Creating`, `Updating`, `Degraded`, `SystemUpdating`, `Failed`, …
    pub status: Option<String>,
    /// Set when the group's capacity comes from a training plan.
    pub training_plan_arn: Option<String>,
}

/// How a node is doing, from HyperPod's instance status: `Running` is healthy; `Pending`,
/// `DeepHealthCheckInProgress` and `SystemUpdating` are on their way; anything else
/// (`Failure`, `ShuttingDown`, `NotFound`, a status AWS adds later) needs attention.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum NodeHealth {
    Healthy,
    Pending,
    Unhealthy,
}

impl NodeHealth {
    pub fn from_instance_status(status: &str) -> Self {
        match status {
            "Running" => NodeHealth::Healthy,
            "Pending" | "DeepHealthCheckInProgress" | "SystemUpdating" => NodeHealth::Pending,
            _ => NodeHealth::Unhealthy,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            NodeHealth::Healthy => "healthy",
            NodeHealth::Pending => "pending",
            NodeHealth::Unhealthy => "unhealthy",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct NodeInfo {
    /// The EC2 instance id, e.g. `i-0123456789abcdef0`.
    pub node_id: String,
    pub instance_group: String,
    pub instance_type: String,
    /// HyperPod's instance status, e.g. `Running`, `Pending`, `Failure`.
    pub status: String,
    pub health: NodeHealth,
    /// HyperPod's note on the status, when it gives one.
    pub message: Option<String>,
    /// RFC 3339, UTC.
    pub launch_time: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct NodeCounts {
    pub total: u32,
    pub healthy: u32,
    pub pending: u32,
    pub unhealthy: u32,
}

impl NodeCounts {
    pub fn of(nodes: &[NodeInfo]) -> Self {
        let mut c = NodeCounts::default();
        for n in nodes {
            c.total += 1;
            match n.health {
                NodeHealth::Healthy => c.healthy += 1,
                NodeHealth::Pending => c.pending += 1,
                NodeHealth::Unhealthy => c.unhealthy += 1,
            }
        }
        c
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct AddonInfo {
    pub name: String,
    pub version: Option<String>,
    /// `CREATING`, `ACTIVE`, `DEGRADED`, `CREATE_FAILED`, `UPDATING`, …
    pub status: Option<String>,
    /// EKS's health issues, when it reports any.
    pub issues: Vec<String>,
}

/// A component hypd installs inside the cluster (e.g. the HyperPod training operator).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ComponentStatus {
    pub name: String,
    pub version: Option<String>,
    /// e.g. `ready`, `progressing`, `failed`.
    pub state: String,
}

/// Shared storage as the cluster sees it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct StorageStatus {
    /// e.g. `s3` (Mountpoint for S3), `fsx-lustre`.
    pub kind: String,
    pub bucket: Option<String>,
    /// The PersistentVolumeClaim that mounts it.
    pub pvc: Option<String>,
    pub namespace: Option<String>,
    /// The claim's phase: `Pending`, `Bound`, `Lost`.
    pub phase: Option<String>,
}

impl Command for DescribeCluster {
    type Output = ClusterDescription;
    const SPEC: CommandSpec = CommandSpec {
        name: "describe_cluster",
        summary: "Show a managed cluster's live state: instance groups, nodes and their health, add-ons",
        description: "Asks AWS now (not hypd's store) about one managed cluster: the EKS control plane's status and version, the HyperPod cluster's status, each instance group's instance type with current and target counts, every node (instance id, group, type, status, health, launch time) with counts by health, and the EKS add-ons with versions and states. Read-only; fails with not_found for a cluster hypd does not manage. Use get_cluster for hypd's stored record only.",
        effect: Effect::ReadOnly,
        role: Role::Viewer,
        idempotent: true,
        status_command: None,
        method: HttpMethod::Get,
        path: "/api/v1/clusters/{name}/describe",
    };
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ImportCluster {
    /// The existing EKS cluster's name; hypd manages it under the same name.
    pub name: EksClusterName,
    /// Its region; hypd's own when omitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<Region>,
    /// The HyperPod cluster orchestrated by it, when there is more than one; found by its
    /// EKS orchestrator when omitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hyperpod_cluster: Option<ClusterName>,
    /// Re-sending a request with the same key returns the same operation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<IdempotencyKey>,
}

impl Command for ImportCluster {
    type Output = OperationRef;
    const SPEC: CommandSpec = CommandSpec {
        name: "import_cluster",
        summary: "Manage an existing EKS cluster (and its HyperPod cluster) with hypd",
        description: "Adopts an existing, ACTIVE EKS cluster: grants hypd's own IAM principal cluster-admin through an EKS access entry, finds the HyperPod cluster it orchestrates (or the one named), records the cluster and makes it your active cluster. Nothing else is changed. Returns an operation: follow it with wait_operation.",
        effect: Effect::Mutating,
        role: Role::Operator,
        idempotent: true,
        status_command: Some("get_operation"),
        method: HttpMethod::Post,
        path: "/api/v1/clusters/import",
    };
}

/// Where the accelerated instances come from. It cannot change for the instance group's
/// life.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Capacity {
    /// Pay as you go, subject to the account's SageMaker quota for the type.
    #[default]
    OnDemand,
    /// Spare capacity at a discount; instances can be reclaimed.
    Spot,
    /// Reserved capacity bought with `create_training_plan`; it fixes the AZ.
    TrainingPlan { training_plan_arn: TrainingPlanArn },
}

/// Advanced network settings; by default hypd creates a new VPC with a free /16.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NetworkOptions {
    /// The new VPC's block (a /16 that overlaps no VPC of the region); chosen when
    /// omitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vpc_cidr: Option<Cidr>,
    /// Use this existing VPC instead of creating one; hypd adds its subnets to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vpc_id: Option<VpcId>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StorageOptions {
    /// The shared bucket for lifecycle scripts, data and checkpoints, mounted in the
    /// cluster through Mountpoint for S3. hypd creates `hypd-<cluster>-<account>` when
    /// omitted; a named bucket is created if it does not exist.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub s3_bucket: Option<BucketName>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateCluster {
    /// Used for the EKS and the HyperPod cluster alike.
    pub name: ClusterName,
    /// hypd's own region when omitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<Region>,
    /// Where the accelerated instances run (a training plan fixes it).
    pub availability_zone: AzName,
    /// The HyperPod instance type of the first instance group, e.g. `ml.p5.48xlarge`.
    pub instance_type: MlInstanceType,
    /// How many instances (at least 1).
    pub instance_count: InstanceCount,
    #[serde(default)]
    pub capacity: Capacity,
    /// EFA-only network interfaces (all EFA cards for the collective traffic); only for
    /// multi-EFA types such as p4d, p5, p5e, p5en, p6 and g6e.24xlarge/48xlarge.
    #[serde(default)]
    pub efa_only: bool,
    /// Run the stress and connectivity checks on every new instance before it joins.
    #[serde(default)]
    pub deep_health_checks: bool,
    /// The EKS version; hypd's tested default when omitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes_version: Option<KubernetesVersion>,
    #[serde(default)]
    pub storage: StorageOptions,
    #[serde(default)]
    pub network: NetworkOptions,
    /// Re-sending a request with the same key returns the same operation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<IdempotencyKey>,
}

impl Command for CreateCluster {
    type Output = OperationRef;
    const SPEC: CommandSpec = CommandSpec {
        name: "create_cluster",
        summary: "Create a GPU cluster: network, IAM, EKS, HyperPod with automatic node recovery, storage",
        description: "Creates everything a HyperPod-on-EKS training cluster needs from decision-level inputs (name, Availability Zone, instance type and count, capacity type, EFA-only, deep health checks): a VPC with public, private and /20 compute subnets, NAT, S3 endpoint and an EFA security group; IAM roles; the EKS control plane with hypd's access entry and OIDC provider; EKS add-ons; the HyperPod cluster with NodeRecovery=Automatic and continuous provisioning; the shared S3 bucket. Problems found before anything is created (name taken, type not offered in the AZ, overlapping CIDR, EFA-only on an ineligible type) are field errors. Returns an operation (15-30 minutes on AWS): follow it with wait_operation.",
        effect: Effect::Mutating,
        role: Role::Operator,
        idempotent: true,
        status_command: Some("get_operation"),
        method: HttpMethod::Post,
        path: "/api/v1/clusters",
    };

    fn validate(&self) -> Result<(), ApiError> {
        let mut errors = Vec::new();
        if self.instance_count.get() == 0 {
            errors.push(FieldError::new(
                "instance_count",
                "a new cluster needs at least 1 instance",
            ));
        }
        if self.efa_only && !efa_only_allowed(self.instance_type.as_str(), None) {
            errors.push(FieldError::new(
                "efa_only",
                format!(
                    "{} has fewer than two EFA cards; EFA-only mode needs a multi-EFA type (p4d, p4de, p5, p5e, p5en, p6-b200, p6-b300, g6e.24xlarge, g6e.48xlarge)",
                    self.instance_type
                ),
            ));
        }
        if self.network.vpc_cidr.is_some() && self.network.vpc_id.is_some() {
            errors.push(FieldError::new(
                "network.vpc_cidr",
                "give either vpc_cidr (a new VPC) or vpc_id (an existing one), not both",
            ));
        }
        if let Some(cidr) = self.network.vpc_cidr
            && cidr.prefix() != 16
        {
            errors.push(FieldError::new(
                "network.vpc_cidr",
                format!(
                    "the VPC block must be a /16 (room for the /24 and /20 subnets); got /{}",
                    cidr.prefix()
                ),
            ));
        }
        if let Some(region) = &self.region
            && !self.availability_zone.as_str().starts_with(region.as_str())
        {
            errors.push(FieldError::new(
                "availability_zone",
                format!("{} is not in {region}", self.availability_zone),
            ));
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(ApiError::Validation { errors })
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeleteCluster {
    pub name: EksClusterName,
    /// Re-sending a request with the same key returns the same operation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<IdempotencyKey>,
}

impl Command for DeleteCluster {
    type Output = OperationRef;
    const SPEC: CommandSpec = CommandSpec {
        name: "delete_cluster",
        summary: "Delete a cluster and everything hypd created for it",
        description: "Tears down, in order, what hypd created for the cluster and nothing else: the HyperPod cluster, EKS add-ons, the EKS cluster (or, for an imported cluster, only hypd's access entry), IAM roles and OIDC provider, the network (NAT, gateways, route tables, subnets, security group, VPC), and the shared bucket if it holds only hypd's lifecycle scripts (a bucket with data is kept and reported). Running workloads are lost. Returns an operation: follow it with wait_operation.",
        effect: Effect::Destructive,
        role: Role::Operator,
        idempotent: true,
        status_command: Some("get_operation"),
        method: HttpMethod::Delete,
        path: "/api/v1/clusters/{name}",
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(extra: serde_json::Value) -> Result<CreateCluster, String> {
        let mut v = serde_json::json!({
            "name": "ml-1", "availability_zone": "us-east-1a",
            "instance_type": "ml.p5.48xlarge", "instance_count": 2,
        });
        if let (Some(base), Some(extra)) = (v.as_object_mut(), extra.as_object()) {
            base.extend(extra.clone());
        }
        serde_json::from_value(v).map_err(|e| e.to_string())
    }

    fn fields(r: &CreateCluster) -> Vec<String> {
        match r.validate() {
            Ok(()) => vec![],
            Err(ApiError::Validation { errors }) => errors.into_iter().map(|e| e.field).collect(),
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn decision_level_defaults() {
        let r = request(serde_json::json!({})).unwrap();
        assert_eq!(r.capacity, Capacity::OnDemand);
        assert!(!r.efa_only && !r.deep_health_checks);
        assert!(fields(&r).is_empty());
        let r = request(serde_json::json!({"capacity": {"type": "training_plan",
            "training_plan_arn": "arn:aws:sagemaker:us-east-1:123456789012:training-plan/p5-week"}}))
        .unwrap();
        assert!(matches!(r.capacity, Capacity::TrainingPlan { .. }));
    }

    #[test]
    fn cross_field_rules_name_their_field() {
        let r = request(serde_json::json!({"instance_count": 0})).unwrap();
        assert_eq!(fields(&r), ["instance_count"]);
        let r = request(serde_json::json!({"instance_type": "ml.g5.8xlarge", "efa_only": true}))
            .unwrap();
        assert_eq!(fields(&r), ["efa_only"]);
        let r = request(serde_json::json!({"instance_type": "ml.p5en.48xlarge", "efa_only": true}))
            .unwrap();
        assert!(fields(&r).is_empty());
        let r = request(serde_json::json!({"network": {"vpc_cidr": "10.1.0.0/16", "vpc_id": "vpc-0123456789abcdef0"}})).unwrap();
        assert_eq!(fields(&r), ["network.vpc_cidr"]);
        let r = request(serde_json::json!({"network": {"vpc_cidr": "10.1.0.0/20"}})).unwrap();
        assert_eq!(fields(&r), ["network.vpc_cidr"]);
        let r = request(serde_json::json!({"region": "us-west-2"})).unwrap();
        assert_eq!(fields(&r), ["availability_zone"]);
        assert!(request(serde_json::json!({"capacity": {"type": "reserved"}})).is_err());
        assert!(request(serde_json::json!({"storage": {"s3_bucket": "Bad_Bucket"}})).is_err());
    }

    #[test]
    fn nodes_are_counted_by_health() {
        let node = |status: &str| NodeInfo {
            node_id: "i-0".into(),
            instance_group: "g".into(),
            instance_type: "ml.g5.8xlarge".into(),
            status: status.into(),
            health: NodeHealth::from_instance_status(status),
            message: None,
            launch_time: None,
        };
        let nodes: Vec<NodeInfo> = [
            "Running",
            "Running",
            "DeepHealthCheckInProgress",
            "Failure",
            "SomethingNew",
        ]
        .map(node)
        .to_vec();
        assert_eq!(
            NodeCounts::of(&nodes),
            NodeCounts {
                total: 5,
                healthy: 2,
                pending: 1,
                unhealthy: 2
            }
        );
    }
}
