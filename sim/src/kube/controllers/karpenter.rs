//! HyperPod's managed Karpenter. While a HyperPod cluster's AutoScaling is InService, its
//! EKS cluster serves Karpenter's NodePool and HyperPod's HyperpodNodeClass. A NodePool
//! whose `nodeClassRef` names a Ready HyperpodNodeClass turns pending pods it can place
//! into a higher count for one of the class's instance groups (what BatchAddClusterNodes
//! does on the cluster role), and deletes its nodes once they have run no workload pods
//! for the pool's `consolidateAfter` (what BatchDeleteClusterNodes does), down to 0.
//! HyperPod, not Karpenter, launches the instances, so nodes come up as any group's do:
//! a group's count is the one thing this controller turns. It places pods by the same
//! rules as the sim's scheduler (nodeSelector, NoSchedule taints, GPUs, EFA, CPU), or it
//! would add nodes the scheduler then leaves empty. NodeClaims, NodePool limits and
//! disruption budgets are not modelled.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value, json};

use super::addons::HYPERPOD_LABEL;
use super::{is_terminal, node_ready, selector_matches, snapshot, upsert};
use crate::clock::reached;
use crate::kube::admission::crd_status;
use crate::kube::discovery::CRD_GR;
use crate::kube::scheduler::{RESOURCES, milli, requests, requirement_admits, tolerates};
use crate::kube::store::{Key, Store, meta};
use crate::kube::time::parse_rfc3339;
use crate::sagemaker::{AutoscaledGroup, Features};
use crate::world::Aws;

/// Karpenter's NodePool, upstream's CRD byte for byte (see crds/SOURCES.md).
pub const NODEPOOL_CRD: &str = include_str!("../../../crds/karpenter.sh_nodepools.yaml");
/// HyperPod's HyperpodNodeClass, written for the sim from AWS's guide (no public CRD).
pub const NODECLASS_CRD: &str =
    include_str!("../../../crds/karpenter.sagemaker.amazonaws.com_hyperpodnodeclasses.yaml");

const NODEPOOLS: &str = "karpenter.sh/nodepools";
const NODECLASSES: &str = "karpenter.sagemaker.amazonaws.com/hyperpodnodeclasses";
const CRDS: [(&str, &str); 2] = [
    ("nodepools.karpenter.sh", NODEPOOL_CRD),
    (
        "hyperpodnodeclasses.karpenter.sagemaker.amazonaws.com",
        NODECLASS_CRD,
    ),
];
const NODECLASS_GROUP: &str = "karpenter.sagemaker.amazonaws.com";

/// Karpenter's well-known labels on the nodes it manages.
const NODEPOOL_LABEL: &str = "karpenter.sh/nodepool";
const CAPACITY_LABEL: &str = "karpenter.sh/capacity-type";
const REGISTERED_LABEL: &str = "karpenter.sh/registered";
const INITIALIZED_LABEL: &str = "karpenter.sh/initialized";
/// When the controller first saw a node without workload pods. Karpenter keeps this on
/// the node's NodeClaim (`status.lastPodEventTime`); the sim, without NodeClaims, keeps
/// it in this annotation of its own.
const EMPTY_SINCE: &str = "sim.hypd.dev/karpenter-empty-since";
const HEALTH: &str = "sagemaker.amazonaws.com/node-health-status";

/// GPUs, EFA interfaces and CPU, as the scheduler counts them (milli-units).
type Resources = [u64; 3];

/// An instance group of a HyperPod cluster on this EKS cluster and what one of its nodes
/// offers.
pub(super) struct Group {
    hyperpod: String,
    facts: AutoscaledGroup,
    capacity: Resources,
}

/// A NodePool on a Ready HyperpodNodeClass.
struct Pool {
    name: String,
    weight: i64,
    /// The groups it may scale (indices into the groups), in its class's order.
    groups: Vec<usize>,
    labels: Map<String, Value>,
    taints: Vec<Value>,
    /// `None`: never consolidate.
    consolidate_after: Option<f64>,
}

/// The groups of the HyperPod clusters among `features` whose managed Karpenter is
/// InService, with what a node of each offers; none when no cluster's is.
pub(super) fn groups(aws: &mut Aws, features: &[Features]) -> Option<Vec<Group>> {
    let hyperpods: Vec<&String> = features
        .iter()
        .filter(|f| f.karpenter)
        .map(|f| &f.cluster)
        .collect();
    if hyperpods.is_empty() {
        return None;
    }
    let mut groups = Vec::new();
    for hp in hyperpods {
        for facts in aws.autoscaled_groups(hp) {
            let capacity = aws
                .sagemaker
                .instance_types
                .get(&facts.instance_type)
                .map(|t| [t.gpus, t.efa_interfaces, t.vcpus].map(|n| u64::from(n) * 1000))
                .unwrap_or_default();
            groups.push(Group {
                hyperpod: hp.clone(),
                facts,
                capacity,
            });
        }
    }
    Some(groups)
}

/// One pass over the cluster's objects for `groups`: the CRDs served, classes' and
/// pools' statuses written, and what to ask of HyperPod decided.
pub(super) fn karpenter(store: &mut Store, groups: &[Group], epoch_now: f64, now: &str) -> Plan {
    install(store, now);
    let classes = node_classes(store, groups, now);
    let pools = node_pools(store, groups, &classes, now);
    plan(store, groups, &pools, epoch_now, now)
}

/// Simulated seconds after which Karpenter asks again for what HyperPod refused (a
/// quota another cluster may since have freed, say). AWS publishes no figure; this is
/// the sim's.
const RETRY_SECS: f64 = 60.0;

/// Asks HyperPod for what `plan` decided, on the cluster role: more nodes in a group
/// (BatchAddClusterNodes), the consolidated nodes deleted (BatchDeleteClusterNodes).
/// The answer is when the controllers must run again for it, in simulated seconds: at
/// once when HyperPod took any of it (to read what changed), after [`RETRY_SECS`] when
/// it refused it all, never when there was nothing to ask.
pub(super) fn apply(aws: &mut Aws, groups: &[Group], plan: Plan) -> f64 {
    let Plan { adds, deletes } = plan;
    let (mut taken, mut refused) = (false, false);
    for (gi, count) in adds {
        let g = &groups[gi];
        match aws.autoscale_up(&g.hyperpod, &g.facts.name, count) {
            Ok(()) => taken = true,
            Err(e) => {
                refused = true;
                tracing::warn!(
                    group = g.facts.name,
                    code = e.code,
                    message = e.message,
                    "Karpenter could not add nodes"
                );
            }
        }
    }
    for (hyperpod, ids) in deletes {
        match aws.autoscale_down(&hyperpod, &ids) {
            Ok(answer) => {
                let deleted = answer["Successful"]
                    .as_array()
                    .is_some_and(|a| !a.is_empty());
                taken |= deleted;
                refused |= !deleted;
            }
            Err(e) => {
                refused = true;
                tracing::warn!(
                    cluster = hyperpod,
                    code = e.code,
                    message = e.message,
                    "Karpenter could not delete nodes"
                );
            }
        }
    }
    match (taken, refused) {
        (true, _) => 0.0,
        (false, true) => RETRY_SECS,
        (false, false) => f64::INFINITY,
    }
}

/// Serves the two CRDs once managed Karpenter runs. They stay (with users' NodePools and
/// classes) when autoscaling goes: AWS does not say what HyperPod removes, and
/// uninstalling a Helm chart, for one, leaves its CRDs. A CRD of the same name already
/// there (a Karpenter of the user's own) is left alone.
fn install(store: &mut Store, now: &str) {
    for (name, yaml) in CRDS {
        let key = Key::new(CRD_GR, "", name);
        if store.get(&key).is_some() {
            continue;
        }
        let Ok(mut crd) = serde_yaml::from_str::<Value>(yaml) else {
            continue;
        };
        crd["metadata"]["uid"] = json!(store.uid());
        crd["metadata"]["creationTimestamp"] = json!(now);
        crd["metadata"]["labels"][HYPERPOD_LABEL.0] = json!(HYPERPOD_LABEL.1);
        crd["status"] = crd_status(&crd, now);
        store.put(key, crd);
    }
}

/// A status condition as Karpenter writes them, its transition time kept while its
/// status holds.
fn condition(
    old: &Value,
    kind: &str,
    ok: bool,
    reason: &str,
    message: &str,
    generation: &Value,
    now: &str,
) -> Value {
    let status = if ok { "True" } else { "False" };
    let since = old["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == kind))
        .filter(|c| c["status"] == status)
        .map_or_else(|| json!(now), |c| c["lastTransitionTime"].clone());
    let mut c = json!({ "type": kind, "status": status, "reason": reason, "message": message,
                        "lastTransitionTime": since });
    if generation.is_number() {
        c["observedGeneration"] = generation.clone();
    }
    c
}

/// Writes each HyperpodNodeClass's status as AWS's guide shows it: InstanceGroupReady
/// (every group exists and is one autoscaling supports: no training plan, no deep health
/// checks), SubnetsReady (every group's subnet is known) and Ready (both), with each
/// group's instance types, subnet and custom labels. The Ready classes and their groups.
/// Reasons of False conditions and their messages are the sim's own.
fn node_classes(store: &mut Store, groups: &[Group], now: &str) -> BTreeMap<String, Vec<usize>> {
    let mut ready = BTreeMap::new();
    for mut class in snapshot(store, NODECLASSES) {
        let name = meta(&class, "name");
        let mut missing = Vec::new();
        let mut unsupported = Vec::new();
        let mut no_subnet = Vec::new();
        let mut found = Vec::new();
        for group in class["spec"]["instanceGroups"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let group = group.as_str().unwrap_or_default();
            let Some(gi) = groups.iter().position(|g| g.facts.name == group) else {
                missing.push(format!(
                    "instance group {group} does not exist in the HyperPod cluster"
                ));
                continue;
            };
            let g = &groups[gi].facts;
            // The guide: only on-demand capacity (no training plans or reserved
            // capacity), and no deep health checks, which keep pods pending for an hour.
            if g.training_plan {
                unsupported.push(format!("instance group {group} uses a training plan; only on-demand capacity is supported"));
            } else if g.deep_health_checks {
                unsupported.push(format!("instance group {group} runs deep health checks, which autoscaling does not support"));
            }
            if g.subnet.is_none() {
                no_subnet.push(format!("no subnet is known for instance group {group}"));
            }
            found.push(gi);
        }
        let old = class["status"].clone();
        let generation = class["metadata"]["generation"].clone();
        let groups_ok = missing.is_empty() && unsupported.is_empty();
        let reason = if !missing.is_empty() {
            "InstanceGroupNotFound"
        } else if !unsupported.is_empty() {
            "InstanceGroupNotSupported"
        } else {
            "InstanceGroupReady"
        };
        let problems: Vec<String> = missing.into_iter().chain(unsupported).collect();
        let subnets_ok = no_subnet.is_empty();
        let mut not_ready = Vec::new();
        if !groups_ok {
            not_ready.push("InstanceGroupReady=False");
        }
        if !subnets_ok {
            not_ready.push("SubnetsReady=False");
        }
        let conditions = json!([
            condition(
                &old,
                "InstanceGroupReady",
                groups_ok,
                reason,
                &problems.join("; "),
                &generation,
                now
            ),
            condition(
                &old,
                "SubnetsReady",
                subnets_ok,
                if subnets_ok {
                    "SubnetsReady"
                } else {
                    "SubnetsNotFound"
                },
                &no_subnet.join("; "),
                &generation,
                now
            ),
            condition(
                &old,
                "Ready",
                not_ready.is_empty(),
                if not_ready.is_empty() {
                    "Ready"
                } else {
                    "NotReady"
                },
                &not_ready.join(", "),
                &generation,
                now
            ),
        ]);
        let entries: Vec<Value> = found
            .iter()
            .map(|gi| {
                let g = &groups[*gi].facts;
                let mut entry =
                    json!({ "name": g.name, "instanceTypes": [g.instance_type], "subnets": [] });
                if let Some(subnet) = &g.subnet {
                    entry["subnets"] =
                        json!([{ "id": subnet, "zone": g.zone, "zoneId": g.zone_id }]);
                }
                if !g.labels.is_empty() {
                    entry["desiredLabels"] = json!(g.labels);
                }
                entry
            })
            .collect();
        class["status"] = json!({ "conditions": conditions, "instanceGroups": entries });
        upsert(store, Key::new(NODECLASSES, "", &name), class);
        if not_ready.is_empty() {
            ready.insert(name, found);
        }
    }
    ready
}

/// Writes each NodePool's status (ValidationSucceeded, NodeClassReady and Ready, as the
/// guide shows them, with its nodes and their resources) for those that name a
/// HyperpodNodeClass, and returns the ones on a Ready class: heaviest first, then by
/// name, the order Karpenter tries them in, each with the groups its requirements admit.
fn node_pools(
    store: &mut Store,
    groups: &[Group],
    classes: &BTreeMap<String, Vec<usize>>,
    now: &str,
) -> Vec<Pool> {
    let mut pools = Vec::new();
    for mut pool in snapshot(store, NODEPOOLS) {
        let reference = &pool["spec"]["template"]["spec"]["nodeClassRef"];
        if reference["group"] != NODECLASS_GROUP || reference["kind"] != "HyperpodNodeClass" {
            continue;
        }
        let name = meta(&pool, "name");
        let class = reference["name"].as_str().unwrap_or_default().to_owned();
        let usable = classes.get(&class);
        let (reason, message) = match usable {
            Some(_) => ("NodeClassReady", String::new()),
            None if store.get(&Key::new(NODECLASSES, "", &class)).is_some() => (
                "NodeClassNotReady",
                format!("HyperpodNodeClass {class} is not Ready"),
            ),
            None => (
                "NodeClassNotFound",
                format!("HyperpodNodeClass {class} not found"),
            ),
        };
        let (mut nodes, mut resources) = (0, [0u64; 3]);
        for n in store.list("/nodes", None) {
            if n["metadata"]["labels"][NODEPOOL_LABEL] == name.as_str() {
                nodes += 1;
                for (i, r) in RESOURCES.iter().enumerate() {
                    resources[i] += milli(&n["status"]["allocatable"][*r]);
                }
            }
        }
        let old = pool["status"].clone();
        let generation = pool["metadata"]["generation"].clone();
        let ok = usable.is_some();
        let mut status = json!({
            "conditions": [
                condition(&old, "ValidationSucceeded", true, "ValidationSucceeded", "", &generation, now),
                condition(&old, "NodeClassReady", ok, reason, &message, &generation, now),
                condition(&old, "Ready", ok, if ok { "Ready" } else { "NotReady" },
                          if ok { "" } else { "NodeClassReady=False" }, &generation, now),
            ],
            "nodes": nodes,
            "resources": { "nodes": nodes.to_string() },
        });
        for (i, r) in RESOURCES.iter().enumerate() {
            if resources[i] > 0 {
                status["resources"][*r] = json!((resources[i] / 1000).to_string());
            }
        }
        pool["status"] = status;
        upsert(store, Key::new(NODEPOOLS, "", &name), pool.clone());
        let Some(class_groups) = usable else {
            continue;
        };
        let template = &pool["spec"]["template"];
        let mut p = Pool {
            name,
            weight: pool["spec"]["weight"].as_i64().unwrap_or(0),
            groups: Vec::new(),
            labels: template["metadata"]["labels"]
                .as_object()
                .cloned()
                .unwrap_or_default(),
            taints: template["spec"]["taints"]
                .as_array()
                .cloned()
                .unwrap_or_default(),
            consolidate_after: consolidate_after(&pool["spec"]["disruption"]["consolidateAfter"]),
        };
        let requirements = &template["spec"]["requirements"];
        p.groups = class_groups
            .iter()
            .copied()
            .filter(|gi| admits(requirements, &node_labels(&groups[*gi], &p)))
            .collect();
        pools.push(p);
    }
    pools.sort_by(|a, b| b.weight.cmp(&a.weight).then_with(|| a.name.cmp(&b.name)));
    pools
}

/// `consolidateAfter` in seconds: `Never` (or a value the CRD's pattern refuses) is
/// never; absent is the CRD's default, `0s`.
fn consolidate_after(v: &Value) -> Option<f64> {
    let Some(s) = v.as_str() else {
        return Some(0.0);
    };
    let mut total = 0.0;
    let mut digits = String::new();
    for c in s.chars() {
        match c {
            '0'..='9' => digits.push(c),
            's' | 'm' | 'h' if !digits.is_empty() => {
                let n: f64 = digits.parse().ok()?;
                total += n * match c {
                    's' => 1.0,
                    'm' => 60.0,
                    _ => 3600.0,
                };
                digits.clear();
            }
            _ => return None,
        }
    }
    (digits.is_empty() && !s.is_empty()).then_some(total)
}

/// The labels a node of `g` carries once `pool` has it: those the sim's nodes controller
/// gives every HyperPod node, its group's, and Karpenter's with the pool's template.
fn node_labels(g: &Group, pool: &Pool) -> Map<String, Value> {
    let f = &g.facts;
    let mut labels = Map::new();
    for (k, v) in [
        ("kubernetes.io/os", "linux"),
        ("kubernetes.io/arch", "amd64"),
        ("node.kubernetes.io/instance-type", &f.instance_type),
        ("beta.kubernetes.io/instance-type", &f.instance_type),
        ("sagemaker.amazonaws.com/compute-type", "hyperpod"),
        ("sagemaker.amazonaws.com/cluster-name", &g.hyperpod),
        ("sagemaker.amazonaws.com/instance-group-name", &f.name),
        (HEALTH, "Schedulable"),
        ("topology.kubernetes.io/region", &f.region),
        ("topology.kubernetes.io/zone", &f.zone),
        ("topology.k8s.aws/zone-id", &f.zone_id),
    ] {
        labels.insert(k.to_owned(), json!(v));
    }
    for (k, v) in &f.labels {
        labels.entry(k.clone()).or_insert_with(|| json!(v));
    }
    for (k, v) in karpenter_labels(g, pool) {
        labels.insert(k, v);
    }
    labels
}

/// What Karpenter puts on its nodes: its well-known labels and the pool's template labels.
fn karpenter_labels(g: &Group, pool: &Pool) -> Map<String, Value> {
    let mut labels = pool.labels.clone();
    labels.insert(NODEPOOL_LABEL.to_owned(), json!(pool.name));
    labels.insert(
        CAPACITY_LABEL.to_owned(),
        json!(if g.facts.spot { "spot" } else { "on-demand" }),
    );
    labels.insert(REGISTERED_LABEL.to_owned(), json!("true"));
    labels.insert(INITIALIZED_LABEL.to_owned(), json!("true"));
    labels
}

/// Whether a NodePool's `requirements` admit a node with `labels`. A key a node does not
/// carry fails `In`, `Exists` and `Gt`/`Lt`, which keeps out groups a requirement on a
/// label the HyperPod provider does not support would need.
fn admits(requirements: &Value, labels: &Map<String, Value>) -> bool {
    requirements.as_array().into_iter().flatten().all(|r| {
        let have = r["key"]
            .as_str()
            .and_then(|k| labels.get(k))
            .and_then(Value::as_str);
        requirement_admits(r, have)
    })
}

fn add(a: Resources, b: Resources) -> Resources {
    [a[0] + b[0], a[1] + b[1], a[2] + b[2]]
}

fn within(need: Resources, room: Resources) -> bool {
    need.iter().zip(room).all(|(n, r)| *n <= r)
}

/// Pods the scheduler found no node for.
fn unschedulable(pod: &Value) -> bool {
    pod["spec"]["nodeName"].is_null()
        && !pod["metadata"]["deletionTimestamp"].is_string()
        && pod["status"]["conditions"].as_array().is_some_and(|cs| {
            cs.iter().any(|c| {
                c["type"] == "PodScheduled"
                    && c["status"] == "False"
                    && c["reason"] == "Unschedulable"
            })
        })
}

fn daemon_pod(pod: &Value) -> bool {
    pod["metadata"]["ownerReferences"]
        .as_array()
        .is_some_and(|refs| refs.iter().any(|r| r["kind"] == "DaemonSet"))
}

/// A node pods can be bound to: ready, healthy and not cordoned.
fn schedulable(node: &Value) -> bool {
    node_ready(node)
        && node["metadata"]["labels"][HEALTH] == "Schedulable"
        && node["spec"]["unschedulable"] != Value::Bool(true)
}

/// How many new nodes of room `room` the pods needing `needs` take, after the `in_flight`
/// nodes already launched (and empty) are filled: first fit, largest first.
fn new_nodes(mut needs: Vec<Resources>, room: Resources, in_flight: usize) -> usize {
    needs.sort_by(|a, b| b.cmp(a));
    let mut bins = vec![[0u64; 3]; in_flight];
    for need in needs {
        match bins.iter_mut().find(|b| within(add(**b, need), room)) {
            Some(b) => *b = add(*b, need),
            None => bins.push(need),
        }
    }
    bins.len() - in_flight
}

/// What the DaemonSets whose node selector a node with `labels` matches request on it.
fn daemon_overhead(daemonsets: &[Value], labels: &Map<String, Value>) -> Resources {
    let labels = Value::Object(labels.clone());
    daemonsets
        .iter()
        .filter(|ds| selector_matches(&ds["spec"]["template"]["spec"]["nodeSelector"], &labels))
        .fold([0; 3], |sum, ds| {
            add(sum, requests(&ds["spec"]["template"]))
        })
}

/// What one pass decides for HyperPod: the groups to grow (by how many nodes) and the
/// instances to delete, by HyperPod cluster.
pub(super) struct Plan {
    adds: Vec<(usize, u32)>,
    deletes: BTreeMap<String, Vec<String>>,
}

impl Plan {
    pub(super) fn is_empty(&self) -> bool {
        self.adds.is_empty() && self.deletes.is_empty()
    }
}

/// One pass of provisioning and consolidation. A pending pod goes to the first
/// pool (in Karpenter's order) and group whose nodes would take it; a group's new nodes
/// are those its pods do not fit in once its launched-but-not-yet-schedulable nodes are
/// counted. A schedulable node of a pool's group with no workload pods (DaemonSet pods
/// do not count) is deleted after the pool's `consolidateAfter`, unless pending pods are
/// waiting for that group. Karpenter's labels and taints are put on the pools' nodes,
/// and each node's empty-since time is kept, in the same write.
fn plan(store: &mut Store, groups: &[Group], pools: &[Pool], epoch_now: f64, now: &str) -> Plan {
    let owner = |gi: usize| pools.iter().find(|p| p.groups.contains(&gi));
    let daemonsets = snapshot(store, "apps/daemonsets");
    let mut busy = BTreeSet::new();
    let mut pending = Vec::new();
    for p in store.list("/pods", None) {
        if is_terminal(p) {
            continue;
        }
        match p["spec"]["nodeName"].as_str() {
            Some(node) if !daemon_pod(p) => {
                busy.insert(node.to_owned());
            }
            Some(_) => {}
            None if unschedulable(p) => pending.push((**p).clone()),
            None => {}
        }
    }
    // Where a pod may go, in Karpenter's order: each pool's groups, with the labels and
    // taints their nodes would have and what DaemonSets would take of them.
    let candidates: Vec<(usize, Value, Vec<Value>, Resources)> = pools
        .iter()
        .flat_map(|pool| pool.groups.iter().map(move |&gi| (pool, gi)))
        .map(|(pool, gi)| {
            let labels = node_labels(&groups[gi], pool);
            let taints = groups[gi]
                .facts
                .taints
                .iter()
                .chain(&pool.taints)
                .cloned()
                .collect();
            let overhead = daemon_overhead(&daemonsets, &labels);
            (gi, Value::Object(labels), taints, overhead)
        })
        .collect();
    let mut demand: BTreeMap<usize, (Resources, Vec<Resources>)> = BTreeMap::new();
    for pod in &pending {
        let need = requests(pod);
        let place = candidates.iter().find(|(gi, labels, taints, overhead)| {
            selector_matches(&pod["spec"]["nodeSelector"], labels)
                && tolerates(pod, taints)
                && within(add(need, *overhead), groups[*gi].capacity)
        });
        if let Some((gi, _, _, overhead)) = place {
            demand
                .entry(*gi)
                .or_insert((*overhead, Vec::new()))
                .1
                .push(need);
        }
    }

    let mut nodes_of: BTreeMap<usize, Vec<Value>> = BTreeMap::new();
    for n in store.list("/nodes", None) {
        let labels = &n["metadata"]["labels"];
        if labels["sagemaker.amazonaws.com/compute-type"] != "hyperpod" {
            continue;
        }
        if let Some(gi) = groups.iter().position(|g| {
            labels["sagemaker.amazonaws.com/cluster-name"] == g.hyperpod.as_str()
                && labels["sagemaker.amazonaws.com/instance-group-name"] == g.facts.name.as_str()
        }) {
            nodes_of.entry(gi).or_default().push((**n).clone());
        }
    }

    let mut adds = Vec::new();
    for (&gi, (overhead, needs)) in &demand {
        let g = &groups[gi];
        let usable = nodes_of
            .get(&gi)
            .map_or(0, |ns| ns.iter().filter(|n| schedulable(n)).count());
        let in_flight = (g.facts.target as usize).saturating_sub(usable);
        let room = [0, 1, 2].map(|i| g.capacity[i].saturating_sub(overhead[i]));
        let more = new_nodes(needs.clone(), room, in_flight);
        if more > 0 {
            adds.push((gi, more as u32));
        }
    }

    let mut deletes: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (gi, nodes) in nodes_of {
        let Some(pool) = owner(gi) else {
            continue;
        };
        let g = &groups[gi];
        for mut node in nodes {
            let name = meta(&node, "name");
            let before = node.clone();
            for (k, v) in karpenter_labels(g, pool) {
                node["metadata"]["labels"][k] = v;
            }
            for t in &pool.taints {
                let mut taints = node["spec"]["taints"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default();
                if !taints
                    .iter()
                    .any(|x| x["key"] == t["key"] && x["effect"] == t["effect"])
                {
                    taints.push(t.clone());
                    node["spec"]["taints"] = json!(taints);
                }
            }
            let since = node["metadata"]["annotations"][EMPTY_SINCE]
                .as_str()
                .and_then(parse_rfc3339);
            let empty = schedulable(&node) && !busy.contains(&name);
            if !empty {
                if let Some(a) = node["metadata"]["annotations"].as_object_mut() {
                    a.remove(EMPTY_SINCE);
                }
            } else {
                let since = since.unwrap_or_else(|| {
                    node["metadata"]["annotations"][EMPTY_SINCE] = json!(now);
                    epoch_now
                });
                let waited = pool
                    .consolidate_after
                    .is_some_and(|after| reached(epoch_now, since + after));
                if waited
                    && !demand.contains_key(&gi)
                    && let Some(id) = name.strip_prefix("hyperpod-")
                {
                    deletes
                        .entry(g.hyperpod.clone())
                        .or_default()
                        .push(id.to_owned());
                }
            }
            if node != before {
                store.put(Key::new("/nodes", "", &name), node);
            }
        }
    }
    Plan { adds, deletes }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consolidate_after_reads_karpenter_durations() {
        assert_eq!(consolidate_after(&json!("30s")), Some(30.0));
        assert_eq!(consolidate_after(&json!("1h30m")), Some(5400.0));
        assert_eq!(consolidate_after(&json!("0s")), Some(0.0));
        assert_eq!(
            consolidate_after(&Value::Null),
            Some(0.0),
            "the CRD's default"
        );
        assert_eq!(consolidate_after(&json!("Never")), None);
        assert_eq!(consolidate_after(&json!("30")), None);
    }

    #[test]
    fn requirements_admit_by_the_labels_a_node_would_carry() {
        let labels: Map<String, Value> = serde_json::from_value(json!({
            "node.kubernetes.io/instance-type": "ml.g5.8xlarge",
            "topology.kubernetes.io/zone": "us-east-1a",
            "kubernetes.io/arch": "amd64",
        }))
        .unwrap();
        let admit = |r: Value| admits(&json!([r]), &labels);
        assert!(admit(
            json!({"key": "node.kubernetes.io/instance-type", "operator": "Exists"})
        ));
        assert!(admit(
            json!({"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["us-east-1a", "us-east-1b"]})
        ));
        assert!(!admit(
            json!({"key": "topology.kubernetes.io/zone", "operator": "NotIn", "values": ["us-east-1a"]})
        ));
        assert!(!admit(
            json!({"key": "kubernetes.io/arch", "operator": "In", "values": ["arm64"]})
        ));
        assert!(!admit(
            json!({"key": "karpenter.k8s.aws/instance-family", "operator": "In", "values": ["g5"]})
        ));
        assert!(admit(
            json!({"key": "karpenter.k8s.aws/instance-family", "operator": "DoesNotExist"})
        ));
        assert!(admits(&Value::Null, &labels), "no requirements");
    }

    #[test]
    fn pending_pods_fill_launched_nodes_before_new_ones() {
        let gpu = |n: u64| [n * 1000, 0, 1000];
        let room = [8000, 0, 192_000];
        assert_eq!(new_nodes(vec![gpu(1)], room, 0), 1);
        assert_eq!(
            new_nodes(vec![gpu(1)], room, 1),
            0,
            "a node on its way takes it"
        );
        assert_eq!(new_nodes(vec![gpu(4), gpu(4), gpu(4)], room, 0), 2);
        assert_eq!(new_nodes(vec![gpu(2), gpu(6), gpu(3), gpu(5)], room, 0), 2);
        assert_eq!(new_nodes(Vec::new(), room, 3), 0);
    }

    #[test]
    fn pods_count_requests_or_limits_and_tolerate_noschedule_taints() {
        let pod = json!({"spec": {"containers": [
            {"resources": {"limits": {"nvidia.com/gpu": "1"}, "requests": {"cpu": "500m"}}},
            {"resources": {"requests": {"cpu": "2", "vpc.amazonaws.com/efa": 1}}},
        ], "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}]}});
        assert_eq!(requests(&pod), [1000, 1000, 2500]);
        let gpu = json!({"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"});
        let other = json!({"key": "team", "value": "a", "effect": "NoSchedule"});
        let soft = json!({"key": "team", "value": "a", "effect": "PreferNoSchedule"});
        assert!(tolerates(&pod, &[gpu.clone(), soft]));
        assert!(!tolerates(&pod, &[gpu, other]));
    }
}
