//! Model serving through the API server's service proxy, as hypd's `invoke_endpoint`
//! reaches it with kube-rs: vLLM pods behind a Service load before they are Ready, the
//! proxy answers 503 with a Status while no pod is, then relays the pods' OpenAI answers
//! (deterministic, counted, pod named in a header); Endpoints follow the pods.

use std::collections::BTreeSet;

use crate::support::{
    active_cluster, eks_client, eks_token, inject, moto, network, register_node, set_time_scale,
    sim, wait_for,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Endpoints, Pod, Service};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

const PROXY: &str = "/api/v1/namespaces/default/services";

/// A kube-rs client as hypd builds one for these calls: with kube-rs's own retry layer
/// off, which would otherwise retry a 503 fifteen times, backing off for minutes.
fn client_without_retries(endpoint: &str, ca_pem: &str, token: &str) -> kube::Client {
    use base64::Engine;
    let _ = rustls::crypto::ring::default_provider().install_default();
    let body: String = ca_pem.lines().filter(|l| !l.starts_with("-----")).collect();
    let der = base64::engine::general_purpose::STANDARD
        .decode(body)
        .unwrap();
    let mut config = kube::Config::new(endpoint.parse().unwrap());
    config.root_cert = Some(vec![der]);
    config.auth_info.token = Some(token.to_owned().into());
    config.default_retry = false;
    kube::Client::try_from(config).unwrap()
}

struct Answer {
    status: u16,
    pod: Option<String>,
    body: Value,
}

/// One call through the proxy of `service` (`name[:port]`) to `path`.
async fn call(
    client: &kube::Client,
    method: &str,
    service: &str,
    path: &str,
    body: Option<Value>,
) -> Answer {
    let request = http::Request::builder()
        .method(method)
        .uri(format!("{PROXY}/{service}/proxy{path}"))
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(kube::client::Body::from(
            body.map(|b| b.to_string().into_bytes()).unwrap_or_default(),
        ))
        .unwrap();
    let response = client.send(request).await.unwrap();
    let status = response.status().as_u16();
    let pod = response
        .headers()
        .get("x-hypd-sim-pod")
        .map(|v| v.to_str().unwrap().to_owned());
    let raw = response.into_body().collect_bytes().await.unwrap();
    let body = serde_json::from_slice(&raw)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&raw).into_owned()));
    Answer { status, pod, body }
}

fn ask(model: &str) -> Value {
    json!({ "model": model, "messages": [
        { "role": "system", "content": "You are terse." },
        { "role": "user", "content": "Say hello to the cluster" }] })
}

fn assert_unavailable(a: &Answer, message: &str) {
    assert_eq!(a.status, 503, "{}", a.body);
    assert_eq!(a.body["kind"], "Status");
    assert_eq!(a.body["reason"], "ServiceUnavailable");
    assert_eq!(a.body["code"], 503);
    assert_eq!(a.body["message"], message);
    assert_eq!(a.pod, None);
}

async fn qwen_pods(pods: &Api<Pod>) -> Vec<Pod> {
    pods.list(&ListParams::default().labels("app=qwen"))
        .await
        .unwrap()
        .items
}

fn running_not_ready(p: &Pod) -> bool {
    let s = p.status.as_ref().unwrap();
    s.phase.as_deref() == Some("Running")
        && s.conditions
            .iter()
            .flatten()
            .any(|c| c.type_ == "Ready" && c.status == "False")
}

#[tokio::test(flavor = "multi_thread")]
async fn the_service_proxy_reaches_vllm_pods_once_they_have_loaded() {
    let (_moto, moto_url) = moto();
    let net = network(&moto_url).await;
    let (_sim, sim_url) = sim(&moto_url, 600.0);
    let eks = eks_client(&sim_url).await;
    let (endpoint, ca) = active_cluster(&eks, &net, "ml-1").await;
    let client = client_without_retries(&endpoint, &ca, &eks_token("ml-1"));
    register_node(&client, "cpu-1", "8").await;

    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    services
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({ "metadata": { "name": "qwen" },
                "spec": { "selector": { "app": "qwen" },
                          "ports": [{ "name": "http", "port": 8000, "targetPort": "http" }] } }))
            .unwrap(),
        )
        .await
        .unwrap();
    let none = r#"no endpoints available for service "qwen""#;
    assert_unavailable(
        &call(
            &client,
            "POST",
            "qwen:8000",
            "/v1/chat/completions",
            Some(ask("qwen")),
        )
        .await,
        none,
    );
    // Slow enough to see the pods load (10 s of load is 2 s), then frozen to look.
    set_time_scale(&sim_url, 5.0).await;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "default");
    let deployment = json!({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": { "name": "qwen" },
        "spec": { "replicas": 2, "selector": { "matchLabels": { "app": "qwen" } },
            "template": {
                "metadata": { "labels": { "app": "qwen" },
                              "annotations": { "sim.hypd.dev/ready-seconds": "10" } },
                "spec": { "containers": [{ "name": "server", "image": "vllm/vllm-openai:v0.11.0",
                    "command": ["vllm", "serve", "/s3/models/Qwen/Qwen2.5-0.5B",
                                "--served-model-name", "qwen", "--port", "8000"],
                    "ports": [{ "name": "http", "containerPort": 8000 }],
                    "readinessProbe": { "httpGet": { "path": "/health", "port": 8000 } } }] } } }
    });
    deployments
        .patch(
            "qwen",
            &PatchParams::apply("test"),
            &Patch::Apply(deployment),
        )
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    wait_for("two qwen pods loading", || async {
        let l = qwen_pods(&pods).await;
        l.len() == 2 && l.iter().all(running_not_ready)
    })
    .await;
    set_time_scale(&sim_url, 0.0).await;
    let loading = qwen_pods(&pods).await;
    assert!(
        loading.iter().all(running_not_ready),
        "still loading once frozen"
    );
    let container = &loading[0]
        .status
        .as_ref()
        .unwrap()
        .container_statuses
        .as_ref()
        .unwrap()[0];
    assert_eq!((container.ready, container.started), (false, Some(true)));
    // Endpoints with only not-ready addresses: the API server names the service as asked.
    assert_unavailable(
        &call(
            &client,
            "POST",
            "qwen:8000",
            "/v1/chat/completions",
            Some(ask("qwen")),
        )
        .await,
        r#"no endpoints available for service "qwen:8000""#,
    );
    let endpoints: Api<Endpoints> = Api::namespaced(client.clone(), "default");
    let subset = &endpoints.get("qwen").await.unwrap().subsets.unwrap()[0];
    assert_eq!(subset.addresses, None);
    assert_eq!(subset.not_ready_addresses.as_ref().unwrap().len(), 2);
    set_time_scale(&sim_url, 600.0).await;
    wait_for("two ready endpoints", || async {
        endpoints
            .get("qwen")
            .await
            .unwrap()
            .subsets
            .unwrap_or_default()
            .iter()
            .map(|s| s.addresses.as_ref().map_or(0, Vec::len))
            .sum::<usize>()
            == 2
    })
    .await;
    let ready = endpoints
        .get("qwen")
        .await
        .unwrap()
        .subsets
        .unwrap()
        .remove(0);
    let names: BTreeSet<String> = qwen_pods(&pods)
        .await
        .into_iter()
        .map(|p| p.metadata.name.unwrap())
        .collect();
    let listed: BTreeSet<String> = ready
        .addresses
        .unwrap()
        .into_iter()
        .map(|a| {
            let target = a.target_ref.unwrap();
            assert_eq!(target.kind.as_deref(), Some("Pod"));
            target.name.unwrap()
        })
        .collect();
    assert_eq!(listed, names);
    let port = &ready.ports.unwrap()[0];
    assert_eq!((port.name.as_deref(), port.port), (Some("http"), 8000));
    // Two replicas take turns; the answer is the same from either.
    let first = call(
        &client,
        "POST",
        "qwen:8000",
        "/v1/chat/completions",
        Some(ask("qwen")),
    )
    .await;
    let again = call(
        &client,
        "POST",
        "qwen:8000",
        "/v1/chat/completions",
        Some(ask("qwen")),
    )
    .await;
    for a in [&first, &again] {
        assert_eq!(a.status, 200, "{}", a.body);
        assert_eq!(a.body["object"], "chat.completion");
        assert_eq!(a.body["model"], "qwen");
        assert_eq!(a.body["choices"][0]["finish_reason"], "stop");
        let content = a.body["choices"][0]["message"]["content"].as_str().unwrap();
        let usage = &a.body["usage"];
        assert_eq!(usage["prompt_tokens"], 8);
        assert_eq!(
            usage["completion_tokens"],
            content.split_whitespace().count()
        );
        assert_eq!(
            usage["total_tokens"].as_u64(),
            Some(8 + content.split_whitespace().count() as u64)
        );
        assert!(a.body["id"].as_str().unwrap().starts_with("chatcmpl-"));
    }
    assert_eq!(
        first.body["choices"][0]["message"],
        again.body["choices"][0]["message"]
    );
    let answered: BTreeSet<String> = [&first, &again]
        .iter()
        .map(|a| a.pod.clone().unwrap())
        .collect();
    assert_eq!(answered, names, "each replica answered once");

    let mut short = ask("qwen");
    short["max_tokens"] = json!(3);
    let cut = call(
        &client,
        "POST",
        "qwen:http",
        "/v1/chat/completions",
        Some(short),
    )
    .await;
    assert_eq!(cut.body["choices"][0]["finish_reason"], "length");
    assert_eq!(cut.body["usage"]["completion_tokens"], 3);
    let wrong = call(
        &client,
        "POST",
        "qwen:8000",
        "/v1/chat/completions",
        Some(ask("llama")),
    )
    .await;
    assert_eq!(wrong.status, 404);
    assert_eq!(
        wrong.body,
        json!({ "object": "error", "message": "The model `llama` does not exist.",
                "type": "NotFoundError", "param": null, "code": 404 })
    );
    let models = call(&client, "GET", "https:qwen:8000", "/v1/models", None).await;
    assert_eq!(models.body["data"][0]["id"], "qwen");
    assert_eq!(models.body["data"][0]["owned_by"], "vllm");
    let served: f64 = futures::future::join_all(
        (0..2).map(|_| call(&client, "GET", "qwen:8000", "/metrics", None)),
    )
    .await
    .iter()
    .flat_map(|m| {
        m.body
            .as_str()
            .unwrap()
            .lines()
            .map(str::to_owned)
            .collect::<Vec<_>>()
    })
    .filter(|l| l.starts_with("vllm:request_success_total{"))
    .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
    .sum();
    assert_eq!(
        served, 3.0,
        "two whole completions and a cut one, over both pods"
    );

    // The API server's own answers on the way.
    assert_unavailable(&call(&client, "GET", "qwen", "/health", None).await, none);
    assert_unavailable(
        &call(&client, "GET", "qwen:9999", "/health", None).await,
        r#"no service port 9999 found for service "qwen""#,
    );
    let missing = call(&client, "GET", "nope:8000", "/health", None).await;
    assert_eq!(
        (missing.status, &missing.body["reason"]),
        (404, &json!("NotFound"))
    );
    assert_eq!(missing.body["message"], r#"services "nope" not found"#);
    inject(
        &sim_url,
        json!({ "service": "kubernetes", "operation": "proxy Service", "kind": "throttle" }),
    )
    .await;
    assert_eq!(
        call(&client, "GET", "qwen:8000", "/health", None)
            .await
            .status,
        429
    );
    assert_eq!(
        call(&client, "GET", "qwen:8000", "/health", None)
            .await
            .status,
        200
    );

    deployments
        .patch(
            "qwen",
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "replicas": 0 } })),
        )
        .await
        .unwrap();
    wait_for("no endpoint once scaled to zero", || async {
        call(
            &client,
            "POST",
            "qwen:8000",
            "/v1/chat/completions",
            Some(ask("qwen")),
        )
        .await
        .status
            == 503
    })
    .await;
    assert_unavailable(
        &call(
            &client,
            "POST",
            "qwen:8000",
            "/v1/chat/completions",
            Some(ask("qwen")),
        )
        .await,
        none,
    );
}
