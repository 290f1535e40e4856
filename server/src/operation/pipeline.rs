//! What a kind of operation is: a command whose request plans a fixed list of stages,
//! each run by one idempotent step. The worker knows nothing about clusters; it calls
//! [`run_stage`], which finds the pipeline by the stored command name.
//!
//! A step must observe before it acts (describe, then create only what is missing,
//! treating "already exists" as success), because after a crash or a lost lease the same
//! step runs again with the outputs stored before the crash.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use app::api::values::IdempotencyKey;
use app::api::{ApiError, Command};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::aws::Aws;
use crate::store::Store;

/// One stage of a plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StagePlan {
    pub name: &'static str,
    pub title: &'static str,
    /// Stopping the operation before or during this stage leaves nothing half-made.
    pub cancellable: bool,
}

/// What one run of a step found.
#[derive(Clone, Debug, PartialEq)]
pub enum Progress {
    /// The stage's goal holds; go on to the next.
    Done,
    /// Not yet (e.g. EKS is still CREATING): look again after `after`.
    Wait { after: Duration, message: String },
}

impl Progress {
    pub fn wait(after: Duration, message: impl Into<String>) -> Self {
        Progress::Wait {
            after,
            message: message.into(),
        }
    }

    /// Done when nothing is `pending`; otherwise look again after `after`, saying what is
    /// still pending (`say` gets the list, comma-separated).
    pub fn unless_pending<S: std::borrow::Borrow<str>>(
        after: Duration,
        pending: &[S],
        say: impl FnOnce(String) -> String,
    ) -> Self {
        if pending.is_empty() {
            Progress::Done
        } else {
            Progress::wait(after, say(pending.join(", ")))
        }
    }
}

/// What a step may use.
pub struct Context {
    pub aws: Arc<Aws>,
    pub store: Store,
    pub operation_id: String,
    /// The token that asked for the operation (its active cluster is per user).
    pub requested_by: String,
}

/// A command that runs as an operation.
pub trait Pipeline: Command + Clone {
    /// What the stages produce, stored on the operation after every step.
    type Outputs: Serialize + DeserializeOwned + Default + Send + Sync;

    /// What the operation acts on, e.g. `cluster/ml-1`: one unfinished operation per
    /// target at a time.
    fn target(&self) -> String;

    /// The caller's idempotency key, if the request carries one.
    fn idempotency_key(&self) -> Option<&IdempotencyKey>;

    /// The stages, in order. Pure: the same request always plans the same stages.
    fn plan(&self) -> Vec<StagePlan>;

    /// Runs stage `stage` once.
    fn step(
        &self,
        cx: &Context,
        stage: &str,
        outputs: &mut Self::Outputs,
    ) -> impl Future<Output = Result<Progress, ApiError>> + Send;
}

/// Calls `$m! { Type, … }` with every pipeline: the one list the worker dispatches on.
macro_rules! for_each_pipeline {
    ($m:ident) => {
        $m! {
            app::api::clusters::CreateCluster,
            app::api::clusters::ImportCluster,
            app::api::clusters::DeleteCluster,
        }
    };
}

/// Runs one step of the operation of command `command`, from its stored spec and
/// outputs; returns the outputs to store.
pub async fn run_stage(
    cx: &Context,
    command: &str,
    stage: &str,
    spec: &str,
    outputs: &str,
) -> (Result<Progress, ApiError>, Option<Value>) {
    macro_rules! by_command {
        ($($p:ty),* $(,)?) => {
            match command {
                $(c if c == <$p as Command>::SPEC.name => typed::<$p>(cx, stage, spec, outputs).await,)*
                other => (
                    Err(ApiError::internal(format!("no pipeline runs {other} operations"))),
                    None,
                ),
            }
        };
    }
    for_each_pipeline!(by_command)
}

async fn typed<P: Pipeline>(
    cx: &Context,
    stage: &str,
    spec: &str,
    outputs: &str,
) -> (Result<Progress, ApiError>, Option<Value>) {
    let request: P = match serde_json::from_str(spec) {
        Ok(r) => r,
        Err(e) => {
            let e = ApiError::internal(format!(
                "stored {} request is unreadable: {e}",
                P::SPEC.name
            ));
            return (Err(e), None);
        }
    };
    let mut out: P::Outputs = serde_json::from_str(outputs).unwrap_or_default();
    let result = request.step(cx, stage, &mut out).await;
    // Outputs are kept even when the step failed: what it made before failing is known.
    (result, serde_json::to_value(&out).ok())
}
