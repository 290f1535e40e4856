//! Subnets hypd carves out of a cluster's VPC: the first free aligned block of the asked
//! size, in the asked AZ. A compute subnet may be shared: one that hypd made in the same
//! VPC and AZ for any cluster is used rather than carving another /20 out of the VPC.

use app::api::ApiError;
use app::api::plan::{Action, Change, KNOWN_AFTER_APPLY};
use app::api::values::Cidr;
use aws_sdk_ec2::types::ResourceType;
use serde_json::json;

use super::{Client, filter, free_block, has_tag, name, of_cluster, tags_for};
use crate::aws::SdkResultExt;
use crate::resources::{Listed, Resource, assume_made, known_after_apply, made_in_plan, tags};

const KIND: &str = "ec2:Subnet";
/// The role tag of compute subnets, which clusters of one VPC may share.
pub const COMPUTE_ROLE: &str = "compute";

#[derive(Clone, Debug, PartialEq)]
pub struct SubnetSpec {
    pub cluster: String,
    /// `public-1`, `private-2`, `compute`, …
    pub role: String,
    pub vpc_id: String,
    pub vpc_cidr: Cidr,
    pub availability_zone: String,
    pub prefix: u8,
    pub extra_tags: Vec<(String, String)>,
    /// Use a subnet of the same role that hypd made in this VPC and AZ for any cluster,
    /// if one is at least this large.
    pub shared: bool,
    /// Free addresses the subnet must have: a subnet of the role with fewer is passed
    /// over, and the next free block is carved instead.
    pub room: u32,
}

pub struct Subnet {
    pub ec2: Client,
    pub spec: SubnetSpec,
}

#[derive(Clone, Debug, PartialEq)]
pub struct SubnetState {
    pub id: String,
    pub cidr: Option<Cidr>,
}

#[derive(Debug, Default)]
pub struct Observed {
    pub subnet: Option<SubnetState>,
    /// Every block of the VPC already used by a subnet.
    pub used: Vec<Cidr>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    Create(Cidr),
}

/// Every subnet of `vpc_id`.
async fn subnets_of(
    ec2: &Client,
    vpc_id: &str,
) -> Result<Vec<aws_sdk_ec2::types::Subnet>, ApiError> {
    if known_after_apply(vpc_id) {
        return Ok(Vec::new());
    }
    let out = ec2
        .describe_subnets()
        .filters(filter("vpc-id", vpc_id))
        .send()
        .await
        .upstream("ec2", "DescribeSubnets")?;
    Ok(out.subnets().to_vec())
}

/// The compute subnets tagged as `cluster`'s in `vpc_id`.
pub async fn compute_subnets_of(
    ec2: &Client,
    cluster: &str,
    vpc_id: &str,
) -> Result<Vec<String>, ApiError> {
    Ok(subnets_of(ec2, vpc_id)
        .await?
        .iter()
        .filter(|s| {
            has_tag(s.tags(), tags::CLUSTER, cluster) && has_tag(s.tags(), tags::ROLE, COMPUTE_ROLE)
        })
        .filter_map(|s| s.subnet_id().map(str::to_owned))
        .collect())
}

/// Subnet `id`'s free addresses and zone, if it exists.
pub async fn free_addresses(ec2: &Client, id: &str) -> Result<Option<(i64, String)>, ApiError> {
    let out = ec2
        .describe_subnets()
        .filters(filter("subnet-id", id))
        .send()
        .await
        .upstream("ec2", "DescribeSubnets")?;
    Ok(out.subnets().first().map(|s| {
        (
            s.available_ip_address_count().map_or(i64::MAX, i64::from),
            s.availability_zone().unwrap_or_default().to_owned(),
        )
    }))
}

fn cidr_of(s: &aws_sdk_ec2::types::Subnet) -> Option<Cidr> {
    s.cidr_block().and_then(|c| Cidr::parse(c).ok())
}

/// The subnet `spec` names among `subnets`: its own by tags, else (when shared) one of
/// the same role, VPC and AZ that hypd made for any cluster and is large enough.
fn pick(spec: &SubnetSpec, subnets: &[aws_sdk_ec2::types::Subnet]) -> Option<SubnetState> {
    let roomy = |s: &aws_sdk_ec2::types::Subnet| {
        s.available_ip_address_count()
            .is_none_or(|n| i64::from(n) >= i64::from(spec.room))
    };
    let in_zone = |s: &aws_sdk_ec2::types::Subnet| {
        s.availability_zone() == Some(spec.availability_zone.as_str())
    };
    let own = subnets.iter().find(|s| {
        has_tag(s.tags(), tags::CLUSTER, &spec.cluster)
            && has_tag(s.tags(), tags::ROLE, &spec.role)
            && in_zone(s)
            && roomy(s)
    });
    let shared = || {
        subnets.iter().find(|s| {
            spec.shared
                && in_zone(s)
                && roomy(s)
                && has_tag(s.tags(), tags::MANAGED, "true")
                && has_tag(s.tags(), tags::ROLE, &spec.role)
                && cidr_of(s).is_some_and(|c| c.prefix() <= spec.prefix)
        })
    };
    own.or_else(shared).map(|s| SubnetState {
        id: s.subnet_id().unwrap_or_default().to_owned(),
        cidr: cidr_of(s),
    })
}

/// The changes for `spec` given what was found. Pure.
pub fn diff(spec: &SubnetSpec, observed: &Observed) -> Result<Vec<Op>, ApiError> {
    if observed.subnet.is_some() {
        return Ok(Vec::new());
    }
    let block = free_block(spec.vpc_cidr, &observed.used, spec.prefix).ok_or_else(|| {
        ApiError::field(
            "network.vpc_id",
            format!(
                "{} ({}) has no free /{} left for the {} subnet",
                spec.vpc_id, spec.vpc_cidr, spec.prefix, spec.role
            ),
        )
    })?;
    Ok(vec![Op::Create(block)])
}

impl Resource for Subnet {
    type Observed = Observed;
    type Op = Op;

    async fn observe(&self) -> Result<Observed, ApiError> {
        let subnets = subnets_of(&self.ec2, &self.spec.vpc_id).await?;
        // In a plan, the blocks of the subnets it already made are taken too.
        let planned = made_in_plan(KIND, &self.spec.vpc_id);
        Ok(Observed {
            subnet: pick(&self.spec, &subnets),
            used: subnets
                .iter()
                .filter_map(cidr_of)
                .chain(planned.iter().filter_map(|c| Cidr::parse(c).ok()))
                .collect(),
        })
    }

    fn diff(&self, observed: &Observed) -> Result<Vec<Op>, ApiError> {
        diff(&self.spec, observed)
    }

    async fn apply(&self, op: &Op, observed: &mut Observed) -> Result<(), ApiError> {
        let Op::Create(block) = op;
        let s = &self.spec;
        let out = self
            .ec2
            .create_subnet()
            .vpc_id(&s.vpc_id)
            .cidr_block(block.to_string())
            .availability_zone(&s.availability_zone)
            .tag_specifications(tags_for(
                ResourceType::Subnet,
                &s.cluster,
                &s.role,
                &s.extra_tags,
            ))
            .send()
            .await
            .upstream("ec2", "CreateSubnet")?;
        let id = out
            .subnet()
            .and_then(|s| s.subnet_id())
            .ok_or_else(|| ApiError::internal("CreateSubnet answered without an id"))?;
        observed.used.push(*block);
        observed.subnet = Some(SubnetState {
            id: id.to_owned(),
            cidr: Some(*block),
        });
        Ok(())
    }

    fn describe(&self, op: &Op, _: &Observed) -> Change {
        let Op::Create(block) = op;
        Change::new(
            Action::Create,
            KIND,
            name(&self.spec.cluster, &self.spec.role),
        )
        .field("cidr_block", None, Some(json!(block.to_string())))
        .field(
            "availability_zone",
            None,
            Some(json!(self.spec.availability_zone)),
        )
        .field("subnet_id", None, Some(json!(KNOWN_AFTER_APPLY)))
    }

    fn assume(&self, op: &Op, observed: &mut Observed) {
        let Op::Create(block) = op;
        assume_made(KIND, &self.spec.vpc_id, block.to_string());
        observed.used.push(*block);
        observed.subnet = Some(SubnetState {
            id: KNOWN_AFTER_APPLY.to_owned(),
            cidr: Some(*block),
        });
    }
}

/// Teardown: every subnet tagged for the cluster, except a compute subnet that another
/// cluster of the VPC may still be using.
pub struct ClusterSubnets {
    pub ec2: Client,
    pub cluster: String,
}

impl Listed for ClusterSubnets {
    const KIND: &'static str = KIND;

    async fn list(&self) -> Result<Vec<String>, ApiError> {
        let out = self
            .ec2
            .describe_subnets()
            .set_filters(Some(of_cluster(&self.cluster)))
            .send()
            .await
            .upstream("ec2", "DescribeSubnets")?;
        let mut gone = Vec::new();
        for s in out.subnets() {
            if has_tag(s.tags(), tags::ROLE, COMPUTE_ROLE)
                && let Some(vpc) = s.vpc_id()
            {
                let others = subnets_of(&self.ec2, vpc).await?;
                let shared = others.iter().any(|o| {
                    has_tag(o.tags(), tags::MANAGED, "true")
                        && !has_tag(o.tags(), tags::CLUSTER, &self.cluster)
                });
                if shared {
                    continue;
                }
            }
            gone.extend(s.subnet_id().map(str::to_owned));
        }
        Ok(gone)
    }

    async fn delete(&self, id: &str) -> Result<(), ApiError> {
        self.ec2
            .delete_subnet()
            .subnet_id(id)
            .send()
            .await
            .found("ec2", "DeleteSubnet")?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_subnet_takes_the_first_free_block_of_its_size() {
        let c = |s| Cidr::parse(s).unwrap();
        let spec = SubnetSpec {
            cluster: "ml".into(),
            role: COMPUTE_ROLE.into(),
            vpc_id: "vpc-1".into(),
            vpc_cidr: c("10.3.0.0/16"),
            availability_zone: "us-east-1a".into(),
            prefix: 20,
            extra_tags: vec![],
            shared: true,
            room: 0,
        };
        let observed = Observed {
            subnet: None,
            used: vec![c("10.3.0.0/24"), c("10.3.1.0/24")],
        };
        assert_eq!(
            diff(&spec, &observed).unwrap(),
            [Op::Create(c("10.3.16.0/20"))]
        );
        let full = Observed {
            subnet: None,
            used: vec![c("10.3.0.0/16")],
        };
        assert!(diff(&spec, &full).is_err());
        let found = Observed {
            subnet: Some(SubnetState {
                id: "subnet-1".into(),
                cidr: None,
            }),
            used: vec![],
        };
        assert!(diff(&spec, &found).unwrap().is_empty());
    }
}
