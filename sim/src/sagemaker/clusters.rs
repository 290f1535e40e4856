//! HyperPod clusters: CreateCluster, UpdateCluster, DeleteCluster, DescribeCluster,
//! ListClusters and ListTags. A cluster's status is read off the clock whenever it is
//! read, and every check of a request runs before anything is changed, so a refused call
//! leaves the cluster as it was.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::groups::{is_spot, kubernetes_details, parse_group};
use super::instances::node_status;
use super::lookups::{self, Lookups};
use super::settings::{apply_settings, take_settings};
use super::{
    CLUSTER_CREATE_SECS, CLUSTER_DELETE_SECS, CLUSTER_UPDATE_SECS, Cluster, Group, Placement,
    check_name, str_field, training_plans, validation,
};
use crate::clock::reached;
use crate::world::{ACCOUNT, Aws, AwsError, Phase};

impl Cluster {
    pub(super) fn arn(&self) -> String {
        format!(
            "arn:aws:sagemaker:{}:{ACCOUNT}:cluster/{}",
            self.region,
            self.name.to_lowercase()
        )
    }

    pub(super) fn status(&self, now: f64, stuck: bool) -> &'static str {
        if self.system_update && !matches!(&self.phase, Some((Phase::Deleting, _))) {
            return "SystemUpdating";
        }
        match &self.phase {
            Some((Phase::Creating, since))
                if stuck || !reached(now, since + CLUSTER_CREATE_SECS) =>
            {
                "Creating"
            }
            Some((Phase::Updating, since))
                if stuck || !reached(now, since + CLUSTER_UPDATE_SECS) =>
            {
                "Updating"
            }
            Some((Phase::Deleting, _)) => "Deleting",
            _ => "InService",
        }
    }

    /// Autoscaling's status, if there is one to report; `stuck` says whether a `stuck`
    /// fault stands for an operation.
    pub(super) fn autoscaling_status(
        &self,
        now: f64,
        stuck: impl Fn(&str) -> bool,
    ) -> Option<&'static str> {
        let a = self.auto_scaling.as_ref()?;
        let creating = self.status(now, stuck("CreateCluster")) == "Creating";
        a.status(now, creating, stuck(a.by))
    }

    /// The tiered storage the nodes run: the requested one once the create or update
    /// that asked for it is over.
    /// Whether its deletion is over.
    pub(super) fn gone(&self, now: f64, stuck_delete: bool) -> bool {
        matches!(&self.phase, Some((Phase::Deleting, since)) if !stuck_delete && reached(now, since + CLUSTER_DELETE_SECS))
    }

    pub(super) fn applied_tiered(&self, now: f64) -> Option<&Value> {
        match self.status(now, false) {
            "Creating" | "Updating" => self.tiered_before.as_ref(),
            _ => self.tiered.as_ref(),
        }
    }
}

impl Aws {
    /// Applies the finished transitions of HyperPod cluster `name`: a finished deletion
    /// takes it away, finished node actions are folded into its nodes. Only the cluster
    /// read or changed is settled, so a call costs the same however many there are.
    pub(super) fn settle_hyperpod(&mut self, name: &str) {
        let now = self.clock.now();
        let stuck_delete = self.stuck("sagemaker", "DeleteCluster");
        let Some(c) = self.sagemaker.clusters.get(name) else {
            return;
        };
        if c.gone(now, stuck_delete) {
            self.sagemaker.clusters.remove(name);
        } else {
            self.settle_nodes(name);
        }
    }

    /// Every cluster settled, for the calls that look at them all.
    pub(super) fn settle_sagemaker(&mut self) {
        let names: Vec<String> = self.sagemaker.clusters.keys().cloned().collect();
        for name in names {
            self.settle_hyperpod(&name);
        }
    }

    /// The clusters whose deletion is not over, settled or not: what they hold is
    /// counted without settling every cluster.
    pub(super) fn live_hyperpods(&self) -> impl Iterator<Item = &Cluster> {
        let now = self.clock.now();
        let stuck_delete = self.stuck("sagemaker", "DeleteCluster");
        self.sagemaker
            .clusters
            .values()
            .filter(move |c| !c.gone(now, stuck_delete))
    }

    pub(super) fn hyperpod(&mut self, name: &str) -> Result<&mut Cluster, AwsError> {
        // HyperPod accepts the name or the ARN.
        let key = name.rsplit('/').next().unwrap_or(name).to_owned();
        let matches = |c: &Cluster| c.name == key || c.name.eq_ignore_ascii_case(&key);
        let candidates: Vec<String> = self
            .sagemaker
            .clusters
            .values()
            .filter(|c| matches(c))
            .map(|c| c.name.clone())
            .collect();
        for candidate in &candidates {
            self.settle_hyperpod(candidate);
        }
        self.sagemaker
            .clusters
            .values_mut()
            .find(|c| matches(c))
            .ok_or_else(|| {
                AwsError::new(400, "ResourceNotFound", format!("Cluster {name} not found"))
            })
    }

    pub(super) fn cluster_json(&self, c: &Cluster) -> Value {
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

/// Cluster-level rules for one group of a create or update request: its override VPC
/// exists, Spot only on EKS with continuous provisioning, its training plan fits. The
/// answer is when its instances may start (a Scheduled plan's start), if later.
pub(super) fn check_group_in_cluster(
    w: &Aws,
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
pub(super) fn in_use(w: &Aws, instance_type: &str, except: Option<&str>) -> u32 {
    w.live_hyperpods()
        .filter(|c| Some(c.name.as_str()) != except)
        .flat_map(|c| c.groups.iter())
        .filter(|g| g.instance_type == instance_type)
        .map(|g| g.target)
        .sum()
}

pub(super) fn check_quotas(
    w: &Aws,
    groups: &[Group],
    except: Option<&str>,
) -> Result<(), AwsError> {
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
pub(super) const IMMUTABLE: &[&str] = &[
    "InstanceType",
    "TrainingPlanArn",
    "ThreadsPerCore",
    "CapacityRequirements",
    "NetworkInterface",
    "OverrideVpcConfig",
];

pub(super) fn create_cluster(
    w: &mut Aws,
    region: &str,
    body: &Value,
    lookups: &Lookups,
) -> Result<Value, AwsError> {
    let name = str_field(body, "ClusterName").unwrap_or_default();
    check_name(name, "clusterName")?;
    w.settle_hyperpod(name);
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

pub(super) fn update_cluster(
    w: &mut Aws,
    body: &Value,
    lookups: &Lookups,
) -> Result<Value, AwsError> {
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

/// DescribeCluster, by name or ARN.
pub(super) fn describe_cluster(w: &mut Aws, body: &Value) -> Result<Value, AwsError> {
    let c = w
        .hyperpod(str_field(body, "ClusterName").unwrap_or_default())?
        .clone();
    Ok(w.cluster_json(&c))
}

/// ListClusters: the region's clusters, each with the status it has now.
pub(super) fn list_clusters(w: &mut Aws, region: &str) -> Result<Value, AwsError> {
    let listed: Vec<String> = w
        .sagemaker
        .clusters
        .values()
        .filter(|c| c.region == region)
        .map(|c| c.name.clone())
        .collect();
    for name in &listed {
        w.settle_hyperpod(name);
    }
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

/// DeleteCluster: the cluster is Deleting, and gone once that is over.
pub(super) fn delete_cluster(w: &mut Aws, body: &Value) -> Result<Value, AwsError> {
    let now = w.clock.now();
    w.hyperpod(str_field(body, "ClusterName").unwrap_or_default())
        .map(|c| {
            c.phase = Some((Phase::Deleting, now));
            json!({ "ClusterArn": c.arn() })
        })
}

/// ListTags for a HyperPod cluster's ARN (the only taggable resource the sim keeps).
pub(super) fn list_tags(w: &mut Aws, body: &Value) -> Result<Value, AwsError> {
    let arn = str_field(body, "ResourceArn").unwrap_or_default();
    w.settle_sagemaker();
    w.sagemaker
        .clusters
        .values()
        .find(|c| c.arn() == arn)
        .map(|c| json!({ "Tags": c.tags }))
        .ok_or_else(|| validation(format!("Resource {arn} does not exist")))
}
