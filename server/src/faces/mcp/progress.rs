//! What a call that blocks on an operation (`wait_operation`) reports while it waits:
//! with `_meta.progressToken`, each stage the operation finishes as `progress` = stages
//! done of `total` = stages, with the stage now running as the message; with
//! `_meta["io.modelcontextprotocol/logLevel"]` (a 2026-07-28 client's per-request opt-in),
//! the operation's events as log messages at that level. Driven by the shared operation
//! feed, not by a poll of its own; MCP wants progress to increase with every
//! notification, so a read that finished nothing new is not sent, and the operation in
//! the call's own answer is reported last, so a wait that ends also ends its progress.
#![expect(
    deprecated,
    reason = "log messages are what clients of 2025 and 2026-07-28 (per request) opt in to"
)]

use std::future::Future;
use std::sync::Arc;

use app::api::ApiError;
use app::api::operations::{Operation, OperationState};
use rmcp::model::{LoggingLevel, ProgressNotificationParam, ProgressToken};
use rmcp::service::{Peer, RequestContext, RoleServer};
use serde_json::value::RawValue;
use serde_json::{Value, json};
use tokio::sync::broadcast::error::RecvError;

use super::session::{at_least, transitions};
use crate::auth::Actor;
use crate::service::Service;

/// The operation a call waits on, when the tool is one that blocks on work.
pub fn followed(tool: &str, input: &Value) -> Option<String> {
    (tool == "wait_operation")
        .then(|| input.get("operation_id")?.as_str().map(str::to_owned))
        .flatten()
}

pub struct Reporter<'a> {
    service: &'a Arc<Service>,
    actor: &'a Actor,
    peer: Peer<RoleServer>,
    operation_id: String,
    token: Option<ProgressToken>,
    level: Option<LoggingLevel>,
    sent: Option<usize>,
    /// The stage states last logged (none until the first read).
    seen: Option<Vec<OperationState>>,
}

impl<'a> Reporter<'a> {
    /// `None` when the call asked for neither progress nor log messages.
    pub fn new(
        service: &'a Arc<Service>,
        actor: &'a Actor,
        context: &RequestContext<RoleServer>,
        operation_id: String,
    ) -> Option<Self> {
        let token = context.meta.get_progress_token();
        let level = context.meta.log_level();
        (token.is_some() || level.is_some()).then(|| Self {
            service,
            actor,
            peer: context.peer.clone(),
            operation_id,
            token,
            level,
            sent: None,
            seen: None,
        })
    }

    /// Runs the call, reporting the operation's progress until the call answers.
    pub async fn around(
        mut self,
        call: impl Future<Output = Result<Box<RawValue>, ApiError>>,
    ) -> Result<Box<RawValue>, ApiError> {
        // Follow before the first read: no change between the two is missed.
        let mut changes = self.service.changes.follow();
        // Where it stands now, read as the caller (a caller who may not read it gets the
        // call's own refusal, and no progress).
        if let Ok(now) = self
            .service
            .dispatch(
                self.actor,
                "get_operation",
                json!({ "operation_id": self.operation_id }),
            )
            .await
            && let Ok(op) = serde_json::from_str::<Operation>(now.get())
        {
            self.report(&op).await;
        }
        tokio::pin!(call);
        let answer = loop {
            tokio::select! {
                answer = &mut call => break answer,
                change = changes.recv() => match change {
                    Ok(op) if op.operation_id == self.operation_id => self.report(&op).await,
                    Ok(_) | Err(RecvError::Lagged(_)) => {}
                    // The feed is gone only when the server stops: wait for the answer.
                    Err(RecvError::Closed) => break call.await,
                },
            }
        };
        if let Ok(text) = &answer
            && let Ok(waited) = serde_json::from_str::<Value>(text.get())
            && let Ok(op) = serde_json::from_value::<Operation>(waited["operation"].clone())
        {
            self.report(&op).await;
        }
        answer
    }

    async fn report(&mut self, op: &Operation) {
        if let Some(level) = self.level {
            let now: Vec<OperationState> = op.stages.iter().map(|s| s.state).collect();
            // The first read is where the wait starts: only what moves after it is news,
            // and a read that moved nothing (the answer's own, after the feed's) is none.
            let news = match self.seen.replace(now.clone()) {
                Some(seen) if seen != now => transitions(op, &seen),
                _ => Vec::new(),
            };
            for message in news.into_iter().filter(|m| at_least(m.level, level)) {
                if let Err(e) = self.peer.notify_logging_message(message).await {
                    tracing::debug!(error = %e, "log message not delivered");
                }
            }
        }
        let Some(token) = &self.token else { return };
        let (done, total, message) = measure(op);
        if self.sent.is_some_and(|sent| done <= sent) {
            return;
        }
        self.sent = Some(done);
        let mut note =
            ProgressNotificationParam::new(token.clone(), done as f64).with_total(total as f64);
        if let Some(message) = message {
            note = note.with_message(message);
        }
        // A client that cannot take the notification still gets the answer.
        if let Err(e) = self.peer.notify_progress(note).await {
            tracing::debug!(error = %e, "progress notification not delivered");
        }
    }
}

/// Stages done, stages in all, and what to say: the stage running now (or next), or how
/// the operation ended.
fn measure(op: &Operation) -> (usize, usize, Option<String>) {
    let total = op.stages.len();
    let done = op
        .stages
        .iter()
        .filter(|s| s.state == OperationState::Succeeded)
        .count();
    let message = if op.state.is_terminal() {
        Some(format!("{} {}", op.command, op.state.as_str()))
    } else {
        op.current_stage()
            .map(|s| format!("{}: {}", s.name, s.title))
    };
    (done, total, message)
}
