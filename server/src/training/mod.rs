//! Training jobs on a cluster: `check` (the pre-flight, one verdict per check),
//! `recipe` (the HyperPodPyTorchJob a request becomes), `ledger` (the recovery budget as
//! the operator spends it), the `submit` and `delete` pipelines, and the read commands
//! here. The cluster is the record: jobs are read from its API server, never from hypd's
//! store, so a job made with kubectl is listed too (as `custom`).

pub mod check;
pub mod delete;
pub mod ledger;
pub mod logs;
pub mod recipe;
pub mod submit;

use std::collections::HashMap;

use app::api::ApiError;
use app::api::training::{
    GetTrainingJob, GetTrainingJobLogs, JobCondition, JobEvent, ListTrainingJobs, NAMESPACE,
    TrainingJob, TrainingJobList, TrainingJobSummary, TrainingLogs, TrainingPod,
};
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::Api;
use kube::api::{ListParams, LogParams};
use serde_json::Value;

use crate::auth::Actor;
use crate::resources::kube::training::HyperPodPyTorchJob;
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

pub(crate) fn jobs(client: &kube::Client) -> Api<HyperPodPyTorchJob> {
    Api::namespaced(client.clone(), NAMESPACE)
}

/// Why a cluster without the operator's CRD has no training jobs.
pub(crate) fn operator_missing(cluster: &str) -> ApiError {
    ApiError::field(
        "name",
        format!(
            "{cluster} does not run the HyperPod training operator (HyperPodPyTorchJob is not served): turn it on with update_features (training_operator: true)"
        ),
    )
}

/// Job `job` of cluster `cluster`: not found, or the operator missing, as such.
pub(crate) async fn read_job(
    client: &kube::Client,
    cluster: &str,
    job: &str,
) -> Result<HyperPodPyTorchJob, ApiError> {
    match kubernetes::get(&jobs(client), job).await {
        Ok(Some(j)) => Ok(j),
        Ok(None) => Err(ApiError::NotFound {
            resource: "training job".into(),
            name: job.to_owned(),
        }),
        Err(e) if kubernetes::kind_not_served(&e) => Err(operator_missing(cluster)),
        Err(e) => Err(e),
    }
}

/// The pods of the namespace, by the uid of the job that owns them.
async fn pods_by_owner(client: &kube::Client) -> Result<HashMap<String, Vec<Pod>>, ApiError> {
    let mut by_owner: HashMap<String, Vec<Pod>> = HashMap::new();
    let pods = Api::<Pod>::namespaced(client.clone(), NAMESPACE);
    kubernetes::each_listed(&pods, ListParams::default(), |p| {
        let owner = p
            .metadata
            .owner_references
            .iter()
            .flatten()
            .find(|o| o.kind == HyperPodPyTorchJob::KIND)
            .map(|o| o.uid.clone());
        if let Some(uid) = owner {
            by_owner.entry(uid).or_default().push(p);
        }
    })
    .await?;
    for pods in by_owner.values_mut() {
        pods.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    }
    Ok(by_owner)
}

fn condition_true(status: &Value, kind: &str) -> bool {
    status["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == kind && c["status"] == "True")
}

/// The pods a job asks for: the replicas of every replica spec.
pub(crate) fn expected_pods(job: &HyperPodPyTorchJob) -> u32 {
    job.spec["replicaSpecs"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|s| s["replicas"].as_u64().unwrap_or(1) as u32)
        .sum()
}

pub(crate) fn running(pod: &Pod) -> bool {
    pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
}

/// `succeeded`, `failed`, `running` (every pod runs), `restarting` (after a failure) or
/// `pending`.
pub(crate) fn phase(job: &HyperPodPyTorchJob, pods: &[Pod]) -> &'static str {
    let status = &job.status;
    if condition_true(status, "Failed") {
        "failed"
    } else if condition_true(status, "Completed") {
        "succeeded"
    } else if expected_pods(job) > 0
        && pods.iter().filter(|p| running(p)).count() as u32 == expected_pods(job)
    {
        "running"
    } else if status["restartCount"].as_u64().unwrap_or(0) > 0 {
        "restarting"
    } else {
        "pending"
    }
}

fn summary(job: &HyperPodPyTorchJob, pods: &[Pod]) -> TrainingJobSummary {
    let labels = job.metadata.labels.clone().unwrap_or_default();
    let annotations = job.metadata.annotations.clone().unwrap_or_default();
    let ours = labels.contains_key(JOB_LABEL);
    let group = annotations.get(GROUP_ANNOTATION).cloned().or_else(|| {
        job.spec["replicaSpecs"][0]["template"]["spec"]["nodeSelector"][NODE_GROUP_LABEL]
            .as_str()
            .map(str::to_owned)
    });
    TrainingJobSummary {
        job: job.metadata.name.clone().unwrap_or_default(),
        recipe: labels
            .get(RECIPE_LABEL)
            .filter(|_| ours)
            .cloned()
            .unwrap_or_else(|| "custom".to_owned()),
        phase: phase(job, pods).to_owned(),
        instance_group: group,
        nodes: expected_pods(job),
        attempt: ledger::attempt(&job.status),
        created_at: job
            .metadata
            .creation_timestamp
            .as_ref()
            .map(|t| t.0.to_string()),
        finished_at: job.status["completionTime"].as_str().map(str::to_owned),
    }
}

/// The pods of job `job`, by the label hypd put on its template, by name.
pub(crate) async fn pods_of(client: &kube::Client, job: &str) -> Result<Vec<Pod>, ApiError> {
    let pods = Api::<Pod>::namespaced(client.clone(), NAMESPACE);
    let mut listed = Vec::new();
    kubernetes::each_listed(
        &pods,
        ListParams::default().labels(&format!("{JOB_LABEL}={job}")),
        |p| listed.push(p),
    )
    .await?;
    listed.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    Ok(listed)
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
        let mut listed = Vec::new();
        match kubernetes::each_listed(&jobs(&client), ListParams::default(), |j| listed.push(j))
            .await
        {
            Ok(()) => {}
            // No operator, no jobs.
            Err(e) if kubernetes::kind_not_served(&e) => {}
            Err(e) => return Err(e),
        }
        let pods = pods_by_owner(&client).await?;
        let none = Vec::new();
        let mut jobs: Vec<TrainingJobSummary> = listed
            .iter()
            .map(|j| {
                let uid = j.metadata.uid.clone().unwrap_or_default();
                summary(j, pods.get(&uid).unwrap_or(&none))
            })
            .collect();
        jobs.sort_by(|a, b| b.created_at.cmp(&a.created_at).then(a.job.cmp(&b.job)));
        Ok(TrainingJobList {
            name: r.name.to_string(),
            jobs,
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
        let uid = job.metadata.uid.clone().unwrap_or_default();
        let pods = pods_by_owner(&client)
            .await?
            .remove(&uid)
            .unwrap_or_default();
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
        let conditions = job.status["conditions"]
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
        let container = &job.spec["replicaSpecs"][0]["template"]["spec"]["containers"][0];
        Ok(TrainingJob {
            name: cluster.to_owned(),
            summary: summary(&job, &pods),
            image: container["image"].as_str().map(str::to_owned),
            processes_per_node: match &job.spec["nprocPerNode"] {
                Value::String(s) => s.parse().ok(),
                v => v.as_u64().map(|n| n as u32),
            },
            pods: pods.iter().map(pod_view).collect(),
            conditions,
            recovery: ledger::ledger(&job, &crate::clock::now()),
            events,
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
    let uid = found.metadata.uid.clone().unwrap_or_default();
    let pods = pods_by_owner(&client)
        .await?
        .remove(&uid)
        .unwrap_or_default();
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
