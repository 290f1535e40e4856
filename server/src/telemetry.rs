//! Logs and metrics. Logs go to stderr (human or JSON); metrics are Prometheus text at
//! `/metrics`. Neither ever carries a token, a password or a database URL.

use std::time::Instant;

use axum::extract::{MatchedPath, Request};
use axum::middleware::Next;
use axum::response::Response;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::format::FmtSpan;

use crate::config::LogConfig;
use crate::config::LogFormat;

pub fn init_logging(cfg: &LogConfig) {
    // The filter was validated while reading the configuration.
    let filter = EnvFilter::try_new(&cfg.filter).unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_span_events(FmtSpan::NONE);
    let result = match cfg.format {
        LogFormat::Human => builder.try_init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .try_init(),
    };
    // A second init (tests that start several servers) keeps the first subscriber.
    let _ = result;
}

pub const HTTP_REQUESTS: &str = "hypd_http_requests_total";
pub const HTTP_DURATION: &str = "hypd_http_request_duration_seconds";
pub const OPERATIONS: &str = "hypd_operations";
/// The store transaction that records one transition of an operation (engine overhead).
pub const TRANSITION_DURATION: &str = "hypd_operation_transition_seconds";
/// One run of a stage's step: the provider calls it made.
pub const STEP_DURATION: &str = "hypd_operation_step_seconds";

/// Installs the process-wide Prometheus recorder once and returns its handle.
pub fn metrics_handle() -> PrometheusHandle {
    static HANDLE: std::sync::OnceLock<PrometheusHandle> = std::sync::OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let builder = PrometheusBuilder::new()
                .set_buckets_for_metric(
                    Matcher::Suffix("_seconds".to_owned()),
                    &[
                        0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                        5.0, 10.0, 30.0,
                    ],
                )
                .unwrap_or_else(|_| PrometheusBuilder::new());
            match builder.install_recorder() {
                Ok(handle) => handle,
                // Another recorder is installed (only possible in tests): render from a
                // private one so /metrics still answers.
                Err(_) => PrometheusBuilder::new().build_recorder().handle(),
            }
        })
        .clone()
}

/// Folds the samples histograms have recorded since the last pass into their buckets.
/// The recorder keeps every sample until then (it is drained only by this or by a
/// scrape of `/metrics`), so without it memory grows by each request's latency sample
/// for as long as nobody scrapes: ~18 bytes a request, measured.
pub async fn upkeep(handle: PrometheusHandle) {
    let mut every = tokio::time::interval(std::time::Duration::from_secs(5));
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        handle.run_upkeep();
    }
}

/// Counts requests and their latency by method, route template and status class. The
/// route is the matched template (`/api/v1/clusters/{name}`), never the raw path, so
/// label cardinality stays bounded.
pub async fn track_http(req: Request, next: Next) -> Response {
    let start = Instant::now();
    let method = req.method().as_str().to_owned();
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |p| p.as_str().to_owned());
    let response = next.run(req).await;
    let status = response.status().as_u16().to_string();
    let labels = [("method", method), ("route", route), ("status", status)];
    metrics::counter!(HTTP_REQUESTS, &labels).increment(1);
    metrics::histogram!(HTTP_DURATION, &labels).record(start.elapsed().as_secs_f64());
    response
}
