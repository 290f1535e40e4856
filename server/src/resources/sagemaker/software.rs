//! A HyperPod cluster's platform software as a resource: the release each node of some
//! groups runs, against the release wanted. `UpdateClusterSoftware` has no client token;
//! while an update rolls, HyperPod shows the cluster as `SystemUpdating` and refuses
//! another, so a cluster in that state is one whose update is under way (an earlier run's
//! whose answer was lost), and nothing is sent again.

use std::collections::{BTreeMap, BTreeSet};

use app::api::ApiError;
use app::api::plan::{Action, Change};
use aws_sdk_sagemaker::types::{
    CapacitySizeConfig, ClusterStatus, DeploymentConfiguration, NodeUnavailabilityType,
    RollingDeploymentPolicy, UpdateClusterSoftwareInstanceGroupSpecification,
};

use super::Client;
use super::nodes::list;
use crate::aws::SdkResultExt;
use crate::resources::Resource;

/// How the update rolls: at most this many nodes at once (or this percent of them), this
/// long between batches.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Rolling {
    pub batch_instances: Option<u32>,
    pub batch_percent: Option<u32>,
    pub wait_seconds: Option<u32>,
}

/// The groups `groups` of HyperPod cluster `cluster` on `release` (`None`: the newest).
pub struct Software {
    pub sagemaker: Client,
    pub cluster: String,
    pub groups: Vec<String>,
    pub release: Option<String>,
    pub rolling: Rolling,
}

/// A node of the groups, as HyperPod lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeRelease {
    pub group: String,
    pub release: Option<String>,
    pub status: String,
}

#[derive(Debug, Default)]
pub struct Observed {
    pub status: Option<ClusterStatus>,
    pub nodes: BTreeMap<String, NodeRelease>,
}

impl Observed {
    /// Nodes of the groups not on `release` (any, for the newest, which only HyperPod
    /// knows: every node is a candidate).
    pub fn behind<'a>(
        &'a self,
        release: Option<&'a str>,
    ) -> impl Iterator<Item = (&'a String, &'a NodeRelease)> {
        self.nodes
            .iter()
            .filter(move |(_, n)| release.is_none_or(|r| n.release.as_deref() != Some(r)))
    }
}

/// The one call.
#[derive(Debug)]
pub struct Update;

impl Software {
    pub async fn observed(&self) -> Result<Observed, ApiError> {
        let status = self
            .sagemaker
            .describe_cluster()
            .cluster_name(&self.cluster)
            .send()
            .await
            .upstream("sagemaker", "DescribeCluster")?
            .cluster_status()
            .cloned();
        let wanted: BTreeSet<&str> = self.groups.iter().map(String::as_str).collect();
        let nodes = list(&self.sagemaker, &self.cluster, None)
            .await?
            .into_iter()
            .filter(|n| n.instance_group_name().is_some_and(|g| wanted.contains(g)))
            .filter_map(|n| {
                Some((
                    n.instance_id()?.to_owned(),
                    NodeRelease {
                        group: n.instance_group_name().unwrap_or_default().to_owned(),
                        release: n.current_image_release_version().map(str::to_owned),
                        status: n
                            .instance_status()
                            .and_then(|s| s.status())
                            .map(|s| s.as_str().to_owned())
                            .unwrap_or_default(),
                    },
                ))
            })
            .collect();
        Ok(Observed { status, nodes })
    }

    fn deployment(&self) -> Option<DeploymentConfiguration> {
        let Rolling {
            batch_instances,
            batch_percent,
            wait_seconds,
        } = self.rolling;
        let size = match (batch_instances, batch_percent) {
            (Some(n), _) => Some((NodeUnavailabilityType::InstanceCount, n)),
            (None, Some(p)) => Some((NodeUnavailabilityType::CapacityPercentage, p)),
            (None, None) => None,
        };
        if size.is_none() && wait_seconds.is_none() {
            return None;
        }
        let mut d = DeploymentConfiguration::builder();
        if let Some((kind, value)) = size {
            let size = CapacitySizeConfig::builder()
                .r#type(kind)
                .value(i32::try_from(value).unwrap_or(i32::MAX))
                .build();
            d = d.rolling_update_policy(
                RollingDeploymentPolicy::builder()
                    .maximum_batch_size(size)
                    .build(),
            );
        }
        if let Some(w) = wait_seconds {
            d = d.wait_interval_in_seconds(i32::try_from(w).unwrap_or(i32::MAX));
        }
        Some(d.build())
    }
}

impl Resource for Software {
    type Observed = Observed;
    type Op = Update;

    async fn observe(&self) -> Result<Observed, ApiError> {
        self.observed().await
    }

    fn diff(&self, observed: &Observed) -> Result<Vec<Update>, ApiError> {
        let under_way = observed.status == Some(ClusterStatus::Systemupdating);
        let behind = observed.behind(self.release.as_deref()).next().is_some();
        Ok(if behind && !under_way {
            vec![Update]
        } else {
            Vec::new()
        })
    }

    async fn apply(&self, _: &Update, observed: &mut Observed) -> Result<(), ApiError> {
        let mut req = self
            .sagemaker
            .update_cluster_software()
            .cluster_name(&self.cluster)
            .set_deployment_config(self.deployment());
        for g in &self.groups {
            req = req.instance_groups(
                UpdateClusterSoftwareInstanceGroupSpecification::builder()
                    .instance_group_name(g)
                    .set_image_release_version(self.release.clone())
                    .build(),
            );
        }
        req.send()
            .await
            .upstream("sagemaker", "UpdateClusterSoftware")?;
        observed.status = Some(ClusterStatus::Systemupdating);
        Ok(())
    }

    fn describe(&self, _: &Update, observed: &Observed) -> Change {
        let wanted = self
            .release
            .clone()
            .unwrap_or_else(|| "the newest".to_owned());
        let mut change = Change::new(Action::Update, "sagemaker:Cluster", &self.cluster);
        for g in &self.groups {
            let now: BTreeSet<String> = observed
                .nodes
                .values()
                .filter(|n| n.group == *g)
                .filter_map(|n| n.release.clone())
                .collect();
            let behind = observed
                .behind(self.release.as_deref())
                .filter(|(_, n)| n.group == *g)
                .count();
            change = change.field(
                format!("instance_groups[{g}].image_release"),
                Some(serde_json::json!(
                    now.into_iter().collect::<Vec<_>>().join(", ")
                )),
                Some(serde_json::json!(format!(
                    "{wanted} ({behind} nodes, each rebooted)"
                ))),
            );
        }
        change
    }

    fn assume(&self, _: &Update, observed: &mut Observed) {
        observed.status = Some(ClusterStatus::Systemupdating);
    }
}
