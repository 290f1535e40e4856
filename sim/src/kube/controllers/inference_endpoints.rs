//! The HyperPod inference operator's InferenceEndpointConfig controller, which runs while
//! the `amazon-sagemaker-hyperpod-inference` add-on is ACTIVE: for each IEC `X` in `N` the
//! worker Deployment `N/X` (pods `app=X`) and its Service `N/X-service`, with intelligent
//! routing the router Deployment `X-N-router` and Service `X-N-routing-service` in
//! `hyperpod-inference-system`, the model's PersistentVolume and claim for S3 and FSx,
//! and the IEC's status. Names and labels are the real operator's where AWS shows them
//! (docs, blog, its CLI) and documented choices elsewhere, because clients find these
//! objects by name. KV caching and routing are the operator's LMCache/vLLM features: an
//! IEC asking for them with any other server is refused in its status, as is turning
//! routing on or off on an existing deployment. The status goes through the CRD's
//! schema, as a write to the status subresource would, and is written only on change.
//! The same operator's JumpStartModel controller
//! ([`jumpstart_models`](super::jumpstart_models)) deploys, routes, sweeps and reports
//! through this one's worker shape, [`cache_and_routing`], [`deploy`], [`sweep`] and
//! [`write_statuses`], so the two kinds' workers, routers and statuses cannot drift
//! apart.

use serde_json::{Value, json};

use super::{is_terminal, owner_ref, selector_matches, snapshot, upsert};
use crate::clock::reached;
use crate::fsx::Mountable;
use crate::kube::admission::{defaults, namespace, object};
use crate::kube::inference_router::{Logic, PROGRAM as ROUTER_PROGRAM, Router};
use crate::kube::model_server::{self, Engine};
use crate::kube::scheduler::affinity_matches;
use crate::kube::store::{Key, Store, meta};
use crate::kube::time::parse_rfc3339;
use crate::kube::{discovery, schema};

use super::pods::{MODEL_LOAD_SECS, READY_ANNOTATION};

pub const IEC_GR: &str = "inference.sagemaker.aws.amazon.com/inferenceendpointconfigs";
/// Where the operator runs, and its routers with it.
pub const ROUTER_NS: &str = "hyperpod-inference-system";
/// The router's image: AWS does not name it; the vLLM production-stack router's.
const ROUTER_IMAGE: &str = "lmcache/lmstack-router:latest";
const ROUTER_PORT: u16 = 8080;
/// The routing Service's port, as AWS's docs invoke it.
const ROUTER_SERVICE_PORT: u16 = 443;
const SESSION_HEADER: &str = "x-session-id";
/// What the operator makes outside the IEC's namespace (routers) or cluster-wide
/// (volumes) cannot name the IEC as owner, since the garbage collector treats an owner
/// in another namespace as absent; these labels tie them to it instead.
const OWNER_NAME: &str = "inference.sagemaker.aws.amazon.com/endpoint-config";
const OWNER_NS: &str = "inference.sagemaker.aws.amazon.com/endpoint-config-namespace";
const OWNER_UID: &str = "inference.sagemaker.aws.amazon.com/endpoint-config-uid";
/// On the worker Deployment: whether it was made with intelligent routing, which the
/// operator never changes afterwards.
const ROUTING_ANNOTATION: &str = "inference.sagemaker.aws.amazon.com/intelligent-routing";
/// How long an IEC waits for a node of its instance type before it fails.
pub const CAPACITY_GRACE_SECS: f64 = 60.0;
/// The CPU memory (GB) LMCache may use for the L1 cache.
const L1_CACHE_GB: &str = "20";
/// The image of the init container that fetches a Hugging Face model (not named by AWS).
const HF_DOWNLOAD_IMAGE: &str = "public.ecr.aws/docker/library/python:3.12-slim";
/// The size the model volumes claim: Mountpoint and FSx ignore it, claims need one.
const MODEL_VOLUME_SIZE: &str = "1200Gi";

/// Why the operator will not (or no longer) deploy an IEC (or a JumpStartModel) as asked.
#[derive(Debug, PartialEq)]
pub(super) struct Refusal {
    pub(super) reason: &'static str,
    pub(super) message: String,
}

pub(super) fn refuse<T>(reason: &'static str, message: impl Into<String>) -> Result<T, Refusal> {
    Err(Refusal {
        reason,
        message: message.into(),
    })
}

/// What the operator deploys for one IEC (or JumpStartModel, which has no volume).
#[derive(Debug)]
pub(super) struct Plan {
    pub(super) routing: bool,
    /// The worker Deployment's spec.
    pub(super) worker: Value,
    /// The worker Service's spec.
    pub(super) service: Value,
    /// The router Deployment's and Service's specs.
    pub(super) router: Option<(Value, Value)>,
    /// The model's PersistentVolume and claim specs (S3 and FSx).
    pub(super) volume: Option<(Value, Value)>,
}

/// The labels that tie what the operator makes to the object it made it for (see
/// [`OWNER_NAME`]): each kind has its own, so that one kind's sweep never takes what
/// another's object made.
pub(super) struct OwnerLabels {
    pub(super) name: &'static str,
    pub(super) namespace: &'static str,
    pub(super) uid: &'static str,
}

const IEC_OWNER: OwnerLabels = OwnerLabels {
    name: OWNER_NAME,
    namespace: OWNER_NS,
    uid: OWNER_UID,
};

fn router_name(name: &str, ns: &str) -> String {
    format!("{name}-{ns}-router")
}

fn routing_service_name(name: &str, ns: &str) -> String {
    format!("{name}-{ns}-routing-service")
}

fn worker_service_name(name: &str) -> String {
    format!("{name}-service")
}

fn volume_names(name: &str, ns: &str) -> (String, String) {
    (format!("{ns}-{name}-model"), format!("{name}-model"))
}

/// A container name from an object name (container names are DNS labels).
pub(super) fn container_name(name: &str) -> String {
    let n: String = name.replace('.', "-").chars().take(63).collect();
    n.trim_end_matches('-').to_owned()
}

fn strings(v: &Value) -> Vec<Value> {
    v.as_array().cloned().unwrap_or_default()
}

/// The model server the worker container runs, if the sim knows it.
fn engine_of(container: &Value) -> Option<Engine> {
    model_server::of(&json!({ "spec": { "containers": [container] } })).map(|s| s.engine)
}

/// The environment and arguments LMCache needs in a vLLM worker for `kv`.
fn kv_cache(kv: &Value, env: &mut Vec<Value>, args: &mut Vec<Value>) -> Result<(), Refusal> {
    let mut ours = Vec::new();
    let mut set = |name: &str, value: Value| ours.push(json!({ "name": name, "value": value }));
    if let Some(file) = kv["cacheConfigFile"].as_str() {
        set("LMCACHE_CONFIG_FILE", json!(file));
    } else {
        set("LMCACHE_USE_EXPERIMENTAL", json!("True"));
        set("LMCACHE_CHUNK_SIZE", json!("256"));
        let l1 = kv["enableL1Cache"].as_bool().unwrap_or(true);
        set(
            "LMCACHE_LOCAL_CPU",
            json!(if l1 { "True" } else { "False" }),
        );
        if l1 {
            set("LMCACHE_MAX_LOCAL_CPU_SIZE", json!(L1_CACHE_GB));
        }
        if kv["enableL2Cache"].as_bool() == Some(true) {
            let l2 = &kv["l2CacheSpec"];
            let backend = l2["l2CacheBackend"]
                .as_str()
                .unwrap_or_default()
                .to_lowercase();
            match backend.as_str() {
                "redis" => {
                    let Some(url) = l2["l2CacheLocalUrl"].as_str().filter(|u| !u.is_empty()) else {
                        return refuse(
                            "InvalidKVCacheSpec",
                            "kvCacheSpec.l2CacheSpec.l2CacheLocalUrl is required when l2CacheBackend is redis",
                        );
                    };
                    set("LMCACHE_REMOTE_URL", json!(url));
                }
                "tieredstorage" => {
                    // HyperPod's tiered-storage daemon listens on each node.
                    ours.push(json!({ "name": "NODE_IP",
                        "valueFrom": { "fieldRef": { "apiVersion": "v1", "fieldPath": "status.hostIP" } } }));
                    ours.push(json!({ "name": "LMCACHE_REMOTE_URL",
                        "value": "sagemaker-hyperpod://$(NODE_IP):9200" }));
                }
                _ => {
                    return refuse(
                        "InvalidKVCacheSpec",
                        "kvCacheSpec.l2CacheSpec.l2CacheBackend (redis or tieredstorage) is required when enableL2Cache is true",
                    );
                }
            }
            ours.push(json!({ "name": "LMCACHE_REMOTE_SERDE", "value": "naive" }));
        }
    }
    // What the user set stays theirs.
    for e in ours {
        if !env.iter().any(|u| u["name"] == e["name"]) {
            env.push(e);
        }
    }
    if !args.iter().any(|a| {
        a.as_str()
            .is_some_and(|a| a.starts_with("--kv-transfer-config"))
    }) {
        args.push(json!("--kv-transfer-config"));
        args.push(json!(
            r#"{"kv_connector":"LMCacheConnectorV1","kv_role":"kv_both"}"#
        ));
    }
    Ok(())
}

/// The pod spec's placement: a node selector for one instance type, required node
/// affinity for several (preferred in their order), or the IEC's own affinity.
fn placement(spec: &Value, pod: &mut Value) -> Result<(), Refusal> {
    let one = spec["instanceType"].as_str();
    let several: Vec<&str> = spec["instanceTypes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    let custom = spec["nodeAffinity"].is_object();
    match (one, several.is_empty(), custom) {
        (Some(_), false, _) => refuse(
            "InvalidSpec",
            "instanceType and instanceTypes are mutually exclusive",
        ),
        (Some(_), _, true) | (_, false, true) => refuse(
            "InvalidSpec",
            "nodeAffinity is mutually exclusive with instanceType and instanceTypes",
        ),
        (Some(t), true, false) => {
            pod["nodeSelector"] = json!({ "node.kubernetes.io/instance-type": t });
            Ok(())
        }
        (None, false, false) => {
            let preferred: Vec<Value> = several
                .iter()
                .enumerate()
                .map(|(i, t)| json!({ "weight": 100 - i.min(99), "preference": { "matchExpressions": [
                    { "key": "node.kubernetes.io/instance-type", "operator": "In", "values": [t] }] } }))
                .collect();
            pod["affinity"]["nodeAffinity"] = json!({
                "requiredDuringSchedulingIgnoredDuringExecution": { "nodeSelectorTerms": [{ "matchExpressions": [
                    { "key": "node.kubernetes.io/instance-type", "operator": "In", "values": several }] }] },
                "preferredDuringSchedulingIgnoredDuringExecution": preferred,
            });
            Ok(())
        }
        (None, true, true) => {
            pod["affinity"]["nodeAffinity"] = spec["nodeAffinity"].clone();
            Ok(())
        }
        (None, true, false) => refuse(
            "InvalidSpec",
            "one of instanceType, instanceTypes or nodeAffinity is required",
        ),
    }
}

/// The worker's model volume name and where it is mounted (the CRD's default).
fn model_mount(worker: &Value) -> (&str, &str) {
    (
        worker["modelVolumeMount"]["name"]
            .as_str()
            .unwrap_or("model-weights"),
        worker["modelVolumeMount"]["mountPath"]
            .as_str()
            .unwrap_or("/opt/ml/model"),
    )
}

/// The model volume (with its claim for S3 and FSx) and what fetches it.
fn model_volume(
    iec: &Value,
    file_systems: &[Mountable],
    region: &str,
    pod: &mut Value,
) -> Result<Option<(Value, Value)>, Refusal> {
    let (name, ns) = (meta(iec, "name"), meta(iec, "namespace"));
    let (name, ns) = (name.as_str(), ns.as_str());
    let source = &iec["spec"]["modelSourceConfig"];
    let (volume_name, mount_path) = model_mount(&iec["spec"]["worker"]);
    let (pv_name, claim) = volume_names(name, ns);
    let location = source["modelLocation"]
        .as_str()
        .map(|l| l.trim_matches('/'))
        .filter(|l| !l.is_empty());
    let claimed = |csi: Value, mode: &str, mount_options: Vec<Value>| {
        let pv = json!({
            "capacity": { "storage": MODEL_VOLUME_SIZE },
            "accessModes": [mode],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": "",
            "mountOptions": mount_options,
            "csi": csi,
            "claimRef": { "kind": "PersistentVolumeClaim", "apiVersion": "v1", "namespace": ns, "name": claim },
        });
        let pvc = json!({
            "accessModes": [mode],
            "storageClassName": "",
            "volumeName": pv_name,
            "resources": { "requests": { "storage": MODEL_VOLUME_SIZE } },
        });
        (pv, pvc)
    };
    match source["modelSourceType"].as_str().unwrap_or_default() {
        "s3" => {
            let s3 = &source["s3Storage"];
            let Some(bucket) = s3["bucketName"].as_str() else {
                return refuse(
                    "InvalidModelSource",
                    "modelSourceConfig.s3Storage.bucketName is required when modelSourceType is s3",
                );
            };
            let bucket_region = s3["region"].as_str().unwrap_or(region);
            let mut options = vec![json!(format!("region {bucket_region}"))];
            if let Some(l) = location {
                options.push(json!(format!("prefix {l}/")));
            }
            pod["volumes"] = json!([{ "name": volume_name,
                "persistentVolumeClaim": { "claimName": claim, "readOnly": true } }]);
            let csi = json!({ "driver": "s3.csi.aws.com", "volumeHandle": format!("s3-csi-{ns}-{name}"),
                              "volumeAttributes": { "bucketName": bucket } });
            Ok(Some(claimed(csi, "ReadOnlyMany", options)))
        }
        "fsx" => {
            let fsx = &source["fsxStorage"];
            let Some(id) = fsx["fileSystemId"].as_str() else {
                return refuse(
                    "InvalidModelSource",
                    "modelSourceConfig.fsxStorage.fileSystemId is required when modelSourceType is fsx",
                );
            };
            // As the operator asks FSx for what the IEC does not say.
            let known = file_systems
                .iter()
                .find(|fs| fs.dns_name.starts_with(&format!("{id}.")));
            let dns = fsx["dnsName"]
                .as_str()
                .map(str::to_owned)
                .or_else(|| known.map(|fs| fs.dns_name.clone()))
                .unwrap_or_else(|| format!("{id}.fsx.{region}.amazonaws.com"));
            let mount = fsx["mountName"]
                .as_str()
                .map(str::to_owned)
                .or_else(|| known.map(|fs| fs.mount_name.clone()))
                .unwrap_or_default();
            pod["volumes"] = json!([{ "name": volume_name,
                "persistentVolumeClaim": { "claimName": claim } }]);
            if let Some(l) = location {
                pod["containers"][0]["volumeMounts"][0]["subPath"] = json!(l);
            }
            let csi = json!({ "driver": "fsx.csi.aws.com", "volumeHandle": id,
                              "volumeAttributes": { "dnsname": dns, "mountname": mount } });
            Ok(Some(claimed(csi, "ReadWriteMany", vec![json!("flock")])))
        }
        "huggingface" => {
            let hf = &source["huggingFaceModel"];
            let Some(model) = hf["modelId"].as_str() else {
                return refuse(
                    "InvalidModelSource",
                    "modelSourceConfig.huggingFaceModel.modelId is required when modelSourceType is huggingface",
                );
            };
            let revision = hf["commitSHA"].as_str().unwrap_or("main");
            let mut env = vec![
                json!({ "name": "HF_MODEL_ID", "value": model }),
                json!({ "name": "HF_MODEL_REVISION", "value": revision }),
                json!({ "name": "MODEL_DIR", "value": mount_path }),
            ];
            // The token goes to the download only, never to the server.
            if let Some(secret) = hf["tokenSecretRef"]["name"].as_str() {
                env.push(json!({ "name": "HF_TOKEN", "valueFrom": { "secretKeyRef": {
                    "name": secret, "key": hf["tokenSecretRef"]["key"].as_str().unwrap_or("token") } } }));
            }
            pod["volumes"] = json!([{ "name": volume_name, "emptyDir": {} }]);
            pod["initContainers"] = json!([{
                "name": "model-download",
                "image": HF_DOWNLOAD_IMAGE,
                "command": ["sh", "-c",
                    "pip install --quiet 'huggingface_hub[cli]' && huggingface-cli download \"$HF_MODEL_ID\" --revision \"$HF_MODEL_REVISION\" --local-dir \"$MODEL_DIR\""],
                "env": env,
                "volumeMounts": [{ "name": volume_name, "mountPath": mount_path }],
            }]);
            Ok(None)
        }
        other => refuse(
            "InvalidModelSource",
            format!("modelSourceType {other:?} is not supported: use s3, fsx or huggingface"),
        ),
    }
}

/// The readiness probe of a worker that sets none: vLLM and SGLang answer `/health`
/// once the model is loaded.
pub(super) fn health_probe(port: u64) -> Value {
    json!({ "httpGet": { "path": "/health", "port": port },
            "periodSeconds": 10, "timeoutSeconds": 1, "failureThreshold": 3 })
}

/// The replicas an IEC or JumpStartModel asks for (the CRDs' default: one).
pub(super) fn replicas(spec: &Value) -> u64 {
    spec["replicas"].as_u64().unwrap_or(1)
}

/// The worker Deployment's and Service's specs for `name`: `replicas` pods `app=<name>`
/// running `pod`, ready once their model has loaded, behind a ClusterIP Service on the
/// invocation port.
pub(super) fn worker_specs(
    name: &str,
    pod: Value,
    replicas: u64,
    port_name: &str,
    port: u64,
) -> (Value, Value) {
    let labels = json!({ "app": name });
    let worker = json!({
        "replicas": replicas,
        "selector": { "matchLabels": labels },
        "template": {
            "metadata": { "labels": labels, "annotations": { READY_ANNOTATION: MODEL_LOAD_SECS.to_string() } },
            "spec": pod,
        },
    });
    let service = json!({
        "type": "ClusterIP",
        "selector": labels,
        "ports": [{ "name": port_name, "protocol": "TCP", "port": port, "targetPort": port }],
    });
    (worker, service)
}

/// What `o`'s `kvCacheSpec` and `intelligentRoutingSpec` make of its worker, for IECs
/// and JumpStartModels alike (their CRDs share the schema, and the operator the
/// feature), so the two kinds cannot differ in what they refuse or deploy: LMCache's
/// environment and arguments join the user's `env` and `args` on `container`; the
/// answer is whether routing is on and, if so, the specs of the router Deployment and
/// Service that reach `o`'s workers on `port`.
pub(super) fn cache_and_routing(
    store: &Store,
    o: &Value,
    container: &mut Value,
    mut env: Vec<Value>,
    mut args: Vec<Value>,
    port: u64,
) -> Result<(bool, Option<(Value, Value)>), Refusal> {
    let name = meta(o, "name");
    let ns = meta(o, "namespace");
    let spec = &o["spec"];
    let kv = spec["kvCacheSpec"].is_object();
    let routing = spec["intelligentRoutingSpec"]["enabled"].as_bool() == Some(true);
    let engine = engine_of(container);
    if (kv || routing) && engine != Some(Engine::Vllm) {
        let asked = match (kv, routing) {
            (true, true) => "KV caching and intelligent routing are",
            (true, false) => "KV caching is",
            _ => "intelligent routing is",
        };
        let runs = match engine {
            Some(Engine::Sglang) => "runs SGLang".to_owned(),
            _ => format!(
                "does not run vLLM (image {})",
                container["image"].as_str().unwrap_or_default()
            ),
        };
        return refuse(
            "UnsupportedModelServer",
            format!(
                "{asked} supported only with vLLM-based inference containers: the worker {runs}"
            ),
        );
    }
    if let Some(d) = store.get(&Key::new("apps/deployments", &ns, &name))
        && let Some(was) = d["metadata"]["annotations"][ROUTING_ANNOTATION].as_str()
        && was != routing.to_string()
    {
        let kind = o["kind"].as_str().unwrap_or_default();
        return refuse(
            "IntelligentRoutingImmutable",
            format!(
                "intelligentRoutingSpec.enabled cannot be changed on an existing deployment (deployed with {was}, now {routing}): delete the {kind} and create it again"
            ),
        );
    }
    if kv {
        kv_cache(&spec["kvCacheSpec"], &mut env, &mut args)?;
        container["args"] = json!(args);
    }
    if !env.is_empty() {
        container["env"] = json!(env);
    }
    let router = routing.then(|| router_specs(&name, &ns, &spec["intelligentRoutingSpec"], port));
    Ok((routing, router))
}

/// The Deployment and Service specs of the router in front of the workers `app=<name>`
/// of `ns` on `port`, routing as `routing` (an `intelligentRoutingSpec`) asks.
fn router_specs(name: &str, ns: &str, routing: &Value, port: u64) -> (Value, Value) {
    let logic = routing["routingStrategy"]
        .as_str()
        .and_then(Logic::parse)
        .unwrap_or(Logic::PrefixAware);
    let r = Router {
        port: ROUTER_PORT,
        namespace: ns.to_owned(),
        selector: format!("app={name}"),
        worker_port: u16::try_from(port).unwrap_or(u16::MAX),
        logic,
        session_key: (logic == Logic::Session).then(|| SESSION_HEADER.to_owned()),
    };
    let labels = json!({ "app": router_name(name, ns) });
    let deployment = json!({
        "replicas": 1,
        "selector": { "matchLabels": labels },
        "template": { "metadata": { "labels": labels }, "spec": { "containers": [{
            "name": "router-container",
            "image": ROUTER_IMAGE,
            "command": [ROUTER_PROGRAM],
            "args": r.args(),
            "ports": [{ "name": "http", "containerPort": ROUTER_PORT, "protocol": "TCP" }],
            "readinessProbe": { "httpGet": { "path": "/health", "port": ROUTER_PORT } },
            "resources": { "requests": { "cpu": "500m", "memory": "1Gi" } },
        }] } },
    });
    let service = json!({
        "type": "ClusterIP",
        "selector": labels,
        "ports": [{ "name": "https", "protocol": "TCP", "port": ROUTER_SERVICE_PORT, "targetPort": ROUTER_PORT }],
    });
    (deployment, service)
}

/// What the operator deploys for `iec`, or why it will not.
fn plan(
    store: &Store,
    iec: &Value,
    file_systems: &[Mountable],
    region: &str,
) -> Result<Plan, Refusal> {
    let name = meta(iec, "name");
    let spec = &iec["spec"];
    let w = &spec["worker"];
    let Some(image) = w["image"].as_str() else {
        return refuse("InvalidSpec", "worker.image is required");
    };
    let Some(port) = w["modelInvocationPort"]["containerPort"].as_u64() else {
        return refuse(
            "InvalidSpec",
            "worker.modelInvocationPort.containerPort is required",
        );
    };
    let port_name = w["modelInvocationPort"]["name"].as_str().unwrap_or("http");
    let (volume_name, mount_path) = model_mount(w);
    let env = strings(&w["environmentVariables"]);
    let args = strings(&w["args"]);
    let command = strings(&w["command"]);

    let mut container = json!({
        "name": container_name(&name),
        "image": image,
        "ports": [{ "name": port_name, "containerPort": port, "protocol": "TCP" }],
        "volumeMounts": [{ "name": volume_name, "mountPath": mount_path }],
    });
    if !command.is_empty() {
        container["command"] = json!(command);
    }
    if !args.is_empty() {
        container["args"] = json!(args);
    }
    let (routing, router) = cache_and_routing(store, iec, &mut container, env, args, port)?;
    if w["resources"].is_object() {
        container["resources"] = w["resources"].clone();
    }
    if let Some(dir) = w["workingDir"].as_str() {
        container["workingDir"] = json!(dir);
    }
    let probes = &w["probes"];
    for probe in ["readinessProbe", "livenessProbe", "startupProbe"] {
        if probes[probe].is_object() {
            container[probe] = probes[probe].clone();
        }
    }
    if container["readinessProbe"].is_null() {
        container["readinessProbe"] = health_probe(port);
    }

    let mut pod = json!({ "containers": [container] });
    placement(spec, &mut pod)?;
    let volume = model_volume(iec, file_systems, region, &mut pod)?;
    for extra in strings(&spec["kubernetes"]["initContainers"]) {
        match pod["initContainers"].as_array_mut() {
            Some(list) => list.push(extra),
            None => pod["initContainers"] = json!([extra]),
        }
    }
    let (worker, service) = worker_specs(&name, pod, replicas(spec), port_name, port);
    Ok(Plan {
        routing,
        worker,
        service,
        router,
        volume,
    })
}

/// What ties an object the operator makes to the IEC or JumpStartModel it made it for.
struct Owner<'a> {
    labels: Value,
    /// The ownerReferences, for what lives in that object's namespace.
    refs: Option<&'a Value>,
}

/// Creates the object at `key` (of `kind`) or brings its labels, annotations, owner
/// and spec to what is planned (with the API server's defaults, so an unchanged plan
/// writes nothing), keeping what others wrote: its status, UID, cluster IP.
#[allow(clippy::too_many_arguments)]
fn put(
    store: &mut Store,
    key: &Key,
    api_version: &str,
    kind: &str,
    owner: &Owner,
    annotations: Option<Value>,
    spec: Value,
    now: &str,
) {
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let plural = key.gr.split_once('/').map_or("", |(_, p)| p);
    let old = store.get(key).cloned();
    let mut o = match &old {
        Some(o) => (**o).clone(),
        None => object(store, api_version, kind, &key.ns, &key.name, now),
    };
    o["metadata"]["labels"] = owner.labels.clone();
    if let Some(a) = annotations {
        o["metadata"]["annotations"] = a;
    }
    if let Some(refs) = owner.refs {
        o["metadata"]["ownerReferences"] = refs.clone();
    }
    o["spec"] = spec;
    if let Some(old) = &old
        && kind == "Service"
    {
        for k in ["clusterIP", "clusterIPs"] {
            o["spec"][k] = old["spec"][k].clone();
        }
    }
    if let Some(res) = discovery::find(store, group, version, plural) {
        defaults(&res, &mut o, now);
    }
    if let Some(old) = &old {
        o["status"] = old["status"].clone();
        if o["spec"] != old["spec"] {
            let g = old["metadata"]["generation"].as_i64().unwrap_or(1);
            o["metadata"]["generation"] = json!(g + 1);
        }
    }
    upsert(store, key.clone(), o);
}

/// Creates what the operator makes once and never changes (a volume and its claim).
fn put_once(store: &mut Store, key: &Key, kind: &str, owner: &Owner, spec: Value, now: &str) {
    if store.get(key).is_none() {
        put(store, key, "v1", kind, owner, None, spec, now);
    }
}

/// The worker objects (and router, and volume) of every IEC, as planned; IECs the
/// operator refuses keep what they have. What an IEC that is gone made outside its
/// namespace goes with it.
pub(super) fn inference_endpoints(
    store: &mut Store,
    file_systems: &[Mountable],
    region: &str,
    now: &str,
) {
    for iec in snapshot(store, IEC_GR) {
        if iec["metadata"]["deletionTimestamp"].is_string() {
            continue;
        }
        let Ok(plan) = plan(store, &iec, file_systems, region) else {
            continue;
        };
        deploy(store, &iec, plan, &IEC_OWNER, now);
    }
    sweep(store, IEC_GR, &IEC_OWNER);
}

/// Makes what `plan` says for `o` (an IEC or a JumpStartModel), or brings it back to
/// that: what lives in `o`'s namespace is owned by it, what lives elsewhere is tied to
/// it by the `keys` labels.
pub(super) fn deploy(store: &mut Store, o: &Value, plan: Plan, keys: &OwnerLabels, now: &str) {
    let name = meta(o, "name");
    let ns = meta(o, "namespace");
    let refs = owner_ref(o);
    let tied = json!({ keys.name: name, keys.namespace: ns, keys.uid: meta(o, "uid") });
    let mut labels = json!({ "app": name });
    if let Some(l) = labels.as_object_mut() {
        l.extend(tied.as_object().cloned().unwrap_or_default());
    }
    let owned = Owner {
        labels: labels.clone(),
        refs: Some(&refs),
    };
    if let Some((pv, pvc)) = plan.volume {
        let (pv_name, claim) = volume_names(&name, &ns);
        let unowned = Owner {
            labels: tied.clone(),
            refs: None,
        };
        put_once(
            store,
            &Key::new("/persistentvolumes", "", &pv_name),
            "PersistentVolume",
            &unowned,
            pv,
            now,
        );
        put_once(
            store,
            &Key::new("/persistentvolumeclaims", &ns, &claim),
            "PersistentVolumeClaim",
            &owned,
            pvc,
            now,
        );
    }
    put(
        store,
        &Key::new("apps/deployments", &ns, &name),
        "apps/v1",
        "Deployment",
        &owned,
        Some(json!({ ROUTING_ANNOTATION: plan.routing.to_string() })),
        plan.worker,
        now,
    );
    put(
        store,
        &Key::new("/services", &ns, &worker_service_name(&name)),
        "v1",
        "Service",
        &owned,
        None,
        plan.service,
        now,
    );
    if let Some((deployment, service)) = plan.router {
        let ns_key = Key::new("/namespaces", "", ROUTER_NS);
        if store.get(&ns_key).is_none() {
            let created = namespace(store, ROUTER_NS, now);
            store.put(ns_key, created);
        }
        let mut labels = tied.clone();
        labels["app"] = json!(router_name(&name, &ns));
        let router = Owner { labels, refs: None };
        put(
            store,
            &Key::new("apps/deployments", ROUTER_NS, &router_name(&name, &ns)),
            "apps/v1",
            "Deployment",
            &router,
            None,
            deployment,
            now,
        );
        put(
            store,
            &Key::new("/services", ROUTER_NS, &routing_service_name(&name, &ns)),
            "v1",
            "Service",
            &router,
            None,
            service,
            now,
        );
    }
}

/// Removes the routers and volumes whose object of `owner_gr` (an IEC, a JumpStartModel),
/// as its `keys` labels name it, is gone (or is another by now): no owner reference can
/// tie them to it (see [`OWNER_NAME`]), so the garbage collector never takes them.
pub(super) fn sweep(store: &mut Store, owner_gr: &str, keys: &OwnerLabels) {
    let places = [
        ("apps/deployments", Some(ROUTER_NS)),
        ("/services", Some(ROUTER_NS)),
        ("/persistentvolumes", None),
    ];
    let mut gone = Vec::new();
    for (gr, ns) in places {
        for o in store.list(gr, ns) {
            let labels = &o["metadata"]["labels"];
            let (Some(name), Some(owner_ns), Some(uid)) = (
                labels[keys.name].as_str(),
                labels[keys.namespace].as_str(),
                labels[keys.uid].as_str(),
            ) else {
                continue;
            };
            let alive = store
                .get(&Key::new(owner_gr, owner_ns, name))
                .is_some_and(|owner| owner["metadata"]["uid"] == uid);
            if !alive {
                gone.push(Key::new(gr, ns.unwrap_or_default(), &meta(o, "name")));
            }
        }
    }
    for k in gone {
        store.remove(&k);
    }
}

/// The first worker pod (by name) that cannot come up, as its container status says.
fn pod_failure(pods: &[&Value]) -> Option<(String, String)> {
    const STUCK: &[&str] = &[
        "CrashLoopBackOff",
        "ImagePullBackOff",
        "ErrImagePull",
        "InvalidImageName",
        "CreateContainerConfigError",
    ];
    for p in pods {
        let pod = meta(p, "name");
        let statuses = ["initContainerStatuses", "containerStatuses"]
            .iter()
            .flat_map(|k| p["status"][*k].as_array().into_iter().flatten());
        for cs in statuses {
            let waiting = &cs["state"]["waiting"];
            if let Some(reason) = waiting["reason"].as_str().filter(|r| STUCK.contains(r)) {
                let container = cs["name"].as_str().unwrap_or_default();
                let detail = waiting["message"]
                    .as_str()
                    .map(|m| format!(": {m}"))
                    .unwrap_or_default();
                return Some((
                    reason.to_owned(),
                    format!("pod {pod}: container {container} is in {reason}{detail}"),
                ));
            }
            let terminated = &cs["state"]["terminated"];
            if p["status"]["phase"] == "Failed" && terminated.is_object() {
                let container = cs["name"].as_str().unwrap_or_default();
                let code = terminated["exitCode"].as_i64().unwrap_or_default();
                return Some((
                    "PodFailed".to_owned(),
                    format!("pod {pod}: container {container} exited with code {code}"),
                ));
            }
        }
    }
    None
}

/// The instance types (or affinity) a pod template asks for, in words.
fn wanted_nodes(pod: &Value) -> String {
    if let Some(t) = pod["nodeSelector"]["node.kubernetes.io/instance-type"].as_str() {
        return format!("instance type {t}");
    }
    let terms = &pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        ["nodeSelectorTerms"];
    let types: Vec<&str> = terms[0]["matchExpressions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["key"] == "node.kubernetes.io/instance-type")
        .flat_map(|e| e["values"].as_array().into_iter().flatten())
        .filter_map(Value::as_str)
        .collect();
    if types.is_empty() {
        "the node affinity".to_owned()
    } else {
        format!("instance types {}", types.join(", "))
    }
}

/// A condition that keeps its transition time while its status holds.
fn condition(
    old: &Value,
    kind: &str,
    status: bool,
    reason: &str,
    message: &str,
    generation: &Value,
    now: &str,
) -> Value {
    let status = if status { "True" } else { "False" };
    let since = old["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == kind))
        .filter(|c| c["status"] == status)
        .map_or_else(|| json!(now), |c| c["lastTransitionTime"].clone());
    json!({ "type": kind, "status": status, "reason": reason, "message": message,
            "lastTransitionTime": since, "observedGeneration": generation })
}

/// The status of `iec` (or a JumpStartModel) at `epoch_now`, from what its objects show.
fn status_of(
    store: &Store,
    iec: &Value,
    planned: Result<Plan, Refusal>,
    epoch_now: f64,
    now: &str,
) -> Value {
    let name = meta(iec, "name");
    let ns = meta(iec, "namespace");
    let uid = meta(iec, "uid");
    let generation = iec["metadata"]["generation"].clone();
    let desired = replicas(&iec["spec"]);
    let old = &iec["status"];
    let deployment = store
        .get(&Key::new("apps/deployments", &ns, &name))
        .filter(|d| {
            d["metadata"]["ownerReferences"]
                .as_array()
                .is_some_and(|refs| refs.iter().any(|r| r["uid"] == uid.as_str()))
        });
    let count = |k: &str| deployment.map_or(0, |d| d["status"][k].as_u64().unwrap_or(0));
    let (replicas, ready, available, updated, unavailable) = (
        count("replicas"),
        count("readyReplicas"),
        count("availableReplicas"),
        count("updatedReplicas"),
        count("unavailableReplicas"),
    );
    let mut pods: Vec<&Value> = store
        .list("/pods", Some(&ns))
        .filter(|p| p["metadata"]["labels"]["app"] == name.as_str())
        .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
        .map(|p| &**p)
        .collect();
    pods.sort_by_key(|p| meta(p, "name"));

    let mut conditions = Vec::new();
    let (state, reason, message) = match planned {
        Err(r) => ("DeploymentFailed", r.reason.to_owned(), r.message),
        Ok(plan) => {
            let pod = &plan.worker["template"]["spec"];
            let capacity = store.list("/nodes", None).any(|n| {
                let labels = &n["metadata"]["labels"];
                selector_matches(&pod["nodeSelector"], labels) && affinity_matches(pod, labels)
            });
            let wanted = wanted_nodes(pod);
            let capacity_condition = condition(
                old,
                "InstanceTypeAvailable",
                capacity,
                if capacity {
                    "NodesFound"
                } else {
                    "NoNodeOfInstanceType"
                },
                &if capacity {
                    format!("the cluster has nodes of {wanted}")
                } else {
                    format!("the cluster has no node of {wanted}")
                },
                &generation,
                now,
            );
            let short_since = capacity_condition["lastTransitionTime"]
                .as_str()
                .and_then(parse_rfc3339)
                .unwrap_or(epoch_now);
            conditions.push(capacity_condition);
            let router_ready = !plan.routing
                || store
                    .get(&Key::new(
                        "apps/deployments",
                        ROUTER_NS,
                        &router_name(&name, &ns),
                    ))
                    .is_some_and(|d| d["status"]["readyReplicas"].as_u64().unwrap_or(0) >= 1);
            let bound = pods
                .iter()
                .any(|p| p["spec"]["nodeName"].is_string() && !is_terminal(p));
            if let Some((reason, message)) = pod_failure(&pods) {
                ("DeploymentFailed", reason, message)
            } else if desired > 0
                && !capacity
                && reached(epoch_now, short_since + CAPACITY_GRACE_SECS)
            {
                (
                    "DeploymentFailed",
                    "InsufficientCapacity".to_owned(),
                    format!(
                        "the cluster has had no node of {wanted} for {CAPACITY_GRACE_SECS:.0}s: the worker pods cannot be scheduled; add an instance group of that type"
                    ),
                )
            } else if deployment.is_some()
                && replicas == desired
                && updated == desired
                && ready >= desired
                && router_ready
            {
                (
                    "DeploymentComplete",
                    "DeploymentComplete".to_owned(),
                    format!("Deployment {name} is ready: {ready}/{desired} replicas"),
                )
            } else if bound || (desired > 0 && ready >= desired) {
                let waiting = if ready >= desired && !router_ready {
                    format!(", waiting for router {}", router_name(&name, &ns))
                } else {
                    String::new()
                };
                (
                    "DeploymentInProgress",
                    "DeploymentInProgress".to_owned(),
                    format!("Deployment {name}: {ready}/{desired} replicas ready{waiting}"),
                )
            } else if !capacity {
                (
                    "DeploymentPending",
                    "WaitingForCapacity".to_owned(),
                    format!(
                        "no node of {wanted} in the cluster yet: the deployment fails if none comes within {CAPACITY_GRACE_SECS:.0}s"
                    ),
                )
            } else {
                // The scheduler's own words, when it said why it cannot place a pod.
                let unschedulable = pods.iter().find_map(|p| {
                    let c = &p["status"]["conditions"][0];
                    (c["type"] == "PodScheduled" && c["reason"] == "Unschedulable").then(|| {
                        format!(
                            ": pod {} {}",
                            meta(p, "name"),
                            c["message"].as_str().unwrap_or_default()
                        )
                    })
                });
                (
                    "DeploymentPending",
                    "DeploymentPending".to_owned(),
                    format!(
                        "Deployment {name}: waiting for its pods to be scheduled{}",
                        unschedulable.unwrap_or_default()
                    ),
                )
            }
        }
    };
    conditions.insert(
        0,
        condition(
            old,
            "DeploymentReady",
            state == "DeploymentComplete",
            &reason,
            &message,
            &generation,
            now,
        ),
    );
    let mut status = match old {
        Value::Object(_) => old.clone(),
        _ => json!({}),
    };
    status["state"] = json!(state);
    status["replicas"] = json!(replicas);
    status["selector"] = json!(format!("app={name}"));
    status["observedGeneration"] = generation.clone();
    status["conditions"] = json!(conditions);
    match deployment {
        Some(d) => {
            let overall = match state {
                "DeploymentComplete" => "Available",
                "DeploymentFailed" => "Failed",
                _ => "Progressing",
            };
            let mut counts = json!({ "replicas": replicas, "readyReplicas": ready,
                "availableReplicas": available, "updatedReplicas": updated,
                "unavailableReplicas": unavailable,
                "observedGeneration": d["status"]["observedGeneration"] });
            if d["status"]["conditions"].is_array() {
                counts["conditions"] = d["status"]["conditions"].clone();
            }
            let mut ds = json!({ "name": name, "reason": reason, "message": message,
                "deploymentObjectOverallState": overall, "status": counts });
            let mut before = old["deploymentStatus"].clone();
            let last = before
                .as_object_mut()
                .and_then(|b| b.remove("lastUpdated"))
                .filter(|_| before == ds)
                .unwrap_or_else(|| json!(now));
            ds["lastUpdated"] = last;
            status["deploymentStatus"] = ds;
        }
        None => {
            if let Some(s) = status.as_object_mut() {
                s.remove("deploymentStatus");
            }
        }
    }
    status
}

/// Every IEC's status, checked against the CRD's schema as the status subresource
/// would check it, and written only when it changed.
pub(super) fn inference_statuses(
    store: &mut Store,
    file_systems: &[Mountable],
    region: &str,
    epoch_now: f64,
    now: &str,
) {
    write_statuses(
        store,
        IEC_GR,
        |store, iec| plan(store, iec, file_systems, region),
        epoch_now,
        now,
    );
}

/// The status of every object of `gr` (IECs, JumpStartModels: `v1` of their CRD) from
/// what `plan` makes of it, checked against the CRD's schema as the status subresource
/// would check it, and written only when it changed.
pub(super) fn write_statuses(
    store: &mut Store,
    gr: &str,
    plan: impl Fn(&Store, &Value) -> Result<Plan, Refusal>,
    epoch_now: f64,
    now: &str,
) {
    let (group, plural) = gr.split_once('/').unwrap_or_default();
    let Some(schema) = discovery::find(store, group, "v1", plural).and_then(|r| r.schema) else {
        return;
    };
    for o in snapshot(store, gr) {
        if o["metadata"]["deletionTimestamp"].is_string() {
            continue;
        }
        let planned = plan(store, &o);
        let mut new = o.clone();
        new["status"] = status_of(store, &o, planned, epoch_now, now);
        if new["status"] == o["status"] {
            continue;
        }
        let out = schema::validate(&schema, &mut new, Some(&o));
        if !out.errors.is_empty() {
            let errors: Vec<String> = out.errors.iter().map(schema::FieldError::render).collect();
            tracing::warn!(kind = o["kind"].as_str().unwrap_or_default(), name = %meta(&o, "name"), "status refused by the CRD schema: {}", errors.join(", "));
            continue;
        }
        let key = Key::new(gr, &meta(&o, "namespace"), &meta(&o, "name"));
        upsert(store, key, new);
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::clock::recording;
    use crate::kube::admission::{bootstrap, crd_status};
    use crate::kube::controllers::{deployments, endpoints, gc, pods, replicasets};
    use crate::kube::discovery::CRD_GR;
    use crate::kube::time::rfc3339;

    pub(in crate::kube::controllers) const T0: &str = "2026-01-01T00:00:00Z";

    fn cluster(nodes: &[(&str, &str)]) -> Store {
        serving(
            include_str!(
                "../../../crds/inference.sagemaker.aws.amazon.com_inferenceendpointconfigs.yaml"
            ),
            nodes,
        )
    }

    /// A cluster at T0 serving the CRD of `crd_yaml`, with a Ready node of one GPU per
    /// `(name, instance type)`.
    pub(in crate::kube::controllers) fn serving(crd_yaml: &str, nodes: &[(&str, &str)]) -> Store {
        let mut store = Store::new();
        bootstrap(&mut store, T0);
        let mut crd: Value = serde_yaml::from_str(crd_yaml).unwrap();
        crd["metadata"]["uid"] = json!("crd");
        crd["status"] = crd_status(&crd, T0);
        let name = meta(&crd, "name");
        store.put(Key::new(CRD_GR, "", &name), crd);
        for (name, instance_type) in nodes {
            let node = json!({ "apiVersion": "v1", "kind": "Node",
                "metadata": { "name": name, "labels": { "node.kubernetes.io/instance-type": instance_type } },
                "spec": {}, "status": { "allocatable": { "nvidia.com/gpu": "1", "cpu": "32" },
                    "addresses": [{ "type": "InternalIP", "address": "10.0.0.9" }],
                    "conditions": [{ "type": "Ready", "status": "True" }] } });
            store.put(Key::new("/nodes", "", name), node);
        }
        store
    }

    fn iec(name: &str, image: &str, args: Value, extra: Value) -> Value {
        let mut o = json!({
            "apiVersion": "inference.sagemaker.aws.amazon.com/v1", "kind": "InferenceEndpointConfig",
            "metadata": { "name": name, "namespace": "ml", "uid": format!("uid-{name}"), "generation": 1,
                          "creationTimestamp": T0 },
            "spec": { "modelName": "m", "instanceType": "ml.g5.8xlarge", "replicas": 1,
                "invocationEndpoint": "v1/chat/completions",
                "modelSourceConfig": { "modelSourceType": "s3", "modelLocation": "llama",
                    "s3Storage": { "bucketName": "models", "region": "us-east-1" } },
                "worker": { "image": image, "args": args,
                    "resources": { "limits": { "nvidia.com/gpu": "1" } },
                    "modelInvocationPort": { "containerPort": 8000, "name": "http" },
                    "modelVolumeMount": { "name": "model-weights", "mountPath": "/opt/ml/model" } } },
        });
        if let (Some(spec), Some(extra)) = (o["spec"].as_object_mut(), extra.as_object()) {
            spec.extend(extra.clone());
        }
        o
    }

    fn put_iec(store: &mut Store, o: Value) {
        let key = Key::new(IEC_GR, "ml", &meta(&o, "name"));
        store.put(key, o);
    }

    pub(in crate::kube::controllers) fn get(
        store: &Store,
        gr: &str,
        ns: &str,
        name: &str,
    ) -> Option<Value> {
        store.get(&Key::new(gr, ns, name)).map(|o| (**o).clone())
    }

    /// One controller pass at `t` seconds after T0, in `reconcile`'s order; when due next.
    fn step(store: &mut Store, t: f64) -> f64 {
        let epoch = parse_rfc3339(T0).unwrap() + t;
        let now = rfc3339(epoch);
        let ((), due) = recording(|| {
            gc::collect_garbage(store);
            inference_endpoints(store, &[], "us-east-1", &now);
            deployments::deployments(store, &now);
            replicasets::replicasets(store, &now);
            pods::pods(store, &[], epoch, &now);
            endpoints::endpoints(store, &now);
            inference_statuses(store, &[], "us-east-1", epoch, &now);
        });
        due
    }

    fn state(store: &Store, name: &str) -> (String, Value) {
        let o = get(store, IEC_GR, "ml", name).unwrap();
        (
            o["status"]["state"].as_str().unwrap_or_default().to_owned(),
            o["status"]["conditions"][0].clone(),
        )
    }

    fn vllm_args() -> Value {
        json!(["--model", "/opt/ml/model", "--served-model-name", "llama"])
    }

    #[test]
    fn a_vllm_config_with_kv_cache_and_routing_loads_completes_and_then_writes_nothing() {
        let mut store = cluster(&[("gpu-1", "ml.g5.8xlarge")]);
        let extra = json!({
            "kvCacheSpec": { "enableL1Cache": true, "enableL2Cache": true,
                             "l2CacheSpec": { "l2CacheBackend": "tieredstorage" } },
            "intelligentRoutingSpec": { "enabled": true, "routingStrategy": "session" } });
        put_iec(
            &mut store,
            iec("llama", "vllm/vllm-openai:v0.10.1", vllm_args(), extra),
        );
        step(&mut store, 0.0);
        assert_eq!(
            state(&store, "llama").0,
            "DeploymentInProgress",
            "bound, starting"
        );
        let worker = get(&store, "apps/deployments", "ml", "llama").unwrap();
        let c = &worker["spec"]["template"]["spec"]["containers"][0];
        let env = c["env"].as_array().unwrap();
        let value = |n: &str| {
            env.iter()
                .find(|e| e["name"] == n)
                .map(|e| e["value"].clone())
        };
        assert_eq!(
            value("LMCACHE_REMOTE_URL"),
            Some(json!("sagemaker-hyperpod://$(NODE_IP):9200"))
        );
        assert_eq!(
            value("LMCACHE_MAX_LOCAL_CPU_SIZE"),
            Some(json!(L1_CACHE_GB))
        );
        let node_ip = env.iter().position(|e| e["name"] == "NODE_IP").unwrap();
        let url = env
            .iter()
            .position(|e| e["name"] == "LMCACHE_REMOTE_URL")
            .unwrap();
        assert!(node_ip < url, "NODE_IP is defined before it is used");
        assert_eq!(worker["metadata"]["ownerReferences"][0]["uid"], "uid-llama");
        let router = get(&store, "apps/deployments", ROUTER_NS, "llama-ml-router").unwrap();
        let parsed = Router::of(&json!({ "spec": router["spec"]["template"]["spec"] })).unwrap();
        assert_eq!(
            (parsed.logic, parsed.session_key.as_deref()),
            (Logic::Session, Some(SESSION_HEADER))
        );
        assert_eq!(
            (parsed.namespace.as_str(), parsed.selector.as_str()),
            ("ml", "app=llama")
        );
        assert!(
            router["metadata"]["ownerReferences"].is_null(),
            "no owner in another namespace"
        );
        let pv = get(&store, "/persistentvolumes", "", "ml-llama-model").unwrap();
        assert_eq!(
            pv["spec"]["mountOptions"],
            json!(["region us-east-1", "prefix llama/"])
        );

        let mut t = 0.0;
        let mut states = Vec::new();
        // As `run` does: again at once after a pass that wrote, else when due.
        let mut passes = 0;
        while t < 120.0 {
            passes += 1;
            assert!(passes < 100, "the controllers keep writing: {states:?}");
            let rv = store.rv();
            let due = step(&mut store, t);
            states.push(state(&store, "llama").0);
            if store.rv() != rv {
                continue;
            }
            if due.is_infinite() {
                break;
            }
            t += due;
        }
        assert_eq!(states.last().unwrap(), "DeploymentComplete", "{states:?}");
        // START_SECS and the 20 s load.
        assert!((25.0..=26.0).contains(&t), "{t}");
        let status = get(&store, IEC_GR, "ml", "llama").unwrap()["status"].clone();
        assert_eq!(status["deploymentStatus"]["status"]["readyReplicas"], 1);
        assert_eq!(status["selector"], "app=llama");
        let rv = store.rv();
        step(&mut store, t + 30.0);
        assert_eq!(store.rv(), rv, "a settled endpoint writes nothing");

        // A new replica count (the scale subresource's write) moves the Deployment.
        let mut scaled = get(&store, IEC_GR, "ml", "llama").unwrap();
        scaled["spec"]["replicas"] = json!(0);
        scaled["metadata"]["generation"] = json!(2);
        put_iec(&mut store, scaled);
        for _ in 0..4 {
            step(&mut store, t + 31.0);
        }
        let worker = get(&store, "apps/deployments", "ml", "llama").unwrap();
        assert_eq!(worker["spec"]["replicas"], 0);
        assert_eq!(worker["metadata"]["generation"], 2);
        let status = get(&store, IEC_GR, "ml", "llama").unwrap()["status"].clone();
        assert_eq!(
            (&status["state"], &status["replicas"]),
            (&json!("DeploymentComplete"), &json!(0))
        );
        assert_eq!(status["observedGeneration"], 2);
        assert_eq!(
            status["deploymentStatus"]["status"]["observedGeneration"],
            2
        );
    }

    #[test]
    fn what_the_operator_will_not_do_fails_in_the_status() {
        let mut store = cluster(&[("gpu-1", "ml.g5.8xlarge")]);
        let sglang = json!([
            "python3",
            "-m",
            "sglang.launch_server",
            "--model-path",
            "/opt/ml/model"
        ]);
        put_iec(
            &mut store,
            iec(
                "sg",
                "lmsysorg/sglang:v0.4.9",
                sglang,
                json!({ "intelligentRoutingSpec": { "enabled": true } }),
            ),
        );
        put_iec(
            &mut store,
            iec(
                "tgi",
                "ghcr.io/huggingface/text-generation-inference:3",
                json!([]),
                json!({ "kvCacheSpec": { "enableL1Cache": true } }),
            ),
        );
        put_iec(
            &mut store,
            iec(
                "redis",
                "vllm/vllm-openai:v0.10.1",
                vllm_args(),
                json!({ "kvCacheSpec": { "enableL2Cache": true, "l2CacheSpec": { "l2CacheBackend": "redis" } } }),
            ),
        );
        put_iec(
            &mut store,
            iec("plain", "vllm/vllm-openai:v0.10.1", vllm_args(), json!({})),
        );
        step(&mut store, 0.0);
        for (name, reason, message) in [
            (
                "sg",
                "UnsupportedModelServer",
                "intelligent routing is supported only with vLLM-based inference containers: the worker runs SGLang",
            ),
            (
                "tgi",
                "UnsupportedModelServer",
                "KV caching is supported only with vLLM-based inference containers: the worker does not run vLLM (image ghcr.io/huggingface/text-generation-inference:3)",
            ),
            (
                "redis",
                "InvalidKVCacheSpec",
                "kvCacheSpec.l2CacheSpec.l2CacheLocalUrl is required when l2CacheBackend is redis",
            ),
        ] {
            let (s, c) = state(&store, name);
            assert_eq!(
                (s.as_str(), &c["reason"], &c["message"]),
                ("DeploymentFailed", &json!(reason), &json!(message))
            );
            assert!(
                get(&store, "apps/deployments", "ml", name).is_none(),
                "{name}: nothing deployed"
            );
        }
        // Routing cannot be turned on for what is deployed; turned back, it is fine again.
        let mut plain = get(&store, IEC_GR, "ml", "plain").unwrap();
        plain["spec"]["intelligentRoutingSpec"] = json!({ "enabled": true });
        plain["metadata"]["generation"] = json!(2);
        put_iec(&mut store, plain.clone());
        step(&mut store, 1.0);
        let (s, c) = state(&store, "plain");
        assert_eq!(
            (s.as_str(), &c["reason"]),
            ("DeploymentFailed", &json!("IntelligentRoutingImmutable"))
        );
        assert!(get(&store, "apps/deployments", ROUTER_NS, "plain-ml-router").is_none());
        plain["spec"]["intelligentRoutingSpec"]["enabled"] = json!(false);
        plain["metadata"]["generation"] = json!(3);
        put_iec(&mut store, plain);
        step(&mut store, 2.0);
        assert_eq!(state(&store, "plain").0, "DeploymentInProgress");
    }

    #[test]
    fn a_worker_that_cannot_start_fails_the_config() {
        let mut store = cluster(&[("gpu-1", "ml.g5.8xlarge")]);
        put_iec(
            &mut store,
            iec("llama", "vllm/vllm-openai:v0.10.1", vllm_args(), json!({})),
        );
        step(&mut store, 0.0);
        step(&mut store, 1.0);
        let mut pod = store
            .list("/pods", Some("ml"))
            .next()
            .map(|p| (**p).clone())
            .unwrap();
        pod["status"]["containerStatuses"][0]["state"] = json!({ "waiting": {
            "reason": "ImagePullBackOff", "message": "Back-off pulling image \"vllm/vllm-openai:v0.10.1\"" } });
        let pod_name = meta(&pod, "name");
        store.put(Key::new("/pods", "ml", &pod_name), pod);
        inference_statuses(
            &mut store,
            &[],
            "us-east-1",
            parse_rfc3339(T0).unwrap() + 2.0,
            T0,
        );
        let (s, c) = state(&store, "llama");
        assert_eq!(
            (s.as_str(), &c["reason"]),
            ("DeploymentFailed", &json!("ImagePullBackOff"))
        );
        assert_eq!(
            c["message"],
            format!(
                "pod {pod_name}: container llama is in ImagePullBackOff: Back-off pulling image \"vllm/vllm-openai:v0.10.1\""
            )
        );
        let ds = &get(&store, IEC_GR, "ml", "llama").unwrap()["status"]["deploymentStatus"];
        assert_eq!(ds["deploymentObjectOverallState"], "Failed");
    }

    #[test]
    fn without_a_node_of_its_type_a_config_waits_then_fails() {
        let mut store = cluster(&[("cpu-1", "ml.m5.xlarge")]);
        put_iec(
            &mut store,
            iec("llama", "vllm/vllm-openai:v0.10.1", vllm_args(), json!({})),
        );
        let due = step(&mut store, 0.0);
        let (s, c) = state(&store, "llama");
        assert_eq!(
            (s.as_str(), &c["reason"]),
            ("DeploymentPending", &json!("WaitingForCapacity"))
        );
        assert_eq!(due, CAPACITY_GRACE_SECS, "due when the grace ends");
        step(&mut store, CAPACITY_GRACE_SECS);
        let (s, c) = state(&store, "llama");
        assert_eq!(
            (s.as_str(), &c["reason"]),
            ("DeploymentFailed", &json!("InsufficientCapacity"))
        );
        assert_eq!(
            c["message"],
            "the cluster has had no node of instance type ml.g5.8xlarge for 60s: the worker pods cannot be scheduled; add an instance group of that type"
        );
    }

    #[test]
    fn what_a_config_made_goes_when_it_goes() {
        let mut store = cluster(&[("gpu-1", "ml.g5.8xlarge")]);
        put_iec(
            &mut store,
            iec(
                "llama",
                "vllm/vllm-openai:v0.10.1",
                vllm_args(),
                json!({ "intelligentRoutingSpec": { "enabled": true } }),
            ),
        );
        step(&mut store, 0.0);
        step(&mut store, 1.0);
        assert!(get(&store, "/services", ROUTER_NS, "llama-ml-routing-service").is_some());
        store.remove(&Key::new(IEC_GR, "ml", "llama"));
        for t in 2..8 {
            step(&mut store, f64::from(t));
        }
        for (gr, ns, name) in [
            ("apps/deployments", "ml", "llama"),
            ("/services", "ml", "llama-service"),
            ("/persistentvolumeclaims", "ml", "llama-model"),
            ("/persistentvolumes", "", "ml-llama-model"),
            ("apps/deployments", ROUTER_NS, "llama-ml-router"),
            ("/services", ROUTER_NS, "llama-ml-routing-service"),
        ] {
            assert!(
                get(&store, gr, ns, name).is_none(),
                "{gr} {ns}/{name} is gone"
            );
        }
        assert_eq!(store.list("/pods", None).count(), 0, "and the pods");
    }
}
