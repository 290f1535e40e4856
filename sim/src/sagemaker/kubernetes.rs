//! What the Kubernetes emulator reads of HyperPod for an EKS cluster: the instances that
//! become its Nodes and the managed features (tiered checkpointing's daemon, Karpenter)
//! that run on it, each with the status it has now on the clock.

use std::collections::BTreeMap;

use serde_json::Value;

use super::groups::{group_labels, group_taints};
use super::instances::node_status;
use super::nodes::{HealthFault, NodeAction};
use super::on_eks;
use super::placement::{private_dns, private_ip};
use crate::world::{Aws, Phase};

/// A HyperPod instance as the Kubernetes emulator sees it (it becomes a Node).
pub struct Instance {
    pub id: String,
    pub instance_type: String,
    pub group: String,
    pub cluster: String,
    pub region: String,
    pub zone: String,
    pub zone_id: String,
    pub private_ip: String,
    pub private_dns: String,
    /// The group's `KubernetesConfig.Labels`.
    pub labels: BTreeMap<String, String>,
    /// The group's `KubernetesConfig.Taints`, as Kubernetes spells taints.
    pub taints: Vec<Value>,
    /// `Pending`, `DeepHealthCheckInProgress`, `Running`, `Failure`, `ShuttingDown` or
    /// `SystemUpdating`.
    pub status: &'static str,
    /// `UnschedulablePendingReboot` or `UnschedulablePendingReplacement` while HyperPod
    /// owes the instance that recovery.
    pub pending_recovery: Option<&'static str>,
    /// The fault the health-monitoring agent found and when, while the recovery it
    /// asked for is owed (none for a user's request).
    pub fault: Option<(f64, HealthFault)>,
    /// When the reboot under way began, if one is.
    pub rebooting: Option<f64>,
    /// When the instance's latest reboot ended.
    pub rebooted: Option<f64>,
    /// Reboots of this instance so far.
    pub boots: u32,
    /// Simulated second the instance was launched.
    pub launched: f64,
}

/// What a HyperPod cluster runs on its EKS cluster's Kubernetes side besides nodes.
pub struct Features {
    pub cluster: String,
    /// The `TieredStorageConfig` the nodes run, while its Mode is Enable: HyperPod's
    /// memory-management daemon is installed.
    pub tiered_storage: Option<Value>,
    /// Autoscaling is InService: managed Karpenter serves its resources and scales.
    pub karpenter: bool,
}

impl Aws {
    /// The HyperPod clusters orchestrated by EKS cluster `eks_name`, settled: what its
    /// controllers read, without settling any other cluster.
    fn settle_on_eks(&mut self, eks_name: &str) {
        let names: Vec<String> = self
            .sagemaker
            .clusters
            .values()
            .filter(|c| on_eks(c, eks_name))
            .map(|c| c.name.clone())
            .collect();
        for name in names {
            self.settle_hyperpod(&name);
        }
    }

    /// The managed features of the HyperPod clusters on EKS cluster `eks_name` (not
    /// those being deleted).
    pub fn hyperpod_features(&mut self, eks_name: &str) -> Vec<Features> {
        self.settle_on_eks(eks_name);
        let now = self.clock.now();
        let stuck = |op: &str| self.stuck("sagemaker", op);
        self.sagemaker
            .clusters
            .values()
            .filter(|c| on_eks(c, eks_name) && !matches!(c.phase, Some((Phase::Deleting, _))))
            .map(|c| Features {
                cluster: c.name.clone(),
                tiered_storage: c
                    .applied_tiered(now)
                    .filter(|t| t["Mode"] == "Enable")
                    .cloned(),
                karpenter: c.autoscaling_status(now, stuck) == Some("InService"),
            })
            .collect()
    }

    /// The instances of HyperPod clusters orchestrated by EKS cluster `eks_name`.
    pub fn hyperpod_instances(&mut self, eks_name: &str) -> Vec<Instance> {
        self.settle_on_eks(eks_name);
        let now = self.clock.now();
        self.sagemaker
            .clusters
            .values()
            .filter(|c| on_eks(c, eks_name))
            .flat_map(|c| {
                c.groups.iter().flat_map(move |g| {
                    g.nodes.iter().map(move |n| {
                        let ip = private_ip(&n.id, g.placement.cidr);
                        Instance {
                            id: n.id.clone(),
                            instance_type: g.instance_type.clone(),
                            group: g.name.clone(),
                            cluster: c.name.clone(),
                            region: c.region.clone(),
                            zone: g.placement.zone.clone(),
                            zone_id: g.placement.zone_id.clone(),
                            private_dns: private_dns(&ip, &c.region),
                            private_ip: ip,
                            labels: group_labels(g),
                            taints: group_taints(g),
                            status: node_status(n, g, now),
                            pending_recovery: n.health.as_ref().map(|h| h.recovery.label()),
                            fault: n
                                .health
                                .as_ref()
                                .and_then(|h| Some((h.since, h.fault.clone()?))),
                            boots: n.boots,
                            rebooting: match n.action {
                                Some(NodeAction::Reboot { since }) => Some(since),
                                _ => None,
                            },
                            rebooted: n.rebooted,
                            launched: n.launched,
                        }
                    })
                })
            })
            .collect()
    }
}
