//! Starting an operation: the request's plan is written (operation, stages, first event)
//! in one transaction before any AWS or Kubernetes call, and only then does the command
//! answer. The store's unique indexes decide races: ten identical requests sent at once
//! make one operation, and a different request for a busy target is refused.

use app::api::ApiError;
use app::api::operations::{OperationRef, OperationState};
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::pipeline::{Pipeline, Preflight, Registered, Stage};
use crate::auth::Actor;
use crate::clock;
use crate::store::{Store, StoreError, on_pool};

/// The command that follows any operation.
pub const STATUS_COMMAND: &str = "get_operation";

/// Starts `request` as an operation, or returns the one it repeats. The pipeline's
/// pre-flight runs only when a new operation is needed: it checks the world (and may fill
/// in defaults) before anything is written.
///
/// An identical request always gets the same operation, however the calls interleave:
/// the store is asked before the pre-flight and again after it (a pre-flight takes
/// seconds, and an identical request may have started the operation meanwhile, which can
/// make this one's pre-flight fail: "the name is taken" by that very operation).
pub async fn submit<P: Registered>(
    store: &Store,
    actor: &Actor,
    request: P,
    cx: &Preflight<'_>,
) -> Result<OperationRef, ApiError> {
    let command = P::SPEC.name;
    let target = request.target();
    let key = request.idempotency_key().map(|k| k.to_string());
    let hash = request_hash(command, &target, &request)?;
    let arrived = clock::now();
    let again = || async {
        existing(
            store,
            command,
            &target,
            key.as_deref(),
            &hash,
            Some(&arrived),
        )
        .await
    };
    if let Some(found) = existing(store, command, &target, key.as_deref(), &hash, None).await? {
        return Ok(found);
    }
    let request = match request.preflight(cx).await {
        Ok(r) => r,
        Err(e) => {
            return match again().await? {
                Some(found) => Ok(found),
                None => Err(e),
            };
        }
    };
    if let Some(found) = again().await? {
        return Ok(found);
    }
    // The last thing before the request is stored: its secrets go where its steps will
    // find them, and out of the request.
    let mut request = request;
    request.keep_secrets(cx).await?;
    let id = clock::sortable_id("op");
    match insert(store, actor, &request, &id, &target, key.as_deref(), &hash).await {
        Ok(()) => Ok(OperationRef {
            operation_id: id,
            status_command: STATUS_COMMAND.into(),
            state: OperationState::Pending,
            created: true,
        }),
        // Another request won the race for the key or the target: answer as it would.
        Err(e) if is_unique_violation(&e) => again()
            .await?
            .ok_or_else(|| ApiError::internal("operation vanished after a conflicting insert")),
        Err(e) => Err(StoreError::from(e).into()),
    }
}

/// The same request (command, target and spec; the idempotency key aside) hashes alike.
fn request_hash<P: Pipeline>(command: &str, target: &str, request: &P) -> Result<String, ApiError> {
    let mut spec = serde_json::to_value(request).map_err(ApiError::internal)?;
    if let Value::Object(map) = &mut spec {
        map.remove("idempotency_key");
    }
    // A secret is no part of what a request is: two that differ only in it are one.
    P::redact(&mut spec);
    let mut h = Sha256::new();
    h.update(command.as_bytes());
    h.update([0]);
    h.update(target.as_bytes());
    h.update([0]);
    // serde_json's maps are ordered (BTreeMap), so equal requests serialize alike.
    h.update(spec.to_string().as_bytes());
    Ok(format!("{:x}", h.finalize()))
}

type Found = (String, String, String, String, String);

/// The operation this request repeats, a Conflict if the target is busy with another, or
/// None when a new operation should start.
///
/// With `since`, an identical request's operation created at or after it counts even when
/// it has finished already: it is the one this request raced with.
async fn existing(
    store: &Store,
    command: &str,
    target: &str,
    key: Option<&str>,
    hash: &str,
    since: Option<&str>,
) -> Result<Option<OperationRef>, ApiError> {
    if let Some(key) = key
        && let Some(found) = by_key(store, command, target, key, hash).await?
    {
        return Ok(Some(found));
    }
    const ACTIVE: &str =
        "SELECT id, command, target, state, request_hash FROM operations WHERE active_target = $1";
    let row: Option<Found> = on_pool!(store, |pool| sqlx::query_as(ACTIVE)
        .bind(target)
        .fetch_optional(pool)
        .await)
    .map_err(StoreError::from)?;
    if let Some(since) = since
        && row.is_none()
    {
        const RACED: &str = "SELECT id, command, target, state, request_hash FROM operations \
             WHERE target = $1 AND command = $2 AND request_hash = $3 AND created_at >= $4 \
             ORDER BY created_at LIMIT 1";
        let raced: Option<Found> = on_pool!(store, |pool| sqlx::query_as(RACED)
            .bind(target)
            .bind(command)
            .bind(hash)
            .bind(since)
            .fetch_optional(pool)
            .await)
        .map_err(StoreError::from)?;
        return Ok(raced.map(|(id, _, _, state, _)| reference(id, &state)));
    }
    match row {
        Some((id, c, _, state, h)) if c == command && h == hash => Ok(Some(reference(id, &state))),
        Some((id, c, _, state, _)) => Err(ApiError::Conflict {
            message: format!(
                "{target} has an unfinished operation {id} ({c}, {state}): wait for it with wait_operation, or cancel it with cancel_operation"
            ),
            operation_id: Some(id),
            field: None,
        }),
        None => Ok(None),
    }
}

/// The operation idempotency key `key` started, if this very request started it; a
/// Conflict naming the field if the key names another request (never an operation it
/// did not ask for, answered as if it had been done).
async fn by_key(
    store: &Store,
    command: &str,
    target: &str,
    key: &str,
    hash: &str,
) -> Result<Option<OperationRef>, ApiError> {
    const SQL: &str = "SELECT id, command, target, state, request_hash FROM operations WHERE idempotency_key = $1";
    let row: Option<Found> = on_pool!(store, |pool| sqlx::query_as(SQL)
        .bind(key)
        .fetch_optional(pool)
        .await)
    .map_err(StoreError::from)?;
    let Some((id, c, t, state, h)) = row else {
        return Ok(None);
    };
    // Operations stored before requests were hashed have no hash to compare.
    let other_values = !h.is_empty() && h != hash;
    if c == command && t == target && !other_values {
        return Ok(Some(reference(id, &state)));
    }
    let what = if c != command || t != target {
        format!("{c} on {t}")
    } else {
        format!("{c} on {t} with other values")
    };
    Err(ApiError::Conflict {
        message: format!(
            "idempotency_key: this key was already used for a different request, operation {id} ({what}); send a new key for a new request, or that same request to get its operation"
        ),
        operation_id: Some(id),
        field: Some("idempotency_key".to_owned()),
    })
}

/// Refuses `request` if its idempotency key names a different request: checked before
/// a plan is shown, so a destructive request is not planned and confirmed only to be
/// refused on its confirmed call.
pub async fn check_key<P: Pipeline>(store: &Store, request: &P) -> Result<(), ApiError> {
    started_by_key(store, request).await.map(drop)
}

/// The operation this very request already started under its idempotency key, as it is
/// now; a Conflict if the key names another request. A retry of a destructive request
/// is answered with it instead of a new plan and confirmation: the request was confirmed
/// when it started, and once it has run, what it deleted can no longer be planned.
pub async fn started_by_key<P: Pipeline>(
    store: &Store,
    request: &P,
) -> Result<Option<OperationRef>, ApiError> {
    let Some(key) = request.idempotency_key() else {
        return Ok(None);
    };
    let target = request.target();
    let hash = request_hash(P::SPEC.name, &target, request)?;
    by_key(store, P::SPEC.name, &target, key.as_str(), &hash).await
}

fn reference(id: String, state: &str) -> OperationRef {
    OperationRef {
        operation_id: id,
        status_command: STATUS_COMMAND.into(),
        state: OperationState::parse(state).unwrap_or(OperationState::Pending),
        created: false,
    }
}

async fn insert<P: Pipeline>(
    store: &Store,
    actor: &Actor,
    request: &P,
    id: &str,
    target: &str,
    key: Option<&str>,
    hash: &str,
) -> Result<(), sqlx::Error> {
    let spec = serde_json::to_string(request).map_err(|e| sqlx::Error::Encode(Box::new(e)))?;
    let now = clock::now();
    let stages = request.plan();
    on_pool!(store, |pool| {
        let mut tx = pool.begin().await?;
        sqlx::query(
            "INSERT INTO operations (id, command, target, state, created_at, updated_at, requested_by, spec, outputs, idempotency_key, request_hash, active_target, next_run_at) \
             VALUES ($1, $2, $3, 'pending', $4, $4, $5, $6, '{}', $7, $8, $3, $4)",
        )
        .bind(id)
        .bind(P::SPEC.name)
        .bind(target)
        .bind(&now)
        .bind(&actor.name)
        .bind(&spec)
        .bind(key)
        .bind(hash)
        .execute(&mut *tx)
        .await?;
        for (idx, s) in stages.iter().enumerate() {
            sqlx::query(
                "INSERT INTO operation_stages (operation_id, idx, name, title, state, cancellable) VALUES ($1, $2, $3, $4, 'pending', $5)",
            )
            .bind(id)
            .bind(idx as i64)
            .bind(s.name())
            .bind(s.title())
            .bind(i64::from(s.cancellable()))
            .execute(&mut *tx)
            .await?;
        }
        super::insert_event(
            id,
            &now,
            None,
            "pending",
            Some(format!("requested by {}", actor.name)),
        )
        .execute(&mut *tx)
        .await?;
        tx.commit().await
    })
}

fn is_unique_violation(e: &sqlx::Error) -> bool {
    e.as_database_error()
        .is_some_and(|d| d.is_unique_violation())
}
