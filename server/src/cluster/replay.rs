//! Fills the desired state of clusters in a store written before hypd kept it, by
//! replaying their operations once at start. Its list of commands is frozen: it names
//! what older hypd versions could have stored, and a new pipeline records its change
//! through its own `settle` hook, never here.

use app::api::clusters::{CreateCluster, ImportCluster};
use app::api::nodes::DeleteNodes;
use app::api::{ApiError, Command};

use super::managed::{self, Desired};
use crate::store::{Store, StoreError, on_pool};

/// Fills the desired state of every cluster that has none and whose creation or import
/// finished; returns how many it filled.
pub async fn fill_missing(store: &Store) -> Result<usize, ApiError> {
    let names: Vec<(String,)> = on_pool!(store, |pool| sqlx::query_as(
        "SELECT name FROM clusters WHERE name NOT IN (SELECT name FROM desired_clusters)"
    )
    .fetch_all(pool)
    .await)
    .map_err(StoreError::from)?;
    let mut filled = 0;
    for (name,) in names {
        if let Some(r) = replay(store, &name).await? {
            managed::fill(store, &name, &r.operation, &r.desired, &r.outputs).await?;
            filled += 1;
        }
    }
    Ok(filled)
}

/// What a cluster's operations say it is meant to be.
struct Replayed {
    desired: Desired,
    /// The outputs of the creation or import.
    outputs: String,
    /// The last operation replayed.
    operation: String,
}

/// The request of the newest creation or import of cluster `name` that succeeded, with
/// every instance-group change that succeeded after it applied to its groups, and the
/// nodes every node deletion took away (HyperPod lowers the groups' counts).
async fn replay(store: &Store, name: &str) -> Result<Option<Replayed>, ApiError> {
    let rows: Vec<(String, String, String, String)> = on_pool!(store, |pool| {
        sqlx::query_as(
            "SELECT id, command, spec, outputs FROM operations WHERE target = $1 AND ((state = 'succeeded' \
             AND command IN ('create_cluster', 'import_cluster', 'add_instance_group', \
             'update_instance_group', 'delete_instance_group')) OR (command = 'delete_nodes' \
             AND state IN ('succeeded', 'failed', 'cancelled'))) ORDER BY created_at, id",
        )
        .bind(super::target(name))
        .fetch_all(pool)
        .await
    })
    .map_err(StoreError::from)?;
    let unreadable = |command: &str, e: serde_json::Error| {
        ApiError::internal(format!("the stored {command} request is unreadable: {e}"))
    };
    let mut replayed: Option<Replayed> = None;
    for (id, command, spec, outputs) in rows {
        let desired = match command.as_str() {
            c if c == CreateCluster::SPEC.name => {
                let r = CreateCluster::from_stored(&spec).map_err(|e| unreadable(c, e))?;
                replayed = Some(Replayed {
                    desired: Desired::Created(r),
                    outputs,
                    operation: id,
                });
                continue;
            }
            c if c == ImportCluster::SPEC.name => {
                let r: ImportCluster = serde_json::from_str(&spec).map_err(|e| unreadable(c, e))?;
                replayed = Some(Replayed {
                    desired: Desired::Imported(r),
                    outputs,
                    operation: id,
                });
                continue;
            }
            c if c == DeleteNodes::SPEC.name => {
                let Some(r) = replayed.take() else { continue };
                let per_group = crate::node::deleted_per_group(&outputs)?;
                Replayed {
                    desired: r.desired.without_nodes(&per_group)?,
                    operation: id,
                    ..r
                }
            }
            c => {
                let Some(mut r) = replayed.take() else {
                    continue;
                };
                if let Desired::Created(request) = &mut r.desired {
                    request.instance_groups =
                        crate::instance_group::applied(c, &spec, &request.instance_groups)?;
                }
                Replayed { operation: id, ..r }
            }
        };
        replayed = Some(desired);
    }
    Ok(replayed)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::cluster::managed::Managed;
    use crate::config::Database;

    async fn operation(
        store: &Store,
        id: &str,
        command: &str,
        state: &str,
        spec: serde_json::Value,
        outputs: serde_json::Value,
    ) {
        on_pool!(store, |pool| sqlx::query(
            "INSERT INTO operations (id, command, target, state, created_at, updated_at, spec, outputs) \
             VALUES ($1, $2, 'cluster/c', $3, $4, $4, $5, $6)"
        )
        .bind(id)
        .bind(command)
        .bind(state)
        .bind(format!("2026-01-01T00:00:{id}Z"))
        .bind(spec.to_string())
        .bind(outputs.to_string())
        .execute(pool)
        .await
        .map(drop))
        .unwrap();
    }

    fn groups(m: &Managed) -> Vec<(String, u32)> {
        match m.desired() {
            Some(Desired::Created(r)) => r
                .instance_groups
                .iter()
                .map(|g| (g.name.to_string(), g.instance_count.get()))
                .collect(),
            other => panic!("not created: {other:?}"),
        }
    }

    /// A store from before the desired state was kept reads as its operations said, once;
    /// after that each operation's change applies once however often it is settled.
    #[tokio::test]
    async fn an_old_store_is_filled_from_its_operations_and_changes_apply_once() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&Database::Sqlite(dir.path().join("hypd.db")))
            .await
            .unwrap();
        crate::cluster::record(
            &store,
            &crate::cluster::Record {
                name: "c",
                region: "us-east-1",
                status: "active",
                kubernetes_version: None,
                eks_cluster_arn: None,
                hyperpod_cluster_arn: None,
            },
        )
        .await
        .unwrap();
        let create = json!({"name": "c", "region": "us-east-1", "availability_zone": "us-east-1a",
            "instance_groups": [{"name": "gpu", "instance_type": "ml.g5.8xlarge", "instance_count": 3}]});
        let add = json!({"name": "c", "group": {"name": "cpu", "instance_type": "ml.m5.xlarge", "instance_count": 2}});
        let deleted = json!({"found": {"i-1": {"group": "gpu", "status": "Running"}, "i-2": {"group": "gpu", "status": "Running"}},
            "answer": {"accepted": ["i-1"], "refused": []}});
        operation(
            &store,
            "10",
            "create_cluster",
            "failed",
            create.clone(),
            json!({}),
        )
        .await;
        operation(
            &store,
            "11",
            "create_cluster",
            "succeeded",
            create,
            json!({"hyperpod": {"s3_bucket": "b"}}),
        )
        .await;
        operation(
            &store,
            "12",
            "add_instance_group",
            "succeeded",
            add.clone(),
            json!({}),
        )
        .await;
        // Refused by HyperPod, so it changed nothing.
        operation(
            &store,
            "13",
            "delete_instance_group",
            "failed",
            json!({"name": "c", "group": "cpu"}),
            json!({}),
        )
        .await;
        // Failed for one node, after the other went.
        operation(
            &store,
            "14",
            "delete_nodes",
            "failed",
            json!({"name": "c", "node_ids": ["i-1", "i-2"]}),
            deleted,
        )
        .await;

        assert_eq!(fill_missing(&store).await.unwrap(), 1);
        let m = Managed::load(&store, "c").await.unwrap();
        assert_eq!(groups(&m), [("gpu".into(), 2), ("cpu".into(), 2)]);
        assert_eq!(
            m.creation_output("/hyperpod/s3_bucket").as_deref(),
            Some("b")
        );
        assert_eq!(fill_missing(&store).await.unwrap(), 0, "filled once");

        let scale = |d: Desired| match d {
            Desired::Created(mut r) => {
                r.instance_groups[1].instance_count =
                    app::api::values::InstanceCount::new(5).unwrap();
                Ok(Desired::Created(r))
            }
            other => Ok(other),
        };
        for _ in 0..2 {
            managed::change(&store, "c", "15", |d| {
                let Desired::Created(r) = &d else {
                    unreachable!()
                };
                let count = r.instance_groups[1].instance_count.get();
                assert_eq!(count, 2, "applied once");
                scale(d)
            })
            .await
            .unwrap();
        }
        let m = Managed::load(&store, "c").await.unwrap();
        assert_eq!(groups(&m), [("gpu".into(), 2), ("cpu".into(), 5)]);

        crate::cluster::forget(&store, "c").await.unwrap();
        assert!(matches!(
            Managed::load(&store, "c").await,
            Err(ApiError::NotFound { .. })
        ));
        let left: (i64,) = on_pool!(&store, |pool| sqlx::query_as(
            "SELECT COUNT(*) FROM desired_clusters"
        )
        .fetch_one(pool)
        .await)
        .unwrap();
        assert_eq!(left.0, 0, "forgotten with the cluster");
    }
}
