//! Autoscaling (managed Karpenter): the status of a cluster's `AutoScaling` read off the
//! clock, and the calls HyperPod makes for Karpenter on its cluster role (adding nodes
//! to a group, deleting the ones it consolidated away), held to the same quotas and
//! cluster states as the public calls.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::clusters::check_quotas;
use super::groups::{group_labels, group_taints, is_spot};
use super::{AUTOSCALING_SECS, lookups, nodes, validation};
use crate::clock::reached;
use crate::world::{Aws, AwsError};

/// A cluster's `AutoScaling`, as the latest Enable or Disable left it.
#[derive(Clone, Debug)]
pub(super) struct AutoScaling {
    pub(super) enabled: bool,
    pub(super) scaler: String,
    /// When that Enable or Disable was accepted, and by which call (whose `stuck` fault
    /// holds it in Creating or Deleting).
    pub(super) since: f64,
    pub(super) by: &'static str,
    /// Set when a `fails` fault was registered for the call that enabled it: the install
    /// ends Failed with this message.
    pub(super) failure: Option<String>,
}

impl AutoScaling {
    /// `Status` as DescribeCluster reports it; none once a Disable is over, as the model
    /// has no status for autoscaling that is gone. An install waits for the cluster.
    pub(super) fn status(
        &self,
        now: f64,
        cluster_creating: bool,
        stuck: bool,
    ) -> Option<&'static str> {
        let settling = stuck || cluster_creating || !reached(now, self.since + AUTOSCALING_SECS);
        match (self.enabled, settling) {
            (true, true) => Some("Creating"),
            (true, false) if self.failure.is_some() => Some("Failed"),
            (true, false) => Some("InService"),
            (false, true) => Some("Deleting"),
            (false, false) => None,
        }
    }

    pub(super) fn json(&self, status: &str) -> Value {
        let mut v = json!({
            "Mode": if self.enabled { "Enable" } else { "Disable" },
            "AutoScalerType": self.scaler,
            "Status": status,
        });
        if status == "Failed" {
            v["FailureMessage"] = json!(self.failure);
        }
        v
    }
}

/// An instance group as managed Karpenter sees it.
#[derive(Clone, Debug)]
pub struct AutoscaledGroup {
    pub name: String,
    pub instance_type: String,
    pub target: u32,
    pub deep_health_checks: bool,
    pub training_plan: bool,
    pub spot: bool,
    pub region: String,
    /// The subnet its instances run in, if the cluster names one.
    pub subnet: Option<String>,
    pub zone: String,
    pub zone_id: String,
    /// Its `KubernetesConfig` labels and taints (as Kubernetes spells taints).
    pub labels: BTreeMap<String, String>,
    pub taints: Vec<Value>,
}

impl Aws {
    /// The instance groups of HyperPod cluster `cluster`, for its managed Karpenter.
    pub fn autoscaled_groups(&mut self, cluster: &str) -> Vec<AutoscaledGroup> {
        let Ok(c) = self.hyperpod(cluster) else {
            return Vec::new();
        };
        c.groups
            .iter()
            .map(|g| AutoscaledGroup {
                name: g.name.clone(),
                instance_type: g.instance_type.clone(),
                target: g.target,
                deep_health_checks: g.deep_health_checks,
                training_plan: g.spec.get("TrainingPlanArn").is_some(),
                spot: is_spot(&g.spec),
                region: c.region.clone(),
                subnet: lookups::strings(
                    g.spec
                        .get("OverrideVpcConfig")
                        .unwrap_or(&c.vpc)
                        .get("Subnets"),
                )
                .next()
                .map(str::to_owned),
                zone: g.placement.zone.clone(),
                zone_id: g.placement.zone_id.clone(),
                labels: group_labels(g),
                taints: group_taints(g),
            })
            .collect()
    }

    /// What BatchAddClusterNodes does for managed Karpenter, on its cluster role: `count`
    /// more nodes in `group`, launched as any group's new nodes are, within the quotas.
    pub fn autoscale_up(&mut self, cluster: &str, group: &str, count: u32) -> Result<(), AwsError> {
        let now = self.clock.now();
        let c = self.hyperpod(cluster)?.clone();
        let status = c.status(now, false);
        if matches!(status, "Creating" | "Deleting") {
            return Err(validation(format!(
                "Cluster {cluster} is {status}; nodes can be added only when it is InService"
            )));
        }
        let Some(index) = c.groups.iter().position(|g| g.name == group) else {
            return Err(validation(format!(
                "Instance group {group} does not exist in cluster {cluster}"
            )));
        };
        let mut groups = c.groups;
        let g = &mut groups[index];
        g.target += count;
        if let Some(o) = g.spec.as_object_mut() {
            o.insert("InstanceCount".into(), json!(g.target));
        }
        check_quotas(self, &groups, Some(cluster))?;
        let mut g = groups.swap_remove(index);
        self.launch(&mut g, now);
        self.hyperpod(cluster)?.groups[index] = g;
        Ok(())
    }

    /// What BatchDeleteClusterNodes does for managed Karpenter: the same call, on the
    /// nodes it has consolidated away.
    pub fn autoscale_down(&mut self, cluster: &str, ids: &[String]) -> Result<Value, AwsError> {
        nodes::batch_delete(self, &json!({ "ClusterName": cluster, "NodeIds": ids }))
    }
}
