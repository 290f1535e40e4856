//! `submit_training_job`: the pre-flight's checks (refused with every failed one), then
//! the job's object made once and its pods followed until every one runs. A job's spec
//! is the operator's to act on, never changed under it: a step run again finds the
//! object this operation made (by its annotation) and leaves it; a job of that name made
//! by anyone else is a conflict, never overwritten.

use std::time::Duration;

use app::api::ApiError;
use app::api::training::{NAMESPACE, SubmitTrainingJob};
use app::api::values::IdempotencyKey;
use serde::{Deserialize, Serialize};

use super::OPERATION_ANNOTATION;
use super::check::{check, choose, groups};
use super::job::{self, Lookup};
use super::recipe;
use crate::cluster::managed::locate;
use crate::operation::pipeline::{Context, Pipeline, Preflight, Progress, stages};
use crate::resources::is_planning;
use crate::resources::kube::{self as kubernetes};

stages! {
    pub enum Stage {
        Job = "job", "The job's object applied (a HyperPodPyTorchJob, or a RayJob for verl): pods with the type's GPUs and EFA, on the group's nodes, the shared bucket at /s3", true;
        Started = "started", "Every pod of the job running (or the job already finished)", true;
    }
}

/// What the stages found, stored with the operation. Field names are stored: never rename.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Outputs {
    /// `default/<job>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_group: Option<String>,
    /// Pods running, of the pods the job asks for.
    #[serde(default)]
    pub running: u32,
    #[serde(default)]
    pub pods: u32,
    /// The MLflow tracking server's ARN and the experiment the job reports to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tracking_server: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub experiment: Option<String>,
    /// The job's phase when the operation last looked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
}

const POLL: Duration = Duration::from_secs(2);

impl Pipeline for SubmitTrainingJob {
    type Stage = Stage;
    type Outputs = Outputs;

    /// Its own target: a job queues behind changes of the same job only (its deletion),
    /// never behind the cluster's.
    fn target(&self) -> String {
        format!("cluster/{}/training-jobs/{}", self.name, self.job)
    }

    fn idempotency_key(&self) -> Option<&IdempotencyKey> {
        self.idempotency_key.as_ref()
    }

    async fn preflight(self, cx: &Preflight<'_>) -> Result<Self, ApiError> {
        let checked = check(cx.aws, cx.store, self).await?;
        match checked.refusal() {
            Some(refused) => Err(refused),
            None => Ok(checked.request),
        }
    }

    async fn step(
        &self,
        cx: &Context,
        stage: Stage,
        out: &mut Outputs,
    ) -> Result<Progress, ApiError> {
        let at = locate(&cx.store, self.name.as_str(), "to run training jobs").await?;
        let client = kubernetes::connect(&cx.aws, &at.region, &at.eks).await?;
        let name = self.job.as_str();
        out.job = Some(format!("{NAMESPACE}/{name}"));
        match stage {
            Stage::Job => {
                let live = if is_planning() {
                    None
                } else if let Lookup::Found(j) = job::find(&client, name).await? {
                    Some(j)
                } else {
                    None
                };
                if let Some(live) = live {
                    let made_by = live
                        .metadata()
                        .annotations
                        .as_ref()
                        .and_then(|a| a.get(OPERATION_ANNOTATION));
                    if made_by == Some(&cx.operation_id) {
                        return Ok(Progress::Done);
                    }
                    return Err(ApiError::field(
                        "job",
                        format!(
                            "a training job named {name} was made by {} after this operation was checked: delete it with delete_training_job or choose another name",
                            made_by.map_or("someone else".to_owned(), |o| format!("operation {o}"))
                        ),
                    ));
                }
                let target = if let app::api::training::Recipe::Custom { .. } = self.recipe {
                    // Applied as given: the spec says where its pods run.
                    recipe::Target::default()
                } else {
                    let described = crate::resources::sagemaker::described(
                        &cx.aws.sagemaker(&at.region),
                        &at.hyperpod,
                    )
                    .await?;
                    let groups = groups(&cx.aws, &at.region, &described).await?;
                    let group = choose(&groups, self.instance_group.as_ref(), self.name.as_str())
                        .map_err(|why| ApiError::field("instance_group", why))?;
                    out.instance_group = Some(group.name.clone());
                    group.target()
                };
                let tracking = super::metrics::tracking(&cx.aws, &at.region, self).await?;
                if let Some(t) = &tracking {
                    out.tracking_server = Some(t.arn.clone());
                    out.experiment = Some(t.experiment.clone());
                }
                recipe::object(
                    self,
                    &target,
                    &at.region,
                    &cx.operation_id,
                    tracking.as_ref(),
                )?
                .converge(&client, false)
                .await?;
                Ok(Progress::Done)
            }
            Stage::Started => {
                if is_planning() {
                    return Ok(Progress::Done);
                }
                let Lookup::Found(job) = job::find(&client, name).await? else {
                    return Err(ApiError::Conflict {
                        message: format!("the training job {name} was deleted before its pods ran"),
                        operation_id: None,
                        field: Some("job".into()),
                    });
                };
                let listed = job.pods_among(&job::all_pods(&client).await?);
                let phase = job.phase(&listed);
                out.phase = Some(phase.to_owned());
                out.pods = job.expected_pods();
                out.running = job.running(&listed);
                match phase {
                    "running" | "succeeded" => Ok(Progress::Done),
                    "failed" => Err(ApiError::Upstream {
                        service: "kubernetes".into(),
                        call: format!("{} {NAMESPACE}/{name}", job.kind()),
                        code: Some("JobFailed".into()),
                        message: format!(
                            "the job failed before all its pods ran ({} restarts used): {}",
                            job.ledger(&crate::clock::now()).restarts_used,
                            job.failure()
                        ),
                        request_id: None,
                        transient: false,
                    }),
                    _ => {
                        let why = listed
                            .iter()
                            .find_map(|p| {
                                kubernetes::not_running(p).map(|w| {
                                    format!("{}: {w}", p.metadata.name.as_deref().unwrap_or("pod"))
                                })
                            })
                            .map(|w| format!("; {w}"))
                            .unwrap_or_default();
                        Ok(Progress::wait(
                            POLL,
                            format!(
                                "{} of {} pods running ({phase}){why}",
                                out.running, out.pods
                            ),
                        ))
                    }
                }
            }
        }
    }
}
