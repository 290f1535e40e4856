//! `list_instance_groups`: a cluster's HyperPod groups as SageMaker describes them now,
//! with what an engineer checks before scaling or adding one: capacity and a training
//! plan's room, EFA-only, placement (subnets and their zones), Kubernetes labels and
//! taints, and node health. Read-only, and asked of AWS on every call (DescribeCluster,
//! the node pages, the subnets, each training plan), like `describe_cluster`.

use std::collections::{BTreeMap, BTreeSet};

use app::api::ApiError;
use app::api::clusters::{NodeCounts, NodeInfo};
use app::api::instance_groups::{InstanceGroupDetail, InstanceGroupList, ListInstanceGroups};
use aws_sdk_sagemaker::types::{ClusterInstanceGroupDetails, ClusterInstanceStorageConfig};

use crate::auth::Actor;
use crate::aws::SdkResultExt;
use crate::cluster::describe::{count, list_nodes};
use crate::resources::sagemaker::capacity;
use crate::service::{Handler, Service};

impl Handler<ListInstanceGroups> for Service {
    async fn handle(
        &self,
        _: &Actor,
        r: ListInstanceGroups,
    ) -> Result<InstanceGroupList, ApiError> {
        let name = r.name.as_str();
        let cluster = crate::cluster::required(&self.store, name).await?;
        let fetched_at = crate::clock::now();
        let hyperpod = cluster.hyperpod_cluster_arn.as_deref().unwrap_or(name);
        let sm = self.aws.sagemaker(&cluster.region);
        let Some(described) = sm
            .describe_cluster()
            .cluster_name(hyperpod)
            .send()
            .await
            .found("sagemaker", "DescribeCluster")?
        else {
            return Ok(InstanceGroupList {
                name: name.to_owned(),
                instance_groups: Vec::new(),
                fetched_at,
            });
        };
        let nodes = list_nodes(&sm, hyperpod).await?;
        let shared: Vec<String> = described
            .vpc_config()
            .map(|v| v.subnets().to_vec())
            .unwrap_or_default();
        let subnets_of = |g: &ClusterInstanceGroupDetails| {
            g.override_vpc_config()
                .map(|v| v.subnets().to_vec())
                .unwrap_or_else(|| shared.clone())
        };
        let all: BTreeSet<String> = described
            .instance_groups()
            .iter()
            .flat_map(subnets_of)
            .collect();
        let zones = zones(&self.aws.ec2(&cluster.region), all).await?;
        let mut room = BTreeMap::new();
        for arn in described
            .instance_groups()
            .iter()
            .filter_map(|g| g.training_plan_arn())
        {
            let plan = arn.rsplit('/').next().unwrap_or(arn);
            if let Some(p) = capacity::training_plan(&sm, plan).await? {
                room.insert(arn.to_owned(), p.available_instances);
            }
        }
        let instance_groups = described
            .instance_groups()
            .iter()
            .map(|g| {
                let subnet_ids = subnets_of(g);
                detail(g, &nodes, &room, &zones, subnet_ids)
            })
            .collect();
        Ok(InstanceGroupList {
            name: name.to_owned(),
            instance_groups,
            fetched_at,
        })
    }
}

/// The Availability Zone of each subnet in `ids`.
async fn zones(
    ec2: &aws_sdk_ec2::Client,
    ids: BTreeSet<String>,
) -> Result<BTreeMap<String, String>, ApiError> {
    if ids.is_empty() {
        return Ok(BTreeMap::new());
    }
    let out = ec2
        .describe_subnets()
        .set_subnet_ids(Some(ids.into_iter().collect()))
        .send()
        .await
        .upstream("ec2", "DescribeSubnets")?;
    Ok(out
        .subnets()
        .iter()
        .filter_map(|s| Some((s.subnet_id()?.to_owned(), s.availability_zone()?.to_owned())))
        .collect())
}

fn detail(
    g: &ClusterInstanceGroupDetails,
    nodes: &[NodeInfo],
    room: &BTreeMap<String, i32>,
    zones: &BTreeMap<String, String>,
    subnet_ids: Vec<String>,
) -> InstanceGroupDetail {
    let name = g.instance_group_name().unwrap_or_default().to_owned();
    let capacity = if g.training_plan_arn().is_some() {
        "training_plan"
    } else if g.capacity_requirements().and_then(|c| c.spot()).is_some() {
        "spot"
    } else {
        "on_demand"
    };
    let mine: Vec<NodeInfo> = nodes
        .iter()
        .filter(|n| n.instance_group == name)
        .cloned()
        .collect();
    let kubernetes = g.kubernetes_config();
    let labels = kubernetes
        .and_then(|k| k.current_labels().or(k.desired_labels()))
        .map(|l| l.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
        .unwrap_or_default();
    let taints = kubernetes
        .map(|k| {
            let taints = if k.current_taints().is_empty() {
                k.desired_taints()
            } else {
                k.current_taints()
            };
            taints
                .iter()
                .map(|t| {
                    format!(
                        "{}={}:{}",
                        t.key(),
                        t.value().unwrap_or_default(),
                        t.effect().as_str()
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    let availability_zones: BTreeSet<String> = subnet_ids
        .iter()
        .filter_map(|s| zones.get(s).cloned())
        .collect();
    InstanceGroupDetail {
        instance_type: g.instance_type().map(|t| t.as_str().to_owned()),
        capacity: capacity.to_owned(),
        training_plan_arn: g.training_plan_arn().map(str::to_owned),
        training_plan_available: g.training_plan_arn().and_then(|a| room.get(a).copied()),
        efa_only: g
            .network_interface()
            .and_then(|n| n.interface_type())
            .is_some_and(|t| t.as_str() == "efa-only"),
        current_count: count(g.current_count()),
        target_count: count(g.target_count()),
        status: g.status().map(|s| s.as_str().to_owned()),
        deep_health_checks: g
            .on_start_deep_health_checks()
            .iter()
            .map(|d| d.as_str().to_owned())
            .collect(),
        volume_size_gb: g.instance_storage_configs().iter().find_map(|c| match c {
            ClusterInstanceStorageConfig::EbsVolumeConfig(v) => {
                v.volume_size_in_gb().and_then(|n| u32::try_from(n).ok())
            }
            _ => None,
        }),
        subnet_ids,
        availability_zones: availability_zones.into_iter().collect(),
        kubernetes_labels: labels,
        kubernetes_taints: taints,
        nodes: NodeCounts::of(&mine),
        name,
    }
}
