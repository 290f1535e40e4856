//! HyperPodPyTorchJobs (the HyperPod training operator's CRD): every replica's pods are
//! launched together, the job completes when all succeed and fails when one fails. The
//! job's run-time annotation reaches its pods, so a test can say how long training takes.

use serde_json::json;

use super::pods::RUN_ANNOTATION;
use super::{condition, finish_time, is_ready, owned, pod_from, snapshot, start_time, upsert};
use crate::kube::store::{Key, Store, meta};

pub(super) const PYTORCHJOB_GR: &str = "sagemaker.amazonaws.com/hyperpodpytorchjobs";

/// HyperPodPyTorchJob: `replicas` pods per replica spec, launched together; the job
/// completes when every pod has succeeded and fails when one fails.
pub(super) fn pytorchjobs(store: &mut Store, now: &str) {
    for job in snapshot(store, PYTORCHJOB_GR) {
        let ns = meta(&job, "namespace");
        let name = meta(&job, "name");
        let uid = meta(&job, "uid");
        let mut index = 0;
        let mut expected = 0;
        for spec in job["spec"]["replicaSpecs"].as_array().into_iter().flatten() {
            let group = spec["name"].as_str().unwrap_or("pods");
            for _ in 0..spec["replicas"].as_u64().unwrap_or(1) {
                let pod_name = format!("{name}-pod-{index}");
                index += 1;
                expected += 1;
                let key = Key::new("/pods", &ns, &pod_name);
                if store.get(&key).is_none() && job["status"]["completionTime"].is_null() {
                    let labels = json!({ "sagemaker.amazonaws.com/job-name": name, "sagemaker.amazonaws.com/replica-group": group,
                                         "HPJob": name });
                    let mut template = spec["template"].clone();
                    if template["spec"]["restartPolicy"].is_null() {
                        template["spec"]["restartPolicy"] = json!("Never");
                    }
                    if let Some(run) = job["metadata"]["annotations"][RUN_ANNOTATION].as_str() {
                        template["metadata"]["annotations"][RUN_ANNOTATION] = json!(run);
                    }
                    let (key, pod) = pod_from(store, &job, &template, &pod_name, &labels, now);
                    store.put(key, pod);
                }
            }
        }
        let pods = owned(store, "/pods", &ns, &uid);
        let running = pods.iter().filter(|p| is_ready(p)).count();
        let succeeded = pods
            .iter()
            .filter(|p| p["status"]["phase"] == "Succeeded")
            .count();
        let failed = pods
            .iter()
            .filter(|p| p["status"]["phase"] == "Failed")
            .count();
        let old = &job["status"];
        let mut conditions = vec![condition(
            old,
            "Created",
            true,
            "JobCreated",
            "HyperPodPyTorchJob created",
            now,
        )];
        let mut status = json!({ "startTime": start_time(&job), "restartCount": 0 });
        if failed > 0 {
            conditions.push(condition(
                old,
                "Failed",
                true,
                "PodFailed",
                "a pod of the job failed",
                now,
            ));
            status["completionTime"] = json!(finish_time(&pods).unwrap_or_else(|| now.to_owned()));
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
        }
        status["conditions"] = json!(conditions);
        let mut job = job.clone();
        job["status"] = status;
        upsert(store, Key::new(PYTORCHJOB_GR, &ns, &name), job);
    }
}
