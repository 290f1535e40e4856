//! The state every HTTP handler of the faces is given. Its own module so the routers
//! (REST, the live channel, the console) depend on it, not on each other.

use std::sync::Arc;

use app::ConsoleInfo;
use axum::extract::FromRef;
use leptos::config::LeptosOptions;
use metrics_exporter_prometheus::PrometheusHandle;

use crate::aws::Aws;
use crate::faces::limits::Guard;
use crate::service::Service;
use crate::store::Store;

/// Shared by every handler.
#[derive(Clone)]
pub struct AppState {
    pub service: Arc<Service>,
    pub store: Store,
    pub aws: Arc<Aws>,
    pub openapi: Arc<serde_json::Value>,
    pub metrics: PrometheusHandle,
    pub console: ConsoleInfo,
    pub leptos: LeptosOptions,
    /// Host check, rate limit and body limit, in front of every route.
    pub guard: Guard,
}

impl FromRef<AppState> for LeptosOptions {
    fn from_ref(state: &AppState) -> Self {
        state.leptos.clone()
    }
}
