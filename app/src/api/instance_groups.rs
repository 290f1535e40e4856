//! The instance-group commands of a cluster hypd created: add a group, change one (its
//! count and deep health checks; its type, capacity and EFA-only mode are fixed for its
//! life), delete one. Each is an operation on the cluster (`cluster/<name>`), so it queues
//! behind any other change of the cluster, and each is what the cluster's desired state
//! becomes once it succeeds: drift and reconcile hold the cluster to its creation with
//! every later group change applied.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::clusters::{
    Capacity, InstanceGroupSpec, MAX_INSTANCE_GROUPS, NodeCounts, Taint, kubernetes_problems,
};
use super::command::{Command, CommandSpec, Effect, HttpMethod, Role};
use super::error::ApiError;
use super::operations::OperationRef;
use super::plan::Gated;
use super::values::{
    ClusterName, Confirmation, EksClusterName, IdempotencyKey, InstanceCount, InstanceGroupName,
    MlInstanceType, VolumeSizeGb,
};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListInstanceGroups {
    /// The cluster.
    pub name: EksClusterName,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct InstanceGroupList {
    pub name: String,
    /// Empty when the cluster has no HyperPod cluster.
    pub instance_groups: Vec<InstanceGroupDetail>,
    /// When AWS was asked (RFC 3339, UTC).
    pub fetched_at: String,
}

/// One group as SageMaker describes it now.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct InstanceGroupDetail {
    pub name: String,
    pub instance_type: Option<String>,
    /// `on_demand`, `spot` or `training_plan`.
    pub capacity: String,
    pub training_plan_arn: Option<String>,
    /// Instances the training plan can still provide.
    pub training_plan_available: Option<i32>,
    pub efa_only: bool,
    pub current_count: u32,
    pub target_count: u32,
    /// `InService`, `Creating`, `Updating`, `Degraded`, …
    pub status: Option<String>,
    /// `InstanceStress`, `InstanceConnectivity`.
    pub deep_health_checks: Vec<String>,
    pub volume_size_gb: Option<u32>,
    pub subnet_ids: Vec<String>,
    pub availability_zones: Vec<String>,
    pub kubernetes_labels: std::collections::BTreeMap<String, String>,
    /// `key=value:Effect`.
    pub kubernetes_taints: Vec<String>,
    /// The group's nodes by health.
    pub nodes: NodeCounts,
}

impl Command for ListInstanceGroups {
    type Output = InstanceGroupList;
    const SPEC: CommandSpec = CommandSpec {
        name: "list_instance_groups",
        summary: "List a cluster's instance groups as AWS has them now",
        description: "A cluster's instance groups, read live: type, capacity, counts, status and nodes by health.",
        effect: Effect::ReadOnly,
        role: Role::Viewer,
        idempotent: true,
        status_command: None,
        method: HttpMethod::Get,
        path: "/api/v1/clusters/{name}/instance-groups",
    };
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AddInstanceGroup {
    /// The cluster's name (one hypd created).
    pub name: ClusterName,
    /// The new group, as create_cluster takes one.
    pub group: InstanceGroupSpec,
    /// Re-sending a request with the same key returns the same operation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<IdempotencyKey>,
    /// Only answer with the plan. Nothing is changed or stored.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dry_run: bool,
}

impl Command for AddInstanceGroup {
    type Output = Gated<OperationRef>;
    const SPEC: CommandSpec = CommandSpec {
        name: "add_instance_group",
        summary: "Add an instance group to a cluster",
        description: "Adds an instance group to a cluster hypd created. Ask the user the instance type, count and capacity type. Returns an operation for wait_operation; dry_run returns the plan.",
        effect: Effect::Mutating,
        role: Role::Operator,
        idempotent: true,
        status_command: Some("get_operation"),
        method: HttpMethod::Post,
        path: "/api/v1/clusters/{name}/instance-groups",
    };

    super::command::dry_run_request!();

    fn validate(&self) -> Result<(), ApiError> {
        let mut errors = Vec::new();
        self.group.problems("group", &mut errors);
        ApiError::unless_broken(errors)
    }
}

// What may change of a group; a field left out stays as it is. Its instance type,
// capacity and EFA-only mode are accepted only with the values the group has (anything
// else is immutable, naming the field). Plain comments: a doc comment would repeat the
// tool's description in its schema, in every tools/list.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateInstanceGroup {
    /// The cluster.
    pub name: ClusterName,
    pub group: InstanceGroupName,
    /// The target count (0 allowed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_count: Option<InstanceCount>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deep_health_checks: Option<bool>,
    // For instances launched from now on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_size_gb: Option<VolumeSizeGb>,
    // The group's whole set of labels (or taints) from now on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes_labels: Option<std::collections::BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes_taints: Option<Vec<Taint>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_type: Option<MlInstanceType>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<Capacity>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub efa_only: Option<bool>,
    /// Re-sending a request with the same key returns the same operation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<IdempotencyKey>,
    /// Only answer with the plan. Nothing is changed or stored.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dry_run: bool,
}

impl UpdateInstanceGroup {
    /// `group` with this request's changes, or why it cannot have them: a group's
    /// instance type, capacity and EFA-only mode are fixed for its life.
    pub fn applied_to(&self, group: &InstanceGroupSpec) -> Result<InstanceGroupSpec, ApiError> {
        let mut new = group.clone();
        if let Some(n) = self.instance_count {
            new.instance_count = n;
        }
        if let Some(d) = self.deep_health_checks {
            new.deep_health_checks = d;
        }
        if let Some(v) = self.volume_size_gb {
            new.volume_size_gb = v;
        }
        if let Some(l) = &self.kubernetes_labels {
            new.kubernetes_labels = l.clone();
        }
        if let Some(t) = &self.kubernetes_taints {
            new.kubernetes_taints = t.clone();
        }
        if let Some(t) = &self.instance_type {
            new.instance_type = t.clone();
        }
        if let Some(c) = &self.capacity {
            new.capacity = c.clone();
        }
        if let Some(e) = self.efa_only {
            new.efa_only = e;
        }
        group.diff(&new, "")?;
        Ok(new)
    }
}

impl Command for UpdateInstanceGroup {
    type Output = Gated<OperationRef>;
    const SPEC: CommandSpec = CommandSpec {
        name: "update_instance_group",
        summary: "Scale an instance group or change its settings",
        description: "Changes a group's count, health checks, volume, labels or taints; type, capacity and EFA-only are fixed (use add_instance_group). Returns an operation for wait_operation; dry_run returns the plan.",
        effect: Effect::Mutating,
        role: Role::Operator,
        idempotent: true,
        status_command: Some("get_operation"),
        method: HttpMethod::Post,
        path: "/api/v1/clusters/{name}/instance-groups/{group}",
    };

    super::command::dry_run_request!();

    fn validate(&self) -> Result<(), ApiError> {
        let nothing = self.instance_count.is_none()
            && self.deep_health_checks.is_none()
            && self.volume_size_gb.is_none()
            && self.kubernetes_labels.is_none()
            && self.kubernetes_taints.is_none()
            && self.instance_type.is_none()
            && self.capacity.is_none()
            && self.efa_only.is_none();
        if nothing {
            return Err(ApiError::field(
                "instance_count",
                "name at least one thing to change: instance_count, deep_health_checks, volume_size_gb, kubernetes_labels or kubernetes_taints",
            ));
        }
        let mut errors = Vec::new();
        kubernetes_problems(
            self.kubernetes_labels
                .as_ref()
                .unwrap_or(&Default::default()),
            self.kubernetes_taints.as_deref().unwrap_or_default(),
            "",
            &mut errors,
        );
        ApiError::unless_broken(errors)
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeleteInstanceGroup {
    /// The cluster.
    pub name: ClusterName,
    pub group: InstanceGroupName,
    /// Re-sending a request with the same key returns the same operation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<IdempotencyKey>,
    /// Only answer with the plan: what would be deleted. Nothing is changed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dry_run: bool,
    /// The confirmation the same call without one returned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confirmation: Option<Confirmation>,
}

impl Command for DeleteInstanceGroup {
    type Output = Gated<OperationRef>;
    const SPEC: CommandSpec = CommandSpec {
        name: "delete_instance_group",
        summary: "Delete an instance group and its instances",
        description: "Deletes an instance group and its instances (volumes are lost); never the last group. The first call returns the plan and a confirmation; call again with it once the user agrees. Returns an operation for wait_operation.",
        effect: Effect::Destructive,
        role: Role::Operator,
        idempotent: true,
        status_command: Some("get_operation"),
        method: HttpMethod::Delete,
        path: "/api/v1/clusters/{name}/instance-groups/{group}",
    };

    super::command::gated_request!();
}

/// A cluster's groups after `add`: refused when the name is taken or HyperPod's limit is
/// reached.
pub fn with_added(
    groups: &[InstanceGroupSpec],
    add: &InstanceGroupSpec,
) -> Result<Vec<InstanceGroupSpec>, ApiError> {
    if groups.iter().any(|g| g.name == add.name) {
        return Err(ApiError::field(
            "group.name",
            format!(
                "the cluster already has an instance group named {}",
                add.name
            ),
        ));
    }
    if groups.len() >= MAX_INSTANCE_GROUPS {
        return Err(ApiError::field(
            "group",
            format!("HyperPod takes at most {MAX_INSTANCE_GROUPS} instance groups per cluster"),
        ));
    }
    let mut all = groups.to_vec();
    all.push(add.clone());
    Ok(all)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group(extra: serde_json::Value) -> InstanceGroupSpec {
        let mut v = serde_json::json!({"name": "gpu", "instance_type": "ml.p5.48xlarge", "instance_count": 2});
        if let (Some(base), Some(extra)) = (v.as_object_mut(), extra.as_object()) {
            base.extend(extra.clone());
        }
        serde_json::from_value(v).unwrap()
    }

    fn update(extra: serde_json::Value) -> UpdateInstanceGroup {
        let mut v = serde_json::json!({"name": "ml-1", "group": "gpu"});
        if let (Some(base), Some(extra)) = (v.as_object_mut(), extra.as_object()) {
            base.extend(extra.clone());
        }
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn an_update_changes_the_count_and_refuses_what_is_fixed() {
        let g = group(serde_json::json!({}));
        let scaled = update(serde_json::json!({"instance_count": 0}))
            .applied_to(&g)
            .unwrap();
        assert_eq!(scaled.instance_count.get(), 0);
        // The group's own values are accepted; others are immutable, by field.
        assert!(
            update(serde_json::json!({"instance_type": "ml.p5.48xlarge", "efa_only": false}))
                .applied_to(&g)
                .is_ok()
        );
        for (extra, field) in [
            (
                serde_json::json!({"instance_type": "ml.g5.8xlarge"}),
                "instance_type",
            ),
            (
                serde_json::json!({"capacity": {"type": "spot"}}),
                "capacity",
            ),
            (serde_json::json!({"efa_only": true}), "efa_only"),
        ] {
            match update(extra).applied_to(&g) {
                Err(ApiError::Immutable { field: f, .. }) => assert_eq!(f, field),
                other => panic!("{other:?}"),
            }
        }
        assert!(update(serde_json::json!({})).validate().is_err());
    }

    #[test]
    fn an_added_group_needs_a_free_name() {
        let g = group(serde_json::json!({}));
        assert_eq!(with_added(&[], &g).unwrap().len(), 1);
        match with_added(std::slice::from_ref(&g), &g) {
            Err(ApiError::Validation { errors }) => assert_eq!(errors[0].field, "group.name"),
            other => panic!("{other:?}"),
        }
    }
}
