//! Managed tiered checkpointing: HyperPod keeps checkpoints in a share of each node's
//! memory, and the training pods copy them to S3. Its identity chain is exactly: an IAM
//! role trusted through the cluster's OIDC provider by one Kubernetes service account
//! (`sub` = that account, `aud` = STS) with one inline policy (the cluster bucket's
//! `checkpoints/` prefix, CloudWatch Logs), and that service account annotated with the
//! role. On: role, account, then `TieredStorageConfig` Enable, waited for until HyperPod
//! is InService again. Off: the setting first (so no daemon expects the chain), then the
//! account and the role, and nothing else.

use std::collections::BTreeMap;

use app::api::ApiError;
use app::api::features::{Feature, FeatureState, MIN_TIERED_MEMORY_PERCENT};
use k8s_openapi::api::core::v1::ServiceAccount;
use serde_json::{Value, json};

use crate::aws::Aws;
use crate::cluster::managed::Where;
use crate::operation::pipeline::Progress;
use crate::resources::iam::role::{Role, RoleSpec, Trust};
use crate::resources::kube::object::Applied;
use crate::resources::sagemaker::tiered_storage::{self, TieredStorage};
use crate::resources::{Resource, Want, converge, missing, plan, tags};

/// The service account training pods run as to reach their checkpoints in S3.
pub const SERVICE_ACCOUNT: (&str, &str) = ("default", "hypd-tiered-checkpointing");
/// The role's `role_name` suffix; the names of roles already made depend on it.
pub(super) const ROLE_SUFFIX: &str = "tiered-ckpt";
const POLICY_NAME: &str = "hypd-tiered-checkpointing";
/// Where in the cluster's bucket checkpoints go.
pub const PREFIX: &str = "checkpoints/";
const ROLE_ARN_ANNOTATION: &str = "eks.amazonaws.com/role-arn";

use super::POLL;

/// What the checkpointing pods may do: read and write the bucket's checkpoint prefix and
/// write their logs.
pub fn policy(bucket: &str) -> Value {
    json!({
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Action": ["s3:ListBucket"],
                "Resource": format!("arn:aws:s3:::{bucket}"),
                "Condition": { "StringLike": { "s3:prefix": [format!("{PREFIX}*")] } },
            },
            {
                "Effect": "Allow",
                "Action": ["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"],
                "Resource": format!("arn:aws:s3:::{bucket}/{PREFIX}*"),
            },
            {
                "Effect": "Allow",
                "Action": ["logs:CreateLogGroup", "logs:CreateLogStream", "logs:PutLogEvents", "logs:DescribeLogStreams"],
                "Resource": "arn:aws:logs:*:*:log-group:/aws/sagemaker/*",
            },
        ],
    })
}

/// The chain and the setting on one cluster.
pub(crate) struct Tiered<'a> {
    aws: &'a Aws,
    at: &'a Where,
    role_arn: String,
    /// The role as it must be; why there can be none (an imported cluster has no bucket
    /// of hypd's).
    spec: Result<RoleSpec, String>,
}

impl<'a> Tiered<'a> {
    /// The chain is made from the bucket of a cluster hypd created and its OIDC issuer;
    /// without them it can be read, not made.
    pub(crate) async fn new(
        aws: &'a Aws,
        at: &'a Where,
        store: &crate::store::Store,
    ) -> Result<Self, ApiError> {
        let bucket = crate::cluster::creation_output(store, &at.eks, "/hyperpod/s3_bucket")
            .await?
            .ok_or_else(|| {
                format!(
                    "{} has no bucket of hypd's for checkpoints (hypd did not create it)",
                    at.eks
                )
            });
        let oidc = super::oidc(aws, at).await?;
        let (namespace, name) = SERVICE_ACCOUNT;
        let spec = bucket.and_then(|bucket| {
            let oidc = oidc?;
            Ok(RoleSpec {
                trust: Trust::ServiceAccount {
                    provider_arn: oidc.provider_arn,
                    issuer: oidc.issuer,
                    namespace: namespace.to_owned(),
                    name: name.to_owned(),
                },
                managed: Vec::new(),
                inline: BTreeMap::from([(POLICY_NAME.to_owned(), policy(&bucket))]),
            })
        });
        Ok(Tiered {
            aws,
            at,
            role_arn: super::role_arn(aws, &at.eks, ROLE_SUFFIX).await?,
            spec,
        })
    }

    /// The role, wanted `on`; turning it on where it cannot be made is a field error.
    fn role(&self, on: bool) -> Result<Role, ApiError> {
        let want = if on {
            Want::Present(
                self.spec
                    .clone()
                    .map_err(|why| ApiError::field(Feature::TieredCheckpointing.as_str(), why))?,
            )
        } else {
            Want::Absent
        };
        Ok(super::role(
            self.aws,
            &self.at.region,
            &self.at.eks,
            ROLE_SUFFIX,
            want,
        ))
    }

    async fn account(&self, on: bool) -> Result<Applied<ServiceAccount>, ApiError> {
        let client =
            crate::resources::kube::connect(self.aws, &self.at.region, &self.at.eks).await?;
        let (namespace, name) = SERVICE_ACCOUNT;
        let object: ServiceAccount = serde_json::from_value(json!({
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "labels": { tags::K8S_MANAGED_BY.0: tags::K8S_MANAGED_BY.1 },
                "annotations": { ROLE_ARN_ANNOTATION: self.role_arn },
            },
        }))
        .map_err(ApiError::internal)?;
        let applied = Applied::namespaced(&client, object);
        Ok(if on { applied } else { applied.absent() })
    }

    fn setting(&self, percent: Option<i32>) -> TieredStorage {
        TieredStorage {
            sagemaker: self.aws.sagemaker(&self.at.region),
            cluster: self.at.hyperpod.clone(),
            want: percent.map_or(Want::Absent, Want::Present),
        }
    }

    /// The percentage to run with: the one asked, else the one it runs with (`now`),
    /// else the least.
    fn percent(asked: Option<u8>, now: &tiered_storage::Observed) -> i32 {
        asked
            .map(i32::from)
            .or(now.enabled)
            .unwrap_or(i32::from(MIN_TIERED_MEMORY_PERCENT))
    }

    /// Whether it already stands as asked: the setting, the role and the account need
    /// no change (the same diffs a run makes).
    pub(crate) async fn holds(&self, on: bool, asked: Option<u8>) -> Result<bool, ApiError> {
        let setting = self.setting(None).observe().await?;
        let wanted = on.then(|| Self::percent(asked, &setting));
        Ok(setting.settled()
            && setting.enabled == wanted
            && plan(&self.role(on)?).await?.is_empty()
            && plan(&self.account(on).await?).await?.is_empty())
    }

    /// One step towards `on` (with `asked` percent).
    pub(crate) async fn step(&self, on: bool, asked: Option<u8>) -> Result<Progress, ApiError> {
        if on {
            let percent = Self::percent(asked, &self.setting(None).observe().await?);
            converge(&self.role(true)?)
                .await?
                .arn
                .ok_or_else(|| missing("the tiered checkpointing role"))?;
            converge(&self.account(true).await?).await?;
            let now = converge(&self.setting(Some(percent))).await?;
            return Ok(self.wait(&now, Some(percent)));
        }
        let now = converge(&self.setting(None)).await?;
        if let p @ Progress::Wait { .. } = self.wait(&now, None) {
            return Ok(p);
        }
        converge(&self.account(false).await?).await?;
        converge(&self.role(false)?).await?;
        Ok(Progress::Done)
    }

    fn wait(&self, now: &tiered_storage::Observed, wanted: Option<i32>) -> Progress {
        if now.settled() && now.enabled == wanted {
            return Progress::Done;
        }
        Progress::wait(
            POLL,
            format!(
                "HyperPod cluster {} is {}: applying tiered checkpointing",
                self.at.hyperpod,
                now.status
                    .as_ref()
                    .map_or("in an unknown state", |s| s.as_str())
            ),
        )
    }

    /// How it stands now, for get_features, with the setting as DescribeCluster gave it.
    pub(crate) async fn state(
        &self,
        setting: tiered_storage::Observed,
    ) -> Result<FeatureState, ApiError> {
        let mut f = super::feature(
            Feature::TieredCheckpointing,
            setting.enabled.is_some(),
            if setting.enabled.is_some() {
                "Enable"
            } else {
                "Disable"
            }
            .to_owned(),
            None,
        );
        if let Some(p) = setting.enabled {
            f.details.push(format!("{p}% of instance memory"));
        }
        if !setting.settled() {
            f.details.push(format!(
                "HyperPod cluster {}",
                setting
                    .status
                    .as_ref()
                    .map_or("state unknown", |s| s.as_str())
            ));
        }
        // Complete when role and account stand as a run would leave them (the
        // account's annotation names the role).
        if let Ok(role) = self.role(true) {
            let role_ok = plan(&role).await?.is_empty();
            let account_ok = plan(&self.account(true).await?).await?.is_empty();
            let (ns, sa) = SERVICE_ACCOUNT;
            if role_ok && account_ok {
                f.details.push(format!(
                    "pods running as {ns}/{sa} act as {} (identity chain complete)",
                    self.role_arn
                ));
            } else if f.enabled {
                f.details.push(format!(
                    "identity chain incomplete: {}",
                    [
                        (!role_ok).then_some("the IAM role"),
                        (!account_ok).then_some("the service account")
                    ]
                    .into_iter()
                    .flatten()
                    .collect::<Vec<_>>()
                    .join(" and ")
                        + " missing or changed"
                ));
            }
        }
        Ok(f)
    }
}
