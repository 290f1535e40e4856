//! The audit trail: every mutation, whichever face it came through, with who asked, the
//! request (secrets redacted) and what came of it. Writing it never fails the command:
//! a lost audit row is logged loudly instead.

use app::api::ApiError;
use serde_json::Value;

use crate::auth::Actor;
use crate::clock;
use crate::store::{Store, on_pool};

/// Keys whose values never enter the audit log.
const SECRET_KEYS: &[&str] = &[
    "token",
    "secret",
    "password",
    "secret_access_key",
    "session_token",
];

pub fn redact(v: &Value) -> Value {
    match v {
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| {
                    let v = if SECRET_KEYS.contains(&k.as_str()) {
                        Value::String("<redacted>".into())
                    } else {
                        redact(v)
                    };
                    (k.clone(), v)
                })
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(redact).collect()),
        other => other.clone(),
    }
}

pub async fn record<T>(
    store: &Store,
    actor: &Actor,
    command: &str,
    request: &Value,
    result: &Result<T, ApiError>,
) {
    let (outcome, detail) = match result {
        Ok(_) => ("ok".to_owned(), None),
        Err(e) => {
            let kind = serde_json::to_value(e)
                .ok()
                .and_then(|v| v["kind"].as_str().map(str::to_owned));
            (kind.unwrap_or_else(|| "error".into()), Some(e.to_string()))
        }
    };
    let id = clock::sortable_id("audit");
    let request = redact(request).to_string();
    let written = on_pool!(store, |pool| {
        sqlx::query(
        "INSERT INTO audit_log (id, at, actor, face, command, request, outcome, detail) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)"
    )
    .bind(&id)
    .bind(clock::now())
    .bind(&actor.name)
    .bind(actor.face.as_str())
    .bind(command)
    .bind(&request)
    .bind(&outcome)
    .bind(&detail)
    .execute(pool)
    .await
    .map(drop)
    });
    match written {
        Ok(()) => {
            tracing::info!(actor = %actor.name, face = actor.face.as_str(), command, outcome, "audit")
        }
        Err(e) => {
            tracing::error!(error = %e, actor = %actor.name, command, outcome, "audit record could not be written")
        }
    }
}

/// The newest audit records (for tests and the console).
pub async fn recent(
    store: &Store,
    limit: i64,
) -> Result<Vec<(String, String, String, String, String)>, sqlx::Error> {
    on_pool!(store, |pool| {
        sqlx::query_as(
        "SELECT actor, face, command, request, outcome FROM audit_log ORDER BY at DESC, id DESC LIMIT $1"
    )
    .bind(limit)
    .fetch_all(pool)
    .await
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_redacted_at_any_depth() {
        let v = serde_json::json!({"name": "ci", "token": "hypd_x", "nested": [{"password": "p"}]});
        let r = redact(&v);
        assert_eq!(r["name"], "ci");
        assert_eq!(r["token"], "<redacted>");
        assert_eq!(r["nested"][0]["password"], "<redacted>");
    }
}
