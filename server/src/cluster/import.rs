//! Importing an existing EKS cluster, with the HyperPod cluster it orchestrates. The only
//! change made in AWS is hypd's own EKS access entry, tagged `hypd:managed=true` so that
//! it is recognised as hypd's later (and only it is removed when hypd lets go).

use std::time::Duration;

use app::api::clusters::ImportCluster;
use app::api::values::IdempotencyKey;
use app::api::{ApiError, Command};
use aws_sdk_eks::types::ClusterStatus;
use serde::{Deserialize, Serialize};

use super::access::{self, Access};
use super::managed::{self, Desired};
use crate::aws::{Aws, SdkResultExt};
use crate::operation::pipeline::{Context, Pipeline, Preflight, Progress, stages};
use crate::resources::eks::cluster::{self as eks, State};
use crate::resources::missing;

const POLL: Duration = Duration::from_secs(15);

stages! {
    pub enum Stage {
        Eks = "eks", "Find the EKS cluster and wait until it is ACTIVE", true;
        Access = "access", "Grant hypd cluster-admin through an EKS access entry", true;
        Hyperpod = "hyperpod", "Find the HyperPod cluster it orchestrates", true;
        Register = "register", "Record the cluster and make it your active cluster", false;
    }
}

/// What the stages found, stored with the operation. Field names are stored: never rename.
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
    type Stage = Stage;
    type Outputs = Outputs;

    fn target(&self) -> String {
        super::target(self.name.as_str())
    }

    fn idempotency_key(&self) -> Option<&IdempotencyKey> {
        self.idempotency_key.as_ref()
    }

    /// The cluster is not hypd's yet, and EKS (and the HyperPod cluster named, if one
    /// is) has it. Fills in the region.
    async fn preflight(mut self, cx: &Preflight<'_>) -> Result<Self, ApiError> {
        let region = cx.region(self.region.as_ref()).await?;
        if super::get(cx.store, self.name.as_str()).await?.is_some() {
            return Err(ApiError::field(
                "name",
                format!("{} is already managed by hypd", self.name),
            ));
        }
        find_eks(cx.aws, region.as_str(), self.name.as_str()).await?;
        if let Some(hp) = &self.hyperpod_cluster {
            find_hyperpod(cx.aws, region.as_str(), hp.as_str()).await?;
        }
        self.region = Some(region);
        Ok(self)
    }

    /// The request is what the cluster is meant to be from now on.
    async fn settle(&self, cx: &Context, out: &Outputs, succeeded: bool) -> Result<(), ApiError> {
        if succeeded {
            let desired = Desired::Imported(self.clone());
            managed::made(
                &cx.store,
                self.name.as_str(),
                &cx.operation_id,
                &desired,
                out,
            )
            .await?;
        }
        Ok(())
    }

    async fn step(
        &self,
        cx: &Context,
        stage: Stage,
        out: &mut Outputs,
    ) -> Result<Progress, ApiError> {
        let region = super::stored_region(self.region.as_ref(), Self::SPEC.name)?;
        let name = self.name.as_str();
        match stage {
            Stage::Eks => {
                let c = find_eks(&cx.aws, &region, name).await?;
                // Known while it is still CREATING: a plan goes on with them.
                out.eks_cluster_arn = c.arn.clone();
                out.kubernetes_version = c.version.clone();
                match &c.status {
                    Some(ClusterStatus::Active) => Ok(Progress::Done),
                    Some(s @ (ClusterStatus::Creating | ClusterStatus::Updating)) => Ok(
                        Progress::wait(POLL, format!("EKS cluster {name} is {}", s.as_str())),
                    ),
                    s => Err(ApiError::field(
                        "name",
                        format!(
                            "EKS cluster {name} is {}; only an ACTIVE cluster can be imported",
                            s.as_ref().map_or("in an unknown state", |s| s.as_str())
                        ),
                    )),
                }
            }
            Stage::Access => match access::grant(&cx.aws, &region, name).await? {
                Access::Granted { principal, managed } => {
                    out.principal_arn = Some(principal);
                    out.access_entry_managed = Some(managed);
                    Ok(Progress::Done)
                }
                Access::Wait(p) => Ok(p),
            },
            Stage::Hyperpod => {
                let wanted = self.hyperpod_cluster.as_ref().map(|c| c.as_str());
                orchestrated_hyperpod(&cx.aws, &region, wanted, out).await
            }
            Stage::Register => {
                let record = super::Record {
                    name,
                    region: &region,
                    status: "imported",
                    kubernetes_version: out.kubernetes_version.as_deref(),
                    eks_cluster_arn: out.eks_cluster_arn.as_deref(),
                    hyperpod_cluster_arn: out.hyperpod_cluster_arn.as_deref(),
                };
                super::record_and_activate(&cx.store, &record, &cx.requested_by).await?;
                Ok(Progress::Done)
            }
        }
    }
}

/// The EKS cluster as it is now, or a field error naming `name` when there is none.
async fn find_eks(aws: &Aws, region: &str, name: &str) -> Result<State, ApiError> {
    eks::describe(&aws.eks(region), name).await?.ok_or_else(|| {
        ApiError::field(
            "name",
            format!("there is no EKS cluster named {name} in {region}"),
        )
    })
}

/// HyperPod cluster `name`'s ARN and the EKS cluster orchestrating it; a field error on
/// `hyperpod_cluster` when there is none.
async fn find_hyperpod(
    aws: &Aws,
    region: &str,
    name: &str,
) -> Result<(String, Option<String>), ApiError> {
    let found = aws
        .sagemaker(region)
        .describe_cluster()
        .cluster_name(name)
        .send()
        .await
        .upstream("sagemaker", "DescribeCluster");
    match found {
        Ok(c) => Ok((
            c.cluster_arn().unwrap_or_default().to_owned(),
            c.orchestrator()
                .and_then(|o| o.eks())
                .and_then(|e| e.cluster_arn())
                .map(str::to_owned),
        )),
        Err(ApiError::Upstream { code: Some(c), .. })
            if c == "ResourceNotFound" || c == "ValidationException" =>
        {
            Err(ApiError::field(
                "hyperpod_cluster",
                format!("there is no HyperPod cluster named {name} in {region}"),
            ))
        }
        Err(e) => Err(e),
    }
}

/// Finds the HyperPod cluster the imported EKS cluster orchestrates: the one named, or
/// the only one whose orchestrator it is (none is fine: an EKS cluster without HyperPod).
async fn orchestrated_hyperpod(
    aws: &Aws,
    region: &str,
    wanted: Option<&str>,
    out: &mut Outputs,
) -> Result<Progress, ApiError> {
    let eks_arn = out
        .eks_cluster_arn
        .clone()
        .ok_or_else(|| missing("the EKS cluster ARN"))?;
    let names = match wanted {
        Some(name) => vec![name.to_owned()],
        None => hyperpod_names(aws, region).await?,
    };
    let mut matching = Vec::new();
    for name in names {
        let (arn, orchestrator) = find_hyperpod(aws, region, &name).await?;
        if orchestrator.as_deref() == Some(eks_arn.as_str()) {
            matching.push((name, arn));
        } else if wanted.is_some() {
            return Err(ApiError::field(
                "hyperpod_cluster",
                format!("HyperPod cluster {name} is not orchestrated by {eks_arn}"),
            ));
        }
    }
    if matching.len() > 1 {
        return Err(ApiError::field(
            "hyperpod_cluster",
            format!(
                "several HyperPod clusters use this EKS cluster ({}); name the one to import",
                matching
                    .iter()
                    .map(|(n, _)| n.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ));
    }
    if let Some((name, arn)) = matching.pop() {
        out.hyperpod_cluster_name = Some(name);
        out.hyperpod_cluster_arn = Some(arn);
    }
    Ok(Progress::Done)
}

async fn hyperpod_names(aws: &Aws, region: &str) -> Result<Vec<String>, ApiError> {
    let mut names = Vec::new();
    let mut pages = aws
        .sagemaker(region)
        .list_clusters()
        .into_paginator()
        .send();
    while let Some(page) = pages.next().await {
        let page = page.upstream("sagemaker", "ListClusters")?;
        names.extend(
            page.cluster_summaries()
                .iter()
                .filter_map(|s| s.cluster_name().map(str::to_owned)),
        );
    }
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operation::pipeline::Stage as _;

    #[test]
    fn the_plan_ends_with_a_stage_that_cannot_be_cancelled() {
        let r: ImportCluster = serde_json::from_value(serde_json::json!({"name": "ml"})).unwrap();
        let plan = r.plan();
        assert!(!plan.last().unwrap().cancellable());
        assert_eq!(r.target(), "cluster/ml");
    }
}
