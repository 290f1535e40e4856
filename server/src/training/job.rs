//! A training job as the cluster holds it: the HyperPod training operator's
//! HyperPodPyTorchJob or KubeRay's RayJob. Every read command sees jobs through this one
//! type, so a phase, a pod count or a ledger means the same whichever operator runs the
//! job; what differs (how pods belong to a job, how it says it finished) is decided here
//! and nowhere else.

use app::api::ApiError;
use app::api::training::{NAMESPACE, PYTORCH_JOB, RAY_JOB, RecoveryLedger};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams};
use serde_json::Value;

use super::{JOB_LABEL, ledger};
use crate::resources::converge;
use crate::resources::kube::object::Applied;
use crate::resources::kube::training::{HyperPodPyTorchJob, RayJob};
use crate::resources::kube::{self as kubernetes};

/// The operators' CRDs: served means the operator is installed (by hypd or not).
pub(crate) const PYTORCH_CRD: &str = "hyperpodpytorchjobs.sagemaker.amazonaws.com";
pub(crate) const RAY_CRD: &str = "rayjobs.ray.io";

/// The label KubeRay puts on a Ray cluster's pods: the cluster's name.
const RAY_CLUSTER_LABEL: &str = "ray.io/cluster";
/// The label a Kubernetes Job puts on its pods: KubeRay's submitter Job has the RayJob's
/// name.
const JOB_NAME_LABEL: &str = "batch.kubernetes.io/job-name";

#[derive(Clone, Debug)]
pub enum Job {
    PyTorch(HyperPodPyTorchJob),
    Ray(RayJob),
}

impl Job {
    pub fn metadata(&self) -> &ObjectMeta {
        match self {
            Job::PyTorch(j) => &j.metadata,
            Job::Ray(j) => &j.metadata,
        }
    }

    pub fn spec(&self) -> &Value {
        match self {
            Job::PyTorch(j) => &j.spec,
            Job::Ray(j) => &j.spec,
        }
    }

    pub fn status(&self) -> &Value {
        match self {
            Job::PyTorch(j) => &j.status,
            Job::Ray(j) => &j.status,
        }
    }

    pub fn kind(&self) -> &'static str {
        match self {
            Job::PyTorch(_) => PYTORCH_JOB,
            Job::Ray(_) => RAY_JOB,
        }
    }

    pub fn name(&self) -> &str {
        self.metadata().name.as_deref().unwrap_or_default()
    }

    /// The pod templates the job's pods are made from, head (or first replica spec) first.
    pub fn templates(&self) -> Vec<&Value> {
        match self {
            Job::PyTorch(j) => j.spec["replicaSpecs"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|s| &s["template"])
                .collect(),
            Job::Ray(j) => {
                let cluster = &j.spec["rayClusterSpec"];
                std::iter::once(&cluster["headGroupSpec"]["template"])
                    .chain(
                        cluster["workerGroupSpecs"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .map(|g| &g["template"]),
                    )
                    .collect()
            }
        }
    }

    /// The pods the job asks for: every replica of every replica spec, or the Ray head
    /// and every worker (KubeRay's submitter pod is not one of them).
    pub fn expected_pods(&self) -> u32 {
        let replicas = |specs: &Value| -> u32 {
            specs
                .as_array()
                .into_iter()
                .flatten()
                .map(|s| s["replicas"].as_u64().unwrap_or(1) as u32)
                .sum()
        };
        match self {
            Job::PyTorch(j) => replicas(&j.spec["replicaSpecs"]),
            Job::Ray(j) => 1 + replicas(&j.spec["rayClusterSpec"]["workerGroupSpecs"]),
        }
    }

    /// Whether `pod` is one of the job's: owned by it, labelled with its name by hypd, of
    /// its Ray cluster, or its submitter.
    pub fn owns(&self, pod: &Pod) -> bool {
        let uid = self.metadata().uid.as_deref();
        let labels = pod.metadata.labels.as_ref();
        let label = |k: &str| labels.and_then(|l| l.get(k)).map(String::as_str);
        let owned = pod
            .metadata
            .owner_references
            .iter()
            .flatten()
            .any(|o| Some(o.uid.as_str()) == uid);
        owned
            || label(JOB_LABEL) == Some(self.name())
            || match self {
                Job::PyTorch(_) => false,
                Job::Ray(j) => {
                    let cluster = j.status["rayClusterName"].as_str();
                    (cluster.is_some() && label(RAY_CLUSTER_LABEL) == cluster)
                        || label(JOB_NAME_LABEL) == Some(self.name())
                }
            }
    }

    /// Of `pods`, the job's.
    pub fn pods_among(&self, pods: &[Pod]) -> Vec<Pod> {
        pods.iter().filter(|p| self.owns(p)).cloned().collect()
    }

    /// Converges the job's object by hypd's rules for objects it applies: made as it is
    /// here, or (`absent`) deleted if hypd made it.
    pub async fn converge(self, client: &kube::Client, absent: bool) -> Result<(), ApiError> {
        match self {
            Job::PyTorch(o) => {
                let applied = Applied::namespaced(client, o);
                converge(&if absent { applied.absent() } else { applied }).await?;
            }
            Job::Ray(o) => {
                let applied = Applied::namespaced(client, o);
                converge(&if absent { applied.absent() } else { applied }).await?;
            }
        }
        Ok(())
    }

    /// A server-side apply of the object with `params` (a dry run, in the pre-flight).
    pub async fn patch(&self, client: &kube::Client, params: &PatchParams) -> kube::Result<()> {
        let name = self.name();
        match self {
            Job::PyTorch(o) => {
                pytorch_jobs(client)
                    .patch(name, params, &Patch::Apply(o))
                    .await?;
            }
            Job::Ray(o) => {
                ray_jobs(client)
                    .patch(name, params, &Patch::Apply(o))
                    .await?;
            }
        }
        Ok(())
    }

    /// Whether `pod` does the job's work (a Ray node, a replica), not KubeRay's submitter.
    fn worker(&self, pod: &Pod) -> bool {
        match self {
            Job::PyTorch(_) => true,
            Job::Ray(_) => pod
                .metadata
                .labels
                .as_ref()
                .is_none_or(|l| !l.contains_key(JOB_NAME_LABEL)),
        }
    }

    /// The job's working pods that run.
    pub fn running(&self, pods: &[Pod]) -> u32 {
        pods.iter().filter(|p| self.worker(p) && running(p)).count() as u32
    }

    /// `succeeded`, `failed`, `running` (every pod runs), `restarting` (after a failure)
    /// or `pending`.
    pub fn phase(&self, pods: &[Pod]) -> &'static str {
        let status = self.status();
        let all_running = self.expected_pods() > 0 && self.running(pods) == self.expected_pods();
        match self {
            Job::PyTorch(_) => {
                if condition_true(status, "Failed") {
                    "failed"
                } else if condition_true(status, "Completed") {
                    "succeeded"
                } else if all_running {
                    "running"
                } else if status["restartCount"].as_u64().unwrap_or(0) > 0 {
                    "restarting"
                } else {
                    "pending"
                }
            }
            Job::Ray(_) => match status["jobDeploymentStatus"].as_str() {
                Some("Complete") if status["jobStatus"] == "SUCCEEDED" => "succeeded",
                Some("Complete" | "Failed" | "ValidationFailed") => "failed",
                Some("Retrying") => "restarting",
                _ if all_running => "running",
                _ => "pending",
            },
        }
    }

    /// When it finished, if it has.
    pub fn finished_at(&self) -> Option<String> {
        let key = match self {
            Job::PyTorch(_) => "completionTime",
            Job::Ray(_) => "endTime",
        };
        self.status()[key].as_str().map(str::to_owned)
    }

    /// The current attempt: 1, then one more after every restart (or Ray retry).
    pub fn attempt(&self) -> u32 {
        match self {
            Job::PyTorch(j) => ledger::attempt(&j.status),
            Job::Ray(j) => j.status["failed"].as_u64().unwrap_or(0) as u32 + 1,
        }
    }

    /// The recovery budget as a ledger at `now`.
    pub fn ledger(&self, now: &str) -> RecoveryLedger {
        match self {
            Job::PyTorch(j) => ledger::ledger(j, now),
            Job::Ray(j) => ledger::ray_ledger(j),
        }
    }

    /// The reason the job failed, as its operator says it.
    pub fn failure(&self) -> String {
        let status = self.status();
        match self {
            Job::PyTorch(_) => status["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|c| c["type"] == "Failed")
                .map(|c| {
                    format!(
                        "{}: {}",
                        c["reason"].as_str().unwrap_or("Failed"),
                        c["message"].as_str().unwrap_or_default()
                    )
                })
                .unwrap_or_else(|| "the operator marked it Failed".to_owned()),
            Job::Ray(_) => format!(
                "{} ({})",
                status["message"]
                    .as_str()
                    .unwrap_or("KubeRay marked the job Failed"),
                status["reason"].as_str().unwrap_or("jobStatus FAILED")
            ),
        }
    }
}

fn condition_true(status: &Value, kind: &str) -> bool {
    status["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == kind && c["status"] == "True")
}

fn running(pod: &Pod) -> bool {
    pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
}

fn pytorch_jobs(client: &kube::Client) -> Api<HyperPodPyTorchJob> {
    Api::namespaced(client.clone(), NAMESPACE)
}

fn ray_jobs(client: &kube::Client) -> Api<RayJob> {
    Api::namespaced(client.clone(), NAMESPACE)
}

/// What looking a job up by name found.
pub(crate) enum Lookup {
    Found(Box<Job>),
    /// At least one of the kinds is served, and has no job of that name.
    Missing,
    /// Neither kind is served: no training operator and no KubeRay.
    NoOperator,
}

/// The job named `name`, of either kind.
pub(crate) async fn find(client: &kube::Client, name: &str) -> Result<Lookup, ApiError> {
    let mut served = false;
    match kubernetes::get(&pytorch_jobs(client), name).await {
        Ok(Some(j)) => return Ok(Lookup::Found(Box::new(Job::PyTorch(j)))),
        Ok(None) => served = true,
        Err(e) if kubernetes::kind_not_served(&e) => {}
        Err(e) => return Err(e),
    }
    match kubernetes::get(&ray_jobs(client), name).await {
        Ok(Some(j)) => return Ok(Lookup::Found(Box::new(Job::Ray(j)))),
        Ok(None) => served = true,
        Err(e) if kubernetes::kind_not_served(&e) => {}
        Err(e) => return Err(e),
    }
    // A `get` of a kind nobody serves answers 404 as a missing object does: whether
    // either kind is served at all is the CRDs' to say.
    if served {
        served = false;
        for crd in [PYTORCH_CRD, RAY_CRD] {
            served |= kubernetes::crd_served(client, crd).await?;
        }
    }
    Ok(if served {
        Lookup::Missing
    } else {
        Lookup::NoOperator
    })
}

/// Every job of either kind; a kind not served has none.
pub(crate) async fn list(client: &kube::Client) -> Result<Vec<Job>, ApiError> {
    let mut jobs = Vec::new();
    let tolerate = |r: Result<(), ApiError>| match r {
        Err(e) if kubernetes::kind_not_served(&e) => Ok(()),
        other => other,
    };
    tolerate(
        kubernetes::each_listed(&pytorch_jobs(client), ListParams::default(), |j| {
            jobs.push(Job::PyTorch(j))
        })
        .await,
    )?;
    tolerate(
        kubernetes::each_listed(&ray_jobs(client), ListParams::default(), |j| {
            jobs.push(Job::Ray(j))
        })
        .await,
    )?;
    Ok(jobs)
}

/// Every pod of the jobs' namespace, by name.
pub(crate) async fn all_pods(client: &kube::Client) -> Result<Vec<Pod>, ApiError> {
    let api = Api::<Pod>::namespaced(client.clone(), NAMESPACE);
    let mut pods = Vec::new();
    kubernetes::each_listed(&api, ListParams::default(), |p| pods.push(p)).await?;
    pods.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    Ok(pods)
}
