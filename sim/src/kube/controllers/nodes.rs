//! Nodes from HyperPod instances: one Node per instance past Pending, with the capacity of
//! its instance type, HyperPod's labels and a NoSchedule taint while it is not healthy.
//! The instance is the truth, so its own labels win on every tick; what users added
//! (labels, taints, a cordon from `kubectl drain`) survives the next tick.

use std::collections::BTreeSet;

use serde_json::{Value, json};

use super::upsert;
use crate::kube::store::{Key, meta};
use crate::kube::time::rfc3339;
use crate::sagemaker::instance_types::InstanceType;
use crate::world::{World, fnv1a};

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

pub(super) fn nodes(w: &mut World, cluster: &str) {
    let instances = w.hyperpod_instances(cluster);
    let version = w
        .kube_cluster(cluster)
        .map(|c| c.version.clone())
        .unwrap_or_default();
    let epoch = |t: f64| w.clock.epoch(t);
    let table = &w.sagemaker.instance_types;
    let wanted: Vec<(String, Value)> = instances
        .iter()
        .filter(|i| i.status != "Pending")
        // HyperPod refuses a group whose type has no row, and rows are only ever added or
        // replaced, so every instance finds its facts.
        .filter_map(|i| Some((i, table.get(&i.instance_type)?)))
        .map(|(i, facts)| {
            let name = format!("hyperpod-{}", i.id);
            let healthy = i.status == "Running";
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
                        "sagemaker.amazonaws.com/node-health-status": if healthy { "Schedulable" } else { "Unschedulable" },
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sagemaker::instance_types::default_table;

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
