//! One MCP session's live side: the resources it subscribed to, the operations it
//! started (whose events it is sent as log messages, at the level it asked), and the one
//! task that turns the shared operation feed into its notifications. The task exists only
//! while the session follows something, holds the session weakly (it ends with it), checks
//! the session's token again every 2 s (a revoked token ends every subscription), and
//! drops a subscriber that stops reading instead of queueing for it.
#![expect(
    deprecated,
    reason = "logging/setLevel and resources/subscribe are what 2025-era clients (the suite, Kiro, the Python SDK) speak; rmcp marks them deprecated in favour of 2026-07-28's subscriptions/listen"
)]

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use app::api::ApiError;
use app::api::operations::{Operation, OperationState};
use axum::http::{HeaderMap, Method, header};
use rmcp::ErrorData as McpError;
use rmcp::model::{
    LoggingLevel, LoggingMessageNotificationParam, MetaObject, NotificationMetaObject,
    ResourceUpdatedNotificationParam,
};
use rmcp::model::{ResourceUpdatedNotification, ServerNotification};
use rmcp::service::{Peer, RoleServer, SubscriptionContext};
use serde_json::json;
use tokio::sync::broadcast::error::RecvError;

use super::resources::Uri;
use crate::auth::{Actor, Face};
use crate::service::Service;

/// How often a following session's token is checked again (auth caches it this long).
const RECHECK: Duration = Duration::from_secs(2);
/// How long one notification may wait for the client to read: a client that does not
/// read for this long is no longer followed (its queue would otherwise grow).
const SEND_TIMEOUT: Duration = Duration::from_secs(5);
/// Until the client asks for a level: outcomes and trouble, not every stage.
const DEFAULT_LEVEL: LoggingLevel = LoggingLevel::Notice;

pub struct Session {
    service: Arc<Service>,
    state: Mutex<State>,
}

struct State {
    /// Who opened the session; every later request must be the same caller.
    owner: Option<String>,
    /// The last credential the caller sent, to check again while following.
    credential: HeaderMap,
    peer: Option<Peer<RoleServer>>,
    subscriptions: Follower,
    level: LoggingLevel,
    /// Operations this session started, with the stage states last reported.
    started: HashMap<String, Vec<OperationState>>,
    following: bool,
}

impl Session {
    pub fn new(service: Arc<Service>) -> Arc<Self> {
        Arc::new(Self {
            service,
            state: Mutex::new(State {
                owner: None,
                credential: HeaderMap::new(),
                peer: None,
                subscriptions: Follower::default(),
                level: DEFAULT_LEVEL,
                started: HashMap::new(),
                following: false,
            }),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Binds the session to its first caller: a session id is not a credential, so a
    /// request with another token is refused even if it names this session.
    pub fn admit(
        &self,
        actor: &Actor,
        headers: Option<&HeaderMap>,
        peer: &Peer<RoleServer>,
    ) -> Result<(), String> {
        let mut s = self.state();
        match &s.owner {
            Some(owner) if *owner != actor.name => {
                return Err(format!(
                    "this MCP session belongs to {owner}: open your own session"
                ));
            }
            Some(_) => {}
            None => s.owner = Some(actor.name.clone()),
        }
        if let Some(auth) = headers.and_then(|h| h.get(header::AUTHORIZATION)) {
            s.credential.insert(header::AUTHORIZATION, auth.clone());
        }
        if s.peer.is_none() {
            s.peer = Some(peer.clone());
        }
        Ok(())
    }

    /// `now`: the resource as the caller just read it (an operation's stages are the
    /// starting point of its stage-by-stage updates).
    pub fn subscribe(self: &Arc<Self>, uri: Uri, now: &str) {
        self.state().subscriptions.add(uri, now);
        self.follow();
    }

    pub fn unsubscribe(&self, uri: &Uri) {
        self.state().subscriptions.remove(uri);
    }

    pub fn set_level(&self, level: LoggingLevel) {
        self.state().level = level;
    }

    /// An operation this session's call started: its events become log messages.
    pub fn started(self: &Arc<Self>, operation_id: &str) {
        self.state()
            .started
            .entry(operation_id.to_owned())
            .or_default();
        self.follow();
    }

    fn follow(self: &Arc<Self>) {
        let mut s = self.state();
        if s.following {
            return;
        }
        s.following = true;
        let changes = self.service.changes.follow();
        tokio::spawn(notify(Arc::downgrade(self), changes));
    }

    /// Stops following: no subscription, no log message, until asked again.
    fn stop(&self, why: &str) {
        let mut s = self.state();
        tracing::info!(owner = ?s.owner, why, "MCP session no longer followed");
        s.subscriptions.clear();
        s.started.clear();
        s.following = false;
    }

    /// What one change means for this session: the updates of the resources it follows
    /// and the log messages (at or above its level) for operations it started.
    fn route(
        &self,
        op: &Operation,
    ) -> (
        Vec<ResourceUpdatedNotificationParam>,
        Vec<LoggingMessageNotificationParam>,
    ) {
        let mut s = self.state();
        let updates = s.subscriptions.updates(op);
        let level = s.level;
        let mut logs = Vec::new();
        if let Some(seen) = s.started.get_mut(&op.operation_id) {
            let now: Vec<OperationState> = op.stages.iter().map(|st| st.state).collect();
            logs = transitions(op, seen)
                .into_iter()
                .filter(|m| at_least(m.level, level))
                .collect();
            *seen = now;
            if op.state.is_terminal() {
                s.started.remove(&op.operation_id);
            }
        }
        (updates, logs)
    }

    fn idle(&self) -> bool {
        let s = self.state();
        s.subscriptions.is_empty() && s.started.is_empty()
    }
}

/// The resources one subscriber follows and, for each operation among them, the stage
/// states it was last told of: an operation's subscriber gets one update per stage that
/// started, waits, finished or failed, in plan order, then one for the operation's end,
/// each naming the stage and state in `_meta` (`hypd/stage`, `hypd/state`), so it knows
/// what moved without reading the operation again. A cluster's (or its nodes')
/// subscriber gets one update per change of an operation on that cluster.
#[derive(Default)]
pub struct Follower {
    uris: BTreeMap<Uri, Vec<OperationState>>,
}

impl Follower {
    pub fn add(&mut self, uri: Uri, now: &str) {
        let seen = match uri {
            Uri::Operation { .. } => serde_json::from_str::<Operation>(now)
                .map(|op| op.stages.iter().map(|s| s.state).collect())
                .unwrap_or_default(),
            _ => Vec::new(),
        };
        self.uris.insert(uri, seen);
    }

    pub fn remove(&mut self, uri: &Uri) {
        self.uris.remove(uri);
    }

    pub fn clear(&mut self) {
        self.uris.clear();
    }

    pub fn is_empty(&self) -> bool {
        self.uris.is_empty()
    }

    /// After changes were missed: every followed resource may have changed.
    pub fn everything(&self) -> Vec<ResourceUpdatedNotificationParam> {
        self.uris
            .keys()
            .map(|u| ResourceUpdatedNotificationParam::new(u.to_uri()))
            .collect()
    }

    pub fn updates(&mut self, op: &Operation) -> Vec<ResourceUpdatedNotificationParam> {
        let cluster = target_cluster(&op.target);
        let mut out = Vec::new();
        for (uri, seen) in &mut self.uris {
            match uri {
                Uri::Operation { id } if *id == op.operation_id => {
                    let text = uri.to_uri();
                    let mut moved = false;
                    for (i, stage) in op.stages.iter().enumerate() {
                        let was = seen.get(i).copied().unwrap_or(OperationState::Pending);
                        if was != stage.state {
                            moved = true;
                            out.push(update(&text, Some(&stage.name), stage.state.as_str()));
                        }
                    }
                    if op.state.is_terminal() || !moved {
                        out.push(update(&text, None, op.state.as_str()));
                    }
                    *seen = op.stages.iter().map(|s| s.state).collect();
                }
                Uri::Operation { .. } => {}
                other if other.cluster().is_some() && other.cluster() == cluster => {
                    let stage = op.current_stage().map(|s| s.name.as_str());
                    let mut u = update(&other.to_uri(), stage, op.state.as_str());
                    if let Some(meta) = u.meta.as_mut() {
                        meta.0
                            .0
                            .insert("hypd/operation_id".into(), op.operation_id.clone().into());
                    }
                    out.push(u);
                }
                _ => {}
            }
        }
        out
    }
}

fn update(uri: &str, stage: Option<&str>, state: &str) -> ResourceUpdatedNotificationParam {
    let mut u = ResourceUpdatedNotificationParam::new(uri);
    let mut meta = serde_json::Map::new();
    if let Some(stage) = stage {
        meta.insert("hypd/stage".into(), stage.into());
    }
    meta.insert("hypd/state".into(), state.into());
    u.meta = Some(NotificationMetaObject(MetaObject(meta)));
    u
}

/// The cluster an operation's target names (`cluster/ml-1`, `cluster/ml-1/…`).
fn target_cluster(target: &str) -> Option<&str> {
    target.strip_prefix("cluster/")?.split('/').next()
}

/// Whether a message at `level` is wanted by a client that asked for `wanted`.
pub(super) fn at_least(level: LoggingLevel, wanted: LoggingLevel) -> bool {
    rank(level) >= rank(wanted)
}

fn rank(level: LoggingLevel) -> u8 {
    match level {
        LoggingLevel::Debug => 0,
        LoggingLevel::Info => 1,
        LoggingLevel::Notice => 2,
        LoggingLevel::Warning => 3,
        LoggingLevel::Error => 4,
        LoggingLevel::Critical => 5,
        LoggingLevel::Alert => 6,
        LoggingLevel::Emergency => 7,
    }
}

/// The events between two reads of an operation: each stage that started, ended, waits
/// or failed, then the operation's own end.
pub(super) fn transitions(
    op: &Operation,
    before: &[OperationState],
) -> Vec<LoggingMessageNotificationParam> {
    let total = op.stages.len();
    let mut out = Vec::new();
    let message = |level, stage: Option<&str>, state: &str, text: String| {
        let mut m = LoggingMessageNotificationParam::new(
            level,
            json!({
                "operation_id": op.operation_id,
                "command": op.command,
                "target": op.target,
                "stage": stage,
                "state": state,
                "message": text,
            }),
        );
        m.logger = Some("hypd.operations".to_owned());
        m
    };
    for (i, stage) in op.stages.iter().enumerate() {
        let was = before.get(i).copied().unwrap_or(OperationState::Pending);
        if was == stage.state {
            continue;
        }
        let n = i + 1;
        let (level, text) = match stage.state {
            // A waiting stage runs again at each poll: only its first start is news.
            OperationState::Running if was == OperationState::Waiting => continue,
            OperationState::Running => (
                LoggingLevel::Info,
                format!(
                    "{} {}: stage {} ({n}/{total}) started",
                    op.command, op.operation_id, stage.name
                ),
            ),
            OperationState::Succeeded => (
                LoggingLevel::Info,
                format!(
                    "{} {}: stage {} ({n}/{total}) done",
                    op.command, op.operation_id, stage.name
                ),
            ),
            OperationState::Waiting => (
                LoggingLevel::Debug,
                format!(
                    "{} {}: stage {} ({n}/{total}) is waiting: {}",
                    op.command,
                    op.operation_id,
                    stage.name,
                    stage.message.as_deref().unwrap_or("see get_operation")
                ),
            ),
            OperationState::Failed => (
                LoggingLevel::Error,
                format!(
                    "{} {}: stage {} ({n}/{total}) failed: {}",
                    op.command,
                    op.operation_id,
                    stage.name,
                    stage
                        .error
                        .as_ref()
                        .or(op.error.as_ref())
                        .map_or_else(|| "see get_operation".to_owned(), ApiError::to_string)
                ),
            ),
            _ => continue,
        };
        out.push(message(
            level,
            Some(&stage.name),
            stage.state.as_str(),
            text,
        ));
    }
    // The session stops tracking an operation once it ends, so this is said once.
    if op.state.is_terminal() {
        let level = match op.state {
            OperationState::Succeeded => LoggingLevel::Notice,
            OperationState::Failed => LoggingLevel::Error,
            _ => LoggingLevel::Warning,
        };
        out.push(message(
            level,
            None,
            op.state.as_str(),
            format!(
                "{} {} on {}: {}",
                op.command,
                op.operation_id,
                op.target,
                op.state.as_str()
            ),
        ));
    }
    out
}

/// The session's one follower task.
async fn notify(
    session: Weak<Session>,
    mut changes: tokio::sync::broadcast::Receiver<Arc<Operation>>,
) {
    let mut recheck = tokio::time::interval(RECHECK);
    recheck.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = recheck.tick() => {
                let Some(s) = session.upgrade() else { return };
                let (credential, peer) = {
                    let st = s.state();
                    (st.credential.clone(), st.peer.clone())
                };
                if peer.as_ref().is_none_or(Peer::is_transport_closed) {
                    s.stop("the session ended");
                    return;
                }
                if !still_admitted(&s.service, &credential).await {
                    s.stop("the token was revoked");
                    return;
                }
                if s.idle() {
                    s.stop("nothing left to follow");
                    return;
                }
            }
            change = changes.recv() => {
                let Some(s) = session.upgrade() else { return };
                let (updates, logs) = match change {
                    Ok(op) => s.route(&op),
                    Err(RecvError::Lagged(_)) => (s.state().subscriptions.everything(), Vec::new()),
                    Err(RecvError::Closed) => return,
                };
                let Some(peer) = s.state().peer.clone() else { return };
                // Checked before sending too, so no change reaches a revoked token.
                if !(updates.is_empty() && logs.is_empty()) {
                    let credential = s.state().credential.clone();
                    if !still_admitted(&s.service, &credential).await {
                        s.stop("the token was revoked");
                        return;
                    }
                }
                for update in updates {
                    if !delivered(peer.notify_resource_updated(update)).await {
                        s.stop("the client stopped reading its notifications");
                        return;
                    }
                }
                for log in logs {
                    if !delivered(peer.notify_logging_message(log)).await {
                        s.stop("the client stopped reading its notifications");
                        return;
                    }
                }
            }
        }
    }
}

/// Whether the credential a follower was admitted with still holds.
async fn still_admitted(service: &Service, credential: &HeaderMap) -> bool {
    !service
        .auth
        .revoked(credential, &Method::POST, Face::Mcp)
        .await
}

/// A 2026-07-28 `subscriptions/listen` stream: the same updates as a session's
/// subscriptions, for as long as the request stays open (there is no session), ended by
/// the client's cancellation, a revoked token, or a client that stops reading.
pub async fn listen(
    service: &Arc<Service>,
    credential: HeaderMap,
    mut follower: Follower,
    context: SubscriptionContext,
) -> Result<(), McpError> {
    let mut changes = service.changes.follow();
    let mut recheck = tokio::time::interval(RECHECK);
    recheck.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let updates = tokio::select! {
            () = context.cancelled() => return Ok(()),
            _ = recheck.tick() => {
                if !still_admitted(service, &credential).await {
                    return Err(McpError::invalid_request(
                        "the token was revoked: the subscription ended",
                        None,
                    ));
                }
                continue;
            }
            change = changes.recv() => match change {
                Ok(op) => follower.updates(&op),
                Err(RecvError::Lagged(_)) => follower.everything(),
                Err(RecvError::Closed) => return Ok(()),
            },
        };
        // Checked before sending too, so no change reaches a revoked token.
        if !updates.is_empty() && !still_admitted(service, &credential).await {
            return Err(McpError::invalid_request(
                "the token was revoked: the subscription ended",
                None,
            ));
        }
        for update in updates {
            let sent = context
                .sink()
                .send(ServerNotification::ResourceUpdatedNotification(
                    ResourceUpdatedNotification::new(update),
                ));
            if !delivered(sent).await {
                return Ok(());
            }
        }
    }
}

async fn delivered<E>(send: impl std::future::Future<Output = Result<(), E>>) -> bool {
    matches!(tokio::time::timeout(SEND_TIMEOUT, send).await, Ok(Ok(())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    /// An operation on cluster ml-1 with three stages in the given states.
    fn op(id: &str, state: &str, stages: [&str; 3]) -> Operation {
        let stage = |name: &str, state: &str| {
            json!({ "name": name, "title": name, "state": state, "attempts": 1,
                    "started_at": null, "finished_at": null, "next_poll_at": null,
                    "message": null, "error": null, "cancellable": true })
        };
        serde_json::from_value(json!({
            "operation_id": id, "command": "create_cluster", "target": "cluster/ml-1",
            "state": state, "requested_by": "admin", "created_at": "t0", "updated_at": "t1",
            "stages": [stage("network", stages[0]), stage("eks", stages[1]), stage("nodes", stages[2])],
            "outputs": {}, "error": null, "retryable": false, "cancellable": false,
        }))
        .unwrap()
    }

    fn told(updates: &[ResourceUpdatedNotificationParam]) -> Vec<(String, Option<String>, String)> {
        updates
            .iter()
            .map(|u| {
                let meta = &u.meta.as_ref().unwrap().0.0;
                (
                    u.uri.clone(),
                    meta.get("hypd/stage")
                        .and_then(|v| v.as_str())
                        .map(str::to_owned),
                    meta["hypd/state"].as_str().unwrap().to_owned(),
                )
            })
            .collect()
    }

    #[test]
    fn an_operations_follower_is_told_each_stage_that_moved_in_order_then_the_end() {
        let mut f = Follower::default();
        let started = op("op-1", "running", ["succeeded", "running", "pending"]);
        f.add(
            Uri::Operation { id: "op-1".into() },
            &serde_json::to_string(&started).unwrap(),
        );
        let uri = "hypd://operations/op-1".to_owned();
        // Two stages moved between two reads: both are told, in plan order.
        let moved = op("op-1", "running", ["succeeded", "succeeded", "running"]);
        assert_eq!(
            told(&f.updates(&moved)),
            [
                (uri.clone(), Some("eks".into()), "succeeded".into()),
                (uri.clone(), Some("nodes".into()), "running".into()),
            ]
        );
        // A read where no stage moved is still one update (a message changed).
        assert_eq!(
            told(&f.updates(&moved)),
            [(uri.clone(), None, "running".into())]
        );
        let done = op("op-1", "succeeded", ["succeeded", "succeeded", "succeeded"]);
        assert_eq!(
            told(&f.updates(&done)),
            [
                (uri.clone(), Some("nodes".into()), "succeeded".into()),
                (uri, None, "succeeded".into()),
            ]
        );
        // Another operation is not this follower's business.
        assert!(
            f.updates(&op("op-2", "running", ["running", "pending", "pending"]))
                .is_empty()
        );
    }

    #[test]
    fn a_clusters_follower_is_told_of_every_operation_on_that_cluster_only() {
        let mut f = Follower::default();
        f.add(
            Uri::Cluster {
                name: "ml-1".into(),
            },
            "{}",
        );
        f.add(
            Uri::Nodes {
                name: "ml-2".into(),
            },
            "{}",
        );
        let change = op("op-3", "running", ["succeeded", "running", "pending"]);
        let updates = f.updates(&change);
        assert_eq!(
            told(&updates),
            [(
                "hypd://clusters/ml-1".into(),
                Some("eks".into()),
                "running".into()
            )]
        );
        let meta = &updates[0].meta.as_ref().unwrap().0.0;
        assert_eq!(meta["hypd/operation_id"], "op-3");
        f.remove(&Uri::Cluster {
            name: "ml-1".into(),
        });
        assert!(f.updates(&change).is_empty());
        assert_eq!(f.everything().len(), 1);
    }

    #[test]
    fn log_messages_say_each_start_end_and_failure_once_at_their_level() {
        let running = op("op-1", "running", ["succeeded", "running", "pending"]);
        let before = [
            OperationState::Succeeded,
            OperationState::Pending,
            OperationState::Pending,
        ];
        let messages = transitions(&running, &before);
        assert_eq!(messages.len(), 1);
        assert_eq!(messages[0].data["stage"], "eks");
        assert_eq!(messages[0].data["state"], "running");
        assert!(matches!(messages[0].level, LoggingLevel::Info));
        // A waiting stage polled again is not news; its wait is debug.
        let waiting = op("op-1", "running", ["succeeded", "waiting", "pending"]);
        let polled = [
            OperationState::Succeeded,
            OperationState::Waiting,
            OperationState::Pending,
        ];
        assert!(transitions(&running, &polled).is_empty());
        let wait = transitions(
            &waiting,
            &[
                OperationState::Succeeded,
                OperationState::Running,
                OperationState::Pending,
            ],
        );
        assert!(matches!(wait[0].level, LoggingLevel::Debug));
        assert!(!at_least(wait[0].level, LoggingLevel::Info));
        // The end comes last, a notice when it succeeded.
        let done = op("op-1", "succeeded", ["succeeded", "succeeded", "succeeded"]);
        let end = transitions(
            &done,
            &[
                OperationState::Succeeded,
                OperationState::Succeeded,
                OperationState::Running,
            ],
        );
        assert_eq!(end.len(), 2);
        assert_eq!(end[1].data["stage"], Value::Null);
        assert!(matches!(end[1].level, LoggingLevel::Notice));
    }

    #[test]
    fn targets_name_their_cluster() {
        assert_eq!(target_cluster("cluster/ml-1"), Some("ml-1"));
        assert_eq!(
            target_cluster("cluster/ml-1/instance-group/a"),
            Some("ml-1")
        );
        assert_eq!(target_cluster("token/x"), None);
    }
}
