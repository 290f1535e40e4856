//! Reading the clusters hypd manages. These answer from hypd's store (fast, no AWS
//! call); the cluster's live state is refreshed by the operations that change it.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::command::{Command, CommandSpec, Effect, HttpMethod, Role};
use super::operations::OperationRef;
use super::values::{ClusterName, EksClusterName, IdempotencyKey, Region};

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
