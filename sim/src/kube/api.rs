//! The API server's HTTP surface: authentication, path routing, and the verbs (get, list,
//! watch, create, update, patch, delete, deletecollection, status, log, service proxy)
//! over the store.
//! Handlers lock only their cluster's store, to read or write it; watches and log follows
//! stream from a task that feeds a small bounded channel, so a client that stops reading
//! holds no more than that channel plus its share of the store's fan-out buffer.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::sync::{broadcast, mpsc};
use tokio_stream::wrappers::ReceiverStream;

use super::admission;
use super::apply;
use super::auth;
use super::discovery::{self, CRD_GR, Resource};
use super::logs;
use super::schema;
use super::service_proxy;
use super::store::{Event, EventKind, Key, Obj, Store};
use super::table;
use super::{ClusterApi, WeakApi};
use crate::world::Shared;

#[derive(Clone)]
struct Ctx {
    world: Shared,
    api: WeakApi,
}

pub fn router(world: Shared, api: WeakApi) -> Router {
    Router::new()
        .fallback(handle)
        .layer(axum::middleware::from_fn(crate::world::with_caller))
        .with_state(Ctx { world, api })
}

fn cluster_gone() -> Response {
    Status::new(503, "ServiceUnavailable", "the cluster is gone").into_response()
}

/// A Kubernetes `Status` error.
#[derive(Debug)]
pub struct Status {
    code: u16,
    reason: &'static str,
    message: String,
    details: Option<Value>,
}

impl Status {
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }

    pub(super) fn with_details(mut self, details: Value) -> Self {
        self.details = Some(details);
        self
    }

    pub fn to_json(&self) -> Value {
        let mut v = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(d) = &self.details {
            v["details"] = d.clone();
        }
        v
    }
}

impl IntoResponse for Status {
    fn into_response(self) -> Response {
        let code = StatusCode::from_u16(self.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        json_response(code, &self.to_json())
    }
}

fn json_response(code: StatusCode, v: &Value) -> Response {
    (
        code,
        [(header::CONTENT_TYPE, "application/json")],
        v.to_string(),
    )
        .into_response()
}

fn ok(v: &Value) -> Response {
    json_response(StatusCode::OK, v)
}

fn not_found(r: &Resource, name: &str) -> Status {
    Status::new(
        404,
        "NotFound",
        format!("{} \"{name}\" not found", qualified(r)),
    )
    .with_details(json!({ "name": name, "group": r.group, "kind": r.plural }))
}

/// `deployments.apps`, `pods`: how the API server names a resource in messages.
fn qualified(r: &Resource) -> String {
    if r.group.is_empty() {
        r.plural.clone()
    } else {
        format!("{}.{}", r.plural, r.group)
    }
}

pub type Query = BTreeMap<String, String>;

fn parse_query(q: Option<&str>) -> Query {
    let mut out = Query::new();
    for pair in q.unwrap_or_default().split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let dec = |s: &str| auth::percent_decode(s).unwrap_or_else(|_| s.to_owned());
        out.insert(dec(k), dec(v));
    }
    out
}

fn truthy(q: &Query, k: &str) -> bool {
    matches!(q.get(k).map(String::as_str), Some("true" | "1"))
}

enum Target {
    Version,
    Health,
    Api,
    Apis,
    Group(String),
    GroupVersion(String, String),
    OpenApiIndex,
    OpenApiGroupVersion(String, String),
    Resource {
        group: String,
        version: String,
        plural: String,
        ns: Option<String>,
        name: Option<String>,
        sub: Option<String>,
        /// For `…/proxy[/path]`: the path after `proxy`, as sent ("" for none).
        proxied: Option<String>,
    },
}

fn route(path: &str) -> Option<Target> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let slash = if path.ends_with('/') { "/" } else { "" };
    let resource = |group: &str, version: &str, rest: &[&str]| -> Option<Target> {
        let (ns, rest) = match rest {
            ["namespaces", ns, plural, tail @ ..]
                if !["status", "finalize"].contains(plural) || !tail.is_empty() =>
            {
                (Some((*ns).to_owned()), {
                    let mut v = vec![*plural];
                    v.extend_from_slice(tail);
                    v
                })
            }
            _ => (None, rest.to_vec()),
        };
        let (plural, name, sub, proxied) = match rest.as_slice() {
            [p] => (*p, None, None, None),
            [p, n] => (*p, Some((*n).to_owned()), None, None),
            // A proxy keeps the rest of the path, its trailing slash included.
            [p, n, "proxy", tail @ ..] => {
                let tail = match tail {
                    [] => slash.to_owned(),
                    _ => format!("/{}{slash}", tail.join("/")),
                };
                (
                    *p,
                    Some((*n).to_owned()),
                    Some("proxy".to_owned()),
                    Some(tail),
                )
            }
            [p, n, s] => (*p, Some((*n).to_owned()), Some((*s).to_owned()), None),
            _ => return None,
        };
        Some(Target::Resource {
            group: group.to_owned(),
            version: version.to_owned(),
            plural: plural.to_owned(),
            ns,
            name,
            sub,
            proxied,
        })
    };
    match segs.as_slice() {
        ["version"] => Some(Target::Version),
        ["healthz" | "livez" | "readyz", ..] => Some(Target::Health),
        ["api"] => Some(Target::Api),
        ["api", v] => Some(Target::GroupVersion(String::new(), (*v).to_owned())),
        ["api", v, rest @ ..] => resource("", v, rest),
        ["apis"] => Some(Target::Apis),
        ["apis", g] => Some(Target::Group((*g).to_owned())),
        ["apis", g, v] => Some(Target::GroupVersion((*g).to_owned(), (*v).to_owned())),
        ["apis", g, v, rest @ ..] => resource(g, v, rest),
        ["openapi", "v3"] => Some(Target::OpenApiIndex),
        ["openapi", "v3", "api", v] => {
            Some(Target::OpenApiGroupVersion(String::new(), (*v).to_owned()))
        }
        ["openapi", "v3", "apis", g, v] => Some(Target::OpenApiGroupVersion(
            (*g).to_owned(),
            (*v).to_owned(),
        )),
        _ => None,
    }
}

fn page_not_found() -> Response {
    Status::new(
        404,
        "NotFound",
        "the server could not find the requested resource",
    )
    .into_response()
}

async fn handle(
    State(ctx): State<Ctx>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    let Some(api) = ctx.api.upgrade() else {
        return cluster_gone();
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or_default();
    let verdict = match token {
        Some(t) => auth::verify(t, &api.name, &ctx.world.kube.secret, now),
        None => Err("no bearer token".to_owned()),
    };
    if let Err(reason) = verdict {
        tracing::info!(cluster = %api.name, %reason, "401 from the Kubernetes API");
        return Status::new(401, "Unauthorized", format!("Unauthorized: {reason}")).into_response();
    }
    let q = parse_query(uri.query());
    // JSON only: client-go answers a 415 by sending JSON from then on.
    let ct = content_type(&headers);
    if !body.is_empty()
        && (ct.starts_with("application/vnd.kubernetes.protobuf") || ct == "application/cbor")
    {
        return Status::new(
            415,
            "UnsupportedMediaType",
            format!("the body of the request was in an unsupported format: {ct}; send JSON"),
        )
        .into_response();
    }
    let Some(target) = route(uri.path()) else {
        return page_not_found();
    };
    // The fault is taken before the store is locked for the request, so a delay holds
    // only this call, not the whole cluster.
    let fault = match fault_operation(&api, &method, &target, &q).await {
        Some(op) => crate::world::injected(&ctx.world, "kubernetes", &op).await,
        None => None,
    };
    let now = ctx.world.clock.epoch(ctx.world.clock.now());
    let stamp = super::time::rfc3339(now);
    let as_table = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(table::wanted);
    let mut store = api.store.lock().await;
    let c = &*api;
    match target {
        Target::Health => "ok".into_response(),
        Target::Version => {
            let minor = c.version.split('.').nth(1).unwrap_or("33").to_owned();
            ok(&json!({
                "major": "1",
                "minor": minor,
                "gitVersion": format!("v{}.0-eks-sim", c.version),
                "gitCommit": "0000000000000000000000000000000000000000",
                "gitTreeState": "clean",
                "buildDate": "2026-01-01T00:00:00Z",
                "goVersion": "go1.24",
                "compiler": "gc",
                "platform": "linux/amd64",
            }))
        }
        Target::Api => ok(&json!({
            "kind": "APIVersions",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [{ "clientCIDR": "0.0.0.0/0", "serverAddress": c.endpoint.trim_start_matches("https://") }],
        })),
        Target::Apis => ok(&discovery::api_group_list(&store)),
        Target::Group(g) => match discovery::api_group(&store, &g) {
            Some(v) => ok(&v),
            None => page_not_found(),
        },
        Target::GroupVersion(g, v) => match discovery::resource_list(&store, &g, &v) {
            Some(v) => ok(&v),
            None => page_not_found(),
        },
        Target::OpenApiIndex => ok(&discovery::openapi_index(&store)),
        Target::OpenApiGroupVersion(g, v) => {
            match discovery::openapi_group_version(&store, &g, &v) {
                Some(v) => ok(&v),
                None => page_not_found(),
            }
        }
        Target::Resource {
            group,
            version,
            plural,
            ns,
            name,
            sub,
            proxied,
        } => {
            let Some(res) = discovery::find(&store, &group, &version, &plural) else {
                return page_not_found();
            };
            if ns.is_some() && !res.namespaced {
                return page_not_found();
            }
            let operation = format!(
                "{} {}",
                verb(&method, name.is_some(), sub.as_deref(), &q),
                res.kind
            );
            let lost = matches!(fault, Some(crate::world::FaultKind::Lost));
            if let Some(kind) = fault.filter(|_| !lost) {
                return injected(kind, &operation).into_response();
            }
            let req = Req {
                res,
                ns: ns.unwrap_or_default(),
                name,
                sub,
                table: as_table.then_some(now),
                manager: q
                    .get("fieldManager")
                    .cloned()
                    .unwrap_or_else(|| manager_from(&headers)),
                strict: q.get("fieldValidation").map(String::as_str) == Some("Strict"),
                dry_run: q.contains_key("dryRun"),
                q,
            };
            let answer = match (&method, req.name.is_some(), req.sub.as_deref()) {
                (&Method::GET, false, _) if truthy(&req.q, "watch") => {
                    drop(store);
                    watch(&api, req).await
                }
                (&Method::GET, false, _) => list(&store, &req),
                (&Method::GET, true, Some("log")) if req.res.plural == "pods" => {
                    drop(store);
                    logs::serve(
                        ctx.world.clone(),
                        ctx.api.clone(),
                        req.ns,
                        req.name.unwrap_or_default(),
                        req.q,
                    )
                    .await
                }
                (_, true, Some("proxy")) if req.res.gr() == "/services" => {
                    let call = service_proxy::Call {
                        method: &method,
                        path: proxied.as_deref().unwrap_or_default(),
                        body: &body,
                        headers: &headers,
                    };
                    let backend = service_proxy::backend(
                        &store,
                        &api.serving,
                        &req.ns,
                        req.name.as_deref().unwrap_or_default(),
                        &call,
                        now,
                    );
                    // The answer may take its decode time, or a gateway's retries: nothing
                    // waits on the cluster, whose store each retry locks anew.
                    drop(store);
                    match backend {
                        Ok(b) => {
                            service_proxy::answer(
                                b,
                                ctx.world.clock.clone(),
                                &api,
                                &call,
                                uri.path(),
                                uri.query(),
                                now as i64,
                            )
                            .await
                        }
                        Err(s) => s.into_response(),
                    }
                }
                (_, true, Some("scale"))
                    if SCALABLE.contains(&req.res.gr().as_str()) || req.res.scale.is_some() =>
                {
                    let ct = content_type(&headers);
                    respond(scale(&mut store, &stamp, &req, &method, &ct, &body))
                }
                (_, _, Some(s)) if s != "status" => page_not_found(),
                (&Method::GET, true, _) => get(&store, &req),
                (&Method::POST, false, _) => respond(create(&mut store, &stamp, &req, &body)),
                (&Method::PUT, true, _) => respond(update(&mut store, &stamp, &req, &body)),
                (&Method::PATCH, true, _) => {
                    let ct = content_type(&headers);
                    respond(patch(&mut store, &stamp, &req, &ct, &body))
                }
                (&Method::DELETE, true, _) => respond(delete(&mut store, &stamp, &req)),
                (&Method::DELETE, false, _) => respond(delete_collection(&mut store, &stamp, &req)),
                _ => Status::new(
                    405,
                    "MethodNotAllowed",
                    format!("{method} is not supported here"),
                )
                .into_response(),
            };
            if lost {
                // Done, but the caller never hears so.
                return injected(crate::world::FaultKind::Lost, &operation).into_response();
            }
            answer
        }
    }
}

/// The fault-matching name (`<verb> <Kind>`) of a request to a resource, read with the
/// cluster's store briefly locked; `None` for anything else (discovery, health).
async fn fault_operation(
    api: &ClusterApi,
    method: &Method,
    target: &Target,
    q: &Query,
) -> Option<String> {
    let Target::Resource {
        group,
        version,
        plural,
        name,
        sub,
        ..
    } = target
    else {
        return None;
    };
    let store = api.store.lock().await;
    let res = discovery::find(&store, group, version, plural)?;
    Some(format!(
        "{} {}",
        verb(method, name.is_some(), sub.as_deref(), q),
        res.kind
    ))
}

fn content_type(headers: &HeaderMap) -> String {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_owned()
}

/// Resources with a `scale` subresource (autoscaling/v1 Scale over `spec.replicas`).
pub const SCALABLE: &[&str] = &["apps/deployments", "apps/replicasets", "apps/statefulsets"];

/// The value at a CRD's JSON path (`.spec.replicas`): null where nothing is.
pub(super) fn at_path<'a>(o: &'a Value, path: &str) -> &'a Value {
    path.split('.')
        .filter(|s| !s.is_empty())
        .fold(o, |v, k| &v[k])
}

/// Sets the value at a CRD's JSON path, making the objects on the way.
pub(super) fn set_path(o: &mut Value, path: &str, value: Value) {
    let target = path
        .split('.')
        .filter(|s| !s.is_empty())
        .fold(o, |v, k| &mut v[k]);
    *target = value;
}

/// The Scale of `o`: a built-in's `spec.replicas` and selector, or what a CRD's scale
/// subresource points at (its selector is already a string there).
fn scale_of(res: &Resource, o: &Value) -> Value {
    let (spec_replicas, status_replicas, selector) = match &res.scale {
        Some(paths) => (
            at_path(o, &paths.spec_replicas).as_u64(),
            at_path(o, &paths.status_replicas).as_u64(),
            paths
                .label_selector
                .as_deref()
                .and_then(|p| at_path(o, p).as_str())
                .unwrap_or_default()
                .to_owned(),
        ),
        None => {
            let selector: Vec<String> = o["spec"]["selector"]["matchLabels"]
                .as_object()
                .into_iter()
                .flatten()
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                .collect();
            (
                o["spec"]["replicas"].as_u64(),
                o["status"]["replicas"].as_u64(),
                selector.join(","),
            )
        }
    };
    let meta = &o["metadata"];
    json!({
        "apiVersion": "autoscaling/v1",
        "kind": "Scale",
        "metadata": { "name": meta["name"], "namespace": meta["namespace"], "uid": meta["uid"],
                      "resourceVersion": meta["resourceVersion"], "creationTimestamp": meta["creationTimestamp"] },
        "spec": { "replicas": spec_replicas.unwrap_or(1) },
        "status": { "replicas": status_replicas.unwrap_or(0), "selector": selector },
    })
}

/// `…/scale`: read or change `spec.replicas` through a Scale object (`kubectl scale`,
/// autoscalers).
fn scale(
    store: &mut Store,
    now: &str,
    req: &Req,
    method: &Method,
    content_type: &str,
    body: &[u8],
) -> Result<(StatusCode, Value), Status> {
    let name = req.name.clone().unwrap_or_default();
    let Some(old) = current(store, req) else {
        return Err(not_found(&req.res, &name));
    };
    let mut wanted = scale_of(&req.res, &old);
    match *method {
        Method::GET => return Ok((StatusCode::OK, wanted)),
        Method::PUT => wanted = parse_body(body, false)?,
        Method::PATCH => {
            let patch = parse_body(body, false)?;
            match content_type {
                "application/json-patch+json" => json_patch(&mut wanted, &patch)?,
                _ => apply::merge_patch(&mut wanted, &patch),
            }
        }
        _ => {
            return Err(Status::new(
                405,
                "MethodNotAllowed",
                format!("{method} is not supported on scale"),
            ));
        }
    }
    check_precondition(req, &old, &wanted)?;
    let Some(replicas) = wanted["spec"]["replicas"].as_u64() else {
        return Err(Status::new(
            422,
            "Invalid",
            format!("Scale.autoscaling \"{name}\" is invalid: spec.replicas: Required value"),
        ));
    };
    let mut new = (*old).clone();
    match &req.res.scale {
        Some(paths) => set_path(&mut new, &paths.spec_replicas, json!(replicas)),
        None => new["spec"]["replicas"] = json!(replicas),
    }
    let (code, stored) = commit(store, now, req, &old, new, false)?;
    Ok((code, scale_of(&req.res, &stored)))
}

/// The field manager of a non-apply write, as the API server derives it from the
/// client's User-Agent (`kubectl/v1.37 …` → `kubectl`).
fn manager_from(headers: &HeaderMap) -> String {
    headers
        .get(header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .and_then(|ua| ua.split('/').next())
        .filter(|s| !s.is_empty())
        .unwrap_or("unknown")
        .to_owned()
}

fn respond(r: Result<(StatusCode, Value), Status>) -> Response {
    match r {
        Ok((code, v)) => json_response(code, &v),
        Err(s) => s.into_response(),
    }
}

pub struct Req {
    pub res: Resource,
    /// Sim time, when the client asked for a Table.
    table: Option<f64>,
    pub ns: String,
    pub name: Option<String>,
    pub sub: Option<String>,
    pub q: Query,
    manager: String,
    strict: bool,
    dry_run: bool,
}

impl Req {
    fn key(&self, name: &str) -> Key {
        Key::new(&self.res.gr(), &self.ns, name)
    }
}

fn get(store: &Store, req: &Req) -> Response {
    let name = req.name.as_deref().unwrap_or_default();
    match store.get(&req.key(name)) {
        Some(o) => match req.table {
            Some(now) => ok(&table::table(
                &req.res,
                &[&**o],
                now,
                &store.rv().to_string(),
                &req.res.printer,
            )),
            None => ok(o),
        },
        None => not_found(&req.res, name).into_response(),
    }
}

/// A parsed label or field selector: every requirement must hold.
pub struct Selector(Vec<Requirement>);

enum Requirement {
    Eq(String, String),
    Ne(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

impl Selector {
    pub fn parse(s: &str) -> Result<Self, Status> {
        let mut reqs = Vec::new();
        // Split on commas outside parentheses.
        let mut parts = Vec::new();
        let (mut depth, mut start) = (0, 0);
        for (i, ch) in s.char_indices() {
            match ch {
                '(' => depth += 1,
                ')' => depth -= 1,
                ',' if depth == 0 => {
                    parts.push(&s[start..i]);
                    start = i + 1;
                }
                _ => {}
            }
        }
        parts.push(&s[start..]);
        for p in parts.into_iter().map(str::trim).filter(|p| !p.is_empty()) {
            let bad = || {
                Status::new(
                    400,
                    "BadRequest",
                    format!("unable to parse requirement: {p}"),
                )
            };
            let set = |rest: &str| -> Result<Vec<String>, Status> {
                let inner = rest
                    .trim()
                    .strip_prefix('(')
                    .and_then(|r| r.strip_suffix(')'))
                    .ok_or_else(bad)?;
                Ok(inner.split(',').map(|v| v.trim().to_owned()).collect())
            };
            let r = if let Some((k, v)) = p.split_once("!=") {
                Requirement::Ne(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = p.split_once("==") {
                Requirement::Eq(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = p.split_once('=') {
                Requirement::Eq(k.trim().into(), v.trim().into())
            } else if let Some((k, rest)) = p.split_once(" notin ") {
                Requirement::NotIn(k.trim().into(), set(rest)?)
            } else if let Some((k, rest)) = p.split_once(" in ") {
                Requirement::In(k.trim().into(), set(rest)?)
            } else if let Some(k) = p.strip_prefix('!') {
                Requirement::NotExists(k.trim().into())
            } else if p
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c))
            {
                Requirement::Exists(p.into())
            } else {
                return Err(bad());
            };
            reqs.push(r);
        }
        Ok(Self(reqs))
    }

    pub fn matches(&self, get: impl Fn(&str) -> Option<String>) -> bool {
        self.0.iter().all(|r| match r {
            Requirement::Eq(k, v) => get(k).as_deref() == Some(v),
            Requirement::Ne(k, v) => get(k).as_deref() != Some(v),
            Requirement::In(k, vs) => get(k).is_some_and(|x| vs.contains(&x)),
            Requirement::NotIn(k, vs) => get(k).is_none_or(|x| !vs.contains(&x)),
            Requirement::Exists(k) => get(k).is_some(),
            Requirement::NotExists(k) => get(k).is_none(),
        })
    }
}

/// Which objects a list or watch returns.
pub struct Filter {
    gr: String,
    ns: Option<String>,
    labels: Selector,
    fields: Selector,
}

impl Filter {
    fn new(req: &Req) -> Result<Self, Status> {
        Ok(Self {
            gr: req.res.gr(),
            ns: (!req.ns.is_empty()).then(|| req.ns.clone()),
            labels: Selector::parse(req.q.get("labelSelector").map_or("", String::as_str))?,
            fields: Selector::parse(req.q.get("fieldSelector").map_or("", String::as_str))?,
        })
    }

    fn matches(&self, o: &Value) -> bool {
        let labels = &o["metadata"]["labels"];
        self.labels
            .matches(|k| labels.get(k).and_then(Value::as_str).map(str::to_owned))
            && self.fields.matches(|k| {
                let v = k.split('.').try_fold(o, |v, seg| v.get(seg));
                Some(match v {
                    Some(Value::String(s)) => s.clone(),
                    Some(Value::Null) | None => String::new(),
                    Some(other) => other.to_string(),
                })
            })
    }

    /// What a watcher with this filter sees of an event: an object that starts matching
    /// is ADDED, one that stops matching is DELETED.
    fn event(&self, e: &Event) -> Option<&'static str> {
        if !self.matches_key(&e.key) {
            return None;
        }
        let now = self.matches(&e.object);
        let before = e.prev.as_deref().is_some_and(|p| self.matches(p));
        match (e.kind, before, now) {
            (EventKind::Modified, true, true) => Some("MODIFIED"),
            (EventKind::Modified, false, true) => Some("ADDED"),
            (EventKind::Modified, true, false) => Some("DELETED"),
            (EventKind::Modified, false, false) => None,
            (kind, _, true) => Some(kind.as_str()),
            _ => None,
        }
    }

    fn matches_key(&self, k: &Key) -> bool {
        k.gr == self.gr && self.ns.as_ref().is_none_or(|n| *n == k.ns)
    }
}

/// `limit` and `continue`, as the API server pages a list: at most `limit` items, and a
/// continue token (the key of the last one, as Kubernetes' own tokens carry the next
/// start key) while more remain. Kubernetes serves every page from the snapshot of the
/// first; the sim has no snapshots, so a later page shows objects as they are now, and a
/// token is refused only when it is not one the sim gave.
struct Page {
    limit: Option<usize>,
    after: Option<(String, String)>,
}

impl Page {
    fn new(req: &Req) -> Result<Self, Status> {
        let limit = match req.q.get("limit").map(String::as_str) {
            None | Some("" | "0") => None,
            Some(l) => Some(l.parse::<usize>().map_err(|_| {
                Status::new(
                    400,
                    "BadRequest",
                    format!("limit: Invalid value: \"{l}\": must be a non-negative integer"),
                )
            })?),
        };
        let after = match req.q.get("continue").map(String::as_str) {
            None | Some("") => None,
            Some(token) => Some(Self::decode(token).ok_or_else(|| {
                Status::new(400, "BadRequest", "continue key is not valid: incorrect encoded start resourceVersion (version meta.k8s.io/v1)".to_owned())
            })?),
        };
        Ok(Self { limit, after })
    }

    fn decode(token: &str) -> Option<(String, String)> {
        use base64::Engine;
        let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(token)
            .ok()?;
        let v: Value = serde_json::from_slice(&raw).ok()?;
        (v["v"] == "meta.k8s.io/v1").then_some(())?;
        Some((
            v["ns"].as_str()?.to_owned(),
            v["start"].as_str()?.to_owned(),
        ))
    }

    fn encode(ns: &str, name: &str, rv: u64) -> String {
        use base64::Engine;
        let v = json!({ "v": "meta.k8s.io/v1", "rv": rv, "ns": ns, "start": name });
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string())
    }
}

fn list(store: &Store, req: &Req) -> Response {
    let (filter, page) = match Filter::new(req).and_then(|f| Ok((f, Page::new(req)?))) {
        Ok(fp) => fp,
        Err(s) => return s.into_response(),
    };
    let mut matching = store
        .list(&filter.gr, filter.ns.as_deref())
        .filter(|o| filter.matches(o))
        .filter(|o| {
            page.after.as_ref().is_none_or(|(ns, name)| {
                let meta = &o["metadata"];
                let key = (
                    meta["namespace"].as_str().unwrap_or(""),
                    meta["name"].as_str().unwrap_or(""),
                );
                key > (ns.as_str(), name.as_str())
            })
        })
        .map(|o| &**o);
    let items: Vec<&Value> = matching
        .by_ref()
        .take(page.limit.unwrap_or(usize::MAX))
        .collect();
    let remaining = matching.count();
    let mut metadata = json!({ "resourceVersion": store.rv().to_string() });
    if remaining > 0
        && let Some(last) = items.last()
    {
        let meta = &last["metadata"];
        metadata["continue"] = json!(Page::encode(
            meta["namespace"].as_str().unwrap_or(""),
            meta["name"].as_str().unwrap_or(""),
            store.rv()
        ));
        metadata["remainingItemCount"] = json!(remaining);
    }
    if let Some(now) = req.table {
        let mut t = table::table(
            &req.res,
            &items,
            now,
            &store.rv().to_string(),
            &req.res.printer,
        );
        t["metadata"] = metadata;
        return ok(&t);
    }
    let body = json!({
        "kind": format!("{}List", req.res.kind),
        "apiVersion": req.res.api_version(),
        "metadata": metadata,
        "items": items,
    });
    ok(&body)
}

fn event_line(kind: &str, object: &Value) -> Bytes {
    let mut line = json!({ "type": kind, "object": object }).to_string();
    line.push('\n');
    Bytes::from(line)
}

fn bookmark(res: &Resource, rv: u64, initial_end: bool) -> Bytes {
    let mut meta = json!({ "resourceVersion": rv.to_string() });
    if initial_end {
        meta["annotations"] = json!({ "k8s.io/initial-events-end": "true" });
    }
    event_line(
        "BOOKMARK",
        &json!({ "kind": res.kind, "apiVersion": res.api_version(), "metadata": meta }),
    )
}

fn gone(message: &str) -> Bytes {
    event_line(
        "ERROR",
        &Status::new(410, "Expired", message.to_owned()).to_json(),
    )
}

/// Lines a watch response may have queued towards a slow reader.
const WATCH_CHANNEL: usize = 64;

async fn watch(api: &ClusterApi, req: Req) -> Response {
    let filter = match Filter::new(&req) {
        Ok(f) => f,
        Err(s) => return s.into_response(),
    };
    let rv_param = req.q.get("resourceVersion").cloned().unwrap_or_default();
    let send_initial = truthy(&req.q, "sendInitialEvents");
    let bookmarks = truthy(&req.q, "allowWatchBookmarks");
    let timeout = req
        .q
        .get("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .unwrap_or(1800);
    let (initial, replay, mut rx, start_rv) = {
        let store = api.store.lock().await;
        let rx = store.subscribe();
        let rv = store.rv();
        if send_initial || rv_param.is_empty() || rv_param == "0" {
            let objects: Vec<Obj> = store
                .list(&filter.gr, filter.ns.as_deref())
                .filter(|o| filter.matches(o))
                .cloned()
                .collect();
            (objects, Vec::new(), rx, rv)
        } else {
            let Ok(from) = rv_param.parse::<u64>() else {
                return Status::new(
                    400,
                    "BadRequest",
                    format!("invalid resourceVersion {rv_param:?}"),
                )
                .into_response();
            };
            match store.since(from) {
                Ok(events) => (Vec::new(), events, rx, rv),
                Err(_) => {
                    let body = gone(&format!(
                        "too old resource version: {from} ({})",
                        store.rv()
                    ));
                    return (
                        StatusCode::OK,
                        [(header::CONTENT_TYPE, "application/json")],
                        body,
                    )
                        .into_response();
                }
            }
        }
    };
    let (tx, out) = mpsc::channel::<Result<Bytes, Infallible>>(WATCH_CHANNEL);
    let res = req.res.clone();
    let as_table = req.table;
    // `kubectl get --watch` asks for each event's object as a one-row Table.
    let event_line = move |kind: &str, o: &Value| match as_table {
        Some(now) => {
            let rv = o["metadata"]["resourceVersion"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            event_line(kind, &table::table(&res, &[o], now, &rv, &res.printer))
        }
        None => event_line(kind, o),
    };
    let res = req.res.clone();
    tokio::spawn(async move {
        let deadline = tokio::time::sleep(Duration::from_secs(timeout));
        tokio::pin!(deadline);
        for o in initial {
            if tx.send(Ok(event_line("ADDED", &o))).await.is_err() {
                return;
            }
        }
        if send_initial && tx.send(Ok(bookmark(&res, start_rv, true))).await.is_err() {
            return;
        }
        let mut last = start_rv;
        for e in replay {
            last = e.rv;
            if let Some(kind) = filter.event(&e)
                && tx.send(Ok(event_line(kind, &e.object))).await.is_err()
            {
                return;
            }
        }
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tokio::select! {
                _ = &mut deadline => return,
                _ = tick.tick(), if bookmarks => {
                    if tx.send(Ok(bookmark(&res, last, false))).await.is_err() {
                        return;
                    }
                }
                e = rx.recv() => match e {
                    Ok(e) => {
                        if e.rv <= start_rv {
                            continue;
                        }
                        last = e.rv;
                        if let Some(kind) = filter.event(&e)
                            && tx.send(Ok(event_line(kind, &e.object))).await.is_err()
                        {
                            return;
                        }
                    }
                    Err(broadcast::error::RecvError::Lagged(n)) => {
                        // Too slow: drop the watcher like the API server does; the
                        // client relists.
                        let _ = tx.send(Ok(gone(&format!("watcher fell {n} events behind")))).await;
                        return;
                    }
                    Err(broadcast::error::RecvError::Closed) => return,
                },
            }
        }
    });
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::TRANSFER_ENCODING, "chunked")
        .body(Body::from_stream(ReceiverStream::new(out)))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

fn parse_body(body: &[u8], yaml: bool) -> Result<Value, Status> {
    let parsed: Result<Value, String> = if yaml {
        serde_yaml::from_slice(body).map_err(|e| e.to_string())
    } else {
        serde_json::from_slice(body).map_err(|e| e.to_string())
    };
    parsed.map_err(|e| {
        Status::new(
            400,
            "BadRequest",
            format!("the body of the request was in an unknown format: {e}"),
        )
    })
}

fn kind_qualified(r: &Resource) -> String {
    if r.group.is_empty() {
        r.kind.clone()
    } else {
        format!("{}.{}", r.kind, r.group)
    }
}

/// Checks a CR against its CRD schema (defaults and pruning included).
fn validate(req: &Req, obj: &mut Value, old: Option<&Value>) -> Result<(), Status> {
    let name = obj["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let Some(schema) = &req.res.schema else {
        return Ok(());
    };
    let out = schema::validate(schema, obj, old);
    if req.strict && !out.unknown.is_empty() {
        let fields: Vec<String> = out
            .unknown
            .iter()
            .map(|u| format!("unknown field \"{u}\""))
            .collect();
        return Err(Status::new(
            400,
            "BadRequest",
            format!(
                "{} in version \"{}\" cannot be handled as a {}: strict decoding error: {}",
                req.res.kind,
                req.res.version,
                req.res.kind,
                fields.join(", ")
            ),
        ));
    }
    if out.errors.is_empty() {
        return Ok(());
    }
    let rendered: Vec<String> = out.errors.iter().map(schema::FieldError::render).collect();
    let list = if rendered.len() == 1 {
        rendered[0].clone()
    } else {
        format!("[{}]", rendered.join(", "))
    };
    let causes: Vec<Value> = out
        .errors
        .iter()
        .map(|e| json!({ "reason": e.reason, "message": e.message, "field": e.field }))
        .collect();
    Err(Status::new(
        422,
        "Invalid",
        format!("{} \"{name}\" is invalid: {list}", kind_qualified(&req.res)),
    )
    .with_details(
        json!({ "name": name, "group": req.res.group, "kind": req.res.kind, "causes": causes }),
    ))
}

fn meta_str<'a>(o: &'a Value, k: &str) -> Option<&'a str> {
    o["metadata"][k].as_str()
}

fn create(
    store: &mut Store,
    now: &str,
    req: &Req,
    body: &[u8],
) -> Result<(StatusCode, Value), Status> {
    let obj = parse_body(body, false)?;
    create_object(store, now, req, obj, false)
}

fn create_object(
    store: &mut Store,
    now: &str,
    req: &Req,
    mut obj: Value,
    managed_done: bool,
) -> Result<(StatusCode, Value), Status> {
    let res = &req.res;
    if !obj.is_object() {
        return Err(Status::new(400, "BadRequest", "the body must be an object"));
    }
    if let Some(kind) = obj["kind"].as_str()
        && kind != res.kind
    {
        return Err(Status::new(
            400,
            "BadRequest",
            format!("the kind {kind} does not match the resource {}", res.plural),
        ));
    }
    obj["kind"] = json!(res.kind);
    obj["apiVersion"] = json!(res.api_version());
    if !obj["metadata"].is_object() {
        obj["metadata"] = json!({});
    }
    let name = match (meta_str(&obj, "name"), meta_str(&obj, "generateName")) {
        (Some(n), _) if !n.is_empty() => n.to_owned(),
        (_, Some(prefix)) => format!("{prefix}{}", store.name_suffix()),
        _ => {
            return Err(Status::new(
                422,
                "Invalid",
                format!(
                    "{} \"\" is invalid: metadata.name: Required value: name or generateName is required",
                    res.kind
                ),
            ));
        }
    };
    check_name(res, &name)?;
    let ns = if res.namespaced {
        let body_ns = meta_str(&obj, "namespace").unwrap_or_default();
        if !body_ns.is_empty() && !req.ns.is_empty() && body_ns != req.ns {
            return Err(Status::new(
                400,
                "BadRequest",
                "the namespace of the provided object does not match the namespace sent on the request",
            ));
        }
        let ns = if req.ns.is_empty() {
            body_ns.to_owned()
        } else {
            req.ns.clone()
        };
        if ns.is_empty() {
            return Err(Status::new(400, "BadRequest", "a namespace is required"));
        }
        match store.get(&Key::new("/namespaces", "", &ns)) {
            None => {
                return Err(
                    Status::new(404, "NotFound", format!("namespaces \"{ns}\" not found"))
                        .with_details(json!({ "name": ns, "kind": "namespaces" })),
                );
            }
            Some(n) if n["metadata"]["deletionTimestamp"].is_string() => {
                return Err(Status::new(
                    403,
                    "Forbidden",
                    format!(
                        "{} \"{name}\" is forbidden: unable to create new content in namespace {ns} because it is being terminated",
                        qualified(res)
                    ),
                ));
            }
            Some(_) => {}
        }
        ns
    } else {
        String::new()
    };
    let key = Key::new(&res.gr(), &ns, &name);
    if store.get(&key).is_some() {
        return Err(Status::new(
            409,
            "AlreadyExists",
            format!("{} \"{name}\" already exists", qualified(res)),
        )
        .with_details(json!({ "name": name, "group": res.group, "kind": res.plural })));
    }
    {
        let meta = &mut obj["metadata"];
        meta["name"] = json!(name);
        if res.namespaced {
            meta["namespace"] = json!(ns);
        } else if let Some(m) = meta.as_object_mut() {
            m.remove("namespace");
        }
        meta["uid"] = json!(store.uid());
        meta["creationTimestamp"] = json!(now);
        meta["generation"] = json!(1);
        if let Some(m) = meta.as_object_mut() {
            m.remove("resourceVersion");
            m.remove("deletionTimestamp");
        }
    }
    if res.status
        && let Some(o) = obj.as_object_mut()
    {
        o.remove("status");
    }
    validate(req, &mut obj, None)?;
    if res.gr() == CRD_GR {
        check_crd(&obj)?;
    }
    admission::defaults(res, &mut obj, now);
    if !managed_done {
        apply::record_update(
            None,
            &mut obj,
            &req.manager,
            &res.api_version(),
            now,
            res.status,
            None,
        );
    }
    if req.dry_run {
        return Ok((StatusCode::CREATED, obj));
    }
    let stored = store.put(key, obj);
    Ok((StatusCode::CREATED, (*stored).clone()))
}

/// The request's verb as Kubernetes audits it; faults name `<verb> <Kind>`, e.g.
/// `patch DaemonSet`, and any call through a proxy `proxy <Kind>`.
fn verb(method: &Method, named: bool, sub: Option<&str>, q: &Query) -> &'static str {
    match *method {
        _ if sub == Some("proxy") => "proxy",
        Method::GET if !named && truthy(q, "watch") => "watch",
        Method::GET if named => "get",
        Method::GET => "list",
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE if named => "delete",
        Method::DELETE => "deletecollection",
        _ => "unknown",
    }
}

/// An injected failure as the API server would answer it.
fn injected(kind: crate::world::FaultKind, operation: &str) -> Status {
    use crate::world::FaultKind;
    match kind {
        FaultKind::Throttle => Status::new(
            429,
            "TooManyRequests",
            format!("too many requests for {operation} (injected by hypd-sim)"),
        ),
        FaultKind::ServerError
        | FaultKind::Stuck
        | FaultKind::Lost
        | FaultKind::Delay { .. }
        | FaultKind::Fails { .. } => Status::new(
            500,
            "InternalError",
            format!("an error on the server for {operation} (injected by hypd-sim)"),
        ),
        FaultKind::Error {
            code,
            status,
            message,
        } => {
            // Status reasons are a closed set in Kubernetes.
            let reason = [
                "BadRequest",
                "Unauthorized",
                "Forbidden",
                "NotFound",
                "AlreadyExists",
                "Conflict",
                "Invalid",
                "Timeout",
                "TooManyRequests",
                "InternalError",
                "ServiceUnavailable",
            ]
            .into_iter()
            .find(|r| *r == code)
            .unwrap_or("InternalError");
            Status::new(status, reason, message)
        }
    }
}

fn check_name(res: &Resource, name: &str) -> Result<(), Status> {
    // RBAC objects are named by path segment only (`system:controller:…` is valid).
    if res.group == "rbac.authorization.k8s.io" {
        if name.is_empty() || name == "." || name == ".." || name.contains(['/', '%']) {
            return Err(Status::new(
                422,
                "Invalid",
                format!(
                    "{} \"{name}\" is invalid: metadata.name: Invalid value: \"{name}\": may not be '.' or '..' and may not contain '/' or '%'",
                    res.kind
                ),
            ));
        }
        return Ok(());
    }
    let ok = !name.is_empty()
        && name.len() <= 253
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric());
    if ok {
        Ok(())
    } else {
        Err(Status::new(
            422,
            "Invalid",
            format!(
                "{} \"{name}\" is invalid: metadata.name: Invalid value: \"{name}\": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character",
                res.kind
            ),
        ))
    }
}

fn check_crd(crd: &Value) -> Result<(), Status> {
    let spec = &crd["spec"];
    let name = meta_str(crd, "name").unwrap_or_default();
    let expected = format!(
        "{}.{}",
        spec["names"]["plural"].as_str().unwrap_or_default(),
        spec["group"].as_str().unwrap_or_default()
    );
    if name != expected {
        return Err(Status::new(
            422,
            "Invalid",
            format!(
                "CustomResourceDefinition.apiextensions.k8s.io \"{name}\" is invalid: metadata.name: Invalid value: \"{name}\": must be spec.names.plural+\".\"+spec.group"
            ),
        ));
    }
    if discovery::crd_resources(crd).is_empty() {
        return Err(Status::new(
            422,
            "Invalid",
            format!(
                "CustomResourceDefinition.apiextensions.k8s.io \"{name}\" is invalid: spec.versions: Invalid value: must have exactly one version marked as storage version"
            ),
        ));
    }
    Ok(())
}

/// Carries what a write to the main resource may not change (identity, status when it
/// has its own subresource), or for a status write, everything but status.
fn merge_write(req: &Req, old: &Value, mut new: Value) -> Value {
    if req.sub.as_deref() == Some("status") {
        let mut out = old.clone();
        out["status"] = new["status"].take();
        return out;
    }
    for k in [
        "uid",
        "creationTimestamp",
        "generation",
        "deletionTimestamp",
        "namespace",
        "name",
    ] {
        match old["metadata"].get(k) {
            Some(v) => new["metadata"][k] = v.clone(),
            None => {
                if let Some(m) = new["metadata"].as_object_mut() {
                    m.remove(k);
                }
            }
        }
    }
    if req.res.status {
        match old.get("status") {
            Some(s) => new["status"] = s.clone(),
            None => {
                if let Some(o) = new.as_object_mut() {
                    o.remove("status");
                }
            }
        }
    }
    new["kind"] = json!(req.res.kind);
    new["apiVersion"] = json!(req.res.api_version());
    new
}

fn spec_of(v: &Value) -> Value {
    let mut v = v.clone();
    if let Some(o) = v.as_object_mut() {
        o.remove("metadata");
        o.remove("status");
    }
    v
}

/// Stores an update unless it changes nothing; finishes a deletion whose last finalizer
/// went away.
fn commit(
    store: &mut Store,
    now: &str,
    req: &Req,
    old: &Obj,
    mut new: Value,
    managed_done: bool,
) -> Result<(StatusCode, Value), Status> {
    // A status or scale write is checked against the schema too: the API server
    // validates the whole object whichever part a request may change.
    validate(req, &mut new, Some(old))?;
    if spec_of(&new) != spec_of(old) {
        let g = old["metadata"]["generation"].as_i64().unwrap_or(1);
        new["metadata"]["generation"] = json!(g + 1);
    }
    if !managed_done {
        apply::record_update(
            Some(old),
            &mut new,
            &req.manager,
            &req.res.api_version(),
            now,
            req.res.status,
            req.sub.as_deref(),
        );
    }
    new["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"].clone();
    if new == **old {
        return Ok((StatusCode::OK, (**old).clone()));
    }
    if req.dry_run {
        return Ok((StatusCode::OK, new));
    }
    let name = meta_str(old, "name").unwrap_or_default().to_owned();
    let key = req.key(&name);
    let finished = new["metadata"]["deletionTimestamp"].is_string()
        && new["metadata"]["finalizers"]
            .as_array()
            .is_none_or(Vec::is_empty);
    if finished {
        store.put(key.clone(), new);
        let gone = store.remove(&key);
        admission::cascade(store, &req.res, &key);
        return Ok((
            StatusCode::OK,
            gone.map(|o| (*o).clone()).unwrap_or_default(),
        ));
    }
    let stored = store.put(key, new);
    Ok((StatusCode::OK, (*stored).clone()))
}

fn current(store: &Store, req: &Req) -> Option<Obj> {
    let name = req.name.clone().unwrap_or_default();
    store.get(&req.key(&name)).cloned()
}

fn check_precondition(req: &Req, old: &Value, new: &Value) -> Result<(), Status> {
    let name = meta_str(old, "name").unwrap_or_default();
    match (meta_str(new, "resourceVersion"), meta_str(old, "resourceVersion")) {
        (Some(want), Some(have)) if !want.is_empty() && want != have => Err(Status::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": the object has been modified; please apply your changes to the latest version and try again",
                qualified(&req.res)
            ),
        )
        .with_details(json!({ "name": name, "group": req.res.group, "kind": req.res.plural }))),
        _ => Ok(()),
    }
}

fn update(
    store: &mut Store,
    now: &str,
    req: &Req,
    body: &[u8],
) -> Result<(StatusCode, Value), Status> {
    let new = parse_body(body, false)?;
    let name = req.name.clone().unwrap_or_default();
    if meta_str(&new, "name").is_some_and(|n| n != name) {
        return Err(Status::new(
            400,
            "BadRequest",
            "the name of the object does not match the name on the URL",
        ));
    }
    let Some(old) = current(store, req) else {
        return Err(not_found(&req.res, &name));
    };
    check_precondition(req, &old, &new)?;
    let merged = merge_write(req, &old, new);
    commit(store, now, req, &old, merged, false)
}

fn patch(
    store: &mut Store,
    now: &str,
    req: &Req,
    content_type: &str,
    body: &[u8],
) -> Result<(StatusCode, Value), Status> {
    let name = req.name.clone().unwrap_or_default();
    let old = current(store, req);
    if content_type == "application/apply-patch+yaml" {
        let applied = parse_body(body, true)?;
        let Some(manager) = req.q.get("fieldManager") else {
            return Err(Status::new(
                422,
                "Invalid",
                "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch",
            ));
        };
        if meta_str(&applied, "name").is_some_and(|n| n != name) {
            return Err(Status::new(
                400,
                "BadRequest",
                "the name of the object does not match the name on the URL",
            ));
        }
        let force = truthy(&req.q, "force");
        let status_sub = req.res.status && req.sub.is_none();
        return match apply::server_side_apply(
            old.as_deref(),
            &applied,
            manager,
            force,
            now,
            status_sub,
        ) {
            Err(conflicts) => {
                let causes: Vec<Value> = conflicts
                    .iter()
                    .map(|c| json!({ "type": "FieldManagerConflict", "message": format!("conflict with \"{}\"", c.manager), "field": c.field }))
                    .collect();
                Err(Status::new(
                    409,
                    "Conflict",
                    apply::conflict_message(&conflicts, applied["apiVersion"].as_str().unwrap_or_default()),
                )
                .with_details(json!({ "name": name, "group": req.res.group, "kind": req.res.plural, "causes": causes })))
            }
            Ok(new) => match old {
                None => {
                    let (_, created) = create_object(store, now, req, new, true)?;
                    Ok((StatusCode::CREATED, created))
                }
                Some(old) => {
                    let merged = merge_write(req, &old, new);
                    commit(store, now, req, &old, merged, true)
                }
            },
        };
    }
    let Some(old) = old else {
        return Err(not_found(&req.res, &name));
    };
    let patch = parse_body(body, false)?;
    let mut new = (*old).clone();
    match content_type {
        "application/merge-patch+json" => apply::merge_patch(&mut new, &patch),
        "application/strategic-merge-patch+json" => {
            if req.res.schema.is_some() {
                return Err(Status::new(
                    415,
                    "UnsupportedMediaType",
                    "strategic merge patch is not supported for custom resources",
                ));
            }
            apply::strategic_merge_patch(&mut new, &patch)
        }
        "application/json-patch+json" => json_patch(&mut new, &patch)?,
        other => {
            return Err(Status::new(
                415,
                "UnsupportedMediaType",
                format!("the media type {other:?} is not supported for PATCH"),
            ));
        }
    }
    check_precondition(req, &old, &patch)?;
    let merged = merge_write(req, &old, new);
    commit(store, now, req, &old, merged, false)
}

/// RFC 6902 (add, remove, replace, test) on JSON pointers.
fn json_patch(target: &mut Value, ops: &Value) -> Result<(), Status> {
    let bad = |m: String| Status::new(422, "Invalid", m);
    for op in ops
        .as_array()
        .ok_or_else(|| bad("a JSON patch is a list".into()))?
    {
        let path = op["path"]
            .as_str()
            .ok_or_else(|| bad("op without path".into()))?;
        let parts: Vec<String> = path
            .split('/')
            .skip(1)
            .map(|p| p.replace("~1", "/").replace("~0", "~"))
            .collect();
        let Some((last, parents)) = parts.split_last() else {
            return Err(bad(format!("invalid path {path}")));
        };
        let mut parent = &mut *target;
        for p in parents {
            parent = match parent {
                Value::Object(o) => o.get_mut(p),
                Value::Array(a) => p.parse::<usize>().ok().and_then(|i| a.get_mut(i)),
                _ => None,
            }
            .ok_or_else(|| bad(format!("path {path} does not exist")))?;
        }
        let value = op["value"].clone();
        match (op["op"].as_str(), parent) {
            (Some("add" | "replace"), Value::Object(o)) => {
                o.insert(last.clone(), value);
            }
            (Some("add"), Value::Array(a)) if last == "-" => a.push(value),
            (Some("add"), Value::Array(a)) => {
                let i: usize = last
                    .parse()
                    .map_err(|_| bad(format!("bad index in {path}")))?;
                if i > a.len() {
                    return Err(bad(format!("index out of range in {path}")));
                }
                a.insert(i, value);
            }
            (Some("replace"), Value::Array(a)) => {
                let slot = last.parse::<usize>().ok().and_then(|i| a.get_mut(i));
                *slot.ok_or_else(|| bad(format!("path {path} does not exist")))? = value;
            }
            (Some("remove"), Value::Object(o)) => {
                o.remove(last)
                    .ok_or_else(|| bad(format!("path {path} does not exist")))?;
            }
            (Some("remove"), Value::Array(a)) => {
                let i = last.parse::<usize>().ok().filter(|i| *i < a.len());
                a.remove(i.ok_or_else(|| bad(format!("path {path} does not exist")))?);
            }
            (Some("test"), p) => {
                let have = match p {
                    Value::Object(o) => o.get(last),
                    Value::Array(a) => last.parse::<usize>().ok().and_then(|i| a.get(i)),
                    _ => None,
                };
                if have != Some(&value) {
                    return Err(bad(format!("test failed at {path}")));
                }
            }
            (other, _) => return Err(bad(format!("unsupported JSON patch op {other:?}"))),
        }
    }
    Ok(())
}

fn delete(store: &mut Store, now: &str, req: &Req) -> Result<(StatusCode, Value), Status> {
    let name = req.name.clone().unwrap_or_default();
    let Some(old) = current(store, req) else {
        return Err(not_found(&req.res, &name));
    };
    delete_object(store, req, &old, now)
}

fn delete_object(
    store: &mut Store,
    req: &Req,
    old: &Obj,
    now: &str,
) -> Result<(StatusCode, Value), Status> {
    let name = meta_str(old, "name").unwrap_or_default().to_owned();
    let key = Key::new(
        &req.res.gr(),
        meta_str(old, "namespace").unwrap_or_default(),
        &name,
    );
    let finalizers = old["metadata"]["finalizers"]
        .as_array()
        .is_some_and(|f| !f.is_empty());
    // Namespaces finalize their content first: it goes with them.
    if finalizers || req.res.plural == "namespaces" {
        if old["metadata"]["deletionTimestamp"].is_string() && finalizers {
            return Ok((StatusCode::ACCEPTED, (**old).clone()));
        }
        let mut new = (**old).clone();
        new["metadata"]["deletionTimestamp"] = json!(now);
        new["metadata"]["deletionGracePeriodSeconds"] = json!(0);
        if req.res.plural == "namespaces" {
            new["status"]["phase"] = json!("Terminating");
        }
        if req.dry_run {
            return Ok((StatusCode::ACCEPTED, new));
        }
        let stored = store.put(key.clone(), new);
        if finalizers {
            return Ok((StatusCode::ACCEPTED, (*stored).clone()));
        }
    }
    if req.dry_run {
        return Ok((StatusCode::OK, (**old).clone()));
    }
    let gone = store.remove(&key);
    admission::cascade(store, &req.res, &key);
    Ok((
        StatusCode::OK,
        gone.map(|o| (*o).clone()).unwrap_or_default(),
    ))
}

fn delete_collection(
    store: &mut Store,
    now: &str,
    req: &Req,
) -> Result<(StatusCode, Value), Status> {
    let filter = Filter::new(req)?;
    let victims: Vec<Obj> = store
        .list(&filter.gr, filter.ns.as_deref())
        .filter(|o| filter.matches(o))
        .cloned()
        .collect();
    let mut items = Vec::new();
    for o in &victims {
        items.push(delete_object(store, req, o, now)?.1);
    }
    Ok((
        StatusCode::OK,
        json!({ "kind": format!("{}List", req.res.kind), "apiVersion": req.res.api_version(), "metadata": {}, "items": items }),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_namespaced_and_cluster_paths() {
        let t = route("/api/v1/namespaces/default/pods/p1/log").unwrap();
        assert!(
            matches!(t, Target::Resource { ref plural, ref ns, ref name, ref sub, .. }
            if plural == "pods" && ns.as_deref() == Some("default") && name.as_deref() == Some("p1") && sub.as_deref() == Some("log"))
        );
        let t = route("/api/v1/namespaces/default/status").unwrap();
        assert!(
            matches!(t, Target::Resource { ref plural, ref ns, ref name, ref sub, .. }
            if plural == "namespaces" && ns.is_none() && name.as_deref() == Some("default") && sub.as_deref() == Some("status"))
        );
        let t = route("/apis/ray.io/v1/rayjobs").unwrap();
        assert!(
            matches!(t, Target::Resource { ref group, ref plural, ref ns, .. } if group == "ray.io" && plural == "rayjobs" && ns.is_none())
        );
        assert!(route("/nope").is_none());
    }

    #[test]
    fn proxies_keep_the_rest_of_the_path() {
        for (path, want) in [
            (
                "/api/v1/namespaces/ml/services/qwen:8000/proxy/v1/chat/completions",
                "/v1/chat/completions",
            ),
            (
                "/api/v1/namespaces/ml/services/https:qwen:http/proxy/v1/models/",
                "/v1/models/",
            ),
            ("/api/v1/namespaces/ml/services/qwen/proxy/", "/"),
            ("/api/v1/namespaces/ml/services/qwen/proxy", ""),
        ] {
            let t = route(path).unwrap();
            assert!(
                matches!(t, Target::Resource { ref plural, ref ns, ref sub, ref proxied, .. }
                if plural == "services" && ns.as_deref() == Some("ml") && sub.as_deref() == Some("proxy")
                    && proxied.as_deref() == Some(want)),
                "{path}"
            );
        }
        assert!(route("/api/v1/namespaces/ml/services/qwen/status/x").is_none());
    }

    #[test]
    fn selectors_match_labels() {
        let labels = json!({"app": "web", "tier": "front"});
        let get = |k: &str| labels.get(k).and_then(Value::as_str).map(str::to_owned);
        for (sel, want) in [
            ("app=web", true),
            ("app==web,tier!=back", true),
            ("app in (web, api),!missing", true),
            ("tier notin (front)", false),
            ("missing", false),
            ("", true),
        ] {
            assert_eq!(Selector::parse(sel).unwrap().matches(get), want, "{sel}");
        }
        assert!(Selector::parse("app in web").is_err());
    }

    #[test]
    fn json_patch_adds_replaces_and_removes() {
        let mut v = json!({"a": {"b": [1, 2]}, "c": 1});
        json_patch(
            &mut v,
            &json!([{"op": "add", "path": "/a/b/-", "value": 3}, {"op": "replace", "path": "/c", "value": 2}, {"op": "remove", "path": "/a/b/0"}]),
        )
        .unwrap();
        assert_eq!(v, json!({"a": {"b": [2, 3]}, "c": 2}));
        assert!(json_patch(&mut v, &json!([{"op": "test", "path": "/c", "value": 9}])).is_err());
    }
}
