//! A training pod's log, live: the WebSocket at
//! `/api/v1/clusters/{name}/training-jobs/{job}/logs/stream`. Every viewer of a container
//! shares one upstream stream (`training::logs`); this face only authenticates (as every
//! request, and again while the socket is open), picks where the viewer starts, and
//! writes batches of lines as frames. A viewer that falls a whole channel behind is told
//! how many lines it missed and closed: it reconnects with `after`, the last line it saw.
//!
//! Frames: `{"type":"hello","pod","container","missed"}`, `{"type":"lines","lines":
//! [{"seq","at","text"}…]}`, `{"type":"missed","lines":n,"after":seq}`, `{"type":"end",
//! "reason"}`.

use std::time::{Duration, SystemTime};

use app::api::ApiError;
use app::api::error::FieldError;
use app::api::values::{EksClusterName, JobName, PodName};
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, Method};
use axum::response::{IntoResponse, Response};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use serde::Deserialize;
use serde_json::json;
use tokio::sync::broadcast::error::RecvError;

use crate::auth::{Actor, Face};
use crate::faces::errors::error_response;
use crate::faces::state::AppState;
use crate::training::logs::{self, Event, From, LogHub, StreamKey};

/// Lines per frame at most.
const BATCH: usize = 1000;
/// A frame the viewer has not taken in this long: it is cut off.
const SEND_TIMEOUT: Duration = Duration::from_secs(30);
/// How often the credential is checked again.
const RECHECK: Duration = Duration::from_secs(5);
/// Close code for "too slow: lines were missed" (4000-4999 are the application's).
const CLOSE_MISSED: u16 = 4409;
const CLOSE_UNAUTHORIZED: u16 = 4401;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogQuery {
    pod: Option<String>,
    container: Option<String>,
    tail_lines: Option<String>,
    since_seconds: Option<String>,
    after: Option<String>,
    follow: Option<String>,
}

/// Where the viewer starts and whether it follows, from the query; field errors for
/// values that are not numbers in range.
fn start(q: &LogQuery) -> Result<(From, bool), ApiError> {
    let number = |field: &str, v: &Option<String>, max: u64| -> Result<Option<u64>, FieldError> {
        v.as_deref()
            .map(|s| {
                s.parse::<u64>().ok().filter(|n| *n <= max).ok_or_else(|| {
                    FieldError::new(
                        field,
                        format!("{field} is a whole number up to {max} (got {s:?})"),
                    )
                })
            })
            .transpose()
    };
    let mut errors = Vec::new();
    let mut take = |r: Result<Option<u64>, FieldError>| match r {
        Ok(v) => v,
        Err(e) => {
            errors.push(e);
            None
        }
    };
    let tail = take(number("tail_lines", &q.tail_lines, logs::RING as u64));
    let since = take(number("since_seconds", &q.since_seconds, 604_800));
    let after = take(number("after", &q.after, u64::MAX));
    let follow = match q.follow.as_deref() {
        None | Some("true") => true,
        Some("false") => false,
        Some(other) => {
            errors.push(FieldError::new(
                "follow",
                format!("follow is true or false (got {other:?})"),
            ));
            true
        }
    };
    if !errors.is_empty() {
        return Err(ApiError::Validation { errors });
    }
    let from = match (after, since, tail) {
        (Some(a), _, _) => From::After(a),
        (None, Some(s), _) => From::Since(s),
        (None, None, t) => From::Tail(t.unwrap_or(100)),
    };
    Ok((from, follow))
}

fn parsed<T>(field: &str, v: Result<T, String>) -> Result<T, ApiError> {
    v.map_err(|m| ApiError::field(field, m))
}

pub async fn stream(
    State(state): State<AppState>,
    Path((name, job)): Path<(String, String)>,
    Query(q): Query<LogQuery>,
    method: Method,
    headers: HeaderMap,
    upgrade: WebSocketUpgrade,
) -> Response {
    let actor = match state
        .service
        .auth
        .authenticate(&headers, &method, Face::Console)
        .await
    {
        Ok(a) => a,
        Err(e) => return error_response(&e),
    };
    let opened = async {
        let cluster = parsed("name", EksClusterName::parse(&name))?;
        let job = parsed("job", JobName::parse(&job))?;
        let pod = q
            .pod
            .as_deref()
            .map(|p| parsed("pod", PodName::parse(p)))
            .transpose()?;
        let container = q
            .container
            .as_deref()
            .map(|c| parsed("container", PodName::parse(c)))
            .transpose()?;
        let (from, follow) = start(&q)?;
        let at = crate::training::job_pod(
            &state.service,
            cluster.as_str(),
            job.as_str(),
            pod.as_ref().map(|p| p.as_str()),
            container.as_ref().map(|c| c.as_str()),
        )
        .await?;
        let key = StreamKey {
            cluster: cluster.to_string(),
            namespace: app::api::training::NAMESPACE.to_owned(),
            pod: at.pod.clone(),
            container: at.container.clone(),
        };
        let pods = Api::<Pod>::namespaced(at.client, app::api::training::NAMESPACE);
        Ok::<_, ApiError>((
            state.service.logs.stream(key.clone(), pods),
            key,
            from,
            follow,
        ))
    };
    let (stream, key, from, follow) = match opened.await {
        Ok(x) => x,
        Err(e) => return error_response(&e),
    };
    upgrade
        .on_upgrade(move |socket| async move {
            let viewer = Viewer {
                state,
                actor,
                method,
                headers,
            };
            viewer.serve(socket, stream, key, from, follow).await;
        })
        .into_response()
}

struct Viewer {
    state: AppState,
    actor: Actor,
    method: Method,
    headers: HeaderMap,
}

/// Sends `text`, unless the viewer has not taken the last frames for [`SEND_TIMEOUT`].
async fn send(socket: &mut WebSocket, text: String) -> bool {
    matches!(
        tokio::time::timeout(SEND_TIMEOUT, socket.send(Message::Text(text.into()))).await,
        Ok(Ok(()))
    )
}

async fn close(socket: &mut WebSocket, code: u16, reason: &str) {
    let frame = CloseFrame {
        code,
        reason: reason.to_owned().into(),
    };
    let _ = tokio::time::timeout(SEND_TIMEOUT, socket.send(Message::Close(Some(frame)))).await;
}

impl Viewer {
    async fn serve(
        self,
        mut socket: WebSocket,
        stream: std::sync::Arc<logs::Stream>,
        key: StreamKey,
        from: From,
        follow: bool,
    ) {
        tracing::debug!(actor = %self.actor.name, pod = %key.pod, "log viewer connected");
        let mut joined = stream.join(from, SystemTime::now());
        let hello = json!({ "type": "hello", "pod": key.pod, "container": key.container,
                            "missed": joined.missed });
        if !send(&mut socket, hello.to_string()).await {
            return LogHub::linger(stream);
        }
        let backlog = std::mem::take(&mut joined.backlog);
        let mut last = None;
        for chunk in backlog.chunks(BATCH) {
            last = logs::last_seq(chunk).or(last);
            for frame in logs::frames(chunk) {
                if !send(&mut socket, frame).await {
                    return LogHub::linger(stream);
                }
            }
            if chunk.iter().any(|e| matches!(e, Event::End(_))) {
                close(&mut socket, 1000, "the container ended").await;
                return LogHub::linger(stream);
            }
        }
        if !follow {
            close(&mut socket, 1000, "the lines asked for were sent").await;
            return LogHub::linger(stream);
        }
        let mut recheck = tokio::time::interval(RECHECK);
        recheck.tick().await;
        loop {
            tokio::select! {
                incoming = socket.recv() => match incoming {
                    Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break,
                    Some(Ok(_)) => {}
                },
                _ = recheck.tick() => {
                    if self.state.service.auth.revoked(&self.headers, &self.method, Face::Console).await {
                        close(&mut socket, CLOSE_UNAUTHORIZED, "the token was revoked or the session ended: sign in again").await;
                        break;
                    }
                }
                event = joined.live.recv() => {
                    let mut batch = match event {
                        Ok(e) => vec![e],
                        Err(RecvError::Lagged(n)) => {
                            self.missed(&mut socket, n, last).await;
                            break;
                        }
                        Err(RecvError::Closed) => break,
                    };
                    if let Err(n) = logs::drain(&mut joined.live, &mut batch, BATCH) {
                        self.missed(&mut socket, n, last).await;
                        break;
                    }
                    last = logs::last_seq(&batch).or(last);
                    let ended = batch.iter().any(|e| matches!(e, Event::End(_)));
                    let mut sent = true;
                    for frame in logs::frames(&batch) {
                        sent = sent && send(&mut socket, frame).await;
                    }
                    if !sent {
                        break;
                    }
                    if ended {
                        close(&mut socket, 1000, "the container ended").await;
                        break;
                    }
                }
            }
        }
        LogHub::linger(stream);
    }

    /// Tells the viewer it fell `n` lines behind after line `last`, and closes.
    async fn missed(&self, socket: &mut WebSocket, n: u64, last: Option<u64>) {
        tracing::info!(actor = %self.actor.name, missed = n, "log viewer too slow: cut off");
        let notice = json!({ "type": "missed", "lines": n, "after": last });
        if send(socket, notice.to_string()).await {
            close(
                socket,
                CLOSE_MISSED,
                "too slow: lines were missed; reconnect with after",
            )
            .await;
        }
    }
}
