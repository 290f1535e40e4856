//! What a pod answers over HTTP when the service proxy reaches it. A pod whose first
//! container starts vLLM or SGLang serves their OpenAI-compatible API (health, models,
//! chat and text completions, Prometheus metrics; vLLM also SageMaker's `/invocations`,
//! SGLang its native `/generate`)
//! with completions that are a function of the served model and the prompt, so tests can
//! assert on them; any other pod is a plain server that knows no path. A completion takes
//! its decode time on the sim's clock, [`DECODE_SECS_PER_TOKEN`] per generated token,
//! which the answer carries as when each part of its body is due ([`Answer::due`]) for
//! the proxy to wait out, so that load builds up as it does on real servers. The sim runs
//! no process: what a pod serves follows from its command line alone, and what it has
//! served and has in flight is counted beside the store ([`Serving`]), never on the pod,
//! so that answering a request writes no object.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};

use axum::http::{Method, StatusCode};
use serde_json::{Value, json};

use super::prometheus;
use super::sglang_router;
use super::store::{Store, meta};
use crate::world::fnv1a;

/// The context length a server reports when its command line sets none.
pub const DEFAULT_MAX_MODEL_LEN: u64 = 4096;
/// Sim seconds a server takes per token it generates (about 50 tokens a second for one
/// request, a mid-sized model on one GPU).
pub const DECODE_SECS_PER_TOKEN: f64 = 0.02;
/// What SGLang's `/generate` generates when its sampling parameters set no
/// `max_new_tokens`.
const SGLANG_MAX_NEW_TOKENS: u64 = 128;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Engine {
    Vllm,
    Sglang,
}

impl Engine {
    fn name(self) -> &'static str {
        match self {
            Self::Vllm => "vllm",
            Self::Sglang => "sglang",
        }
    }
}

/// A model server as its command line starts it.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelServer {
    pub engine: Engine,
    /// The model as given: a path or a Hugging Face id.
    pub model: String,
    /// The names requests may ask for (`--served-model-name`, else the model), the
    /// first being the one it goes by.
    pub names: Vec<String>,
    pub port: u16,
    pub max_model_len: u64,
}

/// The model server `pod`'s first container starts, if it starts one (see [`commands`]).
pub fn of(pod: &Value) -> Option<ModelServer> {
    commands(pod).iter().find_map(|c| server(c))
}

/// The simple commands `pod`'s first container runs: its `command` and `args` as the
/// container runtime joins them (no `command`: the image's [`entrypoint`]), and through
/// `sh -c LINE` (or bash) the commands of LINE as the shell would split it.
pub(super) fn commands(pod: &Value) -> Vec<Vec<String>> {
    let container = &pod["spec"]["containers"][0];
    let words = |k: &str| -> Vec<String> {
        container[k]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|w| w.as_str().map(str::to_owned))
            .collect()
    };
    let mut command = words("command");
    if command.is_empty() {
        let image = container["image"].as_str().unwrap_or_default();
        command = entrypoint(image).iter().map(|w| (*w).to_owned()).collect();
    }
    let words: Vec<String> = command.into_iter().chain(words("args")).collect();
    match words.as_slice() {
        [sh, flags, line, ..]
            if matches!(basename(sh), "sh" | "bash" | "dash" | "ash" | "zsh")
                && flags.starts_with('-')
                && flags.contains('c') =>
        {
            shell_commands(line)
        }
        _ => vec![words],
    }
}

/// The ENTRYPOINT of the serving images the sim knows, by repository (registry and tag
/// aside): what a container that sets no `command` runs, its `args` appended. vLLM's
/// image starts its OpenAI server module; LMCache's build of it runs `vllm serve` (its
/// samples pass the model as the first argument); SGLang's image has none, so its
/// `args` are the whole command line.
pub fn entrypoint(image: &str) -> &'static [&'static str] {
    let without_tag = image.split('@').next().unwrap_or(image);
    // A `:` after the last `/` starts the tag; one before it is a registry's port.
    let repository = match without_tag.rsplit_once(':') {
        Some((repo, tag)) if !tag.contains('/') => repo,
        _ => without_tag,
    };
    let named = |name: &str| repository == name || repository.ends_with(&format!("/{name}"));
    if named("vllm/vllm-openai") {
        &["python3", "-m", "vllm.entrypoints.openai.api_server"]
    } else if named("lmcache/vllm-openai") {
        &["vllm", "serve"]
    } else {
        &[]
    }
}

pub(super) fn basename(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// LINE as a POSIX shell splits it into simple commands: quotes and backslashes join
/// words, and `;`, `&`, `|` and newlines outside them end a command.
fn shell_commands(line: &str) -> Vec<Vec<String>> {
    let mut commands = vec![Vec::new()];
    let mut word: Option<String> = None;
    let mut chars = line.chars();
    let end_word = |word: &mut Option<String>, commands: &mut Vec<Vec<String>>| {
        if let (Some(w), Some(c)) = (word.take(), commands.last_mut()) {
            c.push(w);
        }
    };
    while let Some(c) = chars.next() {
        match c {
            '\'' => word
                .get_or_insert_with(String::new)
                .extend(chars.by_ref().take_while(|&c| c != '\'')),
            '"' => {
                let w = word.get_or_insert_with(String::new);
                while let Some(c) = chars.next() {
                    match c {
                        '"' => break,
                        '\\' => match chars.next() {
                            Some(e @ ('"' | '\\' | '$' | '`')) => w.push(e),
                            Some('\n') => {}
                            Some(e) => w.extend(['\\', e]),
                            None => w.push('\\'),
                        },
                        c => w.push(c),
                    }
                }
            }
            '\\' => match chars.next() {
                Some('\n') | None => {}
                Some(e) => word.get_or_insert_with(String::new).push(e),
            },
            ';' | '&' | '|' | '\n' => {
                end_word(&mut word, &mut commands);
                if commands.last().is_some_and(|c| !c.is_empty()) {
                    commands.push(Vec::new());
                }
            }
            c if c.is_whitespace() => end_word(&mut word, &mut commands),
            c => word.get_or_insert_with(String::new).push(c),
        }
    }
    end_word(&mut word, &mut commands);
    commands.retain(|c| !c.is_empty());
    commands
}

/// `--name VALUE` or `--name=VALUE` (the SGLang router's command line is read with it too).
pub(super) fn flag<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    args.iter().enumerate().find_map(|(i, w)| {
        if w == name {
            args.get(i + 1).map(String::as_str)
        } else {
            w.strip_prefix(name)?.strip_prefix('=')
        }
    })
}

/// The adapters' names after `--lora-modules` (up to the next flag).
fn lora_names(args: &[String]) -> Vec<String> {
    let Some(i) = args.iter().position(|w| w == "--lora-modules") else {
        return Vec::new();
    };
    args[i + 1..]
        .iter()
        .take_while(|w| !w.starts_with("--"))
        .filter_map(|w| match serde_json::from_str::<Value>(w) {
            Ok(v) => v["name"].as_str().map(str::to_owned),
            Err(_) => w.split_once('=').map(|(name, _)| name.to_owned()),
        })
        .collect()
}

fn server(command: &[String]) -> Option<ModelServer> {
    // What runs the program: `exec`, `env` and variable assignments.
    let start = command
        .iter()
        .position(|w| w != "exec" && w != "env" && !w.contains('='))?;
    let (engine, args, positional) = match &command[start..] {
        [prog, serve, args @ ..] if basename(prog) == "vllm" && serve == "serve" => {
            (Engine::Vllm, args, true)
        }
        [python, m, module, args @ ..] if basename(python).starts_with("python") && m == "-m" => {
            match module.as_str() {
                "vllm.entrypoints.openai.api_server" => (Engine::Vllm, args, false),
                "sglang.launch_server" => (Engine::Sglang, args, false),
                _ => return None,
            }
        }
        _ => return None,
    };
    let model = args
        .first()
        .filter(|m| positional && !m.starts_with('-'))
        .map(String::as_str)
        .or_else(|| flag(args, "--model"))
        .or_else(|| flag(args, "--model-path"))?
        .to_owned();
    // vLLM takes several names after one flag.
    let mut names: Vec<String> = match args.iter().position(|w| w == "--served-model-name") {
        Some(i) => args[i + 1..]
            .iter()
            .take_while(|w| !w.starts_with('-'))
            .cloned()
            .collect(),
        None => flag(args, "--served-model-name")
            .map(str::to_owned)
            .into_iter()
            .collect(),
    };
    if names.is_empty() {
        names.push(model.clone());
    }
    // vLLM with LoRA answers for each adapter too, by the name `--lora-modules` gives it
    // (`name=path`, or vLLM's JSON form), only with `--enable-lora`.
    if engine == Engine::Vllm && args.iter().any(|w| w == "--enable-lora") {
        names.extend(lora_names(args));
    }
    let (default_port, len_flag) = match engine {
        Engine::Vllm => (8000, "--max-model-len"),
        Engine::Sglang => (30000, "--context-length"),
    };
    Some(ModelServer {
        engine,
        model,
        names,
        port: flag(args, "--port")
            .and_then(|p| p.parse().ok())
            .unwrap_or(default_port),
        max_model_len: flag(args, len_flag)
            .and_then(|l| l.parse().ok())
            .unwrap_or(DEFAULT_MAX_MODEL_LEN),
    })
}

/// What a pod's server has answered and is decoding, by pod UID, what each gateway has
/// in flight and has learnt, by the gateway pod's UID, and whose turn it is behind each
/// Service: kept beside the cluster's store, not in it, so that serving changes no
/// object. Requests in flight share it ([`InFlight`]): a streamed answer outlives the
/// API server's handler. What each Prometheus server has scraped lives beside it, under
/// a lock of its own ([`prometheus::Tsdbs`]), never taken while the ledger's is held.
#[derive(Default)]
pub struct Serving(Arc<Mutex<Ledger>>, prometheus::Tsdbs);

#[derive(Default)]
struct Ledger {
    pods: HashMap<String, Served>,
    /// By namespace and Service name.
    turns: HashMap<(String, String), usize>,
    gateways: HashMap<String, sglang_router::Ledger>,
}

#[derive(Clone, Copy, Default)]
struct Served {
    stopped: u64,
    cut: u64,
    prompt_tokens: u64,
    generation_tokens: u64,
    /// Completions being decoded now.
    running: u64,
}

fn lock(ledger: &Mutex<Ledger>) -> MutexGuard<'_, Ledger> {
    ledger.lock().unwrap_or_else(|e| e.into_inner())
}

impl Serving {
    fn ledger(&self) -> MutexGuard<'_, Ledger> {
        lock(&self.0)
    }

    /// Which of the `n` endpoints of Service `ns/name` the next request goes to: each
    /// in turn.
    pub fn turn(&self, ns: &str, name: &str, n: usize) -> usize {
        let mut ledger = self.ledger();
        let t = ledger
            .turns
            .entry((ns.to_owned(), name.to_owned()))
            .or_default();
        *t = t.wrapping_add(1);
        (*t - 1) % n.max(1)
    }

    /// Counts a completion of pod `uid`; the number it had served before.
    fn record(&self, uid: &str, stopped: bool, prompt: u64, generated: u64) -> u64 {
        let mut ledger = self.ledger();
        let s = ledger.pods.entry(uid.to_owned()).or_default();
        let before = s.stopped + s.cut;
        if stopped {
            s.stopped += 1;
        } else {
            s.cut += 1;
        }
        s.prompt_tokens += prompt;
        s.generation_tokens += generated;
        before
    }

    fn served(&self, uid: &str) -> Served {
        self.ledger().pods.get(uid).copied().unwrap_or_default()
    }

    /// A completion pod `uid` starts decoding, counted until it is dropped.
    pub(super) fn decoding(&self, uid: &str) -> InFlight {
        self.ledger()
            .pods
            .entry(uid.to_owned())
            .or_default()
            .running += 1;
        InFlight {
            ledger: self.0.clone(),
            what: Counted::Decoding(uid.to_owned()),
        }
    }

    /// `f` on the ledger of the gateway pod `uid` (a new one if it has none yet).
    pub(super) fn gateway<T>(
        &self,
        uid: &str,
        f: impl FnOnce(&mut sglang_router::Ledger) -> T,
    ) -> T {
        f(self.ledger().gateways.entry(uid.to_owned()).or_default())
    }

    /// A request the gateway pod `uid` took (and sent to `worker`, by URL), which its
    /// ledger counted in: counted out when dropped.
    pub(super) fn through_gateway(&self, uid: &str, worker: Option<String>) -> InFlight {
        InFlight {
            ledger: self.0.clone(),
            what: Counted::Routed(uid.to_owned(), worker),
        }
    }

    /// What the Prometheus servers have scraped, by pod UID.
    pub(super) fn prometheus(&self) -> &prometheus::Tsdbs {
        &self.1
    }

    /// Forgets the pods and Services that are gone.
    pub fn forget_gone(&self, store: &Store) {
        let mut ledger = self.ledger();
        if ledger.pods.is_empty() && ledger.turns.is_empty() && ledger.gateways.is_empty() {
            return;
        }
        let pods: HashSet<String> = store.list("/pods", None).map(|p| meta(p, "uid")).collect();
        ledger.pods.retain(|uid, _| pods.contains(uid));
        ledger.gateways.retain(|uid, _| pods.contains(uid));
        let services: HashSet<(String, String)> = store
            .list("/services", None)
            .map(|s| (meta(s, "namespace"), meta(s, "name")))
            .collect();
        // A router's turns are under `<its namespace>/<its pod>` in the namespace of
        // the pods it routes to.
        let pods_by_name: HashSet<(String, String)> = store
            .list("/pods", None)
            .map(|p| (meta(p, "namespace"), meta(p, "name")))
            .collect();
        ledger
            .turns
            .retain(|(ns, name), _| match name.split_once('/') {
                Some((router_ns, router)) => {
                    pods_by_name.contains(&(router_ns.to_owned(), router.to_owned()))
                }
                None => services.contains(&(ns.clone(), name.clone())),
            });
    }
}

/// A request in flight, counted from when it was taken until its answer has been sent:
/// dropping it, also when the client goes away first, counts it out.
pub struct InFlight {
    ledger: Arc<Mutex<Ledger>>,
    what: Counted,
}

enum Counted {
    /// A completion decoding on the model server pod of this UID.
    Decoding(String),
    /// A request through the gateway pod of this UID, and the worker (URL) it went to.
    Routed(String, Option<String>),
}

impl InFlight {
    /// Names the worker (by URL) that a request the gateway took before it had one went
    /// to, so that the load the gateway's pick counted in is counted out with it.
    pub(super) fn routed_to(&mut self, url: String) {
        if let Counted::Routed(_, worker) = &mut self.what {
            *worker = Some(url);
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut ledger = lock(&self.ledger);
        match &self.what {
            Counted::Decoding(uid) => {
                if let Some(s) = ledger.pods.get_mut(uid) {
                    s.running = s.running.saturating_sub(1);
                }
            }
            Counted::Routed(uid, worker) => {
                if let Some(g) = ledger.gateways.get_mut(uid) {
                    g.finish(worker.as_deref());
                }
            }
        }
    }
}

/// An HTTP answer of a pod.
pub struct Answer {
    pub status: StatusCode,
    pub content_type: &'static str,
    pub body: String,
    /// When the body is sent, in pieces: the bytes up to each offset once that many sim
    /// seconds have passed since the request came (offsets and times growing). None:
    /// all of it at once.
    pub due: Vec<(usize, f64)>,
    /// The completion being decoded, counted until the answer has been sent.
    pub decoding: Option<InFlight>,
}

impl Answer {
    pub fn new(status: StatusCode, content_type: &'static str, body: String) -> Self {
        Self {
            status,
            content_type,
            body,
            due: Vec::new(),
            decoding: None,
        }
    }
}

pub(super) fn json_answer(status: StatusCode, v: &Value) -> Answer {
    Answer::new(status, "application/json", v.to_string())
}

/// The OpenAI-style error vLLM and SGLang answer with.
fn error(status: StatusCode, kind: &str, message: impl Into<String>) -> Answer {
    json_answer(
        status,
        &json!({ "object": "error", "message": message.into(), "type": kind, "param": null,
                 "code": status.as_u16() }),
    )
}

fn bad_request(message: impl Into<String>) -> Answer {
    error(StatusCode::BAD_REQUEST, "BadRequestError", message)
}

/// What one request gets from pod `pod`, serving `server` (if it runs one), at sim
/// time `created` (epoch seconds).
pub fn answer(
    pod: &Value,
    server: Option<&ModelServer>,
    serving: &Serving,
    method: &Method,
    path: &str,
    body: &[u8],
    created: i64,
) -> Answer {
    let Some(server) = server else {
        return Answer::new(
            StatusCode::NOT_FOUND,
            "text/plain; charset=utf-8",
            "404 page not found\n".to_owned(),
        );
    };
    let uid = meta(pod, "uid");
    let native = server.engine == Engine::Sglang;
    // FastAPI's answers for a path it lacks and a method a path does not take.
    match (path, method.as_str()) {
        ("/health", "GET") => Answer::new(StatusCode::OK, "application/json", String::new()),
        ("/v1/models", "GET") => models(server, created),
        ("/metrics", "GET") => metrics(server, serving.served(&uid)),
        ("/v1/chat/completions", "POST") => {
            complete(server, serving, &uid, body, created, Kind::Chat)
        }
        ("/v1/completions", "POST") => complete(server, serving, &uid, body, created, Kind::Text),
        ("/invocations", "POST") if !native => invocations(server, serving, &uid, body, created),
        ("/generate", "POST") if native => generate_native(server, serving, &uid, body),
        ("/health" | "/v1/models" | "/metrics" | "/v1/chat/completions" | "/v1/completions", _) => {
            json_answer(
                StatusCode::METHOD_NOT_ALLOWED,
                &json!({ "detail": "Method Not Allowed" }),
            )
        }
        ("/invocations", _) if !native => json_answer(
            StatusCode::METHOD_NOT_ALLOWED,
            &json!({ "detail": "Method Not Allowed" }),
        ),
        ("/generate", _) if native => json_answer(
            StatusCode::METHOD_NOT_ALLOWED,
            &json!({ "detail": "Method Not Allowed" }),
        ),
        _ => json_answer(StatusCode::NOT_FOUND, &json!({ "detail": "Not Found" })),
    }
}

fn models(server: &ModelServer, created: i64) -> Answer {
    let data: Vec<Value> = server
        .names
        .iter()
        .map(|name| {
            json!({ "id": name, "object": "model", "created": created,
                    "owned_by": server.engine.name(), "root": server.model, "parent": null,
                    "max_model_len": server.max_model_len })
        })
        .collect();
    json_answer(StatusCode::OK, &json!({ "object": "list", "data": data }))
}

fn metrics(server: &ModelServer, served: Served) -> Answer {
    let label = format!("model_name=\"{}\"", server.names[0]);
    let mut out = String::new();
    let mut metric = |name: &str, kind: &str, help: &str, samples: &[(&str, u64)]| {
        out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n"));
        for (labels, v) in samples {
            out.push_str(&format!("{name}{{{labels}}} {v}.0\n"));
        }
    };
    let (p, g) = (served.prompt_tokens, served.generation_tokens);
    match server.engine {
        Engine::Vllm => {
            let stop = format!("finished_reason=\"stop\",{label}");
            let length = format!("finished_reason=\"length\",{label}");
            metric(
                "vllm:num_requests_running",
                "gauge",
                "Number of requests in model execution batches.",
                &[(&label, served.running)],
            );
            metric(
                "vllm:num_requests_waiting",
                "gauge",
                "Number of requests waiting to be processed.",
                &[(&label, 0)],
            );
            metric(
                "vllm:request_success_total",
                "counter",
                "Count of successfully processed requests.",
                &[(&stop, served.stopped), (&length, served.cut)],
            );
            metric(
                "vllm:prompt_tokens_total",
                "counter",
                "Number of prefill tokens processed.",
                &[(&label, p)],
            );
            metric(
                "vllm:generation_tokens_total",
                "counter",
                "Number of generation tokens processed.",
                &[(&label, g)],
            );
        }
        Engine::Sglang => {
            let total = served.stopped + served.cut;
            metric(
                "sglang:num_running_reqs",
                "gauge",
                "The number of running requests.",
                &[(&label, served.running)],
            );
            metric(
                "sglang:num_queue_reqs",
                "gauge",
                "The number of requests in the waiting queue.",
                &[(&label, 0)],
            );
            metric(
                "sglang:num_requests_total",
                "counter",
                "Number of requests processed.",
                &[(&label, total)],
            );
            metric(
                "sglang:prompt_tokens_total",
                "counter",
                "Number of prefill tokens processed.",
                &[(&label, p)],
            );
            metric(
                "sglang:generation_tokens_total",
                "counter",
                "Number of generation tokens processed.",
                &[(&label, g)],
            );
        }
    }
    Answer::new(
        StatusCode::OK,
        "text/plain; version=0.0.4; charset=utf-8",
        out,
    )
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Chat,
    Text,
}

/// Tokens as the sim counts them: whitespace-separated words.
fn tokens(text: &str) -> u64 {
    text.split_whitespace().count() as u64
}

/// A message's text: a string, or the text parts of a list.
pub(super) fn content_text(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p["text"].as_str())
            .collect::<Vec<_>>()
            .join(" "),
        _ => String::new(),
    }
}

/// What replies are made of.
const VOCABULARY: &str = "model cluster tokens answer quickly gradient weights serve the a of to \
    and is prompt layer attention batch cache node warm steady bright river stone signal garden \
    orbit lantern harbor echo meadow circuit window thread spark north quiet field vector matrix \
    kernel pod replica endpoint request reply hello again today simple clear fast ready loaded \
    running shard tensor learns writes reads holds brings keeps";

/// The words a server named `name` answers `prompt` with: a function of both alone.
fn reply(name: &str, prompt: &str) -> Vec<&'static str> {
    let words: Vec<&str> = VOCABULARY.split_whitespace().collect();
    let mut h = fnv1a(&format!("{name}\n{prompt}"));
    let n = 8 + (h % 17) as usize;
    (0..n)
        .map(|_| {
            h = h
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            words[(h >> 33) as usize % words.len()]
        })
        .collect()
}

/// One generated text: its words as a sentence.
struct Generated {
    text: String,
    tokens: u64,
    stopped: bool,
}

/// What a server named `name` generates for `prompt`: its reply cut at `max` tokens,
/// or with `ignore_eos` exactly `max` of them (`room`, what the context has left, when
/// there is no `max`), the reply going on past its end as it began.
fn generate(name: &str, prompt: &str, max: Option<u64>, ignore_eos: bool, room: u64) -> Generated {
    let reply = reply(name, prompt);
    let (words, stopped) = if ignore_eos {
        let n = max.unwrap_or(room) as usize;
        (reply.iter().copied().cycle().take(n).collect(), false)
    } else {
        let stopped = max.is_none_or(|m| m >= reply.len() as u64);
        let mut words = reply;
        if let Some(m) = max {
            words.truncate(m as usize);
        }
        (words, stopped)
    };
    let mut text = words.join(" ");
    if let Some(first) = text.get_mut(..1) {
        first.make_ascii_uppercase();
    }
    if stopped {
        text.push('.');
    }
    Generated {
        tokens: words.len() as u64,
        text,
        stopped,
    }
}

/// The sim seconds a batch takes to decode: its choices are generated together, so as
/// long as its longest.
fn decode_secs(generated: &[Generated]) -> f64 {
    generated.iter().map(|g| g.tokens).max().unwrap_or(0) as f64 * DECODE_SECS_PER_TOKEN
}

/// `answer` sent whole once `generated` has been decoded, counted meanwhile as
/// decoding on pod `uid`.
fn decoded(mut answer: Answer, generated: &[Generated], serving: &Serving, uid: &str) -> Answer {
    answer.due = vec![(answer.body.len(), decode_secs(generated))];
    answer.decoding = Some(serving.decoding(uid));
    answer
}

/// `/v1/chat/completions` (one choice, from the last user message) or `/v1/completions`
/// (a choice per prompt), whole or streamed as server-sent events.
fn complete(
    server: &ModelServer,
    serving: &Serving,
    uid: &str,
    body: &[u8],
    created: i64,
    kind: Kind,
) -> Answer {
    let req: Value = match serde_json::from_slice(body) {
        Ok(v @ Value::Object(_)) => v,
        Ok(_) => return bad_request("the request body must be a JSON object"),
        Err(e) => return bad_request(format!("JSON decode error: {e}")),
    };
    let model = match req["model"].as_str() {
        None => server.names[0].clone(),
        Some(m) if server.names.iter().any(|n| n == m) => m.to_owned(),
        Some(m) => {
            return error(
                StatusCode::NOT_FOUND,
                "NotFoundError",
                format!("The model `{m}` does not exist."),
            );
        }
    };
    // (prompt tokens, what the reply is a function of) per choice.
    let prompts: Vec<(u64, String)> = match kind {
        Kind::Chat => {
            let Some(messages) = req["messages"].as_array().filter(|m| !m.is_empty()) else {
                return bad_request("messages: Field required: a list of at least one message");
            };
            let texts: Vec<String> = messages
                .iter()
                .map(|m| content_text(&m["content"]))
                .collect();
            let last_user = messages
                .iter()
                .zip(&texts)
                .rfind(|(m, _)| m["role"] == "user")
                .map_or_else(|| texts[texts.len() - 1].clone(), |(_, t)| t.clone());
            vec![(texts.iter().map(|t| tokens(t)).sum(), last_user)]
        }
        Kind::Text => match &req["prompt"] {
            Value::String(p) => vec![(tokens(p), p.clone())],
            Value::Array(ps) if !ps.is_empty() && ps.iter().all(Value::is_string) => ps
                .iter()
                .filter_map(Value::as_str)
                .map(|p| (tokens(p), p.to_owned()))
                .collect(),
            _ => return bad_request("prompt: Field required: a string or a list of strings"),
        },
    };
    let max = match req
        .get("max_completion_tokens")
        .or_else(|| req.get("max_tokens"))
    {
        None | Some(Value::Null) => None,
        Some(v) => match v.as_u64() {
            Some(m) if m >= 1 => Some(m),
            _ => return bad_request(format!("max_tokens must be at least 1, got {v}.")),
        },
    };
    let len = server.max_model_len;
    for (p, _) in &prompts {
        match max {
            Some(m) if p + m > len => {
                return bad_request(format!(
                    "This model's maximum context length is {len} tokens. However, you requested {} tokens ({p} in the messages, {m} in the completion). Please reduce the length of the messages or completion.",
                    p + m
                ));
            }
            None if *p >= len => {
                return bad_request(format!(
                    "This model's maximum context length is {len} tokens. However, your request has {p} input tokens. Please reduce the length of the input messages."
                ));
            }
            _ => {}
        }
    }
    // The sampling parameter load generators set: no stopping before `max_tokens`.
    let ignore_eos = req["ignore_eos"] == true;
    let generated: Vec<Generated> = prompts
        .iter()
        // An adapter answers differently from its base model.
        .map(|(p, text)| generate(&model, text, max, ignore_eos, len - p))
        .collect();
    let mut served = 0;
    for ((p, _), g) in prompts.iter().zip(&generated) {
        served = serving.record(uid, g.stopped, *p, g.tokens);
    }
    let prompt_tokens: u64 = prompts.iter().map(|(p, _)| p).sum();
    let completion_tokens: u64 = generated.iter().map(|g| g.tokens).sum();
    let usage = json!({ "prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                        "total_tokens": prompt_tokens + completion_tokens });
    let (prefix, object) = match kind {
        Kind::Chat => ("chatcmpl", "chat.completion"),
        Kind::Text => ("cmpl", "text_completion"),
    };
    let id = format!("{prefix}-{}", answer_id(uid, served));
    let finish = |g: &Generated| if g.stopped { "stop" } else { "length" };
    if req["stream"] == true {
        let answer = stream(&req, &id, object, created, &model, kind, &generated, &usage);
        return Answer {
            decoding: Some(serving.decoding(uid)),
            ..answer
        };
    }
    let choices: Vec<Value> = generated
        .iter()
        .enumerate()
        .map(|(i, g)| match kind {
            Kind::Chat => {
                json!({ "index": i, "message": { "role": "assistant", "content": g.text },
                                  "logprobs": null, "finish_reason": finish(g) })
            }
            Kind::Text => json!({ "index": i, "text": g.text, "logprobs": null,
                                  "finish_reason": finish(g) }),
        })
        .collect();
    let whole = json_answer(
        StatusCode::OK,
        &json!({ "id": id, "object": object, "created": created, "model": model,
                 "choices": choices, "usage": usage }),
    );
    decoded(whole, &generated, serving, uid)
}

/// vLLM's `/invocations`, which SageMaker calls (JumpStart's containers are invoked
/// there): the body says which OpenAI request it is, `messages` a chat completion and
/// `prompt` a text completion, each answered as its own path answers it.
fn invocations(
    server: &ModelServer,
    serving: &Serving,
    uid: &str,
    body: &[u8],
    created: i64,
) -> Answer {
    let req: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        // FastAPI's HTTPException, raised before any request type is tried.
        Err(e) => {
            return json_answer(
                StatusCode::BAD_REQUEST,
                &json!({ "detail": format!("JSON decode error: {e}") }),
            );
        }
    };
    if req.get("messages").is_some() {
        complete(server, serving, uid, body, created, Kind::Chat)
    } else if req.get("prompt").is_some() {
        complete(server, serving, uid, body, created, Kind::Text)
    } else {
        bad_request(
            "Cannot find suitable handler for request. Expected one of: ['ChatCompletionRequest', 'CompletionRequest']",
        )
    }
}

/// The id of pod `uid`'s answer after `served` others: 32 hex digits.
fn answer_id(uid: &str, served: u64) -> String {
    format!(
        "{:016x}{:016x}",
        fnv1a(&format!("{uid}/{served}")),
        fnv1a(&format!("{served}/{uid}"))
    )
}

/// Server-sent events, each due once the tokens it follows have been decoded, then
/// `[DONE]`.
fn events(mut events: Vec<(u64, Value)>) -> Answer {
    // The choices of a batch decode together: their chunks interleave by token.
    events.sort_by_key(|(t, _)| *t);
    let last = events.last().map_or(0, |(t, _)| *t);
    let mut body = String::new();
    let mut due = Vec::with_capacity(events.len() + 1);
    let at = |t: u64| t as f64 * DECODE_SECS_PER_TOKEN;
    for (t, e) in &events {
        body.push_str(&format!("data: {e}\n\n"));
        due.push((body.len(), at(*t)));
    }
    body.push_str("data: [DONE]\n\n");
    due.push((body.len(), at(last)));
    Answer {
        due,
        ..Answer::new(StatusCode::OK, "text/event-stream; charset=utf-8", body)
    }
}

/// The same completion as server-sent events: a chunk per word, the finish reason on
/// the last of each choice, usage when `stream_options.include_usage` asks, `[DONE]`.
#[allow(clippy::too_many_arguments)]
fn stream(
    req: &Value,
    id: &str,
    object: &str,
    created: i64,
    model: &str,
    kind: Kind,
    generated: &[Generated],
    usage: &Value,
) -> Answer {
    let object = format!("{object}.chunk");
    let chunk = |choices: Value| json!({ "id": id, "object": object, "created": created, "model": model, "choices": choices });
    // Each chunk with the tokens decoded by the time it is sent.
    let mut chunks = Vec::new();
    for (i, g) in generated.iter().enumerate() {
        if kind == Kind::Chat {
            chunks.push((
                0,
                chunk(
                    json!([{ "index": i, "delta": { "role": "assistant", "content": "" },
                                       "logprobs": null, "finish_reason": null }]),
                ),
            ));
        }
        let words: Vec<&str> = g.text.split(' ').collect();
        for (w, word) in words.iter().enumerate() {
            let piece = if w == 0 {
                (*word).to_owned()
            } else {
                format!(" {word}")
            };
            let finish =
                (w + 1 == words.len()).then_some(if g.stopped { "stop" } else { "length" });
            chunks.push((
                w as u64 + 1,
                chunk(match kind {
                    Kind::Chat => json!([{ "index": i, "delta": { "content": piece },
                                           "logprobs": null, "finish_reason": finish }]),
                    Kind::Text => json!([{ "index": i, "text": piece, "logprobs": null,
                                           "finish_reason": finish }]),
                }),
            ));
        }
    }
    if req["stream_options"]["include_usage"] == true {
        let mut last = chunk(json!([]));
        last["usage"] = usage.clone();
        let tokens = generated.iter().map(|g| g.tokens).max().unwrap_or(0);
        chunks.push((tokens, last));
    }
    events(chunks)
}

/// SGLang's own `/generate`: `text` (one prompt or a list) with `sampling_params`
/// (`max_new_tokens`, `ignore_eos`), answered with the text and its `meta_info`, whole
/// (a list for a list) or streamed as server-sent events of the text so far.
fn generate_native(server: &ModelServer, serving: &Serving, uid: &str, body: &[u8]) -> Answer {
    let refuse = |message: String| {
        json_answer(
            StatusCode::BAD_REQUEST,
            &json!({ "error": { "message": message } }),
        )
    };
    let req: Value = match serde_json::from_slice(body) {
        Ok(v @ Value::Object(_)) => v,
        Ok(_) => return refuse("the request body must be a JSON object".to_owned()),
        Err(e) => return refuse(format!("JSON decode error: {e}")),
    };
    let (texts, batch): (Vec<String>, bool) = match &req["text"] {
        Value::String(t) => (vec![t.clone()], false),
        Value::Array(ts) if !ts.is_empty() && ts.iter().all(Value::is_string) => (
            ts.iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect(),
            true,
        ),
        _ => {
            return refuse("Either text, input_ids or input_embeds should be provided.".to_owned());
        }
    };
    let params = &req["sampling_params"];
    let max = params["max_new_tokens"]
        .as_u64()
        .unwrap_or(SGLANG_MAX_NEW_TOKENS);
    let len = server.max_model_len;
    for t in &texts {
        let p = tokens(t);
        if p + max > len {
            return refuse(format!(
                "Requested token count exceeds the model's maximum context length of {len} tokens. You requested a total of {} tokens: {p} tokens from the input messages and {max} tokens for the completion. Please reduce the number of tokens in the input messages or the completion to fit within the limit.",
                p + max
            ));
        }
    }
    let ignore_eos = params["ignore_eos"] == true;
    let name = &server.names[0];
    let generated: Vec<Generated> = texts
        .iter()
        .map(|t| generate(name, t, Some(max), ignore_eos, len - tokens(t)))
        .collect();
    let mut infos = Vec::with_capacity(texts.len());
    for (t, g) in texts.iter().zip(&generated) {
        let p = tokens(t);
        let served = serving.record(uid, g.stopped, p, g.tokens);
        let finish = if g.stopped {
            json!({ "type": "stop", "matched": null })
        } else {
            json!({ "type": "length", "length": g.tokens })
        };
        infos.push(
            json!({ "id": answer_id(uid, served), "finish_reason": finish,
            "prompt_tokens": p, "completion_tokens": g.tokens, "cached_tokens": 0,
            "e2e_latency": g.tokens as f64 * DECODE_SECS_PER_TOKEN }),
        );
    }
    if req["stream"] == true {
        let mut chunks = Vec::new();
        for (i, (g, info)) in generated.iter().zip(&infos).enumerate() {
            let words: Vec<&str> = g.text.split(' ').collect();
            for n in 1..=words.len() {
                let mut meta_info = info.clone();
                meta_info["completion_tokens"] = json!(n);
                if n < words.len() {
                    meta_info["finish_reason"] = Value::Null;
                }
                let mut chunk = json!({ "text": words[..n].join(" "), "meta_info": meta_info });
                if batch {
                    chunk["index"] = json!(i);
                }
                chunks.push((n as u64, chunk));
            }
        }
        return Answer {
            decoding: Some(serving.decoding(uid)),
            ..events(chunks)
        };
    }
    let outputs: Vec<Value> = generated
        .iter()
        .zip(infos)
        .map(|(g, meta_info)| json!({ "text": g.text, "meta_info": meta_info }))
        .collect();
    let whole = if batch {
        json_answer(StatusCode::OK, &Value::Array(outputs))
    } else {
        json_answer(StatusCode::OK, &outputs[0])
    };
    decoded(whole, &generated, serving, uid)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(command: Value, args: Value) -> Value {
        json!({ "metadata": { "uid": "u1" },
                "spec": { "containers": [{ "name": "server", "command": command, "args": args }] } })
    }

    #[test]
    fn a_container_without_a_command_runs_its_images_entrypoint() {
        let with_image = |image: &str, args: Value| {
            of(
                &json!({ "metadata": { "uid": "u1" }, "spec": { "containers": [
                { "name": "w", "image": image, "args": args }] } }),
            )
        };
        let vllm = with_image(
            "docker.io/vllm/vllm-openai:v0.10.1",
            json!(["--model", "/opt/ml/model", "--served-model-name", "llama"]),
        )
        .unwrap();
        assert_eq!(
            (vllm.engine, vllm.names.as_slice()),
            (Engine::Vllm, &["llama".to_owned()][..])
        );
        let lmcache = with_image("lmcache/vllm-openai:v0.3.7", json!(["/opt/ml/model"])).unwrap();
        assert_eq!(
            (lmcache.engine, lmcache.model.as_str()),
            (Engine::Vllm, "/opt/ml/model")
        );
        let sglang = with_image(
            "lmsysorg/sglang:v0.4.9",
            json!([
                "python3",
                "-m",
                "sglang.launch_server",
                "--model-path",
                "/opt/ml/model"
            ]),
        )
        .unwrap();
        assert_eq!(sglang.engine, Engine::Sglang);
        assert!(with_image("lmsysorg/sglang:v0.4.9", json!(["--model-path", "m"])).is_none());
        assert!(with_image("registry:5000/vllm/vllm-openai", json!(["--model", "m"])).is_some());
    }

    #[test]
    fn servers_are_read_from_command_lines_and_shell_lines() {
        let vllm = of(&pod(
            json!(["vllm", "serve", "/s3/models/Qwen/Qwen2.5-0.5B"]),
            json!([
                "--served-model-name",
                "qwen",
                "--port=8080",
                "--max-model-len",
                "8192"
            ]),
        ))
        .unwrap();
        assert_eq!(vllm.engine, Engine::Vllm);
        assert_eq!(vllm.model, "/s3/models/Qwen/Qwen2.5-0.5B");
        assert_eq!(vllm.names, ["qwen"]);
        let lora = of(&pod(
            json!(["vllm", "serve", "m"]),
            json!([
                "--served-model-name",
                "base",
                "--enable-lora",
                "--lora-modules",
                "sql=/s3/adapters/sql",
                r#"{"name": "chat", "path": "/s3/adapters/chat"}"#,
                "--max-lora-rank",
                "16"
            ]),
        ))
        .unwrap();
        assert_eq!(lora.names, ["base", "sql", "chat"]);
        assert_eq!((vllm.port, vllm.max_model_len), (8080, 8192));

        let api_server = of(&pod(
            json!([
                "python3",
                "-m",
                "vllm.entrypoints.openai.api_server",
                "--model",
                "m"
            ]),
            Value::Null,
        ))
        .unwrap();
        assert_eq!((api_server.names[0].as_str(), api_server.port), ("m", 8000));

        let sglang = of(&pod(
            json!(["/bin/sh", "-c"]),
            json!([
                "pip install x && HF_HOME=/tmp exec python -m sglang.launch_server --model-path 'org/My Model' --served-model-name \"a b\"; echo done"
            ]),
        ))
        .unwrap();
        assert_eq!(sglang.engine, Engine::Sglang);
        assert_eq!(sglang.model, "org/My Model");
        assert_eq!(sglang.names, ["a b"]);
        assert_eq!(sglang.port, 30000);

        for (command, args) in [
            (json!(["python", "train.py"]), Value::Null),
            (json!(["vllm", "serve"]), Value::Null),
            (json!(["sh", "-c", "echo vllm serve m"]), Value::Null),
            (Value::Null, Value::Null),
        ] {
            assert_eq!(of(&pod(command.clone(), args)), None, "{command}");
        }
    }

    fn chat(server: &ModelServer, serving: &Serving, body: Value) -> (StatusCode, Value) {
        let a = answer(
            &json!({ "metadata": { "uid": "u1" } }),
            Some(server),
            serving,
            &Method::POST,
            "/v1/chat/completions",
            body.to_string().as_bytes(),
            1_700_000_000,
        );
        (a.status, serde_json::from_str(&a.body).unwrap())
    }

    #[test]
    fn completions_are_deterministic_counted_and_cut_at_max_tokens() {
        let server = of(&pod(
            json!(["vllm", "serve", "m", "--served-model-name", "qwen"]),
            Value::Null,
        ))
        .unwrap();
        let serving = Serving::default();
        let ask = json!({ "model": "qwen", "messages": [
            { "role": "system", "content": "Be brief." },
            { "role": "user", "content": "Say hello to the cluster" }] });
        let (code, first) = chat(&server, &serving, ask.clone());
        assert_eq!(code, StatusCode::OK, "{first}");
        let (_, again) = chat(&server, &serving, ask.clone());
        let content = first["choices"][0]["message"]["content"].as_str().unwrap();
        assert_eq!(content, again["choices"][0]["message"]["content"]);
        assert_ne!(first["id"], again["id"]);
        assert_eq!(first["model"], "qwen");
        assert_eq!(first["usage"]["prompt_tokens"], 7);
        assert_eq!(first["usage"]["completion_tokens"], tokens(content));
        assert_eq!(first["choices"][0]["finish_reason"], "stop");

        let mut short = ask.clone();
        short["max_tokens"] = json!(2);
        let (_, cut) = chat(&server, &serving, short);
        assert_eq!(cut["choices"][0]["finish_reason"], "length");
        assert_eq!(cut["usage"]["completion_tokens"], 2);

        let mut wrong = ask;
        wrong["model"] = json!("llama");
        let (code, body) = chat(&server, &serving, wrong);
        assert_eq!(code, StatusCode::NOT_FOUND);
        assert_eq!(body["message"], "The model `llama` does not exist.");
        assert_eq!(body["type"], "NotFoundError");
        let (code, body) = chat(&server, &serving, json!({ "messages": [] }));
        assert_eq!(
            (code, body["type"].as_str()),
            (StatusCode::BAD_REQUEST, Some("BadRequestError"))
        );

        let m = answer(
            &json!({ "metadata": { "uid": "u1" } }),
            Some(&server),
            &serving,
            &Method::GET,
            "/metrics",
            b"",
            0,
        );
        assert!(
            m.body.contains(
                "vllm:request_success_total{finished_reason=\"stop\",model_name=\"qwen\"} 2.0"
            ),
            "{}",
            m.body
        );
        assert!(m.body.contains(
            "vllm:request_success_total{finished_reason=\"length\",model_name=\"qwen\"} 1.0"
        ));
        assert!(
            m.body
                .contains("vllm:num_requests_waiting{model_name=\"qwen\"} 0.0")
        );
    }

    #[test]
    fn streams_end_with_done_and_other_pods_know_no_path() {
        let server = of(&pod(json!(["vllm", "serve", "m"]), Value::Null)).unwrap();
        let a = answer(
            &json!({ "metadata": { "uid": "u1" } }),
            Some(&server),
            &Serving::default(),
            &Method::POST,
            "/v1/completions",
            json!({ "prompt": "hi there", "stream": true, "stream_options": { "include_usage": true } })
                .to_string()
                .as_bytes(),
            0,
        );
        assert!(a.content_type.starts_with("text/event-stream"));
        assert!(a.body.ends_with("data: [DONE]\n\n"));
        assert!(a.body.contains("\"prompt_tokens\":2"), "{}", a.body);
        let plain = answer(
            &json!({}),
            None,
            &Serving::default(),
            &Method::GET,
            "/health",
            b"",
            0,
        );
        assert_eq!(plain.status, StatusCode::NOT_FOUND);
        let missing = answer(
            &json!({}),
            Some(&server),
            &Serving::default(),
            &Method::GET,
            "/nope",
            b"",
            0,
        );
        assert_eq!(missing.body, r#"{"detail":"Not Found"}"#);
    }

    #[test]
    fn vllm_answers_sagemakers_invocations_as_the_request_its_body_is() {
        let server = of(&pod(
            json!([
                "vllm",
                "serve",
                "/opt/ml/model",
                "--served-model-name",
                "qwen"
            ]),
            Value::Null,
        ))
        .unwrap();
        let serving = Serving::default();
        let ask = json!({ "messages": [{ "role": "user", "content": "Say hello" }] });
        let chat = post(&server, &serving, "/invocations", ask.clone());
        let direct = post(&server, &serving, "/v1/chat/completions", ask);
        let (chat, direct): (Value, Value) = (
            serde_json::from_str(&chat.body).unwrap(),
            serde_json::from_str(&direct.body).unwrap(),
        );
        assert_eq!(chat["object"], "chat.completion");
        assert_eq!(chat["model"], "qwen");
        assert_eq!(
            chat["choices"][0]["message"]["content"],
            direct["choices"][0]["message"]["content"]
        );
        let text = post(
            &server,
            &serving,
            "/invocations",
            json!({ "prompt": "Once upon a time", "max_tokens": 3 }),
        );
        let text: Value = serde_json::from_str(&text.body).unwrap();
        assert_eq!(text["object"], "text_completion");
        assert_eq!(text["usage"]["completion_tokens"], 3);

        let neither = post(&server, &serving, "/invocations", json!({ "inputs": "hi" }));
        assert_eq!(neither.status, StatusCode::BAD_REQUEST);
        let body: Value = serde_json::from_str(&neither.body).unwrap();
        assert_eq!(
            (&body["object"], &body["type"], &body["code"]),
            (&json!("error"), &json!("BadRequestError"), &json!(400))
        );
        assert!(
            neither.due.is_empty() && neither.decoding.is_none(),
            "a refusal takes no time"
        );
        let garbled = answer(
            &json!({ "metadata": { "uid": "u1" } }),
            Some(&server),
            &serving,
            &Method::POST,
            "/invocations",
            b"{",
            0,
        );
        assert_eq!(garbled.status, StatusCode::BAD_REQUEST);
        assert!(
            garbled.body.contains("JSON decode error"),
            "{}",
            garbled.body
        );
        let get = answer(
            &json!({ "metadata": { "uid": "u1" } }),
            Some(&server),
            &serving,
            &Method::GET,
            "/invocations",
            b"",
            0,
        );
        assert_eq!(get.status, StatusCode::METHOD_NOT_ALLOWED);

        // SGLang serves no such path.
        let sglang = of(&pod(
            json!(["python3", "-m", "sglang.launch_server", "--model-path", "m"]),
            Value::Null,
        ))
        .unwrap();
        let none = post(&sglang, &serving, "/invocations", json!({ "prompt": "a" }));
        assert_eq!(none.status, StatusCode::NOT_FOUND);
    }

    fn post(server: &ModelServer, serving: &Serving, path: &str, body: Value) -> Answer {
        answer(
            &json!({ "metadata": { "uid": "u1" } }),
            Some(server),
            serving,
            &Method::POST,
            path,
            body.to_string().as_bytes(),
            0,
        )
    }

    fn running(server: &ModelServer, serving: &Serving) -> String {
        let m = answer(
            &json!({ "metadata": { "uid": "u1" } }),
            Some(server),
            serving,
            &Method::GET,
            "/metrics",
            b"",
            0,
        );
        m.body
            .lines()
            .find(|l| l.starts_with("sglang:num_running_reqs{"))
            .unwrap()
            .rsplit(' ')
            .next()
            .unwrap()
            .to_owned()
    }

    #[test]
    fn completions_take_their_decode_time_and_ignore_eos_runs_to_max_tokens() {
        let server = of(&pod(
            json!([
                "python3",
                "-m",
                "sglang.launch_server",
                "--model-path",
                "m",
                "--served-model-name",
                "qwen"
            ]),
            Value::Null,
        ))
        .unwrap();
        let serving = Serving::default();
        let ask = json!({ "messages": [{ "role": "user", "content": "tell me more" }],
                          "max_tokens": 50, "ignore_eos": true });
        let long = post(&server, &serving, "/v1/chat/completions", ask.clone());
        let body: Value = serde_json::from_str(&long.body).unwrap();
        assert_eq!(body["usage"]["completion_tokens"], 50);
        assert_eq!(body["choices"][0]["finish_reason"], "length");
        let content = body["choices"][0]["message"]["content"].as_str().unwrap();
        assert_eq!(tokens(content), 50);
        assert_eq!(long.due.len(), 1);
        assert_eq!(long.due[0].0, long.body.len());
        assert!((long.due[0].1 - 1.0).abs() < 1e-9, "{:?}", long.due);
        assert_eq!(
            running(&server, &serving),
            "1.0",
            "counted while it decodes"
        );
        drop(long);
        assert_eq!(running(&server, &serving), "0.0");

        // Without it the reply ends where it ends; an error takes no time.
        let mut short = ask.clone();
        short["ignore_eos"] = json!(false);
        let ended = post(&server, &serving, "/v1/chat/completions", short);
        let body: Value = serde_json::from_str(&ended.body).unwrap();
        assert_eq!(body["choices"][0]["finish_reason"], "stop");
        let n = body["usage"]["completion_tokens"].as_u64().unwrap();
        assert!((ended.due[0].1 - n as f64 * DECODE_SECS_PER_TOKEN).abs() < 1e-9);
        let refused = post(
            &server,
            &serving,
            "/v1/chat/completions",
            json!({ "messages": [] }),
        );
        assert!(refused.due.is_empty() && refused.decoding.is_none());

        // Streamed, each chunk comes due as its token is decoded.
        let mut streamed = ask;
        streamed["max_tokens"] = json!(4);
        streamed["stream"] = json!(true);
        let s = post(&server, &serving, "/v1/chat/completions", streamed);
        let times: Vec<f64> = s.due.iter().map(|(_, t)| *t).collect();
        let step = DECODE_SECS_PER_TOKEN;
        assert_eq!(
            times,
            [0.0, step, 2.0 * step, 3.0 * step, 4.0 * step, 4.0 * step]
        );
        assert_eq!(s.due.last().unwrap().0, s.body.len());
        assert!(s.body.ends_with("data: [DONE]\n\n"));

        // SGLang's own API, with its sampling parameters.
        let g = post(
            &server,
            &serving,
            "/generate",
            json!({ "text": "The capital of France is",
                    "sampling_params": { "max_new_tokens": 6, "ignore_eos": true } }),
        );
        let out: Value = serde_json::from_str(&g.body).unwrap();
        assert_eq!(tokens(out["text"].as_str().unwrap()), 6);
        assert_eq!(
            out["meta_info"]["finish_reason"],
            json!({ "type": "length", "length": 6 })
        );
        assert_eq!(out["meta_info"]["prompt_tokens"], 5);
        let batch = post(
            &server,
            &serving,
            "/generate",
            json!({ "text": ["a", "b c"] }),
        );
        let outs: Value = serde_json::from_str(&batch.body).unwrap();
        assert_eq!(outs.as_array().unwrap().len(), 2);
        assert_eq!(outs[0]["meta_info"]["finish_reason"]["type"], "stop");
        let vllm = of(&pod(json!(["vllm", "serve", "m"]), Value::Null)).unwrap();
        let none = post(&vllm, &serving, "/generate", json!({ "text": "a" }));
        assert_eq!(none.status, StatusCode::NOT_FOUND);
    }
}
