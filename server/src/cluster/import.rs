//! Importing an existing EKS cluster, with the HyperPod cluster it orchestrates. The only
//! change made in AWS is hypd's own EKS access entry, tagged `hypd:managed=true` so that
//! it is recognised as hypd's later (and only it is removed when hypd lets go).

use std::time::Duration;

use app::api::ApiError;
use app::api::clusters::ImportCluster;
use app::api::values::IdempotencyKey;
use aws_sdk_eks::types::{
    AccessScope, AccessScopeType, AuthenticationMode, ClusterStatus, UpdateAccessConfigRequest,
};
use aws_sdk_sagemaker::error::ProvideErrorMetadata;
use serde::{Deserialize, Serialize};

use crate::aws::UpstreamError;
use crate::operation::pipeline::{Context, Pipeline, Progress, StagePlan};

pub const CLUSTER_ADMIN_POLICY: &str =
    "arn:aws:eks::aws:cluster-access-policy/AmazonEKSClusterAdminPolicy";
/// The tag that marks what hypd created.
pub const MANAGED_TAG: &str = "hypd:managed";

const POLL: Duration = Duration::from_secs(15);

const STAGES: [StagePlan; 4] = [
    StagePlan {
        name: "eks",
        title: "Find the EKS cluster and wait until it is ACTIVE",
        cancellable: true,
    },
    StagePlan {
        name: "access",
        title: "Grant hypd cluster-admin through an EKS access entry",
        cancellable: true,
    },
    StagePlan {
        name: "hyperpod",
        title: "Find the HyperPod cluster it orchestrates",
        cancellable: true,
    },
    StagePlan {
        name: "register",
        title: "Record the cluster and make it your active cluster",
        cancellable: false,
    },
];

#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Outputs {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eks_cluster_arn: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kubernetes_version: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub principal_arn: Option<String>,
    /// The access entry carries hypd's tag (hypd made it, now or in an earlier import).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub access_entry_managed: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hyperpod_cluster_name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hyperpod_cluster_arn: Option<String>,
}

impl Pipeline for ImportCluster {
    type Outputs = Outputs;

    fn target(&self) -> String {
        format!("cluster/{}", self.name)
    }

    fn idempotency_key(&self) -> Option<&IdempotencyKey> {
        self.idempotency_key.as_ref()
    }

    fn plan(&self) -> Vec<StagePlan> {
        STAGES.to_vec()
    }

    async fn step(
        &self,
        cx: &Context,
        stage: &str,
        out: &mut Outputs,
    ) -> Result<Progress, ApiError> {
        let region = self
            .region
            .as_ref()
            .map(|r| r.to_string())
            .ok_or_else(|| ApiError::internal("import stored without a region"))?;
        match stage {
            "eks" => find_eks(cx, &region, self.name.as_str(), out).await,
            "access" => match grant_access(cx, &region, self.name.as_str()).await? {
                Access::Granted { principal, managed } => {
                    out.principal_arn = Some(principal);
                    out.access_entry_managed = Some(managed);
                    Ok(Progress::Done)
                }
                Access::Wait(p) => Ok(p),
            },
            "hyperpod" => {
                let wanted = self.hyperpod_cluster.as_ref().map(|c| c.as_str());
                find_hyperpod(cx, &region, wanted, out).await
            }
            "register" => {
                let record = super::Record {
                    name: self.name.as_str(),
                    region: &region,
                    status: "imported",
                    kubernetes_version: out.kubernetes_version.as_deref(),
                    eks_cluster_arn: out.eks_cluster_arn.as_deref(),
                    hyperpod_cluster_arn: out.hyperpod_cluster_arn.as_deref(),
                };
                super::record_and_activate(&cx.store, &record, &cx.requested_by).await?;
                Ok(Progress::Done)
            }
            other => Err(ApiError::internal(format!(
                "import_cluster has no stage {other}"
            ))),
        }
    }
}

pub fn upstream_eks<E, R>(call: &'static str, e: aws_sdk_eks::error::SdkError<E, R>) -> ApiError
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
    R: std::fmt::Debug,
    aws_sdk_eks::error::SdkError<E, R>: aws_sdk_eks::operation::RequestId,
{
    UpstreamError::from_sdk("eks", call, e).into()
}

pub fn sagemaker_error<E, R>(
    call: &'static str,
    e: aws_sdk_sagemaker::error::SdkError<E, R>,
) -> ApiError
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
    R: std::fmt::Debug,
    aws_sdk_sagemaker::error::SdkError<E, R>: aws_sdk_sagemaker::operation::RequestId,
{
    UpstreamError::from_sdk("sagemaker", call, e).into()
}

/// The EKS cluster as it is now, or a field error naming `name` when there is none.
pub async fn describe_eks(
    cx_aws: &crate::aws::Aws,
    region: &str,
    name: &str,
) -> Result<aws_sdk_eks::types::Cluster, ApiError> {
    match cx_aws
        .eks(region)
        .describe_cluster()
        .name(name)
        .send()
        .await
    {
        Ok(out) => out
            .cluster
            .ok_or_else(|| ApiError::internal("DescribeCluster answered without a cluster")),
        Err(e) if e.code() == Some("ResourceNotFoundException") => Err(ApiError::field(
            "name",
            format!("there is no EKS cluster named {name} in {region}"),
        )),
        Err(e) => Err(upstream_eks("DescribeCluster", e)),
    }
}

async fn find_eks(
    cx: &Context,
    region: &str,
    name: &str,
    out: &mut Outputs,
) -> Result<Progress, ApiError> {
    let c = describe_eks(&cx.aws, region, name).await?;
    match c.status() {
        Some(ClusterStatus::Active) => {
            out.eks_cluster_arn = c.arn().map(str::to_owned);
            out.kubernetes_version = c.version().map(str::to_owned);
            Ok(Progress::Done)
        }
        Some(s @ (ClusterStatus::Creating | ClusterStatus::Updating)) => Ok(Progress::wait(
            POLL,
            format!("EKS cluster {name} is {}", s.as_str()),
        )),
        s => Err(ApiError::field(
            "name",
            format!(
                "EKS cluster {name} is {}; only an ACTIVE cluster can be imported",
                s.map_or("in an unknown state", |s| s.as_str())
            ),
        )),
    }
}

/// The IAM principal an access entry names: an assumed role's session ARN becomes the
/// role's ARN (EKS refuses session ARNs), and an STS-form user ARN (as some emulators
/// answer GetCallerIdentity) its IAM form.
pub fn principal_arn(caller: &str) -> String {
    let Some(rest) = caller.strip_prefix("arn:aws:sts::") else {
        return caller.to_owned();
    };
    if let Some((account, role_session)) = rest.split_once(":assumed-role/") {
        let role = role_session.split('/').next().unwrap_or(role_session);
        return format!("arn:aws:iam::{account}:role/{role}");
    }
    match rest.split_once(":user/") {
        Some((account, user)) => format!("arn:aws:iam::{account}:user/{user}"),
        None => caller.to_owned(),
    }
}

/// Where granting hypd's access stands.
pub enum Access {
    /// hypd's principal has cluster-admin; `managed` when the entry carries hypd's tag.
    Granted { principal: String, managed: bool },
    /// The cluster must change first (authentication mode).
    Wait(Progress),
}

/// Gives hypd's own principal cluster-admin through an access entry tagged as hypd's,
/// switching a CONFIG_MAP-only cluster to API_AND_CONFIG_MAP first.
pub async fn grant_access(cx: &Context, region: &str, name: &str) -> Result<Access, ApiError> {
    let eks = cx.aws.eks(region);
    let c = describe_eks(&cx.aws, region, name).await?;
    if c.status() == Some(&ClusterStatus::Updating) {
        return Ok(Access::Wait(Progress::wait(
            POLL,
            format!("EKS cluster {name} is UPDATING"),
        )));
    }
    let mode = c.access_config().and_then(|a| a.authentication_mode());
    if mode == Some(&AuthenticationMode::ConfigMap) {
        // Access entries need the API mode; API_AND_CONFIG_MAP keeps existing aws-auth users.
        eks.update_cluster_config()
            .name(name)
            .access_config(
                UpdateAccessConfigRequest::builder()
                    .authentication_mode(AuthenticationMode::ApiAndConfigMap)
                    .build(),
            )
            .send()
            .await
            .map_err(|e| upstream_eks("UpdateClusterConfig", e))?;
        return Ok(Access::Wait(Progress::wait(
            POLL,
            "switching the authentication mode to API_AND_CONFIG_MAP",
        )));
    }
    let identity = cx.aws.identity().await?;
    let principal = principal_arn(&identity.arn);
    let managed = match eks
        .describe_access_entry()
        .cluster_name(name)
        .principal_arn(&principal)
        .send()
        .await
    {
        Ok(found) => found
            .access_entry()
            .and_then(|a| a.tags())
            .is_some_and(|t| t.get(MANAGED_TAG).map(String::as_str) == Some("true")),
        Err(e) if e.code() == Some("ResourceNotFoundException") => {
            match eks
                .create_access_entry()
                .cluster_name(name)
                .principal_arn(&principal)
                .tags(MANAGED_TAG, "true")
                .tags("hypd:cluster", name)
                .send()
                .await
            {
                Ok(_) => true,
                // Made by a concurrent run of this step; the describe next time sees it.
                Err(e) if e.code() == Some("ResourceInUseException") => true,
                Err(e) => return Err(upstream_eks("CreateAccessEntry", e)),
            }
        }
        Err(e) => return Err(upstream_eks("DescribeAccessEntry", e)),
    };
    let policies = eks
        .list_associated_access_policies()
        .cluster_name(name)
        .principal_arn(&principal)
        .send()
        .await
        .map_err(|e| upstream_eks("ListAssociatedAccessPolicies", e))?;
    let associated = policies
        .associated_access_policies()
        .iter()
        .any(|p| p.policy_arn() == Some(CLUSTER_ADMIN_POLICY));
    if !associated {
        let scope = AccessScope::builder()
            .r#type(AccessScopeType::Cluster)
            .build();
        eks.associate_access_policy()
            .cluster_name(name)
            .principal_arn(&principal)
            .policy_arn(CLUSTER_ADMIN_POLICY)
            .access_scope(scope)
            .send()
            .await
            .map_err(|e| upstream_eks("AssociateAccessPolicy", e))?;
    }
    Ok(Access::Granted { principal, managed })
}

/// Checks that HyperPod cluster `name` exists and names its orchestrator; a field error
/// on `hyperpod_cluster` otherwise.
pub async fn describe_hyperpod(
    aws: &crate::aws::Aws,
    region: &str,
    name: &str,
) -> Result<(String, Option<String>), ApiError> {
    match aws
        .sagemaker(region)
        .describe_cluster()
        .cluster_name(name)
        .send()
        .await
    {
        Ok(c) => Ok((
            c.cluster_arn().unwrap_or_default().to_owned(),
            c.orchestrator()
                .and_then(|o| o.eks())
                .and_then(|e| e.cluster_arn())
                .map(str::to_owned),
        )),
        Err(e)
            if e.code() == Some("ResourceNotFound") || e.code() == Some("ValidationException") =>
        {
            Err(ApiError::field(
                "hyperpod_cluster",
                format!("there is no HyperPod cluster named {name} in {region}"),
            ))
        }
        Err(e) => Err(sagemaker_error("DescribeCluster", e)),
    }
}

async fn find_hyperpod(
    cx: &Context,
    region: &str,
    wanted: Option<&str>,
    out: &mut Outputs,
) -> Result<Progress, ApiError> {
    let eks_arn = out
        .eks_cluster_arn
        .clone()
        .ok_or_else(|| ApiError::internal("the eks stage stored no cluster ARN"))?;
    if let Some(name) = wanted {
        let (arn, orchestrator) = describe_hyperpod(&cx.aws, region, name).await?;
        if orchestrator.as_deref() != Some(eks_arn.as_str()) {
            return Err(ApiError::field(
                "hyperpod_cluster",
                format!("HyperPod cluster {name} is not orchestrated by {eks_arn}"),
            ));
        }
        out.hyperpod_cluster_name = Some(name.to_owned());
        out.hyperpod_cluster_arn = Some(arn);
        return Ok(Progress::Done);
    }
    let sm = cx.aws.sagemaker(region);
    let mut names = Vec::new();
    let mut token = None;
    loop {
        let page = sm
            .list_clusters()
            .set_next_token(token)
            .send()
            .await
            .map_err(|e| sagemaker_error("ListClusters", e))?;
        names.extend(
            page.cluster_summaries()
                .iter()
                .filter_map(|s| s.cluster_name().map(str::to_owned)),
        );
        token = page.next_token().map(str::to_owned);
        if token.is_none() {
            break;
        }
    }
    let mut matching = Vec::new();
    for name in names {
        let (arn, orchestrator) = describe_hyperpod(&cx.aws, region, &name).await?;
        if orchestrator.as_deref() == Some(eks_arn.as_str()) {
            matching.push((name, arn));
        }
    }
    match matching.len() {
        0 | 1 => {
            if let Some((name, arn)) = matching.pop() {
                out.hyperpod_cluster_name = Some(name);
                out.hyperpod_cluster_arn = Some(arn);
            }
            Ok(Progress::Done)
        }
        _ => Err(ApiError::field(
            "hyperpod_cluster",
            format!(
                "several HyperPod clusters use this EKS cluster ({}); name the one to import",
                matching
                    .iter()
                    .map(|(n, _)| n.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn assumed_role_sessions_become_their_role() {
        assert_eq!(
            principal_arn("arn:aws:sts::123456789012:assumed-role/hypd-admin/i-0abc"),
            "arn:aws:iam::123456789012:role/hypd-admin"
        );
        assert_eq!(
            principal_arn("arn:aws:iam::123456789012:user/moto"),
            "arn:aws:iam::123456789012:user/moto"
        );
        assert_eq!(
            principal_arn("arn:aws:sts::123456789012:user/moto"),
            "arn:aws:iam::123456789012:user/moto"
        );
    }

    #[test]
    fn the_plan_ends_with_a_stage_that_cannot_be_cancelled() {
        let r: ImportCluster = serde_json::from_value(serde_json::json!({"name": "ml"})).unwrap();
        let plan = r.plan();
        let names: Vec<&str> = plan.iter().map(|s| s.name).collect();
        assert_eq!(names, ["eks", "access", "hyperpod", "register"]);
        assert!(!plan[3].cancellable);
        assert_eq!(r.target(), "cluster/ml");
    }
}
