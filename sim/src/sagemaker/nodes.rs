//! HyperPod node actions (BatchDelete/Reboot/ReplaceClusterNodes) and platform software
//! updates (UpdateClusterSoftware). A node's action is a record with a start time; the
//! node's status is read off the clock and the action is folded into the node when it
//! is over, so a test that speeds the clock up sees every pending action finish.

use serde_json::{Value, json};

use super::lookups::strings;
use super::{Cluster, Group, Node, str_field, validation};
use crate::clock::reached;
use crate::world::{Aws, AwsError};

/// Simulated seconds each node action takes.
pub const REBOOT_SECS: f64 = 180.0;
pub const SHUTDOWN_SECS: f64 = 120.0;
pub const SOFTWARE_UPDATE_SECS: f64 = 600.0;
/// Simulated seconds between a node being marked for recovery and HyperPod acting on it.
pub const RECOVERY_DELAY_SECS: f64 = 60.0;

/// HyperPod platform image releases, oldest first; new groups get the newest.
pub const IMAGE_RELEASES: &[&str] = &["2025.06.04", "2025.09.15", "2025.11.20"];

pub fn latest_release() -> String {
    IMAGE_RELEASES
        .last()
        .copied()
        .unwrap_or_default()
        .to_owned()
}

/// What is happening to a node; `since` may lie in the future for a node that waits for
/// its batch of a rolling software update.
#[derive(Clone, Debug, PartialEq)]
pub enum NodeAction {
    Reboot { since: f64 },
    Replace { since: f64, new_id: String },
    SoftwareUpdate { since: f64, release: String },
}

/// What HyperPod's health-monitoring agent (or a user's Node label) asks for a node.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Recovery {
    Reboot,
    Replace,
}

impl Recovery {
    /// The `sagemaker.amazonaws.com/node-health-status` value that asks for it.
    pub fn label(self) -> &'static str {
        match self {
            Recovery::Reboot => "UnschedulablePendingReboot",
            Recovery::Replace => "UnschedulablePendingReplacement",
        }
    }

    pub fn from_label(label: &str) -> Option<Self> {
        [Recovery::Reboot, Recovery::Replace]
            .into_iter()
            .find(|r| r.label() == label)
    }
}

/// What the health-monitoring agent reports when a fault body gives no message: the
/// kernel's line for a GPU fallen off the PCI bus (Xid 79).
const XID_79_MESSAGE: &str =
    "NVRM: Xid (PCI:0000:b9:00): 79, pid=<unknown>, name=<unknown>, GPU has fallen off the bus.";

/// A fault the health-monitoring agent found on a node, as it reports it on the Node:
/// `fault_type` names the Node condition and the `fault-type` label.
#[derive(Clone, Debug, PartialEq)]
pub struct HealthFault {
    pub fault_type: String,
    pub fault_reason: String,
    pub message: String,
}

impl HealthFault {
    /// What the agent reports of a GPU fallen off the bus, for the recovery it asks for:
    /// the fault type is how AWS names a fault by the action it needs.
    pub fn for_recovery(recovery: Recovery) -> Self {
        Self {
            fault_type: match recovery {
                Recovery::Reboot => "NvidiaErrorReboot",
                Recovery::Replace => "NvidiaErrorTerminate",
            }
            .to_owned(),
            fault_reason: "XidHardwareFailure".to_owned(),
            message: XID_79_MESSAGE.to_owned(),
        }
    }
}

/// A recovery a node is owed since `since`, for the agent's `fault`; none is a user's
/// label, which HyperPod honours whatever the cluster's NodeRecovery says, as it does
/// its APIs.
#[derive(Clone, Debug, PartialEq)]
pub struct Health {
    pub recovery: Recovery,
    pub since: f64,
    pub fault: Option<HealthFault>,
}

impl Health {
    pub fn requested(&self) -> bool {
        self.fault.is_none()
    }
}

/// The status an action shows, if one is under way.
pub fn action_status(node: &Node, now: f64) -> Option<&'static str> {
    match node.action.as_ref()? {
        NodeAction::Reboot { .. } => Some("Pending"),
        NodeAction::Replace { .. } => Some("ShuttingDown"),
        NodeAction::SoftwareUpdate { since, .. } => {
            reached(now, *since).then_some("SystemUpdating")
        }
    }
}

impl Aws {
    /// Folds the finished node actions of cluster `name` into its nodes, and finished
    /// software updates into its groups and itself.
    pub(super) fn settle_nodes(&mut self, name: &str) {
        let now = self.clock.now();
        let stuck_reboot = self.stuck("sagemaker", "BatchRebootClusterNodes");
        let stuck_replace = self.stuck("sagemaker", "BatchReplaceClusterNodes");
        let stuck_update = self.stuck("sagemaker", "UpdateClusterSoftware");
        let serial = &mut self.sagemaker.nodes;
        let Some(c) = self.sagemaker.clusters.get_mut(name) else {
            return;
        };
        let automatic = c.node_recovery == "Automatic";
        for g in &mut c.groups {
            for n in &mut g.nodes {
                if let Some(h) = n.health.clone().filter(|_| n.action.is_none()) {
                    let at = h.since + RECOVERY_DELAY_SECS;
                    if (automatic || h.requested()) && reached(now, at) {
                        n.action = Some(match h.recovery {
                            Recovery::Reboot => NodeAction::Reboot { since: at },
                            Recovery::Replace => {
                                *serial += 1;
                                NodeAction::Replace {
                                    since: at,
                                    new_id: super::instances::instance_id(*serial),
                                }
                            }
                        });
                    }
                }
                match n.action.clone() {
                    Some(NodeAction::Reboot { since })
                        if !stuck_reboot && reached(now, since + REBOOT_SECS) =>
                    {
                        n.action = None;
                        n.health = None;
                        n.boots += 1;
                        n.rebooted = Some(since + REBOOT_SECS);
                    }
                    Some(NodeAction::Replace { since, new_id })
                        if !stuck_replace && reached(now, since + SHUTDOWN_SECS) =>
                    {
                        n.id = new_id;
                        n.launched = since + SHUTDOWN_SECS;
                        n.action = None;
                        n.software_updated = None;
                        n.health = None;
                        n.boots = 0;
                        n.rebooted = None;
                    }
                    Some(NodeAction::SoftwareUpdate { since, release })
                        if !stuck_update && reached(now, since + SOFTWARE_UPDATE_SECS) =>
                    {
                        n.release = release;
                        n.action = None;
                        n.software_updated = Some(since + SOFTWARE_UPDATE_SECS);
                    }
                    _ => {}
                }
            }
            let updating = g
                .nodes
                .iter()
                .any(|n| matches!(n.action, Some(NodeAction::SoftwareUpdate { .. })));
            if !updating {
                g.release = g.desired_release.clone();
            }
        }
        if c.system_update && c.groups.iter().all(|g| g.release == g.desired_release) {
            c.system_update = false;
        }
    }
}

impl Aws {
    /// Marks node `id` of HyperPod cluster `cluster` as owed `recovery`, for the health
    /// agent's `fault` or (none) at a user's request. None when either is unknown; false
    /// when the node is busy with an action already.
    pub fn mark_node_for_recovery(
        &mut self,
        cluster: &str,
        id: &str,
        recovery: Recovery,
        fault: Option<HealthFault>,
    ) -> Option<bool> {
        self.settle_hyperpod(cluster);
        let now = self.clock.now();
        let c = self.sagemaker.clusters.get_mut(cluster)?;
        let node = c
            .groups
            .iter_mut()
            .flat_map(|g| g.nodes.iter_mut())
            .find(|n| n.id == id)?;
        if node.action.is_some() {
            return Some(false);
        }
        node.health = Some(Health {
            recovery,
            since: now,
            fault,
        });
        Some(true)
    }
}

fn id_list(body: &Value, key: &str) -> Vec<String> {
    strings(body.get(key)).map(str::to_owned).collect()
}

/// Where a named node is: (group index, node index) in `cluster`, or which other
/// cluster holds it.
enum Found {
    Here(usize, usize),
    Elsewhere(String),
    Nowhere,
}

fn find(w: &Aws, cluster: &str, id: &str, logical: bool) -> Found {
    let matches = |n: &Node| {
        if logical {
            n.logical_id == id
        } else {
            n.id == id
        }
    };
    for c in w.sagemaker.clusters.values() {
        for (gi, g) in c.groups.iter().enumerate() {
            if let Some(ni) = g.nodes.iter().position(matches) {
                return if c.name == cluster {
                    Found::Here(gi, ni)
                } else {
                    Found::Elsewhere(c.name.clone())
                };
            }
        }
    }
    Found::Nowhere
}

/// `i-` and 8 or 17 lowercase hex digits, as EC2 instance ids are.
fn is_instance_id(id: &str) -> bool {
    id.strip_prefix("i-").is_some_and(|hex| {
        matches!(hex.len(), 8 | 17)
            && hex
                .chars()
                .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c))
    })
}

/// The three batch actions, their per-node error codes and their request limit.
#[derive(Clone, Copy, PartialEq)]
enum Batch {
    Delete,
    Reboot,
    Replace,
}

impl Batch {
    fn limit(self) -> usize {
        match self {
            Batch::Delete => 99,
            Batch::Reboot | Batch::Replace => 25,
        }
    }

    fn not_found(self) -> &'static str {
        match self {
            Batch::Delete => "NodeIdNotFound",
            _ => "InstanceIdNotFound",
        }
    }

    fn in_use(self) -> &'static str {
        match self {
            Batch::Delete => "NodeIdInUse",
            _ => "InstanceIdInUse",
        }
    }

    fn invalid_status(self) -> &'static str {
        match self {
            Batch::Delete => "InvalidNodeStatus",
            _ => "InvalidInstanceStatus",
        }
    }

    /// Delete's error entries call the field `Code`; reboot's and replace's `ErrorCode`.
    fn code_field(self) -> &'static str {
        match self {
            Batch::Delete => "Code",
            _ => "ErrorCode",
        }
    }
}

fn batch(w: &mut Aws, body: &Value, kind: Batch) -> Result<Value, AwsError> {
    let name = str_field(body, "ClusterName").unwrap_or_default();
    // A node named here may belong to any cluster (and be refused as another's), so
    // every cluster is read as it is now.
    w.settle_sagemaker();
    let now = w.clock.now();
    let cluster = w.hyperpod(name)?.clone();
    let status = cluster.status(now, false);
    if matches!(status, "Creating" | "Deleting") {
        return Err(validation(format!(
            "Cluster {} is {status}; nodes can be changed only when it is InService",
            cluster.name
        )));
    }
    let ids = id_list(body, "NodeIds");
    let logical = id_list(body, "NodeLogicalIds");
    if ids.is_empty() && logical.is_empty() {
        return Err(validation(
            "Either NodeIds or NodeLogicalIds must be provided",
        ));
    }
    for (key, list) in [("nodeIds", &ids), ("nodeLogicalIds", &logical)] {
        if list.len() > kind.limit() {
            return Err(validation(format!(
                "1 validation error detected: Value at '{key}' failed to satisfy constraint: Member must have length less than or equal to {}",
                kind.limit()
            )));
        }
    }
    if let Some(bad) = ids.iter().find(|id| !is_instance_id(id)) {
        return Err(validation(format!(
            "1 validation error detected: Value '{bad}' at 'nodeIds' failed to satisfy constraint: Member must satisfy regular expression pattern: i-[a-f0-9]{{8}}(?:[a-f0-9]{{9}})?"
        )));
    }
    let mut out = serde_json::Map::new();
    for (is_logical, list, ok_key, failed_key, id_key) in [
        (false, &ids, "Successful", "Failed", "NodeId"),
        (
            true,
            &logical,
            "SuccessfulNodeLogicalIds",
            "FailedNodeLogicalIds",
            "NodeLogicalId",
        ),
    ] {
        if list.is_empty() {
            continue;
        }
        let mut successful = Vec::new();
        let mut failed = Vec::new();
        for id in list {
            let refuse = |code: &str, message: String| json!({ id_key: id, kind.code_field(): code, "Message": message });
            let (gi, ni) = match find(w, &cluster.name, id, is_logical) {
                Found::Here(gi, ni) => (gi, ni),
                Found::Elsewhere(other) => {
                    failed.push(refuse(
                        kind.not_found(),
                        format!(
                            "Node {id} belongs to cluster {other}, not to cluster {}",
                            cluster.name
                        ),
                    ));
                    continue;
                }
                Found::Nowhere => {
                    failed.push(refuse(
                        kind.not_found(),
                        format!("Node {id} not found in cluster {}", cluster.name),
                    ));
                    continue;
                }
            };
            let c = w.hyperpod(&cluster.name)?;
            let group: &mut Group = &mut c.groups[gi];
            let node_status = super::instances::node_status(&group.nodes[ni], group, now);
            if group.nodes[ni].action.is_some() || node_status == "SystemUpdating" {
                failed.push(refuse(
                    kind.in_use(),
                    format!("Node {id} is {node_status}; wait until its current operation ends"),
                ));
                continue;
            }
            // A node awaiting recovery is no longer Running, yet rebooting or replacing
            // it is exactly what it waits for.
            let awaits_recovery = group.nodes[ni].health.is_some();
            if kind != Batch::Delete && node_status != "Running" && !awaits_recovery {
                failed.push(refuse(
                    kind.invalid_status(),
                    format!("Node {id} is {node_status}; only Running nodes can be changed"),
                ));
                continue;
            }
            match kind {
                Batch::Delete => {
                    group.nodes.remove(ni);
                    group.target = group.target.saturating_sub(1);
                    if let Some(o) = group.spec.as_object_mut() {
                        o.insert("InstanceCount".into(), json!(group.target));
                    }
                }
                Batch::Reboot => {
                    group.nodes[ni].action = Some(NodeAction::Reboot { since: now });
                }
                Batch::Replace => {
                    w.sagemaker.nodes += 1;
                    let new_id = super::instances::instance_id(w.sagemaker.nodes);
                    let c = w.hyperpod(&cluster.name)?;
                    c.groups[gi].nodes[ni].action =
                        Some(NodeAction::Replace { since: now, new_id });
                }
            }
            successful.push(json!(id));
        }
        out.insert(ok_key.into(), json!(successful));
        out.insert(failed_key.into(), json!(failed));
    }
    Ok(Value::Object(out))
}

pub fn batch_delete(w: &mut Aws, body: &Value) -> Result<Value, AwsError> {
    batch(w, body, Batch::Delete)
}

pub fn batch_reboot(w: &mut Aws, body: &Value) -> Result<Value, AwsError> {
    batch(w, body, Batch::Reboot)
}

pub fn batch_replace(w: &mut Aws, body: &Value) -> Result<Value, AwsError> {
    batch(w, body, Batch::Replace)
}

/// How many nodes a rolling update takes at once.
fn batch_size(body: &Value, nodes: usize) -> Result<usize, AwsError> {
    let Some(size) = body.pointer("/DeploymentConfig/RollingUpdatePolicy/MaximumBatchSize") else {
        return Ok(nodes.max(1));
    };
    let value = size.get("Value").and_then(Value::as_u64).unwrap_or(0) as usize;
    match str_field(size, "Type") {
        Some("INSTANCE_COUNT") if value >= 1 => Ok(value),
        Some("CAPACITY_PERCENTAGE") if (1..=100).contains(&value) => {
            Ok((nodes * value).div_ceil(100).max(1))
        }
        _ => Err(validation(
            "MaximumBatchSize needs Type INSTANCE_COUNT (Value >= 1) or CAPACITY_PERCENTAGE (Value 1-100)",
        )),
    }
}

pub fn update_software(w: &mut Aws, body: &Value) -> Result<Value, AwsError> {
    let name = str_field(body, "ClusterName").unwrap_or_default();
    let now = w.clock.now();
    let cluster: Cluster = w.hyperpod(name)?.clone();
    let status = cluster.status(now, false);
    if status != "InService" {
        return Err(AwsError::new(
            400,
            "ConflictException",
            format!(
                "Cluster {} is {status}; its software can be updated only when it is InService",
                cluster.name
            ),
        ));
    }
    // Without a list every group moves to the newest release.
    let mut targets: Vec<(String, String)> = Vec::new();
    match body.get("InstanceGroups").and_then(Value::as_array) {
        Some(groups) if !groups.is_empty() => {
            for g in groups {
                let group = str_field(g, "InstanceGroupName").unwrap_or_default();
                if !cluster.groups.iter().any(|x| x.name == group) {
                    return Err(validation(format!(
                        "Instance group {group} does not exist in cluster {}",
                        cluster.name
                    )));
                }
                let release = match str_field(g, "ImageReleaseVersion") {
                    Some(r) => check_release(r)?,
                    None => latest_release(),
                };
                targets.push((group.to_owned(), release));
            }
        }
        _ => {
            let release = latest_release();
            targets.extend(
                cluster
                    .groups
                    .iter()
                    .map(|g| (g.name.clone(), release.clone())),
            );
        }
    }
    let total: usize = cluster.groups.iter().map(|g| g.nodes.len()).sum();
    let per_batch = batch_size(body, total)?;
    let wait = body
        .pointer("/DeploymentConfig/WaitIntervalInSeconds")
        .and_then(Value::as_f64)
        .unwrap_or(0.0);
    let c = w.hyperpod(name)?;
    let mut index = 0usize;
    for g in &mut c.groups {
        let Some((_, release)) = targets.iter().find(|(n, _)| *n == g.name) else {
            continue;
        };
        g.desired_release = release.clone();
        for n in &mut g.nodes {
            if n.release == *release {
                continue;
            }
            let round = (index / per_batch) as f64;
            n.action = Some(NodeAction::SoftwareUpdate {
                since: now + round * (SOFTWARE_UPDATE_SECS + wait),
                release: release.clone(),
            });
            index += 1;
        }
    }
    c.system_update = c.groups.iter().any(|g| g.release != g.desired_release);
    Ok(json!({ "ClusterArn": c.arn() }))
}

pub fn check_release(release: &str) -> Result<String, AwsError> {
    if IMAGE_RELEASES.contains(&release) {
        Ok(release.to_owned())
    } else {
        Err(validation(format!(
            "ImageReleaseVersion {release} is not a HyperPod release; available: {}",
            IMAGE_RELEASES.join(", ")
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sagemaker::lookups::Lookups;
    use crate::world::{Fault, FaultKind};

    /// Moves the (stopped) clock `secs` simulated seconds on.
    fn pass(w: &mut Aws, secs: f64) {
        w.clock.advance(secs);
    }

    fn statuses(w: &mut Aws) -> Vec<(String, String)> {
        let nodes = super::super::instances::list_nodes(w, &json!({"ClusterName": "c"})).unwrap();
        nodes["ClusterNodeSummaries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| {
                (
                    n["InstanceId"].as_str().unwrap().to_owned(),
                    n["InstanceStatus"]["Status"].as_str().unwrap().to_owned(),
                )
            })
            .collect()
    }

    fn two_node_cluster(w: &mut Aws, release: &str) {
        let body = json!({
            "ClusterName": "c",
            "InstanceGroups": [{
                "InstanceGroupName": "g", "InstanceType": "ml.g5.8xlarge", "InstanceCount": 2,
                "ExecutionRole": "arn:aws:iam::123456789012:role/r",
                "LifeCycleConfig": {"SourceS3Uri": "s3://b/l", "OnCreate": "on_create.sh"},
                "ImageReleaseVersion": release
            }]
        });
        super::super::clusters::create_cluster(w, "us-east-1", &body, &Lookups::default()).unwrap();
        pass(w, 2000.0);
    }

    #[test]
    fn a_rolling_software_update_takes_one_batch_at_a_time() {
        let mut w = Aws::standalone(0.0);
        two_node_cluster(&mut w, IMAGE_RELEASES[0]);
        let body = json!({
            "ClusterName": "c",
            "DeploymentConfig": {"RollingUpdatePolicy": {"MaximumBatchSize": {"Type": "INSTANCE_COUNT", "Value": 1}}}
        });
        update_software(&mut w, &body).unwrap();
        let s: Vec<String> = statuses(&mut w).into_iter().map(|(_, s)| s).collect();
        assert_eq!(s, ["SystemUpdating", "Running"]);
        pass(&mut w, SOFTWARE_UPDATE_SECS);
        let s: Vec<String> = statuses(&mut w).into_iter().map(|(_, s)| s).collect();
        assert_eq!(s, ["Running", "SystemUpdating"]);
        let c = w.hyperpod("c").unwrap().clone();
        assert_eq!(c.status(w.clock.now(), false), "SystemUpdating");
        pass(&mut w, SOFTWARE_UPDATE_SECS);
        let c = w.hyperpod("c").unwrap().clone();
        assert_eq!(c.status(w.clock.now(), false), "InService");
        assert_eq!(c.groups[0].release, latest_release());
        assert!(
            c.groups[0]
                .nodes
                .iter()
                .all(|n| n.release == latest_release())
        );
    }

    #[test]
    fn a_stuck_replace_holds_the_node_until_the_fault_goes() {
        let mut w = Aws::standalone(0.0);
        two_node_cluster(&mut w, &latest_release());
        let before = statuses(&mut w);
        assert!(before.iter().all(|(_, s)| s == "Running"), "{before:?}");
        let id = before[0].0.clone();
        let fault = w.faults.add(Fault {
            id: 0,
            service: "sagemaker".into(),
            operation: "BatchReplaceClusterNodes".into(),
            kind: FaultKind::Stuck,
            times: 1,
            after: 0,
            caller: None,
        });
        let out = batch_replace(&mut w, &json!({"ClusterName": "c", "NodeIds": [id]})).unwrap();
        assert_eq!(out["Successful"], json!([id]));
        pass(&mut w, 2000.0);
        assert_eq!(statuses(&mut w)[0], (id.clone(), "ShuttingDown".to_owned()));
        w.faults.retain(|f| f.id != fault);
        pass(&mut w, 2000.0);
        let after = statuses(&mut w);
        assert!(after.iter().all(|(_, s)| s == "Running"), "{after:?}");
        assert!(!after.iter().any(|(i, _)| *i == id), "{after:?}");
        assert_eq!(after.len(), 2);
    }

    fn set_recovery(w: &mut Aws, mode: &str) {
        w.hyperpod("c").unwrap().node_recovery = mode.to_owned();
    }

    #[test]
    fn automatic_recovery_reboots_a_faulty_node_after_the_delay() {
        let mut w = Aws::standalone(0.0);
        two_node_cluster(&mut w, &latest_release());
        let id = statuses(&mut w)[0].0.clone();
        assert_eq!(
            w.mark_node_for_recovery(
                "c",
                &id,
                Recovery::Reboot,
                Some(HealthFault::for_recovery(Recovery::Reboot))
            ),
            Some(true)
        );
        assert_eq!(statuses(&mut w)[0], (id.clone(), "Failure".to_owned()));
        pass(&mut w, RECOVERY_DELAY_SECS);
        assert_eq!(statuses(&mut w)[0], (id.clone(), "Pending".to_owned()));
        // Busy nodes take no new fault.
        assert_eq!(
            w.mark_node_for_recovery(
                "c",
                &id,
                Recovery::Replace,
                Some(HealthFault::for_recovery(Recovery::Replace))
            ),
            Some(false)
        );
        pass(&mut w, REBOOT_SECS);
        assert_eq!(statuses(&mut w)[0], (id.clone(), "Running".to_owned()));
        let n = &w.hyperpod("c").unwrap().groups[0].nodes[0];
        assert_eq!((n.boots, n.health.is_none()), (1, true));
        assert_eq!(
            w.mark_node_for_recovery(
                "c",
                "i-00000000",
                Recovery::Reboot,
                Some(HealthFault::for_recovery(Recovery::Reboot))
            ),
            None
        );
        assert_eq!(
            w.mark_node_for_recovery(
                "nope",
                &id,
                Recovery::Reboot,
                Some(HealthFault::for_recovery(Recovery::Reboot))
            ),
            None
        );
    }

    #[test]
    fn automatic_recovery_replaces_a_node_that_needs_it() {
        let mut w = Aws::standalone(0.0);
        two_node_cluster(&mut w, &latest_release());
        let id = statuses(&mut w)[0].0.clone();
        w.mark_node_for_recovery(
            "c",
            &id,
            Recovery::Replace,
            Some(HealthFault::for_recovery(Recovery::Replace)),
        );
        pass(&mut w, RECOVERY_DELAY_SECS);
        assert_eq!(statuses(&mut w)[0], (id.clone(), "ShuttingDown".to_owned()));
        pass(&mut w, SHUTDOWN_SECS);
        let (new_id, _) = statuses(&mut w)[0].clone();
        assert_ne!(new_id, id);
        assert!(w.hyperpod("c").unwrap().groups[0].nodes[0].health.is_none());
    }

    #[test]
    fn without_automatic_recovery_a_faulty_node_waits_for_a_batch_call() {
        let mut w = Aws::standalone(0.0);
        two_node_cluster(&mut w, &latest_release());
        set_recovery(&mut w, "None");
        let ids: Vec<String> = statuses(&mut w).into_iter().map(|(i, _)| i).collect();
        w.mark_node_for_recovery(
            "c",
            &ids[0],
            Recovery::Reboot,
            Some(HealthFault::for_recovery(Recovery::Reboot)),
        );
        w.mark_node_for_recovery(
            "c",
            &ids[1],
            Recovery::Replace,
            Some(HealthFault::for_recovery(Recovery::Replace)),
        );
        pass(&mut w, 3600.0);
        let s: Vec<String> = statuses(&mut w).into_iter().map(|(_, s)| s).collect();
        assert_eq!(s, ["Failure", "Failure"]);
        let out = batch_reboot(&mut w, &json!({"ClusterName": "c", "NodeIds": [ids[0]]})).unwrap();
        assert_eq!(out["Successful"], json!([ids[0]]));
        let out = batch_replace(&mut w, &json!({"ClusterName": "c", "NodeIds": [ids[1]]})).unwrap();
        assert_eq!(out["Successful"], json!([ids[1]]));
        // The replacement boots too.
        pass(&mut w, 2000.0);
        let after = statuses(&mut w);
        assert!(after.iter().all(|(_, s)| s == "Running"), "{after:?}");
        assert_eq!(after[0].0, ids[0]);
        assert_ne!(after[1].0, ids[1]);
        // A node merely not Running yet is still refused.
        w.hyperpod("c").unwrap().groups[0].nodes[0].launched = w.clock.now();
        let out = batch_reboot(&mut w, &json!({"ClusterName": "c", "NodeIds": [ids[0]]})).unwrap();
        assert_eq!(out["Failed"][0]["ErrorCode"], "InvalidInstanceStatus");
    }

    #[test]
    fn a_users_request_is_honoured_without_automatic_recovery() {
        let mut w = Aws::standalone(0.0);
        two_node_cluster(&mut w, &latest_release());
        set_recovery(&mut w, "None");
        let id = statuses(&mut w)[0].0.clone();
        w.mark_node_for_recovery("c", &id, Recovery::Reboot, None);
        pass(&mut w, RECOVERY_DELAY_SECS + REBOOT_SECS);
        assert_eq!(statuses(&mut w)[0], (id, "Running".to_owned()));
        assert_eq!(w.hyperpod("c").unwrap().groups[0].nodes[0].boots, 1);
    }

    #[test]
    fn the_agent_names_a_fault_by_the_recovery_it_needs() {
        let reboot = HealthFault::for_recovery(Recovery::Reboot);
        let replace = HealthFault::for_recovery(Recovery::Replace);
        assert_eq!(
            (reboot.fault_type.as_str(), replace.fault_type.as_str()),
            ("NvidiaErrorReboot", "NvidiaErrorTerminate")
        );
        for f in [reboot, replace] {
            assert_eq!(f.fault_reason, "XidHardwareFailure");
            assert_eq!(f.message, XID_79_MESSAGE);
        }
    }

    #[test]
    fn the_agents_fault_reaches_the_nodes_facts_until_its_reboot_ends() {
        let mut w = Aws::standalone(0.0);
        two_node_cluster(&mut w, &latest_release());
        w.hyperpod("c").unwrap().orchestrator =
            json!({"Eks": {"ClusterArn": "arn:aws:eks:us-east-1:123456789012:cluster/eks"}});
        let id = statuses(&mut w)[0].0.clone();
        let facts = |w: &mut Aws| {
            let i = w.hyperpod_instances("eks").into_iter().find(|i| i.id == id);
            let i = i.expect("the node is on the EKS cluster");
            (i.pending_recovery, i.fault, i.rebooted)
        };
        assert_eq!(facts(&mut w), (None, None, None));
        let fault = HealthFault {
            fault_type: "NvidiaErrorReboot".into(),
            fault_reason: "XidHardwareFailure".into(),
            message: "NVRM: Xid (PCI:0000:10:00): 48, pid=<unknown>, name=<unknown>, DBE".into(),
        };
        let found = w.clock.now();
        w.mark_node_for_recovery("c", &id, Recovery::Reboot, Some(fault.clone()));
        let marked = (
            Some("UnschedulablePendingReboot"),
            Some((found, fault)),
            None,
        );
        assert_eq!(facts(&mut w), marked);
        // It stays through the reboot, which is how HyperPod recovers from it.
        pass(&mut w, RECOVERY_DELAY_SECS);
        assert_eq!(statuses(&mut w)[0], (id.clone(), "Pending".to_owned()));
        assert_eq!(facts(&mut w), marked);
        pass(&mut w, REBOOT_SECS);
        let back = found + RECOVERY_DELAY_SECS + REBOOT_SECS;
        assert_eq!(facts(&mut w), (None, None, Some(back)));
        // A user's label asks for a reboot with no fault found.
        w.mark_node_for_recovery("c", &id, Recovery::Reboot, None);
        assert_eq!(
            facts(&mut w),
            (Some("UnschedulablePendingReboot"), None, Some(back))
        );
    }

    #[test]
    fn instance_ids() {
        assert!(is_instance_id("i-0123456789abcdef0"));
        assert!(is_instance_id("i-0123abcd"));
        assert!(!is_instance_id("i-0123456789ABCDEF0"));
        assert!(!is_instance_id("i-nope"));
        assert!(!is_instance_id("0123456789abcdef0"));
    }

    #[test]
    fn rolling_batches() {
        assert_eq!(batch_size(&json!({}), 5).unwrap(), 5);
        let pct = json!({"DeploymentConfig": {"RollingUpdatePolicy": {"MaximumBatchSize": {"Type": "CAPACITY_PERCENTAGE", "Value": 50}}}});
        assert_eq!(batch_size(&pct, 3).unwrap(), 2);
        let count = json!({"DeploymentConfig": {"RollingUpdatePolicy": {"MaximumBatchSize": {"Type": "INSTANCE_COUNT", "Value": 1}}}});
        assert_eq!(batch_size(&count, 3).unwrap(), 1);
        let bad = json!({"DeploymentConfig": {"RollingUpdatePolicy": {"MaximumBatchSize": {"Type": "INSTANCE_COUNT", "Value": 0}}}});
        assert!(batch_size(&bad, 3).is_err());
    }
}
