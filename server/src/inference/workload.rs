//! The Deployment and Service a `deploy_model_server` request becomes. Pure: the same
//! request and placement give the same objects, so the dry run shows exactly what the
//! steps apply. Pods select the endpoint by one label (`hypd.dev/endpoint`), never by
//! the pod-template hash, so the Service keeps every replica whatever rolls out; what
//! hypd made the endpoint from rides on the Deployment as labels and annotations,
//! which is how the reads find it again without hypd's store.

use app::api::ApiError;
use app::api::inference::{
    DeployModelServer, ENDPOINT_LABEL, ModelSource, NAMESPACE, Serve, ServiceShape,
};
use app::api::storage::{SHARED_CLAIM, SHARED_MOUNT};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Service;
use serde_json::{Value, json};

use crate::resources::tags::K8S_MANAGED_BY;
use crate::training::NODE_GROUP_LABEL;
use crate::training::recipe::Target;

/// The extended resource a replica's GPUs are asked for by.
pub const GPU: &str = "nvidia.com/gpu";
pub const ENGINE_LABEL: &str = "hypd.dev/engine";
/// The model's name as clients ask for it.
pub const MODEL_ANNOTATION: &str = "hypd.dev/model";
pub const SHAPE_ANNOTATION: &str = "hypd.dev/service-shape";
pub const PORT_ANNOTATION: &str = "hypd.dev/port";
pub const GROUP_ANNOTATION: &str = "hypd.dev/instance-group";
/// The Secret holding the Hugging Face token (its name; never the token).
pub const SECRET_ANNOTATION: &str = "hypd.dev/hf-token-secret";
/// A model pool's models: every name its workers serve, comma-separated.
pub const SERVED_NAMES_ANNOTATION: &str = "hypd.dev/served-names";
/// The SGLang router's policy, on an endpoint behind one.
pub const ROUTER_ANNOTATION: &str = "hypd.dev/router-policy";
/// The slowest replica's cold start the last time the endpoint came up, in seconds.
pub const COLD_START_ANNOTATION: &str = "hypd.dev/cold-start-seconds";
pub use crate::training::OPERATION_ANNOTATION;

/// Seconds a replica may take to load its model before Kubernetes restarts it: large
/// models take many minutes to read from storage, and a probe that gives up first would
/// restart the load forever.
const STARTUP_SECONDS: i32 = 3600;

/// Where a replica runs and what it mounts besides the shared bucket.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Placement {
    pub target: Target,
    /// The storage the model is read from when it is not the shared bucket: its claim
    /// and mount path.
    pub storage: Option<(String, String)>,
}

fn labels(r: &DeployModelServer) -> Value {
    json!({
        ENDPOINT_LABEL: r.endpoint.as_str(),
        ENGINE_LABEL: r.engine.as_str(),
        K8S_MANAGED_BY.0: K8S_MANAGED_BY.1,
    })
}

/// The Deployment: `replicas` pods of the serving container, each with the replica's
/// GPUs on the group's nodes, the shared bucket at `/s3` (and the model's storage),
/// a memory-backed `/dev/shm` (tensor-parallel workers share through it), probes on
/// `/health`, and the token from its Secret.
pub fn deployment(
    r: &DeployModelServer,
    serve: &Serve,
    placement: &Placement,
    operation: &str,
    token_secret: Option<&str>,
) -> Result<Deployment, ApiError> {
    let image = r
        .image()
        .ok_or_else(|| ApiError::field("image", "a custom server names its image"))?;
    let gpus = r.gpus_per_replica.get().to_string();
    let mut env = vec![json!({"name": "HYPD_ENDPOINT", "value": r.endpoint.as_str()})];
    if let Some(secret) = token_secret {
        env.push(json!({ "name": "HF_TOKEN", "valueFrom": { "secretKeyRef": {
            "name": secret, "key": "token" } } }));
    }
    let mut mounts = vec![
        json!({ "name": "shared", "mountPath": SHARED_MOUNT }),
        json!({ "name": "dshm", "mountPath": "/dev/shm" }),
    ];
    let mut volumes = vec![
        json!({ "name": "shared", "persistentVolumeClaim": { "claimName": SHARED_CLAIM } }),
        json!({ "name": "dshm", "emptyDir": { "medium": "Memory" } }),
    ];
    if let Some((claim, mount)) = &placement.storage {
        mounts.push(json!({ "name": "model", "mountPath": mount, "readOnly": true }));
        volumes.push(json!({ "name": "model", "persistentVolumeClaim": { "claimName": claim, "readOnly": true } }));
    }
    let probe = |period: i32, failures: i32| json!({ "httpGet": { "path": "/health", "port": "http" }, "periodSeconds": period, "failureThreshold": failures });
    let mut annotations = json!({
        MODEL_ANNOTATION: serve.served_name,
        SHAPE_ANNOTATION: r.service.as_str(),
        PORT_ANNOTATION: serve.port.to_string(),
        OPERATION_ANNOTATION: operation,
    });
    if !placement.target.group.is_empty() {
        annotations[GROUP_ANNOTATION] = json!(placement.target.group);
    }
    if let Some(secret) = token_secret {
        annotations[SECRET_ANNOTATION] = json!(secret);
    }
    if r.service == ServiceShape::ModelPool {
        annotations[SERVED_NAMES_ANNOTATION] = json!(serve.served_names.join(","));
    }
    if let Some(router) = &r.router {
        annotations[ROUTER_ANNOTATION] = json!(router.policy.as_str());
    }
    let mut node_selector = json!({});
    if !placement.target.group.is_empty() {
        node_selector = json!({
            NODE_GROUP_LABEL: placement.target.group,
            "node.kubernetes.io/instance-type": placement.target.instance_type,
        });
    }
    let object = json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": r.endpoint.as_str(),
            "namespace": NAMESPACE,
            "labels": labels(r),
            "annotations": annotations,
        },
        "spec": {
            "replicas": r.replicas.get(),
            "selector": { "matchLabels": { ENDPOINT_LABEL: r.endpoint.as_str() } },
            "template": {
                "metadata": { "labels": labels(r) },
                "spec": {
                    "nodeSelector": node_selector,
                    "containers": [{
                        "name": "server",
                        "image": image,
                        "command": serve.words,
                        "ports": [{ "name": "http", "containerPort": serve.port }],
                        "env": env,
                        "resources": { "requests": { GPU: gpus }, "limits": { GPU: gpus } },
                        "volumeMounts": mounts,
                        "startupProbe": probe(10, STARTUP_SECONDS / 10),
                        "readinessProbe": probe(5, 3),
                        "livenessProbe": probe(30, 3),
                    }],
                    "volumes": volumes,
                },
            },
        },
    });
    serde_json::from_value(object).map_err(ApiError::internal)
}

/// The Service in front of the replicas (or of their router): in-cluster, or an internet-facing NLB made by
/// the AWS Load Balancer Controller (targets are the pods' IPs, so traffic skips the
/// nodes' ports).
pub fn service(r: &DeployModelServer, serve: &Serve) -> Result<Service, ApiError> {
    // Behind a router, clients reach the router, which reaches the replicas.
    let selector = match r.router {
        Some(_) => super::router::ROUTER_LABEL,
        None => ENDPOINT_LABEL,
    };
    let mut object = json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": r.endpoint.as_str(),
            "namespace": NAMESPACE,
            "labels": labels(r),
        },
        "spec": {
            "type": "ClusterIP",
            "selector": { selector: r.endpoint.as_str() },
            "ports": [{ "name": "http", "port": serve.port, "targetPort": "http", "protocol": "TCP" }],
        },
    });
    if r.service == ServiceShape::LoadBalancer {
        object["metadata"]["annotations"] = json!({
            "service.beta.kubernetes.io/aws-load-balancer-type": "external",
            "service.beta.kubernetes.io/aws-load-balancer-nlb-target-type": "ip",
            "service.beta.kubernetes.io/aws-load-balancer-scheme": "internet-facing",
        });
        object["spec"]["type"] = json!("LoadBalancer");
        object["spec"]["loadBalancerClass"] = json!("service.k8s.aws/nlb");
    }
    serde_json::from_value(object).map_err(ApiError::internal)
}

/// The storage a model path is read from: the shared bucket (`/s3/...`, always mounted)
/// or the storage whose mount path holds it.
pub fn storage_of<'a>(
    serve: &Serve,
    mounts: &'a [(String, String)],
) -> Result<Option<&'a (String, String)>, String> {
    let ModelSource::Path(path) = &serve.model else {
        return Ok(None);
    };
    if path.starts_with(&format!("{SHARED_MOUNT}/")) {
        return Ok(None);
    }
    mounts
        .iter()
        .find(|(_, mount)| path.starts_with(&format!("{mount}/")))
        .map(Some)
        .ok_or_else(|| {
            let known: Vec<&str> = std::iter::once(SHARED_MOUNT)
                .chain(mounts.iter().map(|(_, m)| m.as_str()))
                .collect();
            format!(
                "the model {path} is under no storage of the cluster (pods mount {})",
                known.join(", ")
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn request(extra: Value) -> DeployModelServer {
        let mut body = json!({"name": "ml-1", "endpoint": "qwen", "engine": "vllm",
            "command": "vllm serve /s3/models/Qwen/Qwen2.5-0.5B --served-model-name qwen",
            "gpus_per_replica": 2, "replicas": 3});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        serde_json::from_value(body).unwrap()
    }

    fn placement() -> Placement {
        Placement {
            target: Target {
                group: "gpu".into(),
                instance_type: "ml.g5.12xlarge".into(),
                gpus: 4,
                efa: 0,
            },
            storage: None,
        }
    }

    #[test]
    fn replicas_ask_for_their_gpus_on_the_groups_nodes_and_read_the_token_from_its_secret() {
        let r = request(json!({}));
        let serve = r.serve().unwrap();
        let d = serde_json::to_value(
            deployment(&r, &serve, &placement(), "op-1", Some("hypd-hf-token-x")).unwrap(),
        )
        .unwrap();
        assert_eq!(d["spec"]["replicas"], 3);
        assert_eq!(
            d["spec"]["selector"]["matchLabels"],
            json!({ENDPOINT_LABEL: "qwen"})
        );
        let pod = &d["spec"]["template"]["spec"];
        assert_eq!(pod["nodeSelector"][NODE_GROUP_LABEL], "gpu");
        let c = &pod["containers"][0];
        assert_eq!(c["image"], "vllm/vllm-openai:v0.11.0");
        assert_eq!(c["command"][0], "vllm");
        assert_eq!(c["resources"]["limits"][GPU], "2");
        assert_eq!(c["ports"][0]["containerPort"], 8000);
        assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/health");
        let token = c["env"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == "HF_TOKEN")
            .unwrap();
        assert_eq!(
            token["valueFrom"]["secretKeyRef"]["name"],
            "hypd-hf-token-x"
        );
        assert_eq!(d["metadata"]["annotations"][MODEL_ANNOTATION], "qwen");
        assert_eq!(
            d["metadata"]["annotations"][SECRET_ANNOTATION],
            "hypd-hf-token-x"
        );
        // The same request gives the same object: the plan is what is applied.
        assert_eq!(
            d,
            serde_json::to_value(
                deployment(&r, &serve, &placement(), "op-1", Some("hypd-hf-token-x")).unwrap()
            )
            .unwrap()
        );
    }

    #[test]
    fn a_load_balancer_is_an_internet_facing_nlb_and_cluster_ip_stays_inside() {
        let r = request(json!({"service": "load_balancer"}));
        let s = serde_json::to_value(service(&r, &r.serve().unwrap()).unwrap()).unwrap();
        assert_eq!(s["spec"]["type"], "LoadBalancer");
        assert_eq!(s["spec"]["loadBalancerClass"], "service.k8s.aws/nlb");
        assert_eq!(
            s["metadata"]["annotations"]["service.beta.kubernetes.io/aws-load-balancer-scheme"],
            "internet-facing"
        );
        let r = request(json!({}));
        let s = serde_json::to_value(service(&r, &r.serve().unwrap()).unwrap()).unwrap();
        assert_eq!(s["spec"]["type"], "ClusterIP");
        assert!(s["metadata"]["annotations"].is_null());
        assert_eq!(s["spec"]["selector"], json!({ENDPOINT_LABEL: "qwen"}));
    }

    #[test]
    fn a_model_outside_the_bucket_must_be_under_a_storages_mount() {
        let mounts = vec![("fsx-1".to_owned(), "/fsx".to_owned())];
        let on = |cmd: &str| {
            request(json!({"command": cmd}))
                .serve()
                .map(|s| storage_of(&s, &mounts).map(|m| m.cloned()))
                .unwrap()
        };
        assert_eq!(on("vllm serve /s3/models/m"), Ok(None));
        assert_eq!(on("vllm serve Qwen/Qwen2.5-0.5B"), Ok(None));
        assert_eq!(
            on("vllm serve /fsx/models/m"),
            Ok(Some(("fsx-1".into(), "/fsx".into())))
        );
        assert!(on("vllm serve /data/m").unwrap_err().contains("/s3, /fsx"));
    }
}
