//! `invoke_endpoint`: one OpenAI-style chat completion, sent to the endpoint's Service (or
//! the inference operator's router) through the cluster's API server
//! (`services/<name>:<port>/proxy`), so it needs no
//! port-forward and no public address, and is authorised by the same credentials as
//! every other call hypd makes to the cluster. An endpoint with no ready replica is
//! never "not found": while it wakes the answer is unavailable with a `Retry-After`
//! drawn from its measured cold start, so a client that retries gets its answer. One
//! that KEDA scaled to zero behind the SGLang router is sent the request all the same:
//! the router holds it, which is what wakes a worker, and the answer comes once one is
//! ready, or, past [`wake_wait`], the same `Retry-After`.

use std::time::{Duration, Instant};

use app::api::ApiError;
use app::api::inference::{Invocation, InvokeEndpoint};
use http_body_util::BodyExt;
use serde_json::{Value, json};

use super::workload::ROUTER_ANNOTATION;
use crate::auth::Actor;
use crate::resources::kube::keda::ScaledObject;
use crate::resources::kube::{self as kubernetes};
use crate::service::{Handler, Service};
use crate::storage::region_of;

/// The wait suggested while a replica starts and its cold start was never measured.
const DEFAULT_RETRY_SECONDS: u64 = 10;
/// The least an invocation of an endpoint waking from zero waits for its answer (the
/// router holds it meanwhile) before the caller is told to come back.
const WAKE_WAIT: Duration = Duration::from_secs(60);
/// The most: the longest the router holds a request.
const LONGEST_WAKE_WAIT: Duration = Duration::from_secs(600);

/// How long an invocation of an endpoint waking from zero waits: KEDA's next look at
/// the router, then a worker's cold start, with as much again as a margin. Dropped
/// sooner, the request would leave the gauge KEDA reads before KEDA had looked, and an
/// endpoint with a long polling interval would never be woken by hypd's invocations.
fn wake_wait(scaler: &ScaledObject, cold_start: Option<f64>) -> Duration {
    let polling = scaler.spec["pollingInterval"].as_u64().unwrap_or(30);
    let cold = cold_start.map_or(DEFAULT_RETRY_SECONDS, |s| s.ceil() as u64);
    Duration::from_secs(polling + 2 * cold).clamp(WAKE_WAIT, LONGEST_WAKE_WAIT)
}

/// What to tell a caller of endpoint `live` that has no ready replica; `wakes` when KEDA
/// scales it from zero on the requests its router holds.
fn waking(live: &super::Live, endpoint: &str, wakes: bool) -> ApiError {
    let retry = live
        .cold_start_seconds()
        .map_or(DEFAULT_RETRY_SECONDS, |s| (s.ceil() as u64).clamp(1, 600));
    if wakes && live.replicas() == 0 {
        return ApiError::Unavailable {
            message: format!(
                "{endpoint} is scaled to zero and waking: its router holds requests while KEDA starts a worker; try again in {retry} s"
            ),
            retry_after_seconds: Some(retry),
        };
    }
    if live.replicas() == 0 {
        return ApiError::Unavailable {
            message: format!(
                "{endpoint} is scaled to zero: scale_endpoint it to 1 or more replicas to serve"
            ),
            retry_after_seconds: None,
        };
    }
    let why = live
        .waiting()
        .map(|w| format!(" ({w})"))
        .unwrap_or_default();
    ApiError::Unavailable {
        message: format!(
            "{endpoint} is waking: 0 of {} replicas ready{why}; try again in {retry} s",
            live.replicas()
        ),
        retry_after_seconds: Some(retry),
    }
}

/// The model server's own error message, from OpenAI's error shape or FastAPI's.
fn server_message(body: &Value, raw: &[u8]) -> String {
    body["message"]
        .as_str()
        .or_else(|| body["error"]["message"].as_str())
        .or_else(|| body["detail"].as_str())
        .map(str::to_owned)
        .unwrap_or_else(|| String::from_utf8_lossy(&raw[..raw.len().min(512)]).into_owned())
}

impl Handler<InvokeEndpoint> for Service {
    async fn handle(&self, _: &Actor, r: InvokeEndpoint) -> Result<Invocation, ApiError> {
        let cluster = r.name.as_str();
        let endpoint = r.endpoint.as_str();
        let region = region_of(&self.store, cluster).await?;
        let client = kubernetes::connect(&self.aws, &region, cluster).await?;
        // What hypd applied alone says where to send and what to ask for; the pods are
        // read only when the API server finds no ready one (the endpoint is waking).
        let record = super::record(&client, endpoint)
            .await?
            .ok_or_else(|| ApiError::NotFound {
                resource: format!("endpoint of {cluster}"),
                name: endpoint.to_owned(),
            })?;
        let live = super::Live {
            record,
            pods: Vec::new(),
            service: None,
            scaler: None,
        };
        // At zero, an endpoint whose KEDA may scale it from zero is woken by a request
        // its router holds: send it; any other waits for a scale_endpoint.
        let wakes = if live.replicas() == 0 && live.annotation(ROUTER_ANNOTATION).is_some() {
            super::router::scaler(&client, endpoint)
                .await?
                .filter(|s| super::router::state(s).min_replicas == 0)
                .map(|s| wake_wait(&s, live.cold_start_seconds()))
        } else {
            None
        };
        if live.replicas() == 0 && wakes.is_none() {
            return Err(waking(&live, endpoint, false));
        }
        // A pool is asked for one of its models, through that model's Service.
        let model = match (live.is_pool(), &r.model) {
            (true, None) => {
                return Err(ApiError::field(
                    "model",
                    format!(
                        "{endpoint} is a model pool: name one of its models ({})",
                        live.pool_models().join(", ")
                    ),
                ));
            }
            (true, Some(m)) if !live.pool_models().iter().any(|n| n == m.as_str()) => {
                return Err(ApiError::field(
                    "model",
                    format!(
                        "the workers of {endpoint} serve {}, not {m}",
                        live.pool_models().join(", ")
                    ),
                ));
            }
            (_, Some(m)) => m.to_string(),
            (false, None) => live.summary(cluster).model,
        };
        let mut body = json!({ "model": model, "messages": r.messages });
        if let Some(n) = r.max_tokens {
            body["max_tokens"] = json!(n);
        }
        let (namespace, service) = live.invocation_target(&model);
        let at = live.invocation_path();
        let path = format!("/api/v1/namespaces/{namespace}/services/{service}/proxy/{at}");
        let request = http::Request::post(&path)
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(kube::client::Body::from(
                serde_json::to_vec(&body).map_err(ApiError::internal)?,
            ))
            .map_err(ApiError::internal)?;
        let call = format!("POST services/{service}/proxy/{at}");
        let started = Instant::now();
        let exchange = async {
            let response = client
                .send(request)
                .await
                .map_err(|e| kubernetes::upstream(&call, e))?;
            let status = response.status();
            let raw = response
                .into_body()
                .collect()
                .await
                .map_err(|e| kubernetes::upstream(&call, e))?
                .to_bytes();
            Ok::<_, ApiError>((status, raw))
        };
        let (status, raw) = if let Some(wait) = wakes {
            match tokio::time::timeout(wait, exchange).await {
                Ok(done) => done?,
                Err(_) => return Err(waking(&live, endpoint, true)),
            }
        } else {
            exchange.await?
        };
        let latency_ms = started.elapsed().as_millis() as u64;
        let answer: Value = serde_json::from_slice(&raw).unwrap_or(Value::Null);
        // No worker of the pool is bound to the model (its Service has no endpoint, or
        // none was ever made): binding some is the remedy, not waiting.
        let unreached = matches!(status.as_u16(), 404 | 503) && answer["kind"] == "Status";
        if live.is_pool() && unreached {
            return Err(ApiError::Unavailable {
                message: format!(
                    "no ready worker of pool {endpoint} is bound to {model}: bind some with assign_pool_workers"
                ),
                retry_after_seconds: None,
            });
        }
        // The API server found no ready replica after all (one stopped in between), or
        // the router held the request as long as it may and found none.
        let unserved =
            answer["kind"] == "Status" || answer["error"]["code"] == "no_available_workers";
        if status == http::StatusCode::SERVICE_UNAVAILABLE && unserved {
            return Err(waking(
                &super::required(&client, cluster, endpoint).await?,
                endpoint,
                wakes.is_some(),
            ));
        }
        if !status.is_success() {
            return Err(ApiError::Upstream {
                service: "model-server".into(),
                call,
                code: Some(status.as_u16().to_string()),
                message: server_message(&answer, &raw),
                request_id: None,
                transient: status.is_server_error() || status.as_u16() == 429,
            });
        }
        let choice = &answer["choices"][0];
        let text = choice["message"]["content"]
            .as_str()
            .ok_or_else(|| ApiError::Upstream {
                service: "model-server".into(),
                call: call.clone(),
                code: None,
                message: format!(
                    "the answer is not a chat completion: {}",
                    String::from_utf8_lossy(&raw[..raw.len().min(256)])
                ),
                request_id: None,
                transient: false,
            })?;
        Ok(Invocation {
            endpoint: endpoint.to_owned(),
            model: answer["model"].as_str().unwrap_or(&model).to_owned(),
            answer: text.to_owned(),
            finish_reason: choice["finish_reason"].as_str().map(str::to_owned),
            prompt_tokens: answer["usage"]["prompt_tokens"].as_u64().unwrap_or(0),
            completion_tokens: answer["usage"]["completion_tokens"].as_u64().unwrap_or(0),
            latency_ms,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_waking_invocation_outlasts_kedas_next_look_and_a_cold_start() {
        let scaler = |polling: u64| {
            ScaledObject::new(Default::default(), json!({ "pollingInterval": polling }))
        };
        assert_eq!(wake_wait(&scaler(5), Some(20.3)), WAKE_WAIT);
        assert_eq!(
            wake_wait(&scaler(300), Some(20.3)),
            Duration::from_secs(342)
        );
        assert_eq!(wake_wait(&scaler(3600), None), LONGEST_WAKE_WAIT);
    }
}
