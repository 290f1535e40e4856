//! A cluster's route tables: public (default route to the Internet gateway) and private
//! (default route to the NAT gateway), each associated with its subnets. A default route
//! that points elsewhere is put back.

use app::api::ApiError;
use app::api::plan::{Action, Change, KNOWN_AFTER_APPLY};
use aws_sdk_ec2::types::ResourceType;
use serde_json::json;

use super::{Client, name, of_cluster, ours, tags_for};
use crate::aws::SdkResultExt;
use crate::resources::{Resource, missing, shown};

const KIND: &str = "ec2:RouteTable";
const DEFAULT: &str = "0.0.0.0/0";

/// Where a table's default route goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    InternetGateway(String),
    NatGateway(String),
}

impl Target {
    fn id(&self) -> &str {
        match self {
            Target::InternetGateway(id) | Target::NatGateway(id) => id,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct RouteTableSpec {
    pub cluster: String,
    /// `public` or `private`; the table's role tag is `<role>-rt`.
    pub role: String,
    pub vpc_id: String,
    pub default_route: Target,
    pub subnet_ids: Vec<String>,
}

pub struct RouteTable {
    pub ec2: Client,
    pub spec: RouteTableSpec,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Observed {
    pub id: Option<String>,
    /// The gateway the default route points at now.
    pub default_route: Option<String>,
    pub associated: Vec<String>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    Create,
    CreateRoute,
    ReplaceRoute,
    Associate(String),
}

impl RouteTableSpec {
    fn role_tag(&self) -> String {
        format!("{}-rt", self.role)
    }
}

/// The changes for `spec` given what was found. Pure.
pub fn diff(spec: &RouteTableSpec, observed: &Observed) -> Vec<Op> {
    let mut ops = Vec::new();
    if observed.id.is_none() {
        ops.push(Op::Create);
    }
    match &observed.default_route {
        None => ops.push(Op::CreateRoute),
        Some(target) if target != spec.default_route.id() => ops.push(Op::ReplaceRoute),
        Some(_) => {}
    }
    ops.extend(
        spec.subnet_ids
            .iter()
            .filter(|s| !observed.associated.contains(s))
            .cloned()
            .map(Op::Associate),
    );
    ops
}

impl Resource for RouteTable {
    type Observed = Observed;
    type Op = Op;

    async fn observe(&self) -> Result<Observed, ApiError> {
        let out = self
            .ec2
            .describe_route_tables()
            .set_filters(Some(ours(&self.spec.cluster, &self.spec.role_tag())))
            .send()
            .await
            .upstream("ec2", "DescribeRouteTables")?;
        let Some(t) = out.route_tables().first() else {
            return Ok(Observed::default());
        };
        let default_route = t
            .routes()
            .iter()
            .find(|r| r.destination_cidr_block() == Some(DEFAULT))
            .and_then(|r| r.gateway_id().or(r.nat_gateway_id()))
            .map(str::to_owned);
        Ok(Observed {
            id: t.route_table_id().map(str::to_owned),
            default_route,
            associated: t
                .associations()
                .iter()
                .filter_map(|a| a.subnet_id().map(str::to_owned))
                .collect(),
        })
    }

    fn diff(&self, observed: &Observed) -> Result<Vec<Op>, ApiError> {
        Ok(diff(&self.spec, observed))
    }

    async fn apply(&self, op: &Op, observed: &mut Observed) -> Result<(), ApiError> {
        let s = &self.spec;
        if let Op::Create = op {
            let out = self
                .ec2
                .create_route_table()
                .vpc_id(&s.vpc_id)
                .tag_specifications(tags_for(
                    ResourceType::RouteTable,
                    &s.cluster,
                    &s.role_tag(),
                    &[],
                ))
                .send()
                .await
                .upstream("ec2", "CreateRouteTable")?;
            observed.id = Some(
                out.route_table()
                    .and_then(|t| t.route_table_id())
                    .ok_or_else(|| ApiError::internal("CreateRouteTable answered without an id"))?
                    .to_owned(),
            );
            return Ok(());
        }
        let id = observed
            .id
            .clone()
            .ok_or_else(|| missing("the route table"))?;
        match op {
            Op::Create => unreachable!("handled above"),
            Op::CreateRoute => {
                let req = self
                    .ec2
                    .create_route()
                    .route_table_id(&id)
                    .destination_cidr_block(DEFAULT);
                let req = match &s.default_route {
                    Target::InternetGateway(g) => req.gateway_id(g),
                    Target::NatGateway(n) => req.nat_gateway_id(n),
                };
                req.send()
                    .await
                    .allowing("ec2", "CreateRoute", &["RouteAlreadyExists"])?;
            }
            Op::ReplaceRoute => {
                let req = self
                    .ec2
                    .replace_route()
                    .route_table_id(&id)
                    .destination_cidr_block(DEFAULT);
                let req = match &s.default_route {
                    Target::InternetGateway(g) => req.gateway_id(g),
                    Target::NatGateway(n) => req.nat_gateway_id(n),
                };
                req.send().await.upstream("ec2", "ReplaceRoute")?;
            }
            Op::Associate(subnet) => {
                self.ec2
                    .associate_route_table()
                    .route_table_id(&id)
                    .subnet_id(subnet)
                    .send()
                    .await
                    .allowing(
                        "ec2",
                        "AssociateRouteTable",
                        &["Resource.AlreadyAssociated"],
                    )?;
                observed.associated.push(subnet.clone());
            }
        }
        if matches!(op, Op::CreateRoute | Op::ReplaceRoute) {
            observed.default_route = Some(s.default_route.id().to_owned());
        }
        Ok(())
    }

    fn describe(&self, op: &Op, observed: &Observed) -> Change {
        let s = &self.spec;
        let shown = shown(observed.id.as_deref(), || name(&s.cluster, &s.role_tag()));
        match op {
            Op::Create => Change::new(Action::Create, KIND, name(&s.cluster, &s.role_tag())).field(
                "route_table_id",
                None,
                Some(json!(KNOWN_AFTER_APPLY)),
            ),
            Op::CreateRoute | Op::ReplaceRoute => Change::new(Action::Update, KIND, shown).field(
                format!("routes[{DEFAULT}]"),
                observed.default_route.clone().map(|r| json!(r)),
                Some(json!(s.default_route.id())),
            ),
            Op::Associate(subnet) => Change::new(Action::Update, KIND, shown).field(
                "associations",
                None,
                Some(json!(subnet)),
            ),
        }
    }
    fn assume(&self, op: &Op, observed: &mut Observed) {
        match op {
            Op::Create => observed.id = Some(KNOWN_AFTER_APPLY.to_owned()),
            Op::CreateRoute | Op::ReplaceRoute => {
                observed.default_route = Some(self.spec.default_route.id().to_owned())
            }
            Op::Associate(subnet) => observed.associated.push(subnet.clone()),
        }
    }
}

/// Teardown: the cluster's route tables, disassociated and deleted.
pub struct ClusterRouteTables {
    pub ec2: Client,
    pub cluster: String,
}

#[derive(Clone, Debug, PartialEq)]
pub enum TeardownOp {
    Disassociate(String),
    Delete(String),
}

impl Resource for ClusterRouteTables {
    /// (table id, its non-main association ids).
    type Observed = Vec<(String, Vec<String>)>;
    type Op = TeardownOp;

    async fn observe(&self) -> Result<Self::Observed, ApiError> {
        let out = self
            .ec2
            .describe_route_tables()
            .set_filters(Some(of_cluster(&self.cluster)))
            .send()
            .await
            .upstream("ec2", "DescribeRouteTables")?;
        Ok(out
            .route_tables()
            .iter()
            .map(|t| {
                (
                    t.route_table_id().unwrap_or_default().to_owned(),
                    t.associations()
                        .iter()
                        .filter(|a| !a.main().unwrap_or(false))
                        .filter_map(|a| a.route_table_association_id().map(str::to_owned))
                        .collect(),
                )
            })
            .collect())
    }

    fn diff(&self, observed: &Self::Observed) -> Result<Vec<TeardownOp>, ApiError> {
        let mut ops = Vec::new();
        for (id, associations) in observed {
            ops.extend(associations.iter().cloned().map(TeardownOp::Disassociate));
            ops.push(TeardownOp::Delete(id.clone()));
        }
        Ok(ops)
    }

    async fn apply(&self, op: &TeardownOp, observed: &mut Self::Observed) -> Result<(), ApiError> {
        match op {
            TeardownOp::Disassociate(a) => {
                self.ec2
                    .disassociate_route_table()
                    .association_id(a)
                    .send()
                    .await
                    .found("ec2", "DisassociateRouteTable")?;
            }
            TeardownOp::Delete(id) => {
                self.ec2
                    .delete_route_table()
                    .route_table_id(id)
                    .send()
                    .await
                    .found("ec2", "DeleteRouteTable")?;
                observed.retain(|(t, _)| t != id);
            }
        }
        Ok(())
    }

    fn describe(&self, op: &TeardownOp, _: &Self::Observed) -> Change {
        match op {
            TeardownOp::Disassociate(a) => Change::new(Action::Update, KIND, a.clone()).field(
                "associations",
                Some(json!(a)),
                None,
            ),
            TeardownOp::Delete(id) => Change::new(Action::Delete, KIND, id),
        }
    }
    fn assume(&self, op: &TeardownOp, observed: &mut Self::Observed) {
        match op {
            TeardownOp::Disassociate(a) => {
                for (_, associations) in observed.iter_mut() {
                    associations.retain(|x| x != a);
                }
            }
            TeardownOp::Delete(id) => observed.retain(|(t, _)| t != id),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_default_route_pointing_elsewhere_is_replaced() {
        let spec = RouteTableSpec {
            cluster: "ml".into(),
            role: "private".into(),
            vpc_id: "vpc-1".into(),
            default_route: Target::NatGateway("nat-1".into()),
            subnet_ids: vec!["subnet-1".into(), "subnet-2".into()],
        };
        assert_eq!(
            diff(&spec, &Observed::default()),
            [
                Op::Create,
                Op::CreateRoute,
                Op::Associate("subnet-1".into()),
                Op::Associate("subnet-2".into())
            ]
        );
        let drifted = Observed {
            id: Some("rtb-1".into()),
            default_route: Some("igw-9".into()),
            associated: vec!["subnet-1".into(), "subnet-2".into()],
        };
        assert_eq!(diff(&spec, &drifted), [Op::ReplaceRoute]);
        let fine = Observed {
            default_route: Some("nat-1".into()),
            ..drifted
        };
        assert!(diff(&spec, &fine).is_empty());
    }
}
