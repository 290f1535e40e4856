//! `list_nodes`: a cluster's HyperPod nodes as HyperPod lists them, each joined with its
//! Kubernetes Node (readiness, the health label HyperPod's agents set, GPUs and EFA
//! interfaces, zone) and the GPUs its running pods request. HyperPod has no filter on
//! health and pages in its own order, so every node is read, filtered and sorted here
//! (by group, then instance id) and the page token is the last node's key: a page stays
//! right when nodes come and go between requests.

use std::collections::BTreeMap;

use ::kube::api::{Api, ListParams};
use app::api::ApiError;
use app::api::clusters::{NodeCounts, NodeInfo};
use app::api::nodes::{DEFAULT_PAGE, ListNodes, NodeDetail, NodeList};
use k8s_openapi::api::core::v1::{Node, Pod};

use crate::auth::Actor;
use crate::cluster::components::{GROUP_LABEL, HYPERPOD_NODE_LABEL};
use crate::cluster::describe::node_info;
use crate::resources::kube;
use crate::resources::sagemaker::nodes::list;
use crate::service::{Handler, Service};

pub const HEALTH_LABEL: &str = "sagemaker.amazonaws.com/node-health-status";
const ZONE_LABEL: &str = "topology.kubernetes.io/zone";
const GPU: &str = "nvidia.com/gpu";
const EFA: &str = "vpc.amazonaws.com/efa";

impl Handler<ListNodes> for Service {
    async fn handle(&self, _: &Actor, r: ListNodes) -> Result<NodeList, ApiError> {
        let name = r.name.as_str();
        let cluster = crate::cluster::get(&self.store, name)
            .await?
            .ok_or_else(|| ApiError::NotFound {
                resource: "cluster".into(),
                name: name.to_owned(),
            })?;
        let after = r.page_token.as_deref().map(token).transpose()?;
        let fetched_at = crate::clock::now();
        let Some(arn) = cluster.hyperpod_cluster_arn.as_deref() else {
            return Ok(NodeList {
                name: name.to_owned(),
                nodes: Vec::new(),
                counts: NodeCounts::default(),
                next_page_token: None,
                fetched_at,
            });
        };
        let hyperpod = arn.rsplit('/').next().unwrap_or(arn);
        let group = r.group.as_ref().map(|g| g.as_str());
        let sm = self.aws.sagemaker(&cluster.region);
        let mut nodes: Vec<NodeInfo> = list(&sm, hyperpod, group)
            .await?
            .iter()
            .map(node_info)
            .filter(|n| group.is_none_or(|g| n.instance_group == g))
            .filter(|n| r.health.is_none_or(|h| n.health == h))
            .collect();
        nodes.sort_by(|a, b| key(a).cmp(&key(b)));
        let counts = NodeCounts::of(&nodes);
        let limit = r.limit.map_or(DEFAULT_PAGE, |l| l.get()) as usize;
        let start = after.map_or(0, |(g, id)| {
            nodes.partition_point(|n| key(n) <= (g.as_str(), id.as_str()))
        });
        let page: Vec<NodeInfo> = nodes.into_iter().skip(start).take(limit + 1).collect();
        let next_page_token = (page.len() > limit)
            .then(|| page.get(limit - 1))
            .flatten()
            .map(|n| format!("{}/{}", n.instance_group, n.node_id));
        let page = &page[..page.len().min(limit)];
        let seen = if page.is_empty() {
            Kubernetes::default()
        } else {
            kubernetes_view(&self.aws, &cluster.region, name, hyperpod, true).await?
        };
        Ok(NodeList {
            name: name.to_owned(),
            nodes: page.iter().map(|n| seen.detail(n)).collect(),
            counts,
            next_page_token,
            fetched_at,
        })
    }
}

fn key(n: &NodeInfo) -> (&str, &str) {
    (n.instance_group.as_str(), n.node_id.as_str())
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

/// What Kubernetes says of the cluster's HyperPod nodes, by instance id.
#[derive(Default)]
struct Kubernetes {
    nodes: BTreeMap<String, Node>,
    /// GPUs requested by running pods, by Node name.
    gpus_used: BTreeMap<String, u32>,
}

/// Kubernetes' view, or none while the cluster's API cannot be reached yet (no
/// endpoint, the EKS cluster gone): HyperPod's side of the list still answers.
async fn kubernetes_view(
    aws: &crate::aws::Aws,
    region: &str,
    eks: &str,
    hyperpod: &str,
    with_pods: bool,
) -> Result<Kubernetes, ApiError> {
    let client = match kube::connect(aws, region, eks).await {
        Ok(c) => c,
        Err(ApiError::NotFound { .. } | ApiError::Conflict { .. }) => {
            return Ok(Kubernetes::default());
        }
        Err(e) => return Err(e),
    };
    let selector = format!(
        "{}={},sagemaker.amazonaws.com/cluster-name={hyperpod}",
        HYPERPOD_NODE_LABEL.0, HYPERPOD_NODE_LABEL.1
    );
    let mut nodes = BTreeMap::new();
    kube::each_listed(
        &Api::<Node>::all(client.clone()),
        ListParams::default().labels(&selector),
        |n| {
            if let Some(id) = instance_of(&n) {
                nodes.insert(id, n);
            }
        },
    )
    .await?;
    let mut gpus_used = BTreeMap::new();
    if !with_pods {
        return Ok(Kubernetes { nodes, gpus_used });
    }
    kube::each_listed(
        &Api::<Pod>::all(client),
        ListParams::default().fields("status.phase!=Succeeded,status.phase!=Failed"),
        |p| {
            let Some(spec) = p.spec else { return };
            let Some(node) = spec.node_name else { return };
            let gpus: u32 = spec
                .containers
                .iter()
                .filter_map(|c| {
                    let r = c.resources.as_ref()?;
                    let q = r
                        .requests
                        .as_ref()
                        .and_then(|m| m.get(GPU))
                        .or_else(|| r.limits.as_ref()?.get(GPU))?;
                    q.0.parse::<u32>().ok()
                })
                .sum();
            *gpus_used.entry(node).or_insert(0) += gpus;
        },
    )
    .await?;
    Ok(Kubernetes { nodes, gpus_used })
}

/// Each HyperPod node's Kubernetes boot id (`status.nodeInfo.bootID`, new with every
/// boot), by instance id; none while the cluster's API cannot be reached.
pub(crate) async fn boot_ids(
    aws: &crate::aws::Aws,
    at: &crate::cluster::managed::Where,
) -> Result<BTreeMap<String, String>, ApiError> {
    let view = kubernetes_view(aws, &at.region, &at.eks, &at.hyperpod, false).await?;
    Ok(view
        .nodes
        .into_iter()
        .filter_map(|(id, n)| Some((id, n.status?.node_info?.boot_id)))
        .filter(|(_, b)| !b.is_empty())
        .collect())
}

/// The instance id a HyperPod Node runs on: the end of its provider id
/// (`aws:///<zone>/sagemaker/cluster/<cluster>-<instance id>`).
fn instance_of(n: &Node) -> Option<String> {
    let provider = n.spec.as_ref()?.provider_id.as_deref()?;
    let at = provider.rfind("i-")?;
    Some(provider[at..].to_owned())
}

impl Kubernetes {
    fn detail(&self, n: &NodeInfo) -> NodeDetail {
        let node = self.nodes.get(&n.node_id);
        let labels = node.and_then(|k| k.metadata.labels.as_ref());
        let label = |key: &str| labels.and_then(|l| l.get(key)).cloned();
        let capacity = |resource: &str| {
            node.and_then(|k| k.status.as_ref()?.capacity.as_ref()?.get(resource))
                .and_then(|q| q.0.parse::<u32>().ok())
                .unwrap_or(0)
        };
        let name = node.and_then(|k| k.metadata.name.clone());
        NodeDetail {
            node_id: n.node_id.clone(),
            instance_group: label(GROUP_LABEL).unwrap_or_else(|| n.instance_group.clone()),
            instance_type: n.instance_type.clone(),
            status: n.status.clone(),
            health: n.health,
            message: n.message.clone(),
            ready: node.map(|k| {
                k.status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
            }),
            health_label: label(HEALTH_LABEL),
            gpus: capacity(GPU),
            gpus_allocated: name
                .as_ref()
                .and_then(|k| self.gpus_used.get(k).copied())
                .unwrap_or(0),
            efa_interfaces: capacity(EFA),
            availability_zone: label(ZONE_LABEL),
            launch_time: n.launch_time.clone(),
            image_release: n.image_release.clone(),
            kubernetes_node: name,
        }
    }
}
