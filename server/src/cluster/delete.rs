//! Deleting a cluster: the teardown order is written here, once. Every stage deletes only
//! what carries hypd's tags for this cluster, so an imported cluster loses nothing but
//! hypd's access entry and record, and a stage run again finds less to do.

use std::time::Duration;

use app::api::ApiError;
use app::api::clusters::DeleteCluster;
use app::api::values::IdempotencyKey;
use aws_sdk_eks::error::ProvideErrorMetadata;
use aws_sdk_eks::types::{AddonStatus, ClusterStatus};
use serde::{Deserialize, Serialize};

use super::dependencies::ADDONS;
use super::import::{MANAGED_TAG, principal_arn};
use crate::operation::pipeline::{Context, Pipeline, Progress, StagePlan};
use crate::{hyperpod, iam, network};

const POLL: Duration = Duration::from_secs(30);

const STAGES: [StagePlan; 7] = [
    StagePlan {
        name: "hyperpod",
        title: "Delete the HyperPod cluster",
        cancellable: true,
    },
    StagePlan {
        name: "addons",
        title: "Delete hypd's EKS add-ons",
        cancellable: true,
    },
    StagePlan {
        name: "eks",
        title: "Delete the EKS cluster (an imported one keeps it and loses only hypd's access entry)",
        cancellable: false,
    },
    StagePlan {
        name: "iam",
        title: "Delete the IAM roles and the OIDC provider",
        cancellable: false,
    },
    StagePlan {
        name: "network",
        title: "Delete the network: NAT, gateways, route tables, subnets, security group, VPC",
        cancellable: false,
    },
    StagePlan {
        name: "bucket",
        title: "Delete the shared bucket if it holds only hypd's lifecycle scripts",
        cancellable: false,
    },
    StagePlan {
        name: "forget",
        title: "Remove the cluster from hypd",
        cancellable: false,
    },
];

#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Outputs {
    /// Things left in place on purpose, and why.
    #[serde(default)]
    pub kept: Vec<String>,
}

impl Pipeline for DeleteCluster {
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
            "hyperpod" => hyperpod::teardown(&cx.aws, &region, name).await,
            "addons" => delete_addons(cx, &region, name).await,
            "eks" => delete_eks(cx, &region, name, out).await,
            "iam" => {
                let client = cx.aws.iam(&region);
                for suffix in iam::ROLES {
                    iam::delete_role(&client, name, &iam::role_name(name, suffix)).await?;
                }
                iam::delete_oidc_providers(&client, name).await?;
                Ok(Progress::Done)
            }
            "network" => network::teardown(&cx.aws, &region, name).await,
            "bucket" => {
                if let Some(bucket) = created_bucket(cx, name).await?
                    && let Some(kept) =
                        hyperpod::delete_bucket(&cx.aws, &region, name, &bucket).await?
                    && !out.kept.contains(&kept)
                {
                    out.kept.push(kept);
                }
                Ok(Progress::Done)
            }
            "forget" => {
                super::forget(&cx.store, name).await?;
                Ok(Progress::Done)
            }
            other => Err(ApiError::internal(format!(
                "delete_cluster has no stage {other}"
            ))),
        }
    }
}

/// The bucket the cluster's creation used, from that operation's stored outputs.
async fn created_bucket(cx: &Context, name: &str) -> Result<Option<String>, ApiError> {
    let ops = crate::operation::list(&cx.store, None, Some(&format!("cluster/{name}"))).await?;
    Ok(ops
        .iter()
        .filter(|o| o.command == "create_cluster")
        .find_map(|o| {
            o.outputs
                .get("hyperpod")
                .and_then(|h| h.get("s3_bucket"))
                .and_then(|b| b.as_str())
                .map(str::to_owned)
        }))
}

fn ours(tags: Option<&std::collections::HashMap<String, String>>, cluster: &str) -> bool {
    tags.and_then(|t| t.get("hypd:cluster")).map(String::as_str) == Some(cluster)
}

async fn delete_addons(cx: &Context, region: &str, cluster: &str) -> Result<Progress, ApiError> {
    let eks = cx.aws.eks(region);
    let mut deleting = Vec::new();
    for addon in ADDONS {
        let a = match eks
            .describe_addon()
            .cluster_name(cluster)
            .addon_name(addon.name)
            .send()
            .await
        {
            Ok(o) => o.addon,
            Err(e) if e.code() == Some("ResourceNotFoundException") => None,
            Err(e) => return Err(crate::aws::upstream("eks", "DescribeAddon", e)),
        };
        let Some(a) = a.filter(|a| ours(a.tags(), cluster)) else {
            continue;
        };
        if a.status() != Some(&AddonStatus::Deleting) {
            eks.delete_addon()
                .cluster_name(cluster)
                .addon_name(addon.name)
                .send()
                .await
                .map_err(|e| crate::aws::upstream("eks", "DeleteAddon", e))?;
        }
        deleting.push(addon.name);
    }
    Ok(Progress::unless_pending(POLL, &deleting, |d| {
        format!("deleting add-ons: {d}")
    }))
}

async fn delete_eks(
    cx: &Context,
    region: &str,
    cluster: &str,
    out: &mut Outputs,
) -> Result<Progress, ApiError> {
    let eks = cx.aws.eks(region);
    let c = match eks.describe_cluster().name(cluster).send().await {
        Ok(o) => o.cluster,
        Err(e) if e.code() == Some("ResourceNotFoundException") => None,
        Err(e) => return Err(crate::aws::upstream("eks", "DescribeCluster", e)),
    };
    let Some(c) = c else {
        return Ok(Progress::Done);
    };
    if ours(c.tags(), cluster) {
        if c.status() != Some(&ClusterStatus::Deleting) {
            eks.delete_cluster()
                .name(cluster)
                .send()
                .await
                .map_err(|e| crate::aws::upstream("eks", "DeleteCluster", e))?;
        }
        return Ok(Progress::wait(
            POLL,
            format!("EKS cluster {cluster} is DELETING"),
        ));
    }
    // Imported: hypd lets go of it, removing only the access entry it tagged.
    let principal = principal_arn(&cx.aws.identity().await?.arn);
    match eks
        .describe_access_entry()
        .cluster_name(cluster)
        .principal_arn(&principal)
        .send()
        .await
    {
        Ok(found) => {
            let tagged = found
                .access_entry()
                .and_then(|a| a.tags())
                .is_some_and(|t| t.get(MANAGED_TAG).map(String::as_str) == Some("true"));
            if tagged {
                eks.delete_access_entry()
                    .cluster_name(cluster)
                    .principal_arn(&principal)
                    .send()
                    .await
                    .map_err(|e| crate::aws::upstream("eks", "DeleteAccessEntry", e))?;
            } else {
                let kept = format!(
                    "kept the access entry of {principal} on {cluster}: hypd did not create it"
                );
                if !out.kept.contains(&kept) {
                    out.kept.push(kept);
                }
            }
        }
        Err(e) if e.code() == Some("ResourceNotFoundException") => {}
        Err(e) => return Err(crate::aws::upstream("eks", "DescribeAccessEntry", e)),
    }
    Ok(Progress::Done)
}
