//! Managed Karpenter autoscaling: HyperPod runs Karpenter for the cluster and adds or
//! removes nodes of the instance groups a HyperpodNodeClass names when pods are pending
//! (it scales those groups only, never other EC2 capacity). Its parts are exactly: an IAM
//! cluster role trusted by HyperPod, allowed to add and delete nodes of this one cluster;
//! `AutoScaling` Enable with that `ClusterRole`, waited for until InService (Karpenter's
//! CRDs are served only then); a HyperpodNodeClass naming the groups and a NodePool on
//! it, both by server-side apply, waited for until the class is Ready. Off: pool and
//! class first (nothing asks for nodes any more), then the setting, then the role.
//! HyperPod keeps the cluster's `ClusterRole` field after a Disable (the API has no way
//! to clear it) and its CRDs, which are HyperPod's, not hypd's.

use std::collections::BTreeMap;

use app::api::ApiError;
use app::api::features::{Feature, FeatureState, MAX_AUTOSCALED_GROUPS};
use app::api::values::InstanceGroupName;
use aws_sdk_sagemaker::operation::describe_cluster::DescribeClusterOutput;
use aws_sdk_sagemaker::types::ClusterAutoScalingStatus;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::{Value, json};

use crate::aws::{Aws, failed_state};
use crate::cluster::managed::Where;
use crate::operation::pipeline::Progress;
use crate::resources::iam::role::{Role, RoleSpec, Trust};
use crate::resources::kube::karpenter::{HyperpodNodeClass, NodePool, condition};
use crate::resources::kube::kind_not_served;
use crate::resources::kube::object::Applied;
use crate::resources::sagemaker::autoscaling::{self, AutoScaling};
use crate::resources::{Resource, Want, converge, is_planning, missing, plan, tags};

/// The service HyperPod assumes the cluster role as.
pub const HYPERPOD_SERVICE: &str = "hyperpod.sagemaker.amazonaws.com";
/// The role's `role_name` suffix; the names of roles already made depend on it.
pub(super) const ROLE_SUFFIX: &str = "autoscaling";
const POLICY_NAME: &str = "hypd-hyperpod-autoscaling";
/// The name of hypd's HyperpodNodeClass and NodePool.
pub const NAME: &str = "hypd";
/// How long a node Karpenter added may sit without workload pods before it is removed:
/// long enough that a job's next step reuses a GPU node instead of waiting for a new one.
pub const CONSOLIDATE_AFTER: &str = "10m";

use super::POLL;

/// What HyperPod may do as the cluster role: add and delete nodes of this cluster only
/// (AWS's guide allows every cluster; one is all hypd's role needs).
pub fn policy(cluster_arn: &str) -> Value {
    json!({
        "Version": "2012-10-17",
        "Statement": [{
            "Effect": "Allow",
            "Action": ["sagemaker:BatchAddClusterNodes", "sagemaker:BatchDeleteClusterNodes"],
            "Resource": cluster_arn,
        }],
    })
}

/// An instance group as autoscaling sees it: why it cannot be scaled, if it cannot.
struct Group {
    name: String,
    unsupported: Option<&'static str>,
}

/// The instance groups a node class names.
fn class_groups(class: &HyperpodNodeClass) -> impl Iterator<Item = &str> {
    class.spec["instanceGroups"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
}

/// Autoscaling's parts on one cluster, from one DescribeCluster of it.
pub(crate) struct Autoscaling<'a> {
    aws: &'a Aws,
    at: &'a Where,
    role_arn: String,
    cluster_arn: String,
    groups: Vec<Group>,
    setting: autoscaling::Observed,
    /// Its EKS cluster's API, connected on first use (a connection is an EKS
    /// DescribeCluster and a signed token).
    client: tokio::sync::OnceCell<kube::Client>,
}

impl<'a> Autoscaling<'a> {
    pub(crate) async fn new(aws: &'a Aws, at: &'a Where) -> Result<Self, ApiError> {
        Self::described(aws, at, &super::hyperpod(aws, at).await?).await
    }

    /// From a DescribeCluster the caller already made.
    pub(crate) async fn described(
        aws: &'a Aws,
        at: &'a Where,
        d: &DescribeClusterOutput,
    ) -> Result<Self, ApiError> {
        let groups = d
            .instance_groups()
            .iter()
            .map(|g| Group {
                name: g.instance_group_name().unwrap_or_default().to_owned(),
                // AWS's guide: on-demand capacity only, and no deep health checks (they
                // hold new nodes, and the pods waiting for them, for an hour).
                unsupported: if g.training_plan_arn().is_some() {
                    Some("runs on a training plan; autoscaling scales on-demand capacity only")
                } else if !g.on_start_deep_health_checks().is_empty() {
                    Some("runs deep health checks, which autoscaling does not support")
                } else {
                    None
                },
            })
            .collect();
        Ok(Autoscaling {
            aws,
            at,
            role_arn: super::role_arn(aws, &at.eks, ROLE_SUFFIX).await?,
            cluster_arn: d.cluster_arn().unwrap_or_default().to_owned(),
            groups,
            setting: autoscaling::Observed::from(d),
            client: tokio::sync::OnceCell::new(),
        })
    }

    /// The groups the node class names: those `asked` (each must exist and be one
    /// autoscaling supports); else, when it is on already, those it scales now (a request
    /// that does not name groups leaves them as they are); else every group it supports.
    pub(crate) async fn groups(
        &self,
        asked: Option<&[InstanceGroupName]>,
    ) -> Result<Vec<InstanceGroupName>, ApiError> {
        let field = "autoscaling_groups";
        if asked.is_none() && self.setting.enabled {
            let client = self.client().await?;
            if let Some(class) = Self::live_class(client).await? {
                let now: Vec<InstanceGroupName> = class_groups(&class)
                    .filter_map(|g| InstanceGroupName::parse(g).ok())
                    .collect();
                if !now.is_empty() {
                    return Ok(now);
                }
            }
        }
        if let Some(asked) = asked {
            for (i, name) in asked.iter().enumerate() {
                let at = format!("{field}[{i}]");
                match self.groups.iter().find(|g| g.name == name.as_str()) {
                    None => {
                        return Err(ApiError::field(
                            at,
                            format!(
                                "HyperPod cluster {} has no instance group {name}",
                                self.at.hyperpod
                            ),
                        ));
                    }
                    Some(Group {
                        unsupported: Some(why),
                        ..
                    }) => {
                        return Err(ApiError::field(at, format!("instance group {name} {why}")));
                    }
                    Some(_) => {}
                }
            }
            return Ok(asked.to_vec());
        }
        let supported: Vec<InstanceGroupName> = self
            .groups
            .iter()
            .filter(|g| g.unsupported.is_none())
            .filter_map(|g| InstanceGroupName::parse(&g.name).ok())
            .collect();
        if supported.is_empty() {
            let why: Vec<String> = self
                .groups
                .iter()
                .filter_map(|g| g.unsupported.map(|w| format!("{} {w}", g.name)))
                .collect();
            return Err(ApiError::field(
                Feature::Autoscaling.as_str(),
                format!(
                    "no instance group of {} can be autoscaled ({}); add one without deep health checks on on-demand capacity",
                    self.at.hyperpod,
                    why.join("; ")
                ),
            ));
        }
        if supported.len() > MAX_AUTOSCALED_GROUPS {
            return Err(ApiError::field(
                field,
                format!(
                    "{} has {} groups autoscaling supports and a node class names at most {MAX_AUTOSCALED_GROUPS}: name them",
                    self.at.hyperpod,
                    supported.len()
                ),
            ));
        }
        Ok(supported)
    }

    fn role(&self, on: bool) -> Role {
        let want = if on {
            Want::Present(RoleSpec {
                trust: Trust::Service(HYPERPOD_SERVICE.to_owned()),
                managed: Vec::new(),
                inline: BTreeMap::from([(POLICY_NAME.to_owned(), policy(&self.cluster_arn))]),
            })
        } else {
            Want::Absent
        };
        super::role(self.aws, &self.at.region, &self.at.eks, ROLE_SUFFIX, want)
    }

    fn setting(&self, on: bool) -> AutoScaling {
        AutoScaling {
            sagemaker: self.aws.sagemaker(&self.at.region),
            cluster: self.at.hyperpod.clone(),
            want: if on {
                Want::Present(self.role_arn.clone())
            } else {
                Want::Absent
            },
        }
    }

    fn metadata() -> ObjectMeta {
        ObjectMeta {
            name: Some(NAME.to_owned()),
            labels: Some(
                [(tags::K8S_MANAGED_BY.0, tags::K8S_MANAGED_BY.1)]
                    .map(|(k, v)| (k.to_owned(), v.to_owned()))
                    .into(),
            ),
            ..ObjectMeta::default()
        }
    }

    /// The node class naming `groups` (`None`: wanted gone).
    fn class(
        client: &kube::Client,
        groups: Option<&[InstanceGroupName]>,
    ) -> Applied<HyperpodNodeClass> {
        let names: Vec<&str> = groups
            .unwrap_or_default()
            .iter()
            .map(|g| g.as_str())
            .collect();
        let object = HyperpodNodeClass::new(Self::metadata(), json!({ "instanceGroups": names }));
        let applied = Applied::cluster(client, object);
        if groups.is_some() {
            applied
        } else {
            applied.absent()
        }
    }

    /// hypd's node class as it is now.
    async fn live_class(client: &kube::Client) -> Result<Option<HyperpodNodeClass>, ApiError> {
        Self::class(client, Some(&[])).observe().await
    }

    /// The NodePool on hypd's node class: any pending pod its groups can take, their
    /// nodes removed once empty for [`CONSOLIDATE_AFTER`].
    fn pool(client: &kube::Client, on: bool) -> Applied<NodePool> {
        let object = NodePool::new(
            Self::metadata(),
            json!({
                "template": {"spec": {
                    "nodeClassRef": {
                        "group": HyperpodNodeClass::GROUP,
                        "kind": HyperpodNodeClass::KIND,
                        "name": NAME,
                    },
                    "requirements": [
                        {"key": "node.kubernetes.io/instance-type", "operator": "Exists"},
                    ],
                }},
                "disruption": {
                    "consolidationPolicy": "WhenEmpty",
                    "consolidateAfter": CONSOLIDATE_AFTER,
                },
            }),
        );
        let applied = Applied::cluster(client, object);
        if on { applied } else { applied.absent() }
    }

    async fn client(&self) -> Result<&kube::Client, ApiError> {
        self.client
            .get_or_try_init(|| {
                crate::resources::kube::connect(self.aws, &self.at.region, &self.at.eks)
            })
            .await
    }

    /// Whether it already stands as asked: the setting settled that way and the role,
    /// class (with `groups`) and pool needing no change.
    pub(crate) async fn holds(
        &self,
        on: bool,
        groups: Option<&[InstanceGroupName]>,
    ) -> Result<bool, ApiError> {
        if self.setting.done() != Some(on) || !plan(&self.role(on)).await?.is_empty() {
            return Ok(false);
        }
        let client = self.client().await?;
        Ok(plan(&Self::class(client, groups.filter(|_| on)))
            .await?
            .is_empty()
            && plan(&Self::pool(client, on)).await?.is_empty())
    }

    /// One step towards `on` (scaling `groups`).
    pub(crate) async fn step(
        &self,
        on: bool,
        groups: Option<&[InstanceGroupName]>,
    ) -> Result<Progress, ApiError> {
        if on {
            let groups = groups.ok_or_else(|| missing("the groups to autoscale"))?;
            converge(&self.role(true))
                .await?
                .arn
                .ok_or_else(|| missing("the autoscaling cluster role"))?;
            let now = converge(&self.setting(true)).await?;
            if now.scaling == Some(ClusterAutoScalingStatus::Failed) {
                return Err(failed_state(
                    "sagemaker",
                    "DescribeCluster",
                    Some("Failed"),
                    format!(
                        "autoscaling on HyperPod cluster {} failed: {}",
                        self.at.hyperpod,
                        now.failure.as_deref().unwrap_or("no reason given")
                    ),
                ));
            }
            if now.done() != Some(true) {
                return Ok(self.wait(&now, "installing managed Karpenter"));
            }
            let client = self.client().await?;
            let applied = async {
                converge(&Self::class(client, Some(groups))).await?;
                converge(&Self::pool(client, true)).await
            };
            match applied.await {
                Err(e) if kind_not_served(&e) => {
                    return Ok(Progress::wait(
                        POLL,
                        "waiting for the API server to serve managed Karpenter's \
                         HyperpodNodeClass and NodePool",
                    ));
                }
                other => drop(other?),
            }
            if is_planning() {
                return Ok(Progress::Done);
            }
            return self.class_ready(client).await;
        }
        let client = self.client().await?;
        converge(&Self::pool(client, false)).await?;
        converge(&Self::class(client, None)).await?;
        let now = converge(&self.setting(false)).await?;
        if now.done() != Some(false) {
            return Ok(self.wait(&now, "removing managed Karpenter"));
        }
        converge(&self.role(false)).await?;
        Ok(Progress::Done)
    }

    fn wait(&self, now: &autoscaling::Observed, doing: &str) -> Progress {
        Progress::wait(
            POLL,
            format!(
                "HyperPod cluster {} is {}, autoscaling {}: {doing}",
                self.at.hyperpod,
                now.status
                    .as_ref()
                    .map_or("in an unknown state", |s| s.as_str()),
                now.scaling.as_ref().map_or("off", |s| s.as_str()),
            ),
        )
    }

    /// Done once HyperPod says the class is Ready; a group it refuses fails the stage
    /// (no wait makes it Ready).
    async fn class_ready(&self, client: &kube::Client) -> Result<Progress, ApiError> {
        let class = Self::live_class(client).await?;
        let status = class
            .as_ref()
            .and_then(HyperpodNodeClass::current_status)
            .cloned()
            .unwrap_or_default();
        if let Some(("False", why)) = condition(&status, "InstanceGroupReady") {
            return Err(failed_state(
                "kubernetes",
                "get HyperpodNodeClass",
                Some("InstanceGroupReady=False"),
                format!("HyperpodNodeClass {NAME}: {why}"),
            ));
        }
        Ok(Progress::unless(
            POLL,
            (condition(&status, "Ready").map(|(s, _)| s) != Some("True"))
                .then(|| format!("waiting for HyperpodNodeClass {NAME} to be Ready")),
        ))
    }

    /// How it stands now, for get_features.
    pub(crate) async fn state(&self) -> Result<FeatureState, ApiError> {
        let s = &self.setting;
        let mut f = super::feature(
            Feature::Autoscaling,
            s.enabled,
            match (&s.enabled, &s.scaling) {
                (true, Some(st)) => format!("Enable ({})", st.as_str()),
                (true, None) => "Enable".to_owned(),
                (false, Some(st)) => format!("Disable ({})", st.as_str()),
                (false, None) => "Disable".to_owned(),
            },
            None,
        );
        if let Some(why) = &s.failure {
            f.details.push(why.clone());
        }
        if !s.enabled {
            return Ok(f);
        }
        if let Some(role) = &s.role {
            f.details.push(format!("cluster role {role}"));
        }
        if s.scaling != Some(ClusterAutoScalingStatus::Inservice) {
            return Ok(f);
        }
        let client = self.client().await?;
        match Self::live_class(client).await? {
            None => f.details.push(format!(
                "no HyperpodNodeClass {NAME}: no instance group is scaled"
            )),
            Some(class) => {
                let groups: Vec<&str> = class_groups(&class).collect();
                f.details
                    .push(format!("scales instance groups {}", groups.join(", ")));
                match condition(&class.status, "Ready") {
                    Some(("True", _)) => f.details.push("node class Ready".to_owned()),
                    Some((_, why)) => f.details.push(format!("node class not Ready: {why}")),
                    None => f.details.push("node class not Ready yet".to_owned()),
                }
            }
        }
        if Self::pool(client, true).observe().await?.is_none() {
            f.details
                .push(format!("no NodePool {NAME}: no pending pod adds nodes"));
        }
        Ok(f)
    }
}
