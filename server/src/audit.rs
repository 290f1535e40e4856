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
    // Single use and bound to its caller, but still what runs a destructive command.
    "confirmation",
];

/// Longest string value kept whole in an audited request. Names, ARNs and CIDRs are far
/// shorter; anything longer is not worth a reviewer's screen and may be an attempt to
/// fill the store.
const AUDIT_STRING_CHARS: usize = 256;
/// Most bytes of request JSON an audit row keeps. Any role may send refused requests,
/// and each is audited: the row's size must not be the caller's choice.
pub const AUDIT_REQUEST_BYTES: usize = 8 * 1024;
/// Most bytes of an error's text an audit row keeps.
const AUDIT_DETAIL_BYTES: usize = 1024;

/// `s` cut at a character boundary to at most `max` bytes, with a marker saying how much
/// there was.
fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut at = max;
    while !s.is_char_boundary(at) {
        at -= 1;
    }
    format!("{}…[truncated: {} bytes in all]", &s[..at], s.len())
}

/// Long strings cut, then the whole text cut: what the audit log stores of a request.
pub fn audited_request(request: &Value) -> String {
    fn shorten(v: &Value) -> Value {
        match v {
            Value::String(s) => match s.char_indices().nth(AUDIT_STRING_CHARS) {
                Some((at, _)) => Value::String(format!(
                    "{}…[truncated: {} bytes in all]",
                    &s[..at],
                    s.len()
                )),
                None => v.clone(),
            },
            Value::Array(items) => Value::Array(items.iter().map(shorten).collect()),
            Value::Object(map) => Value::Object(
                map.iter()
                    .map(|(k, v)| {
                        let k = match k.char_indices().nth(AUDIT_STRING_CHARS) {
                            Some((at, _)) => format!("{}…", &k[..at]),
                            None => k.clone(),
                        };
                        (k, shorten(v))
                    })
                    .collect(),
            ),
            other => other.clone(),
        }
    }
    truncate(&shorten(&redact(request)).to_string(), AUDIT_REQUEST_BYTES)
}

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
            (
                kind.unwrap_or_else(|| "error".into()),
                Some(truncate(&e.to_string(), AUDIT_DETAIL_BYTES)),
            )
        }
    };
    let id = clock::sortable_id("audit");
    let request = audited_request(request);
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
        let v = serde_json::json!({"name": "ci", "token": "hypd_x", "nested": [{"password": "p"}],
            "confirmation": "hypd_confirm_0"});
        let r = redact(&v);
        assert_eq!(r["name"], "ci");
        assert_eq!(r["token"], "<redacted>");
        assert_eq!(r["confirmation"], "<redacted>");
        assert_eq!(r["nested"][0]["password"], "<redacted>");
    }

    #[test]
    fn large_requests_are_stored_cut_and_marked() {
        let big = "x".repeat(1_500_000);
        let stored = audited_request(&serde_json::json!({"name": big, "role": "admin"}));
        assert!(stored.len() < 1024, "{} bytes", stored.len());
        let v: Value = serde_json::from_str(&stored).unwrap();
        assert!(
            v["name"]
                .as_str()
                .unwrap()
                .ends_with("…[truncated: 1500000 bytes in all]")
        );
        assert_eq!(v["role"], "admin");
        let many: Vec<String> = (0..10_000).map(|i| format!("item-{i}")).collect();
        let stored = audited_request(&serde_json::json!({ "items": many }));
        assert!(stored.len() <= AUDIT_REQUEST_BYTES + 64);
        assert!(
            stored.ends_with(" bytes in all]"),
            "{}",
            &stored[stored.len() - 60..]
        );
        let small = serde_json::json!({"name": "ml-1"});
        assert_eq!(audited_request(&small), small.to_string());
    }
}
