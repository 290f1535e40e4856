//! What the API server itself writes, with no controller involved: the objects a new
//! cluster starts with, the defaults it fills in on create, a CRD's status, and what goes
//! at once with a deleted namespace or CRD. Unlike the controllers, which catch up in
//! their next pass, all of it happens inside the request (or the cluster start) that
//! causes it, so a client reads its own write with the defaults already in.

use serde_json::{Value, json};

use super::discovery::{CRD_GR, Resource};
use super::store::{Key, Store, meta};
use crate::world::fnv1a;

/// A new object with the metadata the API server would give it.
pub(super) fn object(
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

/// A namespace the cluster or an add-on brings, as if it had been created through the API.
pub(super) fn namespace(store: &mut Store, name: &str, now: &str) -> Value {
    let mut o = object(store, "v1", "Namespace", "", name, now);
    namespace_defaults(&mut o, name);
    o
}

fn namespace_defaults(o: &mut Value, name: &str) {
    o["metadata"]["labels"]["kubernetes.io/metadata.name"] = json!(name);
    o["spec"] = json!({ "finalizers": ["kubernetes"] });
    o["status"] = json!({ "phase": "Active" });
}

/// A new pod's defaults, also for the pods controllers make, which in Kubernetes pass
/// through the same admission.
pub(super) fn pod_defaults(o: &mut Value) {
    let spec = &mut o["spec"];
    if spec["restartPolicy"].is_null() {
        spec["restartPolicy"] = json!("Always");
    }
    spec["schedulerName"] = json!("default-scheduler");
    o["status"] = json!({ "phase": "Pending", "qosClass": "BestEffort" });
}

/// The namespaces and the `kubernetes` Service every new cluster has.
pub fn bootstrap(store: &mut Store, now: &str) {
    for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
        let o = namespace(store, ns, now);
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
        ("", "namespaces") => namespace_defaults(o, &name),
        ("", "pods") => pod_defaults(o),
        ("", "services") => {
            if o["spec"]["type"].is_null() {
                o["spec"]["type"] = json!("ClusterIP");
            }
            let h = fnv1a(&uid);
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

pub(super) fn crd_status(crd: &Value, now: &str) -> Value {
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
