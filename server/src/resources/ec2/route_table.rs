//! A cluster's route tables: public (default route to the Internet gateway) and private
//! (default route to the NAT gateway), each associated with its subnets. A table is
//! hypd's whole: a default route that points elsewhere is put back, a route someone else
//! added is removed, a subnet moved to another table is moved back, and a subnet that is
//! not the table's is disassociated. Routes AWS keeps itself (the VPC's local route,
//! routes propagated from a virtual private gateway, a gateway endpoint's prefix-list
//! routes) are not a table's own and are left alone.

use app::api::ApiError;
use app::api::plan::{Action, Change, KNOWN_AFTER_APPLY};
use aws_sdk_ec2::types::{ResourceType, Route, RouteOrigin};
use serde_json::json;

use super::{Client, filter, name, of_cluster, ours, tags_for};
use crate::aws::SdkResultExt;
use crate::resources::{Resource, known_after_apply, missing, shown, tags};

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

/// What a route is for, as `DeleteRoute` names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Destination {
    Cidr(String),
    Ipv6(String),
    PrefixList(String),
}

impl std::fmt::Display for Destination {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Destination::Cidr(d) | Destination::Ipv6(d) | Destination::PrefixList(d) => {
                f.write_str(d)
            }
        }
    }
}

/// A route in hypd's table that hypd did not add.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OtherRoute {
    pub destination: Destination,
    /// The gateway, NAT, peering connection, interface… it sends to.
    pub target: String,
}

/// A subnet's association with a route table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Association {
    pub id: String,
    pub subnet: String,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Observed {
    pub id: Option<String>,
    /// The gateway the default route points at now.
    pub default_route: Option<String>,
    /// The table's subnet associations.
    pub associated: Vec<Association>,
    /// Routes someone else added to the table.
    pub other_routes: Vec<OtherRoute>,
    /// The table's subnets associated with a table hypd did not make instead (asked
    /// only when one of them is not associated with this one).
    pub elsewhere: Vec<Association>,
    /// The table's subnets associated with another cluster's table: a compute subnet
    /// clusters in one VPC share is routed by the first cluster's table, and stays so.
    pub shared: Vec<String>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    Create,
    CreateRoute,
    ReplaceRoute,
    DeleteRoute(OtherRoute),
    Associate(String),
    /// Moves a subnet associated with another table back to this one.
    Reassociate(Association),
    Disassociate(Association),
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
    ops.extend(observed.other_routes.iter().cloned().map(Op::DeleteRoute));
    for subnet in &spec.subnet_ids {
        if observed.associated.iter().any(|a| &a.subnet == subnet)
            || observed.shared.contains(subnet)
        {
            continue;
        }
        ops.push(
            match observed.elsewhere.iter().find(|a| &a.subnet == subnet) {
                Some(a) => Op::Reassociate(a.clone()),
                None => Op::Associate(subnet.clone()),
            },
        );
    }
    ops.extend(
        observed
            .associated
            .iter()
            .filter(|a| !spec.subnet_ids.contains(&a.subnet))
            .cloned()
            .map(Op::Disassociate),
    );
    ops
}

/// A route of a table that the table's owner added: not the VPC's local route, not one
/// propagated from a virtual private gateway, not a gateway endpoint's.
fn added(r: &Route) -> bool {
    let gateway = r.gateway_id().unwrap_or_default();
    gateway != "local"
        && !gateway.starts_with("vpce-")
        && r.origin() != Some(&RouteOrigin::EnableVgwRoutePropagation)
        && r.origin() != Some(&RouteOrigin::CreateRouteTable)
}

fn destination(r: &Route) -> Option<Destination> {
    if let Some(d) = r.destination_cidr_block() {
        Some(Destination::Cidr(d.to_owned()))
    } else if let Some(d) = r.destination_ipv6_cidr_block() {
        Some(Destination::Ipv6(d.to_owned()))
    } else {
        r.destination_prefix_list_id()
            .map(|d| Destination::PrefixList(d.to_owned()))
    }
}

/// What a route sends to, whichever kind of target it has.
fn target(r: &Route) -> String {
    [
        r.gateway_id(),
        r.nat_gateway_id(),
        r.vpc_peering_connection_id(),
        r.transit_gateway_id(),
        r.network_interface_id(),
        r.instance_id(),
        r.egress_only_internet_gateway_id(),
        r.local_gateway_id(),
        r.carrier_gateway_id(),
        r.core_network_arn(),
    ]
    .into_iter()
    .flatten()
    .next()
    .unwrap_or("(no target)")
    .to_owned()
}

fn associations(t: &aws_sdk_ec2::types::RouteTable) -> Vec<Association> {
    t.associations()
        .iter()
        .filter_map(|a| {
            Some(Association {
                id: a.route_table_association_id()?.to_owned(),
                subnet: a.subnet_id()?.to_owned(),
            })
        })
        .collect()
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
        let mut observed = out
            .route_tables()
            .first()
            .map_or_else(Observed::default, |t| Observed {
                id: t.route_table_id().map(str::to_owned),
                default_route: t
                    .routes()
                    .iter()
                    .find(|r| r.destination_cidr_block() == Some(DEFAULT))
                    .and_then(|r| r.gateway_id().or(r.nat_gateway_id()))
                    .map(str::to_owned),
                associated: associations(t),
                other_routes: t
                    .routes()
                    .iter()
                    .filter(|r| r.destination_cidr_block() != Some(DEFAULT) && added(r))
                    .filter_map(|r| {
                        Some(OtherRoute {
                            destination: destination(r)?,
                            target: target(r),
                        })
                    })
                    .collect(),
                elsewhere: Vec::new(),
                shared: Vec::new(),
            });
        // Only a subnet missing from the table costs a call: where is it instead?
        let unassociated: Vec<String> = self
            .spec
            .subnet_ids
            .iter()
            .filter(|s| {
                !known_after_apply(s) && !observed.associated.iter().any(|a| &a.subnet == *s)
            })
            .cloned()
            .collect();
        if !unassociated.is_empty() {
            let out = self
                .ec2
                .describe_route_tables()
                .filters(
                    aws_sdk_ec2::types::Filter::builder()
                        .name("association.subnet-id")
                        .set_values(Some(unassociated.clone()))
                        .build(),
                )
                .filters(filter("vpc-id", &self.spec.vpc_id))
                .send()
                .await
                .upstream("ec2", "DescribeRouteTables")?;
            for t in out.route_tables() {
                let hypds = t.tags().iter().any(|t| t.key() == Some(tags::CLUSTER));
                for a in associations(t) {
                    match (unassociated.contains(&a.subnet), hypds) {
                        (false, _) => {}
                        (true, true) => observed.shared.push(a.subnet),
                        (true, false) => observed.elsewhere.push(a),
                    }
                }
            }
        }
        Ok(observed)
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
            Op::DeleteRoute(route) => {
                let req = self.ec2.delete_route().route_table_id(&id);
                let req = match &route.destination {
                    Destination::Cidr(d) => req.destination_cidr_block(d),
                    Destination::Ipv6(d) => req.destination_ipv6_cidr_block(d),
                    Destination::PrefixList(d) => req.destination_prefix_list_id(d),
                };
                req.send().await.found("ec2", "DeleteRoute")?;
                observed.other_routes.retain(|r| r != route);
            }
            Op::Associate(subnet) => {
                let out = self
                    .ec2
                    .associate_route_table()
                    .route_table_id(&id)
                    .subnet_id(subnet)
                    .send()
                    .await
                    .upstream("ec2", "AssociateRouteTable")?;
                observed.associated.push(Association {
                    id: out.association_id().unwrap_or_default().to_owned(),
                    subnet: subnet.clone(),
                });
            }
            Op::Reassociate(a) => {
                let out = self
                    .ec2
                    .replace_route_table_association()
                    .association_id(&a.id)
                    .route_table_id(&id)
                    .send()
                    .await
                    .upstream("ec2", "ReplaceRouteTableAssociation")?;
                observed.elsewhere.retain(|e| e != a);
                observed.associated.push(Association {
                    id: out.new_association_id().unwrap_or_default().to_owned(),
                    subnet: a.subnet.clone(),
                });
            }
            Op::Disassociate(a) => {
                self.ec2
                    .disassociate_route_table()
                    .association_id(&a.id)
                    .send()
                    .await
                    .found("ec2", "DisassociateRouteTable")?;
                observed.associated.retain(|x| x != a);
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
            Op::DeleteRoute(route) => Change::new(Action::Update, KIND, shown).field(
                format!("routes[{}]", route.destination),
                Some(json!(route.target)),
                None,
            ),
            Op::Associate(subnet) => Change::new(Action::Update, KIND, shown).field(
                "associations",
                None,
                Some(json!(subnet)),
            ),
            Op::Reassociate(a) => Change::new(Action::Update, KIND, shown).field(
                "associations",
                Some(json!(format!("{} (with another route table)", a.subnet))),
                Some(json!(a.subnet)),
            ),
            Op::Disassociate(a) => Change::new(Action::Update, KIND, shown).field(
                "associations",
                Some(json!(a.subnet)),
                None,
            ),
        }
    }
    fn assume(&self, op: &Op, observed: &mut Observed) {
        match op {
            Op::Create => observed.id = Some(KNOWN_AFTER_APPLY.to_owned()),
            Op::CreateRoute | Op::ReplaceRoute => {
                observed.default_route = Some(self.spec.default_route.id().to_owned())
            }
            Op::DeleteRoute(route) => observed.other_routes.retain(|r| r != route),
            Op::Associate(subnet) => observed.associated.push(Association {
                id: KNOWN_AFTER_APPLY.to_owned(),
                subnet: subnet.clone(),
            }),
            Op::Reassociate(a) => {
                observed.elsewhere.retain(|e| e != a);
                observed.associated.push(Association {
                    id: KNOWN_AFTER_APPLY.to_owned(),
                    subnet: a.subnet.clone(),
                });
            }
            Op::Disassociate(a) => observed.associated.retain(|x| x != a),
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

    fn private_table() -> RouteTableSpec {
        RouteTableSpec {
            cluster: "ml".into(),
            role: "private".into(),
            vpc_id: "vpc-1".into(),
            default_route: Target::NatGateway("nat-1".into()),
            subnet_ids: vec!["subnet-1".into(), "subnet-2".into()],
        }
    }

    #[test]
    fn a_default_route_pointing_elsewhere_is_replaced() {
        let spec = private_table();
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
            associated: vec![association("subnet-1"), association("subnet-2")],
            ..Observed::default()
        };
        assert_eq!(diff(&spec, &drifted), [Op::ReplaceRoute]);
        let fine = Observed {
            default_route: Some("nat-1".into()),
            ..drifted
        };
        assert!(diff(&spec, &fine).is_empty());
    }

    fn association(subnet: &str) -> Association {
        Association {
            id: format!("rtbassoc-{subnet}"),
            subnet: subnet.into(),
        }
    }

    #[test]
    fn routes_and_associations_someone_else_made_are_undone() {
        let spec = private_table();
        let peering = OtherRoute {
            destination: Destination::Cidr("10.50.0.0/16".into()),
            target: "pcx-1".into(),
        };
        let moved = association("subnet-2");
        let theirs = association("subnet-9");
        let drifted = Observed {
            id: Some("rtb-1".into()),
            default_route: Some("nat-1".into()),
            associated: vec![association("subnet-1"), theirs.clone()],
            other_routes: vec![peering.clone()],
            elsewhere: vec![moved.clone()],
            shared: Vec::new(),
        };
        let ops = diff(&spec, &drifted);
        assert_eq!(
            ops,
            [
                Op::DeleteRoute(peering),
                Op::Reassociate(moved),
                Op::Disassociate(theirs)
            ]
        );
        // What a plan assumes the changes leave is what needs no change.
        let table = RouteTable {
            ec2: Client::from_conf(
                aws_sdk_ec2::Config::builder()
                    .behavior_version(aws_sdk_ec2::config::BehaviorVersion::latest())
                    .build(),
            ),
            spec: spec.clone(),
        };
        let mut after = drifted;
        for op in &ops {
            table.assume(op, &mut after);
        }
        assert!(diff(&spec, &after).is_empty(), "{after:?}");
        // A subnet another cluster's table routes is left with it.
        let shared = Observed {
            associated: vec![association("subnet-1")],
            shared: vec!["subnet-2".into()],
            ..after
        };
        assert!(diff(&spec, &shared).is_empty());
    }
}
