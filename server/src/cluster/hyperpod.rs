//! The HyperPod half of a cluster: the shared S3 bucket with hypd's lifecycle script, the
//! HyperPod cluster on the EKS control plane with its instance groups, and what must hold
//! before it is asked for (a free name, HyperPod-buildable types offered in the zone,
//! quota, training plans that fit). Group decisions become HyperPod group specs here,
//! once, for creation and every later change of groups alike.

use std::collections::BTreeMap;
use std::time::Duration;

use app::api::ApiError;
use app::api::clusters::{Capacity, InstanceGroupSpec};
use serde::{Deserialize, Serialize};

use super::network::{self, Network};
use crate::aws::Aws;
use crate::inspect;
use crate::operation::pipeline::Progress;
use crate::resources::s3::bucket::{Bucket, Files};
use crate::resources::s3::object::Object;
use crate::resources::sagemaker::capacity::{self, quota_name};
use crate::resources::sagemaker::cluster::{
    self as hyperpod, GroupCapacity, GroupSpec, HyperPodCluster, HyperPodSpec, Unlisted,
};
use crate::resources::{Want, converge, missing};

const POLL: Duration = Duration::from_secs(60);
pub const LIFECYCLE_PREFIX: &str = "hypd/lifecycle";
const ON_CREATE: &str = "on_create.sh";

/// hypd's lifecycle script: HyperPod runs it once on every new instance.
const ON_CREATE_SCRIPT: &str = r#"#!/bin/bash
# hypd lifecycle script for HyperPod instances orchestrated by EKS (runs once per instance).
set -euo pipefail
mkdir -p /var/log/provision
exec > >(tee -a /var/log/provision/hypd-on-create.log) 2>&1
echo "hypd on_create: $(date -Is) on $(hostname)"
# The root volume is small; container images and pod data go to the secondary EBS volume
# HyperPod mounts at /opt/sagemaker.
if mountpoint -q /opt/sagemaker; then
  mkdir -p /opt/sagemaker/containerd /opt/sagemaker/kubelet
  if [ -f /etc/containerd/config.toml ] && ! grep -q '/opt/sagemaker/containerd' /etc/containerd/config.toml; then
    sed -i 's|^root = .*|root = "/opt/sagemaker/containerd"|' /etc/containerd/config.toml
    systemctl restart containerd || true
  fi
fi
echo "hypd on_create: done"
"#;

/// What the HyperPod stage made or adopted (stored with the operation).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Made {
    pub s3_bucket: Option<String>,
    /// hypd created the bucket (teardown may remove it once it is empty).
    pub bucket_created: bool,
    pub lifecycle_script_uri: Option<String>,
    pub hyperpod_cluster_arn: Option<String>,
}

/// Two threads per core where HyperPod recommends it (p4, p5, p6 and training plans);
/// the type's own default otherwise.
pub fn threads_per_core(instance_type: &str, capacity: &Capacity) -> Option<u32> {
    let family = instance_type.trim_start_matches("ml.").split('.').next()?;
    let big_gpu = ["p4", "p5", "p6"].iter().any(|p| family.starts_with(p));
    (big_gpu || matches!(capacity, Capacity::TrainingPlan { .. })).then_some(2)
}

/// The groups as HyperPod takes them, with the cluster's execution role and scripts.
pub fn group_specs(
    groups: &[InstanceGroupSpec],
    execution_role: &str,
    bucket: &str,
) -> Vec<GroupSpec> {
    groups
        .iter()
        .map(|g| GroupSpec {
            name: g.name.to_string(),
            instance_type: g.instance_type.to_string(),
            instance_count: g.instance_count.get(),
            execution_role: execution_role.to_owned(),
            lifecycle_source: format!("s3://{bucket}/{LIFECYCLE_PREFIX}/"),
            on_create: ON_CREATE.to_owned(),
            volume_size_gb: g.volume_size_gb.get(),
            threads_per_core: g
                .threads_per_core
                .map(|t| t.get())
                .or_else(|| threads_per_core(g.instance_type.as_str(), &g.capacity)),
            deep_health_checks: g.deep_health_checks,
            capacity: match &g.capacity {
                Capacity::OnDemand => GroupCapacity::OnDemand,
                Capacity::Spot => GroupCapacity::Spot,
                Capacity::TrainingPlan { training_plan_arn } => {
                    GroupCapacity::TrainingPlan(training_plan_arn.to_string())
                }
            },
            efa_only: g.efa_only,
            subnet: None,
            zone: None,
            labels: g.kubernetes_labels.clone(),
            taints: g
                .kubernetes_taints
                .iter()
                .map(|t| (t.key.clone(), t.value.clone(), t.effect.as_str().to_owned()))
                .collect(),
        })
        .collect()
}

/// Pre-flight: no HyperPod cluster has the name yet.
pub async fn check_name_free(aws: &Aws, region: &str, name: &str) -> Result<(), ApiError> {
    if hyperpod::describe(&aws.sagemaker(region), name, false)
        .await?
        .is_some()
    {
        return Err(ApiError::field(
            "name",
            format!("a HyperPod cluster named {name} already exists in {region}"),
        ));
    }
    Ok(())
}

/// Pre-flight for instance groups in `zone`: each type is one HyperPod builds and EC2
/// offers there; the account's "<type> for cluster usage" quota covers the instances
/// HyperPod clusters already hold plus the requested ones; each training plan is usable,
/// reserves the group's type in the zone and has room. AWS would refuse the first two
/// only at the HyperPod stage, after the network, IAM and EKS were made. Errors name the
/// group's fields under `at(i)` (`instance_groups[1]`; `group` for a request of one, or
/// empty for one whose fields are its own).
pub async fn check_capacity(
    aws: &Aws,
    region: &str,
    zone: &str,
    groups: &[InstanceGroupSpec],
    at: impl Fn(usize) -> String,
) -> Result<(), ApiError> {
    let mut wanted: BTreeMap<&str, (i64, usize)> = BTreeMap::new();
    for (i, g) in groups.iter().enumerate() {
        let at = at(i);
        let t = g.instance_type.as_str();
        if !wanted.contains_key(t) {
            inspect::check_offered(aws, region, zone, t, &under(&at, "instance_type")).await?;
        }
        let entry = wanted.entry(t).or_insert((0, i));
        entry.0 += i64::from(g.instance_count.get());
        if let Capacity::TrainingPlan { training_plan_arn } = &g.capacity {
            check_training_plan(aws, region, zone, g, training_plan_arn.as_str(), &at).await?;
        }
    }
    // Reserved capacity is not drawn from the on-demand quota.
    let on_quota: Vec<&str> = wanted
        .keys()
        .copied()
        .filter(|t| {
            groups.iter().any(|g| {
                g.instance_type.as_str() == *t
                    && !matches!(g.capacity, Capacity::TrainingPlan { .. })
            })
        })
        .collect();
    if on_quota.is_empty() {
        return Ok(());
    }
    let quotas = capacity::cluster_usage_quotas(&aws.service_quotas(region), &on_quota).await?;
    let used = capacity::instances_in_use(&aws.sagemaker(region)).await?;
    for t in on_quota {
        let (asked, first) = wanted[t];
        let field = under(&at(first), "instance_count");
        let name = quota_name(t);
        let Some(limit) = quotas.get(t).copied() else {
            return Err(ApiError::field(
                field,
                format!(
                    "the account has no quota \"{name}\" in {region}, so HyperPod cannot run {t} there; ask for it in Service Quotas or choose another type"
                ),
            ));
        };
        let in_use = used.get(t).copied().unwrap_or(0);
        if (in_use + asked) as f64 > limit {
            return Err(ApiError::field(
                field,
                format!(
                    "the quota \"{name}\" in {region} is {limit}; HyperPod clusters already use {in_use}, so {asked} more would exceed it. Ask for an increase in Service Quotas, choose another instance type, or use a training plan",
                ),
            ));
        }
    }
    Ok(())
}

/// Field `field` of the group at `at` (`at` empty: the request's own field).
fn under(at: &str, field: &str) -> String {
    if at.is_empty() {
        field.to_owned()
    } else {
        format!("{at}.{field}")
    }
}

async fn check_training_plan(
    aws: &Aws,
    region: &str,
    zone: &str,
    g: &InstanceGroupSpec,
    arn: &str,
    at: &str,
) -> Result<(), ApiError> {
    let field = under(at, "capacity.training_plan_arn");
    let plan_name = arn.rsplit('/').next().unwrap_or_default();
    let Some(plan) = capacity::training_plan(&aws.sagemaker(region), plan_name).await? else {
        return Err(ApiError::field(
            field,
            format!("there is no training plan {plan_name} in {region}"),
        ));
    };
    if !plan.usable() {
        return Err(ApiError::field(
            field,
            format!(
                "training plan {plan_name} is {}; only an Active or Scheduled plan provides capacity",
                plan.status
                    .as_ref()
                    .map_or("in an unknown state", |s| s.as_str())
            ),
        ));
    }
    let mut errors = Vec::new();
    for (t, az) in &plan.reserved {
        if let Some(t) = t
            && t != g.instance_type.as_str()
        {
            errors.push(format!(
                "it reserves {t} instances, not {}",
                g.instance_type
            ));
        }
        if let Some(az) = az
            && az != zone
        {
            errors.push(format!("its capacity is in {az}, not {zone}"));
        }
    }
    let asked = g.instance_count.get();
    if plan.available_instances < i32::try_from(asked).unwrap_or(i32::MAX) {
        errors.push(format!(
            "{} of its instances are free, {asked} requested",
            plan.available_instances
        ));
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(ApiError::field(
            field,
            format!(
                "training plan {plan_name} does not fit: {}",
                errors.join("; ")
            ),
        ))
    }
}

/// Everything the HyperPod stage needs to know about the cluster.
pub struct Context<'a> {
    pub region: &'a str,
    pub cluster: &'a str,
    pub bucket: &'a str,
    pub groups: &'a [InstanceGroupSpec],
    pub eks_cluster_arn: &'a str,
    pub execution_role: &'a str,
    pub network: &'a Network,
    /// Live groups `groups` does not list: a conflict for the cluster's whole desired
    /// state, kept as they are for a change of some groups.
    pub unlisted: Unlisted,
    /// Groups to delete.
    pub delete: &'a [String],
}

/// The bucket, the script, then the HyperPod cluster; waits until it is InService.
pub async fn ensure(aws: &Aws, cx: &Context<'_>, made: &mut Made) -> Result<Progress, ApiError> {
    let s3 = aws.s3(cx.region);
    let bucket = converge(&Bucket {
        s3: s3.clone(),
        name: cx.bucket.to_owned(),
        region: cx.region.to_owned(),
        cluster: cx.cluster.to_owned(),
        want: Want::Present(()),
        hypd_files: Files::Under(LIFECYCLE_PREFIX.to_owned()),
        field: "storage.s3_bucket",
        // The user may name a bucket of theirs: never take one without hypd's tags.
        adopt: false,
        harden: false,
    })
    .await?;
    made.bucket_created |= bucket.created;
    made.s3_bucket = Some(cx.bucket.to_owned());
    let key = format!("{LIFECYCLE_PREFIX}/{ON_CREATE}");
    converge(&Object {
        s3,
        bucket: cx.bucket.to_owned(),
        key: key.clone(),
        body: ON_CREATE_SCRIPT.as_bytes(),
        content_type: "text/x-shellscript",
    })
    .await?;
    made.lifecycle_script_uri = Some(format!("s3://{}/{key}", cx.bucket));
    let subnet_id = cx
        .network
        .compute_subnet_id
        .clone()
        .ok_or_else(|| missing("the compute subnet"))?;
    let security_group_id = cx
        .network
        .security_group_id
        .clone()
        .ok_or_else(|| missing("the security group"))?;
    let mut groups = group_specs(cx.groups, cx.execution_role, cx.bucket);
    place(aws, cx, &subnet_id, &security_group_id, &mut groups).await?;
    let spec = HyperPodSpec {
        eks_cluster_arn: cx.eks_cluster_arn.to_owned(),
        subnet_id,
        security_group_id,
        groups,
        unlisted: cx.unlisted,
        delete: cx.delete.to_vec(),
    };
    let state = converge(&HyperPodCluster {
        sagemaker: aws.sagemaker(cx.region),
        name: cx.cluster.to_owned(),
        want: Want::Present(spec),
    })
    .await?;
    let Some(state) = state else {
        return Ok(Progress::wait(
            POLL,
            format!("HyperPod cluster {} is Creating", cx.cluster),
        ));
    };
    made.hyperpod_cluster_arn = state.arn.clone();
    Ok(Progress::unless(POLL, state.progress(cx.cluster)?))
}

/// Where each new group's instances go: the compute subnet of its zone with room for
/// them (the cluster's own when that is it, else a group override on a subnet
/// [`network::compute_subnet`] picks or carves, routed privately). A group HyperPod has
/// already keeps the subnet it runs in.
async fn place(
    aws: &Aws,
    cx: &Context<'_>,
    cluster_subnet: &str,
    security_group: &str,
    groups: &mut [GroupSpec],
) -> Result<(), ApiError> {
    let live = hyperpod::describe(&aws.sagemaker(cx.region), cx.cluster, false).await?;
    let has = |name: &str| live.iter().flat_map(|s| &s.groups).any(|g| g.name == name);
    let ec2 = aws.ec2(cx.region);
    let vpc = cx
        .network
        .vpc_id
        .as_deref()
        .ok_or_else(|| missing("the VPC"))?;
    let cidr = cx
        .network
        .vpc_cidr
        .as_deref()
        .and_then(|c| app::api::values::Cidr::parse(c).ok())
        .ok_or_else(|| missing("the VPC's block"))?;
    let home = cx
        .network
        .availability_zones
        .first()
        .ok_or_else(|| missing("the cluster's zone"))?;
    for (request, g) in cx.groups.iter().zip(groups.iter_mut()) {
        if has(&g.name) {
            continue;
        }
        let zone = request
            .availability_zone
            .as_ref()
            .map_or(home.as_str(), |z| z.as_str());
        g.zone = Some(zone.to_owned());
        // The cluster's own subnet, made by this very plan: new, so it has the room.
        if zone == home && crate::resources::known_after_apply(cluster_subnet) {
            continue;
        }
        let room = network::room_for(g.instance_count);
        let subnet = network::compute_subnet(&ec2, cx.cluster, vpc, cidr, zone, room).await?;
        if subnet != cluster_subnet {
            network::route_privately(&ec2, cx.cluster, cx.network, Some(&subnet)).await?;
            g.subnet = Some((subnet, security_group.to_owned()));
        }
    }
    Ok(())
}

/// Deletes the HyperPod cluster named `cluster` if hypd made it (its tags say so) and
/// waits until it is gone.
pub async fn teardown(aws: &Aws, region: &str, cluster: &str) -> Result<Progress, ApiError> {
    let state = converge(&HyperPodCluster {
        sagemaker: aws.sagemaker(region),
        name: cluster.to_owned(),
        want: Want::Absent,
    })
    .await?;
    Ok(match state {
        Some(s) if s.ours => {
            Progress::wait(POLL, format!("HyperPod cluster {cluster} is Deleting"))
        }
        _ => Progress::Done,
    })
}

/// Deletes the shared bucket if hypd made it for `cluster` and it holds nothing but the
/// lifecycle scripts; otherwise keeps it (data outlives clusters) and says why.
pub async fn delete_bucket(
    aws: &Aws,
    region: &str,
    cluster: &str,
    bucket: &str,
) -> Result<Option<String>, ApiError> {
    let b = Bucket {
        s3: aws.s3(region),
        name: bucket.to_owned(),
        region: region.to_owned(),
        cluster: cluster.to_owned(),
        want: Want::Absent,
        hypd_files: Files::Under(LIFECYCLE_PREFIX.to_owned()),
        field: "storage.s3_bucket",
        // The user may name a bucket of theirs: never take one without hypd's tags.
        adopt: false,
        harden: false,
    };
    let after = converge(&b).await?;
    Ok(b.kept(&after))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_threads_per_core_for_big_gpus_and_plans() {
        assert_eq!(
            threads_per_core("ml.p5.48xlarge", &Capacity::OnDemand),
            Some(2)
        );
        assert_eq!(
            threads_per_core("ml.p4d.24xlarge", &Capacity::Spot),
            Some(2)
        );
        assert_eq!(threads_per_core("ml.g5.8xlarge", &Capacity::OnDemand), None);
        let plan = Capacity::TrainingPlan {
            training_plan_arn: "arn:aws:sagemaker:us-east-1:123456789012:training-plan/x"
                .parse()
                .unwrap(),
        };
        assert_eq!(threads_per_core("ml.g5.8xlarge", &plan), Some(2));
    }

    #[test]
    fn each_group_keeps_its_own_decisions() {
        let groups: Vec<InstanceGroupSpec> = serde_json::from_value(serde_json::json!([
            {"name": "train", "instance_type": "ml.p5.48xlarge", "instance_count": 4, "efa_only": true},
            {"name": "spot", "instance_type": "ml.g5.8xlarge", "instance_count": 2,
             "capacity": {"type": "spot"}, "volume_size_gb": 200, "threads_per_core": 1},
        ]))
        .unwrap();
        let specs = group_specs(&groups, "arn:aws:iam::1:role/r", "b");
        assert_eq!(specs[0].threads_per_core, Some(2));
        assert!(specs[0].efa_only);
        assert_eq!(specs[1].capacity, GroupCapacity::Spot);
        assert_eq!(specs[1].threads_per_core, Some(1));
        assert_eq!(specs[1].volume_size_gb, 200);
        assert_eq!(specs[1].lifecycle_source, "s3://b/hypd/lifecycle/");
    }
}
