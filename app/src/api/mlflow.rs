//! MLflow for a cluster's training jobs: `create_mlflow_tracking_server` makes the
//! cluster's SageMaker managed MLflow tracking server (its artifacts in the shared
//! bucket), which every job of the cluster then reports to unless it names another.
//! SageMaker has no tags on these servers that every region's API returns, so the
//! cluster's is known by its name, `<cluster>-mlflow`, unless the request names it.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::command::{Command, CommandSpec, Effect, HttpMethod, Role};
use super::operations::OperationRef;
use super::plan::Gated;
use super::values::{ClusterName, IdempotencyKey, TrackingServerName};

/// The name of a cluster's own tracking server.
pub fn default_server(cluster: &str) -> String {
    format!("{cluster}-mlflow")
}

/// SageMaker's sizes: AWS recommends Small for up to 25 users, Medium 50, Large 100.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum TrackingServerSize {
    #[default]
    Small,
    Medium,
    Large,
}

impl TrackingServerSize {
    pub fn as_str(self) -> &'static str {
        match self {
            TrackingServerSize::Small => "Small",
            TrackingServerSize::Medium => "Medium",
            TrackingServerSize::Large => "Large",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateMlflowTrackingServer {
    /// The cluster.
    pub name: ClusterName,
    // Default `<cluster>-mlflow`, the one jobs report to without naming one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tracking_server: Option<TrackingServerName>,
    #[serde(default)]
    pub size: TrackingServerSize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<IdempotencyKey>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dry_run: bool,
}

impl CreateMlflowTrackingServer {
    pub fn server_name(&self) -> String {
        self.tracking_server
            .as_ref()
            .map_or_else(|| default_server(self.name.as_str()), |s| s.to_string())
    }
}

impl Command for CreateMlflowTrackingServer {
    type Output = Gated<OperationRef>;
    const SPEC: CommandSpec = CommandSpec {
        name: "create_mlflow_tracking_server",
        summary: "Create the cluster's SageMaker managed MLflow tracking server",
        description: "Creates the cluster's SageMaker MLflow tracking server, which jobs report to (or uses one of that name). Takes ~20 minutes. Returns an operation for wait_operation; dry_run returns the plan.",
        effect: Effect::Mutating,
        role: Role::Operator,
        idempotent: true,
        status_command: Some("get_operation"),
        method: HttpMethod::Post,
        path: "/api/v1/clusters/{name}/mlflow",
    };

    super::command::dry_run_request!();
}

/// A tracking server as a cluster's jobs see it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct TrackingServer {
    pub name: String,
    pub arn: Option<String>,
    /// SageMaker's: Creating, Created, Updating, Updated, CreateFailed, Deleting, ….
    pub status: String,
    /// The MLflow UI (SageMaker asks for a presigned login first).
    pub url: Option<String>,
    pub artifact_store: Option<String>,
    pub size: Option<String>,
    pub mlflow_version: Option<String>,
    /// The IAM role it keeps artifacts with.
    pub role_arn: Option<String>,
}

impl TrackingServer {
    /// Whether jobs can report to it now.
    pub fn up(&self) -> bool {
        matches!(self.status.as_str(), "Created" | "Updated" | "Updating")
    }
}
