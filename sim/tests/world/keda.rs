//! An autoscaled SGLang endpoint as hypd deploys one: SGLang workers behind the SGLang
//! Model Gateway (discovering them by label), and a KEDA ScaledObject (KEDA brought by
//! the inference operator's add-on) whose `metrics-api` trigger reads the gateway's
//! requests in flight from its Prometheus port. Completions take their decode time on
//! the sim's clock, so a load generator's concurrent requests pile up in flight, and the
//! HPA KEDA drives scales the workers up within the ScaledObject's bounds and back down
//! once the load has stopped for its stabilization window, as `SuccessfulRescale` events
//! tell. Workers may also rest at zero: the gateway holds a completion while its retries
//! back off, the held request counts in flight, and KEDA wakes a worker that answers it.
//! Or KEDA's `prometheus` trigger reads the gateway's request rate from a Prometheus
//! server that scrapes it, as hypd provisions one beside the gateway.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::time::Duration;

use crate::support::{
    Proc, active_cluster, call, client_without_retries, eks_client, eks_token, moto, network,
    register_node, set_time_scale, sim, wait_for, wait_for_within,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Event, Pod, Service, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams,
};
use serde_json::{Value, json};

/// Sim seconds a real one while the load runs: a 200-token completion (4 s) takes
/// 200 ms, long enough for eight clients to keep most of their requests in flight.
const LOAD_SCALE: f64 = 20.0;
const MAX_TOKENS: u64 = 200;

fn apply<K>(api: &Api<K>, name: &str, o: Value) -> impl std::future::Future<Output = K>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let api = api.clone();
    let name = name.to_owned();
    async move {
        api.patch(&name, &PatchParams::apply("hypd").force(), &Patch::Apply(o))
            .await
            .unwrap()
    }
}

/// The gateway's `smg_http_connections_active`, through the API server's proxy to its
/// metrics Service.
async fn in_flight(client: &kube::Client) -> f64 {
    let m = call(client, "GET", "qwen-router:29000", "/metrics", None).await;
    assert_eq!(m.status, 200, "{}", m.body);
    let text = m.body.as_str().unwrap().to_owned();
    text.lines()
        .find_map(|l| l.strip_prefix("smg_http_connections_active "))
        .unwrap_or_else(|| panic!("no in-flight gauge in {text}"))
        .parse()
        .unwrap()
}

async fn replicas(deployments: &Api<Deployment>) -> i32 {
    deployments
        .get("qwen")
        .await
        .unwrap()
        .spec
        .replicas
        .unwrap()
}

/// EKS cluster `ml-1` with a 64-CPU node and KEDA up, brought by the inference
/// operator's add-on, the sim running 600 times as fast meanwhile: the sim, its URL and
/// the cluster's client.
async fn keda_cluster(moto_url: &str) -> (Proc, String, kube::Client) {
    let net = network(moto_url).await;
    let (sim, sim_url) = sim(moto_url, 600.0);
    let eks = eks_client(&sim_url).await;
    let (endpoint, ca) = active_cluster(&eks, &net, "ml-1").await;
    let client = client_without_retries(&endpoint, &ca, &eks_token("ml-1"));
    register_node(&client, "cpu-1", "64").await;
    let config = json!({
        "executionRoleArn": "arn:aws:iam::123456789012:role/hyperpod-inference",
        "tlsCertificateS3Bucket": "hypd-tls",
        "hyperpodClusterArn": "arn:aws:sagemaker:us-east-1:123456789012:cluster/hp-1",
        "keda": { "enabled": true },
    });
    eks.create_addon()
        .cluster_name("ml-1")
        .addon_name("amazon-sagemaker-hyperpod-inference")
        .configuration_values(config.to_string())
        .send()
        .await
        .unwrap();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let system: Api<Deployment> = Api::namespaced(client.clone(), "hyperpod-inference-system");
    wait_for("KEDA up", || async {
        let ready = |d: Option<Deployment>| {
            d.and_then(|d| d.status)
                .and_then(|s| s.ready_replicas)
                .unwrap_or(0)
                >= 1
        };
        crds.get_opt("scaledobjects.keda.sh")
            .await
            .unwrap()
            .is_some()
            && ready(system.get_opt("keda-operator").await.unwrap())
            && ready(
                system
                    .get_opt("keda-operator-metrics-apiserver")
                    .await
                    .unwrap(),
            )
    })
    .await;
    (sim, sim_url, client)
}

/// The SGLang workers `qwen`, `replicas` of them, each loading its model for 10 s.
async fn workers(client: &kube::Client, replicas: i32) {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "default");
    let worker = json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": { "name": "qwen", "labels": { "hypd.dev/endpoint": "qwen" } },
        "spec": { "replicas": replicas, "selector": { "matchLabels": { "hypd.dev/endpoint": "qwen" } },
            "template": {
                "metadata": { "labels": { "hypd.dev/endpoint": "qwen" },
                              "annotations": { "sim.hypd.dev/ready-seconds": "10" } },
                "spec": { "containers": [{ "name": "server", "image": "lmsysorg/sglang:v0.5.4",
                    "command": ["python3", "-m", "sglang.launch_server", "--model-path",
                                "Qwen/Qwen2.5-0.5B-Instruct", "--served-model-name", "qwen",
                                "--host", "0.0.0.0", "--port", "30000"],
                    "ports": [{ "name": "http", "containerPort": 30000 }],
                    "readinessProbe": { "httpGet": { "path": "/health", "port": 30000 } } }] } } }
    });
    apply(&deployments, "qwen", worker).await;
}

/// The SGLang Model Gateway `<name>-router`, discovering the `qwen` workers with the
/// flags hypd gives it and `extra`; its pods are labelled
/// `hypd.dev/endpoint-router: <name>`, and Service `name` takes completions to them on
/// 30000.
async fn gateway(client: &kube::Client, name: &str, extra: &[&str]) {
    apply(
        &Api::<ServiceAccount>::namespaced(client.clone(), "default"),
        "qwen-router",
        json!({ "apiVersion": "v1", "kind": "ServiceAccount", "metadata": { "name": "qwen-router" } }),
    )
    .await;
    apply(
        &Api::<Role>::namespaced(client.clone(), "default"),
        "qwen-router",
        json!({ "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                "metadata": { "name": "qwen-router" },
                "rules": [{ "apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"] }] }),
    )
    .await;
    apply(
        &Api::<RoleBinding>::namespaced(client.clone(), "default"),
        "qwen-router",
        json!({ "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                "metadata": { "name": "qwen-router" },
                "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "qwen-router" },
                "subjects": [{ "kind": "ServiceAccount", "name": "qwen-router", "namespace": "default" }] }),
    )
    .await;
    let labels = json!({ "hypd.dev/endpoint-router": name });
    let mut command: Vec<&str> = vec![
        "python3",
        "-m",
        "sglang_router.launch_router",
        "--host",
        "0.0.0.0",
        "--port",
        "30000",
        "--service-discovery",
        "--selector",
        "hypd.dev/endpoint=qwen",
        "--service-discovery-namespace",
        "default",
        "--service-discovery-port",
        "30000",
        "--policy",
        "cache_aware",
        "--cache-threshold",
        "0.3",
        "--balance-abs-threshold",
        "64",
        "--balance-rel-threshold",
        "1.5",
        "--eviction-interval-secs",
        "120",
        "--max-tree-size",
        "67108864",
        "--prometheus-host",
        "0.0.0.0",
        "--prometheus-port",
        "29000",
    ];
    command.extend(extra);
    let router = json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": { "name": format!("{name}-router"), "labels": labels },
        "spec": { "replicas": 1, "selector": { "matchLabels": labels },
            "template": { "metadata": { "labels": labels },
                "spec": { "serviceAccountName": "qwen-router",
                    "containers": [{ "name": "router", "image": "lmsysorg/sglang:v0.5.4",
                        "command": command,
                        "ports": [{ "name": "http", "containerPort": 30000 },
                                  { "name": "metrics", "containerPort": 29000 }],
                        "resources": { "requests": { "cpu": "500m", "memory": "512Mi" } },
                        "readinessProbe": { "httpGet": { "path": "/liveness", "port": "http" } },
                        "livenessProbe": { "httpGet": { "path": "/liveness", "port": "http" } } }] } } }
    });
    apply(
        &Api::<Deployment>::namespaced(client.clone(), "default"),
        &format!("{name}-router"),
        router,
    )
    .await;
    apply(
        &Api::<Service>::namespaced(client.clone(), "default"),
        name,
        json!({ "apiVersion": "v1", "kind": "Service", "metadata": { "name": name },
                "spec": { "selector": labels,
                          "ports": [{ "name": "http", "port": 30000, "targetPort": 30000 }] } }),
    )
    .await;
}

/// Service `qwen-router`: the metrics port of the gateway labelled `gateway`, which KEDA
/// reads.
async fn metrics_service(client: &kube::Client, gateway: &str) {
    apply(
        &Api::<Service>::namespaced(client.clone(), "default"),
        "qwen-router",
        json!({ "apiVersion": "v1", "kind": "Service", "metadata": { "name": "qwen-router" },
                "spec": { "selector": { "hypd.dev/endpoint-router": gateway },
                          "ports": [{ "name": "metrics", "port": 29000, "targetPort": 29000 }] } }),
    )
    .await;
}

fn scaled_objects(client: &kube::Client) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("keda.sh", "v1alpha1", "ScaledObject");
    let ar = ApiResource::from_gvk_with_plural(&gvk, "scaledobjects");
    Api::namespaced_with(client.clone(), "default", &ar)
}

/// The ScaledObject `qwen` sizing the workers between `min` and `max` on the requests in
/// flight at the gateway (two a worker), as hypd writes it, with `spec` merged in.
async fn scaled_object(client: &kube::Client, min: i32, max: i32, spec: Value) {
    let mut scaled_object = json!({
        "apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject",
        "metadata": { "name": "qwen", "labels": { "hypd.dev/endpoint": "qwen" } },
        "spec": {
            "scaleTargetRef": { "apiVersion": "apps/v1", "kind": "Deployment", "name": "qwen" },
            "minReplicaCount": min, "maxReplicaCount": max, "pollingInterval": 5,
            "triggers": [{ "type": "metrics-api", "name": "router-requests", "metricType": "AverageValue",
                "metadata": { "url": "http://qwen-router.default.svc.cluster.local:29000/metrics",
                    "format": "prometheus", "valueLocation": "smg_http_connections_active",
                    "targetValue": "2", "activationTargetValue": "0" } }],
        },
    });
    if let (Some(s), Some(extra)) = (scaled_object["spec"].as_object_mut(), spec.as_object()) {
        s.extend(extra.clone());
    }
    scaled_objects(client)
        .patch(
            "qwen",
            &PatchParams::apply("hypd").force(),
            &Patch::Apply(scaled_object),
        )
        .await
        .unwrap();
}

/// How many pods with labels `selector` are Ready.
async fn count_ready(client: &kube::Client, selector: &str) -> usize {
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let ready = |p: &Pod| {
        p.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
    };
    pods.list(&ListParams::default().labels(selector))
        .await
        .unwrap()
        .items
        .iter()
        .filter(|p| ready(p))
        .count()
}

/// A chat completion asking `content`, with `extra` fields.
/// A completion sent to gateway `gateway` (Service `<gateway>:30000`) with no worker to
/// take it: SMG's retryable 503, from the gateway's pod, never a 404.
async fn refused_for_no_worker(client: &kube::Client, gateway: &str) {
    let answer = call(
        client,
        "POST",
        &format!("{gateway}:30000"),
        "/v1/chat/completions",
        Some(ask("hi", json!({}))),
    )
    .await;
    assert_eq!(answer.status, 503, "{}", answer.body);
    assert_eq!(answer.body["error"]["code"], "no_available_workers");
    let pod = answer.pod.unwrap();
    assert!(pod.starts_with(&format!("{gateway}-router-")), "{pod}");
}

/// Eight clients through the gateway `qwen:30000`, each asking `prompt` again as soon as
/// it is answered, for [`MAX_TOKENS`] every time, until `stop`: each says how many
/// answers it had.
fn load(
    client: &kube::Client,
    prompt: &str,
    stop: &Arc<AtomicBool>,
) -> Vec<tokio::task::JoinHandle<u32>> {
    (0..8)
        .map(|i| {
            let client = client.clone();
            let stop = stop.clone();
            let body = ask(
                &format!("{prompt}, number {i}."),
                json!({ "max_tokens": MAX_TOKENS, "ignore_eos": true }),
            );
            tokio::spawn(async move {
                let mut answered = 0;
                while !stop.load(Ordering::Relaxed) {
                    let a = call(
                        &client,
                        "POST",
                        "qwen:30000",
                        "/v1/chat/completions",
                        Some(body.clone()),
                    )
                    .await;
                    assert_eq!(a.status, 200, "{}", a.body);
                    assert_eq!(a.body["usage"]["completion_tokens"], MAX_TOKENS);
                    assert_eq!(a.body["choices"][0]["finish_reason"], "length");
                    answered += 1;
                }
                answered
            })
        })
        .collect()
}

fn ask(content: &str, extra: Value) -> Value {
    let mut body = json!({ "model": "qwen", "messages": [{ "role": "user", "content": content }] });
    if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
        b.extend(e.clone());
    }
    body
}

#[tokio::test(flavor = "multi_thread")]
async fn keda_scales_sglang_workers_on_the_gateways_requests_in_flight() {
    let (_moto, moto_url) = moto();
    let (_sim, sim_url, client) = keda_cluster(&moto_url).await;

    // Slow enough to see the gateway up before its worker has loaded.
    set_time_scale(&sim_url, 5.0).await;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "default");
    workers(&client, 1).await;
    // Its retries off: a completion before the worker has loaded is answered at once,
    // with the clock stopped (`a_gateway_holds_a_completion_while_keda_wakes_a_worker`
    // holds one).
    gateway(&client, "qwen", &["--disable-retries"]).await;
    metrics_service(&client, "qwen").await;
    let scaled_objects = scaled_objects(&client);
    scaled_object(
        &client,
        1,
        3,
        json!({ "cooldownPeriod": 20,
                "advanced": { "horizontalPodAutoscalerConfig": { "name": "keda-hpa-qwen",
                    "behavior": { "scaleDown": { "stabilizationWindowSeconds": 20 } } } } }),
    )
    .await;

    // The gateway is up before its worker has loaded: it answers for itself.
    let count_ready = |selector: &'static str| count_ready(&client, selector);
    wait_for("the gateway ready, its worker loading", || async {
        count_ready("hypd.dev/endpoint-router=qwen").await == 1
            && count_ready("hypd.dev/endpoint=qwen").await == 0
    })
    .await;
    set_time_scale(&sim_url, 0.0).await;
    refused_for_no_worker(&client, "qwen").await;
    let readiness = call(&client, "GET", "qwen:30000", "/readiness", None).await;
    assert_eq!(readiness.status, 503, "{}", readiness.body);
    let liveness = call(&client, "GET", "qwen:30000", "/liveness", None).await;
    assert_eq!((liveness.status, liveness.body.as_str()), (200, Some("OK")));

    set_time_scale(&sim_url, LOAD_SCALE).await;
    wait_for("the worker ready", || async {
        count_ready("hypd.dev/endpoint=qwen").await == 1
    })
    .await;
    let routed = call(
        &client,
        "POST",
        "qwen:30000",
        "/v1/chat/completions",
        Some(ask("hello", json!({}))),
    )
    .await;
    assert_eq!(routed.status, 200, "{}", routed.body);
    assert_eq!(routed.body["model"], "qwen");
    assert!(routed.pod.as_deref().unwrap().starts_with("qwen-"));
    assert!(
        routed
            .router
            .as_deref()
            .unwrap()
            .starts_with("qwen-router-")
    );
    let streamed = call(
        &client,
        "POST",
        "qwen:30000",
        "/v1/chat/completions",
        Some(ask(
            "hello",
            json!({ "stream": true, "max_tokens": 5, "ignore_eos": true }),
        )),
    )
    .await;
    let events = streamed.body.as_str().unwrap();
    assert_eq!(
        events.matches("\"finish_reason\":\"length\"").count(),
        1,
        "{events}"
    );
    assert!(events.ends_with("data: [DONE]\n\n"));
    assert_eq!(in_flight(&client).await, 0.0);

    // Eight clients, each asking again as soon as it is answered: the gateway has about
    // eight in flight, two a replica are the target, and three the most.
    let stop = Arc::new(AtomicBool::new(false));
    let clients = load(&client, "Write a long story", &stop);
    let most = Arc::new(AtomicI32::new(0));
    wait_for("six or more in flight through the gateway", || async {
        in_flight(&client).await >= 6.0
    })
    .await;
    wait_for("three workers", || async {
        let r = replicas(&deployments).await;
        most.fetch_max(r, Ordering::Relaxed);
        r == 3 && count_ready("hypd.dev/endpoint=qwen").await == 3
    })
    .await;
    let workers = call(&client, "GET", "qwen:30000", "/workers", None).await;
    assert_eq!(workers.body["total"], 3, "{}", workers.body);
    // Held at three while the load goes on: never more.
    for _ in 0..10 {
        let r = replicas(&deployments).await;
        most.fetch_max(r, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(most.load(Ordering::Relaxed), 3, "maxReplicaCount holds");
    let so = scaled_objects.get("qwen").await.unwrap();
    let status = &so.data["status"];
    let condition = |kind: &str| {
        status["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == kind)
            .map(|c| c["status"].as_str().unwrap().to_owned())
    };
    assert_eq!(condition("Ready").as_deref(), Some("True"), "{status}");
    assert_eq!(condition("Active").as_deref(), Some("True"), "{status}");
    assert_eq!(status["hpaName"], "keda-hpa-qwen");
    assert_eq!(
        status["externalMetricNames"],
        json!(["s0-metric-api-smg_http_connections_active"])
    );
    assert!(status["lastActiveTime"].is_string(), "{status}");

    // The load stops: back to one once the 20 s window has passed.
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        assert!(c.await.unwrap() >= 1);
    }
    assert_eq!(in_flight(&client).await, 0.0);
    wait_for_within("one worker again", Duration::from_secs(30), || async {
        replicas(&deployments).await == 1
    })
    .await;
    let rescales = rescales(&client).await;
    let messages: Vec<&str> = rescales
        .iter()
        .filter_map(|e| e.message.as_deref())
        .collect();
    assert!(
        messages.iter().any(|m| m.starts_with(
            "New size: 3; reason: external metric s0-metric-api-smg_http_connections_active("
        ) && m.ends_with(") above target")),
        "{messages:?}"
    );
    assert!(
        messages.contains(&"New size: 1; reason: All metrics below target"),
        "{messages:?}"
    );
    for e in &rescales {
        let involved = &e.involved_object;
        assert_eq!(
            (
                involved.kind.as_deref(),
                involved.name.as_deref(),
                involved.api_version.as_deref()
            ),
            (
                Some("HorizontalPodAutoscaler"),
                Some("keda-hpa-qwen"),
                Some("autoscaling/v2")
            )
        );
        assert_eq!(
            e.source.as_ref().and_then(|s| s.component.as_deref()),
            Some("horizontal-pod-autoscaler")
        );
        assert!(e.first_timestamp.is_some() && e.last_timestamp.is_some());
    }

    // Without its ScaledObject the Deployment keeps its replicas.
    scaled_objects
        .delete("qwen", &Default::default())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(replicas(&deployments).await, 1);
}

/// The value of `name`'s series with `labels` in Prometheus `text`, if it has one.
fn sample(text: &str, name: &str, labels: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}{labels} ")))
        .map(|v| v.parse().unwrap())
}

/// When KEDA last wrote event `reason` about the ScaledObject (epoch seconds).
async fn last_event(client: &kube::Client, reason: &str) -> Option<i64> {
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .filter_map(|e| e.last_timestamp.map(|t| t.0.as_second()))
        .max()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_gateway_holds_a_completion_while_keda_wakes_a_worker() {
    let (_moto, moto_url) = moto();
    let (_sim, sim_url, client) = keda_cluster(&moto_url).await;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "default");
    workers(&client, 1).await;
    // 15 attempts: 1, 1.5, 2.25, 3.375 s and then 5 s apart, 58 s in all, past KEDA's
    // next look (5 s) and a worker's start (5 s) and load (10 s).
    gateway(
        &client,
        "qwen",
        &[
            "--retry-max-retries",
            "15",
            "--retry-initial-backoff-ms",
            "1000",
            "--retry-max-backoff-ms",
            "5000",
        ],
    )
    .await;
    metrics_service(&client, "qwen").await;
    // A gateway whose budget is one attempt, which no wake fits in.
    gateway(&client, "qwen-now", &["--disable-retries"]).await;
    wait_for("both gateways ready", || async {
        count_ready(&client, "hypd.dev/endpoint-router=qwen").await == 1
            && count_ready(&client, "hypd.dev/endpoint-router=qwen-now").await == 1
    })
    .await;
    scaled_object(&client, 0, 2, json!({ "cooldownPeriod": 30 })).await;

    // Never active since it was made (and no initialCooldownPeriod): KEDA takes the
    // idle workers to zero at its first look.
    wait_for("no worker", || async {
        replicas(&deployments).await == 0
            && count_ready(&client, "hypd.dev/endpoint=qwen").await == 0
    })
    .await;
    assert!(
        last_event(&client, "KEDAScaleTargetDeactivated")
            .await
            .is_some()
    );
    refused_for_no_worker(&client, "qwen-now").await;

    // The clock stopped: the completion is held at its first backoff, one connection in
    // flight and one request.
    set_time_scale(&sim_url, 0.0).await;
    let held = tokio::spawn({
        let client = client.clone();
        async move {
            call(
                &client,
                "POST",
                "qwen:30000",
                "/v1/chat/completions",
                Some(ask("hello", json!({ "max_tokens": 20 }))),
            )
            .await
        }
    });
    wait_for("the completion held at the gateway", || async {
        in_flight(&client).await >= 1.0
    })
    .await;
    let metrics = call(&client, "GET", "qwen-router:29000", "/metrics", None).await;
    let text = metrics.body.as_str().unwrap();
    assert_eq!(
        sample(
            text,
            "smg_http_requests_total",
            "{method=\"POST\",path=\"/v1/chat/completions\"}"
        ),
        Some(1.0),
        "{text}"
    );
    assert!(!held.is_finished());

    // KEDA sees the held request and wakes a worker; the request's next attempt after
    // the worker has loaded gets it, and the worker answers as it always does.
    set_time_scale(&sim_url, 20.0).await;
    let answered = tokio::time::timeout(Duration::from_secs(10), held)
        .await
        .expect("answered within the hold")
        .unwrap();
    assert_eq!(answered.status, 200, "{}", answered.body);
    assert_eq!(answered.body["model"], "qwen");
    assert_eq!(answered.body["object"], "chat.completion");
    let worker = answered.pod.unwrap();
    assert!(
        worker.starts_with("qwen-") && !worker.starts_with("qwen-router-"),
        "{worker}"
    );
    assert!(answered.router.unwrap().starts_with("qwen-router-"));
    let so = scaled_objects(&client).get("qwen").await.unwrap();
    let woke = last_event(&client, "KEDAScaleTargetActivated")
        .await
        .expect("woken by KEDA");
    assert!(so.data["status"]["lastActiveTime"].is_string());
    let metrics = call(&client, "GET", "qwen-router:29000", "/metrics", None).await;
    let text = metrics.body.as_str().unwrap();
    assert_eq!(sample(text, "smg_http_connections_active", ""), Some(0.0));
    assert_eq!(
        sample(
            text,
            "smg_http_requests_total",
            "{method=\"POST\",path=\"/v1/chat/completions\"}"
        ),
        Some(1.0),
        "one request however many attempts: {text}"
    );
    let retries = sample(
        text,
        "smg_worker_retries_total",
        "{worker_type=\"regular\",endpoint=\"chat\"}",
    )
    .unwrap_or(0.0);
    assert!((2.0..15.0).contains(&retries), "{text}");

    // Idle again: back to zero once the cooldown has passed since KEDA last saw it
    // active.
    wait_for("no worker again", || async {
        replicas(&deployments).await == 0
    })
    .await;
    let so = scaled_objects(&client).get("qwen").await.unwrap();
    let last_active = so.data["status"]["lastActiveTime"].as_str().unwrap();
    let last_active = last_active
        .parse::<k8s_openapi::jiff::Timestamp>()
        .unwrap()
        .as_second();
    let slept = last_event(&client, "KEDAScaleTargetDeactivated")
        .await
        .unwrap();
    assert!(last_active >= woke, "active while held and answered");
    assert!(
        slept - last_active >= 30,
        "deactivated {slept}, last active {last_active}"
    );
}

/// The query hypd's `prometheus` trigger asks: requests a second through the gateway.
const RATE_QUERY: &str = "sum(rate(smg_http_requests_total{path=~\"/v1/.+|/generate\"}[1m]))";

/// `s` escaped for a query string.
fn escaped(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The Prometheus server hypd provisions beside endpoint `qwen`'s gateway: its
/// ConfigMap, Deployment and Service, scraping `qwen-router:29000` every 15 s.
async fn prometheus_server(client: &kube::Client) {
    let config = "global:\n  scrape_interval: 15s\n  evaluation_interval: 15s\nscrape_configs:\n  - job_name: sglang-router\n    metrics_path: /metrics\n    static_configs:\n      - targets: [\"qwen-router.default.svc.cluster.local:29000\"]\n";
    apply(
        &Api::<ConfigMap>::namespaced(client.clone(), "default"),
        "qwen-prometheus",
        json!({ "apiVersion": "v1", "kind": "ConfigMap", "metadata": { "name": "qwen-prometheus" },
                "data": { "prometheus.yml": config } }),
    )
    .await;
    let labels = json!({ "hypd.dev/endpoint-prometheus": "qwen" });
    apply(
        &Api::<Deployment>::namespaced(client.clone(), "default"),
        "qwen-prometheus",
        json!({ "apiVersion": "apps/v1", "kind": "Deployment", "metadata": { "name": "qwen-prometheus" },
            "spec": { "replicas": 1, "selector": { "matchLabels": labels },
                "template": { "metadata": { "labels": labels },
                    "spec": { "containers": [{ "name": "prometheus",
                        "image": "quay.io/prometheus/prometheus:v3.5.0",
                        "args": ["--config.file=/etc/prometheus/prometheus.yml",
                                 "--storage.tsdb.retention.time=2h", "--web.listen-address=:9090"],
                        "ports": [{ "name": "web", "containerPort": 9090 }],
                        "volumeMounts": [{ "name": "config", "mountPath": "/etc/prometheus" }],
                        "readinessProbe": { "httpGet": { "path": "/-/ready", "port": "web" } },
                        "livenessProbe": { "httpGet": { "path": "/-/healthy", "port": "web" } } }],
                        "volumes": [{ "name": "config", "configMap": { "name": "qwen-prometheus" } }] } } } }),
    )
    .await;
    apply(
        &Api::<Service>::namespaced(client.clone(), "default"),
        "qwen-prometheus",
        json!({ "apiVersion": "v1", "kind": "Service", "metadata": { "name": "qwen-prometheus" },
                "spec": { "selector": labels,
                          "ports": [{ "name": "web", "port": 9090, "targetPort": "web" }] } }),
    )
    .await;
}

/// Prometheus's answer to `query` (at `time`, else now), read through the API server's
/// proxy to its Service: the result's type and the result.
async fn prometheus_query(
    client: &kube::Client,
    query: &str,
    time: Option<f64>,
) -> (String, Vec<Value>) {
    let mut path = format!("/api/v1/query?query={}", escaped(query));
    if let Some(t) = time {
        path.push_str(&format!("&time={t}"));
    }
    let a = call(client, "GET", "qwen-prometheus:9090", &path, None).await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.body["status"], "success", "{}", a.body);
    let data = &a.body["data"];
    (
        data["resultType"].as_str().unwrap().to_owned(),
        data["result"].as_array().unwrap().clone(),
    )
}

/// The HPA's `SuccessfulRescale` events in `default`.
async fn rescales(client: &kube::Client) -> Vec<Event> {
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("SuccessfulRescale"))
        .collect()
}

/// [`RATE_QUERY`] at `time` (else now): its one sample's value, if it has one.
async fn request_rate(client: &kube::Client, time: Option<f64>) -> Option<f64> {
    let (kind, result) = prometheus_query(client, RATE_QUERY, time).await;
    assert_eq!(kind, "vector");
    assert!(result.len() <= 1, "{result:?}");
    result
        .first()
        .map(|s| s["value"][1].as_str().unwrap().parse().unwrap())
}

#[tokio::test(flavor = "multi_thread")]
async fn keda_scales_sglang_workers_on_the_request_rate_prometheus_scrapes() {
    let (_moto, moto_url) = moto();
    let (_sim, sim_url, client) = keda_cluster(&moto_url).await;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "default");
    workers(&client, 1).await;
    gateway(&client, "qwen", &["--disable-retries"]).await;
    metrics_service(&client, "qwen").await;
    prometheus_server(&client).await;
    // Its only trigger: a request a second per worker, at most three.
    let trigger = json!({ "type": "prometheus", "name": "router-request-rate", "metricType": "AverageValue",
        "metadata": { "serverAddress": "http://qwen-prometheus.default.svc.cluster.local:9090",
                      "query": RATE_QUERY, "threshold": "0.5", "activationThreshold": "0" } });
    scaled_object(
        &client,
        1,
        3,
        json!({ "cooldownPeriod": 20, "triggers": [trigger],
                "advanced": { "horizontalPodAutoscalerConfig": { "name": "keda-hpa-qwen",
                    "behavior": { "scaleDown": { "stabilizationWindowSeconds": 20 } } } } }),
    )
    .await;
    wait_for("the worker, the gateway and Prometheus ready", || async {
        count_ready(&client, "hypd.dev/endpoint=qwen").await == 1
            && count_ready(&client, "hypd.dev/endpoint-router=qwen").await == 1
            && count_ready(&client, "hypd.dev/endpoint-prometheus=qwen").await == 1
    })
    .await;
    let ready = call(&client, "GET", "qwen-prometheus:9090", "/-/ready", None).await;
    assert_eq!(ready.body.as_str(), Some("Prometheus Server is Ready.\n"));
    wait_for("the gateway scraped", || async {
        let up = call(
            &client,
            "GET",
            "qwen-prometheus:9090",
            "/api/v1/query?query=up",
            None,
        )
        .await;
        assert_eq!(up.status, 200, "{}", up.body);
        up.body["data"]["result"][0]["value"][1] == "1"
    })
    .await;

    // Eight clients, each asking again once answered: 200 tokens take 4 s, so the
    // gateway sees about two requests a second, four workers' worth, three the most.
    set_time_scale(&sim_url, LOAD_SCALE).await;
    let stop = Arc::new(AtomicBool::new(false));
    let clients = load(&client, "Count to a thousand", &stop);
    wait_for("three workers", || async {
        replicas(&deployments).await == 3
    })
    .await;
    // Once the window holds only load (the counter well past zero at its first scrape,
    // so no extrapolation to zero), the rate is what the gateway's counter gained over
    // the scrapes, 15 s apart, extrapolated to the window's start. Offered: at most two
    // a second (a little under, for the real time each round trip takes besides its
    // decode).
    let prometheus = &client;
    let chat_samples = move |time: Option<f64>| async move {
        let (kind, raw) = prometheus_query(prometheus, "smg_http_requests_total[1m]", time).await;
        assert_eq!(kind, "matrix");
        let Some(chat) = raw
            .iter()
            .find(|s| s["metric"]["path"] == "/v1/chat/completions")
        else {
            return Vec::new();
        };
        assert_eq!(chat["metric"]["job"], "sglang-router");
        assert_eq!(
            chat["metric"]["instance"],
            "qwen-router.default.svc.cluster.local:29000"
        );
        chat["values"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| {
                (
                    v[0].as_f64().unwrap(),
                    v[1].as_str().unwrap().parse::<f64>().unwrap(),
                )
            })
            .collect::<Vec<_>>()
    };
    wait_for("a minute of load in the window", || async {
        let s = chat_samples(None).await;
        s.len() >= 4 && s[0].1 >= 40.0
    })
    .await;
    // The samples and the rate at one evaluation time, so both see the same window;
    // scrapes late on a busy machine make the samples uneven, so the rate is held to
    // the bounds of Prometheus's extrapolation rather than to one figure: at least the
    // gain over the whole minute, at most the gain extrapolated by 1.1 average sample
    // intervals at each end.
    let at = chat_samples(None).await.last().unwrap().0;
    let samples = chat_samples(Some(at)).await;
    let (first, last) = (samples[0], samples[samples.len() - 1]);
    let (gained, sampled) = (last.1 - first.1, last.0 - first.0);
    let offered = gained / sampled;
    assert!((1.0..=2.05).contains(&offered), "{samples:?}");
    let average = sampled / (samples.len() - 1) as f64;
    let least = gained / 60.0;
    let most = gained * (sampled + 2.2 * average) / sampled / 60.0;
    let rate = request_rate(&client, Some(at)).await.unwrap();
    assert!(
        (least - 1e-9..=most + 1e-9).contains(&rate),
        "{rate} outside {least}..{most}: {samples:?}"
    );
    let so = scaled_objects(&client).get("qwen").await.unwrap();
    let status = &so.data["status"];
    assert_eq!(status["externalMetricNames"], json!(["s0-prometheus"]));
    assert_eq!(status["triggersTypes"], "prometheus");

    // The load stops: the rate falls to zero as the minute passes, and the workers go
    // back to one once the 20 s window has passed.
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        assert!(c.await.unwrap() >= 1);
    }
    set_time_scale(&sim_url, 60.0).await;
    wait_for_within("one worker again", Duration::from_secs(15), || async {
        replicas(&deployments).await == 1
    })
    .await;
    assert_eq!(request_rate(&client, None).await, Some(0.0));
    let messages: Vec<String> = rescales(&client)
        .await
        .into_iter()
        .filter_map(|e| e.message)
        .collect();
    assert!(
        messages
            .iter()
            .any(|m| m.starts_with("New size: 3; reason: external metric s0-prometheus(")),
        "{messages:?}"
    );
    assert!(
        messages
            .iter()
            .any(|m| m == "New size: 1; reason: All metrics below target"),
        "{messages:?}"
    );
}
