//! `list_nodes`: a cluster's HyperPod nodes as HyperPod lists them, each joined with its
//! Kubernetes Node (readiness, the health label HyperPod's agents set, GPUs and EFA
//! interfaces, zone) and the GPUs its running pods request, answered from the cluster's
//! node view (`view`), not from AWS and the API server on every call. HyperPod has no
//! filter on health and pages in its own order, so the view holds every node, sorted (by
//! group, then instance id), and the page token is the last node's key: a page stays
//! right when nodes come and go between requests.

use std::collections::BTreeMap;

use ::kube::api::{Api, ListParams};
use app::api::ApiError;
use app::api::clusters::{NodeCounts, NodeInfo};
use app::api::nodes::{DEFAULT_PAGE, ListNodes, NodeDetail, NodeList};
use k8s_openapi::api::core::v1::Node;

use super::view::{Facts, Place, instance_of, key};
use crate::auth::Actor;
use crate::cluster::components::HYPERPOD_NODE_LABEL;
use crate::resources::kube;
use crate::service::{Handler, Service};

impl Handler<ListNodes> for Service {
    async fn handle(&self, _: &Actor, r: ListNodes) -> Result<NodeList, ApiError> {
        let name = r.name.as_str();
        let cluster = crate::cluster::required(&self.store, name).await?;
        let after = r.page_token.as_deref().map(token).transpose()?;
        let Some(place) = Place::of(&cluster) else {
            return Ok(NodeList {
                name: name.to_owned(),
                nodes: Vec::new(),
                counts: NodeCounts::default(),
                next_page_token: None,
                fetched_at: crate::clock::now(),
            });
        };
        let view = self.nodes.of(&self.aws, &place);
        let snapshot = view.hyperpod(&self.store, r.refresh).await?;
        let group = r.group.as_ref().map(|g| g.as_str());
        let matching: Vec<&NodeInfo> = snapshot
            .nodes
            .iter()
            .filter(|n| group.is_none_or(|g| n.instance_group == g))
            .filter(|n| r.health.is_none_or(|h| n.health == h))
            .collect();
        let counts = NodeCounts::of(matching.iter().copied());
        let limit = r.limit.map_or(DEFAULT_PAGE, |l| l.get()) as usize;
        let start = after.map_or(0, |(g, id)| {
            matching.partition_point(|n| key(n) <= (g.as_str(), id.as_str()))
        });
        let page = &matching[start..(start + limit).min(matching.len())];
        let next_page_token = (start + limit < matching.len())
            .then(|| page.last())
            .flatten()
            .map(|n| format!("{}/{}", n.instance_group, n.node_id));
        let seen = if page.is_empty() {
            None
        } else {
            Some(view.kubernetes().await?)
        };
        Ok(NodeList {
            name: name.to_owned(),
            nodes: page.iter().map(|n| detail(seen.as_ref(), n)).collect(),
            counts,
            next_page_token,
            fetched_at: snapshot.taken_at.clone(),
        })
    }
}

/// The node a page token says the page starts after.
fn token(t: &str) -> Result<(String, String), ApiError> {
    t.split_once('/')
        .filter(|(g, id)| !g.is_empty() && id.starts_with("i-"))
        .map(|(g, id)| (g.to_owned(), id.to_owned()))
        .ok_or_else(|| {
            ApiError::field(
                "page_token",
                "not a token a page returned: send the next_page_token of the page before, as it was",
            )
        })
}

/// Each HyperPod node's Kubernetes boot id (`status.nodeInfo.bootID`, new with every
/// boot), by instance id; none while the cluster's API cannot be reached.
pub(crate) async fn boot_ids(
    aws: &crate::aws::Aws,
    at: &crate::cluster::managed::Where,
) -> Result<BTreeMap<String, String>, ApiError> {
    // Read now, not from the view: an operation tells a rebooted node by it.
    let client = match kube::connect(aws, &at.region, &at.eks).await {
        Ok(c) => c,
        Err(ApiError::NotFound { .. } | ApiError::Conflict { .. }) => return Ok(BTreeMap::new()),
        Err(e) => return Err(e),
    };
    let selector = format!(
        "{}={},sagemaker.amazonaws.com/cluster-name={}",
        HYPERPOD_NODE_LABEL.0, HYPERPOD_NODE_LABEL.1, at.hyperpod
    );
    let mut boots = BTreeMap::new();
    kube::each_listed(
        &Api::<Node>::all(client),
        ListParams::default().labels(&selector),
        |n| {
            let boot = n
                .status
                .as_ref()
                .and_then(|s| s.node_info.as_ref())
                .map(|i| i.boot_id.clone());
            if let (Some(id), Some(boot)) = (instance_of(&n), boot.filter(|b| !b.is_empty())) {
                boots.insert(id, boot);
            }
        },
    )
    .await?;
    Ok(boots)
}

/// A node's row: HyperPod's facts, and its Kubernetes Node's when the view has them.
fn detail(seen: Option<&Facts>, n: &NodeInfo) -> NodeDetail {
    let node = seen.and_then(|s| s.nodes.get(&n.node_id));
    NodeDetail {
        node_id: n.node_id.clone(),
        instance_group: node
            .and_then(|k| k.group.clone())
            .unwrap_or_else(|| n.instance_group.clone()),
        instance_type: n.instance_type.clone(),
        status: n.status.clone(),
        health: n.health,
        message: n.message.clone(),
        ready: node.map(|k| k.ready),
        health_label: node.and_then(|k| k.health_label.clone()),
        gpus: node.map_or(0, |k| k.gpus),
        gpus_allocated: node
            .and_then(|k| seen?.gpus_used.get(&k.name).copied())
            .unwrap_or(0),
        efa_interfaces: node.map_or(0, |k| k.efa_interfaces),
        availability_zone: node.and_then(|k| k.zone.clone()),
        launch_time: n.launch_time.clone(),
        image_release: n.image_release.clone(),
        kubernetes_node: node.map(|k| k.name.clone()),
    }
}
