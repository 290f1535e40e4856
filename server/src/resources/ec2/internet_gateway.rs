//! The VPC's Internet gateway, for the public subnets and the NAT gateway. A VPC that has
//! one attached already (the user's own) keeps it; hypd's is found by its tags even when a
//! crash left it made but not attached.

use app::api::ApiError;
use app::api::plan::{Action, Change, KNOWN_AFTER_APPLY};
use aws_sdk_ec2::types::ResourceType;
use serde_json::json;

use super::{Client, filter, name, of_cluster, ours, tags_for};
use crate::aws::SdkResultExt;
use crate::resources::{Resource, known_after_apply, missing, shown};

const KIND: &str = "ec2:InternetGateway";
const ROLE: &str = "igw";

pub struct InternetGateway {
    pub ec2: Client,
    pub cluster: String,
    pub vpc_id: String,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Observed {
    pub id: Option<String>,
    pub attached: bool,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Op {
    Create,
    Attach,
}

/// The changes given what was found. Pure.
pub fn diff(observed: &Observed) -> Vec<Op> {
    match (&observed.id, observed.attached) {
        (None, _) => vec![Op::Create, Op::Attach],
        (Some(_), false) => vec![Op::Attach],
        (Some(_), true) => Vec::new(),
    }
}

impl Resource for InternetGateway {
    type Observed = Observed;
    type Op = Op;

    async fn observe(&self) -> Result<Observed, ApiError> {
        let attached = if known_after_apply(&self.vpc_id) {
            Vec::new()
        } else {
            self.ec2
                .describe_internet_gateways()
                .filters(filter("attachment.vpc-id", &self.vpc_id))
                .send()
                .await
                .upstream("ec2", "DescribeInternetGateways")?
                .internet_gateways
                .unwrap_or_default()
        };
        if let Some(g) = attached.first() {
            return Ok(Observed {
                id: g.internet_gateway_id().map(str::to_owned),
                attached: true,
            });
        }
        let found = self
            .ec2
            .describe_internet_gateways()
            .set_filters(Some(ours(&self.cluster, ROLE)))
            .send()
            .await
            .upstream("ec2", "DescribeInternetGateways")?;
        Ok(Observed {
            id: found
                .internet_gateways()
                .first()
                .and_then(|g| g.internet_gateway_id())
                .map(str::to_owned),
            attached: false,
        })
    }

    fn diff(&self, observed: &Observed) -> Result<Vec<Op>, ApiError> {
        Ok(diff(observed))
    }

    async fn apply(&self, op: &Op, observed: &mut Observed) -> Result<(), ApiError> {
        match op {
            Op::Create => {
                let out = self
                    .ec2
                    .create_internet_gateway()
                    .tag_specifications(tags_for(
                        ResourceType::InternetGateway,
                        &self.cluster,
                        ROLE,
                        &[],
                    ))
                    .send()
                    .await
                    .upstream("ec2", "CreateInternetGateway")?;
                observed.id = Some(
                    out.internet_gateway()
                        .and_then(|g| g.internet_gateway_id())
                        .ok_or_else(|| {
                            ApiError::internal("CreateInternetGateway answered without an id")
                        })?
                        .to_owned(),
                );
            }
            Op::Attach => {
                let id = observed
                    .id
                    .as_deref()
                    .ok_or_else(|| missing("the Internet gateway"))?;
                self.ec2
                    .attach_internet_gateway()
                    .internet_gateway_id(id)
                    .vpc_id(&self.vpc_id)
                    .send()
                    .await
                    .upstream("ec2", "AttachInternetGateway")?;
                observed.attached = true;
            }
        }
        Ok(())
    }

    fn describe(&self, op: &Op, observed: &Observed) -> Change {
        match op {
            Op::Create => Change::new(Action::Create, KIND, name(&self.cluster, ROLE)),
            Op::Attach => Change::new(
                Action::Update,
                KIND,
                shown(observed.id.as_deref(), || name(&self.cluster, ROLE)),
            )
            .field("attachment.vpc_id", None, Some(json!(self.vpc_id))),
        }
    }

    fn assume(&self, op: &Op, observed: &mut Observed) {
        match op {
            Op::Create => observed.id = Some(KNOWN_AFTER_APPLY.to_owned()),
            Op::Attach => observed.attached = true,
        }
    }
}

/// Teardown: the cluster's Internet gateways, detached and deleted.
pub struct ClusterInternetGateways {
    pub ec2: Client,
    pub cluster: String,
}

#[derive(Clone, Debug, PartialEq)]
pub enum TeardownOp {
    Detach { id: String, vpc_id: String },
    Delete(String),
}

impl Resource for ClusterInternetGateways {
    /// (gateway id, the VPCs it is attached to).
    type Observed = Vec<(String, Vec<String>)>;
    type Op = TeardownOp;

    async fn observe(&self) -> Result<Self::Observed, ApiError> {
        let out = self
            .ec2
            .describe_internet_gateways()
            .set_filters(Some(of_cluster(&self.cluster)))
            .send()
            .await
            .upstream("ec2", "DescribeInternetGateways")?;
        Ok(out
            .internet_gateways()
            .iter()
            .map(|g| {
                (
                    g.internet_gateway_id().unwrap_or_default().to_owned(),
                    g.attachments()
                        .iter()
                        .filter_map(|a| a.vpc_id().map(str::to_owned))
                        .collect(),
                )
            })
            .collect())
    }

    fn diff(&self, observed: &Self::Observed) -> Result<Vec<TeardownOp>, ApiError> {
        let mut ops = Vec::new();
        for (id, vpcs) in observed {
            for vpc in vpcs {
                ops.push(TeardownOp::Detach {
                    id: id.clone(),
                    vpc_id: vpc.clone(),
                });
            }
            ops.push(TeardownOp::Delete(id.clone()));
        }
        Ok(ops)
    }

    async fn apply(&self, op: &TeardownOp, observed: &mut Self::Observed) -> Result<(), ApiError> {
        match op {
            TeardownOp::Detach { id, vpc_id } => {
                self.ec2
                    .detach_internet_gateway()
                    .internet_gateway_id(id)
                    .vpc_id(vpc_id)
                    .send()
                    .await
                    .found("ec2", "DetachInternetGateway")?;
            }
            TeardownOp::Delete(id) => {
                self.ec2
                    .delete_internet_gateway()
                    .internet_gateway_id(id)
                    .send()
                    .await
                    .found("ec2", "DeleteInternetGateway")?;
                observed.retain(|(g, _)| g != id);
            }
        }
        Ok(())
    }

    fn describe(&self, op: &TeardownOp, _: &Self::Observed) -> Change {
        match op {
            TeardownOp::Detach { id, vpc_id } => Change::new(Action::Update, KIND, id).field(
                "attachment.vpc_id",
                Some(json!(vpc_id)),
                None,
            ),
            TeardownOp::Delete(id) => Change::new(Action::Delete, KIND, id),
        }
    }
    fn assume(&self, op: &TeardownOp, observed: &mut Self::Observed) {
        match op {
            TeardownOp::Detach { id, vpc_id } => {
                for (_, vpcs) in observed.iter_mut().filter(|(g, _)| g == id) {
                    vpcs.retain(|v| v != vpc_id);
                }
            }
            TeardownOp::Delete(id) => observed.retain(|(g, _)| g != id),
        }
    }
}
