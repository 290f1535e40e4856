//! Inspection commands: who hypd acts as and what the account offers (regions, zones,
//! accelerated instance types). Agents call these before proposing anything, so the
//! answers carry the facts a decision needs (GPU count and memory, EFA, zone offering).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::command::{Command, CommandSpec, Effect, HttpMethod, Role};
use super::listing::Listing;
use super::values::{AzName, InstanceType, MlInstanceType, Region, at_most};

/// How fresh an answer built from AWS is: inspection data is cached briefly so agents
/// and consoles can ask often; `refresh: true` on the request bypasses the cache.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Freshness {
    /// When AWS was asked (RFC 3339, UTC).
    pub fetched_at: String,
    /// Seconds since then.
    pub age_seconds: u64,
    /// True when this answer came from the cache.
    pub cached: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Whoami {}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct WhoamiOutput {
    /// The AWS account hypd acts in.
    pub account: String,
    /// The IAM principal hypd acts as.
    pub arn: String,
    pub region: Option<String>,
    /// True when the account is the local sandbox (moto + sim), not AWS.
    pub sandbox: bool,
    /// The caller's hypd role.
    pub role: Role,
    /// The caller's token name.
    pub token_name: String,
}

impl Command for Whoami {
    type Output = WhoamiOutput;
    const SPEC: CommandSpec = CommandSpec {
        name: "whoami",
        summary: "Show the AWS account, region and IAM principal hypd acts as, and your hypd role",
        description: "The AWS account, principal and region hypd uses, whether it is the sandbox, and your role. Call it first to know where changes would land.",
        effect: Effect::ReadOnly,
        role: Role::Viewer,
        idempotent: true,
        status_command: None,
        method: HttpMethod::Get,
        path: "/api/v1/whoami",
    };
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListRegions {
    /// Bypass the cache and ask AWS now.
    #[serde(default)]
    pub refresh: bool,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct RegionInfo {
    pub name: String,
    /// `opt-in-not-required`, `opted-in` or `not-opted-in`.
    pub opt_in_status: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct RegionList {
    pub regions: Vec<RegionInfo>,
    pub freshness: Freshness,
}

impl Command for ListRegions {
    type Output = RegionList;
    const SPEC: CommandSpec = CommandSpec {
        name: "list_regions",
        summary: "List the AWS regions enabled for the account",
        description: "Regions the account can use. Offer one of these when asking the user for a region; never guess.",
        effect: Effect::ReadOnly,
        role: Role::Viewer,
        idempotent: true,
        status_command: None,
        method: HttpMethod::Get,
        path: "/api/v1/regions",
    };
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListAvailabilityZones {
    /// Region to list; defaults to hypd's region.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<Region>,
    #[serde(default)]
    pub refresh: bool,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct AvailabilityZone {
    /// Account-specific name, e.g. `us-east-1a`.
    pub name: String,
    /// The same in every account, e.g. `use1-az1`: use it to match training plans.
    pub zone_id: String,
    pub state: String,
    /// `availability-zone`, `local-zone` or `wavelength-zone`.
    pub zone_type: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct AvailabilityZoneList {
    pub region: String,
    pub zones: Vec<AvailabilityZone>,
    pub freshness: Freshness,
}

impl Command for ListAvailabilityZones {
    type Output = AvailabilityZoneList;
    const SPEC: CommandSpec = CommandSpec {
        name: "list_availability_zones",
        summary: "List the Availability Zones of a region, with zone names and zone ids",
        description: "The region's Availability Zones (name and zone id). Ask the user to choose the zone for accelerated capacity from them; a training plan fixes it.",
        effect: Effect::ReadOnly,
        role: Role::Viewer,
        idempotent: true,
        status_command: None,
        method: HttpMethod::Get,
        path: "/api/v1/availability-zones",
    };
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListInstanceTypes {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<Region>,
    /// Only types offered in this Availability Zone (name such as `us-east-1a`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub availability_zone: Option<AzName>,
    /// Only accelerated types (GPU, Trainium, Inferentia); default true.
    #[serde(default = "default_true")]
    pub accelerated_only: bool,
    /// Only these types (e.g. `p5.48xlarge`).
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "at_most::<_, _, 100>"
    )]
    #[schemars(length(max = 100))]
    pub instance_types: Vec<InstanceType>,
    /// Only these fields of each type (`instance_type` always); all when empty.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "at_most::<_, _, 10>"
    )]
    #[schemars(length(max = 10))]
    pub fields: Vec<InstanceTypeField>,
    #[serde(default)]
    pub refresh: bool,
}

impl Default for ListInstanceTypes {
    fn default() -> Self {
        Self {
            region: None,
            availability_zone: None,
            accelerated_only: true,
            instance_types: Vec::new(),
            fields: Vec::new(),
            refresh: false,
        }
    }
}

fn default_true() -> bool {
    true
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum AcceleratorKind {
    Gpu,
    Trainium,
    Inferentia,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Accelerator {
    pub kind: AcceleratorKind,
    /// e.g. NVIDIA, AWS.
    pub manufacturer: String,
    /// e.g. H100, A10G, Trainium2.
    pub name: String,
    pub count: u32,
    /// Memory per accelerator in MiB.
    pub memory_mib: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct InstanceTypeInfo {
    /// EC2 name, e.g. `p5.48xlarge`.
    pub instance_type: String,
    /// HyperPod name, e.g. `ml.p5.48xlarge`.
    pub hyperpod_instance_type: String,
    pub vcpus: u32,
    pub memory_mib: u64,
    pub accelerator: Option<Accelerator>,
    pub efa_supported: bool,
    /// Most EFA interfaces the type can attach (0 without EFA).
    pub max_efa_interfaces: u32,
    /// Whether an instance group of this type may use the EFA-only network interface.
    pub efa_only_allowed: bool,
    pub network_performance: Option<String>,
    /// Zone names in the region where the type is offered.
    pub offered_in: Vec<String>,
}

/// A field of `InstanceTypeInfo`, by its name in the answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum InstanceTypeField {
    InstanceType,
    HyperpodInstanceType,
    Vcpus,
    MemoryMib,
    Accelerator,
    EfaSupported,
    MaxEfaInterfaces,
    EfaOnlyAllowed,
    NetworkPerformance,
    OfferedIn,
}

impl InstanceTypeField {
    pub const ALL: [InstanceTypeField; 10] = [
        Self::InstanceType,
        Self::HyperpodInstanceType,
        Self::Vcpus,
        Self::MemoryMib,
        Self::Accelerator,
        Self::EfaSupported,
        Self::MaxEfaInterfaces,
        Self::EfaOnlyAllowed,
        Self::NetworkPerformance,
        Self::OfferedIn,
    ];

    /// Its key in an `InstanceTypeInfo` object.
    pub fn name(self) -> &'static str {
        match self {
            Self::InstanceType => "instance_type",
            Self::HyperpodInstanceType => "hyperpod_instance_type",
            Self::Vcpus => "vcpus",
            Self::MemoryMib => "memory_mib",
            Self::Accelerator => "accelerator",
            Self::EfaSupported => "efa_supported",
            Self::MaxEfaInterfaces => "max_efa_interfaces",
            Self::EfaOnlyAllowed => "efa_only_allowed",
            Self::NetworkPerformance => "network_performance",
            Self::OfferedIn => "offered_in",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct InstanceTypeList {
    pub region: String,
    /// With `fields`, each object has only those keys (and `instance_type`).
    pub instance_types: Listing<InstanceTypeInfo>,
    pub freshness: Freshness,
}

impl Command for ListInstanceTypes {
    type Output = InstanceTypeList;
    const SPEC: CommandSpec = CommandSpec {
        name: "list_instance_types",
        summary: "List (accelerated) instance types with GPU, memory and EFA facts, filterable by zone offering",
        description: "Instance types of a region or zone, with accelerators and EFA. Offer the user instance types from it; HyperPod uses the ml. name.",
        effect: Effect::ReadOnly,
        role: Role::Viewer,
        idempotent: true,
        status_command: None,
        method: HttpMethod::Get,
        path: "/api/v1/instance-types",
    };
}

/// Whether HyperPod lets an instance group of this type use the EFA-only network
/// interface: multi-EFA-card types of the families in DOMAIN.md (g6e only at 24xlarge and
/// 48xlarge). `max_efa_interfaces`, when known, must be at least 2: the small sizes of
/// eligible families (p5.4xlarge) have one card.
pub fn efa_only_allowed(instance_type: &str, max_efa_interfaces: Option<u32>) -> bool {
    let Some((family, size)) = instance_type.trim_start_matches("ml.").split_once('.') else {
        return false;
    };
    let family_ok = match family {
        "p4d" | "p4de" | "p5" | "p5e" | "p5en" | "p6-b200" | "p6-b300" | "p6e-gb200" => true,
        "g6e" => matches!(size, "24xlarge" | "48xlarge"),
        _ => false,
    };
    family_ok && max_efa_interfaces.is_none_or(|n| n >= 2)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `fields` can name every key of an `InstanceTypeInfo`, by the name it has there.
    #[test]
    fn instance_type_fields_are_the_info_keys() {
        let info = InstanceTypeInfo {
            instance_type: "p5.48xlarge".into(),
            hyperpod_instance_type: "ml.p5.48xlarge".into(),
            vcpus: 192,
            memory_mib: 2_097_152,
            accelerator: None,
            efa_supported: true,
            max_efa_interfaces: 32,
            efa_only_allowed: true,
            network_performance: None,
            offered_in: vec![],
        };
        let keys: Vec<String> = serde_json::to_value(&info)
            .unwrap()
            .as_object()
            .unwrap()
            .keys()
            .cloned()
            .collect();
        let mut names: Vec<String> = InstanceTypeField::ALL
            .iter()
            .map(|f| {
                assert_eq!(serde_json::to_value(f).unwrap(), f.name());
                f.name().to_owned()
            })
            .collect();
        names.sort();
        let mut keys = keys;
        keys.sort();
        assert_eq!(names, keys);
    }

    #[test]
    fn efa_only_eligibility() {
        assert!(efa_only_allowed("p5.48xlarge", Some(32)));
        assert!(efa_only_allowed("ml.p5en.48xlarge", None));
        assert!(efa_only_allowed("g6e.48xlarge", Some(4)));
        assert!(!efa_only_allowed("g6e.12xlarge", Some(1)));
        assert!(!efa_only_allowed("p5.4xlarge", Some(1)));
        assert!(!efa_only_allowed("g5.48xlarge", Some(1)));
        assert!(!efa_only_allowed("p3dn.24xlarge", Some(1)));
    }

    #[test]
    fn instance_type_request_defaults() {
        let r: ListInstanceTypes = serde_json::from_str("{}").unwrap();
        assert!(r.accelerated_only);
        let err = serde_json::from_str::<ListInstanceTypes>(r#"{"availability_zone":"mars-1a"}"#)
            .unwrap_err();
        assert!(err.to_string().contains("us-east-1a"), "{err}");
        assert!(serde_json::from_str::<ListInstanceTypes>(r#"{"zone":"x"}"#).is_err());
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListCapacity {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<Region>,
    /// Only these HyperPod types (e.g. `ml.p5.48xlarge`).
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "at_most::<_, _, 100>"
    )]
    #[schemars(length(max = 100))]
    pub instance_types: Vec<MlInstanceType>,
}

/// One type's HyperPod quota (Service Quotas' "<type> for cluster usage") and what the
/// region's HyperPod clusters hold of it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct QuotaUse {
    pub instance_type: String,
    pub quota: u32,
    pub in_use: u32,
    pub free: u32,
}

/// Capacity reserved in one Availability Zone by a training plan.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Reserved {
    pub instance_type: Option<String>,
    pub availability_zone: Option<String>,
    pub instances: u32,
}

/// A SageMaker training plan: reserved capacity a group can run on (`capacity:
/// training_plan` with its ARN), only while it is Active or Scheduled.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct TrainingPlanInfo {
    pub name: String,
    pub arn: String,
    /// `Pending`, `Active`, `Scheduled`, `Expired` or `Failed`.
    pub status: String,
    pub available_instances: u32,
    pub in_use_instances: u32,
    pub reserved: Vec<Reserved>,
    pub start_time: Option<String>,
    pub end_time: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Capacity {
    pub region: String,
    /// The types with a quota above zero or instances in use, by type.
    pub quotas: Vec<QuotaUse>,
    pub training_plans: Vec<TrainingPlanInfo>,
    /// When AWS was asked (RFC 3339, UTC).
    pub fetched_at: String,
}

impl Command for ListCapacity {
    type Output = Capacity;
    const SPEC: CommandSpec = CommandSpec {
        name: "list_capacity",
        summary: "Show HyperPod quotas, their use, and training plans",
        description: "The account's HyperPod quota per instance type with what its clusters use and what is free, and its training plans (reserved capacity, zone, status). Call it before offering instance types and counts or a training plan.",
        effect: Effect::ReadOnly,
        role: Role::Viewer,
        idempotent: true,
        status_command: None,
        method: HttpMethod::Get,
        path: "/api/v1/capacity",
    };
}
