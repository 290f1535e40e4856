//! Garbage collection: Deployments, ReplicaSets, Pods, Jobs, Services and
//! PersistentVolumeClaims whose controlling owner is gone (or was replaced by an object
//! of the same name with another UID) are removed, as background cascading deletion
//! does: in a pass after the owner's delete, not inside it, since Kubernetes' garbage
//! collector works apart from the API server. Children of owner kinds it does not know
//! are left alone.

use serde_json::Value;

use super::inference_endpoints::IEC_GR;
use super::jumpstart_models::JSM_GR;
use super::pytorchjobs::PYTORCHJOB_GR;
use crate::kube::store::{Key, Store, meta};

/// Removes children whose controller is gone (background cascading deletion).
pub(super) fn collect_garbage(store: &mut Store) {
    const OWNERS: &[(&str, &str)] = &[
        ("Deployment", "apps/deployments"),
        ("ReplicaSet", "apps/replicasets"),
        ("DaemonSet", "apps/daemonsets"),
        ("StatefulSet", "apps/statefulsets"),
        ("Job", "batch/jobs"),
        ("RayJob", "ray.io/rayjobs"),
        ("HyperPodPyTorchJob", PYTORCHJOB_GR),
        ("InferenceEndpointConfig", IEC_GR),
        ("JumpStartModel", JSM_GR),
    ];
    let mut orphans = Vec::new();
    for gr in [
        "apps/deployments",
        "apps/replicasets",
        "/pods",
        "batch/jobs",
        "/services",
        "/persistentvolumeclaims",
    ] {
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
