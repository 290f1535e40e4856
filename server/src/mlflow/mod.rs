//! MLflow for training jobs: `create` makes a cluster's SageMaker managed tracking
//! server; [`Mlflow`] speaks MLflow's REST API at a server's URL, each request signed
//! with SigV4 for `sagemaker-mlflow` as SageMaker requires (a plain MLflow server, as in
//! the test world, ignores the signature). Runs and metrics are MLflow's record: hypd
//! keeps none of them.

pub mod create;

use std::time::SystemTime;

use app::api::ApiError;
use app::api::mlflow::TrackingServer;
use serde_json::{Value, json};

use crate::aws::Aws;

/// SigV4's service name for SageMaker's MLflow.
const SIGNING_NAME: &str = "sagemaker-mlflow";

/// Tracking server `name` of the ARN `arn:aws:sagemaker:<region>:<account>:mlflow-tracking-server/<name>`.
pub fn server_name(arn: &str) -> Option<&str> {
    arn.split_once(":mlflow-tracking-server/").map(|(_, n)| n)
}

/// One metric's point as MLflow stores it.
#[derive(Clone, Debug, PartialEq)]
pub struct Point {
    pub step: i64,
    pub value: f64,
    pub timestamp: i64,
}

/// MLflow's REST API at one tracking server.
pub struct Mlflow<'a> {
    aws: &'a Aws,
    region: String,
    base: String,
}

impl<'a> Mlflow<'a> {
    /// The API of `server`, which must be up (have a URL).
    pub fn of(aws: &'a Aws, region: &str, server: &TrackingServer) -> Result<Self, ApiError> {
        let base = server
            .url
            .as_deref()
            .filter(|_| server.up())
            .ok_or_else(|| {
                ApiError::field(
                    "mlflow_tracking_server",
                    format!(
                        "tracking server {} is {}: its runs can be read once it is up",
                        server.name, server.status
                    ),
                )
            })?;
        Ok(Mlflow {
            aws,
            region: region.to_owned(),
            base: base.trim_end_matches('/').to_owned(),
        })
    }

    fn error(
        &self,
        call: &str,
        code: Option<String>,
        message: String,
        transient: bool,
    ) -> ApiError {
        ApiError::Upstream {
            service: "mlflow".into(),
            call: call.to_owned(),
            code,
            message,
            request_id: None,
            transient,
        }
    }

    /// One call: `None` when MLflow answers RESOURCE_DOES_NOT_EXIST.
    async fn call(
        &self,
        method: &str,
        path: &str,
        query: &[(&str, &str)],
        body: Option<&Value>,
    ) -> Result<Option<Value>, ApiError> {
        use aws_sigv4::http_request::{SignableBody, SignableRequest, SigningSettings, sign};
        let call = path.rsplit("mlflow/").next().unwrap_or(path);
        let mut url = reqwest::Url::parse(&format!("{}{path}", self.base))
            .map_err(|e| ApiError::internal(format!("MLflow URL {}: {e}", self.base)))?;
        url.query_pairs_mut().extend_pairs(query);
        let bytes = body.map(|b| b.to_string().into_bytes()).unwrap_or_default();
        let host = match (url.host_str(), url.port()) {
            (Some(h), Some(p)) => format!("{h}:{p}"),
            (Some(h), None) => h.to_owned(),
            _ => return Err(ApiError::internal(format!("MLflow URL {url} has no host"))),
        };
        let identity = self.aws.signing_identity("MLflow's API").await?;
        let params = aws_sigv4::sign::v4::SigningParams::builder()
            .identity(&identity)
            .region(&self.region)
            .name(SIGNING_NAME)
            .time(SystemTime::now())
            .settings(SigningSettings::default())
            .build()
            .map_err(|e| ApiError::internal(format!("signing an MLflow call: {e}")))?
            .into();
        let headers = [
            ("host", host.as_str()),
            ("content-type", "application/json"),
        ];
        let signable = SignableRequest::new(
            method,
            url.as_str(),
            headers.into_iter(),
            SignableBody::Bytes(&bytes),
        )
        .map_err(|e| ApiError::internal(format!("signing an MLflow call: {e}")))?;
        let (instructions, _) = sign(signable, &params)
            .map_err(|e| ApiError::internal(format!("signing an MLflow call: {e}")))?
            .into_parts();
        let mut request = http::Request::builder()
            .method(method)
            .uri(url.as_str())
            .header("content-type", "application/json")
            .body(bytes)
            .map_err(|e| ApiError::internal(format!("an MLflow call: {e}")))?;
        instructions.apply_to_request_http1x(&mut request);
        let request = reqwest::Request::try_from(request)
            .map_err(|e| ApiError::internal(format!("an MLflow call: {e}")))?;
        let response = http_client()
            .execute(request)
            .await
            .map_err(|e| self.error(call, None, format!("{}: {e}", self.base), true))?;
        let status = response.status();
        let text = response
            .text()
            .await
            .map_err(|e| self.error(call, None, e.to_string(), true))?;
        let answer: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        if status.is_success() {
            return Ok(Some(answer));
        }
        let code = answer["error_code"].as_str().map(str::to_owned);
        if code.as_deref() == Some("RESOURCE_DOES_NOT_EXIST") {
            return Ok(None);
        }
        let message = answer["message"]
            .as_str()
            .map_or_else(|| format!("HTTP {status}: {text:.200}"), str::to_owned);
        Err(self.error(
            call,
            code,
            message,
            status.is_server_error() || status.as_u16() == 429,
        ))
    }

    /// The id of experiment `name`, if it exists.
    pub async fn experiment_id(&self, name: &str) -> Result<Option<String>, ApiError> {
        Ok(self
            .call(
                "GET",
                "/api/2.0/mlflow/experiments/get-by-name",
                &[("experiment_name", name)],
                None,
            )
            .await?
            .and_then(|a| a["experiment"]["experiment_id"].as_str().map(str::to_owned)))
    }

    /// The runs of experiment `experiment` whose tags are all of `tags`, oldest first.
    pub async fn runs(
        &self,
        experiment: &str,
        tags: &[(&str, &str)],
    ) -> Result<Vec<Value>, ApiError> {
        let filter = tags
            .iter()
            .map(|(k, v)| format!("tags.`{k}` = '{}'", v.replace('\'', "\\'")))
            .collect::<Vec<_>>()
            .join(" and ");
        let mut runs = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let mut body = json!({
                "experiment_ids": [experiment],
                "filter": filter,
                "max_results": 1000,
                "order_by": ["attributes.start_time ASC"],
            });
            if let Some(t) = &token {
                body["page_token"] = json!(t);
            }
            let page = self
                .call("POST", "/api/2.0/mlflow/runs/search", &[], Some(&body))
                .await?
                .unwrap_or(Value::Null);
            runs.extend(page["runs"].as_array().into_iter().flatten().cloned());
            token = page["next_page_token"]
                .as_str()
                .filter(|t| !t.is_empty())
                .map(str::to_owned);
            if token.is_none() {
                return Ok(runs);
            }
        }
    }

    /// Every point of metric `key` of run `run`, by step.
    pub async fn history(&self, run: &str, key: &str) -> Result<Vec<Point>, ApiError> {
        let mut points = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let mut query = vec![
                ("run_id", run),
                ("metric_key", key),
                ("max_results", "25000"),
            ];
            if let Some(t) = &token {
                query.push(("page_token", t));
            }
            let page = self
                .call("GET", "/api/2.0/mlflow/metrics/get-history", &query, None)
                .await?
                .unwrap_or(Value::Null);
            points.extend(
                page["metrics"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|m| Point {
                        step: m["step"].as_i64().unwrap_or(0),
                        value: m["value"].as_f64().unwrap_or(f64::NAN),
                        timestamp: m["timestamp"].as_i64().unwrap_or(0),
                    }),
            );
            token = page["next_page_token"]
                .as_str()
                .filter(|t| !t.is_empty())
                .map(str::to_owned);
            if token.is_none() {
                break;
            }
        }
        points.sort_by_key(|p| (p.step, p.timestamp));
        Ok(points)
    }

    /// Sets tag `key` of run `run`.
    pub async fn set_tag(&self, run: &str, key: &str, value: &str) -> Result<(), ApiError> {
        self.call(
            "POST",
            "/api/2.0/mlflow/runs/set-tag",
            &[],
            Some(&json!({ "run_id": run, "key": key, "value": value })),
        )
        .await
        .map(|_| ())
    }

    /// The UI's page of run `run` of experiment `experiment`.
    pub fn run_link(&self, experiment: &str, run: &str) -> String {
        format!("{}/#/experiments/{experiment}/runs/{run}", self.base)
    }

    /// The UI's page of experiment `experiment`.
    pub fn experiment_link(&self, experiment: &str) -> String {
        format!("{}/#/experiments/{experiment}", self.base)
    }
}

/// One client for every MLflow call: its connections are reused.
fn http_client() -> &'static reqwest::Client {
    static CLIENT: std::sync::LazyLock<reqwest::Client> = std::sync::LazyLock::new(|| {
        reqwest::Client::builder()
            .timeout(std::time::Duration::from_secs(20))
            .build()
            .expect("a reqwest client builds")
    });
    &CLIENT
}

/// Every `max` points at most, evenly spaced, the first and the last kept.
pub fn thin(points: Vec<Point>, max: usize) -> Vec<Point> {
    if points.len() <= max || max < 2 {
        return points;
    }
    let last = points.len() - 1;
    (0..max)
        .map(|i| points[i * last / (max - 1)].clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thinning_keeps_the_ends_and_spaces_the_rest() {
        let points: Vec<Point> = (0..1000)
            .map(|i| Point {
                step: i,
                value: i as f64,
                timestamp: i,
            })
            .collect();
        let thinned = thin(points.clone(), 5);
        let steps: Vec<i64> = thinned.iter().map(|p| p.step).collect();
        assert_eq!(steps, [0, 249, 499, 749, 999]);
        assert_eq!(thin(points[..3].to_vec(), 5).len(), 3);
        assert_eq!(
            server_name("arn:aws:sagemaker:us-east-1:123:mlflow-tracking-server/ml-1-mlflow"),
            Some("ml-1-mlflow")
        );
    }
}
