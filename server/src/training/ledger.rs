//! The recovery budget as a ledger: what a job's `runPolicy` allows, what its failures
//! used (from the operator's restart history in the job's status), what is left in the
//! evaluation period and in all, and what the operator does on the next failure. Pure:
//! the same job and instant give the same ledger on every face.

use app::api::training::{LedgerEntry, Recovery, RecoveryLedger};
use app::api::values::{EvalPeriodSeconds, RestartCount, RetryCount};
use serde_json::Value;

use crate::resources::kube::training::{HyperPodPyTorchJob, RayJob};

/// The attempt a job is on: 1, then one more after every restart (pod or whole job).
pub fn attempt(status: &Value) -> u32 {
    status["restartCount"].as_u64().unwrap_or(0) as u32 + 1
}

/// The budget a job's `runPolicy` states, when all of it is within hypd's ranges.
fn budget(run_policy: &Value) -> Option<Recovery> {
    let n = |v: &Value| v.as_u64().and_then(|n| u32::try_from(n).ok());
    let r = &run_policy["restartPolicy"];
    Some(Recovery {
        job_max_retry_count: RetryCount::new(n(&run_policy["jobMaxRetryCount"])?).ok()?,
        restarts_before_full_job_restart: RestartCount::new(n(
            &r["numRestartBeforeFullJobRestart"],
        )?)
        .ok()?,
        eval_period_seconds: EvalPeriodSeconds::new(n(&r["evalPeriodSeconds"])?).ok()?,
        max_full_job_restarts: RestartCount::new(n(&r["maxFullJobRestarts"])?).ok()?,
    })
}

fn seconds(t: &str) -> Option<i64> {
    crate::clock::parse_time(t)?
        .duration_since(std::time::UNIX_EPOCH)
        .ok()
        .map(|d| d.as_secs() as i64)
}

/// The ledger of `job` at `now`.
pub fn ledger(job: &HyperPodPyTorchJob, now: &str) -> RecoveryLedger {
    let status = &job.status;
    let count = |k: &str| status[k].as_u64().unwrap_or(0) as u32;
    let restarts_used = count("restartCount");
    let full_used = count("fullJobRestartCount");
    let budget = budget(&job.spec["runPolicy"]);
    // A period that has run out counts nothing any more: the next failure starts anew.
    let period_over = match (&budget, status["periodStart"].as_str()) {
        (Some(b), Some(start)) => match (seconds(start), seconds(now)) {
            (Some(s), Some(n)) => n - s >= i64::from(b.eval_period_seconds.get()),
            _ => false,
        },
        _ => false,
    };
    let in_period = if period_over {
        0
    } else {
        count("restartsInPeriod")
    };
    let finished = !status["completionTime"].is_null();
    let next_failure = match &budget {
        _ if finished => "nothing: the job has finished".to_owned(),
        None => "as the operator's defaults say: the job states no complete runPolicy".to_owned(),
        Some(b) => {
            let max = b.job_max_retry_count.get();
            let before_full = b.restarts_before_full_job_restart.get();
            let max_full = b.max_full_job_restarts.get();
            if restarts_used >= max {
                format!("the job fails: all {max} restarts of jobMaxRetryCount are used")
            } else if in_period >= before_full {
                if full_used >= max_full {
                    format!(
                        "the job fails: {in_period} restarts in this period and all {max_full} full-job restarts are used"
                    )
                } else {
                    format!(
                        "the whole job restarts (full restart {} of {max_full}): {in_period} pod restarts in this period already",
                        full_used + 1
                    )
                }
            } else {
                format!(
                    "the failed pod restarts (restart {} of {max}); {} more in this period before the whole job restarts",
                    restarts_used + 1,
                    before_full - in_period - 1
                )
            }
        }
    };
    let entries = status["restartHistory"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| {
            let s = |k: &str| e[k].as_str().map(str::to_owned);
            LedgerEntry {
                attempt: e["attempt"].as_u64().unwrap_or(0) as u32,
                at: s("time"),
                action: s("action").unwrap_or_default(),
                pod: s("pod"),
                node: s("node"),
                exit_code: e["exitCode"].as_i64().map(|c| c as i32),
                log_rule: s("logRule"),
                message: s("message").unwrap_or_default(),
            }
        })
        .collect();
    RecoveryLedger {
        restarts_left: budget
            .as_ref()
            .map(|b| b.job_max_retry_count.get().saturating_sub(restarts_used)),
        full_job_restarts_left: budget
            .as_ref()
            .map(|b| b.max_full_job_restarts.get().saturating_sub(full_used)),
        budget,
        restarts_used,
        restarts_in_period: in_period,
        full_job_restarts_used: full_used,
        next_failure,
        entries,
    }
}

/// The ledger of a RayJob: KubeRay retries a failed job on a new Ray cluster up to its
/// `backoffLimit` and counts failures in `status.failed`; it keeps no history of them, so
/// the ledger has counts and no entries.
pub fn ray_ledger(job: &RayJob) -> RecoveryLedger {
    let failed = job.status["failed"].as_u64().unwrap_or(0) as u32;
    let limit = job.spec["backoffLimit"].as_u64().unwrap_or(0) as u32;
    let finished = !job.status["endTime"].is_null();
    let next_failure = if finished {
        "nothing: the job has finished".to_owned()
    } else if failed >= limit {
        format!("the job fails: all {limit} retries of its backoffLimit are used")
    } else {
        format!(
            "KubeRay runs the job again on a new Ray cluster (retry {} of {limit})",
            failed + 1
        )
    };
    RecoveryLedger {
        budget: None,
        restarts_used: failed,
        restarts_left: Some(limit.saturating_sub(failed)),
        restarts_in_period: 0,
        full_job_restarts_used: failed,
        full_job_restarts_left: Some(limit.saturating_sub(failed)),
        next_failure,
        entries: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn job(status: Value) -> HyperPodPyTorchJob {
        let mut j = HyperPodPyTorchJob::new(
            Default::default(),
            json!({"runPolicy": {"jobMaxRetryCount": 5, "restartPolicy": {
                "numRestartBeforeFullJobRestart": 2, "evalPeriodSeconds": 3600, "maxFullJobRestarts": 1}}}),
        );
        j.status = status;
        j
    }

    #[test]
    fn the_ledger_counts_what_failures_used_and_says_what_comes_next() {
        let now = "2026-01-01T00:30:00Z";
        let fresh = ledger(&job(json!({})), now);
        assert_eq!((fresh.restarts_used, fresh.restarts_left), (0, Some(5)));
        assert!(
            fresh
                .next_failure
                .starts_with("the failed pod restarts (restart 1 of 5); 1 more"),
            "{}",
            fresh.next_failure
        );
        let two = ledger(
            &job(
                json!({"restartCount": 2, "restartsInPeriod": 2, "periodStart": "2026-01-01T00:00:00Z",
                "restartHistory": [
                    {"attempt": 1, "time": "2026-01-01T00:10:00Z", "action": "pod_restart", "pod": "j-pod-0",
                     "node": "hyperpod-i-1", "exitCode": 1, "message": "…"},
                    {"attempt": 2, "time": "2026-01-01T00:20:00Z", "action": "pod_restart", "pod": "j-pod-1",
                     "node": "hyperpod-i-2", "exitCode": 137, "message": "…"}]}),
            ),
            now,
        );
        assert_eq!((two.restarts_used, two.restarts_left), (2, Some(3)));
        assert_eq!(two.entries[1].exit_code, Some(137));
        assert!(
            two.next_failure
                .starts_with("the whole job restarts (full restart 1 of 1)"),
            "{}",
            two.next_failure
        );
        // An hour later the period is over: the next failure restarts a pod again.
        let later = ledger(
            &job(
                json!({"restartCount": 2, "restartsInPeriod": 2, "periodStart": "2026-01-01T00:00:00Z"}),
            ),
            "2026-01-01T01:30:00Z",
        );
        assert_eq!(later.restarts_in_period, 0);
        assert!(
            later
                .next_failure
                .starts_with("the failed pod restarts (restart 3 of 5)")
        );
        let spent = ledger(&job(json!({"restartCount": 5})), now);
        assert!(
            spent.next_failure.starts_with("the job fails"),
            "{}",
            spent.next_failure
        );
        assert_eq!(attempt(&json!({"restartCount": 5})), 6);
    }
}
