//! The SGLang router (SGLang Model Gateway) in front of an endpoint's SGLang workers, and
//! the KEDA ScaledObject that sizes the workers on the requests in flight at it. Pure:
//! the same request gives the same objects, so the dry run shows what the steps apply.
//!
//! The router finds the workers by the endpoint's label through the Kubernetes API
//! (its own ServiceAccount may only read pods), so a worker KEDA adds is routed to as
//! soon as it is Ready, with no restart. Its pods carry a label of their own
//! ([`ROUTER_LABEL`]), never the workers', or it would discover itself and the
//! endpoint's reads would count it as a replica. It answers `/liveness` whatever the
//! workers do: a router that went unready with its workers would take the endpoint's
//! Service down with them and turn a retryable 503 into "no endpoints".
//!
//! KEDA reads the router's Prometheus endpoint itself (`metrics-api`, format prometheus):
//! a cluster needs no Prometheus server for it. The gauge is the gateway's active HTTP
//! connections, which is the requests in flight through it: one number for the whole
//! endpoint, where the per-worker gauges change names with every pod.

use app::api::ApiError;
use app::api::inference::{
    Autoscaling, AutoscalingState, DeployModelServer, ENDPOINT_LABEL, NAMESPACE, ReplicaChange,
    Serve, SglangRouter,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Event, Service, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::ListParams;
use serde_json::{Value, json};

use crate::resources::converge;
use crate::resources::kube::keda::ScaledObject;
use crate::resources::kube::object::Applied;
use crate::resources::kube::{self as kubernetes};
use crate::resources::tags::K8S_MANAGED_BY;

/// The label on the router's Deployment, pods and Services: the endpoint's name.
pub const ROUTER_LABEL: &str = "hypd.dev/endpoint-router";
/// The port the router serves its Prometheus metrics on.
pub const METRICS_PORT: u16 = 29000;
/// The gateway's gauge of requests in flight through it.
pub const IN_FLIGHT_METRIC: &str = "smg_http_connections_active";
/// The trigger's name in the ScaledObject (and so in the HPA's metric name).
const TRIGGER: &str = "router-requests";

/// The name every router object of endpoint `endpoint` has.
pub fn name(endpoint: &str) -> String {
    format!("{endpoint}-router")
}

/// The HPA KEDA drives for endpoint `endpoint`: named, so its events can be found.
pub fn hpa_name(endpoint: &str) -> String {
    format!("keda-hpa-{endpoint}")
}

fn labels(endpoint: &str) -> Value {
    json!({ ROUTER_LABEL: endpoint, K8S_MANAGED_BY.0: K8S_MANAGED_BY.1 })
}

fn metadata(endpoint: &str) -> Value {
    json!({ "name": name(endpoint), "namespace": NAMESPACE, "labels": labels(endpoint) })
}

/// The first wait of the router's retries while it holds a request at zero workers, how
/// it grows, and its longest: a worker that became ready is found within five seconds.
const HOLD_FIRST_MS: f64 = 1000.0;
const HOLD_MULTIPLIER: f64 = 1.5;
const HOLD_LONGEST_MS: f64 = 5000.0;
/// SMG's default jitter: each wait may be this much shorter, so the count of retries is
/// reckoned on the shortest waits.
const SMG_JITTER: f64 = 0.2;
/// The longest a request is held: past it a client is better told 503 and to retry.
const LONGEST_HOLD_SECONDS: u32 = 600;

/// How long the router holds a request while no worker runs, for an endpoint that may
/// scale to zero: KEDA's next look, then a worker's cold start, which the cooldown is
/// at least as long as (the rule the `autoscaling` stage holds it to). None for one
/// that never does: SMG's own short retries stand.
pub fn hold_seconds(scaling: &Autoscaling) -> Option<u32> {
    (scaling.min_replicas.get() == 0).then(|| {
        (scaling.polling_interval_seconds.get() + scaling.cooldown_seconds.get())
            .min(LONGEST_HOLD_SECONDS)
    })
}

/// The waits that hold a request for at least `seconds` on SMG's backoff (each wait
/// `HOLD_MULTIPLIER` times the last, up to `HOLD_LONGEST_MS`, shortened by jitter).
fn hold_retries(seconds: u32) -> u32 {
    let goal = f64::from(seconds) * 1000.0;
    let (mut held, mut wait, mut retries) = (0.0, HOLD_FIRST_MS, 0);
    while held < goal {
        held += wait * (1.0 - SMG_JITTER);
        wait = (wait * HOLD_MULTIPLIER).min(HOLD_LONGEST_MS);
        retries += 1;
    }
    retries
}

/// The router's command line: discovery by the workers' label on their port, the policy
/// with its thresholds, metrics on every interface (KEDA reads them from another pod),
/// and, for an endpoint that may scale to zero, retries that hold a request while KEDA
/// wakes a worker: SMG retries a request that found no worker (its 503 is retryable),
/// and a request held so counts in the gauge KEDA reads, which is what wakes it.
pub fn args(
    router: &SglangRouter,
    endpoint: &str,
    port: u16,
    scaling: Option<&Autoscaling>,
) -> Vec<String> {
    let mut words: Vec<String> = [
        "python3",
        "-m",
        "sglang_router.launch_router",
        "--host",
        "0.0.0.0",
        "--port",
        &port.to_string(),
        "--service-discovery",
        "--selector",
        &format!("{ENDPOINT_LABEL}={endpoint}"),
        "--service-discovery-namespace",
        NAMESPACE,
        "--service-discovery-port",
        &port.to_string(),
        "--policy",
        router.policy.as_str(),
    ]
    .iter()
    .map(|w| (*w).to_owned())
    .collect();
    if let Some(c) = router.cache_aware() {
        words.extend([
            "--cache-threshold".to_owned(),
            c.cache_threshold.to_string(),
            "--balance-abs-threshold".to_owned(),
            c.balance_abs_threshold.to_string(),
            "--balance-rel-threshold".to_owned(),
            c.balance_rel_threshold.to_string(),
            "--eviction-interval-secs".to_owned(),
            c.eviction_interval_seconds.to_string(),
            "--max-tree-size".to_owned(),
            c.max_tree_size.to_string(),
        ]);
    }
    if let Some(seconds) = scaling.and_then(hold_seconds) {
        // SMG's "max retries" counts attempts: the first one plus each retry.
        words.extend([
            "--retry-max-retries".to_owned(),
            (hold_retries(seconds) + 1).to_string(),
            "--retry-initial-backoff-ms".to_owned(),
            HOLD_FIRST_MS.to_string(),
            "--retry-max-backoff-ms".to_owned(),
            HOLD_LONGEST_MS.to_string(),
            "--retry-backoff-multiplier".to_owned(),
            HOLD_MULTIPLIER.to_string(),
        ]);
    }
    words.extend([
        "--prometheus-host".to_owned(),
        "0.0.0.0".to_owned(),
        "--prometheus-port".to_owned(),
        METRICS_PORT.to_string(),
    ]);
    words
}

/// Scaling to zero is allowed only with a cooldown at least as long as the endpoint's
/// cold start (its pods' scheduling to readiness, measured by the `ready` stage): a
/// shorter one would let KEDA take the last worker away sooner than one takes to come
/// back, and the router would hold requests for nothing.
pub fn cooldown_outlasts(
    endpoint: &str,
    scaling: &Autoscaling,
    cold_start: Option<f64>,
) -> Result<(), ApiError> {
    if scaling.min_replicas.get() > 0 {
        return Ok(());
    }
    let cooldown = scaling.cooldown_seconds.get();
    match cold_start {
        Some(took) if f64::from(cooldown) >= took => Ok(()),
        Some(took) => Err(ApiError::field(
            "autoscaling.cooldown_seconds",
            format!(
                "scaling to zero needs a cooldown at least as long as the endpoint's cold start: {endpoint}'s workers took {took:.1} s from scheduled to ready, and the cooldown is {cooldown} s; delete_endpoint and deploy it again with cooldown_seconds {} or more, or with min_replicas 1",
                took.ceil() as u64
            ),
        )),
        None => Err(ApiError::field(
            "autoscaling.min_replicas",
            format!(
                "{endpoint}'s cold start could not be measured (no worker reports when it was scheduled and became ready), so a cooldown cannot be checked against it: deploy with min_replicas 1"
            ),
        )),
    }
}

/// What the router runs as: a ServiceAccount that may read the namespace's pods and
/// nothing else.
pub fn access(endpoint: &str) -> Result<(ServiceAccount, Role, RoleBinding), ApiError> {
    let account =
        json!({ "apiVersion": "v1", "kind": "ServiceAccount", "metadata": metadata(endpoint) });
    let role = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": metadata(endpoint),
        "rules": [{ "apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"] }],
    });
    let binding = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": metadata(endpoint),
        "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name(endpoint) },
        "subjects": [{ "kind": "ServiceAccount", "name": name(endpoint), "namespace": NAMESPACE }],
    });
    Ok((
        serde_json::from_value(account).map_err(ApiError::internal)?,
        serde_json::from_value(role).map_err(ApiError::internal)?,
        serde_json::from_value(binding).map_err(ApiError::internal)?,
    ))
}

/// The router's Deployment: one replica of the workers' image (which ships the router),
/// on CPU, probed on `/liveness`.
pub fn deployment(
    r: &DeployModelServer,
    router: &SglangRouter,
    serve: &Serve,
    operation: &str,
) -> Result<Deployment, ApiError> {
    let endpoint = r.endpoint.as_str();
    let image = r
        .image()
        .ok_or_else(|| ApiError::field("image", "a custom server names its image"))?;
    let probe = |period: i32| json!({ "httpGet": { "path": "/liveness", "port": "http" }, "periodSeconds": period });
    let mut meta = metadata(endpoint);
    meta["annotations"] = json!({ super::workload::OPERATION_ANNOTATION: operation });
    let object = json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta,
        "spec": {
            "replicas": 1,
            "selector": { "matchLabels": { ROUTER_LABEL: endpoint } },
            "template": {
                "metadata": { "labels": labels(endpoint) },
                "spec": {
                    "serviceAccountName": name(endpoint),
                    "containers": [{
                        "name": "router",
                        "image": image,
                        "command": args(router, endpoint, serve.port, r.autoscaling.as_ref()),
                        "ports": [
                            { "name": "http", "containerPort": serve.port },
                            { "name": "metrics", "containerPort": METRICS_PORT },
                        ],
                        "resources": { "requests": { "cpu": "1", "memory": "2Gi" } },
                        "readinessProbe": probe(5),
                        "livenessProbe": probe(30),
                    }],
                },
            },
        },
    });
    serde_json::from_value(object).map_err(ApiError::internal)
}

/// The in-cluster Service KEDA reads the router's metrics through (never the
/// endpoint's own, which may be an internet-facing load balancer).
pub fn metrics_service(endpoint: &str) -> Result<Service, ApiError> {
    let object = json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(endpoint),
        "spec": {
            "type": "ClusterIP",
            "selector": { ROUTER_LABEL: endpoint },
            "ports": [{ "name": "metrics", "port": METRICS_PORT, "targetPort": "metrics", "protocol": "TCP" }],
        },
    });
    serde_json::from_value(object).map_err(ApiError::internal)
}

/// The longest stabilization window an HPA takes (its API refuses more): a longer
/// cooldown still times KEDA's step to zero, but the steps above the minimum wait at
/// most this long.
const LONGEST_HPA_WINDOW: u32 = 3600;

/// The ScaledObject: the workers' Deployment between the bounds, on the router's
/// requests in flight per replica. The cooldown is also the HPA's scale-down window,
/// which is what governs every step down while the minimum is above zero (KEDA's own
/// cooldownPeriod only times the last step to zero).
pub fn scaled_object(r: &DeployModelServer) -> Option<ScaledObject> {
    let scaling = r.autoscaling.as_ref()?;
    let endpoint = r.endpoint.as_str();
    let url = format!(
        "http://{}.{NAMESPACE}.svc.cluster.local:{METRICS_PORT}/metrics",
        name(endpoint)
    );
    let metadata = serde_json::from_value(json!({
        "name": endpoint,
        "namespace": NAMESPACE,
        "labels": { ENDPOINT_LABEL: endpoint, K8S_MANAGED_BY.0: K8S_MANAGED_BY.1 },
    }))
    .ok()?;
    let mut spec = json!({
        "scaleTargetRef": { "apiVersion": "apps/v1", "kind": "Deployment", "name": endpoint },
        "minReplicaCount": scaling.min_replicas.get(),
        "maxReplicaCount": scaling.max_replicas.get(),
        "pollingInterval": scaling.polling_interval_seconds.get(),
        "cooldownPeriod": scaling.cooldown_seconds.get(),
        "advanced": { "horizontalPodAutoscalerConfig": {
            "name": hpa_name(endpoint),
            "behavior": { "scaleDown": { "stabilizationWindowSeconds": scaling.cooldown_seconds.get().min(LONGEST_HPA_WINDOW) } },
        } },
        "triggers": [{
            "type": "metrics-api",
            "name": TRIGGER,
            "metricType": "AverageValue",
            "metadata": {
                "url": url,
                "format": "prometheus",
                "valueLocation": IN_FLIGHT_METRIC,
                "targetValue": scaling.target_requests_per_replica.get().to_string(),
                "activationTargetValue": scaling.activation_requests.to_string(),
            },
        }],
    });
    if let Some(rate) = &scaling.request_rate
        && let Some(triggers) = spec["triggers"].as_array_mut()
    {
        triggers.push(super::prometheus::trigger(endpoint, rate));
    }
    // KEDA takes a ScaledObject that was never active to zero at its first look unless
    // told to wait: a new endpoint keeps its workers for one cooldown, as one that
    // served would.
    if scaling.min_replicas.get() == 0 {
        spec["initialCooldownPeriod"] = json!(scaling.cooldown_seconds.get());
    }
    Some(ScaledObject::new(metadata, spec))
}

/// The ScaledObject hypd made for endpoint `endpoint`, if any (none where KEDA is not
/// installed: the kind is not served, and a read of it is a 404 like a missing object).
pub async fn scaler(
    client: &kube::Client,
    endpoint: &str,
) -> Result<Option<ScaledObject>, ApiError> {
    let api = Api::<ScaledObject>::namespaced(client.clone(), NAMESPACE);
    Ok(kubernetes::get(&api, endpoint)
        .await?
        .filter(|s| super::labelled_by(&s.metadata, ENDPOINT_LABEL, endpoint)))
}

/// Endpoint `endpoint`'s ScaledObject and router objects deleted, those hypd made
/// (labelled with the endpoint): a Deployment of the user's that happens to be named
/// `<endpoint>-router` stays.
pub async fn remove(client: &kube::Client, endpoint: &str) -> Result<(), ApiError> {
    let named = || ObjectMeta {
        name: Some(name(endpoint)),
        namespace: Some(NAMESPACE.to_owned()),
        ..ObjectMeta::default()
    };
    if scaler(client, endpoint).await?.is_some() {
        let mut meta = named();
        meta.name = Some(endpoint.to_owned());
        converge(&Applied::namespaced(client, ScaledObject::new(meta, Value::Null)).absent())
            .await?;
    }
    super::prometheus::remove(client, endpoint).await?;
    let deployments = Api::<Deployment>::namespaced(client.clone(), NAMESPACE);
    let ours = kubernetes::get(&deployments, &name(endpoint))
        .await?
        .is_some_and(|d| super::labelled_by(&d.metadata, ROUTER_LABEL, endpoint));
    if !ours {
        return Ok(());
    }
    converge(
        &Applied::namespaced(
            client,
            Deployment {
                metadata: named(),
                ..Deployment::default()
            },
        )
        .absent(),
    )
    .await?;
    converge(
        &Applied::namespaced(
            client,
            Service {
                metadata: named(),
                ..Service::default()
            },
        )
        .absent(),
    )
    .await?;
    converge(
        &Applied::namespaced(
            client,
            RoleBinding {
                metadata: named(),
                ..RoleBinding::default()
            },
        )
        .absent(),
    )
    .await?;
    converge(
        &Applied::namespaced(
            client,
            Role {
                metadata: named(),
                ..Role::default()
            },
        )
        .absent(),
    )
    .await?;
    converge(
        &Applied::namespaced(
            client,
            ServiceAccount {
                metadata: named(),
                ..ServiceAccount::default()
            },
        )
        .absent(),
    )
    .await?;
    Ok(())
}

/// A ScaledObject's bounds, target and KEDA's word on it.
pub fn state(scaler: &ScaledObject) -> AutoscalingState {
    let spec = &scaler.spec;
    let number = |v: &Value| {
        v.as_u64()
            .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
            .unwrap_or(0) as u32
    };
    let condition = |kind: &str| {
        scaler.status["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["type"] == kind)
            .cloned()
    };
    let active = condition("Active").and_then(|c| match c["status"].as_str() {
        Some("True") => Some(true),
        Some("False") => Some(false),
        _ => None,
    });
    let problem = condition("Ready")
        .filter(|c| c["status"] == "False")
        .map(|c| {
            c["message"]
                .as_str()
                .unwrap_or("KEDA reports it not ready")
                .to_owned()
        });
    AutoscalingState {
        // KEDA's own defaults where the object leaves them out.
        min_replicas: spec.get("minReplicaCount").map_or(0, number),
        max_replicas: spec.get("maxReplicaCount").map_or(100, number),
        target_requests_per_replica: number(&spec["triggers"][0]["metadata"]["targetValue"]),
        cooldown_seconds: spec.get("cooldownPeriod").map_or(300, number),
        request_rate_per_replica: super::prometheus::target(scaler),
        active,
        problem,
    }
}

/// The replica counts KEDA's HPA set for endpoint `endpoint`, oldest first: its
/// `SuccessfulRescale` events, which say "New size: N; reason: ...", and KEDA's own steps
/// to and from zero. The cluster is the record, so the history is as long as the cluster
/// keeps events.
pub async fn history(
    client: &kube::Client,
    endpoint: &str,
) -> Result<Vec<ReplicaChange>, ApiError> {
    let api = Api::<Event>::namespaced(client.clone(), NAMESPACE);
    let params = ListParams::default().fields(&format!(
        "involvedObject.kind=HorizontalPodAutoscaler,involvedObject.name={},reason=SuccessfulRescale",
        hpa_name(endpoint)
    ));
    let mut changes = Vec::new();
    kubernetes::each_listed(&api, params, |e| {
        let message = e.message.unwrap_or_default();
        let Some((size, reason)) = message
            .strip_prefix("New size: ")
            .and_then(|rest| rest.split_once(';'))
        else {
            return;
        };
        let (Ok(replicas), Some(at)) = (
            size.trim().parse(),
            e.last_timestamp
                .or(e.first_timestamp)
                .map(|t| t.0.to_string()),
        ) else {
            return;
        };
        changes.push(ReplicaChange {
            at,
            replicas,
            reason: reason
                .trim()
                .trim_start_matches("reason:")
                .trim()
                .to_owned(),
        });
    })
    .await?;
    // The steps to and from zero are KEDA's own, not the HPA's (which never goes below
    // one): the ScaledObject's events say "... from 0 to 1, triggered by ..." and
    // "Deactivated ... from 1 to 0".
    let params = ListParams::default().fields(&format!(
        "involvedObject.kind=ScaledObject,involvedObject.name={endpoint}"
    ));
    kubernetes::each_listed(&api, params, |e| {
        let reason = match e.reason.as_deref() {
            Some("KEDAScaleTargetActivated") => "woken from zero by requests at the router",
            Some("KEDAScaleTargetDeactivated") => "no requests for the cooldown",
            _ => return,
        };
        let message = e.message.unwrap_or_default();
        let to = message
            .rsplit_once(" to ")
            .and_then(|(_, rest)| rest.split(',').next())
            .and_then(|n| n.trim().parse().ok());
        let at = e
            .last_timestamp
            .or(e.first_timestamp)
            .map(|t| t.0.to_string());
        if let (Some(replicas), Some(at)) = (to, at) {
            changes.push(ReplicaChange {
                at,
                replicas,
                reason: reason.to_owned(),
            });
        }
    })
    .await?;
    changes.sort_by(|a, b| a.at.cmp(&b.at));
    Ok(changes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(extra: Value) -> DeployModelServer {
        let mut body = json!({"name": "ml-1", "endpoint": "qwen", "engine": "sglang",
            "command": "python3 -m sglang.launch_server --model-path /s3/models/q --port 30000",
            "replicas": 2, "router": {}});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        serde_json::from_value(body).unwrap()
    }

    #[test]
    fn the_router_discovers_the_workers_and_serves_metrics_for_keda() {
        let r = request(json!({}));
        let serve = r.serve().unwrap();
        let d = deployment(&r, r.router.as_ref().unwrap(), &serve, "op-1").unwrap();
        let pod = d.spec.template;
        let labels = pod.metadata.unwrap().labels.unwrap();
        assert_eq!(labels[ROUTER_LABEL], "qwen");
        assert!(
            !labels.contains_key(ENDPOINT_LABEL),
            "it would route to itself"
        );
        let command = pod.spec.unwrap().containers[0].command.clone().unwrap();
        let line = command.join(" ");
        assert!(line.contains("--selector hypd.dev/endpoint=qwen"), "{line}");
        assert!(line.contains("--service-discovery-port 30000"), "{line}");
        assert!(line.contains("--policy cache_aware --cache-threshold 0.3 --balance-abs-threshold 64 --balance-rel-threshold 1.5"), "{line}");
        assert!(line.ends_with("--prometheus-port 29000"), "{line}");
    }

    #[test]
    fn other_policies_take_no_thresholds_and_say_which() {
        let r = request(json!({"router": {"policy": "round_robin", "cache_threshold": 0.5}}));
        let errors = r.request_errors();
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(errors[0].field, "router.cache_threshold");
        let r = request(json!({"router": {"policy": "power_of_two"}}));
        let line = args(r.router.as_ref().unwrap(), "qwen", 30000, None).join(" ");
        assert!(
            line.contains("--policy power_of_two --prometheus-host"),
            "{line}"
        );
    }

    #[test]
    fn autoscaling_reads_the_routers_in_flight_requests_per_replica() {
        let r = request(json!({"autoscaling": {"min_replicas": 1, "max_replicas": 4,
            "target_requests_per_replica": 8, "cooldown_seconds": 120}}));
        assert!(r.request_errors().is_empty(), "{:?}", r.request_errors());
        let so = scaled_object(&r).unwrap();
        assert_eq!(so.api_version, "keda.sh/v1alpha1");
        let trigger = &so.spec["triggers"][0]["metadata"];
        assert_eq!(
            trigger["url"],
            "http://qwen-router.default.svc.cluster.local:29000/metrics"
        );
        assert_eq!(trigger["valueLocation"], IN_FLIGHT_METRIC);
        assert_eq!(trigger["targetValue"], "8");
        let behaviour = &so.spec["advanced"]["horizontalPodAutoscalerConfig"];
        assert_eq!(behaviour["name"], "keda-hpa-qwen");
        assert_eq!(
            behaviour["behavior"]["scaleDown"]["stabilizationWindowSeconds"],
            120
        );
        assert_eq!(so.spec["pollingInterval"], 15);
        assert_eq!(so.spec["triggers"].as_array().unwrap().len(), 1);
        assert_eq!(state(&so).request_rate_per_replica, None);

        // The request rate is a second trigger: the HPA follows whichever asks for more.
        let r = request(json!({"autoscaling": {"max_replicas": 4,
            "request_rate": {"target_per_replica": 0.5, "activation": 0.1}}}));
        assert!(r.request_errors().is_empty(), "{:?}", r.request_errors());
        let so = scaled_object(&r).unwrap();
        let rate = &so.spec["triggers"][1];
        assert_eq!(rate["type"], "prometheus");
        assert_eq!(rate["metadata"]["activationThreshold"], "0.1");
        assert!(
            rate["metadata"]["query"]
                .as_str()
                .unwrap()
                .ends_with("[60s]))"),
            "{rate}"
        );
        assert_eq!(state(&so).request_rate_per_replica, Some(0.5));
    }

    #[test]
    fn scaling_to_zero_holds_requests_and_needs_a_cooldown_past_the_cold_start() {
        let r = request(json!({"autoscaling": {"min_replicas": 0, "max_replicas": 2,
            "polling_interval_seconds": 5, "cooldown_seconds": 30}}));
        let scaling = r.autoscaling.as_ref().unwrap();
        assert_eq!(hold_seconds(scaling), Some(35));
        let line = args(r.router.as_ref().unwrap(), "qwen", 30000, Some(scaling)).join(" ");
        // 0.8 + 1.2 + 1.8 + 2.7 + 4 s, then 4 s a wait: 35 s after 12 waits, which SMG
        // counts as 13 attempts.
        assert!(
            line.contains("--retry-max-retries 13 --retry-initial-backoff-ms 1000 --retry-max-backoff-ms 5000 --retry-backoff-multiplier 1.5"),
            "{line}"
        );
        let so = scaled_object(&r).unwrap();
        assert_eq!(so.spec["minReplicaCount"], 0);
        assert_eq!(so.spec["initialCooldownPeriod"], 30);
        // A day's cooldown: KEDA's own, but the HPA's window is at most an hour.
        let day = request(json!({"autoscaling": {"min_replicas": 0, "max_replicas": 2,
            "cooldown_seconds": 86400}}));
        let so = scaled_object(&day).unwrap();
        assert_eq!(so.spec["cooldownPeriod"], 86400);
        assert_eq!(
            so.spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"],
            3600
        );
        // The hold is bounded, and an endpoint that keeps a worker holds nothing.
        assert_eq!(hold_retries(600), 153);
        let kept = request(json!({"autoscaling": {"min_replicas": 1, "max_replicas": 2}}));
        let line = args(
            kept.router.as_ref().unwrap(),
            "qwen",
            30000,
            kept.autoscaling.as_ref(),
        )
        .join(" ");
        assert!(!line.contains("--retry-"), "{line}");

        cooldown_outlasts("qwen", scaling, Some(21.4)).unwrap();
        let e = cooldown_outlasts("qwen", scaling, Some(42.3)).unwrap_err();
        let ApiError::Validation { errors } = e else {
            panic!("a field error")
        };
        assert_eq!(errors[0].field, "autoscaling.cooldown_seconds");
        assert!(
            errors[0].message.contains("took 42.3 s")
                && errors[0].message.contains("cooldown_seconds 43 or more"),
            "{}",
            errors[0].message
        );
        assert!(cooldown_outlasts("qwen", scaling, None).is_err());
        cooldown_outlasts("qwen", kept.autoscaling.as_ref().unwrap(), None).unwrap();
    }

    #[test]
    fn bad_bounds_and_missing_router_are_field_errors() {
        let fields = |extra: Value| -> Vec<String> {
            request(extra)
                .request_errors()
                .into_iter()
                .map(|e| e.field)
                .collect()
        };
        assert_eq!(
            fields(json!({"autoscaling": {"min_replicas": 0, "max_replicas": 2}})),
            Vec::<String>::new(),
            "scaling to zero is allowed"
        );
        assert_eq!(
            fields(json!({"replicas": 0, "autoscaling": {"min_replicas": 0, "max_replicas": 2}})),
            ["replicas"],
            "with one replica to measure the cold start on"
        );
        assert_eq!(
            fields(json!({"replicas": 0, "autoscaling": {"min_replicas": 0, "max_replicas": 0}})),
            ["autoscaling.max_replicas"]
        );
        assert_eq!(
            fields(json!({"autoscaling": {"min_replicas": 3, "max_replicas": 2}})),
            ["autoscaling.max_replicas"]
        );
        assert_eq!(
            fields(json!({"replicas": 5, "autoscaling": {"max_replicas": 4}})),
            ["replicas"]
        );
        assert_eq!(
            fields(json!({"router": null, "autoscaling": {"max_replicas": 4}})),
            ["autoscaling"]
        );
        assert_eq!(
            fields(json!({"engine": "vllm", "command": "vllm serve /s3/models/q"})),
            ["router"]
        );
        assert_eq!(
            fields(json!({"autoscaling": {"max_replicas": 4, "request_rate":
                {"target_per_replica": 0, "activation": -1, "window_seconds": 30}}})),
            [
                "autoscaling.request_rate.target_per_replica",
                "autoscaling.request_rate.activation",
                "autoscaling.request_rate.window_seconds"
            ]
        );
        assert_eq!(
            fields(json!({"router": {"cache_threshold": 1.5, "balance_rel_threshold": 0.5}})),
            ["router.cache_threshold", "router.balance_rel_threshold"]
        );
    }
}
