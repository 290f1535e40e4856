//! Nodes from HyperPod instances: one Node per instance past Pending, with the capacity of
//! its instance type, HyperPod's and its zone's labels, its group's `KubernetesConfig`
//! labels and taints, and a NoSchedule taint while it is not healthy or awaits a reboot
//! or replacement (a `node-health-status` label a user sets asks HyperPod for one). The instance is the
//! truth, so its own labels win on every pass and a label or taint its group drops leaves
//! the Node; what users added (labels, taints, annotations, a cordon from `kubectl
//! drain`) survives the next pass.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Value, json};

use super::upsert;
use crate::clock::Clock;
use crate::kube::store::{Key, Store, meta};
use crate::kube::time::rfc3339;
use crate::sagemaker::instance_types::InstanceType;
use crate::sagemaker::{Instance, Recovery};
use crate::world::fnv1a;

/// The group's labels and taints last put on a Node, so that the next pass can tell one
/// the group has since dropped (to remove) from one a user added (to keep).
const APPLIED: &str = "sim.hypd.dev/instance-group-kubernetes-config";

/// The taint HyperPod keeps on a Node while its instance is not healthy.
const HEALTH: &str = "sagemaker.amazonaws.com/node-health-status";

/// What a node of an instance type offers pods, from the same table HyperPod checks
/// requests against, so a group's Nodes have the GPUs and EFA interfaces its type has.
/// Allocatable equals capacity: the sim reserves nothing for the kubelet or the system.
fn resources(facts: &InstanceType) -> Value {
    let mut resources = json!({ "cpu": facts.vcpus.to_string(), "memory": format!("{}Gi", facts.memory_gib),
                                "pods": "110", "ephemeral-storage": "500Gi" });
    if facts.gpus > 0 {
        resources["nvidia.com/gpu"] = json!(facts.gpus.to_string());
    }
    if facts.efa_interfaces > 0 {
        resources["vpc.amazonaws.com/efa"] = json!(facts.efa_interfaces.to_string());
    }
    resources
}

/// Nodes a user labelled for reboot or replacement with kubectl: (HyperPod cluster,
/// instance id, recovery). A Node the sim itself marked carries the taint of the same
/// value, so its label is no fresh request.
pub(super) fn requested_recoveries(store: &Store) -> Vec<(String, String, Recovery)> {
    store
        .list("/nodes", None)
        .filter_map(|n| {
            let labels = &n["metadata"]["labels"];
            let value = labels[HEALTH].as_str()?;
            let recovery = Recovery::from_label(value)?;
            let marked = n["spec"]["taints"]
                .as_array()
                .is_some_and(|ts| ts.iter().any(|t| t["key"] == HEALTH && t["value"] == value));
            let id = meta(n, "name").strip_prefix("hyperpod-")?.to_owned();
            let hp = labels["sagemaker.amazonaws.com/cluster-name"].as_str()?;
            (!marked).then(|| (hp.to_owned(), id, recovery))
        })
        .collect()
}

/// The Nodes of `instances` (those past Pending), as a kubelet on each would register
/// them, with what users put on them since kept; Nodes of instances gone are removed.
/// `table` has the rows of the instances' types.
pub(super) fn nodes(
    store: &mut Store,
    instances: &[Instance],
    table: &BTreeMap<String, InstanceType>,
    version: &str,
    clock: &Clock,
) {
    let epoch = |t: f64| clock.epoch(t);
    let wanted: Vec<(String, Value)> = instances
        .iter()
        .filter(|i| i.status != "Pending")
        .filter_map(|i| Some((i, table.get(&i.instance_type)?)))
        .map(|(i, facts)| {
            let name = format!("hyperpod-{}", i.id);
            let healthy = i.status == "Running";
            let health = i.pending_recovery.unwrap_or(if healthy { "Schedulable" } else { "Unschedulable" });
            let booted = rfc3339(epoch(i.launched + crate::sagemaker::NODE_BOOT_SECS));
            let h = fnv1a(&i.id);
            let resources = resources(facts);
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
                        "sagemaker.amazonaws.com/node-health-status": health,
                        "sagemaker.amazonaws.com/deep-health-check-status": if healthy { "Passed" } else { "InProgress" },
                        "topology.kubernetes.io/region": i.region,
                        "topology.kubernetes.io/zone": i.zone,
                        "topology.k8s.aws/zone-id": i.zone_id,
                    },
                },
                "spec": { "providerID": format!("aws:///{}/sagemaker/cluster/{}-{}", i.zone, i.cluster, i.id) },
                "status": {
                    "capacity": resources,
                    "allocatable": resources,
                    "conditions": [{ "type": "Ready", "status": "True", "reason": "KubeletReady",
                                     "message": "kubelet is posting ready status", "lastHeartbeatTime": booted, "lastTransitionTime": booted }],
                    "addresses": [{ "type": "InternalIP", "address": i.private_ip },
                                  { "type": "InternalDNS", "address": i.private_dns },
                                  { "type": "Hostname", "address": name }],
                    "nodeInfo": { "kubeletVersion": format!("v{version}.0-eks"), "containerRuntimeVersion": "containerd://1.7.27",
                                  "osImage": "Amazon Linux 2023", "architecture": "amd64", "operatingSystem": "linux",
                                  "kernelVersion": "6.1.0", "machineID": i.id, "systemUUID": i.id, "bootID": boot_id(&i.id, i.boots) },
                },
            });
            for (k, v) in &i.labels {
                if node["metadata"]["labels"].get(k).is_none() {
                    node["metadata"]["labels"][k] = json!(v);
                }
            }
            let mut taints = Vec::new();
            if !healthy || i.pending_recovery.is_some() {
                taints.push(json!({ "key": HEALTH, "value": health, "effect": "NoSchedule" }));
            }
            taints.extend(i.taints.iter().cloned());
            if !taints.is_empty() {
                node["spec"]["taints"] = json!(taints);
            }
            let applied = json!({ "labels": i.labels, "taints": i.taints }).to_string();
            node["metadata"]["annotations"] = json!({ APPLIED: applied });
            (name, node)
        })
        .collect();
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
            carry_over(&mut node, old);
        }
        upsert(store, key, node);
    }
}

/// A UUID, as kubelets report, that changes with every reboot of the instance.
fn boot_id(instance: &str, boots: u32) -> String {
    let h = fnv1a(&format!("{instance}/boot/{boots}"));
    let l = fnv1a(&format!("{boots}/boot/{instance}"));
    format!(
        "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
        h >> 32,
        (h >> 16) & 0xffff,
        h & 0xfff,
        l >> 52,
        l & 0xffff_ffff_ffff
    )
}

fn same_taint(a: &Value, b: &Value) -> bool {
    a["key"] == b["key"] && a["effect"] == b["effect"]
}

/// What users put on the `old` Node that the `node` built from its instance lacks:
/// labels and annotations of their own, taints, a cordon (`kubectl cordon`/`drain`),
/// and the managed fields of their applies. A label or taint is the group's, not
/// theirs, when the last pass applied it from the group's `KubernetesConfig`.
fn carry_over(node: &mut Value, old: &Value) {
    let applied: Value = old["metadata"]["annotations"][APPLIED]
        .as_str()
        .and_then(|a| serde_json::from_str(a).ok())
        .unwrap_or(Value::Null);
    if let Some(extra) = old["metadata"]["labels"].as_object() {
        for (k, v) in extra {
            if node["metadata"]["labels"].get(k).is_none() && applied["labels"].get(k).is_none() {
                node["metadata"]["labels"][k] = v.clone();
            }
        }
    }
    if let Some(extra) = old["metadata"]["annotations"].as_object() {
        for (k, v) in extra {
            if node["metadata"]["annotations"].get(k).is_none() {
                node["metadata"]["annotations"][k] = v.clone();
            }
        }
    }
    if let Some(m) = old["metadata"].get("managedFields") {
        node["metadata"]["managedFields"] = m.clone();
    }
    if old["spec"]["unschedulable"] == Value::Bool(true) {
        node["spec"]["unschedulable"] = json!(true);
    }
    let was_applied = |t: &Value| {
        applied["taints"]
            .as_array()
            .is_some_and(|a| a.iter().any(|x| same_taint(x, t)))
    };
    let mut taints = node["spec"]["taints"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let theirs: Vec<Value> = old["spec"]["taints"]
        .as_array()
        .into_iter()
        .flatten()
        // A cordon is carried as `unschedulable`: its taint, carried too, would outlive
        // a `kubectl uncordon`.
        .filter(|t| t["key"] != HEALTH && t["key"] != "node.kubernetes.io/unschedulable")
        .filter(|t| !was_applied(t) && !taints.iter().any(|x| same_taint(x, t)))
        .cloned()
        .collect();
    if !theirs.is_empty() {
        taints.extend(theirs);
        node["spec"]["taints"] = json!(taints);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sagemaker::instance_types::default_table;

    /// A Node as the controller builds it for an instance whose group asks for
    /// `labels` and `taints`.
    fn built(labels: Value, taints: Value) -> Value {
        let applied = json!({ "labels": labels, "taints": taints }).to_string();
        let mut node = json!({
            "metadata": { "name": "n", "labels": { "kubernetes.io/hostname": "n" },
                          "annotations": { APPLIED: applied } },
            "spec": {},
        });
        for (k, v) in labels.as_object().unwrap() {
            node["metadata"]["labels"][k] = v.clone();
        }
        if !taints.as_array().unwrap().is_empty() {
            node["spec"]["taints"] = taints;
        }
        node
    }

    #[test]
    fn a_groups_dropped_labels_and_taints_leave_while_users_ones_stay() {
        let gpu = json!({ "key": "gpu", "value": "true", "effect": "NoSchedule" });
        let spot = json!({ "key": "spot", "effect": "PreferNoSchedule" });
        let mine = json!({ "key": "mine", "value": "x", "effect": "NoExecute" });
        let mut old = built(json!({ "team": "a", "tier": "1" }), json!([gpu, spot]));
        // What a user added with kubectl since.
        old["metadata"]["labels"]["owner"] = json!("me");
        old["metadata"]["annotations"]["note"] = json!("keep");
        old["spec"]["taints"]
            .as_array_mut()
            .unwrap()
            .push(mine.clone());
        old["spec"]["unschedulable"] = json!(true);

        // The group now has team=b and no tier, and only the gpu taint.
        let mut node = built(json!({ "team": "b" }), json!([gpu]));
        carry_over(&mut node, &old);
        let labels = &node["metadata"]["labels"];
        assert_eq!(labels["team"], "b");
        assert!(labels.get("tier").is_none(), "{labels}");
        assert_eq!(labels["owner"], "me");
        assert_eq!(node["metadata"]["annotations"]["note"], "keep");
        assert_eq!(node["spec"]["taints"], json!([gpu, mine]));
        assert_eq!(node["spec"]["unschedulable"], true);
        let applied: Value =
            serde_json::from_str(node["metadata"]["annotations"][APPLIED].as_str().unwrap())
                .unwrap();
        assert_eq!(applied["labels"], json!({ "team": "b" }));

        // A Node from before the sim remembered anything keeps every label it had.
        let mut bare = old.clone();
        bare["metadata"]["annotations"] = json!({});
        let mut node = built(json!({}), json!([]));
        carry_over(&mut node, &bare);
        assert_eq!(node["metadata"]["labels"]["tier"], "1");
    }

    #[test]
    fn nodes_offer_what_the_instance_type_table_says() {
        let table = default_table();
        let p5 = resources(&table["ml.p5.48xlarge"]);
        assert_eq!(p5["nvidia.com/gpu"], "8");
        assert_eq!(p5["vpc.amazonaws.com/efa"], "32");
        assert_eq!(p5["cpu"], "192");
        assert_eq!(p5["memory"], "2048Gi");
        let b300 = resources(&table["ml.p6-b300.48xlarge"]);
        assert_eq!(b300["vpc.amazonaws.com/efa"], "16");
        assert_eq!(b300["memory"], "4096Gi");
        let m5 = resources(&table["ml.m5.2xlarge"]);
        assert_eq!((&m5["cpu"], &m5["memory"]), (&json!("8"), &json!("32Gi")));
        assert!(m5.get("nvidia.com/gpu").is_none() && m5.get("vpc.amazonaws.com/efa").is_none());
    }
}
