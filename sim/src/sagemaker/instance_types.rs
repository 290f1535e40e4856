//! The one table of instance-type facts (GPUs, EFA interfaces, CPUs, memory, threads per
//! core, Spot, the default quota): HyperPod checks requests against it and the Kubernetes
//! Nodes of an instance group offer what it says, so the two can never disagree. Facts
//! come from the EC2 instance-type pages; a test replaces rows through
//! `PUT /_sim/sagemaker/instance-types` to stage a type AWS would treat differently.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct InstanceType {
    pub gpus: u32,
    /// Total accelerator memory of the instance.
    pub gpu_memory_gib: u32,
    pub efa_interfaces: u32,
    /// Whether HyperPod accepts `NetworkInterface{InterfaceType: efa-only}`: only types
    /// with several EFA cards, where the extra cards can go without an ENA.
    pub efa_only: bool,
    pub vcpus: u32,
    pub memory_gib: u32,
    /// Accepted `ThreadsPerCore` values (1 turns hyper-threading off).
    pub threads_per_core: Vec<u32>,
    /// Whether Spot capacity is offered for the type.
    pub spot: bool,
    /// The account's default "cluster usage" quota.
    pub default_quota: u32,
}

#[allow(clippy::too_many_arguments)]
fn row(
    gpus: u32,
    gpu_memory_gib: u32,
    efa_interfaces: u32,
    efa_only: bool,
    vcpus: u32,
    memory_gib: u32,
    spot: bool,
    default_quota: u32,
) -> InstanceType {
    InstanceType {
        gpus,
        gpu_memory_gib,
        efa_interfaces,
        efa_only,
        vcpus,
        memory_gib,
        threads_per_core: vec![1, 2],
        spot,
        default_quota,
    }
}

/// The default table.
pub fn default_table() -> BTreeMap<String, InstanceType> {
    [
        ("ml.p4d.24xlarge", row(8, 320, 4, true, 96, 1152, true, 4)),
        ("ml.p4de.24xlarge", row(8, 640, 4, true, 96, 1152, false, 2)),
        ("ml.p5.48xlarge", row(8, 640, 32, true, 192, 2048, true, 4)),
        (
            "ml.p5e.48xlarge",
            row(8, 1128, 32, true, 192, 2048, false, 2),
        ),
        (
            "ml.p5en.48xlarge",
            row(8, 1128, 16, true, 192, 2048, false, 2),
        ),
        (
            "ml.p6-b200.48xlarge",
            row(8, 1432, 8, true, 192, 2048, false, 2),
        ),
        // Twice the B200's EFA: 16 interfaces on network cards 1-16 (card 0 is ENA only),
        // 6.4 Tbps, and 4 TiB of memory.
        (
            "ml.p6-b300.48xlarge",
            row(8, 2148, 16, true, 192, 4096, false, 2),
        ),
        ("ml.g6e.12xlarge", row(4, 192, 1, false, 48, 384, true, 8)),
        ("ml.g6e.24xlarge", row(4, 192, 2, true, 96, 768, true, 4)),
        ("ml.g6e.48xlarge", row(8, 384, 4, true, 192, 1536, true, 4)),
        ("ml.g5.8xlarge", row(1, 24, 1, false, 32, 128, true, 8)),
        ("ml.g5.48xlarge", row(8, 192, 1, false, 192, 768, true, 4)),
        (
            "ml.trn1.32xlarge",
            row(0, 512, 8, false, 128, 512, false, 4),
        ),
        ("ml.m5.2xlarge", row(0, 0, 0, false, 8, 32, true, 16)),
        ("ml.t3.medium", row(0, 0, 0, false, 2, 4, true, 16)),
    ]
    .into_iter()
    .map(|(name, facts)| (name.to_owned(), facts))
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn efa_only_types_are_the_multi_efa_gpu_types() {
        let table = default_table();
        let efa_only: Vec<&str> = table
            .iter()
            .filter(|(_, t)| t.efa_only)
            .map(|(n, _)| n.as_str())
            .collect();
        assert_eq!(
            efa_only,
            [
                "ml.g6e.24xlarge",
                "ml.g6e.48xlarge",
                "ml.p4d.24xlarge",
                "ml.p4de.24xlarge",
                "ml.p5.48xlarge",
                "ml.p5e.48xlarge",
                "ml.p5en.48xlarge",
                "ml.p6-b200.48xlarge",
                "ml.p6-b300.48xlarge",
            ]
        );
        assert!(
            table
                .values()
                .filter(|t| t.efa_only)
                .all(|t| t.efa_interfaces > 1)
        );
    }
}
