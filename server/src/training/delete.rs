//! `delete_training_job`: the job's object deleted (a running job stops), then its pods
//! waited for until gone. Only a job hypd made is deleted (its label says so); what the
//! job wrote to the bucket stays. The kind (HyperPodPyTorchJob or RayJob) is the one the
//! cluster has by that name.

use std::time::Duration;

use app::api::ApiError;
use app::api::training::{DeleteTrainingJob, NAMESPACE};
use app::api::values::IdempotencyKey;
use serde::{Deserialize, Serialize};

use super::job::{self, Lookup};
use super::read_job;
use crate::cluster::managed::locate;
use crate::operation::pipeline::{Context, Pipeline, Preflight, Progress, stages};
use crate::resources::is_planning;
use crate::resources::kube::object::made_by_hypd;
use crate::resources::kube::{self as kubernetes};

stages! {
    pub enum Stage {
        Job = "job", "The job's object deleted (a running job stops)", false;
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

/// The names of every pod of the jobs' namespace.
async fn pod_names(client: &kube::Client) -> Result<Vec<String>, ApiError> {
    Ok(job::all_pods(client)
        .await?
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .collect())
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
        let job = read_job(&client, cluster, self.job.as_str())
            .await
            .map_err(|e| match e {
                ApiError::NotFound { .. } => {
                    ApiError::field("job", format!("{cluster} has no training job {}", self.job))
                }
                other => other,
            })?;
        if !made_by_hypd(job.metadata()) {
            return Err(ApiError::field(
                "job",
                format!(
                    "{} was not made by hypd: delete it where it was made (kubectl delete {} {} -n {NAMESPACE})",
                    self.job,
                    job.kind().to_lowercase(),
                    self.job
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
                let found = match job::find(&client, name).await? {
                    Lookup::Found(j) => j,
                    // Gone already (this step ran before), or never there.
                    _ => return Ok(Progress::Done),
                };
                if out.pods.is_empty() {
                    let pods = found.pods_among(&job::all_pods(&client).await?);
                    out.pods = pods.into_iter().filter_map(|p| p.metadata.name).collect();
                }
                // Deleted by name, if hypd made it, whatever its kind.
                found.converge(&client, true).await?;
                Ok(Progress::Done)
            }
            Stage::Pods => {
                // The pods go with their job (Kubernetes' garbage collector deletes them):
                // nothing of hypd's to plan or delete here, only to wait for.
                if is_planning() {
                    return Ok(Progress::Done);
                }
                let now = pod_names(&client).await?;
                let left: Vec<String> = out
                    .pods
                    .iter()
                    .filter(|p| now.contains(p))
                    .cloned()
                    .collect();
                Ok(Progress::unless_pending(POLL, &left, |pods| {
                    format!("waiting for the job's pods to go: {pods}")
                }))
            }
        }
    }
}
