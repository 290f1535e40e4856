//! The HyperPod training operator: an IAM role trusted by EKS Pod Identity with AWS's
//! managed policy for the operator, its binding to the operator's service account, and
//! the add-on. On: made in that order (the controller must find its role when it
//! starts), then waited for until the add-on is ACTIVE and the controller available.
//! Off: the add-on first (so nothing runs as the role), then binding and role.

use app::api::ApiError;
use app::api::features::{Feature, FeatureState};
use kube::api::ListParams;

use crate::aws::Aws;
use crate::cluster::dependencies::TRAINING_OPERATOR;
use crate::cluster::identity::POD_IDENTITY_SERVICE;
use crate::cluster::managed::Where;
use crate::operation::pipeline::Progress;
use crate::resources::eks::addon::State as AddonState;
use crate::resources::eks::pod_identity::PodIdentity;
use crate::resources::iam::role::{Role, RoleSpec, Trust};
use crate::resources::kube::training::HyperPodPyTorchJob;
use crate::resources::kube::{self as kubernetes};
use crate::resources::{Resource, Want, converge, is_planning, missing, plan};

/// The operator's service account, which its pod identity names.
pub const SERVICE_ACCOUNT: (&str, &str) =
    ("aws-hyperpod", "hp-training-operator-controller-manager");
/// The operator's controller Deployment.
pub const CONTROLLER: (&str, &str) = (
    "aws-hyperpod",
    "hp-training-operator-hp-training-controller-manager",
);
pub const POLICY: &str = "arn:aws:iam::aws:policy/AmazonSageMakerHyperPodTrainingOperatorAccess";
/// The role's `role_name` suffix; the names of roles already made depend on it.
pub(super) const ROLE_SUFFIX: &str = "training-op";

use super::POLL;

fn spec() -> RoleSpec {
    RoleSpec {
        trust: Trust::Service(POD_IDENTITY_SERVICE.to_owned()),
        managed: vec![POLICY.to_owned()],
        inline: Default::default(),
    }
}

/// The operator's parts on one cluster.
pub(crate) struct TrainingOperator<'a> {
    aws: &'a Aws,
    at: &'a Where,
    /// The role's ARN, known from its name before it exists.
    role_arn: String,
}

impl<'a> TrainingOperator<'a> {
    pub(crate) async fn new(aws: &'a Aws, at: &'a Where) -> Result<Self, ApiError> {
        let role_arn = super::role_arn(aws, &at.eks, ROLE_SUFFIX).await?;
        Ok(TrainingOperator { aws, at, role_arn })
    }

    fn role(&self, on: bool) -> Role {
        super::role(
            self.aws,
            &self.at.region,
            &self.at.eks,
            ROLE_SUFFIX,
            if on {
                Want::Present(spec())
            } else {
                Want::Absent
            },
        )
    }

    fn binding(&self, on: bool) -> PodIdentity {
        let (namespace, service_account) = SERVICE_ACCOUNT;
        PodIdentity {
            eks: self.aws.eks(&self.at.region),
            cluster: self.at.eks.clone(),
            namespace: namespace.to_owned(),
            service_account: service_account.to_owned(),
            want: if on {
                Want::Present(self.role_arn.clone())
            } else {
                Want::Absent
            },
        }
    }

    fn addon(&self, on: bool) -> crate::resources::eks::addon::Addon {
        super::addon(
            self.aws,
            self.at,
            &TRAINING_OPERATOR,
            if on {
                Want::Present(TRAINING_OPERATOR.version.to_owned())
            } else {
                Want::Absent
            },
        )
    }

    /// Whether it already stands as `on` asks: nothing to change in any part (the same
    /// diffs a run would make), and when on, the add-on ACTIVE.
    pub async fn holds(&self, on: bool) -> Result<bool, ApiError> {
        let addon = self.addon(on);
        let found = addon.observe().await?;
        if !addon.diff(&found)?.is_empty()
            || (on && !found.as_ref().is_some_and(AddonState::active))
        {
            return Ok(false);
        }
        if !on && found.is_some() {
            // Still there yet nothing to delete: EKS is deleting it, or hypd did not make it.
            return Ok(false);
        }
        Ok(plan(&self.role(on)).await?.is_empty() && plan(&self.binding(on)).await?.is_empty())
    }

    /// Why turning it off cannot be done by hypd, if so.
    pub async fn not_ours(&self) -> Result<Option<String>, ApiError> {
        super::not_ours(self.aws, self.at, &TRAINING_OPERATOR).await
    }

    /// Why it may not be turned off now, if so: training jobs exist, and removing the
    /// add-on removes its CRD and every job with it.
    pub async fn jobs_left(&self) -> Result<Option<String>, ApiError> {
        let client = kubernetes::connect(self.aws, &self.at.region, &self.at.eks).await?;
        let api = kube::Api::<HyperPodPyTorchJob>::all(client);
        let mut jobs = Vec::new();
        let listed = kubernetes::each_listed(&api, ListParams::default(), |j| {
            jobs.push(format!(
                "{}/{}",
                j.metadata.namespace.unwrap_or_default(),
                j.metadata.name.unwrap_or_default()
            ))
        })
        .await;
        match listed {
            Ok(()) => {}
            // No CRD, no job.
            Err(e) if kubernetes::kind_not_served(&e) => {}
            Err(e) => return Err(e),
        }
        Ok((!jobs.is_empty()).then(|| {
            format!(
                "training jobs exist on {} ({}); turning the training operator off deletes its CRD and every job with it: delete them first (delete_training_job)",
                self.at.eks,
                jobs.join(", ")
            )
        }))
    }

    /// One step towards `on`.
    pub async fn step(&self, on: bool) -> Result<Progress, ApiError> {
        if on {
            let made = converge(&self.role(true)).await?;
            made.arn
                .ok_or_else(|| missing("the training operator's role"))?;
            converge(&self.binding(true)).await?;
            let state = converge(&self.addon(true))
                .await?
                .ok_or_else(|| missing("the training operator's add-on"))?;
            state.check(TRAINING_OPERATOR.name)?;
            if !state.active() {
                return Ok(Progress::wait(
                    POLL,
                    format!("waiting for {}", state.describe(TRAINING_OPERATOR.name)),
                ));
            }
            if is_planning() {
                return Ok(Progress::Done);
            }
            return Ok(Progress::unless(POLL, self.controller_pending().await?));
        }
        let after = converge(&self.addon(false)).await?;
        if after.is_some_and(|s| s.ours) {
            return Ok(Progress::wait(
                POLL,
                format!("deleting the {} add-on", TRAINING_OPERATOR.name),
            ));
        }
        converge(&self.binding(false)).await?;
        converge(&self.role(false)).await?;
        Ok(Progress::Done)
    }

    async fn controller_pending(&self) -> Result<Option<String>, ApiError> {
        super::controller_pending(self.aws, self.at, CONTROLLER).await
    }

    /// How it stands now, for get_features.
    pub async fn state(&self) -> Result<FeatureState, ApiError> {
        let addon = self.addon(false).observe().await?;
        let (status, version) = super::status(&addon);
        let mut f = super::feature(
            Feature::TrainingOperator,
            super::on(&addon),
            status,
            version,
        );
        if f.enabled {
            let role = self.role(true).observe().await?;
            f.details.push(match role.arn {
                Some(arn) => format!("pod identity role {arn}"),
                None => "no pod identity role: the controller cannot call AWS".to_owned(),
            });
            let bound = self.binding(true).observe().await?;
            if bound.association_id.is_none() {
                let (ns, sa) = SERVICE_ACCOUNT;
                f.details
                    .push(format!("service account {ns}/{sa} is not bound to a role"));
            }
            f.details.push(match self.controller_pending().await? {
                None => "controller available".to_owned(),
                Some(why) => why,
            });
        }
        Ok(f)
    }
}
