//! KEDA 2.17 (the chart the inference operator's add-on brings with `keda.enabled`) and
//! the HorizontalPodAutoscaler it creates for each ScaledObject, run while KEDA's
//! operator has a ready replica (its scale loop) and its metrics server too (the HPA's
//! metrics). Every `pollingInterval` KEDA's loop reads each trigger (the `metrics-api`
//! scaler: a GET of its `url` inside the cluster, through the Service it names, of JSON,
//! YAML or Prometheus text; the `prometheus` scaler: an instant query of its `query` at
//! its `serverAddress`, answered by the sim's Prometheus server), activates a target at
//! zero replicas when any trigger is active, scales an idle one to
//! zero after `cooldownPeriod`, and keeps the ScaledObject's status and events as KEDA
//! writes them; every 15 s (kube-controller-manager's sync period) the HPA reads the
//! same metrics and scales between the ScaledObject's bounds with the HPA's algorithm
//! (tolerance, stabilization windows, rate policies; with several triggers, the most
//! replicas any metric asks for), writing its `SuccessfulRescale`
//! events. Both write the target's replicas as the scale subresource does. What they
//! keep between passes that Kubernetes keeps in process memory (the loops' next runs,
//! the HPA's recommendations and scale events) lives beside the store ([`Autoscalers`]),
//! so that a quiet cluster still writes nothing; the loops' next runs are deadlines of
//! the pass, through [`reached`]. The sim models no scaler but `metrics-api` and
//! `prometheus` (without its authentication, custom headers or namespaced queries), no
//! fallback, pausing or scaling modifiers.

use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, MutexGuard};

use serde_json::{Value, json};

use super::{record, snapshot, upsert};
use crate::clock::reached;
use crate::kube::api::{SCALABLE, at_path, set_path};
use crate::kube::apply::record_update;
use crate::kube::discovery::{self, CRD_GR, Resource};
use crate::kube::model_server::Serving;
use crate::kube::prometheus::{self, families};
use crate::kube::schema;
use crate::kube::service_proxy::{self, Unreachable};
use crate::kube::store::{Key, Obj, Store, meta};
use crate::kube::time::parse_rfc3339;

const GROUP: &str = "keda.sh";
const VERSION: &str = "v1alpha1";
const PLURAL: &str = "scaledobjects";
const SO_GR: &str = "keda.sh/scaledobjects";
const OPERATOR: &str = "keda-operator";
/// The metrics server the HPA reads KEDA's metrics from, as the Helm chart (which the
/// inference operator's add-on installs) and the release manifests (`make release`,
/// what hypd's keda feature applies) name its Deployment.
const METRICS_SERVERS: [&str; 2] = ["keda-operator-metrics-apiserver", "keda-metrics-apiserver"];
/// The label KEDA puts on each ScaledObject, which its metrics' selector matches.
const NAME_LABEL: &str = "scaledobject.keda.sh/name";
const DEFAULT_POLLING_SECS: f64 = 30.0;
const DEFAULT_COOLDOWN_SECS: f64 = 300.0;
const DEFAULT_MAX_REPLICAS: i64 = 100;
/// kube-controller-manager's `--horizontal-pod-autoscaler-sync-period`.
const HPA_SYNC_SECS: f64 = 15.0;
/// Its `--horizontal-pod-autoscaler-tolerance`.
const TOLERANCE: f64 = 0.1;
/// Its `--horizontal-pod-autoscaler-downscale-stabilization`.
const DOWNSCALE_WINDOW_SECS: f64 = 300.0;
/// The cluster's DNS service, which Go's resolver names in its errors.
const CLUSTER_DNS: &str = "172.20.0.10:53";
/// The field managers of the scale writes: the HPA controller's and KEDA's.
const HPA_MANAGER: &str = "kube-controller-manager";
const KEDA_MANAGER: &str = "keda";

const READY_MESSAGE: &str = "ScaledObject is defined correctly and is ready for scaling";
const TARGET_MESSAGE: &str = "ScaledObject doesn't have correct scaleTargetRef specification";
const ACTIVE_MESSAGE: &str = "Scaling is performed because triggers are active";
const NOT_ACTIVE_MESSAGE: &str = "Scaling is not performed because triggers are not active";

/// What KEDA's scale loops and the HPA controller remember, by ScaledObject UID.
#[derive(Default)]
pub struct Autoscalers(Mutex<HashMap<String, Loop>>);

impl Autoscalers {
    fn loops(&self) -> MutexGuard<'_, HashMap<String, Loop>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

struct Loop {
    ns: String,
    name: String,
    /// The ScaledObject's generation its loop runs for.
    generation: i64,
    /// When KEDA's loop and the HPA next run (epoch seconds).
    next_poll: f64,
    next_sync: f64,
    /// The HPA's recommendations (when, replicas): none until its first.
    recommendations: Option<Vec<(f64, i64)>>,
    /// Its scale events (when, replicas added or removed), for its rate policies.
    ups: Vec<(f64, i64)>,
    downs: Vec<(f64, i64)>,
    /// What to put back when the ScaledObject goes, when it asks for that.
    restore: Option<(Target, i64)>,
}

/// A scale target: the resource it is of and where it is stored.
#[derive(Clone)]
struct Target {
    res: Resource,
    key: Key,
}

impl Target {
    fn replicas(&self, o: &Value) -> i64 {
        let at = match &self.res.scale {
            Some(paths) => at_path(o, &paths.spec_replicas),
            None => &o["spec"]["replicas"],
        };
        at.as_i64().unwrap_or(1)
    }

    fn status_replicas(&self, o: &Value) -> i64 {
        let at = match &self.res.scale {
            Some(paths) => at_path(o, &paths.status_replicas),
            None => &o["status"]["replicas"],
        };
        at.as_i64().unwrap_or(0)
    }

    /// `group/version.Kind`, as KEDA names the kind it scales.
    fn gvk(&self) -> String {
        format!("{}/{}.{}", self.res.group, self.res.version, self.res.kind)
    }

    /// Sets its replicas as a write to its scale subresource by `manager` does.
    fn scale(&self, store: &mut Store, replicas: i64, manager: &str, now: &str) {
        let Some(old) = store.get(&self.key).cloned() else {
            return;
        };
        let mut new = (*old).clone();
        match &self.res.scale {
            Some(paths) => set_path(&mut new, &paths.spec_replicas, json!(replicas)),
            None => new["spec"]["replicas"] = json!(replicas),
        }
        if new["spec"] != old["spec"] {
            let g = old["metadata"]["generation"].as_i64().unwrap_or(1);
            new["metadata"]["generation"] = json!(g + 1);
        }
        let api_version = self.res.api_version();
        record_update(
            Some(&old),
            &mut new,
            manager,
            &api_version,
            now,
            self.res.status,
            Some("scale"),
        );
        upsert(store, self.key.clone(), new);
    }
}

/// Where KEDA runs, if it does: its operator's namespace (where a name with no
/// namespace resolves), and whether its metrics server is up for the HPAs.
fn keda(store: &Store) -> Option<(String, bool)> {
    // A CRD being deleted is no longer served.
    store
        .get(&Key::new(CRD_GR, "", "scaledobjects.keda.sh"))
        .filter(|crd| crd["metadata"]["deletionTimestamp"].is_null())?;
    let ready = |d: &Value| d["status"]["readyReplicas"].as_u64().unwrap_or(0) >= 1;
    let operator = store
        .list("apps/deployments", None)
        .find(|d| meta(d, "name") == OPERATOR && ready(d))?;
    let ns = meta(operator, "namespace");
    let metrics = METRICS_SERVERS.iter().any(|name| {
        store
            .get(&Key::new("apps/deployments", &ns, name))
            .is_some_and(|d| ready(d))
    });
    Some((ns, metrics))
}

/// One pass of KEDA and the HPAs over every ScaledObject, at `epoch_now` (`now` as
/// written).
pub(super) fn scaledobjects(
    store: &mut Store,
    serving: &Serving,
    memory: &Autoscalers,
    epoch_now: f64,
    now: &str,
) {
    let Some((keda_ns, metrics_server)) = keda(store) else {
        return;
    };
    let schema = discovery::find(store, GROUP, VERSION, PLURAL).and_then(|r| r.schema);
    let mut loops = memory.loops();
    let objects = snapshot(store, SO_GR);
    let live: HashSet<String> = objects.iter().map(|so| meta(so, "uid")).collect();
    let env = Env {
        serving,
        keda_ns: &keda_ns,
        metrics_server,
        epoch_now,
        now,
    };
    // A ScaledObject that is gone: its loop stops and its HPA goes with it, leaving the
    // target's replicas as they are unless it asked for the original count back.
    let gone: Vec<String> = loops
        .keys()
        .filter(|u| !live.contains(*u))
        .cloned()
        .collect();
    for uid in gone {
        let Some(l) = loops.remove(&uid) else {
            continue;
        };
        if let Some((target, original)) = &l.restore {
            target.scale(store, *original, KEDA_MANAGER, now);
        }
        let so = json!({ "apiVersion": "keda.sh/v1alpha1",
                         "metadata": { "namespace": l.ns, "name": l.name, "uid": uid } });
        env.note(store, &so, "KEDAScalersStopped", "Stopped scalers watch");
        env.note(
            store,
            &so,
            "ScaledObjectDeleted",
            "ScaledObject was deleted",
        );
    }
    for so in objects {
        if so["metadata"]["deletionTimestamp"].is_string() {
            continue;
        }
        let mut new = so.clone();
        let name = meta(&so, "name");
        if new["metadata"]["labels"][NAME_LABEL] != json!(name) {
            new["metadata"]["labels"][NAME_LABEL] = json!(name);
        }
        reconcile(store, &env, &mut loops, &so, &mut new);
        if new == so {
            continue;
        }
        if let Some(schema) = &schema {
            let out = schema::validate(schema, &mut new, Some(&so));
            if !out.errors.is_empty() {
                let errors: Vec<String> =
                    out.errors.iter().map(schema::FieldError::render).collect();
                tracing::warn!(scaledobject = %name, "status refused by the CRD schema: {}", errors.join(", "));
                continue;
            }
        }
        upsert(store, Key::new(SO_GR, &meta(&so, "namespace"), &name), new);
    }
}

/// What a pass works with.
struct Env<'a> {
    serving: &'a Serving,
    keda_ns: &'a str,
    metrics_server: bool,
    epoch_now: f64,
    now: &'a str,
}

/// Why a ScaledObject cannot be scaled: the Ready condition's message and the events
/// KEDA writes on the way.
struct CheckFailed {
    message: String,
    events: Vec<(&'static str, String)>,
}

fn check_failed(message: &str, events: Vec<(&'static str, String)>) -> CheckFailed {
    CheckFailed {
        message: message.to_owned(),
        events,
    }
}

/// One ScaledObject `so`: its target and triggers checked, its loops run when due, and
/// what KEDA writes of it in `new`.
fn reconcile(
    store: &mut Store,
    env: &Env,
    loops: &mut HashMap<String, Loop>,
    so: &Value,
    new: &mut Value,
) {
    let uid = meta(so, "uid");
    let status = &mut new["status"];
    if !status["conditions"].is_array() {
        status["conditions"] = json!(
            ["Ready", "Active", "Fallback", "Paused"]
                .map(|t| json!({ "type": t, "status": "Unknown" }))
        );
    }
    set_condition(
        status,
        "Fallback",
        "False",
        "NoFallbackFound",
        "No fallbacks are active on this scaled object",
    );
    let checked = check(store, so).and_then(|(target, obj)| Ok((target, obj, triggers(so)?)));
    let (target, target_obj, triggers) = match checked {
        Ok(c) => c,
        Err(failed) => {
            if condition(status, "Ready")
                != ("False", "ScaledObjectCheckFailed", failed.message.as_str())
            {
                for (reason, message) in &failed.events {
                    env.warn(store, so, reason, message);
                }
                env.warn(store, so, "ScaledObjectCheckFailed", &failed.message);
            }
            set_condition(
                status,
                "Ready",
                "False",
                "ScaledObjectCheckFailed",
                &failed.message,
            );
            set_condition(
                status,
                "Active",
                "Unknown",
                "UnknownState",
                "ScaledObject check failed",
            );
            loops.remove(&uid);
            return;
        }
    };
    let generation = so["metadata"]["generation"].as_i64().unwrap_or(1);
    status["scaleTargetKind"] = json!(target.gvk());
    status["scaleTargetGVKR"] = json!({ "group": target.res.group, "kind": target.res.kind,
        "resource": target.res.plural, "version": target.res.version });
    if status["originalReplicaCount"].is_null() {
        status["originalReplicaCount"] = json!(target.replicas(&target_obj));
    }
    let mut types: Vec<&str> = Vec::new();
    for t in &triggers {
        if !types.contains(&t.kind.as_str()) {
            types.push(&t.kind);
        }
    }
    status["triggersTypes"] = json!(types.join(","));
    status["authenticationsTypes"] = json!("");
    status["hpaName"] = json!(hpa_name(so));
    status["externalMetricNames"] = json!(
        triggers
            .iter()
            .map(|t| t.metric.clone())
            .collect::<Vec<_>>()
    );
    let restart = loops.get(&uid).is_none_or(|l| l.generation != generation);
    if restart {
        // The reconcile that starts (or restarts, on a new spec) the scale loop.
        if condition(status, "Ready").0 != "True" {
            env.note(
                store,
                so,
                "ScaledObjectReady",
                "ScaledObject is ready for scaling",
            );
        }
        set_condition(status, "Ready", "True", "ScaledObjectReady", READY_MESSAGE);
        if !loops.contains_key(&uid) {
            for t in &triggers {
                env.note(
                    store,
                    so,
                    "KEDAScalersStarted",
                    &format!("Scaler {} is built", t.kind),
                );
            }
            env.note(store, so, "KEDAScalersStarted", "Started scalers watch");
        }
        let l = loops.entry(uid.clone()).or_insert_with(|| Loop {
            ns: meta(so, "namespace"),
            name: meta(so, "name"),
            generation,
            next_poll: env.epoch_now,
            next_sync: env.epoch_now,
            recommendations: None,
            ups: Vec::new(),
            downs: Vec::new(),
            restore: None,
        });
        l.generation = generation;
    }
    let Some(l) = loops.get_mut(&uid) else {
        return;
    };
    l.restore = (so["spec"]["advanced"]["restoreToOriginalReplicaCount"] == true)
        .then(|| {
            status["originalReplicaCount"]
                .as_i64()
                .map(|o| (target.clone(), o))
        })
        .flatten();
    let polling = so["spec"]["pollingInterval"]
        .as_f64()
        .unwrap_or(DEFAULT_POLLING_SECS)
        .max(1.0);
    if reached(env.epoch_now, l.next_poll) {
        poll(store, env, so, &target, &triggers, status);
        l.next_poll = next_run(l.next_poll, polling, env.epoch_now);
        reached(env.epoch_now, l.next_poll);
    }
    if env.metrics_server {
        if reached(env.epoch_now, l.next_sync) {
            sync(store, env, l, so, &target, &triggers);
            l.next_sync = next_run(l.next_sync, HPA_SYNC_SECS, env.epoch_now);
            reached(env.epoch_now, l.next_sync);
        }
    } else {
        // Once the metrics server is up, the HPA syncs at once.
        l.next_sync = l.next_sync.min(env.epoch_now);
    }
}

/// A loop's next run after the one due at `due`: a period later, as a ticker keeps
/// time, or a period from `now` when it fell that far behind.
fn next_run(due: f64, period: f64, now: f64) -> f64 {
    if due + period > now {
        due + period
    } else {
        now + period
    }
}

fn hpa_name(so: &Value) -> String {
    so["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["name"]
        .as_str()
        .filter(|n| !n.is_empty())
        .map_or_else(|| format!("keda-hpa-{}", meta(so, "name")), str::to_owned)
}

/// The `(status, reason, message)` of condition `kind` in `status`.
fn condition<'a>(status: &'a Value, kind: &str) -> (&'a str, &'a str, &'a str) {
    let c = status["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == kind));
    let s = |k: &str| c.and_then(|c| c[k].as_str()).unwrap_or_default();
    (s("status"), s("reason"), s("message"))
}

fn set_condition(status: &mut Value, kind: &str, state: &str, reason: &str, message: &str) {
    let c = json!({ "type": kind, "status": state, "reason": reason, "message": message });
    let Some(cs) = status["conditions"].as_array_mut() else {
        return;
    };
    match cs.iter_mut().find(|c| c["type"] == kind) {
        Some(old) => *old = c,
        None => cs.push(c),
    }
}

/// The scale target of `so`, checked as KEDA checks it, and the target as stored.
fn check(store: &Store, so: &Value) -> Result<(Target, Obj), CheckFailed> {
    let r = &so["spec"]["scaleTargetRef"];
    let name = r["name"].as_str().unwrap_or_default();
    if name.is_empty() {
        return Err(check_failed(TARGET_MESSAGE, Vec::new()));
    }
    let api_version = r["apiVersion"].as_str().unwrap_or("apps/v1");
    let kind = r["kind"].as_str().unwrap_or("Deployment");
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let Some(res) = discovery::all(store)
        .into_iter()
        .find(|res| res.group == group && res.version == version && res.kind == kind)
    else {
        let why = format!("no matches for kind \"{kind}\" in version \"{api_version}\"");
        return Err(check_failed(
            TARGET_MESSAGE,
            vec![("ScaledObjectUpdateFailed", why)],
        ));
    };
    let ns = meta(so, "namespace");
    let key = Key::new(&res.gr(), &ns, name);
    let Some(obj) = store.get(&key).cloned() else {
        let why = "Target resource doesn't exist".to_owned();
        return Err(check_failed(
            TARGET_MESSAGE,
            vec![("ScaledObjectCheckFailed", why)],
        ));
    };
    if !SCALABLE.contains(&res.gr().as_str()) && res.scale.is_none() {
        let why = "Target resource doesn't expose /scale subresource".to_owned();
        return Err(check_failed(
            TARGET_MESSAGE,
            vec![("ScaledObjectCheckFailed", why)],
        ));
    }
    let (min, max) = bounds(so);
    if min > max {
        return Err(check_failed(
            "ScaledObject doesn't have correct Idle/Min/Max Replica Counts specification",
            Vec::new(),
        ));
    }
    Ok((Target { res, key }, obj))
}

/// `minReplicaCount` (default 0) and `maxReplicaCount` (default 100).
fn bounds(so: &Value) -> (i64, i64) {
    (
        so["spec"]["minReplicaCount"].as_i64().unwrap_or(0),
        so["spec"]["maxReplicaCount"]
            .as_i64()
            .unwrap_or(DEFAULT_MAX_REPLICAS),
    )
}

/// How an external metric's target is given.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Goal {
    AverageValue,
    Value,
}

/// A trigger as KEDA builds its scaler.
struct Trigger {
    kind: String,
    /// What KEDA names it by in its events: its `name`, else the scaler's type.
    name: String,
    /// The external metric it serves the HPA.
    metric: String,
    target_type: Goal,
    /// Its target value and activation threshold.
    target: f64,
    activation: f64,
    source: Source,
}

/// Where a trigger reads its value.
enum Source {
    MetricsApi(MetricsApi),
    Prometheus(PrometheusQuery),
}

/// A `metrics-api` trigger's metadata.
struct MetricsApi {
    url: String,
    format: String,
    value_location: String,
}

/// A `prometheus` trigger's metadata.
struct PrometheusQuery {
    server_address: String,
    query: String,
    /// An empty result (or an infinite value) is 0 rather than an error.
    ignore_null_values: bool,
}

/// KEDA's `NormalizeString`, which makes a metric name of a value location.
fn normalize(s: &str) -> String {
    s.chars()
        .map(|c| if "/.:%()".contains(c) { '-' } else { c })
        .collect()
}

/// The triggers of `so`, or why KEDA cannot build their scalers (which keeps it from
/// creating the HPA).
fn triggers(so: &Value) -> Result<Vec<Trigger>, CheckFailed> {
    let failed = |e: String| {
        check_failed(
            "failed to ensure HPA is correctly created for ScaledObject",
            vec![("KEDAScalerFailed", e)],
        )
    };
    let specs = so["spec"]["triggers"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if specs.is_empty() {
        return Err(check_failed(
            "ScaledObject doesn't have correct triggers specification",
            Vec::new(),
        ));
    }
    let mut out = Vec::with_capacity(specs.len());
    for (i, t) in specs.iter().enumerate() {
        let kind = t["type"].as_str().unwrap_or_default().to_owned();
        if kind != "metrics-api" && kind != "prometheus" {
            return Err(failed(format!("no scaler found for type: {kind}")));
        }
        let target_type = match t["metricType"].as_str().unwrap_or("") {
            "" | "AverageValue" => Goal::AverageValue,
            "Value" => Goal::Value,
            "Utilization" => {
                return Err(failed("error getting scaler metric type: 'Utilization' metric type is unsupported for external metrics, allowed values are 'Value' or 'AverageValue'".to_owned()));
            }
            other => {
                return Err(failed(format!(
                    "error getting scaler metric type: '{other}' is not a valid metric type"
                )));
            }
        };
        let m = &t["metadata"];
        if kind == "prometheus" {
            out.push(prometheus_trigger(i, t, target_type).map_err(failed)?);
            continue;
        }
        let parse_error = |e: &str| failed(format!("error parsing metric API metadata: {e}"));
        let number = |k: &str, default: Option<f64>| -> Result<f64, CheckFailed> {
            match m[k].as_str() {
                Some(v) => v.trim().parse::<f64>().map_err(|_| {
                    parse_error(&format!(
                        "{k} parsing error strconv.ParseFloat: parsing \"{v}\": invalid syntax"
                    ))
                }),
                None => default.ok_or_else(|| parse_error(&format!("no {k} given in metadata"))),
            }
        };
        let target = number("targetValue", None)?;
        let activation = number("activationTargetValue", Some(0.0))?;
        let Some(url) = m["url"].as_str() else {
            return Err(parse_error("no url given in metadata"));
        };
        let format = m["format"].as_str().unwrap_or("json").trim().to_owned();
        if !["json", "prometheus", "yaml", "xml"].contains(&format.as_str()) {
            return Err(parse_error(&format!("format {format} not supported")));
        }
        let Some(value_location) = m["valueLocation"].as_str() else {
            return Err(parse_error("no valueLocation given in metadata"));
        };
        out.push(Trigger {
            name: t["name"]
                .as_str()
                .filter(|n| !n.is_empty())
                .unwrap_or("metricsAPIScaler")
                .to_owned(),
            metric: format!(
                "s{i}-{}",
                normalize(&format!("metric-api-{value_location}"))
            ),
            kind,
            target_type,
            target,
            activation,
            source: Source::MetricsApi(MetricsApi {
                url: url.to_owned(),
                format,
                value_location: value_location.to_owned(),
            }),
        });
    }
    Ok(out)
}

/// The `prometheus` trigger `t` (the `i`th), its metadata read as KEDA 2.17's typed
/// config reads it (`serverAddress`, `query` and `threshold` required), or why not.
fn prometheus_trigger(i: usize, t: &Value, target_type: Goal) -> Result<Trigger, String> {
    let m = &t["metadata"];
    let parse_error = |e: String| format!("error parsing prometheus metadata: {e}");
    let required = |k: &str| -> Result<String, String> {
        m[k].as_str()
            .filter(|v| !v.is_empty())
            .map(str::to_owned)
            .ok_or_else(|| {
                parse_error(format!(
                    "missing required parameter \"{k}\" in [triggerMetadata]"
                ))
            })
    };
    let unable = |k: &str, v: &str, ty: &str| {
        let first = v.chars().next().unwrap_or(' ');
        parse_error(format!(
            "unable to set param \"{k}\" value \"{v}\": unable to unmarshal to field type {ty}: invalid character '{first}' looking for beginning of value"
        ))
    };
    let float = |k: &str, v: &str| -> Result<f64, String> {
        v.trim().parse::<f64>().map_err(|_| unable(k, v, "float64"))
    };
    let server_address = required("serverAddress")?;
    let query = required("query")?;
    let threshold = float("threshold", &required("threshold")?)?;
    let activation = match m["activationThreshold"].as_str() {
        Some(v) if !v.is_empty() => float("activationThreshold", v)?,
        _ => 0.0,
    };
    let ignore_null_values = match m["ignoreNullValues"].as_str() {
        None | Some("") => true,
        Some("1" | "t" | "T" | "true" | "TRUE" | "True") => true,
        Some("0" | "f" | "F" | "false" | "FALSE" | "False") => false,
        Some(v) => return Err(unable("ignoreNullValues", v, "bool")),
    };
    Ok(Trigger {
        kind: "prometheus".to_owned(),
        name: t["name"]
            .as_str()
            .filter(|n| !n.is_empty())
            .unwrap_or("prometheusScaler")
            .to_owned(),
        metric: format!("s{i}-prometheus"),
        target_type,
        target: threshold,
        activation,
        source: Source::Prometheus(PrometheusQuery {
            server_address,
            query,
            ignore_null_values,
        }),
    })
}

/// Each trigger's value now, or the error KEDA's scaler reports for it (also written
/// as a `KEDAScalerFailed` event, as KEDA does on every failed read).
fn measure(
    store: &mut Store,
    env: &Env,
    so: &Value,
    triggers: &[Trigger],
) -> Vec<Result<f64, String>> {
    let values: Vec<Result<f64, String>> = triggers
        .iter()
        .map(|t| match &t.source {
            Source::MetricsApi(api) => fetch(store, env, api)
                .map_err(|e| format!("error requesting metrics endpoint: {e}")),
            Source::Prometheus(p) => query(store, env, p),
        })
        .collect();
    for e in values.iter().filter_map(|v| v.as_ref().err()) {
        env.warn(store, so, "KEDAScalerFailed", e);
    }
    values
}

/// KEDA's scale loop for `so` (its `RequestScale`): activation from and deactivation to
/// zero, the last time a trigger was active, and the Ready and Active conditions.
fn poll(
    store: &mut Store,
    env: &Env,
    so: &Value,
    target: &Target,
    triggers: &[Trigger],
    status: &mut Value,
) {
    let values = measure(store, env, so, triggers);
    let error = values.iter().any(Result::is_err);
    let active_triggers: Vec<&str> = triggers
        .iter()
        .zip(&values)
        .filter(|(t, v)| v.as_ref().is_ok_and(|v| *v > t.activation))
        .map(|(t, _)| t.name.as_str())
        .collect();
    let active = !active_triggers.is_empty();
    let Some(current) = store.get(&target.key).map(|o| target.replicas(o)) else {
        return;
    };
    if !error && condition(status, "Ready").0 != "True" {
        set_condition(status, "Ready", "True", "ScaledObjectReady", READY_MESSAGE);
    }
    let (min, _) = bounds(so);
    let kind = target.gvk();
    let target_name = &target.key.name;
    let ns = &target.key.ns;
    if active {
        if current == 0 {
            let replicas = min.max(1);
            target.scale(store, replicas, KEDA_MANAGER, env.now);
            let message = format!(
                "Scaled {kind} {ns}/{target_name} from 0 to {replicas}, triggered by {}",
                active_triggers.join(";")
            );
            env.note(store, so, "KEDAScaleTargetActivated", &message);
            status["lastActiveTime"] = json!(env.now);
        } else if error {
            let msg = "Some triggers defined in ScaledObject are not working correctly";
            if condition(status, "Ready").0 != "Unknown" {
                set_condition(status, "Ready", "Unknown", "PartialTriggerError", msg);
            }
        } else {
            status["lastActiveTime"] = json!(env.now);
        }
    } else if error {
        let msg = "Triggers defined in ScaledObject are not working correctly";
        if condition(status, "Ready").0 != "False" {
            set_condition(status, "Ready", "False", "TriggerError", msg);
        }
    } else if current > 0 && min == 0 {
        let cooldown = so["spec"]["cooldownPeriod"]
            .as_f64()
            .unwrap_or(DEFAULT_COOLDOWN_SECS);
        let initial = so["spec"]["initialCooldownPeriod"].as_f64().unwrap_or(0.0);
        let since = match status["lastActiveTime"].as_str().and_then(parse_rfc3339) {
            Some(last) => last + cooldown,
            None => so["metadata"]["creationTimestamp"]
                .as_str()
                .and_then(parse_rfc3339)
                .map_or(f64::NEG_INFINITY, |c| c + initial),
        };
        if since < env.epoch_now.floor() {
            target.scale(store, 0, KEDA_MANAGER, env.now);
            let message = format!("Deactivated {kind} {ns}/{target_name} from {current} to 0");
            env.note(store, so, "KEDAScaleTargetDeactivated", &message);
            set_condition(
                status,
                "Active",
                "False",
                "ScalerNotActive",
                NOT_ACTIVE_MESSAGE,
            );
        } else if condition(status, "Active").1 != "ScalerCooldown" {
            let msg = "Scaler cooling down because triggers are not active";
            set_condition(status, "Active", "False", "ScalerCooldown", msg);
        }
    } else if current < min {
        target.scale(store, min, KEDA_MANAGER, env.now);
    }
    let (state, _, _) = condition(status, "Active");
    if state == "Unknown" || (state == "True") != active {
        if active {
            set_condition(status, "Active", "True", "ScalerActive", ACTIVE_MESSAGE);
        } else {
            set_condition(
                status,
                "Active",
                "False",
                "ScalerNotActive",
                NOT_ACTIVE_MESSAGE,
            );
        }
    }
}

/// The HPA's rules for one direction: its stabilization window, how it chooses among
/// its policies, and the policies (Pods or Percent, value, period).
#[derive(Clone, Debug, PartialEq)]
struct Rules {
    window: f64,
    select: Select,
    policies: Vec<(Change, i64, f64)>,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Select {
    Max,
    Min,
    Disabled,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Change {
    Pods,
    Percent,
}

/// The HPA's `behavior` as the API server defaults it, if the ScaledObject gives one
/// (without, the HPA controller scales by its older rules).
fn behavior(so: &Value) -> Option<(Rules, Rules)> {
    let b = &so["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"];
    if !b.is_object() {
        return None;
    }
    let rules = |v: &Value, up: bool| {
        let mut policies: Vec<(Change, i64, f64)> = v["policies"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|p| {
                let change = match p["type"].as_str()? {
                    "Pods" => Change::Pods,
                    "Percent" => Change::Percent,
                    _ => return None,
                };
                Some((change, p["value"].as_i64()?, p["periodSeconds"].as_f64()?))
            })
            .collect();
        if policies.is_empty() {
            policies = if up {
                vec![(Change::Pods, 4, 15.0), (Change::Percent, 100, 15.0)]
            } else {
                vec![(Change::Percent, 100, 15.0)]
            };
        }
        Rules {
            window: v["stabilizationWindowSeconds"].as_f64().unwrap_or(if up {
                0.0
            } else {
                DOWNSCALE_WINDOW_SECS
            }),
            select: match v["selectPolicy"].as_str() {
                Some("Min") => Select::Min,
                Some("Disabled") => Select::Disabled,
                _ => Select::Max,
            },
            policies,
        }
    };
    Some((rules(&b["scaleUp"], true), rules(&b["scaleDown"], false)))
}

/// The replicas `events` (when, change) added within `period` of `now`.
fn changed_within(events: &[(f64, i64)], period: f64, now: f64) -> i64 {
    events
        .iter()
        .filter(|(t, _)| *t > now - period)
        .map(|(_, c)| c)
        .sum()
}

/// Replicas changed (when, how many), for the rate policies.
type Changes = [(f64, i64)];

/// The bound the scale-up (`up`) or scale-down rules put on the replicas from `current`:
/// the most they allow up, the fewest down. Each policy starts from the replicas at the
/// start of its period (what changed within it taken back).
fn limit(
    current: i64,
    (ups, downs): (&Changes, &Changes),
    rules: &Rules,
    now: f64,
    up: bool,
) -> i64 {
    // `Min` picks the policy that changes least: the lowest bound up, the highest down.
    let least = match rules.select {
        Select::Disabled => return current,
        select => (select == Select::Min) == up,
    };
    let (pick, mut result): (fn(i64, i64) -> i64, i64) = if least {
        (i64::min, i64::MAX)
    } else {
        (i64::max, i64::MIN)
    };
    for (change, value, period) in &rules.policies {
        let start =
            current - changed_within(ups, *period, now) + changed_within(downs, *period, now);
        let proposed = match (change, up) {
            (Change::Pods, true) => start + value,
            (Change::Pods, false) => start - value,
            (Change::Percent, true) => (start as f64 * (1.0 + *value as f64 / 100.0)).ceil() as i64,
            (Change::Percent, false) => (start as f64 * (1.0 - *value as f64 / 100.0)) as i64,
        };
        result = pick(result, proposed);
    }
    result
}

impl Loop {
    /// The HPA's recommendation `desired` from `current` within [`min`, `max`], after
    /// its stabilization windows and rate policies (`behavior`), or its older rules
    /// without one: the highest recommendation of the last five minutes when scaling
    /// down, at most twice the replicas (at least 4) when scaling up.
    fn normalize(
        &mut self,
        behavior: Option<&(Rules, Rules)>,
        current: i64,
        desired: i64,
        min: i64,
        max: i64,
        now: f64,
    ) -> i64 {
        let Some((up, down)) = behavior else {
            let recs = self.recommendations.get_or_insert_with(Vec::new);
            let cutoff = now - DOWNSCALE_WINDOW_SECS;
            let stabilized = recs
                .iter()
                .filter(|(t, _)| *t >= cutoff)
                .map(|(_, r)| *r)
                .fold(desired, i64::max);
            keep(recs, (now, desired), cutoff);
            let most = max.min((current * 2).max(4));
            return stabilized.clamp(min.min(most), most);
        };
        if self.recommendations.is_none() && down.window > 0.0 {
            self.recommendations = Some(vec![(now, current)]);
        }
        let recs = self.recommendations.get_or_insert_with(Vec::new);
        let (window, better): (f64, fn(i64, i64) -> i64) = if desired >= current {
            (up.window, i64::min)
        } else {
            (down.window, i64::max)
        };
        let stabilized = recs
            .iter()
            .filter(|(t, _)| *t > now - window)
            .map(|(_, r)| *r)
            .fold(desired, better);
        keep(recs, (now, desired), now - up.window.max(down.window));
        if stabilized > current {
            let limit = limit(current, (&self.ups, &self.downs), up, now, true).max(current);
            stabilized.min(max.min(limit))
        } else if stabilized < current {
            let limit = limit(current, (&self.ups, &self.downs), down, now, false).min(current);
            stabilized.max(min.max(limit))
        } else {
            stabilized
        }
    }

    /// Remembers a rescale from `from` to `to` for the rate policies, forgetting what
    /// is older than the longest of their periods.
    fn scaled(&mut self, behavior: Option<&(Rules, Rules)>, from: i64, to: i64, now: f64) {
        let Some((up, down)) = behavior else {
            return;
        };
        let (events, rules, change) = if to > from {
            (&mut self.ups, up, to - from)
        } else {
            (&mut self.downs, down, from - to)
        };
        let longest = rules.policies.iter().map(|p| p.2).fold(0.0, f64::max);
        events.retain(|(t, _)| *t > now - longest);
        events.push((now, change));
    }
}

/// Stores recommendation `rec`, in place of one from before `cutoff` if there is one.
fn keep(recs: &mut Vec<(f64, i64)>, rec: (f64, i64), cutoff: f64) {
    match recs.iter().rposition(|(t, _)| *t < cutoff) {
        Some(i) => recs[i] = rec,
        None => recs.push(rec),
    }
}

/// HPA's `%+v` of the label selector KEDA gives its external metrics.
fn selector_shown(so_name: &str) -> String {
    format!(
        "&LabelSelector{{MatchLabels:map[string]string{{{NAME_LABEL}: {so_name},}},MatchExpressions:[]LabelSelectorRequirement{{}},}}"
    )
}

/// One sync of the HPA KEDA made for `so`: the replicas its metrics ask for, within the
/// ScaledObject's bounds (at least one), and a `SuccessfulRescale` event when it scales.
fn sync(
    store: &mut Store,
    env: &Env,
    l: &mut Loop,
    so: &Value,
    target: &Target,
    triggers: &[Trigger],
) {
    let Some(obj) = store.get(&target.key).cloned() else {
        return;
    };
    let behavior = behavior(so);
    let current = target.replicas(&obj);
    let (min, max) = bounds(so);
    let min = min.max(1);
    // A target at zero is KEDA's to wake: the HPA leaves it alone.
    if current == 0 {
        return;
    }
    let (desired, reason) = if current > max {
        (
            max,
            "Current number of replicas above Spec.MaxReplicas".to_owned(),
        )
    } else if current < min {
        (
            min,
            "Current number of replicas below Spec.MinReplicas".to_owned(),
        )
    } else {
        let values = measure(store, env, so, triggers);
        let status_replicas = target.status_replicas(&obj);
        let ready = obj["status"]["readyReplicas"]
            .as_i64()
            .unwrap_or(status_replicas);
        let mut proposal: Option<(i64, &str)> = None;
        for (t, v) in triggers.iter().zip(&values) {
            let Ok(v) = v else { continue };
            let usage = (v * 1000.0) as i64;
            let goal = (t.target * 1000.0) as i64;
            if goal <= 0 {
                continue;
            }
            let replicas = match t.target_type {
                Goal::AverageValue => {
                    let ratio = usage as f64 / (goal as f64 * status_replicas as f64);
                    if (1.0 - ratio).abs() > TOLERANCE {
                        (usage as f64 / goal as f64).ceil() as i64
                    } else {
                        status_replicas
                    }
                }
                Goal::Value => {
                    let ratio = usage as f64 / goal as f64;
                    if (1.0 - ratio).abs() <= TOLERANCE {
                        current
                    } else {
                        (ratio * ready as f64).ceil() as i64
                    }
                }
            };
            if proposal.is_none_or(|(r, _)| replicas > r) {
                proposal = Some((replicas, &t.metric));
            }
        }
        let invalid = values.iter().filter(|v| v.is_err()).count();
        // All metrics unreadable, or some with a smaller answer: the HPA does nothing.
        let Some((wanted, metric)) = proposal else {
            return;
        };
        if invalid > 0 && wanted < current {
            return;
        }
        let reason = if wanted > current {
            format!(
                "external metric {metric}({}) above target",
                selector_shown(&meta(so, "name"))
            )
        } else {
            "All metrics below target".to_owned()
        };
        (
            l.normalize(behavior.as_ref(), current, wanted, min, max, env.epoch_now),
            reason,
        )
    };
    if desired == current {
        return;
    }
    target.scale(store, desired, HPA_MANAGER, env.now);
    l.scaled(behavior.as_ref(), current, desired, env.epoch_now);
    let hpa = json!({ "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
                      "namespace": meta(so, "namespace"), "name": hpa_name(so) });
    let message = format!("New size: {desired}; reason: {reason}");
    record(
        store,
        &hpa,
        "Normal",
        "SuccessfulRescale",
        &message,
        &json!({ "component": "horizontal-pod-autoscaler" }),
        env.now,
    );
}

/// The reference an event on `so` has to it.
fn reference(so: &Value) -> Value {
    json!({ "apiVersion": so["apiVersion"], "kind": "ScaledObject", "namespace": meta(so, "namespace"),
            "name": meta(so, "name"), "uid": meta(so, "uid"),
            "resourceVersion": meta(so, "resourceVersion") })
}

impl Env<'_> {
    /// A Normal event of KEDA's operator about `so`.
    fn note(&self, store: &mut Store, so: &Value, reason: &str, message: &str) {
        let involved = reference(so);
        record(
            store,
            &involved,
            "Normal",
            reason,
            message,
            &json!({ "component": OPERATOR }),
            self.now,
        );
    }

    /// A Warning event of KEDA's operator about `so`.
    fn warn(&self, store: &mut Store, so: &Value, reason: &str, message: &str) {
        let involved = reference(so);
        record(
            store,
            &involved,
            "Warning",
            reason,
            message,
            &json!({ "component": OPERATOR }),
            self.now,
        );
    }
}

/// A trigger's URL as Go's HTTP client takes it apart: scheme, host, port, path (with
/// its query).
fn split_url(url: &str) -> Result<(&str, &str, u16, &str), String> {
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| format!("Get \"{url}\": unsupported protocol scheme \"\""))?;
    if !matches!(scheme, "http" | "https") {
        return Err(format!(
            "Get \"{url}\": unsupported protocol scheme \"{scheme}\""
        ));
    }
    let (authority, path) = match rest.find(['/', '?']) {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let default_port = if scheme == "https" { 443 } else { 80 };
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) => (
            h,
            p.parse::<u16>()
                .map_err(|_| format!("parse \"{url}\": invalid port \":{p}\" after host"))?,
        ),
        None => (authority, default_port),
    };
    Ok((scheme, host, port, path))
}

/// What a GET of `url` from KEDA's pod answers (status and body), or Go's HTTP
/// client's error.
fn get(store: &Store, env: &Env, url: &str) -> Result<(u16, String), String> {
    let (scheme, host, port, path) = split_url(url)?;
    let Some(svc) = service_proxy::resolve(store, host, env.keda_ns).cloned() else {
        return Err(format!(
            "Get \"{url}\": dial tcp: lookup {host} on {CLUSTER_DNS}: no such host"
        ));
    };
    let answered = service_proxy::get(store, env.serving, &svc, port, path, env.epoch_now);
    let (code, body) = match answered {
        Err(Unreachable::Refused(at)) => {
            return Err(format!(
                "Get \"{url}\": dial tcp {at}: connect: connection refused"
            ));
        }
        Err(Unreachable::Timeout) => {
            return Err(format!(
                "Get \"{url}\": context deadline exceeded (Client.Timeout exceeded while awaiting headers)"
            ));
        }
        Ok(answer) => answer,
    };
    if scheme == "https" {
        return Err(format!(
            "Get \"{url}\": http: server gave HTTP response to HTTPS client"
        ));
    }
    Ok((code, body))
}

/// What the trigger's URL gives, as its value, or why it gives none.
fn fetch(store: &Store, env: &Env, api: &MetricsApi) -> Result<f64, String> {
    let (code, body) = get(store, env, &api.url)?;
    if code != 200 {
        let path = split_url(&api.url).map_or("", |(_, _, _, p)| p);
        let bare = path.split('?').next().unwrap_or(path);
        return Err(format!("{bare}: api returned {code}"));
    }
    value_in(&body, &api.value_location, &api.format)
}

/// KEDA's `executePromQuery`: an instant query of the trigger's `query` at now, whose
/// one sample is the value (none: 0 when null values are ignored).
fn query(store: &Store, env: &Env, p: &PrometheusQuery) -> Result<f64, String> {
    let url = format!(
        "{}/api/v1/query?query={}&time={}",
        p.server_address,
        prometheus::query_escape(&p.query),
        env.now
    );
    let (code, body) = get(store, env, &url)?;
    if !(200..=299).contains(&code) {
        return Err(format!(
            "prometheus query api returned error. status: {code} response: {body}"
        ));
    }
    let doc: Value = serde_json::from_str(&body).map_err(|e| e.to_string())?;
    let empty = Vec::new();
    let result = doc["data"]["result"].as_array().unwrap_or(&empty);
    let lost = |what: &str| {
        if p.ignore_null_values {
            Ok(0.0)
        } else {
            Err(format!(
                "prometheus metrics 'prometheus' target may be lost, the {what} is empty"
            ))
        }
    };
    let value = match result.as_slice() {
        [] => return lost("result"),
        [one] => one["value"].as_array().cloned().unwrap_or_default(),
        _ => {
            return Err(format!(
                "prometheus query {} returned multiple elements",
                p.query
            ));
        }
    };
    let v = match value.as_slice() {
        [] => return lost("value list"),
        [_] => {
            return Err(format!(
                "prometheus query {} didn't return enough values",
                p.query
            ));
        }
        [_, v, ..] => match v.as_str() {
            Some(s) => parse_go_float(s)
                .ok_or_else(|| format!("strconv.ParseFloat: parsing \"{s}\": invalid syntax"))?,
            None => -1.0,
        },
    };
    // KEDA takes an infinite value as 0 when it ignores null values, and an error
    // otherwise; the sim does the same with NaN, which KEDA would pass on to the HPA
    // as a quantity Go cannot convert.
    if v.is_infinite() || v.is_nan() {
        if p.ignore_null_values {
            return Ok(0.0);
        }
        let shown = prometheus::format_value(v);
        return Err(format!("promtheus query returns {shown}"));
    }
    Ok(v)
}

/// A float as Go's `strconv.ParseFloat` reads Prometheus's values (`+Inf`, `NaN`).
fn parse_go_float(s: &str) -> Option<f64> {
    match s {
        "+Inf" | "Inf" | "inf" | "+inf" => Some(f64::INFINITY),
        "-Inf" | "-inf" => Some(f64::NEG_INFINITY),
        "NaN" | "nan" => Some(f64::NAN),
        s => s.parse().ok(),
    }
}

/// The value at `location` in a response `body` of `format`, as KEDA's
/// `GetValueFromResponse` finds it.
fn value_in(body: &str, location: &str, format: &str) -> Result<f64, String> {
    let wrong = |got: &str| {
        format!(
            "valueLocation must point to value of type number or a string representing a Quantity got: '{got}'"
        )
    };
    let at = |doc: &Value| -> Result<f64, String> {
        let v = path_in(doc, location);
        match v {
            Value::Number(n) => n.as_f64().ok_or_else(|| wrong("Number")),
            Value::String(s) => quantity(s).ok_or_else(|| wrong(s)),
            Value::Null => Err(wrong("Null")),
            Value::Bool(true) => Err(wrong("True")),
            Value::Bool(false) => Err(wrong("False")),
            _ => Err(wrong("JSON")),
        }
    };
    match format {
        "prometheus" => prometheus_value(body, location),
        "json" => at(&serde_json::from_str(body).unwrap_or(Value::Null)),
        "yaml" => {
            let doc: Value = serde_yaml::from_str(body).map_err(|e| e.to_string())?;
            at(&doc)
        }
        other => Err(format!("format {other} not supported")),
    }
}

/// The value at a dotted path (array elements by index; `\.` a dot in a key).
fn path_in<'a>(doc: &'a Value, path: &str) -> &'a Value {
    let mut keys = Vec::new();
    let mut key = String::new();
    let mut chars = path.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => key.extend(chars.next()),
            '.' => keys.push(std::mem::take(&mut key)),
            c => key.push(c),
        }
    }
    keys.push(key);
    keys.iter().fold(doc, |v, k| match (v, k.parse::<usize>()) {
        (Value::Array(items), Ok(i)) => items.get(i).unwrap_or(&Value::Null),
        _ => &v[k.as_str()],
    })
}

/// A Kubernetes quantity (`250m`, `1.5k`, `2Gi`, `1e3`) as a number.
fn quantity(s: &str) -> Option<f64> {
    let s = s.trim();
    let suffixes: [(&str, f64); 15] = [
        ("Ki", 1024.0),
        ("Mi", 1024f64.powi(2)),
        ("Gi", 1024f64.powi(3)),
        ("Ti", 1024f64.powi(4)),
        ("Pi", 1024f64.powi(5)),
        ("Ei", 1024f64.powi(6)),
        ("n", 1e-9),
        ("u", 1e-6),
        ("m", 1e-3),
        ("k", 1e3),
        ("M", 1e6),
        ("G", 1e9),
        ("T", 1e12),
        ("P", 1e15),
        ("E", 1e18),
    ];
    let (number, factor) = suffixes
        .iter()
        .find_map(|(suffix, f)| Some((s.strip_suffix(suffix)?, *f)))
        .unwrap_or((s, 1.0));
    let ok = !number.is_empty()
        && number
            .chars()
            .all(|c| c.is_ascii_digit() || matches!(c, '.' | '+' | '-' | 'e' | 'E'));
    ok.then(|| number.parse::<f64>().ok().map(|n| n * factor))
        .flatten()
}

/// A PromQL selector `name{label="value",...}`: the name and the label matchers (whose
/// operator KEDA ignores, comparing values only).
fn selector(location: &str) -> Result<(String, Vec<(String, String)>), String> {
    let bad = |what: &str| format!("1:1: parse error: {what}");
    let s = location.trim();
    let (name, rest) = match s.find('{') {
        Some(i) => (s[..i].trim(), Some(&s[i + 1..])),
        None => (s, None),
    };
    let mut matchers = Vec::new();
    let mut name = name.to_owned();
    if let Some(rest) = rest {
        let inner = rest
            .trim_end()
            .strip_suffix('}')
            .ok_or_else(|| bad("unexpected end of input inside braces"))?;
        let mut chars = inner.chars().peekable();
        loop {
            while chars.next_if(|c| c.is_whitespace() || *c == ',').is_some() {}
            if chars.peek().is_none() {
                break;
            }
            let label: String =
                std::iter::from_fn(|| chars.next_if(|c| c.is_alphanumeric() || *c == '_'))
                    .collect();
            while chars.next_if(|c| c.is_whitespace()).is_some() {}
            let op: String =
                std::iter::from_fn(|| chars.next_if(|c| matches!(c, '=' | '!' | '~'))).collect();
            while chars.next_if(|c| c.is_whitespace()).is_some() {}
            if label.is_empty()
                || !matches!(op.as_str(), "=" | "!=" | "=~" | "!~")
                || chars.next() != Some('"')
            {
                return Err(bad("unexpected character inside braces"));
            }
            let mut value = String::new();
            loop {
                match chars.next() {
                    Some('"') => break,
                    Some('\\') => value.extend(chars.next()),
                    Some(c) => value.push(c),
                    None => return Err(bad("unterminated quoted string")),
                }
            }
            if label == "__name__" {
                name = value;
            } else {
                matchers.push((label, value));
            }
        }
    }
    let valid = name.chars().enumerate().all(|(i, c)| {
        c.is_ascii_alphabetic() || c == '_' || c == ':' || (i > 0 && c.is_ascii_digit())
    });
    if name.is_empty() || !valid {
        return Err(bad(
            "vector selector must contain at least one non-empty matcher",
        ));
    }
    Ok((name, matchers))
}

/// KEDA's `getValueFromPrometheusResponse`: the first series of the selector's family
/// that has each of its labels with the value asked for.
fn prometheus_value(body: &str, location: &str) -> Result<f64, String> {
    let (name, matchers) = selector(location)?;
    let families = families(body)?;
    let Some((kind, samples)) = families.get(&name) else {
        return Err(format!("metric '{name}' not found"));
    };
    if kind != "histogram" && kind != "summary" {
        for (_, labels, value) in samples {
            if matchers.iter().all(|m| labels.contains(m)) {
                return Ok(*value);
            }
        }
    }
    Err(format!("value {location} not found"))
}

#[cfg(test)]
mod tests {
    use axum::http::Method;

    use super::*;
    use crate::clock::recording;
    use crate::kube::admission::{bootstrap, crd_status};
    use crate::kube::controllers::endpoints;
    use crate::kube::model_server::InFlight;
    use crate::kube::sglang_router::{Gateway, Handling};
    use crate::kube::time::rfc3339;

    const T0: f64 = 1_800_000_000.0;

    const ROUTER_METRICS: &str =
        "# HELP smg_http_requests_total Total HTTP requests by method and path
# TYPE smg_http_requests_total counter
smg_http_requests_total{method=\"POST\",path=\"/v1/chat/completions\"} 12

# HELP smg_http_connections_active Currently active HTTP connections
# TYPE smg_http_connections_active gauge
smg_http_connections_active 7

# TYPE smg_worker_requests_active gauge
smg_worker_requests_active{worker=\"http://10.0.0.1:30000\"} 3
smg_worker_requests_active{worker=\"http://10.0.0.2:30000\"} 4

# TYPE latency histogram
latency_bucket{le=\"1\"} 2
latency_sum 3.5
latency_count 2
";

    #[test]
    fn values_are_found_as_keda_finds_them() {
        let p = |location: &str| value_in(ROUTER_METRICS, location, "prometheus");
        assert_eq!(p("smg_http_connections_active"), Ok(7.0));
        assert_eq!(p("smg_http_connections_active{}"), Ok(7.0));
        assert_eq!(p("smg_worker_requests_active"), Ok(3.0), "the first series");
        assert_eq!(
            p("smg_worker_requests_active{worker=\"http://10.0.0.2:30000\"}"),
            Ok(4.0)
        );
        assert_eq!(
            p("smg_worker_requests_active{worker=\"nope\"}"),
            Err("value smg_worker_requests_active{worker=\"nope\"} not found".to_owned())
        );
        assert_eq!(p("nothing"), Err("metric 'nothing' not found".to_owned()));
        assert_eq!(p("latency"), Err("value latency not found".to_owned()));
        assert_eq!(
            p("latency_sum"),
            Err("metric 'latency_sum' not found".to_owned())
        );
        assert!(
            value_in("x{a=} 1\n", "x", "prometheus")
                .unwrap_err()
                .contains("line 1")
        );
        assert!(p("bad{").is_err());

        let json = r#"{"a": {"b": [{"c": 3}, {"c": "250m"}]}, "s": "x", "t": true}"#;
        assert_eq!(value_in(json, "a.b.0.c", "json"), Ok(3.0));
        assert_eq!(value_in(json, "a.b.1.c", "json"), Ok(0.25));
        assert!(
            value_in(json, "s", "json")
                .unwrap_err()
                .ends_with("got: 'x'")
        );
        assert!(
            value_in(json, "t", "json")
                .unwrap_err()
                .ends_with("got: 'True'")
        );
        assert_eq!(value_in("a:\n  b: 2Ki\n", "a.b", "yaml"), Ok(2048.0));
        assert_eq!(
            normalize("metric-api-smg_http_connections_active"),
            "metric-api-smg_http_connections_active"
        );
        assert_eq!(normalize("metric-api-a.b/c:d"), "metric-api-a-b-c-d");
    }

    fn rules(window: f64, up: bool) -> Rules {
        let policies = if up {
            vec![(Change::Pods, 4, 15.0), (Change::Percent, 100, 15.0)]
        } else {
            vec![(Change::Percent, 100, 15.0)]
        };
        Rules {
            window,
            select: Select::Max,
            policies,
        }
    }

    fn a_loop() -> Loop {
        Loop {
            ns: "default".into(),
            name: "q".into(),
            generation: 1,
            next_poll: 0.0,
            next_sync: 0.0,
            recommendations: None,
            ups: Vec::new(),
            downs: Vec::new(),
            restore: None,
        }
    }

    #[test]
    fn the_hpa_scales_up_at_once_within_its_rate_and_down_after_its_window() {
        let b = (rules(0.0, true), rules(60.0, false));
        let mut l = a_loop();
        // 1 -> 9 asked: at most 4 pods more (or double) per 15 s.
        let d = l.normalize(Some(&b), 1, 9, 1, 10, 0.0);
        assert_eq!(d, 5);
        l.scaled(Some(&b), 1, 5, 0.0);
        assert_eq!(
            l.normalize(Some(&b), 5, 9, 1, 10, 5.0),
            5,
            "no more within the period"
        );
        assert_eq!(l.normalize(Some(&b), 5, 9, 1, 10, 15.0), 9);
        l.scaled(Some(&b), 5, 9, 15.0);
        // Down: the highest recommendation of the last 60 s holds.
        assert_eq!(l.normalize(Some(&b), 9, 2, 1, 10, 30.0), 9);
        assert_eq!(l.normalize(Some(&b), 9, 2, 1, 10, 70.0), 9);
        assert_eq!(
            l.normalize(Some(&b), 9, 2, 1, 10, 80.0),
            2,
            "the 9s are over a minute old"
        );
        // Without a behavior: older rules, five minutes and double-or-4.
        let mut old = a_loop();
        assert_eq!(old.normalize(None, 2, 20, 1, 10, 0.0), 4);
        assert_eq!(old.normalize(None, 4, 1, 1, 10, 100.0), 8, "at most double");
        assert_eq!(old.normalize(None, 4, 1, 1, 10, 400.0), 1);
    }

    fn so(min: i64, max: i64) -> Value {
        json!({ "apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject",
            "metadata": { "name": "qwen", "namespace": "default", "uid": "so-1", "generation": 1,
                          "creationTimestamp": rfc3339(T0), "labels": { "hypd.dev/endpoint": "qwen" } },
            "spec": { "scaleTargetRef": { "apiVersion": "apps/v1", "kind": "Deployment", "name": "qwen" },
                "minReplicaCount": min, "maxReplicaCount": max, "pollingInterval": 5, "cooldownPeriod": 60,
                "advanced": { "horizontalPodAutoscalerConfig": { "name": "keda-hpa-qwen",
                    "behavior": { "scaleDown": { "stabilizationWindowSeconds": 20 } } } },
                "triggers": [{ "type": "metrics-api", "name": "router-requests", "metricType": "AverageValue",
                    "metadata": { "url": "http://qwen-router.default.svc.cluster.local:29000/metrics",
                        "format": "prometheus", "valueLocation": "smg_http_connections_active",
                        "targetValue": "2", "activationTargetValue": "0" } }] } })
    }

    /// A cluster with KEDA up, the `qwen` Deployment at one replica, and its SGLang
    /// gateway pod behind `qwen-router`'s metrics port.
    fn cluster() -> (Store, Obj) {
        let mut store = Store::new();
        let t0 = rfc3339(T0);
        bootstrap(&mut store, &t0);
        let mut crd: Value =
            serde_yaml::from_str(include_str!("../../../crds/keda.sh_scaledobjects.yaml")).unwrap();
        crd["metadata"]["uid"] = json!("crd");
        crd["status"] = crd_status(&crd, &t0);
        store.put(Key::new(CRD_GR, "", "scaledobjects.keda.sh"), crd);
        for name in [OPERATOR, METRICS_SERVERS[0]] {
            let d = json!({ "apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": { "name": name, "namespace": "hyperpod-inference-system" },
                "spec": { "replicas": 1 }, "status": { "readyReplicas": 1 } });
            store.put(
                Key::new("apps/deployments", "hyperpod-inference-system", name),
                d,
            );
        }
        let d = json!({ "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": { "name": "qwen", "namespace": "default", "uid": "d-1", "generation": 1 },
            "spec": { "replicas": 1 }, "status": { "replicas": 1, "readyReplicas": 1 } });
        store.put(Key::new("apps/deployments", "default", "qwen"), d);
        let router = json!({ "apiVersion": "v1", "kind": "Pod",
            "metadata": { "name": "qwen-router-abcde", "namespace": "default", "uid": "r-1",
                          "labels": { "hypd.dev/endpoint-router": "qwen" } },
            "spec": { "containers": [{ "name": "router", "image": "lmsysorg/sglang:v0.5.4",
                "command": ["python3", "-m", "sglang_router.launch_router", "--host", "0.0.0.0",
                    "--port", "30000", "--service-discovery", "--selector", "hypd.dev/endpoint=qwen",
                    "--service-discovery-namespace", "default", "--service-discovery-port", "30000",
                    "--prometheus-host", "0.0.0.0", "--prometheus-port", "29000"],
                "ports": [{ "name": "http", "containerPort": 30000 }, { "name": "metrics", "containerPort": 29000 }] }] },
            "status": { "phase": "Running", "podIP": "10.0.0.9",
                        "conditions": [{ "type": "Ready", "status": "True" }] } });
        let router = store.put(Key::new("/pods", "default", "qwen-router-abcde"), router);
        let svc = json!({ "apiVersion": "v1", "kind": "Service",
            "metadata": { "name": "qwen-router", "namespace": "default" },
            "spec": { "clusterIP": "172.20.9.9", "selector": { "hypd.dev/endpoint-router": "qwen" },
                      "ports": [{ "name": "metrics", "port": 29000, "targetPort": 29000 }] } });
        store.put(Key::new("/services", "default", "qwen-router"), svc);
        endpoints::endpoints(&mut store, &t0);
        (store, router)
    }

    /// Holds `n` requests in flight through the gateway `router` (it has no worker, so
    /// each is answered 503 but stays counted while held).
    fn in_flight(store: &Store, serving: &Serving, router: &Obj, n: usize) -> Vec<InFlight> {
        let gateway = Gateway::of(router).unwrap();
        (0..n)
            .map(|_| {
                match gateway.handle(
                    router,
                    30000,
                    store,
                    serving,
                    &Method::POST,
                    "/v1/chat/completions",
                    b"{}",
                    0.0,
                ) {
                    Handling::Answer(_, Some(counted)) => counted,
                    _ => panic!("no worker: the gateway answers"),
                }
            })
            .collect()
    }

    fn replicas(store: &Store) -> i64 {
        store
            .get(&Key::new("apps/deployments", "default", "qwen"))
            .unwrap()["spec"]["replicas"]
            .as_i64()
            .unwrap()
    }

    fn rescales(store: &Store) -> Vec<String> {
        let mut events: Vec<(String, String)> = store
            .list("/events", Some("default"))
            .filter(|e| e["reason"] == "SuccessfulRescale")
            .map(|e| {
                (
                    e["firstTimestamp"].as_str().unwrap().to_owned(),
                    e["message"].as_str().unwrap().to_owned(),
                )
            })
            .collect();
        events.sort();
        events.into_iter().map(|(_, m)| m).collect()
    }

    #[test]
    fn keda_scales_on_the_routers_in_flight_requests_and_back_after_the_window() {
        let (mut store, router) = cluster();
        let serving = Serving::default();
        let memory = Autoscalers::default();
        store.put(Key::new(SO_GR, "default", "qwen"), so(1, 3));
        let pass = |store: &mut Store, t: f64| {
            recording(|| scaledobjects(store, &serving, &memory, T0 + t, &rfc3339(T0 + t))).1
        };
        let due = pass(&mut store, 0.0);
        assert_eq!(due, 5.0, "KEDA polls again in 5 s");
        let so_now = store
            .get(&Key::new(SO_GR, "default", "qwen"))
            .unwrap()
            .clone();
        let status = &so_now["status"];
        assert_eq!(status["scaleTargetKind"], "apps/v1.Deployment");
        assert_eq!(status["scaleTargetGVKR"]["resource"], "deployments");
        assert_eq!(status["originalReplicaCount"], 1);
        assert_eq!(status["hpaName"], "keda-hpa-qwen");
        assert_eq!(
            status["externalMetricNames"],
            json!(["s0-metric-api-smg_http_connections_active"])
        );
        assert_eq!(
            condition(status, "Ready"),
            ("True", "ScaledObjectReady", READY_MESSAGE)
        );
        assert_eq!(
            condition(status, "Active"),
            ("False", "ScalerNotActive", NOT_ACTIVE_MESSAGE)
        );
        assert_eq!(condition(status, "Paused").0, "Unknown");
        assert_eq!(so_now["metadata"]["labels"][NAME_LABEL], "qwen");
        assert_eq!(replicas(&store), 1);

        // 7 in flight, 2 a replica: 4 asked, 3 at most.
        let held = in_flight(&store, &serving, &router, 7);
        pass(&mut store, 5.0);
        let status = store.get(&Key::new(SO_GR, "default", "qwen")).unwrap()["status"].clone();
        assert_eq!(condition(&status, "Active").0, "True");
        assert_eq!(status["lastActiveTime"], rfc3339(T0 + 5.0));
        assert_eq!(replicas(&store), 1, "the HPA syncs every 15 s");
        pass(&mut store, 15.0);
        assert_eq!(replicas(&store), 3);
        let managers: Vec<Value> = store
            .get(&Key::new("apps/deployments", "default", "qwen"))
            .unwrap()["metadata"]["managedFields"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| json!([m["manager"], m["subresource"]]))
            .collect();
        assert!(
            managers.contains(&json!(["kube-controller-manager", "scale"])),
            "{managers:?}"
        );
        let up = rescales(&store);
        assert_eq!(up.len(), 1);
        assert!(up[0].starts_with("New size: 3; reason: external metric s0-metric-api-smg_http_connections_active(&LabelSelector{MatchLabels:map[string]string{scaledobject.keda.sh/name: qwen,},"), "{up:?}");
        assert!(up[0].ends_with(") above target"), "{up:?}");

        // The load stops: down to 1 once the 20 s window has no higher recommendation.
        drop(held);
        pass(&mut store, 30.0);
        assert_eq!(replicas(&store), 3, "within the window");
        pass(&mut store, 45.0);
        assert_eq!(replicas(&store), 1);
        assert_eq!(
            rescales(&store).last().unwrap(),
            "New size: 1; reason: All metrics below target"
        );
        let e = store
            .list("/events", Some("default"))
            .find(|e| e["reason"] == "SuccessfulRescale")
            .unwrap();
        assert_eq!(e["involvedObject"]["kind"], "HorizontalPodAutoscaler");
        assert_eq!(e["involvedObject"]["apiVersion"], "autoscaling/v2");
        assert_eq!(e["source"]["component"], "horizontal-pod-autoscaler");

        // Deleting it leaves the replicas as they are.
        store.remove(&Key::new(SO_GR, "default", "qwen"));
        assert_eq!(pass(&mut store, 50.0), f64::INFINITY);
        assert_eq!(replicas(&store), 1);
        assert!(
            store
                .list("/events", Some("default"))
                .any(|e| e["reason"] == "ScaledObjectDeleted")
        );
    }

    #[test]
    fn failures_are_told_in_conditions_and_events() {
        let (mut store, _) = cluster();
        let serving = Serving::default();
        let memory = Autoscalers::default();
        let mut missing = so(0, 3);
        missing["spec"]["scaleTargetRef"]["name"] = json!("nope");
        store.put(Key::new(SO_GR, "default", "qwen"), missing);
        let at = |t: f64| rfc3339(T0 + t);
        scaledobjects(&mut store, &serving, &memory, T0, &at(0.0));
        let status = store.get(&Key::new(SO_GR, "default", "qwen")).unwrap()["status"].clone();
        assert_eq!(
            condition(&status, "Ready"),
            ("False", "ScaledObjectCheckFailed", TARGET_MESSAGE)
        );
        assert_eq!(
            condition(&status, "Active"),
            ("Unknown", "UnknownState", "ScaledObject check failed")
        );
        let reasons: Vec<String> = store
            .list("/events", Some("default"))
            .map(|e| {
                format!(
                    "{}: {}",
                    e["reason"].as_str().unwrap(),
                    e["message"].as_str().unwrap()
                )
            })
            .collect();
        assert!(
            reasons.contains(&"ScaledObjectCheckFailed: Target resource doesn't exist".to_owned()),
            "{reasons:?}"
        );
        let rv = store.rv();
        scaledobjects(&mut store, &serving, &memory, T0 + 1.0, &at(1.0));
        assert_eq!(store.rv(), rv, "nothing new to write");

        // A Service that is not there: the trigger fails, KEDA says so, and with
        // minReplicaCount 0 nothing is active.
        let mut wrong = so(0, 3);
        wrong["spec"]["triggers"][0]["metadata"]["url"] =
            json!("http://nope.default:29000/metrics");
        store.put(Key::new(SO_GR, "default", "qwen"), wrong);
        scaledobjects(&mut store, &serving, &memory, T0 + 2.0, &at(2.0));
        let status = store.get(&Key::new(SO_GR, "default", "qwen")).unwrap()["status"].clone();
        assert_eq!(
            condition(&status, "Ready"),
            (
                "False",
                "TriggerError",
                "Triggers defined in ScaledObject are not working correctly"
            )
        );
        let failed = store
            .list("/events", Some("default"))
            .find(|e| e["reason"] == "KEDAScalerFailed")
            .unwrap();
        assert_eq!(
            failed["message"],
            "error requesting metrics endpoint: Get \"http://nope.default:29000/metrics\": dial tcp: lookup nope.default on 172.20.0.10:53: no such host"
        );
        assert_eq!(replicas(&store), 1, "an error does not scale to zero");
    }

    #[test]
    fn an_idle_target_goes_to_zero_after_the_cooldown_and_wakes_when_active() {
        let (mut store, router) = cluster();
        let serving = Serving::default();
        let memory = Autoscalers::default();
        store.put(Key::new(SO_GR, "default", "qwen"), so(0, 3));
        let pass = |store: &mut Store, t: f64| {
            scaledobjects(store, &serving, &memory, T0 + t, &rfc3339(T0 + t));
        };
        let held = in_flight(&store, &serving, &router, 1);
        pass(&mut store, 0.0);
        drop(held);
        pass(&mut store, 5.0);
        let status = store.get(&Key::new(SO_GR, "default", "qwen")).unwrap()["status"].clone();
        assert_eq!(condition(&status, "Active").1, "ScalerCooldown");
        assert_eq!(replicas(&store), 1);
        pass(&mut store, 65.0);
        assert_eq!(replicas(&store), 0, "60 s after it was last active");
        let held = in_flight(&store, &serving, &router, 1);
        pass(&mut store, 70.0);
        assert_eq!(replicas(&store), 1);
        let woke = store
            .list("/events", Some("default"))
            .find(|e| e["reason"] == "KEDAScaleTargetActivated")
            .unwrap();
        assert_eq!(
            woke["message"],
            "Scaled apps/v1.Deployment default/qwen from 0 to 1, triggered by router-requests"
        );
        drop(held);
    }

    /// Prometheus `qwen-prometheus` scraping the gateway's metrics every 15 s.
    fn with_prometheus(store: &mut Store) {
        let yml = "global:\n  scrape_interval: 15s\nscrape_configs:\n  - job_name: sglang-router\n    static_configs:\n      - targets: [\"qwen-router.default.svc.cluster.local:29000\"]\n";
        store.put(
            Key::new("/configmaps", "default", "qwen-prometheus"),
            json!({ "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": { "name": "qwen-prometheus", "namespace": "default" },
                "data": { "prometheus.yml": yml } }),
        );
        let pod = json!({ "apiVersion": "v1", "kind": "Pod",
            "metadata": { "name": "qwen-prometheus-abcde", "namespace": "default", "uid": "p-1",
                          "labels": { "hypd.dev/endpoint-prometheus": "qwen" } },
            "spec": { "containers": [{ "name": "prometheus", "image": "quay.io/prometheus/prometheus:v3.5.0",
                "args": ["--config.file=/etc/prometheus/prometheus.yml", "--web.listen-address=:9090"],
                "ports": [{ "name": "web", "containerPort": 9090 }],
                "volumeMounts": [{ "name": "config", "mountPath": "/etc/prometheus" }] }],
                "volumes": [{ "name": "config", "configMap": { "name": "qwen-prometheus" } }] },
            "status": { "phase": "Running", "podIP": "10.0.0.10",
                        "conditions": [{ "type": "Ready", "status": "True" }] } });
        store.put(Key::new("/pods", "default", "qwen-prometheus-abcde"), pod);
        let svc = json!({ "apiVersion": "v1", "kind": "Service",
            "metadata": { "name": "qwen-prometheus", "namespace": "default" },
            "spec": { "clusterIP": "172.20.9.10", "selector": { "hypd.dev/endpoint-prometheus": "qwen" },
                      "ports": [{ "name": "web", "port": 9090, "targetPort": 9090 }] } });
        store.put(Key::new("/services", "default", "qwen-prometheus"), svc);
        endpoints::endpoints(store, &rfc3339(T0));
    }

    const RATE: &str = "sum(rate(smg_http_requests_total{path=~\"/v1/.+|/generate\"}[1m]))";

    fn prometheus_trigger(metadata: Value) -> Value {
        let mut m = json!({ "serverAddress": "http://qwen-prometheus.default.svc.cluster.local:9090",
                            "query": RATE, "threshold": "0.5" });
        if let (Some(m), Some(extra)) = (m.as_object_mut(), metadata.as_object()) {
            m.extend(extra.clone());
        }
        json!({ "type": "prometheus", "name": "router-request-rate", "metricType": "AverageValue",
                "metadata": m })
    }

    #[test]
    fn the_prometheus_scaler_scales_on_the_rate_prometheus_scraped() {
        let (mut store, router) = cluster();
        with_prometheus(&mut store);
        let serving = Serving::default();
        let memory = Autoscalers::default();
        // Two completions a second through the gateway for a minute, scraped every 15 s.
        for k in 0..=4 {
            if k > 0 {
                drop(in_flight(&store, &serving, &router, 30));
            }
            prometheus::scrape(&store, &serving, T0 + 15.0 * f64::from(k));
        }
        let env = Env {
            serving: &serving,
            keda_ns: "hyperpod-inference-system",
            metrics_server: true,
            epoch_now: T0 + 60.0,
            now: &rfc3339(T0 + 60.0),
        };
        let read = |metadata: Value| {
            let so = json!({ "spec": { "triggers": [prometheus_trigger(metadata)] } });
            let t = triggers(&so).map_err(|f| f.events[0].1.clone())?;
            let Source::Prometheus(p) = &t[0].source else {
                panic!("a prometheus trigger");
            };
            query(&store, &env, p)
        };
        let rate = read(json!({})).unwrap();
        assert!((rate - 2.0).abs() < 1e-9, "{rate}");
        assert_eq!(
            read(json!({ "query": "sum(nothing)" })),
            Ok(0.0),
            "ignoreNullValues"
        );
        assert_eq!(
            read(json!({ "query": "sum(nothing)", "ignoreNullValues": "false" })),
            Err(
                "prometheus metrics 'prometheus' target may be lost, the result is empty"
                    .to_owned()
            )
        );
        assert_eq!(
            read(json!({ "query": "{job=\"sglang-router\"}" })),
            Err("prometheus query {job=\"sglang-router\"} returned multiple elements".to_owned())
        );
        assert!(
            read(json!({ "query": "rate(x)" }))
                .unwrap_err()
                .starts_with("prometheus query api returned error. status: 400 response: {")
        );
        assert_eq!(
            read(json!({ "serverAddress": "" })),
            Err("error parsing prometheus metadata: missing required parameter \"serverAddress\" in [triggerMetadata]".to_owned())
        );
        assert!(
            read(json!({ "threshold": "lots" }))
                .unwrap_err()
                .contains("\"threshold\"")
        );

        // The HPA: 2 a second at 0.5 a replica asks for 4, three at most.
        let mut so = so(1, 3);
        so["spec"]["triggers"] = json!([prometheus_trigger(json!({}))]);
        store.put(Key::new(SO_GR, "default", "qwen"), so);
        scaledobjects(
            &mut store,
            &serving,
            &memory,
            T0 + 60.0,
            &rfc3339(T0 + 60.0),
        );
        assert_eq!(replicas(&store), 3);
        let status = store.get(&Key::new(SO_GR, "default", "qwen")).unwrap()["status"].clone();
        assert_eq!(status["externalMetricNames"], json!(["s0-prometheus"]));
        assert_eq!(condition(&status, "Active").0, "True");
        assert!(
            rescales(&store)[0].starts_with("New size: 3; reason: external metric s0-prometheus(")
        );
    }

    #[test]
    fn with_two_triggers_the_hpa_takes_the_largest_and_any_active_one_activates() {
        let (mut store, router) = cluster();
        with_prometheus(&mut store);
        let serving = Serving::default();
        let memory = Autoscalers::default();
        // No rate (nothing scraped yet), 3 in flight at 2 a replica: the in-flight trigger
        // asks for 2 and wakes the target from zero on its own.
        let held = in_flight(&store, &serving, &router, 3);
        let mut two = so(0, 5);
        let api = two["spec"]["triggers"][0].clone();
        two["spec"]["triggers"] = json!([api, prometheus_trigger(json!({}))]);
        store.put(Key::new(SO_GR, "default", "qwen"), two);
        let d = Key::new("apps/deployments", "default", "qwen");
        let mut target = (**store.get(&d).unwrap()).clone();
        target["spec"]["replicas"] = json!(0);
        store.put(d, target);
        scaledobjects(&mut store, &serving, &memory, T0, &rfc3339(T0));
        let woke = store
            .list("/events", Some("default"))
            .find(|e| e["reason"] == "KEDAScaleTargetActivated")
            .unwrap();
        assert!(
            woke["message"]
                .as_str()
                .unwrap()
                .ends_with("triggered by router-requests")
        );
        assert!(woke["message"].as_str().unwrap().contains("from 0 to 1"));
        // The HPA's sync in the same pass: the larger of 2 and 0.
        assert_eq!(replicas(&store), 2);
        drop(held);
    }
}
