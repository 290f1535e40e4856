//! A cluster's VPC: a new one with a /16 that overlaps no other VPC of the region (and DNS
//! names on, which EKS's private endpoint and the nodes need), or the user's own, which
//! hypd only reads and never deletes.

use app::api::ApiError;
use app::api::plan::{Action, Change, KNOWN_AFTER_APPLY};
use app::api::values::Cidr;
use aws_sdk_ec2::types::{AttributeBooleanValue, ResourceType, VpcAttributeName};
use serde_json::json;

use super::{Client, filter, free_vpc_block, name, ours, tags_for};
use crate::aws::SdkResultExt;
use crate::resources::{Listed, Resource, missing, shown};

const KIND: &str = "ec2:Vpc";
const ROLE: &str = "vpc";

/// Which VPC the cluster uses.
#[derive(Clone, Debug, PartialEq)]
pub enum VpcChoice {
    /// hypd's own, with this block (one is chosen when `None`).
    New { cidr: Option<Cidr> },
    /// The user's VPC with this id.
    Existing(String),
}

pub struct Vpc {
    pub ec2: Client,
    pub cluster: String,
    pub choice: VpcChoice,
}

#[derive(Clone, Debug, PartialEq)]
pub struct VpcState {
    pub id: String,
    pub cidr: Cidr,
    /// hypd made it (teardown may delete it).
    pub created: bool,
    pub dns_support: bool,
    pub dns_hostnames: bool,
}

#[derive(Debug, Default)]
pub struct Observed {
    pub vpc: Option<VpcState>,
    /// Every VPC block of the region, to choose a free one.
    pub region_blocks: Vec<(String, Cidr)>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    Create(Cidr),
    EnableDns(VpcAttributeName),
}

/// Every IPv4 block (primary and associated) of the VPCs `found`.
fn blocks(found: &[aws_sdk_ec2::types::Vpc]) -> Vec<(String, Cidr)> {
    let mut blocks = Vec::new();
    for v in found {
        let id = v.vpc_id().unwrap_or_default().to_owned();
        for a in v.cidr_block_association_set() {
            if let Some(c) = a.cidr_block().and_then(|c| Cidr::parse(c).ok()) {
                blocks.push((id.clone(), c));
            }
        }
        if let Some(c) = v.cidr_block().and_then(|c| Cidr::parse(c).ok())
            && !blocks.iter().any(|(i, b)| *i == id && *b == c)
        {
            blocks.push((id, c));
        }
    }
    blocks
}

/// The VPCs hypd made for `cluster` (one, unless something went wrong).
async fn cluster_vpcs(
    ec2: &Client,
    cluster: &str,
) -> Result<Vec<aws_sdk_ec2::types::Vpc>, ApiError> {
    let out = ec2
        .describe_vpcs()
        .set_filters(Some(ours(cluster, ROLE)))
        .send()
        .await
        .upstream("ec2", "DescribeVpcs")?;
    Ok(out.vpcs().to_vec())
}

/// The region's VPC blocks, for pre-flight and for choosing a new VPC's block.
pub async fn region_blocks(ec2: &Client) -> Result<Vec<(String, Cidr)>, ApiError> {
    let out = ec2
        .describe_vpcs()
        .send()
        .await
        .upstream("ec2", "DescribeVpcs")?;
    Ok(blocks(out.vpcs()))
}

/// Whether VPC `id` exists (pre-flight for a named VPC).
pub async fn exists(ec2: &Client, id: &str) -> Result<bool, ApiError> {
    let out = ec2
        .describe_vpcs()
        .filters(filter("vpc-id", id))
        .send()
        .await
        .upstream("ec2", "DescribeVpcs")?;
    Ok(!out.vpcs().is_empty())
}

async fn dns(ec2: &Client, id: &str, attribute: VpcAttributeName) -> Result<bool, ApiError> {
    let out = ec2
        .describe_vpc_attribute()
        .vpc_id(id)
        .attribute(attribute.clone())
        .send()
        .await
        .upstream("ec2", "DescribeVpcAttribute")?;
    let value = match attribute {
        VpcAttributeName::EnableDnsHostnames => out.enable_dns_hostnames(),
        _ => out.enable_dns_support(),
    };
    Ok(value.and_then(|v| v.value()).unwrap_or(false))
}

fn state(v: &aws_sdk_ec2::types::Vpc, created: bool) -> Result<VpcState, ApiError> {
    Ok(VpcState {
        id: v.vpc_id().unwrap_or_default().to_owned(),
        cidr: v
            .cidr_block()
            .and_then(|c| Cidr::parse(c).ok())
            .ok_or_else(|| ApiError::internal("a VPC without an IPv4 block"))?,
        created,
        dns_support: false,
        dns_hostnames: false,
    })
}

/// The changes for `choice` given what was found. Pure.
pub fn diff(choice: &VpcChoice, observed: &Observed) -> Result<Vec<Op>, ApiError> {
    match (choice, &observed.vpc) {
        (VpcChoice::Existing(id), None) => Err(ApiError::field(
            "network.vpc_id",
            format!("there is no VPC {id}"),
        )),
        (VpcChoice::Existing(_), Some(_)) => Ok(Vec::new()),
        (VpcChoice::New { cidr }, None) => {
            let used: Vec<Cidr> = observed.region_blocks.iter().map(|(_, c)| *c).collect();
            let cidr = match cidr {
                Some(c) => *c,
                None => free_vpc_block(&used).ok_or_else(|| {
                    ApiError::field(
                        "network.vpc_cidr",
                        "every /16 of 10.0.0.0/8 is used by a VPC in this region; name one with vpc_cidr or vpc_id",
                    )
                })?,
            };
            Ok(vec![
                Op::Create(cidr),
                Op::EnableDns(VpcAttributeName::EnableDnsSupport),
                Op::EnableDns(VpcAttributeName::EnableDnsHostnames),
            ])
        }
        (VpcChoice::New { .. }, Some(v)) => {
            let mut ops = Vec::new();
            if !v.dns_support {
                ops.push(Op::EnableDns(VpcAttributeName::EnableDnsSupport));
            }
            if !v.dns_hostnames {
                ops.push(Op::EnableDns(VpcAttributeName::EnableDnsHostnames));
            }
            Ok(ops)
        }
    }
}

impl Resource for Vpc {
    type Observed = Observed;
    type Op = Op;

    async fn observe(&self) -> Result<Observed, ApiError> {
        match &self.choice {
            VpcChoice::Existing(id) => {
                let out = self
                    .ec2
                    .describe_vpcs()
                    .filters(filter("vpc-id", id))
                    .send()
                    .await
                    .upstream("ec2", "DescribeVpcs")?;
                let vpc = out.vpcs().first().map(|v| state(v, false)).transpose()?;
                Ok(Observed {
                    vpc,
                    region_blocks: Vec::new(),
                })
            }
            VpcChoice::New { .. } => {
                let found = cluster_vpcs(&self.ec2, &self.cluster).await?;
                let Some(found) = found.first() else {
                    return Ok(Observed {
                        vpc: None,
                        region_blocks: region_blocks(&self.ec2).await?,
                    });
                };
                let mut vpc = state(found, true)?;
                vpc.dns_support =
                    dns(&self.ec2, &vpc.id, VpcAttributeName::EnableDnsSupport).await?;
                vpc.dns_hostnames =
                    dns(&self.ec2, &vpc.id, VpcAttributeName::EnableDnsHostnames).await?;
                Ok(Observed {
                    vpc: Some(vpc),
                    region_blocks: Vec::new(),
                })
            }
        }
    }

    fn diff(&self, observed: &Observed) -> Result<Vec<Op>, ApiError> {
        diff(&self.choice, observed)
    }

    async fn apply(&self, op: &Op, observed: &mut Observed) -> Result<(), ApiError> {
        match op {
            Op::Create(cidr) => {
                let created = self
                    .ec2
                    .create_vpc()
                    .cidr_block(cidr.to_string())
                    .tag_specifications(tags_for(ResourceType::Vpc, &self.cluster, ROLE, &[]))
                    .send()
                    .await
                    .upstream("ec2", "CreateVpc")?;
                let id = created
                    .vpc()
                    .and_then(|v| v.vpc_id())
                    .ok_or_else(|| ApiError::internal("CreateVpc answered without an id"))?;
                observed.vpc = Some(VpcState {
                    id: id.to_owned(),
                    cidr: *cidr,
                    created: true,
                    dns_support: false,
                    dns_hostnames: false,
                });
            }
            Op::EnableDns(attribute) => {
                let vpc = observed.vpc.as_mut().ok_or_else(|| missing("the VPC"))?;
                let on = AttributeBooleanValue::builder().value(true).build();
                let req = self.ec2.modify_vpc_attribute().vpc_id(&vpc.id);
                let req = match attribute {
                    VpcAttributeName::EnableDnsHostnames => req.enable_dns_hostnames(on),
                    _ => req.enable_dns_support(on),
                };
                req.send().await.upstream("ec2", "ModifyVpcAttribute")?;
                match attribute {
                    VpcAttributeName::EnableDnsHostnames => vpc.dns_hostnames = true,
                    _ => vpc.dns_support = true,
                }
            }
        }
        Ok(())
    }

    fn describe(&self, op: &Op, observed: &Observed) -> Change {
        let shown = shown(observed.vpc.as_ref().map(|v| v.id.as_str()), || {
            name(&self.cluster, ROLE)
        });
        match op {
            Op::Create(cidr) => Change::new(Action::Create, KIND, name(&self.cluster, ROLE))
                .field("cidr_block", None, Some(json!(cidr.to_string())))
                .field("vpc_id", None, Some(json!(KNOWN_AFTER_APPLY))),
            Op::EnableDns(attribute) => Change::new(Action::Update, KIND, shown).field(
                attribute.as_str(),
                Some(json!(false)),
                Some(json!(true)),
            ),
        }
    }

    fn assume(&self, op: &Op, observed: &mut Observed) {
        match op {
            Op::Create(cidr) => {
                observed.vpc = Some(VpcState {
                    id: KNOWN_AFTER_APPLY.to_owned(),
                    cidr: *cidr,
                    created: true,
                    dns_support: false,
                    dns_hostnames: false,
                })
            }
            Op::EnableDns(attribute) => {
                if let Some(vpc) = observed.vpc.as_mut() {
                    match attribute {
                        VpcAttributeName::EnableDnsHostnames => vpc.dns_hostnames = true,
                        _ => vpc.dns_support = true,
                    }
                }
            }
        }
    }
}

/// Teardown: every VPC hypd made for the cluster (a VPC the user named is never among
/// them: it carries no `hypd:role=vpc` tag of the cluster).
pub struct ClusterVpcs {
    pub ec2: Client,
    pub cluster: String,
}

impl Listed for ClusterVpcs {
    const KIND: &'static str = KIND;

    async fn list(&self) -> Result<Vec<String>, ApiError> {
        Ok(cluster_vpcs(&self.ec2, &self.cluster)
            .await?
            .iter()
            .filter_map(|v| v.vpc_id().map(str::to_owned))
            .collect())
    }

    async fn delete(&self, id: &str) -> Result<(), ApiError> {
        self.ec2
            .delete_vpc()
            .vpc_id(id)
            .send()
            .await
            .found("ec2", "DeleteVpc")?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(s: &str) -> Cidr {
        Cidr::parse(s).unwrap()
    }

    #[test]
    fn a_new_vpc_takes_the_first_free_block_and_dns_names() {
        let observed = Observed {
            vpc: None,
            region_blocks: vec![("vpc-1".into(), c("10.0.0.0/16"))],
        };
        let ops = diff(&VpcChoice::New { cidr: None }, &observed).unwrap();
        assert_eq!(ops[0], Op::Create(c("10.1.0.0/16")));
        assert_eq!(ops.len(), 3);
        let made = Observed {
            vpc: Some(VpcState {
                id: "vpc-2".into(),
                cidr: c("10.1.0.0/16"),
                created: true,
                dns_support: true,
                dns_hostnames: true,
            }),
            region_blocks: vec![],
        };
        assert!(
            diff(&VpcChoice::New { cidr: None }, &made)
                .unwrap()
                .is_empty()
        );
        let e = diff(&VpcChoice::Existing("vpc-9".into()), &Observed::default()).unwrap_err();
        assert_eq!(e.errors_for("network.vpc_id").len(), 1);
    }
}
