//! Model pools: `assign_pool_workers` binds free, ready workers of a pool to one of the
//! names they serve by one pod label (`hypd.dev/serves`), behind the Service
//! `<pool>-<model>` that selects it; `release_pool_workers` takes the label off again.
//! The pool's Deployment selects its pods by the endpoint's label alone, so a label
//! change moves a worker without restarting it or its ReplicaSet noticing. Each pod
//! changed carries the operation that changed it (`hypd.dev/pool-operation`), so a step
//! run again after a crash counts what it already moved instead of moving more.

use std::collections::BTreeMap;
use std::time::Duration;

use app::api::ApiError;
use app::api::inference::{
    AssignPoolWorkers, ENDPOINT_LABEL, NAMESPACE, PoolModel, PoolWorkers, ReleasePoolWorkers,
    ServiceShape,
};
use app::api::plan::{Action, Change, FieldChange};
use app::api::values::{ClusterName, EndpointName, IdempotencyKey, ServedName};
use k8s_openapi::api::core::v1::{Endpoints, Pod, Service as KubeService};
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::workload::SERVED_NAMES_ANNOTATION;
use super::{Live, Record};
use crate::cluster::managed::locate;
use crate::operation::pipeline::{Context, Pipeline, Preflight, Progress, stages};
use crate::resources::converge;
use crate::resources::kube::object::Applied;
use crate::resources::kube::{self as kubernetes};
use crate::resources::tags::K8S_MANAGED_BY;
use crate::resources::{is_planning, planned};

/// The label binding a pool's worker to a model.
pub const SERVES_LABEL: &str = "hypd.dev/serves";
/// The operation that last moved a worker.
pub const MOVED_BY_ANNOTATION: &str = "hypd.dev/pool-operation";

stages! {
    pub enum AssignStage {
        Service = "service", "The model's Service applied: it selects the pool's workers bound to the model", true;
        Workers = "workers", "That many free, ready workers bound to the model (their label changed; none restarts) and its Service routing to them", true;
    }
}

stages! {
    pub enum ReleaseStage {
        Workers = "workers", "That many of the model's workers unbound (their label removed; they stay warm)", true;
    }
}

/// What the stages moved, stored with the operation. Field names are stored: never rename.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Outputs {
    /// The workers moved, by name.
    #[serde(default)]
    pub workers: Vec<String>,
    /// Workers bound to the model once done.
    #[serde(default)]
    pub serving: u32,
}

/// The Service in front of a pool's workers bound to `model`.
pub fn service_name(pool: &str, model: &str) -> String {
    format!("{pool}-{model}")
}

/// The Service of `pool`'s model `model`. Pure.
pub fn model_service(pool: &str, model: &str, port: u16) -> Result<KubeService, ApiError> {
    let object = json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": service_name(pool, model),
            "namespace": NAMESPACE,
            "labels": { ENDPOINT_LABEL: pool, SERVES_LABEL: model, K8S_MANAGED_BY.0: K8S_MANAGED_BY.1 },
        },
        "spec": {
            "type": "ClusterIP",
            "selector": { ENDPOINT_LABEL: pool, SERVES_LABEL: model },
            "ports": [{ "name": "http", "port": port, "targetPort": "http", "protocol": "TCP" }],
        },
    });
    serde_json::from_value(object).map_err(ApiError::internal)
}

fn serves(pod: &Pod) -> Option<&str> {
    pod.metadata
        .labels
        .as_ref()?
        .get(SERVES_LABEL)
        .map(String::as_str)
}

/// The pool's workers that may be bound: bound to no model, and ready. The pre-flight
/// and the step count the same ones.
fn free(live: &Live) -> impl Iterator<Item = &Pod> {
    live.pods
        .iter()
        .filter(|p| serves(p).is_none() && super::is_ready(p))
}

fn moved_by(pod: &Pod) -> Option<&str> {
    pod.metadata
        .annotations
        .as_ref()?
        .get(MOVED_BY_ANNOTATION)
        .map(String::as_str)
}

impl Live {
    /// The names a pool's workers serve (none for any other endpoint).
    pub fn pool_models(&self) -> Vec<String> {
        if !self.is_pool() {
            return Vec::new();
        }
        self.annotation(SERVED_NAMES_ANNOTATION)
            .map(|n| n.split(',').map(str::to_owned).collect())
            .unwrap_or_default()
    }

    pub fn is_pool(&self) -> bool {
        matches!(self.record, Record::Server(_))
            && self.annotation(super::workload::SHAPE_ANNOTATION)
                == Some(ServiceShape::ModelPool.as_str())
    }

    /// A pool's workers by model, and those free (ready or not).
    pub fn pool(&self) -> Option<PoolWorkers> {
        if !self.is_pool() {
            return None;
        }
        let mut by_model: BTreeMap<String, u32> =
            self.pool_models().into_iter().map(|m| (m, 0)).collect();
        let mut unassigned = 0;
        for pod in self
            .pods
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
        {
            match serves(pod) {
                Some(m) => *by_model.entry(m.to_owned()).or_default() += 1,
                None => unassigned += 1,
            }
        }
        Some(PoolWorkers {
            models: by_model
                .into_iter()
                .map(|(model, workers)| PoolModel { model, workers })
                .collect(),
            unassigned,
        })
    }
}

/// The pool `pool` of the cluster `client` reaches, with its workers, or a field error.
async fn pool(client: &kube::Client, cluster: &str, pool: &str) -> Result<Live, ApiError> {
    match super::find(client, pool).await? {
        Some(live) if live.is_pool() => Ok(live),
        Some(_) => Err(ApiError::field(
            "pool",
            format!(
                "{pool} is an endpoint of its own, not a model pool (deploy_model_server with service model_pool makes one)"
            ),
        )),
        None => Err(ApiError::field(
            "pool",
            format!("{cluster} has no model pool {pool}"),
        )),
    }
}

/// The model must be one the pool's workers serve.
fn served(live: &Live, model: &str) -> Result<(), ApiError> {
    let models = live.pool_models();
    if models.iter().any(|m| m == model) {
        return Ok(());
    }
    Err(ApiError::field(
        "model",
        format!(
            "the workers of {} serve {}, not {model}",
            live.name(),
            models.join(", ")
        ),
    ))
}

/// Cluster `cluster`'s pool `pool`, which must serve `model`, with a client of the cluster.
async fn located(
    aws: &crate::aws::Aws,
    store: &crate::store::Store,
    cluster: &ClusterName,
    pool_name: &EndpointName,
    model: &ServedName,
) -> Result<(kube::Client, Live), ApiError> {
    let cluster = cluster.as_str();
    let at = locate(store, cluster, "to bind or release pool workers").await?;
    let client = kubernetes::connect(aws, &at.region, &at.eks).await?;
    let live = pool(&client, cluster, pool_name.as_str()).await?;
    served(&live, model.as_str())?;
    Ok((client, live))
}

/// Sets (or, `None`, removes) the model label of `pod`, recording the operation.
async fn label(
    client: &kube::Client,
    pod: &Pod,
    model: Option<&str>,
    operation: &str,
) -> Result<(), ApiError> {
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    let patch = json!({ "metadata": {
        "labels": { SERVES_LABEL: model },
        "annotations": { MOVED_BY_ANNOTATION: operation },
    } });
    Api::<Pod>::namespaced(client.clone(), NAMESPACE)
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(|e| kubernetes::upstream(&format!("patch Pod/{name}"), e))?;
    Ok(())
}

/// The plan of a worker's label change.
fn relabel(pod: &Pod, model: Option<&str>) -> Change {
    let mut c = Change::new(
        Action::Update,
        "k8s:v1/Pod",
        pod.metadata.name.clone().unwrap_or_default(),
    );
    c.namespace = Some(NAMESPACE.to_owned());
    c.fields = vec![FieldChange {
        field: format!("metadata.labels.{SERVES_LABEL}"),
        old: serves(pod).map(|m| json!(m)),
        new: model.map(|m| json!(m)),
    }];
    c
}

/// How soon to look again at a Service that does not route to a bound worker yet.
const ROUTING_POLL: Duration = Duration::from_secs(1);

/// The pods the Service `service` routes to now: the ready addresses of its Endpoints.
async fn routed(client: &kube::Client, service: &str) -> Result<Vec<String>, ApiError> {
    let endpoints = Api::<Endpoints>::namespaced(client.clone(), NAMESPACE)
        .get_opt(service)
        .await
        .map_err(|e| kubernetes::upstream(&format!("get Endpoints/{service}"), e))?;
    Ok(endpoints
        .into_iter()
        .flat_map(|e| e.subsets.unwrap_or_default())
        .flat_map(|s| s.addresses.unwrap_or_default())
        .filter_map(|a| a.target_ref.and_then(|r| r.name))
        .collect())
}

fn pods_named(pods: &[&Pod]) -> Vec<String> {
    pods.iter()
        .filter_map(|p| p.metadata.name.clone())
        .collect()
}

impl Pipeline for AssignPoolWorkers {
    type Stage = AssignStage;
    type Outputs = Outputs;

    /// The pool's target: moves within one pool queue behind each other.
    fn target(&self) -> String {
        super::target(&self.name, &self.pool)
    }

    fn idempotency_key(&self) -> Option<&IdempotencyKey> {
        self.idempotency_key.as_ref()
    }

    /// The pool exists, serves the model, and has that many free, ready workers.
    async fn preflight(self, cx: &Preflight<'_>) -> Result<Self, ApiError> {
        let (_, live) = located(cx.aws, cx.store, &self.name, &self.pool, &self.model).await?;
        let free = free(&live).count() as u32;
        let wanted = self.count.get();
        if free < wanted {
            let bound: Vec<String> = live
                .pool()
                .unwrap_or_default()
                .models
                .iter()
                .filter(|m| m.workers > 0)
                .map(|m| format!("{} {}", m.model, m.workers))
                .collect();
            return Err(ApiError::field(
                "count",
                format!(
                    "{} has {free} free ready worker{} of {} ({}): ask for at most {free}, release some from another model, or scale the pool",
                    self.pool,
                    if free == 1 { "" } else { "s" },
                    live.pods.len(),
                    if bound.is_empty() {
                        "none bound".to_owned()
                    } else {
                        format!("bound: {}", bound.join(", "))
                    },
                ),
            ));
        }
        Ok(self)
    }

    async fn step(
        &self,
        cx: &Context,
        stage: AssignStage,
        out: &mut Outputs,
    ) -> Result<Progress, ApiError> {
        let (client, live) =
            located(&cx.aws, &cx.store, &self.name, &self.pool, &self.model).await?;
        let model = self.model.as_str();
        match stage {
            AssignStage::Service => {
                let service = model_service(self.pool.as_str(), model, live.port())?;
                converge(&Applied::namespaced(&client, service)).await?;
                Ok(Progress::Done)
            }
            AssignStage::Workers => {
                let done: Vec<&Pod> = live
                    .pods
                    .iter()
                    .filter(|p| serves(p) == Some(model) && moved_by(p) == Some(&cx.operation_id))
                    .collect();
                let need = (self.count.get() as usize).saturating_sub(done.len());
                let chosen: Vec<&Pod> = free(&live).take(need).collect();
                if chosen.len() < need {
                    return Err(ApiError::Conflict {
                        message: format!(
                            "{} has {} free ready workers now, fewer than the {need} still to bind: another change took them",
                            self.pool,
                            chosen.len()
                        ),
                        operation_id: None,
                        field: Some("count".into()),
                    });
                }
                for pod in &chosen {
                    if !planned(|| relabel(pod, Some(model))) {
                        label(&client, pod, Some(model), &cx.operation_id).await?;
                    }
                }
                out.workers = pods_named(&done);
                out.workers.extend(pods_named(&chosen));
                out.serving = live
                    .pods
                    .iter()
                    .filter(|p| serves(p) == Some(model))
                    .count() as u32
                    + chosen.len() as u32;
                if is_planning() {
                    return Ok(Progress::Done);
                }
                // The endpoints controller follows a label change a moment later: done
                // before it has, the model would still answer "no endpoints".
                let service = service_name(self.pool.as_str(), model);
                let routed = routed(&client, &service).await?;
                let waiting: Vec<&String> = out
                    .workers
                    .iter()
                    .filter(|w| !routed.contains(*w))
                    .collect();
                if waiting.is_empty() {
                    Ok(Progress::Done)
                } else {
                    Ok(Progress::wait(
                        ROUTING_POLL,
                        format!(
                            "the Service {service} does not route to {} yet",
                            waiting
                                .iter()
                                .map(|w| w.as_str())
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                    ))
                }
            }
        }
    }
}

impl Pipeline for ReleasePoolWorkers {
    type Stage = ReleaseStage;
    type Outputs = Outputs;

    fn target(&self) -> String {
        super::target(&self.name, &self.pool)
    }

    fn idempotency_key(&self) -> Option<&IdempotencyKey> {
        self.idempotency_key.as_ref()
    }

    /// The pool exists, serves the model, and has that many workers bound to it.
    async fn preflight(self, cx: &Preflight<'_>) -> Result<Self, ApiError> {
        let (_, live) = located(cx.aws, cx.store, &self.name, &self.pool, &self.model).await?;
        let bound = live
            .pods
            .iter()
            .filter(|p| serves(p) == Some(self.model.as_str()))
            .count() as u32;
        if let Some(count) = self.count
            && count.get() > bound
        {
            return Err(ApiError::field(
                "count",
                format!(
                    "{} has {bound} worker{} bound to {}: release at most {bound}",
                    self.pool,
                    if bound == 1 { "" } else { "s" },
                    self.model
                ),
            ));
        }
        Ok(self)
    }

    async fn step(
        &self,
        cx: &Context,
        stage: ReleaseStage,
        out: &mut Outputs,
    ) -> Result<Progress, ApiError> {
        let (client, live) =
            located(&cx.aws, &cx.store, &self.name, &self.pool, &self.model).await?;
        let model = self.model.as_str();
        match stage {
            ReleaseStage::Workers => {
                let done: Vec<&Pod> = live
                    .pods
                    .iter()
                    .filter(|p| serves(p).is_none() && moved_by(p) == Some(&cx.operation_id))
                    .collect();
                let bound: Vec<&Pod> = live
                    .pods
                    .iter()
                    .filter(|p| serves(p) == Some(model))
                    .collect();
                let need = match self.count {
                    Some(n) => (n.get() as usize).saturating_sub(done.len()),
                    None => bound.len(),
                };
                // The last bound first: a pool fills from its first workers.
                let chosen: Vec<&Pod> = bound.iter().rev().take(need).copied().collect();
                for pod in &chosen {
                    if !planned(|| relabel(pod, None)) {
                        label(&client, pod, None, &cx.operation_id).await?;
                    }
                }
                out.workers = pods_named(&done);
                out.workers.extend(pods_named(&chosen));
                out.serving = (bound.len() - chosen.len()) as u32;
                Ok(Progress::Done)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_models_service_selects_the_pools_workers_bound_to_it() {
        let s = serde_json::to_value(model_service("pool", "sql", 8000).unwrap()).unwrap();
        assert_eq!(s["metadata"]["name"], "pool-sql");
        assert_eq!(
            s["spec"]["selector"],
            json!({ENDPOINT_LABEL: "pool", SERVES_LABEL: "sql"})
        );
        assert_eq!(s["spec"]["ports"][0]["port"], 8000);
    }
}
