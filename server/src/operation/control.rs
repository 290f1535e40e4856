//! Retrying and cancelling operations. Both are commands like any other; both change
//! stored state only, and leave the calls to the worker, which holds the lease.

use std::sync::Arc;

use app::api::ApiError;
use app::api::operations::{Operation, OperationRef, OperationState};
use app::api::plan::Plan;

use super::pipeline::{Context, Preflight};
use super::preview::Stored;
use super::submit::STATUS_COMMAND;
use super::worker::Wake;
use crate::auth::Actor;
use crate::aws::Aws;
use crate::clock;
use crate::store::{Store, StoreError, on_pool};

fn not_found(id: &str) -> ApiError {
    ApiError::NotFound {
        resource: "operation".into(),
        name: id.into(),
    }
}

/// What retrying failed operation `id` would do now, stage by stage.
pub async fn retry_plan(cx: &Preflight<'_>, actor: &Actor, id: &str) -> Result<Plan, ApiError> {
    let op = super::get(cx.store, id)
        .await?
        .ok_or_else(|| not_found(id))?;
    retryable(&op)?;
    let (spec, outputs): (String, String) = on_pool!(cx.store, |pool| sqlx::query_as(
        "SELECT spec, outputs FROM operations WHERE id = $1"
    )
    .bind(id)
    .fetch_one(pool)
    .await)
    .map_err(StoreError::from)?;
    let stored = Stored {
        spec,
        outputs,
        unfinished: op
            .stages
            .iter()
            .filter(|s| s.state != OperationState::Succeeded)
            .map(|s| s.name.clone())
            .collect(),
    };
    super::preview::retry_plan(cx, actor, &op.command, &stored).await
}

/// Only a failed operation can be retried (one in progress is answered as it is).
fn retryable(op: &Operation) -> Result<(), ApiError> {
    if op.state == OperationState::Failed || !op.state.is_terminal() {
        return Ok(());
    }
    Err(ApiError::field(
        "operation_id",
        format!(
            "operation {} is {}; only failed operations can be retried",
            op.operation_id,
            op.state.as_str()
        ),
    ))
}

/// Puts a failed operation back in line from its failed stage. Retrying one that is
/// already in progress changes nothing.
pub async fn retry(
    store: &Store,
    wake: &Wake,
    actor: &Actor,
    id: &str,
) -> Result<OperationRef, ApiError> {
    let op = super::get(store, id).await?.ok_or_else(|| not_found(id))?;
    let reference = |state| OperationRef {
        operation_id: id.to_owned(),
        status_command: STATUS_COMMAND.into(),
        state,
        created: false,
    };
    retryable(&op)?;
    if op.state != OperationState::Failed {
        return Ok(reference(op.state));
    }
    let now = clock::now();
    let result: Result<u64, sqlx::Error> = on_pool!(store, |pool| {
        async {
        let mut tx = pool.begin().await?;
        let n = sqlx::query(
            "UPDATE operations SET state = 'pending', error = NULL, active_target = target, next_run_at = $1, updated_at = $1 \
             WHERE id = $2 AND state = 'failed'",
        )
        .bind(&now)
        .bind(id)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if n == 1 {
            sqlx::query(
                "UPDATE operation_stages SET state = 'pending', error = NULL, retries = 0, finished_at = NULL, next_poll_at = NULL \
                 WHERE operation_id = $1 AND state = 'failed'",
            )
            .bind(id)
            .execute(&mut *tx)
            .await?;
            super::insert_event(id, &now, None, "pending", Some(format!("retried by {}", actor.name)))
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(n)
    }
    .await
    });
    match result {
        Ok(_) => {
            wake.now();
            let op = super::get(store, id).await?.ok_or_else(|| not_found(id))?;
            Ok(reference(op.state))
        }
        // The target is held by another unfinished operation.
        Err(e)
            if e.as_database_error()
                .is_some_and(|d| d.is_unique_violation()) =>
        {
            let other = super::list(store, None, Some(&op.target))
                .await?
                .into_iter()
                .find(|o| !o.state.is_terminal());
            Err(ApiError::Conflict {
                message: format!(
                    "{} has another unfinished operation{}: wait for it or cancel it before retrying {id}",
                    op.target,
                    other
                        .as_ref()
                        .map(|o| format!(" {} ({})", o.operation_id, o.command))
                        .unwrap_or_default()
                ),
                operation_id: other.map(|o| o.operation_id),
                field: None,
            })
        }
        Err(e) => Err(StoreError::from(e).into()),
    }
}

/// Cancels an operation whose current stage is cancellable. If a worker is running a
/// step right now, it cancels the operation as soon as that step's call returns.
pub async fn cancel(
    store: &Store,
    aws: &Arc<Aws>,
    wake: &Wake,
    actor: &Actor,
    id: &str,
) -> Result<Operation, ApiError> {
    let op = super::get(store, id).await?.ok_or_else(|| not_found(id))?;
    match op.state {
        OperationState::Cancelled => return Ok(op),
        s if s.is_terminal() => {
            return Err(ApiError::Conflict {
                message: format!(
                    "operation {id} already {}; there is nothing to cancel",
                    s.as_str()
                ),
                operation_id: Some(id.to_owned()),
                field: None,
            });
        }
        _ => {}
    }
    if let Some(stage) = op.current_stage().filter(|s| !s.cancellable) {
        return Err(ApiError::Conflict {
            message: format!(
                "operation {id} is in stage {} ({}), which cannot be stopped safely; wait for it to finish",
                stage.name, stage.title
            ),
            operation_id: Some(id.to_owned()),
            field: None,
        });
    }
    let now = clock::now();
    let written: Result<u64, sqlx::Error> = on_pool!(store, |pool| {
        async {
        let mut tx = pool.begin().await?;
        sqlx::query("UPDATE operations SET cancel_requested = 1, updated_at = $1 WHERE id = $2")
            .bind(&now)
            .bind(id)
            .execute(&mut *tx)
            .await?;
        // Only an operation no worker holds is cancelled here; a held one is cancelled
        // by its worker, which sees cancel_requested after its current call.
        let n = sqlx::query(
            "UPDATE operations SET state = 'cancelled', active_target = NULL, next_run_at = NULL \
             WHERE id = $1 AND state NOT IN ('succeeded', 'failed', 'cancelled') \
             AND (lease_until IS NULL OR lease_until < $2)",
        )
        .bind(id)
        .bind(&now)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if n == 1 {
            sqlx::query(
                "UPDATE operation_stages SET state = 'cancelled', next_poll_at = NULL, finished_at = $1 \
                 WHERE operation_id = $2 AND state NOT IN ('succeeded', 'failed', 'cancelled')",
            )
            .bind(&now)
            .bind(id)
            .execute(&mut *tx)
            .await?;
        }
        super::insert_event(
            id,
            &now,
            None,
            if n == 1 { "cancelled" } else { "cancel_requested" },
            Some(format!("cancelled by {}", actor.name)),
        )
        .execute(&mut *tx)
        .await?;
        tx.commit().await.map(|()| n)
    }
    .await
    });
    if written.map_err(StoreError::from)? == 1 {
        // Cancelled here, no worker sees it again: what it changed before it stopped
        // (nodes a deletion took) is recorded as its worker would have.
        let row: Option<(String, String, String, String)> = on_pool!(store, |pool| sqlx::query_as(
            "SELECT command, spec, outputs, requested_by FROM operations WHERE id = $1"
        )
        .bind(id)
        .fetch_optional(pool)
        .await)
        .map_err(StoreError::from)?;
        if let Some((command, spec, outputs, requested_by)) = row {
            let cx = Context {
                aws: aws.clone(),
                store: store.clone(),
                operation_id: id.to_owned(),
                requested_by,
            };
            if let Err(e) = super::pipeline::settle(&cx, &command, &spec, &outputs, false).await {
                tracing::warn!(operation = id, error = %e, "could not record what the cancelled operation changed");
            }
        }
    }
    wake.now();
    super::get(store, id).await?.ok_or_else(|| not_found(id))
}
