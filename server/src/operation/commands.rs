//! The commands that read and steer operations: list, get, wait (a long-poll on the
//! store, so a change made by any replica is seen), retry and cancel.

use std::time::{Duration, Instant};

use app::api::ApiError;
use app::api::operations::{
    CancelOperation, GetOperation, ListOperations, Operation, OperationList, OperationRef,
    RetryOperation, WaitOperation, WaitResult,
};
use app::api::plan::{Gated, Plan};

use super::control;
use crate::auth::Actor;
use crate::service::{Handler, Service};
use crate::store::Store;

/// How often a waiting call re-reads the store. The store is the truth shared by every
/// replica, so a change made by another replica is seen within this period.
const WAIT_POLL: Duration = Duration::from_millis(250);

async fn find(store: &Store, id: &str) -> Result<Operation, ApiError> {
    super::get(store, id)
        .await?
        .ok_or_else(|| ApiError::NotFound {
            resource: "operation".into(),
            name: id.into(),
        })
}

impl Handler<ListOperations> for Service {
    async fn handle(&self, _: &Actor, r: ListOperations) -> Result<OperationList, ApiError> {
        Ok(OperationList {
            operations: super::list(&self.store, r.state, r.target.as_deref()).await?,
        })
    }
}

impl Handler<GetOperation> for Service {
    async fn handle(&self, _: &Actor, r: GetOperation) -> Result<Operation, ApiError> {
        find(&self.store, &r.operation_id).await
    }
}

impl Handler<WaitOperation> for Service {
    async fn handle(&self, _: &Actor, r: WaitOperation) -> Result<WaitResult, ApiError> {
        let limit = Duration::from_secs(r.timeout_seconds.map_or(60, |t| u64::from(t.get())));
        let start = Instant::now();
        loop {
            let op = find(&self.store, &r.operation_id).await?;
            let elapsed = start.elapsed();
            if op.state.is_terminal() || elapsed >= limit {
                return Ok(WaitResult {
                    timed_out: !op.state.is_terminal(),
                    operation: op,
                    waited_seconds: elapsed.as_secs_f64(),
                });
            }
            tokio::time::sleep(WAIT_POLL.min(limit - elapsed)).await;
        }
    }
}

impl Handler<RetryOperation> for Service {
    async fn handle(
        &self,
        actor: &Actor,
        r: RetryOperation,
    ) -> Result<Gated<OperationRef>, ApiError> {
        control::retry(&self.store, &self.wake, actor, &r.operation_id)
            .await
            .map(Gated::from)
    }

    async fn preview(&self, actor: &Actor, r: RetryOperation) -> Result<Plan, ApiError> {
        control::retry_plan(&self.preflight(), actor, &r.operation_id).await
    }
}

impl Handler<CancelOperation> for Service {
    async fn handle(&self, actor: &Actor, r: CancelOperation) -> Result<Operation, ApiError> {
        control::cancel(&self.store, &self.aws, &self.wake, actor, &r.operation_id).await
    }
}
