//! The one error body every HTTP refusal of the API faces has, `{"error": ApiError}`,
//! with the status and headers the error calls for. A leaf: the limits in front of every
//! route and the routers behind them all answer with it.

use app::api::ApiError;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Json, Response};
use serde_json::json;

/// The error body every REST failure has: `{"error": ApiError}`.
pub fn error_response(e: &ApiError) -> Response {
    let status = StatusCode::from_u16(e.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = (status, Json(json!({ "error": e }))).into_response();
    let headers = response.headers_mut();
    if status == StatusCode::UNAUTHORIZED
        && let Ok(v) = "Bearer realm=\"hypd\"".parse()
    {
        headers.insert(axum::http::header::WWW_AUTHENTICATE, v);
    }
    let retry_after = match e {
        ApiError::RateLimited {
            retry_after_seconds,
            ..
        } => Some(*retry_after_seconds),
        ApiError::Unavailable {
            retry_after_seconds,
            ..
        } => *retry_after_seconds,
        _ => None,
    };
    if let Some(seconds) = retry_after {
        headers.insert(axum::http::header::RETRY_AFTER, seconds.into());
    }
    response
}
