//! The node commands of a cluster: list its HyperPod nodes with what Kubernetes says of
//! each, and reboot, replace or delete some of them. The three actions are HyperPod's
//! batch calls, which answer per node: a node HyperPod refuses is reported on the
//! operation with its code and message, never folded into a success. Replacing and
//! deleting lose what is on the instances, so they are two-phase.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::clusters::{NodeCounts, NodeHealth};
use super::command::{Command, CommandSpec, Effect, HttpMethod, Role};
use super::error::{ApiError, FieldError};
use super::operations::OperationRef;
use super::plan::Gated;
use super::values::{
    ClusterName, Confirmation, EksClusterName, IdempotencyKey, InstanceGroupName, NodeId, PageSize,
};

// Filters and the page: a group, a health, at most `limit` nodes (default 100) after the
// `page_token` an earlier page returned; `refresh` reads HyperPod now instead of
// answering from a read up to a few seconds old. Plain comments keep tools/list short.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListNodes {
    /// The cluster.
    pub name: EksClusterName,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<InstanceGroupName>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<NodeHealth>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<PageSize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub page_token: Option<String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub refresh: bool,
}

/// Nodes on a page when the request names no limit.
pub const DEFAULT_PAGE: u32 = 100;

// `nodes` by group, then instance id; `counts` of every node the filters match, on all
// pages; `next_page_token` to send as `page_token`, absent on the last page.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct NodeList {
    pub name: String,
    pub nodes: Vec<NodeDetail>,
    pub counts: NodeCounts,
    pub next_page_token: Option<String>,
    pub fetched_at: String,
}

// A node as HyperPod and Kubernetes see it now: HyperPod's status (`Running`,
// `Pending`, `SystemUpdating`…), its Kubernetes Node, readiness and the
// `sagemaker.amazonaws.com/node-health-status` label, GPUs and those running pods request.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct NodeDetail {
    pub node_id: String,
    pub instance_group: String,
    pub instance_type: String,
    pub status: String,
    pub health: NodeHealth,
    pub message: Option<String>,
    pub kubernetes_node: Option<String>,
    pub ready: Option<bool>,
    pub health_label: Option<String>,
    pub gpus: u32,
    pub gpus_allocated: u32,
    pub efa_interfaces: u32,
    pub availability_zone: Option<String>,
    pub launch_time: Option<String>,
    pub image_release: Option<String>,
}

impl Command for ListNodes {
    type Output = NodeList;
    const SPEC: CommandSpec = CommandSpec {
        name: "list_nodes",
        summary: "List a cluster's nodes, with health and GPU use",
        description: "A cluster's HyperPod nodes with health, readiness, GPUs in use and image release; filter by group or health.",
        effect: Effect::ReadOnly,
        role: Role::Viewer,
        idempotent: true,
        status_command: None,
        method: HttpMethod::Get,
        path: "/api/v1/clusters/{name}/nodes",
    };
}

/// What a node action does; the three requests share their shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeAction {
    Reboot,
    Replace,
    Delete,
}

impl NodeAction {
    /// HyperPod's limit on the nodes of one batch call.
    pub fn limit(self) -> usize {
        match self {
            NodeAction::Delete => 99,
            NodeAction::Reboot | NodeAction::Replace => 25,
        }
    }

    pub fn call(self) -> &'static str {
        match self {
            NodeAction::Reboot => "BatchRebootClusterNodes",
            NodeAction::Replace => "BatchReplaceClusterNodes",
            NodeAction::Delete => "BatchDeleteClusterNodes",
        }
    }

    /// The past tense, for messages.
    pub fn done(self) -> &'static str {
        match self {
            NodeAction::Reboot => "rebooted",
            NodeAction::Replace => "replaced",
            NodeAction::Delete => "deleted",
        }
    }
}

/// The requests' shared rule: 1 to the action's limit of nodes, none twice.
fn check_nodes(ids: &[NodeId], action: NodeAction) -> Result<(), ApiError> {
    let mut errors = Vec::new();
    if ids.is_empty() {
        errors.push(FieldError::new("node_ids", "name at least one node"));
    }
    if ids.len() > action.limit() {
        errors.push(FieldError::new(
            "node_ids",
            format!(
                "HyperPod takes at most {} nodes per {} (got {}): send them in several requests",
                action.limit(),
                action.call(),
                ids.len()
            ),
        ));
    }
    for (i, id) in ids.iter().enumerate() {
        if ids[..i].contains(id) {
            errors.push(FieldError::new(
                format!("node_ids[{i}]"),
                format!("{id} is named twice"),
            ));
        }
    }
    ApiError::unless_broken(errors)
}

/// A node action's request: the cluster, its nodes, and the gate fields.
pub trait NodeRequest {
    const ACTION: NodeAction;
    fn cluster(&self) -> &ClusterName;
    fn node_ids(&self) -> &[NodeId];
}

macro_rules! node_request {
    ($(#[$doc:meta])* $t:ident, $action:expr, $spec:expr, gated: $gated:tt, $($extra:tt)*) => {
        $(#[$doc])*
        #[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
        #[serde(deny_unknown_fields)]
        pub struct $t {
            /// The cluster.
            pub name: ClusterName,
            pub node_ids: Vec<NodeId>,
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub idempotency_key: Option<IdempotencyKey>,
            #[serde(default, skip_serializing_if = "std::ops::Not::not")]
            pub dry_run: bool,
            $($extra)*
        }

        impl NodeRequest for $t {
            const ACTION: NodeAction = $action;

            fn cluster(&self) -> &ClusterName {
                &self.name
            }

            fn node_ids(&self) -> &[NodeId] {
                &self.node_ids
            }
        }

        impl Command for $t {
            type Output = Gated<OperationRef>;
            const SPEC: CommandSpec = $spec;

            node_request!(@gate $gated);

            fn validate(&self) -> Result<(), ApiError> {
                check_nodes(&self.node_ids, Self::ACTION)
            }
        }
    };
    (@gate true) => { super::command::gated_request!(); };
    (@gate false) => { super::command::dry_run_request!(); };
}

node_request!(
    RebootNodes,
    NodeAction::Reboot,
    CommandSpec {
        name: "reboot_nodes",
        summary: "Reboot nodes of a cluster",
        description: "Reboots up to 25 nodes (instance ids from list_nodes); their volumes stay. Returns an operation for wait_operation; dry_run returns the plan.",
        effect: Effect::Mutating,
        role: Role::Operator,
        idempotent: true,
        status_command: Some("get_operation"),
        method: HttpMethod::Post,
        path: "/api/v1/clusters/{name}/nodes/reboot",
    },
    gated: false,
);

node_request!(
    ReplaceNodes,
    NodeAction::Replace,
    CommandSpec {
        name: "replace_nodes",
        summary: "Replace nodes of a cluster with new instances",
        description: "Replaces up to 25 nodes with new instances; their instance volumes are lost. The first call returns the plan and a confirmation; call again with it once the user agrees. Returns an operation for wait_operation.",
        effect: Effect::Destructive,
        role: Role::Operator,
        idempotent: true,
        status_command: Some("get_operation"),
        method: HttpMethod::Post,
        path: "/api/v1/clusters/{name}/nodes/replace",
    },
    gated: true,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confirmation: Option<Confirmation>,
);

node_request!(
    DeleteNodes,
    NodeAction::Delete,
    CommandSpec {
        name: "delete_nodes",
        summary: "Delete nodes of a cluster",
        description: "Deletes up to 99 nodes and lowers their groups' counts. The first call returns the plan and a confirmation; call again with it once the user agrees. Returns an operation for wait_operation.",
        effect: Effect::Destructive,
        role: Role::Operator,
        idempotent: true,
        status_command: Some("get_operation"),
        method: HttpMethod::Post,
        path: "/api/v1/clusters/{name}/nodes/delete",
    },
    gated: true,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confirmation: Option<Confirmation>,
);

#[cfg(test)]
mod tests {
    use super::*;

    fn request(ids: serde_json::Value) -> Result<RebootNodes, serde_json::Error> {
        serde_json::from_value(serde_json::json!({"name": "ml-1", "node_ids": ids}))
    }

    #[test]
    fn node_lists_name_each_bad_node() {
        assert!(
            request(serde_json::json!(["i-0123456789abcdef0"]))
                .unwrap()
                .validate()
                .is_ok()
        );
        assert!(request(serde_json::json!(["i-XYZ"])).is_err());
        let twice = request(serde_json::json!([
            "i-0123456789abcdef0",
            "i-0123456789abcdef0"
        ]))
        .unwrap()
        .validate();
        match twice {
            Err(ApiError::Validation { errors }) => assert_eq!(errors[0].field, "node_ids[1]"),
            other => panic!("{other:?}"),
        }
        let many: Vec<String> = (0..26).map(|i| format!("i-{i:017x}")).collect();
        match request(serde_json::json!(many)).unwrap().validate() {
            Err(ApiError::Validation { errors }) => assert!(errors[0].message.contains("25")),
            other => panic!("{other:?}"),
        }
        assert!(request(serde_json::json!([])).unwrap().validate().is_err());
    }
}
