//! Training jobs on a cluster: `check` (the pre-flight, one verdict per check),
//! `recipe` (the HyperPodPyTorchJob or RayJob a request becomes), `job` (either kind as
//! the cluster holds it), `ledger` (the recovery budget as the operator spends it),
//! `metrics` (the job's MLflow runs), `logs`, the `submit` and `delete` pipelines, and
//! the read commands here. The cluster is the record: jobs are read from its API server, never from hypd's
//! store, so a job made with kubectl is listed too (as `custom`).

pub mod check;
pub mod delete;
pub mod diagnose;
pub mod job;
pub mod ledger;
pub mod logs;
pub mod metrics;
pub mod recipe;
pub mod submit;

use app::api::ApiError;
use app::api::training::{
    GetTrainingJob, GetTrainingJobLogs, JobCondition, JobEvent, ListTrainingJobs, NAMESPACE,
    TrainingJob, TrainingJobList, TrainingJobSummary, TrainingLogs, TrainingPod,
};
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::Api;
use kube::api::{ListParams, LogParams};
use serde_json::Value;

use self::job::{Job, Lookup};
use crate::auth::Actor;
use crate::resources::kube::{self as kubernetes};
use crate::service::{Handler, Service};
use crate::storage::region_of;

/// The label hypd puts on a job and its pods' template: the job's name.
pub const JOB_LABEL: &str = "hypd.dev/training-job";
/// The label naming the recipe a job was made from.
pub const RECIPE_LABEL: &str = "hypd.dev/recipe";
/// The annotation naming the operation that made a job.
pub const OPERATION_ANNOTATION: &str = "hypd.dev/operation";
/// The annotation naming the instance group a job runs on.
pub const GROUP_ANNOTATION: &str = "hypd.dev/instance-group";
/// The label HyperPod puts on its nodes: their instance group.
pub const NODE_GROUP_LABEL: &str = "sagemaker.amazonaws.com/instance-group-name";

/// Why a cluster without either operator's CRD has no training jobs.
pub(crate) fn operator_missing(cluster: &str) -> ApiError {
    ApiError::field(
        "name",
        format!(
            "{cluster} runs neither the HyperPod training operator nor KubeRay (HyperPodPyTorchJob and RayJob are not served): turn one on with update_features (training_operator: true, or kuberay_operator: true for verl)"
        ),
    )
}

/// Job `job` of cluster `cluster`: not found, or no operator, as such.
pub(crate) async fn read_job(
    client: &kube::Client,
    cluster: &str,
    job: &str,
) -> Result<Job, ApiError> {
    match job::find(client, job).await? {
        Lookup::Found(j) => Ok(*j),
        Lookup::Missing => Err(ApiError::NotFound {
            resource: "training job".into(),
            name: job.to_owned(),
        }),
        Lookup::NoOperator => Err(operator_missing(cluster)),
    }
}

fn summary(job: &Job, pods: &[Pod]) -> TrainingJobSummary {
    let labels = job.metadata().labels.clone().unwrap_or_default();
    let annotations = job.metadata().annotations.clone().unwrap_or_default();
    let ours = labels.contains_key(JOB_LABEL);
    let group = annotations.get(GROUP_ANNOTATION).cloned().or_else(|| {
        job.templates()
            .first()
            .and_then(|t| t["spec"]["nodeSelector"][NODE_GROUP_LABEL].as_str())
            .map(str::to_owned)
    });
    TrainingJobSummary {
        job: job.name().to_owned(),
        recipe: labels
            .get(RECIPE_LABEL)
            .filter(|_| ours)
            .cloned()
            .unwrap_or_else(|| "custom".to_owned()),
        kind: job.kind().to_owned(),
        phase: job.phase(pods).to_owned(),
        instance_group: group,
        nodes: job.expected_pods(),
        attempt: job.attempt(),
        created_at: job
            .metadata()
            .creation_timestamp
            .as_ref()
            .map(|t| t.0.to_string()),
        finished_at: job.finished_at(),
    }
}

fn pod_view(pod: &Pod) -> TrainingPod {
    let status = pod.status.as_ref();
    TrainingPod {
        pod: pod.metadata.name.clone().unwrap_or_default(),
        phase: status
            .and_then(|s| s.phase.clone())
            .unwrap_or_else(|| "Pending".to_owned()),
        node: pod.spec.as_ref().and_then(|s| s.node_name.clone()),
        waiting: kubernetes::not_running(pod),
        exit_code: status
            .and_then(|s| s.container_statuses.as_ref())
            .and_then(|cs| {
                cs.iter()
                    .find_map(|c| c.state.as_ref()?.terminated.as_ref().map(|t| t.exit_code))
            }),
    }
}

impl Handler<ListTrainingJobs> for Service {
    async fn handle(&self, _: &Actor, r: ListTrainingJobs) -> Result<TrainingJobList, ApiError> {
        let fetched_at = crate::clock::now();
        let region = region_of(&self.store, r.name.as_str()).await?;
        let client = kubernetes::connect(&self.aws, &region, r.name.as_str()).await?;
        let listed = job::list(&client).await?;
        let pods = job::all_pods(&client).await?;
        let mut jobs: Vec<TrainingJobSummary> = listed
            .iter()
            .map(|j| summary(j, &j.pods_among(&pods)))
            .collect();
        jobs.sort_by(|a, b| b.created_at.cmp(&a.created_at).then(a.job.cmp(&b.job)));
        // The jobs are listed even when the tracking server cannot be read.
        let mlflow = crate::resources::sagemaker::tracking_server::describe(
            &self.aws.sagemaker(&region),
            &app::api::mlflow::default_server(r.name.as_str()),
        )
        .await
        .unwrap_or_else(|e| {
            tracing::warn!(cluster = %r.name, "reading the MLflow tracking server: {e}");
            None
        });
        Ok(TrainingJobList {
            name: r.name.to_string(),
            jobs,
            mlflow,
            fetched_at,
        })
    }
}

impl Handler<GetTrainingJob> for Service {
    async fn handle(&self, _: &Actor, r: GetTrainingJob) -> Result<TrainingJob, ApiError> {
        let fetched_at = crate::clock::now();
        let cluster = r.name.as_str();
        let region = region_of(&self.store, cluster).await?;
        let client = kubernetes::connect(&self.aws, &region, cluster).await?;
        let job = read_job(&client, cluster, r.job.as_str()).await?;
        let uid = job.metadata().uid.clone().unwrap_or_default();
        let pods = job.pods_among(&job::all_pods(&client).await?);
        let mut events = Vec::new();
        let api = Api::<Event>::namespaced(client.clone(), NAMESPACE);
        kubernetes::each_listed(&api, ListParams::default(), |e| {
            if e.involved_object.uid.as_deref() == Some(uid.as_str()) {
                events.push(JobEvent {
                    at: e
                        .last_timestamp
                        .as_ref()
                        .or(e.first_timestamp.as_ref())
                        .map(|t| t.0.to_string()),
                    kind: e.type_.clone().unwrap_or_default(),
                    reason: e.reason.clone().unwrap_or_default(),
                    message: e.message.clone().unwrap_or_default(),
                });
            }
        })
        .await?;
        events.sort_by(|a, b| a.at.cmp(&b.at));
        let conditions = job.status()["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| JobCondition {
                kind: c["type"].as_str().unwrap_or_default().to_owned(),
                status: c["status"].as_str().unwrap_or_default().to_owned(),
                reason: c["reason"].as_str().map(str::to_owned),
                message: c["message"].as_str().map(str::to_owned),
                at: c["lastTransitionTime"].as_str().map(str::to_owned),
            })
            .collect();
        let image = job
            .templates()
            .first()
            .and_then(|t| t["spec"]["containers"][0]["image"].as_str())
            .map(str::to_owned);
        Ok(TrainingJob {
            name: cluster.to_owned(),
            summary: summary(&job, &pods),
            image,
            processes_per_node: match &job.spec()["nprocPerNode"] {
                Value::String(s) => s.parse().ok(),
                v => v.as_u64().map(|n| n as u32),
            },
            pods: pods.iter().map(pod_view).collect(),
            conditions,
            recovery: job.ledger(&crate::clock::now()),
            events,
            mlflow: metrics::job_tracking(&self.aws, &region, cluster, &job).await,
            fetched_at,
        })
    }
}

/// One container of one pod of a job, as logs are read from it.
pub(crate) struct JobPod {
    pub client: kube::Client,
    pub pod: String,
    pub container: String,
}

/// The pod (`pod`, or the job's first) and container (`container`, or the pod's first)
/// of job `job` of cluster `cluster`; a pod that is not the job's, or a container the pod
/// does not have, is refused by field.
pub(crate) async fn job_pod(
    service: &Service,
    cluster: &str,
    job: &str,
    pod: Option<&str>,
    container: Option<&str>,
) -> Result<JobPod, ApiError> {
    let region = region_of(&service.store, cluster).await?;
    let client = kubernetes::connect(&service.aws, &region, cluster).await?;
    let found = read_job(&client, cluster, job).await?;
    let pods = found.pods_among(&job::all_pods(&client).await?);
    let names: Vec<String> = pods
        .iter()
        .filter_map(|p| p.metadata.name.clone())
        .collect();
    let chosen = match pod {
        Some(p) => pods
            .iter()
            .find(|x| x.metadata.name.as_deref() == Some(p))
            .ok_or_else(|| {
                ApiError::field(
                    "pod",
                    format!("{p} is not a pod of {job} (its pods: {})", names.join(", ")),
                )
            })?,
        None => pods
            .first()
            .ok_or_else(|| ApiError::field("pod", format!("{job} has no pod yet")))?,
    };
    let containers: Vec<String> = chosen
        .spec
        .iter()
        .flat_map(|s| s.containers.iter().map(|c| c.name.clone()))
        .collect();
    let container = match container {
        Some(c) if containers.iter().any(|x| x == c) => c.to_owned(),
        Some(c) => {
            return Err(ApiError::field(
                "container",
                format!(
                    "the pod has no container {c} (it has {})",
                    containers.join(", ")
                ),
            ));
        }
        None => containers
            .first()
            .cloned()
            .ok_or_else(|| ApiError::field("container", "the pod has no container"))?,
    };
    Ok(JobPod {
        client,
        pod: chosen.metadata.name.clone().unwrap_or_default(),
        container,
    })
}

impl Handler<GetTrainingJobLogs> for Service {
    async fn handle(&self, _: &Actor, r: GetTrainingJobLogs) -> Result<TrainingLogs, ApiError> {
        let fetched_at = crate::clock::now();
        let at = job_pod(
            self,
            r.name.as_str(),
            r.job.as_str(),
            r.pod.as_ref().map(|p| p.as_str()),
            r.container.as_ref().map(|c| c.as_str()),
        )
        .await?;
        let params = LogParams {
            container: Some(at.container.clone()),
            tail_lines: Some(i64::from(r.tail_lines.map_or(100, |n| n.get()))),
            since_seconds: r.since_seconds.map(|s| i64::from(s.get())),
            ..LogParams::default()
        };
        let pods = Api::<Pod>::namespaced(at.client.clone(), NAMESPACE);
        let text = match pods.logs(&at.pod, &params).await {
            Ok(t) => t,
            // Not started yet: Kubernetes says why (waiting to start: ContainerCreating).
            Err(kube::Error::Api(s)) if s.code == 400 => {
                return Err(ApiError::field("pod", s.message));
            }
            Err(e) => return Err(kubernetes::upstream(&format!("log Pod/{}", at.pod), e)),
        };
        Ok(TrainingLogs {
            name: r.name.to_string(),
            job: r.job.to_string(),
            pod: at.pod,
            container: at.container,
            lines: text.lines().map(str::to_owned).collect(),
            fetched_at,
        })
    }
}
