//! The SGLang Model Gateway ("smg": what `python3 -m sglang_router.launch_router`, `smg`
//! and `sgl-model-gateway` start) as the service proxy finds it in a pod. On its `--port`
//! it passes completions to a worker it discovered by label (`--service-discovery`) or
//! was given (`--worker-urls`), picked by its `--policy`, answers its probes and
//! `/workers` itself, and serves its Prometheus metrics on `--prometheus-port`, under
//! SMG's metric names. A completion it finds no worker for is not answered at once: SMG's
//! retry executor answers each attempt that finds none `503 no_available_workers`, a
//! status it retries, so the request is [`Held`] and tried again on the `--retry-*`
//! schedule, the client's connection open and counted in flight all the while, until a
//! worker is Ready or the attempts are spent. That is what lets KEDA see demand for
//! workers scaled to zero. The sim runs no process: what the gateway does follows from
//! its command line alone, and what it has in flight and has learnt (the requests it
//! counts, each worker's load, the cache-aware policy's prefix trees) is kept per gateway
//! pod in the cluster's [`Serving`] ledger, so that routing writes no object. Its choices
//! must be deterministic (tests assert where a request went), so "random" is a hash of
//! its request count, a cache-aware tree holds whole texts, matched through their
//! neighbours in sorted order, instead of a radix tree, and retries wait their mean
//! delay, without jitter.

use std::collections::BTreeMap;
use std::ops::Bound;

use axum::http::{Method, StatusCode};
use serde_json::{Value, json};

use super::controllers::is_ready;
use super::model_server::{
    self, Answer, InFlight, Serving, basename, content_text, flag, json_answer,
};
use super::store::{Obj, Store, meta};
use crate::world::fnv1a;

/// Characters of a request's text a prefix tree holds and matches: a long prompt's
/// start is what requests share.
const TREE_CHARS: usize = 1024;
/// Texts a prefix tree holds per worker at most, whatever `--max-tree-size` allows, so
/// that a gateway under a load generator's random prompts stays small.
const TREE_TEXTS: usize = 4096;
/// The paths it passes to a worker it picks.
const GENERATE: &[&str] = &["/v1/chat/completions", "/v1/completions", "/generate"];
/// The paths it answers on its `--port`.
const OWN: &[&str] = &[
    "/liveness",
    "/readiness",
    "/health",
    "/workers",
    "/v1/models",
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    CacheAware,
    RoundRobin,
    Random,
    PowerOfTwo,
}

impl Policy {
    fn parse(s: &str) -> Option<Self> {
        match s {
            "cache_aware" => Some(Self::CacheAware),
            "round_robin" => Some(Self::RoundRobin),
            "random" => Some(Self::Random),
            "power_of_two" => Some(Self::PowerOfTwo),
            _ => None,
        }
    }
}

/// The cache-aware policy's settings.
#[derive(Clone, Debug, PartialEq)]
pub struct CacheAware {
    /// The share of a request's text a worker's tree must already hold for it to win.
    pub threshold: f64,
    /// Loads are imbalanced when the busiest has more than this many requests above the
    /// idlest, and more than `balance_rel` times as many.
    pub balance_abs: u64,
    pub balance_rel: f64,
    /// How often the trees are cut back to `max_tree_size` characters, least recently
    /// used texts first.
    pub eviction_interval_secs: u64,
    pub max_tree_size: usize,
}

/// SMG's retry settings (`--retry-*`, `--disable-retries`), which its HTTP router's
/// retry executor applies to every generation request.
#[derive(Clone, Debug, PartialEq)]
pub struct Retries {
    /// SMG's `max_retries` counts attempts, the first one included: five make four
    /// retries. Zero is taken as one, which is what `--disable-retries` sets.
    pub max_retries: u32,
    pub initial_backoff_ms: u64,
    pub max_backoff_ms: u64,
    pub multiplier: f64,
    pub jitter: f64,
    pub disabled: bool,
}

impl Retries {
    /// The sim seconds before retry `k` (0-based), none once the attempts are spent:
    /// `initial * multiplier^k` ms, cut to whole ms as SMG does, at most `max`. SMG
    /// spreads each delay by up to `jitter` either way at random; the sim waits the mean,
    /// so that a held request is tried again at instants a test can tell.
    pub fn delay(&self, k: u32) -> Option<f64> {
        let attempts = if self.disabled {
            1
        } else {
            self.max_retries.max(1)
        };
        if k.saturating_add(1) >= attempts {
            return None;
        }
        let ms = (self.initial_backoff_ms as f64 * self.multiplier.powf(f64::from(k))) as u64;
        Some(ms.min(self.max_backoff_ms) as f64 / 1000.0)
    }
}

/// A gateway as its command line configures it.
#[derive(Clone, Debug, PartialEq)]
pub struct Gateway {
    /// Where it listens for requests: address and port.
    pub host: String,
    pub port: u16,
    /// Kubernetes service discovery: the `k=v` labels its workers' pods have, the
    /// namespace it looks in (every namespace without one), the port it reaches them on.
    pub discovery: bool,
    pub selector: Vec<(String, String)>,
    pub namespace: Option<String>,
    pub worker_port: u16,
    /// Workers given by URL.
    pub worker_urls: Vec<String>,
    pub policy: Policy,
    pub cache: CacheAware,
    pub retry: Retries,
    /// Where it serves its metrics.
    pub prometheus_host: String,
    pub prometheus_port: u16,
}

/// The words after `--name` up to the next flag (the first may be `--name=WORD`).
fn words<'a>(args: &'a [String], name: &str) -> Vec<&'a str> {
    let Some(i) = args
        .iter()
        .position(|w| w == name || w.starts_with(&format!("{name}=")))
    else {
        return Vec::new();
    };
    let first = args[i].strip_prefix(name).and_then(|w| w.strip_prefix('='));
    first
        .into_iter()
        .chain(
            args[i + 1..]
                .iter()
                .take_while(|w| !w.starts_with("--"))
                .map(String::as_str),
        )
        .collect()
}

/// A number flag: its default when absent, none when it does not parse (the program
/// would exit with a usage error).
fn number<T: std::str::FromStr>(args: &[String], name: &str, default: T) -> Option<T> {
    match flag(args, name) {
        None => Some(default),
        Some(v) => v.parse().ok(),
    }
}

/// Whether a server bound to `host` can be reached on the pod's IP.
fn listens_outside(host: &str) -> bool {
    !(host == "localhost" || host == "::1" || host.starts_with("127."))
}

/// A worker it can send requests to.
#[derive(Clone, Debug)]
pub struct Worker {
    pub pod: Obj,
    /// `http://<pod IP>:<port>`, what SMG names it by.
    pub url: String,
    pub port: u16,
    /// The model it serves (what it goes by), as SMG learns it from the worker.
    pub model: String,
}

impl Worker {
    fn of(pod: &Obj, ip: &str, port: u16) -> Self {
        Self {
            pod: pod.clone(),
            url: format!("http://{ip}:{port}"),
            port,
            model: model_server::of(pod)
                .map_or_else(|| "unknown".to_owned(), |s| s.names[0].clone()),
        }
    }
}

/// What a gateway does with one request.
pub enum Handling {
    /// Passes it to `worker` on `port`, counted through the gateway until answered.
    Forward {
        worker: Obj,
        port: u16,
        counted: InFlight,
    },
    /// Answers it itself.
    Answer(Answer, Option<InFlight>),
    /// Nothing listens on the port it was sent to.
    Refused,
}

/// A generation request the gateway found no worker for, held open while SMG's retry
/// executor backs off and tries again. It is one connection and one request, so the
/// gateway counts it once, in flight and among its requests, however many attempts it
/// takes; each backoff counts a retry.
pub struct Held {
    gateway: Gateway,
    /// The gateway pod's UID.
    uid: String,
    path: String,
    text: String,
    attempts: u32,
    counted: InFlight,
}

impl Held {
    /// A request to `path` with `body` that the gateway `pod` took (`counted`) and found
    /// no worker for at its first attempt. It waits on the heap: it keeps its gateway's
    /// whole configuration.
    pub fn new(
        gateway: &Gateway,
        pod: &Obj,
        path: &str,
        body: &[u8],
        counted: InFlight,
    ) -> Box<Self> {
        Box::new(Self {
            gateway: gateway.clone(),
            uid: meta(pod, "uid"),
            path: path.to_owned(),
            text: routing_text(path, body),
            attempts: 1,
            counted,
        })
    }

    /// The sim seconds to wait before the next attempt, counted as a retry; none once
    /// the attempts are spent.
    pub fn back_off(&mut self, serving: &Serving) -> Option<f64> {
        let delay = self.gateway.retry.delay(self.attempts - 1)?;
        serving.gateway(&self.uid, |l| l.retried(&self.path));
        Some(delay)
    }

    /// The next attempt, at sim time `now` (epoch seconds), among the workers Ready in
    /// `store` now: passed to the one picked, or held still.
    pub fn attempt(
        mut self: Box<Self>,
        store: &Store,
        serving: &Serving,
        now: f64,
    ) -> Result<Handling, Box<Self>> {
        self.attempts += 1;
        let workers = self.gateway.workers(store);
        let picked = serving.gateway(&self.uid, |l| {
            l.forget(&workers);
            l.pick(&self.gateway, &workers, &self.text, now)
        });
        let Some(i) = picked else {
            return Err(self);
        };
        let worker = &workers[i];
        // Counted in already: the load the pick added is the worker's to count out.
        self.counted.routed_to(worker.url.clone());
        let Self { counted, .. } = *self;
        Ok(Handling::Forward {
            worker: worker.pod.clone(),
            port: worker.port,
            counted,
        })
    }

    /// What the client gets once the attempts are spent, and what counts the request
    /// until that is sent.
    pub fn give_up(self: Box<Self>) -> (Answer, InFlight) {
        (no_workers(), self.counted)
    }
}

impl Gateway {
    /// The gateway `pod`'s first container runs, if it runs one.
    pub fn of(pod: &Value) -> Option<Self> {
        model_server::commands(pod)
            .iter()
            .find_map(|c| Self::from_command(c))
    }

    fn from_command(command: &[String]) -> Option<Self> {
        // What runs the program: `exec`, `env` and variable assignments.
        let start = command
            .iter()
            .position(|w| w != "exec" && w != "env" && !w.contains('='))?;
        let gateway = |p: &str| matches!(basename(p), "smg" | "sgl-model-gateway");
        let args = match &command[start..] {
            [python, m, module, args @ ..]
                if basename(python).starts_with("python")
                    && m == "-m"
                    && module == "sglang_router.launch_router" =>
            {
                args
            }
            [program, sub, args @ ..]
                if gateway(program) && matches!(sub.as_str(), "launch" | "start") =>
            {
                args
            }
            [program, args @ ..] if gateway(program) => args,
            _ => return None,
        };
        Self::parse(args)
    }

    fn parse(args: &[String]) -> Option<Self> {
        let host = |name: &str| flag(args, name).unwrap_or("0.0.0.0").to_owned();
        Some(Self {
            host: host("--host"),
            port: number(args, "--port", 30000)?,
            discovery: args.iter().any(|w| w == "--service-discovery"),
            selector: words(args, "--selector")
                .into_iter()
                .filter_map(|kv| kv.split_once('='))
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
            namespace: flag(args, "--service-discovery-namespace").map(str::to_owned),
            worker_port: number(args, "--service-discovery-port", 80)?,
            worker_urls: words(args, "--worker-urls")
                .into_iter()
                .map(str::to_owned)
                .collect(),
            policy: Policy::parse(flag(args, "--policy").unwrap_or("cache_aware"))?,
            cache: CacheAware {
                threshold: number(args, "--cache-threshold", 0.3)?,
                balance_abs: number(args, "--balance-abs-threshold", 64)?,
                balance_rel: number(args, "--balance-rel-threshold", 1.5)?,
                eviction_interval_secs: number(args, "--eviction-interval-secs", 120)?,
                max_tree_size: number(args, "--max-tree-size", 67_108_864)?,
            },
            retry: Retries {
                max_retries: number(args, "--retry-max-retries", 5)?,
                initial_backoff_ms: number(args, "--retry-initial-backoff-ms", 50)?,
                max_backoff_ms: number(args, "--retry-max-backoff-ms", 30_000)?,
                multiplier: number(args, "--retry-backoff-multiplier", 1.5)?,
                jitter: number(args, "--retry-jitter-factor", 0.2)?,
                disabled: args.iter().any(|w| w == "--disable-retries"),
            },
            prometheus_host: host("--prometheus-host"),
            prometheus_port: number(args, "--prometheus-port", 29000)?,
        })
    }

    /// Whether a pod in `ns` with `labels` is one of the workers it discovers.
    pub fn selects(&self, ns: &str, labels: &Value) -> bool {
        self.discovery
            && self.namespace.as_deref().is_none_or(|n| n == ns)
            && self
                .selector
                .iter()
                .all(|(k, v)| labels[k].as_str() == Some(v.as_str()))
    }

    /// Its healthy workers, in a stable order: the Ready pods it discovers (by name) and
    /// then the pods its `--worker-urls` name by IP that are Ready.
    pub fn workers(&self, store: &Store) -> Vec<Worker> {
        let healthy = |p: &Obj| {
            p["metadata"]["deletionTimestamp"].is_null()
                && is_ready(p)
                && p["status"]["podIP"].is_string()
        };
        let mut discovered: Vec<&Obj> = if self.discovery {
            store
                .list("/pods", self.namespace.as_deref())
                .filter(|p| self.selects(&meta(p, "namespace"), &p["metadata"]["labels"]))
                .filter(|p| healthy(p))
                .collect()
        } else {
            Vec::new()
        };
        discovered.sort_by_key(|p| (meta(p, "name"), meta(p, "namespace")));
        let mut workers: Vec<Worker> = discovered
            .into_iter()
            .map(|p| {
                let ip = p["status"]["podIP"].as_str().unwrap_or_default();
                Worker::of(p, ip, self.worker_port)
            })
            .collect();
        for url in &self.worker_urls {
            let Some((ip, port)) = url
                .strip_prefix("http://")
                .map(|a| a.trim_end_matches('/'))
                .and_then(|a| a.rsplit_once(':'))
                .and_then(|(ip, port)| Some((ip, port.parse::<u16>().ok()?)))
            else {
                continue;
            };
            if workers
                .iter()
                .any(|w| w.url == format!("http://{ip}:{port}"))
            {
                continue;
            }
            if let Some(p) = store
                .list("/pods", None)
                .find(|p| p["status"]["podIP"].as_str() == Some(ip) && healthy(p))
            {
                workers.push(Worker::of(p, ip, port));
            }
        }
        workers
    }

    /// What the gateway pod `pod` does with `method` on `path` (with `body`) sent to its
    /// `port`, at sim time `now` (epoch seconds).
    #[allow(clippy::too_many_arguments)]
    pub fn handle(
        &self,
        pod: &Obj,
        port: u64,
        store: &Store,
        serving: &Serving,
        method: &Method,
        path: &str,
        body: &[u8],
        now: f64,
    ) -> Handling {
        let uid = meta(pod, "uid");
        if port == u64::from(self.prometheus_port) && listens_outside(&self.prometheus_host) {
            let answer = match (method.as_str(), path) {
                ("GET", "/metrics") => self.metrics(store, serving, &uid),
                _ => Answer::new(
                    StatusCode::NOT_FOUND,
                    "text/plain; charset=utf-8",
                    String::new(),
                ),
            };
            return Handling::Answer(answer, None);
        }
        if port != u64::from(self.port) || !listens_outside(&self.host) {
            return Handling::Refused;
        }
        let workers = self.workers(store);
        let generating = method == Method::POST && GENERATE.contains(&path);
        let text = if generating {
            routing_text(path, body)
        } else {
            String::new()
        };
        let picked = serving.gateway(&uid, |ledger| {
            ledger.arrive(method, path);
            ledger.forget(&workers);
            if generating {
                ledger.pick(self, &workers, &text, now)
            } else {
                None
            }
        });
        let forward = |w: &Worker, counted: InFlight| Handling::Forward {
            worker: w.pod.clone(),
            port: w.port,
            counted,
        };
        if let Some(i) = picked {
            let worker = &workers[i];
            return forward(
                worker,
                serving.through_gateway(&uid, Some(worker.url.clone())),
            );
        }
        let counted = serving.through_gateway(&uid, None);
        let answer = match (method.as_str(), path) {
            _ if generating => no_workers(),
            ("GET", "/v1/models") => match workers.first() {
                Some(w) => return forward(w, counted),
                None => no_workers(),
            },
            ("GET", "/liveness" | "/health") => {
                Answer::new(StatusCode::OK, "text/plain; charset=utf-8", "OK".to_owned())
            }
            ("GET", "/readiness") if workers.is_empty() => json_answer(
                StatusCode::SERVICE_UNAVAILABLE,
                &json!({ "status": "not ready", "reason": "insufficient healthy workers" }),
            ),
            ("GET", "/readiness") => json_answer(
                StatusCode::OK,
                &json!({ "status": "ready", "healthy_workers": workers.len(),
                         "total_workers": workers.len() }),
            ),
            ("GET", "/workers") => self.list_workers(&workers, serving, &uid),
            // axum's answers for a method a route does not take and a path it lacks.
            (_, p) if GENERATE.contains(&p) || OWN.contains(&p) => Answer::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "text/plain; charset=utf-8",
                String::new(),
            ),
            _ => Answer::new(
                StatusCode::NOT_FOUND,
                "text/plain; charset=utf-8",
                String::new(),
            ),
        };
        Handling::Answer(answer, Some(counted))
    }

    /// Whether SMG's retry executor tries a request again that an attempt answered with
    /// `status`: a generation request (what its router runs through the executor) with a
    /// status SMG counts as transient, when the budget allows another attempt.
    pub fn retries(&self, method: &Method, path: &str, status: StatusCode) -> bool {
        let transient = matches!(status.as_u16(), 408 | 429 | 500 | 502 | 503 | 504);
        method == Method::POST
            && GENERATE.contains(&path)
            && transient
            && self.retry.delay(0).is_some()
    }

    /// `GET /workers`: each worker's identity, health and load through this gateway.
    fn list_workers(&self, workers: &[Worker], serving: &Serving, uid: &str) -> Answer {
        let loads = serving.gateway(uid, |l| {
            workers
                .iter()
                .map(|w| l.workers.get(&w.url).map_or(0, |load| load.active))
                .collect::<Vec<_>>()
        });
        let listed: Vec<Value> = workers
            .iter()
            .zip(loads)
            .map(|(w, load)| {
                json!({ "id": meta(&w.pod, "uid"), "url": w.url, "model_id": w.model,
                        "worker_type": "regular", "connection_mode": "http",
                        "runtime_type": "sglang", "priority": 50, "cost": 1.0,
                        "is_healthy": true, "status": "ready", "load": load })
            })
            .collect();
        json_answer(
            StatusCode::OK,
            &json!({ "workers": listed, "total": workers.len(),
                     "stats": { "prefill_count": 0, "decode_count": 0,
                                "regular_count": workers.len() } }),
        )
    }

    /// `GET /metrics` on its Prometheus port, as SMG's exporter renders them.
    fn metrics(&self, store: &Store, serving: &Serving, uid: &str) -> Answer {
        let workers = self.workers(store);
        let (active, requests, loads, retries) = serving.gateway(uid, |l| {
            let loads: Vec<u64> = workers
                .iter()
                .map(|w| l.workers.get(&w.url).map_or(0, |load| load.active))
                .collect();
            (l.active, l.requests.clone(), loads, l.retries.clone())
        });
        let mut out = String::new();
        let mut family = |name: &str, kind: &str, help: &str, samples: Vec<(String, u64)>| {
            if samples.is_empty() {
                return;
            }
            out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n"));
            for (labels, v) in samples {
                let labels = if labels.is_empty() {
                    String::new()
                } else {
                    format!("{{{labels}}}")
                };
                out.push_str(&format!("{name}{labels} {v}\n"));
            }
            out.push('\n');
        };
        family(
            "smg_http_requests_total",
            "counter",
            "Total HTTP requests by method and path",
            requests
                .into_iter()
                .map(|((method, path), n)| {
                    (
                        format!("method=\"{}\",path=\"{}\"", escape(&method), escape(&path)),
                        n,
                    )
                })
                .collect(),
        );
        family(
            "smg_http_connections_active",
            "gauge",
            "Currently active HTTP connections",
            vec![(String::new(), active)],
        );
        let mut pools: BTreeMap<&str, u64> = BTreeMap::new();
        for w in &workers {
            *pools.entry(&w.model).or_default() += 1;
        }
        family(
            "smg_worker_pool_size",
            "gauge",
            "Current worker pool size by worker_type, connection_mode, model",
            pools
                .into_iter()
                .map(|(model, n)| {
                    (
                        format!(
                            "worker_type=\"regular\",connection_mode=\"http\",model=\"{}\"",
                            escape(model)
                        ),
                        n,
                    )
                })
                .collect(),
        );
        let per_worker = |values: Vec<u64>| -> Vec<(String, u64)> {
            workers
                .iter()
                .zip(values)
                .map(|(w, v)| (format!("worker=\"{}\"", escape(&w.url)), v))
                .collect()
        };
        family(
            "smg_worker_requests_active",
            "gauge",
            "Currently running requests per worker",
            per_worker(loads),
        );
        family(
            "smg_worker_health",
            "gauge",
            "Worker health status (1=healthy, 0=unhealthy)",
            per_worker(vec![1; workers.len()]),
        );
        family(
            "smg_worker_retries_total",
            "counter",
            "Total retry attempts by worker_type and endpoint",
            retries
                .into_iter()
                .map(|(endpoint, n)| {
                    (
                        format!("worker_type=\"regular\",endpoint=\"{endpoint}\""),
                        n,
                    )
                })
                .collect(),
        );
        Answer::new(
            StatusCode::OK,
            "text/plain; version=0.0.4; charset=utf-8",
            out,
        )
    }
}

/// A label value as the Prometheus text format writes it.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// SMG's `endpoint` label of a generation path.
fn endpoint(path: &str) -> &'static str {
    match path {
        "/v1/chat/completions" => "chat",
        "/v1/completions" => "completions",
        "/generate" => "generate",
        _ => "other",
    }
}

/// SMG's answer when no worker can take a request.
fn no_workers() -> Answer {
    json_answer(
        StatusCode::SERVICE_UNAVAILABLE,
        &json!({ "error": { "type": "Service Unavailable", "code": "no_available_workers",
                            "message": "No available workers (all circuits open or unhealthy)",
                            "param": null } }),
    )
}

/// The text a request is routed on, as SMG extracts it: a chat's messages' text, a
/// completion's prompt(s), `/generate`'s text(s), joined by spaces.
fn routing_text(path: &str, body: &[u8]) -> String {
    let Ok(req) = serde_json::from_slice::<Value>(body) else {
        return String::new();
    };
    let joined = |v: &Value| match v {
        Value::String(s) => s.clone(),
        Value::Array(items) => items
            .iter()
            .filter_map(Value::as_str)
            .collect::<Vec<_>>()
            .join(" "),
        _ => String::new(),
    };
    match path {
        "/v1/chat/completions" => req["messages"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|m| content_text(&m["content"]))
            .filter(|t| !t.is_empty())
            .collect::<Vec<_>>()
            .join(" "),
        "/v1/completions" => joined(&req["prompt"]),
        _ => joined(&req["text"]),
    }
}

/// What one gateway pod has in flight and has learnt.
#[derive(Default)]
pub struct Ledger {
    /// Requests taken and not yet answered.
    active: u64,
    /// Requests taken, by method and path.
    requests: BTreeMap<(String, String), u64>,
    /// Retries, by SMG's endpoint label.
    retries: BTreeMap<&'static str, u64>,
    /// By worker URL.
    workers: BTreeMap<String, Load>,
    trees: BTreeMap<String, Tree>,
    /// Requests routed, which round-robin and random turns count.
    picks: u64,
    /// Orders uses of tree texts.
    tick: u64,
    /// When the trees were last cut back (epoch seconds).
    evicted_at: f64,
}

#[derive(Clone, Copy, Default)]
struct Load {
    active: u64,
    processed: u64,
}

impl Ledger {
    /// Counts a request in as it arrives: SMG's `RequestLogger::on_request` (a
    /// tower-http `OnRequest`, before any routing or answer) records
    /// `smg_http_requests_total{method, path}`, so a request is counted once however
    /// long it is held or retried, and before it is answered.
    fn arrive(&mut self, method: &Method, path: &str) {
        self.active += 1;
        *self
            .requests
            .entry((method.to_string(), path.to_owned()))
            .or_default() += 1;
    }

    fn retried(&mut self, path: &str) {
        *self.retries.entry(endpoint(path)).or_default() += 1;
    }

    /// Counts out a request, and the worker it went to.
    pub(super) fn finish(&mut self, worker: Option<&str>) {
        self.active = self.active.saturating_sub(1);
        if let Some(load) = worker.and_then(|w| self.workers.get_mut(w)) {
            load.active = load.active.saturating_sub(1);
        }
    }

    /// Drops what it knew of workers that are gone (their trees; their loads once
    /// nothing is in flight to them), as SMG removes a worker that discovery lost.
    fn forget(&mut self, workers: &[Worker]) {
        let present = |url: &String| workers.iter().any(|w| &w.url == url);
        self.trees.retain(|url, _| present(url));
        self.workers
            .retain(|url, load| load.active > 0 || present(url));
    }

    fn load(&self, w: &Worker) -> Load {
        self.workers.get(&w.url).copied().unwrap_or_default()
    }

    /// Which of `workers` (non-empty for an answer) takes a request with `text` at sim
    /// time `now`, counted in as its load.
    fn pick(
        &mut self,
        gateway: &Gateway,
        workers: &[Worker],
        text: &str,
        now: f64,
    ) -> Option<usize> {
        let n = workers.len();
        if n == 0 {
            return None;
        }
        self.picks += 1;
        let turn = fnv1a(&self.picks.to_string()) as usize;
        let i = match gateway.policy {
            Policy::RoundRobin => (self.picks as usize - 1) % n,
            Policy::Random => turn % n,
            Policy::PowerOfTwo if n == 1 => 0,
            Policy::PowerOfTwo => {
                let a = turn % n;
                let b = (turn / n) % (n - 1);
                let b = if b >= a { b + 1 } else { b };
                if self.load(&workers[a]).active <= self.load(&workers[b]).active {
                    a
                } else {
                    b
                }
            }
            Policy::CacheAware => self.cache_aware(&gateway.cache, workers, text, now),
        };
        let load = self.workers.entry(workers[i].url.clone()).or_default();
        load.active += 1;
        load.processed += 1;
        Some(i)
    }

    /// SMG's cache-aware choice: with loads imbalanced the least loaded worker; else the
    /// worker whose tree holds more than `threshold` of the text's start, or failing
    /// that the least loaded; the text goes into the chosen worker's tree.
    fn cache_aware(&mut self, cfg: &CacheAware, workers: &[Worker], text: &str, now: f64) -> usize {
        if now >= self.evicted_at + cfg.eviction_interval_secs as f64 {
            for tree in self.trees.values_mut() {
                tree.trim(cfg.max_tree_size);
            }
            self.evicted_at = now;
        }
        let text: String = text.chars().take(TREE_CHARS).collect();
        let loads: Vec<Load> = workers.iter().map(|w| self.load(w)).collect();
        let min = loads.iter().map(|l| l.active).min().unwrap_or(0);
        let max = loads.iter().map(|l| l.active).max().unwrap_or(0);
        let least = (0..workers.len())
            .min_by_key(|&i| (loads[i].active, loads[i].processed, i))
            .unwrap_or(0);
        let imbalanced = max - min > cfg.balance_abs && max as f64 > min as f64 * cfg.balance_rel;
        let chosen = if imbalanced {
            least
        } else {
            let chars = text.chars().count();
            let best = workers
                .iter()
                .enumerate()
                .filter_map(|(i, w)| Some((self.trees.get(&w.url)?.matched(&text), i)))
                .max_by_key(|((matched, used), i)| (*matched, *used, std::cmp::Reverse(*i)));
            match best {
                Some(((matched, _), i))
                    if chars > 0 && matched as f64 / chars as f64 > cfg.threshold =>
                {
                    i
                }
                _ => least,
            }
        };
        self.tick += 1;
        self.trees
            .entry(workers[chosen].url.clone())
            .or_default()
            .insert(text, self.tick);
        chosen
    }
}

/// The texts routed to one worker, each with when it was last used.
#[derive(Default)]
struct Tree {
    texts: BTreeMap<String, u64>,
    by_use: BTreeMap<u64, String>,
    chars: usize,
}

/// How many characters `a` and `b` start with in common.
fn common_chars(a: &str, b: &str) -> usize {
    a.chars().zip(b.chars()).take_while(|(x, y)| x == y).count()
}

impl Tree {
    /// The most characters `text` starts with in common with a text the tree holds, and
    /// when that text was last used. The text sharing the longest start with `text` is
    /// next to where `text` sorts.
    fn matched(&self, text: &str) -> (usize, u64) {
        let before = self
            .texts
            .range::<str, _>((Bound::Unbounded, Bound::Included(text)))
            .next_back();
        let after = self
            .texts
            .range::<str, _>((Bound::Excluded(text), Bound::Unbounded))
            .next();
        before
            .into_iter()
            .chain(after)
            .map(|(t, used)| (common_chars(t, text), *used))
            .max()
            .unwrap_or((0, 0))
    }

    fn insert(&mut self, text: String, tick: u64) {
        match self.texts.insert(text.clone(), tick) {
            Some(used) => {
                self.by_use.remove(&used);
            }
            None => self.chars += text.chars().count(),
        }
        self.by_use.insert(tick, text);
        while self.texts.len() > TREE_TEXTS {
            self.evict_one();
        }
    }

    /// Cuts the tree back to `max_chars`, least recently used texts first.
    fn trim(&mut self, max_chars: usize) {
        while self.chars > max_chars && self.evict_one() {}
    }

    fn evict_one(&mut self) -> bool {
        let Some((_, text)) = self.by_use.pop_first() else {
            return false;
        };
        self.texts.remove(&text);
        self.chars -= text.chars().count();
        true
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::kube::store::Key;

    fn args(line: &str) -> Vec<String> {
        line.split_whitespace().map(str::to_owned).collect()
    }

    const LINE: &str = "python3 -m sglang_router.launch_router --host 0.0.0.0 --port 30000 \
        --service-discovery --selector hypd.dev/endpoint=qwen tier=gpu \
        --service-discovery-namespace default --service-discovery-port 30000 \
        --policy cache_aware --cache-threshold 0.5 --balance-abs-threshold 2 \
        --balance-rel-threshold 1.5 --eviction-interval-secs 60 --max-tree-size 1000 \
        --prometheus-host 0.0.0.0 --prometheus-port 29000";

    fn worker(i: usize) -> Worker {
        let pod: Obj =
            Arc::new(json!({ "metadata": { "name": format!("w{i}"), "uid": format!("u{i}") } }));
        Worker::of(&pod, &format!("10.0.0.{i}"), 30000)
    }

    #[test]
    fn its_command_lines_are_read_with_smgs_defaults() {
        let g = Gateway::from_command(&args(LINE)).unwrap();
        assert_eq!(
            (g.port, g.worker_port, g.prometheus_port),
            (30000, 30000, 29000)
        );
        assert!(g.discovery);
        assert_eq!(
            g.selector,
            [
                ("hypd.dev/endpoint".to_owned(), "qwen".to_owned()),
                ("tier".to_owned(), "gpu".to_owned())
            ]
        );
        assert_eq!(g.namespace.as_deref(), Some("default"));
        assert_eq!(
            (g.policy, g.cache.threshold, g.cache.balance_abs),
            (Policy::CacheAware, 0.5, 2)
        );
        assert!(g.selects(
            "default",
            &json!({ "hypd.dev/endpoint": "qwen", "tier": "gpu", "x": "y" })
        ));
        assert!(!g.selects("default", &json!({ "hypd.dev/endpoint": "qwen" })));
        assert!(!g.selects(
            "other",
            &json!({ "hypd.dev/endpoint": "qwen", "tier": "gpu" })
        ));

        let bare = Gateway::from_command(&args("smg launch --policy round_robin --selector=app=x"))
            .unwrap();
        assert_eq!(
            (bare.port, bare.worker_port, bare.policy),
            (30000, 80, Policy::RoundRobin)
        );
        assert_eq!(bare.selector, [("app".to_owned(), "x".to_owned())]);
        assert_eq!(bare.namespace, None, "every namespace");
        assert_eq!(bare.cache.max_tree_size, 67_108_864);
        assert!(!bare.discovery);
        assert!(Gateway::from_command(&args("sgl-model-gateway --port 8080")).is_some());
        for refused in [
            "smg --policy fastest",
            "smg --port http",
            "python3 -m sglang.launch_server --model-path m",
            "vllm-router --port 8080",
        ] {
            assert_eq!(Gateway::from_command(&args(refused)), None, "{refused}");
        }
        let pod = json!({ "spec": { "containers": [{ "name": "router", "image": "lmsysorg/sglang:v0.5.4",
            "command": ["/bin/sh", "-c", LINE] }] } });
        assert_eq!(Gateway::of(&pod), Gateway::from_command(&args(LINE)));

        assert_eq!(
            g.retry,
            Retries {
                max_retries: 5,
                initial_backoff_ms: 50,
                max_backoff_ms: 30_000,
                multiplier: 1.5,
                jitter: 0.2,
                disabled: false,
            },
            "SMG's defaults"
        );
        let budget = Gateway::from_command(&args(
            "smg --retry-max-retries 15 --retry-initial-backoff-ms=1000 \
             --retry-max-backoff-ms 5000 --retry-backoff-multiplier 2 --retry-jitter-factor 0",
        ))
        .unwrap();
        assert_eq!(
            budget.retry,
            Retries {
                max_retries: 15,
                initial_backoff_ms: 1000,
                max_backoff_ms: 5000,
                multiplier: 2.0,
                jitter: 0.0,
                disabled: false,
            }
        );
        let off = Gateway::from_command(&args(&format!("{LINE} --disable-retries"))).unwrap();
        assert!(off.retry.disabled);
        assert_eq!(off.selector, g.selector, "a flag ends the selector's words");
        for refused in [
            "smg --retry-max-retries -1",
            "smg --retry-initial-backoff-ms soon",
            "smg --retry-backoff-multiplier x",
        ] {
            assert_eq!(Gateway::from_command(&args(refused)), None, "{refused}");
        }
    }

    #[test]
    fn retries_back_off_exponentially_to_their_cap_without_jitter() {
        let smg = |line: &str| Gateway::from_command(&args(line)).unwrap().retry;
        let defaults = smg("smg");
        let delays: Vec<Option<f64>> = (0..5).map(|k| defaults.delay(k)).collect();
        assert_eq!(
            delays,
            [Some(0.05), Some(0.075), Some(0.112), Some(0.168), None],
            "five attempts: four retries, cut to whole ms"
        );
        let long = smg(
            "smg --retry-max-retries 15 --retry-initial-backoff-ms 1000 --retry-max-backoff-ms 5000",
        );
        let delays: Vec<f64> = (0..).map_while(|k| long.delay(k)).collect();
        assert_eq!(delays.len(), 14);
        assert_eq!(delays[..5], [1.0, 1.5, 2.25, 3.375, 5.0], "capped at 5 s");
        assert_eq!(delays.iter().sum::<f64>(), 58.125);
        for none in [
            "smg --disable-retries",
            "smg --retry-max-retries 1",
            "smg --retry-max-retries 0",
        ] {
            assert_eq!(smg(none).delay(0), None, "{none}: one attempt");
        }
        let huge = smg("smg --retry-max-retries 4294967295");
        assert_eq!(huge.delay(4_000_000_000), Some(30.0));
        assert_eq!(huge.delay(u32::MAX), None);
    }

    #[test]
    fn a_held_request_counts_once_and_goes_to_a_worker_ready_at_a_later_attempt() {
        let g = Gateway::from_command(&args(&format!("{LINE} --retry-max-retries 3"))).unwrap();
        let mut store = Store::new();
        let gateway = store.put(
            Key::new("/pods", "default", "router"),
            json!({ "metadata": { "name": "router", "namespace": "default", "uid": "r" },
                    "status": { "phase": "Running", "podIP": "10.0.0.9",
                                "conditions": [{ "type": "Ready", "status": "True" }] } }),
        );
        let serving = Serving::default();
        let chat = json!({ "messages": [{ "role": "user", "content": "hi" }] }).to_string();
        let path = "/v1/chat/completions";
        let first = g.handle(
            &gateway,
            30000,
            &store,
            &serving,
            &Method::POST,
            path,
            chat.as_bytes(),
            0.0,
        );
        let Handling::Answer(answer, Some(counted)) = first else {
            panic!("no worker: the first attempt answers")
        };
        assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(g.retries(&Method::POST, path, answer.status));
        assert!(!g.retries(&Method::GET, "/v1/models", answer.status));
        assert!(!g.retries(&Method::POST, path, StatusCode::BAD_REQUEST));
        let metrics = |store: &Store| g.metrics(store, &serving, "r").body;
        let mut held = Held::new(&g, &gateway, path, chat.as_bytes(), counted);
        assert_eq!(held.back_off(&serving), Some(0.05));
        let mut held = held
            .attempt(&store, &serving, 1.0)
            .err()
            .expect("still none");
        let text = metrics(&store);
        assert!(text.contains("\nsmg_http_connections_active 1\n"), "{text}");
        assert!(
            text.contains(
                "smg_http_requests_total{method=\"POST\",path=\"/v1/chat/completions\"} 1\n"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "smg_worker_retries_total{worker_type=\"regular\",endpoint=\"chat\"} 1\n"
            ),
            "{text}"
        );

        // A worker is Ready by the next attempt: it takes the request.
        store.put(
            Key::new("/pods", "default", "w0"),
            json!({ "metadata": { "name": "w0", "namespace": "default", "uid": "u0",
                                  "labels": { "hypd.dev/endpoint": "qwen", "tier": "gpu" } },
                    "status": { "phase": "Running", "podIP": "10.0.0.1",
                                "conditions": [{ "type": "Ready", "status": "True" }] } }),
        );
        assert_eq!(held.back_off(&serving), Some(0.075));
        let Ok(Handling::Forward {
            worker,
            port,
            counted,
        }) = held.attempt(&store, &serving, 2.0)
        else {
            panic!("the worker takes it")
        };
        assert_eq!((meta(&worker, "name").as_str(), port), ("w0", 30000));
        let text = metrics(&store);
        assert!(text.contains("\nsmg_http_connections_active 1\n"), "{text}");
        assert!(
            text.contains("smg_worker_requests_active{worker=\"http://10.0.0.1:30000\"} 1\n"),
            "{text}"
        );
        assert!(text.contains("endpoint=\"chat\"} 2\n"), "{text}");
        assert!(
            text.contains("path=\"/v1/chat/completions\"} 1\n"),
            "one request"
        );
        drop(counted);
        let text = metrics(&store);
        assert!(text.contains("\nsmg_http_connections_active 0\n"), "{text}");
        assert!(
            text.contains("worker=\"http://10.0.0.1:30000\"} 0\n"),
            "{text}"
        );

        // Without a worker its three attempts are spent after two retries.
        store.remove(&Key::new("/pods", "default", "w0"));
        let Handling::Answer(_, Some(counted)) = g.handle(
            &gateway,
            30000,
            &store,
            &serving,
            &Method::POST,
            "/generate",
            b"{}",
            3.0,
        ) else {
            panic!("no worker")
        };
        let mut held = Held::new(&g, &gateway, "/generate", b"{}", counted);
        for _ in 0..2 {
            assert!(held.back_off(&serving).is_some());
            held = held.attempt(&store, &serving, 4.0).err().unwrap();
        }
        assert_eq!(held.back_off(&serving), None);
        let (answer, counted) = held.give_up();
        assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(
            answer.body.contains("no_available_workers"),
            "{}",
            answer.body
        );
        assert!(metrics(&store).contains("\nsmg_http_connections_active 1\n"));
        drop(counted);
        let text = metrics(&store);
        assert!(text.contains("\nsmg_http_connections_active 0\n"), "{text}");
        assert!(text.contains("endpoint=\"generate\"} 2\n"), "{text}");
    }

    #[test]
    fn cache_aware_keeps_a_prefix_on_its_worker_until_loads_are_imbalanced() {
        let g = Gateway::from_command(&args(LINE)).unwrap();
        let workers: Vec<Worker> = (0..3).map(worker).collect();
        let mut l = Ledger::default();
        let system = "You are a careful assistant who answers in one line. ";
        let first = l
            .pick(&g, &workers, &format!("{system}What is a pod?"), 0.0)
            .unwrap();
        assert_eq!(first, 0, "nothing cached: the least loaded, first in order");
        // The same long start: the same worker, however loaded, while the spread is
        // within the thresholds (2 above the idlest, 1.5 times as many).
        let again = l
            .pick(&g, &workers, &format!("{system}What is a node?"), 1.0)
            .unwrap();
        assert_eq!(again, first);
        // Another text goes where the load is least.
        let other = l
            .pick(
                &g,
                &workers,
                "Translate this sentence into French please",
                2.0,
            )
            .unwrap();
        assert_eq!(other, 1);
        // A third on worker 0 (3 against none on worker 2) makes the loads imbalanced
        // (more than 2 apart, more than 1.5 times): the idlest takes the next, cached
        // or not.
        l.pick(&g, &workers, &format!("{system}What is a job?"), 3.0)
            .unwrap();
        let spread = l
            .pick(&g, &workers, &format!("{system}What is a volume?"), 4.0)
            .unwrap();
        assert_eq!(spread, 2);
        l.finish(Some(&workers[0].url));
        assert_eq!(l.load(&workers[0]).active, 2);
        assert_eq!(l.active, 0, "the gateway counted none of these in");
    }

    #[test]
    fn the_other_policies_take_turns_hash_and_compare_two() {
        let mut g = Gateway::from_command(&args(LINE)).unwrap();
        let workers: Vec<Worker> = (0..3).map(worker).collect();
        g.policy = Policy::RoundRobin;
        let mut l = Ledger::default();
        let turns: Vec<usize> = (0..4)
            .map(|_| l.pick(&g, &workers, "", 0.0).unwrap())
            .collect();
        assert_eq!(turns, [0, 1, 2, 0]);
        g.policy = Policy::Random;
        let (mut a, mut b) = (Ledger::default(), Ledger::default());
        let ra: Vec<usize> = (0..8)
            .map(|_| a.pick(&g, &workers, "", 0.0).unwrap())
            .collect();
        let rb: Vec<usize> = (0..8)
            .map(|_| b.pick(&g, &workers, "", 0.0).unwrap())
            .collect();
        assert_eq!(ra, rb, "deterministic");
        g.policy = Policy::PowerOfTwo;
        let mut l = Ledger::default();
        for _ in 0..30 {
            l.pick(&g, &workers, "", 0.0);
        }
        let loads: Vec<u64> = workers.iter().map(|w| l.load(w).active).collect();
        assert!(
            loads.iter().max().unwrap() - loads.iter().min().unwrap() <= 2,
            "{loads:?}"
        );
        assert_eq!(l.pick(&g, &[], "", 0.0), None);
    }

    #[test]
    fn trees_match_through_sorted_neighbours_and_evict_least_recently_used() {
        let mut t = Tree::default();
        t.insert("abcdef".to_owned(), 1);
        t.insert("abxyz".to_owned(), 2);
        t.insert("zzz".to_owned(), 3);
        assert_eq!(t.matched("abcdxx"), (4, 1));
        assert_eq!(t.matched("abx"), (3, 2));
        assert_eq!(t.matched("q"), (0, 3));
        t.insert("abcdef".to_owned(), 4);
        t.trim(9);
        assert_eq!(t.chars, 9);
        assert!(
            !t.texts.contains_key("abxyz"),
            "the least recently used went first"
        );
        assert!(t.texts.contains_key("abcdef"));
    }

    #[test]
    fn routing_text_is_what_smg_extracts() {
        let chat = json!({ "messages": [{ "role": "system", "content": "Be brief." },
                                        { "role": "user", "content": [{ "type": "text", "text": "Hi" }] }] });
        assert_eq!(
            routing_text("/v1/chat/completions", chat.to_string().as_bytes()),
            "Be brief. Hi"
        );
        let text = json!({ "prompt": ["a b", "c"] });
        assert_eq!(
            routing_text("/v1/completions", text.to_string().as_bytes()),
            "a b c"
        );
        assert_eq!(routing_text("/generate", br#"{"text": "x y"}"#), "x y");
        assert_eq!(routing_text("/generate", b"not json"), "");
    }
}
