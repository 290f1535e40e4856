//! The clusters hypd manages: their stored records (reads never call AWS), the commands
//! that read them, and the pipelines that create, import and delete them, composed from
//! the resources of `crate::resources` by the modules below.

pub mod access;
pub mod addons;
pub mod components;
pub mod create;
pub mod delete;
pub mod dependencies;
pub mod describe;
pub mod hyperpod;
pub mod identity;
pub mod import;
pub mod managed;
pub mod network;
pub mod reconcile;
pub mod replay;
pub mod rows;
pub mod storage;

use app::api::clusters::{
    ClusterDescription, ClusterList, ClusterSummary, DescribeCluster, GetCluster, ListClusters,
};
use app::api::{ApiError, Command};

use crate::auth::Actor;
use crate::service::{Handler, Service};
use crate::store::Store;
use managed::Managed;

pub use rows::{
    Record, active, forget, get, observe_nodes, record, record_and_activate, required, set_status,
};

/// The region a stored request was given by its pre-flight.
pub(crate) fn stored_region(
    region: Option<&app::api::values::Region>,
    command: &str,
) -> Result<String, ApiError> {
    region
        .map(|r| r.to_string())
        .ok_or_else(|| ApiError::internal(format!("{command} stored without a region")))
}

/// What operations on cluster `name` lock: one unfinished operation per cluster.
pub fn target(name: &str) -> String {
    format!("cluster/{name}")
}

impl Handler<ListClusters> for Service {
    async fn handle(&self, _: &Actor, _: ListClusters) -> Result<ClusterList, ApiError> {
        Ok(ClusterList {
            clusters: self.clusters.list(&self.store).await?,
        })
    }
}

impl Handler<GetCluster> for Service {
    async fn handle(&self, _: &Actor, r: GetCluster) -> Result<ClusterSummary, ApiError> {
        Ok(Managed::load(&self.store, r.name.as_str()).await?.summary)
    }
}

impl Handler<DescribeCluster> for Service {
    async fn handle(&self, _: &Actor, r: DescribeCluster) -> Result<ClusterDescription, ApiError> {
        let stored = Managed::load(&self.store, r.name.as_str()).await?.summary;
        // The nodes come from the view list_nodes reads (one HyperPod read shared by every
        // caller, out of date once an operation on the cluster moves); a cluster whose
        // HyperPod is not recorded yet (a creation under way) has them read directly.
        let nodes = match crate::node::view::Place::of(&stored) {
            Some(place) => describe::Nodes::Viewed(
                self.nodes
                    .of(&self.aws, &place)
                    .hyperpod(&self.store, r.refresh)
                    .await?,
            ),
            None => describe::Nodes::Read,
        };
        let mut described = describe::describe(&self.aws, stored, nodes).await?;
        // What the list shows until the next look.
        let observed = observe_nodes(&self.store, r.name.as_str(), &described.node_counts).await?;
        described.cluster.nodes = Some(observed);
        Ok(described)
    }
}

/// An output of an operation that created the cluster (a JSON pointer into its outputs,
/// e.g. `/hyperpod/s3_bucket`), if hypd created it: also of a creation that failed, so
/// a deletion finds what a failed creation made.
pub(crate) async fn creation_output(
    store: &Store,
    name: &str,
    pointer: &str,
) -> Result<Option<String>, ApiError> {
    let ops = crate::operation::list(store, None, Some(&target(name))).await?;
    Ok(ops
        .into_iter()
        .filter(|o| o.command == app::api::clusters::CreateCluster::SPEC.name)
        .find_map(|o| {
            serde_json::Value::Object(o.outputs.into_iter().collect())
                .pointer(pointer)
                .and_then(|v| v.as_str())
                .map(str::to_owned)
        }))
}
