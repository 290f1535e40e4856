//! The InferenceEndpointConfig a `deploy_inference_endpoint` request becomes. Pure: the
//! same request, group and model source give the same object, so the dry run shows
//! exactly what the step applies. The serve command is the one deploy_model_server
//! takes; the operator mounts the model at its own path, so the command is rewritten to
//! read it there and keeps the name clients ask for. Every field is one of AWS's CRD,
//! which the API server checks the object against.

use app::api::ApiError;
use app::api::inference::{
    DeployInferenceEndpoint, ENDPOINT_LABEL, KvCache, L2Cache, ModelSource, NAMESPACE,
    RoutingStrategy, Serve,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::{Value, json};

use super::workload::{
    ENGINE_LABEL, GPU, GROUP_ANNOTATION, MODEL_ANNOTATION, OPERATION_ANNOTATION, PORT_ANNOTATION,
    SECRET_ANNOTATION,
};
use crate::resources::kube::inference::InferenceEndpointConfig;
use crate::resources::tags::K8S_MANAGED_BY;
use crate::training::NODE_GROUP_LABEL;
use crate::training::recipe::Target;

/// Where the operator mounts the model in every worker (the CRD's default).
pub const MODEL_MOUNT: &str = "/opt/ml/model";
/// The path of an OpenAI chat completion, which the operator's invocations are sent to.
pub const INVOCATION_PATH: &str = "v1/chat/completions";

/// Where the operator reads the model from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// A bucket (the shared one, or an S3 storage's) and the key prefix in it.
    S3 {
        bucket: String,
        region: String,
        location: String,
    },
    /// An FSx for Lustre storage's file system and the directory in it.
    Fsx {
        file_system: String,
        location: String,
    },
    /// A Hugging Face repository, downloaded by the operator before the worker starts.
    Hub { model: String },
}

/// The command's words with the model read from the operator's mount, and the name
/// clients ask for kept (it would otherwise become the mount's path).
fn worker_command(serve: &Serve) -> Vec<String> {
    let model = serve.model.as_str();
    let mut words: Vec<String> = serve
        .words
        .iter()
        .map(|w| {
            if w == model {
                MODEL_MOUNT.to_owned()
            } else if let Some((flag, value)) = w.split_once('=')
                && value == model
                && flag.starts_with("--model")
            {
                format!("{flag}={MODEL_MOUNT}")
            } else {
                w.clone()
            }
        })
        .collect();
    let named = words
        .iter()
        .any(|w| w == "--served-model-name" || w.starts_with("--served-model-name="));
    if !named {
        words.extend(["--served-model-name".to_owned(), serve.served_name.clone()]);
    }
    words
}

fn kv_cache_spec(kv: &KvCache) -> Value {
    let mut spec = json!({ "enableL1Cache": kv.cpu_offload, "enableL2Cache": kv.l2.is_some() });
    match &kv.l2 {
        Some(L2Cache::TieredStorage) => {
            spec["l2CacheSpec"] = json!({ "l2CacheBackend": "tieredstorage" });
        }
        Some(L2Cache::Redis { url }) => {
            spec["l2CacheSpec"] =
                json!({ "l2CacheBackend": "redis", "l2CacheLocalUrl": url.as_str() });
        }
        None => {}
    }
    spec
}

/// The operator's own options, which an InferenceEndpointConfig's and a JumpStartModel's
/// specs hold alike (the two CRDs share their schema).
pub(crate) fn operator_options(
    spec: &mut Value,
    kv: Option<&KvCache>,
    routing: Option<RoutingStrategy>,
) {
    if let Some(kv) = kv {
        spec["kvCacheSpec"] = kv_cache_spec(kv);
    }
    if let Some(routing) = routing {
        spec["intelligentRoutingSpec"] =
            json!({ "enabled": true, "routingStrategy": routing.operator_name() });
    }
}

/// The object: `replicas` workers of the serve command on the group's nodes (by node
/// affinity on the group and its instance type), the model from `source`, the KV cache
/// and routing asked for.
pub fn config(
    r: &DeployInferenceEndpoint,
    serve: &Serve,
    target: &Target,
    source: &Source,
    operation: &str,
    token_secret: Option<&str>,
) -> Result<InferenceEndpointConfig, ApiError> {
    let image = r
        .as_model_server()
        .image()
        .ok_or_else(|| ApiError::field("image", "a custom server names its image"))?
        .to_owned();
    let gpus = r.gpus_per_replica.get().to_string();
    let model_source = match source {
        Source::S3 {
            bucket,
            region,
            location,
        } => json!({
            "modelSourceType": "s3",
            "s3Storage": { "bucketName": bucket, "region": region },
            "modelLocation": location,
        }),
        Source::Fsx {
            file_system,
            location,
        } => json!({
            "modelSourceType": "fsx",
            "fsxStorage": { "fileSystemId": file_system },
            "modelLocation": location,
        }),
        Source::Hub { model } => {
            let mut hub = json!({ "modelId": model });
            if let Some(secret) = token_secret {
                hub["tokenSecretRef"] = json!({ "name": secret, "key": "token" });
            }
            json!({ "modelSourceType": "huggingface", "huggingFaceModel": hub })
        }
    };
    let mut spec = json!({
        "modelName": r.endpoint.as_str(),
        "replicas": r.replicas.get(),
        "invocationEndpoint": INVOCATION_PATH,
        "modelSourceConfig": model_source,
        "worker": {
            "image": image,
            "command": worker_command(serve),
            "modelInvocationPort": { "containerPort": serve.port, "name": "http" },
            "modelVolumeMount": { "name": "model-weights", "mountPath": MODEL_MOUNT },
            "resources": { "requests": { GPU: gpus }, "limits": { GPU: gpus } },
            "environmentVariables": [{ "name": "HYPD_ENDPOINT", "value": r.endpoint.as_str() }],
        },
    });
    if target.group.is_empty() {
        spec["instanceType"] = json!(target.instance_type);
    } else {
        // The instance type alone would also take another group's nodes of that type; the
        // CRD takes node affinity instead of an instance type, never both.
        spec["nodeAffinity"] = json!({ "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{ "matchExpressions": [
                { "key": "node.kubernetes.io/instance-type", "operator": "In", "values": [target.instance_type] },
                { "key": NODE_GROUP_LABEL, "operator": "In", "values": [target.group] },
            ] }],
        } });
    }
    operator_options(&mut spec, r.kv_cache.as_ref(), r.routing);
    let mut annotations: std::collections::BTreeMap<String, String> = [
        (MODEL_ANNOTATION, serve.served_name.clone()),
        (PORT_ANNOTATION, serve.port.to_string()),
        (OPERATION_ANNOTATION, operation.to_owned()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    if !target.group.is_empty() {
        annotations.insert(GROUP_ANNOTATION.to_owned(), target.group.clone());
    }
    if let Some(secret) = token_secret {
        annotations.insert(SECRET_ANNOTATION.to_owned(), secret.to_owned());
    }
    let metadata = ObjectMeta {
        name: Some(r.endpoint.to_string()),
        namespace: Some(NAMESPACE.to_owned()),
        labels: Some(
            [
                (ENDPOINT_LABEL, r.endpoint.as_str()),
                (ENGINE_LABEL, r.engine.as_str()),
                K8S_MANAGED_BY,
            ]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect(),
        ),
        annotations: Some(annotations),
        ..ObjectMeta::default()
    };
    Ok(InferenceEndpointConfig::new(metadata, spec))
}

/// The source of a model path or id, given each storage's mount path and what it is
/// (`Ok(None)`: a path under no storage).
pub fn source_of(serve: &Serve, storages: &[(String, Source)]) -> Result<Source, String> {
    let path = match &serve.model {
        ModelSource::Hub(id) => {
            return Ok(Source::Hub {
                model: id.to_string(),
            });
        }
        ModelSource::Path(p) => p,
    };
    storages
        .iter()
        .filter(|(mount, _)| path.starts_with(&format!("{mount}/")))
        .max_by_key(|(mount, _)| mount.len())
        .map(|(mount, storage)| {
            let location = path[mount.len() + 1..].to_owned();
            match storage {
                Source::S3 { bucket, region, .. } => Source::S3 {
                    bucket: bucket.clone(),
                    region: region.clone(),
                    location,
                },
                Source::Fsx { file_system, .. } => Source::Fsx {
                    file_system: file_system.clone(),
                    location,
                },
                Source::Hub { .. } => unreachable!("storages are S3 or FSx"),
            }
        })
        .ok_or_else(|| {
            let known: Vec<&str> = storages.iter().map(|(m, _)| m.as_str()).collect();
            format!(
                "the model {path} is under no storage of the cluster (pods mount {})",
                known.join(", ")
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(extra: Value) -> DeployInferenceEndpoint {
        let mut body = json!({"name": "ml-1", "endpoint": "qwen", "engine": "vllm",
            "command": "vllm serve /s3/models/Qwen/Qwen2.5-0.5B --max-model-len 4096",
            "replicas": 2,
            "kv_cache": {"l2": {"backend": "redis", "url": "redis://kv.internal:6379"}},
            "routing": "prefix_aware"});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        serde_json::from_value(body).unwrap()
    }

    fn target() -> Target {
        Target {
            group: "gpu".into(),
            instance_type: "ml.g5.8xlarge".into(),
            gpus: 1,
            efa: 0,
        }
    }

    fn storages() -> Vec<(String, Source)> {
        vec![
            (
                "/s3".into(),
                Source::S3 {
                    bucket: "hypd-ml-1".into(),
                    region: "us-east-1".into(),
                    location: String::new(),
                },
            ),
            (
                "/fsx".into(),
                Source::Fsx {
                    file_system: "fs-0123".into(),
                    location: String::new(),
                },
            ),
        ]
    }

    #[test]
    fn the_workers_read_the_bucket_at_the_operators_mount_under_the_same_name() {
        let r = request(json!({}));
        let serve = r.as_model_server().serve().unwrap();
        let source = source_of(&serve, &storages()).unwrap();
        assert_eq!(
            source,
            Source::S3 {
                bucket: "hypd-ml-1".into(),
                region: "us-east-1".into(),
                location: "models/Qwen/Qwen2.5-0.5B".into()
            }
        );
        let c = config(&r, &serve, &target(), &source, "op-1", None).unwrap();
        let spec = &c.spec;
        assert!(
            spec["instanceType"].is_null(),
            "node affinity or an instance type, not both"
        );
        assert_eq!(
            spec["modelSourceConfig"]["s3Storage"]["bucketName"],
            "hypd-ml-1"
        );
        assert_eq!(
            spec["worker"]["command"],
            json!([
                "vllm",
                "serve",
                MODEL_MOUNT,
                "--max-model-len",
                "4096",
                "--served-model-name",
                "/s3/models/Qwen/Qwen2.5-0.5B"
            ])
        );
        assert_eq!(
            spec["kvCacheSpec"]["l2CacheSpec"]["l2CacheBackend"],
            "redis"
        );
        assert_eq!(spec["kvCacheSpec"]["enableL1Cache"], true);
        assert_eq!(
            spec["intelligentRoutingSpec"]["routingStrategy"],
            "prefixaware"
        );
        assert_eq!(
            spec["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
                [0]["matchExpressions"],
            json!([
                {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["ml.g5.8xlarge"]},
                {"key": NODE_GROUP_LABEL, "operator": "In", "values": ["gpu"]},
            ])
        );
        // The plan is what is applied.
        let again = config(&r, &serve, &target(), &source, "op-1", None).unwrap();
        assert_eq!(again.spec, c.spec);
    }

    #[test]
    fn fsx_and_hub_models_are_read_where_they_are() {
        let r = request(json!({"command": "vllm serve /fsx/models/m --served-model-name m"}));
        let serve = r.as_model_server().serve().unwrap();
        assert_eq!(
            source_of(&serve, &storages()).unwrap(),
            Source::Fsx {
                file_system: "fs-0123".into(),
                location: "models/m".into()
            }
        );
        let r = request(json!({"command": "vllm serve Qwen/Qwen2.5-0.5B"}));
        let serve = r.as_model_server().serve().unwrap();
        let source = source_of(&serve, &storages()).unwrap();
        let c = config(
            &r,
            &serve,
            &target(),
            &source,
            "op-1",
            Some("hypd-hf-token-qwen"),
        )
        .unwrap();
        let hub = &c.spec["modelSourceConfig"]["huggingFaceModel"];
        assert_eq!(hub["modelId"], "Qwen/Qwen2.5-0.5B");
        assert_eq!(hub["tokenSecretRef"]["name"], "hypd-hf-token-qwen");
        let r = request(json!({"command": "vllm serve /data/m"}));
        let serve = r.as_model_server().serve().unwrap();
        assert!(
            source_of(&serve, &storages())
                .unwrap_err()
                .contains("/s3, /fsx")
        );
    }

    #[test]
    fn the_operators_options_are_vllm_only_and_refused_by_field() {
        let r = request(json!({"engine": "sglang",
            "command": "python3 -m sglang.launch_server --model-path /s3/models/m"}));
        let fields: Vec<String> = r.request_errors().into_iter().map(|e| e.field).collect();
        assert_eq!(fields, ["kv_cache", "routing"]);
        let bad: Result<DeployInferenceEndpoint, _> = serde_json::from_value(
            json!({"name": "ml-1",
            "endpoint": "q", "engine": "vllm", "command": "vllm serve /s3/m", "routing": "fastest"}),
        );
        assert!(
            bad.unwrap_err()
                .to_string()
                .contains("unknown variant `fastest`")
        );
        let bad: Result<DeployInferenceEndpoint, _> =
            serde_json::from_value(json!({"name": "ml-1",
            "endpoint": "q", "engine": "vllm", "command": "vllm serve /s3/m",
            "kv_cache": {"l2": {"backend": "redis", "url": "redis://user:pw@kv:6379"}}}));
        assert!(bad.unwrap_err().to_string().contains("no user or password"));
    }
}
