//! SageMaker HyperPod, as the `aws-sdk-sagemaker` client sees it (JSON 1.1: `POST /`
//! with `X-Amz-Target: SageMaker.<Operation>`): clusters on an EKS orchestrator that take
//! minutes to come InService, instance groups whose nodes launch and pass health checks
//! on the sim's clock, updates that refuse to change what AWS keeps immutable, and
//! per-type quotas a test can set. Cluster-level settings (autoscaling with its cluster
//! role, tiered storage) are checked together, since AWS ties them to each other and to
//! the orchestrator. Node actions and software updates (`nodes`), training plans, MLflow
//! tracking servers and the instance-type table live in submodules.

use std::collections::BTreeMap;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Json, Response};
use serde_json::{Value, json};

use crate::world::{ACCOUNT, AwsError, Phase, Shared, World, region_of};

pub mod instance_types;
mod lookups;
mod mlflow;
mod nodes;
pub mod training_plans;

use lookups::Lookups;
use nodes::NodeAction;
pub use nodes::Recovery;

pub const CLUSTER_CREATE_SECS: f64 = 900.0;
pub const CLUSTER_UPDATE_SECS: f64 = 300.0;
pub const CLUSTER_DELETE_SECS: f64 = 300.0;
pub const NODE_BOOT_SECS: f64 = 300.0;
pub const DEEP_HEALTH_CHECK_SECS: f64 = 600.0;
/// How long HyperPod takes to install (AutoScaling Creating) or remove (Deleting) its
/// managed Karpenter; AWS publishes no figure, so this is the sim's.
pub const AUTOSCALING_SECS: f64 = 120.0;

/// Default "cluster usage" quotas per instance type, from the instance-type table;
/// `PUT /_sim/sagemaker/quotas` changes them.
pub fn default_quotas() -> BTreeMap<String, u32> {
    instance_types::default_table()
        .into_iter()
        .map(|(t, facts)| (t, facts.default_quota))
        .collect()
}

fn validation(message: impl Into<String>) -> AwsError {
    AwsError::new(400, "ValidationException", message)
}

#[derive(Clone, Debug)]
struct Node {
    id: String,
    /// Stays with the node's slot through replacements, as AWS's NodeLogicalId does.
    logical_id: String,
    launched: f64,
    /// The HyperPod image release the node runs.
    release: String,
    action: Option<NodeAction>,
    /// When a platform software update last finished on this instance.
    software_updated: Option<f64>,
    /// A recovery HyperPod owes the node (health-agent fault or a user's label).
    health: Option<nodes::Health>,
    /// Reboots this instance has been through: a rebooted Node reports a new bootID.
    boots: u32,
}

/// Where a group's instances run. HyperPod launches an instance group in one subnet
/// (InstanceGroupMetadata names one subnet and zone per group): here the first subnet of
/// the group's `OverrideVpcConfig`, else of the cluster's `VpcConfig`.
#[derive(Clone, Debug, Default)]
struct Placement {
    zone: String,
    zone_id: String,
    /// The subnet's network and prefix length, where instances take their addresses.
    cidr: Option<(u32, u8)>,
}

impl Placement {
    /// The placement in the first of `subnets`, from what moto said of it. Without moto
    /// (or a subnet it was not asked about) the sim cannot know the zone, and takes the
    /// region's first.
    fn of<'a>(region: &str, mut subnets: impl Iterator<Item = &'a str>, lookups: &Lookups) -> Self {
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

    fn json(&self) -> Value {
        json!({ "AvailabilityZone": self.zone, "AvailabilityZoneId": self.zone_id })
    }
}

/// The zone id (`use1-az1`) of `zone` (`us-east-1a`) when moto did not say. AWS maps
/// names to ids per account; the sim maps the n-th zone letter to `az<n>`.
fn zone_id(region: &str, zone: &str) -> String {
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

fn parse_cidr(cidr: &str) -> Option<(u32, u8)> {
    let (ip, prefix) = cidr.split_once('/')?;
    let ip: std::net::Ipv4Addr = ip.parse().ok()?;
    let prefix: u8 = prefix.parse().ok().filter(|p| *p <= 32)?;
    let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
    Some((u32::from(ip) & mask, prefix))
}

/// An instance's private address, stable for the instance: within its subnet, past the
/// four addresses AWS keeps at a subnet's start and before the one at its end. Without
/// a known subnet, in 10.1.0.0/16.
fn private_ip(id: &str, cidr: Option<(u32, u8)>) -> String {
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
fn private_dns(ip: &str, region: &str) -> String {
    let domain = if region == "us-east-1" {
        "ec2.internal".to_owned()
    } else {
        format!("{region}.compute.internal")
    };
    format!("ip-{}.{domain}", ip.replace('.', "-"))
}

#[derive(Clone, Debug)]
struct Group {
    name: String,
    instance_type: String,
    target: u32,
    spec: Value,
    deep_health_checks: bool,
    nodes: Vec<Node>,
    release: String,
    desired_release: String,
    placement: Placement,
    /// The group's `KubernetesConfig` before the latest UpdateCluster: what its nodes
    /// are reported to carry (`Current…`) until that update is over.
    previous_kubernetes: Value,
}

/// A cluster's `AutoScaling`, as the latest Enable or Disable left it.
#[derive(Clone, Debug)]
struct AutoScaling {
    enabled: bool,
    scaler: String,
    /// When that Enable or Disable was accepted, and by which call (whose `stuck` fault
    /// holds it in Creating or Deleting).
    since: f64,
    by: &'static str,
    /// Set when a `fails` fault was registered for the call that enabled it: the install
    /// ends Failed with this message.
    failure: Option<String>,
}

impl AutoScaling {
    /// `Status` as DescribeCluster reports it; none once a Disable is over, as the model
    /// has no status for autoscaling that is gone. An install waits for the cluster.
    fn status(&self, now: f64, cluster_creating: bool, stuck: bool) -> Option<&'static str> {
        let settling = stuck || cluster_creating || now - self.since < AUTOSCALING_SECS;
        match (self.enabled, settling) {
            (true, true) => Some("Creating"),
            (true, false) if self.failure.is_some() => Some("Failed"),
            (true, false) => Some("InService"),
            (false, true) => Some("Deleting"),
            (false, false) => None,
        }
    }

    fn json(&self, status: &str) -> Value {
        let mut v = json!({
            "Mode": if self.enabled { "Enable" } else { "Disable" },
            "AutoScalerType": self.scaler,
            "Status": status,
        });
        if status == "Failed" {
            v["FailureMessage"] = json!(self.failure);
        }
        v
    }
}

#[derive(Clone, Debug)]
pub struct Cluster {
    name: String,
    region: String,
    created: f64,
    phase: Option<(Phase, f64)>,
    orchestrator: Value,
    vpc: Value,
    /// Where groups without an `OverrideVpcConfig` run.
    placement: Placement,
    node_recovery: String,
    provisioning: Option<String>,
    groups: Vec<Group>,
    /// An UpdateClusterSoftware is rolling over the nodes.
    system_update: bool,
    /// `Tags` given at creation, as `[{Key, Value}]`; read back with ListTags.
    tags: Value,
    /// The IAM role HyperPod assumes to add and remove nodes for autoscaling.
    cluster_role: Option<String>,
    auto_scaling: Option<AutoScaling>,
    /// `TieredStorageConfig` as last requested, and as it was before the latest
    /// UpdateCluster: what the nodes run until that update is over.
    tiered: Option<Value>,
    tiered_before: Option<Value>,
}

#[derive(Default)]
pub struct SageMaker {
    clusters: BTreeMap<String, Cluster>,
    pub quotas: BTreeMap<String, u32>,
    pub instance_types: BTreeMap<String, instance_types::InstanceType>,
    pub training_plans: training_plans::TrainingPlans,
    mlflow: mlflow::Mlflow,
    nodes: u64,
}

impl SageMaker {
    pub fn new() -> Self {
        Self {
            quotas: default_quotas(),
            instance_types: instance_types::default_table(),
            training_plans: training_plans::TrainingPlans::new(),
            ..Self::default()
        }
    }
}

impl Cluster {
    fn arn(&self) -> String {
        format!(
            "arn:aws:sagemaker:{}:{ACCOUNT}:cluster/{}",
            self.region,
            self.name.to_lowercase()
        )
    }

    fn status(&self, now: f64, stuck: bool) -> &'static str {
        if self.system_update && !matches!(&self.phase, Some((Phase::Deleting, _))) {
            return "SystemUpdating";
        }
        match &self.phase {
            Some((Phase::Creating, since)) if stuck || now - since < CLUSTER_CREATE_SECS => {
                "Creating"
            }
            Some((Phase::Updating, since)) if stuck || now - since < CLUSTER_UPDATE_SECS => {
                "Updating"
            }
            Some((Phase::Deleting, _)) => "Deleting",
            _ => "InService",
        }
    }

    /// Autoscaling's status, if there is one to report; `stuck` says whether a `stuck`
    /// fault stands for an operation.
    fn autoscaling_status(&self, now: f64, stuck: impl Fn(&str) -> bool) -> Option<&'static str> {
        let a = self.auto_scaling.as_ref()?;
        let creating = self.status(now, stuck("CreateCluster")) == "Creating";
        a.status(now, creating, stuck(a.by))
    }

    /// The tiered storage the nodes run: the requested one once the create or update
    /// that asked for it is over.
    fn applied_tiered(&self, now: f64) -> Option<&Value> {
        match self.status(now, false) {
            "Creating" | "Updating" => self.tiered_before.as_ref(),
            _ => self.tiered.as_ref(),
        }
    }
}

fn node_status(node: &Node, group: &Group, now: f64) -> &'static str {
    if let Some(status) = nodes::action_status(node, now) {
        return status;
    }
    // A node the health agent found faulty is unhealthy until HyperPod recovers it.
    if node.health.is_some() {
        return "Failure";
    }
    let age = now - node.launched;
    if age < NODE_BOOT_SECS {
        "Pending"
    } else if group.deep_health_checks && age < NODE_BOOT_SECS + DEEP_HEALTH_CHECK_SECS {
        "DeepHealthCheckInProgress"
    } else {
        "Running"
    }
}

impl World {
    fn settle_sagemaker(&mut self) {
        let now = self.clock.now();
        let stuck_delete = self.stuck("sagemaker", "DeleteCluster");
        self.sagemaker.clusters.retain(|_, c| {
            !matches!(&c.phase, Some((Phase::Deleting, since)) if !stuck_delete && now - since >= CLUSTER_DELETE_SECS)
        });
        self.settle_nodes();
    }

    fn hyperpod(&mut self, name: &str) -> Result<&mut Cluster, AwsError> {
        self.settle_sagemaker();
        // HyperPod accepts the name or the ARN.
        let key = name.rsplit('/').next().unwrap_or(name).to_owned();
        self.sagemaker
            .clusters
            .values_mut()
            .find(|c| c.name == key || c.name.eq_ignore_ascii_case(&key))
            .ok_or_else(|| {
                AwsError::new(400, "ResourceNotFound", format!("Cluster {name} not found"))
            })
    }

    /// Brings `group` to its target count: new nodes launch at `now`; when there are too
    /// many, AWS takes the ones not (yet) Running first, then the newest.
    fn launch(&mut self, group: &mut Group, now: f64) {
        while (group.nodes.len() as u32) < group.target {
            self.sagemaker.nodes += 1;
            let serial = self.sagemaker.nodes;
            group.nodes.push(Node {
                id: instance_id(serial),
                logical_id: format!("{}-{serial:08x}", group.name),
                launched: now,
                release: group.desired_release.clone(),
                action: None,
                software_updated: None,
                health: None,
                boots: 0,
            });
        }
        let excess = group.nodes.len().saturating_sub(group.target as usize);
        if excess > 0 {
            let clock = self.clock.now();
            let mut order: Vec<(bool, f64, usize)> = group
                .nodes
                .iter()
                .enumerate()
                .map(|(i, n)| (node_status(n, group, clock) == "Running", n.launched, i))
                .collect();
            // Not Running before Running, then newest (latest launch, later slot) first.
            order.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.total_cmp(&a.1)).then(b.2.cmp(&a.2)));
            let gone: std::collections::BTreeSet<usize> =
                order.iter().take(excess).map(|(_, _, i)| *i).collect();
            let mut index = 0;
            group.nodes.retain(|_| {
                index += 1;
                !gone.contains(&(index - 1))
            });
        }
    }

    fn cluster_json(&self, c: &Cluster) -> Value {
        let now = self.clock.now();
        let status = c.status(
            now,
            self.stuck("sagemaker", "CreateCluster") || self.stuck("sagemaker", "UpdateCluster"),
        );
        let groups: Vec<Value> = c
            .groups
            .iter()
            .map(|g| {
                let running = g
                    .nodes
                    .iter()
                    .filter(|n| node_status(n, g, now) == "Running")
                    .count();
                let mut v = g.spec.clone();
                let updating = g.release != g.desired_release;
                if let Some(o) = v.as_object_mut() {
                    o.insert("CurrentImageReleaseVersion".into(), json!(g.release));
                    o.insert(
                        "DesiredImageReleaseVersion".into(),
                        json!(g.desired_release),
                    );
                    o.remove("ImageReleaseVersion");
                    if updating {
                        o.insert("SoftwareUpdateStatus".into(), json!("InProgress"));
                    }
                    if let Some(plan) = str_field(&g.spec, "TrainingPlanArn")
                        .and_then(|arn| self.sagemaker.training_plans.get(arn))
                    {
                        let stuck = self.stuck("sagemaker", "CreateTrainingPlan");
                        o.insert("TrainingPlanStatus".into(), json!(plan.status(now, stuck)));
                    }
                    o.insert("CurrentCount".into(), json!(running));
                    o.insert("TargetCount".into(), json!(g.target));
                    o.insert(
                        "Status".into(),
                        json!(match status {
                            "Creating" => "Creating",
                            "Updating" => "Updating",
                            "Deleting" => "Deleting",
                            _ if updating => "SystemUpdating",
                            _ if running < g.target as usize => "Degraded",
                            _ => "InService",
                        }),
                    );
                    o.remove("InstanceCount");
                    // The request's MinInstanceCount is reported as MinCount.
                    if let Some(min) = o.remove("MinInstanceCount") {
                        o.insert("MinCount".into(), min);
                    }
                    let current = if matches!(status, "Creating" | "Updating") {
                        &g.previous_kubernetes
                    } else {
                        g.spec.get("KubernetesConfig").unwrap_or(&Value::Null)
                    };
                    match kubernetes_details(g.spec.get("KubernetesConfig"), current) {
                        Some(k) => o.insert("KubernetesConfig".into(), k),
                        None => o.remove("KubernetesConfig"),
                    };
                }
                v
            })
            .collect();
        let auto_scaling = c
            .auto_scaling
            .as_ref()
            .zip(c.autoscaling_status(now, |op| self.stuck("sagemaker", op)))
            .map(|(a, s)| a.json(s));
        json!({
            "ClusterArn": c.arn(),
            "ClusterName": c.name,
            "ClusterStatus": status,
            "CreationTime": self.clock.epoch(c.created),
            "InstanceGroups": groups,
            "VpcConfig": c.vpc,
            "Orchestrator": c.orchestrator,
            "NodeRecovery": c.node_recovery,
            "NodeProvisioningMode": c.provisioning,
            "ClusterRole": c.cluster_role,
            "AutoScaling": auto_scaling,
            "TieredStorageConfig": c.tiered,
        })
    }
}

fn instance_id(serial: u64) -> String {
    format!("i-{:017x}", 0x0ab0_0000 + serial)
}

fn check_name(name: &str, what: &str) -> Result<(), AwsError> {
    check_hyphenated(name, what, 63, "^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$")
}

/// SageMaker's rule for names of the `[a-zA-Z0-9](-*[a-zA-Z0-9]){0,n}` kind: 1 to `max`
/// alphanumerics and hyphens, alphanumeric at both ends. The message quotes `pattern` as
/// the API reference spells it for that field.
fn check_hyphenated(name: &str, what: &str, max: usize, pattern: &str) -> Result<(), AwsError> {
    let ok = (1..=max).contains(&name.len())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric());
    if ok {
        Ok(())
    } else {
        Err(validation(format!(
            "1 validation error detected: Value '{name}' at '{what}' failed to satisfy constraint: Member must satisfy regular expression pattern: {pattern}"
        )))
    }
}

/// Which way a List call sorts when the request names no `SortOrder`; the API reference
/// says so per operation (ListClusterNodes: Ascending; ListMlflowTrackingServers:
/// Descending).
#[derive(Clone, Copy, PartialEq)]
enum Order {
    Ascending,
    Descending,
}

/// The page of `items` (sorted ascending) a List call asks for: reversed when the
/// `SortOrder` (or the operation's default) is Descending; from the offset a `NextToken`
/// carries, at most `MaxResults` (1 to 100, default 100); with the next page's token, if
/// any. Out-of-range values are refused as AWS's request validation refuses them.
fn page<T>(
    body: &Value,
    mut items: Vec<T>,
    default: Order,
) -> Result<(Vec<T>, Option<String>), AwsError> {
    let order = match str_field(body, "SortOrder") {
        None => default,
        Some("Ascending") => Order::Ascending,
        Some("Descending") => Order::Descending,
        Some(other) => {
            return Err(validation(format!(
                "1 validation error detected: Value '{other}' at 'sortOrder' failed to satisfy constraint: Member must satisfy enum value set: [Ascending, Descending]"
            )));
        }
    };
    if order == Order::Descending {
        items.reverse();
    }
    let max = match body.get("MaxResults").filter(|v| !v.is_null()) {
        None => 100,
        Some(v) => match v.as_i64() {
            Some(n @ 1..=100) => n as usize,
            Some(n) if n < 1 => {
                return Err(validation(format!(
                    "1 validation error detected: Value '{n}' at 'maxResults' failed to satisfy constraint: Member must have value greater than or equal to 1"
                )));
            }
            Some(n) => {
                return Err(validation(format!(
                    "1 validation error detected: Value '{n}' at 'maxResults' failed to satisfy constraint: Member must have value less than or equal to 100"
                )));
            }
            None => return Err(validation(format!("MaxResults {v} is not an integer"))),
        },
    };
    let start = match str_field(body, "NextToken") {
        None => 0,
        Some(token) => offset_of(token).ok_or_else(|| {
            // AWS documents no message for this; ValidationException is its code for
            // a request field it cannot accept.
            validation(format!("Invalid NextToken: {token}"))
        })?,
    };
    let next = (start + max < items.len()).then(|| page_token(start + max));
    Ok((items.into_iter().skip(start).take(max).collect(), next))
}

/// A `NextToken` for the page at `offset`. AWS's tokens are opaque, so callers must
/// echo them unchanged: a checksum makes a garbled or made-up token fail instead of
/// quietly listing from somewhere else.
fn page_token(offset: usize) -> String {
    let check = crate::world::fnv1a(&format!("hypd-sim page {offset}")) as u32;
    format!("{check:08x}{offset:08x}")
}

fn offset_of(token: &str) -> Option<usize> {
    let offset = usize::from_str_radix(token.get(8..)?, 16).ok()?;
    (token.len() == 16 && page_token(offset) == token).then_some(offset)
}

fn str_field<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key).and_then(Value::as_str)
}

/// Checks one instance group of a request and returns its stored form.
fn parse_group(
    g: &Value,
    index: usize,
    table: &BTreeMap<String, instance_types::InstanceType>,
) -> Result<Group, AwsError> {
    let at = |field: &str| format!("instanceGroups.{}.member.{field}", index + 1);
    let name = str_field(g, "InstanceGroupName")
        .ok_or_else(|| validation(format!("{} is required", at("instanceGroupName"))))?;
    check_name(name, &at("instanceGroupName"))?;
    let instance_type = str_field(g, "InstanceType").unwrap_or_default();
    let Some(facts) = table.get(instance_type) else {
        return Err(validation(format!(
            "1 validation error detected: Value '{instance_type}' at '{}' failed to satisfy constraint: Member must be one of the supported HyperPod instance types",
            at("instanceType")
        )));
    };
    check_instance_facts(g, name, instance_type, facts)?;
    let target = instance_count(g, "InstanceCount", &at("instanceCount"))?.unwrap_or(0);
    if let Some(min) = instance_count(g, "MinInstanceCount", &at("minInstanceCount"))?
        && min > target
    {
        return Err(validation(format!(
            "MinInstanceCount ({min}) of instance group {name} must be less than or equal to its InstanceCount ({target})"
        )));
    }
    if str_field(g, "ExecutionRole").is_none() {
        return Err(validation(format!("{} is required", at("executionRole"))));
    }
    let lifecycle = g.get("LifeCycleConfig");
    let uri = lifecycle
        .and_then(|l| str_field(l, "SourceS3Uri"))
        .unwrap_or_default();
    if !uri.starts_with("s3://")
        || lifecycle
            .and_then(|l| str_field(l, "OnCreate"))
            .unwrap_or_default()
            .is_empty()
    {
        return Err(validation(format!(
            "{} needs SourceS3Uri (s3://…) and OnCreate",
            at("lifeCycleConfig")
        )));
    }
    check_kubernetes_config(g.get("KubernetesConfig"), &at("kubernetesConfig"))?;
    let deep_health_checks = g
        .get("OnStartDeepHealthChecks")
        .and_then(Value::as_array)
        .is_some_and(|a| !a.is_empty());
    let release = match str_field(g, "ImageReleaseVersion") {
        Some(r) => nodes::check_release(r)?,
        None => nodes::latest_release(),
    };
    Ok(Group {
        name: name.to_owned(),
        instance_type: instance_type.to_owned(),
        target,
        spec: g.clone(),
        deep_health_checks,
        nodes: Vec::new(),
        release: release.clone(),
        desired_release: release,
        placement: Placement::default(),
        previous_kubernetes: Value::Null,
    })
}

/// A count of instances in a group, if given: the model's `ClusterInstanceCount`, 0 to
/// 6758.
fn instance_count(g: &Value, field: &str, at: &str) -> Result<Option<u32>, AwsError> {
    let Some(v) = g.get(field).filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    match v.as_i64() {
        Some(n @ 0..=6758) => Ok(Some(n as u32)),
        Some(n) if n < 0 => Err(validation(format!(
            "1 validation error detected: Value '{n}' at '{at}' failed to satisfy constraint: Member must have value greater than or equal to 0"
        ))),
        Some(n) => Err(validation(format!(
            "1 validation error detected: Value '{n}' at '{at}' failed to satisfy constraint: Member must have value less than or equal to 6758"
        ))),
        None => Err(validation(format!("{at} must be an integer, not {v}"))),
    }
}

/// What the instance type allows: threads per core, EFA-only interfaces, Spot.
fn check_instance_facts(
    g: &Value,
    group: &str,
    instance_type: &str,
    facts: &instance_types::InstanceType,
) -> Result<(), AwsError> {
    if let Some(threads) = g.get("ThreadsPerCore").and_then(Value::as_u64)
        && !facts
            .threads_per_core
            .iter()
            .any(|t| u64::from(*t) == threads)
    {
        return Err(validation(format!(
            "ThreadsPerCore {threads} is not supported for instance type {instance_type} of instance group {group}; supported values: {:?}",
            facts.threads_per_core
        )));
    }
    match g
        .pointer("/NetworkInterface/InterfaceType")
        .and_then(Value::as_str)
    {
        None | Some("efa") => {}
        Some("efa-only") if facts.efa_only => {}
        Some("efa-only") => {
            return Err(validation(format!(
                "InterfaceType efa-only is not supported for instance type {instance_type} of instance group {group}: EFA-only interfaces need an instance type with multiple EFA network cards"
            )));
        }
        Some(other) => {
            return Err(validation(format!(
                "1 validation error detected: Value '{other}' at 'networkInterface.interfaceType' failed to satisfy constraint: Member must satisfy enum value set: [efa, efa-only]"
            )));
        }
    }
    if let Some(capacity) = g.get("CapacityRequirements") {
        let spot = capacity.get("Spot").is_some();
        if spot == capacity.get("OnDemand").is_some() {
            return Err(validation(format!(
                "CapacityRequirements of instance group {group} must specify exactly one of Spot or OnDemand"
            )));
        }
        if spot && !facts.spot {
            return Err(validation(format!(
                "Spot capacity is not available for instance type {instance_type} of instance group {group}"
            )));
        }
        if spot && g.get("TrainingPlanArn").is_some() {
            return Err(validation(format!(
                "Instance group {group} cannot use Spot capacity with a training plan; training plans reserve On-Demand capacity"
            )));
        }
    }
    Ok(())
}

fn is_spot(g: &Value) -> bool {
    g.pointer("/CapacityRequirements/Spot").is_some()
}

/// A group's `KubernetesConfig` (`Labels` and `Taints`, at most 50 of each, every taint
/// with a `Key` and one of Kubernetes' three effects).
fn check_kubernetes_config(config: Option<&Value>, at: &str) -> Result<(), AwsError> {
    let Some(config) = config else {
        return Ok(());
    };
    if let Some(labels) = config.get("Labels") {
        let Some(labels) = labels
            .as_object()
            .filter(|l| l.values().all(Value::is_string))
        else {
            return Err(validation(format!(
                "{at}.labels must map label keys to string values"
            )));
        };
        if labels.len() > 50 {
            return Err(validation(format!(
                "1 validation error detected: Value at '{at}.labels' failed to satisfy constraint: Member must have length less than or equal to 50"
            )));
        }
    }
    let taints = config
        .get("Taints")
        .and_then(Value::as_array)
        .map_or(&[][..], Vec::as_slice);
    if taints.len() > 50 {
        return Err(validation(format!(
            "1 validation error detected: Value at '{at}.taints' failed to satisfy constraint: Member must have length less than or equal to 50"
        )));
    }
    for (i, t) in taints.iter().enumerate() {
        let member = format!("{at}.taints.{}.member", i + 1);
        if str_field(t, "Key").is_none_or(str::is_empty) {
            return Err(validation(format!("{member}.key is required")));
        }
        let effect = str_field(t, "Effect").unwrap_or_default();
        if !matches!(effect, "NoSchedule" | "PreferNoSchedule" | "NoExecute") {
            return Err(validation(format!(
                "1 validation error detected: Value '{effect}' at '{member}.effect' failed to satisfy constraint: Member must satisfy enum value set: [NoSchedule, PreferNoSchedule, NoExecute]"
            )));
        }
    }
    Ok(())
}

/// `KubernetesConfig` as DescribeCluster and DescribeClusterNode report it: the labels
/// and taints the nodes carry (`current`, a request's `{Labels, Taints}`) and those asked
/// for (`desired`); none when the group never had any.
fn kubernetes_details(desired: Option<&Value>, current: &Value) -> Option<Value> {
    let desired = desired.unwrap_or(&Value::Null);
    if desired.is_null() && current.is_null() {
        return None;
    }
    let mut out = serde_json::Map::new();
    for (field, from) in [("Current", current), ("Desired", desired)] {
        for key in ["Labels", "Taints"] {
            if let Some(v) = from.get(key) {
                out.insert(format!("{field}{key}"), v.clone());
            }
        }
    }
    Some(Value::Object(out))
}

/// Cluster-level rules for one group of a create or update request: its override VPC
/// exists, Spot only on EKS with continuous provisioning, its training plan fits. The
/// answer is when its instances may start (a Scheduled plan's start), if later.
fn check_group_in_cluster(
    w: &World,
    cluster: &str,
    g: &Value,
    cluster_vpc: &Value,
    on_eks: bool,
    provisioning: Option<&str>,
    lookups: &Lookups,
) -> Result<Option<f64>, AwsError> {
    let group = str_field(g, "InstanceGroupName").unwrap_or_default();
    let own_vpc = g.get("OverrideVpcConfig");
    lookups.check_vpc(
        own_vpc,
        &format!("OverrideVpcConfig of instance group {group}"),
    )?;
    if is_spot(g) && !(on_eks && provisioning == Some("Continuous")) {
        return Err(validation(format!(
            "Instance group {group} uses Spot capacity, which needs an EKS orchestrator and NodeProvisioningMode Continuous"
        )));
    }
    let subnets: Vec<String> = lookups::strings(own_vpc.unwrap_or(cluster_vpc).get("Subnets"))
        .map(str::to_owned)
        .collect();
    training_plans::check_group(w, g, &subnets, lookups, cluster)
}

/// Instances of `instance_type` across every cluster, excluding `except` cluster.
fn in_use(w: &World, instance_type: &str, except: Option<&str>) -> u32 {
    w.sagemaker
        .clusters
        .values()
        .filter(|c| Some(c.name.as_str()) != except)
        .flat_map(|c| c.groups.iter())
        .filter(|g| g.instance_type == instance_type)
        .map(|g| g.target)
        .sum()
}

fn check_quotas(w: &World, groups: &[Group], except: Option<&str>) -> Result<(), AwsError> {
    let mut wanted: BTreeMap<&str, u32> = BTreeMap::new();
    for g in groups {
        *wanted.entry(g.instance_type.as_str()).or_default() += g.target;
    }
    for (t, n) in wanted {
        let quota = w.sagemaker.quotas.get(t).copied().unwrap_or(0);
        let used = in_use(w, t, except);
        if used + n > quota {
            return Err(AwsError::new(
                400,
                "ResourceLimitExceeded",
                format!(
                    "The account-level service limit '{t} for cluster usage' is {quota} Instances, with current utilization of {used} Instances and a request delta of {n} Instances. Please use AWS Service Quotas to request an increase for this quota."
                ),
            ));
        }
    }
    Ok(())
}

/// The fields of an instance group AWS refuses to change after creation.
const IMMUTABLE: &[&str] = &[
    "InstanceType",
    "TrainingPlanArn",
    "ThreadsPerCore",
    "CapacityRequirements",
    "NetworkInterface",
    "OverrideVpcConfig",
];

fn create_cluster(
    w: &mut World,
    region: &str,
    body: &Value,
    lookups: &Lookups,
) -> Result<Value, AwsError> {
    let name = str_field(body, "ClusterName").unwrap_or_default();
    check_name(name, "clusterName")?;
    w.settle_sagemaker();
    if w.sagemaker.clusters.values().any(|c| c.name == name) {
        return Err(AwsError::new(
            400,
            "ResourceInUse",
            format!("Cluster {name} already exists"),
        ));
    }
    let groups_in = body
        .get("InstanceGroups")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if groups_in.is_empty() {
        return Err(validation(
            "InstanceGroups must contain at least one instance group",
        ));
    }
    let mut groups = Vec::new();
    for (i, g) in groups_in.iter().enumerate() {
        let group = parse_group(g, i, &w.sagemaker.instance_types)?;
        if groups.iter().any(|x: &Group| x.name == group.name) {
            return Err(validation(format!(
                "Duplicate instance group name {}",
                group.name
            )));
        }
        groups.push(group);
    }
    if let Some(role) = groups_in
        .iter()
        .filter_map(|g| str_field(g, "ExecutionRole"))
        .find(|role| !lookups.role_exists(role))
    {
        return Err(validation(format!(
            "Execution role {role} does not exist or cannot be assumed"
        )));
    }
    let vpc = body.get("VpcConfig").cloned().unwrap_or(Value::Null);
    lookups.check_vpc(Some(&vpc).filter(|v| !v.is_null()), "VpcConfig")?;
    let orchestrator = body.get("Orchestrator").cloned().unwrap_or(Value::Null);
    if let Some(eks_arn) = orchestrator
        .pointer("/Eks/ClusterArn")
        .and_then(Value::as_str)
    {
        let eks_name = eks_arn.rsplit('/').next().unwrap_or_default();
        if !w.eks_cluster_active(eks_name) {
            return Err(validation(format!(
                "The EKS cluster {eks_arn} does not exist or is not ACTIVE"
            )));
        }
    }
    let provisioning = str_field(body, "NodeProvisioningMode");
    let on_eks = orchestrator.get("Eks").is_some();
    let mut starts = Vec::new();
    for g in &groups_in {
        starts.push(check_group_in_cluster(
            w,
            name,
            g,
            &vpc,
            on_eks,
            provisioning,
            lookups,
        )?);
    }
    check_quotas(w, &groups, None)?;
    let placement = Placement::of(region, lookups::strings(vpc.get("Subnets")), lookups);
    for g in &mut groups {
        g.placement = match g.spec.get("OverrideVpcConfig") {
            Some(own) => Placement::of(region, lookups::strings(own.get("Subnets")), lookups),
            None => placement.clone(),
        };
    }
    let now = w.clock.now();
    let mut cluster = Cluster {
        name: name.to_owned(),
        region: region.to_owned(),
        created: now,
        phase: Some((Phase::Creating, now)),
        orchestrator,
        vpc,
        placement,
        node_recovery: "Automatic".to_owned(),
        provisioning: None,
        groups: Vec::new(),
        system_update: false,
        tags: body.get("Tags").cloned().unwrap_or_else(|| json!([])),
        cluster_role: None,
        auto_scaling: None,
        tiered: None,
        tiered_before: None,
    };
    let failure = w.failing("sagemaker", "CreateCluster").map(|(_, m)| m);
    apply_settings(&mut cluster, body, lookups, now, "CreateCluster", failure)?;
    for (g, start) in groups.iter_mut().zip(starts) {
        w.launch(g, start.map_or(now, |s| s.max(now)));
    }
    cluster.groups = groups;
    let arn = cluster.arn();
    w.sagemaker.clusters.insert(name.to_owned(), cluster);
    Ok(json!({ "ClusterArn": arn }))
}

/// `NodeRecovery` of a CreateCluster or UpdateCluster request, if it names one.
fn node_recovery(body: &Value) -> Result<Option<String>, AwsError> {
    match str_field(body, "NodeRecovery") {
        None => Ok(None),
        Some(nr @ ("Automatic" | "None")) => Ok(Some(nr.to_owned())),
        Some(_) => Err(validation("NodeRecovery must be Automatic or None")),
    }
}

/// An IAM role ARN as the model's `RoleArn` shape has it (20 to 2,048 characters).
const ROLE_ARN: &str = r"^arn:aws[a-z\-]*:iam::\d{12}:role/?[a-zA-Z_0-9+=,.@\-_/]+$";

/// A request field that is there and not null.
fn given<'a>(body: &'a Value, key: &str) -> Option<&'a Value> {
    body.get(key).filter(|v| !v.is_null())
}

/// A string enum member of a request: `None` when absent, AWS's refusal when not one of
/// `allowed`. `at` is the member's path as AWS's messages spell it.
fn member<'a>(
    v: &'a Value,
    key: &str,
    at: &str,
    allowed: &[&str],
) -> Result<Option<&'a str>, AwsError> {
    let Some(value) = given(v, key) else {
        return Ok(None);
    };
    match value.as_str() {
        Some(s) if allowed.contains(&s) => Ok(Some(s)),
        _ => Err(validation(format!(
            "1 validation error detected: Value '{}' at '{at}' failed to satisfy constraint: Member must satisfy enum value set: [{}]",
            value
                .as_str()
                .map_or_else(|| value.to_string(), str::to_owned),
            allowed.join(", ")
        ))),
    }
}

fn required(at: &str) -> AwsError {
    validation(format!(
        "1 validation error detected: Value null at '{at}' failed to satisfy constraint: Member must not be null"
    ))
}

/// Applies the cluster-level settings of a CreateCluster or UpdateCluster request
/// (NodeRecovery, NodeProvisioningMode, ClusterRole, AutoScaling, TieredStorageConfig) to
/// `c`, a copy the caller keeps only if this succeeds. A field the request leaves out
/// keeps its value. Field shapes are checked first, then how the settings fit together:
/// autoscaling (managed Karpenter) needs a cluster role, an EKS orchestrator, continuous
/// provisioning and automatic node recovery, and its role cannot change while it is on.
/// `op` is the call's operation and `failure` the message of a `fails` fault registered
/// for it, for an install to end with.
fn apply_settings(
    c: &mut Cluster,
    body: &Value,
    lookups: &Lookups,
    now: f64,
    op: &'static str,
    failure: Option<String>,
) -> Result<(), AwsError> {
    let provisioning = member(
        body,
        "NodeProvisioningMode",
        "nodeProvisioningMode",
        &["Continuous"],
    )?;
    let recovery = node_recovery(body)?;
    let mut auto_scaling = None;
    if let Some(a) = given(body, "AutoScaling") {
        let mode = member(a, "Mode", "autoScaling.mode", &["Enable", "Disable"])?
            .ok_or_else(|| required("autoScaling.mode"))?;
        let scaler = member(
            a,
            "AutoScalerType",
            "autoScaling.autoScalerType",
            &["Karpenter"],
        )?
        .unwrap_or("Karpenter");
        auto_scaling = Some((mode == "Enable", scaler));
    }
    let role = match given(body, "ClusterRole") {
        None => None,
        Some(v) => {
            let role = v.as_str().unwrap_or_default();
            let pattern = regex::Regex::new(ROLE_ARN).map_err(|e| validation(e.to_string()))?;
            if !(20..=2048).contains(&role.len()) || !pattern.is_match(role) {
                return Err(validation(format!(
                    "1 validation error detected: Value '{role}' at 'clusterRole' failed to satisfy constraint: Member must satisfy regular expression pattern: {ROLE_ARN}"
                )));
            }
            Some(role)
        }
    };
    let mut tiered = None;
    if let Some(t) = given(body, "TieredStorageConfig") {
        let mode = member(
            t,
            "Mode",
            "tieredStorageConfig.mode",
            &["Enable", "Disable"],
        )?
        .ok_or_else(|| required("tieredStorageConfig.mode"))?;
        let at = "tieredStorageConfig.instanceMemoryAllocationPercentage";
        let mut config = json!({ "Mode": mode });
        if let Some(p) = given(t, "InstanceMemoryAllocationPercentage") {
            match p.as_i64() {
                Some(n @ 0..=100) => config["InstanceMemoryAllocationPercentage"] = json!(n),
                Some(n) if n < 0 => {
                    return Err(validation(format!(
                        "1 validation error detected: Value '{n}' at '{at}' failed to satisfy constraint: Member must have value greater than or equal to 0"
                    )));
                }
                Some(n) => {
                    return Err(validation(format!(
                        "1 validation error detected: Value '{n}' at '{at}' failed to satisfy constraint: Member must have value less than or equal to 100"
                    )));
                }
                None => return Err(validation(format!("{at} must be an integer, not {p}"))),
            }
        }
        tiered = Some(config);
    }

    let on_eks = c.orchestrator.get("Eks").is_some();
    if let Some(p) = provisioning {
        c.provisioning = Some(p.to_owned());
    }
    if let Some(nr) = recovery {
        c.node_recovery = nr;
    }
    let was_enabled = c.auto_scaling.as_ref().is_some_and(|a| a.enabled);
    if let Some((enable, scaler)) = auto_scaling
        && enable != was_enabled
    {
        c.auto_scaling = Some(AutoScaling {
            enabled: enable,
            scaler: scaler.to_owned(),
            since: now,
            by: op,
            failure: failure.filter(|_| enable),
        });
    }
    let enabled = c.auto_scaling.as_ref().is_some_and(|a| a.enabled);
    if let Some(role) = role {
        if was_enabled && enabled && c.cluster_role.as_deref() != Some(role) {
            return Err(validation(
                "ClusterRole cannot be updated while autoscaling is enabled; disable autoscaling first",
            ));
        }
        if !lookups.role_exists(role) {
            return Err(validation(format!(
                "Cluster role {role} does not exist or cannot be assumed"
            )));
        }
        c.cluster_role = Some(role.to_owned());
    }
    if enabled {
        // Managed Karpenter's prerequisites, as the autoscaling guide lists them.
        let unmet = if c.cluster_role.is_none() {
            Some("a ClusterRole (an IAM role HyperPod assumes to add and remove nodes)")
        } else if !on_eks {
            Some("an EKS orchestrator")
        } else if c.provisioning.as_deref() != Some("Continuous") {
            Some("NodeProvisioningMode Continuous")
        } else if c.node_recovery != "Automatic" {
            Some("NodeRecovery Automatic")
        } else {
            None
        };
        if let Some(unmet) = unmet {
            return Err(validation(format!(
                "AutoScaling with Mode Enable requires {unmet}"
            )));
        }
    }
    if let Some(config) = tiered {
        // Managed tiered checkpointing runs on EKS-orchestrated clusters only.
        if !on_eks {
            return Err(validation(
                "TieredStorageConfig is supported only for clusters with an EKS orchestrator",
            ));
        }
        c.tiered = Some(config);
    }
    Ok(())
}

/// Takes the cluster-level settings `apply_settings` left on `from`; the tiered storage
/// in force so far stays what the nodes run until this update is over.
fn take_settings(c: &mut Cluster, from: &Cluster) {
    c.node_recovery = from.node_recovery.clone();
    c.provisioning = from.provisioning.clone();
    c.cluster_role = from.cluster_role.clone();
    c.auto_scaling = from.auto_scaling.clone();
    c.tiered_before = c.tiered.take();
    c.tiered = from.tiered.clone();
}

fn update_cluster(w: &mut World, body: &Value, lookups: &Lookups) -> Result<Value, AwsError> {
    let name = str_field(body, "ClusterName")
        .unwrap_or_default()
        .to_owned();
    let now = w.clock.now();
    let table = w.sagemaker.instance_types.clone();
    let cluster = w.hyperpod(&name)?.clone();
    if cluster.status(now, false) != "InService" {
        return Err(validation(format!(
            "Cluster {name} is {}; it can be updated only when InService",
            cluster.status(now, false)
        )));
    }
    let failure = w.failing("sagemaker", "UpdateCluster").map(|(_, m)| m);
    let mut settled = cluster.clone();
    apply_settings(&mut settled, body, lookups, now, "UpdateCluster", failure)?;
    if body.get("InstanceGroups").is_none() && body.get("InstanceGroupsToDelete").is_none() {
        // InstanceGroups is optional: a call that names none changes the cluster's own
        // settings, and its groups stay as they are.
        let c = w.hyperpod(&name)?;
        take_settings(c, &settled);
        for g in &mut c.groups {
            g.previous_kubernetes = g
                .spec
                .get("KubernetesConfig")
                .cloned()
                .unwrap_or(Value::Null);
        }
        c.phase = Some((Phase::Updating, now));
        return Ok(json!({ "ClusterArn": c.arn() }));
    }
    let to_delete: Vec<&str> = body
        .get("InstanceGroupsToDelete")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let mut groups = Vec::new();
    for (i, g) in body
        .get("InstanceGroups")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
        .iter()
        .enumerate()
    {
        let mut group = parse_group(g, i, &table)?;
        if let Some(old) = cluster.groups.iter().find(|o| o.name == group.name) {
            for field in IMMUTABLE {
                if old.spec.get(*field) != g.get(*field) {
                    return Err(validation(format!(
                        "{field} of instance group {} cannot be updated (was {}, requested {})",
                        group.name,
                        old.spec.get(*field).unwrap_or(&Value::Null),
                        g.get(*field).unwrap_or(&Value::Null)
                    )));
                }
            }
            group.nodes = old.nodes.clone();
            group.release = old.release.clone();
            group.desired_release = old.desired_release.clone();
            group.placement = old.placement.clone();
            group.previous_kubernetes = old
                .spec
                .get("KubernetesConfig")
                .cloned()
                .unwrap_or(Value::Null);
        } else if let Some(role) =
            str_field(g, "ExecutionRole").filter(|role| !lookups.role_exists(role))
        {
            return Err(validation(format!(
                "Execution role {role} does not exist or cannot be assumed"
            )));
        } else {
            group.placement = match g.get("OverrideVpcConfig") {
                Some(own) => Placement::of(
                    &cluster.region,
                    lookups::strings(own.get("Subnets")),
                    lookups,
                ),
                None => cluster.placement.clone(),
            };
        }
        groups.push(group);
    }
    // Groups neither listed nor deleted stay as they are (UpdateCluster takes the whole
    // list; omitting a group without deleting it is refused, as AWS does).
    for old in &cluster.groups {
        if !groups.iter().any(|g| g.name == old.name) && !to_delete.contains(&old.name.as_str()) {
            return Err(validation(format!(
                "Instance group {} is missing from InstanceGroups; list every group, or name it in InstanceGroupsToDelete",
                old.name
            )));
        }
    }
    let on_eks = cluster.orchestrator.get("Eks").is_some();
    let mut starts = Vec::new();
    for g in body
        .get("InstanceGroups")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        starts.push(check_group_in_cluster(
            w,
            &cluster.name,
            g,
            &cluster.vpc,
            on_eks,
            settled.provisioning.as_deref(),
            lookups,
        )?);
    }
    check_quotas(w, &groups, Some(&cluster.name))?;
    for (g, start) in groups.iter_mut().zip(starts) {
        w.launch(g, start.map_or(now, |s| s.max(now)));
    }
    let c = w.hyperpod(&name)?;
    c.groups = groups;
    take_settings(c, &settled);
    c.phase = Some((Phase::Updating, now));
    Ok(json!({ "ClusterArn": c.arn() }))
}

/// A node as ListClusterNodes and DescribeClusterNode report it.
fn node_json(clock: &crate::world::Clock, c: &Cluster, g: &Group, n: &Node, now: f64) -> Value {
    let mut v = json!({
        "InstanceGroupName": g.name,
        "InstanceId": n.id,
        "InstanceType": g.instance_type,
        "NodeLogicalId": n.logical_id,
        "LaunchTime": clock.epoch(n.launched),
        "InstanceStatus": { "Status": node_status(n, g, now), "Message": "" },
        "PrivateDnsHostname": private_dns(&private_ip(&n.id, g.placement.cidr), &c.region),
        "CurrentImageReleaseVersion": n.release,
    });
    if let Some(t) = n.software_updated {
        v["LastSoftwareUpdateTime"] = json!(clock.epoch(t));
    }
    v
}

fn list_nodes(w: &mut World, body: &Value) -> Result<Value, AwsError> {
    let now = w.clock.now();
    let c = w
        .hyperpod(str_field(body, "ClusterName").unwrap_or_default())?
        .clone();
    let filter = str_field(body, "InstanceGroupNameContains").unwrap_or_default();
    let after = body.get("CreationTimeAfter").and_then(Value::as_f64);
    let before = body.get("CreationTimeBefore").and_then(Value::as_f64);
    let clock = &w.clock;
    let mut nodes: Vec<(&Group, &Node)> = c
        .groups
        .iter()
        .filter(|g| g.name.contains(filter))
        .flat_map(|g| g.nodes.iter().map(move |n| (g, n)))
        .filter(|(_, n)| after.is_none_or(|a| clock.epoch(n.launched) > a))
        .filter(|(_, n)| before.is_none_or(|b| clock.epoch(n.launched) < b))
        .collect();
    // Stable sorts: nodes launched together keep their slots' order, so pages do not
    // shuffle between calls.
    match str_field(body, "SortBy").unwrap_or("CREATION_TIME") {
        "CREATION_TIME" => nodes.sort_by(|a, b| a.1.launched.total_cmp(&b.1.launched)),
        // A node has no name of its own; its instance group's name is the one it lists by.
        "NAME" => nodes.sort_by(|a, b| {
            (a.0.name.as_str(), a.1.launched)
                .partial_cmp(&(b.0.name.as_str(), b.1.launched))
                .unwrap_or(std::cmp::Ordering::Equal)
        }),
        other => {
            return Err(validation(format!(
                "1 validation error detected: Value '{other}' at 'sortBy' failed to satisfy constraint: Member must satisfy enum value set: [CREATION_TIME, NAME]"
            )));
        }
    }
    let (nodes, next) = page(body, nodes, Order::Ascending)?;
    let summaries: Vec<Value> = nodes
        .into_iter()
        .map(|(g, n)| node_json(clock, &c, g, n, now))
        .collect();
    Ok(json!({ "ClusterNodeSummaries": summaries, "NextToken": next }))
}

fn describe_node(w: &mut World, body: &Value) -> Result<Value, AwsError> {
    let now = w.clock.now();
    let c = w
        .hyperpod(str_field(body, "ClusterName").unwrap_or_default())?
        .clone();
    let id = str_field(body, "NodeId")
        .or_else(|| str_field(body, "NodeLogicalId"))
        .unwrap_or_default();
    for g in &c.groups {
        if let Some(n) = g.nodes.iter().find(|n| n.id == id || n.logical_id == id) {
            let mut details = node_json(&w.clock, &c, g, n, now);
            if let Some(o) = details.as_object_mut() {
                o.insert(
                    "PrivatePrimaryIp".into(),
                    json!(private_ip(&n.id, g.placement.cidr)),
                );
                o.insert("Placement".into(), g.placement.json());
                let updating = matches!(c.status(now, false), "Creating" | "Updating");
                let desired = g.spec.get("KubernetesConfig");
                let current = if updating {
                    &g.previous_kubernetes
                } else {
                    desired.unwrap_or(&Value::Null)
                };
                if let Some(k) = kubernetes_details(desired, current) {
                    o.insert("KubernetesConfig".into(), k);
                }
                o.insert(
                    "LifeCycleConfig".into(),
                    g.spec
                        .get("LifeCycleConfig")
                        .cloned()
                        .unwrap_or(Value::Null),
                );
                o.insert(
                    "ThreadsPerCore".into(),
                    g.spec.get("ThreadsPerCore").cloned().unwrap_or(Value::Null),
                );
                o.insert(
                    "CapacityType".into(),
                    json!(if is_spot(&g.spec) { "Spot" } else { "OnDemand" }),
                );
                for key in [
                    "NetworkInterface",
                    "OverrideVpcConfig",
                    "InstanceStorageConfigs",
                ] {
                    if let Some(v) = g.spec.get(key) {
                        o.insert(key.into(), v.clone());
                    }
                }
                o.insert(
                    "DesiredImageReleaseVersion".into(),
                    json!(g.desired_release),
                );
            }
            return Ok(json!({ "NodeDetails": details }));
        }
    }
    Err(AwsError::new(
        400,
        "ResourceNotFound",
        format!("Node {id} not found in cluster {}", c.name),
    ))
}

/// `POST /` with `X-Amz-Target: SageMaker.<Operation>`.
pub async fn dispatch(State(state): State<Shared>, headers: HeaderMap, body: Bytes) -> Response {
    let Some(op) = headers
        .get("x-amz-target")
        .and_then(|v| v.to_str().ok())
        .and_then(|t| t.strip_prefix("SageMaker."))
        .map(str::to_owned)
    else {
        return AwsError::new(400, "UnknownOperationException", "missing X-Amz-Target")
            .into_response();
    };
    let region = region_of(&headers);
    let body: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => return validation(format!("invalid JSON: {e}")).into_response(),
    };
    // moto is asked before the world is locked.
    let moto = state.lock().await.moto.clone();
    let lookups = match Lookups::gather(moto.as_ref(), &region, &op, &body).await {
        Ok(l) => l,
        Err(e) => return e.into_response(),
    };
    let fault = crate::world::injected(&state, "sagemaker", &op).await;
    let lost = matches!(fault, Some(crate::world::FaultKind::Lost));
    if let Some(e) = fault.filter(|_| !lost).and_then(crate::world::aws_error) {
        return e.into_response();
    }
    let mut guard = state.lock().await;
    let w: &mut World = &mut guard;
    let result = match op.as_str() {
        "CreateCluster" => create_cluster(w, &region, &body, &lookups),
        "DescribeCluster" => w
            .hyperpod(str_field(&body, "ClusterName").unwrap_or_default())
            .map(|c| c.clone())
            .map(|c| w.cluster_json(&c)),
        "ListClusters" => {
            w.settle_sagemaker();
            let now = w.clock.now();
            let summaries: Vec<Value> = w
                .sagemaker
                .clusters
                .values()
                .filter(|c| c.region == region)
                .map(|c| {
                    json!({
                        "ClusterArn": c.arn(),
                        "ClusterName": c.name,
                        "CreationTime": w.clock.epoch(c.created),
                        "ClusterStatus": c.status(now, false),
                    })
                })
                .collect();
            Ok(json!({ "ClusterSummaries": summaries }))
        }
        "UpdateCluster" => update_cluster(w, &body, &lookups),
        "DeleteCluster" => {
            let now = w.clock.now();
            w.hyperpod(str_field(&body, "ClusterName").unwrap_or_default())
                .map(|c| {
                    c.phase = Some((Phase::Deleting, now));
                    json!({ "ClusterArn": c.arn() })
                })
        }
        "ListClusterNodes" => list_nodes(w, &body),
        "DescribeClusterNode" => describe_node(w, &body),
        "ListTags" => list_tags(w, &body),
        "BatchDeleteClusterNodes" => nodes::batch_delete(w, &body),
        "BatchRebootClusterNodes" => nodes::batch_reboot(w, &body),
        "BatchReplaceClusterNodes" => nodes::batch_replace(w, &body),
        "UpdateClusterSoftware" => nodes::update_software(w, &body),
        "SearchTrainingPlanOfferings" => training_plans::search(w, &body),
        "CreateTrainingPlan" => training_plans::create(w, &region, &body),
        "DescribeTrainingPlan" => training_plans::describe(w, &body),
        "ListTrainingPlans" => training_plans::list(w, &region, &body),
        "CreateMlflowTrackingServer" => mlflow::create(w, &region, &body, &lookups),
        "DescribeMlflowTrackingServer" => mlflow::describe(w, &body),
        "ListMlflowTrackingServers" => mlflow::list(w, &region, &body),
        "UpdateMlflowTrackingServer" => mlflow::update(w, &body),
        "DeleteMlflowTrackingServer" => mlflow::delete(w, &body),
        "CreatePresignedMlflowTrackingServerUrl" => mlflow::presigned_url(w, &body),
        other => Err(AwsError::new(
            400,
            "UnknownOperationException",
            format!("hypd-sim does not implement SageMaker.{other}"),
        )),
    };
    if lost {
        return crate::world::aws_error(crate::world::FaultKind::Lost)
            .map(IntoResponse::into_response)
            .unwrap_or_default();
    }
    match result {
        Ok(v) => Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

/// ListTags for a HyperPod cluster's ARN (the only taggable resource the sim keeps).
fn list_tags(w: &mut World, body: &Value) -> Result<Value, AwsError> {
    let arn = str_field(body, "ResourceArn").unwrap_or_default();
    w.settle_sagemaker();
    w.sagemaker
        .clusters
        .values()
        .find(|c| c.arn() == arn)
        .map(|c| json!({ "Tags": c.tags }))
        .ok_or_else(|| validation(format!("Resource {arn} does not exist")))
}

/// A HyperPod instance as the Kubernetes emulator sees it (it becomes a Node).
pub struct Instance {
    pub id: String,
    pub instance_type: String,
    pub group: String,
    pub cluster: String,
    pub region: String,
    pub zone: String,
    pub zone_id: String,
    pub private_ip: String,
    pub private_dns: String,
    /// The group's `KubernetesConfig.Labels`.
    pub labels: BTreeMap<String, String>,
    /// The group's `KubernetesConfig.Taints`, as Kubernetes spells taints.
    pub taints: Vec<Value>,
    /// `Pending`, `DeepHealthCheckInProgress`, `Running`, `Failure`, `ShuttingDown` or
    /// `SystemUpdating`.
    pub status: &'static str,
    /// `UnschedulablePendingReboot` or `UnschedulablePendingReplacement` while HyperPod
    /// owes the instance that recovery.
    pub pending_recovery: Option<&'static str>,
    /// Reboots of this instance so far.
    pub boots: u32,
    /// Simulated second the instance was launched.
    pub launched: f64,
}

fn group_labels(g: &Group) -> BTreeMap<String, String> {
    g.spec
        .pointer("/KubernetesConfig/Labels")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
        .collect()
}

fn group_taints(g: &Group) -> Vec<Value> {
    g.spec
        .pointer("/KubernetesConfig/Taints")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|t| {
            let mut taint = json!({ "key": t["Key"], "effect": t["Effect"] });
            if let Some(v) = str_field(t, "Value") {
                taint["value"] = json!(v);
            }
            taint
        })
        .collect()
}

/// Whether HyperPod cluster `c` is orchestrated by EKS cluster `eks_name`.
fn on_eks(c: &Cluster, eks_name: &str) -> bool {
    c.orchestrator["Eks"]["ClusterArn"]
        .as_str()
        .and_then(|arn| arn.rsplit_once(":cluster/"))
        .is_some_and(|(_, name)| name == eks_name)
}

/// What a HyperPod cluster runs on its EKS cluster's Kubernetes side besides nodes.
pub struct Features {
    pub cluster: String,
    /// The `TieredStorageConfig` the nodes run, while its Mode is Enable: HyperPod's
    /// memory-management daemon is installed.
    pub tiered_storage: Option<Value>,
    /// Autoscaling is InService: managed Karpenter serves its resources and scales.
    pub karpenter: bool,
}

/// An instance group as managed Karpenter sees it.
#[derive(Clone, Debug)]
pub struct AutoscaledGroup {
    pub name: String,
    pub instance_type: String,
    pub target: u32,
    pub deep_health_checks: bool,
    pub training_plan: bool,
    pub spot: bool,
    pub region: String,
    /// The subnet its instances run in, if the cluster names one.
    pub subnet: Option<String>,
    pub zone: String,
    pub zone_id: String,
    /// Its `KubernetesConfig` labels and taints (as Kubernetes spells taints).
    pub labels: BTreeMap<String, String>,
    pub taints: Vec<Value>,
}

impl World {
    /// The managed features of the HyperPod clusters on EKS cluster `eks_name` (not
    /// those being deleted).
    pub fn hyperpod_features(&mut self, eks_name: &str) -> Vec<Features> {
        self.settle_sagemaker();
        let now = self.clock.now();
        let stuck = |op: &str| self.stuck("sagemaker", op);
        self.sagemaker
            .clusters
            .values()
            .filter(|c| on_eks(c, eks_name) && !matches!(c.phase, Some((Phase::Deleting, _))))
            .map(|c| Features {
                cluster: c.name.clone(),
                tiered_storage: c
                    .applied_tiered(now)
                    .filter(|t| t["Mode"] == "Enable")
                    .cloned(),
                karpenter: c.autoscaling_status(now, stuck) == Some("InService"),
            })
            .collect()
    }

    /// The instance groups of HyperPod cluster `cluster`, for its managed Karpenter.
    pub fn autoscaled_groups(&mut self, cluster: &str) -> Vec<AutoscaledGroup> {
        let Ok(c) = self.hyperpod(cluster) else {
            return Vec::new();
        };
        c.groups
            .iter()
            .map(|g| AutoscaledGroup {
                name: g.name.clone(),
                instance_type: g.instance_type.clone(),
                target: g.target,
                deep_health_checks: g.deep_health_checks,
                training_plan: g.spec.get("TrainingPlanArn").is_some(),
                spot: is_spot(&g.spec),
                region: c.region.clone(),
                subnet: lookups::strings(
                    g.spec
                        .get("OverrideVpcConfig")
                        .unwrap_or(&c.vpc)
                        .get("Subnets"),
                )
                .next()
                .map(str::to_owned),
                zone: g.placement.zone.clone(),
                zone_id: g.placement.zone_id.clone(),
                labels: group_labels(g),
                taints: group_taints(g),
            })
            .collect()
    }

    /// What BatchAddClusterNodes does for managed Karpenter, on its cluster role: `count`
    /// more nodes in `group`, launched as any group's new nodes are, within the quotas.
    pub fn autoscale_up(&mut self, cluster: &str, group: &str, count: u32) -> Result<(), AwsError> {
        let now = self.clock.now();
        let c = self.hyperpod(cluster)?.clone();
        let status = c.status(now, false);
        if matches!(status, "Creating" | "Deleting") {
            return Err(validation(format!(
                "Cluster {cluster} is {status}; nodes can be added only when it is InService"
            )));
        }
        let Some(index) = c.groups.iter().position(|g| g.name == group) else {
            return Err(validation(format!(
                "Instance group {group} does not exist in cluster {cluster}"
            )));
        };
        let mut groups = c.groups;
        let g = &mut groups[index];
        g.target += count;
        if let Some(o) = g.spec.as_object_mut() {
            o.insert("InstanceCount".into(), json!(g.target));
        }
        check_quotas(self, &groups, Some(cluster))?;
        let mut g = groups.swap_remove(index);
        self.launch(&mut g, now);
        self.hyperpod(cluster)?.groups[index] = g;
        Ok(())
    }

    /// What BatchDeleteClusterNodes does for managed Karpenter: the same call, on the
    /// nodes it has consolidated away.
    pub fn autoscale_down(&mut self, cluster: &str, ids: &[String]) -> Result<Value, AwsError> {
        nodes::batch_delete(self, &json!({ "ClusterName": cluster, "NodeIds": ids }))
    }

    /// The instances of HyperPod clusters orchestrated by EKS cluster `eks_name`.
    pub fn hyperpod_instances(&mut self, eks_name: &str) -> Vec<Instance> {
        self.settle_sagemaker();
        let now = self.clock.now();
        self.sagemaker
            .clusters
            .values()
            .filter(|c| on_eks(c, eks_name))
            .flat_map(|c| {
                c.groups.iter().flat_map(move |g| {
                    g.nodes.iter().map(move |n| {
                        let ip = private_ip(&n.id, g.placement.cidr);
                        Instance {
                            id: n.id.clone(),
                            instance_type: g.instance_type.clone(),
                            group: g.name.clone(),
                            cluster: c.name.clone(),
                            region: c.region.clone(),
                            zone: g.placement.zone.clone(),
                            zone_id: g.placement.zone_id.clone(),
                            private_dns: private_dns(&ip, &c.region),
                            private_ip: ip,
                            labels: group_labels(g),
                            taints: group_taints(g),
                            status: node_status(n, g, now),
                            pending_recovery: n.health.as_ref().map(|h| h.recovery.label()),
                            boots: n.boots,
                            launched: n.launched,
                        }
                    })
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group(name: &str, count: u32) -> Value {
        json!({
            "InstanceGroupName": name, "InstanceType": "ml.g5.8xlarge", "InstanceCount": count,
            "ExecutionRole": "arn:aws:iam::123456789012:role/r",
            "LifeCycleConfig": {"SourceS3Uri": "s3://b/l", "OnCreate": "on_create.sh"}
        })
    }

    /// Cluster `c` with `groups`, waited for until InService.
    fn cluster(w: &mut World, groups: Vec<Value>) {
        let body = json!({"ClusterName": "c", "InstanceGroups": groups});
        create_cluster(w, "us-east-1", &body, &Lookups::default()).unwrap();
        w.clock.advance(2000.0);
    }

    fn update(w: &mut World, groups: Vec<Value>) -> Result<Value, AwsError> {
        let body = json!({"ClusterName": "c", "InstanceGroups": groups});
        let out = update_cluster(w, &body, &Lookups::default());
        w.clock.advance(2000.0);
        out
    }

    fn list(w: &mut World, extra: Value) -> Result<Value, AwsError> {
        let mut body = json!({"ClusterName": "c"});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        list_nodes(w, &body)
    }

    /// (group, instance id) of each summary.
    fn listed(out: &Value) -> Vec<(String, String)> {
        out["ClusterNodeSummaries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| {
                (
                    n["InstanceGroupName"].as_str().unwrap().to_owned(),
                    n["InstanceId"].as_str().unwrap().to_owned(),
                )
            })
            .collect()
    }

    /// Cluster `c`: group `b` of two nodes launched first, then group `a` of three.
    fn two_generations(w: &mut World) -> Vec<(String, String)> {
        cluster(w, vec![group("b", 2)]);
        update(w, vec![group("b", 2), group("a", 3)]).unwrap();
        listed(&list(w, json!({})).unwrap())
    }

    #[test]
    fn list_cluster_nodes_sorts_oldest_first_by_default_and_pages_with_opaque_tokens() {
        let mut w = World::new(0.0, None);
        let all = two_generations(&mut w);
        let groups: Vec<&str> = all.iter().map(|(g, _)| g.as_str()).collect();
        assert_eq!(
            groups,
            ["b", "b", "a", "a", "a"],
            "Ascending by creation time"
        );

        let mut seen = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let mut extra = json!({"MaxResults": 2});
            if let Some(t) = &token {
                extra["NextToken"] = json!(t);
            }
            let out = list(&mut w, extra).unwrap();
            let page = listed(&out);
            assert!(page.len() <= 2);
            seen.extend(page);
            match out["NextToken"].as_str() {
                Some(t) => {
                    assert!(t.parse::<usize>().is_err(), "tokens are not offsets: {t}");
                    token = Some(t.to_owned());
                }
                None => break,
            }
        }
        assert_eq!(seen, all);

        let newest_first = listed(&list(&mut w, json!({"SortOrder": "Descending"})).unwrap());
        assert_eq!(newest_first, all.iter().rev().cloned().collect::<Vec<_>>());
        let by_name = listed(&list(&mut w, json!({"SortBy": "NAME"})).unwrap());
        let names: Vec<&str> = by_name.iter().map(|(g, _)| g.as_str()).collect();
        assert_eq!(names, ["a", "a", "a", "b", "b"]);
    }

    #[test]
    fn list_cluster_nodes_filters_by_group_name_and_creation_time() {
        let mut w = World::new(0.0, None);
        let all = two_generations(&mut w);
        let only_a = listed(&list(&mut w, json!({"InstanceGroupNameContains": "a"})).unwrap());
        assert_eq!(only_a, all[2..]);
        // Group b launched at the clock's start, group a 2,000 s later.
        let split = w.clock.epoch(1000.0);
        let newer = listed(&list(&mut w, json!({"CreationTimeAfter": split})).unwrap());
        assert_eq!(newer, all[2..]);
        let older = listed(&list(&mut w, json!({"CreationTimeBefore": split})).unwrap());
        assert_eq!(older, all[..2]);
    }

    #[test]
    fn list_cluster_nodes_refuses_what_aws_refuses() {
        let mut w = World::new(0.0, None);
        two_generations(&mut w);
        for (extra, says) in [
            (json!({"MaxResults": 0}), "greater than or equal to 1"),
            (json!({"MaxResults": 101}), "less than or equal to 100"),
            (json!({"NextToken": "2"}), "Invalid NextToken"),
            (json!({"SortBy": "STATUS"}), "[CREATION_TIME, NAME]"),
            (json!({"SortOrder": "Up"}), "[Ascending, Descending]"),
        ] {
            let e = list(&mut w, extra.clone()).unwrap_err();
            assert_eq!(e.code, "ValidationException", "{extra}");
            assert!(e.message.contains(says), "{extra}: {}", e.message);
        }
        let out = list(&mut w, json!({"MaxResults": 1})).unwrap();
        let mut garbled = out["NextToken"].as_str().unwrap().to_owned();
        garbled.replace_range(0..1, if garbled.starts_with('0') { "1" } else { "0" });
        let e = list(&mut w, json!({"NextToken": garbled})).unwrap_err();
        assert_eq!(e.code, "ValidationException");
    }

    fn subnet(id: &str, zone: &str, zone_id: &str, cidr: &str) -> crate::moto::Subnet {
        crate::moto::Subnet {
            id: id.into(),
            vpc_id: "vpc-1".into(),
            availability_zone: zone.into(),
            availability_zone_id: zone_id.into(),
            cidr_block: cidr.into(),
        }
    }

    fn describe(w: &mut World, id: &str) -> Value {
        describe_node(w, &json!({"ClusterName": "c", "NodeId": id})).unwrap()["NodeDetails"].clone()
    }

    #[test]
    fn nodes_are_placed_in_their_groups_subnet_with_a_stable_address() {
        let mut w = World::new(0.0, None);
        let lookups = Lookups::default()
            .with_subnet(subnet("subnet-b", "us-east-1b", "use1-az1", "10.0.1.0/24"))
            .with_subnet(subnet("subnet-c", "us-east-1c", "use1-az2", "10.0.2.0/24"))
            .with_subnet(subnet("subnet-d", "us-east-1d", "use1-az4", "10.0.3.0/24"));
        let mut own = group("own", 1);
        own["OverrideVpcConfig"] = json!({"Subnets": ["subnet-c"], "SecurityGroupIds": ["sg-1"]});
        let body = json!({
            "ClusterName": "c",
            "VpcConfig": {"Subnets": ["subnet-b", "subnet-d"], "SecurityGroupIds": ["sg-1"]},
            "InstanceGroups": [group("shared", 2), own],
        });
        create_cluster(&mut w, "us-east-1", &body, &lookups).unwrap();
        w.clock.advance(2000.0);
        let out = list(&mut w, json!({})).unwrap();
        let mut seen = BTreeMap::new();
        for n in out["ClusterNodeSummaries"].as_array().unwrap() {
            let id = n["InstanceId"].as_str().unwrap();
            let d = describe(&mut w, id);
            let ip = d["PrivatePrimaryIp"].as_str().unwrap().to_owned();
            let (zone, zone_id, net) = if n["InstanceGroupName"] == "own" {
                ("us-east-1c", "use1-az2", "10.0.2.")
            } else {
                ("us-east-1b", "use1-az1", "10.0.1.")
            };
            assert_eq!(
                d["Placement"],
                json!({"AvailabilityZone": zone, "AvailabilityZoneId": zone_id})
            );
            assert!(ip.starts_with(net), "{ip}");
            let host: u8 = ip[net.len()..].parse().unwrap();
            assert!((4..255).contains(&host), "{ip}");
            let dns = format!("ip-{}.ec2.internal", ip.replace('.', "-"));
            assert_eq!(n["PrivateDnsHostname"], dns);
            assert_eq!(d["PrivateDnsHostname"], dns);
            assert!(n.get("LastSoftwareUpdateTime").is_none());
            seen.insert(id.to_owned(), ip);
        }
        assert_eq!(seen.len(), 3);
        let distinct: std::collections::BTreeSet<&String> = seen.values().collect();
        assert_eq!(distinct.len(), 3, "{seen:?}");
        // The same node keeps its address.
        for (id, ip) in &seen {
            assert_eq!(describe(&mut w, id)["PrivatePrimaryIp"], json!(ip));
        }
    }

    #[test]
    fn without_moto_nodes_are_in_the_regions_first_zone() {
        let mut w = World::new(0.0, None);
        let body = json!({"ClusterName": "c", "InstanceGroups": [group("g", 1)]});
        create_cluster(&mut w, "eu-central-1", &body, &Lookups::default()).unwrap();
        let id = listed(&list(&mut w, json!({})).unwrap())[0].1.clone();
        let d = describe(&mut w, &id);
        assert_eq!(
            d["Placement"],
            json!({"AvailabilityZone": "eu-central-1a", "AvailabilityZoneId": "euc1-az1"})
        );
        let ip = d["PrivatePrimaryIp"].as_str().unwrap();
        assert!(ip.starts_with("10.1."), "{ip}");
        assert_eq!(
            d["PrivateDnsHostname"],
            format!("ip-{}.eu-central-1.compute.internal", ip.replace('.', "-"))
        );
    }

    #[test]
    fn zone_ids_and_cidrs() {
        assert_eq!(zone_id("us-east-1", "us-east-1a"), "use1-az1");
        assert_eq!(zone_id("ap-northeast-1", "ap-northeast-1c"), "apne1-az3");
        assert_eq!(zone_id("us-west-2", "us-west-2b"), "usw2-az2");
        assert_eq!(parse_cidr("10.0.1.7/24"), Some((0x0a00_0100, 24)));
        assert_eq!(parse_cidr("10.0.1.0/33"), None);
        assert_eq!(
            private_ip("i-00000000000000010", Some((0x0a00_0100, 24))),
            "10.0.1.20"
        );
    }

    #[test]
    fn a_finished_software_update_stamps_the_node() {
        let mut w = World::new(0.0, None);
        let mut g = group("g", 1);
        g["ImageReleaseVersion"] = json!(nodes::IMAGE_RELEASES[0]);
        cluster(&mut w, vec![g]);
        nodes::update_software(&mut w, &json!({"ClusterName": "c"})).unwrap();
        let started = w.clock.now();
        w.clock.advance(nodes::SOFTWARE_UPDATE_SECS + 1.0);
        let out = list(&mut w, json!({})).unwrap();
        let stamp = w.clock.epoch(started + nodes::SOFTWARE_UPDATE_SECS);
        assert_eq!(
            out["ClusterNodeSummaries"][0]["LastSoftwareUpdateTime"],
            json!(stamp)
        );
        let id = listed(&out)[0].1.clone();
        assert_eq!(
            describe(&mut w, &id)["LastSoftwareUpdateTime"],
            json!(stamp)
        );
    }

    fn kubernetes_of(w: &mut World) -> Value {
        let c = w.hyperpod("c").unwrap().clone();
        w.cluster_json(&c)["InstanceGroups"][0]["KubernetesConfig"].clone()
    }

    #[test]
    fn a_groups_kubernetes_config_is_reported_current_and_desired() {
        let mut w = World::new(0.0, None);
        let gpu = json!({"Key": "gpu", "Value": "true", "Effect": "NoSchedule"});
        let mut g = group("g", 1);
        g["KubernetesConfig"] = json!({"Labels": {"team": "a"}, "Taints": [gpu]});
        cluster(&mut w, vec![g.clone()]);
        assert_eq!(
            kubernetes_of(&mut w),
            json!({"CurrentLabels": {"team": "a"}, "DesiredLabels": {"team": "a"},
                   "CurrentTaints": [gpu], "DesiredTaints": [gpu]})
        );

        g["KubernetesConfig"] = json!({"Labels": {"team": "b"}});
        let body = json!({"ClusterName": "c", "InstanceGroups": [g]});
        update_cluster(&mut w, &body, &Lookups::default()).unwrap();
        let during = json!({"CurrentLabels": {"team": "a"}, "DesiredLabels": {"team": "b"},
                            "CurrentTaints": [gpu]});
        assert_eq!(kubernetes_of(&mut w), during);
        let id = listed(&list(&mut w, json!({})).unwrap())[0].1.clone();
        assert_eq!(describe(&mut w, &id)["KubernetesConfig"], during);
        w.clock.advance(CLUSTER_UPDATE_SECS);
        assert_eq!(
            kubernetes_of(&mut w),
            json!({"CurrentLabels": {"team": "b"}, "DesiredLabels": {"team": "b"}})
        );
    }

    #[test]
    fn kubernetes_taints_need_a_key_and_a_known_effect() {
        let mut w = World::new(0.0, None);
        for (taint, says) in [
            (
                json!({"Key": "gpu", "Effect": "Sometimes"}),
                "Value 'Sometimes' at 'instanceGroups.1.member.kubernetesConfig.taints.1.member.effect'",
            ),
            (json!({"Effect": "NoSchedule"}), "key is required"),
        ] {
            let mut g = group("g", 1);
            g["KubernetesConfig"] = json!({"Taints": [taint]});
            let body = json!({"ClusterName": "c", "InstanceGroups": [g]});
            let e = create_cluster(&mut w, "us-east-1", &body, &Lookups::default()).unwrap_err();
            assert_eq!(e.code, "ValidationException");
            assert!(e.message.contains(says), "{}", e.message);
        }
    }

    #[test]
    fn min_instance_count_is_checked_against_the_count_and_reported_as_min_count() {
        let mut w = World::new(0.0, None);
        for (count, min, says) in [
            (
                json!(2),
                json!(3),
                "MinInstanceCount (3) of instance group g must be less than or equal to its InstanceCount (2)",
            ),
            (
                json!(2),
                json!(-1),
                "Value '-1' at 'instanceGroups.1.member.minInstanceCount' failed to satisfy constraint: Member must have value greater than or equal to 0",
            ),
            (
                json!(-1),
                json!(0),
                "Value '-1' at 'instanceGroups.1.member.instanceCount' failed to satisfy constraint: Member must have value greater than or equal to 0",
            ),
            (
                json!(6759),
                json!(0),
                "Member must have value less than or equal to 6758",
            ),
        ] {
            let mut g = group("g", 0);
            g["InstanceCount"] = count;
            g["MinInstanceCount"] = min;
            let body = json!({"ClusterName": "c", "InstanceGroups": [g]});
            let e = create_cluster(&mut w, "us-east-1", &body, &Lookups::default()).unwrap_err();
            assert_eq!(e.code, "ValidationException");
            assert!(e.message.contains(says), "{}", e.message);
        }
        let mut g = group("g", 2);
        g["MinInstanceCount"] = json!(1);
        cluster(&mut w, vec![g.clone()]);
        let c = w.hyperpod("c").unwrap().clone();
        let details = &w.cluster_json(&c)["InstanceGroups"][0];
        assert_eq!(details["MinCount"], 1);
        assert!(details.get("MinInstanceCount").is_none());
        // UpdateCluster checks it too.
        g["MinInstanceCount"] = json!(5);
        let e = update(&mut w, vec![g]).unwrap_err();
        assert!(e.message.contains("MinInstanceCount (5)"), "{}", e.message);
    }

    const ROLE: &str = "arn:aws:iam::123456789012:role/hyperpod-autoscaling";

    /// A CreateCluster body for cluster `c` on an EKS orchestrator with one group of
    /// `count`, continuous provisioning and `extra` fields.
    fn on_eks(count: u32, extra: Value) -> Value {
        let mut body = json!({"ClusterName": "c", "InstanceGroups": [group("g", count)],
                              "Orchestrator": {"Eks": {}}, "NodeProvisioningMode": "Continuous"});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        body
    }

    fn described(w: &mut World) -> Value {
        let c = w.hyperpod("c").unwrap().clone();
        w.cluster_json(&c)
    }

    fn settings(w: &mut World, extra: Value) -> Result<Value, AwsError> {
        let mut body = json!({"ClusterName": "c"});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        update_cluster(w, &body, &Lookups::default())
    }

    #[test]
    fn autoscaling_needs_its_prerequisites_and_holds_its_role() {
        let mut w = World::new(0.0, None);
        let enable = json!({"Mode": "Enable", "AutoScalerType": "Karpenter"});
        for (body, says) in [
            (
                on_eks(0, json!({"AutoScaling": enable})),
                "requires a ClusterRole",
            ),
            (
                json!({"ClusterName": "c", "InstanceGroups": [group("g", 0)],
                       "AutoScaling": enable, "ClusterRole": ROLE}),
                "requires an EKS orchestrator",
            ),
            (
                json!({"ClusterName": "c", "InstanceGroups": [group("g", 0)],
                       "Orchestrator": {"Eks": {}}, "AutoScaling": enable, "ClusterRole": ROLE}),
                "requires NodeProvisioningMode Continuous",
            ),
            (
                on_eks(
                    0,
                    json!({"AutoScaling": enable, "ClusterRole": ROLE, "NodeRecovery": "None"}),
                ),
                "requires NodeRecovery Automatic",
            ),
            (
                on_eks(
                    0,
                    json!({"AutoScaling": {"Mode": "On"}, "ClusterRole": ROLE}),
                ),
                "Value 'On' at 'autoScaling.mode' failed to satisfy constraint: Member must satisfy enum value set: [Enable, Disable]",
            ),
            (
                on_eks(
                    0,
                    json!({"AutoScaling": {"AutoScalerType": "Karpenter"}, "ClusterRole": ROLE}),
                ),
                "Value null at 'autoScaling.mode'",
            ),
            (
                on_eks(
                    0,
                    json!({"AutoScaling": enable, "ClusterRole": "hyperpod-autoscaling"}),
                ),
                "at 'clusterRole' failed to satisfy constraint: Member must satisfy regular expression pattern",
            ),
        ] {
            let e = create_cluster(&mut w, "us-east-1", &body, &Lookups::default()).unwrap_err();
            assert_eq!(e.code, "ValidationException", "{body}");
            assert!(e.message.contains(says), "{body}: {}", e.message);
        }
        assert!(w.sagemaker.clusters.is_empty());

        let body = on_eks(0, json!({"AutoScaling": enable, "ClusterRole": ROLE}));
        create_cluster(&mut w, "us-east-1", &body, &Lookups::default()).unwrap();
        let d = described(&mut w);
        assert_eq!(d["ClusterRole"], ROLE);
        assert_eq!(
            d["AutoScaling"],
            json!({"Mode": "Enable", "AutoScalerType": "Karpenter", "Status": "Creating"})
        );
        // The install waits for the cluster.
        w.clock.advance(AUTOSCALING_SECS);
        assert_eq!(described(&mut w)["AutoScaling"]["Status"], "Creating");
        w.clock.advance(CLUSTER_CREATE_SECS);
        assert_eq!(described(&mut w)["AutoScaling"]["Status"], "InService");

        let other = "arn:aws:iam::123456789012:role/other";
        let e = settings(&mut w, json!({"ClusterRole": other})).unwrap_err();
        assert_eq!(e.code, "ValidationException");
        assert!(
            e.message
                .contains("cannot be updated while autoscaling is enabled"),
            "{}",
            e.message
        );
        // Naming the role it has is no change.
        settings(&mut w, json!({"ClusterRole": ROLE})).unwrap();
        w.clock.advance(CLUSTER_UPDATE_SECS);
        let e = settings(&mut w, json!({"NodeRecovery": "None"})).unwrap_err();
        assert!(
            e.message.contains("requires NodeRecovery Automatic"),
            "{}",
            e.message
        );

        settings(&mut w, json!({"AutoScaling": {"Mode": "Disable"}})).unwrap();
        assert_eq!(
            described(&mut w)["AutoScaling"],
            json!({"Mode": "Disable", "AutoScalerType": "Karpenter", "Status": "Deleting"})
        );
        w.clock.advance(CLUSTER_UPDATE_SECS);
        let d = described(&mut w);
        assert!(d["AutoScaling"].is_null(), "{d}");
        assert_eq!(d["ClusterRole"], ROLE, "the role stays");
        settings(&mut w, json!({"ClusterRole": other})).unwrap();
        assert_eq!(described(&mut w)["ClusterRole"], other);
    }

    #[test]
    fn a_failing_install_ends_failed_with_its_message() {
        let mut w = World::new(0.0, None);
        w.add_fault(crate::world::Fault {
            id: 0,
            service: "sagemaker".into(),
            operation: "UpdateCluster".into(),
            kind: crate::world::FaultKind::Fails {
                code: "InternalFailure".into(),
                message: "Karpenter could not be installed".into(),
            },
            times: 1,
            after: 0,
        });
        create_cluster(
            &mut w,
            "us-east-1",
            &on_eks(0, json!({"ClusterRole": ROLE})),
            &Lookups::default(),
        )
        .unwrap();
        w.clock.advance(CLUSTER_CREATE_SECS);
        settings(&mut w, json!({"AutoScaling": {"Mode": "Enable"}})).unwrap();
        w.clock.advance(AUTOSCALING_SECS);
        assert_eq!(
            described(&mut w)["AutoScaling"],
            json!({"Mode": "Enable", "AutoScalerType": "Karpenter", "Status": "Failed",
                   "FailureMessage": "Karpenter could not be installed"})
        );
    }

    #[test]
    fn tiered_storage_is_checked_kept_and_applied_once_the_update_is_over() {
        let mut w = World::new(0.0, None);
        for (config, says) in [
            (
                json!({"Mode": "Enable", "InstanceMemoryAllocationPercentage": 101}),
                "Value '101' at 'tieredStorageConfig.instanceMemoryAllocationPercentage' failed to satisfy constraint: Member must have value less than or equal to 100",
            ),
            (
                json!({"Mode": "Enable", "InstanceMemoryAllocationPercentage": -1}),
                "greater than or equal to 0",
            ),
            (
                json!({"InstanceMemoryAllocationPercentage": 20}),
                "Value null at 'tieredStorageConfig.mode'",
            ),
        ] {
            let body = on_eks(1, json!({"TieredStorageConfig": config}));
            let e = create_cluster(&mut w, "us-east-1", &body, &Lookups::default()).unwrap_err();
            assert_eq!(e.code, "ValidationException");
            assert!(e.message.contains(says), "{}", e.message);
        }
        let body = json!({"ClusterName": "c", "InstanceGroups": [group("g", 1)],
                          "TieredStorageConfig": {"Mode": "Enable"}});
        let e = create_cluster(&mut w, "us-east-1", &body, &Lookups::default()).unwrap_err();
        assert!(e.message.contains("EKS orchestrator"), "{}", e.message);

        create_cluster(
            &mut w,
            "us-east-1",
            &on_eks(2, json!({})),
            &Lookups::default(),
        )
        .unwrap();
        w.clock.advance(CLUSTER_CREATE_SECS);
        let before = described(&mut w);
        assert!(before["TieredStorageConfig"].is_null());
        let enable = json!({"Mode": "Enable", "InstanceMemoryAllocationPercentage": 40});
        settings(&mut w, json!({"TieredStorageConfig": enable})).unwrap();
        let d = described(&mut w);
        assert_eq!(d["ClusterStatus"], "Updating");
        assert_eq!(d["TieredStorageConfig"], enable);
        let groups = |d: &Value| {
            let g = &d["InstanceGroups"];
            (
                g.as_array().unwrap().len(),
                g[0]["InstanceGroupName"].clone(),
                g[0]["TargetCount"].clone(),
            )
        };
        assert_eq!(groups(&d), groups(&before), "the groups stay");
        assert_eq!(d["NodeRecovery"], before["NodeRecovery"]);
        let daemon = |w: &mut World| {
            let now = w.clock.now();
            w.hyperpod("c").unwrap().applied_tiered(now).cloned()
        };
        assert!(daemon(&mut w).is_none(), "not before the update is over");
        w.clock.advance(CLUSTER_UPDATE_SECS);
        assert_eq!(daemon(&mut w), Some(enable.clone()));

        settings(&mut w, json!({"TieredStorageConfig": {"Mode": "Disable"}})).unwrap();
        assert_eq!(daemon(&mut w), Some(enable), "until the update is over");
        w.clock.advance(CLUSTER_UPDATE_SECS);
        assert_eq!(daemon(&mut w), Some(json!({"Mode": "Disable"})));
        assert_eq!(
            described(&mut w)["TieredStorageConfig"],
            json!({"Mode": "Disable"})
        );
    }

    #[test]
    fn autoscaling_adds_and_deletes_nodes_as_the_batch_calls_do() {
        let mut w = World::new(0.0, None);
        create_cluster(
            &mut w,
            "us-east-1",
            &on_eks(0, json!({})),
            &Lookups::default(),
        )
        .unwrap();
        let e = w.autoscale_up("c", "g", 1).unwrap_err();
        assert!(e.message.contains("Creating"), "{}", e.message);
        w.clock.advance(CLUSTER_CREATE_SECS);
        w.autoscale_up("c", "g", 2).unwrap();
        let d = described(&mut w);
        assert_eq!(d["ClusterStatus"], "InService", "no update of the cluster");
        assert_eq!(d["InstanceGroups"][0]["TargetCount"], 2);
        let nodes = listed(&list(&mut w, json!({})).unwrap());
        assert_eq!(nodes.len(), 2);
        w.sagemaker.quotas.insert("ml.g5.8xlarge".into(), 2);
        let e = w.autoscale_up("c", "g", 1).unwrap_err();
        assert_eq!(e.code, "ResourceLimitExceeded");
        w.autoscale_down("c", &[nodes[0].1.clone()]).unwrap();
        assert_eq!(described(&mut w)["InstanceGroups"][0]["TargetCount"], 1);
        assert_eq!(listed(&list(&mut w, json!({})).unwrap()), nodes[1..]);
    }

    #[test]
    fn scaling_down_removes_nodes_not_running_first_then_the_newest() {
        let mut w = World::new(0.0, None);
        cluster(&mut w, vec![group("g", 3)]);
        let first = listed(&list(&mut w, json!({})).unwrap());
        update(&mut w, vec![group("g", 5)]).unwrap();
        let all = listed(&list(&mut w, json!({})).unwrap());
        assert_eq!(all[..3], first);
        // The oldest node reboots (Pending) and is the first to go; then the two newest.
        nodes::batch_reboot(
            &mut w,
            &json!({"ClusterName": "c", "NodeIds": [first[0].1]}),
        )
        .unwrap();
        let body = json!({"ClusterName": "c", "InstanceGroups": [group("g", 2)]});
        update_cluster(&mut w, &body, &Lookups::default()).unwrap();
        let kept = listed(&list(&mut w, json!({})).unwrap());
        assert_eq!(kept, first[1..]);
        assert_eq!(w.hyperpod("c").unwrap().groups[0].target, 2);

        // Newest is by launch, not by slot: a replaced node is a new instance.
        w.clock.advance(2000.0);
        nodes::batch_replace(&mut w, &json!({"ClusterName": "c", "NodeIds": [kept[0].1]})).unwrap();
        w.clock.advance(2000.0);
        let replaced = listed(&list(&mut w, json!({})).unwrap());
        assert_eq!(replaced.len(), 2);
        assert!(!replaced.contains(&kept[0]), "{replaced:?}");
        update(&mut w, vec![group("g", 1)]).unwrap();
        assert_eq!(listed(&list(&mut w, json!({})).unwrap()), kept[1..]);
    }
}
