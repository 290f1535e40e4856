//! `hypd-sim`: the part of the test world that moto lacks (EKS, SageMaker HyperPod, FSx
//! for Lustre and a Kubernetes API server per cluster). It speaks the real wire protocols so the real
//! `aws-sdk-*` clients reach it through `AWS_ENDPOINT_URL_EKS` /
//! `AWS_ENDPOINT_URL_SAGEMAKER`. With `--moto-url` it also fronts moto: what it does not
//! serve (EC2, IAM, S3, STS, ...) is forwarded there, so tests can set `AWS_ENDPOINT_URL`
//! to the sim and inject faults into every AWS call (see `proxy`). It is a test tool and
//! is never shipped.
//!
//! Its only stdout line is `listening on http://ADDR`, printed once bound, which is how
//! `hypd serve --sandbox` and tests learn the port; logs go to stderr.

mod clock;
mod control;
mod eks;
mod fsx;
mod hub;
mod kube;
mod moto;
mod proxy;
mod quotas;
mod sagemaker;
mod world;

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use axum::Router;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Json, Response};
use clap::Parser;
use serde_json::json;

use crate::world::World;

#[derive(Parser, Debug)]
#[command(
    name = "hypd-sim",
    version,
    about = "Test world for hypd: EKS + SageMaker HyperPod fakes and a Kubernetes API server per cluster"
)]
struct Args {
    /// Address to listen on (port 0 picks a free one)
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// moto's endpoint, asked about subnets, roles and buckets that must exist
    #[arg(long)]
    moto_url: Option<String>,
    /// The S3 (moto) that containers write their output to through their volumes
    /// (model downloads); defaults to --moto-url
    #[arg(long)]
    s3_url: Option<String>,
    /// Simulated seconds per real second (60: a 10-minute EKS creation takes 10 s)
    #[arg(long, default_value_t = 60.0)]
    time_scale: f64,
    /// Secret access key EKS tokens must be signed with (the test world's credentials)
    #[arg(long, default_value = "testing")]
    aws_secret_access_key: String,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let local = listener.local_addr()?;
    println!("listening on http://{local}");
    tracing::info!(%local, moto = ?args.moto_url, "hypd-sim ready");
    if !(args.time_scale.is_finite() && args.time_scale >= 0.0) {
        anyhow::bail!("--time-scale must be a non-negative number");
    }
    let moto = args.moto_url.as_deref().map(moto::Moto::new).transpose()?;
    let s3 = args
        .s3_url
        .as_deref()
        .or(args.moto_url.as_deref())
        .map(moto::Moto::new)
        .transpose()?;
    let mut world = World::new(args.time_scale, moto, args.aws_secret_access_key);
    world.s3 = s3;
    axum::serve(listener, app(Arc::new(world))).await?;
    Ok(())
}

fn app(world: world::Shared) -> Router {
    Router::new()
        .merge(control::routes())
        .merge(eks::routes())
        .route("/", axum::routing::post(json_protocol))
        .fallback(unknown_operation)
        .layer(axum::middleware::from_fn_with_state(
            world.clone(),
            proxy::front,
        ))
        .layer(axum::middleware::from_fn(world::with_caller))
        .with_state(world)
}

/// The JSON 1.1 services the sim serves on `POST /`, told apart by `X-Amz-Target`.
async fn json_protocol(
    state: State<world::Shared>,
    headers: axum::http::HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let target = headers
        .get("x-amz-target")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    if target.starts_with(quotas::TARGET_PREFIX) {
        quotas::dispatch(state, headers, body).await
    } else if target.starts_with(fsx::TARGET_PREFIX) {
        fsx::dispatch(state, headers, body).await
    } else {
        sagemaker::dispatch(state, headers, body).await
    }
}

/// What AWS answers for an operation it does not know, in the caller's protocol: JSON 1.1
/// (SageMaker, `X-Amz-Target`) or REST-JSON (EKS, `x-amzn-errortype`). With moto behind
/// the sim, what is not EKS's or SageMaker's is moto's to answer.
async fn unknown_operation(State(state): State<world::Shared>, request: Request) -> Response {
    let request = match proxy::fallback(&state, request).await {
        Ok(response) => return response,
        Err(request) => request,
    };
    let (headers, uri) = (request.headers(), request.uri());
    let target = headers
        .get("x-amz-target")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let what = target.clone().unwrap_or_else(|| uri.path().to_owned());
    let message = format!("hypd-sim does not implement {what}");
    let body = Json(json!({ "__type": "UnknownOperationException", "message": message }));
    let mut response = (StatusCode::BAD_REQUEST, body).into_response();
    if target.is_none()
        && let Ok(v) = "UnknownOperationException".parse()
    {
        response.headers_mut().insert("x-amzn-errortype", v);
    }
    response
}
