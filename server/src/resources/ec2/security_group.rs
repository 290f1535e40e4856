//! The cluster's EFA security group: all traffic within the group both ways (EFA needs an
//! explicit egress rule to the group itself besides the default allow-all egress), used by
//! the EKS control plane's interfaces and every HyperPod instance.

use app::api::ApiError;
use app::api::plan::{Action, Change, KNOWN_AFTER_APPLY};
use aws_sdk_ec2::types::{IpPermission, ResourceType, UserIdGroupPair};
use serde_json::json;

use super::{Client, filter, of_cluster, tags_for};
use crate::aws::SdkResultExt;
use crate::resources::{Listed, Resource, missing, shown};

const KIND: &str = "ec2:SecurityGroup";
const ROLE: &str = "efa-sg";

pub struct EfaSecurityGroup {
    pub ec2: Client,
    pub cluster: String,
    pub vpc_id: String,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Observed {
    pub id: Option<String>,
    pub self_ingress: bool,
    pub self_egress: bool,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Op {
    Create,
    AuthorizeSelfIngress,
    AuthorizeSelfEgress,
}

/// The changes given what was found. Pure.
pub fn diff(observed: &Observed) -> Vec<Op> {
    let mut ops = Vec::new();
    if observed.id.is_none() {
        ops.push(Op::Create);
    }
    if !observed.self_ingress {
        ops.push(Op::AuthorizeSelfIngress);
    }
    if !observed.self_egress {
        ops.push(Op::AuthorizeSelfEgress);
    }
    ops
}

impl EfaSecurityGroup {
    pub fn group_name(&self) -> String {
        format!("hypd-{}-efa", self.cluster)
    }
}

fn allows_self(perms: &[IpPermission], id: &str) -> bool {
    perms.iter().any(|p| {
        p.ip_protocol() == Some("-1")
            && p.user_id_group_pairs()
                .iter()
                .any(|u| u.group_id() == Some(id))
    })
}

impl Resource for EfaSecurityGroup {
    type Observed = Observed;
    type Op = Op;

    async fn observe(&self) -> Result<Observed, ApiError> {
        let out = self
            .ec2
            .describe_security_groups()
            .filters(filter("vpc-id", &self.vpc_id))
            .filters(filter("group-name", &self.group_name()))
            .send()
            .await
            .upstream("ec2", "DescribeSecurityGroups")?;
        Ok(match out.security_groups().first() {
            None => Observed::default(),
            Some(g) => {
                let id = g.group_id().unwrap_or_default();
                Observed {
                    self_ingress: allows_self(g.ip_permissions(), id),
                    self_egress: allows_self(g.ip_permissions_egress(), id),
                    id: Some(id.to_owned()),
                }
            }
        })
    }

    fn diff(&self, observed: &Observed) -> Result<Vec<Op>, ApiError> {
        Ok(diff(observed))
    }

    async fn apply(&self, op: &Op, observed: &mut Observed) -> Result<(), ApiError> {
        if let Op::Create = op {
            let out = self
                .ec2
                .create_security_group()
                .group_name(self.group_name())
                .description(format!(
                    "hypd {}: all traffic within the group (EFA), all egress",
                    self.cluster
                ))
                .vpc_id(&self.vpc_id)
                .tag_specifications(tags_for(
                    ResourceType::SecurityGroup,
                    &self.cluster,
                    ROLE,
                    &[],
                ))
                .send()
                .await
                .upstream("ec2", "CreateSecurityGroup")?;
            observed.id = Some(
                out.group_id()
                    .ok_or_else(|| {
                        ApiError::internal("CreateSecurityGroup answered without an id")
                    })?
                    .to_owned(),
            );
            return Ok(());
        }
        let id = observed
            .id
            .clone()
            .ok_or_else(|| missing("the security group"))?;
        let rule = IpPermission::builder()
            .ip_protocol("-1")
            .user_id_group_pairs(UserIdGroupPair::builder().group_id(&id).build())
            .build();
        const DUPLICATE: &[&str] = &["InvalidPermission.Duplicate"];
        match op {
            Op::Create => unreachable!("handled above"),
            Op::AuthorizeSelfIngress => {
                self.ec2
                    .authorize_security_group_ingress()
                    .group_id(&id)
                    .ip_permissions(rule)
                    .send()
                    .await
                    .allowing("ec2", "AuthorizeSecurityGroupIngress", DUPLICATE)?;
                observed.self_ingress = true;
            }
            Op::AuthorizeSelfEgress => {
                self.ec2
                    .authorize_security_group_egress()
                    .group_id(&id)
                    .ip_permissions(rule)
                    .send()
                    .await
                    .allowing("ec2", "AuthorizeSecurityGroupEgress", DUPLICATE)?;
                observed.self_egress = true;
            }
        }
        Ok(())
    }

    fn describe(&self, op: &Op, observed: &Observed) -> Change {
        let shown = shown(observed.id.as_deref(), || self.group_name());
        let rule = json!({"protocol": "all", "group": "itself"});
        match op {
            Op::Create => Change::new(Action::Create, KIND, self.group_name()).field(
                "group_id",
                None,
                Some(json!(KNOWN_AFTER_APPLY)),
            ),
            Op::AuthorizeSelfIngress => {
                Change::new(Action::Update, KIND, shown).field("ingress", None, Some(rule))
            }
            Op::AuthorizeSelfEgress => {
                Change::new(Action::Update, KIND, shown).field("egress", None, Some(rule))
            }
        }
    }
    fn assume(&self, op: &Op, observed: &mut Observed) {
        match op {
            Op::Create => observed.id = Some(KNOWN_AFTER_APPLY.to_owned()),
            Op::AuthorizeSelfIngress => observed.self_ingress = true,
            Op::AuthorizeSelfEgress => observed.self_egress = true,
        }
    }
}

/// Teardown: the cluster's security groups.
pub struct ClusterSecurityGroups {
    pub ec2: Client,
    pub cluster: String,
}

impl Listed for ClusterSecurityGroups {
    const KIND: &'static str = KIND;

    async fn list(&self) -> Result<Vec<String>, ApiError> {
        let out = self
            .ec2
            .describe_security_groups()
            .set_filters(Some(of_cluster(&self.cluster)))
            .send()
            .await
            .upstream("ec2", "DescribeSecurityGroups")?;
        Ok(out
            .security_groups()
            .iter()
            .filter_map(|g| g.group_id().map(str::to_owned))
            .collect())
    }

    async fn delete(&self, id: &str) -> Result<(), ApiError> {
        self.ec2
            .delete_security_group()
            .group_id(id)
            .send()
            .await
            .found("ec2", "DeleteSecurityGroup")?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_group_missing_its_egress_rule_gets_only_that() {
        let o = Observed {
            id: Some("sg-1".into()),
            self_ingress: true,
            self_egress: false,
        };
        assert_eq!(diff(&o), [Op::AuthorizeSelfEgress]);
        assert_eq!(diff(&Observed::default()).len(), 3);
    }
}
