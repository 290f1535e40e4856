//! The control API tests use to steer the world: health, the time scale, injected
//! faults, and a reset. It lives under `/_sim/`, a prefix no AWS API uses.

use axum::Router;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Json, Response};
use axum::routing::{delete, get, post};
use serde::Deserialize;
use serde_json::json;

use crate::world::{AwsError, Fault, Shared, World};

async fn health() -> Response {
    Json(json!({ "ok": true })).into_response()
}

async fn get_clock(State(state): State<Shared>) -> Response {
    let w = state.lock().await;
    Json(json!({ "time_scale": w.clock.scale(), "now": w.clock.now() })).into_response()
}

#[derive(Deserialize)]
struct ClockBody {
    time_scale: f64,
}

async fn set_clock(State(state): State<Shared>, Json(body): Json<ClockBody>) -> Response {
    if !(body.time_scale.is_finite() && body.time_scale >= 0.0) {
        return AwsError::invalid_parameter("time_scale must be a non-negative number")
            .into_response();
    }
    let mut w = state.lock().await;
    w.clock.set_scale(body.time_scale);
    Json(json!({ "time_scale": w.clock.scale(), "now": w.clock.now() })).into_response()
}

async fn add_fault(State(state): State<Shared>, Json(fault): Json<Fault>) -> Response {
    if !["eks", "sagemaker"].contains(&fault.service.as_str()) {
        return AwsError::invalid_parameter("service must be eks or sagemaker").into_response();
    }
    let id = state.lock().await.add_fault(fault);
    Json(json!({ "id": id })).into_response()
}

async fn list_faults(State(state): State<Shared>) -> Response {
    Json(json!({ "faults": state.lock().await.faults })).into_response()
}

async fn clear_faults(State(state): State<Shared>) -> Response {
    state.lock().await.faults.clear();
    Json(json!({})).into_response()
}

async fn remove_fault(State(state): State<Shared>, Path(id): Path<u64>) -> Response {
    state.lock().await.faults.retain(|f| f.id != id);
    Json(json!({})).into_response()
}

/// Sets HyperPod "cluster usage" quotas per instance type (types not named keep theirs).
async fn set_quotas(
    State(state): State<Shared>,
    Json(quotas): Json<std::collections::BTreeMap<String, u32>>,
) -> Response {
    let mut w = state.lock().await;
    w.sagemaker.quotas.extend(quotas);
    Json(json!({ "quotas": w.sagemaker.quotas })).into_response()
}

/// Forgets every resource and fault; keeps the time scale and moto.
async fn reset(State(state): State<Shared>) -> Response {
    let mut w = state.lock().await;
    let mut fresh = World::new(w.clock.scale(), w.moto.take());
    fresh.kube.secret = w.kube.secret.clone();
    *w = fresh;
    Json(json!({})).into_response()
}

pub fn routes() -> Router<Shared> {
    Router::new()
        .route("/_sim/health", get(health))
        .route("/_sim/clock", get(get_clock).put(set_clock))
        .route(
            "/_sim/faults",
            post(add_fault).get(list_faults).delete(clear_faults),
        )
        .route("/_sim/faults/{id}", delete(remove_fault))
        .route("/_sim/reset", post(reset))
        .route("/_sim/sagemaker/quotas", axum::routing::put(set_quotas))
}
