//! `hypd mcp`: MCP over stdio for agents that launch their tools as processes. It relays
//! each JSON-RPC message from stdin to a running hypd's `/mcp` endpoint and writes what
//! comes back to stdout, so there is one engine and one store whichever transport an agent
//! uses. Requests run concurrently: a long `wait_operation` does not hold up the rest.
//! Answers that come as an event stream are relayed event by event, so progress reaches
//! the agent while the operation runs; once `initialize` opens a session, one standalone
//! `GET /mcp` stream carries the server's own notifications (resource updates, log
//! messages) and is reopened when it drops; when stdin closes the session is ended with a
//! `DELETE`. reqwest is built without its `stream` feature here, hence the hand-made
//! incremental event-stream parser fed by `Response::chunk`.

use std::sync::Arc;
use std::time::Duration;

use reqwest::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, HeaderValue};
use reqwest::{RequestBuilder, Response, StatusCode};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::{Mutex, mpsc};

const PROTOCOL_HEADER: &str = "mcp-protocol-version";
const SESSION_HEADER: &str = "mcp-session-id";
const LAST_EVENT_HEADER: &str = "last-event-id";
const EVENT_STREAM: &str = "text/event-stream";
/// How long the notification stream waits before it is reopened.
const REOPEN_AFTER: Duration = Duration::from_secs(1);
/// Ending the session must not keep a finished agent waiting on an unresponsive hypd.
const DELETE_TIMEOUT: Duration = Duration::from_secs(5);

/// What later requests must repeat from earlier answers.
#[derive(Default)]
struct Negotiated {
    protocol: Option<String>,
    session: Option<String>,
}

type Out = mpsc::UnboundedSender<String>;

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

    /// Relays until stdin closes, then waits for answers still in flight and ends the
    /// session.
    pub async fn run(self: Arc<Self>) -> Result<(), BridgeError> {
        self.relay_stdio(tokio::io::stdin(), tokio::io::stdout())
            .await
    }

    async fn relay_stdio<R, W>(self: Arc<Self>, input: R, mut output: W) -> Result<(), BridgeError>
    where
        R: AsyncRead + Unpin,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let (tx, mut rx) = mpsc::unbounded_channel::<String>();
        // One writer keeps messages from concurrent relays whole, one per line.
        let writer = tokio::spawn(async move {
            while let Some(line) = rx.recv().await {
                if output.write_all(line.as_bytes()).await.is_err()
                    || output.write_all(b"\n").await.is_err()
                {
                    break;
                }
                let _ = output.flush().await;
            }
        });
        let mut lines = BufReader::new(input).lines();
        let mut in_flight = tokio::task::JoinSet::new();
        let mut listener = None;
        while let Some(line) = lines.next_line().await? {
            if line.trim().is_empty() {
                continue;
            }
            let message: Value = match serde_json::from_str(&line) {
                Ok(v) => v,
                Err(e) => {
                    send(
                        &tx,
                        &rpc_error(&Value::Null, -32700, &format!("parse error: {e}")),
                    );
                    continue;
                }
            };
            let is_initialize = message.get("method").and_then(Value::as_str) == Some("initialize");
            let bridge = self.clone();
            let out = tx.clone();
            let relay = async move { bridge.relay(&message, &out).await };
            // The handshake's answer sets what later requests must name (protocol version,
            // session), and the session is what the notification stream follows.
            if is_initialize {
                relay.await;
                if listener.is_none() && self.negotiated.lock().await.session.is_some() {
                    listener = Some(tokio::spawn(self.clone().listen(tx.clone())));
                }
            } else {
                in_flight.spawn(relay);
            }
        }
        while in_flight.join_next().await.is_some() {}
        if let Some(listener) = listener {
            listener.abort();
            let _ = listener.await;
        }
        self.end_session().await;
        drop(tx);
        let _ = writer.await;
        Ok(())
    }

    /// A request to `/mcp` with the token and what the handshake negotiated.
    async fn request(&self, method: reqwest::Method) -> RequestBuilder {
        let mut request = self.http.request(method, &self.endpoint);
        if let Ok(v) = HeaderValue::from_str(&format!("Bearer {}", self.token)) {
            request = request.header(AUTHORIZATION, v);
        }
        let n = self.negotiated.lock().await;
        if let Some(p) = &n.protocol {
            request = request.header(PROTOCOL_HEADER, p);
        }
        if let Some(s) = &n.session {
            request = request.header(SESSION_HEADER, s);
        }
        request
    }

    /// Sends one message and writes what comes back to `out` as it arrives.
    async fn relay(&self, message: &Value, out: &Out) {
        // Only a request is owed an answer: a failed notification or a failed answer to
        // one of the server's own requests must not produce a stray response.
        let id = message
            .get("method")
            .and(message.get("id"))
            .filter(|id| !id.is_null())
            .cloned();
        let request = self
            .request(reqwest::Method::POST)
            .await
            .header(CONTENT_TYPE, "application/json")
            .header(ACCEPT, "application/json, text/event-stream")
            .json(message);
        let response = match request.send().await {
            Ok(r) => r,
            Err(e) => {
                let msg = format!("cannot reach hypd at {}: {e}", self.endpoint);
                return answer_error(out, id, -32603, &msg);
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
        if status == StatusCode::ACCEPTED {
            return;
        }
        if status.is_success() && is_event_stream(&response) {
            return self.relay_stream(response, id, out).await;
        }
        let body = match response.text().await {
            Ok(b) => b,
            Err(e) => {
                let msg = format!("reading hypd's answer failed: {e}");
                return answer_error(out, id, -32603, &msg);
            }
        };
        if status.is_success() && body.trim().is_empty() {
            return;
        }
        match serde_json::from_str::<Value>(&body) {
            Ok(Value::Array(batch)) => {
                for answer in batch {
                    self.deliver(answer, out).await;
                }
            }
            Ok(v) if v.get("jsonrpc").is_some() => self.deliver(v, out).await,
            // An HTTP-level refusal (401/403) carries hypd's error body.
            Ok(v) => {
                let msg = v["error"]["message"].as_str().unwrap_or("request refused");
                answer_error(out, id, -32001, &format!("hypd answered {status}: {msg}"));
            }
            Err(_) => answer_error(out, id, -32603, &format!("hypd answered {status}: {body}")),
        }
    }

    /// Writes each message of an event-stream answer as soon as its event is complete;
    /// a stream that ends before the request's own answer still gets the agent one.
    async fn relay_stream(&self, mut response: Response, id: Option<Value>, out: &Out) {
        let mut parser = SseParser::default();
        let mut answered = false;
        loop {
            match response.chunk().await {
                Ok(Some(chunk)) => {
                    for data in parser.feed(&chunk) {
                        for message in messages(&data) {
                            answered |= id.as_ref().is_some_and(|id| is_answer_to(&message, id));
                            self.deliver(message, out).await;
                        }
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    if !answered {
                        let msg = format!("reading hypd's answer failed: {e}");
                        answer_error(out, id, -32603, &msg);
                    }
                    return;
                }
            }
        }
        if !answered {
            answer_error(
                out,
                id,
                -32603,
                "hypd's answer stream ended before the result",
            );
        }
    }

    /// Writes one message to stdout, noting the protocol version a handshake settles on.
    async fn deliver(&self, message: Value, out: &Out) {
        if let Some(v) = message
            .pointer("/result/protocolVersion")
            .and_then(Value::as_str)
        {
            self.negotiated.lock().await.protocol = Some(v.to_owned());
        }
        send(out, &message);
    }

    /// Relays the session's standalone notification stream until aborted, reopening it
    /// where it left off when it drops; a server without one (405) is not asked again.
    async fn listen(self: Arc<Self>, out: Out) {
        let mut last_id: Option<String> = None;
        let mut stream_session: Option<String> = None;
        loop {
            // A new handshake means a new session: its events start afresh.
            let session = self.negotiated.lock().await.session.clone();
            if session != stream_session {
                last_id = None;
                stream_session = session;
            }
            let mut request = self
                .request(reqwest::Method::GET)
                .await
                .header(ACCEPT, EVENT_STREAM);
            if let Some(id) = &last_id {
                request = request.header(LAST_EVENT_HEADER, id);
            }
            match request.send().await {
                Ok(r) if r.status() == StatusCode::METHOD_NOT_ALLOWED => return,
                Ok(mut r) if r.status().is_success() && is_event_stream(&r) => {
                    let mut parser = SseParser::resuming(last_id.take());
                    let mut received = false;
                    while let Ok(Some(chunk)) = r.chunk().await {
                        received |= !chunk.is_empty();
                        for data in parser.feed(&chunk) {
                            for message in messages(&data) {
                                if out.send(message.to_string()).is_err() {
                                    return;
                                }
                            }
                        }
                    }
                    // hypd answers a resume it cannot honour (the event has left its
                    // cache) with an empty stream: asking again would loop, so start afresh.
                    if received {
                        last_id = parser.last_id;
                    }
                }
                // hypd restarting or briefly unreachable: try again shortly.
                _ => {}
            }
            tokio::time::sleep(REOPEN_AFTER).await;
        }
    }

    /// Tells hypd the session is over so it frees it now rather than when it expires.
    async fn end_session(&self) {
        if self.negotiated.lock().await.session.is_none() {
            return;
        }
        let request = self
            .request(reqwest::Method::DELETE)
            .await
            .timeout(DELETE_TIMEOUT);
        let _ = request.send().await;
    }
}

fn is_event_stream(response: &Response) -> bool {
    response
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with(EVENT_STREAM))
}

fn is_answer_to(message: &Value, id: &Value) -> bool {
    message.get("id") == Some(id)
        && message.get("method").is_none()
        && (message.get("result").is_some() || message.get("error").is_some())
}

/// The JSON-RPC messages of one event's data: one message, or a batch.
fn messages(data: &str) -> Vec<Value> {
    match serde_json::from_str(data) {
        Ok(Value::Array(batch)) => batch,
        Ok(v @ Value::Object(_)) => vec![v],
        _ => Vec::new(),
    }
}

/// A `text/event-stream` body read as it arrives: a chunk may end anywhere, inside an
/// event, a line, a CRLF pair or a UTF-8 character, so nothing is decoded before its line
/// is complete. Yields the data of each complete event; events whose data is blank (the
/// priming events that only carry `id:` and `retry:`) only move `last_id`.
#[derive(Default)]
struct SseParser {
    line: Vec<u8>,
    after_cr: bool,
    data: Option<String>,
    id: Option<String>,
    /// The id of the last complete event: where a reopened stream resumes.
    last_id: Option<String>,
}

impl SseParser {
    fn resuming(last_id: Option<String>) -> Self {
        Self {
            id: last_id.clone(),
            last_id,
            ..Self::default()
        }
    }

    fn feed(&mut self, chunk: &[u8]) -> Vec<String> {
        let mut events = Vec::new();
        for &b in chunk {
            if std::mem::take(&mut self.after_cr) && b == b'\n' {
                continue;
            }
            match b {
                b'\r' => {
                    self.after_cr = true;
                    self.end_line(&mut events);
                }
                b'\n' => self.end_line(&mut events),
                _ => self.line.push(b),
            }
        }
        events
    }

    fn end_line(&mut self, events: &mut Vec<String>) {
        let line = std::mem::take(&mut self.line);
        if line.is_empty() {
            self.last_id.clone_from(&self.id);
            if let Some(data) = self.data.take()
                && !data.trim().is_empty()
            {
                events.push(data);
            }
            return;
        }
        let line = String::from_utf8_lossy(&line);
        let (field, value) = match line.split_once(':') {
            Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
            None => (&*line, ""),
        };
        match field {
            "data" => match &mut self.data {
                Some(data) => {
                    data.push('\n');
                    data.push_str(value);
                }
                None => self.data = Some(value.to_owned()),
            },
            // The standard ignores an id with a NUL: it could not be sent back in a header.
            "id" if !value.contains('\0') => self.id = Some(value.to_owned()),
            // Comments (keep-alives), `event:` and `retry:` change nothing relayed.
            _ => {}
        }
    }
}

fn send(out: &Out, message: &Value) {
    let _ = out.send(message.to_string());
}

fn rpc_error(id: &Value, code: i64, message: &str) -> Value {
    json!({ "jsonrpc": "2.0", "id": id, "error": { "code": code, "message": message } })
}

/// Requests get an error answer; notifications (no id) get none.
fn answer_error(out: &Out, id: Option<Value>, code: i64, message: &str) {
    if let Some(id) = id {
        send(out, &rpc_error(&id, code, message));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_all(chunks: &[&[u8]]) -> (Vec<String>, Option<String>) {
        let mut parser = SseParser::default();
        let events = chunks.iter().flat_map(|c| parser.feed(c)).collect();
        (events, parser.last_id)
    }

    #[test]
    fn parses_event_streams() {
        let body = b"event: message\ndata: {\"a\":1}\n\n: keep-alive\n\ndata: {\"b\":2}\n\n";
        let (events, _) = parse_all(&[body]);
        assert_eq!(events, vec!["{\"a\":1}", "{\"b\":2}"]);
    }

    #[test]
    fn events_split_anywhere_across_chunks_parse_the_same() {
        let body = "id: 0\r\nretry: 3000\r\ndata: \r\n\r\nid: 1/7\r\ndata: {\"é\":\r\ndata: 1}\r\n\r\n\
                    : ping\n\ndata:{\"b\":2}\rid: 2/7\r\r";
        let whole = parse_all(&[body.as_bytes()]);
        assert_eq!(whole.0, vec!["{\"é\":\n1}", "{\"b\":2}"]);
        assert_eq!(whole.1.as_deref(), Some("2/7"));
        let bytes = body.as_bytes();
        for cut in 0..=bytes.len() {
            let (a, b) = bytes.split_at(cut);
            assert_eq!(parse_all(&[a, b]), whole, "cut at {cut}");
        }
        let one_by_one: Vec<&[u8]> = bytes.chunks(1).collect();
        assert_eq!(parse_all(&one_by_one), whole);
    }

    #[test]
    fn multi_line_data_is_one_message() {
        let (events, _) = parse_all(&[b"data: {\"jsonrpc\": \"2.0\",\ndata:  \"id\": 3}\n\n"]);
        assert_eq!(events, vec!["{\"jsonrpc\": \"2.0\",\n \"id\": 3}"]);
        assert_eq!(
            messages(&events[0]),
            vec![json!({"jsonrpc": "2.0", "id": 3})]
        );
    }

    #[test]
    fn priming_events_are_skipped_but_set_the_resume_point() {
        for priming in [
            &b"id: 0\nretry: 3000\ndata: \n\n"[..],
            b"id: 0\nretry: 3000\ndata\n\n",
        ] {
            let (events, last_id) = parse_all(&[priming]);
            assert!(events.is_empty());
            assert_eq!(last_id.as_deref(), Some("0"));
        }
        // An event cut off by a dropped connection is not where the stream resumes.
        let (events, last_id) = parse_all(&[b"id: 4\ndata: {}\n\nid: 5\ndata: {"]);
        assert_eq!(events, vec!["{}"]);
        assert_eq!(last_id.as_deref(), Some("4"));
        let mut resumed = SseParser::resuming(Some("4".into()));
        assert_eq!(resumed.feed(b"data: {}\n\n"), vec!["{}"]);
        assert_eq!(resumed.last_id.as_deref(), Some("4"));
    }

    #[test]
    fn only_requests_get_error_answers() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        answer_error(&tx, None, -32603, "x");
        answer_error(&tx, Some(json!(7)), -32603, "x");
        let a: Value = serde_json::from_str(&rx.try_recv().unwrap()).unwrap();
        assert_eq!(a["id"], 7);
        assert_eq!(a["error"]["code"], -32603);
        assert!(rx.try_recv().is_err());
        assert!(is_answer_to(&json!({"id": 7, "result": {}}), &json!(7)));
        assert!(!is_answer_to(
            &json!({"id": 7, "method": "ping"}),
            &json!(7)
        ));
    }

    /// A stand-in for hypd's `/mcp` with sessions, in the shapes rmcp answers in.
    mod fake {
        use std::convert::Infallible;
        use std::sync::Mutex;

        use axum::body::Body;
        use axum::extract::State;
        use axum::http::{HeaderMap, StatusCode};
        use axum::response::{IntoResponse, Response};
        use futures_util::StreamExt;
        use futures_util::stream::{self, BoxStream};
        use serde_json::{Value, json};
        use tokio::sync::Notify;

        pub const SESSION: &str = "s-1";
        pub const PROTOCOL: &str = "2025-06-18";

        #[derive(Default)]
        pub struct Fake {
            /// Answer GET with 405, as a server without a notification stream does.
            pub no_stream: bool,
            /// Lets the second half of the `tools/call` answer go.
            pub release: Notify,
            pub seen: Mutex<Seen>,
        }

        #[derive(Default, Debug)]
        pub struct Seen {
            /// Per GET: its session, Last-Event-ID, Authorization and protocol headers.
            pub gets: Vec<[Option<String>; 4]>,
            pub deletes: Vec<Option<String>>,
        }

        fn header(headers: &HeaderMap, name: &str) -> Option<String> {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        }

        fn sse(parts: Vec<BoxStream<'static, String>>) -> Response {
            let body = stream::iter(parts)
                .flatten()
                .map(Ok::<_, Infallible>)
                .boxed();
            (
                [("content-type", "text/event-stream")],
                Body::from_stream(body),
            )
                .into_response()
        }

        fn now(text: &str) -> BoxStream<'static, String> {
            stream::once(std::future::ready(text.to_owned())).boxed()
        }

        pub async fn post(
            State(fake): State<std::sync::Arc<Fake>>,
            headers: HeaderMap,
            body: String,
        ) -> Response {
            let message: Value = serde_json::from_str(&body).unwrap();
            let method = message["method"].as_str().unwrap_or_default();
            if method != "initialize"
                && (header(&headers, "mcp-session-id").as_deref() != Some(SESSION)
                    || header(&headers, "mcp-protocol-version").as_deref() != Some(PROTOCOL))
            {
                return (StatusCode::BAD_REQUEST, "Bad Request: no session").into_response();
            }
            let id = &message["id"];
            match method {
                "initialize" => (
                    [("mcp-session-id", SESSION)],
                    axum::Json(json!({"jsonrpc": "2.0", "id": id,
                        "result": {"protocolVersion": PROTOCOL, "capabilities": {}}})),
                )
                    .into_response(),
                "notifications/initialized" => StatusCode::ACCEPTED.into_response(),
                // Progress, then the result split mid-event; the rest waits for the test.
                "tools/call" => {
                    let first = format!(
                        "id: 0/1\r\nretry: 3000\r\ndata: \r\n\r\n\
                         id: 1/1\r\ndata: {}\r\n\r\nid: 2/1\r\ndata: {{\"jsonrpc\":\"2.0\",",
                        json!({"jsonrpc": "2.0", "method": "notifications/progress",
                            "params": {"progressToken": 1, "progress": 1}})
                    );
                    let rest = format!("\"id\":{id},\r\ndata: \"result\":{{}}}}\r\n\r\n");
                    let later = stream::once(async move {
                        fake.release.notified().await;
                        rest
                    })
                    .boxed();
                    sse(vec![now(&first), later])
                }
                "cut" => sse(vec![now(&format!(
                    "data: {}\n\n",
                    json!({"jsonrpc": "2.0", "method": "notifications/message",
                        "params": {"level": "info", "data": "cut"}})
                ))]),
                _ => (
                    StatusCode::UNAUTHORIZED,
                    axum::Json(json!({"error": {"message": "token expired"}})),
                )
                    .into_response(),
            }
        }

        /// First stream: priming, one update, then it ends; the second, a resume, ends
        /// empty as rmcp's does when the event has left its cache; the third stays open.
        pub async fn get(State(fake): State<std::sync::Arc<Fake>>, headers: HeaderMap) -> Response {
            let n = {
                let mut seen = fake.seen.lock().unwrap();
                seen.gets.push(
                    [
                        "mcp-session-id",
                        "last-event-id",
                        "authorization",
                        "mcp-protocol-version",
                    ]
                    .map(|h| header(&headers, h)),
                );
                seen.gets.len()
            };
            if fake.no_stream {
                return StatusCode::METHOD_NOT_ALLOWED.into_response();
            }
            if n == 1 {
                sse(vec![now(&format!(
                    "id: 0\nretry: 1000\ndata:\n\n: keep-alive\n\nid: 1\ndata: {}\n\n",
                    json!({"jsonrpc": "2.0", "method": "notifications/resources/updated",
                        "params": {"uri": "hypd://clusters/a"}})
                ))])
            } else if n == 2 {
                sse(Vec::new())
            } else {
                let log = json!({"jsonrpc": "2.0", "method": "notifications/message",
                    "params": {"level": "info", "data": "hello"}});
                sse(vec![
                    now(&format!("id: 2\ndata: {log}\n\n")),
                    stream::pending().boxed(),
                ])
            }
        }

        pub async fn delete(
            State(fake): State<std::sync::Arc<Fake>>,
            headers: HeaderMap,
        ) -> StatusCode {
            let session = header(&headers, "mcp-session-id");
            fake.seen.lock().unwrap().deletes.push(session);
            StatusCode::ACCEPTED
        }
    }

    struct Agent {
        stdin: Option<tokio::io::DuplexStream>,
        stdout: tokio::io::Lines<BufReader<tokio::io::DuplexStream>>,
        /// Lines read while waiting for another one.
        unclaimed: Vec<Value>,
        bridge: tokio::task::JoinHandle<Result<(), BridgeError>>,
        fake: Arc<fake::Fake>,
    }

    impl Agent {
        async fn start(fake: fake::Fake) -> Self {
            let fake = Arc::new(fake);
            let app = axum::Router::new()
                .route(
                    "/mcp",
                    axum::routing::post(fake::post)
                        .get(fake::get)
                        .delete(fake::delete),
                )
                .with_state(fake.clone());
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let url = format!("http://{}/", listener.local_addr().unwrap());
            tokio::spawn(async move { axum::serve(listener, app).await });
            let bridge = Arc::new(Bridge::new(&url, "tok".into()).unwrap());
            let (stdin, bridge_in) = tokio::io::duplex(1 << 16);
            let (bridge_out, stdout) = tokio::io::duplex(1 << 16);
            let bridge = tokio::spawn(bridge.relay_stdio(bridge_in, bridge_out));
            Self {
                stdin: Some(stdin),
                stdout: BufReader::new(stdout).lines(),
                unclaimed: Vec::new(),
                bridge,
                fake,
            }
        }

        async fn say(&mut self, message: Value) {
            let stdin = self.stdin.as_mut().unwrap();
            stdin
                .write_all(format!("{message}\n").as_bytes())
                .await
                .unwrap();
        }

        /// The first message written to stdout that `wanted` accepts, in any order.
        async fn expect(&mut self, wanted: impl Fn(&Value) -> bool) -> Value {
            if let Some(i) = self.unclaimed.iter().position(&wanted) {
                return self.unclaimed.remove(i);
            }
            loop {
                let line = tokio::time::timeout(Duration::from_secs(10), self.stdout.next_line())
                    .await
                    .expect("the bridge wrote nothing in time")
                    .unwrap()
                    .expect("the bridge closed stdout");
                let message: Value = serde_json::from_str(&line).unwrap();
                if wanted(&message) {
                    return message;
                }
                self.unclaimed.push(message);
            }
        }

        /// Closes stdin, waits for the bridge to exit and returns what it wrote unasked.
        async fn close(mut self) -> (Vec<Value>, fake::Seen) {
            drop(self.stdin.take());
            tokio::time::timeout(Duration::from_secs(10), self.bridge)
                .await
                .expect("the bridge did not exit")
                .unwrap()
                .unwrap();
            while let Some(line) = self.stdout.next_line().await.unwrap() {
                self.unclaimed.push(serde_json::from_str(&line).unwrap());
            }
            let seen = std::mem::take(&mut *self.fake.seen.lock().unwrap());
            (self.unclaimed, seen)
        }
    }

    fn id_is(id: i64) -> impl Fn(&Value) -> bool {
        move |m| m["id"] == id
    }

    fn method_is(method: &'static str) -> impl Fn(&Value) -> bool {
        move |m| m["method"] == method
    }

    async fn handshake(agent: &mut Agent) {
        agent
            .say(json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}))
            .await;
        let init = agent.expect(id_is(1)).await;
        assert_eq!(init["result"]["protocolVersion"], fake::PROTOCOL);
        agent
            .say(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await;
    }

    #[tokio::test]
    async fn relays_streamed_answers_and_the_session_stream_end_to_end() {
        let mut agent = Agent::start(fake::Fake::default()).await;
        handshake(&mut agent).await;
        let update = agent
            .expect(method_is("notifications/resources/updated"))
            .await;
        assert_eq!(update["params"]["uri"], "hypd://clusters/a");

        // The progress must come through while hypd still holds back the result.
        agent
            .say(json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {}}))
            .await;
        let progress = agent.expect(method_is("notifications/progress")).await;
        assert_eq!(progress["params"]["progress"], 1);
        agent.fake.release.notify_one();
        let result = agent.expect(id_is(2)).await;
        assert_eq!(result, json!({"jsonrpc": "2.0", "id": 2, "result": {}}));

        agent
            .say(json!({"jsonrpc": "2.0", "id": 3, "method": "cut"}))
            .await;
        let cut = agent.expect(id_is(3)).await;
        assert_eq!(cut["error"]["code"], -32603);
        let note = agent.expect(|m| m["params"]["data"] == "cut").await;
        assert_eq!(note["method"], "notifications/message");

        agent
            .say(json!({"jsonrpc": "2.0", "id": 4, "method": "refused"}))
            .await;
        let refused = agent.expect(id_is(4)).await;
        assert_eq!(refused["error"]["code"], -32001);
        let why = refused["error"]["message"].as_str().unwrap();
        assert!(
            why.contains("401") && why.contains("token expired"),
            "{why}"
        );

        // The first stream ended; the reopened one resumed after the last event seen,
        // came back empty, and the one after started afresh.
        let log = agent.expect(|m| m["params"]["data"] == "hello").await;
        assert_eq!(log["method"], "notifications/message");

        let (unasked, seen) = agent.close().await;
        assert!(unasked.is_empty(), "{unasked:?}");
        let header = |s: &str| Some(s.to_owned());
        let first = [
            header(fake::SESSION),
            None,
            header("Bearer tok"),
            header(fake::PROTOCOL),
        ];
        assert_eq!(seen.gets[0], first);
        let mut resumed = first.clone();
        resumed[1] = header("1");
        assert_eq!(seen.gets[1], resumed);
        assert_eq!(seen.gets[2], first);
        assert_eq!(seen.gets.len(), 3, "{:?}", seen.gets);
        assert_eq!(seen.deletes, vec![header(fake::SESSION)]);
    }

    #[tokio::test]
    async fn a_server_without_a_session_stream_is_not_asked_again() {
        let mut agent = Agent::start(fake::Fake {
            no_stream: true,
            ..fake::Fake::default()
        })
        .await;
        handshake(&mut agent).await;
        tokio::time::sleep(REOPEN_AFTER + Duration::from_millis(500)).await;
        let (unasked, seen) = agent.close().await;
        assert!(unasked.is_empty(), "{unasked:?}");
        assert_eq!(seen.gets.len(), 1);
        assert_eq!(seen.deletes.len(), 1);
    }
}
