//! The live channel: a WebSocket at `/api/v1/events` that pushes every operation change
//! as it is stored, for the console's progress panel and for agents that prefer pushing
//! to polling. Changes come from the one operation feed (`operation::feed`), which reads
//! the store for every follower at once. The caller's token or session is checked again
//! every 2 s (auth's cache), so a revoked token or an ended session stops the stream as
//! soon as any other request of its would be refused.

use std::time::Duration;

use axum::extract::State;
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::http::{HeaderMap, Method};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::auth::{Actor, Face};
use crate::faces::errors::error_response;
use crate::faces::state::AppState;
use tokio::sync::broadcast::error::RecvError;

/// How often the caller's credential is checked again (auth caches it this long).
const RECHECK: Duration = Duration::from_secs(2);

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
    // Follow before saying hello: nothing stored after the hello is missed.
    let mut changes = state.service.changes.follow();
    let hello = json!({ "type": "hello", "subscriber": actor.name, "role": actor.role });
    if socket
        .send(Message::Text(hello.to_string().into()))
        .await
        .is_err()
    {
        return;
    }
    let mut recheck = tokio::time::interval(RECHECK);
    loop {
        // What to send, once the credential is checked again: on the timer (nothing to
        // send), and before every event, so no change reaches a revoked token.
        let event = tokio::select! {
            incoming = socket.recv() => match incoming {
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break,
                Some(Ok(_)) => continue,
            },
            _ = recheck.tick() => None,
            change = changes.recv() => match change {
                Ok(op) => Some(json!({ "type": "operation", "operation": op })),
                // A console that cannot keep up is told to read again rather than be
                // shown a panel with gaps.
                Err(RecvError::Lagged(missed)) => Some(json!({ "type": "lagged", "missed": missed })),
                Err(RecvError::Closed) => return,
            },
        };
        if state
            .service
            .auth
            .revoked(&credential.headers, &credential.method, Face::Console)
            .await
        {
            tracing::info!(actor = %actor.name, "events: credential no longer valid, closing");
            let close = CloseFrame {
                code: CLOSE_UNAUTHORIZED,
                reason: "the token was revoked or the session ended: sign in again".into(),
            };
            let _ = socket.send(Message::Close(Some(close))).await;
            return;
        }
        if let Some(event) = event
            && socket
                .send(Message::Text(event.to_string().into()))
                .await
                .is_err()
        {
            return;
        }
    }
    tracing::debug!(actor = %actor.name, "events subscriber left");
}
