//! Changing a created cluster's instance groups: add one, scale or change one, delete
//! one. Each is a pipeline on the cluster's target, so it waits behind any other change
//! of the cluster, and each sends HyperPod only what it decides: the groups it names,
//! with every other group sent back as DescribeCluster gave it (`Unlisted::Keep`), so
//! no group loses a setting hypd does not manage. What the cluster's groups are meant to
//! be is kept in `cluster::managed`: each change that succeeds applies itself there from
//! its `settle` hook, and drift and reconcile hold the cluster to that.

pub mod list;

use app::api::clusters::{CreateCluster, InstanceGroupSpec};
use app::api::instance_groups::{
    AddInstanceGroup, DeleteInstanceGroup, UpdateInstanceGroup, with_added,
};
use app::api::values::{ClusterName, IdempotencyKey, InstanceCount};
use app::api::{ApiError, Command};
use serde::{Deserialize, Serialize};

use crate::cluster::create::{self, Outputs as Created};
use crate::cluster::hyperpod;
use crate::cluster::managed::{self, Desired, Managed};
use crate::operation::pipeline::{Context, Pipeline, Preflight, Progress, stages};
use crate::resources::sagemaker::cluster::{self as hyperpod_cluster, Unlisted};

stages! {
    pub enum Stage {
        Hyperpod = "hyperpod", "HyperPod: UpdateCluster, other groups as they are", false;
        Nodes = "nodes", "The cluster's groups have their nodes Ready in Kubernetes, with the node components", true;
    }
}

/// What the stages found, stored with the operation. Field names are stored: never rename.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Outputs {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hyperpod_cluster_arn: Option<String>,
    /// The cluster's groups once the change is made.
    #[serde(default)]
    pub instance_groups: Vec<String>,
}

/// A change of a cluster's groups: what the three commands share.
trait GroupChange: Pipeline {
    fn cluster(&self) -> &ClusterName;

    /// The cluster's groups once this change is made, from `groups` (as they are meant
    /// to be now).
    fn after(&self, groups: &[InstanceGroupSpec]) -> Result<Vec<InstanceGroupSpec>, ApiError>;

    /// What HyperPod is sent, of `after`: the groups this change decides, and the groups
    /// to delete.
    fn decided(&self, after: &[InstanceGroupSpec]) -> (Vec<InstanceGroupSpec>, Vec<String>);
}

/// The cluster's groups after the stored request of `command` (a group change) is
/// applied to `groups`: how `cluster::replay` reads stores older than the kept state.
pub fn applied(
    command: &str,
    spec: &str,
    groups: &[InstanceGroupSpec],
) -> Result<Vec<InstanceGroupSpec>, ApiError> {
    fn of<C: GroupChange>(
        spec: &str,
        groups: &[InstanceGroupSpec],
    ) -> Result<Vec<InstanceGroupSpec>, ApiError> {
        let request = C::from_stored(spec).map_err(|e| {
            ApiError::internal(format!(
                "the stored {} request is unreadable: {e}",
                C::SPEC.name
            ))
        })?;
        request.after(groups)
    }
    match command {
        c if c == AddInstanceGroup::SPEC.name => of::<AddInstanceGroup>(spec, groups),
        c if c == UpdateInstanceGroup::SPEC.name => of::<UpdateInstanceGroup>(spec, groups),
        c if c == DeleteInstanceGroup::SPEC.name => of::<DeleteInstanceGroup>(spec, groups),
        other => Err(ApiError::internal(format!(
            "{other} does not change instance groups"
        ))),
    }
}

/// A cluster as hypd made it: the request its groups are meant to follow now, and what
/// its creation made (roles, network, the EKS cluster).
struct Made {
    request: CreateCluster,
    created: Created,
    region: String,
}

async fn made(store: &crate::store::Store, name: &ClusterName) -> Result<Made, ApiError> {
    let cluster = Managed::load(store, name.as_str()).await?;
    let request = match cluster.desired() {
        Some(Desired::Created(r)) => r.clone(),
        Some(Desired::Imported(_)) => {
            return Err(ApiError::field(
                "name",
                format!(
                    "{name} was imported: its instance groups are managed where it was created"
                ),
            ));
        }
        None => {
            return Err(ApiError::field(
                "name",
                format!(
                    "{name} is {}: its groups change once its creation has finished",
                    cluster.summary.status
                ),
            ));
        }
    };
    cluster.in_status(&["active"], "only an active cluster's groups change")?;
    let created: Created = cluster.created()?;
    let region = crate::cluster::stored_region(request.region.as_ref(), CreateCluster::SPEC.name)?;
    Ok(Made {
        request,
        created,
        region,
    })
}

/// The group named `name` as it is meant to be, or a field error naming `group`.
fn find<'a>(
    groups: &'a [InstanceGroupSpec],
    cluster: &ClusterName,
    name: &str,
) -> Result<&'a InstanceGroupSpec, ApiError> {
    groups
        .iter()
        .find(|g| g.name.as_str() == name)
        .ok_or_else(|| {
            ApiError::field(
                "group",
                format!(
                    "{cluster} has no instance group {name}; it has {}",
                    groups
                        .iter()
                        .map(|g| g.name.to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            )
        })
}

async fn step<C: GroupChange>(
    change: &C,
    cx: &Context,
    stage: Stage,
    out: &mut Outputs,
) -> Result<Progress, ApiError> {
    let made = made(&cx.store, change.cluster()).await?;
    let after = change.after(&made.request.instance_groups)?;
    out.instance_groups = after.iter().map(|g| g.name.to_string()).collect();
    match stage {
        Stage::Hyperpod => {
            let (decided, delete) = change.decided(&after);
            let Made {
                request,
                mut created,
                region,
            } = made;
            let groups = create::Groups {
                groups: &decided,
                unlisted: Unlisted::Keep,
                delete: &delete,
            };
            let progress = Box::pin(create::ensure_hyperpod(
                &request,
                cx,
                &region,
                &mut created,
                groups,
            ))
            .await?;
            out.hyperpod_cluster_arn = created.hyperpod.hyperpod_cluster_arn;
            Ok(progress)
        }
        Stage::Nodes => {
            let request = CreateCluster {
                instance_groups: after,
                ..made.request
            };
            Box::pin(create::nodes_ready(&request, cx, &made.region)).await
        }
    }
}

/// What the cluster-usage quota (or the training plan) must cover for `group` to grow
/// from `from` instances: only the instances it adds.
async fn check_growth(
    cx: &Preflight<'_>,
    made: &Made,
    group: &InstanceGroupSpec,
    from: u32,
    at: &str,
) -> Result<(), ApiError> {
    let added = group.instance_count.get().saturating_sub(from);
    if added == 0 {
        return Ok(());
    }
    let mut growth = group.clone();
    growth.instance_count = InstanceCount::new(added)
        .map_err(|e| ApiError::internal(format!("an instance count of {added}: {e}")))?;
    let zone = group
        .availability_zone
        .as_ref()
        .unwrap_or(&made.request.availability_zone);
    hyperpod::check_capacity(
        cx.aws,
        &made.region,
        zone.as_str(),
        std::slice::from_ref(&growth),
        |_| at.to_owned(),
    )
    .await
}

macro_rules! group_pipeline {
    ($t:ty) => {
        impl Pipeline for $t {
            type Stage = Stage;
            type Outputs = Outputs;

            fn target(&self) -> String {
                crate::cluster::target(self.name.as_str())
            }

            fn idempotency_key(&self) -> Option<&IdempotencyKey> {
                self.idempotency_key.as_ref()
            }

            /// The cluster is hypd's, created and active; then the command's own checks.
            async fn preflight(self, cx: &Preflight<'_>) -> Result<Self, ApiError> {
                let made = made(cx.store, &self.name).await?;
                self.check(cx, &made).await?;
                Ok(self)
            }

            async fn step(
                &self,
                cx: &Context,
                stage: Stage,
                out: &mut Outputs,
            ) -> Result<Progress, ApiError> {
                step(self, cx, stage, out).await
            }

            /// The cluster's groups are meant to be as this change left them.
            async fn settle(
                &self,
                cx: &Context,
                _: &Outputs,
                succeeded: bool,
            ) -> Result<(), ApiError> {
                if !succeeded {
                    return Ok(());
                }
                managed::change(
                    &cx.store,
                    self.name.as_str(),
                    &cx.operation_id,
                    |d| match d {
                        Desired::Created(mut r) => {
                            r.instance_groups = self.after(&r.instance_groups)?;
                            Ok(Desired::Created(r))
                        }
                        imported => Ok(imported),
                    },
                )
                .await
            }
        }
    };
}

group_pipeline!(AddInstanceGroup);
group_pipeline!(UpdateInstanceGroup);
group_pipeline!(DeleteInstanceGroup);

/// Each command's own pre-flight, after the cluster's.
trait Check {
    async fn check(&self, cx: &Preflight<'_>, made: &Made) -> Result<(), ApiError>;
}

impl GroupChange for AddInstanceGroup {
    fn cluster(&self) -> &ClusterName {
        &self.name
    }

    fn after(&self, groups: &[InstanceGroupSpec]) -> Result<Vec<InstanceGroupSpec>, ApiError> {
        with_added(groups, &self.group)
    }

    fn decided(&self, _: &[InstanceGroupSpec]) -> (Vec<InstanceGroupSpec>, Vec<String>) {
        (vec![self.group.clone()], Vec::new())
    }
}

impl Check for AddInstanceGroup {
    /// The name is free (in hypd's groups and HyperPod's), the type is offered in the
    /// cluster's zone, the quota or training plan covers it.
    async fn check(&self, cx: &Preflight<'_>, made: &Made) -> Result<(), ApiError> {
        self.after(&made.request.instance_groups)?;
        let live =
            hyperpod_cluster::describe(&cx.aws.sagemaker(&made.region), self.name.as_str(), false)
                .await?;
        if live
            .iter()
            .flat_map(|s| &s.groups)
            .any(|g| g.name == self.group.name.as_str())
        {
            return Err(ApiError::field(
                "group.name",
                format!(
                    "HyperPod cluster {} already has an instance group named {} (made outside hypd)",
                    self.name, self.group.name
                ),
            ));
        }
        check_growth(cx, made, &self.group, 0, "group").await?;
        // Room for its instances in its zone's compute subnet, or a /20 to carve one.
        let zone = self
            .group
            .availability_zone
            .as_ref()
            .unwrap_or(&made.request.availability_zone);
        crate::cluster::network::check_room(
            &cx.aws.ec2(&made.region),
            self.name.as_str(),
            &made.created.network,
            zone.as_str(),
            crate::cluster::network::room_for(self.group.instance_count.get()),
        )
        .await
        .map_err(|e| match e {
            ApiError::Validation { errors } => ApiError::Validation {
                errors: errors
                    .into_iter()
                    .map(|mut f| {
                        f.field = "group.availability_zone".into();
                        f
                    })
                    .collect(),
            },
            other => other,
        })
    }
}

impl GroupChange for UpdateInstanceGroup {
    fn cluster(&self) -> &ClusterName {
        &self.name
    }

    fn after(&self, groups: &[InstanceGroupSpec]) -> Result<Vec<InstanceGroupSpec>, ApiError> {
        let old = find(groups, &self.name, self.group.as_str())?;
        let new = self.applied_to(old)?;
        Ok(groups
            .iter()
            .map(|g| {
                if g.name == self.group {
                    new.clone()
                } else {
                    g.clone()
                }
            })
            .collect())
    }

    fn decided(&self, after: &[InstanceGroupSpec]) -> (Vec<InstanceGroupSpec>, Vec<String>) {
        let changed = after
            .iter()
            .filter(|g| g.name == self.group)
            .cloned()
            .collect();
        (changed, Vec::new())
    }
}

impl Check for UpdateInstanceGroup {
    /// The group exists, its fixed settings are not asked to change, and a larger count
    /// is covered by the quota or its training plan.
    async fn check(&self, cx: &Preflight<'_>, made: &Made) -> Result<(), ApiError> {
        let old = find(
            &made.request.instance_groups,
            &self.name,
            self.group.as_str(),
        )?;
        let new = self.applied_to(old)?;
        check_growth(cx, made, &new, old.instance_count.get(), "").await?;
        let more = new
            .instance_count
            .get()
            .saturating_sub(old.instance_count.get());
        if more > 0 {
            room_to_grow(self, cx, made, more).await?;
        }
        Ok(())
    }
}

/// Room in the group's subnet for `more` instances: HyperPod puts a group's new
/// instances where its first ones are, and a subnet out of addresses fails them one
/// by one after the change is accepted.
async fn room_to_grow(
    r: &UpdateInstanceGroup,
    cx: &Preflight<'_>,
    made: &Made,
    more: u32,
) -> Result<(), ApiError> {
    let sm = cx.aws.sagemaker(&made.region);
    let live = hyperpod_cluster::describe(&sm, r.name.as_str(), false).await?;
    let subnet = live
        .iter()
        .flat_map(|s| &s.groups)
        .find(|g| g.name == r.group.as_str())
        .and_then(|g| {
            g.live
                .as_ref()?
                .override_vpc_config()?
                .subnets()
                .first()
                .cloned()
        })
        .or_else(|| made.created.network.compute_subnet_id.clone());
    let Some(subnet) = subnet else {
        return Ok(());
    };
    let ec2 = cx.aws.ec2(&made.region);
    let Some((free, zone)) = crate::resources::ec2::subnet::free_addresses(&ec2, &subnet).await?
    else {
        return Ok(());
    };
    let need = crate::cluster::network::room_for(more);
    if free < i64::from(need) {
        return Err(ApiError::field(
            "instance_count",
            format!(
                "group {} runs in subnet {subnet} ({zone}), which has {free} free addresses; {more} more instances need {need} ({} each). Add a group for the rest: it gets a compute subnet with room",
                r.group,
                crate::cluster::network::ADDRESSES_PER_INSTANCE
            ),
        ));
    }
    Ok(())
}

impl GroupChange for DeleteInstanceGroup {
    fn cluster(&self) -> &ClusterName {
        &self.name
    }

    fn after(&self, groups: &[InstanceGroupSpec]) -> Result<Vec<InstanceGroupSpec>, ApiError> {
        find(groups, &self.name, self.group.as_str())?;
        Ok(groups
            .iter()
            .filter(|g| g.name != self.group)
            .cloned()
            .collect())
    }

    fn decided(&self, _: &[InstanceGroupSpec]) -> (Vec<InstanceGroupSpec>, Vec<String>) {
        (Vec::new(), vec![self.group.to_string()])
    }
}

impl Check for DeleteInstanceGroup {
    /// The group exists and is not the cluster's last.
    async fn check(&self, _: &Preflight<'_>, made: &Made) -> Result<(), ApiError> {
        if self.after(&made.request.instance_groups)?.is_empty() {
            return Err(ApiError::field(
                "group",
                format!(
                    "{} is the last instance group of {}: a HyperPod cluster needs one; delete the cluster instead",
                    self.group, self.name
                ),
            ));
        }
        Ok(())
    }
}
