//! EC2 objects of a cluster's network, one module per kind. Each is found by hypd's tags
//! (`hypd:cluster` and `hypd:role`), which its creating call sets through
//! `TagSpecifications`, so a create that crashed before its answer was stored is found and
//! adopted instead of being made twice. Each kind also has a teardown resource: every
//! object of that kind tagged for the cluster, wanted gone.

pub mod internet_gateway;
pub mod lustre_ports;
pub mod nat_gateway;
pub mod route_table;
pub mod security_group;
pub mod subnet;
pub mod vpc;
pub mod vpc_endpoint;

use std::net::Ipv4Addr;

use app::api::values::Cidr;
use aws_sdk_ec2::types::{Filter, ResourceType, Tag, TagSpecification};

use super::tags;

pub use aws_sdk_ec2::Client;

pub(crate) fn tag(k: &str, v: &str) -> Tag {
    Tag::builder().key(k).value(v).build()
}

pub(crate) fn filter(name: &str, value: &str) -> Filter {
    Filter::builder().name(name).values(value).build()
}

pub(crate) fn pairs(tags: &[Tag]) -> impl Iterator<Item = (&str, &str)> {
    tags.iter()
        .filter_map(|t| Some((t.key()?, t.value().unwrap_or_default())))
}

pub(crate) fn has_tag(tags: &[Tag], k: &str, v: &str) -> bool {
    pairs(tags).any(|(tk, tv)| tk == k && tv == v)
}

/// What a cluster's object of role `role` is called in the console (its `Name` tag).
pub fn name(cluster: &str, role: &str) -> String {
    format!("hypd-{cluster}-{role}")
}

/// The tags of an object hypd makes for `cluster` in role `role`.
pub(crate) fn tags_for(
    kind: ResourceType,
    cluster: &str,
    role: &str,
    extra: &[(String, String)],
) -> TagSpecification {
    let mut all: Vec<Tag> = tags::of_cluster(cluster)
        .iter()
        .map(|(k, v)| tag(k, v))
        .collect();
    all.push(tag(tags::ROLE, role));
    all.push(tag("Name", &name(cluster, role)));
    all.extend(extra.iter().map(|(k, v)| tag(k, v)));
    TagSpecification::builder()
        .resource_type(kind)
        .set_tags(Some(all))
        .build()
}

/// Filters selecting the object hypd made for `cluster` in role `role`.
pub(crate) fn ours(cluster: &str, role: &str) -> Vec<Filter> {
    vec![
        filter(&format!("tag:{}", tags::CLUSTER), cluster),
        filter(&format!("tag:{}", tags::ROLE), role),
    ]
}

/// Filters selecting every object of a kind hypd made for `cluster`.
pub(crate) fn of_cluster(cluster: &str) -> Vec<Filter> {
    vec![filter(&format!("tag:{}", tags::CLUSTER), cluster)]
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

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn c(s: &str) -> Cidr {
        Cidr::parse(s).unwrap()
    }

    /// A VPC of /16 to /20 and subnets already in it, each aligned and inside it, none
    /// overlapping another (as EC2 keeps them): up to 40 of sizes /17 to /28.
    fn layout() -> impl Strategy<Value = (Cidr, Vec<Cidr>)> {
        (
            0u8..=255,
            16u8..=20,
            prop::collection::vec((17u8..=28, any::<u32>()), 0..40),
        )
            .prop_map(|(second, vpc_prefix, wanted)| {
                let vpc = Cidr::new(Ipv4Addr::new(10, second, 0, 0), vpc_prefix).unwrap();
                let (start, end) = vpc.range();
                let mut used: Vec<Cidr> = Vec::new();
                for (prefix, at) in wanted {
                    let prefix = prefix.max(vpc_prefix);
                    let size = 1u64 << (32 - prefix);
                    let span = u64::from(end - start) + 1;
                    let offset = (u64::from(at) % span) / size * size;
                    let block =
                        Cidr::new(Ipv4Addr::from((u64::from(start) + offset) as u32), prefix)
                            .unwrap();
                    if !used.iter().any(|u| u.overlaps(block)) {
                        used.push(block);
                    }
                }
                (vpc, used)
            })
    }

    proptest! {
        /// Compute subnets carved one after another out of any layout: each is a /20
        /// (or the /24 asked), aligned, inside the VPC, overlapping no subnet there and
        /// none carved before it; and when none is found, no free aligned block exists.
        #[test]
        fn carved_blocks_never_overlap((vpc, mut used) in layout(), prefix in prop_oneof![Just(20u8), Just(24u8)]) {
            for _ in 0..8 {
                match free_block(vpc, &used, prefix) {
                    Some(b) => {
                        prop_assert_eq!(b.prefix(), prefix);
                        prop_assert_eq!(u32::from(b.network()) % (1u32 << (32 - prefix)), 0);
                        let (vs, ve) = vpc.range();
                        let (bs, be) = b.range();
                        prop_assert!(vs <= bs && be <= ve, "{b} outside {vpc}");
                        prop_assert!(!used.iter().any(|u| u.overlaps(b)), "{b} overlaps {used:?}");
                        used.push(b);
                    }
                    None => {
                        let (vs, ve) = vpc.range();
                        let size = 1u64 << (32 - prefix);
                        let mut at = u64::from(vs);
                        while at + size - 1 <= u64::from(ve) {
                            let candidate = Cidr::new(Ipv4Addr::from(at as u32), prefix).unwrap();
                            prop_assert!(used.iter().any(|u| u.overlaps(candidate)), "{candidate} was free");
                            at += size;
                        }
                        break;
                    }
                }
            }
        }
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
