//! A Prometheus server (`quay.io/prometheus/prometheus`, `prom/prometheus`) as the service
//! proxy finds it in a pod: it reads its configuration from the ConfigMap volume mounted
//! where `--config.file` points, scrapes each static target every `scrape_interval` on
//! the sim's clock through the same in-cluster resolution KEDA's fetches use
//! ([`service_proxy::get`]), and answers `/-/ready`, `/-/healthy` and `/api/v1/query`
//! with a subset of PromQL (selectors, `rate`/`increase`/`irate`, `sum`/`max`/`min`/
//! `avg`/`count`) evaluated as Prometheus evaluates it. The sim runs no process: what a
//! server scraped is kept beside the store per Prometheus pod UID ([`Tsdbs`], inside the
//! cluster's [`Serving`]), never in an object, so a new pod starts empty as Prometheus
//! on an emptyDir does, and scraping writes nothing to the store. The text format is
//! read by the one parser KEDA's `metrics-api` scaler also uses ([`families`]).

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::{Mutex, MutexGuard};

use axum::http::{Method, StatusCode};
use regex::Regex;
use serde_json::{Value, json};

use super::model_server::{Answer, Serving, basename, flag};
use super::service_proxy::{self, Unreachable};
use super::store::{Store, meta};
use crate::clock::reached;
use crate::kube::time::parse_rfc3339;

/// The image repositories that run Prometheus, whatever their tag.
pub const IMAGES: [&str; 3] = [
    "quay.io/prometheus/prometheus",
    "prom/prometheus",
    "docker.io/prom/prometheus",
];
/// The image's default CMD, used when a container gives no args of its own.
const IMAGE_CMD: [&str; 2] = [
    "--config.file=/etc/prometheus/prometheus.yml",
    "--storage.tsdb.path=/prometheus",
];
/// The image's working directory, against which a relative `--config.file` (its
/// default, `prometheus.yml`) is read.
const WORKING_DIR: &str = "/prometheus";
/// `--web.listen-address`'s default port.
pub const DEFAULT_PORT: u16 = 9090;
/// `--storage.tsdb.retention.time`'s default: 15 days.
const DEFAULT_RETENTION_MS: i64 = 15 * 86_400_000;
/// `global.scrape_interval`'s and `global.scrape_timeout`'s defaults.
const DEFAULT_SCRAPE_MS: i64 = 60_000;
const DEFAULT_TIMEOUT_MS: i64 = 10_000;
/// How far back an instant selector looks for a series' latest sample.
const LOOKBACK_MS: i64 = 300_000;
/// Samples kept per series at most, whatever the retention allows: the sim keeps them
/// in memory, and 4096 is 17 hours at a 15 s interval, far past any test's window.
pub const MAX_SAMPLES_PER_SERIES: usize = 4096;
/// Prometheus's staleness marker: a NaN of this bit pattern, written when a series
/// leaves its target's scrape or the target goes down, which ends its lookback.
const STALE_NAN: u64 = 0x7ff0_0000_0000_0002;

/// A series' labels, `__name__` among them.
pub type Labels = BTreeMap<String, String>;

/// A Prometheus server as its container starts it.
#[derive(Clone, Debug, PartialEq)]
pub struct Server {
    /// `--config.file`, absolute.
    pub config_file: String,
    pub retention_ms: i64,
    pub port: u16,
}

/// The image's repository, without tag or digest.
fn repository(image: &str) -> &str {
    let image = image.split('@').next().unwrap_or(image);
    match image.rfind(':') {
        Some(i) if !image[i..].contains('/') => &image[..i],
        _ => image,
    }
}

/// The Prometheus server `pod`'s first container runs, if it runs one.
pub fn of(pod: &Value) -> Option<Server> {
    let c = &pod["spec"]["containers"][0];
    if !IMAGES.contains(&repository(c["image"].as_str()?)) {
        return None;
    }
    let words = |k: &str| -> Vec<String> {
        c[k].as_array()
            .into_iter()
            .flatten()
            .filter_map(|w| w.as_str().map(str::to_owned))
            .collect()
    };
    let command = words("command");
    let mut args = words("args");
    // The entrypoint is `/bin/prometheus`; a command that is another program is no
    // Prometheus.
    if let Some(first) = command.first() {
        if basename(first) != "prometheus" {
            return None;
        }
        args = command[1..].iter().cloned().chain(args).collect();
    } else if args.is_empty() {
        args = IMAGE_CMD.iter().map(|s| (*s).to_owned()).collect();
    }
    let value = |name: &str| flag(&args, &format!("--{name}")).map(str::to_owned);
    let config = value("config.file").unwrap_or_else(|| "prometheus.yml".to_owned());
    let config_file = if config.starts_with('/') {
        config
    } else {
        format!("{WORKING_DIR}/{}", config.trim_start_matches("./"))
    };
    let retention_ms = value("storage.tsdb.retention.time")
        .and_then(|d| parse_duration(&d))
        .filter(|d| *d > 0)
        .unwrap_or(DEFAULT_RETENTION_MS);
    let port = value("web.listen-address")
        .and_then(|a| a.rsplit(':').next().and_then(|p| p.parse().ok()))
        .unwrap_or(DEFAULT_PORT);
    Some(Server {
        config_file,
        retention_ms,
        port,
    })
}

/// A Prometheus duration (`15s`, `1m`, `1h30m`, `500ms`, `2d`, `1w`, `1y`) in
/// milliseconds: units largest first, each at most once, as `model.ParseDuration` takes
/// them.
pub fn parse_duration(s: &str) -> Option<i64> {
    if s == "0" {
        return Some(0);
    }
    const UNITS: [(&str, i64); 7] = [
        ("y", 365 * 86_400_000),
        ("w", 7 * 86_400_000),
        ("d", 86_400_000),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1000),
        ("ms", 1),
    ];
    let mut rest = s;
    let mut next_unit = 0;
    let mut total: i64 = 0;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit())?;
        if digits == 0 {
            return None;
        }
        let n: i64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let unit_len = if rest.starts_with("ms") {
            2
        } else {
            rest.chars().next()?.len_utf8()
        };
        let unit = &rest[..unit_len];
        let i = UNITS[next_unit..].iter().position(|(u, _)| *u == unit)? + next_unit;
        total = total.checked_add(n.checked_mul(UNITS[i].1)?)?;
        next_unit = i + 1;
        rest = &rest[unit_len..];
    }
    Some(total)
}

/// One scrape job of the configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct Job {
    pub name: String,
    pub interval_ms: i64,
    pub metrics_path: String,
    pub scheme: String,
    /// Each target's address and the labels its static config gives it.
    pub targets: Vec<(String, Labels)>,
}

/// A configuration as Prometheus loads it.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    pub jobs: Vec<Job>,
}

/// Why the server could not load its configuration, as its log says it before it exits 1.
pub fn load_error(file: &str, err: &str) -> String {
    format!("Error loading config (--config.file={file}) file={file} err=\"{err}\"")
}

/// The file at `path` in `pod`'s container, if a ConfigMap volume mounted at its
/// directory (or above) has it: its text, or Go's error opening it.
fn read_file(store: &Store, pod: &Value, path: &str) -> Result<String, String> {
    let missing = || format!("open {path}: no such file or directory");
    let c = &pod["spec"]["containers"][0];
    let mount = c["volumeMounts"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| {
            let at = m["mountPath"].as_str()?.trim_end_matches('/');
            let rel = path.strip_prefix(at)?.strip_prefix('/')?;
            let rel = match m["subPath"].as_str() {
                Some(sub) if !sub.is_empty() => format!("{sub}/{rel}"),
                _ => rel.to_owned(),
            };
            Some((at.len(), m["name"].as_str()?.to_owned(), rel))
        })
        .max_by_key(|(len, _, _)| *len);
    let Some((_, volume, rel)) = mount else {
        return Err(missing());
    };
    let vol = pod["spec"]["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|v| v["name"] == volume.as_str())
        .ok_or_else(missing)?;
    let cm = &vol["configMap"];
    let name = cm["name"].as_str().ok_or_else(missing)?;
    let key = match cm["items"].as_array() {
        Some(items) => items
            .iter()
            .find(|i| i["path"].as_str() == Some(&rel))
            .and_then(|i| i["key"].as_str())
            .ok_or_else(missing)?
            .to_owned(),
        None => rel,
    };
    let ns = meta(pod, "namespace");
    store
        .get(&super::store::Key::new("/configmaps", &ns, name))
        .and_then(|o| o["data"][key.as_str()].as_str().map(str::to_owned))
        .ok_or_else(missing)
}

/// The configuration `server` in `pod` loads from the store, or the log line with which
/// it gives up.
pub fn load(store: &Store, pod: &Value, server: &Server) -> Result<Config, String> {
    let file = &server.config_file;
    let text = read_file(store, pod, file).map_err(|e| load_error(file, &e))?;
    parse_config(&text, file).map_err(|e| load_error(file, &e))
}

/// A configuration's text, checked as Prometheus checks the parts the sim honours.
pub fn parse_config(text: &str, file: &str) -> Result<Config, String> {
    let doc: Value = if text.trim().is_empty() {
        json!({})
    } else {
        serde_yaml::from_str(text).map_err(|e| format!("parsing YAML file {file}: {e}"))?
    };
    if !doc.is_object() && !doc.is_null() {
        return Err(format!(
            "parsing YAML file {file}: yaml: unmarshal errors: cannot unmarshal into config.plain"
        ));
    }
    let duration = |v: &Value, default: i64| -> Result<i64, String> {
        match v.as_str() {
            None if v.is_null() => Ok(default),
            Some(s) => parse_duration(s).ok_or_else(|| {
                format!("parsing YAML file {file}: not a valid duration string: \"{s}\"")
            }),
            None => Err(format!("parsing YAML file {file}: invalid duration {v}")),
        }
    };
    let global = &doc["global"];
    let interval = duration(&global["scrape_interval"], DEFAULT_SCRAPE_MS)?;
    let timeout = duration(&global["scrape_timeout"], DEFAULT_TIMEOUT_MS.min(interval))?;
    if timeout > interval {
        return Err(format!(
            "parsing YAML file {file}: global scrape timeout greater than scrape interval"
        ));
    }
    let mut jobs: Vec<Job> = Vec::new();
    for sc in doc["scrape_configs"].as_array().into_iter().flatten() {
        let name = sc["job_name"].as_str().unwrap_or_default().to_owned();
        if name.is_empty() {
            return Err(format!("parsing YAML file {file}: job_name is empty"));
        }
        if jobs.iter().any(|j| j.name == name) {
            return Err(format!(
                "parsing YAML file {file}: found multiple scrape configs with job name \"{name}\""
            ));
        }
        let job_interval = duration(&sc["scrape_interval"], interval)?;
        let job_timeout = duration(&sc["scrape_timeout"], timeout.min(job_interval))?;
        if job_timeout > job_interval {
            return Err(format!(
                "parsing YAML file {file}: scrape timeout greater than scrape interval for scrape config with job name \"{name}\""
            ));
        }
        let scheme = sc["scheme"].as_str().unwrap_or("http").to_owned();
        if scheme != "http" && scheme != "https" {
            return Err(format!(
                "parsing YAML file {file}: invalid scheme {scheme}, must be http or https"
            ));
        }
        let mut targets = Vec::new();
        for st in sc["static_configs"].as_array().into_iter().flatten() {
            let labels: Labels = st["labels"]
                .as_object()
                .into_iter()
                .flatten()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
                .collect();
            for t in st["targets"].as_array().into_iter().flatten() {
                let address = t.as_str().unwrap_or_default();
                if address.contains('/') {
                    return Err(format!(
                        "parsing YAML file {file}: \"{address}\" is not a valid hostname"
                    ));
                }
                targets.push((address.to_owned(), labels.clone()));
            }
        }
        jobs.push(Job {
            name,
            interval_ms: job_interval,
            metrics_path: sc["metrics_path"].as_str().unwrap_or("/metrics").to_owned(),
            scheme,
            targets,
        });
    }
    Ok(Config { jobs })
}

/// What each Prometheus pod has stored, by pod UID.
#[derive(Default)]
pub struct Tsdbs(Mutex<HashMap<String, Tsdb>>);

impl Tsdbs {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Tsdb>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// One server's storage: its series' samples (milliseconds, value) and its targets'
/// next scrapes and last scrapes' series.
#[derive(Default)]
pub struct Tsdb {
    series: BTreeMap<Labels, VecDeque<(i64, f64)>>,
    /// By (job, target address): when it is next scraped (ms) and what its last scrape
    /// returned, for the staleness markers.
    targets: BTreeMap<(String, String), (i64, BTreeSet<Labels>)>,
}

impl Tsdb {
    /// Appends what one scrape of a target gave at `t` (ms): its samples (with target
    /// labels) and `up`; a series of the previous scrape that is gone gets a staleness
    /// marker. Drops what `retention_ms` no longer keeps.
    pub fn append(
        &mut self,
        key: (String, String),
        t: i64,
        samples: Vec<(Labels, f64)>,
        retention_ms: i64,
    ) {
        let seen: BTreeSet<Labels> = samples
            .iter()
            .filter(|(l, _)| l.get("__name__").map(String::as_str) != Some("up"))
            .map(|(l, _)| l.clone())
            .collect();
        let before = self
            .targets
            .get(&key)
            .map(|(_, s)| s.clone())
            .unwrap_or_default();
        for gone in before.difference(&seen) {
            self.push(gone.clone(), t, f64::from_bits(STALE_NAN));
        }
        for (labels, v) in samples {
            self.push(labels, t, v);
        }
        self.targets.entry(key).or_default().1 = seen;
        let cutoff = t - retention_ms;
        self.series.retain(|_, s| {
            while s.front().is_some_and(|(ts, _)| *ts < cutoff) {
                s.pop_front();
            }
            !s.is_empty()
        });
    }

    fn push(&mut self, labels: Labels, t: i64, v: f64) {
        let s = self.series.entry(labels).or_default();
        // A sample no newer than the last is out of order, which Prometheus refuses.
        if s.back().is_some_and(|(last, _)| *last >= t) {
            return;
        }
        s.push_back((t, v));
        if s.len() > MAX_SAMPLES_PER_SERIES {
            s.pop_front();
        }
    }
}

fn is_stale(v: f64) -> bool {
    v.to_bits() == STALE_NAN
}

/// A scrape that is due: the server's pod, the job and the target.
struct Due {
    uid: String,
    ns: String,
    job: Job,
    target: (String, Labels),
    retention_ms: i64,
}

/// One pass of every Ready Prometheus server's scrape loops at `now` (epoch seconds):
/// each target whose scrape is due is fetched and stored; the next scrapes are the
/// pass's deadlines. Nothing is written to the store.
pub fn scrape(store: &Store, serving: &Serving, now: f64) {
    let t = (now * 1000.0).round() as i64;
    let tsdbs = serving.prometheus();
    let mut due = Vec::new();
    let mut live = BTreeSet::new();
    {
        let mut all = tsdbs.lock();
        for pod in store.list("/pods", None) {
            let Some(server) = of(pod) else { continue };
            let uid = meta(pod, "uid");
            live.insert(uid.clone());
            if pod["metadata"]["deletionTimestamp"].is_string()
                || !super::controllers::is_ready(pod)
            {
                continue;
            }
            let Ok(config) = load(store, pod, &server) else {
                continue;
            };
            let tsdb = all.entry(uid.clone()).or_default();
            for job in &config.jobs {
                for target in &job.targets {
                    let key = (job.name.clone(), target.0.clone());
                    // The first scrape of a target comes at once.
                    let next = tsdb.targets.get(&key).map_or(t, |(n, _)| *n);
                    if reached(t as f64, next as f64) {
                        let after = if next + job.interval_ms > t {
                            next + job.interval_ms
                        } else {
                            t + job.interval_ms
                        };
                        tsdb.targets.entry(key).or_default().0 = after;
                        reached(now, after as f64 / 1000.0);
                        due.push(Due {
                            uid: uid.clone(),
                            ns: meta(pod, "namespace"),
                            job: job.clone(),
                            target: target.clone(),
                            retention_ms: server.retention_ms,
                        });
                    } else {
                        reached(now, next as f64 / 1000.0);
                    }
                }
            }
        }
        all.retain(|uid, _| live.contains(uid));
    }
    // Fetched with the storage let go: a server may scrape itself.
    let scraped: Vec<(Due, Vec<(Labels, f64)>)> = due
        .into_iter()
        .map(|d| {
            let samples = scrape_target(store, serving, &d, now);
            (d, samples)
        })
        .collect();
    let mut all = tsdbs.lock();
    for (d, samples) in scraped {
        if let Some(tsdb) = all.get_mut(&d.uid) {
            let key = (d.job.name.clone(), d.target.0.clone());
            tsdb.append(key, t, samples, d.retention_ms);
        }
    }
}

/// The samples of one scrape of `d`'s target, with its `job` and `instance` labels (a
/// scraped label of the same name kept as `exported_<name>`, as `honor_labels: false`
/// does), and `up`.
fn scrape_target(store: &Store, serving: &Serving, d: &Due, now: f64) -> Vec<(Labels, f64)> {
    let (address, extra) = &d.target;
    let mut target = extra.clone();
    target.insert("job".to_owned(), d.job.name.clone());
    target.insert("instance".to_owned(), address.clone());
    let (host, port) = match address.rsplit_once(':') {
        Some((h, p)) => (h, p.parse::<u16>().ok()),
        None => (
            address.as_str(),
            Some(if d.job.scheme == "https" { 443 } else { 80 }),
        ),
    };
    let body = port.and_then(|port| {
        let svc = service_proxy::resolve(store, host, &d.ns)?;
        match service_proxy::get(store, serving, svc, port, &d.job.metrics_path, now) {
            Ok((200, body)) if d.job.scheme == "http" => Some(body),
            Ok(_) | Err(Unreachable::Refused(_) | Unreachable::Timeout) => None,
        }
    });
    let parsed = body.and_then(|b| families(&b).ok());
    let mut out = Vec::new();
    if let Some(families) = &parsed {
        for (_, samples) in families.values() {
            for (name, labels, v) in samples {
                let mut l: Labels = Labels::new();
                for (k, v) in labels {
                    let k = if target.contains_key(k) {
                        format!("exported_{k}")
                    } else {
                        k.clone()
                    };
                    l.insert(k, v.clone());
                }
                l.extend(target.clone());
                l.insert("__name__".to_owned(), name.clone());
                out.push((l, *v));
            }
        }
    }
    let mut up = target;
    up.insert("__name__".to_owned(), "up".to_owned());
    out.push((up, if parsed.is_some() { 1.0 } else { 0.0 }));
    out
}

/// One sample of the Prometheus text format: its name, labels and value.
pub type Sample = (String, Vec<(String, String)>, f64);

/// The metric families of a Prometheus text exposition: each family's type (`untyped`
/// without a TYPE line) and samples, a histogram's or summary's series under its own
/// name.
pub fn families(body: &str) -> Result<BTreeMap<String, (String, Vec<Sample>)>, String> {
    let mut out: BTreeMap<String, (String, Vec<Sample>)> = BTreeMap::new();
    let failed = |n: usize, what: &str| {
        format!("prometheus format parsing error: text format parsing error in line {n}: {what}")
    };
    for (i, line) in body.lines().enumerate() {
        let n = i + 1;
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        if let Some(comment) = line.strip_prefix('#') {
            let words: Vec<&str> = comment.split_whitespace().collect();
            if let ["TYPE", name, kind] = words.as_slice() {
                if !matches!(
                    *kind,
                    "counter" | "gauge" | "histogram" | "summary" | "untyped"
                ) {
                    return Err(failed(n, &format!("unknown metric type \"{kind}\"")));
                }
                out.entry((*name).to_owned())
                    .or_insert_with(|| ((*kind).to_owned(), Vec::new()))
                    .0 = (*kind).to_owned();
            }
            continue;
        }
        let name_end = line
            .find(|c: char| c == '{' || c.is_whitespace())
            .unwrap_or(line.len());
        let name = &line[..name_end];
        if name.is_empty() {
            return Err(failed(n, "invalid metric name"));
        }
        let mut rest = &line[name_end..];
        let mut labels = Vec::new();
        if let Some(inner) = rest.strip_prefix('{') {
            let mut chars = inner.char_indices().peekable();
            let mut end = None;
            loop {
                while chars
                    .next_if(|(_, c)| c.is_whitespace() || *c == ',')
                    .is_some()
                {}
                match chars.peek() {
                    Some((j, '}')) => {
                        end = Some(*j);
                        break;
                    }
                    None => break,
                    _ => {}
                }
                let label: String = std::iter::from_fn(|| {
                    chars
                        .next_if(|(_, c)| c.is_alphanumeric() || *c == '_')
                        .map(|(_, c)| c)
                })
                .collect();
                if label.is_empty()
                    || chars.next().map(|(_, c)| c) != Some('=')
                    || chars.next().map(|(_, c)| c) != Some('"')
                {
                    return Err(failed(
                        n,
                        &format!("invalid label name for metric \"{name}\""),
                    ));
                }
                let mut value = String::new();
                loop {
                    match chars.next().map(|(_, c)| c) {
                        Some('"') => break,
                        Some('\\') => match chars.next().map(|(_, c)| c) {
                            Some('n') => value.push('\n'),
                            Some(c) => value.push(c),
                            None => return Err(failed(n, "unexpected end of label value")),
                        },
                        Some(c) => value.push(c),
                        None => return Err(failed(n, "unexpected end of label value")),
                    }
                }
                labels.push((label, value));
            }
            let Some(end) = end else {
                return Err(failed(n, "unexpected end of label set"));
            };
            rest = &inner[end + 1..];
        }
        let value = rest.split_whitespace().next().unwrap_or_default();
        let value = match value {
            "+Inf" | "Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            "NaN" => f64::NAN,
            v => v
                .parse::<f64>()
                .map_err(|_| failed(n, &format!("expected float as value, got \"{v}\"")))?,
        };
        // A histogram's or summary's series belong to its family.
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .filter_map(|s| name.strip_suffix(s))
            .find(|base| {
                out.get(*base)
                    .is_some_and(|(k, _)| k == "histogram" || k == "summary")
            })
            .unwrap_or(name);
        out.entry(family.to_owned())
            .or_insert_with(|| ("untyped".to_owned(), Vec::new()))
            .1
            .push((name.to_owned(), labels, value));
    }
    Ok(out)
}

// ---- PromQL ----

#[derive(Clone, Copy, Debug, PartialEq)]
enum Func {
    Rate,
    Increase,
    Irate,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Agg {
    Sum,
    Max,
    Min,
    Avg,
    Count,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Op {
    Eq,
    Ne,
    Re,
    Nre,
}

#[derive(Clone, Debug)]
struct Matcher {
    label: String,
    op: Op,
    value: String,
    /// The value as a regex, anchored at both ends as Prometheus anchors it.
    re: Option<Regex>,
}

impl Matcher {
    fn matches(&self, v: &str) -> bool {
        match (self.op, &self.re) {
            (Op::Eq, _) => v == self.value,
            (Op::Ne, _) => v != self.value,
            (Op::Re, Some(re)) => re.is_match(v),
            (Op::Nre, Some(re)) => !re.is_match(v),
            _ => false,
        }
    }
}

/// A parsed expression of the subset.
#[derive(Clone, Debug)]
pub struct Expr(Node);

#[derive(Clone, Debug)]
enum Node {
    Number(f64),
    Vector(Vec<Matcher>),
    Matrix(Vec<Matcher>, i64),
    Call(Func, Box<Node>),
    Aggregate {
        op: Agg,
        without: bool,
        labels: Vec<String>,
        arg: Box<Node>,
    },
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Scalar,
    Vector,
    Matrix,
}

impl Node {
    fn kind(&self) -> Kind {
        match self {
            Node::Number(_) => Kind::Scalar,
            Node::Matrix(..) => Kind::Matrix,
            _ => Kind::Vector,
        }
    }
}

fn kind_name(k: Kind) -> &'static str {
    match k {
        Kind::Scalar => "scalar",
        Kind::Vector => "instant vector",
        Kind::Matrix => "range vector",
    }
}

/// Functions Prometheus has that this server does not evaluate.
const UNSUPPORTED: &[&str] = &[
    "abs",
    "absent",
    "avg_over_time",
    "ceil",
    "changes",
    "clamp",
    "clamp_max",
    "clamp_min",
    "count_over_time",
    "delta",
    "deriv",
    "floor",
    "histogram_quantile",
    "idelta",
    "label_replace",
    "max_over_time",
    "min_over_time",
    "resets",
    "round",
    "scalar",
    "sort",
    "sort_desc",
    "sum_over_time",
    "time",
    "vector",
    "topk",
    "bottomk",
    "quantile",
    "stddev",
    "stdvar",
    "group",
    "count_values",
];

struct Parser<'a> {
    src: &'a str,
    pos: usize,
}

impl<'a> Parser<'a> {
    /// `1:COL: parse error: WHAT` at byte `at`, as Prometheus positions its errors.
    fn error(&self, at: usize, what: &str) -> String {
        let before = &self.src[..at.min(self.src.len())];
        let line = before.matches('\n').count() + 1;
        let col = before.rsplit('\n').next().unwrap_or("").chars().count() + 1;
        format!("{line}:{col}: parse error: {what}")
    }

    fn skip_space(&mut self) {
        while let Some(c) = self.peek() {
            if c.is_whitespace() {
                self.pos += c.len_utf8();
            } else if c == '#' {
                // A comment runs to the end of its line.
                while let Some(c) = self.peek() {
                    self.pos += c.len_utf8();
                    if c == '\n' {
                        break;
                    }
                }
            } else {
                break;
            }
        }
    }

    fn peek(&self) -> Option<char> {
        self.src[self.pos..].chars().next()
    }

    fn eat(&mut self, c: char) -> bool {
        self.skip_space();
        if self.peek() == Some(c) {
            self.pos += c.len_utf8();
            true
        } else {
            false
        }
    }

    fn expect(&mut self, c: char, context: &str) -> Result<(), String> {
        if self.eat(c) {
            return Ok(());
        }
        Err(self.unexpected(context))
    }

    /// What Prometheus says of the token at the current position.
    fn unexpected(&self, context: &str) -> String {
        let what = match self.peek() {
            None => "end of input".to_owned(),
            Some(c) => format!("character: '{c}'"),
        };
        let what = if context.is_empty() {
            format!("unexpected {what}")
        } else {
            format!("unexpected {what} {context}")
        };
        self.error(self.pos, &what)
    }

    fn ident(&mut self) -> Option<String> {
        self.skip_space();
        let rest = &self.src[self.pos..];
        let mut len = 0;
        for (i, c) in rest.char_indices() {
            let ok =
                c.is_ascii_alphabetic() || c == '_' || c == ':' || (i > 0 && c.is_ascii_digit());
            if !ok {
                break;
            }
            len = i + c.len_utf8();
        }
        if len == 0 {
            return None;
        }
        self.pos += len;
        Some(rest[..len].to_owned())
    }

    fn string(&mut self) -> Result<String, String> {
        self.skip_space();
        let start = self.pos;
        let Some(quote) = self.peek().filter(|c| matches!(c, '"' | '\'' | '`')) else {
            return Err(self.unexpected("in label matching, expected string"));
        };
        self.pos += 1;
        let mut out = String::new();
        loop {
            let Some(c) = self.peek() else {
                return Err(self.error(start, "unterminated quoted string"));
            };
            self.pos += c.len_utf8();
            if c == quote {
                return Ok(out);
            }
            if c == '\\' && quote != '`' {
                let Some(e) = self.peek() else {
                    return Err(self.error(start, "unterminated quoted string"));
                };
                self.pos += e.len_utf8();
                out.push(match e {
                    'n' => '\n',
                    't' => '\t',
                    'r' => '\r',
                    'a' => '\u{7}',
                    'b' => '\u{8}',
                    'f' => '\u{c}',
                    'v' => '\u{b}',
                    '\\' | '"' | '\'' => e,
                    other => {
                        return Err(self.error(
                            self.pos - other.len_utf8() - 1,
                            &format!("unknown escape sequence '{other}'"),
                        ));
                    }
                });
            } else {
                out.push(c);
            }
        }
    }

    fn expr(&mut self) -> Result<Node, String> {
        self.skip_space();
        let start = self.pos;
        match self.peek() {
            None => Err(self.error(start, "no expression found in input")),
            Some(c) if c.is_ascii_digit() || c == '.' => self.number(),
            Some('{') => self.selector(None, start),
            Some(c) if c.is_ascii_alphabetic() || c == '_' || c == ':' => {
                let name = self.ident().unwrap_or_default();
                if matches!(name.as_str(), "Inf" | "inf" | "NaN" | "nan") {
                    return Ok(Node::Number(name.parse().unwrap_or(f64::NAN)));
                }
                let agg = match name.as_str() {
                    "sum" => Some(Agg::Sum),
                    "max" => Some(Agg::Max),
                    "min" => Some(Agg::Min),
                    "avg" => Some(Agg::Avg),
                    "count" => Some(Agg::Count),
                    _ => None,
                };
                if let Some(op) = agg {
                    return self.aggregate(op);
                }
                self.skip_space();
                if self.peek() == Some('(') {
                    let func = match name.as_str() {
                        "rate" => Func::Rate,
                        "increase" => Func::Increase,
                        "irate" => Func::Irate,
                        n if UNSUPPORTED.contains(&n) => {
                            return Err(self.error(
                                start,
                                &format!(
                                    "function \"{n}\" is not supported by the sim's Prometheus"
                                ),
                            ));
                        }
                        n => {
                            return Err(
                                self.error(start, &format!("unknown function with name \"{n}\""))
                            );
                        }
                    };
                    return self.call(func, &name);
                }
                self.selector(Some(name), start)
            }
            Some(_) => Err(self.unexpected("")),
        }
    }

    fn number(&mut self) -> Result<Node, String> {
        let start = self.pos;
        let rest = &self.src[self.pos..];
        let len = rest
            .char_indices()
            .find(|(i, c)| {
                !(c.is_ascii_digit()
                    || *c == '.'
                    || *c == 'e'
                    || *c == 'E'
                    || ((*c == '+' || *c == '-')
                        && *i > 0
                        && matches!(rest.as_bytes()[i - 1], b'e' | b'E')))
            })
            .map_or(rest.len(), |(i, _)| i);
        self.pos += len;
        rest[..len].parse::<f64>().map(Node::Number).map_err(|_| {
            self.error(
                start,
                &format!("bad number or duration syntax: \"{}\"", &rest[..len]),
            )
        })
    }

    fn grouping(&mut self) -> Result<Vec<String>, String> {
        self.expect('(', "in grouping opts, expected \"(\"")?;
        let mut labels = Vec::new();
        loop {
            if self.eat(')') {
                return Ok(labels);
            }
            let Some(l) = self.ident() else {
                return Err(self.unexpected("in grouping opts, expected label"));
            };
            labels.push(l);
            if !self.eat(',') {
                self.expect(')', "in grouping opts, expected \")\" or \",\"")?;
                return Ok(labels);
            }
        }
    }

    fn modifier(&mut self) -> Result<Option<(bool, Vec<String>)>, String> {
        self.skip_space();
        let save = self.pos;
        match self.ident().as_deref() {
            Some("by") => Ok(Some((false, self.grouping()?))),
            Some("without") => Ok(Some((true, self.grouping()?))),
            _ => {
                self.pos = save;
                Ok(None)
            }
        }
    }

    fn aggregate(&mut self, op: Agg) -> Result<Node, String> {
        let before = self.modifier()?;
        self.expect('(', "in aggregation, expected \"(\"")?;
        self.skip_space();
        let arg_at = self.pos;
        let arg = self.expr()?;
        self.expect(')', "in aggregation, expected \")\"")?;
        let after = if before.is_none() {
            self.modifier()?
        } else {
            None
        };
        if arg.kind() != Kind::Vector {
            return Err(self.error(
                arg_at,
                &format!(
                    "expected type instant vector in aggregation expression, got {}",
                    kind_name(arg.kind())
                ),
            ));
        }
        // No grouping at all is `by ()`: one group.
        let (without, labels) = before.or(after).unwrap_or((false, Vec::new()));
        Ok(Node::Aggregate {
            op,
            without,
            labels,
            arg: Box::new(arg),
        })
    }

    fn call(&mut self, func: Func, name: &str) -> Result<Node, String> {
        self.expect('(', "")?;
        self.skip_space();
        let arg_at = self.pos;
        if self.peek() == Some(')') {
            return Err(self.error(
                arg_at,
                &format!("expected 1 argument(s) in call to \"{name}\", got 0"),
            ));
        }
        let arg = self.expr()?;
        if self.eat(',') {
            return Err(self.error(
                arg_at,
                &format!("expected 1 argument(s) in call to \"{name}\", got 2"),
            ));
        }
        self.expect(')', "in call, expected \")\"")?;
        if arg.kind() != Kind::Matrix {
            return Err(self.error(
                arg_at,
                &format!(
                    "expected type range vector in call to function \"{name}\", got {}",
                    kind_name(arg.kind())
                ),
            ));
        }
        Ok(Node::Call(func, Box::new(arg)))
    }

    fn selector(&mut self, name: Option<String>, start: usize) -> Result<Node, String> {
        let mut matchers = Vec::new();
        if let Some(n) = &name {
            matchers.push(Matcher {
                label: "__name__".to_owned(),
                op: Op::Eq,
                value: n.clone(),
                re: None,
            });
        }
        if self.eat('{') {
            loop {
                if self.eat('}') {
                    break;
                }
                self.skip_space();
                let Some(label) = self.ident().filter(|l| !l.contains(':')) else {
                    return Err(self.unexpected("in label matching, expected label"));
                };
                self.skip_space();
                let rest = &self.src[self.pos..];
                let op = if rest.starts_with("=~") {
                    Op::Re
                } else if rest.starts_with("!~") {
                    Op::Nre
                } else if rest.starts_with("!=") {
                    Op::Ne
                } else if rest.starts_with('=') {
                    Op::Eq
                } else {
                    return Err(
                        self.unexpected("in label matching, expected label matching operator")
                    );
                };
                self.pos += if op == Op::Eq { 1 } else { 2 };
                let value_at = self.pos;
                let value = self.string()?;
                let re = match op {
                    Op::Re | Op::Nre => {
                        Some(Regex::new(&format!("^(?s:{value})$")).map_err(|e| {
                            self.error(value_at, &format!("error parsing regexp: {e}"))
                        })?)
                    }
                    _ => None,
                };
                if label == "__name__" && name.is_some() {
                    return Err(self.error(
                        start,
                        &format!(
                            "metric name must not be set twice: \"{}\" or \"{value}\"",
                            name.as_deref().unwrap_or_default()
                        ),
                    ));
                }
                matchers.push(Matcher {
                    label,
                    op,
                    value,
                    re,
                });
                if !self.eat(',') {
                    self.expect('}', "in label matching, expected comma or closing bracket")?;
                    break;
                }
            }
        }
        if !matchers.iter().any(|m| !m.matches("")) {
            return Err(self.error(
                start,
                "vector selector must contain at least one non-empty matcher",
            ));
        }
        if self.eat('[') {
            self.skip_space();
            let at = self.pos;
            let end = self.src[at..]
                .find(']')
                .ok_or_else(|| self.error(at, "unexpected end of input in duration"))?;
            let text = self.src[at..at + end].trim();
            if text.contains(':') {
                return Err(self.error(at, "subqueries are not supported by the sim's Prometheus"));
            }
            let range = parse_duration(text).ok_or_else(|| {
                self.error(at, &format!("not a valid duration string: \"{text}\""))
            })?;
            if range == 0 {
                return Err(self.error(at, "duration must be greater than 0"));
            }
            self.pos = at + end + 1;
            return Ok(Node::Matrix(matchers, range));
        }
        Ok(Node::Vector(matchers))
    }
}

/// `query` parsed, or Prometheus's words for why it is not (for this subset, also why it
/// is beyond it).
pub fn parse(query: &str) -> Result<Expr, String> {
    let mut p = Parser { src: query, pos: 0 };
    let node = p.expr()?;
    p.skip_space();
    if p.pos < query.len() {
        let rest = &query[p.pos..];
        let what = if rest.starts_with("offset") || rest.starts_with('@') {
            "offset and @ modifiers are not supported by the sim's Prometheus".to_owned()
        } else if rest.starts_with(['+', '-', '*', '/', '%', '^', '=', '!', '<', '>'])
            || rest.starts_with("and")
            || rest.starts_with("or")
            || rest.starts_with("unless")
        {
            "binary operators are not supported by the sim's Prometheus".to_owned()
        } else {
            return Err(p.unexpected(""));
        };
        return Err(p.error(p.pos, &what));
    }
    Ok(Expr(node))
}

/// What a query evaluates to.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    Scalar(f64),
    Vector(Vec<(Labels, f64)>),
    Matrix(Vec<(Labels, Vec<(i64, f64)>)>),
}

impl Tsdb {
    fn select<'s>(
        &'s self,
        matchers: &'s [Matcher],
    ) -> impl Iterator<Item = (&'s Labels, &'s VecDeque<(i64, f64)>)> + 's {
        self.series.iter().filter(move |(labels, _)| {
            matchers
                .iter()
                .all(|m| m.matches(labels.get(&m.label).map_or("", String::as_str)))
        })
    }

    /// The samples of each matching series in `(t - range, t]`, staleness markers left
    /// out.
    fn range(&self, matchers: &[Matcher], range: i64, t: i64) -> Vec<(Labels, Vec<(i64, f64)>)> {
        self.select(matchers)
            .filter_map(|(labels, samples)| {
                let inside: Vec<(i64, f64)> = samples
                    .iter()
                    .filter(|(ts, v)| *ts > t - range && *ts <= t && !is_stale(*v))
                    .copied()
                    .collect();
                (!inside.is_empty()).then(|| (labels.clone(), inside))
            })
            .collect()
    }

    /// `expr` evaluated at `t` (ms).
    pub fn eval(&self, expr: &Expr, t: i64) -> Outcome {
        match &expr.0 {
            Node::Number(n) => Outcome::Scalar(*n),
            Node::Matrix(m, range) => Outcome::Matrix(self.range(m, *range, t)),
            node => Outcome::Vector(self.vector(node, t)),
        }
    }

    fn vector(&self, node: &Node, t: i64) -> Vec<(Labels, f64)> {
        match node {
            Node::Vector(matchers) => self
                .select(matchers)
                .filter_map(|(labels, samples)| {
                    // The latest sample in (t - 5m, t], unless it marks the series stale.
                    let (ts, v) = samples.iter().rev().find(|(ts, _)| *ts <= t)?;
                    (*ts > t - LOOKBACK_MS && !is_stale(*v)).then(|| (labels.clone(), *v))
                })
                .collect(),
            Node::Call(func, arg) => {
                let Node::Matrix(matchers, range) = arg.as_ref() else {
                    return Vec::new();
                };
                self.range(matchers, *range, t)
                    .into_iter()
                    .filter_map(|(mut labels, samples)| {
                        let v = match func {
                            Func::Rate => extrapolated_rate(&samples, t - range, t, true),
                            Func::Increase => extrapolated_rate(&samples, t - range, t, false),
                            Func::Irate => instant_rate(&samples),
                        }?;
                        labels.remove("__name__");
                        Some((labels, v))
                    })
                    .collect()
            }
            Node::Aggregate {
                op,
                without,
                labels,
                arg,
            } => aggregate(*op, *without, labels, self.vector(arg, t)),
            Node::Number(_) | Node::Matrix(..) => Vec::new(),
        }
    }
}

/// Prometheus's `extrapolatedRate` for a counter: the increase over `samples` (counter
/// resets added back), extrapolated towards the window's edges `start`..`end` (ms) by
/// at most 1.1 times the average interval between samples (else half of it), and never
/// to below zero; per second when `per_second`. Fewer than two samples: none.
pub fn extrapolated_rate(
    samples: &[(i64, f64)],
    start: i64,
    end: i64,
    per_second: bool,
) -> Option<f64> {
    if samples.len() < 2 {
        return None;
    }
    let (first_t, first_v) = samples[0];
    let (last_t, last_v) = samples[samples.len() - 1];
    let mut result = last_v - first_v;
    let mut prev = 0.0;
    for (_, v) in samples {
        if *v < prev {
            result += prev;
        }
        prev = *v;
    }
    let mut to_start = (first_t - start) as f64 / 1000.0;
    let mut to_end = (end - last_t) as f64 / 1000.0;
    let sampled = (last_t - first_t) as f64 / 1000.0;
    let average = sampled / (samples.len() - 1) as f64;
    let threshold = average * 1.1;
    if to_start >= threshold {
        to_start = average / 2.0;
    }
    if result > 0.0 && first_v >= 0.0 {
        let to_zero = sampled * (first_v / result);
        if to_zero < to_start {
            to_start = to_zero;
        }
    }
    if to_end >= threshold {
        to_end = average / 2.0;
    }
    let mut factor = (sampled + to_start + to_end) / sampled;
    if per_second {
        factor /= (end - start) as f64 / 1000.0;
    }
    Some(result * factor)
}

/// `irate`: the per-second rate between the last two samples (after a reset, the last
/// value over their interval).
fn instant_rate(samples: &[(i64, f64)]) -> Option<f64> {
    let [.., (t0, v0), (t1, v1)] = samples else {
        return None;
    };
    let interval = (t1 - t0) as f64 / 1000.0;
    if interval <= 0.0 {
        return None;
    }
    let delta = if v1 < v0 { *v1 } else { v1 - v0 };
    Some(delta / interval)
}

fn aggregate(
    op: Agg,
    without: bool,
    by: &[String],
    input: Vec<(Labels, f64)>,
) -> Vec<(Labels, f64)> {
    let mut groups: BTreeMap<Labels, (f64, f64)> = BTreeMap::new();
    for (labels, v) in input {
        let key: Labels = labels
            .into_iter()
            .filter(|(k, _)| {
                if without {
                    k != "__name__" && !by.contains(k)
                } else {
                    by.contains(k)
                }
            })
            .collect();
        match groups.get_mut(&key) {
            None => {
                groups.insert(key, (v, 1.0));
            }
            Some((acc, n)) => {
                *n += 1.0;
                *acc = match op {
                    Agg::Sum | Agg::Avg => *acc + v,
                    Agg::Max if v > *acc || acc.is_nan() => v,
                    Agg::Min if v < *acc || acc.is_nan() => v,
                    _ => *acc,
                };
            }
        }
    }
    groups
        .into_iter()
        .map(|(labels, (acc, n))| {
            let v = match op {
                Agg::Avg => acc / n,
                Agg::Count => n,
                _ => acc,
            };
            (labels, v)
        })
        .collect()
}

/// A sample value as Prometheus's JSON writes it.
pub fn format_value(v: f64) -> String {
    if v.is_nan() {
        "NaN".to_owned()
    } else if v == f64::INFINITY {
        "+Inf".to_owned()
    } else if v == f64::NEG_INFINITY {
        "-Inf".to_owned()
    } else {
        format!("{v}")
    }
}

/// A timestamp (ms) as Prometheus's JSON writes it: unix seconds, a fraction only when
/// there is one.
fn format_time(t: i64) -> Value {
    if t % 1000 == 0 {
        json!(t / 1000)
    } else {
        json!(t as f64 / 1000.0)
    }
}

/// The `data` of a successful query answer.
pub fn data(outcome: &Outcome, t: i64) -> Value {
    match outcome {
        Outcome::Scalar(v) => {
            json!({ "resultType": "scalar", "result": [format_time(t), format_value(*v)] })
        }
        Outcome::Vector(samples) => json!({ "resultType": "vector", "result": samples.iter()
            .map(|(l, v)| json!({ "metric": l, "value": [format_time(t), format_value(*v)] }))
            .collect::<Vec<_>>() }),
        Outcome::Matrix(series) => json!({ "resultType": "matrix", "result": series.iter()
            .map(|(l, s)| json!({ "metric": l, "values": s.iter()
                .map(|(ts, v)| json!([format_time(*ts), format_value(*v)])).collect::<Vec<_>>() }))
            .collect::<Vec<_>>() }),
    }
}

/// A query string's parameters, decoded as Go's `url.ParseQuery` does.
pub fn query_params(q: &str) -> Vec<(String, String)> {
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (url_decode(k), url_decode(v))
        })
        .collect()
}

fn url_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => match u8::from_str_radix(&s[i + 1..i + 3], 16) {
                Ok(byte) => {
                    out.push(byte);
                    i += 2;
                }
                Err(_) => out.push(b'%'),
            },
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `s` escaped as Go's `url.QueryEscape` escapes it.
pub fn query_escape(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char);
            }
            b' ' => out.push('+'),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// A `time` parameter: RFC 3339 (with or without a fraction) or unix seconds, in ms.
fn parse_time(s: &str) -> Option<i64> {
    if let Ok(secs) = s.parse::<f64>()
        && secs.is_finite()
    {
        return Some((secs * 1000.0).round() as i64);
    }
    let (whole, fraction) = match s.find('.') {
        Some(i) => {
            let end = s[i..].find('Z')? + i;
            (format!("{}Z", &s[..i]), s[i..end].parse::<f64>().ok()?)
        }
        None => (s.to_owned(), 0.0),
    };
    let secs = parse_rfc3339(&whole)?;
    Some(((secs + fraction) * 1000.0).round() as i64)
}

fn bad_data(error: &str) -> Answer {
    Answer::new(
        StatusCode::BAD_REQUEST,
        "application/json",
        json!({ "status": "error", "errorType": "bad_data", "error": error }).to_string(),
    )
}

fn text(status: StatusCode, body: &str) -> Answer {
    Answer::new(status, "text/plain; charset=utf-8", body.to_owned())
}

/// What the Prometheus server of pod `uid` answers to `method` on `path` with query
/// string `query` (and a form `body`), at sim time `now` (epoch seconds).
pub fn answer(
    serving: &Serving,
    uid: &str,
    method: &Method,
    path: &str,
    query: Option<&str>,
    body: &[u8],
    now: f64,
) -> Answer {
    match (method.as_str(), path) {
        ("GET" | "HEAD", "/-/ready") => text(StatusCode::OK, "Prometheus Server is Ready.\n"),
        ("GET" | "HEAD", "/-/healthy") => text(StatusCode::OK, "Prometheus Server is Healthy.\n"),
        ("GET" | "POST", "/api/v1/query") => {
            let mut params = query.map(query_params).unwrap_or_default();
            if method == Method::POST {
                params.extend(query_params(&String::from_utf8_lossy(body)));
            }
            let param = |k: &str| params.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
            let t = match param("time") {
                Some(s) if !s.is_empty() => match parse_time(&s) {
                    Some(t) => t,
                    None => {
                        return bad_data(&format!(
                            "invalid parameter \"time\": cannot parse \"{s}\" to a valid timestamp"
                        ));
                    }
                },
                _ => (now * 1000.0).round() as i64,
            };
            let q = param("query").unwrap_or_default();
            let expr = match parse(&q) {
                Ok(e) => e,
                Err(e) => return bad_data(&format!("invalid parameter \"query\": {e}")),
            };
            let outcome = {
                let all = serving.prometheus().lock();
                let empty = Tsdb::default();
                all.get(uid).unwrap_or(&empty).eval(&expr, t)
            };
            Answer::new(
                StatusCode::OK,
                "application/json",
                json!({ "status": "success", "data": data(&outcome, t) }).to_string(),
            )
        }
        (_, "/-/ready" | "/-/healthy" | "/api/v1/query") => {
            text(StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed\n")
        }
        _ => text(StatusCode::NOT_FOUND, "404 page not found\n"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> Labels {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn refused(q: &str) -> String {
        parse(q).map(|_| ()).unwrap_err()
    }

    #[test]
    fn the_subset_parses_and_the_rest_is_refused_in_prometheus_words() {
        for q in [
            "sum(rate(smg_http_requests_total{path=~\"/v1/.+|/generate\"}[1m]))",
            "sum by (path) (rate(x[5m]))",
            "sum(rate(x[5m])) by (path, method)",
            "count without (instance) (up)",
            "avg(x)",
            "max by () (x)",
            "min(x{a!=\"b\",c!~'d.*'})",
            "42",
            "1.5e3",
            "irate(x[30s])",
            "increase(x[1h])",
            "{__name__=\"x\"}",
            "x[1h30m]",
            "  rate( x [ 5m ] )  ",
        ] {
            assert!(parse(q).is_ok(), "{q}: {:?}", parse(q).err());
        }
        assert_eq!(
            refused("rate(x)"),
            "1:6: parse error: expected type range vector in call to function \"rate\", got instant vector"
        );
        assert_eq!(
            refused("sum(x[5m])"),
            "1:5: parse error: expected type instant vector in aggregation expression, got range vector"
        );
        assert_eq!(
            refused("sum(1)"),
            "1:5: parse error: expected type instant vector in aggregation expression, got scalar"
        );
        assert_eq!(
            refused("foo(x)"),
            "1:1: parse error: unknown function with name \"foo\""
        );
        assert!(refused("histogram_quantile(0.9, x)").contains("not supported"));
        assert!(refused("x + 1").starts_with("1:3: parse error: binary operators"));
        assert!(refused("x offset 5m").contains("offset"));
        assert_eq!(
            refused("{a=\"\"}"),
            "1:1: parse error: vector selector must contain at least one non-empty matcher"
        );
        assert_eq!(
            refused("x[5x]"),
            "1:3: parse error: not a valid duration string: \"5x\""
        );
        assert_eq!(
            refused(""),
            "1:1: parse error: no expression found in input"
        );
        assert!(refused("x{a=~\"(\"}").contains("error parsing regexp"));
        assert!(refused("sum(x").contains("unexpected end of input"));
        assert!(refused("x{a=\"b\"").contains("unexpected end of input"));
        assert!(refused("x[5m:1m]").contains("subqueries"));
        assert!(refused("x{__name__=\"y\"}").contains("metric name must not be set twice"));
    }

    #[test]
    fn regexes_are_anchored_at_both_ends() {
        let Expr(Node::Vector(m)) = parse("x{path=~\"/v1/.+|/generate\"}").unwrap() else {
            panic!("a selector");
        };
        let path = &m[1];
        assert!(path.matches("/v1/chat/completions"));
        assert!(path.matches("/generate"));
        assert!(!path.matches("/x/generate"));
        assert!(!path.matches("/generate/x"));
        assert!(!path.matches("/health"));
    }

    #[test]
    fn durations_are_read_as_prometheus_reads_them() {
        assert_eq!(parse_duration("15s"), Some(15_000));
        assert_eq!(parse_duration("1m"), Some(60_000));
        assert_eq!(parse_duration("1h30m"), Some(5_400_000));
        assert_eq!(parse_duration("500ms"), Some(500));
        assert_eq!(parse_duration("2h"), Some(7_200_000));
        assert_eq!(parse_duration("15d"), Some(DEFAULT_RETENTION_MS));
        assert_eq!(parse_duration("0"), Some(0));
        assert_eq!(parse_duration("30m1h"), None, "largest unit first");
        assert_eq!(parse_duration("1.5h"), None);
        assert_eq!(parse_duration(""), None);
    }

    /// A counter's samples (seconds, value) as one series.
    fn tsdb(series: &[(&str, &[(i64, f64)])]) -> Tsdb {
        let mut db = Tsdb::default();
        for (name, samples) in series {
            for (t, v) in *samples {
                db.push(labels(&[("__name__", name), ("job", "j")]), t * 1000, *v);
            }
        }
        db
    }

    fn scalar_of(db: &Tsdb, q: &str, at_secs: i64) -> Option<f64> {
        match db.eval(&parse(q).unwrap(), at_secs * 1000) {
            Outcome::Vector(v) => {
                assert!(v.len() <= 1, "{v:?}");
                v.first().map(|(_, x)| *x)
            }
            other => panic!("{other:?}"),
        }
    }

    fn close(a: Option<f64>, b: f64) -> bool {
        a.is_some_and(|a| (a - b).abs() < 1e-9)
    }

    #[test]
    fn rate_and_increase_follow_extrapolated_rate() {
        // A reset at 35 s: 10 + 25 (added back) + 15 = 35 over 45 s, extrapolated 5 s to
        // the window's start and 10 s to its end (both under 1.1 x 15 s): 35 x 60/45.
        let db = tsdb(&[("c", &[(5, 10.0), (20, 25.0), (35, 5.0), (50, 20.0)])]);
        let increase = 35.0 * 60.0 / 45.0;
        assert!(close(scalar_of(&db, "increase(c[1m])", 60), increase));
        assert!(close(scalar_of(&db, "rate(c[1m])", 60), increase / 60.0));
        // irate: the last two samples, 15 over 15 s.
        assert!(close(scalar_of(&db, "irate(c[1m])", 60), 1.0));

        // The series starts 40 s into the window, past 1.1 x the 10 s interval: it is
        // extrapolated only half an interval back. 20 over 20 s, x 25/20.
        let db = tsdb(&[("c", &[(40, 100.0), (50, 110.0), (60, 120.0)])]);
        assert!(close(scalar_of(&db, "increase(c[1m])", 60), 25.0));
        assert!(close(scalar_of(&db, "rate(c[1m])", 60), 25.0 / 60.0));

        // Not below zero: from 1 at 10 s rising 1/s, zero is 1 s before the first
        // sample, nearer than the window's start 10 s before it. 20 x 21/20.
        let db = tsdb(&[("c", &[(10, 1.0), (20, 11.0), (30, 21.0)])]);
        assert!(close(scalar_of(&db, "increase(c[30s])", 30), 21.0));
        assert!(close(scalar_of(&db, "rate(c[30s])", 30), 0.7));

        // One sample in the window: no result.
        assert_eq!(scalar_of(&db, "rate(c[5s])", 30), None);
        // The window is open on the left: the sample at 10 s is out of (10, 30].
        assert!(close(
            scalar_of(&db, "increase(c[20s])", 30),
            10.0 * 20.0 / 10.0
        ));
    }

    #[test]
    fn an_instant_selector_looks_back_five_minutes_until_a_staleness_marker() {
        let mut db = Tsdb::default();
        let key = ("j".to_owned(), "t:1".to_owned());
        let g = labels(&[("__name__", "g"), ("job", "j")]);
        db.append(key.clone(), 0, vec![(g.clone(), 5.0)], DEFAULT_RETENTION_MS);
        assert_eq!(scalar_of(&db, "g", 0), Some(5.0));
        assert_eq!(scalar_of(&db, "g", 299), Some(5.0));
        assert_eq!(scalar_of(&db, "g", 300), None, "(t - 5m, t]");
        assert_eq!(scalar_of(&db, "g", -1), None);
        // The next scrape lacks it: stale from then on, while the range keeps its past.
        db.append(key, 100_000, Vec::new(), DEFAULT_RETENTION_MS);
        assert_eq!(scalar_of(&db, "g", 99), Some(5.0));
        assert_eq!(scalar_of(&db, "g", 150), None);
        match db.eval(&parse("g[5m]").unwrap(), 150_000) {
            Outcome::Matrix(m) => assert_eq!(m, vec![(g, vec![(0, 5.0)])]),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn retention_and_the_per_series_cap_bound_what_is_kept() {
        let mut db = Tsdb::default();
        let key = ("j".to_owned(), "t:1".to_owned());
        let g = labels(&[("__name__", "g")]);
        for i in 0..(MAX_SAMPLES_PER_SERIES as i64 + 10) {
            db.append(
                key.clone(),
                i * 1000,
                vec![(g.clone(), i as f64)],
                7_200_000,
            );
        }
        assert_eq!(db.series[&g].len(), MAX_SAMPLES_PER_SERIES);
        db.append(key, 20_000_000, vec![(g.clone(), 1.0)], 7_200_000);
        assert_eq!(db.series[&g].len(), 1, "older than 2 h");
    }

    #[test]
    fn aggregations_group_by_and_without_and_drop_the_name() {
        let mut db = Tsdb::default();
        for (path, instance, v) in [("/a", "i1", 1.0), ("/a", "i2", 2.0), ("/b", "i1", 4.0)] {
            let l = labels(&[("__name__", "x"), ("path", path), ("instance", instance)]);
            db.push(l, 0, v);
        }
        let eval = |q: &str| match db.eval(&parse(q).unwrap(), 0) {
            Outcome::Vector(v) => v,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            eval("sum by (path) (x)"),
            vec![
                (labels(&[("path", "/a")]), 3.0),
                (labels(&[("path", "/b")]), 4.0)
            ]
        );
        assert_eq!(eval("sum(x) by (path)"), eval("sum by (path) (x)"));
        assert_eq!(eval("sum(x)"), vec![(Labels::new(), 7.0)]);
        assert_eq!(eval("max(x)"), vec![(Labels::new(), 4.0)]);
        assert_eq!(eval("min(x)"), vec![(Labels::new(), 1.0)]);
        assert_eq!(eval("avg(x)"), vec![(Labels::new(), 7.0 / 3.0)]);
        assert_eq!(
            eval("count without (path) (x)"),
            vec![
                (labels(&[("instance", "i1")]), 2.0),
                (labels(&[("instance", "i2")]), 1.0)
            ]
        );
        assert_eq!(
            eval("sum(nothing)"),
            Vec::new(),
            "sum over nothing is empty"
        );
        assert_eq!(eval("x{path=\"/b\"}")[0].0["__name__"], "x");
    }

    #[test]
    fn the_query_api_answers_prometheus_json() {
        let serving = Serving::default();
        {
            let mut all = serving.prometheus().lock();
            let db = all.entry("p-1".to_owned()).or_default();
            for (t, v) in [(0, 0.0), (15, 30.0), (30, 60.0), (45, 90.0), (60, 120.0)] {
                let l = labels(&[
                    ("__name__", "smg_http_requests_total"),
                    ("job", "sglang-router"),
                    ("instance", "r:29000"),
                    ("method", "POST"),
                    ("path", "/v1/chat/completions"),
                ]);
                db.push(l, t * 1000, v);
            }
        }
        let q = format!(
            "query={}&time=60",
            query_escape("sum(rate(smg_http_requests_total{path=~\"/v1/.+|/generate\"}[1m]))")
        );
        let a = answer(
            &serving,
            "p-1",
            &Method::GET,
            "/api/v1/query",
            Some(&q),
            b"",
            0.0,
        );
        assert_eq!(a.status, StatusCode::OK);
        let body: Value = serde_json::from_str(&a.body).unwrap();
        // 90 over the 45 s from 15 s, extrapolated 15 s back: 120 a minute, 2 a second,
        // in Prometheus's float arithmetic (factor 60/45, then /60, then x 90).
        assert_eq!(
            body,
            json!({ "status": "success", "data": { "resultType": "vector",
                "result": [{ "metric": {}, "value": [60, "1.9999999999999998"] }] } })
        );
        let q = "query=smg_http_requests_total&time=2027-01-15T08:00:00.5Z";
        let a = answer(
            &serving,
            "p-1",
            &Method::GET,
            "/api/v1/query",
            Some(q),
            b"",
            0.0,
        );
        let body: Value = serde_json::from_str(&a.body).unwrap();
        assert_eq!(
            body["data"]["result"],
            json!([]),
            "nothing within 5 minutes"
        );
        let t = parse_rfc3339("2027-01-15T08:00:00Z").unwrap();
        assert_eq!(
            parse_time("2027-01-15T08:00:00.5Z"),
            Some((t * 1000.0) as i64 + 500)
        );
        // POSTed as a form, the same; a scalar and its time.
        let a = answer(
            &serving,
            "p-1",
            &Method::POST,
            "/api/v1/query",
            None,
            b"query=4&time=1.5",
            0.0,
        );
        let body: Value = serde_json::from_str(&a.body).unwrap();
        assert_eq!(
            body["data"],
            json!({ "resultType": "scalar", "result": [1.5, "4"] })
        );

        let a = answer(
            &serving,
            "p-1",
            &Method::GET,
            "/api/v1/query",
            Some("query=rate(x)"),
            b"",
            0.0,
        );
        assert_eq!(a.status, StatusCode::BAD_REQUEST);
        let body: Value = serde_json::from_str(&a.body).unwrap();
        assert_eq!(
            body,
            json!({ "status": "error", "errorType": "bad_data",
            "error": "invalid parameter \"query\": 1:6: parse error: expected type range vector in call to function \"rate\", got instant vector" })
        );
        let a = answer(
            &serving,
            "p-1",
            &Method::GET,
            "/api/v1/query",
            Some("query=x&time=soon"),
            b"",
            0.0,
        );
        assert_eq!(a.status, StatusCode::BAD_REQUEST);
        assert!(
            a.body.contains("invalid parameter \\\"time\\\""),
            "{}",
            a.body
        );

        let ready = answer(&serving, "p-1", &Method::GET, "/-/ready", None, b"", 0.0);
        assert_eq!(
            (ready.status, ready.body.as_str()),
            (StatusCode::OK, "Prometheus Server is Ready.\n")
        );
        let healthy = answer(&serving, "p-1", &Method::GET, "/-/healthy", None, b"", 0.0);
        assert_eq!(healthy.body, "Prometheus Server is Healthy.\n");
        let other = answer(&serving, "p-1", &Method::GET, "/nope", None, b"", 0.0);
        assert_eq!(other.status, StatusCode::NOT_FOUND);
        assert_eq!(format_value(f64::INFINITY), "+Inf");
        assert_eq!(format_value(0.1 + 0.2), "0.30000000000000004");
        assert_eq!(
            query_params(&format!("q={}", query_escape("a b+c&\"d\""))),
            vec![("q".to_owned(), "a b+c&\"d\"".to_owned())]
        );
    }

    fn pod(args: Value) -> Value {
        json!({ "metadata": { "name": "p", "namespace": "default", "uid": "p-1" },
            "spec": { "containers": [{ "name": "prometheus",
                "image": "quay.io/prometheus/prometheus:v3.5.0", "args": args,
                "volumeMounts": [{ "name": "config", "mountPath": "/etc/prometheus" }] }],
                "volumes": [{ "name": "config", "configMap": { "name": "e-prometheus" } }] } })
    }

    #[test]
    fn a_server_reads_its_flags_and_its_config_from_the_config_map() {
        let p = pod(json!([
            "--config.file=/etc/prometheus/prometheus.yml",
            "--storage.tsdb.retention.time=2h",
            "--web.listen-address=:9090"
        ]));
        let server = of(&p).unwrap();
        assert_eq!(
            server,
            Server {
                config_file: "/etc/prometheus/prometheus.yml".into(),
                retention_ms: 7_200_000,
                port: 9090
            }
        );
        let default = of(&pod(json!([]))).unwrap();
        assert_eq!(
            default.config_file, "/etc/prometheus/prometheus.yml",
            "the image's CMD"
        );
        assert_eq!(default.retention_ms, DEFAULT_RETENTION_MS);
        assert_eq!(
            of(&pod(json!(["--web.listen-address=0.0.0.0:9191"])))
                .unwrap()
                .config_file,
            "/prometheus/prometheus.yml",
            "Prometheus's own default, in its working dir"
        );
        let mut other = p.clone();
        other["spec"]["containers"][0]["image"] = json!("prom/prometheus");
        assert!(of(&other).is_some());
        other["spec"]["containers"][0]["image"] = json!("grafana/grafana:11");
        assert!(of(&other).is_none());

        let mut store = Store::new();
        let missing = load(&store, &p, &server).unwrap_err();
        assert_eq!(
            missing,
            "Error loading config (--config.file=/etc/prometheus/prometheus.yml) file=/etc/prometheus/prometheus.yml err=\"open /etc/prometheus/prometheus.yml: no such file or directory\""
        );
        let yml = "global:\n  scrape_interval: 15s\n  evaluation_interval: 15s\nscrape_configs:\n  - job_name: sglang-router\n    metrics_path: /metrics\n    static_configs:\n      - targets: [\"e-router.default.svc.cluster.local:29000\"]\n        labels: { team: ml }\n";
        let cm = json!({ "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": { "name": "e-prometheus", "namespace": "default" },
            "data": { "prometheus.yml": yml } });
        store.put(
            super::super::store::Key::new("/configmaps", "default", "e-prometheus"),
            cm,
        );
        let config = load(&store, &p, &server).unwrap();
        assert_eq!(
            config.jobs,
            vec![Job {
                name: "sglang-router".into(),
                interval_ms: 15_000,
                metrics_path: "/metrics".into(),
                scheme: "http".into(),
                targets: vec![(
                    "e-router.default.svc.cluster.local:29000".into(),
                    labels(&[("team", "ml")])
                )]
            }]
        );

        let f = "/etc/prometheus/prometheus.yml";
        let job = |extra: &str| format!("scrape_configs:\n  - job_name: a\n{extra}");
        assert_eq!(parse_config("", f).unwrap().jobs, Vec::new());
        assert_eq!(
            parse_config(&job(""), f).unwrap().jobs[0].interval_ms,
            60_000,
            "1m by default"
        );
        assert!(
            parse_config(
                &job("    scrape_interval: 5s\n    scrape_timeout: 10s\n"),
                f
            )
            .unwrap_err()
            .contains("scrape timeout greater than scrape interval")
        );
        assert!(
            parse_config("global:\n  scrape_interval: fast\n", f)
                .unwrap_err()
                .contains("not a valid duration string: \"fast\"")
        );
        assert!(
            parse_config("scrape_configs:\n  - job_name: a\n  - job_name: a\n", f)
                .unwrap_err()
                .contains("found multiple scrape configs with job name \"a\"")
        );
        assert!(
            parse_config("a: [", f)
                .unwrap_err()
                .starts_with("parsing YAML file /etc/prometheus/prometheus.yml: ")
        );
    }
}
