//! The worker: claims due operations with a lease, advances each through its stages and
//! stores every transition before the next call. A claim is one atomic UPDATE (SQLite
//! serialises writers; PostgreSQL adds `FOR UPDATE SKIP LOCKED`), every later write is
//! fenced by the lease owner, and a lease is renewed while a step runs — so two replicas
//! never advance the same operation, and a crashed one's work is taken over when its
//! lease expires. Long waits are stored (`waiting` + next poll time), not held in memory.

use std::sync::Arc;
use std::time::{Duration, Instant};

use app::api::ApiError;
use app::api::operations::OperationState;
use tokio::sync::Notify;
use tokio::task::JoinSet;

use super::pipeline::{self, Context, Progress};
use crate::aws::Aws;
use crate::store::{Store, StoreError, on_pool};
use crate::{clock, telemetry};

/// How long a claim holds without renewal.
const LEASE: Duration = Duration::from_secs(15);
/// How often a running step renews its lease.
const HEARTBEAT: Duration = Duration::from_secs(5);
/// How often the store is asked for due work when nothing woke the worker and none of
/// its own waits is due sooner: work another replica stored, or a lease that expired.
const IDLE_POLL: Duration = Duration::from_millis(500);
/// Operations advanced at once by one worker.
const IN_FLIGHT: usize = 64;
/// Transient failures in a row before a stage fails for good.
const MAX_RETRIES: i64 = 6;

/// The handle the service keeps: wakes the worker when an operation was submitted.
#[derive(Clone, Default)]
pub struct Wake(Arc<Notify>);

impl Wake {
    pub fn now(&self) {
        self.0.notify_one();
    }
}

pub use crate::config::Pace;

pub struct Worker {
    store: Store,
    aws: Arc<Aws>,
    owner: String,
    wake: Wake,
    pace: Pace,
}

impl Worker {
    pub fn new(store: Store, aws: Arc<Aws>, wake: Wake, pace: Pace) -> Self {
        Self {
            store,
            aws,
            owner: clock::sortable_id(&format!("worker-{}", std::process::id())),
            wake,
            pace,
        }
    }

    /// Runs until the process ends.
    pub async fn run(self) {
        let this = Arc::new(self);
        if let Store::Sqlite(_) = this.store
            && let Err(e) = this.release_stale_leases().await
        {
            tracing::error!(error = %e, "worker: cannot release the leases of a previous run");
        }
        tracing::info!(owner = %this.owner, "operations worker started");
        let mut tasks = JoinSet::new();
        // When the waits this worker stored fall due: it looks again then, not at its
        // next idle poll, so a short wait is not stretched to the poll's length.
        let mut due = std::collections::BinaryHeap::new();
        loop {
            while let Some(done) = tasks.try_join_next() {
                due.extend(done.ok().flatten().map(std::cmp::Reverse));
            }
            let now = Instant::now();
            while due.peek().is_some_and(|d| d.0 <= now) {
                due.pop();
            }
            let room = IN_FLIGHT.saturating_sub(tasks.len());
            if room > 0 {
                match this.claim(room).await {
                    Ok(ids) => {
                        for id in ids {
                            let w = this.clone();
                            tasks.spawn(async move { w.advance(&id).await });
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "worker: cannot claim operations"),
                }
            }
            let sleep = due.peek().map_or(IDLE_POLL, |d| {
                d.0.saturating_duration_since(now).min(IDLE_POLL)
            });
            tokio::select! {
                _ = this.wake.0.notified() => {}
                _ = tokio::time::sleep(sleep) => {}
                Some(done) = tasks.join_next(), if !tasks.is_empty() => {
                    due.extend(done.ok().flatten().map(std::cmp::Reverse));
                }
            }
        }
    }

    /// With SQLite one process owns the store, so any lease found at start is a crashed
    /// run's: its operations resume at once instead of after the lease expires.
    async fn release_stale_leases(&self) -> Result<(), StoreError> {
        on_pool!(&self.store, |pool| {
            sqlx::query(
            "UPDATE operations SET lease_owner = NULL, lease_until = NULL WHERE lease_owner IS NOT NULL"
        )
        .execute(pool)
        .await
        .map(drop)
        })?;
        Ok(())
    }

    /// Takes the lease of up to `limit` due operations.
    async fn claim(&self, limit: usize) -> Result<Vec<String>, StoreError> {
        let now = clock::now();
        let until = clock::after(LEASE);
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        const DUE: &str = "SELECT id FROM operations WHERE next_run_at IS NOT NULL AND next_run_at <= $3 \
             AND (lease_until IS NULL OR lease_until < $3) ORDER BY next_run_at LIMIT $4";
        // PostgreSQL's replicas must not claim the same rows; SQLite serialises writers.
        let lock = match &self.store {
            Store::Sqlite(_) => "",
            Store::Postgres(_) => " FOR UPDATE SKIP LOCKED",
        };
        let sql = format!(
            "UPDATE operations SET lease_owner = $1, lease_until = $2 WHERE id IN ({DUE}{lock}) RETURNING id"
        );
        let rows: Vec<(String,)> = on_pool!(&self.store, |pool| sqlx::query_as(&sql)
            .bind(&self.owner)
            .bind(&until)
            .bind(&now)
            .bind(limit)
            .fetch_all(pool)
            .await)?;
        Ok(rows.into_iter().map(|(id,)| id).collect())
    }

    /// Advances one claimed operation until it waits, fails, finishes or loses its lease;
    /// when it waits, the instant its wait is due.
    async fn advance(&self, id: &str) -> Option<Instant> {
        let heartbeat = {
            let (store, owner, id) = (self.store.clone(), self.owner.clone(), id.to_owned());
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(HEARTBEAT).await;
                    if !renew(&store, &owner, &id).await {
                        break;
                    }
                }
            })
        };
        let result = self.advance_leased(id).await;
        heartbeat.abort();
        match result {
            Ok(wait) => wait.map(|w| Instant::now() + w),
            Err(e) => {
                match e {
                    Halt::LostLease => {
                        tracing::warn!(
                            operation = id,
                            "worker: lease lost; another worker continues it"
                        )
                    }
                    Halt::Store(e) => {
                        tracing::error!(operation = id, error = %e, "worker: store failed; the operation resumes when its lease expires")
                    }
                    Halt::Settle(e) => {
                        tracing::error!(operation = id, error = %e, "worker: could not record what the operation made its cluster; it finishes when its lease expires")
                    }
                }
                None
            }
        }
    }

    /// What [`Worker::advance`] does once the lease is held; the wait it stored, if any.
    async fn advance_leased(&self, id: &str) -> Result<Option<Duration>, Halt> {
        let Some(mut op) = Live::load(&self.store, id).await? else {
            return Ok(None);
        };
        let cx = Context {
            aws: self.aws.clone(),
            store: self.store.clone(),
            operation_id: op.id.clone(),
            requested_by: op.requested_by.clone(),
        };
        loop {
            if op.cancel_requested {
                // A cancelled operation may have changed part of what it was asked to.
                pipeline::settle(&cx, &op.command, &op.spec, &op.outputs, false)
                    .await
                    .map_err(Halt::Settle)?;
                op.cancel();
                return op
                    .save(&self.store, &self.owner, None, true)
                    .await
                    .map(|()| None);
            }
            let Some(i) = op
                .stages
                .iter()
                .position(|s| s.state != OperationState::Succeeded)
            else {
                pipeline::settle(&cx, &op.command, &op.spec, &op.outputs, true)
                    .await
                    .map_err(Halt::Settle)?;
                op.state = OperationState::Succeeded;
                let note = op
                    .stages
                    .is_empty()
                    .then(|| app::api::operations::NOTHING_TO_DO.to_owned());
                op.event(None, "succeeded", note);
                return op
                    .save(&self.store, &self.owner, None, true)
                    .await
                    .map(|()| None);
            };
            if op.stages[i].state.is_terminal() {
                // Failed or cancelled while this worker held no lease: nothing to run.
                return op
                    .save(&self.store, &self.owner, None, true)
                    .await
                    .map(|()| None);
            }
            if op.stages[i].state == OperationState::Running && !op.resumed {
                // It was running when its worker stopped (a crash, a lost lease): this
                // run is another attempt, and the trail says why it happens.
                op.resumed = true;
                let s = &mut op.stages[i];
                s.attempts += 1;
                s.dirty = true;
                let name = s.name.clone();
                op.event(
                    Some(&name),
                    "running",
                    Some("resumed: the previous attempt was interrupted".to_owned()),
                );
                op.save(&self.store, &self.owner, Some(clock::now()), false)
                    .await?;
            }
            if op.stages[i].state == OperationState::Pending {
                let s = &mut op.stages[i];
                s.state = OperationState::Running;
                s.attempts += 1;
                s.started_at.get_or_insert_with(clock::now);
                s.dirty = true;
                op.state = OperationState::Running;
                let name = op.stages[i].name.clone();
                op.event(Some(&name), "running", None);
                op.save(&self.store, &self.owner, Some(clock::now()), false)
                    .await?;
            }
            let name = op.stages[i].name.clone();
            let started = Instant::now();
            let step_cx = Context {
                aws: Arc::new(self.aws.for_step(&op.id, &name)),
                store: cx.store.clone(),
                operation_id: cx.operation_id.clone(),
                requested_by: cx.requested_by.clone(),
            };
            let (result, outputs) =
                pipeline::run_stage(&step_cx, &op.command, &name, &op.spec, &op.outputs).await;
            let labels = [("command", op.command.clone()), ("stage", name.clone())];
            metrics::histogram!(telemetry::STEP_DURATION, &labels)
                .record(started.elapsed().as_secs_f64());
            if let Some(o) = outputs {
                op.outputs = o.to_string();
            }
            let s = &mut op.stages[i];
            s.dirty = true;
            match result {
                Ok(Progress::Done) => {
                    s.state = OperationState::Succeeded;
                    s.finished_at = Some(clock::now());
                    s.next_poll_at = None;
                    // A wait's note ("still CREATING") no longer describes it.
                    s.message = None;
                    s.retries = 0;
                    op.event(Some(&name), "succeeded", None);
                    op.save(&self.store, &self.owner, Some(clock::now()), false)
                        .await?;
                }
                Ok(Progress::Wait { after, message }) => {
                    let changed = s.state != OperationState::Waiting
                        || s.message.as_deref() != Some(message.as_str());
                    let in_stage = s
                        .started_at
                        .as_deref()
                        .and_then(clock::parse_time)
                        .and_then(|t| t.elapsed().ok())
                        .unwrap_or_default();
                    let wait = poll_interval(in_stage, after, self.pace.min_poll);
                    let next = clock::after(wait);
                    s.state = OperationState::Waiting;
                    s.next_poll_at = Some(next.clone());
                    s.message = Some(message.clone());
                    s.retries = 0;
                    op.state = OperationState::Waiting;
                    if changed {
                        op.event(Some(&name), "waiting", Some(message));
                    }
                    return op
                        .save(&self.store, &self.owner, Some(next), true)
                        .await
                        .map(|()| Some(wait));
                }
                Err(e) if is_transient(&e) && s.retries < MAX_RETRIES => {
                    s.retries += 1;
                    s.attempts += 1;
                    let after = backoff(s.retries, self.pace.retry_backoff);
                    let next = clock::after(after);
                    let message = format!("{e}; trying again in {}", seconds(after));
                    s.state = OperationState::Waiting;
                    s.next_poll_at = Some(next.clone());
                    s.message = Some(message.clone());
                    op.state = OperationState::Waiting;
                    op.event(Some(&name), "waiting", Some(message));
                    return op
                        .save(&self.store, &self.owner, Some(next), true)
                        .await
                        .map(|()| Some(after));
                }
                Err(e) => {
                    pipeline::settle(&cx, &op.command, &op.spec, &op.outputs, false)
                        .await
                        .map_err(Halt::Settle)?;
                    let json = serde_json::to_string(&e).ok();
                    s.state = OperationState::Failed;
                    s.finished_at = Some(clock::now());
                    s.next_poll_at = None;
                    s.error = json.clone();
                    op.state = OperationState::Failed;
                    op.error = json;
                    op.event(Some(&name), "failed", Some(e.to_string()));
                    op.save(&self.store, &self.owner, None, true).await?;
                    if let Err(e) = pipeline::failed(&cx, &op.command, &op.spec).await {
                        tracing::warn!(operation = %op.id, error = %e, "could not record the failure beyond the operation");
                    }
                    return Ok(None);
                }
            }
        }
    }
}

/// Whether asking again may help is decided where the error is raised (throttling,
/// provider 5xx and transport failures are; a refusal or a failed resource is not).
fn is_transient(e: &ApiError) -> bool {
    matches!(
        e,
        ApiError::Upstream {
            transient: true,
            ..
        }
    )
}

/// How long a waiting stage sleeps: a quarter of the time it has waited so far, from
/// `at_least` (the pace's floor) up to the step's own interval. Quick transitions are
/// seen quickly; a 15-minute creation is polled a few dozen times, not every second.
fn poll_interval(in_stage: Duration, at_most: Duration, at_least: Duration) -> Duration {
    (in_stage / 4).clamp(at_least, at_most.max(at_least))
}

/// `first`, then twice as long for each further failure in a row (2 s, 4 s, 8 s … with
/// the default), at most a minute.
fn backoff(retries: i64, first: Duration) -> Duration {
    let exp = u32::try_from(retries.clamp(1, 6) - 1).unwrap_or(5);
    (first * 2u32.pow(exp)).min(Duration::from_secs(60))
}

/// A wait as a note shows it: whole seconds when it is, else to the millisecond.
fn seconds(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{} s", d.as_secs())
    } else {
        format!("{:.3} s", d.as_secs_f64())
    }
}

async fn renew(store: &Store, owner: &str, id: &str) -> bool {
    let r = on_pool!(store, |pool| sqlx::query(
        "UPDATE operations SET lease_until = $1 WHERE id = $2 AND lease_owner = $3"
    )
    .bind(clock::after(LEASE))
    .bind(id)
    .bind(owner)
    .execute(pool)
    .await
    .map(|r| r.rows_affected()));
    matches!(r, Ok(1))
}

enum Halt {
    LostLease,
    Store(StoreError),
    /// What the finished operation makes its cluster meant to be could not be recorded.
    Settle(ApiError),
}

impl From<StoreError> for Halt {
    fn from(e: StoreError) -> Self {
        Halt::Store(e)
    }
}

impl From<sqlx::Error> for Halt {
    fn from(e: sqlx::Error) -> Self {
        Halt::Store(StoreError::Query(e))
    }
}

/// An operation as the worker holds it between writes.
struct Live {
    id: String,
    command: String,
    target: String,
    requested_by: String,
    spec: String,
    outputs: String,
    state: OperationState,
    error: Option<String>,
    cancel_requested: bool,
    /// The first stage found running at load has been counted as a new attempt.
    resumed: bool,
    stages: Vec<LiveStage>,
    events: Vec<(Option<String>, &'static str, Option<String>)>,
}

struct LiveStage {
    idx: i64,
    name: String,
    state: OperationState,
    attempts: i64,
    retries: i64,
    started_at: Option<String>,
    finished_at: Option<String>,
    next_poll_at: Option<String>,
    message: Option<String>,
    error: Option<String>,
    dirty: bool,
}

type OpRow = (
    String,
    String,
    String,
    String,
    String,
    String,
    String,
    Option<String>,
    i64,
);

impl Live {
    async fn load(store: &Store, id: &str) -> Result<Option<Self>, StoreError> {
        let row: Option<OpRow> = on_pool!(store, |pool| {
            sqlx::query_as(
            "SELECT id, command, target, requested_by, spec, outputs, state, error, cancel_requested FROM operations WHERE id = $1"
        )
        .bind(id)
        .fetch_optional(pool)
        .await
        })?;
        let Some(r) = row else { return Ok(None) };
        let stages = super::stage_rows(store, &[id]).await?;
        Ok(Some(Live {
            id: r.0,
            command: r.1,
            target: r.2,
            requested_by: r.3,
            spec: r.4,
            outputs: r.5,
            state: OperationState::parse(&r.6).unwrap_or(OperationState::Failed),
            error: r.7,
            cancel_requested: r.8 != 0,
            resumed: false,
            stages: stages
                .into_iter()
                .map(|s| LiveStage {
                    idx: s.idx,
                    name: s.name,
                    state: OperationState::parse(&s.state).unwrap_or(OperationState::Failed),
                    attempts: s.attempts,
                    retries: s.retries,
                    started_at: s.started_at,
                    finished_at: s.finished_at,
                    next_poll_at: s.next_poll_at,
                    message: s.message,
                    error: s.error,
                    dirty: false,
                })
                .collect(),
            events: Vec::new(),
        }))
    }

    fn event(&mut self, stage: Option<&str>, state: &'static str, message: Option<String>) {
        self.events.push((stage.map(str::to_owned), state, message));
    }

    fn cancel(&mut self) {
        for s in self.stages.iter_mut().filter(|s| !s.state.is_terminal()) {
            s.state = OperationState::Cancelled;
            s.next_poll_at = None;
            s.finished_at = Some(clock::now());
            s.dirty = true;
        }
        self.state = OperationState::Cancelled;
        self.event(None, "cancelled", None);
    }

    /// Writes the operation, its changed stages and new events in one transaction,
    /// fenced by the lease: if another worker owns it now, nothing is written.
    async fn save(
        &mut self,
        store: &Store,
        owner: &str,
        next_run_at: Option<String>,
        release: bool,
    ) -> Result<(), Halt> {
        let started = Instant::now();
        let now = clock::now();
        let finished = self.state.is_terminal();
        let next_run_at = if finished { None } else { next_run_at };
        let active_target = (!finished).then_some(self.target.as_str());
        let stages: Vec<&LiveStage> = self.stages.iter().filter(|s| s.dirty).collect();
        let events = std::mem::take(&mut self.events);
        let written: Result<bool, sqlx::Error> = on_pool!(store, |pool| {
            async {
            let mut tx = pool.begin().await?;
            let updated = sqlx::query(
                "UPDATE operations SET state = $1, updated_at = $2, outputs = $3, error = $4, next_run_at = $5, \
                 active_target = $6, \
                 lease_owner = CASE WHEN $7 THEN NULL ELSE lease_owner END, \
                 lease_until = CASE WHEN $7 THEN NULL ELSE lease_until END \
                 WHERE id = $8 AND lease_owner = $9",
            )
            .bind(self.state.as_str())
            .bind(&now)
            .bind(&self.outputs)
            .bind(&self.error)
            .bind(&next_run_at)
            .bind(active_target)
            .bind(release)
            .bind(&self.id)
            .bind(owner)
            .execute(&mut *tx)
            .await?
            .rows_affected();
            if updated != 1 {
                tx.rollback().await?;
                return Ok::<bool, sqlx::Error>(false);
            }
            for s in &stages {
                sqlx::query(
                    "UPDATE operation_stages SET state = $1, attempts = $2, retries = $3, started_at = $4, \
                     finished_at = $5, next_poll_at = $6, message = $7, error = $8 WHERE operation_id = $9 AND idx = $10",
                )
                .bind(s.state.as_str())
                .bind(s.attempts)
                .bind(s.retries)
                .bind(&s.started_at)
                .bind(&s.finished_at)
                .bind(&s.next_poll_at)
                .bind(&s.message)
                .bind(&s.error)
                .bind(&self.id)
                .bind(s.idx)
                .execute(&mut *tx)
                .await?;
            }
            for (stage, state, message) in &events {
                super::insert_event(&self.id, &now, stage.as_deref(), state, message.clone())
                    .execute(&mut *tx)
                    .await?;
            }
            tx.commit().await?;
            Ok(true)
        }
        .await
        });
        if !written? {
            return Err(Halt::LostLease);
        }
        metrics::histogram!(telemetry::TRANSITION_DURATION, "backend" => store.backend())
            .record(started.elapsed().as_secs_f64());
        for s in &mut self.stages {
            s.dirty = false;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_errors_raised_as_transient_are_retried() {
        let upstream = |transient: bool| ApiError::Upstream {
            service: "eks".into(),
            call: "CreateAccessEntry".into(),
            code: None,
            message: "m".into(),
            request_id: None,
            transient,
        };
        assert!(is_transient(&upstream(true)));
        assert!(!is_transient(&upstream(false)));
        assert!(!is_transient(&ApiError::field("name", "bad")));
    }

    #[test]
    fn polls_start_fast_and_slow_down_to_the_steps_interval() {
        let at_most = Duration::from_secs(30);
        let floor = Pace::DEFAULT.min_poll;
        assert_eq!(
            poll_interval(Duration::ZERO, at_most, floor),
            Duration::from_secs(1)
        );
        assert_eq!(
            poll_interval(Duration::from_secs(20), at_most, floor),
            Duration::from_secs(5)
        );
        assert_eq!(
            poll_interval(Duration::from_secs(600), at_most, floor),
            at_most
        );
        assert_eq!(
            poll_interval(Duration::from_secs(600), Duration::ZERO, floor),
            Duration::from_secs(1)
        );
        // A lower floor: quick transitions are seen sooner, long ones polled the same.
        let floor = Duration::from_millis(50);
        assert_eq!(poll_interval(Duration::ZERO, at_most, floor), floor);
        assert_eq!(
            poll_interval(Duration::from_secs(600), at_most, floor),
            at_most
        );
    }

    #[test]
    fn backoff_doubles_to_a_minute() {
        let first = Pace::DEFAULT.retry_backoff;
        let secs: Vec<u64> = (1..=7).map(|n| backoff(n, first).as_secs()).collect();
        assert_eq!(secs, [2, 4, 8, 16, 32, 60, 60]);
        let ms: Vec<u128> = (1..=3)
            .map(|n| backoff(n, Duration::from_millis(100)).as_millis())
            .collect();
        assert_eq!(ms, [100, 200, 400]);
        assert_eq!(seconds(Duration::from_secs(4)), "4 s");
        assert_eq!(seconds(Duration::from_millis(200)), "0.200 s");
    }
}
