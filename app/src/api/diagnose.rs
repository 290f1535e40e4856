//! Diagnosis: what is wrong with something hypd manages, found by reading only, with
//! the commands that would fix it as suggestions for the user to approve. A diagnosis
//! never changes anything, so an agent may run one on its own; every suggestion names a
//! registered command, its arguments and its effect, in the order to try them
//! (investigate, then the least drastic change).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::command::{Command, CommandSpec, Effect, HttpMethod, Role};
use super::plan::Plan;
use super::values::{EksClusterName, JobName, NodeId, OperationId, checked};

/// Ordered from the least severe.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    /// A fact that explains the state.
    Info,
    /// Something that may need the user.
    Warning,
    /// The cause of a failure.
    Error,
}

/// One thing found.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Finding {
    pub severity: Severity,
    /// What was found, in one sentence.
    pub summary: String,
    /// The evidence: the provider's message and request id, a log line, a condition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evidence: Option<String>,
}

/// A command the diagnosis would run next, never runs itself.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Suggestion {
    /// A registered command (tool) name.
    pub command: String,
    /// Its arguments, as the tool takes them.
    pub arguments: serde_json::Map<String, serde_json::Value>,
    /// What it changes: a mutating or destructive one needs the user's approval.
    pub effect: Effect,
    /// Why this one, and what to check first.
    pub why: String,
}

impl Suggestion {
    /// `command` with `arguments` (a JSON object), its effect as the registry declares
    /// it, so a suggestion can never understate what a command changes.
    pub fn new(command: &str, arguments: serde_json::Value, why: impl Into<String>) -> Self {
        let effect = super::find(command).map(|e| e.spec.effect);
        debug_assert!(effect.is_some(), "{command} is not a command");
        Suggestion {
            command: command.to_owned(),
            arguments: match arguments {
                serde_json::Value::Object(map) => map,
                _ => serde_json::Map::new(),
            },
            // An unknown command is said to be the most drastic kind.
            effect: effect.unwrap_or(Effect::Destructive),
            why: why.into(),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Diagnosis {
    /// What was diagnosed, e.g. `operation/op-…`.
    pub subject: String,
    /// Most severe first.
    pub findings: Vec<Finding>,
    /// In the order to try them.
    pub suggestions: Vec<Suggestion>,
    /// For an operation that can be resumed: what its stages left would change now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remaining: Option<Plan>,
}

impl Diagnosis {
    /// Each suggestion's command and effect, in the order to try them.
    pub fn suggested(&self) -> Vec<(&str, Effect)> {
        self.suggestions
            .iter()
            .map(|s| (s.command.as_str(), s.effect))
            .collect()
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DiagnoseOperation {
    #[serde(deserialize_with = "checked::<_, OperationId>")]
    #[schemars(with = "OperationId")]
    pub operation_id: String,
}

impl Command for DiagnoseOperation {
    type Output = Diagnosis;
    const SPEC: CommandSpec = CommandSpec {
        name: "diagnose_operation",
        summary: "Find why an operation failed or is stuck, and what to do next",
        description: "Read-only: the failed or waiting stage, the provider's error and request id, what the stages left would change now, and the next commands to suggest (never run). Call it when an operation fails, before retrying; show the suggestions to the user.",
        effect: Effect::ReadOnly,
        role: Role::Viewer,
        idempotent: true,
        status_command: None,
        method: HttpMethod::Get,
        path: "/api/v1/operations/{operation_id}/diagnosis",
    };
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DiagnoseNode {
    /// The cluster.
    pub name: EksClusterName,
    /// The instance id, e.g. `i-0123456789abcdef0`.
    pub node_id: NodeId,
}

impl Command for DiagnoseNode {
    type Output = Diagnosis;
    const SPEC: CommandSpec = CommandSpec {
        name: "diagnose_node",
        summary: "Find what ails a node, and whether to wait, reboot or replace it",
        description: "Read-only: HyperPod's status, the health agent's findings, Kubernetes conditions, recent events and the pods a fix would stop, with the next commands to suggest (never run): wait, then reboot, then replace.",
        effect: Effect::ReadOnly,
        role: Role::Viewer,
        idempotent: true,
        status_command: None,
        method: HttpMethod::Get,
        path: "/api/v1/clusters/{name}/nodes/{node_id}/diagnosis",
    };
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DiagnoseTrainingJob {
    /// The cluster.
    pub name: EksClusterName,
    pub job: JobName,
}

impl Command for DiagnoseTrainingJob {
    type Output = Diagnosis;
    const SPEC: CommandSpec = CommandSpec {
        name: "diagnose_training_job",
        summary: "Find why a training job fails, restarts or hangs",
        description: "Read-only: pods, restarts and exit codes, NCCL/EFA/GPU error lines in each pod's recent log (with pod, line and time) and the nodes involved, with the next commands to suggest (never run). Call it when a job fails, restarts or stops logging.",
        effect: Effect::ReadOnly,
        role: Role::Viewer,
        idempotent: true,
        status_command: None,
        method: HttpMethod::Get,
        path: "/api/v1/clusters/{name}/training-jobs/{job}/diagnosis",
    };
}
