//! Nodes from HyperPod instances: one Node per instance past Pending, with the capacity of
//! its instance type, HyperPod's labels and a NoSchedule taint while it is not healthy.
//! The instance is the truth, so its own labels win on every tick; what users added
//! (labels, taints, a cordon from `kubectl drain`) survives the next tick.

use std::collections::BTreeSet;

use serde_json::{Value, json};

use super::upsert;
use crate::kube::store::{Key, meta};
use crate::kube::time::rfc3339;
use crate::world::{World, fnv1a};

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

pub(super) fn nodes(w: &mut World, cluster: &str) {
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
            let h = fnv1a(&i.id);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capacities_know_the_gpu_types() {
        assert_eq!(capacity("ml.p5.48xlarge"), (8, 32, 192, 2048));
        assert_eq!(capacity("ml.m5.2xlarge"), (0, 0, 8, 32));
        assert_eq!(capacity("ml.g5.xlarge").0, 1);
    }
}
