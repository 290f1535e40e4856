//! Nodes from HyperPod instances: one Node per instance past Pending (a rebooting one
//! keeps its Node, whose kubelet stops posting: Ready Unknown), with the capacity of
//! its instance type, HyperPod's and its zone's labels, its group's `KubernetesConfig`
//! labels and taints, and a NoSchedule taint while it is not healthy or awaits a reboot
//! or replacement (a `node-health-status` label a user sets asks HyperPod for one). The instance is the
//! truth, so its own labels win on every pass and a label or taint its group drops leaves
//! the Node; what users added (labels, taints, annotations, a cordon from `kubectl
//! drain`) survives the next pass. A fault HyperPod's health-monitoring agent found shows
//! as the agent shows it: `fault-type`/`fault-reason` labels while it lasts, a
//! `fault-details` annotation of recent faults and a condition that outlive it (False
//! once the instance is back from its reboot), and one Warning Event.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::{record, upsert};
use crate::clock::Clock;
use crate::kube::store::{Key, Store, meta};
use crate::kube::time::{parse_rfc3339, rfc3339};
use crate::sagemaker::instance_types::InstanceType;
use crate::sagemaker::{Instance, Recovery};
use crate::world::fnv1a;

/// The group's labels and taints last put on a Node, so that the next pass can tell one
/// the group has since dropped (to remove) from one a user added (to keep).
const APPLIED: &str = "sim.hypd.dev/instance-group-kubernetes-config";

/// The taint HyperPod keeps on a Node while its instance is not healthy.
const HEALTH: &str = "sagemaker.amazonaws.com/node-health-status";

/// The labels the health-monitoring agent keeps on a Node while its fault lasts.
const FAULT_TYPE: &str = "sagemaker.amazonaws.com/fault-type";
const FAULT_REASON: &str = "sagemaker.amazonaws.com/fault-reason";

/// The agent's record of a Node's recent faults, a JSON array of [`FaultDetail`].
const FAULT_DETAILS: &str = "sagemaker.amazonaws.com/fault-details";

/// Who reports the agent's Events (the node-problem-detector it builds on).
const AGENT: &str = "sagemaker-health-monitoring-agent";

/// How many faults `fault-details` keeps: a Node's annotations share a 256 KiB budget, so
/// the record of a node that faults again and again cannot grow without end.
const FAULT_HISTORY: usize = 10;

/// One fault in `fault-details`, its fields in the agent's order.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct FaultDetail {
    timestamp: String,
    #[serde(rename = "type")]
    fault_type: String,
    reason: String,
    message: String,
}

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
    let wanted: Vec<(&Instance, String, Value)> = instances
        .iter()
        .filter(|i| i.status != "Pending" || i.rebooting.is_some())
        .filter_map(|i| Some((i, table.get(&i.instance_type)?)))
        .map(|(i, facts)| {
            let name = format!("hyperpod-{}", i.id);
            let healthy = i.status == "Running";
            let health = i.pending_recovery.unwrap_or(if healthy { "Schedulable" } else { "Unschedulable" });
            let booted = rfc3339(epoch(i.launched + crate::sagemaker::NODE_BOOT_SECS));
            let ready = match (i.rebooting, i.rebooted) {
                (Some(since), _) => {
                    let since = rfc3339(epoch(since));
                    json!({ "type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown",
                            "message": "Kubelet stopped posting node status.",
                            "lastHeartbeatTime": since, "lastTransitionTime": since })
                }
                (None, up) => {
                    let up = up.map_or_else(|| booted.clone(), |t| rfc3339(epoch(t)));
                    json!({ "type": "Ready", "status": "True", "reason": "KubeletReady",
                            "message": "kubelet is posting ready status",
                            "lastHeartbeatTime": up, "lastTransitionTime": up })
                }
            };
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
                    "conditions": [ready],
                    "addresses": [{ "type": "InternalIP", "address": i.private_ip },
                                  { "type": "InternalDNS", "address": i.private_dns },
                                  { "type": "Hostname", "address": name }],
                    "nodeInfo": { "kubeletVersion": format!("v{version}.0-eks"), "containerRuntimeVersion": "containerd://1.7.27",
                                  "osImage": "Amazon Linux 2023", "architecture": "amd64", "operatingSystem": "linux",
                                  "kernelVersion": "6.1.0", "machineID": i.id, "systemUUID": i.id, "bootID": boot_id(&i.id, i.boots) },
                },
            });
            if let Some((_, fault)) = &i.fault {
                node["metadata"]["labels"][FAULT_TYPE] = json!(fault.fault_type);
                node["metadata"]["labels"][FAULT_REASON] = json!(fault.fault_reason);
            }
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
            (i, name, node)
        })
        .collect();
    let names: BTreeSet<&String> = wanted.iter().map(|(_, n, _)| n).collect();
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
    for (i, name, mut node) in wanted {
        let key = Key::new("/nodes", "", &name);
        let old = store.get(&key).cloned();
        if let Some(old) = &old {
            carry_over(&mut node, old);
        }
        let found = fault_marks(&mut node, old.as_deref(), i, clock);
        let involved = json!({ "kind": "Node", "name": name, "uid": node["metadata"]["uid"] });
        upsert(store, key, node);
        if let (true, Some((since, fault))) = (found, &i.fault) {
            let source = json!({ "component": AGENT, "host": name });
            let when = rfc3339(clock.epoch(*since));
            record(
                store,
                &involved,
                "Warning",
                &fault.fault_reason,
                &fault.message,
                &source,
                &when,
            );
        }
    }
}

/// The agent's marks on `node` that outlive a fault, over what the `old` Node had: the
/// fault instance `i` has now joins `fault-details` (true: it is new, and the agent
/// reports it), and each fault type listed there keeps its condition, True while its
/// fault lasts, else False since the instance came back from its reboot. A Node with no
/// fault in its record has none of them.
fn fault_marks(node: &mut Value, old: Option<&Value>, i: &Instance, clock: &Clock) -> bool {
    let at = |t: f64| rfc3339(clock.epoch(t));
    let mut history: Vec<FaultDetail> = node["metadata"]["annotations"][FAULT_DETAILS]
        .as_str()
        .and_then(|d| serde_json::from_str(d).ok())
        .unwrap_or_default();
    let current = i.fault.as_ref().map(|(since, f)| {
        let detail = FaultDetail {
            timestamp: at(*since),
            fault_type: f.fault_type.clone(),
            reason: f.fault_reason.clone(),
            message: f.message.clone(),
        };
        let condition = json!({ "type": f.fault_type, "status": "True", "reason": f.fault_reason,
                                "message": f.message, "lastHeartbeatTime": detail.timestamp,
                                "lastTransitionTime": detail.timestamp });
        (detail, condition)
    });
    let found = current.as_ref().is_some_and(|(d, _)| !history.contains(d));
    if let (true, Some((detail, _))) = (found, &current) {
        history.push(detail.clone());
        let excess = history.len().saturating_sub(FAULT_HISTORY);
        history.drain(..excess);
        node["metadata"]["annotations"][FAULT_DETAILS] =
            json!(serde_json::to_string(&history).unwrap_or_default());
    }
    let types: BTreeSet<&str> = history.iter().map(|d| d.fault_type.as_str()).collect();
    // A condition goes False when the reboot that recovered the instance ends; one whose
    // fault merely gave way to another (the node awaiting its recovery still) goes now.
    let recovered = |found: &Value| {
        let found = found.as_str().and_then(parse_rfc3339).unwrap_or_default();
        match i.rebooted.map(|r| clock.epoch(r)) {
            Some(r) if r >= found => rfc3339(r),
            _ => rfc3339(clock.epoch(clock.now())),
        }
    };
    let mut conditions = node["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let mut placed = false;
    let kept = old
        .and_then(|o| o["status"]["conditions"].as_array())
        .into_iter()
        .flatten()
        .filter(|c| c["type"] != "Ready" && c["type"].as_str().is_some_and(|t| types.contains(t)));
    for c in kept {
        match &current {
            Some((d, condition)) if c["type"] == d.fault_type.as_str() => {
                conditions.push(condition.clone());
                placed = true;
            }
            _ if c["status"] == "True" => {
                let since = recovered(&c["lastTransitionTime"]);
                let mut c = c.clone();
                c["status"] = json!("False");
                c["lastHeartbeatTime"] = json!(since);
                c["lastTransitionTime"] = json!(since);
                conditions.push(c);
            }
            _ => conditions.push(c.clone()),
        }
    }
    if let (false, Some((_, condition))) = (placed, &current) {
        conditions.push(condition.clone());
    }
    node["status"]["conditions"] = json!(conditions);
    found
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
        // The agent's fault labels go with the fault, as its taint does.
        let agents = |k: &str| k == FAULT_TYPE || k == FAULT_REASON;
        for (k, v) in extra {
            if node["metadata"]["labels"].get(k).is_none()
                && applied["labels"].get(k).is_none()
                && !agents(k)
            {
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
    use crate::sagemaker::HealthFault;
    use crate::sagemaker::instance_types::default_table;

    const ID: &str = "i-0123456789abcdef0";
    const NODE: &str = "hyperpod-i-0123456789abcdef0";

    /// Instance `id`, Running unless it owes `recovery` (for the agent's `fault` or at a
    /// user's request), back from its latest reboot at `rebooted`.
    fn instance(
        id: &str,
        recovery: Option<Recovery>,
        fault: Option<(f64, HealthFault)>,
        rebooted: Option<f64>,
    ) -> Instance {
        Instance {
            id: id.into(),
            instance_type: "ml.g5.8xlarge".into(),
            group: "g".into(),
            cluster: "hp".into(),
            region: "us-east-1".into(),
            zone: "us-east-1a".into(),
            zone_id: "use1-az1".into(),
            private_ip: "10.1.0.5".into(),
            private_dns: "ip-10-1-0-5.ec2.internal".into(),
            labels: BTreeMap::new(),
            taints: Vec::new(),
            status: if recovery.is_some() {
                "Failure"
            } else {
                "Running"
            },
            pending_recovery: recovery.map(Recovery::label),
            fault,
            boots: u32::from(rebooted.is_some()),
            launched: 0.0,
            rebooting: None,
            rebooted,
        }
    }

    fn pass(store: &mut Store, instances: &[Instance], clock: &Clock) -> Value {
        nodes(store, instances, &default_table(), "1.32", clock);
        (**store.get(&Key::new("/nodes", "", NODE)).unwrap()).clone()
    }

    fn events(store: &Store) -> Vec<Value> {
        store
            .list("/events", Some("default"))
            .map(|e| (**e).clone())
            .collect()
    }

    fn details(node: &Value) -> Vec<Value> {
        let d = node["metadata"]["annotations"][FAULT_DETAILS]
            .as_str()
            .unwrap();
        serde_json::from_str(d).unwrap()
    }

    #[test]
    fn a_fault_the_agent_found_shows_in_four_parts_and_one_event() {
        let clock = Clock::new(0.0);
        clock.advance(1000.0);
        let at = |t: f64| rfc3339(clock.epoch(t));
        let mut store = Store::new();
        let fault = HealthFault::for_recovery(Recovery::Reboot);
        let xid = fault.message.clone();
        let sick = [instance(
            ID,
            Some(Recovery::Reboot),
            Some((1000.0, fault)),
            None,
        )];
        let node = pass(&mut store, &sick, &clock);

        let labels = &node["metadata"]["labels"];
        assert_eq!(labels[HEALTH], "UnschedulablePendingReboot");
        assert_eq!(labels[FAULT_TYPE], "NvidiaErrorReboot");
        assert_eq!(labels[FAULT_REASON], "XidHardwareFailure");
        assert_eq!(
            node["spec"]["taints"],
            json!([{ "key": HEALTH, "value": "UnschedulablePendingReboot", "effect": "NoSchedule" }])
        );
        let raw = node["metadata"]["annotations"][FAULT_DETAILS]
            .as_str()
            .unwrap();
        assert!(raw.starts_with(r#"[{"timestamp":"#), "{raw}");
        assert_eq!(
            details(&node),
            [
                json!({ "timestamp": at(1000.0), "type": "NvidiaErrorReboot",
                     "reason": "XidHardwareFailure", "message": xid })
            ]
        );
        let conditions = node["status"]["conditions"].as_array().unwrap();
        assert_eq!(conditions[0]["type"], "Ready");
        assert_eq!(
            conditions[1..],
            [
                json!({ "type": "NvidiaErrorReboot", "status": "True", "reason": "XidHardwareFailure",
                     "message": xid, "lastHeartbeatTime": at(1000.0),
                     "lastTransitionTime": at(1000.0) })
            ]
        );

        let e = events(&store);
        assert_eq!(e.len(), 1, "{e:?}");
        let e = &e[0];
        assert_eq!(
            (&e["type"], &e["reason"], &e["message"]),
            (&json!("Warning"), &json!("XidHardwareFailure"), &json!(xid))
        );
        assert_eq!(
            e["involvedObject"],
            json!({ "kind": "Node", "name": NODE, "uid": node["metadata"]["uid"] })
        );
        assert_eq!(e["source"], json!({ "component": AGENT, "host": NODE }));
        assert_eq!(e["metadata"]["namespace"], "default");
        assert_eq!(
            (&e["firstTimestamp"], &e["lastTimestamp"], &e["count"]),
            (&json!(at(1000.0)), &json!(at(1000.0)), &json!(1))
        );

        // Once: later passes write nothing, neither the Node nor another Event.
        let rv = store.rv();
        clock.advance(30.0);
        pass(&mut store, &sick, &clock);
        assert_eq!(store.rv(), rv);
    }

    #[test]
    fn after_the_reboot_the_condition_stays_false_and_the_fault_labels_go() {
        let clock = Clock::new(0.0);
        clock.advance(1000.0);
        let at = |t: f64| rfc3339(clock.epoch(t));
        let mut store = Store::new();
        let fault = HealthFault::for_recovery(Recovery::Reboot);
        let sick = |since: f64| {
            [instance(
                ID,
                Some(Recovery::Reboot),
                Some((since, fault.clone())),
                None,
            )]
        };
        pass(&mut store, &sick(1000.0), &clock);
        let first = details(store.get(&Key::new("/nodes", "", NODE)).unwrap());

        // Found at 1000 and rebooted after the 60 s delay: the Node stays, its kubelet
        // silent, and the fault with it.
        clock.advance(60.0);
        let [mut rebooting] = sick(1000.0);
        (rebooting.status, rebooting.rebooting) = ("Pending", Some(1060.0));
        let node = pass(&mut store, &[rebooting], &clock);
        let conditions = node["status"]["conditions"].as_array().unwrap();
        assert_eq!(
            (
                &conditions[0]["status"],
                &conditions[0]["lastTransitionTime"]
            ),
            (&json!("Unknown"), &json!(at(1060.0)))
        );
        assert_eq!(conditions[1]["status"], "True");
        assert_eq!(node["metadata"]["labels"][FAULT_TYPE], "NvidiaErrorReboot");

        // Back 180 s later.
        clock.advance(180.0);
        let node = pass(
            &mut store,
            &[instance(ID, None, None, Some(1240.0))],
            &clock,
        );
        let labels = &node["metadata"]["labels"];
        assert_eq!(labels[HEALTH], "Schedulable");
        assert!(
            labels.get(FAULT_TYPE).is_none() && labels.get(FAULT_REASON).is_none(),
            "{labels}"
        );
        assert!(node["spec"].get("taints").is_none(), "{node}");
        assert_eq!(details(&node), first);
        let conditions = node["status"]["conditions"].as_array().unwrap();
        assert_eq!(
            (
                &conditions[0]["status"],
                &conditions[0]["lastTransitionTime"]
            ),
            (&json!("True"), &json!(at(1240.0)))
        );
        assert_eq!(
            conditions[1..],
            [
                json!({ "type": "NvidiaErrorReboot", "status": "False", "reason": "XidHardwareFailure",
                     "message": fault.message, "lastHeartbeatTime": at(1240.0),
                     "lastTransitionTime": at(1240.0) })
            ]
        );
        assert_eq!(events(&store).len(), 1);
        let rv = store.rv();
        clock.advance(30.0);
        pass(
            &mut store,
            &[instance(ID, None, None, Some(1240.0))],
            &clock,
        );
        assert_eq!(store.rv(), rv, "the False condition is not written again");

        // The same fault again: True again, a second entry, and the Event counts up.
        clock.advance(730.0);
        let node = pass(&mut store, &sick(2000.0), &clock);
        assert_eq!(details(&node).len(), 2);
        assert_eq!(details(&node)[1]["timestamp"], at(2000.0));
        let conditions = node["status"]["conditions"].as_array().unwrap();
        assert_eq!(conditions.len(), 2);
        assert_eq!(
            (
                &conditions[1]["status"],
                &conditions[1]["lastTransitionTime"]
            ),
            (&json!("True"), &json!(at(2000.0)))
        );
        let e = events(&store);
        assert_eq!(e.len(), 1, "{e:?}");
        assert_eq!(
            (&e[0]["count"], &e[0]["lastTimestamp"]),
            (&json!(2), &json!(at(2000.0)))
        );
    }

    #[test]
    fn a_users_request_and_a_replacement_show_no_fault() {
        let clock = Clock::new(0.0);
        clock.advance(1000.0);
        let mut store = Store::new();
        let asked = [instance(ID, Some(Recovery::Reboot), None, None)];
        let node = pass(&mut store, &asked, &clock);
        let labels = &node["metadata"]["labels"];
        assert_eq!(labels[HEALTH], "UnschedulablePendingReboot");
        assert!(
            labels.get(FAULT_TYPE).is_none() && labels.get(FAULT_REASON).is_none(),
            "{labels}"
        );
        assert!(node["metadata"]["annotations"].get(FAULT_DETAILS).is_none());
        assert_eq!(node["status"]["conditions"].as_array().unwrap().len(), 1);
        assert!(events(&store).is_empty());

        // A replaced instance is a new Node: its predecessor's fault is not its own.
        let fault = HealthFault::for_recovery(Recovery::Replace);
        let sick = [instance(
            ID,
            Some(Recovery::Replace),
            Some((1000.0, fault)),
            None,
        )];
        pass(&mut store, &sick, &clock);
        let new = "i-0123456789abcdef1";
        nodes(
            &mut store,
            &[instance(new, None, None, None)],
            &default_table(),
            "1.32",
            &clock,
        );
        assert!(store.get(&Key::new("/nodes", "", NODE)).is_none());
        let node = store
            .get(&Key::new("/nodes", "", &format!("hyperpod-{new}")))
            .unwrap();
        assert!(node["metadata"]["annotations"].get(FAULT_DETAILS).is_none());
        assert_eq!(node["status"]["conditions"].as_array().unwrap().len(), 1);
        assert!(node["metadata"]["labels"].get(FAULT_TYPE).is_none());
    }

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
