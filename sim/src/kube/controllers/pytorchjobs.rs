//! HyperPodPyTorchJobs (the HyperPod training operator's CRD): every replica's pods are
//! launched together, the job completes when all succeed, and a failed pod is restarted
//! within the job's `runPolicy` as the operator does: in place while the evaluation
//! period's count allows, then the whole job, until `jobMaxRetryCount` or
//! `maxFullJobRestarts` is spent and the job fails with the reason. A running pod one of
//! the job's log rules fires on (its pattern not seen within its start cut-off, or not
//! again within its expected frequency: a hang) counts as a failure too. Each restart is an
//! Event on the job and an entry of `status.restartHistory` (the sim's status shape: the
//! operator publishes no CRD).
//!
//! Training runs until told otherwise, as training does: a pod runs for the job's
//! `sim.hypd.dev/run-seconds` if it has one, else until deleted. `sim.hypd.dev/exit-code`
//! on the job makes its pods fail with that code, all of them, or, with
//! `sim.hypd.dev/failures: N`, only until N restarts were used; set on a running job, it
//! makes running pods fail a second later (a test annotates the job hypd submitted).

use serde_json::{Value, json};

use super::pods::{EXIT_ANNOTATION, RUN_ANNOTATION};
use super::{condition, finish_time, is_ready, owned, pod_from, snapshot, start_time, upsert};
use crate::clock::reached;
use crate::kube::admission::object;
use crate::kube::store::{Key, Store, meta};
use crate::kube::time::parse_rfc3339;
use crate::world::fnv1a;

pub(super) const PYTORCHJOB_GR: &str = "sagemaker.amazonaws.com/hyperpodpytorchjobs";
/// On a job: pods fail (with `sim.hypd.dev/exit-code`, default 1) until this many
/// restarts were used.
pub const FAILURES_ANNOTATION: &str = "sim.hypd.dev/failures";
/// How long a failing pod runs when the job says nothing of its run time.
const FAILING_RUN: &str = "30";
/// Most entries `status.restartHistory` keeps (the oldest go first).
const HISTORY: usize = 100;

/// The job's `runPolicy`, with the operator's defaults for what it leaves out.
struct RunPolicy {
    max_retries: u64,
    restarts_before_full: u64,
    eval_period: f64,
    max_full: u64,
}

impl RunPolicy {
    fn of(job: &Value) -> Self {
        let p = &job["spec"]["runPolicy"];
        let r = &p["restartPolicy"];
        RunPolicy {
            max_retries: p["jobMaxRetryCount"].as_u64().unwrap_or(0),
            restarts_before_full: r["numRestartBeforeFullJobRestart"]
                .as_u64()
                .unwrap_or(u64::MAX),
            eval_period: r["evalPeriodSeconds"].as_f64().unwrap_or(f64::INFINITY),
            max_full: r["maxFullJobRestarts"].as_u64().unwrap_or(0),
        }
    }
}

/// The counters the job's status carries between passes.
struct Budget {
    restarts: u64,
    full: u64,
    in_period: u64,
    period_start: String,
    history: Vec<Value>,
}

impl Budget {
    fn of(status: &Value, now: &str) -> Self {
        let n = |k: &str| status[k].as_u64().unwrap_or(0);
        Budget {
            restarts: n("restartCount"),
            full: n("fullJobRestartCount"),
            in_period: n("restartsInPeriod"),
            period_start: status["periodStart"].as_str().unwrap_or(now).to_owned(),
            history: status["restartHistory"]
                .as_array()
                .cloned()
                .unwrap_or_default(),
        }
    }
}

/// A pod that failed: its exit code, or the log rule that fired on it and why.
type Failure<'a> = (&'a Value, Option<i64>, Option<(String, String)>);

/// What a failed pod leads to.
enum Verdict {
    RestartPod,
    RestartJob,
    Fail(&'static str, String),
}

/// The operator's decision for one more failure, counting it.
fn decide(policy: &RunPolicy, b: &mut Budget, now: &str) -> Verdict {
    let t = |s: &str| parse_rfc3339(s).unwrap_or(0.0);
    if t(now) - t(&b.period_start) >= policy.eval_period {
        b.period_start = now.to_owned();
        b.in_period = 0;
    }
    if b.restarts >= policy.max_retries {
        return Verdict::Fail(
            "RetryLimitExceeded",
            format!(
                "jobMaxRetryCount {} reached: {} restarts",
                policy.max_retries, b.restarts
            ),
        );
    }
    if b.in_period >= policy.restarts_before_full {
        if b.full >= policy.max_full {
            return Verdict::Fail(
                "FullJobRestartLimitExceeded",
                format!(
                    "{} restarts within the evaluation period and maxFullJobRestarts {} reached",
                    b.in_period, policy.max_full
                ),
            );
        }
        b.restarts += 1;
        b.full += 1;
        b.in_period = 0;
        return Verdict::RestartJob;
    }
    b.restarts += 1;
    b.in_period += 1;
    Verdict::RestartPod
}

/// The failed container's exit code.
fn exit_code(pod: &Value) -> Option<i64> {
    pod["status"]["containerStatuses"]
        .as_array()
        .into_iter()
        .flatten()
        .find_map(|c| c["state"]["terminated"]["exitCode"].as_i64())
}

/// A Warning Event on the job.
fn event(store: &mut Store, job: &Value, reason: &str, message: &str, now: &str) {
    let ns = meta(job, "namespace");
    let name = format!(
        "{}.{:016x}",
        meta(job, "name"),
        fnv1a(&format!("{}/{reason}/{message}", meta(job, "uid")))
    );
    let mut e = object(store, "v1", "Event", &ns, &name, now);
    e["involvedObject"] = json!({ "apiVersion": job["apiVersion"], "kind": job["kind"],
        "namespace": ns, "name": meta(job, "name"), "uid": meta(job, "uid") });
    e["reason"] = json!(reason);
    e["message"] = json!(message);
    e["type"] = json!(if reason == "JobCompleted" {
        "Normal"
    } else {
        "Warning"
    });
    e["source"] = json!({ "component": "hyperpod-training-operator" });
    e["reportingComponent"] = json!("hyperpod-training-operator");
    e["firstTimestamp"] = json!(now);
    e["lastTimestamp"] = json!(now);
    e["count"] = json!(1);
    store.put(Key::new("/events", &ns, &name), e);
}

/// The log rule of `rules` (the job's `logMonitoringConfiguration`) that fires on running
/// pod `pod` at sim epoch `now`, with why: its pattern not seen within
/// `expectedStartCutOffInSeconds` of the start, or not again within
/// `expectedRecurringFrequencyInSeconds` (a hang). The sim's lines all share one shape,
/// so whether the last line matches is whether any does. (Metric thresholds are not
/// judged: the sim's numbers only fall.)
fn fired(rules: &Value, pod: &Value, now: f64) -> Option<(String, String)> {
    let started = pod["status"]["containerStatuses"][0]["state"]["running"]["startedAt"]
        .as_str()
        .and_then(parse_rfc3339)?;
    // A container whose run is over exits (its exit code is the failure), it does not
    // hang: its log stopped because it did.
    if crate::kube::logs::run_over(pod, now) {
        return None;
    }
    let last = crate::kube::logs::last_line(pod, now);
    for rule in rules.as_array().into_iter().flatten() {
        let (Some(name), Some(pattern)) = (rule["name"].as_str(), rule["logPattern"].as_str())
        else {
            continue;
        };
        let Ok(re) = regex::Regex::new(pattern) else {
            continue;
        };
        let seen = last
            .as_ref()
            .filter(|(text, _)| re.is_match(text))
            .map(|(_, at)| *at);
        let cutoff = rule["expectedStartCutOffInSeconds"].as_f64();
        let every = rule["expectedRecurringFrequencyInSeconds"].as_f64();
        let why = match (seen, cutoff, every) {
            (None, Some(c), _) if reached(now, started + c) => {
                format!("{pattern} not seen within {c} s of the start")
            }
            (Some(at), _, Some(f)) if reached(now, at + f) => {
                format!("{pattern} not seen for {f} s (a hang)")
            }
            _ => continue,
        };
        return Some((name.to_owned(), why));
    }
    None
}

/// HyperPodPyTorchJob: `replicas` pods per replica spec, launched together; failures
/// restarted within the run policy; complete when every pod has succeeded.
pub(super) fn pytorchjobs(store: &mut Store, now: &str) {
    for job in snapshot(store, PYTORCHJOB_GR) {
        let ns = meta(&job, "namespace");
        let name = meta(&job, "name");
        let uid = meta(&job, "uid");
        let old = &job["status"];
        let done = !old["completionTime"].is_null();
        let policy = RunPolicy::of(&job);
        let mut budget = Budget::of(old, now);
        let mut failed: Option<(&str, String)> = None;

        // Failures first: each is one unit of the budget, oldest first.
        let mut pods = owned(store, "/pods", &ns, &uid);
        pods.sort_by_key(|p| {
            p["status"]["containerStatuses"][0]["state"]["terminated"]["finishedAt"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        });
        // Failed pods, and running ones a log rule fired on.
        let epoch_now = parse_rfc3339(now).unwrap_or(0.0);
        let rules = job["spec"]["runPolicy"]["logMonitoringConfiguration"].clone();
        let failures: Vec<Failure> = pods
            .iter()
            .filter_map(|p| match p["status"]["phase"].as_str() {
                Some("Failed") => Some((p, exit_code(p), None)),
                Some("Running") => fired(&rules, p, epoch_now).map(|r| (p, None, Some(r))),
                _ => None,
            })
            .collect();
        for (pod, code, rule) in failures {
            if done || failed.is_some() {
                break;
            }
            let pod_name = meta(pod, "name");
            let node = pod["spec"]["nodeName"].as_str().map(str::to_owned);
            let attempt = budget.restarts + 1;
            let on = node
                .as_deref()
                .map(|n| format!(" on {n}"))
                .unwrap_or_default();
            let what = match &rule {
                Some((name, why)) => format!("log rule {name} fired on pod {pod_name}{on}: {why}"),
                None => format!(
                    "pod {pod_name}{on} exited with code {}",
                    code.map_or_else(|| "unknown".to_owned(), |c| c.to_string())
                ),
            };
            let (action, reason, message) = match decide(&policy, &mut budget, now) {
                Verdict::RestartPod => {
                    store.remove(&Key::new("/pods", &ns, &pod_name));
                    (
                        "pod_restart",
                        "PodRestart",
                        format!(
                            "{what}: restarting it (restart {} of {})",
                            budget.restarts, policy.max_retries
                        ),
                    )
                }
                Verdict::RestartJob => {
                    for p in &pods {
                        store.remove(&Key::new("/pods", &ns, &meta(p, "name")));
                    }
                    (
                        "full_job_restart",
                        "FullJobRestart",
                        format!(
                            "{what}: restarting the whole job (full restart {} of {})",
                            budget.full, policy.max_full
                        ),
                    )
                }
                Verdict::Fail(reason, why) => {
                    let message = format!("{what}: the job failed: {why}");
                    failed = Some((reason, message.clone()));
                    ("failed", reason, message)
                }
            };
            event(store, &job, reason, &message, now);
            budget
                .history
                .push(json!({ "attempt": attempt, "time": now, "action": action,
                "pod": pod_name, "node": node, "exitCode": code, "logRule": rule.map(|(n, _)| n),
                "reason": reason, "message": message }));
            if matches!(action, "full_job_restart") {
                break;
            }
        }
        let keep = budget.history.len().saturating_sub(HISTORY);
        budget.history.drain(..keep);

        // Pods that are to fail: every one with an exit code, or until the failures asked
        // for are used; running ones are told to fail a second from now.
        let annotations = &job["metadata"]["annotations"];
        let code = annotations[EXIT_ANNOTATION].as_str();
        let wanted = annotations[FAILURES_ANNOTATION]
            .as_str()
            .and_then(|s| s.parse::<u64>().ok());
        let more_fail = |restarts: u64, marked: u64| match wanted {
            Some(n) => restarts + marked < n,
            None => code.is_some(),
        };
        let live = owned(store, "/pods", &ns, &uid);
        let marked = |p: &Value| p["metadata"]["annotations"][EXIT_ANNOTATION].is_string();
        let mut failing = live
            .iter()
            .filter(|p| !super::is_terminal(p) && marked(p))
            .count() as u64;
        for mut pod in live
            .into_iter()
            .filter(|p| p["status"]["phase"] == "Running" && !marked(p))
        {
            if done || failed.is_some() || !more_fail(budget.restarts, failing) {
                break;
            }
            let started = pod["status"]["containerStatuses"][0]["state"]["running"]["startedAt"]
                .as_str()
                .and_then(parse_rfc3339)
                .unwrap_or(epoch_now);
            pod["metadata"]["annotations"][EXIT_ANNOTATION] = json!(code.unwrap_or("1"));
            pod["metadata"]["annotations"][RUN_ANNOTATION] =
                json!(format!("{}", (epoch_now - started).ceil() + 1.0));
            failing += 1;
            upsert(store, Key::new("/pods", &ns, &meta(&pod, "name")), pod);
        }

        // Then the pods every replica spec asks for, made again where one is missing.
        let mut index = 0;
        let mut expected = 0;
        for spec in job["spec"]["replicaSpecs"].as_array().into_iter().flatten() {
            let group = spec["name"].as_str().unwrap_or("pods");
            for _ in 0..spec["replicas"].as_u64().unwrap_or(1) {
                let pod_name = format!("{name}-pod-{index}");
                index += 1;
                expected += 1;
                let key = Key::new("/pods", &ns, &pod_name);
                if store.get(&key).is_some() || done || failed.is_some() {
                    continue;
                }
                let labels = json!({ "sagemaker.amazonaws.com/job-name": name, "sagemaker.amazonaws.com/replica-group": group,
                                     "HPJob": name });
                let mut template = spec["template"].clone();
                if template["spec"]["restartPolicy"].is_null() {
                    template["spec"]["restartPolicy"] = json!("Never");
                }
                let run = annotations[RUN_ANNOTATION].as_str();
                let pod_annotations = &mut template["metadata"]["annotations"];
                if more_fail(budget.restarts, failing) {
                    pod_annotations[EXIT_ANNOTATION] = json!(code.unwrap_or("1"));
                    pod_annotations[RUN_ANNOTATION] = json!(run.unwrap_or(FAILING_RUN));
                    failing += 1;
                } else {
                    // Training runs until it is told how long: never, by default.
                    pod_annotations[RUN_ANNOTATION] = json!(run.unwrap_or("inf"));
                }
                let (key, pod) = pod_from(store, &job, &template, &pod_name, &labels, now);
                store.put(key, pod);
            }
        }

        let pods = owned(store, "/pods", &ns, &uid);
        let running = pods.iter().filter(|p| is_ready(p)).count();
        let succeeded = pods
            .iter()
            .filter(|p| p["status"]["phase"] == "Succeeded")
            .count();
        let mut conditions = vec![condition(
            old,
            "Created",
            true,
            "JobCreated",
            "HyperPodPyTorchJob created",
            now,
        )];
        let mut status = json!({ "startTime": start_time(&job), "restartCount": budget.restarts,
            "fullJobRestartCount": budget.full, "restartsInPeriod": budget.in_period,
            "periodStart": budget.period_start,
            "restartHistory": budget.history });
        let was = |kind: &str| {
            old["conditions"]
                .as_array()
                .and_then(|cs| {
                    cs.iter()
                        .find(|c| c["type"] == kind && c["status"] == "True")
                })
                .cloned()
        };
        if let Some(c) = was("Failed").or_else(|| was("Completed")) {
            conditions.push(c);
            status["completionTime"] = old["completionTime"].clone();
        } else if let Some((reason, message)) = &failed {
            conditions.push(condition(old, "Failed", true, reason, message, now));
            status["completionTime"] = json!(now);
        } else if expected > 0 && succeeded == expected {
            conditions.push(condition(
                old,
                "Completed",
                true,
                "JobCompleted",
                "all pods succeeded",
                now,
            ));
            status["completionTime"] = json!(finish_time(&pods).unwrap_or_else(|| now.to_owned()));
        } else if expected > 0 && running == expected {
            conditions.push(condition(
                old,
                "PodsRunning",
                true,
                "AllPodsRunning",
                "all pods are running",
                now,
            ));
            conditions.push(condition(
                old,
                "Running",
                true,
                "JobRunning",
                "the job is running",
                now,
            ));
        } else if budget.restarts > 0 {
            conditions.push(condition(
                old,
                "Restarting",
                true,
                "JobRestarting",
                "restarting after a failure",
                now,
            ));
        }
        status["conditions"] = json!(conditions);
        let mut job = job.clone();
        job["status"] = status;
        upsert(store, Key::new(PYTORCHJOB_GR, &ns, &name), job);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(max: u64, before_full: u64, full: u64) -> RunPolicy {
        RunPolicy {
            max_retries: max,
            restarts_before_full: before_full,
            eval_period: 3600.0,
            max_full: full,
        }
    }

    #[test]
    fn failures_restart_pods_then_the_job_then_fail_it() {
        let p = policy(10, 2, 1);
        let mut b = Budget::of(&Value::Null, "2026-01-01T00:00:00Z");
        let now = "2026-01-01T00:10:00Z";
        assert!(matches!(decide(&p, &mut b, now), Verdict::RestartPod));
        assert!(matches!(decide(&p, &mut b, now), Verdict::RestartPod));
        assert!(matches!(decide(&p, &mut b, now), Verdict::RestartJob));
        assert_eq!((b.restarts, b.full, b.in_period), (3, 1, 0));
        decide(&p, &mut b, now);
        decide(&p, &mut b, now);
        assert!(matches!(
            decide(&p, &mut b, now),
            Verdict::Fail("FullJobRestartLimitExceeded", _)
        ));
        // A new evaluation period counts from zero again.
        let later = "2026-01-01T02:00:00Z";
        assert!(matches!(decide(&p, &mut b, later), Verdict::RestartPod));
        let mut spent = Budget::of(&json!({"restartCount": 10}), now);
        assert!(matches!(
            decide(&p, &mut spent, now),
            Verdict::Fail("RetryLimitExceeded", _)
        ));
    }
}
