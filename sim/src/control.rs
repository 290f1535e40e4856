//! The control API tests use to steer the world: health, the time scale, injected
//! faults, and a reset. It lives under `/_sim/`, a prefix no AWS API uses.

use axum::Router;
use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Json, Response};
use axum::routing::{delete, get, post};
use serde::Deserialize;
use serde_json::json;

use std::collections::BTreeMap;

use crate::sagemaker::instance_types::InstanceType;
use crate::sagemaker::training_plans::{Offering, OfferingSpec};
use crate::sagemaker::{HealthFault, Recovery};
use crate::world::{AwsError, Fault, Shared};

async fn health() -> Response {
    Json(json!({ "ok": true })).into_response()
}

async fn get_clock(State(state): State<Shared>) -> Response {
    let clock = &state.clock;
    Json(json!({ "time_scale": clock.scale(), "now": clock.now() })).into_response()
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
    let clock = &state.clock;
    clock.set_scale(body.time_scale);
    // Every controller's deadline is real time at the old speed.
    state.kube.wake_all();
    Json(json!({ "time_scale": clock.scale(), "now": clock.now() })).into_response()
}

async fn add_fault(State(state): State<Shared>, Json(fault): Json<Fault>) -> Response {
    let proxied = crate::proxy::PROXIED_SERVICES.contains(&fault.service.as_str());
    let served = ["eks", "sagemaker", "fsx", "servicequotas", "kubernetes"];
    if !proxied && !served.contains(&fault.service.as_str()) {
        return AwsError::invalid_parameter(
            "service must be eks, sagemaker, fsx, servicequotas or kubernetes, or ec2, iam, s3 or sts (forwarded to moto)",
        )
        .into_response();
    }
    if !["eks", "sagemaker", "fsx"].contains(&fault.service.as_str())
        && fault.kind == crate::world::FaultKind::Stuck
    {
        return AwsError::invalid_parameter(
            "stuck applies to eks, sagemaker and fsx; other services' resources have no transitions here",
        )
        .into_response();
    }
    let fails_on = [("eks", "CreateCluster"), ("fsx", "CreateFileSystem")];
    if matches!(fault.kind, crate::world::FaultKind::Fails { .. })
        && !fails_on.contains(&(fault.service.as_str(), fault.operation.as_str()))
    {
        return AwsError::invalid_parameter(
            "fails applies to eks CreateCluster and fsx CreateFileSystem: what they start ends FAILED",
        )
        .into_response();
    }
    if fault.caller.is_some()
        && matches!(
            fault.kind,
            crate::world::FaultKind::Stuck | crate::world::FaultKind::Fails { .. }
        )
    {
        return AwsError::invalid_parameter(
            "caller applies to faults that answer a call; stuck and fails shape what every caller's calls start",
        )
        .into_response();
    }
    let id = state.faults.add(fault);
    // A `stuck` fault holds transitions the controllers may be waiting for.
    state.kube.wake_all();
    Json(json!({ "id": id })).into_response()
}

async fn list_faults(State(state): State<Shared>) -> Response {
    Json(json!({ "faults": state.faults.list() })).into_response()
}

/// `?caller=KEY`: only what that access key's calls did, or the faults scoped to it
/// (tests sharing a world each read and clear their own).
#[derive(Deserialize)]
struct ByCaller {
    caller: Option<String>,
}

impl ByCaller {
    fn holds(&self, caller: Option<&str>) -> bool {
        self.caller.is_none() || self.caller.as_deref() == caller
    }
}

async fn clear_faults(State(state): State<Shared>, Query(by): Query<ByCaller>) -> Response {
    state.faults.retain(|f| !by.holds(f.caller.as_deref()));
    state.kube.wake_all();
    Json(json!({})).into_response()
}

/// The calls the world answered since the log was last cleared, oldest first.
async fn list_calls(State(state): State<Shared>, Query(by): Query<ByCaller>) -> Response {
    let calls = state.calls.list(|c| by.holds(c.caller.as_deref()));
    Json(json!({ "calls": calls })).into_response()
}

async fn clear_calls(State(state): State<Shared>, Query(by): Query<ByCaller>) -> Response {
    state.calls.retain(|c| !by.holds(c.caller.as_deref()));
    Json(json!({})).into_response()
}

async fn remove_fault(State(state): State<Shared>, Path(id): Path<u64>) -> Response {
    state.faults.retain(|f| f.id != id);
    state.kube.wake_all();
    Json(json!({})).into_response()
}

/// Sets HyperPod "cluster usage" quotas per instance type (types not named keep theirs).
async fn set_quotas(
    State(state): State<Shared>,
    Json(quotas): Json<std::collections::BTreeMap<String, u32>>,
) -> Response {
    let mut w = state.aws.lock().await;
    w.sagemaker.quotas.extend(quotas);
    // Managed Karpenter may now add the nodes a quota held back.
    w.kube.wake_all();
    Json(json!({ "quotas": w.sagemaker.quotas })).into_response()
}

/// Adds or replaces rows of the HyperPod instance-type table; a new type gets its
/// default quota unless one is set.
async fn set_instance_types(
    State(state): State<Shared>,
    Json(rows): Json<BTreeMap<String, InstanceType>>,
) -> Response {
    let mut w = state.aws.lock().await;
    for (name, facts) in rows {
        w.sagemaker
            .quotas
            .entry(name.clone())
            .or_insert(facts.default_quota);
        w.sagemaker.instance_types.insert(name, facts);
    }
    // Nodes offer what the table says.
    w.kube.wake_all();
    Json(json!({ "instance_types": w.sagemaker.instance_types })).into_response()
}

/// Replaces the training-plan offerings; each row's start is counted from now.
async fn set_offerings(
    State(state): State<Shared>,
    Json(rows): Json<Vec<OfferingSpec>>,
) -> Response {
    let mut w = state.aws.lock().await;
    let now = w.clock.now();
    w.sagemaker.training_plans.offerings =
        rows.into_iter().map(|o| Offering::new(o, now)).collect();
    Json(json!({ "offerings": w.sagemaker.training_plans.offerings.len() })).into_response()
}

#[derive(Deserialize)]
#[serde(rename_all = "lowercase")]
enum FaultRecovery {
    Reboot,
    Replace,
}

/// The fault the health agent found; what is left out is a GPU fallen off the bus.
#[derive(Deserialize)]
struct NodeFaultBody {
    recovery: FaultRecovery,
    fault_type: Option<String>,
    fault_reason: Option<String>,
    message: Option<String>,
}

/// Whether `v` may be a Kubernetes label value, as the fault's type and reason become
/// Node labels, which the API server would refuse otherwise (non-empty here: the type
/// names a condition too, and an empty reason tells nothing).
fn label_value(v: &str) -> bool {
    let edge = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    v.len() <= 63
        && edge(v.chars().next())
        && edge(v.chars().last())
        && v.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// The recovery a fault body asks for, and the fault, with what it leaves out filled in.
fn fault_of(body: NodeFaultBody) -> Result<(Recovery, HealthFault), AwsError> {
    let recovery = match body.recovery {
        FaultRecovery::Reboot => Recovery::Reboot,
        FaultRecovery::Replace => Recovery::Replace,
    };
    let mut fault = HealthFault::for_recovery(recovery);
    for (given, field, name) in [
        (body.fault_type, &mut fault.fault_type, "fault_type"),
        (body.fault_reason, &mut fault.fault_reason, "fault_reason"),
    ] {
        if let Some(v) = given {
            if !label_value(&v) {
                return Err(AwsError::invalid_parameter(format!(
                    "{name} becomes a Node label value: 1-63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit"
                )));
            }
            *field = v;
        }
    }
    if let Some(m) = body.message {
        fault.message = m;
    }
    Ok((recovery, fault))
}

/// What HyperPod's health-monitoring agent concludes about a node's hardware fault: the
/// node awaits a reboot or replacement, which HyperPod does itself under Automatic
/// NodeRecovery and otherwise leaves to BatchReboot/ReplaceClusterNodes; its Node tells
/// the fault meanwhile.
async fn node_fault(
    State(state): State<Shared>,
    Path((cluster, id)): Path<(String, String)>,
    Json(body): Json<NodeFaultBody>,
) -> Response {
    let (recovery, fault) = match fault_of(body) {
        Ok(found) => found,
        Err(e) => return e.into_response(),
    };
    let answer = json!({ "recovery": recovery.label(), "fault_type": fault.fault_type,
                         "fault_reason": fault.fault_reason, "message": fault.message });
    let mut w = state.aws.lock().await;
    if let Some(eks) = w.sagemaker.orchestrator_of(&cluster) {
        w.kube.wake(&eks);
    }
    match w.mark_node_for_recovery(&cluster, &id, recovery, Some(fault)) {
        Some(true) => Json(answer).into_response(),
        Some(false) => AwsError::new(
            409,
            "ConflictException",
            format!("Node {id} is busy with a reboot, replacement or update"),
        )
        .into_response(),
        None => AwsError::new(
            404,
            "ResourceNotFound",
            format!("Node {id} not found in HyperPod cluster {cluster}"),
        )
        .into_response(),
    }
}

/// Forgets EKS cluster `name`, its node groups, the HyperPod clusters on it and its
/// Kubernetes API server; what moto holds for it stays.
async fn forget_cluster(State(state): State<Shared>, Path(name): Path<String>) -> Response {
    if state.aws.lock().await.forget_eks_cluster(&name) {
        Json(json!({})).into_response()
    } else {
        AwsError::not_found(format!("No cluster found for name: {name}.")).into_response()
    }
}

/// Forgets every resource, fault and call, and starts time from zero again; keeps the
/// time scale and moto.
async fn reset(State(state): State<Shared>) -> Response {
    state.reset().await;
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
        .route("/_sim/calls", get(list_calls).delete(clear_calls))
        .route("/_sim/reset", post(reset))
        .route("/_sim/clusters/{name}", delete(forget_cluster))
        .route("/_sim/sagemaker/quotas", axum::routing::put(set_quotas))
        .route(
            "/_sim/sagemaker/instance-types",
            axum::routing::put(set_instance_types),
        )
        .route(
            "/_sim/sagemaker/training-plan-offerings",
            axum::routing::put(set_offerings),
        )
        .route(
            "/_sim/sagemaker/clusters/{cluster}/nodes/{instance_id}/fault",
            axum::routing::put(node_fault),
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fault(body: serde_json::Value) -> Result<(Recovery, HealthFault), AwsError> {
        fault_of(serde_json::from_value(body).expect("a fault body"))
    }

    #[test]
    fn a_node_fault_fills_in_what_it_leaves_out_by_its_recovery() {
        let (recovery, f) = fault(json!({ "recovery": "replace" })).unwrap();
        assert_eq!(recovery, Recovery::Replace);
        assert_eq!(f, HealthFault::for_recovery(Recovery::Replace));
        let (_, f) = fault(json!({ "recovery": "reboot", "fault_reason": "XidEccError",
                                   "message": "NVRM: Xid 48", "note": "ignored as before" }))
        .unwrap();
        assert_eq!(
            (
                f.fault_type.as_str(),
                f.fault_reason.as_str(),
                f.message.as_str()
            ),
            ("NvidiaErrorReboot", "XidEccError", "NVRM: Xid 48")
        );
        let (_, f) =
            fault(json!({ "recovery": "reboot", "fault_type": "EfaHealthCheckFailure" })).unwrap();
        assert_eq!(f.fault_type, "EfaHealthCheckFailure");
        for bad in ["", "Xid 79", "-Xid", &"x".repeat(64)] {
            let e = fault(json!({ "recovery": "reboot", "fault_type": bad })).unwrap_err();
            assert!(e.message.contains("fault_type"), "{bad}: {}", e.message);
        }
    }
}
