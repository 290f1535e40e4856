//! The live channel: a WebSocket at `/api/v1/events` that pushes every operation change
//! as it is stored, for the console's progress panel and for agents that prefer pushing
//! to polling. Changes are read from the store (not from an in-process bus), so a client
//! connected to any replica sees what every replica did. The caller's token or session
//! is checked again on every poll (through auth's 2 s cache), so a revoked token or an
//! ended session stops the stream as soon as any other request of its would be refused.

use std::time::Duration;

use app::api::ApiError;
use axum::extract::State;
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::http::{HeaderMap, Method};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::auth::{Actor, Face};
use crate::faces::errors::error_response;
use crate::faces::state::AppState;
use crate::operation;

/// How often the store is asked for changes.
const POLL: Duration = Duration::from_millis(250);

pub async fn subscribe(
    State(state): State<AppState>,
    method: Method,
    headers: HeaderMap,
    upgrade: WebSocketUpgrade,
) -> Response {
    // A browser's upgrade carries the session cookie: authenticate() insists on our Origin.
    let actor = match state
        .service
        .auth
        .authenticate(&headers, &method, Face::Console)
        .await
    {
        Ok(a) => a,
        Err(e) => return error_response(&e),
    };
    upgrade
        .on_upgrade(move |socket| stream(state, actor, Credential { method, headers }, socket))
        .into_response()
}

/// What the upgrade authenticated with, to check again while the socket is open.
struct Credential {
    method: Method,
    headers: HeaderMap,
}

/// Close code for "the credential no longer holds" (4000-4999 are the application's;
/// 4401 reads as HTTP's 401).
const CLOSE_UNAUTHORIZED: u16 = 4401;

async fn stream(state: AppState, actor: Actor, credential: Credential, mut socket: WebSocket) {
    tracing::debug!(actor = %actor.name, "events subscriber connected");
    let hello = json!({ "type": "hello", "subscriber": actor.name, "role": actor.role });
    if socket
        .send(Message::Text(hello.to_string().into()))
        .await
        .is_err()
    {
        return;
    }
    // Start from now: the console reads current state through get/list, then follows.
    let mut cursor = crate::clock::now();
    // Several changes can share a millisecond: remember which were sent at the cursor.
    let mut sent_at_cursor: Vec<String> = Vec::new();
    let mut ticker = tokio::time::interval(POLL);
    loop {
        tokio::select! {
            incoming = socket.recv() => match incoming {
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break,
                Some(Ok(_)) => {}
            },
            _ = ticker.tick() => {
                if let Err(e) = state
                    .service
                    .auth
                    .authenticate(&credential.headers, &credential.method, Face::Console)
                    .await
                {
                    // A store that cannot answer is not a revocation: only a refusal ends
                    // the stream.
                    if matches!(e, ApiError::Unauthorized { .. } | ApiError::Forbidden { .. }) {
                        tracing::info!(actor = %actor.name, "events: credential no longer valid, closing");
                        let close = CloseFrame {
                            code: CLOSE_UNAUTHORIZED,
                            reason: "the token was revoked or the session ended: sign in again".into(),
                        };
                        let _ = socket.send(Message::Close(Some(close))).await;
                        return;
                    }
                    continue;
                }
                let changes = match operation::changed_since(&state.store, &cursor).await {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::warn!(error = %e, "events: cannot read operation changes");
                        continue;
                    }
                };
                for op in changes {
                    if op.updated_at == cursor && sent_at_cursor.contains(&op.operation_id) {
                        continue;
                    }
                    if op.updated_at > cursor {
                        cursor = op.updated_at.clone();
                        sent_at_cursor.clear();
                    }
                    sent_at_cursor.push(op.operation_id.clone());
                    let event = json!({ "type": "operation", "operation": op });
                    if socket.send(Message::Text(event.to_string().into())).await.is_err() {
                        return;
                    }
                }
            }
        }
    }
    tracing::debug!(actor = %actor.name, "events subscriber left");
}
