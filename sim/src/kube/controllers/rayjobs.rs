//! RayJobs (KubeRay's K8sJobMode): a Ray cluster of head and worker pods and, once the
//! head runs, a submitter Job; the Job decides the outcome, and runs as long as the
//! RayJob's `sim.hypd.dev/run-seconds` says (forever without it, as training does). Ray
//! pods run until the job is done whatever run time their template asks for, since Ray
//! nodes serve the job.

use serde_json::{Value, json};

use super::pods::RUN_ANNOTATION;
use super::{is_ready, owner_ref, pod_from, snapshot, start_time, upsert};
use crate::kube::admission::object;
use crate::kube::store::{Key, Store, meta};

/// RayJob (KubeRay's K8sJobMode): a Ray cluster (head + worker pods) and, once the head
/// runs, a submitter Job whose pod runs the entrypoint; the Job decides the outcome.
pub(super) fn rayjobs(store: &mut Store, now: &str) {
    for rj in snapshot(store, "ray.io/rayjobs") {
        let ns = meta(&rj, "namespace");
        let name = meta(&rj, "name");
        let uid = meta(&rj, "uid");
        let cluster = format!("{name}-raycluster");
        let spec = &rj["spec"];
        let status = &rj["status"];
        let finished = matches!(
            status["jobDeploymentStatus"].as_str(),
            Some("Complete" | "Failed")
        );
        let mut groups = vec![(
            format!("{cluster}-head"),
            spec["rayClusterSpec"]["headGroupSpec"]["template"].clone(),
            json!({ "ray.io/cluster": cluster, "ray.io/node-type": "head", "ray.io/group": "headgroup" }),
        )];
        for g in spec["rayClusterSpec"]["workerGroupSpecs"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let group = g["groupName"].as_str().unwrap_or("workers");
            for i in 0..g["replicas"].as_u64().unwrap_or(1) {
                groups.push((
                    format!("{cluster}-{group}-worker-{i}"),
                    g["template"].clone(),
                    json!({ "ray.io/cluster": cluster, "ray.io/node-type": "worker", "ray.io/group": group }),
                ));
            }
        }
        let shutdown = spec["shutdownAfterJobFinishes"] == Value::Bool(true);
        if !(finished && shutdown) {
            for (pod_name, template, labels) in &groups {
                let key = Key::new("/pods", &ns, pod_name);
                if store.get(&key).is_none() && !finished {
                    let (key, mut pod) = pod_from(store, &rj, template, pod_name, labels, now);
                    // Ray nodes run until the job is done.
                    if let Some(a) = pod["metadata"]["annotations"].as_object_mut() {
                        a.remove(RUN_ANNOTATION);
                    }
                    store.put(key, pod);
                }
            }
        } else {
            for (pod_name, _, _) in &groups {
                store.remove(&Key::new("/pods", &ns, pod_name));
            }
        }
        let head_running = store
            .get(&Key::new("/pods", &ns, &format!("{cluster}-head")))
            .is_some_and(|p| is_ready(p));
        let job_key = Key::new("batch/jobs", &ns, &name);
        if head_running && store.get(&job_key).is_none() && !finished {
            let mut job = object(store, "batch/v1", "Job", &ns, &name, now);
            job["metadata"]["ownerReferences"] = owner_ref(&rj);
            job["metadata"]["labels"] = json!({ "ray.io/originated-from-crd": "RayJob", "ray.io/originated-from-cr-name": name });
            let job_uid = meta(&job, "uid");
            let mut annotations = rj["metadata"]["annotations"].clone();
            if !annotations.is_object() {
                annotations = json!({});
            }
            // The submitter follows the entrypoint, which (training) runs until it is
            // told how long: never, by default.
            if annotations[RUN_ANNOTATION].is_null() {
                annotations[RUN_ANNOTATION] = json!("inf");
            }
            let entrypoint = spec["entrypoint"].as_str().unwrap_or_default();
            job["spec"] = json!({
                "parallelism": 1, "completions": 1, "backoffLimit": spec["submitterConfig"]["backoffLimit"].as_u64().unwrap_or(2),
                "selector": { "matchLabels": { "batch.kubernetes.io/controller-uid": job_uid } },
                "template": {
                    "metadata": { "labels": { "batch.kubernetes.io/controller-uid": job_uid, "controller-uid": job_uid,
                                              "job-name": name, "batch.kubernetes.io/job-name": name }, "annotations": annotations },
                    "spec": { "restartPolicy": "Never", "containers": [{ "name": "ray-job-submitter", "image": "rayproject/ray:2.46.0",
                        "command": ["ray", "job", "submit", "--address", format!("http://{cluster}-head-svc.{ns}.svc.cluster.local:8265"), "--", "/bin/sh", "-c", entrypoint],
                        "resources": { "requests": { "cpu": "500m" } } }] },
                },
            });
            job["status"] = json!({ "startTime": now, "active": 0 });
            store.put(job_key.clone(), job);
        }
        let job = store.get(&job_key).map(|j| (**j).clone());
        let job_cond = |t: &str| {
            job.as_ref().is_some_and(|j| {
                j["status"]["conditions"]
                    .as_array()
                    .is_some_and(|cs| cs.iter().any(|c| c["type"] == t && c["status"] == "True"))
            })
        };
        let (deployment, job_status) = if finished {
            (
                status["jobDeploymentStatus"].clone(),
                status["jobStatus"].clone(),
            )
        } else if job_cond("Complete") {
            (json!("Complete"), json!("SUCCEEDED"))
        } else if job_cond("Failed") {
            (json!("Failed"), json!("FAILED"))
        } else if job.is_some() {
            (json!("Running"), json!("RUNNING"))
        } else {
            (json!("Initializing"), json!("PENDING"))
        };
        let mut new_status = json!({
            "jobDeploymentStatus": deployment,
            "jobStatus": job_status,
            "jobId": format!("{name}-{}", &uid[uid.len().saturating_sub(5)..]),
            "rayClusterName": cluster,
            "dashboardURL": format!("{cluster}-head-svc.{ns}.svc.cluster.local:8265"),
            "startTime": start_time(&rj),
            "observedGeneration": rj["metadata"]["generation"],
            "rayClusterStatus": { "state": if head_running { "ready" } else { "" } },
        });
        if matches!(deployment.as_str(), Some("Complete" | "Failed")) {
            let end = status["endTime"].as_str().map(str::to_owned).or_else(|| {
                job.as_ref().and_then(|j| {
                    j["status"]["completionTime"]
                        .as_str()
                        .map(str::to_owned)
                        .or_else(|| {
                            j["status"]["conditions"][0]["lastTransitionTime"]
                                .as_str()
                                .map(str::to_owned)
                        })
                })
            });
            new_status["endTime"] = json!(end.unwrap_or_else(|| now.to_owned()));
            new_status["rayClusterStatus"] = json!({ "state": "" });
            if job_status == "SUCCEEDED" {
                new_status["message"] = json!("Job finished successfully.");
            }
        }
        let mut rj = rj.clone();
        rj["status"] = new_status;
        upsert(store, Key::new("ray.io/rayjobs", &ns, &name), rj);
    }
}
