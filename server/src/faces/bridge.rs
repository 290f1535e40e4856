//! `hypd mcp`: MCP over stdio for agents that launch their tools as processes. It relays
//! each JSON-RPC message from stdin to a running hypd's `/mcp` endpoint and writes the
//! answers to stdout, so there is one engine and one store whichever transport an agent
//! uses. Requests run concurrently: a long `wait_operation` does not hold up the rest.

use std::sync::Arc;

use reqwest::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, HeaderValue};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::{Mutex, mpsc};

const PROTOCOL_HEADER: &str = "mcp-protocol-version";
const SESSION_HEADER: &str = "mcp-session-id";

/// What later requests must repeat from earlier answers.
#[derive(Default)]
struct Negotiated {
    protocol: Option<String>,
    session: Option<String>,
}

pub struct Bridge {
    http: reqwest::Client,
    endpoint: String,
    token: String,
    negotiated: Mutex<Negotiated>,
}

#[derive(Debug, thiserror::Error)]
pub enum BridgeError {
    #[error("cannot build the HTTP client: {0}")]
    Client(#[from] reqwest::Error),
    #[error("stdio: {0}")]
    Io(#[from] std::io::Error),
}

impl Bridge {
    pub fn new(base_url: &str, token: String) -> Result<Self, BridgeError> {
        let http = reqwest::Client::builder().build()?;
        Ok(Self {
            http,
            endpoint: format!("{}/mcp", base_url.trim_end_matches('/')),
            token,
            negotiated: Mutex::new(Negotiated::default()),
        })
    }

    /// Relays until stdin closes, then waits for answers still in flight.
    pub async fn run(self: Arc<Self>) -> Result<(), BridgeError> {
        let (tx, mut rx) = mpsc::unbounded_channel::<String>();
        let writer = tokio::spawn(async move {
            let mut stdout = tokio::io::stdout();
            while let Some(line) = rx.recv().await {
                if stdout.write_all(line.as_bytes()).await.is_err()
                    || stdout.write_all(b"\n").await.is_err()
                {
                    break;
                }
                let _ = stdout.flush().await;
            }
        });
        let mut lines = BufReader::new(tokio::io::stdin()).lines();
        let mut in_flight = tokio::task::JoinSet::new();
        while let Some(line) = lines.next_line().await? {
            if line.trim().is_empty() {
                continue;
            }
            let message: Value = match serde_json::from_str(&line) {
                Ok(v) => v,
                Err(e) => {
                    let _ = tx.send(
                        rpc_error(&Value::Null, -32700, &format!("parse error: {e}")).to_string(),
                    );
                    continue;
                }
            };
            let is_initialize = message.get("method").and_then(Value::as_str) == Some("initialize");
            let bridge = self.clone();
            let tx = tx.clone();
            let relay = async move {
                for answer in bridge.relay(&message).await {
                    let _ = tx.send(answer.to_string());
                }
            };
            // The handshake's answer sets the protocol version later requests must name.
            if is_initialize {
                relay.await;
            } else {
                in_flight.spawn(relay);
            }
        }
        while in_flight.join_next().await.is_some() {}
        drop(tx);
        let _ = writer.await;
        Ok(())
    }

    /// Sends one message and returns the messages to write back.
    async fn relay(&self, message: &Value) -> Vec<Value> {
        let id = message.get("id").cloned();
        let mut request = self
            .http
            .post(&self.endpoint)
            .header(CONTENT_TYPE, "application/json")
            .header(ACCEPT, "application/json, text/event-stream")
            .json(message);
        if let Ok(v) = HeaderValue::from_str(&format!("Bearer {}", self.token)) {
            request = request.header(AUTHORIZATION, v);
        }
        {
            let n = self.negotiated.lock().await;
            if let Some(p) = &n.protocol {
                request = request.header(PROTOCOL_HEADER, p);
            }
            if let Some(s) = &n.session {
                request = request.header(SESSION_HEADER, s);
            }
        }
        let response = match request.send().await {
            Ok(r) => r,
            Err(e) => {
                return answer_error(
                    id,
                    -32603,
                    &format!("cannot reach hypd at {}: {e}", self.endpoint),
                );
            }
        };
        if let Some(session) = response
            .headers()
            .get(SESSION_HEADER)
            .and_then(|v| v.to_str().ok())
        {
            self.negotiated.lock().await.session = Some(session.to_owned());
        }
        let status = response.status();
        let is_sse = response
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        let body = match response.text().await {
            Ok(b) => b,
            Err(e) => {
                return answer_error(id, -32603, &format!("reading hypd's answer failed: {e}"));
            }
        };
        if status == reqwest::StatusCode::ACCEPTED
            || (status.is_success() && body.trim().is_empty())
        {
            return Vec::new();
        }
        let answers: Vec<Value> = if is_sse {
            sse_data(&body)
                .filter_map(|d| serde_json::from_str(d).ok())
                .collect()
        } else {
            match serde_json::from_str::<Value>(&body) {
                Ok(Value::Array(batch)) => batch,
                Ok(v) if v.get("jsonrpc").is_some() => vec![v],
                // An HTTP-level refusal (401/403) carries hypd's error body.
                Ok(v) => {
                    let msg = v["error"]["message"]
                        .as_str()
                        .unwrap_or("request refused")
                        .to_owned();
                    return answer_error(id, -32001, &format!("hypd answered {status}: {msg}"));
                }
                Err(_) => {
                    return answer_error(id, -32603, &format!("hypd answered {status}: {body}"));
                }
            }
        };
        for a in &answers {
            if let Some(v) = a.pointer("/result/protocolVersion").and_then(Value::as_str) {
                self.negotiated.lock().await.protocol = Some(v.to_owned());
            }
        }
        answers
    }
}

/// The `data:` payloads of an event stream, one per event.
fn sse_data(body: &str) -> impl Iterator<Item = &str> {
    body.split("\n\n").filter_map(|event| {
        let data: Vec<&str> = event
            .lines()
            .filter_map(|l| l.strip_prefix("data:").map(str::trim_start))
            .collect();
        (!data.is_empty()).then(|| data.into_iter().next().unwrap_or_default())
    })
}

fn rpc_error(id: &Value, code: i64, message: &str) -> Value {
    json!({ "jsonrpc": "2.0", "id": id, "error": { "code": code, "message": message } })
}

/// Requests get an error answer; notifications (no id) get none.
fn answer_error(id: Option<Value>, code: i64, message: &str) -> Vec<Value> {
    id.map(|id| vec![rpc_error(&id, code, message)])
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_event_streams() {
        let body = "event: message\ndata: {\"a\":1}\n\n: keep-alive\n\ndata: {\"b\":2}\n\n";
        let got: Vec<&str> = sse_data(body).collect();
        assert_eq!(got, vec!["{\"a\":1}", "{\"b\":2}"]);
    }

    #[test]
    fn notifications_get_no_error_answer() {
        assert!(answer_error(None, -32603, "x").is_empty());
        let a = answer_error(Some(json!(7)), -32603, "x");
        assert_eq!(a[0]["id"], 7);
        assert_eq!(a[0]["error"]["code"], -32603);
    }
}
