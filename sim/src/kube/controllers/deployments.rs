//! Deployments: one ReplicaSet per pod template (named by the template's hash), the old
//! ones scaled to zero, and the status kubectl's rollout status reads. Rollouts are
//! all-at-once: the new ReplicaSet gets every replica at once, so availability is judged
//! only against `maxUnavailable` (a quarter of the replicas).

use serde_json::{Value, json};

use super::{condition, is_ready, owned, owner_ref, snapshot, upsert};
use crate::kube::admission::object;
use crate::kube::store::{Key, Store, meta};
use crate::world::fnv1a;

fn template_hash(template: &Value) -> String {
    format!("{:010x}", fnv1a(&template.to_string()) & 0xff_ffff_ffff)
}

pub(super) fn deployments(store: &mut Store, now: &str) {
    for d in snapshot(store, "apps/deployments") {
        let ns = meta(&d, "namespace");
        let uid = meta(&d, "uid");
        if d["metadata"]["deletionTimestamp"].is_string() {
            continue;
        }
        let replicas = d["spec"]["replicas"].as_u64().unwrap_or(1);
        let hash = template_hash(&d["spec"]["template"]);
        let rs_name = format!("{}-{}", meta(&d, "name"), &hash[..10]);
        for mut rs in owned(store, "apps/replicasets", &ns, &uid) {
            if meta(&rs, "name") != rs_name && rs["spec"]["replicas"].as_u64() != Some(0) {
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
        let rs_all = owned(store, "apps/replicasets", &ns, &uid);
        let mut total = 0;
        let mut updated = 0;
        let mut ready = 0;
        for rs in &rs_all {
            let pods = owned(store, "/pods", &ns, &meta(rs, "uid"));
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
