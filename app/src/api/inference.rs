//! Model endpoints: `deploy_model_server` runs a serving container of your choice (vLLM,
//! SGLang or a custom image) as a Deployment behind a Service in one of three shapes,
//! and `list_endpoints`, `get_endpoint`, `scale_endpoint`, `invoke_endpoint` and
//! `delete_endpoint` follow it. The serve command is one line that is parsed here, in
//! the contract, so every face (the console's form included) refuses the same bad line
//! with the same field error before anything reaches a cluster.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::command::{Command, CommandSpec, Effect, HttpMethod, Role};
use super::error::{ApiError, FieldError};
use super::models::HfToken;
use super::operations::OperationRef;
use super::plan::Gated;
use super::values::{
    ClusterName, Confirmation, ContainerImage, CooldownSeconds, EndpointName, GpusPerReplica,
    HfModelId, IdempotencyKey, InstanceGroupName, PollingSeconds, RedisUrl, ReplicaCount,
    RequestsPerReplica, SecretName, ServeCommand, ServedName, WorkerCount,
};

/// The namespace endpoints run in: the shared bucket's claim is there.
pub const NAMESPACE: &str = "default";
/// The label on an endpoint's Deployment, its pods and its Service: the endpoint's name.
pub const ENDPOINT_LABEL: &str = "hypd.dev/endpoint";
/// The prefix of the Secret a token given with a deploy is kept in (key `token`).
pub const TOKEN_SECRET: &str = "hypd-hf-token";

// The serving program a model server runs: vllm (`vllm serve <model> [flags]`), sglang
// (`python3 -m sglang.launch_server --model-path <model> [flags]`), or custom (any image
// and command serving OpenAI's chat completions API). Plain comments, not docs: the
// tools' descriptions say it once, and the schema lists the names only.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Engine {
    Vllm,
    Sglang,
    Custom,
}

impl Engine {
    pub fn as_str(self) -> &'static str {
        match self {
            Engine::Vllm => "vllm",
            Engine::Sglang => "sglang",
            Engine::Custom => "custom",
        }
    }

    /// The port the program listens on unless told `--port`.
    pub fn default_port(self) -> u16 {
        match self {
            Engine::Sglang => 30000,
            Engine::Vllm | Engine::Custom => 8000,
        }
    }

    /// The pinned image used unless the request names one.
    pub fn default_image(self) -> Option<&'static str> {
        match self {
            Engine::Vllm => Some("vllm/vllm-openai:v0.11.0"),
            Engine::Sglang => Some("lmsysorg/sglang:v0.5.4"),
            Engine::Custom => None,
        }
    }

    /// The flags that set the model, its served name and tensor parallelism.
    fn flags(self) -> (&'static [&'static str], &'static [&'static str]) {
        match self {
            Engine::Vllm => (&["--model"], &["--tensor-parallel-size", "-tp"]),
            Engine::Sglang => (&["--model-path", "--model"], &["--tp-size", "--tp"]),
            Engine::Custom => (&["--model", "--model-path"], &[]),
        }
    }
}

// How the endpoint is reached: cluster_ip (an in-cluster Service, reached with
// invoke_endpoint through the API server), load_balancer (an internet-facing Network Load
// Balancer, its address reported when ready), model_pool (warm workers no Service
// reaches until assign_pool_workers binds some to one of the names they serve, by one
// label: no restart). Plain comments: deploy_model_server's description says it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ServiceShape {
    #[default]
    ClusterIp,
    LoadBalancer,
    ModelPool,
}

impl ServiceShape {
    pub fn as_str(self) -> &'static str {
        match self {
            ServiceShape::ClusterIp => "cluster_ip",
            ServiceShape::LoadBalancer => "load_balancer",
            ServiceShape::ModelPool => "model_pool",
        }
    }
}

/// Where the weights come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ModelSource {
    /// A directory the pod mounts: `/s3/...` (the shared bucket) or a storage's mount.
    Path(String),
    /// A Hugging Face repository the server downloads when it starts.
    Hub(HfModelId),
}

impl ModelSource {
    pub fn as_str(&self) -> &str {
        match self {
            ModelSource::Path(p) => p,
            ModelSource::Hub(id) => id.as_str(),
        }
    }
}

/// What a serve command says, once parsed against its engine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Serve {
    /// The words the container runs (hypd's additions included).
    pub words: Vec<String>,
    pub model: ModelSource,
    /// The name clients ask for (`--served-model-name`, else the model).
    pub served_name: String,
    /// Every name it answers for: `--served-model-name`'s (vLLM takes several), then
    /// the LoRA adapters' of `--lora-modules` (with `--enable-lora`).
    pub served_names: Vec<String>,
    pub port: u16,
    pub tensor_parallel: Option<u32>,
}

/// The value after `flag` (`--flag v` or `--flag=v`), the last one given.
fn flag_value(words: &[String], flags: &[&str]) -> Option<String> {
    let mut found = None;
    for (i, w) in words.iter().enumerate() {
        for f in flags {
            if w == f {
                found = words.get(i + 1).cloned().or(Some(String::new()));
            } else if let Some(v) = w.strip_prefix(f).and_then(|r| r.strip_prefix('=')) {
                found = Some(v.to_owned());
            }
        }
    }
    found
}

/// The adapters' names after `--lora-modules`: `name=path`, or vLLM's JSON form.
fn lora_names(words: &[String]) -> Vec<String> {
    let Some(i) = words.iter().position(|w| w == "--lora-modules") else {
        return Vec::new();
    };
    words[i + 1..]
        .iter()
        .take_while(|w| !w.starts_with("--"))
        .filter_map(|w| match serde_json::from_str::<serde_json::Value>(w) {
            Ok(v) => v["name"].as_str().map(str::to_owned),
            Err(_) => w.split_once('=').map(|(name, _)| name.to_owned()),
        })
        .collect()
}

/// A model that is a path must be one a pod can mount: absolute, no `..`.
fn model_source(model: &str) -> Result<ModelSource, String> {
    if model.starts_with('/') {
        let ok = model.len() <= 512
            && model.split('/').skip(1).all(|p| {
                !p.is_empty()
                    && p != "."
                    && p != ".."
                    && p.chars().all(|c| {
                        c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '+' | '=')
                    })
            });
        return if ok {
            Ok(ModelSource::Path(model.to_owned()))
        } else {
            Err(format!(
                "the model {model:?} is neither a directory pods mount (/s3/<key>, or under a storage's mount path; no '..') nor a Hugging Face id"
            ))
        };
    }
    HfModelId::parse(model).map(ModelSource::Hub).map_err(|_| {
        format!(
            "the model {model:?} is neither a directory pods mount (/s3/<key>) nor a Hugging Face id (<organisation>/<name>)"
        )
    })
}

/// `command` parsed as `engine` runs it, with what hypd adds (SGLang listens on every
/// address only when told to). The errors say what the engine expects.
pub fn parse_serve(engine: Engine, command: &ServeCommand) -> Result<Serve, String> {
    let mut words = command.words();
    let shown = |w: &[String]| w.iter().take(3).cloned().collect::<Vec<_>>().join(" ");
    let (model_flags, tp_flags) = engine.flags();
    let positional = match engine {
        Engine::Vllm => {
            if words.len() < 2 || words[0] != "vllm" || words[1] != "serve" {
                return Err(format!(
                    "a vllm server runs `vllm serve <model> [flags]` (got `{}`)",
                    shown(&words)
                ));
            }
            words.get(2).filter(|w| !w.starts_with('-')).cloned()
        }
        Engine::Sglang => {
            let python = matches!(
                words.first().map(String::as_str),
                Some("python" | "python3")
            );
            if !python
                || words.get(1).map(String::as_str) != Some("-m")
                || words.get(2).map(String::as_str) != Some("sglang.launch_server")
            {
                return Err(format!(
                    "an sglang server runs `python3 -m sglang.launch_server --model-path <model> [flags]` (got `{}`)",
                    shown(&words)
                ));
            }
            None
        }
        Engine::Custom => None,
    };
    let model = positional.or_else(|| flag_value(&words, model_flags).filter(|m| !m.is_empty()));
    let model = match (model, engine) {
        (Some(m), _) => model_source(&m)?,
        (None, Engine::Custom) => {
            return Err(
                "a custom server's command names its model with --model <model> (a /s3/... directory or a Hugging Face id), so clients know what to ask for"
                    .into(),
            );
        }
        (None, _) => {
            return Err(format!(
                "the command names no model: {}",
                if engine == Engine::Vllm {
                    "`vllm serve <model>`"
                } else {
                    "`--model-path <model>`"
                }
            ));
        }
    };
    let port = match flag_value(&words, &["--port"]) {
        None => engine.default_port(),
        Some(p) => p
            .parse::<u16>()
            .ok()
            .filter(|p| *p >= 1)
            .ok_or_else(|| format!("--port is a port number from 1 to 65535 (got {p:?})"))?,
    };
    if let Some(host) = flag_value(&words, &["--host"])
        && !matches!(host.as_str(), "0.0.0.0" | "::" | "[::]")
    {
        return Err(format!(
            "--host {host} would not be reachable through the Service: drop it (hypd listens on every address)"
        ));
    }
    let tensor_parallel = match flag_value(&words, tp_flags) {
        None => None,
        Some(tp) => Some(
            tp.parse::<u32>()
                .ok()
                .filter(|n| (1..=64).contains(n))
                .ok_or_else(|| {
                    format!("tensor parallelism is a number of GPUs from 1 to 64 (got {tp:?})")
                })?,
        ),
    };
    let served_name = flag_value(&words, &["--served-model-name"])
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| model.as_str().to_owned());
    let mut served_names: Vec<String> = match words.iter().position(|w| w == "--served-model-name")
    {
        Some(i) => words[i + 1..]
            .iter()
            .take_while(|w| !w.starts_with('-'))
            .cloned()
            .collect(),
        None => Vec::new(),
    };
    if served_names.is_empty() {
        served_names.push(served_name.clone());
    }
    if engine == Engine::Vllm && words.iter().any(|w| w == "--enable-lora") {
        served_names.extend(lora_names(&words));
    }
    if engine == Engine::Sglang && flag_value(&words, &["--host"]).is_none() {
        words.extend(["--host".to_owned(), "0.0.0.0".to_owned()]);
    }
    Ok(Serve {
        words,
        model,
        served_name,
        served_names,
        port,
        tensor_parallel,
    })
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeployModelServer {
    /// The cluster.
    pub name: ClusterName,
    pub endpoint: EndpointName,
    pub engine: Engine,
    /// One line, e.g. `vllm serve /s3/models/Qwen/Qwen2.5-0.5B --max-model-len 4096`.
    pub command: ServeCommand,
    // Default: the engine's pinned image; required for custom.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<ContainerImage>,
    #[serde(default = "one_gpu")]
    pub gpus_per_replica: GpusPerReplica,
    #[serde(default = "one_replica")]
    pub replicas: ReplicaCount,
    // Default: the cluster's one HyperPod group with GPUs (asked for when there are several).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_group: Option<InstanceGroupName>,
    #[serde(default)]
    pub service: ServiceShape,
    // For gated models: kept only as a Secret of this endpoint in the cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hf_token: Option<HfToken>,
    // A Secret of yours in default holding key `token`, instead of hf_token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hf_token_secret: Option<SecretName>,
    // SGLang only: the SGLang router in front of the replicas (the Service reaches it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub router: Option<SglangRouter>,
    // KEDA scales the replicas on the router's requests in flight (needs router).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoscaling: Option<Autoscaling>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<IdempotencyKey>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dry_run: bool,
}

fn one_gpu() -> GpusPerReplica {
    GpusPerReplica::new(1).expect("in range")
}

fn one_replica() -> ReplicaCount {
    ReplicaCount::new(1).expect("in range")
}

impl DeployModelServer {
    /// The serve command as the engine runs it.
    pub fn serve(&self) -> Result<Serve, String> {
        parse_serve(self.engine, &self.command)
    }

    /// The image the container runs.
    pub fn image(&self) -> Option<&str> {
        self.image
            .as_ref()
            .map(ContainerImage::as_str)
            .or(self.engine.default_image())
    }

    /// The rules that need nothing but the request, as field errors (every one broken).
    pub fn request_errors(&self) -> Vec<FieldError> {
        let mut errors = Vec::new();
        match self.serve() {
            Err(why) => errors.push(FieldError::new("command", why)),
            Ok(serve) => {
                if let Some(tp) = serve.tensor_parallel
                    && tp > self.gpus_per_replica.get()
                {
                    errors.push(FieldError::new(
                        "gpus_per_replica",
                        format!(
                            "the command shards the model over {tp} GPUs (tensor parallelism) but a replica has {}: give gpus_per_replica {tp}",
                            self.gpus_per_replica.get()
                        ),
                    ));
                }
            }
        }
        if self.service == ServiceShape::ModelPool
            && let Ok(serve) = self.serve()
            && let Some(bad) = serve
                .served_names
                .iter()
                .find(|n| ServedName::parse(n).is_err())
        {
            errors.push(FieldError::new(
                "command",
                format!(
                    "a pool's workers are bound to a model by a label and a Service named after it: give each name they serve (--served-model-name, --lora-modules) as 1-20 lowercase letters, digits and '-' (got {bad:?})"
                ),
            ));
        }
        if self.engine == Engine::Custom && self.image.is_none() {
            errors.push(FieldError::new(
                "image",
                "a custom server names its image (vllm and sglang have pinned ones)",
            ));
        }
        if self.hf_token.is_some() && self.hf_token_secret.is_some() {
            errors.push(FieldError::new(
                "hf_token_secret",
                "give a token or the Secret that holds one, not both",
            ));
        }
        if let Some(router) = &self.router {
            if self.engine != Engine::Sglang {
                errors.push(FieldError::new(
                    "router",
                    format!(
                        "the SGLang router fronts SGLang workers (engine is {}): deploy_inference_endpoint routes vLLM workers",
                        self.engine.as_str()
                    ),
                ));
            }
            if self.service == ServiceShape::ModelPool {
                errors.push(FieldError::new(
                    "router",
                    "a router fronts one endpoint's workers, and a pool's are bound to models by assign_pool_workers: use cluster_ip or load_balancer",
                ));
            }
            errors.extend(router.errors());
        }
        if let Some(scaling) = &self.autoscaling {
            if self.router.is_none() {
                errors.push(FieldError::new(
                    "autoscaling",
                    "KEDA scales the replicas on the SGLang router's requests in flight: give router too",
                ));
            }
            errors.extend(scaling.errors(self.replicas));
        }
        errors
    }
}

// How the SGLang router picks a worker: cache_aware (the one already holding the prompt's
// prefix, unless the load is imbalanced), round_robin, random, power_of_two (the less
// loaded of two). Plain comments: the schema lists the names only.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RouterPolicy {
    #[default]
    CacheAware,
    RoundRobin,
    Random,
    PowerOfTwo,
}

impl RouterPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            RouterPolicy::CacheAware => "cache_aware",
            RouterPolicy::RoundRobin => "round_robin",
            RouterPolicy::Random => "random",
            RouterPolicy::PowerOfTwo => "power_of_two",
        }
    }
}

// The SGLang router (SGLang Model Gateway) in front of an endpoint's workers, which it
// finds by label. Plain comments: deploy_model_server's description says it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SglangRouter {
    #[serde(default)]
    pub policy: RouterPolicy,
    // cache_aware only; unset, the gateway's defaults (see CacheAware::DEFAULT).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_threshold: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub balance_abs_threshold: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub balance_rel_threshold: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eviction_interval_seconds: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tree_size: Option<u64>,
}

/// The cache-aware policy's thresholds as the router runs them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CacheAware {
    /// The share of a prompt a worker's prefix tree must hold for the prompt to go there.
    pub cache_threshold: f64,
    /// Load differences (requests in flight) below which the cache decides alone...
    pub balance_abs_threshold: u32,
    /// ...and the busiest-to-idlest ratio below which it does.
    pub balance_rel_threshold: f64,
    pub eviction_interval_seconds: u32,
    pub max_tree_size: u64,
}

impl CacheAware {
    /// The SGLang Model Gateway's own defaults (newer and more load-tolerant than the
    /// first router's 0.5 / 32 / 1.0001 / 60 s / 2^24).
    pub const DEFAULT: CacheAware = CacheAware {
        cache_threshold: 0.3,
        balance_abs_threshold: 64,
        balance_rel_threshold: 1.5,
        eviction_interval_seconds: 120,
        max_tree_size: 1 << 26,
    };
}

impl SglangRouter {
    /// The cache-aware thresholds, defaults filled in; `None` for another policy.
    pub fn cache_aware(&self) -> Option<CacheAware> {
        let d = CacheAware::DEFAULT;
        (self.policy == RouterPolicy::CacheAware).then(|| CacheAware {
            cache_threshold: self.cache_threshold.unwrap_or(d.cache_threshold),
            balance_abs_threshold: self
                .balance_abs_threshold
                .unwrap_or(d.balance_abs_threshold),
            balance_rel_threshold: self
                .balance_rel_threshold
                .unwrap_or(d.balance_rel_threshold),
            eviction_interval_seconds: self
                .eviction_interval_seconds
                .unwrap_or(d.eviction_interval_seconds),
            max_tree_size: self.max_tree_size.unwrap_or(d.max_tree_size),
        })
    }

    fn errors(&self) -> Vec<FieldError> {
        let mut errors = Vec::new();
        let given = [
            ("cache_threshold", self.cache_threshold.is_some()),
            (
                "balance_abs_threshold",
                self.balance_abs_threshold.is_some(),
            ),
            (
                "balance_rel_threshold",
                self.balance_rel_threshold.is_some(),
            ),
            (
                "eviction_interval_seconds",
                self.eviction_interval_seconds.is_some(),
            ),
            ("max_tree_size", self.max_tree_size.is_some()),
        ];
        if self.policy != RouterPolicy::CacheAware {
            for (field, _) in given.iter().filter(|(_, g)| *g) {
                errors.push(FieldError::new(
                    format!("router.{field}"),
                    format!(
                        "only the cache_aware policy uses it (policy is {})",
                        self.policy.as_str()
                    ),
                ));
            }
            return errors;
        }
        if let Some(t) = self.cache_threshold
            && !(0.0..=1.0).contains(&t)
        {
            errors.push(FieldError::new(
                "router.cache_threshold",
                format!("the share of a prompt already cached on a worker: from 0 to 1 (got {t})"),
            ));
        }
        if let Some(r) = self.balance_rel_threshold
            && !(r >= 1.0 && r.is_finite())
        {
            errors.push(FieldError::new(
                "router.balance_rel_threshold",
                format!("the busiest worker's load over the idlest's: at least 1 (got {r})"),
            ));
        }
        if self.eviction_interval_seconds == Some(0) {
            errors.push(FieldError::new(
                "router.eviction_interval_seconds",
                "at least 1 second",
            ));
        }
        if self.max_tree_size == Some(0) {
            errors.push(FieldError::new("router.max_tree_size", "at least 1 node"));
        }
        errors
    }
}

// KEDA scales the workers between min and max replicas on the requests in flight at the
// router: ceil(in flight / target_requests_per_replica), at once on the way up, after
// cooldown_seconds without load on the way down. min_replicas 0 scales to zero: the
// router then holds a request while KEDA wakes a worker, and the cooldown must be at
// least the endpoint's measured cold start. Plain comments: the tool's description says
// it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Autoscaling {
    #[serde(default = "one_replica")]
    pub min_replicas: ReplicaCount,
    pub max_replicas: ReplicaCount,
    #[serde(default = "four_requests")]
    pub target_requests_per_replica: RequestsPerReplica,
    // In flight above this wakes the scaler (KEDA's activation threshold).
    #[serde(default)]
    pub activation_requests: u32,
    #[serde(default = "fifteen_seconds")]
    pub polling_interval_seconds: PollingSeconds,
    #[serde(default = "five_minutes")]
    pub cooldown_seconds: CooldownSeconds,
    // A second signal beside requests in flight; KEDA follows whichever asks for more.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_rate: Option<RequestRate>,
}

// Requests a second through the router, over the last window_seconds, from a Prometheus
// server hypd runs beside it: ceil(rate / target_per_replica) replicas.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RequestRate {
    pub target_per_replica: f64,
    #[serde(default)]
    pub activation: f64,
    #[serde(default = "one_minute")]
    pub window_seconds: u32,
}

impl RequestRate {
    /// How often the Prometheus server beside the router scrapes it: a rate needs at
    /// least four samples in its window to follow the load rather than the scrape.
    pub const SCRAPE_SECONDS: u32 = 15;
    const WINDOWS: std::ops::RangeInclusive<u32> = 60..=900;
    const TARGETS: std::ops::RangeInclusive<f64> = 0.01..=10_000.0;

    fn errors(&self) -> Vec<FieldError> {
        let mut errors = Vec::new();
        let t = self.target_per_replica;
        if !Self::TARGETS.contains(&t) {
            errors.push(FieldError::new(
                "autoscaling.request_rate.target_per_replica",
                format!(
                    "requests a second a replica takes, from {} to {} (got {t})",
                    Self::TARGETS.start(),
                    Self::TARGETS.end()
                ),
            ));
        }
        let a = self.activation;
        if !(a.is_finite() && a >= 0.0) {
            errors.push(FieldError::new(
                "autoscaling.request_rate.activation",
                format!("requests a second that wake the scaler, 0 or more (got {a})"),
            ));
        }
        let w = self.window_seconds;
        if !Self::WINDOWS.contains(&w) {
            errors.push(FieldError::new(
                "autoscaling.request_rate.window_seconds",
                format!(
                    "from {} to {} s: the router is scraped every {} s and a rate needs four samples (got {w})",
                    Self::WINDOWS.start(),
                    Self::WINDOWS.end(),
                    Self::SCRAPE_SECONDS
                ),
            ));
        }
        errors
    }
}

fn one_minute() -> u32 {
    60
}

fn four_requests() -> RequestsPerReplica {
    RequestsPerReplica::new(4).expect("in range")
}

fn fifteen_seconds() -> PollingSeconds {
    PollingSeconds::new(15).expect("in range")
}

fn five_minutes() -> CooldownSeconds {
    CooldownSeconds::new(300).expect("in range")
}

impl Autoscaling {
    fn errors(&self, replicas: ReplicaCount) -> Vec<FieldError> {
        let mut errors = Vec::new();
        let (min, max) = (self.min_replicas.get(), self.max_replicas.get());
        if max == 0 {
            errors.push(FieldError::new(
                "autoscaling.max_replicas",
                "at least 1: an endpoint KEDA may never wake serves nothing",
            ));
        } else if max < min {
            errors.push(FieldError::new(
                "autoscaling.max_replicas",
                format!("at least min_replicas ({min}) (got {max})"),
            ));
        } else if !(min.max(1)..=max).contains(&replicas.get()) {
            errors.push(FieldError::new(
                "replicas",
                format!(
                    "an autoscaled endpoint starts within its bounds, and with at least one replica, on which its cold start is measured: from {} to {max} (got {})",
                    min.max(1),
                    replicas.get()
                ),
            ));
        }
        errors.extend(self.request_rate.iter().flat_map(RequestRate::errors));
        errors
    }
}

impl Command for DeployModelServer {
    type Output = Gated<OperationRef>;
    const SPEC: CommandSpec = CommandSpec {
        name: "deploy_model_server",
        summary: "Deploy a vLLM, SGLang or custom model server behind a Service",
        description: "Serves a model with vLLM, SGLang or a custom image on a HyperPod group. service: cluster_ip (call it with invoke_endpoint), load_balancer (internet-facing NLB) or model_pool (warm workers for assign_pool_workers). SGLang can add `router` and KEDA `autoscaling`. Ask the user for the model, GPUs and replicas. Returns an operation for wait_operation; dry_run returns the plan.",
        effect: Effect::Mutating,
        role: Role::Operator,
        idempotent: true,
        status_command: Some("get_operation"),
        method: HttpMethod::Post,
        path: "/api/v1/clusters/{name}/endpoints",
    };

    super::command::dry_run_request!();

    fn validate(&self) -> Result<(), ApiError> {
        let errors = self.request_errors();
        ApiError::unless_broken(errors)
    }

    /// The token, and the Secret's name (a token pasted there by mistake), are blanked.
    fn redact(request: &mut serde_json::Value) {
        super::models::redact_tokens(request);
    }
}

// How the inference operator's router picks a replica: prefix_aware (the replica already
// holding the prompt's prefix in its KV cache), kv_aware (the one whose KV cache holds
// most of the request), session (a session's requests stay on one replica), round_robin.
// Plain comments, not docs: the tool's schema lists the names only.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RoutingStrategy {
    PrefixAware,
    KvAware,
    Session,
    RoundRobin,
}

impl RoutingStrategy {
    /// The operator's name for it (`intelligentRoutingSpec.routingStrategy`).
    pub fn operator_name(self) -> &'static str {
        match self {
            RoutingStrategy::PrefixAware => "prefixaware",
            RoutingStrategy::KvAware => "kvaware",
            RoutingStrategy::Session => "session",
            RoutingStrategy::RoundRobin => "roundrobin",
        }
    }

    /// The strategy of the operator's name, as its status or spec holds it.
    pub fn from_operator(name: &str) -> Option<Self> {
        [
            RoutingStrategy::PrefixAware,
            RoutingStrategy::KvAware,
            RoutingStrategy::Session,
            RoutingStrategy::RoundRobin,
        ]
        .into_iter()
        .find(|s| s.operator_name().eq_ignore_ascii_case(name))
    }

    pub fn as_str(self) -> &'static str {
        match self {
            RoutingStrategy::PrefixAware => "prefix_aware",
            RoutingStrategy::KvAware => "kv_aware",
            RoutingStrategy::Session => "session",
            RoutingStrategy::RoundRobin => "round_robin",
        }
    }
}

// The tiers the workers' KV cache is offloaded to.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct KvCache {
    /// L1: the node's CPU memory (default true).
    #[serde(default = "yes")]
    pub cpu_offload: bool,
    /// L2, shared by the replicas: tiered_storage or redis (with url).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub l2: Option<L2Cache>,
}

fn yes() -> bool {
    true
}

// The second tier of the KV cache: HyperPod's managed tiered storage on the cluster's
// nodes, or a Redis reachable from the cluster.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "backend", rename_all = "snake_case", deny_unknown_fields)]
pub enum L2Cache {
    TieredStorage,
    Redis { url: RedisUrl },
}

impl KvCache {
    /// `l1_cpu`, `l1_cpu+redis`, `tiered_storage`...: what list_endpoints shows.
    pub fn describe(&self) -> String {
        let l2 = self.l2.as_ref().map(|l| match l {
            L2Cache::TieredStorage => "tiered_storage",
            L2Cache::Redis { .. } => "redis",
        });
        match (self.cpu_offload, l2) {
            (true, Some(l2)) => format!("l1_cpu+{l2}"),
            (true, None) => "l1_cpu".into(),
            (false, Some(l2)) => l2.into(),
            (false, None) => "off".into(),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeployInferenceEndpoint {
    /// The cluster.
    pub name: ClusterName,
    pub endpoint: EndpointName,
    pub engine: Engine,
    /// One line, as deploy_model_server takes it.
    pub command: ServeCommand,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<ContainerImage>,
    #[serde(default = "one_gpu")]
    pub gpus_per_replica: GpusPerReplica,
    #[serde(default = "one_replica")]
    pub replicas: ReplicaCount,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_group: Option<InstanceGroupName>,
    // vLLM only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_cache: Option<KvCache>,
    // vLLM only: the operator's router in front of the replicas.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routing: Option<RoutingStrategy>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hf_token: Option<HfToken>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hf_token_secret: Option<SecretName>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<IdempotencyKey>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dry_run: bool,
}

impl DeployInferenceEndpoint {
    /// The same server as deploy_model_server would run it: the rules both share (the
    /// serve command, the image, GPUs, the token, the group) are checked there, once.
    pub fn as_model_server(&self) -> DeployModelServer {
        DeployModelServer {
            name: self.name.clone(),
            endpoint: self.endpoint.clone(),
            engine: self.engine,
            command: self.command.clone(),
            image: self.image.clone(),
            gpus_per_replica: self.gpus_per_replica,
            replicas: self.replicas,
            instance_group: self.instance_group.clone(),
            service: ServiceShape::ClusterIp,
            hf_token: self.hf_token.clone(),
            hf_token_secret: self.hf_token_secret.clone(),
            router: None,
            autoscaling: None,
            idempotency_key: None,
            dry_run: self.dry_run,
        }
    }

    pub fn request_errors(&self) -> Vec<FieldError> {
        let mut errors = self.as_model_server().request_errors();
        errors.extend(operator_option_errors(
            self.kv_cache.as_ref(),
            self.routing,
            (self.engine != Engine::Vllm).then(|| {
                (
                    format!("engine is {}", self.engine.as_str()),
                    "serve with vllm",
                )
            }),
        ));
        errors
    }
}

/// The rules of the inference operator's own options, which an InferenceEndpointConfig
/// and a JumpStartModel take alike: both work with vLLM workers only (`not_vllm` says
/// what the worker is instead, and what the user can do about it), and a cache needs a
/// tier.
pub fn operator_option_errors(
    kv_cache: Option<&KvCache>,
    routing: Option<RoutingStrategy>,
    not_vllm: Option<(String, &str)>,
) -> Vec<FieldError> {
    let mut errors = Vec::new();
    if let Some((what, instead)) = &not_vllm {
        if kv_cache.is_some() {
            errors.push(FieldError::new(
                "kv_cache",
                format!("the inference operator offers KV cache tiers with vLLM workers only ({what}): drop kv_cache, or {instead}"),
            ));
        }
        if routing.is_some() {
            errors.push(FieldError::new(
                "routing",
                format!("the inference operator's intelligent routing works with vLLM workers only ({what}): drop routing, or {instead}"),
            ));
        }
    }
    if let Some(kv) = kv_cache
        && !kv.cpu_offload
        && kv.l2.is_none()
    {
        errors.push(FieldError::new(
            "kv_cache",
            "a KV cache with neither tier offloads nothing: set cpu_offload, give l2, or drop kv_cache",
        ));
    }
    errors
}

impl Command for DeployInferenceEndpoint {
    type Output = Gated<OperationRef>;
    const SPEC: CommandSpec = CommandSpec {
        name: "deploy_inference_endpoint",
        summary: "Deploy a model through the HyperPod inference operator",
        description: "Deploys a model through the HyperPod inference operator (update_features inference_operator): deploy_model_server's serve command plus KV cache tiers and routing (vLLM only). Ask for the model, GPUs, replicas, cache and routing. Returns an operation for wait_operation; dry_run returns the plan.",
        effect: Effect::Mutating,
        role: Role::Operator,
        idempotent: true,
        status_command: Some("get_operation"),
        method: HttpMethod::Post,
        path: "/api/v1/clusters/{name}/inference-endpoints",
    };

    super::command::dry_run_request!();

    fn validate(&self) -> Result<(), ApiError> {
        let errors = self.request_errors();
        ApiError::unless_broken(errors)
    }

    fn redact(request: &mut serde_json::Value) {
        super::models::redact_tokens(request);
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListEndpoints {
    /// Only this cluster's (default: every cluster's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<ClusterName>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct EndpointList {
    pub endpoints: Vec<EndpointSummary>,
    /// Clusters that could not be read, and why (the others are listed).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unreadable: Vec<UnreadableCluster>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct UnreadableCluster {
    pub name: String,
    pub error: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct EndpointSummary {
    /// The cluster.
    pub name: String,
    pub endpoint: String,
    /// `model_server` (deploy_model_server) or `inference_endpoint` (the operator's).
    pub kind: String,
    /// `vllm`, `sglang` or `custom`.
    pub engine: String,
    /// The name clients ask for.
    pub model: String,
    /// `cluster_ip` or `load_balancer`.
    pub service: String,
    /// `deploying`, `scaling`, `in_service`, `scaled_to_zero` or `failed`.
    pub phase: String,
    pub replicas: u32,
    pub ready: u32,
    /// The load balancer's DNS name once it has one.
    pub address: Option<String>,
    /// The slowest replica's start, pod scheduled → ready, in seconds.
    pub cold_start_seconds: Option<f64>,
    pub created_at: Option<String>,
    /// The router's strategy: the operator's, or the SGLang router's policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routing: Option<String>,
    /// KEDA's sizing of the replicas, on an autoscaled endpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoscaling: Option<AutoscalingState>,
    /// The KV cache tiers (inference endpoints), e.g. `l1_cpu+redis`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_cache: Option<String>,
    /// A model pool's workers: those bound to each model, and those free.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<PoolWorkers>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PoolWorkers {
    /// Every name the workers serve, each with the workers bound to it.
    pub models: Vec<PoolModel>,
    pub unassigned: u32,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PoolModel {
    pub model: String,
    pub workers: u32,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GetEndpoint {
    /// The cluster.
    pub name: ClusterName,
    pub endpoint: EndpointName,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Endpoint {
    #[serde(flatten)]
    pub summary: EndpointSummary,
    pub image: String,
    pub command: Vec<String>,
    pub port: u16,
    pub gpus_per_replica: u32,
    pub instance_group: Option<String>,
    /// The Secret the server reads its Hugging Face token from (its name only).
    pub hf_token_secret: Option<String>,
    /// Why it is not serving, when something holds it back (a pod's waiting reason).
    pub waiting: Option<String>,
    pub pods: Vec<EndpointPod>,
    /// The replica counts the autoscaler set, oldest first (as long as the cluster keeps
    /// its events, an hour on EKS).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub replica_history: Vec<ReplicaChange>,
}

/// An autoscaled endpoint's bounds and what KEDA says of it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct AutoscalingState {
    pub min_replicas: u32,
    pub max_replicas: u32,
    pub target_requests_per_replica: u32,
    pub cooldown_seconds: u32,
    /// Requests a second a replica takes, when the request rate is a signal too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_rate_per_replica: Option<f64>,
    /// Whether the router's load is above the activation threshold (KEDA's `Active`).
    pub active: Option<bool>,
    /// Why KEDA cannot scale it, when it says so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
}

/// One change of an autoscaled endpoint's replica count.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ReplicaChange {
    /// RFC 3339.
    pub at: String,
    pub replicas: u32,
    /// The autoscaler's reason, e.g. "All metrics below target".
    pub reason: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct EndpointPod {
    pub pod: String,
    pub uid: String,
    pub phase: String,
    pub ready: bool,
    pub node: Option<String>,
    /// Pod scheduled → ready, in seconds, once ready.
    pub cold_start_seconds: Option<f64>,
    pub restarts: u32,
    /// The model a pool's worker is bound to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serves: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ScaleEndpoint {
    /// The cluster.
    pub name: ClusterName,
    pub endpoint: EndpointName,
    pub replicas: ReplicaCount,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<IdempotencyKey>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dry_run: bool,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeleteEndpoint {
    /// The cluster.
    pub name: ClusterName,
    pub endpoint: EndpointName,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<IdempotencyKey>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dry_run: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confirmation: Option<Confirmation>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AssignPoolWorkers {
    /// The cluster.
    pub name: ClusterName,
    /// The model pool (a deploy_model_server endpoint of service model_pool).
    pub pool: EndpointName,
    /// One of the names its workers serve.
    pub model: ServedName,
    pub count: WorkerCount,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<IdempotencyKey>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dry_run: bool,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReleasePoolWorkers {
    /// The cluster.
    pub name: ClusterName,
    pub pool: EndpointName,
    pub model: ServedName,
    // Default: every worker bound to the model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<WorkerCount>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<IdempotencyKey>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dry_run: bool,
}

impl Command for AssignPoolWorkers {
    type Output = Gated<OperationRef>;
    const SPEC: CommandSpec = CommandSpec {
        name: "assign_pool_workers",
        summary: "Bind free workers of a model pool to one of its models",
        description: "Binds free workers of a model_pool endpoint to one of its models, without restart. Ask the user which model and how many. Returns an operation for wait_operation; dry_run returns the plan.",
        effect: Effect::Mutating,
        role: Role::Operator,
        idempotent: true,
        status_command: Some("get_operation"),
        method: HttpMethod::Post,
        path: "/api/v1/clusters/{name}/endpoints/{pool}/assign",
    };

    super::command::dry_run_request!();
}

impl Command for ReleasePoolWorkers {
    type Output = Gated<OperationRef>;
    const SPEC: CommandSpec = CommandSpec {
        name: "release_pool_workers",
        summary: "Return a model's workers to its pool",
        description: "Unbinds workers from a model; they stay warm for assign_pool_workers. Returns an operation for wait_operation; dry_run returns the plan.",
        effect: Effect::Mutating,
        role: Role::Operator,
        idempotent: true,
        status_command: Some("get_operation"),
        method: HttpMethod::Post,
        path: "/api/v1/clusters/{name}/endpoints/{pool}/release",
    };

    super::command::dry_run_request!();
}

/// Most messages in one invocation, and the longest one.
pub const MAX_MESSAGES: usize = 64;
pub const MAX_MESSAGE_CHARS: usize = 32_768;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ChatMessage {
    /// `system`, `user` or `assistant`.
    pub role: ChatRole,
    pub content: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ChatRole {
    System,
    User,
    Assistant,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct InvokeEndpoint {
    /// The cluster.
    pub name: ClusterName,
    pub endpoint: EndpointName,
    pub messages: Vec<ChatMessage>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 8192))]
    pub max_tokens: Option<u32>,
    /// A model pool's model (required for a pool).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<ServedName>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Invocation {
    pub endpoint: String,
    /// The model that answered, as the server names it.
    pub model: String,
    pub answer: String,
    /// `stop`, or `length` when max_tokens cut it.
    pub finish_reason: Option<String>,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    /// From hypd sending the request to the answer read, in milliseconds.
    pub latency_ms: u64,
}

impl InvokeEndpoint {
    pub fn request_errors(&self) -> Vec<FieldError> {
        let mut errors = Vec::new();
        if self.messages.is_empty() || self.messages.len() > MAX_MESSAGES {
            errors.push(FieldError::new(
                "messages",
                format!("1 to {MAX_MESSAGES} messages (got {})", self.messages.len()),
            ));
        }
        for (i, m) in self.messages.iter().enumerate() {
            if m.content.chars().count() > MAX_MESSAGE_CHARS {
                errors.push(FieldError::new(
                    format!("messages[{i}].content"),
                    format!("at most {MAX_MESSAGE_CHARS} characters"),
                ));
            }
        }
        if self
            .messages
            .last()
            .is_some_and(|m| m.role != ChatRole::User)
        {
            errors.push(FieldError::new(
                format!("messages[{}].role", self.messages.len() - 1),
                "the last message is the user's: it is what the model answers",
            ));
        }
        if let Some(n) = self.max_tokens
            && !(1..=8192).contains(&n)
        {
            errors.push(FieldError::new(
                "max_tokens",
                format!("max_tokens is from 1 to 8192 (got {n})"),
            ));
        }
        errors
    }
}

impl Command for ListEndpoints {
    type Output = EndpointList;
    const SPEC: CommandSpec = CommandSpec {
        name: "list_endpoints",
        summary: "List model endpoints of one cluster or all",
        description: "Every model endpoint with its engine, model, ready replicas, phase and address.",
        effect: Effect::ReadOnly,
        role: Role::Viewer,
        idempotent: true,
        status_command: None,
        method: HttpMethod::Get,
        path: "/api/v1/endpoints",
    };
}

impl Command for GetEndpoint {
    type Output = Endpoint;
    const SPEC: CommandSpec = CommandSpec {
        name: "get_endpoint",
        summary: "One model endpoint with its pods",
        description: "One endpoint in detail: image, command, GPUs, why it waits and each pod's readiness.",
        effect: Effect::ReadOnly,
        role: Role::Viewer,
        idempotent: true,
        status_command: None,
        method: HttpMethod::Get,
        path: "/api/v1/clusters/{name}/endpoints/{endpoint}",
    };
}

impl Command for ScaleEndpoint {
    type Output = Gated<OperationRef>;
    const SPEC: CommandSpec = CommandSpec {
        name: "scale_endpoint",
        summary: "Change a model endpoint's replicas",
        description: "Sets an endpoint's replicas (0 scales to zero) and waits until they are ready. Returns an operation for wait_operation; dry_run returns the plan.",
        effect: Effect::Mutating,
        role: Role::Operator,
        idempotent: true,
        status_command: Some("get_operation"),
        method: HttpMethod::Post,
        path: "/api/v1/clusters/{name}/endpoints/{endpoint}/scale",
    };

    super::command::dry_run_request!();
}

impl Command for DeleteEndpoint {
    type Output = Gated<OperationRef>;
    const SPEC: CommandSpec = CommandSpec {
        name: "delete_endpoint",
        summary: "Delete a model endpoint",
        description: "Deletes an endpoint and waits until its pods are gone. The first call returns the plan and a confirmation; call again with it once the user agrees. Returns an operation for wait_operation.",
        effect: Effect::Destructive,
        role: Role::Operator,
        idempotent: true,
        status_command: Some("get_operation"),
        method: HttpMethod::Delete,
        path: "/api/v1/clusters/{name}/endpoints/{endpoint}",
    };

    super::command::gated_request!();
}

impl Command for InvokeEndpoint {
    type Output = Invocation;
    const SPEC: CommandSpec = CommandSpec {
        name: "invoke_endpoint",
        summary: "Send a chat completion to a model endpoint",
        description: "Sends OpenAI-style messages to an endpoint through the cluster's API server (no public address needed); while it wakes, retry after Retry-After.",
        effect: Effect::ReadOnly,
        role: Role::Operator,
        idempotent: false,
        status_command: None,
        method: HttpMethod::Post,
        path: "/api/v1/clusters/{name}/endpoints/{endpoint}/invoke",
    };

    fn validate(&self) -> Result<(), ApiError> {
        let errors = self.request_errors();
        ApiError::unless_broken(errors)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn deploy(extra: serde_json::Value) -> DeployModelServer {
        let mut body = json!({"name": "ml-1", "endpoint": "qwen", "engine": "vllm",
            "command": "vllm serve /s3/models/Qwen/Qwen2.5-0.5B --served-model-name qwen"});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        serde_json::from_value(body).unwrap()
    }

    fn fields(r: &DeployModelServer) -> Vec<String> {
        r.request_errors().into_iter().map(|e| e.field).collect()
    }

    #[test]
    fn a_vllm_line_gives_its_model_name_port_and_parallelism() {
        let r = deploy(json!({}));
        let s = r.serve().unwrap();
        assert_eq!(
            s.model,
            ModelSource::Path("/s3/models/Qwen/Qwen2.5-0.5B".into())
        );
        assert_eq!(s.served_name, "qwen");
        assert_eq!(s.port, 8000);
        assert_eq!(r.image(), Some("vllm/vllm-openai:v0.11.0"));
        assert!(r.request_errors().is_empty());
        let r = deploy(
            json!({"command": "vllm serve Qwen/Qwen2.5-7B --port=9000 -tp 2", "gpus_per_replica": 2}),
        );
        let s = r.serve().unwrap();
        assert_eq!(
            s.model,
            ModelSource::Hub(HfModelId::parse("Qwen/Qwen2.5-7B").unwrap())
        );
        assert_eq!((s.port, s.tensor_parallel), (9000, Some(2)));
        assert_eq!(s.served_name, "Qwen/Qwen2.5-7B");
        // Quoted words stay one word.
        let r = deploy(json!({"command": "vllm serve /s3/m --chat-template '{{ x }} y'"}));
        assert!(r.serve().unwrap().words.contains(&"{{ x }} y".to_owned()));
    }

    #[test]
    fn sglang_listens_on_every_address_and_takes_its_own_flags() {
        let r = deploy(json!({"engine": "sglang",
            "command": "python3 -m sglang.launch_server --model-path /s3/models/m --tp 2", "gpus_per_replica": 2}));
        let s = r.serve().unwrap();
        assert_eq!((s.port, s.tensor_parallel), (30000, Some(2)));
        assert_eq!(&s.words[s.words.len() - 2..], ["--host", "0.0.0.0"]);
        assert_eq!(r.image(), Some("lmsysorg/sglang:v0.5.4"));
    }

    #[test]
    fn bad_lines_are_refused_at_the_field_that_is_wrong() {
        let unparsable: Result<DeployModelServer, _> =
            serde_json::from_value(json!({"name": "ml-1",
            "endpoint": "q", "engine": "vllm", "command": "vllm serve '/s3/m"}));
        assert!(unparsable.unwrap_err().to_string().contains("never closed"));
        for (extra, field, says) in [
            (
                json!({"command": "python3 serve.py"}),
                "command",
                "vllm serve <model>",
            ),
            (
                json!({"command": "vllm serve --port 8000"}),
                "command",
                "names no model",
            ),
            (
                json!({"command": "vllm serve /s3/m --port http"}),
                "command",
                "port number",
            ),
            (
                json!({"command": "vllm serve /s3/../etc"}),
                "command",
                "neither",
            ),
            (
                json!({"command": "vllm serve /s3/m --host 127.0.0.1"}),
                "command",
                "reachable",
            ),
            (
                json!({"command": "vllm serve /s3/m -tp 4"}),
                "gpus_per_replica",
                "4 GPUs",
            ),
            (
                json!({"engine": "sglang"}),
                "command",
                "sglang.launch_server",
            ),
            (
                json!({"engine": "custom", "command": "serve --model /s3/m"}),
                "image",
                "names its image",
            ),
        ] {
            let r = deploy(extra.clone());
            let errors = r.request_errors();
            let e = errors
                .iter()
                .find(|e| e.field == field)
                .unwrap_or_else(|| panic!("{extra}: {errors:?}"));
            assert!(e.message.contains(says), "{extra}: {}", e.message);
        }
        assert_eq!(
            fields(&deploy(
                json!({"engine": "custom", "image": "example.com/srv:1", "command": "serve --model /s3/m"})
            )),
            Vec::<String>::new()
        );
    }

    #[test]
    fn an_invocation_ends_with_the_users_message() {
        let r: InvokeEndpoint = serde_json::from_value(json!({"name": "ml-1", "endpoint": "q",
            "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yes"}]}))
        .unwrap();
        assert_eq!(r.request_errors()[0].field, "messages[1].role");
        let r: InvokeEndpoint = serde_json::from_value(json!({"name": "ml-1", "endpoint": "q",
            "messages": [], "max_tokens": 0}))
        .unwrap();
        let fields: Vec<_> = r.request_errors().into_iter().map(|e| e.field).collect();
        assert_eq!(fields, ["messages", "max_tokens"]);
    }
}
