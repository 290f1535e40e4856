//! Instance groups: a request's group checked as AWS checks it (names, counts, the
//! instance type's facts, lifecycle script, `KubernetesConfig`) into its stored form, and
//! a group brought to its target count. Only what the request itself says is checked
//! here; how a group fits its cluster is `clusters`'s to check.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::instances::{instance_id, node_status};
use super::{Group, Node, Placement, check_name, instance_types, nodes, str_field, validation};
use crate::world::{Aws, AwsError};

/// Checks one instance group of a request and returns its stored form.
pub(super) fn parse_group(
    g: &Value,
    index: usize,
    table: &BTreeMap<String, instance_types::InstanceType>,
) -> Result<Group, AwsError> {
    let at = |field: &str| format!("instanceGroups.{}.member.{field}", index + 1);
    let name = str_field(g, "InstanceGroupName")
        .ok_or_else(|| validation(format!("{} is required", at("instanceGroupName"))))?;
    check_name(name, &at("instanceGroupName"))?;
    let instance_type = str_field(g, "InstanceType").unwrap_or_default();
    let Some(facts) = table.get(instance_type) else {
        return Err(validation(format!(
            "1 validation error detected: Value '{instance_type}' at '{}' failed to satisfy constraint: Member must be one of the supported HyperPod instance types",
            at("instanceType")
        )));
    };
    check_instance_facts(g, name, instance_type, facts)?;
    let target = instance_count(g, "InstanceCount", &at("instanceCount"))?.unwrap_or(0);
    if let Some(min) = instance_count(g, "MinInstanceCount", &at("minInstanceCount"))?
        && min > target
    {
        return Err(validation(format!(
            "MinInstanceCount ({min}) of instance group {name} must be less than or equal to its InstanceCount ({target})"
        )));
    }
    if str_field(g, "ExecutionRole").is_none() {
        return Err(validation(format!("{} is required", at("executionRole"))));
    }
    let lifecycle = g.get("LifeCycleConfig");
    let uri = lifecycle
        .and_then(|l| str_field(l, "SourceS3Uri"))
        .unwrap_or_default();
    if !uri.starts_with("s3://")
        || lifecycle
            .and_then(|l| str_field(l, "OnCreate"))
            .unwrap_or_default()
            .is_empty()
    {
        return Err(validation(format!(
            "{} needs SourceS3Uri (s3://…) and OnCreate",
            at("lifeCycleConfig")
        )));
    }
    check_kubernetes_config(g.get("KubernetesConfig"), &at("kubernetesConfig"))?;
    let deep_health_checks = g
        .get("OnStartDeepHealthChecks")
        .and_then(Value::as_array)
        .is_some_and(|a| !a.is_empty());
    let release = match str_field(g, "ImageReleaseVersion") {
        Some(r) => nodes::check_release(r)?,
        None => nodes::latest_release(),
    };
    Ok(Group {
        name: name.to_owned(),
        instance_type: instance_type.to_owned(),
        target,
        spec: g.clone(),
        deep_health_checks,
        nodes: Vec::new(),
        release: release.clone(),
        desired_release: release,
        placement: Placement::default(),
        previous_kubernetes: Value::Null,
    })
}

/// A count of instances in a group, if given: the model's `ClusterInstanceCount`, 0 to
/// 6758.
pub(super) fn instance_count(g: &Value, field: &str, at: &str) -> Result<Option<u32>, AwsError> {
    let Some(v) = g.get(field).filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    match v.as_i64() {
        Some(n @ 0..=6758) => Ok(Some(n as u32)),
        Some(n) if n < 0 => Err(validation(format!(
            "1 validation error detected: Value '{n}' at '{at}' failed to satisfy constraint: Member must have value greater than or equal to 0"
        ))),
        Some(n) => Err(validation(format!(
            "1 validation error detected: Value '{n}' at '{at}' failed to satisfy constraint: Member must have value less than or equal to 6758"
        ))),
        None => Err(validation(format!("{at} must be an integer, not {v}"))),
    }
}

/// What the instance type allows: threads per core, EFA-only interfaces, Spot.
pub(super) fn check_instance_facts(
    g: &Value,
    group: &str,
    instance_type: &str,
    facts: &instance_types::InstanceType,
) -> Result<(), AwsError> {
    if let Some(threads) = g.get("ThreadsPerCore").and_then(Value::as_u64)
        && !facts
            .threads_per_core
            .iter()
            .any(|t| u64::from(*t) == threads)
    {
        return Err(validation(format!(
            "ThreadsPerCore {threads} is not supported for instance type {instance_type} of instance group {group}; supported values: {:?}",
            facts.threads_per_core
        )));
    }
    match g
        .pointer("/NetworkInterface/InterfaceType")
        .and_then(Value::as_str)
    {
        None | Some("efa") => {}
        Some("efa-only") if facts.efa_only => {}
        Some("efa-only") => {
            return Err(validation(format!(
                "InterfaceType efa-only is not supported for instance type {instance_type} of instance group {group}: EFA-only interfaces need an instance type with multiple EFA network cards"
            )));
        }
        Some(other) => {
            return Err(validation(format!(
                "1 validation error detected: Value '{other}' at 'networkInterface.interfaceType' failed to satisfy constraint: Member must satisfy enum value set: [efa, efa-only]"
            )));
        }
    }
    if let Some(capacity) = g.get("CapacityRequirements") {
        let spot = capacity.get("Spot").is_some();
        if spot == capacity.get("OnDemand").is_some() {
            return Err(validation(format!(
                "CapacityRequirements of instance group {group} must specify exactly one of Spot or OnDemand"
            )));
        }
        if spot && !facts.spot {
            return Err(validation(format!(
                "Spot capacity is not available for instance type {instance_type} of instance group {group}"
            )));
        }
        if spot && g.get("TrainingPlanArn").is_some() {
            return Err(validation(format!(
                "Instance group {group} cannot use Spot capacity with a training plan; training plans reserve On-Demand capacity"
            )));
        }
    }
    Ok(())
}

pub(super) fn is_spot(g: &Value) -> bool {
    g.pointer("/CapacityRequirements/Spot").is_some()
}

/// A group's `KubernetesConfig` (`Labels` and `Taints`, at most 50 of each, every taint
/// with a `Key` and one of Kubernetes' three effects).
pub(super) fn check_kubernetes_config(config: Option<&Value>, at: &str) -> Result<(), AwsError> {
    let Some(config) = config else {
        return Ok(());
    };
    if let Some(labels) = config.get("Labels") {
        let Some(labels) = labels
            .as_object()
            .filter(|l| l.values().all(Value::is_string))
        else {
            return Err(validation(format!(
                "{at}.labels must map label keys to string values"
            )));
        };
        if labels.len() > 50 {
            return Err(validation(format!(
                "1 validation error detected: Value at '{at}.labels' failed to satisfy constraint: Member must have length less than or equal to 50"
            )));
        }
    }
    let taints = config
        .get("Taints")
        .and_then(Value::as_array)
        .map_or(&[][..], Vec::as_slice);
    if taints.len() > 50 {
        return Err(validation(format!(
            "1 validation error detected: Value at '{at}.taints' failed to satisfy constraint: Member must have length less than or equal to 50"
        )));
    }
    for (i, t) in taints.iter().enumerate() {
        let member = format!("{at}.taints.{}.member", i + 1);
        if str_field(t, "Key").is_none_or(str::is_empty) {
            return Err(validation(format!("{member}.key is required")));
        }
        let effect = str_field(t, "Effect").unwrap_or_default();
        if !matches!(effect, "NoSchedule" | "PreferNoSchedule" | "NoExecute") {
            return Err(validation(format!(
                "1 validation error detected: Value '{effect}' at '{member}.effect' failed to satisfy constraint: Member must satisfy enum value set: [NoSchedule, PreferNoSchedule, NoExecute]"
            )));
        }
    }
    Ok(())
}

/// `KubernetesConfig` as DescribeCluster and DescribeClusterNode report it: the labels
/// and taints the nodes carry (`current`, a request's `{Labels, Taints}`) and those asked
/// for (`desired`); none when the group never had any.
pub(super) fn kubernetes_details(desired: Option<&Value>, current: &Value) -> Option<Value> {
    let desired = desired.unwrap_or(&Value::Null);
    if desired.is_null() && current.is_null() {
        return None;
    }
    let mut out = serde_json::Map::new();
    for (field, from) in [("Current", current), ("Desired", desired)] {
        for key in ["Labels", "Taints"] {
            if let Some(v) = from.get(key) {
                out.insert(format!("{field}{key}"), v.clone());
            }
        }
    }
    Some(Value::Object(out))
}

pub(super) fn group_labels(g: &Group) -> BTreeMap<String, String> {
    g.spec
        .pointer("/KubernetesConfig/Labels")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
        .collect()
}

pub(super) fn group_taints(g: &Group) -> Vec<Value> {
    g.spec
        .pointer("/KubernetesConfig/Taints")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|t| {
            let mut taint = json!({ "key": t["Key"], "effect": t["Effect"] });
            if let Some(v) = str_field(t, "Value") {
                taint["value"] = json!(v);
            }
            taint
        })
        .collect()
}

impl Aws {
    /// Brings `group` to its target count: new nodes launch at `now`; when there are too
    /// many, AWS takes the ones not (yet) Running first, then the newest.
    pub(super) fn launch(&mut self, group: &mut Group, now: f64) {
        while (group.nodes.len() as u32) < group.target {
            self.sagemaker.nodes += 1;
            let serial = self.sagemaker.nodes;
            group.nodes.push(Node {
                id: instance_id(serial),
                logical_id: format!("{}-{serial:08x}", group.name),
                launched: now,
                release: group.desired_release.clone(),
                action: None,
                software_updated: None,
                health: None,
                boots: 0,
                rebooted: None,
            });
        }
        let excess = group.nodes.len().saturating_sub(group.target as usize);
        if excess > 0 {
            let clock = self.clock.now();
            let mut order: Vec<(bool, f64, usize)> = group
                .nodes
                .iter()
                .enumerate()
                .map(|(i, n)| (node_status(n, group, clock) == "Running", n.launched, i))
                .collect();
            // Not Running before Running, then newest (latest launch, later slot) first.
            order.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.total_cmp(&a.1)).then(b.2.cmp(&a.2)));
            let gone: std::collections::BTreeSet<usize> =
                order.iter().take(excess).map(|(_, _, i)| *i).collect();
            let mut index = 0;
            group.nodes.retain(|_| {
                index += 1;
                !gone.contains(&(index - 1))
            });
        }
    }
}
