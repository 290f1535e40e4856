//! The HyperPod inference operator: an EKS add-on whose configuration names everything it
//! acts as and writes to, all made by hypd first: the TLS certificate bucket, the
//! operator's execution role, the JumpStart gated-model role, and the roles of the ALB
//! controller and KEDA it runs, each trusted through the cluster's OIDC provider by its
//! own service accounts only. On: bucket and roles, then the add-on, waited for until
//! ACTIVE and its controller available. Off: the add-on first (nothing may run as a role
//! that is going), then the roles, then the bucket with the certificates the operator
//! wrote (worth nothing without it).

use std::collections::BTreeMap;

use app::api::ApiError;
use app::api::features::{Feature, FeatureState};
use aws_sdk_sagemaker::operation::describe_cluster::DescribeClusterOutput;
use serde_json::{Value, json};
use sha2::Digest;

use super::Oidc;
use crate::aws::Aws;
use crate::cluster::dependencies::INFERENCE_OPERATOR;
use crate::cluster::managed::Where;
use crate::operation::pipeline::Progress;
use crate::resources::eks::addon::{Addon, State as AddonState};
use crate::resources::iam::role::{Role, RoleSpec, Trust};
use crate::resources::s3::bucket::{Bucket, Files};
use crate::resources::{Resource, Want, converge, is_planning, missing, plan};

/// The controller's Deployment, whose service account the execution role trusts.
pub const CONTROLLER: (&str, &str) = (
    "hyperpod-inference-system",
    "hyperpod-inference-controller-manager",
);
const NAMESPACE: &str = "hyperpod-inference-system";
/// The service accounts the operator makes per JumpStart model to fetch gated weights.
const GATED_SUBJECT: &str = "system:serviceaccount:*:hyperpod-inference-service-account*";
const SAGEMAKER_SERVICE: &str = "sagemaker.amazonaws.com";
const MANAGED: &str = "arn:aws:iam::aws:policy/";

/// The roles' `role_name` suffixes, in `Part`'s order; the names of roles already made
/// depend on them.
pub(super) const ROLE_SUFFIXES: [&str; 4] = [
    "inference-exec",
    "inference-gated",
    "inference-alb",
    "inference-keda",
];

/// Each role the operator's configuration names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Part {
    Execution,
    Gated,
    Alb,
    Keda,
}

impl Part {
    const ALL: [Part; 4] = [Part::Execution, Part::Gated, Part::Alb, Part::Keda];

    fn suffix(self) -> &'static str {
        ROLE_SUFFIXES[self as usize]
    }

    /// Who may act as it: the subject of its service accounts, and an AWS service too.
    fn subject(self) -> (String, Option<&'static str>) {
        let account = |name: &str| format!("system:serviceaccount:{NAMESPACE}:{name}");
        match self {
            Part::Execution => (account(CONTROLLER.1), None),
            Part::Gated => (GATED_SUBJECT.to_owned(), Some(SAGEMAKER_SERVICE)),
            Part::Alb => (account("aws-load-balancer-controller"), None),
            Part::Keda => (account("keda-operator"), Some(SAGEMAKER_SERVICE)),
        }
    }

    /// Its AWS managed policies and inline policies.
    fn policies(self, bucket: &str) -> (Vec<String>, BTreeMap<String, Value>) {
        let managed = |names: &[&str]| names.iter().map(|n| format!("{MANAGED}{n}")).collect();
        match self {
            Part::Execution => (
                managed(&["AmazonSageMakerHyperPodInferenceAccess"]),
                BTreeMap::from([("hypd-tls-bucket".to_owned(), tls_policy(bucket))]),
            ),
            Part::Gated => (
                managed(&["AmazonSageMakerHyperPodGatedModelAccess"]),
                BTreeMap::new(),
            ),
            Part::Alb => (
                managed(&["ElasticLoadBalancingFullAccess"]),
                BTreeMap::from([("hypd-alb-security-groups".to_owned(), alb_policy())]),
            ),
            Part::Keda => (
                Vec::new(),
                BTreeMap::from([("hypd-keda-metrics".to_owned(), keda_policy())]),
            ),
        }
    }
}

/// The operator writes the certificates of the endpoints it serves to the bucket, reads
/// them back and deletes them with the endpoint; only in this account's bucket.
fn tls_policy(bucket: &str) -> Value {
    let objects = format!("arn:aws:s3:::{bucket}/*");
    let own = json!({ "StringEquals": { "aws:ResourceAccount": "${aws:PrincipalAccount}" } });
    json!({
        "Version": "2012-10-17",
        "Statement": [
            { "Effect": "Allow", "Action": ["s3:GetObject"], "Resource": [objects] },
            {
                "Effect": "Allow",
                "Action": ["s3:PutObject", "s3:PutObjectTagging", "s3:DeleteObject"],
                "Resource": [objects],
                "Condition": own,
            },
        ],
    })
}

/// What the ALB controller needs beyond the managed ELB policy: the security groups it
/// makes for each load balancer, and their tags.
fn alb_policy() -> Value {
    json!({
        "Version": "2012-10-17",
        "Statement": [{
            "Effect": "Allow",
            "Action": [
                "ec2:CreateSecurityGroup", "ec2:DeleteSecurityGroup",
                "ec2:AuthorizeSecurityGroupIngress", "ec2:RevokeSecurityGroupIngress",
                "ec2:CreateTags", "ec2:DeleteTags",
            ],
            "Resource": "*",
        }],
    })
}

/// KEDA scales endpoints on CloudWatch and Amazon Managed Prometheus metrics: read only.
fn keda_policy() -> Value {
    json!({
        "Version": "2012-10-17",
        "Statement": [{
            "Effect": "Allow",
            "Action": [
                "cloudwatch:GetMetricData", "cloudwatch:GetMetricStatistics", "cloudwatch:ListMetrics",
                "aps:QueryMetrics", "aps:GetLabels", "aps:GetSeries", "aps:GetMetricMetadata",
            ],
            "Resource": "*",
        }],
    })
}

/// The TLS bucket's name: S3's rules (lowercase, no `_`, at most 63 characters), unique
/// per account and cluster; a name too long keeps a hash of the whole.
pub fn tls_bucket(cluster: &str, account: &str) -> String {
    let cluster = cluster.to_lowercase().replace('_', "-");
    let name = format!("hypd-{cluster}-{account}-tls");
    if name.len() <= 63 {
        return name;
    }
    let hash = format!("{:x}", sha2::Sha256::digest(cluster.as_bytes()));
    let hash = &hash[..8];
    let keep = 63 - (5 + 1 + 8 + 1 + account.len() + 4);
    format!(
        "hypd-{}-{hash}-{account}-tls",
        cluster[..keep].trim_end_matches('-')
    )
}

/// Removes the TLS bucket of cluster `cluster` once the cluster is gone (its roles go
/// with the other features' roles).
pub(super) async fn teardown(aws: &Aws, region: &str, cluster: &str) -> Result<(), ApiError> {
    let account = aws.identity().await?.account;
    let name = tls_bucket(cluster, &account);
    converge(&bucket(aws, region, cluster, &name, false)).await?;
    Ok(())
}

/// The TLS bucket `name` of cluster `cluster`, wanted `on`.
fn bucket(aws: &Aws, region: &str, cluster: &str, name: &str, on: bool) -> Bucket {
    Bucket {
        s3: aws.s3(region),
        name: name.to_owned(),
        region: region.to_owned(),
        cluster: cluster.to_owned(),
        want: if on { Want::Present(()) } else { Want::Absent },
        // Everything in it is the operator's: certificates of its endpoints.
        hypd_files: Files::All,
        field: Feature::InferenceOperator.as_str(),
        // Its name is hypd's own (`tls_bucket`).
        adopt: true,
        harden: false,
    }
}

/// The operator's parts on one cluster.
pub(crate) struct Inference<'a> {
    aws: &'a Aws,
    at: &'a Where,
    account: String,
    bucket: String,
    /// The HyperPod cluster the operator deploys onto.
    cluster_arn: Option<String>,
    oidc: Result<Oidc, String>,
}

impl<'a> Inference<'a> {
    pub(crate) async fn new(aws: &'a Aws, at: &'a Where) -> Result<Self, ApiError> {
        Self::described(aws, at, &super::hyperpod(aws, at).await?).await
    }

    /// From a DescribeCluster the caller already made.
    pub(crate) async fn described(
        aws: &'a Aws,
        at: &'a Where,
        d: &DescribeClusterOutput,
    ) -> Result<Self, ApiError> {
        let account = aws.identity().await?.account;
        Ok(Inference {
            aws,
            at,
            bucket: tls_bucket(&at.eks, &account),
            account,
            cluster_arn: d.cluster_arn.clone(),
            oidc: super::oidc(aws, at).await?,
        })
    }

    fn role_arn(&self, part: Part) -> String {
        format!(
            "arn:aws:iam::{}:role/{}",
            self.account,
            crate::resources::iam::role_name(&self.at.eks, part.suffix())
        )
    }

    /// A role, wanted `on`; turning it on without the cluster's OIDC issuer is a field
    /// error.
    fn role(&self, part: Part, on: bool) -> Result<Role, ApiError> {
        let want = if on {
            let oidc = self
                .oidc
                .as_ref()
                .map_err(|why| ApiError::field(Feature::InferenceOperator.as_str(), why.clone()))?;
            let (subject, service) = part.subject();
            let (managed, inline) = part.policies(&self.bucket);
            Want::Present(RoleSpec {
                trust: Trust::Workloads {
                    provider_arn: oidc.provider_arn.clone(),
                    issuer: oidc.issuer.clone(),
                    subject,
                    service: service.map(str::to_owned),
                },
                managed,
                inline,
            })
        } else {
            Want::Absent
        };
        Ok(super::role(
            self.aws,
            &self.at.region,
            &self.at.eks,
            part.suffix(),
            want,
        ))
    }

    fn bucket(&self, on: bool) -> Bucket {
        bucket(self.aws, &self.at.region, &self.at.eks, &self.bucket, on)
    }

    /// The add-on's configuration: the keys of AWS's own add-on schema.
    fn configuration(&self) -> Result<Value, ApiError> {
        let cluster_arn = self
            .cluster_arn
            .clone()
            .ok_or_else(|| missing("the HyperPod cluster's ARN"))?;
        Ok(json!({
            "executionRoleArn": self.role_arn(Part::Execution),
            "tlsCertificateS3Bucket": self.bucket,
            "hyperpodClusterArn": cluster_arn,
            "jumpstartGatedModelDownloadRoleArn": self.role_arn(Part::Gated),
            "alb": { "enabled": true, "serviceAccount": { "create": true, "roleArn": self.role_arn(Part::Alb) } },
            "keda": { "enabled": true, "auth": { "aws": { "irsa": { "enabled": true, "roleArn": self.role_arn(Part::Keda) } } } },
        }))
    }

    fn addon(&self, on: bool) -> Result<Addon, ApiError> {
        let mut addon = super::addon(
            self.aws,
            self.at,
            &INFERENCE_OPERATOR,
            if on {
                Want::Present(INFERENCE_OPERATOR.version.to_owned())
            } else {
                Want::Absent
            },
        );
        if on {
            addon.configuration = Some(self.configuration()?);
        }
        Ok(addon)
    }

    /// Whether it already stands as `on` asks: no part to change (the same diffs a run
    /// makes), and when on, the add-on ACTIVE; when off, no add-on at all.
    pub(crate) async fn holds(&self, on: bool) -> Result<bool, ApiError> {
        let addon = self.addon(on)?;
        let found = addon.observe().await?;
        if !addon.diff(&found)?.is_empty()
            || (on && !found.as_ref().is_some_and(AddonState::active))
            || (!on && found.is_some())
        {
            return Ok(false);
        }
        for part in Part::ALL {
            if !plan(&self.role(part, on)?).await?.is_empty() {
                return Ok(false);
            }
        }
        Ok(plan(&self.bucket(on)).await?.is_empty())
    }

    /// One step towards `on`.
    pub(crate) async fn step(&self, on: bool) -> Result<Progress, ApiError> {
        let name = INFERENCE_OPERATOR.name;
        if on {
            converge(&self.bucket(true)).await?;
            for part in Part::ALL {
                converge(&self.role(part, true)?).await?;
            }
            let state = converge(&self.addon(true)?)
                .await?
                .ok_or_else(|| missing("the inference operator's add-on"))?;
            state.check(name)?;
            if !state.active() {
                return Ok(Progress::wait(
                    super::POLL,
                    format!("waiting for {}", state.describe(name)),
                ));
            }
            if is_planning() {
                return Ok(Progress::Done);
            }
            return Ok(Progress::unless(
                super::POLL,
                super::controller_pending(self.aws, self.at, CONTROLLER).await?,
            ));
        }
        let after = converge(&self.addon(false)?).await?;
        if after.is_some_and(|s| s.ours) {
            return Ok(Progress::wait(
                super::POLL,
                format!("deleting the {name} add-on"),
            ));
        }
        for part in Part::ALL {
            converge(&self.role(part, false)?).await?;
        }
        converge(&self.bucket(false)).await?;
        Ok(Progress::Done)
    }

    /// How it stands now, for get_features.
    pub(crate) async fn state(&self) -> Result<FeatureState, ApiError> {
        let addon = self.addon(false)?.observe().await?;
        let (status, version) = super::status(&addon);
        let mut f = super::feature(
            Feature::InferenceOperator,
            super::on(&addon),
            status,
            version,
        );
        if !f.enabled {
            return Ok(f);
        }
        let config = addon.and_then(|a| a.configuration).unwrap_or_default();
        let named = |key: &str| {
            config
                .pointer(key)
                .and_then(Value::as_str)
                .map(str::to_owned)
        };
        f.details.push(match named("/executionRoleArn") {
            Some(arn) => format!("execution role {arn}"),
            None => "no execution role configured: the operator cannot call AWS".to_owned(),
        });
        f.details.push(match named("/tlsCertificateS3Bucket") {
            Some(b) => format!("TLS certificates in bucket {b}"),
            None => "no TLS certificate bucket configured".to_owned(),
        });
        // The roles hypd makes: say which are missing or changed.
        if self.oidc.is_ok() {
            let mut off = Vec::new();
            for part in Part::ALL {
                if !plan(&self.role(part, true)?).await?.is_empty() {
                    off.push(crate::resources::iam::role_name(
                        &self.at.eks,
                        part.suffix(),
                    ));
                }
            }
            if !off.is_empty() {
                f.details
                    .push(format!("roles missing or changed: {}", off.join(", ")));
            }
        }
        f.details.push(
            match super::controller_pending(self.aws, self.at, CONTROLLER).await? {
                None => "controller available".to_owned(),
                Some(why) => why,
            },
        );
        Ok(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tls_bucket_name_follows_s3s_rules() {
        assert_eq!(
            tls_bucket("ML_1", "123456789012"),
            "hypd-ml-1-123456789012-tls"
        );
        let long = tls_bucket(&"a".repeat(63), "123456789012");
        assert!(long.len() <= 63, "{long}");
        assert!(long.ends_with("-123456789012-tls"), "{long}");
        assert_ne!(long, tls_bucket(&"a".repeat(62), "123456789012"));
    }

    #[test]
    fn each_role_is_trusted_by_its_own_service_accounts() {
        let (subject, service) = Part::Execution.subject();
        assert_eq!(
            subject,
            "system:serviceaccount:hyperpod-inference-system:hyperpod-inference-controller-manager"
        );
        assert!(service.is_none());
        let (subject, service) = Part::Gated.subject();
        assert!(subject.starts_with("system:serviceaccount:*:"), "{subject}");
        assert_eq!(service, Some("sagemaker.amazonaws.com"));
        let (managed, inline) = Part::Execution.policies("b");
        assert_eq!(
            managed,
            ["arn:aws:iam::aws:policy/AmazonSageMakerHyperPodInferenceAccess"]
        );
        assert!(
            inline["hypd-tls-bucket"]
                .to_string()
                .contains("arn:aws:s3:::b/*")
        );
    }
}
