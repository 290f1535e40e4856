//! Drift and its repair. hypd's desired state for a cluster is the request that made it
//! (the creation's, or the import's) run through the same stages today: `get_drift` is
//! the plan preview of `reconcile_cluster`, and `reconcile_cluster` runs those stages
//! again, so what is reported and what is put back come from one observe and diff per
//! resource, and a cluster that did not drift plans, and changes, nothing.

use app::api::clusters::{
    CreateCluster, DriftReport, Drifted, GetDrift, ImportCluster, ReconcileCluster,
};
use app::api::nodes::DeleteNodes;
use app::api::plan::Action;
use app::api::values::{IdempotencyKey, InstanceCount};
use app::api::{ApiError, Command};
use serde::{Deserialize, Serialize};

use super::{create, import};
use crate::auth::Actor;
use crate::operation::pipeline::{Context, Pipeline, Preflight, Progress, stages};
use crate::service::{Handler, Service};
use crate::store::{Store, StoreError, on_pool};

stages! {
    pub enum Stage {
        Network = "network", "Network: VPC, subnets, NAT, routes, S3 endpoint, EFA security group", true;
        Iam = "iam", "IAM roles: trust and policies", true;
        Eks = "eks", "EKS control plane", true;
        Access = "access", "OIDC provider and hypd's cluster-admin access entry", true;
        Addons = "addons", "EKS add-ons", true;
        Components = "components", "HyperPod node components", true;
        Hyperpod = "hyperpod", "Shared bucket, lifecycle script and the HyperPod cluster's instance groups", true;
        Storage = "storage", "Shared storage: the Mountpoint PersistentVolume and claim", true;
    }
}

/// What the stages found, stored with the operation. Field names are stored: never rename.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Outputs {
    #[serde(default)]
    pub created: create::Outputs,
    #[serde(default)]
    pub imported: import::Outputs,
}

/// The request that made a cluster: its desired state.
pub enum Desired {
    Created(CreateCluster),
    Imported(ImportCluster),
}

impl Desired {
    fn command(&self) -> &'static str {
        match self {
            Desired::Created(_) => CreateCluster::SPEC.name,
            Desired::Imported(_) => ImportCluster::SPEC.name,
        }
    }
}

/// The request of the newest creation or import of cluster `name` that succeeded, with
/// every instance-group change that succeeded after it applied to its groups, and the
/// nodes every node deletion took away (HyperPod lowers the groups' counts).
pub async fn desired(store: &Store, name: &str) -> Result<Option<Desired>, ApiError> {
    let rows: Vec<(String, String, String)> = on_pool!(store, |pool| {
        sqlx::query_as(
        "SELECT command, spec, outputs FROM operations WHERE target = $1 AND ((state = 'succeeded' \
         AND command IN ('create_cluster', 'import_cluster', 'add_instance_group', \
         'update_instance_group', 'delete_instance_group')) OR command = 'delete_nodes') \
         ORDER BY created_at, id"
    )
    .bind(super::target(name))
    .fetch_all(pool)
    .await
    })
    .map_err(StoreError::from)?;
    let unreadable = |command: &str, e: serde_json::Error| {
        ApiError::internal(format!("the stored {command} request is unreadable: {e}"))
    };
    let mut desired = None;
    for (command, spec, outputs) in rows {
        match command.as_str() {
            c if c == CreateCluster::SPEC.name => {
                let r = CreateCluster::from_stored(&spec).map_err(|e| unreadable(c, e))?;
                desired = Some(Desired::Created(r));
            }
            c if c == ImportCluster::SPEC.name => {
                let r = serde_json::from_str(&spec).map_err(|e| unreadable(c, e))?;
                desired = Some(Desired::Imported(r));
            }
            c if c == DeleteNodes::SPEC.name => {
                if let Some(Desired::Created(r)) = &mut desired {
                    for (group, n) in crate::node::deleted_per_group(&outputs)? {
                        if let Some(g) = r
                            .instance_groups
                            .iter_mut()
                            .find(|g| g.name.as_str() == group)
                        {
                            let left = g.instance_count.get().saturating_sub(n);
                            g.instance_count =
                                InstanceCount::new(left).map_err(ApiError::internal)?;
                        }
                    }
                }
            }
            c => {
                if let Some(Desired::Created(r)) = &mut desired {
                    r.instance_groups =
                        crate::instance_group::applied(c, &spec, &r.instance_groups)?;
                }
            }
        }
    }
    Ok(desired)
}

async fn required(store: &Store, name: &str) -> Result<Desired, ApiError> {
    desired(store, name).await?.ok_or_else(|| {
        ApiError::field(
            "name",
            format!(
                "{name} has no finished creation or import to hold it to: retry or delete the one that failed"
            ),
        )
    })
}

/// The creation's stage that a reconcile stage runs (all but Activate, which only
/// writes hypd's record).
fn creation_stage(stage: Stage) -> create::Stage {
    match stage {
        Stage::Network => create::Stage::Network,
        Stage::Iam => create::Stage::Iam,
        Stage::Eks => create::Stage::Eks,
        Stage::Access => create::Stage::Access,
        Stage::Addons => create::Stage::Addons,
        Stage::Components => create::Stage::Components,
        Stage::Hyperpod => create::Stage::Hyperpod,
        Stage::Storage => create::Stage::Storage,
    }
}

impl Pipeline for ReconcileCluster {
    type Stage = Stage;
    type Outputs = Outputs;

    fn target(&self) -> String {
        super::target(self.name.as_str())
    }

    fn idempotency_key(&self) -> Option<&IdempotencyKey> {
        self.idempotency_key.as_ref()
    }

    /// hypd manages the cluster, it is in use (not being created or deleted), and a
    /// creation or import of it finished.
    async fn preflight(self, cx: &Preflight<'_>) -> Result<Self, ApiError> {
        let name = self.name.as_str();
        let Some(cluster) = super::get(cx.store, name).await? else {
            return Err(ApiError::NotFound {
                resource: "cluster".into(),
                name: name.to_owned(),
            });
        };
        if !matches!(cluster.status.as_str(), "active" | "imported") {
            return Err(ApiError::field(
                "name",
                format!(
                    "{name} is {}: only an active or imported cluster is held to what made it",
                    cluster.status
                ),
            ));
        }
        required(cx.store, name).await?;
        Ok(self)
    }

    async fn step(
        &self,
        cx: &Context,
        stage: Stage,
        out: &mut Outputs,
    ) -> Result<Progress, ApiError> {
        match required(&cx.store, self.name.as_str()).await? {
            Desired::Created(c) => {
                Box::pin(create::converge_stage(
                    &c,
                    cx,
                    creation_stage(stage),
                    &mut out.created,
                    false,
                ))
                .await
            }
            // hypd made only its access entry in an imported cluster.
            Desired::Imported(i) if stage == Stage::Access => {
                i.step(cx, import::Stage::Access, &mut out.imported).await
            }
            Desired::Imported(_) => Ok(Progress::Done),
        }
    }
}

impl Handler<GetDrift> for Service {
    async fn handle(&self, actor: &Actor, r: GetDrift) -> Result<DriftReport, ApiError> {
        let request = ReconcileCluster {
            name: r.name.clone(),
            idempotency_key: None,
            dry_run: false,
        };
        let made_by = required(&self.store, r.name.as_str()).await?.command();
        let checked_at = crate::clock::now();
        let plan = <Service as Handler<ReconcileCluster>>::preview(self, actor, request).await?;
        let drifted = plan
            .stages
            .into_iter()
            .flat_map(|s| {
                let stage = s.stage;
                s.changes
                    .into_iter()
                    .filter(|c| {
                        matches!(c.action, Action::Create | Action::Update | Action::Delete)
                    })
                    .map(move |c| Drifted::of(&stage, c))
            })
            .collect();
        Ok(DriftReport {
            name: r.name.to_string(),
            made_by: made_by.to_owned(),
            checked_at,
            drifted,
        })
    }
}
