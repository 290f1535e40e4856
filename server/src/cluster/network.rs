//! A cluster's network, composed from EC2 resources: a VPC (new, with a /16 that overlaps
//! no other VPC of the region, or the user's), public and private /24s in two AZs for the
//! EKS control plane, a /20 compute subnet in the accelerated capacity's AZ, Internet and
//! NAT gateways, route tables, an S3 gateway endpoint and the EFA security group; and its
//! teardown in dependency order. Every compute subnet is made by [`compute_subnet`], the
//! one place that decides where accelerated instances live.

use std::time::Duration;

use app::api::ApiError;
use app::api::clusters::NetworkOptions;
use app::api::values::Cidr;
use serde::{Deserialize, Serialize};

use crate::aws::{Aws, SdkResultExt};
use crate::operation::pipeline::Progress;
use crate::resources::ec2::internet_gateway::{ClusterInternetGateways, InternetGateway};
use crate::resources::ec2::nat_gateway::{ClusterNatGateways, NatGateway};
use crate::resources::ec2::route_table::{ClusterRouteTables, RouteTable, RouteTableSpec, Target};
use crate::resources::ec2::security_group::{ClusterSecurityGroups, EfaSecurityGroup};
use crate::resources::ec2::subnet::{COMPUTE_ROLE, ClusterSubnets, Subnet, SubnetSpec};
use crate::resources::ec2::vpc::{ClusterVpcs, Vpc, VpcChoice};
use crate::resources::ec2::vpc_endpoint::{ClusterEndpoints, S3Endpoint};
use crate::resources::ec2::{self, Client};
use crate::resources::{DeleteEach, converge, missing};

/// Control-plane subnets (two AZs each) and the compute subnet's size.
const CONTROL_PREFIX: u8 = 24;
pub const COMPUTE_PREFIX: u8 = 20;
const NAT_POLL: Duration = Duration::from_secs(15);

/// What the network stage made or adopted (stored with the operation).
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

/// Pre-flight: a requested VPC block must not overlap the region's VPCs, and a named VPC
/// must exist. Field errors name `network.vpc_cidr` / `network.vpc_id`.
pub async fn check(aws: &Aws, region: &str, opts: &NetworkOptions) -> Result<(), ApiError> {
    let ec2 = aws.ec2(region);
    if let Some(cidr) = opts.vpc_cidr
        && let Some((id, b)) = ec2::vpc::region_blocks(&ec2)
            .await?
            .iter()
            .find(|(_, b)| b.overlaps(cidr))
    {
        return Err(ApiError::field(
            "network.vpc_cidr",
            format!(
                "{cidr} overlaps {id} ({b}); choose a /16 that no VPC in {region} uses, or omit it to let hypd choose"
            ),
        ));
    }
    if let Some(vpc) = &opts.vpc_id
        && !ec2::vpc::exists(&ec2, vpc.as_str()).await?
    {
        return Err(ApiError::field(
            "network.vpc_id",
            format!("there is no VPC {vpc} in {region}"),
        ));
    }
    Ok(())
}

/// `zone` and the first other zone of the region (EKS needs subnets in two AZs).
async fn zones(ec2: &Client, zone: &str) -> Result<Vec<String>, ApiError> {
    let out = ec2
        .describe_availability_zones()
        .send()
        .await
        .upstream("ec2", "DescribeAvailabilityZones")?;
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

/// Addresses one HyperPod instance takes in its subnet, as hypd plans room: its primary
/// interface, the VPC CNI's warm pool of pod addresses and its EFA interfaces. Real use
/// varies with the type and the pods; this is the margin hypd keeps.
pub const ADDRESSES_PER_INSTANCE: u32 = 32;

/// The addresses `instances` instances need.
pub fn room_for(instances: u32) -> u32 {
    instances.saturating_mul(ADDRESSES_PER_INSTANCE)
}

/// The /20 compute subnet in `zone` for `cluster`'s accelerated instances, with `room`
/// free addresses: the VPC's hypd compute subnet in that AZ when one has the room (the
/// cluster's own first; any cluster's, which they share), else the next free /20. The one
/// function that makes compute subnets; the caller routes the subnet through the private
/// route table ([`route_privately`]).
pub async fn compute_subnet(
    ec2: &Client,
    cluster: &str,
    vpc_id: &str,
    vpc_cidr: Cidr,
    zone: &str,
    room: u32,
) -> Result<String, ApiError> {
    let subnet = converge(&Subnet {
        ec2: ec2.clone(),
        spec: SubnetSpec {
            cluster: cluster.to_owned(),
            role: COMPUTE_ROLE.to_owned(),
            vpc_id: vpc_id.to_owned(),
            vpc_cidr,
            availability_zone: zone.to_owned(),
            prefix: COMPUTE_PREFIX,
            extra_tags: internal_tags(cluster),
            shared: true,
            room,
        },
    })
    .await?;
    subnet
        .subnet
        .map(|s| s.id)
        .ok_or_else(|| missing("the compute subnet"))
}

/// Pre-flight of [`compute_subnet`]: `Err` with the reason when `zone` of the VPC has no
/// hypd compute subnet with `room` free addresses and no free /20 to carve one.
pub async fn check_room(
    ec2: &Client,
    cluster: &str,
    network: &Network,
    zone: &str,
    room: u32,
) -> Result<(), ApiError> {
    let vpc_id = network.vpc_id.clone().ok_or_else(|| missing("the VPC"))?;
    let vpc_cidr = network
        .vpc_cidr
        .as_deref()
        .and_then(|c| Cidr::parse(c).ok())
        .ok_or_else(|| missing("the VPC's block"))?;
    let subnet = Subnet {
        ec2: ec2.clone(),
        spec: SubnetSpec {
            cluster: cluster.to_owned(),
            role: COMPUTE_ROLE.to_owned(),
            vpc_id,
            vpc_cidr,
            availability_zone: zone.to_owned(),
            prefix: COMPUTE_PREFIX,
            extra_tags: Vec::new(),
            shared: true,
            room,
        },
    };
    use crate::resources::Resource;
    let observed = subnet.observe().await?;
    subnet.diff(&observed).map(|_| ())
}

/// The private route table of `cluster` routing its private subnets, every compute
/// subnet tagged as the cluster's, and `also` (one a plan is about to make), through the
/// NAT gateway.
pub async fn route_privately(
    ec2: &Client,
    cluster: &str,
    network: &Network,
    also: Option<&str>,
) -> Result<String, ApiError> {
    let vpc_id = network.vpc_id.clone().ok_or_else(|| missing("the VPC"))?;
    let nat = network
        .nat_gateway_id
        .clone()
        .ok_or_else(|| missing("the NAT gateway"))?;
    let mut subnet_ids = network.private_subnet_ids.clone();
    subnet_ids.extend(ec2::subnet::compute_subnets_of(ec2, cluster, &vpc_id).await?);
    subnet_ids.extend(network.compute_subnet_id.clone());
    subnet_ids.extend(also.map(str::to_owned));
    let mut seen = std::collections::BTreeSet::new();
    subnet_ids.retain(|s| seen.insert(s.clone()));
    converge(&RouteTable {
        ec2: ec2.clone(),
        spec: RouteTableSpec {
            cluster: cluster.to_owned(),
            role: "private".to_owned(),
            vpc_id,
            default_route: Target::NatGateway(nat),
            subnet_ids,
        },
    })
    .await?
    .id
    .ok_or_else(|| missing("the private route table"))
}

/// Makes (or adopts) the cluster's network; `out` keeps what exists so far.
pub async fn ensure(
    aws: &Aws,
    region: &str,
    cluster: &str,
    zone: &str,
    opts: &NetworkOptions,
    room: u32,
    out: &mut Network,
) -> Result<Progress, ApiError> {
    let ec2 = aws.ec2(region);
    let choice = match &opts.vpc_id {
        Some(id) => VpcChoice::Existing(id.to_string()),
        None => VpcChoice::New {
            cidr: opts.vpc_cidr,
        },
    };
    let vpc = converge(&Vpc {
        ec2: ec2.clone(),
        cluster: cluster.to_owned(),
        choice,
    })
    .await?
    .vpc
    .ok_or_else(|| missing("the VPC"))?;
    out.vpc_id = Some(vpc.id.clone());
    out.vpc_cidr = Some(vpc.cidr.to_string());
    out.vpc_created = vpc.created;
    out.availability_zones = zones(&ec2, zone).await?;

    let igw = converge(&InternetGateway {
        ec2: ec2.clone(),
        cluster: cluster.to_owned(),
        vpc_id: vpc.id.clone(),
    })
    .await?
    .id
    .ok_or_else(|| missing("the Internet gateway"))?;
    out.internet_gateway_id = Some(igw.clone());

    let mut public = Vec::new();
    let mut private = Vec::new();
    for (i, az) in out.availability_zones.clone().iter().enumerate() {
        let n = i + 1;
        for (role, extra, into) in [
            (
                format!("public-{n}"),
                vec![("kubernetes.io/role/elb".to_owned(), "1".to_owned())],
                &mut public,
            ),
            (format!("private-{n}"), internal_tags(cluster), &mut private),
        ] {
            let s = converge(&Subnet {
                ec2: ec2.clone(),
                spec: SubnetSpec {
                    cluster: cluster.to_owned(),
                    role,
                    vpc_id: vpc.id.clone(),
                    vpc_cidr: vpc.cidr,
                    availability_zone: az.clone(),
                    prefix: CONTROL_PREFIX,
                    extra_tags: extra,
                    shared: false,
                    room: 0,
                },
            })
            .await?;
            into.push(s.subnet.map(|s| s.id).ok_or_else(|| missing("a subnet"))?);
        }
    }
    out.public_subnet_ids = public.clone();
    out.private_subnet_ids = private.clone();
    // The subnet the cluster was made with stays its own, full or not; one deleted
    // since is made again.
    let kept = match &out.compute_subnet_id {
        Some(id) => ec2::subnet::compute_subnets_of(&ec2, cluster, &vpc.id)
            .await?
            .contains(id)
            .then(|| id.clone()),
        None => None,
    };
    let compute = match kept {
        Some(id) => id,
        None => compute_subnet(&ec2, cluster, &vpc.id, vpc.cidr, zone, room).await?,
    };
    out.compute_subnet_id = Some(compute.clone());

    let nat = converge(&NatGateway {
        ec2: ec2.clone(),
        cluster: cluster.to_owned(),
        public_subnet_id: public[0].clone(),
    })
    .await?;
    let (nat_id, nat_state) = nat
        .gateway
        .clone()
        .ok_or_else(|| missing("the NAT gateway"))?;
    out.nat_gateway_id = Some(nat_id.clone());
    if !nat.available() {
        return Ok(Progress::wait(
            NAT_POLL,
            format!("NAT gateway is {}", nat_state.as_str()),
        ));
    }

    let public_rt = converge(&RouteTable {
        ec2: ec2.clone(),
        spec: RouteTableSpec {
            cluster: cluster.to_owned(),
            role: "public".to_owned(),
            vpc_id: vpc.id.clone(),
            default_route: Target::InternetGateway(igw),
            subnet_ids: public,
        },
    })
    .await?
    .id
    .ok_or_else(|| missing("the public route table"))?;
    out.public_route_table_id = Some(public_rt);
    let private_rt = route_privately(&ec2, cluster, out, None).await?;
    out.private_route_table_id = Some(private_rt.clone());
    out.s3_endpoint_id = converge(&S3Endpoint {
        ec2: ec2.clone(),
        cluster: cluster.to_owned(),
        region: region.to_owned(),
        vpc_id: vpc.id.clone(),
        route_table_id: private_rt,
    })
    .await?;
    out.security_group_id = converge(&EfaSecurityGroup {
        ec2: ec2.clone(),
        cluster: cluster.to_owned(),
        vpc_id: vpc.id,
    })
    .await?
    .id;
    Ok(Progress::Done)
}

/// Deletes, in dependency order, every EC2 object tagged as `cluster`'s (and nothing
/// else: a VPC the user named stays, as do its other subnets and a compute subnet another
/// cluster shares). Waits while the NAT gateway is deleting.
pub async fn teardown(aws: &Aws, region: &str, cluster: &str) -> Result<Progress, ApiError> {
    let ec2 = aws.ec2(region);
    let c = || cluster.to_owned();
    converge(&DeleteEach(ClusterEndpoints {
        ec2: ec2.clone(),
        cluster: c(),
    }))
    .await?;
    let nat = converge(&ClusterNatGateways {
        ec2: ec2.clone(),
        cluster: c(),
    })
    .await?;
    // Its address and subnet stay in use until the gateway is gone. A plan lists what
    // follows as well.
    if nat.deleting() && !crate::resources::is_planning() {
        return Ok(Progress::wait(NAT_POLL, "NAT gateway is deleting"));
    }
    converge(&ClusterRouteTables {
        ec2: ec2.clone(),
        cluster: c(),
    })
    .await?;
    converge(&DeleteEach(ClusterSubnets {
        ec2: ec2.clone(),
        cluster: c(),
    }))
    .await?;
    converge(&DeleteEach(ClusterSecurityGroups {
        ec2: ec2.clone(),
        cluster: c(),
    }))
    .await?;
    converge(&ClusterInternetGateways {
        ec2: ec2.clone(),
        cluster: c(),
    })
    .await?;
    converge(&DeleteEach(ClusterVpcs { ec2, cluster: c() })).await?;
    Ok(Progress::Done)
}
