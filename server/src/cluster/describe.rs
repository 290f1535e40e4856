//! `describe_cluster`: a managed cluster's live state, asked of EKS and SageMaker on every
//! call (the store only knows what the last operation recorded), except its nodes: those
//! come from the node view `list_nodes` reads too (`node::view`), so a page of 1,000
//! nodes is not listed again per caller. Nothing is changed.

use std::time::SystemTime;

use app::api::ApiError;
use app::api::clusters::{
    AddonInfo, ClusterDescription, ClusterSummary, ComponentStatus, EksInfo, HyperPodInfo,
    InstanceGroupInfo, NodeCounts, NodeHealth, NodeInfo, StorageStatus,
};
use tokio::task::JoinSet;

use crate::aws::{Aws, SdkResultExt};

/// Where the HyperPod cluster's nodes come from.
pub enum Nodes {
    /// A read of the cluster's node view, made by the caller.
    Viewed(std::sync::Arc<crate::node::view::Snapshot>),
    /// Listed here (no view yet: the HyperPod cluster is found by name).
    Read,
}

/// Reads everything AWS knows about `cluster` now. A missing EKS or HyperPod cluster is
/// reported as absent rather than as an error: early in a creation, or for an EKS cluster
/// imported without HyperPod, that is the truth.
pub async fn describe(
    aws: &Aws,
    cluster: ClusterSummary,
    nodes: Nodes,
) -> Result<ClusterDescription, ApiError> {
    let region = cluster.region.clone();
    let fetched_at = crate::clock::now();
    // hypd names a HyperPod cluster it creates after the cluster itself; its ARN is only
    // recorded once the creation finishes, so an unfinished one is found by name.
    let hyperpod_ref = cluster.hyperpod_cluster_arn.clone().or_else(|| {
        matches!(cluster.status.as_str(), "creating" | "failed").then(|| cluster.name.clone())
    });
    let (eks, addons, (hyperpod, instance_groups, nodes)) = tokio::try_join!(
        eks_info(aws, &region, &cluster.name),
        addons(aws, &region, &cluster.name),
        hyperpod(aws, &region, hyperpod_ref.as_deref(), nodes),
    )?;
    // Kubernetes can be asked only once the control plane is up.
    let active = eks.as_ref().and_then(|e| e.status.as_deref()) == Some("ACTIVE");
    let (components, storage) = if active {
        kubernetes_side(aws, &region, &cluster.name).await?
    } else {
        (Vec::new(), Vec::new())
    };
    Ok(ClusterDescription {
        node_counts: NodeCounts::of(&nodes),
        cluster,
        eks,
        hyperpod,
        instance_groups,
        nodes,
        addons,
        components,
        storage,
        fetched_at,
    })
}

/// The node components and shared storage as the cluster runs them.
async fn kubernetes_side(
    aws: &Aws,
    region: &str,
    name: &str,
) -> Result<(Vec<ComponentStatus>, Vec<StorageStatus>), ApiError> {
    let client = crate::resources::kube::connect(aws, region, name).await?;
    let components = super::components::states(&client)
        .await?
        .into_iter()
        .map(|c| ComponentStatus {
            state: c.state().to_owned(),
            name: c.name,
            version: c.version,
        })
        .collect();
    let storage = super::storage::current(&client)
        .await?
        .map(|s| StorageStatus {
            kind: "s3".to_owned(),
            bucket: Some(s.bucket),
            pvc: Some(s.claim),
            namespace: Some(s.namespace),
            phase: Some(s.phase),
        })
        .into_iter()
        .collect();
    Ok((components, storage))
}

fn time(t: Option<&aws_sdk_sagemaker::primitives::DateTime>) -> Option<String> {
    t.and_then(|t| SystemTime::try_from(*t).ok())
        .map(crate::clock::format_time)
}

pub(crate) fn count(n: Option<i32>) -> u32 {
    n.and_then(|n| u32::try_from(n).ok()).unwrap_or(0)
}

async fn eks_info(aws: &Aws, region: &str, name: &str) -> Result<Option<EksInfo>, ApiError> {
    Ok(
        crate::resources::eks::cluster::describe(&aws.eks(region), name)
            .await?
            .map(|c| EksInfo {
                arn: c.arn,
                status: c.status.map(|s| s.as_str().to_owned()),
                kubernetes_version: c.version,
                platform_version: c.platform_version,
                endpoint: c.endpoint,
            }),
    )
}

async fn addons(aws: &Aws, region: &str, cluster: &str) -> Result<Vec<AddonInfo>, ApiError> {
    let eks = aws.eks(region);
    let mut names = Vec::new();
    let mut pages = eks
        .list_addons()
        .cluster_name(cluster)
        .into_paginator()
        .send();
    while let Some(page) = pages.next().await {
        match page.found("eks", "ListAddons")? {
            Some(p) => names.extend(p.addons.unwrap_or_default()),
            None => return Ok(Vec::new()),
        }
    }
    // One DescribeAddon per add-on, at once: a handful of calls, not worth a queue.
    let mut calls = JoinSet::new();
    for (i, name) in names.into_iter().enumerate() {
        let eks = eks.clone();
        let cluster = cluster.to_owned();
        calls.spawn(async move {
            let answer = eks
                .describe_addon()
                .cluster_name(cluster)
                .addon_name(&name)
                .send()
                .await;
            (i, name, answer)
        });
    }
    let mut found = Vec::new();
    while let Some(joined) = calls.join_next().await {
        let (i, name, answer) = joined.map_err(ApiError::internal)?;
        // Removed between the list and the describe: it is simply not there.
        let Some(out) = answer.found("eks", "DescribeAddon")? else {
            continue;
        };
        let addon = out.addon;
        let info = match addon {
            Some(a) => AddonInfo {
                name: a.addon_name.unwrap_or(name),
                version: a.addon_version,
                status: a.status.map(|s| s.as_str().to_owned()),
                issues: a
                    .health
                    .map(|h| {
                        h.issues
                            .unwrap_or_default()
                            .into_iter()
                            .filter_map(|i| i.message)
                            .collect()
                    })
                    .unwrap_or_default(),
            },
            None => AddonInfo {
                name,
                version: None,
                status: None,
                issues: Vec::new(),
            },
        };
        found.push((i, info));
    }
    found.sort_by_key(|(i, _)| *i);
    Ok(found.into_iter().map(|(_, a)| a).collect())
}

/// The HyperPod cluster's nodes counted by health now (none when it does not exist).
pub async fn node_counts(aws: &Aws, region: &str, cluster: &str) -> Result<NodeCounts, ApiError> {
    let (_, _, nodes) = hyperpod(aws, region, Some(cluster), Nodes::Read).await?;
    Ok(NodeCounts::of(&nodes))
}

type HyperPodState = (Option<HyperPodInfo>, Vec<InstanceGroupInfo>, Vec<NodeInfo>);

async fn hyperpod(
    aws: &Aws,
    region: &str,
    cluster: Option<&str>,
    nodes: Nodes,
) -> Result<HyperPodState, ApiError> {
    let Some(cluster) = cluster else {
        return Ok(HyperPodState::default());
    };
    let sm = aws.sagemaker(region);
    let Some(described) = sm
        .describe_cluster()
        .cluster_name(cluster)
        .send()
        .await
        .found("sagemaker", "DescribeCluster")?
    else {
        return Ok(HyperPodState::default());
    };
    let groups = described
        .instance_groups()
        .iter()
        .map(|g| InstanceGroupInfo {
            name: g.instance_group_name().unwrap_or_default().to_owned(),
            instance_type: g.instance_type().map(|t| t.as_str().to_owned()),
            current_count: count(g.current_count()),
            target_count: count(g.target_count()),
            status: g.status().map(|s| s.as_str().to_owned()),
            training_plan_arn: g.training_plan_arn().map(str::to_owned),
        })
        .collect();
    let nodes = match nodes {
        Nodes::Viewed(snapshot) => snapshot.nodes.clone(),
        Nodes::Read => list_nodes(&sm, cluster).await?,
    };
    let info = HyperPodInfo {
        name: described.cluster_name().map(str::to_owned),
        arn: described.cluster_arn().map(str::to_owned),
        status: described.cluster_status().map(|s| s.as_str().to_owned()),
        node_recovery: described.node_recovery().map(|r| r.as_str().to_owned()),
        failure_message: described
            .failure_message()
            .filter(|m| !m.is_empty())
            .map(str::to_owned),
    };
    Ok((Some(info), groups, nodes))
}

/// Every node of HyperPod cluster `cluster`, page by page.
pub(crate) async fn list_nodes(
    sm: &aws_sdk_sagemaker::Client,
    cluster: &str,
) -> Result<Vec<NodeInfo>, ApiError> {
    Ok(crate::resources::sagemaker::nodes::list(sm, cluster, None)
        .await?
        .iter()
        .map(node_info)
        .collect())
}

/// A node as HyperPod lists it.
pub(crate) fn node_info(n: &aws_sdk_sagemaker::types::ClusterNodeSummary) -> NodeInfo {
    let status = n
        .instance_status()
        .and_then(|s| s.status())
        .map(|s| s.as_str().to_owned())
        .unwrap_or_default();
    NodeInfo {
        node_id: n.instance_id().unwrap_or_default().to_owned(),
        instance_group: n.instance_group_name().unwrap_or_default().to_owned(),
        instance_type: n
            .instance_type()
            .map(|t| t.as_str().to_owned())
            .unwrap_or_default(),
        health: NodeHealth::from_instance_status(&status),
        status,
        message: n
            .instance_status()
            .and_then(|s| s.message())
            .filter(|m| !m.is_empty())
            .map(str::to_owned),
        launch_time: time(n.launch_time()),
        image_release: n.current_image_release_version().map(str::to_owned),
    }
}
