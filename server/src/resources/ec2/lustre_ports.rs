//! Lustre's ports within a security group someone else may own: TCP 988 and 1018–1023
//! from the group itself, which FSx for Lustre needs between its servers and the clients
//! in the group. Only the ranges no rule covers yet are added (a group allowing all
//! traffic within itself, as hypd's EFA group does, needs none), and nothing is ever
//! removed: other file systems may rely on them.

use std::ops::RangeInclusive;

use app::api::ApiError;
use app::api::plan::{Action, Change};
use aws_sdk_ec2::types::{IpPermission, UserIdGroupPair};
use serde_json::json;

use super::Client;
use crate::aws::SdkResultExt;
use crate::resources::{Resource, known_after_apply};

const KIND: &str = "ec2:SecurityGroup";

/// The TCP port ranges Lustre needs open within the group.
pub const LUSTRE_PORTS: [RangeInclusive<i32>; 2] = [988..=988, 1018..=1023];

pub struct LustrePorts {
    pub ec2: Client,
    pub group_id: String,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Observed {
    pub exists: bool,
    /// The ranges of [`LUSTRE_PORTS`] no ingress rule from the group itself covers.
    pub missing: Vec<RangeInclusive<i32>>,
    /// All traffic allowed within the group both ways (what EFA needs).
    pub all_within: bool,
}

/// Whether a rule from group `id` lets TCP `range` in. Pure.
fn covers(perms: &[IpPermission], id: &str, range: &RangeInclusive<i32>) -> bool {
    perms.iter().any(|p| {
        let from_itself = p
            .user_id_group_pairs()
            .iter()
            .any(|u| u.group_id() == Some(id));
        let ports = match p.ip_protocol() {
            Some("-1") => true,
            Some("tcp" | "6") => {
                p.from_port().is_some_and(|f| f <= *range.start())
                    && p.to_port().is_some_and(|t| t >= *range.end())
            }
            _ => false,
        };
        from_itself && ports
    })
}

/// All traffic from group `id` in `perms`.
pub(crate) fn allows_all_within(perms: &[IpPermission], id: &str) -> bool {
    perms.iter().any(|p| {
        p.ip_protocol() == Some("-1")
            && p.user_id_group_pairs()
                .iter()
                .any(|u| u.group_id() == Some(id))
    })
}

/// What the group lacks for Lustre (and EFA) given its rules. Pure.
pub fn lacking(ingress: &[IpPermission], egress: &[IpPermission], id: &str) -> Observed {
    Observed {
        exists: true,
        missing: LUSTRE_PORTS
            .iter()
            .filter(|r| !covers(ingress, id, r))
            .cloned()
            .collect(),
        all_within: allows_all_within(ingress, id) && allows_all_within(egress, id),
    }
}

fn ports(r: &RangeInclusive<i32>) -> String {
    if r.start() == r.end() {
        r.start().to_string()
    } else {
        format!("{}-{}", r.start(), r.end())
    }
}

impl Resource for LustrePorts {
    type Observed = Observed;
    /// One range to open.
    type Op = RangeInclusive<i32>;

    async fn observe(&self) -> Result<Observed, ApiError> {
        // A group this plan makes has hypd's all-traffic rule.
        if known_after_apply(&self.group_id) {
            return Ok(Observed {
                exists: true,
                missing: Vec::new(),
                all_within: true,
            });
        }
        let out = self
            .ec2
            .describe_security_groups()
            .group_ids(&self.group_id)
            .send()
            .await
            .found("ec2", "DescribeSecurityGroups")?;
        Ok(
            match out.as_ref().and_then(|o| o.security_groups().first()) {
                None => Observed::default(),
                Some(g) => lacking(
                    g.ip_permissions(),
                    g.ip_permissions_egress(),
                    &self.group_id,
                ),
            },
        )
    }

    fn diff(&self, observed: &Observed) -> Result<Vec<Self::Op>, ApiError> {
        if !observed.exists {
            return Err(ApiError::field(
                "security_group_id",
                format!("security group {} does not exist", self.group_id),
            ));
        }
        Ok(observed.missing.clone())
    }

    async fn apply(&self, op: &Self::Op, observed: &mut Observed) -> Result<(), ApiError> {
        let rule = IpPermission::builder()
            .ip_protocol("tcp")
            .from_port(*op.start())
            .to_port(*op.end())
            .user_id_group_pairs(
                UserIdGroupPair::builder()
                    .group_id(&self.group_id)
                    .description("FSx for Lustre (hypd)")
                    .build(),
            )
            .build();
        self.ec2
            .authorize_security_group_ingress()
            .group_id(&self.group_id)
            .ip_permissions(rule)
            .send()
            .await
            .allowing(
                "ec2",
                "AuthorizeSecurityGroupIngress",
                &["InvalidPermission.Duplicate"],
            )?;
        observed.missing.retain(|r| r != op);
        Ok(())
    }

    fn describe(&self, op: &Self::Op, _: &Observed) -> Change {
        Change::new(Action::Update, KIND, &self.group_id).field(
            "ingress",
            None,
            Some(json!({"protocol": "tcp", "ports": ports(op), "from": "the group itself"})),
        )
    }

    fn assume(&self, op: &Self::Op, observed: &mut Observed) {
        observed.missing.retain(|r| r != op);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(protocol: &str, from: i32, to: i32, group: &str) -> IpPermission {
        IpPermission::builder()
            .ip_protocol(protocol)
            .from_port(from)
            .to_port(to)
            .user_id_group_pairs(UserIdGroupPair::builder().group_id(group).build())
            .build()
    }

    #[test]
    fn only_the_ranges_no_rule_from_the_group_covers_are_opened() {
        // All traffic within the group (hypd's EFA group): nothing to add.
        let all = lacking(
            &[rule("-1", -1, -1, "sg-1")],
            &[rule("-1", -1, -1, "sg-1")],
            "sg-1",
        );
        assert!(all.missing.is_empty() && all.all_within);
        // 988 open, 1018–1023 not: only the second range.
        let some = lacking(&[rule("tcp", 988, 988, "sg-1")], &[], "sg-1");
        assert_eq!(some.missing, [1018..=1023]);
        assert!(!some.all_within);
        // A rule from another group does not count.
        let other = lacking(&[rule("tcp", 0, 65535, "sg-2")], &[], "sg-1");
        assert_eq!(other.missing.len(), 2);
        // One wide TCP rule covers both.
        assert!(
            lacking(&[rule("tcp", 900, 1100, "sg-1")], &[], "sg-1")
                .missing
                .is_empty()
        );
    }
}
