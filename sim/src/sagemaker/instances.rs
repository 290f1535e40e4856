//! HyperPod instances as ListClusterNodes and DescribeClusterNode report them: a node's
//! status is a function of the clock (boot, deep health checks, an action under way), so
//! it is computed when read and never stored.

use serde_json::{Value, json};

use super::groups::{is_spot, kubernetes_details};
use super::placement::{private_dns, private_ip};
use super::{
    Cluster, DEEP_HEALTH_CHECK_SECS, Group, NODE_BOOT_SECS, Node, Order, nodes, page, str_field,
    validation,
};
use crate::clock::reached;
use crate::world::{Aws, AwsError};

pub(super) fn node_status(node: &Node, group: &Group, now: f64) -> &'static str {
    if let Some(status) = nodes::action_status(node, now) {
        return status;
    }
    // A node the health agent found faulty is unhealthy until HyperPod recovers it.
    if node.health.is_some() {
        return "Failure";
    }
    let booted = node.launched + NODE_BOOT_SECS;
    if !reached(now, booted) {
        "Pending"
    } else if group.deep_health_checks && !reached(now, booted + DEEP_HEALTH_CHECK_SECS) {
        "DeepHealthCheckInProgress"
    } else {
        "Running"
    }
}

pub(super) fn instance_id(serial: u64) -> String {
    format!("i-{:017x}", 0x0ab0_0000 + serial)
}

/// A node as ListClusterNodes and DescribeClusterNode report it.
pub(super) fn node_json(
    clock: &crate::world::Clock,
    c: &Cluster,
    g: &Group,
    n: &Node,
    now: f64,
) -> Value {
    let mut v = json!({
        "InstanceGroupName": g.name,
        "InstanceId": n.id,
        "InstanceType": g.instance_type,
        "NodeLogicalId": n.logical_id,
        "LaunchTime": clock.epoch(n.launched),
        "InstanceStatus": { "Status": node_status(n, g, now), "Message": "" },
        "PrivateDnsHostname": private_dns(&private_ip(&n.id, g.placement.cidr), &c.region),
        "CurrentImageReleaseVersion": n.release,
    });
    if let Some(t) = n.software_updated {
        v["LastSoftwareUpdateTime"] = json!(clock.epoch(t));
    }
    v
}

pub(super) fn list_nodes(w: &mut Aws, body: &Value) -> Result<Value, AwsError> {
    let now = w.clock.now();
    let c = w
        .hyperpod(str_field(body, "ClusterName").unwrap_or_default())?
        .clone();
    let filter = str_field(body, "InstanceGroupNameContains").unwrap_or_default();
    let after = body.get("CreationTimeAfter").and_then(Value::as_f64);
    let before = body.get("CreationTimeBefore").and_then(Value::as_f64);
    let clock = &w.clock;
    let mut nodes: Vec<(&Group, &Node)> = c
        .groups
        .iter()
        .filter(|g| g.name.contains(filter))
        .flat_map(|g| g.nodes.iter().map(move |n| (g, n)))
        .filter(|(_, n)| after.is_none_or(|a| clock.epoch(n.launched) > a))
        .filter(|(_, n)| before.is_none_or(|b| clock.epoch(n.launched) < b))
        .collect();
    // Stable sorts: nodes launched together keep their slots' order, so pages do not
    // shuffle between calls.
    match str_field(body, "SortBy").unwrap_or("CREATION_TIME") {
        "CREATION_TIME" => nodes.sort_by(|a, b| a.1.launched.total_cmp(&b.1.launched)),
        // A node has no name of its own; its instance group's name is the one it lists by.
        "NAME" => nodes.sort_by(|a, b| {
            (a.0.name.as_str(), a.1.launched)
                .partial_cmp(&(b.0.name.as_str(), b.1.launched))
                .unwrap_or(std::cmp::Ordering::Equal)
        }),
        other => {
            return Err(validation(format!(
                "1 validation error detected: Value '{other}' at 'sortBy' failed to satisfy constraint: Member must satisfy enum value set: [CREATION_TIME, NAME]"
            )));
        }
    }
    let (nodes, next) = page(body, nodes, Order::Ascending)?;
    let summaries: Vec<Value> = nodes
        .into_iter()
        .map(|(g, n)| node_json(clock, &c, g, n, now))
        .collect();
    Ok(json!({ "ClusterNodeSummaries": summaries, "NextToken": next }))
}

pub(super) fn describe_node(w: &mut Aws, body: &Value) -> Result<Value, AwsError> {
    let now = w.clock.now();
    let c = w
        .hyperpod(str_field(body, "ClusterName").unwrap_or_default())?
        .clone();
    let id = str_field(body, "NodeId")
        .or_else(|| str_field(body, "NodeLogicalId"))
        .unwrap_or_default();
    for g in &c.groups {
        if let Some(n) = g.nodes.iter().find(|n| n.id == id || n.logical_id == id) {
            let mut details = node_json(&w.clock, &c, g, n, now);
            if let Some(o) = details.as_object_mut() {
                o.insert(
                    "PrivatePrimaryIp".into(),
                    json!(private_ip(&n.id, g.placement.cidr)),
                );
                o.insert("Placement".into(), g.placement.json());
                let updating = matches!(c.status(now, false), "Creating" | "Updating");
                let desired = g.spec.get("KubernetesConfig");
                let current = if updating {
                    &g.previous_kubernetes
                } else {
                    desired.unwrap_or(&Value::Null)
                };
                if let Some(k) = kubernetes_details(desired, current) {
                    o.insert("KubernetesConfig".into(), k);
                }
                o.insert(
                    "LifeCycleConfig".into(),
                    g.spec
                        .get("LifeCycleConfig")
                        .cloned()
                        .unwrap_or(Value::Null),
                );
                o.insert(
                    "ThreadsPerCore".into(),
                    g.spec.get("ThreadsPerCore").cloned().unwrap_or(Value::Null),
                );
                o.insert(
                    "CapacityType".into(),
                    json!(if is_spot(&g.spec) { "Spot" } else { "OnDemand" }),
                );
                for key in [
                    "NetworkInterface",
                    "OverrideVpcConfig",
                    "InstanceStorageConfigs",
                ] {
                    if let Some(v) = g.spec.get(key) {
                        o.insert(key.into(), v.clone());
                    }
                }
                o.insert(
                    "DesiredImageReleaseVersion".into(),
                    json!(g.desired_release),
                );
            }
            return Ok(json!({ "NodeDetails": details }));
        }
    }
    Err(AwsError::new(
        400,
        "ResourceNotFound",
        format!("Node {id} not found in cluster {}", c.name),
    ))
}
