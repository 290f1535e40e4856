//! Self-managed model servers through REST against moto + hypd-sim: bad requests
//! refused by field (GPUs above the group's, an unparsable or engine-foreign serve
//! command, a model that is not in the bucket), the plan of a deploy, an endpoint that
//! answers unavailable with Retry-After while it wakes (never not-found), then serves
//! chat completions through the API server's service proxy; a load-balanced one with
//! its NLB address; both listed across clusters, scaled to zero, and deleted in two
//! steps with their token's Secret; a model pool whose warm workers are bound to its
//! models and released by a label, never restarted; SGLang behind its router, scaled by
//! KEDA on the router's requests in flight up to its maximum and back; the token nowhere
//! hypd keeps or says anything.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Secret, Service};
use kube::Api;
use reqwest::Method;
use serde_json::{Value, json};

use crate::FAST;
use crate::common::cluster::{kube_client, small, world_with_cluster};
use crate::common::{Hypd, World};

const TOKEN: &str = "hf_iNfErEnCeSeCrEt0123456789abcd";

/// The names of the objects of kind `K` in `default`, sorted.
pub async fn names<K>(client: &kube::Client) -> Vec<String>
where
    K: kube::Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let listed = Api::<K>::namespaced(client.clone(), "default")
        .list(&Default::default())
        .await
        .unwrap();
    let mut names: Vec<String> = listed
        .items
        .iter()
        .filter_map(|o| o.meta().name.clone())
        .collect();
    names.sort();
    names
}

/// The names of KEDA's ScaledObjects in `default`, sorted.
pub async fn scaled_objects(client: &kube::Client) -> Vec<String> {
    let kind = kube::api::ApiResource {
        group: "keda.sh".into(),
        version: "v1alpha1".into(),
        api_version: "keda.sh/v1alpha1".into(),
        kind: "ScaledObject".into(),
        plural: "scaledobjects".into(),
    };
    let listed = Api::<kube::api::DynamicObject>::namespaced_with(client.clone(), "default", &kind)
        .list(&Default::default())
        .await
        .unwrap();
    let mut names: Vec<String> = listed
        .items
        .into_iter()
        .filter_map(|o| o.metadata.name)
        .collect();
    names.sort();
    names
}

/// Runs `body` as an operation at `path` and waits until it succeeds.
pub fn run_op(hypd: &Hypd, token: &str, path: &str, body: Value) -> Value {
    let (status, started) = hypd.call(token, Method::POST, path, Some(body));
    assert_eq!(status, 200, "{started}");
    let op = hypd.finish(token, started["operation_id"].as_str().unwrap());
    assert_eq!(op["state"], "succeeded", "{op:#}");
    op
}

/// A model's files in the shared bucket, as download_model leaves them.
pub fn model_in_bucket(hypd: &Hypd, token: &str, name: &str) {
    crate::training::upload(hypd, token, name, "models/qwen/config.json");
}

/// Sets the sim's clock speed (0 stops it: pods stay where they are).
fn clock(world: &World, time_scale: f64) {
    let (status, set) = world.sim.call(
        Method::PUT,
        "/_sim/clock",
        Some(json!({ "time_scale": time_scale })),
    );
    assert!(status < 300, "{set}");
}

/// The invocation's status, its `Retry-After` header and its body.
fn invoke(
    hypd: &Hypd,
    token: &str,
    name: &str,
    endpoint: &str,
    prompt: &str,
) -> (u16, Option<String>, Value) {
    let resp = reqwest::blocking::Client::new()
        .post(format!(
            "{}/api/v1/clusters/{name}/endpoints/{endpoint}/invoke",
            hypd.url
        ))
        .bearer_auth(token)
        .json(&json!({"messages": [{"role": "user", "content": prompt}], "max_tokens": 64}))
        .send()
        .unwrap();
    let status = resp.status().as_u16();
    let retry = resp
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_owned());
    (status, retry, resp.json().unwrap())
}

fn field_of(refused: &Value) -> (&str, &str) {
    let e = &refused["error"]["errors"][0];
    (
        e["field"].as_str().unwrap_or_default(),
        e["message"].as_str().unwrap_or_default(),
    )
}

#[test]
fn model_servers_wake_serve_through_the_api_server_scale_and_are_deleted() {
    let name = "ml-infer";
    let (world, hypd, token, _) = world_with_cluster(FAST, json!({}), small(name));
    let rt = tokio::runtime::Runtime::new().unwrap();
    let endpoints = format!("/api/v1/clusters/{name}/endpoints");
    let vllm = json!({"endpoint": "qwen", "engine": "vllm", "hf_token": TOKEN,
        "command": "vllm serve /s3/models/qwen --served-model-name qwen --max-model-len 4096"});
    let with = |patch: Value| {
        let mut body = vllm.clone();
        for (k, v) in patch.as_object().unwrap() {
            body[k] = v.clone();
        }
        body
    };

    // Refused by field, before anything is made: the group's type (ml.g5.8xlarge) has
    // one GPU; a line that does not split; a line of another engine; no model there yet.
    for (patch, field, says) in [
        (json!({"gpus_per_replica": 2}), "gpus_per_replica", "has 1"),
        (
            json!({"command": "vllm serve '/s3/models/qwen"}),
            "command",
            "never closed",
        ),
        (
            json!({"engine": "sglang"}),
            "command",
            "sglang.launch_server",
        ),
        (json!({}), "command", "nothing is at /s3/models/qwen"),
    ] {
        let (status, refused) =
            hypd.call(&token, Method::POST, &endpoints, Some(with(patch.clone())));
        assert_eq!(status, 422, "{patch}: {refused}");
        let (f, message) = field_of(&refused);
        assert_eq!(f, field, "{refused:#}");
        assert!(message.contains(says), "{patch}: {message}");
        assert!(!refused.to_string().contains("sEcReT"), "{refused}");
    }
    model_in_bucket(&hypd, &token, name);

    // The plan: the token's Secret, the Deployment (the replica's GPU on the group's
    // nodes), the Service, and the cold start recorded once the replica is ready.
    let (status, plan) = hypd.call(
        &token,
        Method::POST,
        &endpoints,
        Some(with(json!({"dry_run": true}))),
    );
    assert_eq!(status, 200, "{plan}");
    let kinds: Vec<Vec<&str>> = plan["plan"]["stages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            s["changes"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| c["kind"].as_str().unwrap())
                .collect()
        })
        .collect();
    assert_eq!(
        kinds,
        [
            vec!["k8s:v1/Secret", "k8s:apps/v1/Deployment"],
            vec!["k8s:v1/Service"],
            vec!["k8s:apps/v1/Deployment"]
        ],
        "{plan:#}"
    );
    let spec = &plan["plan"]["stages"][0]["changes"][1]["fields"][0]["new"];
    let container = &spec["template"]["spec"]["containers"][0];
    assert_eq!(
        container["resources"]["limits"]["nvidia.com/gpu"], "1",
        "{spec:#}"
    );
    assert_eq!(
        spec["template"]["spec"]["nodeSelector"]["sagemaker.amazonaws.com/instance-group-name"],
        "gpu"
    );
    assert!(!plan.to_string().contains("sEcReT"), "{plan}");

    // With time stopped the replica cannot load its model: the endpoint is there and
    // waking, and an invocation is told to come back, not that nothing is there.
    clock(&world, 0.0);
    let (status, started) = hypd.call(&token, Method::POST, &endpoints, Some(vllm.clone()));
    assert_eq!(status, 200, "{started}");
    let op_id = started["operation_id"].as_str().unwrap().to_owned();
    crate::wait_until("the Deployment", std::time::Duration::from_secs(60), || {
        hypd.call(&token, Method::GET, &format!("{endpoints}/qwen"), None)
            .0
            == 200
    });
    let (status, retry, waking) = invoke(&hypd, &token, name, "qwen", "hello");
    assert_eq!((status, retry.as_deref()), (503, Some("10")), "{waking}");
    assert_eq!(waking["error"]["kind"], "unavailable", "{waking}");
    assert!(waking.to_string().contains("waking"), "{waking}");
    let (_, got) = hypd.call(&token, Method::GET, &format!("{endpoints}/qwen"), None);
    assert_eq!(
        (got["phase"].as_str(), got["ready"].as_u64()),
        (Some("deploying"), Some(0)),
        "{got:#}"
    );
    clock(&world, FAST);
    let op = hypd.finish(&token, &op_id);
    assert_eq!(op["state"], "succeeded", "{op:#}");
    let cold = op["outputs"]["cold_start_seconds"].as_f64().unwrap();
    // The sim's container start (5 s) and model load (20 s) after scheduling.
    assert!((20.0..60.0).contains(&cold), "{op:#}");

    // It serves, through the API server: the model's own answer, the same for the same
    // prompt, with token counts.
    let (status, _, answer) = invoke(&hypd, &token, name, "qwen", "What is HyperPod?");
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["model"], "qwen", "{answer}");
    assert!(!answer["answer"].as_str().unwrap().is_empty(), "{answer}");
    assert!(answer["prompt_tokens"].as_u64().unwrap() >= 3, "{answer}");
    assert!(
        answer["completion_tokens"].as_u64().unwrap() >= 1,
        "{answer}"
    );
    let (_, _, again) = invoke(&hypd, &token, name, "qwen", "What is HyperPod?");
    assert_eq!(again["answer"], answer["answer"]);
    let (status, refused) = hypd.call(
        &token,
        Method::POST,
        &format!("{endpoints}/qwen/invoke"),
        Some(json!({"messages": []})),
    );
    assert_eq!(
        (status, field_of(&refused).0),
        (422, "messages"),
        "{refused}"
    );

    // What the cluster holds: the token only in the endpoint's Secret, which the
    // replica reads; the replica on the group's nodes with its GPU.
    let (secret, deployment, pods) = rt.block_on(async {
        let client = kube_client(&world, name).await;
        let secret = Api::<Secret>::namespaced(client.clone(), "default")
            .get("hypd-hf-token-qwen")
            .await
            .unwrap();
        let deployment = Api::<Deployment>::namespaced(client.clone(), "default")
            .get("qwen")
            .await
            .unwrap();
        let pods = Api::<Pod>::namespaced(client, "default")
            .list(&kube::api::ListParams::default().labels("hypd.dev/endpoint=qwen"))
            .await
            .unwrap();
        (secret, deployment, pods.items)
    });
    assert_eq!(secret.data.unwrap()["token"].0, TOKEN.as_bytes());
    let env =
        serde_json::to_value(&deployment.spec.template.spec.unwrap().containers[0].env).unwrap();
    assert!(env.to_string().contains("hypd-hf-token-qwen"), "{env}");
    assert_eq!(pods.len(), 1);

    // A second endpoint, load-balanced: ready only once its NLB has an address.
    let lb = json!({"endpoint": "qwen-lb", "engine": "vllm", "service": "load_balancer",
        "command": "vllm serve /s3/models/qwen"});
    let op = run_op(&hypd, &token, &endpoints, lb);
    let address = op["outputs"]["address"].as_str().unwrap().to_owned();
    assert!(address.ends_with(".elb.us-east-1.amazonaws.com"), "{op:#}");

    // Both, listed across clusters.
    let (status, listed) = hypd.call(&token, Method::GET, "/api/v1/endpoints", None);
    assert_eq!(status, 200, "{listed}");
    let rows: Vec<(&str, &str, &str, u64)> = listed["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["endpoint"].as_str().unwrap(),
                e["service"].as_str().unwrap(),
                e["phase"].as_str().unwrap(),
                e["ready"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        rows,
        [
            ("qwen", "cluster_ip", "in_service", 1),
            ("qwen-lb", "load_balancer", "in_service", 1)
        ],
        "{listed:#}"
    );
    assert_eq!(listed["endpoints"][1]["address"], address.as_str());
    assert_eq!(listed["endpoints"][0]["model"], "qwen");
    assert_eq!(listed["endpoints"][1]["model"], "/s3/models/qwen");

    // Scaled to zero: it keeps its cold start, and an invocation is told to scale it.
    let op = run_op(
        &hypd,
        &token,
        &format!("{endpoints}/qwen/scale"),
        json!({"replicas": 0}),
    );
    assert_eq!(op["outputs"]["before"], 1, "{op:#}");
    let (status, retry, zero) = invoke(&hypd, &token, name, "qwen", "hello");
    assert_eq!((status, retry), (503, None), "{zero}");
    assert!(zero.to_string().contains("scale_endpoint"), "{zero}");
    let (_, got) = hypd.call(&token, Method::GET, &format!("{endpoints}/qwen"), None);
    assert_eq!(got["phase"], "scaled_to_zero", "{got:#}");
    assert!(got["cold_start_seconds"].as_f64().is_some(), "{got:#}");

    // Deleted in two steps, with the Secret hypd made.
    for endpoint in ["qwen", "qwen-lb"] {
        let path = format!("{endpoints}/{endpoint}");
        let (status, gated) = hypd.call(&token, Method::DELETE, &path, Some(json!({})));
        assert_eq!(status, 200, "{gated}");
        assert!(gated["confirmation"].is_string(), "{gated:#}");
        let (status, started) = hypd.confirmed(&token, Method::DELETE, &path, Some(json!({})));
        assert_eq!(status, 200, "{started}");
        let op = hypd.finish(&token, started["operation_id"].as_str().unwrap());
        assert_eq!(op["state"], "succeeded", "{op:#}");
    }
    model_pool(&hypd, &token, name);
    router_and_autoscaling(&world, &hypd, &token, name, &rt);
    request_rate(&world, &hypd, &token, name, &rt);
    scale_to_zero(&world, &hypd, &token, name, &rt);

    let left = rt.block_on(async {
        let client = kube_client(&world, name).await;
        let names = |l: Vec<Option<String>>| l.into_iter().flatten().collect::<Vec<_>>();
        let d = Api::<Deployment>::namespaced(client.clone(), "default")
            .list(&Default::default())
            .await
            .unwrap();
        let s = Api::<Service>::namespaced(client.clone(), "default")
            .list(&Default::default())
            .await
            .unwrap();
        let secrets = Api::<Secret>::namespaced(client, "default")
            .list(&Default::default())
            .await
            .unwrap();
        (
            names(d.items.into_iter().map(|x| x.metadata.name).collect()),
            names(s.items.into_iter().map(|x| x.metadata.name).collect()),
            names(secrets.items.into_iter().map(|x| x.metadata.name).collect()),
        )
    });
    for kind in [&left.0, &left.1] {
        assert!(
            !kind
                .iter()
                .any(|n| ["qwen", "pool", "sg"].iter().any(|p| n.starts_with(p))),
            "{left:?}"
        );
    }
    assert!(
        !left.2.iter().any(|n| n.starts_with("hypd-hf-token")),
        "{left:?}"
    );
    let (_, listed) = hypd.call(
        &token,
        Method::GET,
        &format!("/api/v1/endpoints?name={name}"),
        None,
    );
    assert_eq!(listed["endpoints"], json!([]), "{listed:#}");

    crate::models::nowhere_kept(&hypd, &token, TOKEN);
}

/// Each pod of `pool`: its uid, restarts and the model it is bound to.
fn workers(hypd: &Hypd, token: &str, name: &str) -> Vec<(String, u64, Option<String>)> {
    let (status, got) = hypd.call(
        token,
        Method::GET,
        &format!("/api/v1/clusters/{name}/endpoints/pool"),
        None,
    );
    assert_eq!(status, 200, "{got}");
    got["pods"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["uid"].as_str().unwrap().to_owned(),
                p["restarts"].as_u64().unwrap(),
                p["serves"].as_str().map(str::to_owned),
            )
        })
        .collect()
}

/// A pool of two warm vLLM workers serving a base model and two LoRA adapters: no model
/// is reached before a worker is bound to it (503, no Retry-After: waiting would not
/// help); binding one worker to each adapter by its label, refusing a third when one
/// is free, each adapter then answering as itself; releasing returns a worker. No
/// worker restarts or is replaced (uids unchanged) through all of it; deleting the pool
/// deletes its models' Services.
fn model_pool(hypd: &Hypd, token: &str, name: &str) {
    let endpoints = format!("/api/v1/clusters/{name}/endpoints");
    let lora = "--enable-lora --lora-modules sql=/s3/models/qwen/sql chat=/s3/models/qwen/chat";
    let pool = json!({"endpoint": "pool", "engine": "vllm", "service": "model_pool", "replicas": 2,
        "command": format!("vllm serve /s3/models/qwen --served-model-name base {lora}")});
    let mut bad = pool.clone();
    bad["command"] = json!(format!(
        "vllm serve /s3/models/qwen --served-model-name Qwen/Base {lora}"
    ));
    let (status, refused) = hypd.call(token, Method::POST, &endpoints, Some(bad));
    assert_eq!(status, 422, "{refused}");
    assert_eq!(field_of(&refused).0, "command", "{refused}");
    assert!(field_of(&refused).1.contains("lowercase"), "{refused}");
    let op = run_op(hypd, token, &endpoints, pool);
    assert_eq!(op["outputs"]["ready"], 2, "{op:#}");
    let (_, got) = hypd.call(token, Method::GET, &format!("{endpoints}/pool"), None);
    assert_eq!(
        got["pool"],
        json!({"models": [{"model": "base", "workers": 0}, {"model": "chat", "workers": 0},
            {"model": "sql", "workers": 0}], "unassigned": 2}),
        "{got:#}"
    );
    let before = workers(hypd, token, name);
    let ask = |model: Option<&str>| {
        let mut body = json!({"messages": [{"role": "user", "content": "SELECT 1?"}]});
        if let Some(m) = model {
            body["model"] = json!(m);
        }
        hypd.call(
            token,
            Method::POST,
            &format!("{endpoints}/pool/invoke"),
            Some(body),
        )
    };
    let (status, refused) = ask(None);
    assert_eq!((status, field_of(&refused).0), (422, "model"), "{refused}");
    let (status, unbound) = ask(Some("sql"));
    assert_eq!(status, 503, "{unbound}");
    assert!(
        unbound.to_string().contains("assign_pool_workers"),
        "{unbound}"
    );

    let assign = format!("{endpoints}/pool/assign");
    let op = run_op(hypd, token, &assign, json!({"model": "sql", "count": 1}));
    assert_eq!(op["outputs"]["serving"], 1, "{op:#}");
    let (status, refused) = hypd.call(
        token,
        Method::POST,
        &assign,
        Some(json!({"model": "chat", "count": 2})),
    );
    assert_eq!(status, 422, "{refused}");
    let (field, says) = field_of(&refused);
    assert_eq!(field, "count");
    assert!(
        says.contains("1 free ready worker of 2 (bound: sql 1)"),
        "{says}"
    );
    let (status, refused) = hypd.call(
        token,
        Method::POST,
        &assign,
        Some(json!({"model": "poetry", "count": 1})),
    );
    assert_eq!((status, field_of(&refused).0), (422, "model"), "{refused}");
    run_op(hypd, token, &assign, json!({"model": "chat", "count": 1}));
    for model in ["sql", "chat"] {
        let (status, answer) = ask(Some(model));
        assert_eq!(status, 200, "{answer}");
        assert_eq!(answer["model"], model, "{answer}");
    }
    let bound = workers(hypd, token, name);
    let uids =
        |w: &[(String, u64, Option<String>)]| w.iter().map(|p| p.0.clone()).collect::<Vec<_>>();
    assert_eq!(uids(&bound), uids(&before), "the same pods: none replaced");
    assert!(bound.iter().all(|p| p.1 == 0), "none restarted: {bound:?}");
    let mut serving: Vec<_> = bound.iter().filter_map(|p| p.2.clone()).collect();
    serving.sort();
    assert_eq!(serving, ["chat", "sql"]);

    let op = run_op(
        hypd,
        token,
        &format!("{endpoints}/pool/release"),
        json!({"model": "sql"}),
    );
    assert_eq!(op["outputs"]["serving"], 0, "{op:#}");
    let released = workers(hypd, token, name);
    assert_eq!(uids(&released), uids(&before));
    assert_eq!(released.iter().filter(|p| p.2.is_none()).count(), 1);
    let (status, unbound) = ask(Some("sql"));
    assert_eq!(status, 503, "{unbound}");

    let path = format!("{endpoints}/pool");
    let (status, gated) = hypd.call(token, Method::DELETE, &path, Some(json!({})));
    assert_eq!(status, 200, "{gated}");
    let services: Vec<&str> = gated["plan"]["stages"][0]["changes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(services, ["pool-chat", "pool-sql"], "{gated:#}");
    let (status, started) = hypd.confirmed(token, Method::DELETE, &path, Some(json!({})));
    assert_eq!(status, 200, "{started}");
    let op = hypd.finish(token, started["operation_id"].as_str().unwrap());
    assert_eq!(op["state"], "succeeded", "{op:#}");
}

/// SGLang workers behind the SGLang router, sized by KEDA on the requests in flight at
/// the router: load through the API server's proxy takes them to the maximum (never
/// beyond), its end back to the minimum after the cooldown; the history of that is the
/// endpoint's; the router and the ScaledObject go with the endpoint.
fn router_and_autoscaling(
    world: &World,
    hypd: &Hypd,
    token: &str,
    name: &str,
    rt: &tokio::runtime::Runtime,
) {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};

    let endpoints = format!("/api/v1/clusters/{name}/endpoints");
    let sg = json!({"endpoint": "sg", "engine": "sglang", "replicas": 1,
        "command": "python3 -m sglang.launch_server --model-path /s3/models/qwen --served-model-name sg",
        "router": {"policy": "cache_aware", "balance_abs_threshold": 4},
        "autoscaling": {"min_replicas": 1, "max_replicas": 2, "target_requests_per_replica": 2,
            "polling_interval_seconds": 5, "cooldown_seconds": 120}});
    // KEDA is not installed yet: said by field, with the feature that brings it.
    let (status, refused) = hypd.call(token, Method::POST, &endpoints, Some(sg.clone()));
    assert_eq!(status, 409, "{refused}");
    assert!(refused.to_string().contains("keda"), "{refused}");
    let (status, started) = hypd.call(
        token,
        Method::POST,
        &format!("/api/v1/clusters/{name}/features"),
        Some(json!({"keda": true})),
    );
    assert_eq!(status, 200, "{started}");
    let op = hypd.finish(token, started["operation_id"].as_str().unwrap());
    assert_eq!(op["state"], "succeeded", "{op:#}");

    let op = run_op(hypd, token, &endpoints, sg);
    let stages: Vec<&str> = op["stages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        stages,
        ["workload", "service", "router", "ready", "autoscaling"]
    );
    let (_, got) = hypd.call(token, Method::GET, &format!("{endpoints}/sg"), None);
    assert_eq!(got["routing"], "cache_aware", "{got:#}");
    assert_eq!(got["autoscaling"]["max_replicas"], 2, "{got:#}");
    assert_eq!(
        got["pods"].as_array().unwrap().len(),
        1,
        "the router is no replica: {got:#}"
    );
    // The Service reaches the router, which reaches a worker.
    let (status, answer) = hypd.call(
        token,
        Method::POST,
        &format!("{endpoints}/sg/invoke"),
        Some(json!({"messages": [{"role": "user", "content": "hello"}]})),
    );
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["model"], "sg", "{answer}");

    let client = rt.block_on(kube_client(world, name));
    let deployments = Api::<Deployment>::namespaced(client.clone(), "default");
    let replicas = || {
        rt.block_on(deployments.get("sg"))
            .unwrap()
            .spec
            .replicas
            .unwrap_or(1) as u32
    };
    // Load: requests that generate to max_tokens (ignore_eos, as load generators ask)
    // keep several in flight at the router at every look KEDA takes.
    let load = Load::start(
        rt,
        &client,
        "sg",
        8,
        json!({"max_tokens": 2000, "ignore_eos": true}),
    );
    let most = Arc::new(AtomicU32::new(0));
    let metrics = rt
        .block_on(
            client.request_text(
                http::Request::get(
                    "/api/v1/namespaces/default/services/sg-router:29000/proxy/metrics",
                )
                .body(Vec::new())
                .unwrap(),
            ),
        )
        .unwrap();
    assert!(metrics.contains("smg_http_connections_active"), "{metrics}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    loop {
        let now = replicas();
        most.fetch_max(now, Ordering::Relaxed);
        if now == 2 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "never scaled up");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let (_, got) = hypd.call(token, Method::GET, &format!("{endpoints}/sg"), None);
    assert_eq!(got["autoscaling"]["active"], true, "{got:#}");
    // Held at the maximum while the load lasts, though it asks for four.
    for _ in 0..20 {
        most.fetch_max(replicas(), Ordering::Relaxed);
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    load.stop(rt);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while replicas() != 1 {
        most.fetch_max(replicas(), Ordering::Relaxed);
        assert!(std::time::Instant::now() < deadline, "never scaled down");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert_eq!(most.load(Ordering::Relaxed), 2, "never beyond max_replicas");
    let (_, got) = hypd.call(token, Method::GET, &format!("{endpoints}/sg"), None);
    let sizes: Vec<u64> = got["replica_history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["replicas"].as_u64().unwrap())
        .collect();
    assert_eq!(sizes.first(), Some(&2), "{got:#}");
    assert_eq!(sizes.last(), Some(&1), "{got:#}");

    // KEDA owns the count now: a count by hand is refused, by field.
    let (status, refused) = hypd.call(
        token,
        Method::POST,
        &format!("{endpoints}/sg/scale"),
        Some(json!({"replicas": 2})),
    );
    assert_eq!(
        (status, field_of(&refused).0),
        (422, "replicas"),
        "{refused}"
    );

    let path = format!("{endpoints}/sg");
    let (status, started) = hypd.confirmed(token, Method::DELETE, &path, Some(json!({})));
    assert_eq!(status, 200, "{started}");
    let op = hypd.finish(token, started["operation_id"].as_str().unwrap());
    assert_eq!(op["state"], "succeeded", "{op:#}");
    let left = rt.block_on(async {
        let roles = names::<k8s_openapi::api::rbac::v1::Role>(&client).await;
        (scaled_objects(&client).await.len(), roles.len())
    });
    assert_eq!(
        left,
        (0, 0),
        "the ScaledObject and the router's Role go too"
    );
}

/// SGLang workers KEDA may scale to zero behind the router: a cooldown shorter than the
/// cold start measured at deploy is refused by field once it is known (the endpoint
/// keeps serving, unscaled, until deleted); with a long enough one the workers go to
/// zero when idle, and an invocation is held by the router, which is what wakes a
/// worker, and answered by it, with KEDA's steps in the endpoint's history.
fn scale_to_zero(
    world: &World,
    hypd: &Hypd,
    token: &str,
    name: &str,
    rt: &tokio::runtime::Runtime,
) {
    let endpoints = format!("/api/v1/clusters/{name}/endpoints");
    let zero = |cooldown: u32| {
        json!({"endpoint": "zz", "engine": "sglang", "replicas": 1,
            "command": "python3 -m sglang.launch_server --model-path /s3/models/qwen --served-model-name zz",
            "router": {"policy": "round_robin"},
            "autoscaling": {"min_replicas": 0, "max_replicas": 1, "polling_interval_seconds": 5,
                "cooldown_seconds": cooldown}})
    };
    let delete = || {
        let path = format!("{endpoints}/zz");
        let (status, started) = hypd.confirmed(token, Method::DELETE, &path, Some(json!({})));
        assert_eq!(status, 200, "{started}");
        let op = hypd.finish(token, started["operation_id"].as_str().unwrap());
        assert_eq!(op["state"], "succeeded", "{op:#}");
    };
    // The sim's model servers load in 20 s: a 5 s cooldown is too short, which only the
    // measured cold start can tell.
    let (status, started) = hypd.call(token, Method::POST, &endpoints, Some(zero(5)));
    assert_eq!(status, 200, "{started}");
    let op = hypd.finish(token, started["operation_id"].as_str().unwrap());
    assert_eq!(op["state"], "failed", "{op:#}");
    let failed = crate::stage(&op, "autoscaling");
    assert_eq!(failed["state"], "failed", "{op:#}");
    let error = failed["error"].to_string();
    assert!(
        error.contains("autoscaling.cooldown_seconds") && error.contains("from scheduled to ready"),
        "{error}"
    );
    let client = rt.block_on(kube_client(world, name));
    assert!(
        !rt.block_on(scaled_objects(&client))
            .contains(&"zz".to_owned()),
        "no ScaledObject for a cooldown the rule refuses"
    );
    delete();

    // Slower, so that the held request spans several of KEDA's looks in real time too.
    clock(world, 60.0);
    let op = run_op(hypd, token, &endpoints, zero(60));
    assert_eq!(op["stages"].as_array().unwrap().len(), 5, "{op:#}");
    let deployments = Api::<Deployment>::namespaced(client.clone(), "default");
    let router = rt.block_on(deployments.get("zz-router")).unwrap();
    let line = router.spec.template.spec.unwrap().containers[0]
        .command
        .clone()
        .unwrap()
        .join(" ");
    assert!(
        line.contains("--retry-max-retries"),
        "the router holds requests: {line}"
    );
    let replicas = || {
        rt.block_on(deployments.get("zz"))
            .unwrap()
            .spec
            .replicas
            .unwrap_or(1)
    };
    crate::wait_until(
        "a scale to zero",
        std::time::Duration::from_secs(60),
        || replicas() == 0,
    );
    let (_, got) = hypd.call(token, Method::GET, &format!("{endpoints}/zz"), None);
    assert_eq!(got["phase"], "scaled_to_zero", "{got:#}");
    assert_eq!(got["autoscaling"]["min_replicas"], 0, "{got:#}");

    // Held by the router until KEDA has woken a worker, then answered by it.
    let (status, _, answer) = invoke(hypd, token, name, "zz", "wake up");
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["model"], "zz", "{answer}");
    assert_eq!(replicas(), 1);
    let (_, got) = hypd.call(token, Method::GET, &format!("{endpoints}/zz"), None);
    let sizes: Vec<u64> = got["replica_history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["replicas"].as_u64().unwrap())
        .collect();
    assert!(
        sizes.ends_with(&[0, 1]),
        "KEDA's steps to zero and back: {got:#}"
    );
    clock(world, FAST);
    delete();
}

/// SGLang workers KEDA sizes on the request rate through the router as well: the rate
/// comes from a Prometheus server hypd runs beside the router, which scrapes the
/// gateway's request counter. Short requests sent one after another keep few in flight
/// (the in-flight signal alone would not move) but many a second, which raises the
/// workers to the maximum; once they stop, the rate falls to nothing and the workers go
/// back to the minimum. Deleted, the Prometheus objects go too.
fn request_rate(world: &World, hypd: &Hypd, token: &str, name: &str, rt: &tokio::runtime::Runtime) {
    let endpoints = format!("/api/v1/clusters/{name}/endpoints");
    let rr = json!({"endpoint": "rr", "engine": "sglang", "replicas": 1,
        "command": "python3 -m sglang.launch_server --model-path /s3/models/qwen --served-model-name rr",
        "router": {"policy": "round_robin"},
        "autoscaling": {"min_replicas": 1, "max_replicas": 3, "target_requests_per_replica": 50,
            "polling_interval_seconds": 5, "cooldown_seconds": 60,
            "request_rate": {"target_per_replica": 0.5, "window_seconds": 60}}});
    let op = run_op(hypd, token, &endpoints, rr);
    assert_eq!(op["stages"].as_array().unwrap().len(), 5, "{op:#}");
    let (_, got) = hypd.call(token, Method::GET, &format!("{endpoints}/rr"), None);
    assert_eq!(
        got["autoscaling"]["request_rate_per_replica"], 0.5,
        "{got:#}"
    );
    let client = rt.block_on(kube_client(world, name));
    let deployments = Api::<Deployment>::namespaced(client.clone(), "default");
    let ready = |d: &str| {
        rt.block_on(deployments.get(d))
            .unwrap()
            .status
            .and_then(|s| s.ready_replicas)
            .unwrap_or(0)
    };
    crate::wait_until(
        "Prometheus ready",
        std::time::Duration::from_secs(60),
        || ready("rr-prometheus") >= 1,
    );
    let replicas = || {
        rt.block_on(deployments.get("rr"))
            .unwrap()
            .spec
            .replicas
            .unwrap_or(1)
    };

    // At this clock a request takes a few sim seconds' worth of real time at most, so a
    // handful of callers make several requests a sim second.
    clock(world, 20.0);
    let load = Load::start(rt, &client, "rr", 4, json!({"max_tokens": 4}));
    crate::wait_until(
        "a scale-up on the rate",
        std::time::Duration::from_secs(90),
        || replicas() == 3,
    );
    // What KEDA read: the rate Prometheus computes, well above one replica's share.
    let mut url = reqwest::Url::parse("http://prometheus/api/v1/query").unwrap();
    url.query_pairs_mut().append_pair(
        "query",
        "sum(rate(smg_http_requests_total{path=~\"/v1/.+|/generate\"}[60s]))",
    );
    let asked = rt
        .block_on(
            client.request_text(
                http::Request::get(format!(
                    "/api/v1/namespaces/default/services/rr-prometheus:9090/proxy/api/v1/query?{}",
                    url.query().unwrap()
                ))
                .body(Vec::new())
                .unwrap(),
            ),
        )
        .unwrap();
    let asked: Value = serde_json::from_str(&asked).unwrap();
    let rate: f64 = asked["data"]["result"][0]["value"][1]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(rate > 1.0, "{asked}");
    load.stop(rt);
    clock(world, FAST);
    crate::wait_until(
        "a scale-down once the rate fell",
        std::time::Duration::from_secs(90),
        || replicas() == 1,
    );
    let (_, got) = hypd.call(token, Method::GET, &format!("{endpoints}/rr"), None);
    let sizes: Vec<u64> = got["replica_history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["replicas"].as_u64().unwrap())
        .collect();
    assert!(sizes.contains(&3) && sizes.last() == Some(&1), "{got:#}");

    let path = format!("{endpoints}/rr");
    let (status, started) = hypd.confirmed(token, Method::DELETE, &path, Some(json!({})));
    assert_eq!(status, 200, "{started}");
    let op = hypd.finish(token, started["operation_id"].as_str().unwrap());
    assert_eq!(op["state"], "succeeded", "{op:#}");
    let left = rt.block_on(async {
        let maps = names::<k8s_openapi::api::core::v1::ConfigMap>(&client).await;
        let deployments = names::<Deployment>(&client).await;
        let services = names::<Service>(&client).await;
        [maps, deployments, services]
            .concat()
            .into_iter()
            .filter(|n| n.starts_with("rr"))
            .collect::<Vec<_>>()
    });
    assert!(left.is_empty(), "{left:?}");
}

/// Callers of endpoint `endpoint`'s Service through the API server's proxy, each asking
/// again as soon as it is answered, until stopped (or dropped, however the test ends: a
/// load task left running would keep the runtime, and the test, from ever finishing).
struct Load {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    fn start(
        rt: &tokio::runtime::Runtime,
        client: &kube::Client,
        endpoint: &str,
        callers: usize,
        options: Value,
    ) -> Self {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let path = format!(
            "/api/v1/namespaces/default/services/{endpoint}:30000/proxy/v1/chat/completions"
        );
        let tasks = (0..callers)
            .map(|i| {
                let (client, stop, path) = (client.clone(), stop.clone(), path.clone());
                let mut body = json!({"model": endpoint,
                    "messages": [{"role": "user", "content": format!("load {i}")}]});
                for (k, v) in options.as_object().unwrap() {
                    body[k] = v.clone();
                }
                rt.spawn(async move {
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        let request = http::Request::post(path.as_str())
                            .header("content-type", "application/json")
                            .body(serde_json::to_vec(&body).unwrap())
                            .unwrap();
                        let _ = client.request_text(request).await;
                    }
                })
            })
            .collect();
        Load { stop, tasks }
    }

    /// Stops the callers and waits until each has had its last answer.
    fn stop(mut self, rt: &tokio::runtime::Runtime) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for task in std::mem::take(&mut self.tasks) {
            rt.block_on(task).unwrap();
        }
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}
