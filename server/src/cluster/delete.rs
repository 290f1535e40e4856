//! Deleting a cluster: the teardown order is written here, once. Every stage deletes only
//! what carries hypd's tags for this cluster, so an imported cluster loses nothing but
//! hypd's access entry and record, and a stage run again finds less to do. Nothing here
//! looks at another cluster's objects: several clusters can be deleted at once.

use std::time::Duration;

use app::api::ApiError;
use app::api::clusters::DeleteCluster;
use app::api::plan::{Action, Change};
use app::api::values::IdempotencyKey;
use serde::{Deserialize, Serialize};

use super::{access, addons, hyperpod, identity, network};
use crate::operation::pipeline::{Context, Pipeline, Preflight, Progress, stages};
use crate::resources::eks::cluster::EksCluster;
use crate::resources::iam::oidc_provider;
use crate::resources::{Want, converge, is_planning, planned};

const POLL: Duration = Duration::from_secs(30);

stages! {
    pub enum Stage {
        Hyperpod = "hyperpod", "Delete the HyperPod cluster", true;
        Addons = "addons", "Delete hypd's EKS add-ons", true;
        Eks = "eks", "Delete the EKS cluster (an imported one keeps it and loses only hypd's access entry)", false;
        Mlflow = "mlflow", "Delete the MLflow tracking server hypd made for the cluster (with its runs) and its role", false;
        Iam = "iam", "Delete the IAM roles and the OIDC provider", false;
        FileSystems = "file_systems", "Delete the FSx file systems hypd made for the cluster's storage (with their files)", false;
        Network = "network", "Delete the network: NAT, gateways, route tables, subnets, security group, VPC", false;
        Bucket = "bucket", "Delete the shared bucket if it holds only hypd's lifecycle scripts", false;
        Forget = "forget", "Remove the cluster from hypd", false;
    }
}

/// What the stages found, stored with the operation. Field names are stored: never rename.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Outputs {
    /// Things left in place on purpose, and why.
    #[serde(default)]
    pub kept: Vec<String>,
    /// The cluster's OIDC provider, read from EKS before the control plane goes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oidc_provider_arn: Option<String>,
}

impl Outputs {
    fn keep(&mut self, why: Option<String>) {
        if let Some(why) = why
            && !self.kept.contains(&why)
        {
            self.kept.push(why);
        }
    }
}

impl Pipeline for DeleteCluster {
    type Stage = Stage;
    type Outputs = Outputs;

    fn target(&self) -> String {
        super::target(self.name.as_str())
    }

    fn idempotency_key(&self) -> Option<&IdempotencyKey> {
        self.idempotency_key.as_ref()
    }

    /// hypd manages the cluster.
    async fn preflight(self, cx: &Preflight<'_>) -> Result<Self, ApiError> {
        if super::get(cx.store, self.name.as_str()).await?.is_none() {
            return Err(ApiError::NotFound {
                resource: "cluster".into(),
                name: self.name.to_string(),
            });
        }
        Ok(self)
    }

    async fn step(
        &self,
        cx: &Context,
        stage: Stage,
        out: &mut Outputs,
    ) -> Result<Progress, ApiError> {
        let name = self.name.as_str();
        let region = super::get(&cx.store, name)
            .await?
            .map(|c| c.region)
            .ok_or_else(|| {
                ApiError::internal(format!(
                    "cluster {name} left the store before its deletion finished"
                ))
            })?;
        match stage {
            Stage::Hyperpod => {
                if !is_planning() {
                    super::set_status(
                        &cx.store,
                        name,
                        &["creating", "active", "failed", "imported"],
                        "deleting",
                    )
                    .await?;
                }
                hyperpod::teardown(&cx.aws, &region, name).await
            }
            Stage::Addons => addons::teardown(&cx.aws, &region, name).await,
            Stage::Eks => {
                let eks = EksCluster {
                    eks: cx.aws.eks(&region),
                    name: name.to_owned(),
                    want: Want::Absent,
                };
                let before = crate::resources::Resource::observe(&eks).await?;
                let Some(c) = &before else {
                    return Ok(Progress::Done);
                };
                if out.oidc_provider_arn.is_none()
                    && let Some(issuer) = &c.oidc_issuer
                {
                    let account = cx.aws.identity().await?.account;
                    out.oidc_provider_arn = Some(oidc_provider::arn(&account, issuer));
                }
                if c.ours {
                    converge(&eks).await?;
                    return Ok(Progress::wait(
                        POLL,
                        format!("EKS cluster {name} is DELETING"),
                    ));
                }
                // Imported: hypd lets go of it, removing only the access entry it tagged.
                out.oidc_provider_arn = None;
                out.keep(access::revoke(&cx.aws, &region, name).await?);
                Ok(Progress::Done)
            }
            Stage::Mlflow => {
                let (progress, kept) =
                    crate::mlflow::create::teardown(&cx.aws, &region, name).await?;
                out.keep(kept);
                Ok(progress)
            }
            Stage::Iam => {
                let known = match &out.oidc_provider_arn {
                    Some(arn) => Some(arn.clone()),
                    None => super::creation_output(&cx.store, name, "/oidc_provider_arn").await?,
                };
                identity::teardown(&cx.aws, &region, name, known.as_deref()).await?;
                crate::features::teardown(&cx.aws, &region, name).await?;
                Ok(Progress::Done)
            }
            Stage::FileSystems => {
                // An imported cluster keeps its EKS cluster, and pods there may still
                // mount them.
                let created = matches!(
                    super::managed::Managed::load(&cx.store, name)
                        .await?
                        .desired(),
                    Some(super::managed::Desired::Created(_))
                );
                let (progress, kept) =
                    crate::storage::fsx::teardown(&cx.aws, &region, name, created).await?;
                for k in kept {
                    out.keep(Some(k));
                }
                Ok(progress)
            }
            Stage::Network => network::teardown(&cx.aws, &region, name).await,
            Stage::Bucket => {
                if let Some(bucket) =
                    super::creation_output(&cx.store, name, "/hyperpod/s3_bucket").await?
                {
                    out.keep(hyperpod::delete_bucket(&cx.aws, &region, name, &bucket).await?);
                }
                Ok(Progress::Done)
            }
            Stage::Forget => {
                if !planned(|| Change::new(Action::Delete, "hypd:Cluster", name)) {
                    super::forget(&cx.store, name).await?;
                }
                Ok(Progress::Done)
            }
        }
    }
}
