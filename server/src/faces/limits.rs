//! What one caller may ask of hypd on the way in, before any command runs: which `Host`
//! names are served (DNS rebinding), how many requests a token may send (a per-token
//! rate limit with `429` and `Retry-After`), how large a body may be, and that every
//! refusal of the API faces is `{"error": …}` JSON, even those made by the HTTP stack.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use app::api::ApiError;
use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::Response;

use crate::config::{HostList, Limits};
use crate::faces::errors::error_response;

/// Loopback names a browser on this machine uses; a DNS-rebinding page cannot present
/// them as its own origin.
const LOOPBACK_HOSTS: [&str; 3] = ["localhost", "127.0.0.1", "[::1]"];

/// The `Host` names to serve: on a loopback bind only loopback names and the configured
/// ones; on any other bind the configured ones (plus loopback, for health checks), or
/// any host when none are configured. `None` serves any.
pub fn allowed_hosts(bind: IpAddr, configured: Option<HostList>) -> Option<Vec<String>> {
    let mut names: Vec<String> = LOOPBACK_HOSTS.map(str::to_owned).to_vec();
    match configured {
        Some(HostList::Any) => None,
        Some(HostList::Names(extra)) => {
            names.extend(extra);
            Some(names)
        }
        None if bind.is_loopback() => Some(names),
        None => None,
    }
}

/// The host a request names (`:authority` for HTTP/2, else `Host`), lowercase, without
/// port or trailing dot; IPv6 literals keep their brackets.
fn request_host(req: &Request) -> Option<String> {
    let raw = req
        .uri()
        .authority()
        .map(|a| a.as_str().to_owned())
        .or_else(|| {
            req.headers()
                .get(header::HOST)
                .and_then(|h| h.to_str().ok())
                .map(str::to_owned)
        })?;
    let raw = raw.rsplit_once('@').map_or(raw.as_str(), |(_, h)| h);
    let host = if raw.starts_with('[') {
        raw.split_once(']')
            .map_or(raw.to_owned(), |(h, _)| format!("{h}]"))
    } else {
        raw.split(':').next().unwrap_or_default().to_owned()
    };
    let host = host.to_ascii_lowercase();
    Some(host.strip_suffix('.').unwrap_or(&host).to_owned())
}

/// A token bucket per caller.
struct Bucket {
    tokens: f64,
    at: Instant,
}

/// Callers tracked at most; beyond this, buckets that have refilled are forgotten
/// (they hold no information), and a caller that still finds no room shares one bucket.
const MAX_BUCKETS: usize = 10_000;

pub struct RateLimiter {
    rate: f64,
    burst: f64,
    buckets: Mutex<HashMap<String, Bucket>>,
}

impl RateLimiter {
    pub fn new(limits: &Limits) -> Self {
        let rate = f64::from(limits.rate_per_second);
        Self {
            rate,
            burst: (rate * f64::from(limits.burst_seconds)).max(1.0),
            buckets: Mutex::default(),
        }
    }

    /// Takes one request from `key`'s bucket; when it is empty, how long until it is not.
    fn take(&self, key: &str, now: Instant) -> Result<(), Duration> {
        if self.rate == 0.0 {
            return Ok(());
        }
        let Ok(mut buckets) = self.buckets.lock() else {
            return Ok(());
        };
        if buckets.len() >= MAX_BUCKETS && !buckets.contains_key(key) {
            let (rate, burst) = (self.rate, self.burst);
            buckets.retain(|_, b| b.tokens + now.duration_since(b.at).as_secs_f64() * rate < burst);
        }
        let key = if buckets.len() >= MAX_BUCKETS && !buckets.contains_key(key) {
            "overflow"
        } else {
            key
        };
        let bucket = buckets.entry(key.to_owned()).or_insert(Bucket {
            tokens: self.burst,
            at: now,
        });
        bucket.tokens = (bucket.tokens + now.duration_since(bucket.at).as_secs_f64() * self.rate)
            .min(self.burst);
        bucket.at = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - bucket.tokens) / self.rate))
        }
    }
}

/// Who a request counts against: the credential it carries (hashed, so no secret is
/// kept), else the address it came from.
fn caller(req: &Request) -> String {
    let headers = req.headers();
    if let Some(value) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
    {
        return format!("token:{}", crate::auth::hash_secret(value.trim()));
    }
    if let Some(session) = crate::auth::session_cookie(headers) {
        return format!("session:{}", crate::auth::hash_secret(&session));
    }
    match req.extensions().get::<ConnectInfo<SocketAddr>>() {
        Some(ConnectInfo(addr)) => format!("address:{}", addr.ip()),
        None => "address:unknown".to_owned(),
    }
}

/// Probes, metrics and the console's static files are not a caller's work: a scraper or
/// a page's assets never spend a token's budget.
fn exempt(path: &str) -> bool {
    matches!(path, "/healthz" | "/readyz" | "/metrics" | "/favicon.svg")
        || path.starts_with("/pkg/")
}

/// The shared state of [`guard`].
#[derive(Clone)]
pub struct Guard {
    pub limits: Limits,
    pub hosts: Option<Arc<Vec<String>>>,
    pub rate: Arc<RateLimiter>,
}

impl Guard {
    pub fn new(limits: Limits, hosts: Option<Vec<String>>) -> Self {
        Self {
            rate: Arc::new(RateLimiter::new(&limits)),
            hosts: hosts.map(Arc::new),
            limits,
        }
    }
}

/// The most of a refused request's body that is read (and dropped) so the connection
/// stays usable; a larger one is left unread and the connection closed.
const DRAIN_MAX: usize = 16 << 20;

/// Answers a request the guard refuses. Its body is read first, unless the client waits
/// for `100 Continue` before sending it (curl does for large bodies) or it is larger
/// than [`DRAIN_MAX`]: closing a socket with unread data resets it, and the client would
/// then lose the answer along with the connection.
async fn refuse(req: Request, e: &ApiError, face: ErrorFace) -> Response {
    let headers = req.headers();
    let expects_continue = headers
        .get(header::EXPECT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("100-continue"));
    let declared = content_length(headers);
    let has_body =
        declared.is_some_and(|n| n > 0) || headers.contains_key(header::TRANSFER_ENCODING);
    if !has_body {
        return face.render(e);
    }
    if expects_continue || declared.is_some_and(|n| n > DRAIN_MAX as u64) {
        return closing(face.render(e));
    }
    match axum::body::to_bytes(req.into_body(), DRAIN_MAX).await {
        Ok(_) => face.render(e),
        Err(_) => closing(face.render(e)),
    }
}

fn content_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
}

/// Host check, rate limit and body limit, in that order (a refused Host costs no token),
/// all before the request reaches a route.
pub async fn guard(State(guard): State<Guard>, req: Request, next: Next) -> Response {
    let face = ErrorFace::of(req.uri().path());
    if let Some(hosts) = &guard.hosts
        && let Some(host) = request_host(&req)
        && !hosts.contains(&host)
    {
        return refuse(
            req,
            &ApiError::Forbidden {
                message: format!(
                    "this hypd does not serve the host {}: it answers to {} (add names with --allowed-hosts or HYPD_ALLOWED_HOSTS)",
                    app::api::values::shown(&host),
                    hosts.join(", ")
                ),
            },
            face,
        )
        .await;
    }
    if !exempt(req.uri().path())
        && let Err(wait) = guard.rate.take(&caller(&req), Instant::now())
    {
        let retry_after_seconds = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
        return refuse(
            req,
            &ApiError::RateLimited {
                message: format!(
                    "too many requests from this token (or session, or address): {} per second are allowed, in bursts of up to {}; retry after {retry_after_seconds} s",
                    guard.limits.rate_per_second,
                    guard.limits.rate_per_second * guard.limits.burst_seconds,
                ),
                retry_after_seconds,
            },
            face,
        )
        .await;
    }
    let limit = guard.limits.body_bytes;
    if content_length(req.headers()).is_some_and(|n| n > limit as u64) {
        return refuse(req, &too_large(limit), face).await;
    }
    // A body without a declared length is cut off at the limit while it is read.
    let req = req.map(|body| Body::new(http_body_util::Limited::new(body, limit)));
    next.run(req).await
}

pub fn too_large(limit: usize) -> ApiError {
    ApiError::TooLarge {
        message: format!(
            "the request body is larger than {} KiB, the most hypd accepts",
            limit / 1024
        ),
        limit_bytes: limit as u64,
    }
}

/// How a face's errors are shaped: REST, MCP and sign-in wrap them as `{"error": …}`;
/// the console's server functions send the `ApiError` itself (their client decodes it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorFace {
    Api,
    ServerFn,
    /// Console pages and assets: HTML is fine there.
    Page,
}

impl ErrorFace {
    pub fn of(path: &str) -> Self {
        if path.starts_with("/fn/") {
            ErrorFace::ServerFn
        } else if path.starts_with("/api/") || path == "/mcp" || path.starts_with("/auth/") {
            ErrorFace::Api
        } else {
            ErrorFace::Page
        }
    }

    fn render(self, e: &ApiError) -> Response {
        match self {
            ErrorFace::ServerFn => {
                let mut response = error_response(e);
                // Same status and headers, the bare error as the body.
                let body = serde_json::to_vec(e).unwrap_or_default();
                *response.body_mut() = Body::from(body);
                response
            }
            ErrorFace::Api | ErrorFace::Page => error_response(e),
        }
    }
}

/// Longest text kept from an error body the HTTP stack wrote itself.
const STACK_TEXT_MAX: usize = 512;

/// The refusals made below the command layer (axum's extractors, the router, rmcp's
/// transport) are plain text or empty; on the API faces they become the same JSON
/// error every other refusal is, with their status kept.
pub async fn json_errors(req: Request, next: Next) -> Response {
    let face = ErrorFace::of(req.uri().path());
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let response = next.run(req).await;
    let status = response.status();
    if face == ErrorFace::Page || !(status.is_client_error() || status.is_server_error()) {
        return response;
    }
    if is_json(response.headers()) {
        return response;
    }
    let (parts, body) = response.into_parts();
    let bytes = axum::body::to_bytes(body, 64 * 1024)
        .await
        .unwrap_or_default();
    // Server functions mark their JSON errors with a header, not always a content type.
    if serde_json::from_slice::<serde_json::Value>(&bytes).is_ok_and(|v| v.is_object()) {
        return Response::from_parts(parts, Body::from(bytes));
    }
    let text = String::from_utf8_lossy(&bytes).trim().to_owned();
    let text = match text.char_indices().nth(STACK_TEXT_MAX) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text,
    };
    let e = stack_error(status, &method, &path, text);
    let mut fixed = face.render(&e);
    *fixed.status_mut() = status;
    for (name, value) in parts.headers.iter() {
        if name != header::CONTENT_TYPE && name != header::CONTENT_LENGTH {
            fixed.headers_mut().insert(name, value.clone());
        }
    }
    fixed
}

fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"))
}

/// The `ApiError` a bare HTTP status stands for.
fn stack_error(
    status: StatusCode,
    method: &axum::http::Method,
    path: &str,
    text: String,
) -> ApiError {
    let message = if text.is_empty() {
        status
            .canonical_reason()
            .unwrap_or("request refused")
            .to_owned()
    } else {
        text
    };
    match status {
        StatusCode::UNAUTHORIZED => ApiError::Unauthorized { message },
        StatusCode::FORBIDDEN => ApiError::Forbidden { message },
        StatusCode::NOT_FOUND | StatusCode::METHOD_NOT_ALLOWED => ApiError::NotFound {
            resource: "route".into(),
            name: format!(
                "{method} {}",
                app::api::values::shown(path).trim_matches('"')
            ),
        },
        StatusCode::PAYLOAD_TOO_LARGE => ApiError::TooLarge {
            message,
            limit_bytes: 0,
        },
        StatusCode::TOO_MANY_REQUESTS => ApiError::RateLimited {
            message,
            retry_after_seconds: 1,
        },
        StatusCode::SERVICE_UNAVAILABLE => ApiError::Unavailable {
            message,
            retry_after_seconds: None,
        },
        s if s.is_server_error() => ApiError::Internal { message },
        _ => ApiError::field("", message),
    }
}

/// Marks a response to a request whose body was not read to the end: the connection
/// cannot be reused, and the client must know before it sends another request on it.
pub fn closing(mut response: Response) -> Response {
    response
        .headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_refill_at_the_rate() {
        let limiter = RateLimiter::new(&Limits {
            rate_per_second: 2,
            burst_seconds: 2,
            ..Limits::default()
        });
        let t0 = Instant::now();
        for _ in 0..4 {
            assert!(limiter.take("a", t0).is_ok());
        }
        let wait = limiter.take("a", t0).unwrap_err();
        assert_eq!(wait, Duration::from_millis(500));
        // Another caller has its own bucket.
        assert!(limiter.take("b", t0).is_ok());
        assert!(limiter.take("a", t0 + Duration::from_millis(500)).is_ok());
        assert!(limiter.take("a", t0 + Duration::from_millis(500)).is_err());
    }

    #[test]
    fn zero_means_no_limit() {
        let limiter = RateLimiter::new(&Limits {
            rate_per_second: 0,
            ..Limits::default()
        });
        let t0 = Instant::now();
        assert!((0..10_000).all(|_| limiter.take("a", t0).is_ok()));
    }

    #[test]
    fn loopback_binds_serve_loopback_names_and_the_configured_ones() {
        let lo: IpAddr = "127.0.0.1".parse().unwrap();
        let any: IpAddr = "0.0.0.0".parse().unwrap();
        assert_eq!(
            allowed_hosts(lo, None).unwrap(),
            ["localhost", "127.0.0.1", "[::1]"]
        );
        assert_eq!(allowed_hosts(any, None), None);
        assert_eq!(allowed_hosts(lo, Some(HostList::Any)), None);
        let named = allowed_hosts(any, Some(HostList::Names(vec!["hypd.internal".into()])));
        assert_eq!(
            named.unwrap(),
            ["localhost", "127.0.0.1", "[::1]", "hypd.internal"]
        );
    }

    #[test]
    fn hosts_are_read_without_ports() {
        let host = |h: &str| {
            let req = Request::builder()
                .uri("/x")
                .header(header::HOST, h)
                .body(Body::empty())
                .unwrap();
            request_host(&req).unwrap()
        };
        assert_eq!(host("LocalHost:3099"), "localhost");
        assert_eq!(host("[::1]:3099"), "[::1]");
        assert_eq!(host("[::1]"), "[::1]");
        assert_eq!(host("127.0.0.1"), "127.0.0.1");
        assert_eq!(host("evil.example.:80"), "evil.example");
    }
}
