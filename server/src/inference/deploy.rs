//! `deploy_model_server`: the pre-flight refuses what could never serve (a group without
//! the GPUs a replica asks for, a model that is not where the command says, a name
//! taken), then the Deployment and the Service are applied and the replicas followed
//! until they answer their readiness probe (and a load balancer has its address); SGLang
//! workers may get the SGLang router in front and KEDA's ScaledObject after them
//! ([`super::router`]). The objects are applied by server-side apply, so a step run again changes nothing; an
//! object of that name made by anyone else is a conflict, never taken over.
//!
//! A token never reaches hypd's store: [`Pipeline::keep_secrets`] puts it in the Secret
//! `hypd-hf-token-<endpoint>` before the operation is stored; the pods read it there.

use std::time::Duration;

use app::api::ApiError;
use app::api::inference::{
    DeployModelServer, ENDPOINT_LABEL, ModelSource, NAMESPACE, ServiceShape, TOKEN_SECRET,
};
use app::api::models::HfToken;
use app::api::plan::{Action, Change, FieldChange, KNOWN_AFTER_APPLY};
use app::api::storage::SHARED_CLAIM;
use app::api::values::{ClusterName, EndpointName, IdempotencyKey, InstanceGroupName, SecretName};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Service as KubeService;
use kube::Api;
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::workload::{self, COLD_START_ANNOTATION, OPERATION_ANNOTATION, Placement};
use crate::aws::SdkResultExt;
use crate::cluster::managed::{Where, locate};
use crate::operation::pipeline::{Context, Pipeline, Preflight, Progress, Stage as _, stages};
use crate::resources::kube::object::{Applied, made_by_hypd};
use crate::resources::kube::{self as kubernetes};
use crate::resources::{converge, is_planning, planned};
use crate::training::check::{choose, groups};

stages! {
    pub enum Stage {
        Workload = "workload", "The Deployment applied: replicas of the serving container with their GPUs on the group's nodes, the model's storage mounted", true;
        Service = "service", "The Service applied (in-cluster, or an internet-facing NLB)", true;
        Router = "router", "The SGLang router applied in front of the replicas, with the pod-reading account it discovers them with", true;
        Ready = "ready", "Every replica ready (its model loaded and answering /health), the router too, and the load balancer's address known", true;
        Autoscaling = "autoscaling", "The KEDA ScaledObject applied: from now on KEDA sizes the replicas on the router's requests in flight (to zero only with a cooldown as long as the measured cold start)", true;
    }
}

/// What the stages found, stored with the operation. Field names are stored: never rename.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Outputs {
    /// `default/<endpoint>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_group: Option<String>,
    #[serde(default)]
    pub ready: u32,
    #[serde(default)]
    pub replicas: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cold_start_seconds: Option<f64>,
}

const POLL: Duration = Duration::from_secs(2);

/// The Secret a token given with endpoint `endpoint` is kept in.
pub(crate) fn token_secret(endpoint: &str) -> String {
    format!("{TOKEN_SECRET}-{endpoint}")
}

/// Every storage of the cluster but the shared bucket: its claim and mount path.
async fn mounts(
    aws: &crate::aws::Aws,
    store: &crate::store::Store,
    cluster: &str,
) -> Result<Vec<(String, String)>, ApiError> {
    Ok(crate::storage::list(aws, store, cluster)
        .await?
        .into_iter()
        .filter(|s| !s.shared)
        .map(|s| (s.name, s.mount_path))
        .collect())
}

/// Where the request's replicas run: its group (chosen by the pre-flight) and the
/// storage its model is read from.
/// The pre-flight refuses what this refuses, by the same field; the steps compute it
/// again from the stored request (the group the pre-flight chose).
pub(crate) async fn placement(
    r: &DeployModelServer,
    aws: &crate::aws::Aws,
    store: &crate::store::Store,
    at: &Where,
) -> Result<Placement, ApiError> {
    let described =
        crate::resources::sagemaker::described(&aws.sagemaker(&at.region), &at.hyperpod).await?;
    let groups = groups(aws, &at.region, &described).await?;
    let group = choose(&groups, r.instance_group.as_ref(), r.name.as_str())
        .map_err(|why| ApiError::field("instance_group", why))?;
    let serve = r.serve().map_err(|why| ApiError::field("command", why))?;
    let storage = match &serve.model {
        ModelSource::Path(p) if !p.starts_with("/s3/") => {
            workload::storage_of(&serve, &mounts(aws, store, r.name.as_str()).await?)
                .map_err(|why| ApiError::field("command", why))?
                .cloned()
        }
        _ => None,
    };
    Ok(Placement {
        target: group.target(),
        storage,
    })
}

/// What already has name `name` in the endpoints' namespace: a Deployment or a Service.
async fn taken(client: &kube::Client, name: &str) -> Result<Option<&'static str>, ApiError> {
    let deployments = Api::<Deployment>::namespaced(client.clone(), NAMESPACE);
    let services = Api::<KubeService>::namespaced(client.clone(), NAMESPACE);
    Ok(match kubernetes::get(&deployments, name).await? {
        Some(_) => Some("Deployment"),
        None => kubernetes::get(&services, name).await?.map(|_| "Service"),
    })
}

/// Endpoint name `endpoint` is free on `cluster`, or refused by field `endpoint`.
pub(crate) async fn free(
    client: &kube::Client,
    cluster: &str,
    endpoint: &str,
) -> Result<(), ApiError> {
    match taken(client, endpoint).await? {
        Some(kind) => Err(ApiError::field(
            "endpoint",
            format!(
                "{cluster} already has a {kind} named {endpoint} in {NAMESPACE}: choose another name, or delete_endpoint first"
            ),
        )),
        None => Ok(()),
    }
}

/// What deploy_model_server and deploy_inference_endpoint both refuse, by the same
/// fields: a name taken, no group with room for a replica, a model not where the command
/// says, a named token Secret without a token. The group chosen is stored with the
/// request.
pub(crate) async fn check(
    r: &DeployModelServer,
    cx: &Preflight<'_>,
    at: &Where,
    client: &kube::Client,
) -> Result<InstanceGroupName, ApiError> {
    let cluster = r.name.as_str();
    let endpoint = r.endpoint.as_str();
    let serve = r.serve().map_err(|why| ApiError::field("command", why))?;
    // The name is free: neither hypd's endpoint nor anyone's Deployment or Service;
    // nor is the router's, when the request asks for one.
    free(client, cluster, endpoint).await?;
    let router = r
        .router
        .as_ref()
        .map(|_| (super::router::name(endpoint), "router"));
    let rate = r.autoscaling.as_ref().and_then(|a| a.request_rate.as_ref());
    let prometheus = rate.map(|_| (super::prometheus::name(endpoint), "Prometheus server"));
    for (name, what) in router.iter().chain(&prometheus) {
        if let Some(kind) = taken(client, name).await? {
            return Err(ApiError::field(
                "endpoint",
                format!(
                    "{cluster} already has a {kind} named {name} in {NAMESPACE}, the name the endpoint's {what} takes: choose another endpoint name"
                ),
            ));
        }
    }
    // A group to run on, a storage holding the model's path, and a replica that fits
    // on one node of that group.
    let target = placement(r, cx.aws, cx.store, at).await?.target;
    let gpus = r.gpus_per_replica.get();
    if gpus > target.gpus {
        return Err(ApiError::field(
            "gpus_per_replica",
            format!(
                "a replica asks for {gpus} GPUs but a node of group {} ({}) has {}: ask for at most {}, or choose a group with more",
                target.group, target.instance_type, target.gpus, target.gpus
            ),
        ));
    }
    let group = InstanceGroupName::parse(&target.group).map_err(ApiError::internal)?;
    // A model in the shared bucket is there.
    if let ModelSource::Path(path) = &serve.model
        && let Some(key) = path.strip_prefix("/s3/")
    {
        let (region, bucket, _) =
            crate::storage::bucket_of(cx.aws, cx.store, cluster, SHARED_CLAIM).await?;
        let page = cx
            .aws
            .s3(&region)
            .list_objects_v2()
            .bucket(&bucket)
            .prefix(format!("{key}/"))
            .max_keys(1)
            .send()
            .await
            .upstream("s3", "ListObjectsV2")?;
        if page.key_count().unwrap_or(0) == 0 {
            return Err(ApiError::field(
                "command",
                format!(
                    "nothing is at {path} (s3://{bucket}/{key}/): put the model there first (download_model writes a Hugging Face model to /s3/models/<organisation>/<name>)"
                ),
            ));
        }
    }
    if let Some(secret) = &r.hf_token_secret {
        crate::model::token::check_secret(client, cluster, secret).await?;
    }
    if r.autoscaling.is_some() && !kubernetes::crd_served(client, KEDA_CRD).await? {
        return Err(ApiError::Conflict {
            message: format!(
                "{cluster} does not run KEDA (ScaledObject is not served): turn it on with update_features (keda: true), or deploy without autoscaling"
            ),
            operation_id: None,
            field: Some("autoscaling".into()),
        });
    }
    Ok(group)
}

/// The CRD that says KEDA is installed (by the keda feature or the inference operator's).
const KEDA_CRD: &str = "scaledobjects.keda.sh";

/// Before the object endpoint `endpoint` is made of (kind `K`) is applied: one already
/// there must be this operation's (a step run again), never one made by anyone since the
/// pre-flight. A plan of a request with a token lists its Secret, made when it is sent.
pub(crate) async fn claim<K>(
    client: &kube::Client,
    endpoint: &str,
    operation: &str,
    token: bool,
) -> Result<(), ApiError>
where
    K: kube::Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    if token {
        planned(|| Change::new(Action::Create, "k8s:v1/Secret", token_secret(endpoint)));
    }
    if is_planning() {
        return Ok(());
    }
    let Some(live) =
        kubernetes::get(&Api::<K>::namespaced(client.clone(), NAMESPACE), endpoint).await?
    else {
        return Ok(());
    };
    let made_by = live
        .meta()
        .annotations
        .as_ref()
        .and_then(|a| a.get(OPERATION_ANNOTATION));
    if made_by.map(String::as_str) == Some(operation) {
        return Ok(());
    }
    Err(ApiError::field(
        "endpoint",
        format!(
            "{} {} named {endpoint} was made by {} after this operation was checked: delete it or choose another name",
            if K::kind(&()).starts_with(['A', 'E', 'I', 'O', 'U']) {
                "an"
            } else {
                "a"
            },
            K::kind(&()),
            made_by.map_or("someone else".to_owned(), |o| format!("operation {o}"))
        ),
    ))
}

/// A token given with endpoint `endpoint` kept in its Secret; the Secret's name.
pub(crate) async fn keep_token(
    cx: &Preflight<'_>,
    cluster: &ClusterName,
    endpoint: &EndpointName,
    token: &HfToken,
) -> Result<SecretName, ApiError> {
    let at = locate(cx.store, cluster.as_str(), "to deploy model servers").await?;
    let client = kubernetes::connect(cx.aws, &at.region, &at.eks).await?;
    let name = token_secret(endpoint.as_str());
    let labels = [(ENDPOINT_LABEL.to_owned(), endpoint.to_string())].into();
    crate::model::token::keep(&client, &name, labels, token).await
}

impl Pipeline for DeployModelServer {
    type Stage = Stage;
    type Outputs = Outputs;

    /// Its own target: an endpoint queues behind changes of the same endpoint only.
    fn target(&self) -> String {
        super::target(&self.name, &self.endpoint)
    }

    fn idempotency_key(&self) -> Option<&IdempotencyKey> {
        self.idempotency_key.as_ref()
    }

    /// The router's and the autoscaler's stages only when the request asks for them.
    fn plan(&self) -> Vec<Stage> {
        let asked = |s: &Stage| match s {
            Stage::Router => self.router.is_some(),
            Stage::Autoscaling => self.autoscaling.is_some(),
            _ => true,
        };
        Stage::ALL.iter().copied().filter(asked).collect()
    }

    async fn preflight(mut self, cx: &Preflight<'_>) -> Result<Self, ApiError> {
        let at = locate(cx.store, self.name.as_str(), "to deploy model servers").await?;
        let client = kubernetes::connect(cx.aws, &at.region, &at.eks).await?;
        self.instance_group = Some(check(&self, cx, &at, &client).await?);
        Ok(self)
    }

    /// The token goes into the endpoint's Secret and out of the request.
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
        let at = locate(&cx.store, self.name.as_str(), "to deploy model servers").await?;
        let client = kubernetes::connect(&cx.aws, &at.region, &at.eks).await?;
        let endpoint = self.endpoint.as_str();
        let serve = self
            .serve()
            .map_err(|why| ApiError::field("command", why))?;
        out.endpoint = Some(format!("{NAMESPACE}/{endpoint}"));
        out.model = Some(serve.served_name.clone());
        match stage {
            Stage::Workload => {
                let token = self.hf_token.is_some();
                claim::<Deployment>(&client, endpoint, &cx.operation_id, token).await?;
                let placement = placement(self, &cx.aws, &cx.store, &at).await?;
                out.instance_group = Some(placement.target.group.clone());
                let secret = self
                    .hf_token_secret
                    .as_ref()
                    .map(|s| s.to_string())
                    .or_else(|| self.hf_token.is_some().then(|| token_secret(endpoint)));
                let deployment = workload::deployment(
                    self,
                    &serve,
                    &placement,
                    &cx.operation_id,
                    secret.as_deref(),
                )?;
                converge(&Applied::namespaced(&client, deployment)).await?;
                Ok(Progress::Done)
            }
            // A pool's workers are reached through the Services of its models, which
            // assign_pool_workers makes.
            Stage::Service if self.service == ServiceShape::ModelPool => Ok(Progress::Done),
            Stage::Service => {
                let services = Api::<KubeService>::namespaced(client.clone(), NAMESPACE);
                if !is_planning()
                    && let Some(live) = kubernetes::get(&services, endpoint).await?
                    && !made_by_hypd(&live.metadata)
                {
                    return Err(ApiError::field(
                        "endpoint",
                        format!(
                            "a Service named {endpoint} was made by someone else after this operation was checked: delete it or choose another name"
                        ),
                    ));
                }
                converge(&Applied::namespaced(
                    &client,
                    workload::service(self, &serve)?,
                ))
                .await?;
                Ok(Progress::Done)
            }
            Stage::Router => {
                let Some(router) = &self.router else {
                    return Ok(Progress::Done);
                };
                let name = super::router::name(endpoint);
                claim::<Deployment>(&client, &name, &cx.operation_id, false).await?;
                let (account, role, binding) = super::router::access(endpoint)?;
                converge(&Applied::namespaced(&client, account)).await?;
                converge(&Applied::namespaced(&client, role)).await?;
                converge(&Applied::namespaced(&client, binding)).await?;
                let deployment = super::router::deployment(self, router, &serve, &cx.operation_id)?;
                converge(&Applied::namespaced(&client, deployment)).await?;
                let metrics = super::router::metrics_service(endpoint)?;
                converge(&Applied::namespaced(&client, metrics)).await?;
                Ok(Progress::Done)
            }
            Stage::Ready => {
                if self.router.is_some() && !is_planning() {
                    let name = super::router::name(endpoint);
                    let deployments = Api::<Deployment>::namespaced(client.clone(), NAMESPACE);
                    let ready = kubernetes::get(&deployments, &name)
                        .await?
                        .and_then(|d| d.status)
                        .and_then(|s| s.ready_replicas)
                        .unwrap_or(0);
                    if ready < 1 {
                        return Ok(Progress::wait(
                            POLL,
                            format!("the router {NAMESPACE}/{name} is not ready yet"),
                        ));
                    }
                }
                let at = (self.name.as_str(), endpoint);
                let kind = "k8s:apps/v1/Deployment";
                ready(&client, at, kind, self.replicas.get(), self.service, out).await
            }
            Stage::Autoscaling => {
                let (Some(object), Some(scaling)) =
                    (super::router::scaled_object(self), &self.autoscaling)
                else {
                    return Ok(Progress::Done);
                };
                // The cold start is known once `ready` has run, which a plan has not.
                if !is_planning() {
                    super::router::cooldown_outlasts(endpoint, scaling, out.cold_start_seconds)?;
                }
                // The server the rate is asked of comes first: KEDA reports the trigger
                // failing until it answers.
                if scaling.request_rate.is_some() {
                    let name = super::prometheus::name(endpoint);
                    claim::<Deployment>(&client, &name, &cx.operation_id, false).await?;
                    let (config, deployment, service) =
                        super::prometheus::objects(endpoint, &cx.operation_id)?;
                    converge(&Applied::namespaced(&client, config)).await?;
                    converge(&Applied::namespaced(&client, deployment)).await?;
                    converge(&Applied::namespaced(&client, service)).await?;
                }
                converge(&Applied::namespaced(&client, object)).await?;
                Ok(Progress::Done)
            }
        }
    }
}

/// Whether endpoint `endpoint` serves with every replica it asks for (and its load
/// balancer's address), recording its cold start on the Deployment when it does: it
/// outlives the pods (an endpoint scaled to zero still knows how long it takes to wake).
/// A plan lists that record on `kind` (whose value is known once the replicas are up)
/// unless the endpoint is asked for `replicas` 0, which has no replica to time.
pub(crate) async fn ready(
    client: &kube::Client,
    (cluster, endpoint): (&str, &str),
    kind: &str,
    replicas: u32,
    shape: ServiceShape,
    out: &mut Outputs,
) -> Result<Progress, ApiError> {
    if is_planning() {
        if replicas > 0 {
            planned(|| {
                let mut c = Change::new(Action::Update, kind, endpoint);
                c.namespace = Some(NAMESPACE.to_owned());
                c.fields = vec![FieldChange {
                    field: format!("metadata.annotations.{COLD_START_ANNOTATION}"),
                    old: None,
                    new: Some(json!(KNOWN_AFTER_APPLY)),
                }];
                c
            });
        }
        return Ok(Progress::Done);
    }
    let Some(live) = super::find(client, endpoint).await? else {
        return Err(ApiError::Conflict {
            message: format!("the endpoint {endpoint} was deleted before it was ready"),
            operation_id: None,
            field: Some("endpoint".into()),
        });
    };
    out.replicas = live.replicas();
    out.ready = live.ready();
    out.address = live.address();
    if live.phase() == "failed" {
        let (code, call) = match &live.record {
            super::Record::Server(_) => (
                "ReplicasFailed",
                format!("Deployment {NAMESPACE}/{endpoint}"),
            ),
            operated => (
                "DeploymentFailed",
                format!(
                    "{} {NAMESPACE}/{endpoint}",
                    operated.kind().rsplit('/').next().unwrap_or_default()
                ),
            ),
        };
        return Err(ApiError::Upstream {
            service: "kubernetes".into(),
            call,
            code: Some(code.into()),
            message: format!(
                "the endpoint's replicas cannot start: {}",
                live.waiting().unwrap_or_default()
            ),
            request_id: None,
            transient: false,
        });
    }
    // Pods of an earlier size still going away are not counted as serving; the
    // operator's own word is waited for too.
    let operator_done = live
        .operator_state()
        .is_none_or(|s| s == "DeploymentComplete")
        || matches!(live.record, super::Record::Server(_));
    let settled = out.ready >= out.replicas && live.pods.len() as u32 <= out.replicas;
    if !settled || !operator_done {
        let why = live
            .waiting()
            .or_else(|| {
                live.operator_state()
                    .map(|s| format!("the operator reports {s}"))
            })
            .map(|w| format!("; {w}"))
            .unwrap_or_default();
        return Ok(Progress::wait(
            POLL,
            format!("{} of {} replicas ready{why}", out.ready, out.replicas),
        ));
    }
    if shape == ServiceShape::LoadBalancer && out.address.is_none() && out.replicas > 0 {
        return Ok(Progress::wait(
            POLL,
            format!("the load balancer of {cluster}/{endpoint} has no address yet"),
        ));
    }
    out.cold_start_seconds = live.cold_start_seconds();
    if let Some(seconds) = out.cold_start_seconds {
        let patch = json!({ "metadata": { "annotations": { COLD_START_ANNOTATION: format!("{seconds:.1}") } } });
        live.record.patch(client, &patch, false).await?;
    }
    Ok(Progress::Done)
}
