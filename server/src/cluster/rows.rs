//! The clusters table: one row per cluster hypd manages, and the rendered list kept by
//! the table's revision. Nothing here knows the service or a pipeline, so the service can
//! hold the list cache without a circle through the cluster module.

use app::api::ApiError;
use app::api::clusters::{ClusterSummary, NodeCounts, ObservedNodes};
use app::api::listing::Listing;
use app::api::plan::{Action, Change};

use crate::store::{Store, StoreError, on_pool};

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

async fn read_all(store: &Store) -> Result<Vec<ClusterSummary>, StoreError> {
    let sql = format!("SELECT {COLUMNS} FROM clusters ORDER BY name");
    let rows: Vec<Row> = on_pool!(store, |pool| sqlx::query_as(&sql).fetch_all(pool).await)?;
    Ok(rows.into_iter().map(summary).collect())
}

/// Bumps the clusters' revision; every write of `clusters` runs it in its transaction.
const BUMP: &str = "UPDATE revisions SET revision = revision + 1 WHERE name = 'clusters'";

async fn revision(store: &Store) -> Result<i64, StoreError> {
    let (n,): (i64,) = on_pool!(store, |pool| sqlx::query_as(
        "SELECT revision FROM revisions WHERE name = 'clusters'"
    )
    .fetch_one(pool)
    .await)?;
    Ok(n)
}

/// The cluster list as it is sent, kept for the revision it was read at. Rendering it is
/// nearly all of a list's cost (serializing ~430 bytes per cluster), and the list changes
/// only when a cluster is written; with it, a list costs one one-row read whatever the
/// number of clusters.
#[derive(Default)]
pub struct ListCache(std::sync::Mutex<Option<(i64, Listing<ClusterSummary>)>>);

impl ListCache {
    pub async fn list(&self, store: &Store) -> Result<Listing<ClusterSummary>, ApiError> {
        // Read before the rows: a write committed between the two makes the rows newer
        // than the revision kept with them, which only costs a render at the next ask.
        let at = revision(store).await?;
        if let Some((kept, list)) = &*self.0.lock().unwrap_or_else(|e| e.into_inner())
            && *kept == at
        {
            return Ok(list.clone());
        }
        let list = Listing::render(&read_all(store).await?).map_err(ApiError::internal)?;
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some((at, list.clone()));
        Ok(list)
    }
}

pub async fn get(store: &Store, name: &str) -> Result<Option<ClusterSummary>, StoreError> {
    let sql = format!("SELECT {COLUMNS} FROM clusters WHERE name = $1");
    let row: Option<Row> = on_pool!(store, |pool| sqlx::query_as(&sql)
        .bind(name)
        .fetch_optional(pool)
        .await)?;
    Ok(row.map(summary))
}

/// Cluster `name` as hypd stores it, or not found.
pub async fn required(store: &Store, name: &str) -> Result<ClusterSummary, ApiError> {
    get(store, name).await?.ok_or_else(|| ApiError::NotFound {
        resource: "cluster".into(),
        name: name.to_owned(),
    })
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
/// active cluster, in one transaction. In a plan, it is the change listed instead; a plan
/// of the request that made a recorded cluster lists none (the record is there).
pub async fn record_and_activate(
    store: &Store,
    r: &Record<'_>,
    actor: &str,
) -> Result<(), StoreError> {
    if crate::resources::is_planning() && get(store, r.name).await?.is_some() {
        return Ok(());
    }
    let change = || {
        Change::new(Action::Create, "hypd:Cluster", r.name)
            .field("status", None, Some(serde_json::json!(r.status)))
            .field("active_for", None, Some(serde_json::json!(actor)))
    };
    if crate::resources::planned(change) {
        return Ok(());
    }
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
        sqlx::query(BUMP).execute(&mut *tx).await?;
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
    let done: Result<(), sqlx::Error> = on_pool!(store, |pool| async {
        let mut tx = pool.begin().await?;
        sqlx::query(
            "UPDATE clusters SET nodes_total = $2, nodes_healthy = $3, nodes_pending = $4, \
             nodes_unhealthy = $5, nodes_observed_at = $6 WHERE name = $1",
        )
        .bind(name)
        .bind(i64::from(counts.total))
        .bind(i64::from(counts.healthy))
        .bind(i64::from(counts.pending))
        .bind(i64::from(counts.unhealthy))
        .bind(&observed.observed_at)
        .execute(&mut *tx)
        .await?;
        sqlx::query(BUMP).execute(&mut *tx).await?;
        tx.commit().await
    }
    .await);
    done?;
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
    let done: Result<(), sqlx::Error> = on_pool!(store, |pool| async {
        let mut tx = pool.begin().await?;
        for f in from {
            sqlx::query(
                "UPDATE clusters SET status = $3, updated_at = $4 WHERE name = $1 AND status = $2",
            )
            .bind(name)
            .bind(*f)
            .bind(to)
            .bind(&now)
            .execute(&mut *tx)
            .await?;
        }
        sqlx::query(BUMP).execute(&mut *tx).await?;
        tx.commit().await
    }
    .await);
    Ok(done?)
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

/// Removes the cluster's row and what it was meant to be, and makes it nobody's active cluster.
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
        sqlx::query("DELETE FROM desired_clusters WHERE name = $1")
            .bind(name)
            .execute(&mut *tx)
            .await?;
        sqlx::query(BUMP).execute(&mut *tx).await?;
        tx.commit().await
    }
    .await);
    Ok(done?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Database;

    fn text(l: &Listing<ClusterSummary>) -> (String, *const u8) {
        match l {
            Listing::Rendered(raw) => (raw.get().to_owned(), raw.get().as_ptr()),
            Listing::Items(_) => panic!("not rendered"),
        }
    }

    fn names(l: &Listing<ClusterSummary>) -> Vec<String> {
        let items: Vec<ClusterSummary> = serde_json::from_str(&text(l).0).unwrap();
        items.into_iter().map(|c| c.name).collect()
    }

    /// The cached list is the table's content after every kind of write, made by this
    /// replica or another one on the same database, and the same bytes between writes.
    #[tokio::test]
    async fn the_cached_list_follows_every_write() {
        let dir = tempfile::tempdir().unwrap();
        let db = Database::Sqlite(dir.path().join("hypd.db"));
        let (store, other) = (
            Store::open(&db).await.unwrap(),
            Store::open(&db).await.unwrap(),
        );
        let cache = ListCache::default();
        let row = |name| Record {
            name,
            region: "us-east-1",
            status: "creating",
            kubernetes_version: None,
            eks_cluster_arn: None,
            hyperpod_cluster_arn: None,
        };
        assert!(names(&cache.list(&store).await.unwrap()).is_empty());
        record(&store, &row("a")).await.unwrap();
        record_and_activate(&other, &row("b"), "admin")
            .await
            .unwrap();
        let listed = cache.list(&store).await.unwrap();
        assert_eq!(names(&listed), ["a", "b"]);
        let again = cache.list(&store).await.unwrap();
        assert_eq!(
            text(&again),
            text(&listed),
            "the same bytes, not rendered again"
        );

        let status = |l: &Listing<ClusterSummary>| {
            let items: Vec<ClusterSummary> = serde_json::from_str(&text(l).0).unwrap();
            items
                .into_iter()
                .map(|c| (c.status, c.nodes.map(|n| n.counts.total)))
                .collect::<Vec<_>>()
        };
        set_status(&other, "a", &["creating"], "active")
            .await
            .unwrap();
        assert_eq!(
            status(&cache.list(&store).await.unwrap())[0],
            ("active".into(), None)
        );
        let counts = NodeCounts {
            total: 3,
            healthy: 3,
            pending: 0,
            unhealthy: 0,
        };
        observe_nodes(&other, "a", &counts).await.unwrap();
        assert_eq!(
            status(&cache.list(&store).await.unwrap())[0],
            ("active".into(), Some(3))
        );
        forget(&other, "b").await.unwrap();
        assert_eq!(names(&cache.list(&store).await.unwrap()), ["a"]);
    }
}
