//! The pre-flight of a training job, one verdict per check: `check_training_job` returns
//! them all, and `submit_training_job` refuses with the failed ones as field errors, so
//! both faces of the question say the same. It also fills in what the request left to
//! hypd (the group, processes per node), which is then stored with the operation.

use app::api::ApiError;
use app::api::error::FieldError;
use app::api::storage::SHARED_CLAIM;
use app::api::training::{
    CheckTrainingJob, RAY_JOB, Recipe, SubmitTrainingJob, TrainingChecks, Verdict,
};
use app::api::values::{InstanceGroupName, ProcessesPerNode};
use aws_sdk_sagemaker::operation::describe_cluster::DescribeClusterOutput;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::{ListParams, PatchParams};

use super::NODE_GROUP_LABEL;
use super::job::{self, Lookup, PYTORCH_CRD, RAY_CRD};
use super::recipe::Target;
use crate::auth::Actor;
use crate::aws::{Aws, SdkResultExt};
use crate::cluster::managed::{Where, locate};
use crate::resources::kube::{self as kubernetes};
use crate::resources::sagemaker::tiered_storage;
use crate::service::{Handler, Service};
use crate::store::Store;

/// One instance group of the cluster and what each of its nodes has.
#[derive(Debug)]
pub(crate) struct Group {
    pub name: String,
    pub instance_type: String,
    pub spot: bool,
    /// NVIDIA GPUs per node (0: none, or accelerators hypd does not request).
    pub gpus: u32,
    pub efa: u32,
}

impl Group {
    pub fn target(&self) -> Target {
        Target {
            group: self.name.clone(),
            instance_type: self.instance_type.clone(),
            gpus: self.gpus,
            efa: self.efa,
        }
    }
}

/// The cluster's instance groups with their types' facts (one DescribeInstanceTypes per
/// type).
pub(crate) async fn groups(
    aws: &Aws,
    region: &str,
    described: &DescribeClusterOutput,
) -> Result<Vec<Group>, ApiError> {
    let mut groups = Vec::new();
    for g in described.instance_groups() {
        let (Some(name), Some(t)) = (g.instance_group_name(), g.instance_type()) else {
            continue;
        };
        let info = crate::inspect::catalogue::one_type(aws, region, t.as_str()).await?;
        let gpus = info
            .as_ref()
            .and_then(|i| i.accelerator.as_ref())
            .filter(|a| a.kind == app::api::inspect::AcceleratorKind::Gpu)
            .map_or(0, |a| a.count);
        groups.push(Group {
            name: name.to_owned(),
            instance_type: t.as_str().to_owned(),
            spot: g.capacity_requirements().and_then(|c| c.spot()).is_some(),
            gpus,
            efa: info.map_or(0, |i| i.max_efa_interfaces),
        });
    }
    Ok(groups)
}

/// The group a request runs on: the one it names, else the cluster's one group with
/// GPUs; why not, by the field to change.
pub(crate) fn choose<'a>(
    groups: &'a [Group],
    asked: Option<&InstanceGroupName>,
    cluster: &str,
) -> Result<&'a Group, String> {
    let names = |gs: &mut dyn Iterator<Item = &Group>| {
        gs.map(|g| g.name.as_str()).collect::<Vec<_>>().join(", ")
    };
    if let Some(asked) = asked {
        return groups
            .iter()
            .find(|g| g.name == asked.as_str())
            .ok_or_else(|| {
                format!(
                    "{cluster} has no instance group {asked} (it has {})",
                    names(&mut groups.iter())
                )
            });
    }
    let gpu: Vec<&Group> = groups.iter().filter(|g| g.gpus > 0).collect();
    match gpu.as_slice() {
        [one] => Ok(one),
        [] => Err(format!(
            "{cluster} has no instance group with GPUs: add one with add_instance_group"
        )),
        several => Err(format!(
            "several groups have GPUs ({}): name one in instance_group",
            names(&mut several.iter().copied())
        )),
    }
}

/// Nodes of `group` that are Ready and take new pods.
async fn schedulable(client: &kube::Client, group: &str) -> Result<u32, ApiError> {
    let nodes = Api::<Node>::all(client.clone());
    let mut n = 0;
    kubernetes::each_listed(
        &nodes,
        ListParams::default().labels(&format!("{NODE_GROUP_LABEL}={group}")),
        |node| {
            let ready = node
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
            let spec = node.spec.unwrap_or_default();
            let cordoned = spec.unschedulable == Some(true);
            let tainted = spec
                .taints
                .iter()
                .flatten()
                .any(|t| matches!(t.effect.as_str(), "NoSchedule" | "NoExecute"));
            if ready && !cordoned && !tainted {
                n += 1;
            }
        },
    )
    .await?;
    Ok(n)
}

/// A custom object as the cluster's own CRD schema judges it: a server-side dry-run
/// apply with strict field validation (unknown fields refused), so the rule is the
/// installed operator's version, not a copy of it.
async fn schema_check(
    client: &kube::Client,
    r: &SubmitTrainingJob,
) -> Result<(bool, String), ApiError> {
    let made = super::recipe::object(r, &Target::default(), "", "check", None)?;
    let params = PatchParams::apply(crate::resources::kube::FIELD_MANAGER)
        .dry_run()
        .validation_strict();
    let kind = r.recipe.object_kind();
    Ok(match made.patch(client, &params).await {
        Ok(()) => (
            true,
            format!("the cluster's {kind} schema accepts the object"),
        ),
        Err(kube::Error::Api(s)) if s.code == 422 || s.code == 400 => (
            false,
            format!("the cluster's {kind} schema refuses it: {}", s.message),
        ),
        Err(e) => return Err(kubernetes::upstream("dry-run apply", e)),
    })
}

/// What the checks found: the verdicts, and the request with hypd's defaults filled in.
pub(crate) struct Checked {
    pub request: SubmitTrainingJob,
    pub verdicts: Vec<Verdict>,
}

impl Checked {
    /// The failed verdicts as field errors: what a submit is refused with.
    pub fn refusal(&self) -> Option<ApiError> {
        let errors: Vec<FieldError> = self
            .verdicts
            .iter()
            .filter(|v| !v.passed)
            .map(|v| {
                FieldError::new(
                    v.field.clone().unwrap_or_else(|| "name".into()),
                    v.message.clone(),
                )
            })
            .collect();
        (!errors.is_empty()).then_some(ApiError::Validation { errors })
    }
}

/// Every check of request `r` against the cluster as it is now.
pub(crate) async fn check(
    aws: &Aws,
    store: &Store,
    mut r: SubmitTrainingJob,
) -> Result<Checked, ApiError> {
    let cluster = r.name.to_string();
    let at: Where = locate(store, &cluster, "to run training jobs").await?;
    let described =
        crate::resources::sagemaker::described(&aws.sagemaker(&at.region), &at.hyperpod).await?;
    let client = kubernetes::connect(aws, &at.region, &at.eks).await?;
    let mut verdicts = Vec::new();
    let mut say = |check: &str, passed: bool, field: Option<&str>, message: String| {
        verdicts.push(Verdict {
            check: check.to_owned(),
            passed,
            field: field.map(str::to_owned),
            message,
        })
    };

    let ray = r.recipe.object_kind() == RAY_JOB;
    let (crd, operator, feature) = if ray {
        (RAY_CRD, "KubeRay", "kuberay_operator")
    } else {
        (
            PYTORCH_CRD,
            "the HyperPod training operator",
            "training_operator",
        )
    };
    let served = kubernetes::crd_served(&client, crd).await?;
    say(
        "feature",
        served,
        Some("name"),
        if served {
            format!("{operator} serves {}", r.recipe.object_kind())
        } else {
            format!(
                "{cluster} does not run {operator} ({} is not served): turn it on with update_features ({feature}: true)",
                r.recipe.object_kind()
            )
        },
    );

    let custom = matches!(r.recipe, Recipe::Custom { .. });
    // A custom job's spec says where its pods run and what they ask for.
    let groups = if custom {
        Vec::new()
    } else {
        groups(aws, &at.region, &described).await?
    };
    let chosen = match choose(&groups, r.instance_group.as_ref(), &cluster) {
        _ if custom => None,
        Ok(g) => {
            say(
                "instance_group",
                true,
                Some("instance_group"),
                format!("runs on group {} ({})", g.name, g.instance_type),
            );
            r.instance_group = Some(InstanceGroupName::parse(&g.name).map_err(ApiError::internal)?);
            Some(g)
        }
        Err(why) => {
            say("instance_group", false, Some("instance_group"), why);
            None
        }
    };

    if let Some(g) = chosen {
        if g.gpus == 0 {
            say(
                "gpus",
                false,
                Some("instance_group"),
                format!(
                    "{} ({}) has no NVIDIA GPUs: a training job needs a GPU group",
                    g.name, g.instance_type
                ),
            );
        } else {
            let procs = r.processes_per_node.map_or(g.gpus, |p| p.get());
            if procs > g.gpus {
                say(
                    "gpus",
                    false,
                    Some("processes_per_node"),
                    format!(
                        "processes_per_node is at most the GPUs of {}: {} (got {procs})",
                        g.instance_type, g.gpus
                    ),
                );
            } else {
                say(
                    "gpus",
                    true,
                    Some("processes_per_node"),
                    format!(
                        "each pod asks for the {} GPUs of {}; {procs} processes per node",
                        g.gpus, g.instance_type
                    ),
                );
                r.processes_per_node =
                    Some(ProcessesPerNode::new(procs).map_err(ApiError::internal)?);
            }
        }
        say(
            "efa",
            true,
            Some("instance_group"),
            if g.efa > 0 {
                format!(
                    "each pod asks for the {} EFA interfaces of {}; NCCL runs over EFA",
                    g.efa, g.instance_type
                )
            } else {
                format!("{} has no EFA: NCCL runs over TCP", g.instance_type)
            },
        );
        let need = r.elastic.as_ref().map_or(r.nodes, |e| e.min_nodes).get();
        let autoscaled = described
            .auto_scaling()
            .is_some_and(|a| a.mode().as_str() == "Enable");
        let have = schedulable(&client, &g.name).await?;
        say(
            "nodes",
            have >= need || autoscaled,
            Some("nodes"),
            if have >= need {
                format!(
                    "{have} healthy nodes of {} take pods; the job needs {need}",
                    g.name
                )
            } else if autoscaled {
                format!(
                    "{have} healthy nodes of {} now; the job needs {need}, which Karpenter adds for its pending pods",
                    g.name
                )
            } else {
                format!(
                    "the job needs {need} nodes but only {have} of group {} are healthy and take pods: scale the group (update_instance_group) or ask for fewer",
                    g.name
                )
            },
        );
    }

    let (file, field) = r
        .recipe
        .file()
        .map_or((None, "recipe"), |(file, field)| (Some(file), field));
    match crate::storage::find(&client, SHARED_CLAIM).await? {
        Some(shared) if shared.phase() == "Bound" => {
            say(
                "storage",
                true,
                Some(field),
                format!("the shared bucket's claim {SHARED_CLAIM} is bound, at /s3 in every pod"),
            );
            match (file, shared.bucket()) {
                // Nothing to find: the recipe names no file.
                (None, _) => {}
                (Some(file), Some(bucket)) => {
                    let head = aws
                        .s3(&at.region)
                        .head_object()
                        .bucket(&bucket)
                        .key(file.key())
                        .send()
                        .await
                        .found("s3", "HeadObject")?;
                    say(
                        "file",
                        head.is_some(),
                        Some(field),
                        match head {
                            Some(h) => format!(
                                "{file} is s3://{bucket}/{} ({} bytes)",
                                file.key(),
                                h.content_length().unwrap_or(0)
                            ),
                            None => format!(
                                "{file} is not there: s3://{bucket}/{} does not exist; upload it (upload_storage_file, or the Storage tab)",
                                file.key()
                            ),
                        },
                    );
                }
                (Some(_), None) => say(
                    "file",
                    false,
                    Some(field),
                    format!("{SHARED_CLAIM}'s volume names no bucket"),
                ),
            }
        }
        Some(shared) => say(
            "storage",
            false,
            Some(field),
            format!(
                "the shared bucket's claim {SHARED_CLAIM} is {}, not Bound: check_storage says why",
                shared.phase()
            ),
        ),
        None => say(
            "storage",
            false,
            Some(field),
            format!(
                "{cluster} has no shared bucket claim {SHARED_CLAIM}: reconcile_cluster makes it again"
            ),
        ),
    }

    if let Some(e) = &r.elastic {
        let mut why = Vec::new();
        if let Some(g) = chosen.filter(|g| g.spot) {
            why.push(format!(
                "group {} is spot capacity, which elastic training is refused on (a reclaimed node is not a planned shrink)",
                g.name
            ));
        }
        if tiered_storage::Observed::from(&described).enabled.is_some() {
            why.push(
                "managed tiered checkpointing is on, which elastic training is refused with (turn it off with update_features)".to_owned(),
            );
        }
        say(
            "elastic",
            why.is_empty(),
            Some("elastic"),
            if why.is_empty() {
                format!(
                    "elastic from {} to {} nodes",
                    e.min_nodes.get(),
                    e.max_nodes.get()
                )
            } else {
                why.join("; ")
            },
        );
    }

    if r.checkpointless && tiered_storage::Observed::from(&described).enabled.is_some() {
        say(
            "checkpointless",
            false,
            Some("checkpointless"),
            "managed tiered checkpointing is on, which checkpointless training is refused with (turn it off with update_features)".to_owned(),
        );
    }

    if custom && served {
        let (passed, message) = schema_check(&client, &r).await?;
        say("schema", passed, Some("recipe.object"), message);
    }

    let mut bad_patterns = 0;
    for (i, rule) in r.log_monitoring.iter().enumerate() {
        let compiled = regex::Regex::new(&rule.pattern);
        if let Err(e) = &compiled {
            bad_patterns += 1;
            say(
                "log_monitoring",
                false,
                Some(&format!("log_monitoring[{i}].pattern")),
                format!("not a regular expression: {e}"),
            );
        } else if rule.metric_threshold.is_some() && compiled.is_ok_and(|re| re.captures_len() < 2)
        {
            bad_patterns += 1;
            say(
                "log_monitoring",
                false,
                Some(&format!("log_monitoring[{i}].pattern")),
                "a rule with a threshold captures the number it judges: put it in a group, e.g. loss=([0-9.]+)".to_owned(),
            );
        }
    }
    if !r.log_monitoring.is_empty() && bad_patterns == 0 {
        say(
            "log_monitoring",
            true,
            Some("log_monitoring"),
            format!("{} log rules", r.log_monitoring.len()),
        );
    }

    if served {
        match job::find(&client, r.job.as_str()).await? {
            Lookup::Found(j) => say(
                "name",
                false,
                Some("job"),
                format!(
                    "a training job named {} exists ({}, {}): delete it with delete_training_job or choose another name",
                    r.job,
                    j.kind(),
                    if j.finished_at().is_none() {
                        "not finished"
                    } else {
                        "finished"
                    }
                ),
            ),
            _ => say(
                "name",
                true,
                Some("job"),
                format!("no training job is named {}", r.job),
            ),
        }
    }

    if served {
        let (ok, field, message) = super::metrics::check(aws, &at.region, &mut r).await?;
        say("mlflow", ok, Some(field), message);
    }

    Ok(Checked {
        request: r,
        verdicts,
    })
}

impl Handler<CheckTrainingJob> for Service {
    async fn handle(&self, _: &Actor, r: CheckTrainingJob) -> Result<TrainingChecks, ApiError> {
        let checked = check(&self.aws, &self.store, r.0).await?;
        Ok(TrainingChecks {
            name: checked.request.name.to_string(),
            job: checked.request.job.to_string(),
            ready: checked.verdicts.iter().all(|v| v.passed),
            checks: checked.verdicts,
        })
    }
}
