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

use super::check::{check, choose, groups};
use super::{OPERATION_ANNOTATION, jobs, recipe};
use crate::cluster::managed::locate;
use crate::operation::pipeline::{Context, Pipeline, Preflight, Progress, stages};
use crate::resources::kube::object::Applied;
use crate::resources::kube::{self as kubernetes};
use crate::resources::{converge, is_planning};

stages! {
    pub enum Stage {
        Job = "job", "The HyperPodPyTorchJob applied: pods with the type's GPUs and EFA, on the group's nodes, the shared bucket at /s3", true;
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
                } else {
                    kubernetes::get(&jobs(&client), name).await?
                };
                if let Some(live) = live {
                    let made_by = live
                        .metadata
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
                let described = crate::resources::sagemaker::described(
                    &cx.aws.sagemaker(&at.region),
                    &at.hyperpod,
                )
                .await?;
                let groups = groups(&cx.aws, &at.region, &described).await?;
                let group = choose(&groups, self.instance_group.as_ref(), self.name.as_str())
                    .map_err(|why| ApiError::field("instance_group", why))?;
                out.instance_group = Some(group.name.clone());
                let object = recipe::object(self, &group.target(), &at.region, &cx.operation_id)?;
                converge(&Applied::namespaced(&client, object)).await?;
                Ok(Progress::Done)
            }
            Stage::Started => {
                if is_planning() {
                    return Ok(Progress::Done);
                }
                let Some(job) = kubernetes::get(&jobs(&client), name).await? else {
                    return Err(ApiError::Conflict {
                        message: format!("the training job {name} was deleted before its pods ran"),
                        operation_id: None,
                        field: Some("job".into()),
                    });
                };
                let listed = super::pods_of(&client, name).await?;
                let phase = super::phase(&job, &listed);
                out.phase = Some(phase.to_owned());
                out.pods = super::expected_pods(&job);
                out.running = listed.iter().filter(|p| super::running(p)).count() as u32;
                match phase {
                    "running" | "succeeded" => Ok(Progress::Done),
                    "failed" => {
                        let ledger = super::ledger::ledger(&job, &crate::clock::now());
                        let why = job.status["conditions"]
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
                            .unwrap_or_else(|| "the operator marked it Failed".to_owned());
                        Err(ApiError::Upstream {
                            service: "kubernetes".into(),
                            call: format!("HyperPodPyTorchJob {NAMESPACE}/{name}"),
                            code: Some("JobFailed".into()),
                            message: format!(
                                "the job failed before all its pods ran ({} restarts used): {why}",
                                ledger.restarts_used
                            ),
                            request_id: None,
                            transient: false,
                        })
                    }
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
