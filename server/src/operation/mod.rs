//! Operations as stored: every mutation is an operation whose plan (its stages) is written
//! before anything is called. This module reads them back (`get_operation`, lists, the
//! live channel); `submit` writes new ones, `worker` advances them, `pipeline` is what
//! each kind of operation does in each stage.

pub mod control;
pub mod pipeline;
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

type StageRow = (
    String,
    String,
    String,
    String,
    i64,
    i64,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
);

const STAGE_COLUMNS: &str = "operation_id, name, title, state, cancellable, attempts, started_at, finished_at, next_poll_at, message, error";

fn state(s: &str) -> OperationState {
    // The columns' CHECK constraints admit only known states.
    OperationState::parse(s).unwrap_or(OperationState::Failed)
}

fn error(json: Option<String>) -> Option<ApiError> {
    json.and_then(|e| serde_json::from_str(&e).ok())
}

fn stage(r: StageRow) -> (String, Stage) {
    (
        r.0,
        Stage {
            name: r.1,
            title: r.2,
            state: state(&r.3),
            cancellable: r.4 != 0,
            attempts: u32::try_from(r.5).unwrap_or(0),
            started_at: r.6,
            finished_at: r.7,
            next_poll_at: r.8,
            message: r.9,
            error: error(r.10),
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
    Operation {
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
    // One query for every stage of the page; ids are ours (hex), bound as parameters.
    let placeholders: Vec<String> = (1..=rows.len()).map(|i| format!("${i}")).collect();
    let sql = format!(
        "SELECT {STAGE_COLUMNS} FROM operation_stages WHERE operation_id IN ({}) ORDER BY operation_id, idx",
        placeholders.join(", ")
    );
    let stage_rows: Vec<StageRow> = on_pool!(store, |pool| {
        let mut q = sqlx::query_as(&sql);
        for r in &rows {
            q = q.bind(&r.0);
        }
        q.fetch_all(pool).await
    })?;
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
