//! An EKS Pod Identity association: a Kubernetes service account bound to an IAM role, so
//! a driver or operator gets the role's rights without node credentials. Made once per
//! service account; pointed at the right role again if someone changed it.

use app::api::ApiError;
use app::api::plan::{Action, Change, KNOWN_AFTER_APPLY};
use serde_json::json;

use super::{Client, cluster_tags};
use crate::aws::SdkResultExt;
use crate::resources::Resource;

const KIND: &str = "eks:PodIdentityAssociation";

pub struct PodIdentity {
    pub eks: Client,
    pub cluster: String,
    pub namespace: String,
    pub service_account: String,
    pub role_arn: String,
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
}

/// The changes given what was found. Pure.
pub fn diff(role_arn: &str, o: &Observed) -> Vec<Op> {
    match (&o.association_id, o.role_arn.as_deref()) {
        (None, _) => vec![Op::Create],
        (Some(_), Some(r)) if r != role_arn => vec![Op::UpdateRole],
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
        Ok(diff(&self.role_arn, observed))
    }

    async fn apply(&self, op: &Op, o: &mut Observed) -> Result<(), ApiError> {
        match op {
            Op::Create => {
                let made = self
                    .eks
                    .create_pod_identity_association()
                    .cluster_name(&self.cluster)
                    .namespace(&self.namespace)
                    .service_account(&self.service_account)
                    .role_arn(&self.role_arn)
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
                o.role_arn = Some(self.role_arn.clone());
            }
            Op::UpdateRole => {
                let id = o.association_id.clone().unwrap_or_default();
                self.eks
                    .update_pod_identity_association()
                    .cluster_name(&self.cluster)
                    .association_id(id)
                    .role_arn(&self.role_arn)
                    .send()
                    .await
                    .upstream("eks", "UpdatePodIdentityAssociation")?;
                o.role_arn = Some(self.role_arn.clone());
            }
        }
        Ok(())
    }

    fn describe(&self, op: &Op, o: &Observed) -> Change {
        let name = format!("{}/{}", self.namespace, self.service_account);
        match op {
            Op::Create => Change::new(Action::Create, KIND, name).field(
                "role_arn",
                None,
                Some(json!(self.role_arn)),
            ),
            Op::UpdateRole => Change::new(Action::Update, KIND, name).field(
                "role_arn",
                o.role_arn.clone().map(|r| json!(r)),
                Some(json!(self.role_arn)),
            ),
        }
    }
    fn assume(&self, op: &Op, o: &mut Observed) {
        if let Op::Create = op {
            o.association_id = Some(KNOWN_AFTER_APPLY.to_owned());
        }
        o.role_arn = Some(self.role_arn.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rebound_association_is_pointed_back() {
        assert_eq!(diff("r1", &Observed::default()), [Op::Create]);
        let o = Observed {
            association_id: Some("a-1".into()),
            role_arn: Some("r2".into()),
        };
        assert_eq!(diff("r1", &o), [Op::UpdateRole]);
        assert!(diff("r2", &o).is_empty());
    }
}
