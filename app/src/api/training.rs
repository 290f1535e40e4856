//! Training jobs: `submit_training_job` turns a recipe (a PyTorch script, a
//! LLaMA-Factory or ms-swift config, a VERL run, or a spec of your own) into the HyperPod
//! training operator's HyperPodPyTorchJob or KubeRay's RayJob, with the instance type's
//! GPUs and EFA, the group's node selector, the shared bucket at `/s3` in every pod, the
//! MLflow tracking server, and a recovery budget the operator enforces;
//! `check_training_job` says, check by check, whether the same request may run;
//! `list_training_jobs`, `get_training_job` (with the budget as a ledger of what used it)
//! and `delete_training_job` follow it. The job's object is the record: hypd reads the
//! cluster, never its own store, so a job made with kubectl shows up too.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::command::{Command, CommandSpec, Effect, HttpMethod, Role};
use super::error::{ApiError, FieldError};
use super::operations::OperationRef;
use super::plan::Gated;
use super::values::{
    ClusterName, Confirmation, ContainerImage, DataPoints, EksClusterName, EvalPeriodSeconds,
    ExperimentName, IdempotencyKey, InstanceGroupName, JobName, LogLines, LogRuleName, LogSeconds,
    LogSince, MetricKey, MetricPoints, NodeCount, PodName, PodPath, ProcessesPerNode, RestartCount,
    RetryCount, TrackingServerName,
};

/// The namespace jobs run in: the shared bucket's claim is there.
pub const NAMESPACE: &str = "default";
/// Most arguments a script may be given, and the longest one.
pub const MAX_ARGS: usize = 64;
pub const MAX_ARG_CHARS: usize = 1024;
/// Most log-monitoring rules per job.
pub const MAX_LOG_RULES: usize = 16;

// What the job runs; `kind` picks the recipe. Decoded by hand (below) so a bad value
// is reported at its own path (`recipe.script`), which serde's tagged enums lose.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Recipe {
    // A PyTorch script on the shared bucket, launched on every node by `hyperpodrun`.
    Pytorch {
        script: PodPath,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        args: Vec<String>,
    },
    // A LLaMA-Factory training config (SFT, DPO, …) on the shared bucket.
    LlamaFactory {
        config: PodPath,
    },
    // An ms-swift run: `swift sft|pt|rlhf` or `megatron sft|pt|rlhf` with a config file.
    MsSwift {
        command: SwiftCommand,
        config: PodPath,
    },
    // A VERL reinforcement-learning run as a KubeRay RayJob: a script on the bucket, or
    // VERL's PPO trainer (`python3 -m verl.trainer.main_ppo`) with Hydra overrides.
    Verl {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        script: Option<PodPath>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        args: Vec<String>,
    },
    // A HyperPodPyTorchJob or RayJob spec of your own, applied as given (checked by the
    // cluster's CRD schema).
    Custom {
        #[schemars(schema_with = "any_object")]
        object: serde_json::Value,
    },
}

// The ms-swift entry points hypd launches (`//`: tools/list carries no doc of it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum SwiftCommand {
    Sft,
    Pt,
    Rlhf,
    MegatronSft,
    MegatronPt,
    MegatronRlhf,
}

impl SwiftCommand {
    /// The module of ms-swift whose file is the entry point (`swift sft` runs it).
    pub fn module(self) -> &'static str {
        match self {
            SwiftCommand::Sft => "swift.cli.sft",
            SwiftCommand::Pt => "swift.cli.pt",
            SwiftCommand::Rlhf => "swift.cli.rlhf",
            SwiftCommand::MegatronSft => "swift.cli._megatron.sft",
            SwiftCommand::MegatronPt => "swift.cli._megatron.pt",
            SwiftCommand::MegatronRlhf => "swift.cli._megatron.rlhf",
        }
    }
}

/// A custom object's schema: any object (the cluster's CRD schema judges it).
fn any_object(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({ "type": "object" })
}

/// The CRD kinds a training job is made of.
pub const PYTORCH_JOB: &str = "HyperPodPyTorchJob";
pub const RAY_JOB: &str = "RayJob";

impl Recipe {
    pub fn kind(&self) -> &'static str {
        match self {
            Recipe::Pytorch { .. } => "pytorch",
            Recipe::LlamaFactory { .. } => "llama_factory",
            Recipe::MsSwift { .. } => "ms_swift",
            Recipe::Verl { .. } => "verl",
            Recipe::Custom { .. } => "custom",
        }
    }

    /// The file on the bucket the recipe reads, and its request field.
    pub fn file(&self) -> Option<(&PodPath, &'static str)> {
        match self {
            Recipe::Pytorch { script, .. } => Some((script, "recipe.script")),
            Recipe::LlamaFactory { config } | Recipe::MsSwift { config, .. } => {
                Some((config, "recipe.config"))
            }
            Recipe::Verl { script, .. } => script.as_ref().map(|s| (s, "recipe.script")),
            Recipe::Custom { .. } => None,
        }
    }

    /// The kind of object the job is: a RayJob for VERL (and a custom RayJob), a
    /// HyperPodPyTorchJob otherwise.
    pub fn object_kind(&self) -> &str {
        match self {
            Recipe::Verl { .. } => RAY_JOB,
            Recipe::Custom { object } => object["kind"].as_str().unwrap_or(PYTORCH_JOB),
            _ => PYTORCH_JOB,
        }
    }

    /// The rules of a recipe that need nothing but the request.
    fn errors(&self, err: &mut impl FnMut(String, String)) {
        let args = match self {
            Recipe::Pytorch { args, .. } | Recipe::Verl { args, .. } => args.as_slice(),
            _ => &[],
        };
        if args.len() > MAX_ARGS {
            err(
                "recipe.args".into(),
                format!("at most {MAX_ARGS} arguments (got {})", args.len()),
            );
        }
        for (i, a) in args.iter().enumerate() {
            if a.chars().count() > MAX_ARG_CHARS || a.contains('\0') {
                err(
                    format!("recipe.args[{i}]"),
                    format!("an argument is at most {MAX_ARG_CHARS} characters, without NUL"),
                );
            }
        }
        if let Recipe::Custom { object } = self {
            custom_errors(object, err);
        }
    }
}

/// The apiVersion each custom kind must have.
fn api_version_of(kind: &str) -> Option<&'static str> {
    match kind {
        PYTORCH_JOB => Some("sagemaker.amazonaws.com/v1"),
        RAY_JOB => Some("ray.io/v1"),
        _ => None,
    }
}

/// A custom object: one of the two kinds at its version, with a spec; its name and
/// namespace are the request's (a different one is refused, not silently replaced).
fn custom_errors(object: &serde_json::Value, err: &mut impl FnMut(String, String)) {
    let Some(map) = object.as_object() else {
        return err(
            "recipe.object".into(),
            "an object: {apiVersion, kind, spec}".into(),
        );
    };
    let kind = map.get("kind").and_then(|k| k.as_str()).unwrap_or_default();
    match api_version_of(kind) {
        None => err(
            "recipe.object.kind".into(),
            format!("a custom job is a {PYTORCH_JOB} or a {RAY_JOB} (got {kind:?})"),
        ),
        Some(v) if map.get("apiVersion").and_then(|a| a.as_str()) != Some(v) => err(
            "recipe.object.apiVersion".into(),
            format!("a {kind} is {v}"),
        ),
        Some(_) => {}
    }
    if !map.get("spec").is_some_and(|s| s.is_object()) {
        err(
            "recipe.object.spec".into(),
            "the job's spec, an object".into(),
        );
    }
    if map.contains_key("status") {
        err(
            "recipe.object.status".into(),
            "a status is the operator's to write".into(),
        );
    }
    let meta = &object["metadata"];
    if meta["namespace"].as_str().is_some_and(|n| n != NAMESPACE) {
        err(
            "recipe.object.metadata.namespace".into(),
            format!("training jobs run in {NAMESPACE}, where the shared bucket's claim is"),
        );
    }
    if meta.get("name").is_some() {
        err(
            "recipe.object.metadata.name".into(),
            "the job's name is the request's `job`: leave it out".into(),
        );
    }
}

impl<'de> Deserialize<'de> for Recipe {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = Recipe;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a recipe: {\"kind\": \"pytorch\" | \"llama_factory\" | \"ms_swift\" | \"verl\" | \"custom\", …}")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Recipe, A::Error> {
                use serde::de::Error;
                const FIELDS: &[&str] = &["kind", "script", "args", "config", "command", "object"];
                const KINDS: &[&str] = &["pytorch", "llama_factory", "ms_swift", "verl", "custom"];
                let (mut kind, mut script, mut args, mut config, mut command, mut object) =
                    (None::<String>, None, None, None, None, None);
                while let Some(key) = map.next_key::<String>()? {
                    // Each value read here carries its key in the error's path.
                    match key.as_str() {
                        "kind" => kind = Some(map.next_value()?),
                        "script" => script = Some(map.next_value::<PodPath>()?),
                        "args" => args = Some(map.next_value::<Vec<String>>()?),
                        "config" => config = Some(map.next_value::<PodPath>()?),
                        "command" => command = Some(map.next_value::<SwiftCommand>()?),
                        "object" => object = Some(map.next_value::<serde_json::Value>()?),
                        other => return Err(A::Error::unknown_field(other, FIELDS)),
                    }
                }
                let kind = kind.ok_or_else(|| A::Error::missing_field("kind"))?;
                // The fields each kind takes; any other given is refused by name.
                let takes: &[&str] = match kind.as_str() {
                    "pytorch" | "verl" => &["script", "args"],
                    "llama_factory" => &["config"],
                    "ms_swift" => &["command", "config"],
                    "custom" => &["object"],
                    other => return Err(A::Error::unknown_variant(other, KINDS)),
                };
                let given = [
                    ("script", script.is_some()),
                    ("args", args.is_some()),
                    ("config", config.is_some()),
                    ("command", command.is_some()),
                    ("object", object.is_some()),
                ];
                if let Some((field, _)) = given.iter().find(|(f, g)| *g && !takes.contains(f)) {
                    return Err(A::Error::custom(format!(
                        "`{field}` is not a field of a {kind} recipe"
                    )));
                }
                fn need<T, E: Error>(v: Option<T>, field: &'static str) -> Result<T, E> {
                    v.ok_or_else(|| E::missing_field(field))
                }
                Ok(match kind.as_str() {
                    "pytorch" => Recipe::Pytorch {
                        script: need(script, "script")?,
                        args: args.unwrap_or_default(),
                    },
                    "llama_factory" => Recipe::LlamaFactory {
                        config: need(config, "config")?,
                    },
                    "ms_swift" => Recipe::MsSwift {
                        command: need(command, "command")?,
                        config: need(config, "config")?,
                    },
                    "verl" => Recipe::Verl {
                        script,
                        args: args.unwrap_or_default(),
                    },
                    _ => Recipe::Custom {
                        object: need(object, "object")?,
                    },
                })
            }
        }
        d.deserialize_map(Visit)
    }
}

// How many failures the training operator absorbs before it gives up: its `runPolicy`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Recovery {
    // Pod restarts in all, over the job's life (default 50).
    #[serde(default = "Recovery::default_retries")]
    pub job_max_retry_count: RetryCount,
    // Pod restarts within one evaluation period before the whole job restarts (default 3).
    #[serde(default = "Recovery::default_restarts")]
    pub restarts_before_full_job_restart: RestartCount,
    // The period restarts are counted in (default 21,600 s: six hours).
    #[serde(default = "Recovery::default_period")]
    pub eval_period_seconds: EvalPeriodSeconds,
    // Full-job restarts before the job fails (default 1).
    #[serde(default = "Recovery::default_full")]
    pub max_full_job_restarts: RestartCount,
}

impl Recovery {
    fn default_retries() -> RetryCount {
        RetryCount::new(50).expect("in range")
    }
    fn default_restarts() -> RestartCount {
        RestartCount::new(3).expect("in range")
    }
    fn default_period() -> EvalPeriodSeconds {
        EvalPeriodSeconds::new(21600).expect("in range")
    }
    fn default_full() -> RestartCount {
        RestartCount::new(1).expect("in range")
    }
}

impl Default for Recovery {
    fn default() -> Self {
        Recovery {
            job_max_retry_count: Self::default_retries(),
            restarts_before_full_job_restart: Self::default_restarts(),
            eval_period_seconds: Self::default_period(),
            max_full_job_restarts: Self::default_full(),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Comparison {
    Gt,
    Gteq,
    Lt,
    Lteq,
    Eq,
}

impl Comparison {
    /// The operator's spelling.
    pub fn as_operator(self) -> &'static str {
        match self {
            Comparison::Gt => "gt",
            Comparison::Gteq => "gteq",
            Comparison::Lt => "lt",
            Comparison::Lteq => "lteq",
            Comparison::Eq => "eq",
        }
    }
}

// A log-monitoring rule: the operator restarts the job when a pattern is not seen in
// time (a hang) or the number it captures crosses a threshold (an outlier).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LogRule {
    pub name: LogRuleName,
    // A regular expression; for a threshold, its first group captures the number.
    pub pattern: String,
    // The pattern must be seen within this many seconds of the start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_cutoff_seconds: Option<LogSeconds>,
    // Then again at least this often (a hang otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_frequency_seconds: Option<LogSeconds>,
    // The captured number is judged against this, with `comparison`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metric_threshold: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comparison: Option<Comparison>,
    // Consecutive values that must break the threshold (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evaluation_data_points: Option<DataPoints>,
}

// Elastic training: the job runs on as few as `min_nodes` and grows to `max_nodes`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Elastic {
    pub min_nodes: NodeCount,
    pub max_nodes: NodeCount,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SubmitTrainingJob {
    /// The cluster.
    pub name: ClusterName,
    pub job: JobName,
    pub recipe: Recipe,
    // Default: the cluster's one group with GPUs (asked for when there are several).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_group: Option<InstanceGroupName>,
    // One pod per node (default 1).
    #[serde(default = "one_node")]
    pub nodes: NodeCount,
    // Default: the instance type's GPUs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub processes_per_node: Option<ProcessesPerNode>,
    // Default: the recipe's pinned image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<ContainerImage>,
    #[serde(default)]
    pub recovery: Recovery,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub log_monitoring: Vec<LogRule>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub elastic: Option<Elastic>,
    // The script uses HyperPod checkpointless training (recovery from peers' memory),
    // which refuses elastic training and managed tiered checkpointing.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub checkpointless: bool,
    // MLflow tracking server (default: the cluster's, if it has one) and experiment
    // (default: the cluster's name) the job reports to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mlflow_tracking_server: Option<TrackingServerName>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mlflow_experiment: Option<ExperimentName>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<IdempotencyKey>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dry_run: bool,
}

fn one_node() -> NodeCount {
    NodeCount::new(1).expect("in range")
}

impl SubmitTrainingJob {
    /// The rules that need nothing but the request, as field errors (every one broken).
    pub fn request_errors(&self) -> Vec<FieldError> {
        let mut errors = Vec::new();
        let mut err = |field: String, message: String| errors.push(FieldError::new(field, message));
        self.recipe.errors(&mut err);
        if let Some(e) = &self.elastic {
            if e.min_nodes > e.max_nodes {
                err(
                    "elastic.min_nodes".into(),
                    format!(
                        "min_nodes ({}) must not exceed max_nodes ({})",
                        e.min_nodes.get(),
                        e.max_nodes.get()
                    ),
                );
            } else if !(e.min_nodes..=e.max_nodes).contains(&self.nodes) {
                err(
                    "nodes".into(),
                    format!(
                        "an elastic job starts within its range: nodes ({}) must be from min_nodes ({}) to max_nodes ({})",
                        self.nodes.get(),
                        e.min_nodes.get(),
                        e.max_nodes.get()
                    ),
                );
            }
        }
        if self.checkpointless && self.elastic.is_some() {
            err(
                "elastic".into(),
                "elastic training is refused with checkpointless training (HyperPod supports neither with the other): drop one".into(),
            );
        }
        // What only the training operator acts on, refused where it would be ignored.
        let operator_only: &[(&str, bool)] = &[
            ("log_monitoring", !self.log_monitoring.is_empty()),
            ("elastic", self.elastic.is_some()),
            ("checkpointless", self.checkpointless),
        ];
        if let Recipe::Verl { .. } = self.recipe {
            for (field, given) in operator_only {
                if *given {
                    err(
                        (*field).into(),
                        format!(
                            "{field} is the HyperPod training operator's; a verl job is a KubeRay RayJob"
                        ),
                    );
                }
            }
        }
        if let Recipe::Custom { .. } = self.recipe {
            let given = [
                ("image", self.image.is_some()),
                ("processes_per_node", self.processes_per_node.is_some()),
                ("log_monitoring", !self.log_monitoring.is_empty()),
                ("elastic", self.elastic.is_some()),
            ];
            for (field, _) in given.iter().filter(|(_, g)| *g) {
                err(
                    (*field).into(),
                    format!(
                        "a custom job is applied as given: put {field} in recipe.object's spec"
                    ),
                );
            }
        }
        if self.log_monitoring.len() > MAX_LOG_RULES {
            err(
                "log_monitoring".into(),
                format!(
                    "at most {MAX_LOG_RULES} rules (got {})",
                    self.log_monitoring.len()
                ),
            );
        }
        for (i, rule) in self.log_monitoring.iter().enumerate() {
            let at = |f: &str| format!("log_monitoring[{i}].{f}");
            if self.log_monitoring[..i].iter().any(|r| r.name == rule.name) {
                err(at("name"), format!("{} names two rules", rule.name));
            }
            if rule.pattern.is_empty() || rule.pattern.chars().count() > 512 {
                err(
                    at("pattern"),
                    "a pattern is 1-512 characters of a regular expression".into(),
                );
            }
            if rule.metric_threshold.is_some() != rule.comparison.is_some() {
                err(
                    at("comparison"),
                    "a threshold needs its comparison (gt, gteq, lt, lteq, eq), and a comparison its metric_threshold".into(),
                );
            }
            if rule.metric_threshold.is_some_and(|t| !t.is_finite()) {
                err(
                    at("metric_threshold"),
                    "a threshold is a finite number".into(),
                );
            }
            let judged = rule.metric_threshold.is_some()
                || rule.start_cutoff_seconds.is_some()
                || rule.expected_frequency_seconds.is_some();
            if !judged {
                err(
                    at("pattern"),
                    "a rule acts on a start cut-off, an expected frequency or a threshold: give at least one".into(),
                );
            }
        }
        errors
    }
}

impl Command for SubmitTrainingJob {
    type Output = Gated<OperationRef>;
    const SPEC: CommandSpec = CommandSpec {
        name: "submit_training_job",
        summary: "Submit a training job (PyTorch, LLaMA-Factory, ms-swift, VERL or a custom spec)",
        description: "Submits a training job (a HyperPodPyTorchJob, or a KubeRay RayJob for verl); files are /s3/... paths. Call check_training_job first. Returns an operation for wait_operation; dry_run returns the object.",
        effect: Effect::Mutating,
        role: Role::Operator,
        idempotent: true,
        status_command: Some("get_operation"),
        method: HttpMethod::Post,
        path: "/api/v1/clusters/{name}/training-jobs",
    };

    super::command::dry_run_request!();

    fn validate(&self) -> Result<(), ApiError> {
        let errors = self.request_errors();
        ApiError::unless_broken(errors)
    }
}

/// The same request as `submit_training_job`, checked without submitting it
/// (`idempotency_key` and `dry_run` are ignored).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct CheckTrainingJob(pub SubmitTrainingJob);

/// An object naming the cluster and the job, pointing at submit_training_job's schema for
/// the rest: the two tools' inputs are one request, and listing its 3 kB schema twice
/// would cost every agent's tools/list (decoding checks every field the same either way).
impl JsonSchema for CheckTrainingJob {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "CheckTrainingJob".into()
    }
    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "object",
            "properties": {
                "name": generator.subschema_for::<ClusterName>(),
                "job": generator.subschema_for::<JobName>(),
                "recipe": { "type": "object" },
            },
            "required": ["name", "job", "recipe"],
        })
    }
}

/// One pre-flight check's verdict.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Verdict {
    /// Stable id: `feature`, `instance_group`, `gpus`, `efa`, `nodes`, `storage`, `file`,
    /// `elastic`, `log_monitoring`, `name`.
    pub check: String,
    pub passed: bool,
    /// The request field the check is about, when one is.
    pub field: Option<String>,
    /// What was found, or the rule and how to meet it.
    pub message: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct TrainingChecks {
    pub name: String,
    pub job: String,
    /// Every check passed: submit_training_job would run.
    pub ready: bool,
    pub checks: Vec<Verdict>,
}

impl Command for CheckTrainingJob {
    type Output = TrainingChecks;
    const SPEC: CommandSpec = CommandSpec {
        name: "check_training_job",
        summary: "Check a training job before submitting it",
        description: "Pre-flight checks for submit_training_job, with the same arguments. Call it before submitting; a submit failing a check is refused.",
        effect: Effect::ReadOnly,
        role: Role::Viewer,
        idempotent: true,
        status_command: None,
        method: HttpMethod::Post,
        path: "/api/v1/clusters/{name}/training-jobs/check",
    };

    fn validate(&self) -> Result<(), ApiError> {
        self.0.validate()
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListTrainingJobs {
    /// The cluster.
    pub name: EksClusterName,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct TrainingJobList {
    pub name: String,
    pub jobs: Vec<TrainingJobSummary>,
    /// The cluster's MLflow tracking server (`<cluster>-mlflow`), if it has one.
    pub mlflow: Option<super::mlflow::TrackingServer>,
    pub fetched_at: String,
}

/// Where a job is: `pending` (pods not all running), `running`, `restarting`,
/// `succeeded`, `failed`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct TrainingJobSummary {
    pub job: String,
    /// `pytorch`, `llama_factory`, `ms_swift`, `verl`, or `custom` (also a job hypd did
    /// not make).
    pub recipe: String,
    /// `HyperPodPyTorchJob` or `RayJob`.
    pub kind: String,
    pub phase: String,
    pub instance_group: Option<String>,
    pub nodes: u32,
    /// The current attempt: 1, then one more after every restart.
    pub attempt: u32,
    pub created_at: Option<String>,
    pub finished_at: Option<String>,
}

impl Command for ListTrainingJobs {
    type Output = TrainingJobList;
    const SPEC: CommandSpec = CommandSpec {
        name: "list_training_jobs",
        summary: "List a cluster's training jobs",
        description: "Every HyperPodPyTorchJob and RayJob of the cluster (hypd's and others'), with recipe, phase and attempt.",
        effect: Effect::ReadOnly,
        role: Role::Viewer,
        idempotent: true,
        status_command: None,
        method: HttpMethod::Get,
        path: "/api/v1/clusters/{name}/training-jobs",
    };
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GetTrainingJob {
    /// The cluster.
    pub name: EksClusterName,
    pub job: JobName,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct TrainingJob {
    pub name: String,
    #[serde(flatten)]
    pub summary: TrainingJobSummary,
    pub image: Option<String>,
    pub processes_per_node: Option<u32>,
    pub pods: Vec<TrainingPod>,
    pub conditions: Vec<JobCondition>,
    pub recovery: RecoveryLedger,
    /// The job's events, oldest first.
    pub events: Vec<JobEvent>,
    /// Where the job reports to MLflow, and its runs (one per attempt), if it does.
    pub mlflow: Option<JobTracking>,
    pub fetched_at: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct JobTracking {
    /// The tracking server's ARN (the job's MLFLOW_TRACKING_URI).
    pub tracking_server: String,
    pub experiment: String,
    /// The MLflow UI of the experiment (SageMaker asks for a presigned login first).
    pub url: Option<String>,
    /// Oldest first; empty until the job's code starts its first run.
    pub runs: Vec<MlflowRun>,
    /// Why the runs could not be read, when they could not (the job still runs).
    pub error: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct MlflowRun {
    pub run_id: String,
    pub name: Option<String>,
    /// The job's attempt the run belongs to (hypd tags it `hypd.attempt`).
    pub attempt: Option<u32>,
    /// MLflow's: RUNNING, FINISHED, FAILED, KILLED.
    pub status: String,
    pub started_at: Option<String>,
    pub ended_at: Option<String>,
    pub link: Option<String>,
    /// Every metric's last value.
    pub last: Vec<MetricPoint>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct MetricPoint {
    pub key: String,
    pub step: i64,
    pub value: f64,
    /// Milliseconds since the epoch, as MLflow stores it.
    pub timestamp: i64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct TrainingPod {
    pub pod: String,
    pub phase: String,
    pub node: Option<String>,
    /// Why it is not running, when it waits (unscheduled, image pull, a volume).
    pub waiting: Option<String>,
    pub exit_code: Option<i32>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct JobCondition {
    pub kind: String,
    pub status: String,
    pub reason: Option<String>,
    pub message: Option<String>,
    pub at: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct JobEvent {
    pub at: Option<String>,
    pub kind: String,
    pub reason: String,
    pub message: String,
}

/// The recovery budget as the operator spends it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct RecoveryLedger {
    /// The budget as asked (`runPolicy`); None for a job without one.
    pub budget: Option<Recovery>,
    /// Pod restarts so far, of `job_max_retry_count`.
    pub restarts_used: u32,
    pub restarts_left: Option<u32>,
    /// Pod restarts in the current evaluation period, of
    /// `restarts_before_full_job_restart`.
    pub restarts_in_period: u32,
    pub full_job_restarts_used: u32,
    pub full_job_restarts_left: Option<u32>,
    /// What the operator does on the next failure.
    pub next_failure: String,
    /// Each unit used, oldest first.
    pub entries: Vec<LedgerEntry>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct LedgerEntry {
    /// The attempt this failure ended.
    pub attempt: u32,
    pub at: Option<String>,
    /// `pod_restart` or `full_job_restart`; `failed` when the budget was spent.
    pub action: String,
    pub pod: Option<String>,
    pub node: Option<String>,
    pub exit_code: Option<i32>,
    /// The log rule that fired, when it was one.
    pub log_rule: Option<String>,
    pub message: String,
}

impl Command for GetTrainingJob {
    type Output = TrainingJob;
    const SPEC: CommandSpec = CommandSpec {
        name: "get_training_job",
        summary: "Show a training job: pods, conditions, events and its recovery ledger",
        description: "One job's phase, pods, events, MLflow runs and recovery budget: restarts and why, what is left, what the next failure does.",
        effect: Effect::ReadOnly,
        role: Role::Viewer,
        idempotent: true,
        status_command: None,
        method: HttpMethod::Get,
        path: "/api/v1/clusters/{name}/training-jobs/{job}",
    };
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GetTrainingJobLogs {
    /// The cluster.
    pub name: EksClusterName,
    pub job: JobName,
    // Default: the job's first pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<PodName>,
    // Default: the pod's first container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<PodName>,
    // The last lines (default 100, at most 5000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tail_lines: Option<LogLines>,
    // Only lines written within the last this many seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since_seconds: Option<LogSince>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct TrainingLogs {
    pub name: String,
    pub job: String,
    pub pod: String,
    pub container: String,
    /// Oldest first.
    pub lines: Vec<String>,
    pub fetched_at: String,
}

impl Command for GetTrainingJobLogs {
    type Output = TrainingLogs;
    const SPEC: CommandSpec = CommandSpec {
        name: "get_training_job_logs",
        summary: "Read a training job's pod logs",
        description: "The last log lines of a training job's pod (default the job's first pod).",
        effect: Effect::ReadOnly,
        role: Role::Viewer,
        idempotent: true,
        status_command: None,
        method: HttpMethod::Get,
        path: "/api/v1/clusters/{name}/training-jobs/{job}/logs",
    };
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GetTrainingJobMetrics {
    /// The cluster.
    pub name: EksClusterName,
    pub job: JobName,
    // Default: every metric the runs logged.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub metrics: Vec<MetricKey>,
    // Most points per series (default 500); longer histories are thinned evenly.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_points: Option<MetricPoints>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct TrainingMetrics {
    pub name: String,
    pub job: String,
    pub tracking: Option<JobTracking>,
    /// One series per run and metric, runs oldest first.
    pub series: Vec<MetricSeries>,
    pub fetched_at: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct MetricSeries {
    pub run_id: String,
    pub attempt: Option<u32>,
    pub key: String,
    /// `[step, value]`, by step.
    pub points: Vec<(i64, f64)>,
}

impl Command for GetTrainingJobMetrics {
    type Output = TrainingMetrics;
    const SPEC: CommandSpec = CommandSpec {
        name: "get_training_job_metrics",
        summary: "Read a training job's MLflow metrics (loss, throughput, GPU use)",
        description: "A training job's MLflow runs (one per attempt) and their metrics as [step, value] points.",
        effect: Effect::ReadOnly,
        role: Role::Viewer,
        idempotent: true,
        status_command: None,
        method: HttpMethod::Get,
        path: "/api/v1/clusters/{name}/training-jobs/{job}/metrics",
    };
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeleteTrainingJob {
    /// The cluster.
    pub name: ClusterName,
    pub job: JobName,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<IdempotencyKey>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dry_run: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confirmation: Option<Confirmation>,
}

impl Command for DeleteTrainingJob {
    type Output = Gated<OperationRef>;
    const SPEC: CommandSpec = CommandSpec {
        name: "delete_training_job",
        summary: "Delete a training job and its pods",
        description: "Deletes a training job (running pods stop); its files in the bucket stay. The first call returns the plan and a confirmation; call again with it once the user agrees. Returns an operation for wait_operation.",
        effect: Effect::Destructive,
        role: Role::Operator,
        idempotent: true,
        status_command: Some("get_operation"),
        method: HttpMethod::Delete,
        path: "/api/v1/clusters/{name}/training-jobs/{job}",
    };

    super::command::gated_request!();
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn submit(extra: serde_json::Value) -> Result<SubmitTrainingJob, String> {
        let mut body = json!({"name": "ml-1", "job": "sft-1",
            "recipe": {"kind": "pytorch", "script": "/s3/scripts/train.py"}});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        serde_json::from_value(body).map_err(|e| e.to_string())
    }

    #[test]
    fn defaults_are_the_operators_documented_budget() {
        let r = submit(json!({})).unwrap();
        assert_eq!(r.nodes.get(), 1);
        assert_eq!(r.recovery.job_max_retry_count.get(), 50);
        assert_eq!(r.recovery.eval_period_seconds.get(), 21600);
        assert!(r.validate().is_ok());
        // A stored request without the newer fields still decodes.
        let stored: SubmitTrainingJob = serde_json::from_value(json!({"name": "ml-1",
            "job": "a", "recipe": {"kind": "llama_factory", "config": "/s3/cfg/sft.yaml"}}))
        .unwrap();
        assert_eq!(stored.recipe.file().unwrap().1, "recipe.config");
    }

    #[test]
    fn request_rules_name_their_field() {
        for bad in ["/data/x.py", "/s3/../etc/passwd", "/s3/", "s3/x.py"] {
            let e = submit(json!({"recipe": {"kind": "pytorch", "script": bad}})).unwrap_err();
            assert!(e.contains("/s3/<key>"), "{bad}: {e}");
        }
        let e = submit(json!({"recipe": {"kind": "pytorch", "script": "/s3/a.py", "extra": 1}}))
            .unwrap_err();
        assert!(e.contains("extra"), "{e}");
        // The path of a bad value inside the recipe is its own.
        let bad = json!({"name": "ml-1", "job": "a", "recipe": {"kind": "llama_factory", "config": "/data/x"}});
        match crate::api::decode::<SubmitTrainingJob>(bad) {
            Err(ApiError::Validation { errors }) => assert_eq!(errors[0].field, "recipe.config"),
            other => panic!("{other:?}"),
        }
        let e = submit(json!({"recipe": {"kind": "llama_factory", "config": "/s3/c.yaml", "script": "/s3/a.py"}}))
            .unwrap_err();
        assert!(
            e.contains("`script` is not a field of a llama_factory recipe"),
            "{e}"
        );
        let r = submit(json!({"nodes": 5, "elastic": {"min_nodes": 1, "max_nodes": 4}})).unwrap();
        let errors = r.request_errors();
        assert_eq!(errors[0].field, "nodes", "{errors:?}");
        let r = submit(json!({"log_monitoring": [
            {"name": "hang", "pattern": ".*step.*", "expected_frequency_seconds": 60},
            {"name": "hang", "pattern": "loss=(\\d+)", "metric_threshold": 0.5}]}))
        .unwrap();
        let fields: Vec<String> = r.request_errors().into_iter().map(|e| e.field).collect();
        assert_eq!(
            fields,
            ["log_monitoring[1].name", "log_monitoring[1].comparison"]
        );
    }

    #[test]
    fn a_threshold_keeps_its_type() {
        let r = submit(
            json!({"log_monitoring": [{"name": "loss", "pattern": "loss=([0-9.]+)",
            "metric_threshold": 0.5, "comparison": "gt"}]}),
        )
        .unwrap();
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["log_monitoring"][0]["metric_threshold"], json!(0.5));
        assert!(r.validate().is_ok());
    }

    #[test]
    fn each_recipe_decodes_and_its_rules_name_their_fields() {
        let r = submit(
            json!({"recipe": {"kind": "ms_swift", "command": "rlhf", "config": "/s3/c.yaml"}}),
        )
        .unwrap();
        assert_eq!(r.recipe.object_kind(), PYTORCH_JOB);
        let e = submit(
            json!({"recipe": {"kind": "ms_swift", "command": "dpo", "config": "/s3/c.yaml"}}),
        )
        .unwrap_err();
        assert!(e.contains("dpo"), "{e}");
        let r = submit(json!({"recipe": {"kind": "verl"}, "log_monitoring": [
            {"name": "hang", "pattern": "step", "expected_frequency_seconds": 60}]}))
        .unwrap();
        assert_eq!(r.recipe.object_kind(), RAY_JOB);
        assert_eq!(r.recipe.file(), None);
        let fields: Vec<String> = r.request_errors().into_iter().map(|e| e.field).collect();
        assert_eq!(fields, ["log_monitoring"]);
        let r =
            submit(json!({"checkpointless": true, "elastic": {"min_nodes": 1, "max_nodes": 2}}))
                .unwrap();
        assert_eq!(r.request_errors()[0].field, "elastic");
        let r = submit(
            json!({"image": "x/y:1", "recipe": {"kind": "custom", "object": {
            "apiVersion": "ray.io/v2", "kind": "RayJob", "metadata": {"name": "other"},
            "status": {}}}}),
        )
        .unwrap();
        let fields: Vec<String> = r.request_errors().into_iter().map(|e| e.field).collect();
        assert_eq!(
            fields,
            [
                "recipe.object.apiVersion",
                "recipe.object.spec",
                "recipe.object.status",
                "recipe.object.metadata.name",
                "image"
            ]
        );
        let e = submit(json!({"recipe": {"kind": "custom", "object": {}, "script": "/s3/a.py"}}))
            .unwrap_err();
        assert!(
            e.contains("`script` is not a field of a custom recipe"),
            "{e}"
        );
    }
}
