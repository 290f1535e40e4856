//! A HyperPod cluster orchestrated by EKS, with automatic node recovery and continuous
//! provisioning, and its instance groups. Present: created with every group; once
//! InService, a group that is missing or whose count or deep health checks differ, or
//! node recovery turned off, is sent again with `UpdateCluster` (which takes every group:
//! all are listed, with automatic node recovery). Settings
//! HyperPod fixes for a group's life (instance type, training plan, threads per core,
//! capacity type, network interface) differing is a refusal, never an update. Absent:
//! deleted if hypd's tags are on it.

use std::collections::BTreeMap;

use app::api::ApiError;
use app::api::plan::{Action, Change, FieldChange, KNOWN_AFTER_APPLY};
use aws_sdk_sagemaker::types::{
    ClusterCapacityRequirements, ClusterEbsVolumeConfig, ClusterInstanceGroupDetails,
    ClusterInstanceGroupSpecification, ClusterInstanceStorageConfig, ClusterInstanceType,
    ClusterInterfaceType, ClusterKubernetesConfig, ClusterKubernetesTaint,
    ClusterKubernetesTaintEffect, ClusterLifeCycleConfig, ClusterNetworkInterface,
    ClusterNodeProvisioningMode, ClusterNodeRecovery, ClusterOrchestrator,
    ClusterOrchestratorEksConfig, ClusterSpotOptions, ClusterStatus, DeepHealthCheckType, Tag,
    VpcConfig,
};
use serde_json::json;

use super::Client;
use crate::aws::{SdkResultExt, failed_state};
use crate::resources::{Resource, Want, missing, tags};

const KIND: &str = "sagemaker:Cluster";

/// Where a group's instances come from; fixed for the group's life.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GroupCapacity {
    OnDemand,
    Spot,
    TrainingPlan(String),
}

/// One instance group as HyperPod takes it.
#[derive(Clone, Debug, PartialEq)]
pub struct GroupSpec {
    pub name: String,
    /// `ml.p5.48xlarge`.
    pub instance_type: String,
    pub instance_count: u32,
    pub execution_role: String,
    /// `s3://bucket/prefix/` holding the lifecycle scripts.
    pub lifecycle_source: String,
    pub on_create: String,
    pub volume_size_gb: u32,
    pub threads_per_core: Option<u32>,
    pub deep_health_checks: bool,
    pub capacity: GroupCapacity,
    pub efa_only: bool,
    /// (subnet, security group) of a group that runs outside the cluster's compute
    /// subnet (`OverrideVpcConfig`).
    pub subnet: Option<(String, String)>,
    /// The Availability Zone a new group was placed in (the cluster's, or the one it
    /// names), once placed; shown in plans.
    pub zone: Option<String>,
    pub labels: BTreeMap<String, String>,
    /// (key, value, effect).
    pub taints: Vec<(String, Option<String>, String)>,
}

impl GroupSpec {
    /// The group's labels and taints as HyperPod takes them; none when it has neither.
    fn kubernetes(&self) -> Option<ClusterKubernetesConfig> {
        if self.labels.is_empty() && self.taints.is_empty() {
            return None;
        }
        let taints = self
            .taints
            .iter()
            .filter_map(|(k, v, e)| {
                ClusterKubernetesTaint::builder()
                    .key(k)
                    .set_value(v.clone())
                    .effect(ClusterKubernetesTaintEffect::from(e.as_str()))
                    .build()
                    .ok()
            })
            .collect();
        Some(
            ClusterKubernetesConfig::builder()
                .set_labels(Some(self.labels.clone().into_iter().collect()))
                .set_taints(Some(taints))
                .build(),
        )
    }

    /// Every setting of the group that the request decides, as a plan shows a group to
    /// be made: what a person or an agent approves, so two groups that differ in any
    /// of them never look alike.
    pub fn planned(&self) -> serde_json::Value {
        let capacity = match &self.capacity {
            GroupCapacity::OnDemand => json!({"type": "on_demand"}),
            GroupCapacity::Spot => json!({"type": "spot"}),
            GroupCapacity::TrainingPlan(arn) => json!({
                "type": "training_plan",
                "training_plan_arn": arn,
                "training_plan_name": arn.rsplit_once(":training-plan/").map(|(_, n)| n),
            }),
        };
        let taints: Vec<String> = self
            .taints
            .iter()
            .map(|(k, v, e)| format!("{k}={}:{e}", v.as_deref().unwrap_or_default()))
            .collect();
        json!({
            "instance_type": self.instance_type,
            "instance_count": self.instance_count,
            "capacity": capacity,
            "efa_only": self.efa_only,
            "deep_health_checks": self.deep_health_checks,
            "volume_size_gb": self.volume_size_gb,
            "threads_per_core": self.threads_per_core,
            "kubernetes_labels": self.labels,
            "kubernetes_taints": taints,
            "availability_zone": self.zone,
            "subnet": self.subnet.as_ref().map_or("the cluster's compute subnet", |(s, _)| s.as_str()),
        })
    }

    /// The group as CreateCluster and UpdateCluster take it.
    pub fn specification(&self) -> ClusterInstanceGroupSpecification {
        let mut g = ClusterInstanceGroupSpecification::builder()
            .instance_group_name(&self.name)
            .instance_type(ClusterInstanceType::from(self.instance_type.as_str()))
            .instance_count(i32::try_from(self.instance_count).unwrap_or(i32::MAX))
            .execution_role(&self.execution_role)
            .life_cycle_config(
                ClusterLifeCycleConfig::builder()
                    .source_s3_uri(&self.lifecycle_source)
                    .on_create(&self.on_create)
                    .build(),
            )
            .instance_storage_configs(ClusterInstanceStorageConfig::EbsVolumeConfig(
                ClusterEbsVolumeConfig::builder()
                    .volume_size_in_gb(i32::try_from(self.volume_size_gb).unwrap_or(i32::MAX))
                    .build(),
            ))
            .set_threads_per_core(self.threads_per_core.and_then(|t| i32::try_from(t).ok()));
        if self.deep_health_checks {
            g = g
                .on_start_deep_health_checks(DeepHealthCheckType::InstanceStress)
                .on_start_deep_health_checks(DeepHealthCheckType::InstanceConnectivity);
        }
        match &self.capacity {
            GroupCapacity::OnDemand => {}
            GroupCapacity::Spot => {
                g = g.capacity_requirements(
                    ClusterCapacityRequirements::builder()
                        .spot(ClusterSpotOptions::builder().build())
                        .build(),
                );
            }
            GroupCapacity::TrainingPlan(arn) => g = g.training_plan_arn(arn),
        }
        if let Some(k) = self.kubernetes() {
            g = g.kubernetes_config(k);
        }
        if let Some((subnet, sg)) = &self.subnet {
            g = g.override_vpc_config(
                VpcConfig::builder()
                    .subnets(subnet)
                    .security_group_ids(sg)
                    .build(),
            );
        }
        if self.efa_only {
            g = g.network_interface(
                ClusterNetworkInterface::builder()
                    .interface_type(ClusterInterfaceType::EfaOnly)
                    .build(),
            );
        }
        g.build()
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct HyperPodSpec {
    pub eks_cluster_arn: String,
    pub subnet_id: String,
    pub security_group_id: String,
    pub groups: Vec<GroupSpec>,
    /// What becomes of live groups `groups` does not list.
    pub unlisted: Unlisted,
    /// Groups to delete (`InstanceGroupsToDelete`).
    pub delete: Vec<String>,
}

/// Live groups a spec does not list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unlisted {
    /// The spec is the cluster's every group as stored (create, reconcile): another one
    /// is a conflict (UpdateCluster would have to name it). While autoscaling is on, the
    /// live target counts stand: resetting them would remove nodes Karpenter added for
    /// pending pods.
    Refuse,
    /// The spec changes some groups: the others are sent to HyperPod as they are.
    Keep,
}

pub struct HyperPodCluster {
    pub sagemaker: Client,
    pub name: String,
    pub want: Want<HyperPodSpec>,
}

/// One group as HyperPod describes it.
#[derive(Clone, Debug, PartialEq)]
pub struct GroupState {
    pub name: String,
    pub instance_type: Option<String>,
    pub current_count: u32,
    pub target_count: u32,
    pub status: Option<String>,
    pub deep_health_checks: bool,
    pub training_plan_arn: Option<String>,
    pub threads_per_core: Option<u32>,
    pub volume_size_gb: Option<u32>,
    pub labels: BTreeMap<String, String>,
    /// (key, value, effect), sorted.
    pub taints: Vec<(String, Option<String>, String)>,
    /// The group as DescribeCluster gave it (none when a plan assumed it): an update
    /// sends it back through [`normalised`], so no setting hypd does not decide is lost.
    pub live: Option<ClusterInstanceGroupDetails>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct State {
    pub arn: Option<String>,
    pub status: Option<ClusterStatus>,
    pub failure_message: Option<String>,
    pub ours: bool,
    /// `Automatic` or `None`.
    pub node_recovery: Option<String>,
    pub groups: Vec<GroupState>,
    /// HyperPod's managed Karpenter is on: it adds and removes nodes, so the groups'
    /// target counts are its to change.
    pub autoscaling: bool,
}

impl State {
    /// Ready, still on its way (with a note), or failed for good.
    pub fn progress(&self, name: &str) -> Result<Option<String>, ApiError> {
        match &self.status {
            Some(ClusterStatus::Inservice) => Ok(None),
            Some(
                s @ (ClusterStatus::Creating
                | ClusterStatus::Updating
                | ClusterStatus::Systemupdating
                | ClusterStatus::Deleting),
            ) => {
                let groups: Vec<String> = self
                    .groups
                    .iter()
                    .map(|g| format!("{} {}/{}", g.name, g.current_count, g.target_count))
                    .collect();
                Ok(Some(format!(
                    "HyperPod cluster {name} is {} ({})",
                    s.as_str(),
                    groups.join(", ")
                )))
            }
            s => Err(failed_state(
                "sagemaker",
                "DescribeCluster",
                s.as_ref().map(|s| s.as_str()),
                format!(
                    "HyperPod cluster {name} is {}: {}",
                    s.as_ref().map_or("in an unknown state", |s| s.as_str()),
                    self.failure_message.as_deref().unwrap_or("no reason given")
                ),
            )),
        }
    }
}

fn count(n: Option<i32>) -> u32 {
    n.and_then(|n| u32::try_from(n).ok()).unwrap_or(0)
}

fn group_state(g: &ClusterInstanceGroupDetails) -> GroupState {
    GroupState {
        name: g.instance_group_name().unwrap_or_default().to_owned(),
        instance_type: g.instance_type().map(|t| t.as_str().to_owned()),
        current_count: count(g.current_count()),
        target_count: count(g.target_count()),
        status: g.status().map(|s| s.as_str().to_owned()),
        deep_health_checks: !g.on_start_deep_health_checks().is_empty(),
        training_plan_arn: g.training_plan_arn().map(str::to_owned),
        threads_per_core: g.threads_per_core().and_then(|t| u32::try_from(t).ok()),
        volume_size_gb: g.instance_storage_configs().iter().find_map(|c| match c {
            ClusterInstanceStorageConfig::EbsVolumeConfig(v) if v.root_volume() != Some(true) => {
                v.volume_size_in_gb().and_then(|n| u32::try_from(n).ok())
            }
            _ => None,
        }),
        labels: g
            .kubernetes_config()
            .and_then(|k| k.desired_labels().or(k.current_labels()))
            .map(|l| l.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
            .unwrap_or_default(),
        taints: {
            let mut t: Vec<(String, Option<String>, String)> = g
                .kubernetes_config()
                .map(|k| {
                    if k.desired_taints().is_empty() {
                        k.current_taints()
                    } else {
                        k.desired_taints()
                    }
                })
                .unwrap_or_default()
                .iter()
                .map(|t| {
                    (
                        t.key().to_owned(),
                        t.value().map(str::to_owned),
                        t.effect().as_str().to_owned(),
                    )
                })
                .collect();
            t.sort();
            t
        },
        live: Some(g.clone()),
    }
}

/// A live group as UpdateCluster takes it back: every field a group can be given
/// (target count, image, lifecycle configuration, execution role, threads per core,
/// storage, deep health checks, training plan, VPC override, capacity, network interface,
/// Kubernetes labels and taints, scheduled updates, minimum count), as DescribeCluster
/// reported it. What AWS computes (current count, status) is not a setting and is left
/// out.
pub fn normalised(d: &ClusterInstanceGroupDetails) -> ClusterInstanceGroupSpecification {
    let kubernetes = d.kubernetes_config().map(|k| {
        ClusterKubernetesConfig::builder()
            .set_labels(k.desired_labels().or(k.current_labels()).cloned())
            .set_taints(Some(if k.desired_taints().is_empty() {
                k.current_taints().to_vec()
            } else {
                k.desired_taints().to_vec()
            }))
            .build()
    });
    ClusterInstanceGroupSpecification::builder()
        .set_instance_group_name(d.instance_group_name().map(str::to_owned))
        .set_instance_type(d.instance_type().cloned())
        .set_instance_count(d.target_count())
        .set_min_instance_count(d.min_count())
        .set_life_cycle_config(d.life_cycle_config().cloned())
        .set_execution_role(d.execution_role().map(str::to_owned))
        .set_threads_per_core(d.threads_per_core())
        .set_instance_storage_configs(
            Some(d.instance_storage_configs().to_vec()).filter(|v| !v.is_empty()),
        )
        .set_on_start_deep_health_checks(
            Some(d.on_start_deep_health_checks().to_vec()).filter(|v| !v.is_empty()),
        )
        .set_training_plan_arn(d.training_plan_arn().map(str::to_owned))
        .set_override_vpc_config(d.override_vpc_config().cloned())
        .set_scheduled_update_config(d.scheduled_update_config().cloned())
        .set_image_id(d.desired_image_id().map(str::to_owned))
        .set_kubernetes_config(kubernetes)
        .set_capacity_requirements(d.capacity_requirements().cloned())
        .set_network_interface(d.network_interface().map(|n| {
            ClusterNetworkInterface::builder()
                .set_interface_type(n.interface_type().cloned())
                .build()
        }))
        .build()
}

/// A live group with what hypd decides of it (count, deep health checks) taken from
/// `spec`, the rest as it is.
fn merged(
    live: &ClusterInstanceGroupDetails,
    spec: &GroupSpec,
) -> ClusterInstanceGroupSpecification {
    let decided = spec.specification();
    let mut g = normalised(live);
    g.instance_count = decided.instance_count;
    g.on_start_deep_health_checks = decided.on_start_deep_health_checks;
    g.instance_storage_configs = decided.instance_storage_configs;
    // hypd decides the labels and taints: none is an empty set that removes the live ones.
    g.kubernetes_config = decided.kubernetes_config.or_else(|| {
        g.kubernetes_config.as_ref().map(|_| {
            ClusterKubernetesConfig::builder()
                .set_labels(Some(Default::default()))
                .set_taints(Some(Vec::new()))
                .build()
        })
    });
    g
}

/// What HyperPod has now under `name` (a name or an ARN), `None` when nothing; whether
/// it is hypd's is read (one more call) only when `ownership` is asked for.
pub async fn describe(
    sagemaker: &Client,
    name: &str,
    ownership: bool,
) -> Result<Option<State>, ApiError> {
    let Some(c) = sagemaker
        .describe_cluster()
        .cluster_name(name)
        .send()
        .await
        .found("sagemaker", "DescribeCluster")?
    else {
        return Ok(None);
    };
    let arn = c.cluster_arn().map(str::to_owned);
    let cluster_name = c.cluster_name().unwrap_or(name);
    let ours = match &arn {
        Some(arn) if ownership => match sagemaker
            .list_tags()
            .resource_arn(arn)
            .send()
            .await
            .upstream("sagemaker", "ListTags")
        {
            Ok(t) => t
                .tags()
                .iter()
                .any(|t| t.key() == Some(tags::CLUSTER) && t.value() == Some(cluster_name)),
            // A deletion can end between the two calls: HyperPod then refuses ListTags
            // for the ARN it no longer has. Asked again, DescribeCluster tells gone from
            // a refusal that stands.
            Err(e) => {
                let again = sagemaker
                    .describe_cluster()
                    .cluster_name(name)
                    .send()
                    .await
                    .found("sagemaker", "DescribeCluster")?;
                return match again {
                    None => Ok(None),
                    Some(_) => Err(e),
                };
            }
        },
        _ => false,
    };
    Ok(Some(State {
        arn,
        status: c.cluster_status().cloned(),
        failure_message: c
            .failure_message()
            .filter(|m| !m.is_empty())
            .map(str::to_owned),
        ours,
        node_recovery: c.node_recovery().map(|n| n.as_str().to_owned()),
        groups: c.instance_groups().iter().map(group_state).collect(),
        autoscaling: super::autoscaling::enabled(&c),
    }))
}

#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    Create,
    /// UpdateCluster with every group and automatic node recovery; what changes.
    Update(Vec<FieldChange>),
    Delete,
}

/// The changes for `want` given what was found. Pure.
pub fn diff(want: &Want<HyperPodSpec>, observed: &Option<State>) -> Result<Vec<Op>, ApiError> {
    let (spec, state) = match (want, observed) {
        (Want::Present(_), None) => return Ok(vec![Op::Create]),
        (Want::Present(spec), Some(state)) => (spec, state),
        (Want::Absent, Some(s)) if s.ours && s.status != Some(ClusterStatus::Deleting) => {
            return Ok(vec![Op::Delete]);
        }
        (Want::Absent, _) => return Ok(Vec::new()),
    };
    let mut changes = Vec::new();
    let counts_kept = karpenter_counts(spec, Some(state));
    for name in &spec.delete {
        if let Some(live) = state.groups.iter().find(|l| &l.name == name) {
            changes.push(FieldChange {
                field: format!("instance_groups[{name}]"),
                old: Some(
                    json!({"instance_type": live.instance_type, "instance_count": live.target_count}),
                ),
                new: None,
            });
        }
    }
    for g in &spec.groups {
        let Some(live) = state.groups.iter().find(|l| l.name == g.name) else {
            changes.push(FieldChange {
                field: format!("instance_groups[{}]", g.name),
                old: None,
                new: Some(g.planned()),
            });
            continue;
        };
        let fixed = |field: &str, old: String, new: String| ApiError::Immutable {
            field: format!("instance_groups[{}].{field}", g.name),
            message: format!(
                "HyperPod fixes it for the group's life: it is {old}, asked for {new}"
            ),
        };
        if let Some(t) = &live.instance_type
            && *t != g.instance_type
        {
            return Err(fixed("instance_type", t.clone(), g.instance_type.clone()));
        }
        let plan = match &g.capacity {
            GroupCapacity::TrainingPlan(arn) => Some(arn.clone()),
            _ => None,
        };
        if live.training_plan_arn != plan {
            return Err(fixed(
                "capacity",
                live.training_plan_arn
                    .clone()
                    .unwrap_or_else(|| "without a training plan".into()),
                plan.unwrap_or_else(|| "without a training plan".into()),
            ));
        }
        if !counts_kept && live.target_count != g.instance_count {
            changes.push(FieldChange {
                field: format!("instance_groups[{}].instance_count", g.name),
                old: Some(json!(live.target_count)),
                new: Some(json!(g.instance_count)),
            });
        }
        if live.deep_health_checks != g.deep_health_checks {
            changes.push(FieldChange {
                field: format!("instance_groups[{}].deep_health_checks", g.name),
                old: Some(json!(live.deep_health_checks)),
                new: Some(json!(g.deep_health_checks)),
            });
        }
        // Only a described group says what it has (a plan's assumed one does not).
        if live.live.is_some() {
            if live.volume_size_gb != Some(g.volume_size_gb) {
                changes.push(FieldChange {
                    field: format!("instance_groups[{}].volume_size_gb", g.name),
                    old: live.volume_size_gb.map(|v| json!(v)),
                    new: Some(json!(g.volume_size_gb)),
                });
            }
            if live.labels != g.labels {
                changes.push(FieldChange {
                    field: format!("instance_groups[{}].kubernetes_labels", g.name),
                    old: Some(json!(live.labels)),
                    new: Some(json!(g.labels)),
                });
            }
            let mut taints = g.taints.clone();
            taints.sort();
            if live.taints != taints {
                let show = |t: &[(String, Option<String>, String)]| {
                    json!(
                        t.iter()
                            .map(|(k, v, e)| format!(
                                "{k}={}:{e}",
                                v.as_deref().unwrap_or_default()
                            ))
                            .collect::<Vec<_>>()
                    )
                };
                changes.push(FieldChange {
                    field: format!("instance_groups[{}].kubernetes_taints", g.name),
                    old: Some(show(&live.taints)),
                    new: Some(show(&taints)),
                });
            }
        }
    }
    let recovery = ClusterNodeRecovery::Automatic.as_str();
    if state.node_recovery.as_deref() != Some(recovery) {
        changes.push(FieldChange {
            field: "node_recovery".into(),
            old: state.node_recovery.clone().map(|n| json!(n)),
            new: Some(json!(recovery)),
        });
    }
    if changes.is_empty() {
        return Ok(Vec::new());
    }
    if let Some(extra) = state.groups.iter().find(|l| {
        spec.unlisted == Unlisted::Refuse
            && !spec.groups.iter().any(|g| g.name == l.name)
            && !spec.delete.contains(&l.name)
    }) {
        return Err(ApiError::Conflict {
            message: format!(
                "HyperPod cluster has instance group {} that this request does not list; UpdateCluster would have to name every group",
                extra.name
            ),
            operation_id: None,
            field: None,
        });
    }
    Ok(vec![Op::Update(changes)])
}

/// The live target counts stand over `spec`'s: it is the stored whole and managed
/// Karpenter is on (see [`Unlisted::Refuse`]).
fn karpenter_counts(spec: &HyperPodSpec, observed: Option<&State>) -> bool {
    spec.unlisted == Unlisted::Refuse && observed.is_some_and(|s| s.autoscaling)
}

/// Every group UpdateCluster must list: the live ones (but those deleted), each as it is
/// with what `spec` decides of it, then the new ones.
fn update_groups(
    spec: &HyperPodSpec,
    observed: Option<&State>,
) -> Result<Vec<ClusterInstanceGroupSpecification>, ApiError> {
    let live = observed.map_or(&[][..], |s| s.groups.as_slice());
    let counts_kept = karpenter_counts(spec, observed);
    let mut groups = Vec::new();
    for l in live.iter().filter(|l| !spec.delete.contains(&l.name)) {
        let wanted = spec.groups.iter().find(|g| g.name == l.name);
        groups.push(match (&l.live, wanted) {
            (Some(d), Some(g)) => {
                let mut m = merged(d, g);
                if counts_kept {
                    m.instance_count = d.target_count();
                }
                m
            }
            (Some(d), None) => normalised(d),
            (None, Some(g)) => g.specification(),
            (None, None) => {
                return Err(ApiError::internal(format!(
                    "instance group {} was not described, so it cannot be sent back as it is",
                    l.name
                )));
            }
        });
    }
    groups.extend(
        spec.groups
            .iter()
            .filter(|g| !live.iter().any(|l| l.name == g.name))
            .map(GroupSpec::specification),
    );
    Ok(groups)
}

impl Resource for HyperPodCluster {
    type Observed = Option<State>;
    type Op = Op;

    async fn observe(&self) -> Result<Option<State>, ApiError> {
        describe(&self.sagemaker, &self.name, self.want == Want::Absent).await
    }

    fn diff(&self, observed: &Option<State>) -> Result<Vec<Op>, ApiError> {
        // A cluster that is changing takes no update until it is InService again.
        if let (Want::Present(_), Some(s)) = (&self.want, observed)
            && s.status != Some(ClusterStatus::Inservice)
        {
            return Ok(Vec::new());
        }
        diff(&self.want, observed)
    }

    async fn apply(&self, op: &Op, observed: &mut Option<State>) -> Result<(), ApiError> {
        match op {
            Op::Create => {
                let spec = self
                    .want
                    .present()
                    .ok_or_else(|| missing("the HyperPod spec"))?;
                let tag = |k: &str, v: &str| Tag::builder().key(k).value(v).build();
                let mut req = self
                    .sagemaker
                    .create_cluster()
                    .cluster_name(&self.name)
                    .orchestrator(
                        ClusterOrchestrator::builder()
                            .eks(
                                ClusterOrchestratorEksConfig::builder()
                                    .cluster_arn(&spec.eks_cluster_arn)
                                    .build(),
                            )
                            .build(),
                    )
                    .node_recovery(ClusterNodeRecovery::Automatic)
                    .node_provisioning_mode(ClusterNodeProvisioningMode::Continuous)
                    .vpc_config(
                        VpcConfig::builder()
                            .security_group_ids(&spec.security_group_id)
                            .subnets(&spec.subnet_id)
                            .build(),
                    );
                for g in &spec.groups {
                    req = req.instance_groups(g.specification());
                }
                for (k, v) in tags::of_cluster(&self.name) {
                    req = req.tags(tag(k, &v));
                }
                // Made by an earlier run of this step whose answer was lost.
                req.send()
                    .await
                    .allowing("sagemaker", "CreateCluster", &["ResourceInUse"])?;
                *observed = describe(&self.sagemaker, &self.name, false).await?;
            }
            Op::Update(_) => {
                let spec = self
                    .want
                    .present()
                    .ok_or_else(|| missing("the HyperPod spec"))?;
                let mut req = self
                    .sagemaker
                    .update_cluster()
                    .cluster_name(&self.name)
                    .node_recovery(ClusterNodeRecovery::Automatic);
                for g in update_groups(spec, observed.as_ref())? {
                    req = req.instance_groups(g);
                }
                for name in spec.delete.iter().filter(|n| {
                    observed
                        .as_ref()
                        .is_some_and(|s| s.groups.iter().any(|l| &&l.name == n))
                }) {
                    req = req.instance_groups_to_delete(name);
                }
                req.send().await.upstream("sagemaker", "UpdateCluster")?;
                *observed = describe(&self.sagemaker, &self.name, false).await?;
            }
            Op::Delete => {
                self.sagemaker
                    .delete_cluster()
                    .cluster_name(&self.name)
                    .send()
                    .await
                    .found("sagemaker", "DeleteCluster")?;
                if let Some(s) = observed {
                    s.status = Some(ClusterStatus::Deleting);
                }
            }
        }
        Ok(())
    }

    fn describe(&self, op: &Op, _: &Option<State>) -> Change {
        match op {
            Op::Create => {
                let mut c = Change::new(Action::Create, KIND, &self.name)
                    .field("node_recovery", None, Some(json!("Automatic")))
                    .field("cluster_arn", None, Some(json!(KNOWN_AFTER_APPLY)));
                if let Some(spec) = self.want.present() {
                    for g in &spec.groups {
                        c = c.field(
                            format!("instance_groups[{}]", g.name),
                            None,
                            Some(g.planned()),
                        );
                    }
                }
                c
            }
            Op::Update(fields) => {
                let mut c = Change::new(Action::Update, KIND, &self.name);
                c.fields = fields.clone();
                c
            }
            Op::Delete => Change::new(Action::Delete, KIND, &self.name),
        }
    }
    /// Assumed made or updated is assumed in service with the groups asked for (a plan
    /// goes on past the wait), and deleted gone.
    fn assume(&self, op: &Op, observed: &mut Option<State>) {
        let Some(spec) = self.want.present().filter(|_| !matches!(op, Op::Delete)) else {
            *observed = None;
            return;
        };
        let arn = observed.as_ref().and_then(|s| s.arn.clone());
        let kept: Vec<GroupState> = observed
            .as_ref()
            .map(|s| s.groups.clone())
            .unwrap_or_default()
            .into_iter()
            .filter(|l| {
                spec.unlisted == Unlisted::Keep
                    && !spec.delete.contains(&l.name)
                    && !spec.groups.iter().any(|g| g.name == l.name)
            })
            .collect();
        let autoscaling = observed.as_ref().is_some_and(|s| s.autoscaling);
        *observed = Some(State {
            autoscaling,
            arn: arn.or_else(|| Some(KNOWN_AFTER_APPLY.to_owned())),
            status: Some(ClusterStatus::Inservice),
            failure_message: None,
            ours: true,
            node_recovery: Some(ClusterNodeRecovery::Automatic.as_str().to_owned()),
            groups: kept
                .into_iter()
                .chain(spec.groups.iter().map(|g| GroupState {
                    name: g.name.clone(),
                    instance_type: Some(g.instance_type.clone()),
                    current_count: g.instance_count,
                    target_count: g.instance_count,
                    status: Some("InService".to_owned()),
                    deep_health_checks: g.deep_health_checks,
                    training_plan_arn: match &g.capacity {
                        GroupCapacity::TrainingPlan(arn) => Some(arn.clone()),
                        _ => None,
                    },
                    threads_per_core: g.threads_per_core,
                    volume_size_gb: Some(g.volume_size_gb),
                    labels: g.labels.clone(),
                    taints: g.taints.clone(),
                    live: None,
                }))
                .collect(),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group(name: &str, count: u32) -> GroupSpec {
        GroupSpec {
            name: name.into(),
            instance_type: "ml.g5.8xlarge".into(),
            instance_count: count,
            execution_role: "arn:aws:iam::1:role/r".into(),
            lifecycle_source: "s3://b/hypd/lifecycle/".into(),
            on_create: "on_create.sh".into(),
            volume_size_gb: 500,
            threads_per_core: None,
            deep_health_checks: false,
            capacity: GroupCapacity::OnDemand,
            efa_only: false,
            subnet: None,
            zone: None,
            labels: BTreeMap::new(),
            taints: Vec::new(),
        }
    }

    fn live(name: &str, count: u32) -> GroupState {
        GroupState {
            name: name.into(),
            instance_type: Some("ml.g5.8xlarge".into()),
            current_count: count,
            target_count: count,
            status: Some("InService".into()),
            deep_health_checks: false,
            training_plan_arn: None,
            threads_per_core: None,
            volume_size_gb: Some(500),
            labels: BTreeMap::new(),
            taints: Vec::new(),
            live: None,
        }
    }

    fn state(groups: Vec<GroupState>) -> Option<State> {
        Some(State {
            arn: Some("arn".into()),
            status: Some(ClusterStatus::Inservice),
            failure_message: None,
            ours: true,
            node_recovery: Some("Automatic".into()),
            groups,
            autoscaling: false,
        })
    }

    fn spec(groups: Vec<GroupSpec>) -> Want<HyperPodSpec> {
        Want::Present(HyperPodSpec {
            eks_cluster_arn: "arn:eks".into(),
            subnet_id: "subnet-1".into(),
            security_group_id: "sg-1".into(),
            groups,
            unlisted: Unlisted::Refuse,
            delete: Vec::new(),
        })
    }

    #[test]
    fn groups_as_created_need_nothing_and_a_count_change_is_one_update() {
        let want = spec(vec![group("a", 2), group("b", 1)]);
        assert_eq!(diff(&want, &None).unwrap(), [Op::Create]);
        assert!(
            diff(&want, &state(vec![live("a", 2), live("b", 1)]))
                .unwrap()
                .is_empty()
        );
        let ops = diff(&want, &state(vec![live("a", 2), live("b", 3)])).unwrap();
        let [Op::Update(fields)] = ops.as_slice() else {
            panic!("{ops:?}")
        };
        assert_eq!(fields[0].field, "instance_groups[b].instance_count");
    }

    #[test]
    fn while_karpenter_scales_the_stored_counts_do_not_reset_the_live_ones() {
        let mut scaled = state(vec![live("a", 2), live("b", 3)]);
        if let Some(s) = &mut scaled {
            s.autoscaling = true;
        }
        // Reconcile (the stored whole) leaves Karpenter's counts alone…
        let whole = spec(vec![group("a", 2), group("b", 1)]);
        assert!(diff(&whole, &scaled).unwrap().is_empty());
        // …a change of one group sets the count it names.
        let Want::Present(mut one) = spec(vec![group("b", 1)]) else {
            unreachable!()
        };
        one.unlisted = Unlisted::Keep;
        let ops = diff(&Want::Present(one), &scaled).unwrap();
        let [Op::Update(fields)] = ops.as_slice() else {
            panic!("{ops:?}")
        };
        assert_eq!(fields[0].field, "instance_groups[b].instance_count");
    }

    #[test]
    fn node_recovery_turned_off_is_turned_on_again() {
        let want = spec(vec![group("a", 2)]);
        let mut off = state(vec![live("a", 2)]);
        if let Some(s) = &mut off {
            s.node_recovery = Some("None".into());
        }
        let ops = diff(&want, &off).unwrap();
        let [Op::Update(fields)] = ops.as_slice() else {
            panic!("{ops:?}")
        };
        assert_eq!(fields.len(), 1, "{fields:?}");
        assert_eq!(fields[0].field, "node_recovery");
        assert_eq!(fields[0].old, Some(json!("None")));
        assert_eq!(fields[0].new, Some(json!("Automatic")));
    }

    #[test]
    fn a_fixed_setting_is_refused_and_unknown_groups_are_not_dropped() {
        let mut p5 = group("a", 2);
        p5.instance_type = "ml.p5.48xlarge".into();
        match diff(&spec(vec![p5]), &state(vec![live("a", 2)])) {
            Err(ApiError::Immutable { field, .. }) => {
                assert_eq!(field, "instance_groups[a].instance_type")
            }
            other => panic!("{other:?}"),
        }
        let e = diff(
            &spec(vec![group("a", 3)]),
            &state(vec![live("a", 2), live("other", 1)]),
        )
        .unwrap_err();
        assert!(matches!(e, ApiError::Conflict { .. }), "{e:?}");
    }

    #[test]
    fn a_group_carries_every_decision() {
        let mut g = group("a", 4);
        g.instance_type = "ml.p5.48xlarge".into();
        g.threads_per_core = Some(2);
        g.deep_health_checks = true;
        g.capacity = GroupCapacity::Spot;
        g.efa_only = true;
        let s = g.specification();
        assert_eq!(s.instance_count(), Some(4));
        assert_eq!(s.threads_per_core(), Some(2));
        assert_eq!(s.on_start_deep_health_checks().len(), 2);
        assert!(s.capacity_requirements().and_then(|c| c.spot()).is_some());
        assert_eq!(
            s.network_interface().and_then(|n| n.interface_type()),
            Some(&ClusterInterfaceType::EfaOnly)
        );
        assert_eq!(
            s.life_cycle_config().and_then(|l| l.source_s3_uri()),
            Some("s3://b/hypd/lifecycle/")
        );
    }
}
