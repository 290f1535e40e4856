//! ReplicaSets: as many live pods as replicas, removing not-ready pods first and then the
//! newest, as the ReplicaSet controller does, so scaling down keeps the pods that serve.

use serde_json::{Value, json};

use super::{is_ready, is_terminal, owned, pod_from, snapshot, upsert};
use crate::kube::store::{Key, Store, meta};

pub(super) fn replicasets(store: &mut Store, now: &str) {
    for rs in snapshot(store, "apps/replicasets") {
        let ns = meta(&rs, "namespace");
        let uid = meta(&rs, "uid");
        let want = rs["spec"]["replicas"].as_u64().unwrap_or(1) as usize;
        let pods = owned(store, "/pods", &ns, &uid);
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
            let name = format!("{}-{}", meta(&rs, "name"), store.name_suffix());
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
        let pods = owned(store, "/pods", &ns, &uid);
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
