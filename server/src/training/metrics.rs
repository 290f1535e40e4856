//! A training job and MLflow: which tracking server and experiment a request reports to
//! (checked before submit, filled into the stored request), the job's runs as its
//! pods' environment says where they report, and their metric histories. A job's runs
//! are found by the tags hypd gives it (`MLFLOW_TAGS`), never by name, and each is tagged
//! with the job's attempt it belongs to, from the recovery ledger's times.

use app::api::ApiError;
use app::api::mlflow::{TrackingServer, default_server};
use app::api::training::{
    GetTrainingJobMetrics, JobTracking, LedgerEntry, MetricPoint, MetricSeries, MlflowRun,
    SubmitTrainingJob, TrainingMetrics,
};
use app::api::values::{ExperimentName, TrackingServerName};

use super::job::Job;
use super::recipe::Tracking;
use crate::auth::Actor;
use crate::aws::Aws;
use crate::mlflow::{Mlflow, server_name, thin};
use crate::resources::kube::{self as kubernetes};
use crate::resources::sagemaker::tracking_server::describe;
use crate::service::{Handler, Service};
use crate::storage::region_of;

/// The tags a job's runs carry.
pub const CLUSTER_TAG: &str = "hypd.cluster";
pub const JOB_TAG: &str = "hypd.job";
/// The job's attempt a run belongs to, which hypd adds.
pub const ATTEMPT_TAG: &str = "hypd.attempt";

/// Points per series unless asked otherwise.
const DEFAULT_POINTS: usize = 500;

/// Resolves where `r` reports (the named server, else the cluster's own if it has one;
/// the experiment, else the cluster's name) into `r`, and says whether it can: the
/// verdict, its field and message.
pub(crate) async fn check(
    aws: &Aws,
    region: &str,
    r: &mut SubmitTrainingJob,
) -> Result<(bool, &'static str, String), ApiError> {
    const FIELD: &str = "mlflow_tracking_server";
    let sagemaker = aws.sagemaker(region);
    let cluster = r.name.to_string();
    let (name, named) = match &r.mlflow_tracking_server {
        Some(n) => (n.to_string(), true),
        None => (default_server(&cluster), false),
    };
    let found = match describe(&sagemaker, &name).await {
        Ok(found) => found,
        // The cluster's server could not be read (a role without
        // sagemaker:DescribeMlflowTrackingServer): the job runs without MLflow, and says so.
        Err(e) if !named => {
            return Ok((
                true,
                FIELD,
                format!("no MLflow: the cluster's tracking server {name} could not be read ({e})"),
            ));
        }
        Err(e) => return Err(e),
    };
    let experiment = r
        .mlflow_experiment
        .as_ref()
        .map_or_else(|| cluster.clone(), |e| e.to_string());
    let verdict = match found {
        Some(s) if s.up() => {
            r.mlflow_tracking_server =
                Some(TrackingServerName::parse(&name).map_err(ApiError::internal)?);
            r.mlflow_experiment =
                Some(ExperimentName::parse(&experiment).map_err(ApiError::internal)?);
            (
                true,
                FIELD,
                format!("reports to MLflow tracking server {name}, experiment {experiment}"),
            )
        }
        Some(s) if named => (
            false,
            FIELD,
            format!(
                "tracking server {name} is {}: a job reports to a server that is up",
                s.status
            ),
        ),
        Some(s) => (
            true,
            FIELD,
            format!(
                "the cluster's tracking server {name} is {}: this job will not report to MLflow",
                s.status
            ),
        ),
        None if named => (
            false,
            FIELD,
            format!(
                "{region} has no MLflow tracking server {name}: create_mlflow_tracking_server makes one"
            ),
        ),
        None if r.mlflow_experiment.is_some() => (
            false,
            "mlflow_experiment",
            format!(
                "an experiment needs a tracking server: {cluster} has none ({name}); create_mlflow_tracking_server makes it"
            ),
        ),
        None => (
            true,
            FIELD,
            format!(
                "no MLflow: {cluster} has no tracking server ({name}); create_mlflow_tracking_server makes it"
            ),
        ),
    };
    Ok(verdict)
}

/// Where the checked request `r` reports, with the server's ARN.
pub(crate) async fn tracking(
    aws: &Aws,
    region: &str,
    r: &SubmitTrainingJob,
) -> Result<Option<Tracking>, ApiError> {
    let Some(name) = &r.mlflow_tracking_server else {
        return Ok(None);
    };
    let server = describe(&aws.sagemaker(region), name.as_str())
        .await?
        .ok_or_else(|| {
            ApiError::field(
                "mlflow_tracking_server",
                format!("tracking server {name} was deleted after the job was checked"),
            )
        })?;
    let arn = server.arn.ok_or_else(|| {
        ApiError::internal(format!(
            "SageMaker describes tracking server {name} with no ARN"
        ))
    })?;
    Ok(Some(Tracking {
        arn,
        experiment: r
            .mlflow_experiment
            .as_ref()
            .map_or_else(|| r.name.to_string(), |e| e.to_string()),
    }))
}

/// The tracking server's ARN and experiment in the job's pods' environment.
fn reported_to(job: &Job) -> Option<(String, String)> {
    let env = job.templates().first()?["spec"]["containers"][0]["env"].clone();
    let get = |name: &str| {
        env.as_array()?.iter().find(|e| e["name"] == name)?["value"]
            .as_str()
            .map(str::to_owned)
    };
    let uri = get("MLFLOW_TRACKING_URI")?;
    Some((
        uri,
        get("MLFLOW_EXPERIMENT_NAME").unwrap_or_else(|| "Default".into()),
    ))
}

/// The attempt a run that started at `start_ms` belongs to: one more than the failures
/// before it.
fn attempt_at(entries: &[LedgerEntry], start_ms: i64) -> u32 {
    let ms = |t: &str| {
        crate::clock::parse_time(t)?
            .duration_since(std::time::UNIX_EPOCH)
            .ok()
            .map(|d| d.as_millis() as i64)
    };
    1 + entries
        .iter()
        .filter(|e| e.at.as_deref().and_then(ms).is_some_and(|t| t <= start_ms))
        .count() as u32
}

fn iso(ms: Option<i64>) -> Option<String> {
    let ms = u64::try_from(ms?).ok()?;
    Some(crate::clock::format_time(
        std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms),
    ))
}

/// The job's MLflow runs, each tagged with its attempt (once), and the API they came
/// from (none when the server cannot be reached); None for a job that reports nowhere.
async fn runs<'a>(
    aws: &'a Aws,
    region: &str,
    cluster: &str,
    job: &Job,
) -> Result<Option<(JobTracking, Option<Mlflow<'a>>)>, ApiError> {
    let Some((uri, experiment)) = reported_to(job) else {
        return Ok(None);
    };
    let mut tracking = JobTracking {
        tracking_server: uri.clone(),
        experiment: experiment.clone(),
        url: None,
        runs: Vec::new(),
        error: None,
    };
    let Some(name) = server_name(&uri) else {
        tracking.error = Some(format!("{uri} is not a SageMaker tracking server's ARN"));
        return Ok(Some((tracking, None)));
    };
    let server: Option<TrackingServer> = describe(&aws.sagemaker(region), name).await?;
    let api = match server.as_ref().map(|s| Mlflow::of(aws, region, s)) {
        Some(Ok(api)) => api,
        Some(Err(e)) => {
            tracking.error = Some(e.to_string());
            return Ok(Some((tracking, None)));
        }
        None => {
            tracking.error = Some(format!("tracking server {name} no longer exists"));
            return Ok(Some((tracking, None)));
        }
    };
    let Some(experiment_id) = api.experiment_id(&experiment).await? else {
        // Made by the job's first run.
        return Ok(Some((tracking, Some(api))));
    };
    tracking.url = Some(api.experiment_link(&experiment_id));
    let runs = api
        .runs(
            &experiment_id,
            &[(CLUSTER_TAG, cluster), (JOB_TAG, job.name())],
        )
        .await?;
    let entries = job.ledger(&crate::clock::now()).entries;
    let mut seen = Vec::new();
    for (i, run) in runs.iter().enumerate() {
        let info = &run["info"];
        let id = info["run_id"].as_str().unwrap_or_default().to_owned();
        let tags = run["data"]["tags"].as_array().cloned().unwrap_or_default();
        let tagged = tags
            .iter()
            .find(|t| t["key"] == ATTEMPT_TAG)
            .and_then(|t| t["value"].as_str()?.parse::<u32>().ok());
        let attempt = match tagged {
            Some(a) => a,
            None => {
                let start = info["start_time"].as_i64().unwrap_or(0);
                // KubeRay keeps no failure times: a RayJob's runs are its attempts in
                // order.
                let a = match job {
                    Job::PyTorch(_) => attempt_at(&entries, start),
                    Job::Ray(_) => i as u32 + 1,
                };
                api.set_tag(&id, ATTEMPT_TAG, &a.to_string()).await?;
                a
            }
        };
        seen.push(MlflowRun {
            link: Some(api.run_link(&experiment_id, &id)),
            run_id: id,
            name: info["run_name"].as_str().map(str::to_owned),
            attempt: Some(attempt),
            status: info["status"].as_str().unwrap_or("UNKNOWN").to_owned(),
            started_at: iso(info["start_time"].as_i64()),
            ended_at: iso(info["end_time"].as_i64()),
            last: run["data"]["metrics"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|m| MetricPoint {
                    key: m["key"].as_str().unwrap_or_default().to_owned(),
                    step: m["step"].as_i64().unwrap_or(0),
                    value: m["value"].as_f64().unwrap_or(f64::NAN),
                    timestamp: m["timestamp"].as_i64().unwrap_or(0),
                })
                .collect(),
        });
    }
    tracking.runs = seen;
    Ok(Some((tracking, Some(api))))
}

/// The job's MLflow view for get_training_job: where it reports and its runs; an
/// MLflow that cannot be read is said in `error`, never fails the read of the job.
pub(crate) async fn job_tracking(
    aws: &Aws,
    region: &str,
    cluster: &str,
    job: &Job,
) -> Option<JobTracking> {
    match runs(aws, region, cluster, job).await {
        Ok(found) => found.map(|(t, _)| t),
        Err(e) => reported_to(job).map(|(uri, experiment)| JobTracking {
            tracking_server: uri,
            experiment,
            url: None,
            runs: Vec::new(),
            error: Some(e.to_string()),
        }),
    }
}

impl Handler<GetTrainingJobMetrics> for Service {
    async fn handle(
        &self,
        _: &Actor,
        r: GetTrainingJobMetrics,
    ) -> Result<TrainingMetrics, ApiError> {
        let fetched_at = crate::clock::now();
        let cluster = r.name.as_str();
        let region = region_of(&self.store, cluster).await?;
        let client = kubernetes::connect(&self.aws, &region, cluster).await?;
        let job = super::read_job(&client, cluster, r.job.as_str()).await?;
        let max = r.max_points.map_or(DEFAULT_POINTS, |m| m.get() as usize);
        let mut series = Vec::new();
        let found = runs(&self.aws, &region, cluster, &job).await?;
        let tracking = match found {
            None => None,
            Some((tracking, api)) => {
                if let Some(api) = api {
                    for run in &tracking.runs {
                        let keys: Vec<String> = if r.metrics.is_empty() {
                            run.last.iter().map(|m| m.key.clone()).collect()
                        } else {
                            r.metrics.iter().map(|k| k.to_string()).collect()
                        };
                        for key in keys {
                            let points = thin(api.history(&run.run_id, &key).await?, max);
                            if points.is_empty() {
                                continue;
                            }
                            series.push(MetricSeries {
                                run_id: run.run_id.clone(),
                                attempt: run.attempt,
                                key,
                                points: points.iter().map(|p| (p.step, p.value)).collect(),
                            });
                        }
                    }
                }
                Some(tracking)
            }
        };
        Ok(TrainingMetrics {
            name: cluster.to_owned(),
            job: r.job.to_string(),
            tracking,
            series,
            fetched_at,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_belongs_to_the_attempt_after_the_failures_before_it() {
        let entry = |at: &str| LedgerEntry {
            attempt: 1,
            at: Some(at.to_owned()),
            action: "pod_restart".into(),
            pod: None,
            node: None,
            exit_code: Some(1),
            log_rule: None,
            message: String::new(),
        };
        let entries = [entry("2026-01-01T00:10:00Z"), entry("2026-01-01T00:20:00Z")];
        let ms = |t: &str| {
            crate::clock::parse_time(t)
                .unwrap()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_millis() as i64
        };
        assert_eq!(attempt_at(&entries, ms("2026-01-01T00:00:05Z")), 1);
        assert_eq!(attempt_at(&entries, ms("2026-01-01T00:10:30Z")), 2);
        assert_eq!(attempt_at(&entries, ms("2026-01-01T00:25:00Z")), 3);
    }
}
