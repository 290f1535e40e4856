//! Model endpoints on a cluster: `workload` (the Deployment and Service a
//! `deploy_model_server` request becomes), the `deploy`, `scale` and `delete` pipelines,
//! `invoke` (a chat completion through the API server's service proxy), and the reads
//! here. The cluster is the record: an endpoint is its Deployment as the cluster holds
//! it (labels and annotations say what hypd made it from), never a row of hypd's store,
//! so what `list_endpoints` shows is what runs.

pub mod delete;
pub mod deploy;
pub mod invoke;
pub mod scale;
pub mod workload;

use app::api::ApiError;
use app::api::inference::{
    ENDPOINT_LABEL, Endpoint, EndpointList, EndpointPod, EndpointSummary, GetEndpoint,
    ListEndpoints, NAMESPACE, UnreadableCluster,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Service as KubeService};
use kube::Api;
use kube::api::ListParams;

use self::workload::{
    COLD_START_ANNOTATION, ENGINE_LABEL, GROUP_ANNOTATION, MODEL_ANNOTATION, PORT_ANNOTATION,
    SECRET_ANNOTATION, SHAPE_ANNOTATION,
};
use crate::auth::Actor;
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

/// An endpoint as the cluster holds it: its Deployment, pods and Service.
pub(crate) struct Live {
    pub deployment: Deployment,
    pub pods: Vec<Pod>,
    pub service: Option<KubeService>,
}

fn annotation<'a>(d: &'a Deployment, key: &str) -> Option<&'a str> {
    d.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

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

impl Live {
    pub fn name(&self) -> &str {
        self.deployment.metadata.name.as_deref().unwrap_or_default()
    }

    /// Replicas asked for.
    pub fn replicas(&self) -> u32 {
        self.deployment.spec.replicas.map_or(1, |r| r.max(0) as u32)
    }

    pub fn ready(&self) -> u32 {
        self.pods.iter().filter(|p| is_ready(p)).count() as u32
    }

    /// The slowest ready replica's cold start, or the one recorded when it last scaled
    /// up (its pods may be gone since).
    pub fn cold_start_seconds(&self) -> Option<f64> {
        let live = self.pods.iter().filter_map(cold_start).reduce(f64::max);
        let recorded =
            annotation(&self.deployment, COLD_START_ANNOTATION).and_then(|s| s.parse::<f64>().ok());
        match (live, recorded) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        }
    }

    /// The first thing holding a pod back, as `pod: reason`.
    pub fn waiting(&self) -> Option<String> {
        self.pods.iter().find_map(|p| {
            kubernetes::not_running(p)
                .map(|w| format!("{}: {w}", p.metadata.name.as_deref().unwrap_or("pod")))
        })
    }

    pub fn phase(&self) -> &'static str {
        let (replicas, ready) = (self.replicas(), self.ready());
        let failed = self.pods.iter().any(|p| {
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
        annotation(&self.deployment, PORT_ANNOTATION)
            .and_then(|p| p.parse().ok())
            .unwrap_or(8000)
    }

    pub fn summary(&self, cluster: &str) -> EndpointSummary {
        let d = &self.deployment;
        let labels = d.metadata.labels.clone().unwrap_or_default();
        EndpointSummary {
            name: cluster.to_owned(),
            endpoint: self.name().to_owned(),
            kind: "model_server".to_owned(),
            engine: labels.get(ENGINE_LABEL).cloned().unwrap_or_default(),
            model: annotation(d, MODEL_ANNOTATION)
                .unwrap_or_default()
                .to_owned(),
            service: annotation(d, SHAPE_ANNOTATION)
                .unwrap_or_default()
                .to_owned(),
            phase: self.phase().to_owned(),
            replicas: self.replicas(),
            ready: self.ready(),
            address: self.address(),
            cold_start_seconds: self.cold_start_seconds(),
            created_at: d
                .metadata
                .creation_timestamp
                .as_ref()
                .map(|t| t.0.to_string()),
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
    Ok(kubernetes::get(&deployments, endpoint).await?.filter(|d| {
        d.metadata
            .labels
            .as_ref()
            .is_some_and(|l| l.get(ENDPOINT_LABEL).map(String::as_str) == Some(endpoint))
    }))
}

/// Endpoint `endpoint` of the cluster `client` reaches, if hypd made one of that name.
pub(crate) async fn find(client: &kube::Client, endpoint: &str) -> Result<Option<Live>, ApiError> {
    let Some(deployment) = deployment(client, endpoint).await? else {
        return Ok(None);
    };
    let pods = find_pods(client, endpoint).await?;
    let services = Api::<KubeService>::namespaced(client.clone(), NAMESPACE);
    let service = kubernetes::get(&services, endpoint).await?;
    Ok(Some(Live {
        deployment,
        pods,
        service,
    }))
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
    let deployments = Api::<Deployment>::namespaced(client.clone(), NAMESPACE);
    let mut found = Vec::new();
    kubernetes::each_listed(
        &deployments,
        ListParams::default().labels(ENDPOINT_LABEL),
        |d| found.push(d),
    )
    .await?;
    let mut pods = Vec::new();
    let api = Api::<Pod>::namespaced(client.clone(), NAMESPACE);
    kubernetes::each_listed(&api, ListParams::default().labels(ENDPOINT_LABEL), |p| {
        pods.push(p)
    })
    .await?;
    let mut services = Vec::new();
    let api = Api::<KubeService>::namespaced(client.clone(), NAMESPACE);
    kubernetes::each_listed(&api, ListParams::default().labels(ENDPOINT_LABEL), |s| {
        services.push(s)
    })
    .await?;
    let label = |m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta| {
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
                deployment,
            };
            live.summary(cluster)
        })
        .collect();
    endpoints.sort_by(|a, b| a.endpoint.cmp(&b.endpoint));
    Ok(endpoints)
}

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
        for (cluster, region) in clusters {
            let listed = async {
                let client = kubernetes::connect(&self.aws, &region, &cluster).await?;
                list(&client, &cluster).await
            }
            .await;
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
        let d = &live.deployment;
        let container = d
            .spec
            .template
            .spec
            .as_ref()
            .and_then(|s| s.containers.first());
        let gpus = container
            .and_then(|c| c.resources.as_ref()?.limits.as_ref()?.get(workload::GPU))
            .and_then(|q| q.0.parse().ok())
            .unwrap_or(0);
        Ok(Endpoint {
            summary: live.summary(cluster),
            image: container.and_then(|c| c.image.clone()).unwrap_or_default(),
            command: container
                .and_then(|c| c.command.clone())
                .unwrap_or_default(),
            port: live.port(),
            gpus_per_replica: gpus,
            instance_group: annotation(d, GROUP_ANNOTATION).map(str::to_owned),
            hf_token_secret: annotation(d, SECRET_ANNOTATION).map(str::to_owned),
            waiting: live.waiting(),
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
                    }
                })
                .collect(),
        })
    }
}
