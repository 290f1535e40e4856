//! Reading the clusters hypd manages. These answer from hypd's store (fast, no AWS
//! call); the cluster's live state is refreshed by the operations that change it.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::command::{Command, CommandSpec, Effect, HttpMethod, Role};
use super::values::ClusterName;

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
