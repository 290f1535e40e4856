//! Drift and its repair. hypd's desired state for a cluster is the request that made it
//! (the creation's, or the import's) run through the same stages today: `get_drift` is
//! the plan preview of `reconcile_cluster`, and `reconcile_cluster` runs those stages
//! again, so what is reported and what is put back come from one observe and diff per
//! resource, and a cluster that did not drift plans, and changes, nothing.

use app::api::ApiError;
use app::api::clusters::{DriftReport, Drifted, GetDrift, ReconcileCluster};
use app::api::plan::Action;
use app::api::values::IdempotencyKey;
use serde::{Deserialize, Serialize};

use super::managed::{Desired, Managed};
use super::{create, import};
use crate::auth::Actor;
use crate::operation::pipeline::{Context, Pipeline, Preflight, Progress, stages};
use crate::service::{Handler, Service};

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
        Managed::load(cx.store, self.name.as_str())
            .await?
            .in_status(
                &["active", "imported"],
                "only an active or imported cluster is held to what made it",
            )?
            .required()?;
        Ok(self)
    }

    async fn step(
        &self,
        cx: &Context,
        stage: Stage,
        out: &mut Outputs,
    ) -> Result<Progress, ApiError> {
        let cluster = Managed::load(&cx.store, self.name.as_str()).await?;
        match cluster.required()? {
            Desired::Created(c) => {
                Box::pin(create::converge_stage(
                    c,
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
        let made_by = Managed::load(&self.store, r.name.as_str())
            .await?
            .required()?
            .command();
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
