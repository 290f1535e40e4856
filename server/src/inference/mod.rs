//! Model endpoints on a cluster: `workload` (the Deployment and Service a
//! `deploy_model_server` request becomes), the `deploy`, `scale` and `delete` pipelines,
//! `invoke` (a chat completion through the API server's service proxy), `endpoint_config`
//! and `managed` (the inference operator's InferenceEndpointConfig a
//! `deploy_inference_endpoint` request becomes, and its pipeline), and the reads here.
//! The cluster is the record: an endpoint is its Deployment, or its
//! InferenceEndpointConfig, as the cluster holds it (labels and annotations say what
//! hypd made it from), never a row of hypd's store, so what `list_endpoints` shows is
//! what runs; both kinds are one list, one detail, one scale, one delete, one invoke.

pub mod delete;
pub mod deploy;
pub mod endpoint_config;
pub mod invoke;
pub mod jumpstart;
pub mod managed;
pub mod pool;
pub mod prometheus;
pub mod router;
pub mod scale;
pub mod workload;

use app::api::ApiError;
use app::api::inference::{
    ENDPOINT_LABEL, Endpoint, EndpointList, EndpointPod, EndpointSummary, GetEndpoint,
    ListEndpoints, NAMESPACE, RoutingStrategy, UnreadableCluster,
};
use futures_util::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Service as KubeService};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams};

use self::workload::{
    COLD_START_ANNOTATION, ENGINE_LABEL, GROUP_ANNOTATION, MODEL_ANNOTATION, PORT_ANNOTATION,
    ROUTER_ANNOTATION, SECRET_ANNOTATION, SHAPE_ANNOTATION,
};
use crate::auth::Actor;
use crate::resources::kube::inference::{InferenceEndpointConfig, JumpStartModel};
use crate::resources::kube::keda::ScaledObject;
use crate::resources::kube::{self as kubernetes};
use crate::service::{Handler, Service};
use crate::storage::region_of;

/// Pod waiting reasons that do not pass by themselves: the endpoint has failed until
/// someone changes it.
const FAILED_REASONS: &[&str] = &[
    "CrashLoopBackOff",
    "ImagePullBackOff",
    "ErrImagePull",
    "InvalidImageName",
    "CreateContainerConfigError",
];

/// What an endpoint is made of, as hypd applied it.
pub(crate) enum Record {
    /// deploy_model_server's Deployment.
    Server(Box<Deployment>),
    /// deploy_inference_endpoint's InferenceEndpointConfig (the operator makes the
    /// Deployment).
    Managed(Box<InferenceEndpointConfig>),
    /// deploy_jumpstart_model's JumpStartModel (the operator makes the Deployment).
    JumpStart(Box<JumpStartModel>),
}

/// An endpoint as the cluster holds it: its record, pods and Service (and the
/// ScaledObject that sizes it, when KEDA does).
pub(crate) struct Live {
    pub record: Record,
    pub pods: Vec<Pod>,
    pub service: Option<KubeService>,
    pub scaler: Option<ScaledObject>,
}

/// The namespace of the inference operator's routers.
pub(crate) const OPERATOR_NAMESPACE: &str = "hyperpod-inference-system";

/// Seconds from a pod's scheduling to its readiness, once it is ready.
fn cold_start(pod: &Pod) -> Option<f64> {
    let conditions = pod.status.as_ref()?.conditions.as_ref()?;
    let at = |kind: &str| {
        conditions
            .iter()
            .find(|c| c.type_ == kind && c.status == "True")
            .and_then(|c| c.last_transition_time.as_ref())
            .map(|t| t.0)
    };
    let (scheduled, ready) = (at("PodScheduled")?, at("Ready")?);
    Some(ready.duration_since(scheduled).as_secs_f64().max(0.0))
}

fn is_ready(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

impl Record {
    pub fn meta(&self) -> &ObjectMeta {
        match self {
            Record::Server(d) => &d.metadata,
            Record::Managed(c) => &c.metadata,
            Record::JumpStart(m) => &m.metadata,
        }
    }

    /// The kind hypd applied, as plans name it.
    pub fn kind(&self) -> &'static str {
        match self {
            Record::Server(_) => "k8s:apps/v1/Deployment",
            Record::Managed(_) => MANAGED_KIND,
            Record::JumpStart(_) => jumpstart::JUMPSTART_KIND,
        }
    }

    /// The spec and status of an object the inference operator deploys from.
    fn operated(&self) -> Option<(&serde_json::Value, &serde_json::Value)> {
        match self {
            Record::Server(_) => None,
            Record::Managed(c) => Some((&c.spec, &c.status)),
            Record::JumpStart(m) => Some((&m.spec, &m.status)),
        }
    }

    /// Merges `patch` into the object (into its scale subresource when `scale`).
    pub async fn patch(
        &self,
        client: &kube::Client,
        patch: &serde_json::Value,
        scale: bool,
    ) -> Result<(), ApiError> {
        let name = self.meta().name.as_deref().unwrap_or_default();
        let patched = match self {
            Record::Server(_) => patch_as::<Deployment>(client, name, patch, scale).await,
            Record::Managed(_) => {
                patch_as::<InferenceEndpointConfig>(client, name, patch, scale).await
            }
            Record::JumpStart(_) => patch_as::<JumpStartModel>(client, name, patch, scale).await,
        };
        let what = if scale { "scale" } else { "patch" };
        patched.map_err(|e| kubernetes::upstream(&format!("{what} {}/{name}", self.kind()), e))
    }
}

async fn patch_as<K>(
    client: &kube::Client,
    name: &str,
    patch: &serde_json::Value,
    scale: bool,
) -> Result<(), kube::Error>
where
    K: kube::Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let api = Api::<K>::namespaced(client.clone(), NAMESPACE);
    let (params, patch) = (PatchParams::default(), Patch::Merge(patch));
    if scale {
        api.patch_scale(name, &params, &patch).await.map(drop)
    } else {
        api.patch(name, &params, &patch).await.map(drop)
    }
}

/// The target of every operation on endpoint `endpoint` of `cluster`, whichever kind it
/// is made of (one unfinished operation per target at a time).
pub(crate) fn target(
    cluster: &impl std::fmt::Display,
    endpoint: &impl std::fmt::Display,
) -> String {
    format!("cluster/{cluster}/endpoints/{endpoint}")
}

/// An InferenceEndpointConfig as plans name it.
pub(crate) const MANAGED_KIND: &str =
    "k8s:inference.sagemaker.aws.amazon.com/v1/InferenceEndpointConfig";

impl Live {
    fn annotation(&self, key: &str) -> Option<&str> {
        self.record
            .meta()
            .annotations
            .as_ref()
            .and_then(|a| a.get(key))
            .map(String::as_str)
    }

    pub fn name(&self) -> &str {
        self.record.meta().name.as_deref().unwrap_or_default()
    }

    /// Replicas asked for.
    pub fn replicas(&self) -> u32 {
        match &self.record {
            Record::Server(d) => d.spec.replicas,
            operated => operated
                .operated()
                .and_then(|(spec, _)| spec["replicas"].as_i64())
                .map(|r| r as i32),
        }
        .map_or(1, |r| r.max(0) as u32)
    }

    pub fn ready(&self) -> u32 {
        self.pods.iter().filter(|p| is_ready(p)).count() as u32
    }

    /// The slowest ready replica's cold start, or the one recorded when it last scaled
    /// up (its pods may be gone since).
    pub fn cold_start_seconds(&self) -> Option<f64> {
        let live = self.pods.iter().filter_map(cold_start).reduce(f64::max);
        let recorded = self
            .annotation(COLD_START_ANNOTATION)
            .and_then(|s| s.parse::<f64>().ok());
        match (live, recorded) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        }
    }

    /// The operator's state of a managed endpoint (`DeploymentComplete`...).
    pub fn operator_state(&self) -> Option<&str> {
        self.record.operated()?.1["state"].as_str()
    }

    /// Why the operator failed a managed endpoint, as it says.
    fn operator_failure(&self) -> Option<String> {
        let (_, status) = self.record.operated()?;
        if self.operator_state() != Some("DeploymentFailed") {
            return None;
        }
        let failed = status["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|k| {
                k["reason"]
                    .as_str()
                    .is_some_and(|r| r != "DeploymentComplete")
                    && k["message"].is_string()
                    && (k["status"] == "False"
                        || k["type"].as_str().is_some_and(|t| t.contains("Fail")))
            })
            .map(|k| (k["reason"].as_str(), k["message"].as_str()));
        let (reason, message) = failed.unwrap_or((
            status["deploymentStatus"]["reason"].as_str(),
            status["deploymentStatus"]["message"].as_str(),
        ));
        let said: Vec<&str> = [reason, message]
            .into_iter()
            .flatten()
            .filter(|s| !s.is_empty())
            .collect();
        Some(if said.is_empty() {
            "the inference operator failed the deployment".to_owned()
        } else {
            said.join(": ")
        })
    }

    /// The first thing holding a replica back, as `pod: reason` (or the operator's).
    pub fn waiting(&self) -> Option<String> {
        self.operator_failure().or_else(|| {
            self.pods.iter().find_map(|p| {
                kubernetes::not_running(p)
                    .map(|w| format!("{}: {w}", p.metadata.name.as_deref().unwrap_or("pod")))
            })
        })
    }

    pub fn phase(&self) -> &'static str {
        let (replicas, ready) = (self.replicas(), self.ready());
        let failed = self.operator_failure().is_some()
            || self.pods.iter().any(|p| {
                p.status
                    .as_ref()
                    .and_then(|s| s.container_statuses.as_ref())
                    .into_iter()
                    .flatten()
                    .filter_map(|c| c.state.as_ref()?.waiting.as_ref()?.reason.as_deref())
                    .any(|r| FAILED_REASONS.contains(&r))
            });
        match () {
            _ if replicas == 0 => "scaled_to_zero",
            _ if failed && ready == 0 => "failed",
            _ if ready == 0 => "deploying",
            _ if ready < replicas => "scaling",
            _ => "in_service",
        }
    }

    /// The load balancer's DNS name, once it has one.
    pub fn address(&self) -> Option<String> {
        let ingress = self
            .service
            .as_ref()?
            .status
            .as_ref()?
            .load_balancer
            .as_ref()?
            .ingress
            .as_ref()?;
        ingress
            .iter()
            .find_map(|i| i.hostname.clone().or_else(|| i.ip.clone()))
    }

    pub fn port(&self) -> u16 {
        self.annotation(PORT_ANNOTATION)
            .and_then(|p| p.parse().ok())
            .unwrap_or(8000)
    }

    /// The operator's routing strategy, when its router fronts the replicas.
    pub fn routing(&self) -> Option<RoutingStrategy> {
        let (spec, _) = self.record.operated()?;
        let spec = &spec["intelligentRoutingSpec"];
        if spec["enabled"] != true {
            return None;
        }
        RoutingStrategy::from_operator(spec["routingStrategy"].as_str().unwrap_or("prefixaware"))
    }

    /// Where invocations go, as the API server's service proxy names it
    /// (`namespace`, `[scheme:]service:port`): the operator's router when it routes, a
    /// pool's model's Service, else the Service in front of the replicas.
    pub fn invocation_target(&self, model: &str) -> (String, String) {
        let name = self.name();
        match &self.record {
            Record::Server(_) if self.is_pool() => (
                NAMESPACE.to_owned(),
                format!("{}:{}", pool::service_name(name, model), self.port()),
            ),
            Record::Server(_) => (NAMESPACE.to_owned(), format!("{name}:{}", self.port())),
            Record::Managed(_) | Record::JumpStart(_) if self.routing().is_some() => (
                OPERATOR_NAMESPACE.to_owned(),
                format!("https:{}:443", managed::router_service(name)),
            ),
            Record::Managed(_) | Record::JumpStart(_) => (
                NAMESPACE.to_owned(),
                format!("{}:{}", managed::service_name(name), self.port()),
            ),
        }
    }

    /// The path an OpenAI chat completion is posted to: a catalogue model's server
    /// answers SageMaker's own `invocations` (whatever its image), every other one the
    /// OpenAI path.
    pub fn invocation_path(&self) -> &'static str {
        match &self.record {
            Record::JumpStart(_) => app::api::jumpstart::INVOCATION_PATH,
            _ => endpoint_config::INVOCATION_PATH,
        }
    }

    pub fn summary(&self, cluster: &str) -> EndpointSummary {
        let meta = self.record.meta();
        let labels = meta.labels.clone().unwrap_or_default();
        let (kind, service, kv_cache) = match &self.record {
            Record::Server(_) => (
                "model_server",
                self.annotation(SHAPE_ANNOTATION).unwrap_or_default(),
                None,
            ),
            Record::Managed(c) => (
                "inference_endpoint",
                "cluster_ip",
                managed::kv_cache(&c.spec),
            ),
            Record::JumpStart(m) => ("jumpstart_model", "cluster_ip", managed::kv_cache(&m.spec)),
        };
        EndpointSummary {
            name: cluster.to_owned(),
            endpoint: self.name().to_owned(),
            kind: kind.to_owned(),
            engine: labels.get(ENGINE_LABEL).cloned().unwrap_or_default(),
            model: self
                .annotation(MODEL_ANNOTATION)
                .unwrap_or_default()
                .to_owned(),
            service: service.to_owned(),
            phase: self.phase().to_owned(),
            replicas: self.replicas(),
            ready: self.ready(),
            address: self.address(),
            cold_start_seconds: self.cold_start_seconds(),
            created_at: meta.creation_timestamp.as_ref().map(|t| t.0.to_string()),
            routing: self
                .routing()
                .map(|r| r.as_str().to_owned())
                .or_else(|| self.annotation(ROUTER_ANNOTATION).map(str::to_owned)),
            autoscaling: self.scaler.as_ref().map(router::state),
            kv_cache,
            pool: self.pool(),
        }
    }
}

fn selector(endpoint: &str) -> ListParams {
    ListParams::default().labels(&format!("{ENDPOINT_LABEL}={endpoint}"))
}

/// The pods of endpoint `endpoint` (by its label, whichever ReplicaSet made them), by name.
pub(crate) async fn find_pods(client: &kube::Client, endpoint: &str) -> Result<Vec<Pod>, ApiError> {
    let mut pods = Vec::new();
    let api = Api::<Pod>::namespaced(client.clone(), NAMESPACE);
    kubernetes::each_listed(&api, selector(endpoint), |p| pods.push(p)).await?;
    pods.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    Ok(pods)
}

/// The Deployment of endpoint `endpoint`, if hypd made one of that name.
pub(crate) async fn deployment(
    client: &kube::Client,
    endpoint: &str,
) -> Result<Option<Deployment>, ApiError> {
    let deployments = Api::<Deployment>::namespaced(client.clone(), NAMESPACE);
    Ok(kubernetes::get(&deployments, endpoint)
        .await?
        .filter(|d| labelled(&d.metadata, endpoint)))
}

/// The InferenceEndpointConfig of endpoint `endpoint`, if hypd made one of that name (none
/// where the inference operator is not installed).
pub(crate) async fn config(
    client: &kube::Client,
    endpoint: &str,
) -> Result<Option<InferenceEndpointConfig>, ApiError> {
    let configs = Api::<InferenceEndpointConfig>::namespaced(client.clone(), NAMESPACE);
    Ok(kubernetes::get(&configs, endpoint)
        .await?
        .filter(|c| labelled(&c.metadata, endpoint)))
}

/// Whether an object is hypd's for endpoint `endpoint`: its label `label` (the
/// endpoint's, or its router's) names it.
pub(crate) fn labelled_by(meta: &ObjectMeta, label: &str, endpoint: &str) -> bool {
    meta.labels
        .as_ref()
        .is_some_and(|l| l.get(label).map(String::as_str) == Some(endpoint))
}

fn labelled(meta: &ObjectMeta, endpoint: &str) -> bool {
    labelled_by(meta, ENDPOINT_LABEL, endpoint)
}

/// What endpoint `endpoint` was made of, if hypd made it: its Deployment or its
/// InferenceEndpointConfig.
pub(crate) async fn record(
    client: &kube::Client,
    endpoint: &str,
) -> Result<Option<Record>, ApiError> {
    if let Some(d) = deployment(client, endpoint).await? {
        return Ok(Some(Record::Server(Box::new(d))));
    }
    if let Some(c) = config(client, endpoint).await? {
        return Ok(Some(Record::Managed(Box::new(c))));
    }
    let models = Api::<JumpStartModel>::namespaced(client.clone(), NAMESPACE);
    Ok(kubernetes::get(&models, endpoint)
        .await?
        .filter(|m| labelled(&m.metadata, endpoint))
        .map(|m| Record::JumpStart(Box::new(m))))
}

/// The pods and Service of an endpoint made of `record`.
async fn live(client: &kube::Client, record: Record) -> Result<Live, ApiError> {
    let name = record.meta().name.clone().unwrap_or_default();
    let (pods, service, scaler) = match &record {
        Record::Server(_) => {
            let services = Api::<KubeService>::namespaced(client.clone(), NAMESPACE);
            futures_util::try_join!(
                find_pods(client, &name),
                kubernetes::get(&services, &name),
                router::scaler(client, &name),
            )?
        }
        Record::Managed(_) | Record::JumpStart(_) => {
            let status = record
                .operated()
                .map_or(&serde_json::Value::Null, |(_, s)| s);
            (managed::pods(client, status).await?, None, None)
        }
    };
    Ok(Live {
        record,
        pods,
        service,
        scaler,
    })
}

/// Every object of kind `K` in the endpoints' namespace with hypd's endpoint label; none
/// where the kind is not served (its operator is not installed).
pub(crate) async fn labelled_if_served<K>(client: &kube::Client) -> Result<Vec<K>, ApiError>
where
    K: kube::Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let api = Api::<K>::namespaced(client.clone(), NAMESPACE);
    let params = ListParams::default().labels(ENDPOINT_LABEL);
    match api.list(&params).await {
        Ok(list) => Ok(list.items),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(Vec::new()),
        Err(e) => Err(kubernetes::upstream(&format!("list {}", K::kind(&())), e)),
    }
}

/// Endpoint `endpoint` of the cluster `client` reaches, if hypd made one of that name.
pub(crate) async fn find(client: &kube::Client, endpoint: &str) -> Result<Option<Live>, ApiError> {
    match record(client, endpoint).await? {
        Some(record) => Ok(Some(live(client, record).await?)),
        None => Ok(None),
    }
}

/// Endpoint `endpoint` of cluster `cluster`, or not found as such.
pub(crate) async fn required(
    client: &kube::Client,
    cluster: &str,
    endpoint: &str,
) -> Result<Live, ApiError> {
    find(client, endpoint)
        .await?
        .ok_or_else(|| ApiError::NotFound {
            resource: format!("endpoint of {cluster}"),
            name: endpoint.to_owned(),
        })
}

/// Every endpoint of the cluster `client` reaches, by name.
async fn list(client: &kube::Client, cluster: &str) -> Result<Vec<EndpointSummary>, ApiError> {
    let labelled = || ListParams::default().labels(ENDPOINT_LABEL);
    let (mut found, mut pods, mut services) = (Vec::new(), Vec::new(), Vec::new());
    let deployments = Api::<Deployment>::namespaced(client.clone(), NAMESPACE);
    let pod_api = Api::<Pod>::namespaced(client.clone(), NAMESPACE);
    let service_api = Api::<KubeService>::namespaced(client.clone(), NAMESPACE);
    // Five reads at once: one round trip's wait instead of five.
    let (_, _, _, configs, models, scalers) = futures_util::try_join!(
        kubernetes::each_listed(&deployments, labelled(), |d| found.push(d)),
        kubernetes::each_listed(&pod_api, labelled(), |p| pods.push(p)),
        kubernetes::each_listed(&service_api, labelled(), |s| services.push(s)),
        labelled_if_served::<InferenceEndpointConfig>(client),
        labelled_if_served::<JumpStartModel>(client),
        labelled_if_served::<ScaledObject>(client),
    )?;
    let label = |m: &ObjectMeta| {
        m.labels
            .as_ref()
            .and_then(|l| l.get(ENDPOINT_LABEL))
            .cloned()
    };
    let mut endpoints: Vec<EndpointSummary> = found
        .into_iter()
        .filter(|d| label(&d.metadata) == d.metadata.name)
        .map(|deployment| {
            let name = deployment.metadata.name.clone();
            let live = Live {
                pods: pods
                    .iter()
                    .filter(|p| label(&p.metadata) == name)
                    .cloned()
                    .collect(),
                service: services.iter().find(|s| s.metadata.name == name).cloned(),
                scaler: scalers.iter().find(|s| s.metadata.name == name).cloned(),
                record: Record::Server(Box::new(deployment)),
            };
            live.summary(cluster)
        })
        .collect();
    let operated = configs
        .into_iter()
        .map(|c| Record::Managed(Box::new(c)))
        .chain(models.into_iter().map(|m| Record::JumpStart(Box::new(m))));
    for record in operated {
        if label(record.meta()) == record.meta().name {
            endpoints.push(live(client, record).await?.summary(cluster));
        }
    }
    endpoints.sort_by(|a, b| a.endpoint.cmp(&b.endpoint));
    Ok(endpoints)
}

/// Clusters list_endpoints reads at once.
const CLUSTERS_AT_ONCE: usize = 8;

impl Handler<ListEndpoints> for Service {
    async fn handle(&self, _: &Actor, r: ListEndpoints) -> Result<EndpointList, ApiError> {
        let clusters: Vec<(String, String)> = match &r.name {
            Some(name) => vec![(
                name.to_string(),
                region_of(&self.store, name.as_str()).await?,
            )],
            // Clusters still being made, or being deleted, have no endpoints to read.
            None => self
                .clusters
                .list(&self.store)
                .await?
                .into_items()
                .map_err(ApiError::internal)?
                .into_iter()
                .filter(|c| matches!(c.status.as_str(), "active" | "imported"))
                .map(|c| (c.name, c.region))
                .collect(),
        };
        let mut endpoints = Vec::new();
        let mut unreadable = Vec::new();
        // Clusters are read a few at a time, each a round trip away (through an SSM
        // tunnel, seconds): the answer waits for the slowest, not for their sum.
        let mut read = futures_util::stream::iter(clusters)
            .map(|(cluster, region)| async move {
                let listed = async {
                    let client = kubernetes::connect(&self.aws, &region, &cluster).await?;
                    list(&client, &cluster).await
                }
                .await;
                (cluster, listed)
            })
            .buffered(CLUSTERS_AT_ONCE);
        while let Some((cluster, listed)) = read.next().await {
            match listed {
                Ok(found) => endpoints.extend(found),
                // One cluster out of reach does not hide the others'; asked by name, it
                // is the answer.
                Err(e) if r.name.is_none() => unreadable.push(UnreadableCluster {
                    name: cluster,
                    error: e.to_string(),
                }),
                Err(e) => return Err(e),
            }
        }
        Ok(EndpointList {
            endpoints,
            unreadable,
        })
    }
}

impl Handler<GetEndpoint> for Service {
    async fn handle(&self, _: &Actor, r: GetEndpoint) -> Result<Endpoint, ApiError> {
        let cluster = r.name.as_str();
        let region = region_of(&self.store, cluster).await?;
        let client = kubernetes::connect(&self.aws, &region, cluster).await?;
        let live = required(&client, cluster, r.endpoint.as_str()).await?;
        let (image, command, gpus) = live.container();
        Ok(Endpoint {
            summary: live.summary(cluster),
            image,
            command,
            port: live.port(),
            gpus_per_replica: gpus,
            instance_group: live.annotation(GROUP_ANNOTATION).map(str::to_owned),
            hf_token_secret: live.annotation(SECRET_ANNOTATION).map(str::to_owned),
            waiting: live.waiting(),
            replica_history: match &live.scaler {
                Some(_) => router::history(&client, r.endpoint.as_str()).await?,
                None => Vec::new(),
            },
            pods: live
                .pods
                .iter()
                .map(|p| {
                    let status = p.status.as_ref();
                    EndpointPod {
                        pod: p.metadata.name.clone().unwrap_or_default(),
                        uid: p.metadata.uid.clone().unwrap_or_default(),
                        phase: status
                            .and_then(|s| s.phase.clone())
                            .unwrap_or_else(|| "Pending".to_owned()),
                        ready: is_ready(p),
                        node: p.spec.as_ref().and_then(|s| s.node_name.clone()),
                        cold_start_seconds: cold_start(p),
                        restarts: status
                            .and_then(|s| s.container_statuses.as_ref())
                            .map_or(0, |cs| {
                                cs.iter().map(|c| c.restart_count.max(0) as u32).sum()
                            }),
                        serves: p
                            .metadata
                            .labels
                            .as_ref()
                            .and_then(|l| l.get(pool::SERVES_LABEL))
                            .cloned(),
                    }
                })
                .collect(),
        })
    }
}
