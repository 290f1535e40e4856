//! The HyperPod inference operator's JumpStartModel controller, which runs exactly when
//! its InferenceEndpointConfig controller does: for each JumpStartModel `X` in `N` it
//! looks the model up in the SageMaker public hub (the sim's catalogue,
//! [`hub_contents`](crate::sagemaker::hub_contents), as the real operator asks
//! DescribeHubContent) and deploys it as the IEC controller deploys a vLLM worker —
//! Deployment `N/X` (pods `app=X`) of the hub's vLLM container on one GPU of the asked
//! instance type, and Service `N/X-service` on port 8080 — with no volume, since the
//! weights come prepacked. Its `kvCacheSpec` and `intelligentRoutingSpec` (the IEC's
//! schema) add LMCache to the worker and the router Deployment `X-N-router` and Service
//! `X-N-routing-service` in `hyperpod-inference-system`, refused and deployed as an
//! IEC's are; the routers of a model that is gone are swept. A model the hub lacks, a
//! gated model whose EULA is not accepted and an instance type the model does not
//! support are refused in the status. The cache and routing, deploying, sweeping and the
//! status are the IEC controller's own code, so a JumpStartModel reads exactly as an
//! IEC does.

use serde_json::{Value, json};

use super::inference_endpoints::{
    OwnerLabels, Plan, Refusal, cache_and_routing, container_name, deploy, health_probe, refuse,
    replicas, sweep, worker_specs, write_statuses,
};
use super::snapshot;
use crate::kube::store::{Store, meta};
use crate::sagemaker::hub_contents::{self, PUBLIC_HUB};

pub const JSM_GR: &str = "inference.sagemaker.aws.amazon.com/jumpstartmodels";
/// The port the hub's vLLM container serves on (SageMaker's model-serving port).
pub const JSM_PORT: u64 = 8080;
/// Where the container reads the model's prepacked weights.
const MODEL_DIR: &str = "/opt/ml/model";
/// What ties the worker objects to their JumpStartModel, apart from the IEC's labels so
/// neither kind's sweep ever takes the other's objects.
const JSM_OWNER: OwnerLabels = OwnerLabels {
    name: "inference.sagemaker.aws.amazon.com/jumpstart-model",
    namespace: "inference.sagemaker.aws.amazon.com/jumpstart-model-namespace",
    uid: "inference.sagemaker.aws.amazon.com/jumpstart-model-uid",
};

/// What the operator deploys for `jsm` in a cluster of `region` (whose hub it reads),
/// or why it will not.
fn plan(store: &Store, jsm: &Value, region: &str) -> Result<Plan, Refusal> {
    let name = meta(jsm, "name");
    let spec = &jsm["spec"];
    let model = &spec["model"];
    // The CRD requires both; a stored object that lacks them still gets a status.
    let Some(id) = model["modelId"].as_str() else {
        return refuse("InvalidSpec", "model.modelId is required");
    };
    let Some(instance_type) = spec["server"]["instanceType"].as_str() else {
        return refuse("InvalidSpec", "server.instanceType is required");
    };
    let hub = model["modelHubName"].as_str().unwrap_or(PUBLIC_HUB);
    if !hub_contents::is_public_hub(hub, region) {
        return refuse(
            "ModelNotFound",
            format!("model hub {hub} does not exist: JumpStart models come from {PUBLIC_HUB}"),
        );
    }
    // The HyperPod CLI writes an empty version for "the latest".
    let version = model["modelVersion"].as_str().filter(|v| !v.is_empty());
    let Some(m) = hub_contents::model(id, version) else {
        let versions = hub_contents::versions(id);
        return refuse(
            "ModelNotFound",
            match version {
                Some(v) if !versions.is_empty() => format!(
                    "model {id} has no version {v} in hub {PUBLIC_HUB}: its versions are {}",
                    versions.join(", ")
                ),
                _ => format!("model {id} is not in hub {PUBLIC_HUB}"),
            },
        );
    };
    if m.gated && model["acceptEula"] != true {
        return refuse(
            "EulaNotAccepted",
            format!(
                "model {id} {} is gated: accept its end-user license agreement ({}) by setting spec.model.acceptEula to true",
                m.version,
                m.eula_uri(region).unwrap_or_default()
            ),
        );
    }
    if !m.supports(instance_type) {
        return refuse(
            "UnsupportedInstanceType",
            format!(
                "instance type {instance_type} is not supported by model {id} {}: use one of {}",
                m.version,
                m.supported_instance_types.join(", ")
            ),
        );
    }
    let mut container = json!({
        "name": container_name(&name),
        "image": m.hosting_ecr_uri(region),
        "command": ["vllm", "serve", MODEL_DIR, "--served-model-name", id,
                    "--port", JSM_PORT.to_string()],
        "ports": [{ "name": "http", "containerPort": JSM_PORT, "protocol": "TCP" }],
        "resources": { "limits": { "nvidia.com/gpu": "1" } },
        "readinessProbe": health_probe(JSM_PORT),
    });
    let (routing, router) =
        cache_and_routing(store, jsm, &mut container, Vec::new(), Vec::new(), JSM_PORT)?;
    let pod = json!({
        "containers": [container],
        "nodeSelector": { "node.kubernetes.io/instance-type": instance_type },
    });
    let (worker, service) = worker_specs(&name, pod, replicas(spec), "http", JSM_PORT);
    Ok(Plan {
        routing,
        worker,
        service,
        router,
        volume: None,
    })
}

/// The worker objects (and router) of every JumpStartModel the hub can serve as asked;
/// those refused keep what they have, as refused IECs do. What a model that is gone
/// made outside its namespace goes with it.
pub(super) fn jumpstart_models(store: &mut Store, region: &str, now: &str) {
    for jsm in snapshot(store, JSM_GR) {
        if jsm["metadata"]["deletionTimestamp"].is_string() {
            continue;
        }
        if let Ok(plan) = plan(store, &jsm, region) {
            deploy(store, &jsm, plan, &JSM_OWNER, now);
        }
    }
    sweep(store, JSM_GR, &JSM_OWNER);
}

/// Every JumpStartModel's status, as IECs' are written.
pub(super) fn jumpstart_statuses(store: &mut Store, region: &str, epoch_now: f64, now: &str) {
    write_statuses(
        store,
        JSM_GR,
        |store, jsm| plan(store, jsm, region),
        epoch_now,
        now,
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::recording;
    use crate::kube::controllers::inference_endpoints::tests::{T0, get, serving};
    use crate::kube::controllers::inference_endpoints::{
        CAPACITY_GRACE_SECS, ROUTER_NS, inference_endpoints,
    };
    use crate::kube::controllers::{deployments, endpoints, gc, pods, replicasets};
    use crate::kube::inference_router::{Logic, Router};
    use crate::kube::model_server::{self, Engine};
    use crate::kube::store::Key;
    use crate::kube::time::{parse_rfc3339, rfc3339};

    const REGION: &str = "us-east-1";
    const QWEN: &str = "huggingface-llm-qwen2-5-7b-instruct";
    const LLAMA: &str = "meta-textgeneration-llama-3-1-8b-instruct";

    fn cluster(nodes: &[(&str, &str)]) -> Store {
        serving(
            include_str!("../../../crds/inference.sagemaker.aws.amazon.com_jumpstartmodels.yaml"),
            nodes,
        )
    }

    fn jsm(name: &str, model: Value, instance_type: &str) -> Value {
        json!({
            "apiVersion": "inference.sagemaker.aws.amazon.com/v1", "kind": "JumpStartModel",
            "metadata": { "name": name, "namespace": "ml", "uid": format!("uid-{name}"), "generation": 1,
                          "creationTimestamp": T0 },
            "spec": { "model": model, "server": { "instanceType": instance_type }, "replicas": 1 },
        })
    }

    fn put_jsm(store: &mut Store, o: Value) {
        let key = Key::new(JSM_GR, "ml", &meta(&o, "name"));
        store.put(key, o);
    }

    /// One controller pass at `t` seconds after T0, in `reconcile`'s order; when due next.
    fn step(store: &mut Store, t: f64) -> f64 {
        let epoch = parse_rfc3339(T0).unwrap() + t;
        let now = rfc3339(epoch);
        let ((), due) = recording(|| {
            gc::collect_garbage(store);
            jumpstart_models(store, REGION, &now);
            deployments::deployments(store, &now);
            replicasets::replicasets(store, &now);
            pods::pods(store, &[], epoch, &now);
            endpoints::endpoints(store, &now);
            jumpstart_statuses(store, REGION, epoch, &now);
        });
        due
    }

    /// Passes from `t` as `run` makes them (again at once after a pass that wrote, else
    /// when due) until nothing is due; the time reached.
    fn settle(store: &mut Store, mut t: f64) -> f64 {
        for _ in 0..100 {
            let rv = store.rv();
            let due = step(store, t);
            if store.rv() != rv {
                continue;
            }
            if due.is_infinite() {
                return t;
            }
            t += due;
        }
        panic!("the controllers keep writing");
    }

    /// `o` with the fields of `extra` added to its spec.
    fn with(mut o: Value, extra: Value) -> Value {
        if let (Some(spec), Some(extra)) = (o["spec"].as_object_mut(), extra.as_object()) {
            spec.extend(extra.clone());
        }
        o
    }

    /// The user's write of the fields of `extra` to JumpStartModel `name`'s spec.
    fn rewrite(store: &mut Store, name: &str, extra: Value) {
        let o = get(store, JSM_GR, "ml", name).unwrap();
        let generation = o["metadata"]["generation"].as_i64().unwrap() + 1;
        let mut o = with(o, extra);
        o["metadata"]["generation"] = json!(generation);
        put_jsm(store, o);
    }

    fn state(store: &Store, name: &str) -> (String, Value) {
        let o = get(store, JSM_GR, "ml", name).unwrap();
        (
            o["status"]["state"].as_str().unwrap_or_default().to_owned(),
            o["status"]["conditions"][0].clone(),
        )
    }

    #[test]
    fn a_jumpstart_model_deploys_the_hubs_vllm_container_completes_and_then_writes_nothing() {
        let mut store = cluster(&[("gpu-1", "ml.g5.8xlarge")]);
        put_jsm(
            &mut store,
            jsm(
                "qwen",
                json!({ "modelId": QWEN, "acceptEula": false }),
                "ml.g5.8xlarge",
            ),
        );
        step(&mut store, 0.0);
        assert_eq!(state(&store, "qwen").0, "DeploymentInProgress");
        let worker = get(&store, "apps/deployments", "ml", "qwen").unwrap();
        assert_eq!(
            worker["metadata"]["ownerReferences"][0]["kind"],
            "JumpStartModel"
        );
        assert_eq!(worker["metadata"]["ownerReferences"][0]["uid"], "uid-qwen");
        assert_eq!(worker["metadata"]["labels"][JSM_OWNER.name], "qwen");
        let pod = &worker["spec"]["template"];
        assert_eq!(pod["metadata"]["labels"], json!({ "app": "qwen" }));
        let c = &pod["spec"]["containers"][0];
        assert_eq!(c["name"], "qwen");
        assert_eq!(
            c["image"],
            "763104351884.dkr.ecr.us-east-1.amazonaws.com/vllm:0.11.0-gpu-py312"
        );
        assert_eq!(
            c["command"],
            json!([
                "vllm",
                "serve",
                "/opt/ml/model",
                "--served-model-name",
                QWEN,
                "--port",
                "8080"
            ])
        );
        assert_eq!(c["resources"]["limits"]["nvidia.com/gpu"], "1");
        assert_eq!(
            pod["spec"]["nodeSelector"],
            json!({ "node.kubernetes.io/instance-type": "ml.g5.8xlarge" })
        );
        assert!(pod["spec"]["volumes"].is_null(), "no model volume");
        let server = model_server::of(&json!({ "spec": pod["spec"] })).unwrap();
        assert_eq!(
            (server.engine, server.names.as_slice(), server.port),
            (Engine::Vllm, &[QWEN.to_owned()][..], 8080)
        );
        let service = get(&store, "/services", "ml", "qwen-service").unwrap();
        assert_eq!(service["spec"]["selector"], json!({ "app": "qwen" }));
        assert_eq!(service["spec"]["ports"][0]["port"], 8080);
        assert_eq!(service["metadata"]["ownerReferences"][0]["uid"], "uid-qwen");

        let t = settle(&mut store, 0.0);
        let (s, c) = state(&store, "qwen");
        assert_eq!(
            (s.as_str(), &c["reason"]),
            ("DeploymentComplete", &json!("DeploymentComplete"))
        );
        // START_SECS and the 20 s load.
        assert!((25.0..=26.0).contains(&t), "{t}");
        let status = get(&store, JSM_GR, "ml", "qwen").unwrap()["status"].clone();
        assert_eq!(
            (&status["selector"], &status["replicas"]),
            (&json!("app=qwen"), &json!(1))
        );
        assert_eq!(
            status["deploymentStatus"]["deploymentObjectOverallState"],
            "Available"
        );
        assert_eq!(status["deploymentStatus"]["status"]["readyReplicas"], 1);
        assert_eq!(status["conditions"][1]["type"], "InstanceTypeAvailable");
        let rv = store.rv();
        step(&mut store, t + 30.0);
        assert_eq!(store.rv(), rv, "a settled model writes nothing");
    }

    #[test]
    fn what_the_hub_lacks_or_forbids_fails_in_the_status_and_deploys_nothing() {
        let mut store = cluster(&[("gpu-1", "ml.g5.2xlarge")]);
        let llama70 = "meta-textgeneration-llama-3-3-70b-instruct";
        let cases = [
            (
                "unknown",
                json!({ "modelId": "no-such-model", "acceptEula": true }),
                "ml.g5.2xlarge",
                "ModelNotFound",
                "model no-such-model is not in hub SageMakerPublicHub".to_owned(),
            ),
            (
                "version",
                json!({ "modelId": QWEN, "modelVersion": "9.9.9", "acceptEula": false }),
                "ml.g5.2xlarge",
                "ModelNotFound",
                format!(
                    "model {QWEN} has no version 9.9.9 in hub SageMakerPublicHub: its versions are 1.0.0, 1.2.0"
                ),
            ),
            (
                "hub",
                json!({ "modelId": QWEN, "modelHubName": "my-hub", "acceptEula": false }),
                "ml.g5.2xlarge",
                "ModelNotFound",
                "model hub my-hub does not exist: JumpStart models come from SageMakerPublicHub"
                    .to_owned(),
            ),
            (
                "gated",
                json!({ "modelId": LLAMA, "acceptEula": false }),
                "ml.g5.2xlarge",
                "EulaNotAccepted",
                format!(
                    "model {LLAMA} 2.8.0 is gated: accept its end-user license agreement (s3://jumpstart-cache-prod-us-east-1/fmhMetadata/eula/llama3_1Eula.txt) by setting spec.model.acceptEula to true"
                ),
            ),
            (
                "small",
                json!({ "modelId": llama70, "acceptEula": true }),
                "ml.g5.2xlarge",
                "UnsupportedInstanceType",
                format!(
                    "instance type ml.g5.2xlarge is not supported by model {llama70} 1.0.0: use one of ml.g5.48xlarge, ml.p4d.24xlarge, ml.p5.48xlarge"
                ),
            ),
        ];
        for (name, model, instance_type, _, _) in &cases {
            put_jsm(&mut store, jsm(name, model.clone(), instance_type));
        }
        step(&mut store, 0.0);
        for (name, _, _, reason, message) in &cases {
            let (s, c) = state(&store, name);
            assert_eq!(
                (s.as_str(), &c["reason"], &c["message"]),
                ("DeploymentFailed", &json!(reason), &json!(message)),
                "{name}"
            );
            assert_eq!(c["status"], "False");
            assert!(
                get(&store, "apps/deployments", "ml", name).is_none(),
                "{name}: nothing deployed"
            );
            assert!(get(&store, "/services", "ml", &format!("{name}-service")).is_none());
        }
        // Accepting the EULA lets the gated model deploy.
        let mut gated = get(&store, JSM_GR, "ml", "gated").unwrap();
        gated["spec"]["model"]["acceptEula"] = json!(true);
        gated["metadata"]["generation"] = json!(2);
        put_jsm(&mut store, gated);
        step(&mut store, 1.0);
        assert_eq!(state(&store, "gated").0, "DeploymentInProgress");
        assert!(get(&store, "apps/deployments", "ml", "gated").is_some());
    }

    #[test]
    fn a_new_replica_count_resizes_the_deployment() {
        let mut store = cluster(&[("gpu-1", "ml.g5.2xlarge"), ("gpu-2", "ml.g5.2xlarge")]);
        put_jsm(
            &mut store,
            jsm(
                "qwen",
                json!({ "modelId": QWEN, "modelVersion": "1.0.0", "acceptEula": false }),
                "ml.g5.2xlarge",
            ),
        );
        let t = settle(&mut store, 0.0);
        assert_eq!(state(&store, "qwen").0, "DeploymentComplete");
        // The scale subresource's write.
        let mut scaled = get(&store, JSM_GR, "ml", "qwen").unwrap();
        scaled["spec"]["replicas"] = json!(2);
        scaled["metadata"]["generation"] = json!(2);
        put_jsm(&mut store, scaled);
        step(&mut store, t + 1.0);
        let worker = get(&store, "apps/deployments", "ml", "qwen").unwrap();
        assert_eq!(worker["spec"]["replicas"], 2);
        assert_eq!(state(&store, "qwen").0, "DeploymentInProgress");
        settle(&mut store, t + 1.0);
        let status = get(&store, JSM_GR, "ml", "qwen").unwrap()["status"].clone();
        assert_eq!(
            (
                &status["state"],
                &status["replicas"],
                &status["observedGeneration"]
            ),
            (&json!("DeploymentComplete"), &json!(2), &json!(2))
        );
        assert_eq!(store.list("/pods", Some("ml")).count(), 2);
    }

    #[test]
    fn without_a_node_of_its_type_a_model_waits_then_fails() {
        let mut store = cluster(&[("cpu-1", "ml.m5.xlarge")]);
        put_jsm(
            &mut store,
            jsm(
                "qwen",
                json!({ "modelId": QWEN, "acceptEula": false }),
                "ml.g6.2xlarge",
            ),
        );
        let due = step(&mut store, 0.0);
        let (s, c) = state(&store, "qwen");
        assert_eq!(
            (s.as_str(), &c["reason"]),
            ("DeploymentPending", &json!("WaitingForCapacity"))
        );
        assert_eq!(due, CAPACITY_GRACE_SECS, "due when the grace ends");
        step(&mut store, CAPACITY_GRACE_SECS);
        let (s, c) = state(&store, "qwen");
        assert_eq!(
            (s.as_str(), &c["reason"]),
            ("DeploymentFailed", &json!("InsufficientCapacity"))
        );
        assert_eq!(
            c["message"],
            "the cluster has had no node of instance type ml.g6.2xlarge for 60s: the worker pods cannot be scheduled; add an instance group of that type"
        );
    }

    #[test]
    fn what_a_model_made_goes_when_it_goes() {
        let mut store = cluster(&[("gpu-1", "ml.g5.2xlarge")]);
        put_jsm(
            &mut store,
            jsm(
                "qwen",
                json!({ "modelId": QWEN, "acceptEula": false }),
                "ml.g5.2xlarge",
            ),
        );
        let t = settle(&mut store, 0.0);
        assert_eq!(store.list("/pods", Some("ml")).count(), 1);
        store.remove(&Key::new(JSM_GR, "ml", "qwen"));
        for i in 1..6 {
            step(&mut store, t + f64::from(i));
        }
        assert!(get(&store, "apps/deployments", "ml", "qwen").is_none());
        assert!(get(&store, "/services", "ml", "qwen-service").is_none());
        assert_eq!(store.list("/pods", None).count(), 0, "and the pods");
    }

    #[test]
    fn kv_cache_and_session_routing_give_lmcache_and_a_router_that_goes_with_the_model() {
        let mut store = cluster(&[("gpu-1", "ml.g5.8xlarge")]);
        let redis = "redis://redis.ml.svc.cluster.local:6379";
        let extra = json!({
            "kvCacheSpec": { "enableL1Cache": true, "enableL2Cache": true,
                "l2CacheSpec": { "l2CacheBackend": "redis", "l2CacheLocalUrl": redis } },
            "intelligentRoutingSpec": { "enabled": true, "routingStrategy": "session" } });
        put_jsm(
            &mut store,
            with(
                jsm(
                    "qwen",
                    json!({ "modelId": QWEN, "acceptEula": false }),
                    "ml.g5.8xlarge",
                ),
                extra,
            ),
        );
        step(&mut store, 0.0);
        assert_eq!(state(&store, "qwen").0, "DeploymentInProgress");
        let worker = get(&store, "apps/deployments", "ml", "qwen").unwrap();
        assert_eq!(
            worker["metadata"]["annotations"]["inference.sagemaker.aws.amazon.com/intelligent-routing"],
            "true"
        );
        let pod = &worker["spec"]["template"];
        let c = &pod["spec"]["containers"][0];
        assert_eq!(
            c["args"],
            json!([
                "--kv-transfer-config",
                r#"{"kv_connector":"LMCacheConnectorV1","kv_role":"kv_both"}"#
            ])
        );
        let env: Vec<(&str, &str)> = c["env"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| (e["name"].as_str().unwrap(), e["value"].as_str().unwrap()))
            .collect();
        assert_eq!(
            env,
            [
                ("LMCACHE_USE_EXPERIMENTAL", "True"),
                ("LMCACHE_CHUNK_SIZE", "256"),
                ("LMCACHE_LOCAL_CPU", "True"),
                ("LMCACHE_MAX_LOCAL_CPU_SIZE", "20"),
                ("LMCACHE_REMOTE_URL", redis),
                ("LMCACHE_REMOTE_SERDE", "naive"),
            ]
        );
        let server = model_server::of(&json!({ "spec": pod["spec"] })).unwrap();
        assert_eq!(
            (server.engine, server.names.as_slice(), server.port),
            (Engine::Vllm, &[QWEN.to_owned()][..], 8080),
            "still the hub's vLLM, with the cache's arguments after its command"
        );

        let router = get(&store, "apps/deployments", ROUTER_NS, "qwen-ml-router").unwrap();
        let parsed = Router::of(&json!({ "spec": router["spec"]["template"]["spec"] })).unwrap();
        assert_eq!(
            (parsed.logic, parsed.session_key.as_deref()),
            (Logic::Session, Some("x-session-id"))
        );
        assert_eq!(
            (
                parsed.namespace.as_str(),
                parsed.selector.as_str(),
                parsed.worker_port
            ),
            ("ml", "app=qwen", 8080)
        );
        assert!(
            router["metadata"]["ownerReferences"].is_null(),
            "no owner in another namespace"
        );
        let labels = &router["metadata"]["labels"];
        assert_eq!(
            (
                &labels[JSM_OWNER.name],
                &labels[JSM_OWNER.namespace],
                &labels[JSM_OWNER.uid]
            ),
            (&json!("qwen"), &json!("ml"), &json!("uid-qwen"))
        );
        assert!(
            labels["inference.sagemaker.aws.amazon.com/endpoint-config"].is_null(),
            "not an IEC's"
        );
        let routing = get(&store, "/services", ROUTER_NS, "qwen-ml-routing-service").unwrap();
        assert_eq!(
            routing["spec"]["selector"],
            json!({ "app": "qwen-ml-router" })
        );
        assert_eq!(
            (
                &routing["spec"]["ports"][0]["port"],
                &routing["spec"]["ports"][0]["targetPort"]
            ),
            (&json!(443), &json!(8080))
        );

        let t = settle(&mut store, 0.0);
        let (s, c) = state(&store, "qwen");
        assert_eq!(
            (s.as_str(), &c["reason"]),
            ("DeploymentComplete", &json!("DeploymentComplete"))
        );
        let router = get(&store, "apps/deployments", ROUTER_NS, "qwen-ml-router").unwrap();
        assert_eq!(
            router["status"]["readyReplicas"], 1,
            "complete with its router"
        );
        let rv = store.rv();
        step(&mut store, t + 30.0);
        assert_eq!(store.rv(), rv, "a settled model writes nothing");

        // Each kind's sweep takes only what its own kind's gone objects made: the
        // routing Service of an IEC that is gone stays through the JumpStartModels'
        // pass, and the model's router through the IECs'.
        let orphan = json!({ "apiVersion": "v1", "kind": "Service",
            "metadata": { "name": "gone-ml-routing-service", "namespace": ROUTER_NS, "labels": {
                "app": "gone-ml-router",
                "inference.sagemaker.aws.amazon.com/endpoint-config": "gone",
                "inference.sagemaker.aws.amazon.com/endpoint-config-namespace": "ml",
                "inference.sagemaker.aws.amazon.com/endpoint-config-uid": "uid-gone" } },
            "spec": routing["spec"].clone() });
        let orphan_key = Key::new("/services", ROUTER_NS, "gone-ml-routing-service");
        store.put(orphan_key.clone(), orphan);
        step(&mut store, t + 31.0);
        assert!(store.get(&orphan_key).is_some(), "not the model's to sweep");
        let now = rfc3339(parse_rfc3339(T0).unwrap() + t + 32.0);
        inference_endpoints(&mut store, &[], REGION, &now);
        assert!(store.get(&orphan_key).is_none(), "the IECs' to sweep");
        assert!(get(&store, "apps/deployments", ROUTER_NS, "qwen-ml-router").is_some());
        assert!(get(&store, "/services", ROUTER_NS, "qwen-ml-routing-service").is_some());

        store.remove(&Key::new(JSM_GR, "ml", "qwen"));
        for i in 0..6 {
            step(&mut store, t + 33.0 + f64::from(i));
        }
        assert!(get(&store, "apps/deployments", ROUTER_NS, "qwen-ml-router").is_none());
        assert!(get(&store, "/services", ROUTER_NS, "qwen-ml-routing-service").is_none());
        assert!(get(&store, "apps/deployments", "ml", "qwen").is_none());
        assert_eq!(store.list("/pods", None).count(), 0, "and the pods");
    }

    #[test]
    fn routing_turned_on_or_off_once_deployed_and_a_redis_cache_without_its_url_are_refused() {
        let mut store = cluster(&[("gpu-1", "ml.g5.8xlarge"), ("gpu-2", "ml.g5.8xlarge")]);
        let model = json!({ "modelId": QWEN, "acceptEula": false });
        put_jsm(&mut store, jsm("plain", model.clone(), "ml.g5.8xlarge"));
        put_jsm(
            &mut store,
            with(
                jsm("routed", model.clone(), "ml.g5.8xlarge"),
                json!({ "intelligentRoutingSpec": { "enabled": true } }),
            ),
        );
        put_jsm(
            &mut store,
            with(
                jsm("redis", model, "ml.g5.8xlarge"),
                json!({ "kvCacheSpec": { "enableL2Cache": true,
                                         "l2CacheSpec": { "l2CacheBackend": "redis" } } }),
            ),
        );
        step(&mut store, 0.0);
        let (s, c) = state(&store, "redis");
        assert_eq!(
            (s.as_str(), &c["reason"], &c["message"]),
            (
                "DeploymentFailed",
                &json!("InvalidKVCacheSpec"),
                &json!(
                    "kvCacheSpec.l2CacheSpec.l2CacheLocalUrl is required when l2CacheBackend is redis"
                )
            )
        );
        assert!(get(&store, "apps/deployments", "ml", "redis").is_none());
        let router = get(&store, "apps/deployments", ROUTER_NS, "routed-ml-router").unwrap();
        let parsed = Router::of(&json!({ "spec": router["spec"]["template"]["spec"] })).unwrap();
        assert_eq!(
            (parsed.logic, parsed.session_key),
            (Logic::PrefixAware, None),
            "the CRD's default strategy"
        );

        let on = json!({ "intelligentRoutingSpec": { "enabled": true } });
        rewrite(&mut store, "plain", on);
        let off = json!({ "intelligentRoutingSpec": { "enabled": false } });
        rewrite(&mut store, "routed", off);
        step(&mut store, 1.0);
        for (name, was, now) in [("plain", false, true), ("routed", true, false)] {
            let (s, c) = state(&store, name);
            assert_eq!(
                (s.as_str(), &c["reason"], &c["message"]),
                (
                    "DeploymentFailed",
                    &json!("IntelligentRoutingImmutable"),
                    &json!(format!(
                        "intelligentRoutingSpec.enabled cannot be changed on an existing deployment (deployed with {was}, now {now}): delete the JumpStartModel and create it again"
                    ))
                ),
                "{name}"
            );
        }
        assert!(get(&store, "apps/deployments", ROUTER_NS, "plain-ml-router").is_none());
        assert!(
            get(&store, "apps/deployments", ROUTER_NS, "routed-ml-router").is_some(),
            "a refused model keeps what it has"
        );

        // Turned back, it is fine again.
        let back = json!({ "intelligentRoutingSpec": { "enabled": false } });
        rewrite(&mut store, "plain", back);
        step(&mut store, 2.0);
        assert_eq!(state(&store, "plain").0, "DeploymentInProgress");
    }
}
