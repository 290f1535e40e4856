//! The cluster commands: reading what hypd manages (`list_clusters` and `get_cluster`
//! answer from hypd's store, with no AWS call; `describe_cluster` asks AWS and the
//! cluster now) and the operations that create, import and delete clusters, with their
//! decision-level inputs (instance groups, capacity, network and storage options).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::command::{Command, CommandSpec, Effect, HttpMethod, Role};
use super::error::{ApiError, FieldError};
use super::inspect::efa_only_allowed;
use super::listing::Listing;
use super::operations::OperationRef;
use super::plan::{FieldChange, Gated};
use super::values::{
    AzName, BucketName, Cidr, ClusterName, Confirmation, EksClusterName, IdempotencyKey,
    InstanceCount, InstanceGroupName, KubernetesVersion, MlInstanceType, Region, ThreadsPerCore,
    TrainingPlanArn, VolumeSizeGb, VpcId,
};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ClusterSummary {
    pub name: String,
    pub region: String,
    /// hypd's view: `creating`, `active` (created and usable), `imported`, `failed` (its
    /// creation failed; the operation says where and why, and `retry_operation` resumes
    /// it), `deleting` (a deletion started; it stays so if the deletion fails).
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
    pub clusters: Listing<ClusterSummary>,
}

impl Command for ListClusters {
    type Output = ClusterList;
    const SPEC: CommandSpec = CommandSpec {
        name: "list_clusters",
        summary: "List the clusters hypd manages (created or imported)",
        description: "Clusters hypd manages. Call it before creating one: the name may be taken, or an existing cluster may already fit.",
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
        description: "hypd's stored record of one managed cluster; describe_cluster reads its live state from AWS.",
        effect: Effect::ReadOnly,
        role: Role::Viewer,
        idempotent: true,
        status_command: None,
        method: HttpMethod::Get,
        path: "/api/v1/clusters/{name}",
    };
}

// `refresh` reads HyperPod's nodes now instead of answering from a read up to a few
// seconds old (the one `list_nodes` shares). Plain comment: keeps tools/list short.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DescribeCluster {
    /// A managed cluster's name (imported EKS clusters may contain underscores).
    pub name: EksClusterName,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub refresh: bool,
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

/// HyperPod's instance status: `Running` is healthy; `Pending`,
/// `DeepHealthCheckInProgress` and `SystemUpdating` are on their way; any other needs
/// attention.
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
    /// The HyperPod platform image release it runs.
    #[serde(default)]
    pub image_release: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct NodeCounts {
    pub total: u32,
    pub healthy: u32,
    pub pending: u32,
    pub unhealthy: u32,
}

impl NodeCounts {
    pub fn of<'a>(nodes: impl IntoIterator<Item = &'a NodeInfo>) -> Self {
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
        description: "A cluster's live state from AWS: status, instance groups, nodes by health, add-ons. Use get_cluster for hypd's stored record only.",
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
    /// Only answer with the plan: every object each stage would make or change, ids made
    /// by an earlier stage shown as "(known after apply)". Nothing is changed or stored.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dry_run: bool,
}

impl Command for ImportCluster {
    type Output = Gated<OperationRef>;
    const SPEC: CommandSpec = CommandSpec {
        name: "import_cluster",
        summary: "Manage an existing EKS cluster (and its HyperPod cluster) with hypd",
        description: "Brings an existing ACTIVE EKS cluster and its HyperPod cluster under hypd, changing only hypd's own access. Returns an operation for wait_operation; dry_run returns the plan.",
        effect: Effect::Mutating,
        role: Role::Operator,
        idempotent: true,
        status_command: Some("get_operation"),
        method: HttpMethod::Post,
        path: "/api/v1/clusters/import",
    };

    super::command::dry_run_request!();
}

/// Where the instances come from; fixed for the group's life.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Capacity {
    /// Pay as you go, within the account's SageMaker quota for the type.
    #[default]
    OnDemand,
    /// Spare capacity at a discount; instances can be reclaimed.
    Spot,
    /// Reserved capacity bought as a SageMaker training plan; it fixes the AZ.
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
    /// The shared bucket, mounted in the cluster at /s3: `hypd-<cluster>-<account>` when
    /// omitted; created if it does not exist.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub s3_bucket: Option<BucketName>,
}

impl Capacity {
    /// The capacity type's name, as errors and plans show it.
    pub fn kind(&self) -> &'static str {
        match self {
            Capacity::OnDemand => "on_demand",
            Capacity::Spot => "spot",
            Capacity::TrainingPlan { .. } => "training_plan",
        }
    }
}

fn default_volume_size() -> VolumeSizeGb {
    VolumeSizeGb::new(DEFAULT_VOLUME_SIZE_GB).expect("the default volume size is in range")
}

/// The EBS volume each instance gets at `/opt/sagemaker` unless a group names one.
pub const DEFAULT_VOLUME_SIZE_GB: u32 = 500;

/// One HyperPod instance group at decision level. Its instance type, capacity type and
/// EFA-only mode are fixed for the group's life; the rest may change later.
// (`InstanceGroupSpec::diff` refuses to change them. A plain comment: the doc above is
// what agents read in the schema.)
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct InstanceGroupSpec {
    /// Unique within the cluster, e.g. `gpu-spot`.
    pub name: InstanceGroupName,
    /// The HyperPod instance type, e.g. `ml.p5.48xlarge`.
    pub instance_type: MlInstanceType,
    /// How many instances.
    pub instance_count: InstanceCount,
    #[serde(default)]
    pub capacity: Capacity,
    /// Every EFA card for collective traffic; only multi-EFA types (p4d, p5*, p6,
    /// g6e.24/48xlarge).
    #[serde(default)]
    pub efa_only: bool,
    /// Run the stress and connectivity checks on every new instance before it joins.
    #[serde(default)]
    pub deep_health_checks: bool,
    /// EBS volume per instance in GB, mounted at /opt/sagemaker (default 500).
    #[serde(default = "default_volume_size")]
    pub volume_size_gb: VolumeSizeGb,
    /// 1 turns hyperthreading off (default 2 on p4, p5, p6 and training plans, else the
    /// type's own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threads_per_core: Option<ThreadsPerCore>,
    // Where the group's instances run (default the cluster's zone); labels and taints
    // HyperPod puts on its Nodes. Plain comments keep tools/list short.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub availability_zone: Option<AzName>,
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub kubernetes_labels: std::collections::BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kubernetes_taints: Vec<Taint>,
}

// A Kubernetes taint on a group's Nodes.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Taint {
    pub key: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    pub effect: TaintEffect,
}

#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
pub enum TaintEffect {
    NoSchedule,
    PreferNoSchedule,
    NoExecute,
}

impl TaintEffect {
    pub fn as_str(self) -> &'static str {
        match self {
            TaintEffect::NoSchedule => "NoSchedule",
            TaintEffect::PreferNoSchedule => "PreferNoSchedule",
            TaintEffect::NoExecute => "NoExecute",
        }
    }
}

/// Kubernetes' rule for a label or taint key: an optional DNS-subdomain prefix and `/`,
/// then a name of up to 63 letters, digits, `-`, `_`, `.`, starting and ending with a
/// letter or digit. Keys under `sagemaker.amazonaws.com/` are HyperPod's own.
pub fn key_problem(key: &str) -> Option<String> {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if prefix
        .is_some_and(|p| p == "sagemaker.amazonaws.com" || p.ends_with(".sagemaker.amazonaws.com"))
    {
        return Some(format!(
            "{key:?} is under sagemaker.amazonaws.com/, which HyperPod keeps for its own labels"
        ));
    }
    let prefix_ok = prefix.is_none_or(|p| {
        (1..=253).contains(&p.len())
            && p.split('.').all(|l| {
                (1..=63).contains(&l.len())
                    && l.chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                    && !l.starts_with('-')
                    && !l.ends_with('-')
            })
    });
    (!(prefix_ok && label_value_ok(name) && !name.is_empty())).then(|| {
        format!("{key:?} is not a Kubernetes key: an optional DNS prefix and '/', then up to 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit")
    })
}

/// Kubernetes' rule for a label value: empty, or up to 63 letters, digits, `-`, `_`, `.`,
/// starting and ending with a letter or digit.
pub fn label_value_ok(v: &str) -> bool {
    v.is_empty()
        || (v.len() <= 63
            && v.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
            && v.starts_with(|c: char| c.is_ascii_alphanumeric())
            && v.ends_with(|c: char| c.is_ascii_alphanumeric()))
}

/// The rules of a group's labels and taints, as field errors under `at`.
pub fn kubernetes_problems(
    labels: &std::collections::BTreeMap<String, String>,
    taints: &[Taint],
    at: &str,
    errors: &mut Vec<FieldError>,
) {
    let path = |f: String| {
        if at.is_empty() {
            f
        } else {
            format!("{at}.{f}")
        }
    };
    for (k, v) in labels {
        if let Some(p) = key_problem(k) {
            errors.push(FieldError::new(path(format!("kubernetes_labels.{k}")), p));
        } else if !label_value_ok(v) {
            errors.push(FieldError::new(
                path(format!("kubernetes_labels.{k}")),
                format!("{v:?} is not a Kubernetes label value: up to 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit"),
            ));
        }
    }
    for (i, t) in taints.iter().enumerate() {
        if let Some(p) = key_problem(&t.key) {
            errors.push(FieldError::new(
                path(format!("kubernetes_taints[{i}].key")),
                p,
            ));
        }
        if t.value.as_deref().is_some_and(|v| !label_value_ok(v)) {
            errors.push(FieldError::new(
                path(format!("kubernetes_taints[{i}].value")),
                "a taint value follows the label value rule: up to 63 letters, digits, '-', '_' or '.'",
            ));
        }
        if taints[..i]
            .iter()
            .any(|o| o.key == t.key && o.effect == t.effect)
        {
            errors.push(FieldError::new(
                path(format!("kubernetes_taints[{i}]")),
                format!("{} with {} is given twice", t.key, t.effect.as_str()),
            ));
        }
    }
}

impl InstanceGroupSpec {
    /// The group's own rules; `at` is its path in the request (`instance_groups[1]`).
    pub fn problems(&self, at: &str, errors: &mut Vec<FieldError>) {
        kubernetes_problems(&self.kubernetes_labels, &self.kubernetes_taints, at, errors);
        if self.efa_only && !efa_only_allowed(self.instance_type.as_str(), None) {
            errors.push(FieldError::new(
                format!("{at}.efa_only"),
                format!(
                    "{} has fewer than two EFA cards; EFA-only mode needs a multi-EFA type (p4d, p4de, p5, p5e, p5en, p6-b200, p6-b300, g6e.24xlarge, g6e.48xlarge)",
                    self.instance_type
                ),
            ));
        }
    }

    /// What changes from `self` (the group as it is) to `new`: the fields that may change
    /// for a group's life, old → new. Instance type, capacity type and EFA-only mode may
    /// not: changing one is `Immutable`, naming the field under `at`.
    pub fn diff(&self, new: &InstanceGroupSpec, at: &str) -> Result<Vec<FieldChange>, ApiError> {
        // A request that names the group's fields at its top level passes `at` empty.
        let path = |field: &str| {
            if at.is_empty() {
                field.to_owned()
            } else {
                format!("{at}.{field}")
            }
        };
        let immutable = |field: &str, old: String, new: String| ApiError::Immutable {
            field: path(field),
            message: format!(
                "it is {old} for the life of instance group {}; asked for {new}. Add a new group with the setting you want and delete this one",
                self.name
            ),
        };
        if self.instance_type != new.instance_type {
            return Err(immutable(
                "instance_type",
                self.instance_type.to_string(),
                new.instance_type.to_string(),
            ));
        }
        if self.capacity != new.capacity {
            let show = |c: &Capacity| match c {
                Capacity::TrainingPlan { training_plan_arn } => {
                    format!("training_plan {training_plan_arn}")
                }
                other => other.kind().to_owned(),
            };
            return Err(immutable(
                "capacity",
                show(&self.capacity),
                show(&new.capacity),
            ));
        }
        if self.availability_zone != new.availability_zone {
            let show = |z: &Option<AzName>| {
                z.as_ref()
                    .map_or_else(|| "the cluster's zone".to_owned(), |z| z.to_string())
            };
            return Err(immutable(
                "availability_zone",
                show(&self.availability_zone),
                show(&new.availability_zone),
            ));
        }
        if self.efa_only != new.efa_only {
            return Err(immutable(
                "efa_only",
                self.efa_only.to_string(),
                new.efa_only.to_string(),
            ));
        }
        let mut changes = Vec::new();
        let mut field = |name: &str, old: serde_json::Value, new: serde_json::Value| {
            if old != new {
                changes.push(FieldChange {
                    field: path(name),
                    old: Some(old),
                    new: Some(new),
                });
            }
        };
        use serde_json::json;
        field(
            "instance_count",
            json!(self.instance_count.get()),
            json!(new.instance_count.get()),
        );
        field(
            "deep_health_checks",
            json!(self.deep_health_checks),
            json!(new.deep_health_checks),
        );
        field(
            "volume_size_gb",
            json!(self.volume_size_gb.get()),
            json!(new.volume_size_gb.get()),
        );
        field(
            "threads_per_core",
            json!(self.threads_per_core.map(|t| t.get())),
            json!(new.threads_per_core.map(|t| t.get())),
        );
        field(
            "kubernetes_labels",
            json!(self.kubernetes_labels),
            json!(new.kubernetes_labels),
        );
        field(
            "kubernetes_taints",
            json!(self.kubernetes_taints),
            json!(new.kubernetes_taints),
        );
        Ok(changes)
    }
}

/// HyperPod's limit on instance groups in one CreateCluster request.
pub const MAX_INSTANCE_GROUPS: usize = 100;

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
    /// The HyperPod instance groups, one or more, each with its own type, count and
    /// capacity (e.g. an on-demand group and a spot group).
    pub instance_groups: Vec<InstanceGroupSpec>,
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
    /// Only answer with the plan: every object each stage would make or change, ids made
    /// by an earlier stage shown as "(known after apply)". Nothing is changed or stored.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dry_run: bool,
}

/// The single-group request stored before instance groups were a list. Operations
/// written then still resume: [`CreateCluster::from_stored`] reads this shape into one
/// group with the name those clusters' groups were given.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SingleGroupCreateCluster {
    name: ClusterName,
    #[serde(default)]
    region: Option<Region>,
    availability_zone: AzName,
    instance_type: MlInstanceType,
    instance_count: InstanceCount,
    #[serde(default)]
    capacity: Capacity,
    #[serde(default)]
    efa_only: bool,
    #[serde(default)]
    deep_health_checks: bool,
    #[serde(default)]
    kubernetes_version: Option<KubernetesVersion>,
    #[serde(default)]
    storage: StorageOptions,
    #[serde(default)]
    network: NetworkOptions,
    #[serde(default)]
    idempotency_key: Option<IdempotencyKey>,
}

/// The group name single-group clusters were created with.
pub const SINGLE_GROUP_NAME: &str = "accelerated-1";

impl CreateCluster {
    /// Reads a stored request, of today's shape or of the single-group one.
    pub fn from_stored(json: &str) -> Result<Self, serde_json::Error> {
        match serde_json::from_str::<CreateCluster>(json) {
            Ok(r) => Ok(r),
            Err(e) => {
                let Ok(old) = serde_json::from_str::<SingleGroupCreateCluster>(json) else {
                    return Err(e);
                };
                Ok(CreateCluster {
                    name: old.name,
                    region: old.region,
                    availability_zone: old.availability_zone,
                    instance_groups: vec![InstanceGroupSpec {
                        name: InstanceGroupName::parse(SINGLE_GROUP_NAME)
                            .expect("the single-group name is valid"),
                        instance_type: old.instance_type,
                        instance_count: old.instance_count,
                        capacity: old.capacity,
                        efa_only: old.efa_only,
                        deep_health_checks: old.deep_health_checks,
                        volume_size_gb: default_volume_size(),
                        threads_per_core: None,
                        availability_zone: None,
                        kubernetes_labels: Default::default(),
                        kubernetes_taints: Vec::new(),
                    }],
                    kubernetes_version: old.kubernetes_version,
                    storage: old.storage,
                    network: old.network,
                    idempotency_key: old.idempotency_key,
                    dry_run: false,
                })
            }
        }
    }

    /// Instances asked for across every group.
    pub fn total_instances(&self) -> u64 {
        self.instance_groups
            .iter()
            .map(|g| u64::from(g.instance_count.get()))
            .sum()
    }
}

impl Command for CreateCluster {
    type Output = Gated<OperationRef>;
    const SPEC: CommandSpec = CommandSpec {
        name: "create_cluster",
        summary: "Create a GPU cluster: network, IAM, EKS, HyperPod with automatic node recovery, storage",
        description: "Creates a HyperPod-on-EKS GPU cluster with its network and shared S3 storage. Ask the user the name, region, Availability Zone and, per instance group, instance type, count and capacity type (on-demand, spot, training plan); never CIDRs, subnets or security groups. Takes 15-30 minutes. Returns an operation for wait_operation; dry_run returns the plan.",
        effect: Effect::Mutating,
        role: Role::Operator,
        idempotent: true,
        status_command: Some("get_operation"),
        method: HttpMethod::Post,
        path: "/api/v1/clusters",
    };

    super::command::dry_run_request!();

    fn validate(&self) -> Result<(), ApiError> {
        let mut errors = Vec::new();
        if self.instance_groups.is_empty() {
            errors.push(FieldError::new(
                "instance_groups",
                "a cluster needs at least one instance group",
            ));
        } else if self.instance_groups.len() > MAX_INSTANCE_GROUPS {
            errors.push(FieldError::new(
                "instance_groups",
                format!(
                    "HyperPod takes at most {MAX_INSTANCE_GROUPS} instance groups per cluster (got {})",
                    self.instance_groups.len()
                ),
            ));
        } else if self.total_instances() == 0 {
            errors.push(FieldError::new(
                "instance_groups[0].instance_count",
                "a new cluster needs at least 1 instance in one of its groups",
            ));
        }
        for (i, g) in self.instance_groups.iter().enumerate() {
            let at = format!("instance_groups[{i}]");
            if let Some(first) = self.instance_groups[..i]
                .iter()
                .position(|o| o.name == g.name)
            {
                errors.push(FieldError::new(
                    format!("{at}.name"),
                    format!("instance_groups[{first}] is already named {}", g.name),
                ));
            }
            g.problems(&at, &mut errors);
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
        ApiError::unless_broken(errors)
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeleteCluster {
    pub name: EksClusterName,
    /// Re-sending a request with the same key returns the same operation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<IdempotencyKey>,
    /// Only answer with the plan: what would be deleted. Nothing is changed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dry_run: bool,
    /// The confirmation the same call without one returned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confirmation: Option<Confirmation>,
}

impl Command for DeleteCluster {
    type Output = Gated<OperationRef>;
    const SPEC: CommandSpec = CommandSpec {
        name: "delete_cluster",
        summary: "Delete a cluster and everything hypd created for it",
        description: "Deletes what hypd created for a cluster, nothing else (for an imported cluster, only hypd's access); a bucket with data is kept. Running workloads are lost. The first call returns the plan and a confirmation; call again with it once the user agrees. Returns an operation for wait_operation.",
        effect: Effect::Destructive,
        role: Role::Operator,
        idempotent: true,
        status_command: Some("get_operation"),
        method: HttpMethod::Delete,
        path: "/api/v1/clusters/{name}",
    };

    super::command::gated_request!();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(extra: serde_json::Value) -> Result<CreateCluster, String> {
        let mut v = serde_json::json!({
            "name": "ml-1", "availability_zone": "us-east-1a",
            "instance_groups": [{"name": "gpu", "instance_type": "ml.p5.48xlarge", "instance_count": 2}],
        });
        if let (Some(base), Some(extra)) = (v.as_object_mut(), extra.as_object()) {
            base.extend(extra.clone());
        }
        serde_json::from_value(v).map_err(|e| e.to_string())
    }

    fn group(extra: serde_json::Value) -> serde_json::Value {
        let mut g = serde_json::json!({"name": "gpu", "instance_type": "ml.p5.48xlarge", "instance_count": 2});
        if let (Some(base), Some(extra)) = (g.as_object_mut(), extra.as_object()) {
            base.extend(extra.clone());
        }
        g
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
        let g = &r.instance_groups[0];
        assert_eq!(g.capacity, Capacity::OnDemand);
        assert!(!g.efa_only && !g.deep_health_checks);
        assert_eq!(g.volume_size_gb.get(), DEFAULT_VOLUME_SIZE_GB);
        assert!(fields(&r).is_empty());
        let r = request(serde_json::json!({"instance_groups": [group(serde_json::json!({"capacity": {"type": "training_plan",
            "training_plan_arn": "arn:aws:sagemaker:us-east-1:123456789012:training-plan/p5-week"}}))]}))
        .unwrap();
        assert!(matches!(
            r.instance_groups[0].capacity,
            Capacity::TrainingPlan { .. }
        ));
    }

    #[test]
    fn cross_field_rules_name_their_field() {
        let r = request(
            serde_json::json!({"instance_groups": [group(serde_json::json!({"instance_count": 0}))]}),
        )
        .unwrap();
        assert_eq!(fields(&r), ["instance_groups[0].instance_count"]);
        let r = request(serde_json::json!({"instance_groups": []})).unwrap();
        assert_eq!(fields(&r), ["instance_groups"]);
        let r = request(serde_json::json!({"instance_groups": [
            group(serde_json::json!({})),
            group(serde_json::json!({"instance_type": "ml.g5.8xlarge", "efa_only": true})),
        ]}))
        .unwrap();
        assert_eq!(
            fields(&r),
            ["instance_groups[1].name", "instance_groups[1].efa_only"]
        );
        let r = request(serde_json::json!({"instance_groups": [group(serde_json::json!({"instance_type": "ml.p5en.48xlarge", "efa_only": true}))]}))
            .unwrap();
        assert!(fields(&r).is_empty());
        let r = request(serde_json::json!({"network": {"vpc_cidr": "10.1.0.0/16", "vpc_id": "vpc-0123456789abcdef0"}})).unwrap();
        assert_eq!(fields(&r), ["network.vpc_cidr"]);
        let r = request(serde_json::json!({"network": {"vpc_cidr": "10.1.0.0/20"}})).unwrap();
        assert_eq!(fields(&r), ["network.vpc_cidr"]);
        let r = request(serde_json::json!({"region": "us-west-2"})).unwrap();
        assert_eq!(fields(&r), ["availability_zone"]);
        assert!(
            request(serde_json::json!({"instance_groups": [group(serde_json::json!({"capacity": {"type": "reserved"}}))]}))
                .is_err()
        );
        assert!(request(serde_json::json!({"storage": {"s3_bucket": "Bad_Bucket"}})).is_err());
    }

    #[test]
    fn a_groups_type_capacity_and_efa_mode_are_fixed_for_its_life() {
        let g: InstanceGroupSpec = serde_json::from_value(group(serde_json::json!({}))).unwrap();
        let with = |extra| -> InstanceGroupSpec { serde_json::from_value(group(extra)).unwrap() };
        let changes = g
            .diff(
                &with(serde_json::json!({"instance_count": 0, "deep_health_checks": true})),
                "instance_groups[1]",
            )
            .unwrap();
        let names: Vec<&str> = changes.iter().map(|c| c.field.as_str()).collect();
        assert_eq!(
            names,
            [
                "instance_groups[1].instance_count",
                "instance_groups[1].deep_health_checks"
            ]
        );
        assert_eq!(changes[0].new, Some(serde_json::json!(0)));
        assert!(g.diff(&g, "x").unwrap().is_empty());
        for (extra, field) in [
            (
                serde_json::json!({"instance_type": "ml.p5en.48xlarge"}),
                "instance_groups[1].instance_type",
            ),
            (
                serde_json::json!({"capacity": {"type": "spot"}}),
                "instance_groups[1].capacity",
            ),
            (
                serde_json::json!({"efa_only": true}),
                "instance_groups[1].efa_only",
            ),
        ] {
            match g.diff(&with(extra), "instance_groups[1]") {
                Err(ApiError::Immutable { field: f, .. }) => assert_eq!(f, field),
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn single_group_requests_stored_earlier_still_read() {
        let stored = r#"{"name":"ml-1","region":"us-east-1","availability_zone":"us-east-1a","instance_type":"ml.g5.8xlarge","instance_count":2,"capacity":{"type":"spot"},"efa_only":false,"deep_health_checks":true,"storage":{"s3_bucket":"hypd-ml-1-123456789012"},"network":{}}"#;
        let r = CreateCluster::from_stored(stored).unwrap();
        assert_eq!(r.instance_groups.len(), 1);
        let g = &r.instance_groups[0];
        assert_eq!(g.name.as_str(), SINGLE_GROUP_NAME);
        assert_eq!(g.instance_type.as_str(), "ml.g5.8xlarge");
        assert_eq!(g.capacity, Capacity::Spot);
        assert!(g.deep_health_checks);
        let today = serde_json::to_string(&r).unwrap();
        assert_eq!(CreateCluster::from_stored(&today).unwrap(), r);
        // The API itself takes only today's shape.
        assert!(serde_json::from_str::<CreateCluster>(stored).is_err());
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
            image_release: None,
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

/// What drifted from what hypd made: the cluster's own pipeline (the creation, or the
/// import) planned again on the live world, with the request that made it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GetDrift {
    pub name: EksClusterName,
}

/// How an object differs from what hypd made.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum DriftState {
    /// hypd made it and it is gone (or a setting of it is, such as a rule or a policy).
    Missing,
    /// It is there with fields other than hypd set.
    Differs,
    /// It is there and hypd would remove it.
    Unexpected,
}

/// One field as hypd set it and as it is now.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct FieldDrift {
    pub field: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub actual: Option<serde_json::Value>,
}

/// One object that drifted.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Drifted {
    /// The stage of the cluster's pipeline that owns it.
    pub stage: String,
    pub state: DriftState,
    /// As plans name kinds: `ec2:SecurityGroup`, `iam:Role`, `k8s:apps/v1/DaemonSet`, …
    pub kind: String,
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fields: Vec<FieldDrift>,
    /// Kubernetes field managers other than hypd that wrote the object.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub changed_by: Vec<String>,
}

impl Drifted {
    /// A planned change of the cluster's pipeline as drift: what the change would set is
    /// what hypd expects, what it would replace is what is there.
    pub fn of(stage: &str, c: super::plan::Change) -> Self {
        use super::plan::Action;
        Drifted {
            stage: stage.to_owned(),
            state: match c.action {
                Action::Create => DriftState::Missing,
                Action::Delete => DriftState::Unexpected,
                Action::Update | Action::Adopt | Action::None => {
                    // A setting added back (a rule, a policy) was missing, not different.
                    if !c.fields.is_empty() && c.fields.iter().all(|f| f.old.is_none()) {
                        DriftState::Missing
                    } else {
                        DriftState::Differs
                    }
                }
            },
            kind: c.kind,
            name: c.name,
            namespace: c.namespace,
            fields: c
                .fields
                .into_iter()
                .map(|f| FieldDrift {
                    field: f.field,
                    expected: f.new,
                    actual: f.old,
                })
                .collect(),
            changed_by: c.changed_by,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct DriftReport {
    pub name: String,
    /// The command whose request is hypd's desired state: `create_cluster` or
    /// `import_cluster` (an imported cluster's desired state is hypd's access only).
    pub made_by: String,
    /// When the live world was read (RFC 3339, UTC).
    pub checked_at: String,
    /// Empty when nothing drifted.
    pub drifted: Vec<Drifted>,
}

impl Command for GetDrift {
    type Output = DriftReport;
    const SPEC: CommandSpec = CommandSpec {
        name: "get_drift",
        summary: "Report what changed outside hypd in what hypd made for a cluster",
        description: "What changed outside hypd in what it made for a cluster: objects missing, differing or unexpected, and who changed them. reconcile_cluster puts it back.",
        effect: Effect::ReadOnly,
        role: Role::Viewer,
        idempotent: true,
        status_command: None,
        method: HttpMethod::Get,
        path: "/api/v1/clusters/{name}/drift",
    };
}

/// Puts back what drifted: the cluster's own stages run again with the request that made
/// it, so each makes exactly the changes its diff finds and nothing else.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReconcileCluster {
    pub name: EksClusterName,
    /// Re-sending a request with the same key returns the same operation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<IdempotencyKey>,
    /// Only answer with the plan: the drift, as the changes that put it back.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dry_run: bool,
}

impl Command for ReconcileCluster {
    type Output = Gated<OperationRef>;
    const SPEC: CommandSpec = CommandSpec {
        name: "reconcile_cluster",
        summary: "Put back what drifted in what hypd made for a cluster",
        description: "Puts back what get_drift reports, changing nothing else. Returns an operation for wait_operation; dry_run returns the plan.",
        effect: Effect::Mutating,
        role: Role::Operator,
        idempotent: true,
        status_command: Some("get_operation"),
        method: HttpMethod::Post,
        path: "/api/v1/clusters/{name}/reconcile",
    };

    super::command::dry_run_request!();
}
