//! Where a group's instances run and the addresses they get: HyperPod launches an
//! instance group in one subnet, so its zone and address range come from what moto said
//! of that subnet, and addresses are derived from instance ids so they stay put.

use serde_json::{Value, json};

use super::lookups::Lookups;

/// Where a group's instances run. HyperPod launches an instance group in one subnet
/// (InstanceGroupMetadata names one subnet and zone per group): here the first subnet of
/// the group's `OverrideVpcConfig`, else of the cluster's `VpcConfig`.
#[derive(Clone, Debug, Default)]
pub(super) struct Placement {
    pub(super) zone: String,
    pub(super) zone_id: String,
    /// The subnet's network and prefix length, where instances take their addresses.
    pub(super) cidr: Option<(u32, u8)>,
}

impl Placement {
    /// The placement in the first of `subnets`, from what moto said of it. Without moto
    /// (or a subnet it was not asked about) the sim cannot know the zone, and takes the
    /// region's first.
    pub(super) fn of<'a>(
        region: &str,
        mut subnets: impl Iterator<Item = &'a str>,
        lookups: &Lookups,
    ) -> Self {
        let Some(subnet) = subnets.next().and_then(|id| lookups.subnet(id)) else {
            let zone = format!("{region}a");
            return Self {
                zone_id: zone_id(region, &zone),
                zone,
                cidr: None,
            };
        };
        let zone = subnet.availability_zone.clone();
        Self {
            zone_id: Some(subnet.availability_zone_id.clone())
                .filter(|id| !id.is_empty())
                .unwrap_or_else(|| zone_id(region, &zone)),
            zone,
            cidr: parse_cidr(&subnet.cidr_block),
        }
    }

    pub(super) fn json(&self) -> Value {
        json!({ "AvailabilityZone": self.zone, "AvailabilityZoneId": self.zone_id })
    }
}

/// The zone id (`use1-az1`) of `zone` (`us-east-1a`) when moto did not say. AWS maps
/// names to ids per account; the sim maps the n-th zone letter to `az<n>`.
pub(super) fn zone_id(region: &str, zone: &str) -> String {
    let parts: Vec<&str> = region.split('-').collect();
    let [country, areas @ .., number] = parts.as_slice() else {
        return String::new();
    };
    let mut short = (*country).to_owned();
    for area in areas {
        let mut rest = *area;
        while let Some(word) = ["central", "north", "south", "east", "west"]
            .iter()
            .find(|w| rest.starts_with(*w))
        {
            short.push_str(&word[..1]);
            rest = &rest[word.len()..];
        }
        short.push_str(rest);
    }
    let letter = zone.strip_prefix(region).and_then(|l| l.bytes().next());
    let n = letter.map_or(1, |l| u32::from(l.saturating_sub(b'a')) + 1);
    format!("{short}{number}-az{n}")
}

pub(super) fn parse_cidr(cidr: &str) -> Option<(u32, u8)> {
    let (ip, prefix) = cidr.split_once('/')?;
    let ip: std::net::Ipv4Addr = ip.parse().ok()?;
    let prefix: u8 = prefix.parse().ok().filter(|p| *p <= 32)?;
    let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
    Some((u32::from(ip) & mask, prefix))
}

/// An instance's private address, stable for the instance: within its subnet, past the
/// four addresses AWS keeps at a subnet's start and before the one at its end. Without
/// a known subnet, in 10.1.0.0/16.
pub(super) fn private_ip(id: &str, cidr: Option<(u32, u8)>) -> String {
    let n = id
        .strip_prefix("i-")
        .and_then(|hex| u64::from_str_radix(hex, 16).ok())
        .unwrap_or_else(|| crate::world::fnv1a(id));
    let (base, prefix) = cidr.unwrap_or((0x0a01_0000, 16));
    let size = 1u64 << (32 - u32::from(prefix));
    let host = if size > 5 {
        4 + n % (size - 5)
    } else {
        n % size
    };
    std::net::Ipv4Addr::from(base.wrapping_add(host as u32)).to_string()
}

/// EC2's private DNS name for `ip`: `ec2.internal` in us-east-1, `<region>.compute.internal`
/// elsewhere.
pub(super) fn private_dns(ip: &str, region: &str) -> String {
    let domain = if region == "us-east-1" {
        "ec2.internal".to_owned()
    } else {
        format!("{region}.compute.internal")
    };
    format!("ip-{}.{domain}", ip.replace('.', "-"))
}
