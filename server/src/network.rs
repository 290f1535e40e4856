//! A cluster's network in EC2: a VPC (new, with a /16 that overlaps no other VPC of the
//! region, or the user's), public and private /24s in two AZs for the EKS control plane,
//! a /20 compute subnet in the accelerated capacity's AZ, Internet and NAT gateways,
//! route tables, an S3 gateway endpoint and a security group open within itself (EFA).
//!
//! Everything hypd creates is tagged at creation (`TagSpecifications`, so a crash between
//! a create and its tagging cannot leave an unknown resource) with `hypd:managed=true`,
//! `hypd:cluster=<name>` and a `hypd:role`; each step finds its resource by those tags
//! before creating it, so running it again adopts what exists.

use std::net::Ipv4Addr;
use std::time::Duration;

use app::api::ApiError;
use app::api::clusters::NetworkOptions;
use app::api::values::Cidr;
use aws_sdk_ec2::Client;
use aws_sdk_ec2::error::ProvideErrorMetadata;
use aws_sdk_ec2::types::{
    Filter, IpPermission, NatGatewayState, ResourceType, Tag, TagSpecification, UserIdGroupPair,
    VpcEndpointType,
};
use serde::{Deserialize, Serialize};

use crate::aws::Aws;
use crate::operation::pipeline::Progress;

pub const MANAGED_TAG: &str = "hypd:managed";
pub const CLUSTER_TAG: &str = "hypd:cluster";
pub const ROLE_TAG: &str = "hypd:role";

/// Control-plane subnets (two AZs each) and the compute subnet's size.
const CONTROL_PREFIX: u8 = 24;
const COMPUTE_PREFIX: u8 = 20;
const NAT_POLL: Duration = Duration::from_secs(15);

/// What the network stage made or adopted.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Network {
    pub vpc_id: Option<String>,
    pub vpc_cidr: Option<String>,
    /// False when the user named an existing VPC: teardown leaves it.
    pub vpc_created: bool,
    /// The accelerated capacity's AZ first, then a second one for the control plane.
    pub availability_zones: Vec<String>,
    pub public_subnet_ids: Vec<String>,
    pub private_subnet_ids: Vec<String>,
    pub compute_subnet_id: Option<String>,
    pub internet_gateway_id: Option<String>,
    pub nat_gateway_id: Option<String>,
    pub public_route_table_id: Option<String>,
    pub private_route_table_id: Option<String>,
    pub s3_endpoint_id: Option<String>,
    pub security_group_id: Option<String>,
}

fn tag(k: &str, v: &str) -> Tag {
    Tag::builder().key(k).value(v).build()
}

fn filter(name: &str, value: &str) -> Filter {
    Filter::builder().name(name).values(value).build()
}

/// The tags of a resource hypd makes for `cluster` in role `role`.
fn tags_for(
    kind: ResourceType,
    cluster: &str,
    role: &str,
    extra: &[(String, String)],
) -> TagSpecification {
    let mut tags = vec![
        tag(MANAGED_TAG, "true"),
        tag(CLUSTER_TAG, cluster),
        tag(ROLE_TAG, role),
        tag("Name", &format!("hypd-{cluster}-{role}")),
    ];
    tags.extend(extra.iter().map(|(k, v)| tag(k, v)));
    TagSpecification::builder()
        .resource_type(kind)
        .set_tags(Some(tags))
        .build()
}

/// Filters selecting the resource hypd made for `cluster` in role `role`.
fn ours(cluster: &str, role: &str) -> Vec<Filter> {
    vec![
        filter(&format!("tag:{CLUSTER_TAG}"), cluster),
        filter(&format!("tag:{ROLE_TAG}"), role),
    ]
}

/// The first block of `prefix` bits inside `within` that overlaps none of `used`.
pub fn free_block(within: Cidr, used: &[Cidr], prefix: u8) -> Option<Cidr> {
    if prefix < within.prefix() {
        return None;
    }
    let (start, end) = within.range();
    let size = 1u64 << (32 - prefix);
    let mut at = u64::from(start);
    while at + size - 1 <= u64::from(end) {
        let candidate = Cidr::new(Ipv4Addr::from(at as u32), prefix).ok()?;
        if !used.iter().any(|u| u.overlaps(candidate)) {
            return Some(candidate);
        }
        at += size;
    }
    None
}

/// A /16 for a new VPC in 10.0.0.0/8 that overlaps none of the region's VPCs.
pub fn free_vpc_block(existing: &[Cidr]) -> Option<Cidr> {
    (0..=255u8).find_map(|second| {
        let c = Cidr::new(Ipv4Addr::new(10, second, 0, 0), 16).ok()?;
        (!existing.iter().any(|e| e.overlaps(c))).then_some(c)
    })
}

/// The region's VPC blocks (each VPC's primary and associated IPv4 blocks).
async fn vpc_blocks(ec2: &Client) -> Result<Vec<(String, Cidr)>, ApiError> {
    let out = ec2
        .describe_vpcs()
        .send()
        .await
        .map_err(|e| crate::aws::upstream("ec2", "DescribeVpcs", e))?;
    let mut blocks = Vec::new();
    for v in out.vpcs() {
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
    Ok(blocks)
}

/// Pre-flight: a requested VPC block must not overlap the region's VPCs, and a named VPC
/// must exist. Field errors name `network.vpc_cidr` / `network.vpc_id`.
pub async fn check(aws: &Aws, region: &str, opts: &NetworkOptions) -> Result<(), ApiError> {
    let ec2 = aws.ec2(region);
    if let Some(cidr) = opts.vpc_cidr {
        let blocks = vpc_blocks(&ec2).await?;
        if let Some((id, b)) = blocks.iter().find(|(_, b)| b.overlaps(cidr)) {
            return Err(ApiError::field(
                "network.vpc_cidr",
                format!(
                    "{cidr} overlaps {id} ({b}); choose a /16 that no VPC in {region} uses, or omit it to let hypd choose"
                ),
            ));
        }
    }
    if let Some(vpc) = &opts.vpc_id {
        let found = ec2
            .describe_vpcs()
            .filters(filter("vpc-id", vpc.as_str()))
            .send()
            .await
            .map_err(|e| crate::aws::upstream("ec2", "DescribeVpcs", e))?;
        if found.vpcs().is_empty() {
            return Err(ApiError::field(
                "network.vpc_id",
                format!("there is no VPC {vpc} in {region}"),
            ));
        }
    }
    Ok(())
}

/// Makes (or adopts) the cluster's network; `out` keeps what exists so far.
pub async fn ensure(
    aws: &Aws,
    region: &str,
    cluster: &str,
    zone: &str,
    opts: &NetworkOptions,
    out: &mut Network,
) -> Result<Progress, ApiError> {
    let ec2 = aws.ec2(region);
    let (vpc_id, vpc_cidr) = ensure_vpc(&ec2, cluster, opts, out).await?;
    out.availability_zones = zones(&ec2, zone).await?;
    let igw = ensure_internet_gateway(&ec2, cluster, &vpc_id).await?;
    out.internet_gateway_id = Some(igw.clone());

    let mut public = Vec::new();
    let mut private = Vec::new();
    for (i, az) in out.availability_zones.clone().iter().enumerate() {
        let n = i + 1;
        let elb = [("kubernetes.io/role/elb".to_owned(), "1".to_owned())];
        public.push(
            ensure_subnet(
                &ec2,
                cluster,
                &vpc_id,
                vpc_cidr,
                az,
                &format!("public-{n}"),
                CONTROL_PREFIX,
                &elb,
            )
            .await?,
        );
        private.push(
            ensure_subnet(
                &ec2,
                cluster,
                &vpc_id,
                vpc_cidr,
                az,
                &format!("private-{n}"),
                CONTROL_PREFIX,
                &internal_tags(cluster),
            )
            .await?,
        );
    }
    out.public_subnet_ids = public.clone();
    out.private_subnet_ids = private.clone();
    let compute = compute_subnet(&ec2, cluster, &vpc_id, vpc_cidr, zone).await?;
    out.compute_subnet_id = Some(compute.clone());

    let nat = match ensure_nat_gateway(&ec2, cluster, &public[0]).await? {
        (id, NatGatewayState::Available) => id,
        (id, state) => {
            out.nat_gateway_id = Some(id);
            return Ok(Progress::wait(
                NAT_POLL,
                format!("NAT gateway is {}", state.as_str()),
            ));
        }
    };
    out.nat_gateway_id = Some(nat.clone());

    let public_rt = ensure_route_table(
        &ec2,
        cluster,
        &vpc_id,
        "public",
        Route::Internet(&igw),
        &public,
    )
    .await?;
    out.public_route_table_id = Some(public_rt);
    let mut private_subnets = private.clone();
    private_subnets.push(compute.clone());
    let private_rt = ensure_route_table(
        &ec2,
        cluster,
        &vpc_id,
        "private",
        Route::Nat(&nat),
        &private_subnets,
    )
    .await?;
    out.private_route_table_id = Some(private_rt.clone());
    out.s3_endpoint_id =
        Some(ensure_s3_endpoint(&ec2, cluster, region, &vpc_id, &private_rt).await?);
    out.security_group_id = Some(ensure_security_group(&ec2, cluster, &vpc_id).await?);
    Ok(Progress::Done)
}

fn internal_tags(cluster: &str) -> Vec<(String, String)> {
    vec![
        ("kubernetes.io/role/internal-elb".to_owned(), "1".to_owned()),
        (
            format!("kubernetes.io/cluster/{cluster}"),
            "shared".to_owned(),
        ),
        ("karpenter.sh/discovery".to_owned(), cluster.to_owned()),
    ]
}

async fn ensure_vpc(
    ec2: &Client,
    cluster: &str,
    opts: &NetworkOptions,
    out: &mut Network,
) -> Result<(String, Cidr), ApiError> {
    let parse = |c: Option<&str>| {
        c.and_then(|c| Cidr::parse(c).ok())
            .ok_or_else(|| ApiError::internal("VPC without an IPv4 block"))
    };
    if let Some(id) = &opts.vpc_id {
        let found = ec2
            .describe_vpcs()
            .filters(filter("vpc-id", id.as_str()))
            .send()
            .await
            .map_err(|e| crate::aws::upstream("ec2", "DescribeVpcs", e))?;
        let vpc = found
            .vpcs()
            .first()
            .ok_or_else(|| ApiError::field("network.vpc_id", format!("there is no VPC {id}")))?;
        let cidr = parse(vpc.cidr_block())?;
        out.vpc_id = Some(id.to_string());
        out.vpc_cidr = Some(cidr.to_string());
        out.vpc_created = false;
        return Ok((id.to_string(), cidr));
    }
    let found = ec2
        .describe_vpcs()
        .set_filters(Some(ours(cluster, "vpc")))
        .send()
        .await
        .map_err(|e| crate::aws::upstream("ec2", "DescribeVpcs", e))?;
    if let Some(vpc) = found.vpcs().first() {
        let id = vpc.vpc_id().unwrap_or_default().to_owned();
        let cidr = parse(vpc.cidr_block())?;
        out.vpc_id = Some(id.clone());
        out.vpc_cidr = Some(cidr.to_string());
        out.vpc_created = true;
        return Ok((id, cidr));
    }
    let cidr = match opts.vpc_cidr {
        Some(c) => c,
        None => {
            let used: Vec<Cidr> = vpc_blocks(ec2).await?.into_iter().map(|(_, c)| c).collect();
            free_vpc_block(&used).ok_or_else(|| {
                ApiError::field("network.vpc_cidr", "every /16 of 10.0.0.0/8 is used by a VPC in this region; name one with vpc_cidr or vpc_id")
            })?
        }
    };
    let created = ec2
        .create_vpc()
        .cidr_block(cidr.to_string())
        .tag_specifications(tags_for(ResourceType::Vpc, cluster, "vpc", &[]))
        .send()
        .await
        .map_err(|e| crate::aws::upstream("ec2", "CreateVpc", e))?;
    let id = created
        .vpc()
        .and_then(|v| v.vpc_id())
        .ok_or_else(|| ApiError::internal("CreateVpc answered without an id"))?
        .to_owned();
    // EKS's private endpoint and the nodes need DNS names inside the VPC.
    for hostnames in [false, true] {
        let req = ec2.modify_vpc_attribute().vpc_id(&id);
        let value = aws_sdk_ec2::types::AttributeBooleanValue::builder()
            .value(true)
            .build();
        let req = if hostnames {
            req.enable_dns_hostnames(value)
        } else {
            req.enable_dns_support(value)
        };
        req.send()
            .await
            .map_err(|e| crate::aws::upstream("ec2", "ModifyVpcAttribute", e))?;
    }
    out.vpc_id = Some(id.clone());
    out.vpc_cidr = Some(cidr.to_string());
    out.vpc_created = true;
    Ok((id, cidr))
}

/// `zone` and the first other zone of the region (EKS needs subnets in two AZs).
async fn zones(ec2: &Client, zone: &str) -> Result<Vec<String>, ApiError> {
    let out = ec2
        .describe_availability_zones()
        .send()
        .await
        .map_err(|e| crate::aws::upstream("ec2", "DescribeAvailabilityZones", e))?;
    let mut names: Vec<String> = out
        .availability_zones()
        .iter()
        .filter_map(|z| z.zone_name().map(str::to_owned))
        .collect();
    names.sort();
    if !names.iter().any(|n| n == zone) {
        return Err(ApiError::field(
            "availability_zone",
            format!(
                "{zone} is not an Availability Zone here; choose one of: {}",
                names.join(", ")
            ),
        ));
    }
    let other = names.iter().find(|n| *n != zone).ok_or_else(|| {
        ApiError::field(
            "availability_zone",
            "EKS needs two Availability Zones; this region has one",
        )
    })?;
    Ok(vec![zone.to_owned(), other.clone()])
}

async fn subnets_of(
    ec2: &Client,
    vpc_id: &str,
) -> Result<Vec<aws_sdk_ec2::types::Subnet>, ApiError> {
    let out = ec2
        .describe_subnets()
        .filters(filter("vpc-id", vpc_id))
        .send()
        .await
        .map_err(|e| crate::aws::upstream("ec2", "DescribeSubnets", e))?;
    Ok(out.subnets().to_vec())
}

fn has_tag(tags: &[Tag], k: &str, v: &str) -> bool {
    tags.iter()
        .any(|t| t.key() == Some(k) && t.value() == Some(v))
}

#[allow(clippy::too_many_arguments)]
async fn ensure_subnet(
    ec2: &Client,
    cluster: &str,
    vpc_id: &str,
    vpc_cidr: Cidr,
    az: &str,
    role: &str,
    prefix: u8,
    extra: &[(String, String)],
) -> Result<String, ApiError> {
    let subnets = subnets_of(ec2, vpc_id).await?;
    if let Some(s) = subnets
        .iter()
        .find(|s| has_tag(s.tags(), CLUSTER_TAG, cluster) && has_tag(s.tags(), ROLE_TAG, role))
    {
        return Ok(s.subnet_id().unwrap_or_default().to_owned());
    }
    create_subnet(
        ec2, cluster, vpc_id, vpc_cidr, az, role, prefix, extra, &subnets,
    )
    .await
}

#[allow(clippy::too_many_arguments)]
async fn create_subnet(
    ec2: &Client,
    cluster: &str,
    vpc_id: &str,
    vpc_cidr: Cidr,
    az: &str,
    role: &str,
    prefix: u8,
    extra: &[(String, String)],
    existing: &[aws_sdk_ec2::types::Subnet],
) -> Result<String, ApiError> {
    let used: Vec<Cidr> = existing
        .iter()
        .filter_map(|s| s.cidr_block().and_then(|c| Cidr::parse(c).ok()))
        .collect();
    let block = free_block(vpc_cidr, &used, prefix).ok_or_else(|| {
        ApiError::field(
            "network.vpc_id",
            format!("{vpc_id} ({vpc_cidr}) has no free /{prefix} left for the {role} subnet"),
        )
    })?;
    let out = ec2
        .create_subnet()
        .vpc_id(vpc_id)
        .cidr_block(block.to_string())
        .availability_zone(az)
        .tag_specifications(tags_for(ResourceType::Subnet, cluster, role, extra))
        .send()
        .await
        .map_err(|e| crate::aws::upstream("ec2", "CreateSubnet", e))?;
    out.subnet()
        .and_then(|s| s.subnet_id())
        .map(str::to_owned)
        .ok_or_else(|| ApiError::internal("CreateSubnet answered without an id"))
}

/// The /20 compute subnet in `az`: every capacity path (instance groups, training plans,
/// spot) gets its subnet here. A compute subnet of the VPC in that AZ that hypd made for
/// any cluster is shared rather than carving another /20 out of the VPC.
pub async fn compute_subnet(
    ec2: &Client,
    cluster: &str,
    vpc_id: &str,
    vpc_cidr: Cidr,
    az: &str,
) -> Result<String, ApiError> {
    let subnets = subnets_of(ec2, vpc_id).await?;
    let shared = subnets.iter().find(|s| {
        s.availability_zone() == Some(az)
            && has_tag(s.tags(), MANAGED_TAG, "true")
            && has_tag(s.tags(), ROLE_TAG, "compute")
            && s.cidr_block()
                .and_then(|c| Cidr::parse(c).ok())
                .is_some_and(|c| c.prefix() <= COMPUTE_PREFIX)
    });
    if let Some(s) = shared {
        return Ok(s.subnet_id().unwrap_or_default().to_owned());
    }
    create_subnet(
        ec2,
        cluster,
        vpc_id,
        vpc_cidr,
        az,
        "compute",
        COMPUTE_PREFIX,
        &internal_tags(cluster),
        &subnets,
    )
    .await
}

async fn ensure_internet_gateway(
    ec2: &Client,
    cluster: &str,
    vpc_id: &str,
) -> Result<String, ApiError> {
    let attached = ec2
        .describe_internet_gateways()
        .filters(filter("attachment.vpc-id", vpc_id))
        .send()
        .await
        .map_err(|e| crate::aws::upstream("ec2", "DescribeInternetGateways", e))?;
    if let Some(g) = attached.internet_gateways().first() {
        return Ok(g.internet_gateway_id().unwrap_or_default().to_owned());
    }
    // Made earlier but not attached (a crash in between): attach it now.
    let ours_found = ec2
        .describe_internet_gateways()
        .set_filters(Some(ours(cluster, "igw")))
        .send()
        .await
        .map_err(|e| crate::aws::upstream("ec2", "DescribeInternetGateways", e))?;
    let id = match ours_found.internet_gateways().first() {
        Some(g) => g.internet_gateway_id().unwrap_or_default().to_owned(),
        None => ec2
            .create_internet_gateway()
            .tag_specifications(tags_for(ResourceType::InternetGateway, cluster, "igw", &[]))
            .send()
            .await
            .map_err(|e| crate::aws::upstream("ec2", "CreateInternetGateway", e))?
            .internet_gateway()
            .and_then(|g| g.internet_gateway_id())
            .ok_or_else(|| ApiError::internal("CreateInternetGateway answered without an id"))?
            .to_owned(),
    };
    ec2.attach_internet_gateway()
        .internet_gateway_id(&id)
        .vpc_id(vpc_id)
        .send()
        .await
        .map_err(|e| crate::aws::upstream("ec2", "AttachInternetGateway", e))?;
    Ok(id)
}

async fn ensure_nat_gateway(
    ec2: &Client,
    cluster: &str,
    public_subnet: &str,
) -> Result<(String, NatGatewayState), ApiError> {
    let found = nat_gateways_of(ec2, cluster).await?;
    let live = found.iter().find(|g| {
        matches!(
            g.state(),
            Some(NatGatewayState::Pending | NatGatewayState::Available)
        )
    });
    if let Some(g) = live {
        return Ok((
            g.nat_gateway_id().unwrap_or_default().to_owned(),
            g.state().cloned().unwrap_or(NatGatewayState::Pending),
        ));
    }
    let eips = addresses_of(ec2, cluster).await?;
    let allocation = match eips.iter().find(|a| has_tag(a.tags(), ROLE_TAG, "nat-eip")) {
        Some(a) => a.allocation_id().unwrap_or_default().to_owned(),
        None => ec2
            .allocate_address()
            .domain(aws_sdk_ec2::types::DomainType::Vpc)
            .tag_specifications(tags_for(ResourceType::ElasticIp, cluster, "nat-eip", &[]))
            .send()
            .await
            .map_err(|e| crate::aws::upstream("ec2", "AllocateAddress", e))?
            .allocation_id()
            .ok_or_else(|| ApiError::internal("AllocateAddress answered without an id"))?
            .to_owned(),
    };
    let created = ec2
        .create_nat_gateway()
        .subnet_id(public_subnet)
        .allocation_id(&allocation)
        // The same token makes a repeated call after a crash return the first gateway.
        .client_token(format!("hypd-{cluster}-nat"))
        .tag_specifications(tags_for(ResourceType::Natgateway, cluster, "nat", &[]))
        .send()
        .await
        .map_err(|e| crate::aws::upstream("ec2", "CreateNatGateway", e))?;
    let g = created
        .nat_gateway()
        .ok_or_else(|| ApiError::internal("CreateNatGateway answered without a gateway"))?;
    Ok((
        g.nat_gateway_id().unwrap_or_default().to_owned(),
        g.state().cloned().unwrap_or(NatGatewayState::Pending),
    ))
}

enum Route<'a> {
    Internet(&'a str),
    Nat(&'a str),
}

async fn ensure_route_table(
    ec2: &Client,
    cluster: &str,
    vpc_id: &str,
    role: &str,
    default_route: Route<'_>,
    subnets: &[String],
) -> Result<String, ApiError> {
    let found = ec2
        .describe_route_tables()
        .set_filters(Some(ours(cluster, &format!("{role}-rt"))))
        .send()
        .await
        .map_err(|e| crate::aws::upstream("ec2", "DescribeRouteTables", e))?;
    let (id, table) = match found.route_tables().first() {
        Some(t) => (
            t.route_table_id().unwrap_or_default().to_owned(),
            Some(t.clone()),
        ),
        None => {
            let t = ec2
                .create_route_table()
                .vpc_id(vpc_id)
                .tag_specifications(tags_for(
                    ResourceType::RouteTable,
                    cluster,
                    &format!("{role}-rt"),
                    &[],
                ))
                .send()
                .await
                .map_err(|e| crate::aws::upstream("ec2", "CreateRouteTable", e))?;
            let id = t
                .route_table()
                .and_then(|t| t.route_table_id())
                .ok_or_else(|| ApiError::internal("CreateRouteTable answered without an id"))?
                .to_owned();
            (id, None)
        }
    };
    let has_default = table.as_ref().is_some_and(|t| {
        t.routes()
            .iter()
            .any(|r| r.destination_cidr_block() == Some("0.0.0.0/0"))
    });
    if !has_default {
        let req = ec2
            .create_route()
            .route_table_id(&id)
            .destination_cidr_block("0.0.0.0/0");
        let req = match default_route {
            Route::Internet(g) => req.gateway_id(g),
            Route::Nat(n) => req.nat_gateway_id(n),
        };
        if let Err(e) = req.send().await
            && e.code() != Some("RouteAlreadyExists")
        {
            return Err(crate::aws::upstream("ec2", "CreateRoute", e));
        }
    }
    let associated: Vec<String> = table
        .as_ref()
        .map(|t| {
            t.associations()
                .iter()
                .filter_map(|a| a.subnet_id().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    for s in subnets.iter().filter(|s| !associated.contains(s)) {
        if let Err(e) = ec2
            .associate_route_table()
            .route_table_id(&id)
            .subnet_id(s)
            .send()
            .await
            && e.code() != Some("Resource.AlreadyAssociated")
        {
            return Err(crate::aws::upstream("ec2", "AssociateRouteTable", e));
        }
    }
    Ok(id)
}

async fn ensure_s3_endpoint(
    ec2: &Client,
    cluster: &str,
    region: &str,
    vpc_id: &str,
    route_table: &str,
) -> Result<String, ApiError> {
    let service = format!("com.amazonaws.{region}.s3");
    let found = ec2
        .describe_vpc_endpoints()
        .filters(filter("vpc-id", vpc_id))
        .filters(filter("service-name", &service))
        .send()
        .await
        .map_err(|e| crate::aws::upstream("ec2", "DescribeVpcEndpoints", e))?;
    let live = found
        .vpc_endpoints()
        .iter()
        .find(|e| !matches!(e.state().map(|s| s.as_str()), Some("deleted" | "deleting")));
    if let Some(e) = live {
        return Ok(e.vpc_endpoint_id().unwrap_or_default().to_owned());
    }
    let created = ec2
        .create_vpc_endpoint()
        .vpc_id(vpc_id)
        .service_name(&service)
        .vpc_endpoint_type(VpcEndpointType::Gateway)
        .route_table_ids(route_table)
        .client_token(format!("hypd-{cluster}-s3"))
        .tag_specifications(tags_for(
            ResourceType::VpcEndpoint,
            cluster,
            "s3-endpoint",
            &[],
        ))
        .send()
        .await
        .map_err(|e| crate::aws::upstream("ec2", "CreateVpcEndpoint", e))?;
    created
        .vpc_endpoint()
        .and_then(|e| e.vpc_endpoint_id())
        .map(str::to_owned)
        .ok_or_else(|| ApiError::internal("CreateVpcEndpoint answered without an id"))
}

async fn ensure_security_group(
    ec2: &Client,
    cluster: &str,
    vpc_id: &str,
) -> Result<String, ApiError> {
    let name = format!("hypd-{cluster}-efa");
    let found = ec2
        .describe_security_groups()
        .filters(filter("vpc-id", vpc_id))
        .filters(filter("group-name", &name))
        .send()
        .await
        .map_err(|e| crate::aws::upstream("ec2", "DescribeSecurityGroups", e))?;
    let (id, existing) = match found.security_groups().first() {
        Some(g) => (g.group_id().unwrap_or_default().to_owned(), Some(g.clone())),
        None => {
            let g = ec2
                .create_security_group()
                .group_name(&name)
                .description(format!(
                    "hypd {cluster}: all traffic within the group (EFA), all egress"
                ))
                .vpc_id(vpc_id)
                .tag_specifications(tags_for(
                    ResourceType::SecurityGroup,
                    cluster,
                    "efa-sg",
                    &[],
                ))
                .send()
                .await
                .map_err(|e| crate::aws::upstream("ec2", "CreateSecurityGroup", e))?;
            (
                g.group_id()
                    .ok_or_else(|| {
                        ApiError::internal("CreateSecurityGroup answered without an id")
                    })?
                    .to_owned(),
                None,
            )
        }
    };
    let self_rule = |perms: &[IpPermission]| {
        perms.iter().any(|p| {
            p.ip_protocol() == Some("-1")
                && p.user_id_group_pairs()
                    .iter()
                    .any(|u| u.group_id() == Some(id.as_str()))
        })
    };
    let rule = IpPermission::builder()
        .ip_protocol("-1")
        .user_id_group_pairs(UserIdGroupPair::builder().group_id(&id).build())
        .build();
    let has_ingress = existing
        .as_ref()
        .is_some_and(|g| self_rule(g.ip_permissions()));
    if !has_ingress
        && let Err(e) = ec2
            .authorize_security_group_ingress()
            .group_id(&id)
            .ip_permissions(rule.clone())
            .send()
            .await
        && e.code() != Some("InvalidPermission.Duplicate")
    {
        return Err(crate::aws::upstream(
            "ec2",
            "AuthorizeSecurityGroupIngress",
            e,
        ));
    }
    // EFA also needs an explicit egress rule to the group itself (the default
    // allow-all egress rule stays).
    let has_egress = existing
        .as_ref()
        .is_some_and(|g| self_rule(g.ip_permissions_egress()));
    if !has_egress
        && let Err(e) = ec2
            .authorize_security_group_egress()
            .group_id(&id)
            .ip_permissions(rule)
            .send()
            .await
        && e.code() != Some("InvalidPermission.Duplicate")
    {
        return Err(crate::aws::upstream(
            "ec2",
            "AuthorizeSecurityGroupEgress",
            e,
        ));
    }
    Ok(id)
}

/// Deletes, in dependency order, every EC2 resource tagged as `cluster`'s (and nothing
/// else: a VPC the user named stays, as do its other subnets). Waits while the NAT
/// gateway is deleting; returns Done once nothing of the cluster's is left.
pub async fn teardown(aws: &Aws, region: &str, cluster: &str) -> Result<Progress, ApiError> {
    let ec2 = aws.ec2(region);
    let by_cluster = || vec![filter(&format!("tag:{CLUSTER_TAG}"), cluster)];

    let endpoints = ec2
        .describe_vpc_endpoints()
        .set_filters(Some(by_cluster()))
        .send()
        .await
        .map_err(|e| crate::aws::upstream("ec2", "DescribeVpcEndpoints", e))?;
    let endpoint_ids: Vec<String> = endpoints
        .vpc_endpoints()
        .iter()
        .filter(|e| !matches!(e.state().map(|s| s.as_str()), Some("deleted")))
        .filter_map(|e| e.vpc_endpoint_id().map(str::to_owned))
        .collect();
    if !endpoint_ids.is_empty() {
        ec2.delete_vpc_endpoints()
            .set_vpc_endpoint_ids(Some(endpoint_ids))
            .send()
            .await
            .map_err(|e| crate::aws::upstream("ec2", "DeleteVpcEndpoints", e))?;
    }

    let mut deleting = false;
    for g in nat_gateways_of(&ec2, cluster).await? {
        match g.state() {
            Some(NatGatewayState::Deleted) => {}
            Some(NatGatewayState::Deleting) => deleting = true,
            _ => {
                ec2.delete_nat_gateway()
                    .nat_gateway_id(g.nat_gateway_id().unwrap_or_default())
                    .send()
                    .await
                    .map_err(|e| crate::aws::upstream("ec2", "DeleteNatGateway", e))?;
                deleting = true;
            }
        }
    }
    // Its address and subnet stay in use until the gateway is gone.
    let still = nat_gateways_of(&ec2, cluster).await?;
    if deleting
        && still
            .iter()
            .any(|g| g.state() != Some(&NatGatewayState::Deleted))
    {
        return Ok(Progress::wait(NAT_POLL, "NAT gateway is deleting"));
    }
    for a in addresses_of(&ec2, cluster).await? {
        ec2.release_address()
            .allocation_id(a.allocation_id().unwrap_or_default())
            .send()
            .await
            .map_err(|e| crate::aws::upstream("ec2", "ReleaseAddress", e))?;
    }

    let tables = ec2
        .describe_route_tables()
        .set_filters(Some(by_cluster()))
        .send()
        .await
        .map_err(|e| crate::aws::upstream("ec2", "DescribeRouteTables", e))?;
    for t in tables.route_tables() {
        for a in t
            .associations()
            .iter()
            .filter(|a| !a.main().unwrap_or(false))
        {
            ec2.disassociate_route_table()
                .association_id(a.route_table_association_id().unwrap_or_default())
                .send()
                .await
                .map_err(|e| crate::aws::upstream("ec2", "DisassociateRouteTable", e))?;
        }
        ec2.delete_route_table()
            .route_table_id(t.route_table_id().unwrap_or_default())
            .send()
            .await
            .map_err(|e| crate::aws::upstream("ec2", "DeleteRouteTable", e))?;
    }

    let subnets = ec2
        .describe_subnets()
        .set_filters(Some(by_cluster()))
        .send()
        .await
        .map_err(|e| crate::aws::upstream("ec2", "DescribeSubnets", e))?;
    for s in subnets.subnets() {
        // A compute subnet shared with another cluster of the VPC stays for it.
        if has_tag(s.tags(), ROLE_TAG, "compute") && shared_elsewhere(&ec2, s, cluster).await? {
            continue;
        }
        ec2.delete_subnet()
            .subnet_id(s.subnet_id().unwrap_or_default())
            .send()
            .await
            .map_err(|e| crate::aws::upstream("ec2", "DeleteSubnet", e))?;
    }

    let groups = ec2
        .describe_security_groups()
        .set_filters(Some(by_cluster()))
        .send()
        .await
        .map_err(|e| crate::aws::upstream("ec2", "DescribeSecurityGroups", e))?;
    for g in groups.security_groups() {
        ec2.delete_security_group()
            .group_id(g.group_id().unwrap_or_default())
            .send()
            .await
            .map_err(|e| crate::aws::upstream("ec2", "DeleteSecurityGroup", e))?;
    }

    let igws = ec2
        .describe_internet_gateways()
        .set_filters(Some(by_cluster()))
        .send()
        .await
        .map_err(|e| crate::aws::upstream("ec2", "DescribeInternetGateways", e))?;
    for g in igws.internet_gateways() {
        let id = g.internet_gateway_id().unwrap_or_default();
        for a in g.attachments() {
            ec2.detach_internet_gateway()
                .internet_gateway_id(id)
                .vpc_id(a.vpc_id().unwrap_or_default())
                .send()
                .await
                .map_err(|e| crate::aws::upstream("ec2", "DetachInternetGateway", e))?;
        }
        ec2.delete_internet_gateway()
            .internet_gateway_id(id)
            .send()
            .await
            .map_err(|e| crate::aws::upstream("ec2", "DeleteInternetGateway", e))?;
    }

    let vpcs = ec2
        .describe_vpcs()
        .set_filters(Some(ours(cluster, "vpc")))
        .send()
        .await
        .map_err(|e| crate::aws::upstream("ec2", "DescribeVpcs", e))?;
    for v in vpcs.vpcs() {
        ec2.delete_vpc()
            .vpc_id(v.vpc_id().unwrap_or_default())
            .send()
            .await
            .map_err(|e| crate::aws::upstream("ec2", "DeleteVpc", e))?;
    }
    Ok(Progress::Done)
}

/// The NAT gateways tagged as `cluster`'s, matched here for the same reason.
async fn nat_gateways_of(
    ec2: &Client,
    cluster: &str,
) -> Result<Vec<aws_sdk_ec2::types::NatGateway>, ApiError> {
    let out = ec2
        .describe_nat_gateways()
        .send()
        .await
        .map_err(|e| crate::aws::upstream("ec2", "DescribeNatGateways", e))?;
    Ok(out
        .nat_gateways()
        .iter()
        .filter(|g| has_tag(g.tags(), CLUSTER_TAG, cluster))
        .cloned()
        .collect())
}

/// The Elastic IPs tagged as `cluster`'s. Tags are matched here rather than with a
/// `tag:` filter, which some EC2 implementations ignore for addresses.
async fn addresses_of(
    ec2: &Client,
    cluster: &str,
) -> Result<Vec<aws_sdk_ec2::types::Address>, ApiError> {
    let out = ec2
        .describe_addresses()
        .send()
        .await
        .map_err(|e| crate::aws::upstream("ec2", "DescribeAddresses", e))?;
    Ok(out
        .addresses()
        .iter()
        .filter(|a| has_tag(a.tags(), CLUSTER_TAG, cluster))
        .cloned()
        .collect())
}

/// True when another cluster's HyperPod may be using this compute subnet: another
/// cluster of the same VPC has hypd resources.
async fn shared_elsewhere(
    ec2: &Client,
    subnet: &aws_sdk_ec2::types::Subnet,
    cluster: &str,
) -> Result<bool, ApiError> {
    let Some(vpc) = subnet.vpc_id() else {
        return Ok(false);
    };
    let others = subnets_of(ec2, vpc).await?;
    Ok(others.iter().any(|o| {
        has_tag(o.tags(), MANAGED_TAG, "true") && !has_tag(o.tags(), CLUSTER_TAG, cluster)
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(s: &str) -> Cidr {
        Cidr::parse(s).unwrap()
    }

    #[test]
    fn blocks_are_the_first_free_aligned_ones() {
        let vpc = c("10.3.0.0/16");
        assert_eq!(free_block(vpc, &[], 24), Some(c("10.3.0.0/24")));
        let used = [
            c("10.3.0.0/24"),
            c("10.3.1.0/24"),
            c("10.3.2.0/24"),
            c("10.3.3.0/24"),
        ];
        // A /20 must be aligned: the first free one starts at 10.3.16.0.
        assert_eq!(free_block(vpc, &used, 20), Some(c("10.3.16.0/20")));
        assert_eq!(free_block(vpc, &used, 24), Some(c("10.3.4.0/24")));
        let full: Vec<Cidr> = (0..16)
            .map(|i| c(&format!("10.3.{}.0/20", i * 16)))
            .collect();
        assert_eq!(free_block(vpc, &full, 20), None);
        assert_eq!(free_block(c("10.3.0.0/20"), &[], 16), None);
    }

    #[test]
    fn vpc_blocks_avoid_every_existing_vpc() {
        assert_eq!(free_vpc_block(&[]), Some(c("10.0.0.0/16")));
        let used = [c("10.0.0.0/16"), c("10.1.128.0/17"), c("172.31.0.0/16")];
        assert_eq!(free_vpc_block(&used), Some(c("10.2.0.0/16")));
        let all: Vec<Cidr> = (0..=255).map(|i| c(&format!("10.{i}.0.0/16"))).collect();
        assert_eq!(free_vpc_block(&all), None);
    }
}
