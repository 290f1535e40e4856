//! One inline policy of a role hypd made, managed on its own: what a later change adds
//! to a role and takes away again (the access a mounted bucket gives the storage
//! driver), without restating the role's other policies. Only a role carrying hypd's
//! tags for the cluster is changed; another role is reported, not touched.

use app::api::ApiError;
use app::api::plan::{Action, Change};
use serde_json::Value;

use super::{Client, document, pairs};
use crate::aws::SdkResultExt;
use crate::resources::{Resource, Want, tags};

pub struct InlinePolicy {
    pub iam: Client,
    pub cluster: String,
    pub role: String,
    pub name: String,
    /// Present: the policy document.
    pub want: Want<Value>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Observed {
    pub role_exists: bool,
    /// The role carries hypd's tags for this cluster.
    pub ours: bool,
    pub document: Option<Value>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    Put,
    Delete,
}

/// The changes given what was found. Pure. A role that is not hypd's is left alone.
pub fn diff(want: &Want<Value>, o: &Observed) -> Vec<Op> {
    if !o.ours {
        return Vec::new();
    }
    match want {
        Want::Present(doc) if o.document.as_ref() != Some(doc) => vec![Op::Put],
        Want::Absent if o.document.is_some() => vec![Op::Delete],
        _ => Vec::new(),
    }
}

impl Resource for InlinePolicy {
    type Observed = Observed;
    type Op = Op;

    async fn observe(&self) -> Result<Observed, ApiError> {
        let Some(found) = self
            .iam
            .get_role()
            .role_name(&self.role)
            .send()
            .await
            .found("iam", "GetRole")?
        else {
            return Ok(Observed::default());
        };
        let ours = found
            .role()
            .is_some_and(|r| tags::belongs_to(pairs(r.tags()), &self.cluster));
        let document = self
            .iam
            .get_role_policy()
            .role_name(&self.role)
            .policy_name(&self.name)
            .send()
            .await
            .found("iam", "GetRolePolicy")?
            .map(|p| document(p.policy_document()));
        Ok(Observed {
            role_exists: true,
            ours,
            document,
        })
    }

    fn diff(&self, observed: &Observed) -> Result<Vec<Op>, ApiError> {
        Ok(diff(&self.want, observed))
    }

    async fn apply(&self, op: &Op, observed: &mut Observed) -> Result<(), ApiError> {
        match op {
            Op::Put => {
                let doc = self
                    .want
                    .present()
                    .cloned()
                    .ok_or_else(|| crate::resources::missing("the inline policy"))?;
                self.iam
                    .put_role_policy()
                    .role_name(&self.role)
                    .policy_name(&self.name)
                    .policy_document(doc.to_string())
                    .send()
                    .await
                    .upstream("iam", "PutRolePolicy")?;
                observed.document = Some(doc);
            }
            Op::Delete => {
                self.iam
                    .delete_role_policy()
                    .role_name(&self.role)
                    .policy_name(&self.name)
                    .send()
                    .await
                    .found("iam", "DeleteRolePolicy")?;
                observed.document = None;
            }
        }
        Ok(())
    }

    fn describe(&self, op: &Op, observed: &Observed) -> Change {
        let field = format!("inline_policies.{}", self.name);
        match op {
            Op::Put => Change::new(Action::Update, "iam:Role", &self.role).field(
                field,
                observed.document.clone(),
                self.want.present().cloned(),
            ),
            Op::Delete => Change::new(Action::Update, "iam:Role", &self.role).field(
                field,
                observed.document.clone(),
                None,
            ),
        }
    }

    fn assume(&self, op: &Op, observed: &mut Observed) {
        observed.document = match op {
            Op::Put => self.want.present().cloned(),
            Op::Delete => None,
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn only_a_role_of_hypds_is_changed() {
        let doc = json!({"Version": "2012-10-17"});
        let ours = Observed {
            role_exists: true,
            ours: true,
            document: None,
        };
        assert_eq!(diff(&Want::Present(doc.clone()), &ours), [Op::Put]);
        let theirs = Observed {
            ours: false,
            ..ours.clone()
        };
        assert!(diff(&Want::Present(doc.clone()), &theirs).is_empty());
        let there = Observed {
            document: Some(doc.clone()),
            ..ours
        };
        assert!(diff(&Want::Present(doc), &there).is_empty());
        assert_eq!(diff(&Want::Absent, &there), [Op::Delete]);
    }
}
