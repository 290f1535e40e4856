//! Jobs: up to `parallelism` pods at a time until `completions` succeed or more than
//! `backoffLimit` fail; the conditions carry the time the last pod finished, not the pass
//! that noticed, so a Job's completion time does not depend on the controllers' rhythm.

use serde_json::{Value, json};

use super::{finish_time, is_ready, owned, pod_from, snapshot, start_time, upsert};
use crate::kube::store::{Key, Store, meta};

pub(super) fn jobs(store: &mut Store, now: &str) {
    for job in snapshot(store, "batch/jobs") {
        let ns = meta(&job, "namespace");
        let uid = meta(&job, "uid");
        let spec = &job["spec"];
        let completions = spec["completions"].as_u64().unwrap_or(1);
        let parallelism = spec["parallelism"].as_u64().unwrap_or(1);
        let backoff = spec["backoffLimit"].as_u64().unwrap_or(6);
        let pods = owned(store, "/pods", &ns, &uid);
        let succeeded = pods
            .iter()
            .filter(|p| p["status"]["phase"] == "Succeeded")
            .count() as u64;
        let failed = pods
            .iter()
            .filter(|p| p["status"]["phase"] == "Failed")
            .count() as u64;
        let active = pods.len() as u64 - succeeded - failed;
        let done = succeeded >= completions;
        let gave_up = failed > backoff;
        if !done && !gave_up && spec["suspend"] != Value::Bool(true) {
            let want = parallelism.min(completions - succeeded);
            for _ in active..want {
                let name = format!("{}-{}", meta(&job, "name"), store.name_suffix());
                let labels = json!({ "job-name": meta(&job, "name"), "batch.kubernetes.io/job-name": meta(&job, "name"),
                                     "controller-uid": uid, "batch.kubernetes.io/controller-uid": uid });
                let (key, pod) = pod_from(store, &job, &spec["template"], &name, &labels, now);
                store.put(key, pod);
            }
        }
        let pods = owned(store, "/pods", &ns, &uid);
        let ready = pods.iter().filter(|p| is_ready(p)).count();
        let mut status = json!({
            "startTime": start_time(&job),
            "active": active,
            "ready": ready,
            "succeeded": succeeded,
            "failed": failed,
            "terminating": 0,
            "uncountedTerminatedPods": {},
        });
        if done {
            let at = finish_time(&pods).unwrap_or_else(|| now.to_owned());
            status["completionTime"] = json!(at);
            status["active"] = json!(0);
            status["conditions"] = json!([
                { "type": "SuccessCriteriaMet", "status": "True", "reason": "CompletionsReached", "message": "Reached expected number of succeeded pods", "lastProbeTime": at, "lastTransitionTime": at },
                { "type": "Complete", "status": "True", "reason": "CompletionsReached", "message": "Reached expected number of succeeded pods", "lastProbeTime": at, "lastTransitionTime": at },
            ]);
        } else if gave_up {
            let at = finish_time(&pods).unwrap_or_else(|| now.to_owned());
            status["conditions"] = json!([
                { "type": "FailureTarget", "status": "True", "reason": "BackoffLimitExceeded", "message": "Job has reached the specified backoff limit", "lastProbeTime": at, "lastTransitionTime": at },
                { "type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "message": "Job has reached the specified backoff limit", "lastProbeTime": at, "lastTransitionTime": at },
            ]);
        }
        let mut job = job.clone();
        job["status"] = status;
        upsert(store, Key::new("batch/jobs", &ns, &meta(&job, "name")), job);
    }
}
