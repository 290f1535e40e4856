//! The cluster's controllers, driven by the sim's clock: HyperPod instances become Nodes,
//! EKS add-ons bring their workloads, Deployments/ReplicaSets/DaemonSets/Jobs/RayJobs/
//! HyperPodPyTorchJobs get Pods, Pods are scheduled by GPU/EFA/CPU requests against node
//! allocatable, LoadBalancer Services get a hostname and PVCs bind to PVs.
//!
//! Every status is a pure function of the stored objects and the clock (times come from
//! earlier transitions, never from "now" unless something changed), and an object is
//! written only when it changes, so a quiet cluster's resourceVersion stands still and
//! watchers see one event per real transition. Controllers run every [`super::TICK`].

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Value, json};
use tokio::sync::watch;

use super::discovery::{CRD_GR, Resource};
use super::store::{Key, Store};
use super::time::{parse_rfc3339, rfc3339};
use crate::world::{Shared, World};

/// Pod or template annotation: sim seconds a container runs before it exits (jobs default
/// to [`DEFAULT_RUN_SECS`]; long-running pods without it run until deleted).
pub const RUN_ANNOTATION: &str = "sim.hypd.dev/run-seconds";
/// Pod or template annotation: the exit code of a container that finishes (default 0).
pub const EXIT_ANNOTATION: &str = "sim.hypd.dev/exit-code";
pub const DEFAULT_RUN_SECS: f64 = 60.0;
/// Sim seconds from scheduling to a running container (image pull and start).
pub const START_SECS: f64 = 5.0;
/// Sim seconds until a LoadBalancer Service gets its hostname.
pub const LB_SECS: f64 = 30.0;

pub const PYTORCHJOB_CRD: &str =
    include_str!("../../crds/sagemaker.amazonaws.com_hyperpodpytorchjobs.yaml");
pub const TRAINING_OPERATOR: &str = "amazon-sagemaker-hyperpod-training-operator";

fn meta(o: &Value, k: &str) -> String {
    o["metadata"][k].as_str().unwrap_or_default().to_owned()
}

fn fnv(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// A new object with the metadata the API server would give it.
fn object(
    store: &mut Store,
    api_version: &str,
    kind: &str,
    ns: &str,
    name: &str,
    now: &str,
) -> Value {
    let mut o = json!({
        "apiVersion": api_version,
        "kind": kind,
        "metadata": { "name": name, "uid": store.uid(), "creationTimestamp": now, "generation": 1 },
    });
    if !ns.is_empty() {
        o["metadata"]["namespace"] = json!(ns);
    }
    o
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

pub fn bootstrap(store: &mut Store, now: &str) {
    for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
        let mut o = object(store, "v1", "Namespace", "", ns, now);
        o["metadata"]["labels"] = json!({ "kubernetes.io/metadata.name": ns });
        o["spec"] = json!({ "finalizers": ["kubernetes"] });
        o["status"] = json!({ "phase": "Active" });
        store.put(Key::new("/namespaces", "", ns), o);
    }
    let mut svc = object(store, "v1", "Service", "default", "kubernetes", now);
    svc["metadata"]["labels"] = json!({ "component": "apiserver", "provider": "kubernetes" });
    svc["spec"] = json!({ "type": "ClusterIP", "clusterIP": "172.20.0.1", "clusterIPs": ["172.20.0.1"],
        "ports": [{ "name": "https", "port": 443, "protocol": "TCP", "targetPort": 443 }] });
    svc["status"] = json!({ "loadBalancer": {} });
    store.put(Key::new("/services", "default", "kubernetes"), svc);
}

/// Defaults the API server fills in on create.
pub fn defaults(res: &Resource, o: &mut Value, now: &str) {
    let uid = meta(o, "uid");
    let name = meta(o, "name");
    match (res.group.as_str(), res.plural.as_str()) {
        ("", "namespaces") => {
            o["metadata"]["labels"]["kubernetes.io/metadata.name"] = json!(name);
            o["spec"] = json!({ "finalizers": ["kubernetes"] });
            o["status"] = json!({ "phase": "Active" });
        }
        ("", "pods") => {
            let spec = &mut o["spec"];
            if spec["restartPolicy"].is_null() {
                spec["restartPolicy"] = json!("Always");
            }
            spec["schedulerName"] = json!("default-scheduler");
            o["status"] = json!({ "phase": "Pending", "qosClass": "BestEffort" });
        }
        ("", "services") => {
            if o["spec"]["type"].is_null() {
                o["spec"]["type"] = json!("ClusterIP");
            }
            let h = fnv(&uid);
            let ip = format!("172.20.{}.{}", (h >> 8) % 250 + 1, h % 250 + 2);
            if o["spec"]["clusterIP"].as_str() != Some("None") {
                o["spec"]["clusterIP"] = json!(ip);
                o["spec"]["clusterIPs"] = json!([ip]);
            }
            o["status"] = json!({ "loadBalancer": {} });
        }
        ("", "persistentvolumes") => o["status"] = json!({ "phase": "Available" }),
        ("", "persistentvolumeclaims") => o["status"] = json!({ "phase": "Pending" }),
        ("apps", "deployments") => {
            if o["spec"]["replicas"].is_null() {
                o["spec"]["replicas"] = json!(1);
            }
            if o["spec"]["strategy"].is_null() {
                o["spec"]["strategy"] = json!({ "type": "RollingUpdate", "rollingUpdate": { "maxSurge": "25%", "maxUnavailable": "25%" } });
            }
            o["spec"]["revisionHistoryLimit"] = o["spec"]["revisionHistoryLimit"]
                .take()
                .as_i64()
                .map_or(json!(10), |v| json!(v));
            o["spec"]["progressDeadlineSeconds"] = json!(600);
        }
        ("batch", "jobs") => {
            let spec = &mut o["spec"];
            for (k, v) in [("parallelism", 1), ("completions", 1), ("backoffLimit", 6)] {
                if spec[k].is_null() {
                    spec[k] = json!(v);
                }
            }
            if spec["selector"].is_null() {
                spec["selector"] =
                    json!({ "matchLabels": { "batch.kubernetes.io/controller-uid": uid } });
                for (k, v) in [
                    ("batch.kubernetes.io/controller-uid", &uid),
                    ("controller-uid", &uid),
                    ("batch.kubernetes.io/job-name", &name),
                    ("job-name", &name),
                ] {
                    spec["template"]["metadata"]["labels"][k] = json!(v);
                }
            }
            if spec["template"]["spec"]["restartPolicy"].is_null() {
                spec["template"]["spec"]["restartPolicy"] = json!("Never");
            }
            o["status"] = json!({ "startTime": now, "active": 0 });
        }
        ("apiextensions.k8s.io", "customresourcedefinitions") => {
            o["status"] = crd_status(o, now);
        }
        _ => {}
    }
}

fn crd_status(crd: &Value, now: &str) -> Value {
    let stored: Vec<Value> = crd["spec"]["versions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|v| v["storage"].as_bool() == Some(true))
        .filter_map(|v| v["name"].as_str().map(|n| json!(n)))
        .collect();
    json!({
        "acceptedNames": crd["spec"]["names"],
        "storedVersions": stored,
        "conditions": [
            { "type": "NamesAccepted", "status": "True", "reason": "NoConflicts", "message": "no conflicts found", "lastTransitionTime": now },
            { "type": "Established", "status": "True", "reason": "InitialNamesAccepted", "message": "the initial names have been accepted", "lastTransitionTime": now },
        ],
    })
}

/// What goes with a deleted object at once: a namespace's content, a CRD's objects.
pub fn cascade(store: &mut Store, res: &Resource, key: &Key) {
    let victims: Vec<Key> = if res.gr() == "/namespaces" {
        store.keys().filter(|k| k.ns == key.name).cloned().collect()
    } else if res.gr() == CRD_GR {
        let Some((plural, group)) = key.name.split_once('.') else {
            return;
        };
        let gr = format!("{group}/{plural}");
        store.keys().filter(|k| k.gr == gr).cloned().collect()
    } else {
        return;
    };
    for k in victims {
        store.remove(&k);
    }
}

pub async fn run(world: Shared, cluster: String, mut stopped: watch::Receiver<()>) {
    let mut tick = tokio::time::interval(super::TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stopped.changed() => return,
            _ = tick.tick() => {
                let mut w = world.lock().await;
                reconcile(&mut w, &cluster);
            }
        }
    }
}

/// Resources one node offers: GPUs, EFA interfaces, vCPUs, memory (GiB).
fn capacity(instance_type: &str) -> (u32, u32, u32, u32) {
    let t = instance_type.trim_start_matches("ml.");
    match t {
        "p5.48xlarge" | "p5e.48xlarge" => (8, 32, 192, 2048),
        "p5en.48xlarge" => (8, 16, 192, 2048),
        "p6-b200.48xlarge" | "p6-b300.48xlarge" => (8, 8, 192, 2048),
        "p4d.24xlarge" | "p4de.24xlarge" => (8, 4, 96, 1152),
        "g6e.48xlarge" => (8, 4, 192, 1536),
        "g6e.24xlarge" => (4, 2, 96, 768),
        "g6e.12xlarge" => (4, 1, 48, 384),
        "g5.48xlarge" | "g6.48xlarge" => (8, 1, 192, 768),
        "g5.24xlarge" | "g6.24xlarge" => (4, 1, 96, 384),
        "g5.12xlarge" | "g6.12xlarge" => (4, 1, 48, 192),
        "g5.8xlarge" | "g6.8xlarge" => (1, 1, 32, 128),
        "trn1.32xlarge" | "trn1n.32xlarge" => (0, 8, 128, 512),
        _ => {
            let gpus = u32::from(t.starts_with('g') || t.starts_with('p'));
            let size = t.split('.').nth(1).unwrap_or("xlarge");
            let vcpu = match size {
                "medium" => 2,
                "large" => 2,
                "xlarge" => 4,
                s => s
                    .trim_end_matches("xlarge")
                    .parse::<u32>()
                    .map_or(8, |n| n * 4),
            };
            let ratio = if t.starts_with('c') {
                2
            } else if t.starts_with('r') {
                8
            } else {
                4
            };
            (gpus, 0, vcpu, vcpu * ratio)
        }
    }
}

fn nodes(w: &mut World, cluster: &str) {
    let instances = w.hyperpod_instances(cluster);
    let version = w
        .kube_cluster(cluster)
        .map(|c| c.version.clone())
        .unwrap_or_default();
    let epoch = |t: f64| w.clock.epoch(t);
    let wanted: Vec<(String, Value)> = instances
        .iter()
        .filter(|i| i.status != "Pending")
        .map(|i| {
            let name = format!("hyperpod-{}", i.id);
            let (gpu, efa, cpu, mem) = capacity(&i.instance_type);
            let healthy = i.status == "Running";
            let booted = rfc3339(epoch(i.launched + crate::sagemaker::NODE_BOOT_SECS));
            let h = fnv(&i.id);
            let mut resources = json!({ "cpu": cpu.to_string(), "memory": format!("{mem}Gi"), "pods": "110", "ephemeral-storage": "500Gi" });
            if gpu > 0 {
                resources["nvidia.com/gpu"] = json!(gpu.to_string());
            }
            if efa > 0 {
                resources["vpc.amazonaws.com/efa"] = json!(efa.to_string());
            }
            let mut node = json!({
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": name,
                    "uid": format!("5157d000-0000-4000-9000-{:012x}", h & 0xffff_ffff_ffff),
                    "creationTimestamp": booted,
                    "labels": {
                        "kubernetes.io/hostname": name,
                        "kubernetes.io/os": "linux",
                        "kubernetes.io/arch": "amd64",
                        "node.kubernetes.io/instance-type": i.instance_type,
                        "beta.kubernetes.io/instance-type": i.instance_type,
                        "sagemaker.amazonaws.com/compute-type": "hyperpod",
                        "sagemaker.amazonaws.com/cluster-name": i.cluster,
                        "sagemaker.amazonaws.com/instance-group-name": i.group,
                        "sagemaker.amazonaws.com/node-health-status": if healthy { "Schedulable" } else { "Unschedulable" },
                        "sagemaker.amazonaws.com/deep-health-check-status": if healthy { "Passed" } else { "InProgress" },
                    },
                },
                "spec": { "providerID": format!("aws:///us-east-1a/sagemaker/cluster/{}-{}", i.cluster, i.id) },
                "status": {
                    "capacity": resources,
                    "allocatable": resources,
                    "conditions": [{ "type": "Ready", "status": "True", "reason": "KubeletReady",
                                     "message": "kubelet is posting ready status", "lastHeartbeatTime": booted, "lastTransitionTime": booted }],
                    "addresses": [{ "type": "InternalIP", "address": format!("10.1.{}.{}", (h >> 8) % 250, h % 250 + 2) },
                                  { "type": "Hostname", "address": name }],
                    "nodeInfo": { "kubeletVersion": format!("v{version}.0-eks"), "containerRuntimeVersion": "containerd://1.7.27",
                                  "osImage": "Amazon Linux 2023", "architecture": "amd64", "operatingSystem": "linux",
                                  "kernelVersion": "6.1.0", "machineID": i.id, "systemUUID": i.id, "bootID": i.id },
                },
            });
            if !healthy {
                node["spec"]["taints"] = json!([{ "key": "sagemaker.amazonaws.com/node-health-status", "value": "Unschedulable", "effect": "NoSchedule" }]);
            }
            (name, node)
        })
        .collect();
    let Some(c) = w.kube_cluster(cluster) else {
        return;
    };
    let store = &mut c.store;
    let names: BTreeSet<&String> = wanted.iter().map(|(n, _)| n).collect();
    let stale: Vec<Key> = store
        .list("/nodes", None)
        .filter(|n| n["metadata"]["labels"]["sagemaker.amazonaws.com/compute-type"] == "hyperpod")
        .map(|n| meta(n, "name"))
        .filter(|n| !names.contains(n))
        .map(|n| Key::new("/nodes", "", &n))
        .collect();
    for k in stale {
        store.remove(&k);
    }
    for (name, mut node) in wanted {
        let key = Key::new("/nodes", "", &name);
        if let Some(old) = store.get(&key) {
            // Labels and taints set by users stay; the instance's own labels win.
            if let Some(extra) = old["metadata"]["labels"].as_object() {
                for (k, v) in extra {
                    if node["metadata"]["labels"].get(k).is_none() {
                        node["metadata"]["labels"][k] = v.clone();
                    }
                }
            }
            if let Some(m) = old["metadata"].get("managedFields") {
                node["metadata"]["managedFields"] = m.clone();
            }
            // A cordon (kubectl cordon/drain) and users' taints survive the next tick.
            if old["spec"]["unschedulable"] == Value::Bool(true) {
                node["spec"]["unschedulable"] = json!(true);
            }
            let ours = "sagemaker.amazonaws.com/node-health-status";
            let theirs: Vec<Value> = old["spec"]["taints"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|t| t["key"] != ours && t["key"] != "node.kubernetes.io/unschedulable")
                .cloned()
                .collect();
            if !theirs.is_empty() {
                let mut taints = node["spec"]["taints"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default();
                taints.extend(theirs);
                node["spec"]["taints"] = json!(taints);
            }
        }
        upsert(store, key, node);
    }
}

/// The workloads an EKS add-on runs: namespace, kind, name, replicas (DaemonSets: 0).
fn addon_workloads(addon: &str) -> &'static [(&'static str, &'static str, &'static str, u32)] {
    match addon {
        "coredns" => &[("kube-system", "Deployment", "coredns", 2)],
        "kube-proxy" => &[("kube-system", "DaemonSet", "kube-proxy", 0)],
        "vpc-cni" => &[("kube-system", "DaemonSet", "aws-node", 0)],
        "eks-pod-identity-agent" => &[("kube-system", "DaemonSet", "eks-pod-identity-agent", 0)],
        "metrics-server" => &[("kube-system", "Deployment", "metrics-server", 2)],
        "aws-mountpoint-s3-csi-driver" => &[
            ("kube-system", "DaemonSet", "s3-csi-node", 0),
            ("kube-system", "Deployment", "s3-csi-controller", 1),
        ],
        "aws-fsx-csi-driver" => &[
            ("kube-system", "DaemonSet", "fsx-csi-node", 0),
            ("kube-system", "Deployment", "fsx-csi-controller", 2),
        ],
        "cert-manager" => &[
            ("cert-manager", "Deployment", "cert-manager", 1),
            ("cert-manager", "Deployment", "cert-manager-cainjector", 1),
            ("cert-manager", "Deployment", "cert-manager-webhook", 1),
        ],
        "amazon-cloudwatch-observability" => &[
            ("amazon-cloudwatch", "DaemonSet", "cloudwatch-agent", 0),
            (
                "amazon-cloudwatch",
                "Deployment",
                "amazon-cloudwatch-observability-controller-manager",
                1,
            ),
        ],
        TRAINING_OPERATOR => &[(
            "aws-hyperpod",
            "Deployment",
            "hp-training-operator-hp-training-controller-manager",
            1,
        )],
        "amazon-sagemaker-hyperpod-inference" => &[(
            "hyperpod-inference-system",
            "Deployment",
            "hyperpod-inference-operator-controller-manager",
            1,
        )],
        "amazon-sagemaker-hyperpod-taskgovernance" => {
            &[("kueue-system", "Deployment", "kueue-controller-manager", 1)]
        }
        _ => &[],
    }
}

const ADDON_LABEL: &str = "eks.amazonaws.com/addon";

fn addons(w: &mut World, cluster: &str, now: &str) {
    let active = w.eks_active_addons(cluster);
    let Some(c) = w.kube_cluster(cluster) else {
        return;
    };
    let store = &mut c.store;
    let mut wanted = BTreeSet::new();
    for addon in &active {
        for (ns, kind, name, replicas) in addon_workloads(addon) {
            let (gr, api) = if *kind == "Deployment" {
                ("apps/deployments", "apps/v1")
            } else {
                ("apps/daemonsets", "apps/v1")
            };
            wanted.insert(Key::new(gr, ns, name));
            let ns_key = Key::new("/namespaces", "", ns);
            if store.get(&ns_key).is_none() {
                let mut o = object(store, "v1", "Namespace", "", ns, now);
                o["metadata"]["labels"] = json!({ "kubernetes.io/metadata.name": ns });
                o["spec"] = json!({ "finalizers": ["kubernetes"] });
                o["status"] = json!({ "phase": "Active" });
                store.put(ns_key, o);
            }
            let key = Key::new(gr, ns, name);
            if store.get(&key).is_some() {
                continue;
            }
            let mut o = object(store, api, kind, ns, name, now);
            let labels = json!({ "app.kubernetes.io/name": name, "app.kubernetes.io/managed-by": "EKS", ADDON_LABEL: addon });
            o["metadata"]["labels"] = labels.clone();
            let mut template_spec = json!({ "containers": [{ "name": name, "image": format!("602401143452.dkr.ecr.us-east-1.amazonaws.com/eks/{name}:latest"),
                "resources": { "requests": { "cpu": "100m", "memory": "128Mi" } } }] });
            if *kind == "DaemonSet" {
                template_spec["tolerations"] = json!([{ "operator": "Exists" }]);
            }
            o["spec"] = json!({
                "selector": { "matchLabels": { "app.kubernetes.io/name": name } },
                "template": { "metadata": { "labels": labels }, "spec": template_spec },
            });
            if *kind == "Deployment" {
                o["spec"]["replicas"] = json!(replicas);
            }
            store.put(key, o);
        }
        if addon == TRAINING_OPERATOR {
            let key = Key::new(CRD_GR, "", "hyperpodpytorchjobs.sagemaker.amazonaws.com");
            if store.get(&key).is_none()
                && let Ok(mut crd) = serde_yaml::from_str::<Value>(PYTORCHJOB_CRD)
            {
                crd["metadata"]["uid"] = json!(store.uid());
                crd["metadata"]["creationTimestamp"] = json!(now);
                crd["metadata"]["labels"][ADDON_LABEL] = json!(addon);
                crd["status"] = crd_status(&crd, now);
                store.put(key, crd);
            }
        }
    }
    let stale: Vec<Key> = store
        .keys()
        .filter(|k| k.gr == "apps/deployments" || k.gr == "apps/daemonsets")
        .filter(|k| !wanted.contains(k))
        .filter(|k| {
            store
                .get(k)
                .is_some_and(|o| o["metadata"]["labels"][ADDON_LABEL].is_string())
        })
        .cloned()
        .collect();
    for k in stale {
        store.remove(&k);
    }
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

fn owned_by<'a>(
    store: &'a Store,
    gr: &'a str,
    ns: &'a str,
    owner_uid: &'a str,
) -> impl Iterator<Item = &'a super::store::Obj> {
    store.list(gr, Some(ns)).filter(move |o| {
        o["metadata"]["ownerReferences"]
            .as_array()
            .is_some_and(|refs| refs.iter().any(|r| r["uid"].as_str() == Some(owner_uid)))
    })
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
    if pod["spec"]["restartPolicy"].is_null() {
        pod["spec"]["restartPolicy"] = json!("Always");
    }
    pod["spec"]["schedulerName"] = json!("default-scheduler");
    pod["status"] = json!({ "phase": "Pending", "qosClass": "BestEffort" });
    (Key::new("/pods", &ns, name), pod)
}

fn is_terminal(pod: &Value) -> bool {
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

fn template_hash(template: &Value) -> String {
    format!("{:010x}", fnv(&template.to_string()) & 0xff_ffff_ffff)
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

fn deployments(store: &mut Store, now: &str) {
    let deploys: Vec<Value> = store
        .list("apps/deployments", None)
        .map(|d| (**d).clone())
        .collect();
    for d in deploys {
        let ns = meta(&d, "namespace");
        let uid = meta(&d, "uid");
        if d["metadata"]["deletionTimestamp"].is_string() {
            continue;
        }
        let replicas = d["spec"]["replicas"].as_u64().unwrap_or(1);
        let hash = template_hash(&d["spec"]["template"]);
        let rs_name = format!("{}-{}", meta(&d, "name"), &hash[..10]);
        let owned: Vec<Value> = owned_by(store, "apps/replicasets", &ns, &uid)
            .map(|r| (**r).clone())
            .collect();
        for rs in &owned {
            if meta(rs, "name") != rs_name && rs["spec"]["replicas"].as_u64() != Some(0) {
                let mut rs = rs.clone();
                rs["spec"]["replicas"] = json!(0);
                let key = Key::new("apps/replicasets", &ns, &meta(&rs, "name"));
                upsert(store, key, rs);
            }
        }
        let key = Key::new("apps/replicasets", &ns, &rs_name);
        let mut rs = match store.get(&key) {
            Some(rs) => (**rs).clone(),
            None => {
                let mut rs = object(store, "apps/v1", "ReplicaSet", &ns, &rs_name, now);
                let mut labels = d["spec"]["template"]["metadata"]["labels"].clone();
                labels["pod-template-hash"] = json!(hash);
                rs["metadata"]["labels"] = labels.clone();
                rs["metadata"]["ownerReferences"] = owner_ref(&d);
                let mut template = d["spec"]["template"].clone();
                template["metadata"]["labels"] = labels;
                let mut selector = d["spec"]["selector"].clone();
                selector["matchLabels"]["pod-template-hash"] = json!(hash);
                rs["spec"] =
                    json!({ "replicas": replicas, "selector": selector, "template": template });
                rs
            }
        };
        rs["spec"]["replicas"] = json!(replicas);
        upsert(store, key, rs);
        let rs_all: Vec<Value> = owned_by(store, "apps/replicasets", &ns, &uid)
            .map(|r| (**r).clone())
            .collect();
        let mut total = 0;
        let mut updated = 0;
        let mut ready = 0;
        for rs in &rs_all {
            let pods: Vec<Value> = owned_by(store, "/pods", &ns, &meta(rs, "uid"))
                .map(|p| (**p).clone())
                .collect();
            total += pods.len() as u64;
            ready += pods.iter().filter(|p| is_ready(p)).count() as u64;
            if meta(rs, "name") == rs_name {
                updated += pods.len() as u64;
            }
        }
        let old = &d["status"];
        let max_unavailable = replicas / 4;
        let available = ready + max_unavailable >= replicas;
        let complete = updated == replicas && ready == replicas && total == replicas;
        let mut status = json!({
            "observedGeneration": d["metadata"]["generation"],
            "replicas": total,
            "updatedReplicas": updated,
            "readyReplicas": ready,
            "availableReplicas": ready,
            "conditions": [
                condition(old, "Available", available,
                    if available { "MinimumReplicasAvailable" } else { "MinimumReplicasUnavailable" },
                    if available { "Deployment has minimum availability." } else { "Deployment does not have minimum availability." }, now),
                condition(old, "Progressing", true,
                    if complete { "NewReplicaSetAvailable" } else { "ReplicaSetUpdated" },
                    &format!("ReplicaSet \"{rs_name}\" {}", if complete { "has successfully progressed." } else { "is progressing." }), now),
            ],
        });
        if total > ready {
            status["unavailableReplicas"] = json!(total - ready);
        }
        let mut d = d.clone();
        d["status"] = status;
        upsert(
            store,
            Key::new("apps/deployments", &ns, &meta(&d, "name")),
            d,
        );
    }
}

fn short_suffix(store: &mut Store) -> String {
    let uid = store.uid();
    let mut n = fnv(&uid);
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    (0..5)
        .map(|_| {
            let c = ALPHABET[(n % ALPHABET.len() as u64) as usize] as char;
            n /= ALPHABET.len() as u64;
            c
        })
        .collect()
}

fn replicasets(store: &mut Store, now: &str) {
    let sets: Vec<Value> = store
        .list("apps/replicasets", None)
        .map(|r| (**r).clone())
        .collect();
    for rs in sets {
        let ns = meta(&rs, "namespace");
        let uid = meta(&rs, "uid");
        let want = rs["spec"]["replicas"].as_u64().unwrap_or(1) as usize;
        let pods: Vec<Value> = owned_by(store, "/pods", &ns, &uid)
            .map(|p| (**p).clone())
            .collect();
        let live: Vec<&Value> = pods.iter().filter(|p| !is_terminal(p)).collect();
        if live.len() > want {
            // Not-ready pods go first, then the newest.
            let mut order: Vec<&Value> = live.clone();
            order.sort_by_key(|p| (is_ready(p), std::cmp::Reverse(meta(p, "creationTimestamp"))));
            for p in order.iter().take(live.len() - want) {
                store.remove(&Key::new("/pods", &ns, &meta(p, "name")));
            }
        }
        for _ in live.len()..want {
            let name = format!("{}-{}", meta(&rs, "name"), short_suffix(store));
            let (key, pod) = pod_from(
                store,
                &rs,
                &rs["spec"]["template"],
                &name,
                &Value::Null,
                now,
            );
            store.put(key, pod);
        }
        let pods: Vec<Value> = owned_by(store, "/pods", &ns, &uid)
            .map(|p| (**p).clone())
            .collect();
        let ready = pods.iter().filter(|p| is_ready(p)).count();
        let mut rs = rs.clone();
        rs["status"] = json!({ "replicas": pods.len(), "fullyLabeledReplicas": pods.len(), "readyReplicas": ready,
                               "availableReplicas": ready, "observedGeneration": rs["metadata"]["generation"] });
        upsert(
            store,
            Key::new("apps/replicasets", &ns, &meta(&rs, "name")),
            rs,
        );
    }
}

fn daemonsets(store: &mut Store, now: &str) {
    let nodes: Vec<Value> = store
        .list("/nodes", None)
        .filter(|n| node_ready(n))
        .map(|n| (**n).clone())
        .collect();
    let sets: Vec<Value> = store
        .list("apps/daemonsets", None)
        .map(|d| (**d).clone())
        .collect();
    for ds in sets {
        let ns = meta(&ds, "namespace");
        let uid = meta(&ds, "uid");
        let targets: Vec<&Value> = nodes
            .iter()
            .filter(|n| {
                selector_matches(
                    &ds["spec"]["template"]["spec"]["nodeSelector"],
                    &n["metadata"]["labels"],
                )
            })
            .collect();
        let pods: Vec<Value> = owned_by(store, "/pods", &ns, &uid)
            .map(|p| (**p).clone())
            .collect();
        for p in &pods {
            let on = p["spec"]["nodeName"].as_str().unwrap_or_default();
            if !targets.iter().any(|n| meta(n, "name") == on) {
                store.remove(&Key::new("/pods", &ns, &meta(p, "name")));
            }
        }
        for n in &targets {
            let node = meta(n, "name");
            if pods
                .iter()
                .any(|p| p["spec"]["nodeName"].as_str() == Some(&node))
            {
                continue;
            }
            let name = format!("{}-{}", meta(&ds, "name"), short_suffix(store));
            let (key, mut pod) = pod_from(
                store,
                &ds,
                &ds["spec"]["template"],
                &name,
                &Value::Null,
                now,
            );
            pod["spec"]["nodeName"] = json!(node);
            pod["status"]["conditions"] =
                json!([{ "type": "PodScheduled", "status": "True", "lastTransitionTime": now }]);
            store.put(key, pod);
        }
        let pods: Vec<Value> = owned_by(store, "/pods", &ns, &uid)
            .map(|p| (**p).clone())
            .collect();
        let ready = pods.iter().filter(|p| is_ready(p)).count();
        let mut ds = ds.clone();
        ds["status"] = json!({ "desiredNumberScheduled": targets.len(), "currentNumberScheduled": pods.len(),
            "numberReady": ready, "numberAvailable": ready, "updatedNumberScheduled": pods.len(),
            "numberMisscheduled": 0, "observedGeneration": ds["metadata"]["generation"] });
        upsert(
            store,
            Key::new("apps/daemonsets", &ns, &meta(&ds, "name")),
            ds,
        );
    }
}

fn selector_matches(selector: &Value, labels: &Value) -> bool {
    selector
        .as_object()
        .is_none_or(|s| s.iter().all(|(k, v)| labels.get(k) == Some(v)))
}

fn node_ready(n: &Value) -> bool {
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

fn jobs(store: &mut Store, now: &str) {
    let all: Vec<Value> = store
        .list("batch/jobs", None)
        .map(|j| (**j).clone())
        .collect();
    for job in all {
        let ns = meta(&job, "namespace");
        let uid = meta(&job, "uid");
        let spec = &job["spec"];
        let completions = spec["completions"].as_u64().unwrap_or(1);
        let parallelism = spec["parallelism"].as_u64().unwrap_or(1);
        let backoff = spec["backoffLimit"].as_u64().unwrap_or(6);
        let pods: Vec<Value> = owned_by(store, "/pods", &ns, &uid)
            .map(|p| (**p).clone())
            .collect();
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
                let name = format!("{}-{}", meta(&job, "name"), short_suffix(store));
                let labels = json!({ "job-name": meta(&job, "name"), "batch.kubernetes.io/job-name": meta(&job, "name"),
                                     "controller-uid": uid, "batch.kubernetes.io/controller-uid": uid });
                let (key, pod) = pod_from(store, &job, &spec["template"], &name, &labels, now);
                store.put(key, pod);
            }
        }
        let pods: Vec<Value> = owned_by(store, "/pods", &ns, &uid)
            .map(|p| (**p).clone())
            .collect();
        let ready = pods.iter().filter(|p| is_ready(p)).count();
        let old = &job["status"];
        let mut status = json!({
            "startTime": old["startTime"].as_str().map_or_else(|| json!(meta(&job, "creationTimestamp")), |s| json!(s)),
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

/// RayJob (KubeRay's K8sJobMode): a Ray cluster (head + worker pods) and, once the head
/// runs, a submitter Job whose pod runs the entrypoint; the Job decides the outcome.
fn rayjobs(store: &mut Store, now: &str) {
    let all: Vec<Value> = store
        .list("ray.io/rayjobs", None)
        .map(|j| (**j).clone())
        .collect();
    for rj in all {
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
            "startTime": status["startTime"].as_str().map_or_else(|| json!(meta(&rj, "creationTimestamp")), |s| json!(s)),
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

const PYTORCHJOB_GR: &str = "sagemaker.amazonaws.com/hyperpodpytorchjobs";

/// HyperPodPyTorchJob: `replicas` pods per replica spec, launched together; the job
/// completes when every pod has succeeded and fails when one fails.
fn pytorchjobs(store: &mut Store, now: &str) {
    let all: Vec<Value> = store
        .list(PYTORCHJOB_GR, None)
        .map(|j| (**j).clone())
        .collect();
    for job in all {
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
        let pods: Vec<Value> = owned_by(store, "/pods", &ns, &uid)
            .map(|p| (**p).clone())
            .collect();
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
        let mut status = json!({ "startTime": old["startTime"].as_str().map_or_else(|| json!(meta(&job, "creationTimestamp")), |s| json!(s)), "restartCount": 0 });
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

/// A quantity in milli-units (`"500m"`, `"2"`), for CPU; integers for devices.
fn milli(q: &Value) -> u64 {
    let s = match q {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        _ => return 0,
    };
    match s.strip_suffix('m') {
        Some(m) => m.parse().unwrap_or(0),
        None => s.parse::<f64>().map(|f| (f * 1000.0) as u64).unwrap_or(0),
    }
}

const RESOURCES: [&str; 3] = ["nvidia.com/gpu", "vpc.amazonaws.com/efa", "cpu"];

fn requests(pod: &Value) -> [u64; 3] {
    let mut out = [0; 3];
    for c in pod["spec"]["containers"].as_array().into_iter().flatten() {
        for (i, r) in RESOURCES.iter().enumerate() {
            let q = &c["resources"]["requests"][*r];
            let q = if q.is_null() {
                &c["resources"]["limits"][*r]
            } else {
                q
            };
            out[i] += milli(q);
        }
    }
    out
}

fn tolerates(pod: &Value, node: &Value) -> bool {
    let tolerations = pod["spec"]["tolerations"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    node["spec"]["taints"]
        .as_array()
        .into_iter()
        .flatten()
        .all(|t| {
            t["effect"] != "NoSchedule"
                || tolerations.iter().any(|tol| {
                    (tol["key"].is_null() && tol["operator"] == "Exists")
                        || (tol["key"] == t["key"]
                            && (tol["operator"] == "Exists" || tol["value"] == t["value"]))
                })
        })
}

/// Binds pending pods to nodes with room for their GPU/EFA/CPU requests and moves bound
/// pods through their phases.
fn pods(store: &mut Store, epoch_now: f64, now: &str) {
    let nodes: Vec<Value> = store.list("/nodes", None).map(|n| (**n).clone()).collect();
    let mut used: BTreeMap<String, [u64; 3]> = BTreeMap::new();
    for p in store.list("/pods", None) {
        if let Some(n) = p["spec"]["nodeName"].as_str()
            && !is_terminal(p)
        {
            let r = requests(p);
            let u = used.entry(n.to_owned()).or_default();
            for i in 0..3 {
                u[i] += r[i];
            }
        }
    }
    let all: Vec<Value> = store.list("/pods", None).map(|p| (**p).clone()).collect();
    for mut pod in all {
        let ns = meta(&pod, "namespace");
        let name = meta(&pod, "name");
        let key = Key::new("/pods", &ns, &name);
        if pod["metadata"]["deletionTimestamp"].is_string() || is_terminal(&pod) {
            continue;
        }
        if pod["spec"]["nodeName"].is_null() {
            let need = requests(&pod);
            let mut reasons: BTreeMap<String, usize> = BTreeMap::new();
            let mut chosen = None;
            for n in &nodes {
                let node = meta(n, "name");
                if !node_ready(n) {
                    *reasons.entry("node(s) were not ready".into()).or_default() += 1;
                    continue;
                }
                if n["spec"]["unschedulable"] == Value::Bool(true) {
                    *reasons
                        .entry("node(s) were unschedulable".into())
                        .or_default() += 1;
                    continue;
                }
                if !selector_matches(&pod["spec"]["nodeSelector"], &n["metadata"]["labels"]) {
                    *reasons
                        .entry("node(s) didn't match Pod's node affinity/selector".into())
                        .or_default() += 1;
                    continue;
                }
                if !tolerates(&pod, n) {
                    *reasons
                        .entry("node(s) had untolerated taint(s)".into())
                        .or_default() += 1;
                    continue;
                }
                let u = used.get(&node).copied().unwrap_or_default();
                let mut fits = true;
                for (i, r) in RESOURCES.iter().enumerate() {
                    let have = milli(&n["status"]["allocatable"][*r]);
                    if need[i] > 0 && u[i] + need[i] > have {
                        fits = false;
                        *reasons.entry(format!("Insufficient {r}")).or_default() += 1;
                    }
                }
                if fits {
                    chosen = Some(node);
                    break;
                }
            }
            match chosen {
                Some(node) => {
                    let u = used.entry(node.clone()).or_default();
                    for i in 0..3 {
                        u[i] += need[i];
                    }
                    pod["spec"]["nodeName"] = json!(node);
                    pod["status"]["conditions"] = json!([{ "type": "PodScheduled", "status": "True", "lastTransitionTime": now }]);
                }
                None => {
                    let detail: Vec<String> =
                        reasons.iter().map(|(r, n)| format!("{n} {r}")).collect();
                    let message = format!(
                        "0/{} nodes are available: {}.",
                        nodes.len(),
                        if detail.is_empty() {
                            "no nodes available to schedule pods".to_owned()
                        } else {
                            detail.join(", ")
                        }
                    );
                    let old = pod["status"]["conditions"][0].clone();
                    let since = if old["message"] == message.as_str() {
                        old["lastTransitionTime"].clone()
                    } else {
                        json!(now)
                    };
                    pod["status"]["conditions"] = json!([{ "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                                          "message": message, "lastTransitionTime": since }]);
                    upsert(store, key, pod);
                    continue;
                }
            }
        }
        advance(&mut pod, epoch_now, &nodes);
        upsert(store, key, pod);
    }
}

/// Sim seconds a pod's containers run before they exit, if they ever do.
pub fn run_seconds(pod: &Value) -> Option<f64> {
    let restart = pod["spec"]["restartPolicy"].as_str().unwrap_or("Always");
    pod["metadata"]["annotations"][RUN_ANNOTATION]
        .as_str()
        .and_then(|s| s.parse::<f64>().ok())
        .or((restart != "Always").then_some(DEFAULT_RUN_SECS))
}

/// A bound pod's status at sim time `now` from when it was scheduled.
fn advance(pod: &mut Value, now: f64, nodes: &[Value]) {
    let scheduled = pod["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == "PodScheduled"))
        .and_then(|c| c["lastTransitionTime"].as_str())
        .and_then(parse_rfc3339)
        .unwrap_or(now);
    let start = scheduled + START_SECS;
    let annotations = &pod["metadata"]["annotations"];
    let run = run_seconds(pod);
    let exit: i64 = annotations[EXIT_ANNOTATION]
        .as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let node = pod["spec"]["nodeName"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let host_ip = nodes
        .iter()
        .find(|n| n["metadata"]["name"] == node.as_str())
        .and_then(|n| n["status"]["addresses"][0]["address"].as_str())
        .unwrap_or("10.1.0.1")
        .to_owned();
    let h = fnv(&meta(pod, "uid"));
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
    let (phase, state, ready) = if now < start {
        (
            "Pending",
            json!({ "waiting": { "reason": "ContainerCreating" } }),
            false,
        )
    } else if let Some(run) = run.filter(|r| now >= start + r) {
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
            true,
        )
    };
    let statuses: Vec<Value> = containers
        .iter()
        .map(|(name, image)| {
            json!({ "name": name, "image": image, "imageID": "", "ready": ready, "restartCount": 0,
                    "started": state.get("running").is_some(), "state": state,
                    "containerID": format!("containerd://{:016x}", h) })
        })
        .collect();
    let ready_since = if ready {
        ts(start)
    } else {
        scheduled_at.clone()
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
            { "type": "ContainersReady", "status": if ready { "True" } else { "False" }, "lastTransitionTime": ready_since },
            { "type": "Ready", "status": if ready { "True" } else { "False" }, "lastTransitionTime": ready_since },
        ],
        "containerStatuses": statuses,
    });
    if !started && let Some(s) = pod["status"].as_object_mut() {
        s.remove("podIP");
    }
}

fn services(store: &mut Store, epoch_now: f64, region: &str) {
    let all: Vec<Value> = store
        .list("/services", None)
        .filter(|s| s["spec"]["type"] == "LoadBalancer")
        .map(|s| (**s).clone())
        .collect();
    for mut svc in all {
        let created = parse_rfc3339(&meta(&svc, "creationTimestamp")).unwrap_or(epoch_now);
        if epoch_now < created + LB_SECS {
            continue;
        }
        let ns = meta(&svc, "namespace");
        let name = meta(&svc, "name");
        let h = fnv(&meta(&svc, "uid"));
        let short = |s: &str| s.chars().take(9).collect::<String>();
        let hostname = format!(
            "k8s-{}-{}-{:010x}.elb.{region}.amazonaws.com",
            short(&ns),
            short(&name),
            h & 0xff_ffff_ffff
        );
        svc["status"]["loadBalancer"] = json!({ "ingress": [{ "hostname": hostname }] });
        upsert(store, Key::new("/services", &ns, &name), svc);
    }
}

fn quantity_gi(q: &Value) -> f64 {
    let s = q.as_str().unwrap_or_default();
    let (num, unit) = s.split_at(s.find(|c: char| c.is_alphabetic()).unwrap_or(s.len()));
    let n: f64 = num.parse().unwrap_or(0.0);
    n * match unit {
        "Ki" => 1.0 / (1024.0 * 1024.0),
        "Mi" => 1.0 / 1024.0,
        "Gi" => 1.0,
        "Ti" => 1024.0,
        "Pi" => 1024.0 * 1024.0,
        "G" => 1e9 / 1024f64.powi(3),
        "T" => 1e12 / 1024f64.powi(3),
        "M" => 1e6 / 1024f64.powi(3),
        _ => 1.0 / 1024f64.powi(3),
    }
}

fn claims(store: &mut Store) {
    let pending: Vec<Value> = store
        .list("/persistentvolumeclaims", None)
        .filter(|c| c["status"]["phase"] != "Bound")
        .map(|c| (**c).clone())
        .collect();
    for mut pvc in pending {
        let class = pvc["spec"]["storageClassName"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let want = quantity_gi(&pvc["spec"]["resources"]["requests"]["storage"]);
        let modes: Vec<Value> = pvc["spec"]["accessModes"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let named = pvc["spec"]["volumeName"].as_str().map(str::to_owned);
        let ns = meta(&pvc, "namespace");
        let name = meta(&pvc, "name");
        // A volume is free, or reserved for this very claim by a claimRef naming it (how
        // static provisioning pre-binds a volume to the claim it was made for).
        let free_for_us = |pv: &Value| {
            let r = &pv["spec"]["claimRef"];
            r.is_null()
                || (r["namespace"] == ns.as_str()
                    && r["name"] == name.as_str()
                    && (r["uid"].is_null() || r["uid"] == pvc["metadata"]["uid"]))
        };
        let pv = store
            .list("/persistentvolumes", None)
            .filter(|pv| pv["status"]["phase"] == "Available" && free_for_us(pv))
            .filter(|pv| named.as_ref().is_none_or(|n| meta(pv, "name") == *n))
            .filter(|pv| {
                named.is_some()
                    || pv["spec"]["storageClassName"].as_str().unwrap_or_default() == class
            })
            .filter(|pv| quantity_gi(&pv["spec"]["capacity"]["storage"]) >= want)
            .find(|pv| {
                let have = pv["spec"]["accessModes"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default();
                modes.iter().all(|m| have.contains(m))
            })
            .map(|pv| (**pv).clone());
        let Some(mut pv) = pv else {
            continue;
        };
        pv["spec"]["claimRef"] = json!({ "kind": "PersistentVolumeClaim", "namespace": ns, "name": name,
                                         "uid": meta(&pvc, "uid"), "apiVersion": "v1" });
        pv["status"] = json!({ "phase": "Bound" });
        pvc["spec"]["volumeName"] = json!(meta(&pv, "name"));
        pvc["status"] = json!({ "phase": "Bound", "accessModes": pv["spec"]["accessModes"], "capacity": pv["spec"]["capacity"] });
        upsert(
            store,
            Key::new("/persistentvolumes", "", &meta(&pv, "name")),
            pv,
        );
        upsert(store, Key::new("/persistentvolumeclaims", &ns, &name), pvc);
    }
}

/// Removes children whose controller is gone (background cascading deletion).
fn collect_garbage(store: &mut Store) {
    const OWNERS: &[(&str, &str)] = &[
        ("Deployment", "apps/deployments"),
        ("ReplicaSet", "apps/replicasets"),
        ("DaemonSet", "apps/daemonsets"),
        ("StatefulSet", "apps/statefulsets"),
        ("Job", "batch/jobs"),
        ("RayJob", "ray.io/rayjobs"),
        ("HyperPodPyTorchJob", PYTORCHJOB_GR),
    ];
    let mut orphans = Vec::new();
    for gr in ["apps/replicasets", "/pods", "batch/jobs"] {
        for o in store.list(gr, None) {
            let Some(owner) = o["metadata"]["ownerReferences"]
                .as_array()
                .and_then(|refs| refs.iter().find(|r| r["controller"] == Value::Bool(true)))
            else {
                continue;
            };
            let Some((_, owner_gr)) = OWNERS.iter().find(|(k, _)| owner["kind"] == *k) else {
                continue;
            };
            let ns = meta(o, "namespace");
            let alive = store
                .get(&Key::new(
                    owner_gr,
                    &ns,
                    owner["name"].as_str().unwrap_or_default(),
                ))
                .is_some_and(|x| x["metadata"]["uid"] == owner["uid"]);
            if !alive {
                orphans.push(Key::new(gr, &ns, &meta(o, "name")));
            }
        }
    }
    for k in orphans {
        store.remove(&k);
    }
}

fn reconcile(w: &mut World, cluster: &str) {
    let epoch_now = w.clock.epoch(w.clock.now());
    let now = rfc3339(epoch_now);
    nodes(w, cluster);
    addons(w, cluster, &now);
    let Some(c) = w.kube_cluster(cluster) else {
        return;
    };
    let region = c.region.clone();
    let store = &mut c.store;
    collect_garbage(store);
    deployments(store, &now);
    replicasets(store, &now);
    daemonsets(store, &now);
    rayjobs(store, &now);
    pytorchjobs(store, &now);
    jobs(store, &now);
    pods(store, epoch_now, &now);
    services(store, epoch_now, &region);
    claims(store);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capacities_know_the_gpu_types() {
        assert_eq!(capacity("ml.p5.48xlarge"), (8, 32, 192, 2048));
        assert_eq!(capacity("ml.m5.2xlarge"), (0, 0, 8, 32));
        assert_eq!(capacity("ml.g5.xlarge").0, 1);
    }

    #[test]
    fn quantities_parse() {
        assert_eq!(milli(&json!("500m")), 500);
        assert_eq!(milli(&json!("2")), 2000);
        assert_eq!(milli(&json!(8)), 8000);
        assert!((quantity_gi(&json!("1Ti")) - 1024.0).abs() < 1e-9);
    }

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
        pods(&mut store, t0, "2026-01-01T00:00:00Z");
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
        pods(&mut store, t0, "2026-01-01T00:00:00Z");
        assert_eq!(store.rv(), rv, "nothing changed, nothing written");
        pods(&mut store, t0 + 6.0, "2026-01-01T00:00:06Z");
        assert_eq!(
            store.get(&Key::new("/pods", "default", "a")).unwrap()["status"]["phase"],
            "Running"
        );
        pods(&mut store, t0 + 16.0, "2026-01-01T00:00:16Z");
        assert_eq!(
            store.get(&Key::new("/pods", "default", "a")).unwrap()["status"]["phase"],
            "Succeeded"
        );
        pods(&mut store, t0 + 17.0, "2026-01-01T00:00:17Z");
        assert_eq!(
            store.get(&Key::new("/pods", "default", "b")).unwrap()["spec"]["nodeName"],
            "n1",
            "room freed by the finished pod"
        );
    }
}
