//! The default scheduler: binds a pending pod to the first ready, schedulable node whose
//! labels (`nodeSelector` and required node affinity), taints and free allocatable (GPUs,
//! EFA interfaces, CPU) admit it, or says why none does in kube-scheduler's words. What a bound pod requests counts at once, so two
//! pods bound in the same pass never share a GPU.

use std::collections::{BTreeMap, HashMap};

use serde_json::{Value, json};

use super::controllers::{is_terminal, node_ready, selector_matches};
use super::store::{Store, meta};

/// A quantity in milli-units (`"500m"`, `"2"`), for CPU; integers for devices.
pub(crate) fn milli(q: &Value) -> u64 {
    let s = match q {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        _ => return 0,
    };
    match s.strip_suffix('m') {
        Some(m) => m.parse().unwrap_or(0),
        None => s.parse::<f64>().map(|f| (f * 1000.0) as u64).unwrap_or(0),
    }
}

/// What pods are placed by, in the order [`requests`] returns them.
pub(crate) const RESOURCES: [&str; 3] = ["nvidia.com/gpu", "vpc.amazonaws.com/efa", "cpu"];

/// What a pod (or a pod template) requests of [`RESOURCES`] (limits where it names no
/// request).
pub(crate) fn requests(pod: &Value) -> [u64; 3] {
    let mut out = [0; 3];
    for c in pod["spec"]["containers"].as_array().into_iter().flatten() {
        for (i, r) in RESOURCES.iter().enumerate() {
            let q = &c["resources"]["requests"][*r];
            let q = if q.is_null() {
                &c["resources"]["limits"][*r]
            } else {
                q
            };
            out[i] += milli(q);
        }
    }
    out
}

/// Whether node `labels` satisfy the pod's required node affinity
/// (`requiredDuringSchedulingIgnoredDuringExecution`): any one of its terms, each with all
/// its `matchExpressions`. Preferred terms only rank nodes, which this scheduler does not.
pub(crate) fn affinity_matches(pod_spec: &Value, labels: &Value) -> bool {
    let required = &pod_spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        ["nodeSelectorTerms"];
    let Some(terms) = required.as_array() else {
        return true;
    };
    terms.iter().any(|term| {
        term["matchExpressions"]
            .as_array()
            .into_iter()
            .flatten()
            .all(|e| expression_matches(e, labels))
    })
}

fn expression_matches(e: &Value, labels: &Value) -> bool {
    requirement_admits(e, e["key"].as_str().and_then(|k| labels[k].as_str()))
}

/// Whether a node whose label of `r`'s key is `have` meets one node-selector requirement
/// (a node affinity's `matchExpressions` entry, or a Karpenter NodePool's requirement):
/// a key the node does not carry fails `In`, `Exists`, `Gt` and `Lt`.
pub(crate) fn requirement_admits(r: &Value, have: Option<&str>) -> bool {
    let values: Vec<&str> = r["values"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    let number = |s: &str| s.parse::<i64>().ok();
    let bound = values.first().copied().and_then(number);
    match r["operator"].as_str().unwrap_or_default() {
        "In" => have.is_some_and(|v| values.contains(&v)),
        "NotIn" => have.is_none_or(|v| !values.contains(&v)),
        "Exists" => have.is_some(),
        "DoesNotExist" => have.is_none(),
        "Gt" => have.and_then(number).zip(bound).is_some_and(|(v, b)| v > b),
        "Lt" => have.and_then(number).zip(bound).is_some_and(|(v, b)| v < b),
        _ => false,
    }
}

/// Whether `pod` tolerates every NoSchedule taint of `taints`.
pub(crate) fn tolerates(pod: &Value, taints: &[Value]) -> bool {
    let tolerations = pod["spec"]["tolerations"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    taints.iter().all(|t| {
        t["effect"] != "NoSchedule"
            || tolerations.iter().any(|tol| {
                (tol["key"].is_null() && tol["operator"] == "Exists")
                    || (tol["key"] == t["key"]
                        && (tol["operator"] == "Exists" || tol["value"] == t["value"]))
            })
    })
}

/// The nodes as stored at the start of a pass and what the live pods bound to each
/// already request.
pub struct Scheduler {
    nodes: Vec<Value>,
    /// Each node's position in `nodes`, by name: every bound pod looks its node up.
    index: HashMap<String, usize>,
    used: BTreeMap<String, [u64; 3]>,
}

impl Scheduler {
    pub fn new(store: &Store) -> Self {
        let nodes: Vec<Value> = store.list("/nodes", None).map(|n| (**n).clone()).collect();
        let mut used: BTreeMap<String, [u64; 3]> = BTreeMap::new();
        for p in store.list("/pods", None) {
            if let Some(n) = p["spec"]["nodeName"].as_str()
                && !is_terminal(p)
            {
                let r = requests(p);
                let u = used.entry(n.to_owned()).or_default();
                for i in 0..3 {
                    u[i] += r[i];
                }
            }
        }
        let index = nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (meta(n, "name"), i))
            .collect();
        Self { nodes, index, used }
    }

    /// How many nodes the cluster has, as the scheduler's messages count them.
    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// The first address of node `name`, as a pod's `hostIP`.
    pub fn address(&self, name: &str) -> Option<&str> {
        let n = &self.nodes[*self.index.get(name)?];
        n["status"]["addresses"][0]["address"].as_str()
    }

    /// Binds `pod` to a node with room for its GPU/EFA/CPU requests, or marks it
    /// Unschedulable with the reasons (keeping the condition's time while they stay the
    /// same); whether it was bound.
    pub fn bind(&mut self, pod: &mut Value, now: &str) -> bool {
        let nodes = &self.nodes;
        let used = &mut self.used;
        let need = requests(pod);
        let mut reasons: BTreeMap<String, usize> = BTreeMap::new();
        let mut chosen = None;
        for n in nodes {
            let node = meta(n, "name");
            if !node_ready(n) {
                *reasons.entry("node(s) were not ready".into()).or_default() += 1;
                continue;
            }
            if n["spec"]["unschedulable"] == Value::Bool(true) {
                *reasons
                    .entry("node(s) were unschedulable".into())
                    .or_default() += 1;
                continue;
            }
            if !selector_matches(&pod["spec"]["nodeSelector"], &n["metadata"]["labels"])
                || !affinity_matches(&pod["spec"], &n["metadata"]["labels"])
            {
                *reasons
                    .entry("node(s) didn't match Pod's node affinity/selector".into())
                    .or_default() += 1;
                continue;
            }
            let taints = n["spec"]["taints"]
                .as_array()
                .map_or(&[][..], Vec::as_slice);
            if !tolerates(pod, taints) {
                *reasons
                    .entry("node(s) had untolerated taint(s)".into())
                    .or_default() += 1;
                continue;
            }
            let u = used.get(&node).copied().unwrap_or_default();
            let mut fits = true;
            for (i, r) in RESOURCES.iter().enumerate() {
                let have = milli(&n["status"]["allocatable"][*r]);
                if need[i] > 0 && u[i] + need[i] > have {
                    fits = false;
                    *reasons.entry(format!("Insufficient {r}")).or_default() += 1;
                }
            }
            if fits {
                chosen = Some(node);
                break;
            }
        }
        match chosen {
            Some(node) => {
                let u = used.entry(node.clone()).or_default();
                for i in 0..3 {
                    u[i] += need[i];
                }
                pod["spec"]["nodeName"] = json!(node);
                pod["status"]["conditions"] = json!([{ "type": "PodScheduled", "status": "True", "lastTransitionTime": now }]);
                true
            }
            None => {
                let detail: Vec<String> = reasons.iter().map(|(r, n)| format!("{n} {r}")).collect();
                let message = format!(
                    "0/{} nodes are available: {}.",
                    nodes.len(),
                    if detail.is_empty() {
                        "no nodes available to schedule pods".to_owned()
                    } else {
                        detail.join(", ")
                    }
                );
                let old = pod["status"]["conditions"][0].clone();
                let since = if old["message"] == message.as_str() {
                    old["lastTransitionTime"].clone()
                } else {
                    json!(now)
                };
                pod["status"]["conditions"] = json!([{ "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                                      "message": message, "lastTransitionTime": since }]);
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn required_node_affinity_admits_nodes_matching_any_term() {
        let spec = json!({ "affinity": { "nodeAffinity": { "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                { "matchExpressions": [{ "key": "node.kubernetes.io/instance-type", "operator": "In",
                                         "values": ["ml.g5.8xlarge", "ml.g5.12xlarge"] }] },
                { "matchExpressions": [{ "key": "pool", "operator": "Exists" },
                                       { "key": "gpus", "operator": "Gt", "values": ["4"] }] },
            ] } } } });
        let admits = |labels: Value| affinity_matches(&spec, &labels);
        assert!(admits(
            json!({ "node.kubernetes.io/instance-type": "ml.g5.12xlarge" })
        ));
        assert!(!admits(
            json!({ "node.kubernetes.io/instance-type": "ml.p5.48xlarge" })
        ));
        assert!(admits(json!({ "pool": "a", "gpus": "8" })));
        assert!(!admits(json!({ "pool": "a", "gpus": "2" })));
        assert!(
            affinity_matches(&json!({}), &json!({})),
            "no affinity, any node"
        );
    }

    #[test]
    fn quantities_parse() {
        assert_eq!(milli(&json!("500m")), 500);
        assert_eq!(milli(&json!("2")), 2000);
        assert_eq!(milli(&json!(8)), 8000);
    }
}
