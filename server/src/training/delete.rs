//! `delete_training_job`: the job's object deleted (a running job stops), then its pods
//! waited for until gone. Only a job hypd made is deleted (its label says so); what the
//! job wrote to the bucket stays.

use std::time::Duration;

use app::api::ApiError;
use app::api::training::{DeleteTrainingJob, NAMESPACE};
use app::api::values::IdempotencyKey;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::ListParams;
use serde::{Deserialize, Serialize};

use super::{JOB_LABEL, jobs, operator_missing};
use crate::cluster::managed::locate;
use crate::operation::pipeline::{Context, Pipeline, Preflight, Progress, stages};
use crate::resources::kube::object::Applied;
use crate::resources::kube::training::HyperPodPyTorchJob;
use crate::resources::kube::{self as kubernetes};
use crate::resources::tags::K8S_MANAGED_BY;
use crate::resources::{converge, is_planning};

stages! {
    pub enum Stage {
        Job = "job", "The HyperPodPyTorchJob deleted (a running job stops)", false;
        Pods = "pods", "Every pod of the job gone", false;
    }
}

/// What the stages found, stored with the operation. Field names are stored: never rename.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Outputs {
    /// The pods the job had when it was deleted.
    #[serde(default)]
    pub pods: Vec<String>,
}

const POLL: Duration = Duration::from_secs(2);

/// The job's pods, by the label hypd put on its template.
async fn pods_of(client: &kube::Client, job: &str) -> Result<Vec<String>, ApiError> {
    let pods = Api::<Pod>::namespaced(client.clone(), NAMESPACE);
    let mut names = Vec::new();
    kubernetes::each_listed(
        &pods,
        ListParams::default().labels(&format!("{JOB_LABEL}={job}")),
        |p| names.extend(p.metadata.name),
    )
    .await?;
    names.sort();
    Ok(names)
}

impl Pipeline for DeleteTrainingJob {
    type Stage = Stage;
    type Outputs = Outputs;

    fn target(&self) -> String {
        format!("cluster/{}/training-jobs/{}", self.name, self.job)
    }

    fn idempotency_key(&self) -> Option<&IdempotencyKey> {
        self.idempotency_key.as_ref()
    }

    /// The job exists and hypd made it.
    async fn preflight(self, cx: &Preflight<'_>) -> Result<Self, ApiError> {
        let cluster = self.name.as_str();
        let at = locate(cx.store, cluster, "to delete training jobs").await?;
        let client = kubernetes::connect(cx.aws, &at.region, &at.eks).await?;
        let job = match kubernetes::get(&jobs(&client), self.job.as_str()).await {
            Ok(j) => j,
            Err(e) if kubernetes::kind_not_served(&e) => return Err(operator_missing(cluster)),
            Err(e) => return Err(e),
        };
        let Some(job) = job else {
            return Err(ApiError::field(
                "job",
                format!("{cluster} has no training job {}", self.job),
            ));
        };
        let ours = job
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(K8S_MANAGED_BY.0))
            .is_some_and(|v| v == K8S_MANAGED_BY.1);
        if !ours {
            return Err(ApiError::field(
                "job",
                format!(
                    "{} was not made by hypd: delete it where it was made (kubectl delete hyperpodpytorchjob {} -n {NAMESPACE})",
                    self.job, self.job
                ),
            ));
        }
        Ok(self)
    }

    async fn step(
        &self,
        cx: &Context,
        stage: Stage,
        out: &mut Outputs,
    ) -> Result<Progress, ApiError> {
        let at = locate(&cx.store, self.name.as_str(), "to delete training jobs").await?;
        let client = kubernetes::connect(&cx.aws, &at.region, &at.eks).await?;
        let name = self.job.as_str();
        match stage {
            Stage::Job => {
                if out.pods.is_empty() {
                    out.pods = pods_of(&client, name).await?;
                }
                let mut job = HyperPodPyTorchJob::new(Default::default(), Default::default());
                job.metadata.name = Some(name.to_owned());
                job.metadata.namespace = Some(NAMESPACE.to_owned());
                converge(&Applied::namespaced(&client, job).absent()).await?;
                Ok(Progress::Done)
            }
            Stage::Pods => {
                // The pods go with their job (Kubernetes' garbage collector deletes them):
                // nothing of hypd's to plan or delete here, only to wait for.
                if is_planning() {
                    return Ok(Progress::Done);
                }
                let left = pods_of(&client, name).await?;
                Ok(Progress::unless_pending(POLL, &left, |pods| {
                    format!("waiting for the job's pods to go: {pods}")
                }))
            }
        }
    }
}
