//! Accepting and serving connections, with the limits that keep slow or idle clients
//! from holding sockets (and file descriptors) for ever: a request head must arrive
//! within the header timeout, a connection with nothing in flight is closed after the
//! idle timeout, and at most `max_connections` are served at once (the next ones get a
//! `503` and are closed). hyper's own header timeout starts only once it has told HTTP/1
//! from HTTP/2 and also ends idle keep-alive connections, so both clocks are kept here,
//! from what the connection reads and writes. Time hypd itself spends producing a
//! response (a handler, or a server-rendered page's body waiting for its data between
//! chunks) is never the client's idleness; time a body waits for the client to take what
//! was written is.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};
use tower::ServiceExt;

use crate::config::Limits;

/// A request head (line and headers) larger than this is refused by hyper with 431:
/// hypd's own requests carry a token and a cookie, far below it.
const MAX_HEAD_BYTES: usize = 64 * 1024;

/// How long a stopping server waits for connections to finish their requests.
const DRAIN: Duration = Duration::from_secs(10);

/// "No time": the head clock is not running.
const NONE: u64 = u64::MAX;

/// What a connection has been doing, in milliseconds since it was accepted.
struct Activity {
    start: Instant,
    /// Requests whose response has not been produced yet.
    busy: AtomicUsize,
    /// Response bodies waiting on hypd for their next chunk.
    producing: AtomicUsize,
    /// When the connection last had nothing in flight (accept, the last response, or a
    /// body's last wait on hypd).
    idle_since: AtomicU64,
    /// When the head of the next request began (accept for the first one, else its
    /// first byte); `NONE` while a request is in flight or nothing has arrived.
    head_since: AtomicU64,
    /// The last write to the client: a response body still going out is not idle.
    last_write: AtomicU64,
}

impl Activity {
    fn new() -> Self {
        Self {
            start: Instant::now(),
            busy: AtomicUsize::new(0),
            producing: AtomicUsize::new(0),
            idle_since: AtomicU64::new(0),
            head_since: AtomicU64::new(0),
            last_write: AtomicU64::new(0),
        }
    }

    fn now(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_millis()).unwrap_or(NONE - 1)
    }

    fn read(&self) {
        if self.busy.load(Ordering::Acquire) == 0 {
            let _ = self.head_since.compare_exchange(
                NONE,
                self.now(),
                Ordering::AcqRel,
                Ordering::Relaxed,
            );
        }
    }

    fn wrote(&self) {
        self.last_write.store(self.now(), Ordering::Release);
    }

    fn begin(self: &Arc<Self>) -> InFlight {
        self.busy.fetch_add(1, Ordering::AcqRel);
        self.head_since.store(NONE, Ordering::Release);
        InFlight(self.clone())
    }

    /// Why the connection should be closed now, if it should.
    fn expired(&self, limits: &Limits) -> Option<&'static str> {
        if self.busy.load(Ordering::Acquire) > 0 || self.producing.load(Ordering::Acquire) > 0 {
            return None;
        }
        let now = self.now();
        let elapsed = |since: u64| Duration::from_millis(now.saturating_sub(since));
        let head = self.head_since.load(Ordering::Acquire);
        if head != NONE {
            return (elapsed(head) > limits.header_timeout).then_some("header read timeout");
        }
        let idle = self
            .idle_since
            .load(Ordering::Acquire)
            .max(self.last_write.load(Ordering::Acquire));
        (elapsed(idle) > limits.idle_timeout).then_some("idle timeout")
    }
}

/// Held while a request is in flight.
struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        if self.0.busy.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.idle_since.store(self.0.now(), Ordering::Release);
        }
    }
}

/// A response body that tells its connection's [`Activity`] while it waits on hypd for
/// its next chunk.
struct Producing {
    body: Body,
    activity: Arc<Activity>,
    waiting: bool,
}

impl Producing {
    fn waiting(&mut self, waiting: bool) {
        if waiting == self.waiting {
            return;
        }
        self.waiting = waiting;
        if waiting {
            self.activity.producing.fetch_add(1, Ordering::AcqRel);
        } else {
            // The wait was hypd's: the idle clock starts again from its end.
            self.activity
                .idle_since
                .store(self.activity.now(), Ordering::Release);
            self.activity.producing.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl hyper::body::Body for Producing {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        self.waiting(polled.is_pending());
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

impl Drop for Producing {
    fn drop(&mut self) {
        self.waiting(false);
    }
}

/// The socket, reporting reads and writes to its connection's [`Activity`].
struct Tracked {
    io: TcpStream,
    activity: Arc<Activity>,
}

impl AsyncRead for Tracked {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.io).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.read();
        }
        polled
    }
}

impl AsyncWrite for Tracked {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.io).poll_write(cx, buf);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.wrote();
        }
        polled
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.wrote();
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// The answer to a connection over the limit, written before it is closed.
fn over_capacity(max: usize) -> Vec<u8> {
    let body = serde_json::json!({ "error": app::api::ApiError::Unavailable {
        message: format!("hypd is serving as many connections as it allows ({max}); retry shortly"),
        retry_after_seconds: Some(1),
    }})
    .to_string();
    format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {}\r\nretry-after: 1\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// The most connections this process can hold: the configured cap, lowered to leave
/// file descriptors for the store, AWS and the sandbox's children.
fn connection_cap(configured: usize) -> usize {
    const RESERVED: u64 = 128;
    let fds = raise_open_file_limit();
    let usable = usize::try_from(fds.saturating_sub(RESERVED)).unwrap_or(usize::MAX);
    if usable < configured {
        tracing::warn!(
            configured,
            open_file_limit = fds,
            serving = usable.max(1),
            "the open-file limit is too low for --max-connections: serving fewer"
        );
    }
    configured.min(usable).max(1)
}

/// Raises the soft open-file limit to the hard one (as Go and nginx do) and returns it.
fn raise_open_file_limit() -> u64 {
    #[cfg(unix)]
    {
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit/setrlimit write or read only the struct passed.
        unsafe {
            if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
                return 1024;
            }
            if lim.rlim_cur < lim.rlim_max {
                let raised = libc::rlimit {
                    rlim_cur: lim.rlim_max,
                    rlim_max: lim.rlim_max,
                };
                if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                    lim.rlim_cur = lim.rlim_max;
                }
            }
        }
        lim.rlim_cur
    }
    #[cfg(not(unix))]
    {
        u64::MAX
    }
}

/// Serves `app` on `listener` until `shutdown` completes, then lets open requests finish
/// (for at most [`DRAIN`]).
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()> {
    let cap = connection_cap(limits.max_connections);
    let permits = Arc::new(Semaphore::new(cap));
    let limits = Arc::new(limits);
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut shutdown = pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of file descriptors, or a connection reset before accept: wait
                    // a moment rather than spin.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            let _ = stream.try_write(&over_capacity(cap));
            continue;
        };
        let _ = stream.set_nodelay(true);
        let app = app.clone();
        let limits = limits.clone();
        let stop = stop_rx.clone();
        tokio::spawn(async move {
            connection(stream, peer, app, &limits, stop).await;
            drop(permit);
        });
    }
    let _ = stop_tx.send(true);
    let all = u32::try_from(cap).unwrap_or(u32::MAX);
    if tokio::time::timeout(DRAIN, permits.acquire_many(all))
        .await
        .is_err()
    {
        tracing::warn!(
            "connections still open after {} s: closing them",
            DRAIN.as_secs()
        );
    }
    Ok(())
}

async fn connection(
    stream: TcpStream,
    peer: SocketAddr,
    app: Router,
    limits: &Limits,
    mut stop: watch::Receiver<bool>,
) {
    let activity = Arc::new(Activity::new());
    let io = TokioIo::new(Tracked {
        io: stream,
        activity: activity.clone(),
    });
    let requests = activity.clone();
    let service = hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
        let in_flight = requests.begin();
        req.extensions_mut().insert(ConnectInfo(peer));
        let call = app.clone().oneshot(req.map(Body::new));
        let activity = requests.clone();
        async move {
            let response = call.await.unwrap_or_else(|e| match e {});
            drop(in_flight);
            Ok::<_, Infallible>(response.map(|body| {
                Body::new(Producing {
                    body,
                    activity,
                    waiting: false,
                })
            }))
        }
    });
    let mut builder = Builder::new(TokioExecutor::new());
    builder.http1().max_buf_size(MAX_HEAD_BYTES);
    builder
        .http2()
        .max_header_list_size(MAX_HEAD_BYTES as u32)
        // WebSockets over HTTP/2 (RFC 8441).
        .enable_connect_protocol();
    let mut conn = pin!(builder.serve_connection_with_upgrades(io, service));
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut closing = false;
    loop {
        tokio::select! {
            result = conn.as_mut() => {
                if let Err(e) = result {
                    tracing::trace!(%peer, error = %e, "connection ended with an error");
                }
                return;
            }
            _ = tick.tick() => {
                if let Some(why) = activity.expired(limits) {
                    tracing::debug!(%peer, reason = why, "closing connection");
                    return;
                }
            }
            changed = stop.changed(), if !closing => {
                closing = true;
                if changed.is_ok() {
                    conn.as_mut().graceful_shutdown();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Limits {
        Limits {
            header_timeout: Duration::from_millis(100),
            idle_timeout: Duration::from_millis(300),
            ..Limits::default()
        }
    }

    /// An activity whose clock started `ago` earlier.
    fn started(ago: Duration) -> Arc<Activity> {
        let a = Activity::new();
        Arc::new(Activity {
            start: a.start - ago,
            ..a
        })
    }

    #[test]
    fn a_first_request_must_arrive_within_the_header_timeout() {
        assert_eq!(started(Duration::ZERO).expired(&limits()), None);
        assert_eq!(
            started(Duration::from_millis(150)).expired(&limits()),
            Some("header read timeout")
        );
    }

    #[test]
    fn requests_in_flight_keep_a_connection_and_idleness_ends_it() {
        let a = started(Duration::from_secs(5));
        let in_flight = a.begin();
        assert_eq!(a.expired(&limits()), None, "a long poll is not idle");
        drop(in_flight);
        assert_eq!(a.expired(&limits()), None, "just answered");
        // Idle since 400 ms ago: past the idle timeout, and no head has begun.
        a.idle_since.store(a.now() - 400, Ordering::Release);
        assert_eq!(a.expired(&limits()), Some("idle timeout"));
        // The first byte of a new request starts the header clock instead.
        a.idle_since.store(a.now(), Ordering::Release);
        a.read();
        assert_eq!(a.expired(&limits()), None);
        a.head_since.store(a.now() - 150, Ordering::Release);
        assert_eq!(a.expired(&limits()), Some("header read timeout"));
    }

    #[test]
    fn a_body_waiting_on_hypd_is_not_idle() {
        use hyper::body::Body as _;
        let a = started(Duration::from_secs(5));
        // The handler has answered; the body is what is left of the response.
        drop(a.begin());
        a.idle_since.store(a.now() - 400, Ordering::Release);
        let never = futures_util::stream::pending::<Result<axum::body::Bytes, io::Error>>();
        let mut body = Producing {
            body: Body::from_stream(never),
            activity: a.clone(),
            waiting: false,
        };
        let mut cx = Context::from_waker(std::task::Waker::noop());
        assert!(Pin::new(&mut body).poll_frame(&mut cx).is_pending());
        assert_eq!(a.expired(&limits()), None, "a page still rendering");
        drop(body);
        assert_eq!(a.expired(&limits()), None, "its wait ended just now");
        a.idle_since.store(a.now() - 400, Ordering::Release);
        assert_eq!(a.expired(&limits()), Some("idle timeout"));
    }

    #[test]
    fn the_cap_leaves_descriptors_for_the_rest() {
        let fds = raise_open_file_limit();
        assert!(connection_cap(usize::MAX) as u64 <= fds.saturating_sub(128).max(1));
        assert_eq!(connection_cap(1), 1);
    }
}
