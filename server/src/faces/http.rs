//! The one HTTP listener: the Leptos console (SSR + hydration bundle), REST under
//! `/api/v1` with its OpenAPI document, MCP at `/mcp`, console sign-in, health and
//! readiness probes and Prometheus metrics. One port serves every face.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use app::api::ApiError;
use app::api::call::{Dispatcher, SharedDispatcher};
use app::{App, ConsoleInfo, shell};
use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Json, Response};
use axum::routing::{get, post};
use leptos::config::LeptosOptions;
use leptos::prelude::provide_context;
use leptos_axum::{LeptosRoutes, generate_route_list};
use serde_json::json;
use tower_http::compression::CompressionLayer;

use crate::auth::{self, Face};
use crate::aws::Aws;
use crate::config::ServeConfig;
use crate::faces::errors::error_response;
use crate::faces::limits::{self, Guard};
use crate::faces::state::AppState;
use crate::faces::{events, mcp, openapi, rest};
use crate::sandbox::SandboxInfo;
use crate::service::Service;
use crate::store::{Store, StoreError};
use crate::telemetry;

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("cannot create the data directory {path}: {source}")]
    DataDir {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot create the first admin token: {0}")]
    FirstToken(ApiError),
    #[error("cannot read what the stored clusters are meant to be: {0}")]
    Desired(ApiError),
    #[error("server error: {0}")]
    Io(#[from] std::io::Error),
}

/// Opens the store, connects AWS, binds and serves until SIGINT/SIGTERM.
pub async fn serve(cfg: ServeConfig, sandbox: Option<SandboxInfo>) -> Result<(), ServeError> {
    create_private_dir(&cfg.data_dir)?;
    let store = Store::open(&cfg.database).await?;
    tracing::info!(store = %cfg.database.describe(), "store ready");
    let aws = Arc::new(Aws::from_env().await);
    let service = Arc::new(Service::new(
        store.clone(),
        aws.clone(),
        sandbox.is_some(),
        cfg.pace.min_poll,
    ));
    if let Some((secret, path)) = service
        .auth
        .ensure_first_admin(&crate::sandbox::state_dir(&cfg.data_dir, cfg.sandbox))
        .await
        .map_err(ServeError::FirstToken)?
    {
        // Shown once, here; afterwards only the file (mode 0600) has it.
        println!(
            "hypd first start: admin token {secret} (also written to {})",
            path.display()
        );
        tracing::info!(file = %path.display(), "created the first admin token");
    }

    // A store written before hypd kept each cluster's desired state gets it from its
    // operations, before an operation that finishes changes it.
    let filled = crate::cluster::replay::fill_missing(&store)
        .await
        .map_err(ServeError::Desired)?;
    if filled > 0 {
        tracing::info!(
            clusters = filled,
            "read the desired state of clusters from their operations"
        );
    }

    // Resumes every unfinished operation, then follows new ones.
    let worker = crate::operation::worker::Worker::new(
        store.clone(),
        Arc::new(aws.for_operations()),
        service.wake.clone(),
        cfg.pace,
    );
    tokio::spawn(worker.run());
    // The create form's first open asks for regions, zones and instance types: asked
    // now, the first user does not wait for cold calls to AWS. Test worlds turn it off:
    // their hypd restarts hundreds of times and most never open the form, while each
    // warm-up costs moto a second of CPU (it answers the offerings in one 0.8 MB page).
    if cfg.warm_catalogue {
        let service = service.clone();
        tokio::spawn(async move { service.catalogue.warm(&service.aws).await });
    }
    tokio::spawn(crate::retention::run(store.clone(), cfg.retention));
    tokio::spawn(telemetry::upkeep(telemetry::metrics_handle()));

    let addr = SocketAddr::new(cfg.bind, cfg.port);
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| ServeError::Bind { addr, source })?;
    let local = listener.local_addr()?;

    check_site_root(&cfg.site_root);
    let state = AppState {
        service,
        openapi: Arc::new(openapi::document()),
        store,
        console: ConsoleInfo {
            version: env!("CARGO_PKG_VERSION").to_owned(),
            sandbox: sandbox.is_some(),
            region: aws.region(),
        },
        aws,
        metrics: telemetry::metrics_handle(),
        leptos: leptos_options(&cfg.site_root, local),
        guard: Guard::new(cfg.limits.clone(), cfg.allowed_hosts.clone()),
    };
    let app = router(state);

    // Tests and scripts read this line to learn the port when 0 was asked for.
    tracing::info!(
        url = %format!("http://{local}"),
        sandbox = sandbox.is_some(),
        "hypd console listening"
    );
    println!("hypd listening on http://{local}");
    crate::faces::listener::serve(listener, app, cfg.limits, shutdown_signal()).await?;
    tracing::info!("hypd stopped");
    Ok(())
}

pub fn router(state: AppState) -> Router {
    let routes = generate_route_list(App);
    let console = state.console.clone();
    let leptos = state.leptos.clone();
    let dispatcher: SharedDispatcher = Arc::new(ConsoleDispatch(state.service.clone()));
    let mcp = Router::new()
        .route_service("/mcp", mcp::service(state.service.clone()))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            authenticate_mcp,
        ));
    // The not-found page renders the same shell as every page, so it needs the same
    // context: without it the 404 could not see the session and showed "Sign in".
    let context = move || {
        provide_context(console.clone());
        provide_context(dispatcher.clone());
    };
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/api/v1/openapi.json", get(openapi_json))
        .route("/api/v1/events", get(events::subscribe))
        .route(
            "/api/v1/clusters/{name}/training-jobs/{job}/logs/stream",
            get(super::logs::stream),
        )
        .route("/auth/login", post(login))
        .route("/auth/logout", post(logout))
        .merge(rest::routes())
        .merge(mcp)
        .nest_service("/pkg", bundle_files(&state.leptos))
        .leptos_routes_with_context(&state, routes, context.clone(), move || {
            shell(leptos.clone())
        })
        .fallback(leptos_axum::file_and_error_handler_with_context::<
            AppState,
            _,
        >(context, shell))
        .layer(axum::middleware::from_fn(limits::json_errors))
        .layer(axum::middleware::from_fn(server_fn_status))
        .layer(axum::extract::DefaultBodyLimit::max(
            state.guard.limits.body_bytes,
        ))
        .layer(axum::middleware::from_fn_with_state(
            state.guard.clone(),
            limits::guard,
        ))
        .layer(axum::middleware::from_fn(telemetry::track_http))
        .layer(CompressionLayer::new())
        .with_state(state)
}

/// The console's bundle (`<site>/pkg`). console-build writes a brotli and a gzip copy of
/// every file, sent as they are to a browser that accepts them (the compression layer
/// leaves an encoded answer alone). The names carry no hash, so a browser must ask again
/// (If-Modified-Since, answered 304) before it reuses a copy: a stale bundle would not
/// hydrate a newer server's pages.
fn bundle_files(leptos: &LeptosOptions) -> Router {
    let dir = Path::new(leptos.site_root.as_ref()).join(leptos.site_pkg_dir.as_ref());
    Router::new()
        .fallback_service(
            tower_http::services::ServeDir::new(dir)
                .precompressed_br()
                .precompressed_gzip(),
        )
        .layer(axum::middleware::map_response(
            |mut response: Response| async move {
                response
                    .headers_mut()
                    .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
                response
            },
        ))
}

fn leptos_options(site_root: &Path, addr: SocketAddr) -> LeptosOptions {
    LeptosOptions::builder()
        .output_name("hypd")
        .site_root(site_root.display().to_string())
        .site_pkg_dir("pkg")
        .site_addr(addr)
        .build()
}

fn check_site_root(site_root: &Path) {
    let js = site_root.join("pkg").join("hypd.js");
    if !js.is_file() {
        tracing::warn!(
            site_root = %site_root.display(),
            "console bundle not found (pkg/hypd.js): pages render but do not hydrate; build it with `cargo run -p console-build` or set HYPD_SITE_ROOT"
        );
    }
}

fn create_private_dir(dir: &Path) -> Result<(), ServeError> {
    let err = |source| ServeError::DataDir {
        path: dir.display().to_string(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(err)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        // The data dir holds the admin token and the store: owner only.
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(err)?;
    }
    Ok(())
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
    tracing::info!("shutdown signal received");
}

/// The process is up and serving.
async fn healthz() -> impl IntoResponse {
    Json(json!({ "status": "ok" }))
}

/// Ready to do work: the store answers and AWS says who we are. Who hypd acts as (the
/// account and role ARN) and the store's errors are for callers with a token; anyone
/// else, a load balancer included, learns only ready or not.
async fn readyz(State(state): State<AppState>, headers: HeaderMap) -> Response {
    let store = match tokio::time::timeout(Duration::from_secs(3), state.store.ping()).await {
        Ok(Ok(())) => json!({ "ok": true, "backend": state.store.backend() }),
        Ok(Err(e)) => {
            json!({ "ok": false, "backend": state.store.backend(), "error": e.to_string() })
        }
        Err(_) => {
            json!({ "ok": false, "backend": state.store.backend(), "error": "timed out after 3 s" })
        }
    };
    let aws = match tokio::time::timeout(Duration::from_secs(10), state.aws.identity()).await {
        Ok(Ok(id)) => {
            json!({ "ok": true, "account": id.account, "arn": id.arn, "region": state.aws.region() })
        }
        Ok(Err(e)) => json!({ "ok": false, "error": e, "region": state.aws.region() }),
        Err(_) => json!({ "ok": false, "error": { "message": "timed out after 10 s" } }),
    };
    let ready = store["ok"] == true && aws["ok"] == true;
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    if !ready {
        tracing::warn!(%store, %aws, "not ready");
    }
    let known = state
        .service
        .auth
        .authenticate(&headers, &axum::http::Method::GET, Face::Rest)
        .await
        .is_ok();
    let body = if known {
        json!({ "ready": ready, "sandbox": state.console.sandbox, "store": store, "aws": aws })
    } else {
        json!({ "ready": ready })
    };
    (status, Json(body)).into_response()
}

async fn metrics(State(state): State<AppState>) -> Response {
    match state.store.operations_by_state().await {
        Ok(counts) => {
            for (s, n) in counts {
                metrics::gauge!(telemetry::OPERATIONS, "state" => s).set(n as f64);
            }
        }
        Err(e) => tracing::warn!(error = %e, "cannot count operations for /metrics"),
    }
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        state.metrics.render(),
    )
        .into_response()
}

async fn openapi_json(State(state): State<AppState>) -> Response {
    Json(state.openapi.as_ref().clone()).into_response()
}

/// MCP requests must carry a token; the actor rides in the request's extensions, where
/// the MCP handler finds it.
async fn authenticate_mcp(State(state): State<AppState>, mut req: Request, next: Next) -> Response {
    match state
        .service
        .auth
        .authenticate(req.headers(), req.method(), Face::Mcp)
        .await
    {
        Ok(actor) => {
            req.extensions_mut().insert(actor);
            next.run(req).await
        }
        Err(e) => {
            // The refused request's body is read (it is under the body limit), so the
            // client may send its next request on the same connection; when it cannot
            // be read, the answer says the connection closes.
            match axum::body::to_bytes(req.into_body(), usize::MAX).await {
                Ok(_) => error_response(&e),
                Err(_) => limits::closing(error_response(&e)),
            }
        }
    }
}

/// Server functions answer every error with 500. An `ApiError` gets the status REST gives
/// it instead, so a refusal reads the same on the wire whichever face it came through.
async fn server_fn_status(req: Request, next: Next) -> Response {
    let response = next.run(req).await;
    if !response
        .headers()
        .contains_key(leptos::server_fn::error::SERVER_FN_ERROR_HEADER)
    {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    // Error bodies are one small JSON object (echoed values are cut), so this limit is
    // never reached by one of ours.
    let bytes = match axum::body::to_bytes(body, 1 << 20).await {
        Ok(b) => b,
        Err(e) => {
            let e = ApiError::internal(format!("the error could not be read: {e}"));
            let mut response = error_response(&e);
            *response.body_mut() =
                axum::body::Body::from(serde_json::to_vec(&e).unwrap_or_default());
            return response;
        }
    };
    if let Ok(e) = serde_json::from_slice::<ApiError>(&bytes)
        && let Ok(status) = StatusCode::from_u16(e.http_status())
    {
        parts.status = status;
    }
    Response::from_parts(parts, axum::body::Body::from(bytes))
}

/// The console's server functions reach `dispatch` through this, authenticated by the
/// session cookie (or a bearer token) of the request that carried them.
struct ConsoleDispatch(Arc<Service>);

impl Dispatcher for ConsoleDispatch {
    fn dispatch_http(
        &self,
        parts: http::request::Parts,
        command: String,
        input: serde_json::Value,
    ) -> std::pin::Pin<Box<dyn Future<Output = Result<serde_json::Value, ApiError>> + Send + '_>>
    {
        Box::pin(async move {
            let actor = self
                .0
                .auth
                .authenticate(&parts.headers, &parts.method, Face::Console)
                .await?;
            let answer = self.0.dispatch(&actor, &command, input).await?;
            serde_json::from_str(answer.get()).map_err(ApiError::internal)
        })
    }
}

#[derive(serde::Deserialize)]
struct Login {
    token: String,
}

/// A browser's sign-in must come from this console's own page.
fn cross_origin(headers: &HeaderMap) -> Option<Response> {
    (headers.contains_key(header::ORIGIN) && !auth::same_origin(headers)).then(|| {
        error_response(&ApiError::Forbidden {
            message: "cross-origin sign-in refused".into(),
        })
    })
}

async fn login(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    if let Some(refused) = cross_origin(&headers) {
        return refused;
    }
    let Ok(Login { token }) = serde_json::from_slice::<Login>(&body) else {
        return error_response(&ApiError::field("token", "send {\"token\": \"hypd_…\"}"));
    };
    // Tokens are 69 characters; anything much longer is not one, and is not hashed.
    if token.len() > 256 {
        return error_response(&ApiError::field(
            "token",
            "a token is 69 characters (hypd_ and 64 hex digits)",
        ));
    }
    match state.service.auth.login(&token).await {
        Ok((session, actor)) => {
            let mut response =
                Json(json!({ "name": actor.name, "role": actor.role })).into_response();
            let cookie = auth::session_set_cookie(&session, auth::via_https(&headers));
            if let Ok(v) = HeaderValue::from_str(&cookie) {
                response.headers_mut().insert(header::SET_COOKIE, v);
            }
            response
        }
        Err(e) => error_response(&e),
    }
}

async fn logout(State(state): State<AppState>, headers: HeaderMap) -> Response {
    if let Some(refused) = cross_origin(&headers) {
        return refused;
    }
    if let Some(session) = auth::session_cookie(&headers)
        && let Err(e) = state.service.auth.logout(&session).await
    {
        return error_response(&e);
    }
    let mut response = StatusCode::NO_CONTENT.into_response();
    if let Ok(v) = HeaderValue::from_str(&auth::session_clear_cookie(auth::via_https(&headers))) {
        response.headers_mut().insert(header::SET_COOKIE, v);
    }
    response
}
