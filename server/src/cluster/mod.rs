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
pub mod network;
pub mod storage;

use app::api::ApiError;
use app::api::clusters::{
    ClusterDescription, ClusterList, ClusterSummary, DescribeCluster, GetCluster, ListClusters,
    NodeCounts, ObservedNodes,
};

use crate::auth::Actor;
use crate::service::{Handler, Service};
use crate::store::{Store, StoreError, on_pool};

/// What operations on cluster `name` lock: one unfinished operation per cluster.
pub fn target(name: &str) -> String {
    format!("cluster/{name}")
}

type Row = (
    String,
    String,
    String,
    Option<String>,
    Option<String>,
    Option<String>,
    String,
    String,
    Option<i64>,
    Option<i64>,
    Option<i64>,
    Option<i64>,
    Option<String>,
);

const COLUMNS: &str = "name, region, status, kubernetes_version, eks_cluster_arn, hyperpod_cluster_arn, created_at, updated_at, \
                       nodes_total, nodes_healthy, nodes_pending, nodes_unhealthy, nodes_observed_at";

fn summary(r: Row) -> ClusterSummary {
    ClusterSummary {
        name: r.0,
        region: r.1,
        status: r.2,
        kubernetes_version: r.3,
        eks_cluster_arn: r.4,
        hyperpod_cluster_arn: r.5,
        created_at: r.6,
        updated_at: r.7,
        nodes: r.12.map(|observed_at| {
            let n = |v: Option<i64>| u32::try_from(v.unwrap_or(0)).unwrap_or(0);
            ObservedNodes {
                counts: NodeCounts {
                    total: n(r.8),
                    healthy: n(r.9),
                    pending: n(r.10),
                    unhealthy: n(r.11),
                },
                observed_at,
            }
        }),
    }
}

pub async fn list(store: &Store) -> Result<Vec<ClusterSummary>, StoreError> {
    let sql = format!("SELECT {COLUMNS} FROM clusters ORDER BY name");
    let rows: Vec<Row> = on_pool!(store, |pool| sqlx::query_as(&sql).fetch_all(pool).await)?;
    Ok(rows.into_iter().map(summary).collect())
}

pub async fn get(store: &Store, name: &str) -> Result<Option<ClusterSummary>, StoreError> {
    let sql = format!("SELECT {COLUMNS} FROM clusters WHERE name = $1");
    let row: Option<Row> = on_pool!(store, |pool| sqlx::query_as(&sql)
        .bind(name)
        .fetch_optional(pool)
        .await)?;
    Ok(row.map(summary))
}

/// What a finished import or creation records.
pub struct Record<'a> {
    pub name: &'a str,
    pub region: &'a str,
    pub status: &'a str,
    pub kubernetes_version: Option<&'a str>,
    pub eks_cluster_arn: Option<&'a str>,
    pub hyperpod_cluster_arn: Option<&'a str>,
}

/// Writes the cluster's row (again, when a step runs twice).
pub async fn record(store: &Store, r: &Record<'_>) -> Result<(), StoreError> {
    write(store, r, None).await
}

/// Writes the cluster's row (again, when a step runs twice) and makes it `actor`'s
/// active cluster, in one transaction.
pub async fn record_and_activate(
    store: &Store,
    r: &Record<'_>,
    actor: &str,
) -> Result<(), StoreError> {
    write(store, r, Some(actor)).await
}

async fn write(
    store: &Store,
    r: &Record<'_>,
    activate_for: Option<&str>,
) -> Result<(), StoreError> {
    let now = crate::clock::now();
    let written: Result<(), sqlx::Error> = on_pool!(store, |pool| {
        async {
        let mut tx = pool.begin().await?;
        sqlx::query(
            "INSERT INTO clusters (name, region, status, kubernetes_version, eks_cluster_arn, hyperpod_cluster_arn, created_at, updated_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $7) \
             ON CONFLICT (name) DO UPDATE SET region = $2, status = $3, kubernetes_version = $4, \
             eks_cluster_arn = $5, hyperpod_cluster_arn = $6, updated_at = $7",
        )
        .bind(r.name)
        .bind(r.region)
        .bind(r.status)
        .bind(r.kubernetes_version)
        .bind(r.eks_cluster_arn)
        .bind(r.hyperpod_cluster_arn)
        .bind(&now)
        .execute(&mut *tx)
        .await?;
        if let Some(actor) = activate_for {
            sqlx::query(
                "INSERT INTO active_clusters (actor, cluster, updated_at) VALUES ($1, $2, $3) \
                 ON CONFLICT (actor) DO UPDATE SET cluster = $2, updated_at = $3",
            )
            .bind(actor)
            .bind(r.name)
            .bind(&now)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await
    }
    .await
    });
    Ok(written?)
}

/// Records the cluster's node health as just observed. Not a change of the cluster, so
/// `updated_at` stays; a cluster forgotten meanwhile is left forgotten.
pub async fn observe_nodes(
    store: &Store,
    name: &str,
    counts: &NodeCounts,
) -> Result<ObservedNodes, StoreError> {
    let observed = ObservedNodes {
        counts: counts.clone(),
        observed_at: crate::clock::now(),
    };
    on_pool!(store, |pool| sqlx::query(
        "UPDATE clusters SET nodes_total = $2, nodes_healthy = $3, nodes_pending = $4, \
         nodes_unhealthy = $5, nodes_observed_at = $6 WHERE name = $1"
    )
    .bind(name)
    .bind(i64::from(counts.total))
    .bind(i64::from(counts.healthy))
    .bind(i64::from(counts.pending))
    .bind(i64::from(counts.unhealthy))
    .bind(&observed.observed_at)
    .execute(pool)
    .await
    .map(|_| ()))?;
    Ok(observed)
}

/// Moves the cluster's status from one of `from` to `to` (a cluster forgotten meanwhile
/// stays forgotten; one in another status keeps it).
pub async fn set_status(
    store: &Store,
    name: &str,
    from: &[&str],
    to: &str,
) -> Result<(), StoreError> {
    let now = crate::clock::now();
    for f in from {
        on_pool!(store, |pool| sqlx::query(
            "UPDATE clusters SET status = $3, updated_at = $4 WHERE name = $1 AND status = $2"
        )
        .bind(name)
        .bind(*f)
        .bind(to)
        .bind(&now)
        .execute(pool)
        .await
        .map(|_| ()))?;
    }
    Ok(())
}

/// The cluster later commands act on for `actor` when they name none.
pub async fn active(store: &Store, actor: &str) -> Result<Option<String>, StoreError> {
    let row: Option<(String,)> = on_pool!(store, |pool| sqlx::query_as(
        "SELECT cluster FROM active_clusters WHERE actor = $1"
    )
    .bind(actor)
    .fetch_optional(pool)
    .await)?;
    Ok(row.map(|(c,)| c))
}

/// Removes the cluster's row and makes it nobody's active cluster.
pub async fn forget(store: &Store, name: &str) -> Result<(), StoreError> {
    let done: Result<(), sqlx::Error> = on_pool!(store, |pool| async {
        let mut tx = pool.begin().await?;
        sqlx::query("DELETE FROM active_clusters WHERE cluster = $1")
            .bind(name)
            .execute(&mut *tx)
            .await?;
        sqlx::query("DELETE FROM clusters WHERE name = $1")
            .bind(name)
            .execute(&mut *tx)
            .await?;
        tx.commit().await
    }
    .await);
    Ok(done?)
}

/// The managed cluster `name`, or not found.
async fn managed(store: &Store, name: &str) -> Result<ClusterSummary, ApiError> {
    get(store, name).await?.ok_or_else(|| ApiError::NotFound {
        resource: "cluster".into(),
        name: name.to_owned(),
    })
}

impl Handler<ListClusters> for Service {
    async fn handle(&self, _: &Actor, _: ListClusters) -> Result<ClusterList, ApiError> {
        Ok(ClusterList {
            clusters: list(&self.store).await?,
        })
    }
}

impl Handler<GetCluster> for Service {
    async fn handle(&self, _: &Actor, r: GetCluster) -> Result<ClusterSummary, ApiError> {
        managed(&self.store, r.name.as_str()).await
    }
}

impl Handler<DescribeCluster> for Service {
    async fn handle(&self, _: &Actor, r: DescribeCluster) -> Result<ClusterDescription, ApiError> {
        let stored = managed(&self.store, r.name.as_str()).await?;
        let mut described = describe::describe(&self.aws, stored).await?;
        // What the list shows until the next look.
        let observed = observe_nodes(&self.store, r.name.as_str(), &described.node_counts).await?;
        described.cluster.nodes = Some(observed);
        Ok(described)
    }
}
