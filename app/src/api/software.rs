//! `update_cluster_software`: HyperPod's platform image moved to a newer release on a
//! cluster's groups, rolling, a batch of nodes at a time (each batch rebooted onto the
//! new image while the others keep running). An operation on the cluster, so it queues
//! behind any other change of it.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::command::{Command, CommandSpec, Effect, HttpMethod, Role};
use super::error::{ApiError, FieldError};
use super::operations::OperationRef;
use super::plan::Gated;
use super::values::{ClusterName, IdempotencyKey, InstanceGroupName};

// `groups`: which groups (default all); `image_release`: e.g. 2025.11.20 (default the
// newest); a batch is `batch_percent` of the nodes or `batch_instances` nodes (default
// all at once); `wait_seconds` between batches (0-3600). Plain comments keep tools/list
// short.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateClusterSoftware {
    /// The cluster.
    pub name: ClusterName,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<InstanceGroupName>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_release: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch_instances: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch_percent: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_seconds: Option<u32>,
    /// Re-sending a request with the same key returns the same operation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<IdempotencyKey>,
    /// Only answer with the plan. Nothing is changed or stored.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dry_run: bool,
}

/// HyperPod's longest wait between batches.
pub const MAX_WAIT_SECONDS: u32 = 3600;

impl UpdateClusterSoftware {
    /// Nodes in one batch, of `nodes` to update.
    pub fn batch(&self, nodes: usize) -> usize {
        match (self.batch_instances, self.batch_percent) {
            (Some(n), _) => n as usize,
            (None, Some(p)) => (nodes * p as usize).div_ceil(100),
            (None, None) => nodes,
        }
        .max(1)
    }
}

impl Command for UpdateClusterSoftware {
    type Output = Gated<OperationRef>;
    const SPEC: CommandSpec = CommandSpec {
        name: "update_cluster_software",
        summary: "Update the HyperPod platform image of a cluster's nodes, rolling",
        description: "Moves the groups' nodes to an image release (default the newest), rebooting a batch at a time. Returns an operation for wait_operation; dry_run returns the plan.",
        effect: Effect::Mutating,
        role: Role::Operator,
        idempotent: true,
        status_command: Some("get_operation"),
        method: HttpMethod::Post,
        path: "/api/v1/clusters/{name}/software-update",
    };

    super::command::dry_run_request!();

    fn validate(&self) -> Result<(), ApiError> {
        let mut errors = Vec::new();
        if let Some(r) = &self.image_release {
            let ok = r.len() == 10
                && r.char_indices().all(|(i, c)| {
                    if i == 4 || i == 7 {
                        c == '.'
                    } else {
                        c.is_ascii_digit()
                    }
                });
            if !ok {
                errors.push(FieldError::new(
                    "image_release",
                    format!("a HyperPod image release looks like 2025.11.20 (got {r:?})"),
                ));
            }
        }
        match (self.batch_instances, self.batch_percent) {
            (Some(_), Some(_)) => errors.push(FieldError::new(
                "batch_percent",
                "give batch_instances or batch_percent, not both",
            )),
            (Some(0), None) => errors.push(FieldError::new(
                "batch_instances",
                "a batch is at least 1 instance",
            )),
            (None, Some(p)) if !(1..=100).contains(&p) => errors.push(FieldError::new(
                "batch_percent",
                format!("a batch is 1 to 100 percent of the nodes (got {p})"),
            )),
            _ => {}
        }
        if self.wait_seconds.is_some_and(|w| w > MAX_WAIT_SECONDS) {
            errors.push(FieldError::new(
                "wait_seconds",
                format!("HyperPod waits at most {MAX_WAIT_SECONDS} seconds between batches"),
            ));
        }
        for (i, g) in self.groups.iter().enumerate() {
            if self.groups[..i].contains(g) {
                errors.push(FieldError::new(
                    format!("groups[{i}]"),
                    format!("{g} is named twice"),
                ));
            }
        }
        ApiError::unless_broken(errors)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(v: serde_json::Value) -> UpdateClusterSoftware {
        let mut base = serde_json::json!({"name": "ml-1"});
        base.as_object_mut()
            .unwrap()
            .extend(v.as_object().unwrap().clone());
        serde_json::from_value(base).unwrap()
    }

    #[test]
    fn batches_and_releases_are_checked_by_field() {
        assert!(request(serde_json::json!({})).validate().is_ok());
        assert_eq!(
            request(serde_json::json!({"batch_percent": 25})).batch(10),
            3
        );
        assert_eq!(
            request(serde_json::json!({"batch_instances": 2})).batch(10),
            2
        );
        assert_eq!(request(serde_json::json!({})).batch(10), 10);
        for (bad, field) in [
            (
                serde_json::json!({"image_release": "latest"}),
                "image_release",
            ),
            (serde_json::json!({"batch_percent": 0}), "batch_percent"),
            (serde_json::json!({"batch_instances": 0}), "batch_instances"),
            (
                serde_json::json!({"batch_instances": 1, "batch_percent": 5}),
                "batch_percent",
            ),
            (serde_json::json!({"wait_seconds": 4000}), "wait_seconds"),
            (serde_json::json!({"groups": ["a", "a"]}), "groups[1]"),
        ] {
            match request(bad.clone()).validate() {
                Err(ApiError::Validation { errors }) => assert_eq!(errors[0].field, field, "{bad}"),
                other => panic!("{bad}: {other:?}"),
            }
        }
    }
}
