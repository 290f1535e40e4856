//! The Prometheus server hypd runs beside an endpoint's SGLang router when the endpoint
//! scales on its request rate, and the KEDA trigger that asks it for that rate. KEDA's
//! `metrics-api` scaler reads a number as it stands; a rate is a difference over time,
//! which only something that keeps the router's counter's past can compute. Pure like
//! the router's objects: the same request gives the same objects, so the plan shows
//! what the `autoscaling` stage applies.
//!
//! One server per endpoint, scraping one target (the router's metrics Service; the
//! router runs one replica), with nothing to discover and so no access to the API: the
//! smallest thing that answers the one query, and it goes when the endpoint does.

use app::api::ApiError;
use app::api::inference::{NAMESPACE, RequestRate};
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use serde_json::{Value, json};

use crate::resources::converge;
use crate::resources::kube::keda::ScaledObject;
use crate::resources::kube::object::{Applied, Object};
use crate::resources::kube::{self as kubernetes};
use crate::resources::tags::K8S_MANAGED_BY;

/// The label on the server's Deployment, pods, Service and ConfigMap: the endpoint's
/// name (never the workers' label, or the router would send it requests).
pub const PROMETHEUS_LABEL: &str = "hypd.dev/endpoint-prometheus";
/// Prometheus's long-term-support release.
pub const IMAGE: &str = "quay.io/prometheus/prometheus:v3.5.0";
pub const PORT: u16 = 9090;
/// The gateway's counter of the HTTP requests it answered, by method and path.
pub const REQUESTS_METRIC: &str = "smg_http_requests_total";
/// The trigger's name in the ScaledObject (and so in the HPA's metric name).
pub const TRIGGER: &str = "router-request-rate";
/// Where the ConfigMap is mounted, and so where the server reads its configuration.
const CONFIG_DIR: &str = "/etc/prometheus";
/// Samples are kept for this long: the longest rate window is 15 minutes, and a server
/// restarted loses them anyway (they live on an emptyDir).
const RETENTION: &str = "2h";

/// The name of every object of endpoint `endpoint`'s Prometheus server.
pub fn name(endpoint: &str) -> String {
    format!("{endpoint}-prometheus")
}

fn labels(endpoint: &str) -> Value {
    json!({ PROMETHEUS_LABEL: endpoint, K8S_MANAGED_BY.0: K8S_MANAGED_BY.1 })
}

fn metadata(endpoint: &str) -> Value {
    json!({ "name": name(endpoint), "namespace": NAMESPACE, "labels": labels(endpoint) })
}

/// The query KEDA asks: requests a second through the router over the window, counting
/// only what a client sends (the OpenAI routes and SGLang's native `/generate`), never
/// the probes.
pub fn query(rate: &RequestRate) -> String {
    format!(
        "sum(rate({REQUESTS_METRIC}{{path=~\"/v1/.+|/generate\"}}[{}s]))",
        rate.window_seconds
    )
}

/// The server's configuration: the router's metrics Service, every
/// [`RequestRate::SCRAPE_SECONDS`].
pub fn config(endpoint: &str) -> String {
    let target = format!(
        "{}.{NAMESPACE}.svc.cluster.local:{}",
        super::router::name(endpoint),
        super::router::METRICS_PORT
    );
    let every = RequestRate::SCRAPE_SECONDS;
    format!(
        "global:\n  scrape_interval: {every}s\n  evaluation_interval: {every}s\nscrape_configs:\n  - job_name: sglang-router\n    metrics_path: /metrics\n    static_configs:\n      - targets: [\"{target}\"]\n"
    )
}

/// The ConfigMap, the Deployment (one replica, on CPU, probed as the image documents)
/// and the Service KEDA queries through.
pub fn objects(
    endpoint: &str,
    operation: &str,
) -> Result<(ConfigMap, Deployment, Service), ApiError> {
    let config = json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(endpoint),
        "data": { "prometheus.yml": config(endpoint) },
    });
    let mut meta = metadata(endpoint);
    meta["annotations"] = json!({ super::workload::OPERATION_ANNOTATION: operation });
    let probe = |path: &str, period: i32| json!({ "httpGet": { "path": path, "port": "web" }, "periodSeconds": period });
    let deployment = json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta,
        "spec": {
            "replicas": 1,
            "selector": { "matchLabels": { PROMETHEUS_LABEL: endpoint } },
            "template": {
                "metadata": { "labels": labels(endpoint) },
                "spec": {
                    "containers": [{
                        "name": "prometheus",
                        "image": IMAGE,
                        "args": [
                            format!("--config.file={CONFIG_DIR}/prometheus.yml"),
                            format!("--storage.tsdb.retention.time={RETENTION}"),
                            format!("--web.listen-address=:{PORT}"),
                        ],
                        "ports": [{ "name": "web", "containerPort": PORT }],
                        "resources": { "requests": { "cpu": "100m", "memory": "256Mi" } },
                        "readinessProbe": probe("/-/ready", 5),
                        "livenessProbe": probe("/-/healthy", 30),
                        "volumeMounts": [
                            { "name": "config", "mountPath": CONFIG_DIR },
                            { "name": "data", "mountPath": "/prometheus" },
                        ],
                    }],
                    "volumes": [
                        { "name": "config", "configMap": { "name": name(endpoint) } },
                        { "name": "data", "emptyDir": {} },
                    ],
                },
            },
        },
    });
    let service = json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(endpoint),
        "spec": {
            "type": "ClusterIP",
            "selector": { PROMETHEUS_LABEL: endpoint },
            "ports": [{ "name": "web", "port": PORT, "targetPort": "web", "protocol": "TCP" }],
        },
    });
    Ok((
        serde_json::from_value(config).map_err(ApiError::internal)?,
        serde_json::from_value(deployment).map_err(ApiError::internal)?,
        serde_json::from_value(service).map_err(ApiError::internal)?,
    ))
}

/// KEDA's `prometheus` trigger on the rate, per replica (`AverageValue`: KEDA divides
/// the rate by the replicas).
pub fn trigger(endpoint: &str, rate: &RequestRate) -> Value {
    json!({
        "type": "prometheus",
        "name": TRIGGER,
        "metricType": "AverageValue",
        "metadata": {
            "serverAddress": format!("http://{}.{NAMESPACE}.svc.cluster.local:{PORT}", name(endpoint)),
            "query": query(rate),
            "threshold": rate.target_per_replica.to_string(),
            "activationThreshold": rate.activation.to_string(),
        },
    })
}

/// The rate a replica takes, from a ScaledObject's triggers, if one reads the rate.
pub fn target(scaler: &ScaledObject) -> Option<f64> {
    scaler.spec["triggers"]
        .as_array()?
        .iter()
        .find(|t| t["type"] == "prometheus" && t["name"] == TRIGGER)?["metadata"]["threshold"]
        .as_str()?
        .parse()
        .ok()
}

/// Endpoint `endpoint`'s Prometheus objects deleted, if hypd made them (labelled with
/// the endpoint): an object of the user's of the same name stays.
pub async fn remove(client: &kube::Client, endpoint: &str) -> Result<(), ApiError> {
    remove_ours::<Deployment>(client, endpoint).await?;
    remove_ours::<Service>(client, endpoint).await?;
    remove_ours::<ConfigMap>(client, endpoint).await
}

async fn remove_ours<K>(client: &kube::Client, endpoint: &str) -> Result<(), ApiError>
where
    K: Object + Default + kube::Resource<Scope = NamespaceResourceScope>,
{
    let api = Api::<K>::namespaced(client.clone(), NAMESPACE);
    let ours = kubernetes::get(&api, &name(endpoint))
        .await?
        .is_some_and(|o| super::labelled_by(o.meta(), PROMETHEUS_LABEL, endpoint));
    if ours {
        let mut object = K::default();
        *object.meta_mut() = ObjectMeta {
            name: Some(name(endpoint)),
            namespace: Some(NAMESPACE.to_owned()),
            ..ObjectMeta::default()
        };
        converge(&Applied::namespaced(client, object).absent()).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rate(window: u32) -> RequestRate {
        serde_json::from_value(json!({"target_per_replica": 2.5, "window_seconds": window}))
            .unwrap()
    }

    #[test]
    fn the_server_scrapes_the_router_and_keda_asks_it_for_the_rate() {
        let yml = config("qwen");
        assert!(yml.contains("scrape_interval: 15s"), "{yml}");
        assert!(
            yml.contains("targets: [\"qwen-router.default.svc.cluster.local:29000\"]"),
            "{yml}"
        );
        let (cm, d, svc) = objects("qwen", "op-1").unwrap();
        assert_eq!(cm.data.unwrap()["prometheus.yml"], yml);
        let pod = d.spec.template;
        let labels = pod.metadata.unwrap().labels.unwrap();
        assert_eq!(labels[PROMETHEUS_LABEL], "qwen");
        assert!(!labels.contains_key(app::api::inference::ENDPOINT_LABEL));
        let spec = pod.spec.unwrap();
        assert_eq!(
            spec.containers[0].args.as_ref().unwrap()[0],
            "--config.file=/etc/prometheus/prometheus.yml"
        );
        assert_eq!(
            spec.volumes.unwrap()[0].config_map.as_ref().unwrap().name,
            "qwen-prometheus"
        );
        assert_eq!(svc.spec.unwrap().ports.unwrap()[0].port, 9090);

        let t = trigger("qwen", &rate(120));
        assert_eq!(
            t["metadata"]["serverAddress"],
            "http://qwen-prometheus.default.svc.cluster.local:9090"
        );
        assert_eq!(
            t["metadata"]["query"],
            "sum(rate(smg_http_requests_total{path=~\"/v1/.+|/generate\"}[120s]))"
        );
        assert_eq!(t["metadata"]["threshold"], "2.5");
        assert_eq!(t["metadata"]["activationThreshold"], "0");
        let so = ScaledObject::new(ObjectMeta::default(), json!({ "triggers": [{}, t] }));
        assert_eq!(target(&so), Some(2.5));
    }
}
