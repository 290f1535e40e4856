//! A pipeline's plan preview: its pre-flight, then every stage's own step run inside
//! [`crate::resources::planning`] with clients that refuse mutating calls. There is no
//! second planner: the changes listed are the ones the steps' `converge` calls found by
//! the same observe and diff. A planned change is assumed made (its ids "known after
//! apply"), and a step that would wait (EKS still creating or deleting) is taken as done,
//! so the stages after it are listed too. Nothing is stored. A retry's plan is the same
//! for the stages a failed operation has left, from what it stored.

use std::sync::Arc;

use app::api::plan::{Plan, StagePlan};
use app::api::{ApiError, Command};

use super::pipeline::{Context, Pipeline, Preflight, Stage, for_each_pipeline};
use crate::auth::Actor;
use crate::resources::{planning, take_planned};

/// What `request` would do now, stage by stage.
pub async fn preview<P: Pipeline>(
    cx: &Preflight<'_>,
    actor: &Actor,
    request: P,
) -> Result<Plan, ApiError> {
    let request = request.plan_preflight(cx).await?;
    let stages = request.plan();
    let stages = steps(cx, actor, &request, &stages, P::Outputs::default()).await?;
    Ok(Plan {
        command: P::SPEC.name.to_owned(),
        target: request.target(),
        stages,
    })
}

/// What retrying a failed operation of pipeline `P` would do now: the stages that have
/// not succeeded, from the outputs the operation stored. No pre-flight: the request
/// passed one when it was submitted, and what its stages made is there to be found.
pub async fn remaining<P: Pipeline>(
    cx: &Preflight<'_>,
    actor: &Actor,
    stored: &Stored,
) -> Result<Plan, ApiError> {
    let unreadable = |what: &str, e: serde_json::Error| {
        ApiError::internal(format!(
            "the stored {} {what} is unreadable: {e}",
            P::SPEC.name
        ))
    };
    let request = P::from_stored(&stored.spec).map_err(|e| unreadable("request", e))?;
    let outputs: P::Outputs =
        serde_json::from_str(&stored.outputs).map_err(|e| unreadable("outputs", e))?;
    let left: Vec<P::Stage> = stored
        .unfinished
        .iter()
        .filter_map(|name| P::Stage::parse(name))
        .collect();
    Ok(Plan {
        command: P::SPEC.name.to_owned(),
        target: request.target(),
        stages: steps(cx, actor, &request, &left, outputs).await?,
    })
}

/// An operation as a retry would resume it.
pub struct Stored {
    pub spec: String,
    pub outputs: String,
    /// The stages that have not succeeded, in order.
    pub unfinished: Vec<String>,
}

/// Runs `request`'s steps of `stages` for a plan, from `outputs`; each stage's changes.
async fn steps<P: Pipeline>(
    cx: &Preflight<'_>,
    actor: &Actor,
    request: &P,
    stages: &[P::Stage],
    mut outputs: P::Outputs,
) -> Result<Vec<StagePlan>, ApiError> {
    let step_cx = Context {
        aws: Arc::new(cx.aws.read_only()),
        store: cx.store.clone(),
        operation_id: "(plan preview)".to_owned(),
        requested_by: actor.name.clone(),
    };
    planning(async {
        let mut planned = Vec::new();
        for &stage in stages {
            // On the heap: a step's future is large (every resource it converges), and a
            // preview runs under whichever face asked, MCP's own futures included.
            Box::pin(request.step(&step_cx, stage, &mut outputs)).await?;
            planned.push(StagePlan {
                stage: stage.name().to_owned(),
                title: stage.title().to_owned(),
                changes: take_planned(),
            });
        }
        Ok(planned)
    })
    .await
}

/// What retrying the stored operation of command `command` would do now.
pub async fn retry_plan(
    cx: &Preflight<'_>,
    actor: &Actor,
    command: &str,
    stored: &Stored,
) -> Result<app::api::plan::Plan, ApiError> {
    macro_rules! by_command {
        ($($p:ty),* $(,)?) => {
            match command {
                $(c if c == <$p as Command>::SPEC.name => {
                    Box::pin(remaining::<$p>(cx, actor, stored)).await
                })*
                other => Err(ApiError::internal(format!("no pipeline runs {other} operations"))),
            }
        };
    }
    for_each_pipeline!(by_command)
}
