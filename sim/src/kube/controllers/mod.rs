//! The cluster's controllers, driven by the sim's clock: HyperPod instances become Nodes,
//! EKS add-ons bring their workloads, Deployments/ReplicaSets/DaemonSets/Jobs/RayJobs/
//! HyperPodPyTorchJobs get Pods, Pods are bound by the [`scheduler`](super::scheduler) and
//! run through their phases (those mounting FSx for Lustre once it can be mounted),
//! LoadBalancer Services get a hostname, Services with a selector get Endpoints listing
//! their pods, the inference operator deploys InferenceEndpointConfigs and JumpStart
//! models, PVCs bind to PVs, orphans are collected, Prometheus servers scrape their
//! targets, KEDA scales workloads on what their ScaledObjects' triggers read, and
//! HyperPod's managed Karpenter scales instance groups
//! for pods that found no node. One file per kind; what several share lives here.
//!
//! Every status is a pure function of the stored objects and the clock (times come from
//! earlier transitions, never from "now" unless something changed), and an object is
//! written only when it changes, so a quiet cluster's resourceVersion stands still and
//! watchers see one event per real transition. Controllers run when something they
//! watch changed or when a deadline they found is due, never on a fixed tick (see
//! [`run`]); every status they compare with the clock goes through
//! [`reached`](crate::clock::reached), which is how a pass knows its deadline. A pass
//! reads what it needs of EKS and HyperPod under the AWS lock first, then works on the
//! objects under the cluster's own lock, and hands what it asks of HyperPod back under
//! the AWS lock: it never holds both.

mod addons;
mod claims;
mod daemonsets;
mod deployments;
mod downloads;
mod endpoints;
mod gc;
mod inference_endpoints;
mod jobs;
mod jumpstart_models;
mod karpenter;
mod mlflow_reports;
mod mounts;
mod nodes;
mod pods;
mod pytorchjobs;
mod rayjobs;
mod replicasets;
mod scaledobjects;
mod services;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::sync::{Notify, watch};

use super::admission::{object, pod_defaults};
use super::store::{Key, Store, meta};
use super::time::rfc3339;
use super::{ClusterApi, WeakApi};
use crate::clock::{Clock, recording};
use crate::sagemaker::instance_types::InstanceType;
use crate::sagemaker::{Features, Instance};
use crate::world::{Aws, Shared, World, fnv1a};

pub use downloads::of as download_of;
pub use pods::run_seconds;
pub use scaledobjects::Autoscalers;

/// The shortest real time between two passes, so that changes that come together (a
/// client applying many objects, a pass's own writes) are reconciled together.
const MIN_PAUSE: Duration = Duration::from_millis(10);
/// A pass that took long is followed by a pause this many times as long.
const IDLE_PER_BUSY: u32 = 4;

/// Runs the controllers of a cluster until its API server stops: a pass when something
/// they watch changed (`wake`: a write to the cluster's objects, or a change in EKS or
/// HyperPod for this cluster) or when the soonest instant a pass found still to come is
/// due, converted to real time at the clock's speed (a change of speed wakes every
/// cluster, so the deadline is computed again). Nothing else runs them: a quiet cluster
/// costs nothing. A pass is followed by a pause [`IDLE_PER_BUSY`] times as long (at
/// least [`MIN_PAUSE`]), so the controllers hold the cluster's lock at most a fifth of
/// the time however big the cluster: API calls are answered while the controllers fall
/// behind, as a real control plane's work queues do.
pub async fn run(world: Shared, api: WeakApi, wake: Arc<Notify>, mut stopped: watch::Receiver<()>) {
    // The first pass runs at once: it finds the cluster's first deadlines.
    let mut due = Some(Instant::now());
    let mut not_before = Instant::now();
    loop {
        let deadline = async {
            match due {
                Some(at) => tokio::time::sleep_until(at.into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = stopped.changed() => return,
            () = wake.notified() => {}
            () = deadline => {}
        }
        tokio::select! {
            _ = stopped.changed() => return,
            () = tokio::time::sleep_until(not_before.into()) => {}
        }
        let Some(api) = api.upgrade() else {
            return;
        };
        let started = Instant::now();
        let next = pass(&world, &api).await;
        drop(api);
        not_before = Instant::now() + (started.elapsed() * IDLE_PER_BUSY).max(MIN_PAUSE);
        // Measured from the pass's start, before any instant it compared with was read,
        // the deadline is never late; a pass that comes early finds it again.
        due = world.clock.real_time_for(next).map(|d| started + d);
    }
}

/// What a pass reads of EKS and HyperPod, all under one hold of the AWS lock.
struct Facts {
    /// The instances of the HyperPod clusters on this EKS cluster.
    instances: Vec<Instance>,
    /// The instance-type table's rows for their types.
    types: BTreeMap<String, InstanceType>,
    features: Vec<Features>,
    /// The ACTIVE add-ons, each with its configuration.
    addons: Vec<(String, Option<Value>)>,
    /// The groups managed Karpenter scales, if it runs for a HyperPod cluster here.
    karpenter: Option<Vec<karpenter::Group>>,
    /// The FSx file systems of the cluster's region, which its pods may mount.
    file_systems: Vec<crate::fsx::Mountable>,
}

impl Facts {
    fn gather(aws: &mut Aws, cluster: &str, region: &str) -> Self {
        let instances = aws.hyperpod_instances(cluster);
        // HyperPod refuses a group whose type has no row, and rows are only ever added
        // or replaced, so every instance finds its row.
        let types = instances
            .iter()
            .filter_map(|i| {
                let row = aws.sagemaker.instance_types.get(&i.instance_type)?;
                Some((i.instance_type.clone(), row.clone()))
            })
            .collect();
        let features = aws.hyperpod_features(cluster);
        let addons = aws
            .eks_active_addons(cluster)
            .into_iter()
            .map(|addon| {
                let config = aws.eks_addon_configuration(cluster, &addon);
                (addon, config)
            })
            .collect();
        let karpenter = karpenter::groups(aws, &features);
        let file_systems = aws.fsx_mountable(region);
        Self {
            instances,
            types,
            features,
            addons,
            karpenter,
            file_systems,
        }
    }
}

/// One pass over cluster `api`: what users asked of HyperPod through Node labels is
/// handed on, EKS and HyperPod are read, the objects reconciled, and what managed
/// Karpenter decided is asked of HyperPod. Each hold of the AWS lock first makes sure the
/// cluster is still the one served under its name (it may have been deleted, forgotten
/// or made anew meanwhile). The answer is the simulated seconds until the soonest
/// instant at which anything the pass read changes (infinite: none), or sooner when it
/// asked HyperPod for something (see [`karpenter::apply`]).
async fn pass(world: &World, api: &ClusterApi) -> f64 {
    let recoveries = nodes::requested_recoveries(&*api.store.lock().await);
    let (facts, aws_due) = {
        let mut aws = world.aws.lock().await;
        if !world.kube.is_current(api) {
            return f64::INFINITY;
        }
        for (hyperpod, id, recovery) in recoveries {
            aws.mark_node_for_recovery(&hyperpod, &id, recovery, None);
        }
        let gathered = recording(|| Facts::gather(&mut aws, &api.name, &api.region));
        // Reading the EKS cluster settles it: one whose deletion is over has no server.
        if !world.kube.is_current(api) {
            return f64::INFINITY;
        }
        gathered
    };
    let (plan, kube_due) = {
        let mut store = api.store.lock().await;
        recording(|| reconcile(&mut store, api, &facts, &world.clock))
    };
    let written_due = write_downloads(world, api).await;
    let reported_due = report_metrics(world, api).await;
    let mut karpenter_due = f64::INFINITY;
    if let (Some(plan), Some(groups)) = (plan, &facts.karpenter)
        && !plan.is_empty()
    {
        let mut aws = world.aws.lock().await;
        if world.kube.is_current(api) {
            karpenter_due = karpenter::apply(&mut aws, groups, plan);
        }
    }
    aws_due
        .min(kube_due)
        .min(karpenter_due)
        .min(written_due)
        .min(reported_due)
}

/// Logs what training containers report to MLflow (see [`mlflow_reports`]), with no lock
/// held while MLflow answers. Due again a step later, but no sooner than half a real
/// second: at the tests' 600x a step is 17 ms, and one call logs many steps.
async fn report_metrics(world: &World, api: &ClusterApi) -> f64 {
    static CLIENT: std::sync::LazyLock<reqwest::Client> = std::sync::LazyLock::new(|| {
        reqwest::Client::builder()
            .timeout(std::time::Duration::from_secs(10))
            .build()
            .expect("a reqwest client builds")
    });
    let now = world.clock.epoch(world.clock.now());
    let pending = mlflow_reports::pending(&*api.store.lock().await, now);
    if pending.is_empty() {
        return f64::INFINITY;
    }
    let urls: Vec<Option<String>> = {
        let aws = world.aws.lock().await;
        pending
            .iter()
            .map(|r| aws.sagemaker.mlflow.reporting_url(&r.tracking))
            .collect()
    };
    let mut done = Vec::new();
    for (r, url) in pending.iter().zip(urls) {
        // A server that is not up (or not this sim's) hears nothing, as a real one
        // would not; the pod tries again later.
        let Some(url) = url else { continue };
        match mlflow_reports::report(&CLIENT, &url, r).await {
            Ok(state) => done.push((r, state)),
            Err(e) => tracing::warn!(pod = %r.pod, "reporting to MLflow: {e}"),
        }
    }
    let mut store = api.store.lock().await;
    for (r, state) in done {
        mlflow_reports::reported(&mut store, r, &state);
    }
    mlflow_reports::STEP_SECS.max(world.clock.scale() * 0.5)
}

/// Writes the files of the download containers that started, with no lock held while
/// S3 answers, then lets each container exit; due at once when any did (its pod's next
/// phase is the next pass's).
async fn write_downloads(world: &World, api: &ClusterApi) -> f64 {
    let pending = downloads::pending(&*api.store.lock().await);
    if pending.is_empty() {
        return f64::INFINITY;
    }
    let now = rfc3339(world.clock.epoch(world.clock.now()));
    let mut results = Vec::with_capacity(pending.len());
    for d in &pending {
        let result = match (&world.s3, &d.target) {
            (Some(s3), _) => downloads::write(s3, &api.region, d, &now).await,
            (None, None) => Ok(()),
            (None, Some((bucket, _))) => Err(format!(
                "hypd-sim has no S3 to write s3://{bucket} to: start it with --s3-url or --moto-url"
            )),
        };
        results.push(result);
    }
    let mut store = api.store.lock().await;
    for (d, result) in pending.iter().zip(results) {
        downloads::written(&mut store, d, result.err().as_deref());
    }
    0.0
}

/// One pass of every controller, in the order a change flows: Nodes and add-ons first,
/// from what EKS and HyperPod say, then orphans go so nothing is reconciled for an owner
/// that is gone, owners come before what they create (RayJobs make Jobs, Jobs make
/// Pods), and Pods come after every workload so a new pod is scheduled in the pass that
/// made it. Karpenter comes last, to see the pods the scheduler could not place in this
/// pass; what it decides for HyperPod is the answer.
fn reconcile(
    store: &mut Store,
    api: &ClusterApi,
    facts: &Facts,
    clock: &Clock,
) -> Option<karpenter::Plan> {
    let epoch_now = clock.epoch(clock.now());
    let now = rfc3339(epoch_now);
    nodes::nodes(store, &facts.instances, &facts.types, &api.version, clock);
    addons::addons(store, &facts.addons, &facts.features, &now);
    gc::collect_garbage(store);
    // The inference operator runs only while its add-on does.
    let inference = facts
        .addons
        .iter()
        .any(|(a, _)| a == addons::INFERENCE_OPERATOR);
    if inference {
        inference_endpoints::inference_endpoints(store, &facts.file_systems, &api.region, &now);
        jumpstart_models::jumpstart_models(store, &api.region, &now);
    }
    // Before the workloads, so a target it scales gets its pods in the same pass.
    scaledobjects::scaledobjects(store, &api.serving, &api.autoscalers, epoch_now, &now);
    deployments::deployments(store, &now);
    replicasets::replicasets(store, &now);
    daemonsets::daemonsets(store, &now);
    rayjobs::rayjobs(store, &now);
    pytorchjobs::pytorchjobs(store, &now);
    jobs::jobs(store, &now);
    pods::pods(store, &facts.file_systems, epoch_now, &now);
    services::services(store, epoch_now, &api.region);
    // After the pods, so a Service's Endpoints list its pods as this pass left them.
    endpoints::endpoints(store, &now);
    // After the Endpoints, so a scrape reaches the pods this pass left behind a Service.
    crate::kube::prometheus::scrape(store, &api.serving, epoch_now);
    // Last, so an InferenceEndpointConfig's status tells what this pass left.
    if inference {
        inference_endpoints::inference_statuses(
            store,
            &facts.file_systems,
            &api.region,
            epoch_now,
            &now,
        );
        jumpstart_models::jumpstart_statuses(store, &api.region, epoch_now, &now);
    }
    // What gone pods served, and gone Services' turns, go with them.
    api.serving.forget_gone(store);
    claims::claims(store);
    let groups = facts.karpenter.as_deref()?;
    Some(karpenter::karpenter(store, groups, epoch_now, &now))
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

pub(super) fn is_ready(pod: &Value) -> bool {
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

/// A core Event about `involved`, reported by `source` (`{component}`, and `host` for an
/// agent on a node), as client-go's recorder writes it: the same event again counts up
/// on the one written first, and one about a cluster-scoped object (a Node) goes to
/// `default`.
fn record(
    store: &mut Store,
    involved: &Value,
    kind: &str,
    reason: &str,
    message: &str,
    source: &Value,
    now: &str,
) {
    let ns = involved["namespace"]
        .as_str()
        .filter(|ns| !ns.is_empty())
        .unwrap_or("default")
        .to_owned();
    let who = involved["name"].as_str().unwrap_or_default();
    let component = source["component"].as_str().unwrap_or_default();
    let identity = format!(
        "{}/{}/{}/{who}/{}/{component}/{kind}/{reason}/{message}",
        involved["apiVersion"].as_str().unwrap_or_default(),
        involved["kind"].as_str().unwrap_or_default(),
        ns,
        involved["uid"].as_str().unwrap_or_default()
    );
    let name = format!("{who}.{:016x}", fnv1a(&identity));
    let key = Key::new("/events", &ns, &name);
    let e = match store.get(&key) {
        Some(old) => {
            let mut e = (**old).clone();
            e["count"] = json!(old["count"].as_u64().unwrap_or(1) + 1);
            e["lastTimestamp"] = json!(now);
            e
        }
        None => {
            let mut e = object(store, "v1", "Event", &ns, &name, now);
            let mut involved = involved.clone();
            if involved["resourceVersion"] == ""
                && let Some(o) = involved.as_object_mut()
            {
                o.remove("resourceVersion");
            }
            e["involvedObject"] = involved;
            e["reason"] = json!(reason);
            e["message"] = json!(message);
            e["type"] = json!(kind);
            e["source"] = source.clone();
            e["reportingComponent"] = json!(component);
            e["reportingInstance"] = source.get("host").cloned().unwrap_or(json!(""));
            e["firstTimestamp"] = json!(now);
            e["lastTimestamp"] = json!(now);
            e["count"] = json!(1);
            e
        }
    };
    store.put(key, e);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn node_and_job_pod(store: &mut Store) {
        let node = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "labels": {}},
            "spec": {}, "status": {"allocatable": {"cpu": "8"},
            "conditions": [{"type": "Ready", "status": "True"}]}});
        store.put(Key::new("/nodes", "", "n1"), node);
        let pod = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "default", "uid": "p",
                         "annotations": {pods::RUN_ANNOTATION: "30"}},
            "spec": {"restartPolicy": "Never", "containers": [{"name": "main"}]}});
        store.put(Key::new("/pods", "default", "p"), pod);
    }

    fn phase(store: &Store) -> Value {
        store.get(&Key::new("/pods", "default", "p")).unwrap()["status"]["phase"].clone()
    }

    #[tokio::test]
    async fn a_pass_is_due_when_what_it_read_changes_and_a_quiet_cluster_never() {
        let world = World::new(0.0, None, "testing".to_owned());
        let (api, _stopped) = world.kube.serve_nothing("c");
        node_and_job_pod(&mut *api.store.lock().await);
        // Bound now, its container starts START_SECS after the scheduling time the pod
        // records (whole seconds), so at most that far off.
        let due = pass(&world, &api).await;
        assert!(
            due > pods::START_SECS - 1.0 && due <= pods::START_SECS,
            "{due}"
        );
        assert_eq!(phase(&*api.store.lock().await), "Pending");
        world.clock.advance(due);
        let due = pass(&world, &api).await;
        assert_eq!(phase(&*api.store.lock().await), "Running");
        assert!(due > 29.0 && due <= 30.0, "{due}");
        world.clock.advance(due);
        assert_eq!(pass(&world, &api).await, f64::INFINITY);
        assert_eq!(phase(&*api.store.lock().await), "Succeeded");
        // Nothing is left to change: a pass writes nothing and is never due.
        let rv = api.store.lock().await.rv();
        assert_eq!(pass(&world, &api).await, f64::INFINITY);
        assert_eq!(api.store.lock().await.rv(), rv);
        // A cluster forgotten meanwhile is left alone.
        world.kube.stop("c");
        assert_eq!(pass(&world, &api).await, f64::INFINITY);
    }

    #[tokio::test]
    async fn controllers_run_at_their_deadlines_with_nothing_else_to_wake_them() {
        // 600 simulated seconds a real one: the pod's 5 s start and 30 s run take about
        // 60 ms, but only the deadlines can move it on, since nothing writes after the
        // pass that binds it.
        let world = Arc::new(World::new(600.0, None, "testing".to_owned()));
        let (api, stopped) = world.kube.serve_nothing("c");
        tokio::spawn(run(
            world.clone(),
            Arc::downgrade(&api),
            api.store.lock().await.changes(),
            stopped,
        ));
        node_and_job_pod(&mut *api.store.lock().await);
        let finished = async {
            while phase(&*api.store.lock().await) != "Succeeded" {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        // A bound on a hang, not a figure: the run takes a few passes.
        tokio::time::timeout(Duration::from_secs(60), finished)
            .await
            .expect("the pod runs to completion");
    }
}
