//! AWS Service Quotas (JSON 1.1, `X-Amz-Target: ServiceQuotasV20190624.<Op>`) for the
//! SageMaker "<type> for cluster usage" quotas, read from the same table HyperPod's
//! CreateCluster enforces (`PUT /_sim/sagemaker/quotas` changes both).

use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::world::{AwsError, Shared, region_of};

pub const TARGET_PREFIX: &str = "ServiceQuotasV20190624.";

/// The quota's name as the Service Quotas console shows it.
fn quota_name(instance_type: &str) -> String {
    format!("{instance_type} for cluster usage")
}

/// A stable quota code per name (real codes are opaque `L-` + 8 hex digits).
fn quota_code(name: &str) -> String {
    let h = name.bytes().fold(0x811c_9dc5_u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    });
    format!("L-{h:08X}")
}

fn quota_json(region: &str, instance_type: &str, value: u32) -> Value {
    let name = quota_name(instance_type);
    let code = quota_code(&name);
    json!({
        "ServiceCode": "sagemaker",
        "ServiceName": "Amazon SageMaker",
        "QuotaArn": format!("arn:aws:servicequotas:{region}:123456789012:sagemaker/{code}"),
        "QuotaCode": code,
        "QuotaName": name,
        "Value": f64::from(value),
        "Unit": "None",
        "Adjustable": true,
        "GlobalQuota": false,
    })
}

pub async fn dispatch(State(state): State<Shared>, headers: HeaderMap, body: Bytes) -> Response {
    let op = headers
        .get("x-amz-target")
        .and_then(|v| v.to_str().ok())
        .and_then(|t| t.strip_prefix(TARGET_PREFIX))
        .unwrap_or_default()
        .to_owned();
    let region = region_of(&headers);
    let body: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => {
            return AwsError::new(
                400,
                "IllegalArgumentException",
                format!("invalid JSON: {e}"),
            )
            .into_response();
        }
    };
    if let Some(e) = crate::world::injected(&state, "servicequotas", &op)
        .await
        .and_then(crate::world::aws_error)
    {
        return e.into_response();
    }
    let w = state.aws.lock().await;
    let service = body["ServiceCode"].as_str().unwrap_or_default();
    if service != "sagemaker" {
        return AwsError::new(
            400,
            "NoSuchResourceException",
            format!("hypd-sim serves Service Quotas for sagemaker only, not {service:?}"),
        )
        .into_response();
    }
    let all: Vec<Value> = w
        .sagemaker
        .quotas
        .iter()
        .map(|(t, v)| quota_json(&region, t, *v))
        .collect();
    let result = match op.as_str() {
        "ListServiceQuotas" => {
            let max = body["MaxResults"].as_u64().unwrap_or(100).clamp(1, 100) as usize;
            let start: usize = body["NextToken"]
                .as_str()
                .and_then(|t| t.parse().ok())
                .unwrap_or(0);
            let page: Vec<Value> = all.iter().skip(start).take(max).cloned().collect();
            let mut out = json!({ "Quotas": page });
            if start + max < all.len() {
                out["NextToken"] = json!((start + max).to_string());
            }
            Ok(out)
        }
        "GetServiceQuota" => {
            let code = body["QuotaCode"].as_str().unwrap_or_default();
            all.into_iter()
                .find(|q| q["QuotaCode"] == code)
                .map(|q| json!({ "Quota": q }))
                .ok_or_else(|| {
                    AwsError::new(
                        400,
                        "NoSuchResourceException",
                        format!(
                            "The request failed because the specified quota {code} does not exist."
                        ),
                    )
                })
        }
        other => Err(AwsError::new(
            400,
            "UnknownOperationException",
            format!("hypd-sim does not implement Service Quotas {other}"),
        )),
    };
    match result {
        Ok(v) => axum::Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_stable_and_distinct() {
        let a = quota_code(&quota_name("ml.p5.48xlarge"));
        assert_eq!(a, quota_code(&quota_name("ml.p5.48xlarge")));
        assert_ne!(a, quota_code(&quota_name("ml.g5.8xlarge")));
        assert!(a.starts_with("L-") && a.len() == 10);
    }
}
