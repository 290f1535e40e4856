//! Operations as stored: what `list_operations`, `get_operation` and `wait_operation`
//! read. The engine that creates and advances them writes the same rows.

use app::api::operations::{Operation, OperationState};

use crate::store::{Store, StoreError, on_pool};

type Row = (String, String, String, String, String, String);

const COLUMNS: &str = "id, command, target, state, created_at, updated_at";
const LIST_LIMIT: i64 = 200;

fn operation(r: Row) -> Operation {
    Operation {
        operation_id: r.0,
        command: r.1,
        target: r.2,
        // The column's CHECK constraint admits only known states.
        state: OperationState::parse(&r.3).unwrap_or(OperationState::Failed),
        created_at: r.4,
        updated_at: r.5,
    }
}

pub async fn list(
    store: &Store,
    state: Option<OperationState>,
    target: Option<&str>,
) -> Result<Vec<Operation>, StoreError> {
    let sql = format!(
        "SELECT {COLUMNS} FROM operations \
         WHERE ($1 IS NULL OR state = $1) AND ($2 IS NULL OR target = $2) \
         ORDER BY created_at DESC, id DESC LIMIT $3"
    );
    let state = state.map(OperationState::as_str);
    let rows: Vec<Row> = on_pool!(store, |pool| sqlx::query_as(&sql)
        .bind(state)
        .bind(target)
        .bind(LIST_LIMIT)
        .fetch_all(pool)
        .await)?;
    Ok(rows.into_iter().map(operation).collect())
}

pub async fn get(store: &Store, id: &str) -> Result<Option<Operation>, StoreError> {
    let sql = format!("SELECT {COLUMNS} FROM operations WHERE id = $1");
    let row: Option<Row> = on_pool!(store, |pool| sqlx::query_as(&sql)
        .bind(id)
        .fetch_optional(pool)
        .await)?;
    Ok(row.map(operation))
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
    Ok(rows.into_iter().map(operation).collect())
}
