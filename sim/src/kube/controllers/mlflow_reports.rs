//! What a training container reports to MLflow while it runs, since the sim runs no
//! program: a container whose environment names a tracking server of this sim
//! (`MLFLOW_TRACKING_URI`, its ARN, as the `sagemaker-mlflow` plugin takes it) starts a
//! run in `MLFLOW_EXPERIMENT_NAME` with the tags of `MLFLOW_TAGS` — as HF Trainer's
//! MLflow callback does — and logs a training step's metrics every 10 simulated seconds
//! until it ends, when the run is marked FINISHED or FAILED. Only rank 0 reports (a
//! HyperPodPyTorchJob's first pod, a Ray head), as only the main process logs. Where a
//! pod's run stands is kept on the pod (an annotation), so nothing is logged twice.

use serde_json::{Value, json};

use crate::kube::store::{Key, Store, meta};

const TRACKING_ENV: &str = "MLFLOW_TRACKING_URI";
const EXPERIMENT_ENV: &str = "MLFLOW_EXPERIMENT_NAME";
const TAGS_ENV: &str = "MLFLOW_TAGS";
const RUN_NAME_ENV: &str = "MLFLOW_RUN_NAME";
/// Where the pod's run stands: `{"run", "started", "steps", "ended"}`.
const STATE_ANNOTATION: &str = "sim.hypd.dev/mlflow-run";
/// A training step is logged this often (simulated seconds).
pub const STEP_SECS: f64 = 10.0;
/// Most steps one run logs: a long run's history stays small.
const MAX_STEPS: u64 = 500;
/// Most steps one call logs (5 metrics each: MLflow takes 1,000 per batch).
const BATCH_STEPS: u64 = 150;

/// One pod's reporting to do.
pub struct Report {
    pub namespace: String,
    pub pod: String,
    pub uid: String,
    /// The tracking server's ARN.
    pub tracking: String,
    experiment: String,
    tags: Vec<(String, String)>,
    run_name: String,
    /// The container's start: a new one is a new run.
    started: String,
    started_ms: i64,
    /// The run already made for this start, and the steps it has.
    run: Option<String>,
    steps: u64,
    /// Steps due by now.
    due: u64,
    /// How the container ended, if it has: MLflow's status and when (ms).
    ended: Option<(&'static str, i64)>,
}

fn env_of(container: &Value, name: &str) -> Option<String> {
    container["env"].as_array()?.iter().find_map(|e| {
        (e["name"] == name)
            .then(|| e["value"].as_str().map(str::to_owned))
            .flatten()
    })
}

fn ms(t: &str) -> Option<i64> {
    crate::kube::time::parse_rfc3339(t).map(|s| (s * 1000.0) as i64)
}

/// Whether `pod` is its job's rank 0.
fn rank_zero(pod: &Value) -> bool {
    let owned_by = |kind: &str| {
        pod["metadata"]["ownerReferences"]
            .as_array()
            .is_some_and(|o| o.iter().any(|r| r["kind"] == kind))
    };
    if pod["metadata"]["labels"]["ray.io/node-type"].is_string() {
        return pod["metadata"]["labels"]["ray.io/node-type"] == "head";
    }
    !owned_by("HyperPodPyTorchJob") || meta(pod, "name").ends_with("-pod-0")
}

/// The reporting due on `store` at `now` (epoch seconds).
pub fn pending(store: &Store, now: f64) -> Vec<Report> {
    let mut due = Vec::new();
    for pod in store.list("/pods", None) {
        let Some(container) = pod["spec"]["containers"].get(0) else {
            continue;
        };
        let Some(tracking) = env_of(container, TRACKING_ENV) else {
            continue;
        };
        if !rank_zero(pod) {
            continue;
        }
        let status = &pod["status"]["containerStatuses"][0]["state"];
        let (started, ended) = match (&status["running"], &status["terminated"]) {
            (Value::Object(r), _) => (r["startedAt"].as_str(), None),
            (_, Value::Object(t)) => {
                let how = if t["exitCode"] == 0 {
                    "FINISHED"
                } else {
                    "FAILED"
                };
                let at = t["finishedAt"].as_str().and_then(ms);
                (t["startedAt"].as_str(), at.map(|at| (how, at)))
            }
            _ => continue,
        };
        let Some(started) = started.map(str::to_owned) else {
            continue;
        };
        let Some(started_ms) = ms(&started) else {
            continue;
        };
        let state: Value = pod["metadata"]["annotations"][STATE_ANNOTATION]
            .as_str()
            .and_then(|s| serde_json::from_str(s).ok())
            .unwrap_or(Value::Null);
        let same_start = state["started"] == started.as_str();
        if same_start && state["ended"] == true {
            continue;
        }
        let (run, steps) = if same_start {
            (
                state["run"].as_str().map(str::to_owned),
                state["steps"].as_u64().unwrap_or(0),
            )
        } else {
            (None, 0)
        };
        let until = ended.map_or(now * 1000.0, |(_, at)| at as f64);
        let due_steps =
            (((until - started_ms as f64) / 1000.0 / STEP_SECS).max(0.0) as u64).min(MAX_STEPS);
        if run.is_some() && due_steps <= steps && ended.is_none() {
            continue;
        }
        let tags = env_of(container, TAGS_ENV)
            .and_then(|t| serde_json::from_str::<serde_json::Map<String, Value>>(&t).ok())
            .map(|m| {
                m.into_iter()
                    .filter_map(|(k, v)| Some((k, v.as_str()?.to_owned())))
                    .collect()
            })
            .unwrap_or_default();
        due.push(Report {
            namespace: meta(pod, "namespace"),
            pod: meta(pod, "name"),
            uid: meta(pod, "uid"),
            tracking,
            experiment: env_of(container, EXPERIMENT_ENV).unwrap_or_else(|| "Default".into()),
            tags,
            run_name: env_of(container, RUN_NAME_ENV).unwrap_or_else(|| meta(pod, "name")),
            started,
            started_ms,
            run,
            steps,
            due: due_steps,
            ended,
        });
    }
    due
}

/// Step `step`'s metrics, deterministic per pod: a loss falling from about 2.5 towards
/// 0.3 with a little noise, a warmed-up learning rate, a settling gradient norm, a steady
/// throughput and a busy GPU.
fn metrics(seed: u64, step: u64) -> [(&'static str, f64); 5] {
    let s = step as f64;
    // Slow swings for the steady metrics, a little jitter on top (deterministic).
    let phase = (seed % 1000) as f64 / 100.0;
    let slow = (s / 400.0 + phase).sin();
    let jitter = (s * 1.7 + phase).sin();
    [
        ("loss", 0.3 + 2.2 * (-s / 150.0).exp() + 0.03 * jitter),
        ("learning_rate", 2e-5 * (s / 50.0).min(1.0)),
        ("grad_norm", 1.0 + 0.5 * (-s / 100.0).exp() + 0.03 * jitter),
        ("train_samples_per_second", 42.0 + 1.5 * slow + 0.2 * jitter),
        (
            "system/gpu_0_utilization_percentage",
            90.0 + 4.0 * slow + 0.5 * jitter,
        ),
    ]
}

async fn post(
    client: &reqwest::Client,
    url: &str,
    call: &str,
    body: Value,
) -> Result<Value, String> {
    let response = client
        .post(format!("{url}/api/2.0/mlflow/{call}"))
        .json(&body)
        .send()
        .await
        .map_err(|e| format!("{call}: {e}"))?;
    let status = response.status();
    let answer: Value = response.json().await.unwrap_or(Value::Null);
    if status.is_success() {
        Ok(answer)
    } else {
        Err(format!("{call}: HTTP {status}: {answer}"))
    }
}

/// The experiment's id, made if it is not there.
async fn experiment(client: &reqwest::Client, url: &str, name: &str) -> Result<String, String> {
    let got = client
        .get(format!("{url}/api/2.0/mlflow/experiments/get-by-name"))
        .query(&[("experiment_name", name)])
        .send()
        .await
        .map_err(|e| format!("experiments/get-by-name: {e}"))?;
    if got.status().is_success() {
        let v: Value = got.json().await.map_err(|e| e.to_string())?;
        return Ok(v["experiment"]["experiment_id"]
            .as_str()
            .unwrap_or_default()
            .to_owned());
    }
    match post(client, url, "experiments/create", json!({ "name": name })).await {
        Ok(v) => Ok(v["experiment_id"].as_str().unwrap_or_default().to_owned()),
        // Made by another pod meanwhile.
        Err(e) if e.contains("RESOURCE_ALREADY_EXISTS") => {
            Box::pin(experiment(client, url, name)).await
        }
        Err(e) => Err(e),
    }
}

/// Carries out `r` against the MLflow at `url`: the run made if new, the due steps
/// logged, the run ended if the container has. Answers the annotation that records it.
pub async fn report(client: &reqwest::Client, url: &str, r: &Report) -> Result<String, String> {
    let run = match &r.run {
        Some(run) => run.clone(),
        None => {
            let experiment_id = experiment(client, url, &r.experiment).await?;
            let mut tags: Vec<Value> = r
                .tags
                .iter()
                .map(|(k, v)| json!({ "key": k, "value": v }))
                .collect();
            tags.push(json!({ "key": "mlflow.runName", "value": r.run_name }));
            let made = post(
                client,
                url,
                "runs/create",
                json!({ "experiment_id": experiment_id, "start_time": r.started_ms,
                        "run_name": r.run_name, "tags": tags }),
            )
            .await?;
            made["run"]["info"]["run_id"]
                .as_str()
                .ok_or_else(|| format!("runs/create answered no run id: {made}"))?
                .to_owned()
        }
    };
    let seed = crate::world::fnv1a(&r.pod);
    let mut steps = r.steps;
    while steps < r.due {
        let last = r.due.min(steps + BATCH_STEPS);
        let batch: Vec<Value> = (steps + 1..=last)
            .flat_map(|k| {
                let at = r.started_ms + (k as f64 * STEP_SECS * 1000.0) as i64;
                metrics(seed, k * 10).map(|(key, value)| {
                    json!({ "key": key, "value": value, "timestamp": at, "step": k * 10 })
                })
            })
            .collect();
        post(
            client,
            url,
            "runs/log-batch",
            json!({ "run_id": run, "metrics": batch }),
        )
        .await?;
        steps = last;
    }
    if let Some((status, at)) = r.ended {
        post(
            client,
            url,
            "runs/update",
            json!({ "run_id": run, "status": status, "end_time": at }),
        )
        .await?;
    }
    Ok(
        json!({ "run": run, "started": r.started, "steps": steps, "ended": r.ended.is_some() })
            .to_string(),
    )
}

/// Records on the pod what `report` did, if it is still the same pod.
pub fn reported(store: &mut Store, r: &Report, state: &str) {
    let key = Key::new("/pods", &r.namespace, &r.pod);
    let Some(pod) = store.get(&key) else {
        return;
    };
    if meta(pod, "uid") != r.uid {
        return;
    }
    let mut pod = (**pod).clone();
    if !pod["metadata"]["annotations"].is_object() {
        pod["metadata"]["annotations"] = json!({});
    }
    pod["metadata"]["annotations"][STATE_ANNOTATION] = json!(state);
    super::upsert(store, key, pod);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_loss_falls_and_stays_positive() {
        let early = metrics(7, 10)[0].1;
        let late = metrics(7, 2000)[0].1;
        assert!(early > 2.0 && late < 0.4 && late > 0.2, "{early} {late}");
        assert_eq!(metrics(7, 500), metrics(7, 500));
    }
}
