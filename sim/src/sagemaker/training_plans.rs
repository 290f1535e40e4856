//! SageMaker training plans: reserved capacity bought from an offerings table a test
//! sets (`PUT /_sim/sagemaker/training-plan-offerings`). A plan is Pending while it is
//! paid for, Scheduled until its start, Active until its end, then Expired — all read
//! off the clock — and HyperPod instance groups that name it are held to its instance
//! type, zone and remaining capacity.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::lookups::Lookups;
use super::{Order, check_name, page, str_field, validation};
use crate::clock::reached;
use crate::world::{ACCOUNT, Aws, AwsError};

/// Simulated seconds a new plan stays Pending (payment and capacity allocation).
pub const PLAN_PENDING_SECS: f64 = 120.0;

/// One row of the offerings table as a test writes it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct OfferingSpec {
    pub id: String,
    pub instance_type: String,
    pub instance_count: u32,
    pub availability_zone: String,
    pub duration_hours: u64,
    pub upfront_fee: String,
    #[serde(default = "usd")]
    pub currency_code: String,
    /// Hours from the moment the table is set until the reservation starts.
    #[serde(default)]
    pub starts_in_hours: f64,
    #[serde(default = "hyperpod_only")]
    pub target_resources: Vec<String>,
}

fn usd() -> String {
    "USD".to_owned()
}

fn hyperpod_only() -> Vec<String> {
    vec!["hyperpod-cluster".to_owned()]
}

/// An offering with its start fixed on the sim's clock.
#[derive(Clone, Debug)]
pub struct Offering {
    spec: OfferingSpec,
    start: f64,
}

impl Offering {
    pub fn new(spec: OfferingSpec, now: f64) -> Self {
        let start = now + spec.starts_in_hours * 3600.0;
        Self { spec, start }
    }

    fn end(&self) -> f64 {
        self.start + self.spec.duration_hours as f64 * 3600.0
    }
}

/// The default offerings: p5 and g6e capacity in us-east-1a, starting at once.
pub fn default_offerings() -> Vec<Offering> {
    let row = |id: &str, instance_type: &str, count: u32, fee: &str| OfferingSpec {
        id: id.to_owned(),
        instance_type: instance_type.to_owned(),
        instance_count: count,
        availability_zone: "us-east-1a".to_owned(),
        duration_hours: 24 * 7,
        upfront_fee: fee.to_owned(),
        currency_code: usd(),
        starts_in_hours: 0.0,
        target_resources: hyperpod_only(),
    };
    [
        row("tpo-p5-2-use1a", "ml.p5.48xlarge", 2, "16512.00"),
        row("tpo-p5-4-use1a", "ml.p5.48xlarge", 4, "33024.00"),
        row("tpo-g6e-2-use1a", "ml.g6e.48xlarge", 2, "4200.00"),
    ]
    .into_iter()
    .map(|spec| Offering::new(spec, 0.0))
    .collect()
}

#[derive(Clone, Debug)]
pub struct Plan {
    name: String,
    region: String,
    offering: Offering,
    created: f64,
}

impl Plan {
    pub fn arn(&self) -> String {
        format!(
            "arn:aws:sagemaker:{}:{ACCOUNT}:training-plan/{}",
            self.region, self.name
        )
    }

    pub fn status(&self, now: f64, stuck: bool) -> &'static str {
        if stuck || !reached(now, self.created + PLAN_PENDING_SECS) {
            "Pending"
        } else if !reached(now, self.offering.start) {
            "Scheduled"
        } else if !reached(now, self.offering.end()) {
            "Active"
        } else {
            "Expired"
        }
    }

    /// When instances under this plan can start: not before the reservation does.
    pub fn start(&self) -> f64 {
        self.offering.start
    }
}

#[derive(Default)]
pub struct TrainingPlans {
    pub offerings: Vec<Offering>,
    plans: BTreeMap<String, Plan>,
}

impl TrainingPlans {
    pub fn new() -> Self {
        Self {
            offerings: default_offerings(),
            plans: BTreeMap::new(),
        }
    }

    /// By name or ARN.
    pub fn get(&self, name_or_arn: &str) -> Option<&Plan> {
        let name = name_or_arn.rsplit('/').next().unwrap_or(name_or_arn);
        self.plans.get(name)
    }
}

fn epoch_arg(body: &Value, key: &str) -> Option<f64> {
    body.get(key).and_then(Value::as_f64)
}

/// Instances of a plan held by instance groups, except those of `except` cluster.
pub fn in_use(w: &Aws, arn: &str, except: Option<&str>) -> u32 {
    w.live_hyperpods()
        .filter(|c| Some(c.name.as_str()) != except)
        .flat_map(|c| c.groups.iter())
        .filter(|g| str_field(&g.spec, "TrainingPlanArn") == Some(arn))
        .map(|g| g.target)
        .sum()
}

fn offering_json(w: &Aws, o: &Offering, body: &Value) -> Value {
    let hours = o.spec.duration_hours;
    json!({
        "TrainingPlanOfferingId": o.spec.id,
        "TargetResources": o.spec.target_resources,
        "RequestedStartTimeAfter": body.get("StartTimeAfter"),
        "RequestedEndTimeBefore": body.get("EndTimeBefore"),
        "DurationHours": hours,
        "DurationMinutes": 0,
        "UpfrontFee": o.spec.upfront_fee,
        "CurrencyCode": o.spec.currency_code,
        "ReservedCapacityOfferings": [{
            "ReservedCapacityType": "Instance",
            "InstanceType": o.spec.instance_type,
            "InstanceCount": o.spec.instance_count,
            "AvailabilityZone": o.spec.availability_zone,
            "DurationHours": hours,
            "DurationMinutes": 0,
            "StartTime": w.clock.epoch(o.start),
            "EndTime": w.clock.epoch(o.end()),
        }],
    })
}

pub fn search(w: &mut Aws, body: &Value) -> Result<Value, AwsError> {
    let targets: Vec<&str> = body
        .get("TargetResources")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    if targets.is_empty() {
        return Err(validation(
            "1 validation error detected: Value null at 'targetResources' failed to satisfy constraint: Member must not be null",
        ));
    }
    let instance_type = str_field(body, "InstanceType");
    let count = body.get("InstanceCount").and_then(Value::as_u64);
    let duration = body.get("DurationHours").and_then(Value::as_u64);
    let after = epoch_arg(body, "StartTimeAfter");
    let before = epoch_arg(body, "EndTimeBefore");
    let used: Vec<&str> = w
        .sagemaker
        .training_plans
        .plans
        .values()
        .map(|p| p.offering.spec.id.as_str())
        .collect();
    let found: Vec<Value> = w
        .sagemaker
        .training_plans
        .offerings
        .iter()
        .filter(|o| !used.contains(&o.spec.id.as_str()))
        .filter(|o| {
            targets
                .iter()
                .all(|t| o.spec.target_resources.iter().any(|x| x == t))
        })
        .filter(|o| instance_type.is_none_or(|t| t == o.spec.instance_type))
        .filter(|o| count.is_none_or(|n| n == u64::from(o.spec.instance_count)))
        .filter(|o| duration.is_none_or(|d| o.spec.duration_hours >= d))
        .filter(|o| after.is_none_or(|a| w.clock.epoch(o.start) >= a))
        .filter(|o| before.is_none_or(|b| w.clock.epoch(o.end()) <= b))
        .map(|o| offering_json(w, o, body))
        .collect();
    Ok(json!({ "TrainingPlanOfferings": found }))
}

pub fn create(w: &mut Aws, region: &str, body: &Value) -> Result<Value, AwsError> {
    let name = str_field(body, "TrainingPlanName").unwrap_or_default();
    check_name(name, "trainingPlanName")?;
    let id = str_field(body, "TrainingPlanOfferingId").unwrap_or_default();
    let tp = &w.sagemaker.training_plans;
    if tp.plans.contains_key(name) {
        return Err(AwsError::new(
            400,
            "ResourceInUse",
            format!("Training plan {name} already exists"),
        ));
    }
    let offering = tp
        .offerings
        .iter()
        .find(|o| o.spec.id == id)
        .cloned()
        .ok_or_else(|| {
            AwsError::new(
                400,
                "ResourceNotFound",
                format!("Training plan offering {id} not found"),
            )
        })?;
    if tp.plans.values().any(|p| p.offering.spec.id == id) {
        return Err(AwsError::new(
            400,
            "ResourceLimitExceeded",
            format!("Training plan offering {id} has already been purchased"),
        ));
    }
    let plan = Plan {
        name: name.to_owned(),
        region: region.to_owned(),
        offering,
        created: w.clock.now(),
    };
    let arn = plan.arn();
    w.sagemaker
        .training_plans
        .plans
        .insert(name.to_owned(), plan);
    Ok(json!({ "TrainingPlanArn": arn }))
}

fn plan_json(w: &Aws, p: &Plan, full: bool) -> Value {
    let now = w.clock.now();
    let status = p.status(now, w.stuck("sagemaker", "CreateTrainingPlan"));
    let o = &p.offering;
    let total = o.spec.instance_count;
    let used = in_use(w, &p.arn(), None);
    let mut v = json!({
        "TrainingPlanArn": p.arn(),
        "TrainingPlanName": p.name,
        "Status": status,
        "StatusMessage": match status {
            "Pending" => "Payment and capacity allocation in progress",
            "Scheduled" => "Reserved capacity starts at the plan's start time",
            "Expired" => "The plan's reservation has ended",
            _ => "",
        },
        "DurationHours": o.spec.duration_hours,
        "DurationMinutes": 0,
        "StartTime": w.clock.epoch(o.start),
        "EndTime": w.clock.epoch(o.end()),
        "UpfrontFee": o.spec.upfront_fee,
        "CurrencyCode": o.spec.currency_code,
        "TotalInstanceCount": total,
        "AvailableInstanceCount": total.saturating_sub(used),
        "InUseInstanceCount": used,
        "TargetResources": o.spec.target_resources,
        "ReservedCapacitySummaries": [{
            "ReservedCapacityArn": format!(
                "arn:aws:sagemaker:{}:{ACCOUNT}:reserved-capacity/{}-{}",
                p.region, p.name, o.spec.availability_zone
            ),
            "ReservedCapacityType": "Instance",
            "InstanceType": o.spec.instance_type,
            "TotalInstanceCount": total,
            "Status": status,
            "AvailabilityZone": o.spec.availability_zone,
            "DurationHours": o.spec.duration_hours,
            "DurationMinutes": 0,
            "StartTime": w.clock.epoch(o.start),
            "EndTime": w.clock.epoch(o.end()),
        }],
    });
    if full && let Some(m) = v.as_object_mut() {
        m.insert("UnhealthyInstanceCount".into(), json!(0));
        m.insert("AvailableSpareInstanceCount".into(), json!(0));
    }
    v
}

pub fn describe(w: &mut Aws, body: &Value) -> Result<Value, AwsError> {
    let name = str_field(body, "TrainingPlanName").unwrap_or_default();
    let plan = w
        .sagemaker
        .training_plans
        .get(name)
        .cloned()
        .ok_or_else(|| {
            AwsError::new(
                400,
                "ResourceNotFound",
                format!("Training plan {name} not found"),
            )
        })?;
    Ok(plan_json(w, &plan, true))
}

pub fn list(w: &mut Aws, region: &str, body: &Value) -> Result<Value, AwsError> {
    let now = w.clock.now();
    let stuck = w.stuck("sagemaker", "CreateTrainingPlan");
    let mut statuses = Vec::new();
    for f in body
        .get("Filters")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        match (str_field(f, "Name"), str_field(f, "Value")) {
            (Some("Status"), Some(v)) => statuses.push(v.to_owned()),
            (name, _) => {
                return Err(validation(format!(
                    "Invalid filter name {}; the only filter is Status",
                    name.unwrap_or("null")
                )));
            }
        }
    }
    let after = epoch_arg(body, "StartTimeAfter");
    let before = epoch_arg(body, "StartTimeBefore");
    let mut plans: Vec<&Plan> = w
        .sagemaker
        .training_plans
        .plans
        .values()
        .filter(|p| p.region == region)
        .filter(|p| statuses.is_empty() || statuses.iter().any(|s| s == p.status(now, stuck)))
        .filter(|p| after.is_none_or(|a| w.clock.epoch(p.offering.start) >= a))
        .filter(|p| before.is_none_or(|b| w.clock.epoch(p.offering.start) <= b))
        .collect();
    match str_field(body, "SortBy").unwrap_or("StartTime") {
        "TrainingPlanName" => plans.sort_by(|a, b| a.name.cmp(&b.name)),
        "Status" => plans.sort_by_key(|p| p.status(now, stuck)),
        _ => plans.sort_by(|a, b| a.offering.start.total_cmp(&b.offering.start)),
    }
    let (plans, next) = page(body, plans, Order::Descending)?;
    let summaries: Vec<Value> = plans.iter().map(|p| plan_json(w, p, false)).collect();
    Ok(json!({ "TrainingPlanSummaries": summaries, "NextToken": next }))
}

/// Checks an instance group that names a training plan, as CreateCluster and
/// UpdateCluster do: the plan exists, can run instances, is for this instance type,
/// has room for the group, and the group's subnets are in the plan's zone.
pub fn check_group(
    w: &Aws,
    group: &Value,
    subnets: &[String],
    lookups: &Lookups,
    cluster: &str,
) -> Result<Option<f64>, AwsError> {
    let Some(arn) = str_field(group, "TrainingPlanArn") else {
        return Ok(None);
    };
    let group_name = str_field(group, "InstanceGroupName").unwrap_or_default();
    let plan = w
        .sagemaker
        .training_plans
        .get(arn)
        .filter(|p| p.arn() == arn)
        .ok_or_else(|| validation(format!("Training plan {arn} does not exist")))?;
    let status = plan.status(w.clock.now(), w.stuck("sagemaker", "CreateTrainingPlan"));
    if !matches!(status, "Active" | "Scheduled") {
        return Err(validation(format!(
            "Training plan {arn} is {status}; an instance group can use a training plan only when it is Active or Scheduled"
        )));
    }
    if !plan
        .offering
        .spec
        .target_resources
        .iter()
        .any(|t| t == "hyperpod-cluster")
    {
        return Err(validation(format!(
            "Training plan {arn} does not target hyperpod-cluster"
        )));
    }
    let instance_type = str_field(group, "InstanceType").unwrap_or_default();
    if instance_type != plan.offering.spec.instance_type {
        return Err(validation(format!(
            "Instance type {instance_type} of instance group {group_name} does not match the instance type {} of training plan {arn}",
            plan.offering.spec.instance_type
        )));
    }
    let wanted = group
        .get("InstanceCount")
        .and_then(Value::as_u64)
        .unwrap_or(0);
    let total = u64::from(plan.offering.spec.instance_count);
    let used = u64::from(in_use(w, arn, Some(cluster)));
    if used + wanted > total {
        return Err(validation(format!(
            "Instance group {group_name} requests {wanted} instances but training plan {arn} has {} of {total} available",
            total.saturating_sub(used)
        )));
    }
    let zone = &plan.offering.spec.availability_zone;
    for id in subnets {
        if let Some(z) = lookups.subnet_zone(id)?
            && z != zone
        {
            return Err(validation(format!(
                "Subnet {id} of instance group {group_name} is in {z}, but training plan {arn} reserves capacity in {zone}; use subnets in {zone}"
            )));
        }
    }
    Ok(Some(plan.start()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(created: f64, starts_in_hours: f64) -> Plan {
        let mut o = default_offerings().remove(0);
        o.spec.starts_in_hours = starts_in_hours;
        Plan {
            name: "p".into(),
            region: "us-east-1".into(),
            offering: Offering::new(o.spec, created),
            created,
        }
    }

    #[test]
    fn plan_walks_pending_scheduled_active_expired() {
        let p = plan(0.0, 1.0);
        assert_eq!(p.status(10.0, false), "Pending");
        assert_eq!(p.status(PLAN_PENDING_SECS, false), "Scheduled");
        assert_eq!(p.status(3600.0, false), "Active");
        assert_eq!(p.status(3600.0, true), "Pending");
        assert_eq!(p.status(3600.0 + 7.0 * 24.0 * 3600.0, false), "Expired");
        assert_eq!(plan(0.0, 0.0).status(PLAN_PENDING_SECS, false), "Active");
    }
}
