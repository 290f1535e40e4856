//! The HyperPod half of a cluster: the shared S3 bucket with hypd's lifecycle script, and
//! the HyperPod cluster on the EKS control plane with automatic node recovery and
//! continuous provisioning. Instance-group settings that cannot change for a group's
//! life (capacity type, EFA-only interfaces) are decided here, once.

use std::time::Duration;

use app::api::ApiError;
use app::api::clusters::{Capacity, CreateCluster};
use app::api::inspect::efa_only_allowed;
use aws_sdk_sagemaker::error::ProvideErrorMetadata;
use aws_sdk_sagemaker::types::{
    ClusterCapacityRequirements, ClusterEbsVolumeConfig, ClusterInstanceGroupSpecification,
    ClusterInstanceStorageConfig, ClusterInstanceType, ClusterInterfaceType,
    ClusterLifeCycleConfig, ClusterNetworkInterface, ClusterNodeProvisioningMode,
    ClusterNodeRecovery, ClusterOrchestrator, ClusterOrchestratorEksConfig, ClusterSpotOptions,
    ClusterStatus, DeepHealthCheckType, Tag, TrainingPlanStatus, VpcConfig,
};
use serde::{Deserialize, Serialize};

use crate::aws::Aws;
use crate::network::Network;
use crate::operation::pipeline::Progress;

/// The first instance group's name.
pub const GROUP: &str = "accelerated-1";
const POLL: Duration = Duration::from_secs(60);
const EBS_GB: i32 = 500;
const LIFECYCLE_PREFIX: &str = "hypd/lifecycle";
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

/// What the HyperPod stage made or adopted.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Made {
    pub s3_bucket: Option<String>,
    /// hypd created the bucket (teardown may remove it once it is empty).
    pub bucket_created: bool,
    pub lifecycle_script_uri: Option<String>,
    pub hyperpod_cluster_arn: Option<String>,
}

pub struct Spec<'a> {
    pub region: &'a str,
    pub cluster: &'a str,
    pub bucket: &'a str,
    pub instance_type: &'a str,
    pub instance_count: u32,
    pub capacity: &'a Capacity,
    pub efa_only: bool,
    pub deep_health_checks: bool,
}

/// Two threads per core where HyperPod recommends it (p4, p5, p6 and training plans).
pub fn threads_per_core(instance_type: &str, capacity: &Capacity) -> Option<i32> {
    let family = instance_type.trim_start_matches("ml.").split('.').next()?;
    let big_gpu = ["p4", "p5", "p6"].iter().any(|p| family.starts_with(p));
    (big_gpu || matches!(capacity, Capacity::TrainingPlan { .. })).then_some(2)
}

/// Pre-flight: no HyperPod cluster has the name yet.
pub async fn check(aws: &Aws, region: &str, r: &CreateCluster) -> Result<(), ApiError> {
    match aws
        .sagemaker(region)
        .describe_cluster()
        .cluster_name(r.name.as_str())
        .send()
        .await
    {
        Ok(_) => Err(ApiError::field(
            "name",
            format!(
                "a HyperPod cluster named {} already exists in {region}",
                r.name
            ),
        )),
        Err(e) if matches!(e.code(), Some("ResourceNotFound" | "ValidationException")) => Ok(()),
        Err(e) => Err(crate::aws::upstream("sagemaker", "DescribeCluster", e)),
    }
}

/// Pre-flight: the account's "<type> for cluster usage" quota in the region covers the
/// instances HyperPod clusters already hold plus the requested ones. AWS would refuse
/// CreateCluster with ResourceLimitExceeded only after the network, IAM and EKS stages
/// had run; here it is a field error before anything is made.
pub async fn check_quota(aws: &Aws, region: &str, r: &CreateCluster) -> Result<(), ApiError> {
    let instance_type = r.instance_type.as_str();
    let quota_name = format!("{instance_type} for cluster usage");
    let mut pages = aws
        .service_quotas(region)
        .list_service_quotas()
        .service_code("sagemaker")
        .into_paginator()
        .send();
    let mut limit = None;
    while let Some(page) = pages.next().await {
        let page =
            page.map_err(|e| crate::aws::upstream("servicequotas", "ListServiceQuotas", e))?;
        if let Some(q) = page
            .quotas()
            .iter()
            .find(|q| q.quota_name() == Some(quota_name.as_str()))
        {
            limit = q.value();
            break;
        }
    }
    // No such quota listed: nothing to compare with; CreateCluster has the last word.
    let Some(limit) = limit else {
        return Ok(());
    };
    let sm = aws.sagemaker(region);
    let mut used = 0_i64;
    let mut clusters = sm.list_clusters().into_paginator().send();
    while let Some(page) = clusters.next().await {
        let page = page.map_err(|e| crate::aws::upstream("sagemaker", "ListClusters", e))?;
        for summary in page.cluster_summaries() {
            let Some(name) = summary.cluster_name() else {
                continue;
            };
            let c = match sm.describe_cluster().cluster_name(name).send().await {
                Ok(c) => c,
                // Deleted between the list and the describe.
                Err(e) if e.code() == Some("ResourceNotFound") => continue,
                Err(e) => return Err(crate::aws::upstream("sagemaker", "DescribeCluster", e)),
            };
            used += c
                .instance_groups()
                .iter()
                .filter(|g| g.instance_type().map(|t| t.as_str()) == Some(instance_type))
                .map(|g| i64::from(g.target_count().unwrap_or(0)))
                .sum::<i64>();
        }
    }
    let wanted = i64::from(r.instance_count.get());
    if (used + wanted) as f64 > limit {
        return Err(ApiError::field(
            "instance_count",
            format!(
                "the quota \"{quota_name}\" in {region} is {limit}; HyperPod clusters already use {used}, so {wanted} more would exceed it. Ask for an increase in Service Quotas, choose another instance type, or use a training plan",
            ),
        ));
    }
    Ok(())
}

/// Pre-flight for a training plan: it exists, is active or scheduled, covers the instance
/// type and count, and is in the requested AZ.
pub async fn check_training_plan(aws: &Aws, r: &CreateCluster) -> Result<(), ApiError> {
    let Capacity::TrainingPlan { training_plan_arn } = &r.capacity else {
        return Ok(());
    };
    const FIELD: &str = "capacity.training_plan_arn";
    let region = r.region.as_ref().map(|r| r.to_string()).unwrap_or_default();
    let plan_name = training_plan_arn
        .as_str()
        .rsplit('/')
        .next()
        .unwrap_or_default();
    let plan = match aws
        .sagemaker(&region)
        .describe_training_plan()
        .training_plan_name(plan_name)
        .send()
        .await
    {
        Ok(p) => p,
        Err(e) if matches!(e.code(), Some("ResourceNotFound" | "ValidationException")) => {
            return Err(ApiError::field(
                FIELD,
                format!("there is no training plan {plan_name} in {region}"),
            ));
        }
        Err(e) => return Err(crate::aws::upstream("sagemaker", "DescribeTrainingPlan", e)),
    };
    let status = plan.status();
    if !matches!(
        status,
        Some(TrainingPlanStatus::Active | TrainingPlanStatus::Scheduled)
    ) {
        return Err(ApiError::field(
            FIELD,
            format!(
                "training plan {plan_name} is {}; only an Active or Scheduled plan provides capacity",
                status.map_or("in an unknown state", |s| s.as_str())
            ),
        ));
    }
    let mut errors = Vec::new();
    for rc in plan.reserved_capacity_summaries() {
        if let Some(t) = rc.instance_type()
            && t.as_str() != r.instance_type.as_str()
        {
            errors.push(format!(
                "it reserves {} instances, not {}",
                t.as_str(),
                r.instance_type
            ));
        }
        if let Some(az) = rc.availability_zone()
            && az != r.availability_zone.as_str()
        {
            errors.push(format!(
                "its capacity is in {az}, not {}",
                r.availability_zone
            ));
        }
    }
    let available = plan.available_instance_count().unwrap_or(0);
    if available < i32::try_from(r.instance_count.get()).unwrap_or(i32::MAX) {
        errors.push(format!(
            "{available} of its instances are free, {} requested",
            r.instance_count.get()
        ));
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(ApiError::field(
            FIELD,
            format!(
                "training plan {plan_name} does not fit: {}",
                errors.join("; ")
            ),
        ))
    }
}

/// The bucket, the script, then the HyperPod cluster; waits until it is InService.
pub async fn ensure(
    aws: &Aws,
    spec: &Spec<'_>,
    eks_arn: &str,
    execution_role: &str,
    network: &Network,
    made: &mut Made,
) -> Result<Progress, ApiError> {
    ensure_bucket(aws, spec, made).await?;
    let sm = aws.sagemaker(spec.region);
    let found = match sm
        .describe_cluster()
        .cluster_name(spec.cluster)
        .send()
        .await
    {
        Ok(c) => Some(c),
        Err(e) if matches!(e.code(), Some("ResourceNotFound" | "ValidationException")) => None,
        Err(e) => return Err(crate::aws::upstream("sagemaker", "DescribeCluster", e)),
    };
    let Some(c) = found else {
        create(aws, spec, eks_arn, execution_role, network).await?;
        return Ok(Progress::wait(
            POLL,
            format!("HyperPod cluster {} is Creating", spec.cluster),
        ));
    };
    made.hyperpod_cluster_arn = c.cluster_arn().map(str::to_owned);
    match c.cluster_status() {
        Some(ClusterStatus::Inservice) => Ok(Progress::Done),
        Some(
            s @ (ClusterStatus::Creating | ClusterStatus::Updating | ClusterStatus::Systemupdating),
        ) => {
            let groups: Vec<String> = c
                .instance_groups()
                .iter()
                .map(|g| {
                    format!(
                        "{} {}/{}",
                        g.instance_group_name().unwrap_or_default(),
                        g.current_count().unwrap_or(0),
                        g.target_count().unwrap_or(0)
                    )
                })
                .collect();
            Ok(Progress::wait(
                POLL,
                format!(
                    "HyperPod cluster {} is {} ({})",
                    spec.cluster,
                    s.as_str(),
                    groups.join(", ")
                ),
            ))
        }
        s => Err(ApiError::Upstream {
            service: "sagemaker".into(),
            call: "DescribeCluster".into(),
            code: s.map(|s| s.as_str().to_owned()),
            message: format!(
                "HyperPod cluster {} is {}: {}",
                spec.cluster,
                s.map_or("in an unknown state", |s| s.as_str()),
                c.failure_message().unwrap_or("no reason given")
            ),
            request_id: None,
        }),
    }
}

async fn ensure_bucket(aws: &Aws, spec: &Spec<'_>, made: &mut Made) -> Result<(), ApiError> {
    let s3 = aws.s3(spec.region);
    match s3.head_bucket().bucket(spec.bucket).send().await {
        Ok(_) => {}
        Err(e) if e.raw_response().is_some_and(|r| r.status().as_u16() == 404) => {
            let mut req = s3.create_bucket().bucket(spec.bucket);
            if spec.region != "us-east-1" {
                req = req.create_bucket_configuration(
                    aws_sdk_s3::types::CreateBucketConfiguration::builder()
                        .location_constraint(aws_sdk_s3::types::BucketLocationConstraint::from(
                            spec.region,
                        ))
                        .build(),
                );
            }
            match req.send().await {
                Ok(_) => made.bucket_created = true,
                Err(e) if e.code() == Some("BucketAlreadyOwnedByYou") => {}
                Err(e) if e.code() == Some("BucketAlreadyExists") => {
                    return Err(ApiError::field(
                        "storage.s3_bucket",
                        format!(
                            "bucket {} belongs to another account; choose another name",
                            spec.bucket
                        ),
                    ));
                }
                Err(e) => return Err(crate::aws::upstream("s3", "CreateBucket", e)),
            }
            let tagging = aws_sdk_s3::types::Tagging::builder()
                .tag_set(
                    aws_sdk_s3::types::Tag::builder()
                        .key("hypd:managed")
                        .value("true")
                        .build()
                        .map_err(ApiError::internal)?,
                )
                .tag_set(
                    aws_sdk_s3::types::Tag::builder()
                        .key("hypd:cluster")
                        .value(spec.cluster)
                        .build()
                        .map_err(ApiError::internal)?,
                )
                .build()
                .map_err(ApiError::internal)?;
            s3.put_bucket_tagging()
                .bucket(spec.bucket)
                .tagging(tagging)
                .send()
                .await
                .map_err(|e| crate::aws::upstream("s3", "PutBucketTagging", e))?;
        }
        Err(e) => return Err(crate::aws::upstream("s3", "HeadBucket", e)),
    }
    made.s3_bucket = Some(spec.bucket.to_owned());
    // Writing the same script again is harmless: the object is replaced by itself.
    s3.put_object()
        .bucket(spec.bucket)
        .key(format!("{LIFECYCLE_PREFIX}/{ON_CREATE}"))
        .body(ON_CREATE_SCRIPT.as_bytes().to_vec().into())
        .content_type("text/x-shellscript")
        .send()
        .await
        .map_err(|e| crate::aws::upstream("s3", "PutObject", e))?;
    made.lifecycle_script_uri = Some(format!(
        "s3://{}/{LIFECYCLE_PREFIX}/{ON_CREATE}",
        spec.bucket
    ));
    Ok(())
}

/// The first instance group, from the request's decisions.
pub fn instance_group(spec: &Spec<'_>, execution_role: &str) -> ClusterInstanceGroupSpecification {
    let mut g = ClusterInstanceGroupSpecification::builder()
        .instance_group_name(GROUP)
        .instance_type(ClusterInstanceType::from(spec.instance_type))
        .instance_count(i32::try_from(spec.instance_count).unwrap_or(i32::MAX))
        .execution_role(execution_role)
        .life_cycle_config(
            ClusterLifeCycleConfig::builder()
                .source_s3_uri(format!("s3://{}/{LIFECYCLE_PREFIX}/", spec.bucket))
                .on_create(ON_CREATE)
                .build(),
        )
        .instance_storage_configs(ClusterInstanceStorageConfig::EbsVolumeConfig(
            ClusterEbsVolumeConfig::builder()
                .volume_size_in_gb(EBS_GB)
                .build(),
        ))
        .set_threads_per_core(threads_per_core(spec.instance_type, spec.capacity));
    if spec.deep_health_checks {
        g = g
            .on_start_deep_health_checks(DeepHealthCheckType::InstanceStress)
            .on_start_deep_health_checks(DeepHealthCheckType::InstanceConnectivity);
    }
    match spec.capacity {
        Capacity::OnDemand => {}
        Capacity::Spot => {
            g = g.capacity_requirements(
                ClusterCapacityRequirements::builder()
                    .spot(ClusterSpotOptions::builder().build())
                    .build(),
            );
        }
        Capacity::TrainingPlan { training_plan_arn } => {
            g = g.training_plan_arn(training_plan_arn.as_str());
        }
    }
    if spec.efa_only && efa_only_allowed(spec.instance_type, None) {
        g = g.network_interface(
            ClusterNetworkInterface::builder()
                .interface_type(ClusterInterfaceType::EfaOnly)
                .build(),
        );
    }
    g.build()
}

async fn create(
    aws: &Aws,
    spec: &Spec<'_>,
    eks_arn: &str,
    execution_role: &str,
    network: &Network,
) -> Result<(), ApiError> {
    let subnet = network
        .compute_subnet_id
        .clone()
        .ok_or_else(|| ApiError::internal("the network stage stored no compute subnet"))?;
    let sg = network
        .security_group_id
        .clone()
        .ok_or_else(|| ApiError::internal("the network stage stored no security group"))?;
    let tag = |k: &str, v: &str| Tag::builder().key(k).value(v).build();
    let result = aws
        .sagemaker(spec.region)
        .create_cluster()
        .cluster_name(spec.cluster)
        .orchestrator(
            ClusterOrchestrator::builder()
                .eks(
                    ClusterOrchestratorEksConfig::builder()
                        .cluster_arn(eks_arn)
                        .build(),
                )
                .build(),
        )
        .node_recovery(ClusterNodeRecovery::Automatic)
        .node_provisioning_mode(ClusterNodeProvisioningMode::Continuous)
        .vpc_config(
            VpcConfig::builder()
                .security_group_ids(sg)
                .subnets(subnet)
                .build(),
        )
        .instance_groups(instance_group(spec, execution_role))
        .tags(tag("hypd:managed", "true"))
        .tags(tag("hypd:cluster", spec.cluster))
        .send()
        .await;
    match result {
        Ok(_) => Ok(()),
        // Made by an earlier run of this step whose answer was lost.
        Err(e) if e.code() == Some("ResourceInUse") => Ok(()),
        Err(e) => Err(crate::aws::upstream("sagemaker", "CreateCluster", e)),
    }
}

/// Deletes the HyperPod cluster named `cluster` if hypd made it (its tags say so) and
/// waits until it is gone.
pub async fn teardown(aws: &Aws, region: &str, cluster: &str) -> Result<Progress, ApiError> {
    let sm = aws.sagemaker(region);
    let c = match sm.describe_cluster().cluster_name(cluster).send().await {
        Ok(c) => c,
        Err(e) if matches!(e.code(), Some("ResourceNotFound" | "ValidationException")) => {
            return Ok(Progress::Done);
        }
        Err(e) => return Err(crate::aws::upstream("sagemaker", "DescribeCluster", e)),
    };
    let arn = c.cluster_arn().unwrap_or_default();
    let tags = sm
        .list_tags()
        .resource_arn(arn)
        .send()
        .await
        .map_err(|e| crate::aws::upstream("sagemaker", "ListTags", e))?;
    let ours = tags
        .tags()
        .iter()
        .any(|t| t.key() == Some("hypd:cluster") && t.value() == Some(cluster));
    if !ours {
        return Ok(Progress::Done);
    }
    if c.cluster_status() != Some(&ClusterStatus::Deleting) {
        sm.delete_cluster()
            .cluster_name(cluster)
            .send()
            .await
            .map_err(|e| crate::aws::upstream("sagemaker", "DeleteCluster", e))?;
    }
    Ok(Progress::wait(
        POLL,
        format!("HyperPod cluster {cluster} is Deleting"),
    ))
}

/// Deletes the shared bucket if hypd made it for `cluster` and it holds nothing but the
/// lifecycle scripts; otherwise keeps it (data outlives clusters) and says why.
pub async fn delete_bucket(
    aws: &Aws,
    region: &str,
    cluster: &str,
    bucket: &str,
) -> Result<Option<String>, ApiError> {
    let s3 = aws.s3(region);
    let tags = match s3.get_bucket_tagging().bucket(bucket).send().await {
        Ok(t) => t,
        Err(e) if matches!(e.code(), Some("NoSuchBucket" | "NoSuchTagSet")) => return Ok(None),
        Err(e) => return Err(crate::aws::upstream("s3", "GetBucketTagging", e)),
    };
    if !tags
        .tag_set()
        .iter()
        .any(|t| t.key() == "hypd:cluster" && t.value() == cluster)
    {
        return Ok(None);
    }
    let listed = s3
        .list_objects_v2()
        .bucket(bucket)
        .send()
        .await
        .map_err(|e| crate::aws::upstream("s3", "ListObjectsV2", e))?;
    let keys: Vec<&str> = listed.contents().iter().filter_map(|o| o.key()).collect();
    let data = keys
        .iter()
        .filter(|k| !k.starts_with(LIFECYCLE_PREFIX))
        .count();
    if data > 0 {
        return Ok(Some(format!(
            "kept bucket {bucket}: it holds {data} objects besides hypd's lifecycle scripts"
        )));
    }
    for key in keys {
        s3.delete_object()
            .bucket(bucket)
            .key(key)
            .send()
            .await
            .map_err(|e| crate::aws::upstream("s3", "DeleteObject", e))?;
    }
    match s3.delete_bucket().bucket(bucket).send().await {
        Ok(_) => Ok(None),
        Err(e) if e.code() == Some("NoSuchBucket") => Ok(None),
        Err(e) => Err(crate::aws::upstream("s3", "DeleteBucket", e)),
    }
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
    fn the_group_carries_every_decision() {
        let spec = Spec {
            region: "us-east-1",
            cluster: "ml-1",
            bucket: "hypd-ml-1-123456789012",
            instance_type: "ml.p5.48xlarge",
            instance_count: 4,
            capacity: &Capacity::Spot,
            efa_only: true,
            deep_health_checks: true,
        };
        let g = instance_group(&spec, "arn:aws:iam::123456789012:role/hypd-ml-1-hyperpod");
        assert_eq!(g.instance_count(), Some(4));
        assert_eq!(g.threads_per_core(), Some(2));
        assert_eq!(g.on_start_deep_health_checks().len(), 2);
        assert!(g.capacity_requirements().and_then(|c| c.spot()).is_some());
        assert_eq!(
            g.network_interface().and_then(|n| n.interface_type()),
            Some(&ClusterInterfaceType::EfaOnly)
        );
        assert_eq!(
            g.life_cycle_config().and_then(|l| l.source_s3_uri()),
            Some("s3://hypd-ml-1-123456789012/hypd/lifecycle/")
        );
    }
}
