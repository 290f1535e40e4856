//! Model serving through the API server's service proxy, as hypd's `invoke_endpoint`
//! reaches it with kube-rs: vLLM pods behind a Service load before they are Ready, the
//! proxy answers 503 with a Status while no pod is, then relays the pods' OpenAI answers
//! (deterministic, counted, pod named in a header); Endpoints follow the pods. The
//! inference operator's InferenceEndpointConfigs become such workers, with LMCache and a
//! router when asked, and are scaled and deleted through the custom resource.

use std::collections::BTreeSet;

use crate::support::{
    Answer, active_cluster, call, call_in, client_without_retries, eks_client, eks_token,
    inference_cluster, inject, moto, network, register_node, set_time_scale, sim, wait_for,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{
    Endpoints, PersistentVolume, PersistentVolumeClaim, Pod, Service,
};
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch,
    PatchParams, PostParams,
};
use serde_json::{Value, json};

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

/// An InferenceEndpointConfig as AWS's samples write one: a vLLM worker reading its
/// model from S3 on one GPU of an `ml.g5.8xlarge`.
fn endpoint_config(name: &str, image: &str, args: Value) -> Value {
    json!({
        "apiVersion": "inference.sagemaker.aws.amazon.com/v1",
        "kind": "InferenceEndpointConfig",
        "metadata": { "name": name },
        "spec": {
            "modelName": "Llama-3-1-8B-Instruct",
            "instanceType": "ml.g5.8xlarge",
            "replicas": 1,
            "invocationEndpoint": "v1/chat/completions",
            "modelSourceConfig": {
                "modelSourceType": "s3",
                "s3Storage": { "bucketName": "hypd-models", "region": "us-east-1" },
                "modelLocation": "llama31_8b",
            },
            "worker": {
                "image": image,
                "args": args,
                "resources": { "limits": { "nvidia.com/gpu": "1" },
                               "requests": { "cpu": "6", "memory": "30Gi", "nvidia.com/gpu": "1" } },
                "modelInvocationPort": { "containerPort": 8000, "name": "http" },
                "modelVolumeMount": { "name": "model-weights", "mountPath": "/opt/ml/model" },
                "environmentVariables": [{ "name": "HF_HOME", "value": "/tmp/hf_home" }],
            },
        },
    })
}

fn state(o: &DynamicObject) -> String {
    o.data["status"]["state"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

fn env_of(d: &Deployment) -> Vec<(String, String)> {
    let c = &d.spec.template.spec.as_ref().unwrap().containers[0];
    c.env
        .iter()
        .flatten()
        .map(|e| (e.name.clone(), e.value.clone().unwrap_or_default()))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn inference_endpoint_configs_become_workers_behind_a_router_and_go_with_their_config() {
    let (_moto, moto_url) = moto();
    let net = network(&moto_url).await;
    let (_sim, sim_url) = sim(&moto_url, 600.0);
    let client = inference_cluster(
        &sim_url,
        &net,
        "inferenceendpointconfigs.inference.sagemaker.aws.amazon.com",
    )
    .await;
    let gvk = GroupVersionKind::gvk(
        "inference.sagemaker.aws.amazon.com",
        "v1",
        "InferenceEndpointConfig",
    );
    let ar = ApiResource::from_gvk_with_plural(&gvk, "inferenceendpointconfigs");
    let iecs: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &ar);
    let create = |o: Value| {
        let iecs = iecs.clone();
        async move {
            iecs.create(&PostParams::default(), &serde_json::from_value(o).unwrap())
                .await
        }
    };
    let vllm_args = json!([
        "--model",
        "/opt/ml/model",
        "--served-model-name",
        "llama-8b",
        "--max-model-len",
        "4096"
    ]);

    // The CRD's schema holds: a strategy it does not list is refused.
    let mut fastest = endpoint_config("fastest", "vllm/vllm-openai:v0.10.1", vllm_args.clone());
    fastest["spec"]["intelligentRoutingSpec"] =
        json!({ "enabled": true, "routingStrategy": "fastest" });
    match create(fastest).await {
        Err(kube::Error::Api(e)) => {
            assert_eq!((e.code, e.reason.as_str()), (422, "Invalid"), "{e:?}");
            assert!(
                e.message
                    .contains("spec.intelligentRoutingSpec.routingStrategy"),
                "{}",
                e.message
            );
        }
        other => panic!("an unknown routing strategy was accepted: {other:?}"),
    }

    // Ten simulated seconds a real one: the workers' 5 s start and 20 s load take 2.5 s.
    set_time_scale(&sim_url, 10.0).await;
    let mut llama = endpoint_config("llama", "vllm/vllm-openai:v0.10.1", vllm_args.clone());
    llama["spec"]["kvCacheSpec"] = json!({ "enableL1Cache": true, "enableL2Cache": true,
        "l2CacheSpec": { "l2CacheBackend": "redis",
                         "l2CacheLocalUrl": "redis://redis.default.svc.cluster.local:6379" } });
    llama["spec"]["intelligentRoutingSpec"] =
        json!({ "enabled": true, "routingStrategy": "prefixaware" });
    create(llama).await.unwrap();
    let mut sglang = endpoint_config(
        "qwen-sglang",
        "lmsysorg/sglang:v0.4.9",
        json!([
            "python3",
            "-m",
            "sglang.launch_server",
            "--model-path",
            "/opt/ml/model",
            "--port",
            "8000"
        ]),
    );
    sglang["spec"]["kvCacheSpec"] = json!({ "enableL1Cache": true });
    create(sglang).await.unwrap();

    // Once its router runs and before the worker has loaded, frozen to look: the router
    // itself answers that it has no worker to send to.
    let system = "hyperpod-inference-system";
    let routers: Api<Deployment> = Api::namespaced(client.clone(), system);
    wait_for("the router up, the worker loading", || async {
        let router_up = routers
            .get_opt("llama-default-router")
            .await
            .unwrap()
            .and_then(|d| d.status)
            .and_then(|s| s.ready_replicas)
            == Some(1);
        router_up && state(&iecs.get("llama").await.unwrap()) == "DeploymentInProgress"
    })
    .await;
    set_time_scale(&sim_url, 0.0).await;
    let early = call_in(
        &client,
        system,
        "POST",
        "llama-default-routing-service:443",
        "/v1/chat/completions",
        Some(ask("llama-8b")),
    )
    .await;
    assert_eq!(early.status, 503, "{}", early.body);
    assert_eq!(
        early.body["message"],
        "no ready worker matches app=llama in namespace default"
    );
    assert!(
        early
            .pod
            .as_deref()
            .unwrap()
            .starts_with("llama-default-router-")
    );
    set_time_scale(&sim_url, 10.0).await;
    let seen = std::sync::Mutex::new(BTreeSet::from(["DeploymentInProgress".to_owned()]));
    wait_for("llama deployed", || async {
        let s = state(&iecs.get("llama").await.unwrap());
        seen.lock().unwrap().insert(s.clone());
        s == "DeploymentComplete"
    })
    .await;
    let seen = seen.into_inner().unwrap();
    assert_eq!(
        seen,
        BTreeSet::from([
            "DeploymentInProgress".to_owned(),
            "DeploymentComplete".to_owned()
        ]),
        "in progress while the model loads, then complete"
    );
    let failed = iecs.get("qwen-sglang").await.unwrap();
    assert_eq!(state(&failed), "DeploymentFailed");
    let ready = &failed.data["status"]["conditions"][0];
    assert_eq!(
        (&ready["type"], &ready["status"]),
        (&json!("DeploymentReady"), &json!("False"))
    );
    assert_eq!(ready["reason"], "UnsupportedModelServer");
    assert_eq!(
        ready["message"],
        "KV caching is supported only with vLLM-based inference containers: the worker runs SGLang"
    );
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "default");
    assert!(
        deployments.get_opt("qwen-sglang").await.unwrap().is_none(),
        "nothing deployed"
    );

    // The worker: the image's entrypoint with its args, LMCache's L1 and L2 (redis) cache,
    // the GPU, the instance type and the model's S3 volume.
    let status = iecs.get("llama").await.unwrap().data["status"].clone();
    assert_eq!(status["replicas"], 1);
    assert_eq!(status["selector"], "app=llama");
    assert_eq!(status["observedGeneration"], 1);
    assert_eq!(status["deploymentStatus"]["name"], "llama");
    assert_eq!(status["deploymentStatus"]["status"]["readyReplicas"], 1);
    assert_eq!(
        status["deploymentStatus"]["deploymentObjectOverallState"],
        "Available"
    );
    assert_eq!(status["conditions"][0]["status"], "True");
    let worker = deployments.get("llama").await.unwrap();
    let env = env_of(&worker);
    for (k, v) in [
        ("HF_HOME", "/tmp/hf_home"),
        ("LMCACHE_LOCAL_CPU", "True"),
        (
            "LMCACHE_REMOTE_URL",
            "redis://redis.default.svc.cluster.local:6379",
        ),
    ] {
        assert!(
            env.contains(&(k.to_owned(), v.to_owned())),
            "{k}={v} in {env:?}"
        );
    }
    let pod_spec = worker.spec.template.spec.clone().unwrap();
    let container = &pod_spec.containers[0];
    assert_eq!(container.image.as_deref(), Some("vllm/vllm-openai:v0.10.1"));
    assert_eq!(container.command, None, "the image's entrypoint runs");
    let args = container.args.clone().unwrap();
    let kv = args
        .iter()
        .position(|a| a == "--kv-transfer-config")
        .expect("LMCache connector");
    assert!(args[kv + 1].contains("LMCacheConnectorV1"), "{args:?}");
    assert_eq!(
        pod_spec.node_selector.unwrap()["node.kubernetes.io/instance-type"],
        "ml.g5.8xlarge"
    );
    let claim = pod_spec.volumes.unwrap()[0]
        .persistent_volume_claim
        .clone()
        .unwrap();
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "default");
    let volume = claims
        .get(&claim.claim_name)
        .await
        .unwrap()
        .spec
        .unwrap()
        .volume_name
        .unwrap();
    let pv = Api::<PersistentVolume>::all(client.clone())
        .get(&volume)
        .await
        .unwrap()
        .spec
        .unwrap();
    let csi = pv.csi.unwrap();
    assert_eq!(csi.driver, "s3.csi.aws.com");
    assert_eq!(csi.volume_attributes.unwrap()["bucketName"], "hypd-models");
    assert!(
        pv.mount_options
            .unwrap()
            .contains(&"prefix llama31_8b/".to_owned())
    );
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    let port = &services
        .get("llama-service")
        .await
        .unwrap()
        .spec
        .unwrap()
        .ports
        .unwrap()[0];
    assert_eq!(port.port, 8000);

    // The router fronts the workers from the operator's namespace, with the strategy.
    let router = routers.get("llama-default-router").await.unwrap();
    let router_args = router.spec.template.spec.unwrap().containers[0]
        .args
        .clone()
        .unwrap();
    let logic = router_args
        .iter()
        .position(|a| a == "--routing-logic")
        .unwrap();
    assert_eq!(router_args[logic + 1], "prefixaware");
    let routed = call_in(
        &client,
        system,
        "POST",
        "llama-default-routing-service:443",
        "/v1/chat/completions",
        Some(ask("llama-8b")),
    )
    .await;
    assert_eq!(routed.status, 200, "{}", routed.body);
    assert_eq!(
        routed.body["model"], "llama-8b",
        "vLLM serves the name it was given"
    );
    assert_eq!(routed.body["object"], "chat.completion");
    assert!(
        routed.pod.as_deref().unwrap().starts_with("llama-"),
        "{:?}",
        routed.pod
    );
    let direct = call(
        &client,
        "POST",
        "llama-service:8000",
        "/v1/chat/completions",
        Some(ask("llama-8b")),
    )
    .await;
    assert_eq!(
        direct.body["choices"], routed.body["choices"],
        "one model, one answer"
    );

    // The scale subresource moves the worker Deployment.
    iecs.patch_scale(
        "llama",
        &PatchParams::default(),
        &Patch::Merge(json!({ "spec": { "replicas": 2 } })),
    )
    .await
    .unwrap();
    wait_for("two llama replicas ready", || async {
        let s = iecs.get("llama").await.unwrap().data["status"].clone();
        s["state"] == "DeploymentComplete"
            && s["replicas"] == 2
            && s["deploymentStatus"]["status"]["readyReplicas"] == 2
    })
    .await;
    assert_eq!(
        deployments.get("llama").await.unwrap().spec.replicas,
        Some(2)
    );
    let scale = iecs.get_scale("llama").await.unwrap();
    assert_eq!(scale.status.unwrap().selector.as_deref(), Some("app=llama"));

    // Deleting the config takes what it made, here and in the operator's namespace.
    iecs.delete("llama", &DeleteParams::default())
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let router_services: Api<Service> = Api::namespaced(client.clone(), system);
    wait_for("llama's objects gone", || async {
        deployments.get_opt("llama").await.unwrap().is_none()
            && services.get_opt("llama-service").await.unwrap().is_none()
            && routers
                .get_opt("llama-default-router")
                .await
                .unwrap()
                .is_none()
            && router_services
                .get_opt("llama-default-routing-service")
                .await
                .unwrap()
                .is_none()
            && pods
                .list(&ListParams::default().labels("app=llama"))
                .await
                .unwrap()
                .items
                .is_empty()
    })
    .await;
}
