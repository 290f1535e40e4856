//! The NAT gateway (and its Elastic IP) that gives the private and compute subnets a way
//! out. Gateways and addresses are listed and matched by tag here rather than with a
//! `tag:` filter, which some EC2 implementations ignore for them; the create call carries
//! a client token, so a repeat after a crash returns the first gateway.

use app::api::ApiError;
use app::api::plan::{Action, Change, KNOWN_AFTER_APPLY};
use aws_sdk_ec2::types::{DomainType, NatGatewayState, ResourceType};
use serde_json::json;

use super::{Client, has_tag, name, tags_for};
use crate::aws::SdkResultExt;
use crate::resources::{Resource, missing, tags};

const KIND: &str = "ec2:NatGateway";
const ADDRESS_KIND: &str = "ec2:ElasticIp";
const ROLE: &str = "nat";
const ADDRESS_ROLE: &str = "nat-eip";

pub struct NatGateway {
    pub ec2: Client,
    pub cluster: String,
    pub public_subnet_id: String,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Observed {
    /// A pending or available gateway of the cluster, and its state.
    pub gateway: Option<(String, NatGatewayState)>,
    /// The cluster's NAT address (its allocation id).
    pub address: Option<String>,
}

impl Observed {
    pub fn available(&self) -> bool {
        matches!(&self.gateway, Some((_, NatGatewayState::Available)))
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Op {
    AllocateAddress,
    Create,
}

/// The changes given what was found. Pure.
pub fn diff(observed: &Observed) -> Vec<Op> {
    match (&observed.gateway, &observed.address) {
        (Some(_), _) => Vec::new(),
        (None, Some(_)) => vec![Op::Create],
        (None, None) => vec![Op::AllocateAddress, Op::Create],
    }
}

async fn gateways(
    ec2: &Client,
    cluster: &str,
) -> Result<Vec<aws_sdk_ec2::types::NatGateway>, ApiError> {
    let out = ec2
        .describe_nat_gateways()
        .send()
        .await
        .upstream("ec2", "DescribeNatGateways")?;
    Ok(out
        .nat_gateways()
        .iter()
        .filter(|g| has_tag(g.tags(), tags::CLUSTER, cluster))
        .cloned()
        .collect())
}

async fn addresses(
    ec2: &Client,
    cluster: &str,
) -> Result<Vec<aws_sdk_ec2::types::Address>, ApiError> {
    let out = ec2
        .describe_addresses()
        .send()
        .await
        .upstream("ec2", "DescribeAddresses")?;
    Ok(out
        .addresses()
        .iter()
        .filter(|a| has_tag(a.tags(), tags::CLUSTER, cluster))
        .cloned()
        .collect())
}

impl Resource for NatGateway {
    type Observed = Observed;
    type Op = Op;

    async fn observe(&self) -> Result<Observed, ApiError> {
        let gateway = gateways(&self.ec2, &self.cluster)
            .await?
            .into_iter()
            .find_map(|g| match g.state() {
                Some(s @ (NatGatewayState::Pending | NatGatewayState::Available)) => {
                    Some((g.nat_gateway_id().unwrap_or_default().to_owned(), s.clone()))
                }
                _ => None,
            });
        let address = if gateway.is_some() {
            None
        } else {
            addresses(&self.ec2, &self.cluster)
                .await?
                .iter()
                .find(|a| has_tag(a.tags(), tags::ROLE, ADDRESS_ROLE))
                .and_then(|a| a.allocation_id().map(str::to_owned))
        };
        Ok(Observed { gateway, address })
    }

    fn diff(&self, observed: &Observed) -> Result<Vec<Op>, ApiError> {
        Ok(diff(observed))
    }

    async fn apply(&self, op: &Op, observed: &mut Observed) -> Result<(), ApiError> {
        match op {
            Op::AllocateAddress => {
                let out = self
                    .ec2
                    .allocate_address()
                    .domain(DomainType::Vpc)
                    .tag_specifications(tags_for(
                        ResourceType::ElasticIp,
                        &self.cluster,
                        ADDRESS_ROLE,
                        &[],
                    ))
                    .send()
                    .await
                    .upstream("ec2", "AllocateAddress")?;
                observed.address = Some(
                    out.allocation_id()
                        .ok_or_else(|| {
                            ApiError::internal("AllocateAddress answered without an id")
                        })?
                        .to_owned(),
                );
            }
            Op::Create => {
                let allocation = observed
                    .address
                    .as_deref()
                    .ok_or_else(|| missing("the NAT gateway's address"))?;
                let out = self
                    .ec2
                    .create_nat_gateway()
                    .subnet_id(&self.public_subnet_id)
                    .allocation_id(allocation)
                    .client_token(format!("hypd-{}-nat", self.cluster))
                    .tag_specifications(tags_for(
                        ResourceType::Natgateway,
                        &self.cluster,
                        ROLE,
                        &[],
                    ))
                    .send()
                    .await
                    .upstream("ec2", "CreateNatGateway")?;
                let g = out.nat_gateway().ok_or_else(|| {
                    ApiError::internal("CreateNatGateway answered without a gateway")
                })?;
                observed.gateway = Some((
                    g.nat_gateway_id().unwrap_or_default().to_owned(),
                    g.state().cloned().unwrap_or(NatGatewayState::Pending),
                ));
            }
        }
        Ok(())
    }

    fn describe(&self, op: &Op, _: &Observed) -> Change {
        match op {
            Op::AllocateAddress => Change::new(
                Action::Create,
                ADDRESS_KIND,
                name(&self.cluster, ADDRESS_ROLE),
            ),
            Op::Create => Change::new(Action::Create, KIND, name(&self.cluster, ROLE))
                .field("subnet_id", None, Some(json!(self.public_subnet_id)))
                .field("nat_gateway_id", None, Some(json!(KNOWN_AFTER_APPLY))),
        }
    }

    /// Assumed made is assumed available: a plan goes on past the wait for it.
    fn assume(&self, op: &Op, observed: &mut Observed) {
        match op {
            Op::AllocateAddress => observed.address = Some(KNOWN_AFTER_APPLY.to_owned()),
            Op::Create => {
                observed.gateway = Some((KNOWN_AFTER_APPLY.to_owned(), NatGatewayState::Available))
            }
        }
    }
}

/// Teardown: the cluster's NAT gateways, then (once they are gone, as their addresses stay
/// in use until then) its Elastic IPs.
pub struct ClusterNatGateways {
    pub ec2: Client,
    pub cluster: String,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct TeardownObserved {
    /// Gateways not yet deleted, and their states.
    pub gateways: Vec<(String, NatGatewayState)>,
    /// Allocation ids of the cluster's addresses.
    pub addresses: Vec<String>,
}

impl TeardownObserved {
    /// A gateway is still on its way out.
    pub fn deleting(&self) -> bool {
        !self.gateways.is_empty()
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum TeardownOp {
    Delete(String),
    Release(String),
}

/// The teardown changes given what was found: every gateway not yet deleting, then
/// every address. Pure. The releases are listed even while a gateway still holds its
/// address, so a plan shows them; [`Resource::apply`] defers them until the gateways
/// are gone (the step waits and runs again).
pub fn teardown_diff(observed: &TeardownObserved) -> Vec<TeardownOp> {
    observed
        .gateways
        .iter()
        .filter(|(_, s)| *s != NatGatewayState::Deleting)
        .map(|(id, _)| TeardownOp::Delete(id.clone()))
        .chain(observed.addresses.iter().cloned().map(TeardownOp::Release))
        .collect()
}

impl Resource for ClusterNatGateways {
    type Observed = TeardownObserved;
    type Op = TeardownOp;

    async fn observe(&self) -> Result<TeardownObserved, ApiError> {
        Ok(TeardownObserved {
            gateways: gateways(&self.ec2, &self.cluster)
                .await?
                .iter()
                .filter(|g| g.state() != Some(&NatGatewayState::Deleted))
                .map(|g| {
                    (
                        g.nat_gateway_id().unwrap_or_default().to_owned(),
                        g.state().cloned().unwrap_or(NatGatewayState::Pending),
                    )
                })
                .collect(),
            addresses: addresses(&self.ec2, &self.cluster)
                .await?
                .iter()
                .filter_map(|a| a.allocation_id().map(str::to_owned))
                .collect(),
        })
    }

    fn diff(&self, observed: &TeardownObserved) -> Result<Vec<TeardownOp>, ApiError> {
        Ok(teardown_diff(observed))
    }

    async fn apply(
        &self,
        op: &TeardownOp,
        observed: &mut TeardownObserved,
    ) -> Result<(), ApiError> {
        match op {
            TeardownOp::Delete(id) => {
                self.ec2
                    .delete_nat_gateway()
                    .nat_gateway_id(id)
                    .send()
                    .await
                    .found("ec2", "DeleteNatGateway")?;
                for g in observed.gateways.iter_mut().filter(|(g, _)| g == id) {
                    g.1 = NatGatewayState::Deleting;
                }
            }
            // An address stays in use until its gateway is gone.
            TeardownOp::Release(_) if observed.deleting() => {}
            TeardownOp::Release(id) => {
                self.ec2
                    .release_address()
                    .allocation_id(id)
                    .send()
                    .await
                    .found("ec2", "ReleaseAddress")?;
                observed.addresses.retain(|a| a != id);
            }
        }
        Ok(())
    }

    fn describe(&self, op: &TeardownOp, _: &TeardownObserved) -> Change {
        match op {
            TeardownOp::Delete(id) => Change::new(Action::Delete, KIND, id),
            TeardownOp::Release(id) => Change::new(Action::Delete, ADDRESS_KIND, id),
        }
    }

    fn assume(&self, op: &TeardownOp, observed: &mut TeardownObserved) {
        match op {
            TeardownOp::Delete(id) => observed.gateways.retain(|(g, _)| g != id),
            TeardownOp::Release(id) => observed.addresses.retain(|a| a != id),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_go_only_once_no_gateway_is_left() {
        let mut o = TeardownObserved {
            gateways: vec![("nat-1".into(), NatGatewayState::Available)],
            addresses: vec!["eipalloc-1".into()],
        };
        assert_eq!(
            teardown_diff(&o),
            [
                TeardownOp::Delete("nat-1".into()),
                TeardownOp::Release("eipalloc-1".into())
            ]
        );
        o.gateways[0].1 = NatGatewayState::Deleting;
        assert_eq!(
            teardown_diff(&o),
            [TeardownOp::Release("eipalloc-1".into())],
            "listed, and deferred by apply while the gateway goes"
        );
        assert!(o.deleting());
        o.gateways.clear();
        assert_eq!(
            teardown_diff(&o),
            [TeardownOp::Release("eipalloc-1".into())]
        );
        assert_eq!(
            diff(&Observed::default()),
            [Op::AllocateAddress, Op::Create]
        );
    }
}
