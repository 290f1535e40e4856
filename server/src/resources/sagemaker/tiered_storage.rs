//! A HyperPod cluster's managed tiered checkpointing setting (`TieredStorageConfig`): on
//! with a share of each instance's memory, or off. Changed by an `UpdateCluster` that
//! sends only that setting (no instance group), so nothing else of the cluster is
//! touched. HyperPod shows the cluster `Updating` while it applies it and refuses another
//! update meanwhile, so a cluster not `InService` is waited for, never sent to again.

use app::api::ApiError;
use app::api::plan::{Action, Change};
use aws_sdk_sagemaker::operation::describe_cluster::DescribeClusterOutput;
use aws_sdk_sagemaker::types::{ClusterConfigMode, ClusterStatus, ClusterTieredStorageConfig};
use serde_json::json;

use super::Client;
use crate::aws::SdkResultExt;
use crate::resources::{Resource, Want};

const KIND: &str = "sagemaker:Cluster";

pub struct TieredStorage {
    pub sagemaker: Client,
    pub cluster: String,
    /// Present: the percentage of each instance's memory (20-100).
    pub want: Want<i32>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Observed {
    pub status: Option<ClusterStatus>,
    /// The percentage while the mode is Enable; `None` when off.
    pub enabled: Option<i32>,
}

impl Observed {
    /// HyperPod takes an update now.
    pub fn settled(&self) -> bool {
        self.status == Some(ClusterStatus::Inservice)
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Op {
    Set(i32),
    Disable,
}

/// The change for `want` given what was found. Pure. Nothing is sent to a cluster that
/// is not InService: its last update is still being applied.
pub fn diff(want: &Want<i32>, o: &Observed) -> Vec<Op> {
    if !o.settled() {
        return Vec::new();
    }
    match (want, o.enabled) {
        (Want::Present(p), now) if now != Some(*p) => vec![Op::Set(*p)],
        (Want::Absent, Some(_)) => vec![Op::Disable],
        _ => Vec::new(),
    }
}

/// Reads the setting and the cluster's status.
pub async fn observe(sagemaker: &Client, cluster: &str) -> Result<Observed, ApiError> {
    Ok(Observed::from(&super::described(sagemaker, cluster).await?))
}

impl From<&DescribeClusterOutput> for Observed {
    /// The setting and status of a cluster DescribeCluster gave (a caller that reads
    /// other fields of it too need not ask again).
    fn from(d: &DescribeClusterOutput) -> Self {
        let t = d.tiered_storage_config();
        Observed {
            enabled: t
                .filter(|t| t.mode() == Some(&ClusterConfigMode::Enable))
                .map(|t| {
                    t.instance_memory_allocation_percentage()
                        .unwrap_or_default()
                }),
            status: d.cluster_status.clone(),
        }
    }
}

impl Resource for TieredStorage {
    type Observed = Observed;
    type Op = Op;

    async fn observe(&self) -> Result<Observed, ApiError> {
        observe(&self.sagemaker, &self.cluster).await
    }

    fn diff(&self, o: &Observed) -> Result<Vec<Op>, ApiError> {
        Ok(diff(&self.want, o))
    }

    async fn apply(&self, op: &Op, o: &mut Observed) -> Result<(), ApiError> {
        let config = match op {
            Op::Set(p) => ClusterTieredStorageConfig::builder()
                .mode(ClusterConfigMode::Enable)
                .instance_memory_allocation_percentage(*p),
            Op::Disable => ClusterTieredStorageConfig::builder().mode(ClusterConfigMode::Disable),
        }
        .build();
        self.sagemaker
            .update_cluster()
            .cluster_name(&self.cluster)
            .tiered_storage_config(config)
            .send()
            .await
            .upstream("sagemaker", "UpdateCluster")?;
        self.assume(op, o);
        o.status = Some(ClusterStatus::Updating);
        Ok(())
    }

    fn describe(&self, op: &Op, o: &Observed) -> Change {
        let shown = |p: Option<i32>| {
            Some(match p {
                Some(p) => json!(format!("Enable ({p}% of instance memory)")),
                None => json!("Disable"),
            })
        };
        let new = match op {
            Op::Set(p) => Some(*p),
            Op::Disable => None,
        };
        Change::new(Action::Update, KIND, &self.cluster).field(
            "tiered_storage_config",
            shown(o.enabled),
            shown(new),
        )
    }

    fn assume(&self, op: &Op, o: &mut Observed) {
        o.enabled = match op {
            Op::Set(p) => Some(*p),
            Op::Disable => None,
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_settled_cluster_is_sent_a_change() {
        let at = |status, enabled| Observed {
            status: Some(status),
            enabled,
        };
        let on = Want::Present(40);
        assert_eq!(
            diff(&on, &at(ClusterStatus::Inservice, None)),
            [Op::Set(40)]
        );
        assert_eq!(
            diff(&on, &at(ClusterStatus::Inservice, Some(20))),
            [Op::Set(40)]
        );
        assert!(diff(&on, &at(ClusterStatus::Inservice, Some(40))).is_empty());
        assert!(diff(&on, &at(ClusterStatus::Updating, None)).is_empty());
        assert_eq!(
            diff(&Want::Absent, &at(ClusterStatus::Inservice, Some(40))),
            [Op::Disable]
        );
        assert!(diff(&Want::Absent, &at(ClusterStatus::Inservice, None)).is_empty());
    }
}
