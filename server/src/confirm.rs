//! Two-phase destructive commands. A destructive command sent without `confirmation`
//! does nothing and answers with its plan and a confirmation: random, single use, bound
//! to the caller, the command and the exact request (its hash), valid for five minutes.
//! Confirmations live in the store, not in memory, so the second call may reach another
//! replica; only their hashes are kept, as with tokens.

use std::time::Duration;

use app::api::ApiError;
use app::api::values::{CONFIRMATION_PREFIX, Confirmation};
use serde_json::value::RawValue;

use crate::auth::{Actor, hash_secret, random_hex};
use crate::clock;
use crate::store::{Store, StoreError, on_pool};

/// How long a confirmation is accepted after its plan was shown.
pub const VALID_FOR: Duration = Duration::from_secs(300);

/// The hash a confirmation is bound to: the command and its request without `dry_run`
/// and `confirmation`, as the typed request serializes (fields in declaration order).
pub fn request_hash(command: &str, request: &impl serde::Serialize) -> Result<String, ApiError> {
    let json = serde_json::to_string(request).map_err(ApiError::internal)?;
    Ok(hash_secret(&format!("{command}\n{json}")))
}

/// A new confirmation for `actor` to run `command` with the request hashed as `request`.
pub async fn issue(
    store: &Store,
    actor: &Actor,
    command: &str,
    request: &str,
) -> Result<(Confirmation, String), ApiError> {
    let secret = format!("{CONFIRMATION_PREFIX}{}", random_hex()?);
    let confirmation = Confirmation::parse(&secret).map_err(ApiError::internal)?;
    let (now, expires_at) = (clock::now(), clock::after(VALID_FOR));
    on_pool!(store, |pool| sqlx::query(
        "INSERT INTO confirmations (hash, caller, command, request_hash, created_at, expires_at) \
         VALUES ($1, $2, $3, $4, $5, $6)"
    )
    .bind(hash_secret(&secret))
    .bind(&actor.name)
    .bind(command)
    .bind(request)
    .bind(&now)
    .bind(&expires_at)
    .execute(pool)
    .await
    .map(drop))
    .map_err(StoreError::from)?;
    Ok((confirmation, expires_at))
}

/// What redeeming a confirmation found.
#[derive(Debug)]
pub enum Redeemed {
    /// Unused until now: the call runs (and [`record`]s its answer, or [`release`]s the
    /// confirmation if it failed).
    Fresh,
    /// The same caller sent the same confirmed request again: its first answer.
    Replay(String),
}

#[derive(sqlx::FromRow)]
struct Row {
    caller: String,
    command: String,
    request_hash: String,
    expires_at: String,
    used_at: Option<String>,
    answer: Option<String>,
}

fn refused(why: impl std::fmt::Display) -> ApiError {
    ApiError::field("confirmation", why.to_string())
}

/// Checks `confirmation` against the caller, command and request, and takes it (once).
pub async fn redeem(
    store: &Store,
    actor: &Actor,
    command: &str,
    request: &str,
    confirmation: &Confirmation,
) -> Result<Redeemed, ApiError> {
    let hash = hash_secret(confirmation.as_str());
    let row: Option<Row> = on_pool!(store, |pool| sqlx::query_as(
        "SELECT caller, command, request_hash, expires_at, used_at, answer \
         FROM confirmations WHERE hash = $1"
    )
    .bind(&hash)
    .fetch_optional(pool)
    .await)
    .map_err(StoreError::from)?;
    let Some(row) = row else {
        return Err(refused(
            "is not one hypd issued: send the request without it to get the plan and a confirmation",
        ));
    };
    if row.caller != actor.name {
        return Err(refused("was issued to another caller"));
    }
    if row.command != command || row.request_hash != request {
        return Err(refused(format!(
            "was issued for another request{}: send exactly the arguments of the call that returned it",
            if row.command == command {
                String::new()
            } else {
                format!(" ({})", row.command)
            }
        )));
    }
    if row.used_at.is_some() {
        return match row.answer {
            Some(answer) => Ok(Redeemed::Replay(answer)),
            None => Err(refused("is in use by a call still running")),
        };
    }
    if row.expires_at <= clock::now() {
        return Err(refused(format!(
            "expired at {}: send the request without it for a new plan",
            row.expires_at
        )));
    }
    let taken = on_pool!(store, |pool| sqlx::query(
        "UPDATE confirmations SET used_at = $2 WHERE hash = $1 AND used_at IS NULL"
    )
    .bind(&hash)
    .bind(clock::now())
    .execute(pool)
    .await
    .map(|r| r.rows_affected()))
    .map_err(StoreError::from)?;
    if taken == 1 {
        Ok(Redeemed::Fresh)
    } else {
        // Another call took it between the read and the update.
        Err(refused("is in use by a call still running"))
    }
}

/// Keeps what the confirmed call answered, for replays.
pub async fn record(store: &Store, confirmation: &Confirmation, answer: &RawValue) {
    let written = on_pool!(store, |pool| sqlx::query(
        "UPDATE confirmations SET answer = $2 WHERE hash = $1"
    )
    .bind(hash_secret(confirmation.as_str()))
    .bind(answer.get())
    .execute(pool)
    .await
    .map(drop));
    if let Err(e) = written {
        tracing::warn!(error = %e, "could not record a confirmed call's answer");
    }
}

/// Gives a confirmation back after its call failed before doing anything (a refused
/// pre-flight, an unreachable provider), so the caller can send it again.
pub async fn release(store: &Store, confirmation: &Confirmation) {
    let written = on_pool!(store, |pool| sqlx::query(
        "UPDATE confirmations SET used_at = NULL WHERE hash = $1 AND answer IS NULL"
    )
    .bind(hash_secret(confirmation.as_str()))
    .execute(pool)
    .await
    .map(drop));
    if let Err(e) = written {
        tracing::warn!(error = %e, "could not release a confirmation");
    }
}
