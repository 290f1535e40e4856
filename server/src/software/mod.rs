//! `update_cluster_software`: one `UpdateClusterSoftware` call for the chosen groups,
//! then the roll watched batch by batch until every node of the groups runs the release
//! and is Ready in Kubernetes again. HyperPod rolls the batches itself; the operation's
//! progress note says which batch is updating and which nodes are in it.

use std::collections::BTreeMap;
use std::time::Duration;

use app::api::ApiError;
use app::api::software::UpdateClusterSoftware;
use app::api::values::IdempotencyKey;
use aws_sdk_sagemaker::types::ClusterStatus;
use serde::{Deserialize, Serialize};

use crate::cluster::managed::{Where, locate};
use crate::node::kubernetes_behind;
use crate::operation::pipeline::{Context, Pipeline, Preflight, Progress, stages};
use crate::resources::converge;
use crate::resources::sagemaker::software::{Rolling, Software};

stages! {
    pub enum Stage {
        Update = "update", "HyperPod: UpdateClusterSoftware for the groups", false;
        Rolled = "rolled", "Every node of the groups on the release and Ready again, batch by batch", true;
    }
}

/// What the stages found, stored with the operation. Field names are stored: never rename.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Outputs {
    /// The groups updated.
    #[serde(default)]
    pub groups: Vec<String>,
    /// Nodes not on the release when the update was sent.
    #[serde(default)]
    pub nodes_to_update: usize,
}

const POLL: Duration = Duration::from_secs(30);

/// What a software update needs of the cluster.
const NEEDS: &str = "its software is updated in an active or imported cluster";

/// The groups the request names, or every group of the cluster; each named one must be
/// the cluster's.
async fn groups(
    r: &UpdateClusterSoftware,
    cx_aws: &crate::aws::Aws,
    at: &Where,
) -> Result<Vec<String>, ApiError> {
    let described =
        crate::resources::sagemaker::described(&cx_aws.sagemaker(&at.region), &at.hyperpod).await?;
    let all: Vec<String> = described
        .instance_groups()
        .iter()
        .filter_map(|g| g.instance_group_name().map(str::to_owned))
        .collect();
    if r.groups.is_empty() {
        return Ok(all);
    }
    for (i, g) in r.groups.iter().enumerate() {
        if !all.iter().any(|a| a == g.as_str()) {
            return Err(ApiError::field(
                format!("groups[{i}]"),
                format!(
                    "{} has no instance group {g}; it has {}",
                    r.name,
                    all.join(", ")
                ),
            ));
        }
    }
    Ok(r.groups.iter().map(|g| g.to_string()).collect())
}

fn software(r: &UpdateClusterSoftware, cx: &Context, at: &Where, groups: Vec<String>) -> Software {
    Software {
        sagemaker: cx.aws.sagemaker(&at.region),
        cluster: at.hyperpod.clone(),
        groups,
        release: r.image_release.clone(),
        rolling: Rolling {
            batch_instances: r.batch_instances,
            batch_percent: r.batch_percent,
            wait_seconds: r.wait_seconds,
        },
    }
}

impl Pipeline for UpdateClusterSoftware {
    type Stage = Stage;
    type Outputs = Outputs;

    fn target(&self) -> String {
        crate::cluster::target(self.name.as_str())
    }

    fn idempotency_key(&self) -> Option<&IdempotencyKey> {
        self.idempotency_key.as_ref()
    }

    /// The cluster has a HyperPod cluster and the groups named are its own; whether the
    /// release exists is HyperPod's to say.
    async fn preflight(self, cx: &Preflight<'_>) -> Result<Self, ApiError> {
        let at = locate(cx.store, self.name.as_str(), NEEDS).await?;
        groups(&self, cx.aws, &at).await?;
        Ok(self)
    }

    async fn step(
        &self,
        cx: &Context,
        stage: Stage,
        out: &mut Outputs,
    ) -> Result<Progress, ApiError> {
        let at = locate(&cx.store, self.name.as_str(), NEEDS).await?;
        match stage {
            Stage::Update => {
                let groups = groups(self, &cx.aws, &at).await?;
                let s = software(self, cx, &at, groups.clone());
                // The nodes as observed before the call (apply changes only the status).
                let seen = converge(&s).await?;
                if out.groups.is_empty() {
                    out.nodes_to_update = seen.behind(self.image_release.as_deref()).count();
                }
                out.groups = groups;
                Ok(Progress::Done)
            }
            Stage::Rolled => {
                let s = software(self, cx, &at, out.groups.clone());
                let now = s.observed().await?;
                let updating: Vec<&String> = now
                    .nodes
                    .iter()
                    .filter(|(_, n)| n.status == "SystemUpdating")
                    .map(|(id, _)| id)
                    .collect();
                let behind = now.behind(self.image_release.as_deref()).count();
                let rolling = now.status == Some(ClusterStatus::Systemupdating);
                // Without a release named, only HyperPod knows the newest: the roll is over
                // when the cluster is no longer updating.
                let left = if self.image_release.is_some() {
                    behind
                } else {
                    updating.len()
                };
                if left > 0 || rolling {
                    let total = out.nodes_to_update.max(left);
                    let per_batch = self.batch(total);
                    let done = total.saturating_sub(left);
                    let batches = total.div_ceil(per_batch).max(1);
                    let batch = (done / per_batch + 1).min(batches);
                    let release = self
                        .image_release
                        .as_deref()
                        .unwrap_or("the newest release");
                    let who = if updating.is_empty() {
                        "waiting for the next batch".to_owned()
                    } else {
                        format!(
                            "updating {}",
                            updating
                                .iter()
                                .map(|s| s.as_str())
                                .collect::<Vec<_>>()
                                .join(", ")
                        )
                    };
                    return Ok(Progress::wait(
                        POLL,
                        format!(
                            "{done} of {total} nodes on {release}; batch {batch} of {batches}: {who}"
                        ),
                    ));
                }
                let mut running: BTreeMap<&str, usize> = BTreeMap::new();
                for n in now.nodes.values().filter(|n| n.status == "Running") {
                    *running.entry(n.group.as_str()).or_insert(0) += 1;
                }
                Ok(Progress::unless(
                    POLL,
                    kubernetes_behind(cx, &at, &running).await?,
                ))
            }
        }
    }
}
