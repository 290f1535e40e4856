//! An IAM role hypd makes: its trust policy, the managed policies attached and its inline
//! policies. Present: whatever is missing or different is put right (a policy someone
//! else attached is left). Absent: a role carrying hypd's tags for the cluster is emptied
//! (IAM requires policies detached and deleted first) and deleted; a role of the same name
//! that hypd did not make is left alone.

use std::collections::BTreeMap;

use app::api::ApiError;
use app::api::plan::{Action, Change, KNOWN_AFTER_APPLY};
use serde_json::{Value, json};

use super::{Client, cluster_tags, document, pairs};
use crate::aws::SdkResultExt;
use crate::resources::{Resource, Want, missing, tags};

const KIND: &str = "iam:Role";

/// Who may assume the role.
#[derive(Clone, Debug, PartialEq)]
pub enum Trust {
    /// An AWS service principal, e.g. `eks.amazonaws.com`.
    Service(String),
    /// One Kubernetes service account of one cluster (IAM roles for service accounts):
    /// web identity tokens from the cluster's IAM OIDC provider whose subject is that
    /// account and whose audience is STS. Nothing else the provider signs is trusted.
    ServiceAccount {
        /// The IAM OIDC provider's ARN.
        provider_arn: String,
        /// The issuer without its scheme (`oidc.eks.<region>.amazonaws.com/id/<id>`), as
        /// IAM names the condition keys.
        issuer: String,
        namespace: String,
        name: String,
    },
    /// Service accounts whose subject matches `subject` (IAM's `StringLike`: `*` stands
    /// for any run, so one role can serve accounts made per model), audience STS; and an
    /// AWS service besides, if named (a role SageMaker also assumes for the workload).
    Workloads {
        provider_arn: String,
        issuer: String,
        /// `system:serviceaccount:<namespace>:<name>`, possibly with `*`.
        subject: String,
        service: Option<String>,
    },
}

impl Trust {
    pub fn document(&self) -> Value {
        match self {
            Trust::Service(service) => json!({
                "Version": "2012-10-17",
                "Statement": [{
                    "Effect": "Allow",
                    "Principal": { "Service": service },
                    "Action": ["sts:AssumeRole", "sts:TagSession"],
                }],
            }),
            Trust::ServiceAccount {
                provider_arn,
                issuer,
                namespace,
                name,
            } => {
                let issuer = issuer.trim_start_matches("https://");
                json!({
                    "Version": "2012-10-17",
                    "Statement": [{
                        "Effect": "Allow",
                        "Principal": { "Federated": provider_arn },
                        "Action": "sts:AssumeRoleWithWebIdentity",
                        "Condition": { "StringEquals": {
                            format!("{issuer}:sub"): format!("system:serviceaccount:{namespace}:{name}"),
                            format!("{issuer}:aud"): "sts.amazonaws.com",
                        }},
                    }],
                })
            }
            Trust::Workloads {
                provider_arn,
                issuer,
                subject,
                service,
            } => {
                let issuer = issuer.trim_start_matches("https://");
                let mut statements: Vec<Value> = service
                    .iter()
                    .map(|s| {
                        json!({
                            "Effect": "Allow",
                            "Principal": { "Service": s },
                            "Action": "sts:AssumeRole",
                        })
                    })
                    .collect();
                statements.push(json!({
                    "Effect": "Allow",
                    "Principal": { "Federated": provider_arn },
                    "Action": "sts:AssumeRoleWithWebIdentity",
                    "Condition": {
                        "StringEquals": { format!("{issuer}:aud"): "sts.amazonaws.com" },
                        "StringLike": { format!("{issuer}:sub"): subject },
                    },
                }));
                json!({ "Version": "2012-10-17", "Statement": statements })
            }
        }
    }

    fn describe(&self) -> String {
        match self {
            Trust::Service(s) => s.clone(),
            Trust::ServiceAccount {
                namespace, name, ..
            } => format!("service account {namespace}/{name} (OIDC)"),
            Trust::Workloads {
                subject, service, ..
            } => match service {
                Some(s) => format!("{subject} (OIDC) and {s}"),
                None => format!("{subject} (OIDC)"),
            },
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct RoleSpec {
    pub trust: Trust,
    /// ARNs of managed policies to attach.
    pub managed: Vec<String>,
    /// Inline policies by name.
    pub inline: BTreeMap<String, Value>,
}

pub struct Role {
    pub iam: Client,
    pub cluster: String,
    pub name: String,
    pub want: Want<RoleSpec>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Observed {
    pub arn: Option<String>,
    /// The role carries hypd's tags for this cluster.
    pub ours: bool,
    pub trust: Value,
    pub attached: Vec<String>,
    pub inline: BTreeMap<String, Value>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    Create,
    UpdateTrust,
    Attach(String),
    PutInline(String),
    Detach(String),
    DeleteInline(String),
    Delete,
}

/// The changes for `want` given what was found. Pure.
pub fn diff(want: &Want<RoleSpec>, observed: &Observed) -> Vec<Op> {
    match want {
        Want::Present(spec) => {
            let mut ops = Vec::new();
            if observed.arn.is_none() {
                ops.push(Op::Create);
            } else if observed.trust != spec.trust.document() {
                ops.push(Op::UpdateTrust);
            }
            ops.extend(
                spec.managed
                    .iter()
                    .filter(|p| !observed.attached.contains(p))
                    .cloned()
                    .map(Op::Attach),
            );
            ops.extend(
                spec.inline
                    .iter()
                    .filter(|(name, doc)| observed.inline.get(*name) != Some(doc))
                    .map(|(name, _)| Op::PutInline(name.clone())),
            );
            ops
        }
        Want::Absent if observed.arn.is_some() && observed.ours => {
            let mut ops: Vec<Op> = observed.attached.iter().cloned().map(Op::Detach).collect();
            ops.extend(observed.inline.keys().cloned().map(Op::DeleteInline));
            ops.push(Op::Delete);
            ops
        }
        Want::Absent => Vec::new(),
    }
}

impl Resource for Role {
    type Observed = Observed;
    type Op = Op;

    async fn observe(&self) -> Result<Observed, ApiError> {
        let Some(found) = self
            .iam
            .get_role()
            .role_name(&self.name)
            .send()
            .await
            .found("iam", "GetRole")?
        else {
            return Ok(Observed::default());
        };
        let Some(role) = found.role() else {
            return Ok(Observed::default());
        };
        let attached = self
            .iam
            .list_attached_role_policies()
            .role_name(&self.name)
            .send()
            .await
            .upstream("iam", "ListAttachedRolePolicies")?;
        let names = self
            .iam
            .list_role_policies()
            .role_name(&self.name)
            .send()
            .await
            .upstream("iam", "ListRolePolicies")?;
        let mut inline = BTreeMap::new();
        for name in names.policy_names() {
            if let Some(p) = self
                .iam
                .get_role_policy()
                .role_name(&self.name)
                .policy_name(name)
                .send()
                .await
                .found("iam", "GetRolePolicy")?
            {
                inline.insert(name.clone(), document(p.policy_document()));
            }
        }
        Ok(Observed {
            arn: Some(role.arn().to_owned()),
            ours: tags::belongs_to(pairs(role.tags()), &self.cluster),
            trust: role
                .assume_role_policy_document()
                .map(document)
                .unwrap_or(Value::Null),
            attached: attached
                .attached_policies()
                .iter()
                .filter_map(|p| p.policy_arn().map(str::to_owned))
                .collect(),
            inline,
        })
    }

    fn diff(&self, observed: &Observed) -> Result<Vec<Op>, ApiError> {
        Ok(diff(&self.want, observed))
    }

    async fn apply(&self, op: &Op, observed: &mut Observed) -> Result<(), ApiError> {
        let spec = || {
            self.want
                .present()
                .ok_or_else(|| missing("the role's spec"))
        };
        let name = self.name.as_str();
        match op {
            Op::Create => {
                let spec = spec()?;
                let trust = spec.trust.document();
                let made = self
                    .iam
                    .create_role()
                    .role_name(name)
                    .assume_role_policy_document(trust.to_string())
                    .description(format!(
                        "hypd: {} for cluster {}",
                        spec.trust.describe(),
                        self.cluster
                    ))
                    .set_tags(Some(cluster_tags(&self.cluster)))
                    .send()
                    .await
                    .allowing("iam", "CreateRole", &["EntityAlreadyExists"])?;
                let arn = match made.and_then(|m| m.role().map(|r| r.arn().to_owned())) {
                    Some(arn) => arn,
                    // Made by a concurrent run of the same step: read it back.
                    None => {
                        *observed = self.observe().await?;
                        return Ok(());
                    }
                };
                *observed = Observed {
                    arn: Some(arn),
                    ours: true,
                    trust,
                    ..Observed::default()
                };
            }
            Op::UpdateTrust => {
                let trust = spec()?.trust.document();
                self.iam
                    .update_assume_role_policy()
                    .role_name(name)
                    .policy_document(trust.to_string())
                    .send()
                    .await
                    .upstream("iam", "UpdateAssumeRolePolicy")?;
                observed.trust = trust;
            }
            Op::Attach(policy) => {
                self.iam
                    .attach_role_policy()
                    .role_name(name)
                    .policy_arn(policy)
                    .send()
                    .await
                    .upstream("iam", "AttachRolePolicy")?;
                observed.attached.push(policy.clone());
            }
            Op::PutInline(policy) => {
                let doc = spec()?
                    .inline
                    .get(policy)
                    .cloned()
                    .ok_or_else(|| missing("the inline policy"))?;
                self.iam
                    .put_role_policy()
                    .role_name(name)
                    .policy_name(policy)
                    .policy_document(doc.to_string())
                    .send()
                    .await
                    .upstream("iam", "PutRolePolicy")?;
                observed.inline.insert(policy.clone(), doc);
            }
            Op::Detach(policy) => {
                self.iam
                    .detach_role_policy()
                    .role_name(name)
                    .policy_arn(policy)
                    .send()
                    .await
                    .found("iam", "DetachRolePolicy")?;
                observed.attached.retain(|p| p != policy);
            }
            Op::DeleteInline(policy) => {
                self.iam
                    .delete_role_policy()
                    .role_name(name)
                    .policy_name(policy)
                    .send()
                    .await
                    .found("iam", "DeleteRolePolicy")?;
                observed.inline.remove(policy);
            }
            Op::Delete => {
                self.iam
                    .delete_role()
                    .role_name(name)
                    .send()
                    .await
                    .found("iam", "DeleteRole")?;
                *observed = Observed::default();
            }
        }
        Ok(())
    }

    fn describe(&self, op: &Op, observed: &Observed) -> Change {
        let change = |action| Change::new(action, KIND, &self.name);
        let trust = || self.want.present().map(|s| s.trust.document());
        match op {
            Op::Create => change(Action::Create).field("trust", None, trust()),
            Op::UpdateTrust => {
                change(Action::Update).field("trust", Some(observed.trust.clone()), trust())
            }
            Op::Attach(p) => change(Action::Update).field("managed_policies", None, Some(json!(p))),
            Op::Detach(p) => change(Action::Update).field("managed_policies", Some(json!(p)), None),
            Op::PutInline(p) => change(Action::Update).field(
                format!("inline_policies.{p}"),
                observed.inline.get(p).cloned(),
                self.want.present().and_then(|s| s.inline.get(p).cloned()),
            ),
            Op::DeleteInline(p) => change(Action::Update).field(
                format!("inline_policies.{p}"),
                observed.inline.get(p).cloned(),
                None,
            ),
            Op::Delete => change(Action::Delete),
        }
    }
    fn assume(&self, op: &Op, observed: &mut Observed) {
        let spec = self.want.present();
        match op {
            Op::Create => {
                *observed = Observed {
                    arn: Some(KNOWN_AFTER_APPLY.to_owned()),
                    ours: true,
                    trust: spec.map(|s| s.trust.document()).unwrap_or_default(),
                    ..Observed::default()
                }
            }
            Op::UpdateTrust => {
                observed.trust = spec.map(|s| s.trust.document()).unwrap_or_default()
            }
            Op::Attach(policy) => observed.attached.push(policy.clone()),
            Op::PutInline(policy) => {
                let doc = spec.and_then(|s| s.inline.get(policy)).cloned();
                observed
                    .inline
                    .insert(policy.clone(), doc.unwrap_or_default());
            }
            Op::Detach(policy) => observed.attached.retain(|p| p != policy),
            Op::DeleteInline(policy) => {
                observed.inline.remove(policy);
            }
            Op::Delete => *observed = Observed::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> RoleSpec {
        RoleSpec {
            trust: Trust::Service("eks.amazonaws.com".into()),
            managed: vec!["arn:aws:iam::aws:policy/A".into()],
            inline: BTreeMap::from([("p".to_owned(), json!({"Version": "2012-10-17"}))]),
        }
    }

    #[test]
    fn a_service_account_role_trusts_that_account_only() {
        let trust = Trust::ServiceAccount {
            provider_arn: "arn:aws:iam::1:oidc-provider/oidc.eks.us-east-1.amazonaws.com/id/AB"
                .into(),
            issuer: "https://oidc.eks.us-east-1.amazonaws.com/id/AB".into(),
            namespace: "aws-hyperpod".into(),
            name: "checkpointing".into(),
        };
        let doc = trust.document();
        let statement = &doc["Statement"][0];
        assert_eq!(statement["Action"], "sts:AssumeRoleWithWebIdentity");
        assert_eq!(
            statement["Principal"]["Federated"],
            "arn:aws:iam::1:oidc-provider/oidc.eks.us-east-1.amazonaws.com/id/AB"
        );
        assert_eq!(
            statement["Condition"]["StringEquals"],
            json!({
                "oidc.eks.us-east-1.amazonaws.com/id/AB:sub": "system:serviceaccount:aws-hyperpod:checkpointing",
                "oidc.eks.us-east-1.amazonaws.com/id/AB:aud": "sts.amazonaws.com",
            })
        );
    }

    #[test]
    fn a_workloads_role_matches_its_subject_pattern_and_names_its_service() {
        let trust = Trust::Workloads {
            provider_arn: "arn:aws:iam::1:oidc-provider/oidc.eks.us-east-1.amazonaws.com/id/AB"
                .into(),
            issuer: "oidc.eks.us-east-1.amazonaws.com/id/AB".into(),
            subject: "system:serviceaccount:*:model-*".into(),
            service: Some("sagemaker.amazonaws.com".into()),
        };
        let doc = trust.document();
        assert_eq!(
            doc["Statement"][0],
            json!({"Effect": "Allow", "Principal": {"Service": "sagemaker.amazonaws.com"},
                   "Action": "sts:AssumeRole"})
        );
        let federated = &doc["Statement"][1];
        assert_eq!(
            federated["Condition"],
            json!({
                "StringEquals": {"oidc.eks.us-east-1.amazonaws.com/id/AB:aud": "sts.amazonaws.com"},
                "StringLike": {"oidc.eks.us-east-1.amazonaws.com/id/AB:sub": "system:serviceaccount:*:model-*"},
            })
        );
        // Without a service, the web identity statement is the only one.
        let alone = Trust::Workloads {
            provider_arn: "arn:aws:iam::1:oidc-provider/x".into(),
            issuer: "x".into(),
            subject: "system:serviceaccount:a:b".into(),
            service: None,
        };
        assert_eq!(alone.document()["Statement"].as_array().unwrap().len(), 1);
    }

    #[test]
    fn only_what_differs_is_changed() {
        let want = Want::Present(spec());
        assert_eq!(
            diff(&want, &Observed::default()),
            [
                Op::Create,
                Op::Attach("arn:aws:iam::aws:policy/A".into()),
                Op::PutInline("p".into())
            ]
        );
        let made = Observed {
            arn: Some("arn:aws:iam::1:role/r".into()),
            ours: true,
            trust: spec().trust.document(),
            attached: spec().managed,
            inline: spec().inline,
        };
        assert!(diff(&want, &made).is_empty());
        let edited = Observed {
            inline: BTreeMap::new(),
            attached: vec![],
            ..made.clone()
        };
        assert_eq!(
            diff(&want, &edited),
            [
                Op::Attach("arn:aws:iam::aws:policy/A".into()),
                Op::PutInline("p".into())
            ]
        );
        assert_eq!(
            diff(&Want::Absent, &made),
            [
                Op::Detach("arn:aws:iam::aws:policy/A".into()),
                Op::DeleteInline("p".into()),
                Op::Delete
            ]
        );
        let theirs = Observed {
            ours: false,
            ..made
        };
        assert!(diff(&Want::Absent, &theirs).is_empty());
    }
}
