//! Operations as stored: every mutation is an operation whose plan (its stages) is written
//! before anything is called. This module reads them back (`get_operation`, lists, the
//! live channel); `submit` writes new ones, `worker` advances them, `pipeline` is what
//! each kind of operation does in each stage.

pub mod commands;
pub mod control;
pub mod diagnose;
pub mod feed;
pub mod pipeline;
pub mod preview;
pub mod submit;
pub mod worker;

use std::collections::BTreeMap;

use app::api::ApiError;
use app::api::operations::{Operation, OperationState, Stage};

use crate::store::{Store, StoreError, on_pool};

type Row = (
    String,
    String,
    String,
    String,
    String,
    String,
    String,
    String,
    Option<String>,
);

const COLUMNS: &str =
    "id, command, target, state, requested_by, created_at, updated_at, outputs, error";
const LIST_LIMIT: i64 = 200;

/// One stage as stored: what reads show and what the worker advances.
#[derive(sqlx::FromRow)]
pub(crate) struct StageRow {
    pub operation_id: String,
    pub idx: i64,
    pub name: String,
    pub title: String,
    pub state: String,
    pub cancellable: i64,
    pub attempts: i64,
    pub retries: i64,
    pub started_at: Option<String>,
    pub finished_at: Option<String>,
    pub next_poll_at: Option<String>,
    pub message: Option<String>,
    pub error: Option<String>,
}

/// The stages of the operations `ids`, in each one's order.
pub(crate) async fn stage_rows(store: &Store, ids: &[&str]) -> Result<Vec<StageRow>, StoreError> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    // One query for every stage asked for; ids are ours (hex), bound as parameters.
    let placeholders: Vec<String> = (1..=ids.len()).map(|i| format!("${i}")).collect();
    let sql = format!(
        "SELECT operation_id, idx, name, title, state, cancellable, attempts, retries, started_at, \
         finished_at, next_poll_at, message, error FROM operation_stages \
         WHERE operation_id IN ({}) ORDER BY operation_id, idx",
        placeholders.join(", ")
    );
    Ok(on_pool!(store, |pool| {
        let mut q = sqlx::query_as(&sql);
        for id in ids {
            q = q.bind(*id);
        }
        q.fetch_all(pool).await
    })?)
}

fn state(s: &str) -> OperationState {
    // The columns' CHECK constraints admit only known states.
    OperationState::parse(s).unwrap_or(OperationState::Failed)
}

fn error(json: Option<String>) -> Option<ApiError> {
    json.and_then(|e| serde_json::from_str(&e).ok())
}

fn stage(r: StageRow) -> (String, Stage) {
    (
        r.operation_id,
        Stage {
            name: r.name,
            title: r.title,
            state: state(&r.state),
            cancellable: r.cancellable != 0,
            attempts: u32::try_from(r.attempts).unwrap_or(0),
            started_at: r.started_at,
            finished_at: r.finished_at,
            next_poll_at: r.next_poll_at,
            message: r.message,
            error: error(r.error),
        },
    )
}

fn operation(r: Row, stages: Vec<Stage>) -> Operation {
    let state = state(&r.3);
    let outputs: BTreeMap<String, serde_json::Value> =
        serde_json::from_str(&r.7).unwrap_or_default();
    let current_cancellable = stages
        .iter()
        .find(|s| s.state != OperationState::Succeeded)
        .is_some_and(|s| s.cancellable);
    let note = (state == OperationState::Succeeded && stages.is_empty())
        .then(|| app::api::operations::NOTHING_TO_DO.to_owned());
    Operation {
        note,
        operation_id: r.0,
        command: r.1,
        target: r.2,
        state,
        requested_by: r.4,
        created_at: r.5,
        updated_at: r.6,
        stages,
        outputs,
        error: error(r.8),
        retryable: state == OperationState::Failed,
        cancellable: !state.is_terminal() && current_cancellable,
    }
}

/// Reads the operations that `rows` name, with their stages, in the rows' order.
async fn with_stages(store: &Store, rows: Vec<Row>) -> Result<Vec<Operation>, StoreError> {
    if rows.is_empty() {
        return Ok(Vec::new());
    }
    let ids: Vec<&str> = rows.iter().map(|r| r.0.as_str()).collect();
    let stage_rows = stage_rows(store, &ids).await?;
    let mut by_op: BTreeMap<String, Vec<Stage>> = BTreeMap::new();
    for r in stage_rows {
        let (op, s) = stage(r);
        by_op.entry(op).or_default().push(s);
    }
    Ok(rows
        .into_iter()
        .map(|r| {
            let stages = by_op.remove(&r.0).unwrap_or_default();
            operation(r, stages)
        })
        .collect())
}

pub async fn list(
    store: &Store,
    state: Option<OperationState>,
    target: Option<&str>,
) -> Result<Vec<Operation>, StoreError> {
    // Only the filters given appear in the SQL: `($1 IS NULL OR state = $1)` hides the
    // column from both planners, which then scan and sort the whole table instead of
    // walking an index (created_at, or state/target then created_at) for 200 rows.
    let state = state.map(OperationState::as_str);
    let filters: Vec<(&str, &str)> = [("state", state), ("target", target)]
        .into_iter()
        .filter_map(|(column, value)| value.map(|v| (column, v)))
        .collect();
    let mut clauses = Vec::new();
    for (i, (column, _)) in filters.iter().enumerate() {
        clauses.push(format!("{column} = ${}", i + 1));
    }
    let filter = if clauses.is_empty() {
        String::new()
    } else {
        format!("WHERE {}", clauses.join(" AND "))
    };
    let sql = format!(
        "SELECT {COLUMNS} FROM operations {filter} ORDER BY created_at DESC, id DESC LIMIT ${}",
        filters.len() + 1
    );
    let rows: Vec<Row> = on_pool!(store, |pool| {
        let mut q = sqlx::query_as(&sql);
        for (_, value) in &filters {
            q = q.bind(*value);
        }
        q.bind(LIST_LIMIT).fetch_all(pool).await
    })?;
    with_stages(store, rows).await
}

pub async fn get(store: &Store, id: &str) -> Result<Option<Operation>, StoreError> {
    let sql = format!("SELECT {COLUMNS} FROM operations WHERE id = $1");
    let row: Option<Row> = on_pool!(store, |pool| sqlx::query_as(&sql)
        .bind(id)
        .fetch_optional(pool)
        .await)?;
    match row {
        Some(r) => Ok(with_stages(store, vec![r]).await?.pop()),
        None => Ok(None),
    }
}

/// Operations changed at or after `cursor` (an RFC 3339 timestamp), oldest change first.
/// When an operation on `target` last changed (RFC 3339), if one ever ran.
pub async fn changed_at(store: &Store, target: &str) -> Result<Option<String>, StoreError> {
    let at: Option<(Option<String>,)> = on_pool!(store, |pool| sqlx::query_as(
        "SELECT max(updated_at) FROM operations WHERE target = $1"
    )
    .bind(target)
    .fetch_optional(pool)
    .await)?;
    Ok(at.and_then(|(at,)| at))
}

pub async fn changed_since(store: &Store, cursor: &str) -> Result<Vec<Operation>, StoreError> {
    let sql = format!(
        "SELECT {COLUMNS} FROM operations WHERE updated_at >= $1 ORDER BY updated_at, id LIMIT $2"
    );
    let rows: Vec<Row> = on_pool!(store, |pool| sqlx::query_as(&sql)
        .bind(cursor)
        .bind(LIST_LIMIT)
        .fetch_all(pool)
        .await)?;
    with_stages(store, rows).await
}

/// The one statement that records a transition (the engine's audit trail); every writer
/// of operations calls it inside the transaction of the change it records.
pub(crate) fn insert_event<'q, DB>(
    operation_id: &'q str,
    at: &'q str,
    stage: Option<&'q str>,
    state: &'q str,
    message: Option<String>,
) -> sqlx::query::Query<'q, DB, <DB as sqlx::Database>::Arguments<'q>>
where
    DB: sqlx::Database,
    String: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    Option<&'q str>: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    Option<String>: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
{
    sqlx::query(
        "INSERT INTO operation_events (id, operation_id, at, stage, state, message) VALUES ($1, $2, $3, $4, $5, $6)",
    )
    .bind(crate::clock::sortable_id("ev"))
    .bind(operation_id)
    .bind(at)
    .bind(stage)
    .bind(state)
    .bind(message)
}

/// One recorded transition of an operation (the engine's audit trail).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub at: String,
    pub stage: Option<String>,
    pub state: String,
    pub message: Option<String>,
}

/// Every transition of one operation, oldest first.
pub async fn events(store: &Store, id: &str) -> Result<Vec<Event>, StoreError> {
    let rows: Vec<(String, Option<String>, String, Option<String>)> = on_pool!(store, |pool| {
        sqlx::query_as(
            "SELECT at, stage, state, message FROM operation_events WHERE operation_id = $1 ORDER BY at, id",
        )
        .bind(id)
        .fetch_all(pool)
        .await
    })?;
    Ok(rows
        .into_iter()
        .map(|(at, stage, state, message)| Event {
            at,
            stage,
            state,
            message,
        })
        .collect())
}
