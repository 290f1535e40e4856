//! Pods' lifecycle: each pending pod goes to the [`Scheduler`], and a bound pod's status is
//! then a function of the time it was scheduled: ContainerCreating for [`START_SECS`],
//! Running (Ready at once, or once it has loaded when a readiness probe waits for that:
//! see [`load_seconds`]), and, if it has a run time, Succeeded or Failed by its exit
//! code; one whose collective hangs is taken down by NCCL's watchdog (see
//! [`logs::NCCL_TIMEOUT_ANNOTATION`]); a Prometheus server that cannot load its
//! configuration crash-loops, never Ready. A pod with FSx for Lustre volumes waits for its
//! claims to bind and its volumes to mount (see [`mounts`](super::mounts)); other pods'
//! volumes are not looked at. Pods are bound and advanced in one pass so a pass writes
//! each pod at most once.

use serde_json::{Value, json};

use super::mounts::{self, Mounts};
use super::{is_terminal, snapshot, upsert};
use crate::clock::reached;
use crate::fsx::Mountable;
use crate::kube::scheduler::Scheduler;
use crate::kube::store::{Key, Store, meta};
use crate::kube::time::{parse_rfc3339, rfc3339};
use crate::kube::{logs, model_server, prometheus};
use crate::world::fnv1a;

/// Pod or template annotation: sim seconds a container runs before it exits (jobs default
/// to [`DEFAULT_RUN_SECS`]; long-running pods without it run until deleted).
pub const RUN_ANNOTATION: &str = "sim.hypd.dev/run-seconds";
/// Pod or template annotation: the exit code of a container that finishes (default 0).
pub const EXIT_ANNOTATION: &str = "sim.hypd.dev/exit-code";
pub const DEFAULT_RUN_SECS: f64 = 60.0;
/// The exit code of a process that aborts (128 + SIGABRT), as `terminate` does when
/// NCCL's watchdog throws.
const ABORTED_EXIT: i64 = 134;
/// Sim seconds from scheduling to a running container (image pull and start).
pub const START_SECS: f64 = 5.0;
/// Pod or template annotation: sim seconds from a container's start until its readiness
/// probe passes (its load), for pods whose containers have one.
pub const READY_ANNOTATION: &str = "sim.hypd.dev/ready-seconds";
/// The load of a model server (vLLM, SGLang) with a readiness probe and no
/// [`READY_ANNOTATION`]: reading weights and warming up.
pub const MODEL_LOAD_SECS: f64 = 20.0;

/// Binds pending pods (through the scheduler) and moves bound pods through their phases.
pub(super) fn pods(store: &mut Store, file_systems: &[Mountable], epoch_now: f64, now: &str) {
    let mut scheduler = Scheduler::new(store);
    for mut pod in snapshot(store, "/pods") {
        let ns = meta(&pod, "namespace");
        let name = meta(&pod, "name");
        let key = Key::new("/pods", &ns, &name);
        if pod["metadata"]["deletionTimestamp"].is_string() || is_terminal(&pod) {
            continue;
        }
        if pod["spec"]["nodeName"].is_null() {
            if mounts::unbound_claims(store, &pod) {
                mounts::unschedulable(&mut pod, scheduler.node_count(), now);
                upsert(store, key, pod);
                continue;
            }
            if !scheduler.bind(&mut pod, now) {
                upsert(store, key, pod);
                continue;
            }
        }
        // A volume that cannot be mounted holds the containers back: they start once
        // every volume could be mounted, which is never while one cannot.
        let mounted = match mounts::mounts(store, &pod, file_systems) {
            Mounts::None => f64::NEG_INFINITY,
            Mounts::Ready(since) => since,
            Mounts::Failed(message) => {
                if pod["status"]["phase"] != "Running" {
                    mounts::failed_mount(store, &pod, &message, now);
                }
                f64::INFINITY
            }
        };
        if mounted == f64::INFINITY && pod["status"]["phase"] == "Running" {
            // kubelet does not stop a running container whose volume's server goes away.
            upsert(store, key, pod);
            continue;
        }
        // A Prometheus server that cannot load its configuration exits 1 at once, and
        // kubelet keeps restarting it.
        let crash = prometheus::of(&pod).and_then(|p| prometheus::load(store, &pod, &p).err());
        advance(&mut pod, epoch_now, mounted, &scheduler, crash.as_deref());
        upsert(store, key, pod);
    }
}

/// Sim seconds a pod's containers run before they exit, if they ever do: their run time,
/// or less when a hung collective has NCCL's watchdog take them down first.
pub fn run_seconds(pod: &Value) -> Option<f64> {
    let restart = pod["spec"]["restartPolicy"].as_str().unwrap_or("Always");
    let run = pod["metadata"]["annotations"][RUN_ANNOTATION]
        .as_str()
        .and_then(|s| s.parse::<f64>().ok())
        .or((restart != "Always").then_some(DEFAULT_RUN_SECS));
    match (run, logs::nccl_timeout(pod)) {
        (Some(run), Some(abort)) => Some(run.min(abort)),
        (run, abort) => run.or(abort),
    }
}

/// The exit code of a pod's containers when they exit: the annotation's, else an abort's
/// when NCCL's watchdog takes them down, else 0.
fn exit_code(pod: &Value) -> i64 {
    pod["metadata"]["annotations"][EXIT_ANNOTATION]
        .as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or(if logs::watchdog_ends(pod) {
            ABORTED_EXIT
        } else {
            0
        })
}

/// Sim seconds from a pod's container start until it is Ready. Without a readiness probe
/// kubelet counts a running container ready at once; with one, it is ready when the
/// probe first passes: after [`READY_ANNOTATION`]'s seconds, else a model server's
/// [`MODEL_LOAD_SECS`], else at once.
fn load_seconds(pod: &Value) -> f64 {
    let probed = pod["spec"]["containers"]
        .as_array()
        .is_some_and(|cs| cs.iter().any(|c| c["readinessProbe"].is_object()));
    if !probed {
        return 0.0;
    }
    pod["metadata"]["annotations"][READY_ANNOTATION]
        .as_str()
        .and_then(|s| s.parse::<f64>().ok())
        .filter(|s| s.is_finite())
        .map(|s| s.max(0.0))
        .unwrap_or_else(|| {
            if model_server::of(pod).is_some() {
                MODEL_LOAD_SECS
            } else {
                0.0
            }
        })
}

/// A bound pod's status at sim time `now` from when it was scheduled.
/// `mounted` is when its volumes could first all be mounted (infinite: not yet).
/// `crash` is why its container exits 1 as soon as it starts, if it does (it is then
/// in CrashLoopBackOff, its last exit recorded with that line as its message; the sim
/// keeps one restart counted rather than a count that grows with every back-off, so
/// that its status stays put).
fn advance(pod: &mut Value, now: f64, mounted: f64, scheduler: &Scheduler, crash: Option<&str>) {
    let scheduled = pod["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == "PodScheduled"))
        .and_then(|c| c["lastTransitionTime"].as_str())
        .and_then(parse_rfc3339)
        .unwrap_or(now);
    let start = scheduled.max(mounted) + START_SECS;
    // A download's container exits once its files are written (see `downloads`).
    let run = run_seconds(pod).filter(|_| !super::downloads::writing(pod));
    let exit = exit_code(pod);
    let node = pod["spec"]["nodeName"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let host_ip = scheduler.address(&node).unwrap_or("10.1.0.1").to_owned();
    let h = fnv1a(&meta(pod, "uid"));
    let pod_ip = format!("10.1.{}.{}", 100 + (h >> 8) % 150, h % 250 + 2);
    let ts = |t: f64| rfc3339(t);
    let scheduled_at = ts(scheduled);
    let containers: Vec<(String, String)> = pod["spec"]["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            (
                c["name"].as_str().unwrap_or("main").to_owned(),
                c["image"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    let loaded = start + load_seconds(pod);
    let (phase, state, ready) = if !reached(now, start) {
        (
            "Pending",
            json!({ "waiting": { "reason": "ContainerCreating" } }),
            false,
        )
    } else if crash.is_some() {
        let name = containers.first().map_or("main", |(n, _)| n.as_str());
        let message = format!(
            "back-off 10s restarting failed container={name} pod={}",
            meta(pod, "name")
        );
        (
            "Running",
            json!({ "waiting": { "reason": "CrashLoopBackOff", "message": message } }),
            false,
        )
    } else if let Some(run) = run.filter(|r| reached(now, start + r)) {
        let finished = ts(start + run);
        let reason = if exit == 0 { "Completed" } else { "Error" };
        (
            if exit == 0 { "Succeeded" } else { "Failed" },
            json!({ "terminated": { "exitCode": exit, "reason": reason, "startedAt": ts(start), "finishedAt": finished } }),
            false,
        )
    } else {
        (
            "Running",
            json!({ "running": { "startedAt": ts(start) } }),
            reached(now, loaded),
        )
    };
    // A startup probe holds `started` back until it passes, which is when the load ends.
    let startup_probe = pod["spec"]["containers"]
        .as_array()
        .is_some_and(|cs| cs.iter().any(|c| c["startupProbe"].is_object()));
    let container_started = state.get("running").is_some() && (ready || !startup_probe);
    let statuses: Vec<Value> = containers
        .iter()
        .map(|(name, image)| {
            json!({ "name": name, "image": image, "imageID": "", "ready": ready, "restartCount": 0,
                    "started": container_started, "state": state,
                    "containerID": format!("containerd://{:016x}", h) })
        })
        .collect();
    let mut statuses = statuses;
    if let (Some(line), Some(first)) = (crash.filter(|_| reached(now, start)), statuses.first_mut())
    {
        first["restartCount"] = json!(1);
        first["lastState"] = json!({ "terminated": { "exitCode": 1, "reason": "Error",
            "message": line, "startedAt": ts(start), "finishedAt": ts(start) } });
    }
    let readiness = |kind: &str| {
        if ready {
            return json!({ "type": kind, "status": "True", "lastTransitionTime": ts(loaded) });
        }
        let mut c = json!({ "type": kind, "status": "False", "lastTransitionTime": scheduled_at });
        if matches!(phase, "Succeeded" | "Failed") {
            c["reason"] = json!("PodCompleted");
        } else {
            let names: Vec<&str> = containers.iter().map(|(n, _)| n.as_str()).collect();
            c["reason"] = json!("ContainersNotReady");
            c["message"] = json!(format!(
                "containers with unready status: [{}]",
                names.join(" ")
            ));
        }
        c
    };
    let started = now >= start;
    pod["status"] = json!({
        "phase": phase,
        "hostIP": host_ip,
        "podIP": if started { json!(pod_ip) } else { Value::Null },
        "startTime": scheduled_at,
        "qosClass": "BestEffort",
        "conditions": [
            { "type": "PodScheduled", "status": "True", "lastTransitionTime": scheduled_at },
            { "type": "Initialized", "status": "True", "lastTransitionTime": scheduled_at },
            readiness("ContainersReady"),
            readiness("Ready"),
        ],
        "containerStatuses": statuses,
    });
    if !started && let Some(s) = pod["status"].as_object_mut() {
        s.remove("podIP");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kube::admission::bootstrap;

    #[test]
    fn pods_are_scheduled_by_gpu_requests_and_run_to_completion() {
        let mut store = Store::new();
        bootstrap(&mut store, "2026-01-01T00:00:00Z");
        let t0 = parse_rfc3339("2026-01-01T00:00:00Z").unwrap();
        let node = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "labels": {}},
            "spec": {}, "status": {"allocatable": {"nvidia.com/gpu": "8", "cpu": "192"},
            "conditions": [{"type": "Ready", "status": "True"}]}});
        store.put(Key::new("/nodes", "", "n1"), node);
        for (name, gpus) in [("a", 6), ("b", 4)] {
            let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default", "uid": name,
                "annotations": {RUN_ANNOTATION: "10"}},
                "spec": {"restartPolicy": "Never", "containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": gpus.to_string()}}}]}});
            store.put(Key::new("/pods", "default", name), pod);
        }
        pods(&mut store, &[], t0, "2026-01-01T00:00:00Z");
        let a = store
            .get(&Key::new("/pods", "default", "a"))
            .unwrap()
            .clone();
        let b = store
            .get(&Key::new("/pods", "default", "b"))
            .unwrap()
            .clone();
        assert_eq!(a["spec"]["nodeName"], "n1");
        assert_eq!(a["status"]["phase"], "Pending");
        assert!(b["spec"]["nodeName"].is_null());
        assert_eq!(
            b["status"]["conditions"][0]["message"],
            "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."
        );
        let rv = store.rv();
        pods(&mut store, &[], t0, "2026-01-01T00:00:00Z");
        assert_eq!(store.rv(), rv, "nothing changed, nothing written");
        pods(&mut store, &[], t0 + 6.0, "2026-01-01T00:00:06Z");
        assert_eq!(
            store.get(&Key::new("/pods", "default", "a")).unwrap()["status"]["phase"],
            "Running"
        );
        pods(&mut store, &[], t0 + 16.0, "2026-01-01T00:00:16Z");
        assert_eq!(
            store.get(&Key::new("/pods", "default", "a")).unwrap()["status"]["phase"],
            "Succeeded"
        );
        pods(&mut store, &[], t0 + 17.0, "2026-01-01T00:00:17Z");
        assert_eq!(
            store.get(&Key::new("/pods", "default", "b")).unwrap()["spec"]["nodeName"],
            "n1",
            "room freed by the finished pod"
        );
    }

    /// A store with one Ready node, `n1`, and the epoch its clock starts at.
    fn one_node() -> (Store, f64) {
        let mut store = Store::new();
        bootstrap(&mut store, "2026-01-01T00:00:00Z");
        let node = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "labels": {}},
            "spec": {}, "status": {"allocatable": {"cpu": "8"},
            "conditions": [{"type": "Ready", "status": "True"}]}});
        store.put(Key::new("/nodes", "", "n1"), node);
        (store, parse_rfc3339("2026-01-01T00:00:00Z").unwrap())
    }

    #[test]
    fn a_pass_over_pods_is_due_again_when_a_container_starts_or_exits() {
        use crate::clock::recording;
        let (mut store, t0) = one_node();
        for (name, run) in [("job", Some("30")), ("server", None)] {
            let mut pod = json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": "default", "uid": name},
                "spec": {"containers": [{"name": "main"}]}});
            if let Some(run) = run {
                pod["metadata"]["annotations"][RUN_ANNOTATION] = json!(run);
            }
            store.put(Key::new("/pods", "default", name), pod);
        }
        let at = |t: f64| rfc3339(t0 + t);
        let ((), due) = recording(|| pods(&mut store, &[], t0, &at(0.0)));
        assert_eq!(due, START_SECS, "both start");
        let ((), due) = recording(|| pods(&mut store, &[], t0 + 7.0, &at(7.0)));
        assert_eq!(due, START_SECS + 30.0 - 7.0, "the job's container exits");
        let ((), due) = recording(|| pods(&mut store, &[], t0 + 40.0, &at(40.0)));
        assert_eq!(due, f64::INFINITY, "a server runs until deleted");
        let rv = store.rv();
        pods(&mut store, &[], t0 + 41.0, &at(41.0));
        assert_eq!(store.rv(), rv);
    }

    #[test]
    fn a_prometheus_without_its_config_crash_loops_until_the_config_map_comes() {
        let (mut store, t0) = one_node();
        let pod = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "default", "uid": "p"},
            "spec": {"containers": [{"name": "prometheus", "image": "prom/prometheus:v3.5.0",
                "readinessProbe": {"httpGet": {"path": "/-/ready", "port": 9090}},
                "volumeMounts": [{"name": "config", "mountPath": "/etc/prometheus"}]}],
                "volumes": [{"name": "config", "configMap": {"name": "p-config"}}]}});
        store.put(Key::new("/pods", "default", "p"), pod);
        let at = |t: f64| rfc3339(t0 + t);
        pods(&mut store, &[], t0, &at(0.0));
        pods(&mut store, &[], t0 + 10.0, &at(10.0));
        let status = store.get(&Key::new("/pods", "default", "p")).unwrap()["status"].clone();
        let c = &status["containerStatuses"][0];
        assert_eq!(c["state"]["waiting"]["reason"], "CrashLoopBackOff");
        assert_eq!(c["ready"], false);
        assert_eq!(c["lastState"]["terminated"]["exitCode"], 1);
        assert!(
            c["lastState"]["terminated"]["message"]
                .as_str()
                .unwrap()
                .starts_with("Error loading config (--config.file=/etc/prometheus/prometheus.yml)")
        );
        let rv = store.rv();
        pods(&mut store, &[], t0 + 20.0, &at(20.0));
        assert_eq!(store.rv(), rv, "its status stays put");
        let cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "p-config", "namespace": "default"},
            "data": {"prometheus.yml": "global:\n  scrape_interval: 15s\n"}});
        store.put(Key::new("/configmaps", "default", "p-config"), cm);
        pods(&mut store, &[], t0 + 30.0, &at(30.0));
        let status = store.get(&Key::new("/pods", "default", "p")).unwrap()["status"].clone();
        assert_eq!(status["containerStatuses"][0]["ready"], true);
    }

    #[test]
    fn probed_pods_are_ready_once_loaded_and_the_pass_is_due_then() {
        use crate::clock::recording;
        let (mut store, t0) = one_node();
        let probe = json!({"httpGet": {"path": "/health", "port": 8000}});
        let vllm = json!(["vllm", "serve", "/s3/models/m", "--served-model-name", "m"]);
        for (name, command, annotation, startup) in [
            ("annotated", vllm.clone(), Some("10"), false),
            ("model", vllm.clone(), None, true),
            ("web", json!(["nginx"]), None, false),
        ] {
            let mut pod = json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": "default", "uid": name},
                "spec": {"containers": [{"name": "main", "command": command, "readinessProbe": probe}]}});
            if let Some(a) = annotation {
                pod["metadata"]["annotations"][READY_ANNOTATION] = json!(a);
            }
            if startup {
                pod["spec"]["containers"][0]["startupProbe"] = probe.clone();
            }
            store.put(Key::new("/pods", "default", name), pod);
        }
        let at = |t: f64| rfc3339(t0 + t);
        let get = |store: &Store, name: &str| {
            let p = store.get(&Key::new("/pods", "default", name)).unwrap();
            let cond = |k: &str| {
                p["status"]["conditions"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|c| c["type"] == k)
                    .unwrap()
                    .clone()
            };
            (
                p["status"]["phase"].clone(),
                cond("Ready"),
                cond("ContainersReady"),
                p["status"]["containerStatuses"][0].clone(),
            )
        };
        let ((), due) = recording(|| pods(&mut store, &[], t0, &at(0.0)));
        assert_eq!(due, START_SECS);
        let ((), due) = recording(|| pods(&mut store, &[], t0 + START_SECS, &at(START_SECS)));
        assert_eq!(due, 10.0, "the annotated pod is due to be ready");
        let (phase, ready, _, container) = get(&store, "annotated");
        assert_eq!(
            (phase, &ready["status"]),
            (json!("Running"), &json!("False"))
        );
        assert_eq!(ready["reason"], "ContainersNotReady");
        assert_eq!(ready["message"], "containers with unready status: [main]");
        assert_eq!(
            (&container["ready"], &container["started"]),
            (&json!(false), &json!(true))
        );
        let (_, _, _, container) = get(&store, "model");
        assert_eq!(
            container["started"], false,
            "its startup probe has not passed"
        );
        let (_, ready, _, _) = get(&store, "web");
        assert_eq!(ready["status"], "True", "nothing to load");

        let ((), due) = recording(|| {
            pods(
                &mut store,
                &[],
                t0 + START_SECS + 10.0,
                &at(START_SECS + 10.0),
            )
        });
        assert_eq!(
            due,
            MODEL_LOAD_SECS - 10.0,
            "the model server loads for longer"
        );
        let (_, ready, containers_ready, container) = get(&store, "annotated");
        assert_eq!(
            (&ready["status"], &containers_ready["status"]),
            (&json!("True"), &json!("True"))
        );
        assert_eq!(ready["lastTransitionTime"], at(START_SECS + 10.0));
        assert_eq!(container["ready"], true);

        let loaded = START_SECS + MODEL_LOAD_SECS;
        let ((), due) = recording(|| pods(&mut store, &[], t0 + loaded, &at(loaded)));
        assert_eq!(due, f64::INFINITY);
        let (_, ready, _, container) = get(&store, "model");
        assert_eq!(ready["lastTransitionTime"], at(loaded));
        assert_eq!(
            (&container["ready"], &container["started"]),
            (&json!(true), &json!(true))
        );
        let rv = store.rv();
        pods(&mut store, &[], t0 + loaded + 5.0, &at(loaded + 5.0));
        assert_eq!(store.rv(), rv, "a loaded pod stays as it is");
    }

    #[test]
    fn a_hung_collective_ends_the_container_with_an_abort_unless_told_otherwise() {
        use crate::clock::recording;
        use crate::kube::logs::{NCCL_TIMEOUT_ANNOTATION, NCCL_TIMEOUT_SECS};
        let (mut store, t0) = one_node();
        for (name, exit) in [("sft-pod-0", None), ("sft-pod-1", Some("3"))] {
            let mut pod = json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": "default", "uid": name,
                    "annotations": {RUN_ANNOTATION: "inf", NCCL_TIMEOUT_ANNOTATION: "30"}},
                "spec": {"restartPolicy": "Never", "containers": [{"name": "main"}]}});
            if let Some(code) = exit {
                pod["metadata"]["annotations"][EXIT_ANNOTATION] = json!(code);
            }
            store.put(Key::new("/pods", "default", name), pod);
        }
        let at = |t: f64| rfc3339(t0 + t);
        pods(&mut store, &[], t0, &at(0.0));
        let ((), due) = recording(|| pods(&mut store, &[], t0 + START_SECS, &at(START_SECS)));
        assert_eq!(due, 30.0 + NCCL_TIMEOUT_SECS, "due when the watchdog fires");
        let abort = START_SECS + 30.0 + NCCL_TIMEOUT_SECS;
        pods(&mut store, &[], t0 + abort - 1.0, &at(abort - 1.0));
        let get = |store: &Store, name: &str| {
            store
                .get(&Key::new("/pods", "default", name))
                .unwrap()
                .clone()
        };
        assert_eq!(get(&store, "sft-pod-0")["status"]["phase"], "Running");
        pods(&mut store, &[], t0 + abort, &at(abort));
        let pod = get(&store, "sft-pod-0");
        assert_eq!(pod["status"]["phase"], "Failed");
        let terminated = &pod["status"]["containerStatuses"][0]["state"]["terminated"];
        assert_eq!(
            (
                &terminated["exitCode"],
                &terminated["reason"],
                &terminated["finishedAt"]
            ),
            (&json!(ABORTED_EXIT), &json!("Error"), &json!(at(abort)))
        );
        assert_eq!(
            get(&store, "sft-pod-1")["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"],
            3,
            "the exit-code annotation says otherwise"
        );
        let (last, _) = crate::kube::logs::last_line(&pod, t0 + abort + 60.0).unwrap();
        assert_eq!(
            last,
            "terminate called after throwing an instance of 'c10::DistBackendError'"
        );
    }
}
