//! A HyperPod cluster's managed Karpenter autoscaling (`AutoScaling` with its
//! `ClusterRole`): on with the role HyperPod assumes to add and remove nodes, or off.
//! Changed by an `UpdateCluster` that sends only these settings (no instance group), so
//! nothing else of the cluster is touched. HyperPod shows the cluster `Updating` and the
//! autoscaling `Creating`/`Deleting` while it installs or removes Karpenter and refuses
//! another update meanwhile, so an unsettled cluster is waited for, never sent to again.
//! The role cannot change while autoscaling is on (the API refuses it), so one already
//! on is left on whatever role it runs with.

use app::api::ApiError;
use app::api::plan::{Action, Change};
use aws_sdk_sagemaker::operation::describe_cluster::DescribeClusterOutput;
use aws_sdk_sagemaker::types::{
    ClusterAutoScalerType, ClusterAutoScalingConfig, ClusterAutoScalingMode,
    ClusterAutoScalingStatus, ClusterStatus,
};
use serde_json::json;

use super::Client;
use crate::aws::SdkResultExt;
use crate::resources::{Resource, Want};

const KIND: &str = "sagemaker:Cluster";

pub struct AutoScaling {
    pub sagemaker: Client,
    pub cluster: String,
    /// Present: the ARN of the cluster role to enable it with.
    pub want: Want<String>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Observed {
    pub status: Option<ClusterStatus>,
    /// The mode is Enable.
    pub enabled: bool,
    /// Autoscaling's own status; `None` once a Disable is over.
    pub scaling: Option<ClusterAutoScalingStatus>,
    pub role: Option<String>,
    /// Why an install failed, as HyperPod says it.
    pub failure: Option<String>,
}

impl Observed {
    /// HyperPod takes an update now: the cluster InService, no install or removal under
    /// way.
    pub fn settled(&self) -> bool {
        self.status == Some(ClusterStatus::Inservice)
            && !matches!(
                self.scaling,
                Some(ClusterAutoScalingStatus::Creating | ClusterAutoScalingStatus::Deleting)
            )
    }

    /// On and serving (`Some(true)`), off and gone (`Some(false)`), or still moving.
    pub fn done(&self) -> Option<bool> {
        if !self.settled() {
            return None;
        }
        match (self.enabled, &self.scaling) {
            (true, Some(ClusterAutoScalingStatus::Inservice)) => Some(true),
            (false, None | Some(ClusterAutoScalingStatus::Inservice)) => Some(false),
            _ => None,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    Enable(String),
    Disable,
}

/// The change for `want` given what was found. Pure.
pub fn diff(want: &Want<String>, o: &Observed) -> Vec<Op> {
    if !o.settled() {
        return Vec::new();
    }
    match (want, o.enabled) {
        (Want::Present(role), false) => vec![Op::Enable(role.clone())],
        (Want::Absent, true) => vec![Op::Disable],
        _ => Vec::new(),
    }
}

/// Managed Karpenter is on for the cluster DescribeCluster gave.
pub fn enabled(d: &DescribeClusterOutput) -> bool {
    d.auto_scaling()
        .is_some_and(|a| a.mode() == &ClusterAutoScalingMode::Enable)
}

impl From<&DescribeClusterOutput> for Observed {
    fn from(d: &DescribeClusterOutput) -> Self {
        let a = d.auto_scaling();
        Observed {
            status: d.cluster_status.clone(),
            enabled: enabled(d),
            scaling: a.map(|a| a.status().clone()),
            role: d.cluster_role().map(str::to_owned),
            failure: a.and_then(|a| a.failure_message()).map(str::to_owned),
        }
    }
}

impl Resource for AutoScaling {
    type Observed = Observed;
    type Op = Op;

    async fn observe(&self) -> Result<Observed, ApiError> {
        Ok(Observed::from(
            &super::described(&self.sagemaker, &self.cluster).await?,
        ))
    }

    fn diff(&self, o: &Observed) -> Result<Vec<Op>, ApiError> {
        Ok(diff(&self.want, o))
    }

    async fn apply(&self, op: &Op, o: &mut Observed) -> Result<(), ApiError> {
        let call = self.sagemaker.update_cluster().cluster_name(&self.cluster);
        let mode = match op {
            Op::Enable(_) => ClusterAutoScalingMode::Enable,
            Op::Disable => ClusterAutoScalingMode::Disable,
        };
        let config = ClusterAutoScalingConfig::builder()
            .mode(mode)
            .auto_scaler_type(ClusterAutoScalerType::Karpenter)
            .build()
            .map_err(ApiError::internal)?;
        let call = match op {
            Op::Enable(role) => call.cluster_role(role),
            Op::Disable => call,
        };
        call.auto_scaling(config)
            .send()
            .await
            .upstream("sagemaker", "UpdateCluster")?;
        self.assume(op, o);
        // What HyperPod shows until the install or removal is over.
        o.status = Some(ClusterStatus::Updating);
        o.scaling = match op {
            Op::Enable(_) => Some(ClusterAutoScalingStatus::Creating),
            Op::Disable => Some(ClusterAutoScalingStatus::Deleting),
        };
        Ok(())
    }

    fn describe(&self, op: &Op, o: &Observed) -> Change {
        let shown = |on: bool| json!(if on { "Enable (Karpenter)" } else { "Disable" });
        let change = Change::new(Action::Update, KIND, &self.cluster).field(
            "auto_scaling",
            Some(shown(o.enabled)),
            Some(shown(matches!(op, Op::Enable(_)))),
        );
        match op {
            Op::Enable(role) if o.role.as_ref() != Some(role) => change.field(
                "cluster_role",
                o.role.as_ref().map(|r| json!(r)),
                Some(json!(role)),
            ),
            _ => change,
        }
    }

    fn assume(&self, op: &Op, o: &mut Observed) {
        match op {
            Op::Enable(role) => {
                o.enabled = true;
                o.role = Some(role.clone());
                o.scaling = Some(ClusterAutoScalingStatus::Inservice);
            }
            Op::Disable => {
                o.enabled = false;
                o.scaling = None;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_settled_cluster_is_sent_a_change_and_a_role_is_never_swapped() {
        let at = |status, enabled, scaling| Observed {
            status: Some(status),
            enabled,
            scaling,
            ..Observed::default()
        };
        let on = Want::Present("arn:aws:iam::1:role/r".to_owned());
        let ready = ClusterStatus::Inservice;
        assert_eq!(
            diff(&on, &at(ready.clone(), false, None)),
            [Op::Enable("arn:aws:iam::1:role/r".into())]
        );
        // Already on (whatever its role: the API refuses a change while it is on).
        let serving = Some(ClusterAutoScalingStatus::Inservice);
        assert!(diff(&on, &at(ready.clone(), true, serving.clone())).is_empty());
        assert!(diff(&on, &at(ClusterStatus::Updating, false, None)).is_empty());
        let removing = Some(ClusterAutoScalingStatus::Deleting);
        assert!(diff(&on, &at(ready.clone(), false, removing.clone())).is_empty());
        assert_eq!(
            diff(&Want::Absent, &at(ready.clone(), true, serving.clone())),
            [Op::Disable]
        );
        assert!(diff(&Want::Absent, &at(ready.clone(), false, None)).is_empty());
        assert_eq!(at(ready.clone(), true, serving).done(), Some(true));
        assert_eq!(at(ready.clone(), false, None).done(), Some(false));
        assert_eq!(at(ready, false, removing).done(), None);
    }
}
