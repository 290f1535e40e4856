//! A pipeline's plan preview: its pre-flight, then every stage's own step run inside
//! [`crate::resources::planning`] with clients that refuse mutating calls. There is no
//! second planner: the changes listed are the ones the steps' `converge` calls found by
//! the same observe and diff. A planned change is assumed made (its ids "known after
//! apply"), and a step that would wait (EKS still creating or deleting) is taken as done,
//! so the stages after it are listed too. Nothing is stored.

use std::sync::Arc;

use app::api::ApiError;
use app::api::plan::{Plan, StagePlan};

use super::pipeline::{Context, Pipeline, Preflight, Stage};
use crate::auth::Actor;
use crate::resources::{planning, take_planned};

/// What `request` would do now, stage by stage.
pub async fn preview<P: Pipeline>(
    cx: &Preflight<'_>,
    actor: &Actor,
    request: P,
) -> Result<Plan, ApiError> {
    let request = request.preflight(cx).await?;
    let step_cx = Context {
        aws: Arc::new(cx.aws.read_only()),
        store: cx.store.clone(),
        operation_id: "(plan preview)".to_owned(),
        requested_by: actor.name.clone(),
    };
    let stages = planning(async {
        let mut outputs = P::Outputs::default();
        let mut stages = Vec::new();
        for stage in request.plan() {
            // On the heap: a step's future is large (every resource it converges), and a
            // preview runs under whichever face asked, MCP's own futures included.
            Box::pin(request.step(&step_cx, stage, &mut outputs)).await?;
            stages.push(StagePlan {
                stage: stage.name().to_owned(),
                title: stage.title().to_owned(),
                changes: take_planned(),
            });
        }
        Ok::<_, ApiError>(stages)
    })
    .await?;
    Ok(Plan {
        command: P::SPEC.name.to_owned(),
        target: request.target(),
        stages,
    })
}
