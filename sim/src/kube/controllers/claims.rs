//! PersistentVolumeClaims bind to an Available PersistentVolume of their class with room
//! and the access modes they ask for, or to the volume they name; there is no dynamic
//! provisioning, so a claim without a fitting volume stays Pending, as it would on a
//! cluster without a CSI provisioner for its class.

use serde_json::{Value, json};

use super::upsert;
use crate::kube::store::{Key, Store, meta};

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

pub(super) fn claims(store: &mut Store) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_parse() {
        assert!((quantity_gi(&json!("1Ti")) - 1024.0).abs() < 1e-9);
    }
}
