//! An EKS access entry with the cluster-admin policy, for hypd's own principal. Access
//! entries need the API authentication mode: a CONFIG_MAP-only cluster is switched to
//! API_AND_CONFIG_MAP first, which keeps the aws-auth users it has. The entry hypd creates
//! carries hypd's tags; one that was there before is used but never deleted.

use app::api::ApiError;
use app::api::plan::{Action, Change};
use aws_sdk_eks::types::{
    AccessScope, AccessScopeType, AuthenticationMode, ClusterStatus, UpdateAccessConfigRequest,
};
use serde_json::json;

use super::{Client, cluster_tags};
use crate::aws::SdkResultExt;
use crate::resources::{Resource, Want, tags};

const KIND: &str = "eks:AccessEntry";
pub const CLUSTER_ADMIN_POLICY: &str =
    "arn:aws:eks::aws:cluster-access-policy/AmazonEKSClusterAdminPolicy";

pub struct AccessEntry {
    pub eks: Client,
    pub cluster: String,
    pub principal_arn: String,
    /// Present: with cluster-admin.
    pub want: Want<()>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Observed {
    pub authentication_mode: Option<AuthenticationMode>,
    /// The cluster is UPDATING (e.g. its authentication mode): wait before anything else.
    pub cluster_updating: bool,
    pub exists: bool,
    /// The entry carries hypd's tag.
    pub managed: bool,
    pub cluster_admin: bool,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Op {
    EnableAccessEntries,
    Create,
    AssociateClusterAdmin,
    Delete,
}

/// The changes for `want` given what was found. Pure.
pub fn diff(want: &Want<()>, o: &Observed) -> Vec<Op> {
    match want {
        Want::Present(()) => {
            if o.cluster_updating {
                return Vec::new();
            }
            if o.authentication_mode == Some(AuthenticationMode::ConfigMap) {
                return vec![Op::EnableAccessEntries];
            }
            let mut ops = Vec::new();
            if !o.exists {
                ops.push(Op::Create);
            }
            if !o.cluster_admin {
                ops.push(Op::AssociateClusterAdmin);
            }
            ops
        }
        Want::Absent if o.exists && o.managed => vec![Op::Delete],
        Want::Absent => Vec::new(),
    }
}

impl Observed {
    /// Access is not usable yet: the cluster is changing its authentication mode.
    pub fn waiting(&self) -> bool {
        self.cluster_updating || self.authentication_mode == Some(AuthenticationMode::ConfigMap)
    }
}

impl Resource for AccessEntry {
    type Observed = Observed;
    type Op = Op;

    async fn observe(&self) -> Result<Observed, ApiError> {
        let mut o = Observed::default();
        if self.want.present().is_some() {
            let c = super::cluster::describe(&self.eks, &self.cluster).await?;
            if c.is_none() && super::cluster::made_by_this_plan(&self.cluster) {
                // A plan's new cluster: API access mode, no entries yet.
                o.authentication_mode = Some(AuthenticationMode::ApiAndConfigMap);
                return Ok(o);
            }
            let c = c.ok_or_else(|| {
                ApiError::field(
                    "name",
                    format!("there is no EKS cluster named {}", self.cluster),
                )
            })?;
            o.authentication_mode = c.authentication_mode;
            o.cluster_updating = c.status == Some(ClusterStatus::Updating);
        }
        let found = self
            .eks
            .describe_access_entry()
            .cluster_name(&self.cluster)
            .principal_arn(&self.principal_arn)
            .send()
            .await
            .found("eks", "DescribeAccessEntry")?;
        let Some(entry) = found.and_then(|f| f.access_entry) else {
            return Ok(o);
        };
        o.exists = true;
        o.managed = tags::map_managed(entry.tags());
        if self.want.present().is_some() {
            let policies = self
                .eks
                .list_associated_access_policies()
                .cluster_name(&self.cluster)
                .principal_arn(&self.principal_arn)
                .send()
                .await
                .upstream("eks", "ListAssociatedAccessPolicies")?;
            o.cluster_admin = policies
                .associated_access_policies()
                .iter()
                .any(|p| p.policy_arn() == Some(CLUSTER_ADMIN_POLICY));
        }
        Ok(o)
    }

    fn diff(&self, observed: &Observed) -> Result<Vec<Op>, ApiError> {
        Ok(diff(&self.want, observed))
    }

    async fn apply(&self, op: &Op, o: &mut Observed) -> Result<(), ApiError> {
        match op {
            Op::EnableAccessEntries => {
                self.eks
                    .update_cluster_config()
                    .name(&self.cluster)
                    .access_config(
                        UpdateAccessConfigRequest::builder()
                            .authentication_mode(AuthenticationMode::ApiAndConfigMap)
                            .build(),
                    )
                    .send()
                    .await
                    .upstream("eks", "UpdateClusterConfig")?;
                o.cluster_updating = true;
            }
            Op::Create => {
                let made = self
                    .eks
                    .create_access_entry()
                    .cluster_name(&self.cluster)
                    .principal_arn(&self.principal_arn)
                    .set_tags(Some(cluster_tags(&self.cluster)))
                    .send()
                    .await
                    .allowing("eks", "CreateAccessEntry", &["ResourceInUseException"])?;
                o.exists = true;
                // A concurrent run made it; it carries the same tags.
                o.managed = made.is_some() || o.managed;
            }
            Op::AssociateClusterAdmin => {
                self.eks
                    .associate_access_policy()
                    .cluster_name(&self.cluster)
                    .principal_arn(&self.principal_arn)
                    .policy_arn(CLUSTER_ADMIN_POLICY)
                    .access_scope(
                        AccessScope::builder()
                            .r#type(AccessScopeType::Cluster)
                            .build(),
                    )
                    .send()
                    .await
                    .upstream("eks", "AssociateAccessPolicy")?;
                o.cluster_admin = true;
            }
            Op::Delete => {
                self.eks
                    .delete_access_entry()
                    .cluster_name(&self.cluster)
                    .principal_arn(&self.principal_arn)
                    .send()
                    .await
                    .found("eks", "DeleteAccessEntry")?;
                *o = Observed::default();
            }
        }
        Ok(())
    }

    fn describe(&self, op: &Op, o: &Observed) -> Change {
        match op {
            Op::EnableAccessEntries => Change::new(Action::Update, "eks:Cluster", &self.cluster)
                .field(
                    "authentication_mode",
                    o.authentication_mode.as_ref().map(|m| json!(m.as_str())),
                    Some(json!("API_AND_CONFIG_MAP")),
                ),
            Op::Create => Change::new(Action::Create, KIND, &self.principal_arn),
            Op::AssociateClusterAdmin => Change::new(Action::Update, KIND, &self.principal_arn)
                .field("access_policies", None, Some(json!(CLUSTER_ADMIN_POLICY))),
            Op::Delete => Change::new(Action::Delete, KIND, &self.principal_arn),
        }
    }
    fn assume(&self, op: &Op, o: &mut Observed) {
        match op {
            Op::EnableAccessEntries => {
                o.authentication_mode = Some(AuthenticationMode::ApiAndConfigMap)
            }
            Op::Create => {
                o.exists = true;
                o.managed = true;
            }
            Op::AssociateClusterAdmin => o.cluster_admin = true,
            Op::Delete => o.exists = false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_config_map_cluster_switches_mode_before_anything_else() {
        let o = Observed {
            authentication_mode: Some(AuthenticationMode::ConfigMap),
            ..Observed::default()
        };
        assert_eq!(diff(&Want::Present(()), &o), [Op::EnableAccessEntries]);
        let api = Observed {
            authentication_mode: Some(AuthenticationMode::ApiAndConfigMap),
            ..Observed::default()
        };
        assert_eq!(
            diff(&Want::Present(()), &api),
            [Op::Create, Op::AssociateClusterAdmin]
        );
        let found_unmanaged = Observed {
            exists: true,
            ..api
        };
        assert!(diff(&Want::Absent, &found_unmanaged).is_empty());
    }
}
