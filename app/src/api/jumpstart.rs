//! Catalogue models: the SageMaker public hub's (JumpStart) models, which the inference
//! operator deploys from a `JumpStartModel`. The hub, not the request, says what a model
//! runs on (its image, the instance types it supports, a licence to accept), so a
//! request names only the model and where it runs, and hypd checks it against the hub's
//! own answer before anything is made.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::command::{Command, CommandSpec, Effect, HttpMethod, Role};
use super::error::ApiError;
use super::inference::{KvCache, RoutingStrategy, operator_option_errors};
use super::operations::OperationRef;
use super::plan::Gated;
use super::values::{
    ClusterName, EndpointName, HubModelId, HubModelVersion, IdempotencyKey, InstanceGroupName,
    ReplicaCount,
};

/// The hub every catalogue model comes from.
pub const PUBLIC_HUB: &str = "SageMakerPublicHub";

/// The port and path the operator's workers of a catalogue model answer on (SageMaker's
/// own serving contract).
pub const PORT: u16 = 8080;
pub const INVOCATION_PATH: &str = "invocations";

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeployJumpstartModel {
    /// The cluster.
    pub name: ClusterName,
    pub endpoint: EndpointName,
    /// From list_jumpstart_models.
    pub model_id: HubModelId,
    // Default: the latest, pinned when the operation starts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_version: Option<HubModelVersion>,
    // A gated model's licence: ask the user to accept it, never assume.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub accept_eula: bool,
    #[serde(default = "one_replica")]
    pub replicas: ReplicaCount,
    // Default: the one GPU group of a type the model supports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_group: Option<InstanceGroupName>,
    // As deploy_inference_endpoint's: models the hub serves with vLLM only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_cache: Option<KvCache>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routing: Option<RoutingStrategy>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<IdempotencyKey>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dry_run: bool,
}

fn one_replica() -> ReplicaCount {
    ReplicaCount::new(1).expect("in range")
}

impl Command for DeployJumpstartModel {
    type Output = Gated<OperationRef>;
    const SPEC: CommandSpec = CommandSpec {
        name: "deploy_jumpstart_model",
        summary: "Deploy a SageMaker JumpStart catalogue model",
        description: "Deploys a model of list_jumpstart_models through the inference operator (update_features inference_operator), with deploy_inference_endpoint's KV cache tiers and routing if the hub serves it with vLLM. Ask which model, replicas, the group when several fit, and whether the user accepts a gated model's licence. Returns an operation for wait_operation; dry_run returns the plan.",
        effect: Effect::Mutating,
        role: Role::Operator,
        idempotent: true,
        status_command: Some("get_operation"),
        method: HttpMethod::Post,
        path: "/api/v1/clusters/{name}/jumpstart-endpoints",
    };

    super::command::dry_run_request!();

    // The engine is the hub's to say, so the vLLM-only rule waits for its answer (the
    // pre-flight); the rest holds whatever the model.
    fn validate(&self) -> Result<(), ApiError> {
        ApiError::unless_broken(operator_option_errors(
            self.kv_cache.as_ref(),
            self.routing,
            None,
        ))
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListJumpstartModels {
    /// The cluster (its region's hub, its groups).
    pub name: ClusterName,
    /// Only models whose id contains this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub search: Option<String>,
}

/// The catalogue as one cluster can use it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct JumpstartCatalogue {
    pub models: Vec<CatalogueModel>,
    /// Models matching but not described (narrow with search).
    pub more: usize,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct CatalogueModel {
    pub model_id: String,
    /// Its latest version.
    pub version: String,
    pub display_name: String,
    pub description: String,
    /// Deploying it needs accept_eula.
    pub gated: bool,
    /// Where its licence is, for the user to read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eula: Option<String>,
    pub default_instance_type: String,
    pub instance_types: Vec<String>,
    /// This cluster's groups of a supported type.
    pub groups: Vec<String>,
}

/// The longest search string: more than any model id.
pub const MAX_SEARCH: usize = 63;

impl Command for ListJumpstartModels {
    type Output = JumpstartCatalogue;
    const SPEC: CommandSpec = CommandSpec {
        name: "list_jumpstart_models",
        summary: "The JumpStart models a cluster can deploy",
        description: "SageMaker JumpStart models for the cluster's region: version, gated or not, and which of its groups can run each.",
        effect: Effect::ReadOnly,
        role: Role::Viewer,
        idempotent: true,
        status_command: None,
        method: HttpMethod::Get,
        path: "/api/v1/clusters/{name}/jumpstart-models",
    };

    fn validate(&self) -> Result<(), ApiError> {
        match &self.search {
            Some(s) if s.chars().count() > MAX_SEARCH => Err(ApiError::field(
                "search",
                format!("a search is at most {MAX_SEARCH} characters, longer than any model id"),
            )),
            _ => Ok(()),
        }
    }
}
