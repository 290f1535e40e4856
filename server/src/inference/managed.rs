//! `deploy_inference_endpoint`: an InferenceEndpointConfig applied, then followed until
//! the inference operator reports every replica ready. The pre-flight is
//! deploy_model_server's (the same serve command, group, model and token rules, by the
//! same fields), plus what only the operator needs: the operator itself, a name no
//! InferenceEndpointConfig has, and tiered storage on when the KV cache's second tier is
//! kept there. What the operator makes of the object (its Deployment `<name>`, pods
//! labelled `app=<name>`, Service `<name>-service`, and the router
//! `<name>-<namespace>-routing-service` in its own namespace) is read, never written.

use app::api::ApiError;
use app::api::inference::ModelSource;
use app::api::inference::{DeployInferenceEndpoint, KvCache, L2Cache, NAMESPACE};
use app::api::storage::{SHARED_CLAIM, SHARED_MOUNT};
use app::api::values::IdempotencyKey;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::ListParams;

use super::Record;
use super::deploy::{self, Outputs, keep_token, token_secret};
use super::endpoint_config::{self, Source};
use super::workload::GPU;
use crate::cluster::managed::{Where, locate};
use crate::operation::pipeline::{Context, Pipeline, Preflight, Progress, stages};
use crate::resources::converge;
use crate::resources::kube::inference::InferenceEndpointConfig;
use crate::resources::kube::object::Applied;
use crate::resources::kube::{self as kubernetes};
use crate::resources::sagemaker::tiered_storage;

stages! {
    pub enum Stage {
        Config = "config", "The InferenceEndpointConfig applied: the inference operator makes the workers, their Service and router from it", true;
        Ready = "ready", "The operator reports the deployment complete, every replica ready", true;
    }
}

pub(crate) const IEC_CRD: &str = "inferenceendpointconfigs.inference.sagemaker.aws.amazon.com";

/// The inference operator serves `kind` (its CRD `crd`) on `cluster`, or a conflict
/// saying how to turn it on (and `otherwise`, what else would do).
pub(crate) async fn operator_serves(
    client: &kube::Client,
    cluster: &str,
    (crd, kind): (&str, &str),
    otherwise: &str,
) -> Result<(), ApiError> {
    if kubernetes::crd_served(client, crd).await? {
        return Ok(());
    }
    Err(ApiError::Conflict {
        message: format!(
            "{cluster} does not run the HyperPod inference operator ({kind} is not served): turn it on with update_features (inference_operator: true){otherwise}"
        ),
        operation_id: None,
        field: Some("name".into()),
    })
}

/// The Service the operator puts in front of endpoint `name`'s workers.
pub(crate) fn service_name(name: &str) -> String {
    format!("{name}-service")
}

/// The operator's router Service of endpoint `name` (in the operator's namespace).
pub(crate) fn router_service(name: &str) -> String {
    format!("{name}-{NAMESPACE}-routing-service")
}

/// The KV cache tiers an InferenceEndpointConfig's or a JumpStartModel's spec asks for,
/// as list_endpoints shows them.
pub(crate) fn kv_cache(spec: &serde_json::Value) -> Option<String> {
    let kv = spec.get("kvCacheSpec")?;
    let l2 =
        (kv["enableL2Cache"] == true).then(|| match kv["l2CacheSpec"]["l2CacheBackend"].as_str() {
            Some(b) if b.eq_ignore_ascii_case("redis") => L2Cache::Redis {
                url: app::api::values::RedisUrl::parse(
                    kv["l2CacheSpec"]["l2CacheLocalUrl"]
                        .as_str()
                        .unwrap_or("redis://unknown"),
                )
                .unwrap_or_else(|_| {
                    app::api::values::RedisUrl::parse("redis://unknown").expect("valid")
                }),
            },
            _ => L2Cache::TieredStorage,
        });
    Some(
        KvCache {
            cpu_offload: kv["enableL1Cache"] != false,
            l2,
        }
        .describe(),
    )
}

/// The workers of an object the operator deploys from, by the selector its `status`
/// names (none before the operator wrote one).
pub(crate) async fn pods(
    client: &kube::Client,
    status: &serde_json::Value,
) -> Result<Vec<Pod>, ApiError> {
    let Some(selector) = status["selector"].as_str().filter(|s| !s.is_empty()) else {
        return Ok(Vec::new());
    };
    let mut pods = Vec::new();
    let api = Api::<Pod>::namespaced(client.clone(), NAMESPACE);
    kubernetes::each_listed(&api, ListParams::default().labels(selector), |p| {
        pods.push(p)
    })
    .await?;
    pods.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    Ok(pods)
}

/// The storages a model path can be read from: each mount path and what it is.
async fn sources(
    aws: &crate::aws::Aws,
    store: &crate::store::Store,
    cluster: &str,
    region: &str,
) -> Result<Vec<(String, Source)>, ApiError> {
    Ok(crate::storage::list(aws, store, cluster)
        .await?
        .into_iter()
        .filter_map(|s| {
            let source = match (s.bucket, s.file_system) {
                (Some(bucket), _) => Source::S3 {
                    bucket,
                    region: region.to_owned(),
                    location: String::new(),
                },
                (None, Some(file_system)) => Source::Fsx {
                    file_system,
                    location: String::new(),
                },
                (None, None) => return None,
            };
            let mount = if s.shared {
                SHARED_MOUNT.to_owned()
            } else {
                s.mount_path
            };
            Some((mount, source))
        })
        .collect())
}

/// Where the request's model is read from.
async fn source(
    r: &DeployInferenceEndpoint,
    aws: &crate::aws::Aws,
    store: &crate::store::Store,
    at: &Where,
) -> Result<Source, ApiError> {
    let serve = r
        .as_model_server()
        .serve()
        .map_err(|why| ApiError::field("command", why))?;
    // The shared bucket needs no listing of every storage (and of the pods using each).
    let storages = match &serve.model {
        ModelSource::Hub(_) => Vec::new(),
        ModelSource::Path(p) if p.starts_with(&format!("{SHARED_MOUNT}/")) => {
            let (region, bucket, _) =
                crate::storage::bucket_of(aws, store, r.name.as_str(), SHARED_CLAIM).await?;
            let location = String::new();
            let bucket = Source::S3 {
                bucket,
                region,
                location,
            };
            vec![(SHARED_MOUNT.to_owned(), bucket)]
        }
        ModelSource::Path(_) => sources(aws, store, r.name.as_str(), &at.region).await?,
    };
    endpoint_config::source_of(&serve, &storages).map_err(|why| ApiError::field("command", why))
}

/// The KV cache's tiered_storage tier lives in the cluster's managed tiered storage, so
/// it needs that on; refused by field otherwise, before the operator would fail.
pub(crate) async fn tier_kept(
    kv: Option<&KvCache>,
    aws: &crate::aws::Aws,
    at: &Where,
    cluster: &str,
) -> Result<(), ApiError> {
    let Some(KvCache {
        l2: Some(L2Cache::TieredStorage),
        ..
    }) = kv
    else {
        return Ok(());
    };
    let described =
        crate::resources::sagemaker::described(&aws.sagemaker(&at.region), &at.hyperpod).await?;
    if tiered_storage::Observed::from(&described).enabled.is_none() {
        return Err(ApiError::field(
            "kv_cache.l2",
            format!(
                "{cluster}'s managed tiered storage is off, which the KV cache's tiered_storage tier is kept in: turn it on with update_features (tiered_checkpointing: true), or use a redis tier"
            ),
        ));
    }
    Ok(())
}

impl Pipeline for DeployInferenceEndpoint {
    type Stage = Stage;
    type Outputs = Outputs;

    fn target(&self) -> String {
        super::target(&self.name, &self.endpoint)
    }

    fn idempotency_key(&self) -> Option<&IdempotencyKey> {
        self.idempotency_key.as_ref()
    }

    async fn preflight(mut self, cx: &Preflight<'_>) -> Result<Self, ApiError> {
        let cluster = self.name.as_str();
        let endpoint = self.endpoint.as_str();
        let at = locate(cx.store, cluster, "to deploy inference endpoints").await?;
        let client = kubernetes::connect(cx.aws, &at.region, &at.eks).await?;
        operator_serves(
            &client,
            cluster,
            (IEC_CRD, InferenceEndpointConfig::KIND),
            ", or use deploy_model_server",
        )
        .await?;
        let configs = Api::<InferenceEndpointConfig>::namespaced(client.clone(), NAMESPACE);
        if kubernetes::get(&configs, endpoint).await?.is_some() {
            return Err(ApiError::field(
                "endpoint",
                format!(
                    "{cluster} already has an InferenceEndpointConfig named {endpoint} in {NAMESPACE}: choose another name, or delete_endpoint first"
                ),
            ));
        }
        tier_kept(self.kv_cache.as_ref(), cx.aws, &at, cluster).await?;
        let group = deploy::check(&self.as_model_server(), cx, &at, &client).await?;
        source(&self, cx.aws, cx.store, &at).await?;
        self.instance_group = Some(group);
        Ok(self)
    }

    async fn keep_secrets(&mut self, cx: &Preflight<'_>) -> Result<(), ApiError> {
        if let Some(token) = self.hf_token.take() {
            self.hf_token_secret = Some(keep_token(cx, &self.name, &self.endpoint, &token).await?);
        }
        Ok(())
    }

    async fn step(
        &self,
        cx: &Context,
        stage: Stage,
        out: &mut Outputs,
    ) -> Result<Progress, ApiError> {
        let at = locate(
            &cx.store,
            self.name.as_str(),
            "to deploy inference endpoints",
        )
        .await?;
        let client = kubernetes::connect(&cx.aws, &at.region, &at.eks).await?;
        let endpoint = self.endpoint.as_str();
        let server = self.as_model_server();
        let serve = server
            .serve()
            .map_err(|why| ApiError::field("command", why))?;
        out.endpoint = Some(format!("{NAMESPACE}/{endpoint}"));
        out.model = Some(serve.served_name.clone());
        match stage {
            Stage::Config => {
                let token = self.hf_token.is_some();
                deploy::claim::<InferenceEndpointConfig>(
                    &client,
                    endpoint,
                    &cx.operation_id,
                    token,
                )
                .await?;
                let target = deploy::placement(&server, &cx.aws, &cx.store, &at)
                    .await?
                    .target;
                out.instance_group = Some(target.group.clone());
                let source = source(self, &cx.aws, &cx.store, &at).await?;
                let secret = self
                    .hf_token_secret
                    .as_ref()
                    .map(|s| s.to_string())
                    .or_else(|| self.hf_token.is_some().then(|| token_secret(endpoint)));
                let object = endpoint_config::config(
                    self,
                    &serve,
                    &target,
                    &source,
                    &cx.operation_id,
                    secret.as_deref(),
                )?;
                converge(&Applied::namespaced(&client, object)).await?;
                Ok(Progress::Done)
            }
            Stage::Ready => {
                let at = (self.name.as_str(), endpoint);
                deploy::ready(
                    &client,
                    at,
                    super::MANAGED_KIND,
                    self.replicas.get(),
                    app::api::inference::ServiceShape::ClusterIp,
                    out,
                )
                .await
            }
        }
    }
}

impl super::Live {
    /// The serving container's image, command and GPUs, as hypd asked for them (as the
    /// operator runs them, for a catalogue model: the hub chose them).
    pub fn container(&self) -> (String, Vec<String>, u32) {
        let gpus = |limits: Option<&serde_json::Value>| {
            limits
                .and_then(|l| {
                    l[GPU]
                        .as_str()
                        .map(str::to_owned)
                        .or(l[GPU].as_u64().map(|n| n.to_string()))
                })
                .and_then(|q| q.parse().ok())
                .unwrap_or(0)
        };
        let first = |spec: Option<&k8s_openapi::api::core::v1::PodSpec>| {
            spec.and_then(|s| s.containers.first()).cloned()
        };
        match &self.record {
            Record::Server(_) | Record::JumpStart(_) => {
                let c = match &self.record {
                    Record::Server(d) => first(d.spec.template.spec.as_ref()),
                    _ => first(self.pods.first().and_then(|p| p.spec.as_ref())),
                };
                let c = c.as_ref();
                let limits = c
                    .and_then(|c| c.resources.as_ref()?.limits.as_ref())
                    .map(|l| serde_json::to_value(l).unwrap_or_default());
                (
                    c.and_then(|c| c.image.clone()).unwrap_or_default(),
                    c.and_then(|c| c.command.clone()).unwrap_or_default(),
                    gpus(limits.as_ref()),
                )
            }
            Record::Managed(c) => {
                let worker = &c.spec["worker"];
                (
                    worker["image"].as_str().unwrap_or_default().to_owned(),
                    serde_json::from_value(worker["command"].clone()).unwrap_or_default(),
                    gpus(Some(&worker["resources"]["limits"])),
                )
            }
        }
    }
}
