//! An EKS Pod Identity association: a Kubernetes service account bound to an IAM role, so
//! a driver or operator gets the role's rights without node credentials. Made once per
//! service account; pointed at the right role again if someone changed it; deleted when
//! the feature that made it is turned off (whoever made it: the service account is the
//! feature's own).

use app::api::ApiError;
use app::api::plan::{Action, Change, KNOWN_AFTER_APPLY};
use serde_json::json;

use super::{Client, cluster_tags};
use crate::aws::SdkResultExt;
use crate::resources::{Resource, Want};

const KIND: &str = "eks:PodIdentityAssociation";

pub struct PodIdentity {
    pub eks: Client,
    pub cluster: String,
    pub namespace: String,
    pub service_account: String,
    /// Present: the role's ARN.
    pub want: Want<String>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Observed {
    pub association_id: Option<String>,
    pub role_arn: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Op {
    Create,
    UpdateRole,
    Delete,
}

/// The changes given what was found. Pure.
pub fn diff(want: &Want<String>, o: &Observed) -> Vec<Op> {
    match (want, &o.association_id, o.role_arn.as_deref()) {
        (Want::Present(_), None, _) => vec![Op::Create],
        (Want::Present(role_arn), Some(_), Some(r)) if r != role_arn => vec![Op::UpdateRole],
        (Want::Absent, Some(_), _) => vec![Op::Delete],
        _ => Vec::new(),
    }
}

impl Resource for PodIdentity {
    type Observed = Observed;
    type Op = Op;

    async fn observe(&self) -> Result<Observed, ApiError> {
        // Nothing is associated yet with a cluster the plan makes.
        if super::cluster::made_by_this_plan(&self.cluster) {
            return Ok(Observed::default());
        }
        let found = self
            .eks
            .list_pod_identity_associations()
            .cluster_name(&self.cluster)
            .namespace(&self.namespace)
            .service_account(&self.service_account)
            .send()
            .await
            .upstream("eks", "ListPodIdentityAssociations")?;
        let Some(id) = found
            .associations()
            .first()
            .and_then(|a| a.association_id())
        else {
            return Ok(Observed::default());
        };
        let described = self
            .eks
            .describe_pod_identity_association()
            .cluster_name(&self.cluster)
            .association_id(id)
            .send()
            .await
            .found("eks", "DescribePodIdentityAssociation")?;
        Ok(Observed {
            association_id: Some(id.to_owned()),
            role_arn: described
                .and_then(|d| d.association)
                .and_then(|a| a.role_arn),
        })
    }

    fn diff(&self, observed: &Observed) -> Result<Vec<Op>, ApiError> {
        Ok(diff(&self.want, observed))
    }

    async fn apply(&self, op: &Op, o: &mut Observed) -> Result<(), ApiError> {
        let role_arn = self.want.present().cloned().unwrap_or_default();
        match op {
            Op::Create => {
                let made = self
                    .eks
                    .create_pod_identity_association()
                    .cluster_name(&self.cluster)
                    .namespace(&self.namespace)
                    .service_account(&self.service_account)
                    .role_arn(&role_arn)
                    .set_tags(Some(cluster_tags(&self.cluster)))
                    .client_request_token(format!(
                        "hypd-{}-{}-{}",
                        self.cluster, self.namespace, self.service_account
                    ))
                    .send()
                    .await
                    .allowing(
                        "eks",
                        "CreatePodIdentityAssociation",
                        &["ResourceInUseException"],
                    )?;
                o.association_id = made
                    .and_then(|m| m.association)
                    .and_then(|a| a.association_id)
                    .or(Some(String::new()));
                o.role_arn = Some(role_arn);
            }
            Op::UpdateRole => {
                let id = o.association_id.clone().unwrap_or_default();
                self.eks
                    .update_pod_identity_association()
                    .cluster_name(&self.cluster)
                    .association_id(id)
                    .role_arn(&role_arn)
                    .send()
                    .await
                    .upstream("eks", "UpdatePodIdentityAssociation")?;
                o.role_arn = Some(role_arn);
            }
            Op::Delete => {
                let id = o.association_id.clone().unwrap_or_default();
                self.eks
                    .delete_pod_identity_association()
                    .cluster_name(&self.cluster)
                    .association_id(id)
                    .send()
                    .await
                    .found("eks", "DeletePodIdentityAssociation")?;
                *o = Observed::default();
            }
        }
        Ok(())
    }

    fn describe(&self, op: &Op, o: &Observed) -> Change {
        let name = format!("{}/{}", self.namespace, self.service_account);
        let wanted = self.want.present().map(|r| json!(r));
        match op {
            Op::Create => Change::new(Action::Create, KIND, name).field("role_arn", None, wanted),
            Op::UpdateRole => Change::new(Action::Update, KIND, name).field(
                "role_arn",
                o.role_arn.clone().map(|r| json!(r)),
                wanted,
            ),
            Op::Delete => Change::new(Action::Delete, KIND, name),
        }
    }
    fn assume(&self, op: &Op, o: &mut Observed) {
        match op {
            Op::Create => {
                o.association_id = Some(KNOWN_AFTER_APPLY.to_owned());
                o.role_arn = self.want.present().cloned();
            }
            Op::UpdateRole => o.role_arn = self.want.present().cloned(),
            Op::Delete => *o = Observed::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rebound_association_is_pointed_back() {
        let want = |r: &str| Want::Present(r.to_owned());
        assert_eq!(diff(&want("r1"), &Observed::default()), [Op::Create]);
        let o = Observed {
            association_id: Some("a-1".into()),
            role_arn: Some("r2".into()),
        };
        assert_eq!(diff(&want("r1"), &o), [Op::UpdateRole]);
        assert!(diff(&want("r2"), &o).is_empty());
        assert_eq!(diff(&Want::Absent, &o), [Op::Delete]);
        assert!(diff(&Want::Absent, &Observed::default()).is_empty());
    }
}
