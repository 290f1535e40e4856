//! DaemonSets: one pod per ready node the template's nodeSelector matches, bound to its
//! node at creation (the DaemonSet controller places its pods itself, not through the
//! scheduler), and removed from nodes that no longer match.

use std::collections::BTreeSet;

use serde_json::{Value, json};

use super::{is_ready, node_ready, owned, pod_from, selector_matches, snapshot, upsert};
use crate::kube::store::{Key, Store, meta};

pub(super) fn daemonsets(store: &mut Store, now: &str) {
    let nodes: Vec<Value> = store
        .list("/nodes", None)
        .filter(|n| node_ready(n))
        .map(|n| (**n).clone())
        .collect();
    for ds in snapshot(store, "apps/daemonsets") {
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
        // Sets, not scans: a DaemonSet on a thousand nodes has a thousand pods. Ordered, so
        // pods are made in node order and a run repeats.
        let wanted: BTreeSet<&str> = targets
            .iter()
            .filter_map(|n| n["metadata"]["name"].as_str())
            .collect();
        let pods = owned(store, "/pods", &ns, &uid);
        let mut covered = BTreeSet::new();
        for p in &pods {
            let on = p["spec"]["nodeName"].as_str().unwrap_or_default();
            if wanted.contains(on) {
                covered.insert(on);
            } else {
                store.remove(&Key::new("/pods", &ns, &meta(p, "name")));
            }
        }
        for node in wanted.iter().filter(|n| !covered.contains(*n)) {
            let name = format!("{}-{}", meta(&ds, "name"), store.name_suffix());
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
        let pods = owned(store, "/pods", &ns, &uid);
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
