//! Following operations: every mutation returns an operation id and names the command
//! that decides completion. `wait_operation` long-polls so an agent never sleeps blind.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use std::collections::BTreeMap;

use super::command::{Command, CommandSpec, Effect, HttpMethod, Role};
use super::error::ApiError;
use super::values::{OperationId, OperationTarget, WaitSeconds, checked, checked_opt};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum OperationState {
    Pending,
    Running,
    Waiting,
    Succeeded,
    Failed,
    Cancelled,
}

impl OperationState {
    pub const ALL: [OperationState; 6] = [
        OperationState::Pending,
        OperationState::Running,
        OperationState::Waiting,
        OperationState::Succeeded,
        OperationState::Failed,
        OperationState::Cancelled,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            OperationState::Pending => "pending",
            OperationState::Running => "running",
            OperationState::Waiting => "waiting",
            OperationState::Succeeded => "succeeded",
            OperationState::Failed => "failed",
            OperationState::Cancelled => "cancelled",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|x| x.as_str() == s)
    }

    /// No further change will happen without a new command (retry).
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            OperationState::Succeeded | OperationState::Failed | OperationState::Cancelled
        )
    }
}

/// One step of an operation's plan. Stages run in order; each observes the world before
/// acting, so running one again after a crash or a retry adopts what it already made.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Stage {
    /// Stable identifier, e.g. `network`.
    pub name: String,
    /// What it does, for people, e.g. `Network: VPC, subnets, gateways`.
    pub title: String,
    pub state: OperationState,
    /// How many times it has been started (a retry or a resumed poll counts).
    pub attempts: u32,
    pub started_at: Option<String>,
    pub finished_at: Option<String>,
    /// While `waiting`: when the stage looks at the world again.
    pub next_poll_at: Option<String>,
    /// The latest progress note, e.g. `EKS cluster is CREATING`.
    pub message: Option<String>,
    /// Why it failed: for provider failures, the call, the error code, the provider's
    /// message and request id.
    pub error: Option<ApiError>,
    /// Cancelling while this stage is current leaves nothing half-made.
    pub cancellable: bool,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Operation {
    pub operation_id: String,
    /// The command that started it, e.g. `create_cluster`.
    pub command: String,
    /// What it acts on, e.g. `cluster/ml-1`.
    pub target: String,
    pub state: OperationState,
    /// The token (user or agent) that asked for it.
    pub requested_by: String,
    pub created_at: String,
    pub updated_at: String,
    /// The plan, in order, with each stage's progress.
    pub stages: Vec<Stage>,
    /// What the stages produced so far (`vpc_id`, `eks_cluster_arn`, …).
    pub outputs: BTreeMap<String, serde_json::Value>,
    /// The failing stage's error, when `state` is `failed`.
    pub error: Option<ApiError>,
    /// `retry_operation` would resume it now.
    pub retryable: bool,
    /// `cancel_operation` would stop it safely now.
    pub cancellable: bool,
    /// `nothing to do` when it found everything already as asked and had no stage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// The note of an operation that had nothing to do.
pub const NOTHING_TO_DO: &str = "nothing to do: everything named was already as asked";

impl Operation {
    /// The stage that is running, waiting or failed, or the next to start.
    pub fn current_stage(&self) -> Option<&Stage> {
        self.stages
            .iter()
            .find(|s| s.state != OperationState::Succeeded)
    }
}

/// What every mutation returns: the operation to follow and how.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct OperationRef {
    pub operation_id: String,
    /// Call this (with `operation_id`) to follow it; `wait_operation` long-polls.
    pub status_command: String,
    pub state: OperationState,
    /// False when the same request was already in progress (or the idempotency key was
    /// used before): this is that operation, and nothing new was started.
    pub created: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListOperations {
    /// Only operations in this state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<OperationState>,
    /// Only operations on this target, e.g. `cluster/ml-1`.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "checked_opt::<_, OperationTarget>"
    )]
    #[schemars(with = "Option<OperationTarget>")]
    pub target: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct OperationList {
    /// Newest first, at most 200.
    pub operations: Vec<Operation>,
}

impl Command for ListOperations {
    type Output = OperationList;
    const SPEC: CommandSpec = CommandSpec {
        name: "list_operations",
        summary: "List operations, newest first, optionally by state or target",
        description: "Operations, newest first. Filter by state or target (e.g. cluster/ml-1) to find work in progress before starting more.",
        effect: Effect::ReadOnly,
        role: Role::Viewer,
        idempotent: true,
        status_command: None,
        method: HttpMethod::Get,
        path: "/api/v1/operations",
    };
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GetOperation {
    #[serde(deserialize_with = "checked::<_, OperationId>")]
    #[schemars(with = "OperationId")]
    pub operation_id: String,
}

impl Command for GetOperation {
    type Output = Operation;
    const SPEC: CommandSpec = CommandSpec {
        name: "get_operation",
        summary: "Show one operation and its state",
        description: "An operation's command, target and state; succeeded, failed and cancelled are final. To wait for it, call wait_operation.",
        effect: Effect::ReadOnly,
        role: Role::Viewer,
        idempotent: true,
        status_command: None,
        method: HttpMethod::Get,
        path: "/api/v1/operations/{operation_id}",
    };
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WaitOperation {
    #[serde(deserialize_with = "checked::<_, OperationId>")]
    #[schemars(with = "OperationId")]
    pub operation_id: String,
    /// Longest wait in seconds.
    #[serde(default = "default_wait", skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<WaitSeconds>,
}

fn default_wait() -> Option<WaitSeconds> {
    WaitSeconds::new(60).ok()
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct WaitResult {
    pub operation: Operation,
    /// True when the wait ended before the operation reached a final state: call
    /// wait_operation again.
    pub timed_out: bool,
    pub waited_seconds: f64,
}

impl Command for WaitOperation {
    type Output = WaitResult;
    const SPEC: CommandSpec = CommandSpec {
        name: "wait_operation",
        summary: "Wait until an operation reaches a final state, or a timeout of at most 300 s",
        description: "Waits until an operation ends or times out. Call it again while timed_out is true; report the final state to the user, never just the submission.",
        effect: Effect::ReadOnly,
        role: Role::Viewer,
        idempotent: true,
        status_command: None,
        method: HttpMethod::Get,
        path: "/api/v1/operations/{operation_id}/wait",
    };
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RetryOperation {
    #[serde(deserialize_with = "checked::<_, OperationId>")]
    #[schemars(with = "OperationId")]
    pub operation_id: String,
    /// Only answer with the plan of the stages left. Nothing is changed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dry_run: bool,
}

impl Command for RetryOperation {
    type Output = super::plan::Gated<OperationRef>;
    const SPEC: CommandSpec = CommandSpec {
        name: "retry_operation",
        summary: "Resume a failed operation from its failed stage",
        description: "Reruns a failed operation from its failed stage (see retryable in get_operation); nothing is created twice. Returns an operation for wait_operation; dry_run returns the stages left.",
        effect: Effect::Mutating,
        role: Role::Operator,
        idempotent: true,
        status_command: Some("get_operation"),
        method: HttpMethod::Post,
        path: "/api/v1/operations/{operation_id}/retry",
    };
    super::command::dry_run_request!();
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CancelOperation {
    #[serde(deserialize_with = "checked::<_, OperationId>")]
    #[schemars(with = "OperationId")]
    pub operation_id: String,
}

impl Command for CancelOperation {
    type Output = Operation;
    const SPEC: CommandSpec = CommandSpec {
        name: "cancel_operation",
        summary: "Stop an operation whose current stage can be stopped safely",
        description: "Cancels an operation whose stage is cancellable (see get_operation); what earlier stages made stays (use the matching delete command). Returns the operation.",
        effect: Effect::Mutating,
        role: Role::Operator,
        idempotent: true,
        status_command: Some("get_operation"),
        method: HttpMethod::Post,
        path: "/api/v1/operations/{operation_id}/cancel",
    };
}
