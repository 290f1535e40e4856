//! The clusters hypd manages, as stored. Creation and import (which write these rows)
//! are operations of their own; reads never call AWS.

use app::api::clusters::ClusterSummary;

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
);

const COLUMNS: &str = "name, region, status, kubernetes_version, eks_cluster_arn, hyperpod_cluster_arn, created_at, updated_at";

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
