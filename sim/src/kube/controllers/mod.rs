//! The cluster's controllers, driven by the sim's clock: HyperPod instances become Nodes,
//! EKS add-ons bring their workloads, Deployments/ReplicaSets/DaemonSets/Jobs/RayJobs/
//! HyperPodPyTorchJobs get Pods, Pods are bound by the [`scheduler`](super::scheduler) and
//! run through their phases, LoadBalancer Services get a hostname, PVCs bind to PVs,
//! orphans are collected, and HyperPod's managed Karpenter scales instance groups for
//! pods that found no node. One file per kind; what several share lives here.
//!
//! Every status is a pure function of the stored objects and the clock (times come from
//! earlier transitions, never from "now" unless something changed), and an object is
//! written only when it changes, so a quiet cluster's resourceVersion stands still and
//! watchers see one event per real transition. Controllers run every [`super::TICK`], or
//! less often when a pass is slow (see [`run`]).

mod addons;
mod claims;
mod daemonsets;
mod deployments;
mod gc;
mod jobs;
mod karpenter;
mod nodes;
mod pods;
mod pytorchjobs;
mod rayjobs;
mod replicasets;
mod services;

use serde_json::{Value, json};
use tokio::sync::watch;

use super::admission::{object, pod_defaults};
use super::store::{Key, Store, meta};
use super::time::rfc3339;
use crate::world::{Shared, World};

pub use pods::run_seconds;

/// Runs the controllers of `cluster` every tick until its API server stops. A pass that
/// took long is followed by a wait [`IDLE_PER_BUSY`] times as long, so the controllers hold
/// the world's lock at most a fifth of the time however big the cluster: API calls are
/// answered while the controllers fall behind, as a real control plane's work queues do.
pub async fn run(world: Shared, cluster: String, mut stopped: watch::Receiver<()>) {
    let mut wait = super::TICK;
    loop {
        tokio::select! {
            _ = stopped.changed() => return,
            _ = tokio::time::sleep(wait) => {
                let mut w = world.lock().await;
                let started = std::time::Instant::now();
                reconcile(&mut w, &cluster);
                wait = super::TICK.max(started.elapsed() * IDLE_PER_BUSY);
            }
        }
    }
}

const IDLE_PER_BUSY: u32 = 4;

/// One pass of every controller, in the order a change flows: orphans go first so nothing
/// is reconciled for an owner that is gone, owners come before what they create (RayJobs
/// make Jobs, Jobs make Pods), and Pods come after every workload so a new pod is
/// scheduled in the tick that made it. Karpenter comes last, to see the pods the
/// scheduler could not place in this tick.
fn reconcile(w: &mut World, cluster: &str) {
    let epoch_now = w.clock.epoch(w.clock.now());
    let now = rfc3339(epoch_now);
    nodes::nodes(w, cluster);
    addons::addons(w, cluster, &now);
    let Some(c) = w.kube_cluster(cluster) else {
        return;
    };
    let region = c.region.clone();
    let store = &mut c.store;
    gc::collect_garbage(store);
    deployments::deployments(store, &now);
    replicasets::replicasets(store, &now);
    daemonsets::daemonsets(store, &now);
    rayjobs::rayjobs(store, &now);
    pytorchjobs::pytorchjobs(store, &now);
    jobs::jobs(store, &now);
    pods::pods(store, epoch_now, &now);
    services::services(store, epoch_now, &region);
    claims::claims(store);
    karpenter::karpenter(w, cluster, epoch_now, &now);
}

/// Stores `value` if it differs from what is stored (resourceVersion aside).
fn upsert(store: &mut Store, key: Key, mut value: Value) {
    if let Some(old) = store.get(&key) {
        value["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"].clone();
        if **old == value {
            return;
        }
    }
    store.put(key, value);
}

/// A child object's owner reference to `owner` (the controller).
fn owner_ref(owner: &Value) -> Value {
    json!([{
        "apiVersion": owner["apiVersion"],
        "kind": owner["kind"],
        "name": owner["metadata"]["name"],
        "uid": owner["metadata"]["uid"],
        "controller": true,
        "blockOwnerDeletion": true,
    }])
}

/// Every object of a resource, copied: a controller writes to the store while it walks
/// them.
fn snapshot(store: &Store, gr: &str) -> Vec<Value> {
    store.list(gr, None).map(|o| (**o).clone()).collect()
}

/// The objects of `gr` in `ns` that `owner_uid` owns, copied for the same reason.
fn owned(store: &Store, gr: &str, ns: &str, owner_uid: &str) -> Vec<Value> {
    store
        .list(gr, Some(ns))
        .filter(|o| {
            o["metadata"]["ownerReferences"]
                .as_array()
                .is_some_and(|refs| refs.iter().any(|r| r["uid"].as_str() == Some(owner_uid)))
        })
        .map(|o| (**o).clone())
        .collect()
}

/// A run's `status.startTime`: the one recorded, else the object's creation, so it does
/// not move once set.
fn start_time(o: &Value) -> Value {
    o["status"]["startTime"]
        .as_str()
        .map_or_else(|| json!(meta(o, "creationTimestamp")), |s| json!(s))
}

/// A pod from a template, owned by `owner`.
fn pod_from(
    store: &mut Store,
    owner: &Value,
    template: &Value,
    name: &str,
    extra_labels: &Value,
    now: &str,
) -> (Key, Value) {
    let ns = meta(owner, "namespace");
    let mut pod = object(store, "v1", "Pod", &ns, name, now);
    pod["metadata"]["labels"] = template["metadata"]["labels"].clone();
    if let Some(extra) = extra_labels.as_object() {
        for (k, v) in extra {
            pod["metadata"]["labels"][k] = v.clone();
        }
    }
    if template["metadata"]["annotations"].is_object() {
        pod["metadata"]["annotations"] = template["metadata"]["annotations"].clone();
    }
    pod["metadata"]["ownerReferences"] = owner_ref(owner);
    pod["spec"] = template["spec"].clone();
    pod_defaults(&mut pod);
    (Key::new("/pods", &ns, name), pod)
}

pub(super) fn is_terminal(pod: &Value) -> bool {
    matches!(
        pod["status"]["phase"].as_str(),
        Some("Succeeded" | "Failed")
    )
}

fn is_ready(pod: &Value) -> bool {
    pod["status"]["phase"] == "Running"
        && pod["status"]["conditions"].as_array().is_some_and(|cs| {
            cs.iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        })
}

/// Keeps a condition's transition time while its status holds.
fn condition(
    old: &Value,
    kind: &str,
    status: bool,
    reason: &str,
    message: &str,
    now: &str,
) -> Value {
    let status = if status { "True" } else { "False" };
    let prev = old["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == kind));
    let since = match prev {
        Some(p) if p["status"] == status && p["reason"] == reason => {
            p["lastTransitionTime"].clone()
        }
        _ => json!(now),
    };
    json!({ "type": kind, "status": status, "reason": reason, "message": message,
            "lastTransitionTime": since, "lastUpdateTime": since })
}

pub(super) fn selector_matches(selector: &Value, labels: &Value) -> bool {
    selector
        .as_object()
        .is_none_or(|s| s.iter().all(|(k, v)| labels.get(k) == Some(v)))
}

pub(super) fn node_ready(n: &Value) -> bool {
    n["status"]["conditions"].as_array().is_some_and(|cs| {
        cs.iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
    })
}

/// When the last of `pods` finished, if any did.
fn finish_time(pods: &[Value]) -> Option<String> {
    pods.iter()
        .filter_map(|p| {
            p["status"]["containerStatuses"][0]["state"]["terminated"]["finishedAt"]
                .as_str()
                .map(str::to_owned)
        })
        .max()
}
