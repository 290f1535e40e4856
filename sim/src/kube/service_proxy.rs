//! The `services/{id}/proxy` subresource, resolved as the API server resolves it: `id`
//! is `name`, `name:port` or `scheme:name:port`, a port given by number stands for the
//! name of the Service port with that number, and the request goes to an address of the
//! Service's Endpoints that is ready, serves a port of that name, and whose pod still
//! has it. The sim dials nothing: the pod's answer comes from [`model_server`] and is
//! relayed with its status unchanged, plus [`POD_HEADER`] naming the pod. A pod that is
//! an inference router ([`inference_router`]) or an SGLang gateway ([`sglang_router`])
//! passes the request on to the worker it picks, whose answer comes back with
//! [`ROUTER_HEADER`] naming the router; a Prometheus server's pod ([`prometheus`])
//! answers from what it scraped, reading the request's query string. Resolving reads the store under the cluster's
//! lock; the answer is computed once it is let go, and a completion's is then sent as
//! its decode time passes on the sim's clock, with no lock held while it waits. A
//! completion an SGLang gateway found no worker for is [`Held`] while the gateway's
//! retries back off on the sim's clock, also with no lock held: each attempt takes the
//! lock again and reads the workers anew. The same resolution serves what a pod fetches
//! from a Service inside the cluster ([`get`]).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::ClusterApi;
use super::api::Status;
use super::controllers::is_ready;
use super::inference_router::Router;
use super::model_server::{self, Answer, InFlight, Serving};
use super::prometheus;
use super::sglang_router::{Gateway, Handling, Held};
use super::store::{Key, Obj, Store, meta};
use crate::clock::Clock;

/// The response header naming the pod that answered.
pub const POD_HEADER: &str = "x-hypd-sim-pod";
/// The response header naming the router a request went through, if it did.
pub const ROUTER_HEADER: &str = "x-hypd-sim-router";
/// The longest real time an answer waits between two looks at the clock, whose speed
/// may change meanwhile.
const LONGEST_NAP: Duration = Duration::from_millis(100);

/// A request as the proxy passes it on.
pub struct Call<'a> {
    pub method: &'a Method,
    /// What followed `/proxy` in the request's path ("" for nothing).
    pub path: &'a str,
    pub body: &'a [u8],
    pub headers: &'a HeaderMap,
}

/// Where a proxied request goes: a pod, and the address and port it is reached at.
pub struct Backend {
    pod: Obj,
    ip: String,
    port: u64,
    routed: Option<Routed>,
    /// The request as the gateway it went through counts it.
    counted: Option<InFlight>,
}

/// What a router made of a request: the worker it passed it to (the backend's pod), or
/// none it could (its own answer).
enum Routed {
    Via(String),
    NoWorker(String),
    /// A gateway (the backend's pod) answered it.
    Own(Answer),
    /// Nothing listens on the gateway's port the request went to.
    Refused,
    /// A gateway (the backend's pod) found no worker for it yet, and tries again.
    Held(Box<Held>),
}

fn no_endpoints(what: &str) -> Status {
    Status::new(
        503,
        "ServiceUnavailable",
        format!("no endpoints available for service \"{what}\""),
    )
}

/// The backend of Service proxy `id` in namespace `ns` for `call`, at sim time `now`
/// (epoch seconds); the endpoints that can answer take turns, and a router among them
/// picks its worker.
pub fn backend(
    store: &Store,
    serving: &Serving,
    ns: &str,
    id: &str,
    call: &Call,
    now: f64,
) -> Result<Backend, Status> {
    let (scheme, name, port) = match id.split(':').collect::<Vec<_>>().as_slice() {
        [n] => ("", *n, ""),
        [n, p] => ("", *n, *p),
        [s, n, p] => (*s, *n, *p),
        _ => ("", "", ""),
    };
    if name.is_empty() || !["", "http", "https"].contains(&scheme) {
        return Err(Status::new(
            400,
            "BadRequest",
            format!("invalid service request \"{id}\""),
        ));
    }
    let Some(svc) = store.get(&Key::new("/services", ns, name)) else {
        return Err(
            Status::new(404, "NotFound", format!("services \"{name}\" not found"))
                .with_details(json!({ "name": name, "kind": "services" })),
        );
    };
    let port_name = match port.parse::<u64>() {
        Err(_) => port.to_owned(),
        Ok(number) => svc["spec"]["ports"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|p| p["port"].as_u64() == Some(number))
            .map(|p| p["name"].as_str().unwrap_or_default().to_owned())
            .ok_or_else(|| {
                Status::new(
                    503,
                    "ServiceUnavailable",
                    format!("no service port {number} found for service \"{name}\""),
                )
            })?,
    };
    // A Service the endpoints controller has not reached yet has no Endpoints: it has
    // no endpoints either.
    let subsets = store
        .get(&Key::new("/endpoints", ns, name))
        .and_then(|e| e["subsets"].as_array().cloned())
        .unwrap_or_default();
    if subsets.is_empty() {
        return Err(no_endpoints(name));
    }
    let mut candidates = Vec::new();
    for ss in &subsets {
        let addresses = ss["addresses"].as_array().cloned().unwrap_or_default();
        let ports = ss["ports"].as_array().into_iter().flatten();
        for p in ports.filter(|p| p["name"].as_str().unwrap_or_default() == port_name) {
            for a in &addresses {
                let target = &a["targetRef"];
                let (Some(ip), Some(pod_name), Some(number)) = (
                    a["ip"].as_str(),
                    target["name"].as_str(),
                    p["port"].as_u64(),
                ) else {
                    continue;
                };
                if target["kind"] != "Pod" {
                    continue;
                }
                let pod_ns = target["namespace"].as_str().unwrap_or(ns);
                // An address whose pod is gone, or has another IP now, is skipped.
                if let Some(pod) = store.get(&Key::new("/pods", pod_ns, pod_name))
                    && pod["status"]["podIP"].as_str() == Some(ip)
                {
                    candidates.push(Backend {
                        pod: pod.clone(),
                        ip: ip.to_owned(),
                        port: number,
                        routed: None,
                        counted: None,
                    });
                }
            }
        }
    }
    if candidates.is_empty() {
        return Err(no_endpoints(id));
    }
    let turn = serving.turn(ns, name, candidates.len());
    let chosen = candidates.swap_remove(turn);
    // The API server answers a read of the bare proxy itself (see `answer`).
    if call.path.is_empty() && matches!(*call.method, Method::GET | Method::HEAD) {
        return Ok(chosen);
    }
    if let Some(gateway) = Gateway::of(&chosen.pod) {
        return Ok(through_gateway(store, serving, &gateway, chosen, call, now));
    }
    Ok(match Router::of(&chosen.pod) {
        Some(router) if u64::from(router.port) == chosen.port => {
            route(store, serving, &router, chosen, call.body, call.headers)
        }
        _ => chosen,
    })
}

/// What the SGLang `gateway` (the pod of `via`) makes of `call`.
fn through_gateway(
    store: &Store,
    serving: &Serving,
    gateway: &Gateway,
    via: Backend,
    call: &Call,
    now: f64,
) -> Backend {
    let path = if call.path.is_empty() { "/" } else { call.path };
    let handling = gateway.handle(
        &via.pod,
        via.port,
        store,
        serving,
        call.method,
        path,
        call.body,
        now,
    );
    match handling {
        Handling::Answer(answer, Some(counted))
            if gateway.retries(call.method, path, answer.status) =>
        {
            let held = Held::new(gateway, &via.pod, path, call.body, counted);
            Backend {
                routed: Some(Routed::Held(held)),
                ..via
            }
        }
        handling => handled(via, handling),
    }
}

/// Where a gateway's `handling` of a request sends it: `via` is the gateway's own pod.
fn handled(via: Backend, handling: Handling) -> Backend {
    match handling {
        Handling::Forward {
            worker,
            port,
            counted,
        } => Backend {
            ip: worker["status"]["podIP"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            port: u64::from(port),
            routed: Some(Routed::Via(meta(&via.pod, "name"))),
            pod: worker,
            counted: Some(counted),
        },
        Handling::Answer(answer, counted) => Backend {
            routed: Some(Routed::Own(answer)),
            counted,
            ..via
        },
        Handling::Refused => Backend {
            routed: Some(Routed::Refused),
            ..via
        },
    }
}

/// Where `router` (the pod of `via`) sends a request: one of the Ready pods it discovers,
/// in name order, on the port it reaches them at.
fn route(
    store: &Store,
    serving: &Serving,
    router: &Router,
    via: Backend,
    body: &[u8],
    headers: &HeaderMap,
) -> Backend {
    let router_name = meta(&via.pod, "name");
    let mut workers: Vec<Obj> = store
        .list("/pods", Some(&router.namespace))
        .filter(|p| router.selects(&p["metadata"]["labels"]))
        .filter(|p| p["metadata"]["deletionTimestamp"].is_null() && is_ready(p))
        .filter(|p| p["status"]["podIP"].is_string())
        .cloned()
        .collect();
    workers.sort_by_key(|p| meta(p, "name"));
    // Its turns are its own, apart from those of the Service in front of it.
    let turns = format!("{}/{router_name}", meta(&via.pod, "namespace"));
    let picked = router.pick(&workers, body, headers, |n| {
        serving.turn(&router.namespace, &turns, n)
    });
    match picked {
        Some(worker) => Backend {
            ip: worker["status"]["podIP"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            pod: worker.clone(),
            port: u64::from(router.worker_port),
            routed: Some(Routed::Via(router_name)),
            counted: None,
        },
        None => Backend {
            routed: Some(Routed::NoWorker(format!(
                "no ready worker matches {} in namespace {}",
                router.selector, router.namespace
            ))),
            ..via
        },
    }
}

/// A pod's answer to a request, with who gave it and what counts it in flight.
struct Reply {
    answer: Answer,
    pod: String,
    router: Option<String>,
    counted: Option<InFlight>,
}

fn refused(ip: &str, port: u64) -> Status {
    Status::new(
        503,
        "ServiceUnavailable",
        format!("error trying to reach service: dial tcp {ip}:{port}: connect: connection refused"),
    )
}

/// What `backend` answers to `call`'s method on its path (not empty) with its query
/// string, at sim time `created`
/// (epoch seconds), before any decode time passes; the API server's own answer when
/// nothing listens where the request went.
fn reply(
    backend: Backend,
    serving: &Serving,
    call: (&Method, &str, Option<&str>),
    body: &[u8],
    created: f64,
) -> Result<Reply, Status> {
    let (method, path, query) = call;
    let pod = meta(&backend.pod, "name");
    let (router, counted) = match backend.routed {
        Some(Routed::NoWorker(message)) => {
            let body = json!({ "object": "error", "message": message,
                               "type": "ServiceUnavailableError", "param": null, "code": 503 });
            let answer = Answer::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "application/json",
                body.to_string(),
            );
            return Ok(Reply {
                answer,
                pod,
                router: None,
                counted: None,
            });
        }
        Some(Routed::Own(answer)) => {
            return Ok(Reply {
                answer,
                pod,
                router: None,
                counted: backend.counted,
            });
        }
        Some(Routed::Refused) => return Err(refused(&backend.ip, backend.port)),
        // Nothing waits here: `answer` holds a request before it gets this far, and what
        // a pod fetches inside the cluster is never a completion.
        Some(Routed::Held(held)) => {
            let (answer, counted) = held.give_up();
            return Ok(Reply {
                answer,
                pod,
                router: None,
                counted: Some(counted),
            });
        }
        Some(Routed::Via(router)) => (Some(router), backend.counted),
        None => (None, backend.counted),
    };
    if let Some(p) = prometheus::of(&backend.pod) {
        if u64::from(p.port) != backend.port {
            return Err(refused(&backend.ip, backend.port));
        }
        let uid = meta(&backend.pod, "uid");
        let answer = prometheus::answer(serving, &uid, method, path, query, body, created);
        return Ok(Reply {
            answer,
            pod,
            router,
            counted,
        });
    }
    let server = model_server::of(&backend.pod);
    if let Some(s) = &server
        && u64::from(s.port) != backend.port
    {
        return Err(refused(&backend.ip, backend.port));
    }
    let answer = model_server::answer(
        &backend.pod,
        server.as_ref(),
        serving,
        method,
        path,
        body,
        created as i64,
    );
    Ok(Reply {
        answer,
        pod,
        router,
        counted,
    })
}

/// What `backend` in `cluster` answers to `call` (whose full path was `request_path`)
/// taken at sim time `created` (epoch seconds): sent as `clock` reaches the time each
/// part of it is due, after any hold of a gateway's retries.
pub async fn answer(
    backend: Backend,
    clock: Arc<Clock>,
    cluster: &ClusterApi,
    call: &Call<'_>,
    request_path: &str,
    query: Option<&str>,
    created: i64,
) -> Response {
    // The API server sends a read of the bare proxy to its root, as a directory.
    if call.path.is_empty() && matches!(*call.method, Method::GET | Method::HEAD) {
        let query = query.map(|q| format!("?{q}")).unwrap_or_default();
        let location = format!("{request_path}/{query}");
        return (
            StatusCode::MOVED_PERMANENTLY,
            [(header::LOCATION, location)],
        )
            .into_response();
    }
    let path = if call.path.is_empty() { "/" } else { call.path };
    let serving = &cluster.serving;
    let (backend, created) = match backend.routed {
        Some(Routed::Held(held)) => {
            let via = Backend {
                routed: None,
                ..backend
            };
            match hold(via, held, &clock, cluster).await {
                // The worker takes it when the attempt that found it was made.
                Ok(b) => (b, clock.epoch(clock.now()) as i64),
                Err(s) => return s.into_response(),
            }
        }
        routed => (Backend { routed, ..backend }, created),
    };
    let start = clock.now();
    match reply(
        backend,
        serving,
        (call.method, path, query),
        call.body,
        created as f64,
    ) {
        Ok(r) => send(r, clock, start).await,
        Err(s) => s.into_response(),
    }
}

/// Holds a request the gateway (the pod of `via`) found no worker for: each backoff
/// waits on `clock` with no lock held, and each attempt after it reads `cluster`'s
/// workers as they are then. The backend the request ends with: a worker, or the
/// gateway's own answer once the attempts are spent. The client's connection ends if
/// the gateway's pod goes meanwhile.
async fn hold(
    via: Backend,
    mut held: Box<Held>,
    clock: &Clock,
    cluster: &ClusterApi,
) -> Result<Backend, Status> {
    let serving = &cluster.serving;
    let gateway = Key::new(
        "/pods",
        &meta(&via.pod, "namespace"),
        &meta(&via.pod, "name"),
    );
    let uid = meta(&via.pod, "uid");
    while let Some(delay) = held.back_off(serving) {
        // SMG sleeps after each attempt, and an attempt takes no sim time.
        until(clock, clock.now() + delay).await;
        let store = cluster.store.lock().await;
        if store.get(&gateway).is_none_or(|p| meta(p, "uid") != uid) {
            return Err(Status::new(
                503,
                "ServiceUnavailable",
                "error trying to reach service: EOF",
            ));
        }
        match held.attempt(&store, serving, clock.epoch(clock.now())) {
            Ok(handling) => return Ok(handled(via, handling)),
            Err(again) => held = again,
        }
    }
    let (answer, counted) = held.give_up();
    Ok(Backend {
        routed: Some(Routed::Own(answer)),
        counted: Some(counted),
        ..via
    })
}

/// Waits until `clock` reads `at` (sim seconds), however its speed changes meanwhile.
async fn until(clock: &Clock, at: f64) {
    loop {
        let left = at - clock.now();
        if left <= 0.0 {
            return;
        }
        let nap = clock
            .real_time_for(left)
            .map_or(LONGEST_NAP, |d| d.min(LONGEST_NAP));
        tokio::time::sleep(nap).await;
    }
}

/// `reply` as an HTTP response whose body is sent as it comes due, measured from
/// `start` (sim seconds): whole once decoded, or a streamed answer's events one by one.
/// What counts the request in flight lives until the last byte is handed on.
async fn send(reply: Reply, clock: Arc<Clock>, start: f64) -> Response {
    let Reply {
        answer,
        pod,
        router,
        counted,
    } = reply;
    let Answer {
        status,
        content_type,
        body,
        due,
        decoding,
    } = answer;
    let body = if due.len() > 1 {
        let mut pieces = Vec::with_capacity(due.len());
        let mut from = 0;
        for (to, at) in due {
            pieces.push((Bytes::copy_from_slice(&body.as_bytes()[from..to]), at));
            from = to;
        }
        let state = (pieces.into_iter(), clock, (decoding, counted));
        Body::from_stream(futures_util::stream::unfold(
            state,
            move |(mut pieces, clock, held)| async move {
                let (bytes, at) = pieces.next()?;
                until(&clock, start + at).await;
                Some((Ok::<_, Infallible>(bytes), (pieces, clock, held)))
            },
        ))
    } else {
        if let Some((_, at)) = due.first() {
            until(&clock, start + at).await;
        }
        drop((decoding, counted));
        Body::from(body)
    };
    let mut response = (status, body).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    if let Ok(v) = HeaderValue::from_str(&pod) {
        headers.insert(POD_HEADER, v);
    }
    if let Some(router) = router
        && let Ok(v) = HeaderValue::from_str(&router)
    {
        headers.insert(ROUTER_HEADER, v);
    }
    response
}

/// Why a fetch from inside the cluster got no answer.
#[derive(Debug, PartialEq)]
pub enum Unreachable {
    /// Something at the address refuses the connection (`ip:port`).
    Refused(String),
    /// Nothing answers at all: no rule forwards the cluster IP's port.
    Timeout,
}

/// What a GET of `path` from a pod answers through Service `svc` on `port`, as its
/// cluster IP forwards it to a ready endpoint, at sim time `now` (epoch seconds): the
/// status and body. Nothing a GET asks for takes decode time.
pub fn get(
    store: &Store,
    serving: &Serving,
    svc: &Value,
    port: u16,
    path: &str,
    now: f64,
) -> Result<(u16, String), Unreachable> {
    let ns = meta(svc, "namespace");
    let name = meta(svc, "name");
    let ip = svc["spec"]["clusterIP"].as_str().unwrap_or_default();
    let served = svc["spec"]["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|p| p["port"].as_u64() == Some(u64::from(port)));
    if !served {
        return Err(Unreachable::Timeout);
    }
    let (path, query) = match path.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (path, None),
    };
    let headers = HeaderMap::new();
    let call = Call {
        method: &Method::GET,
        path,
        body: b"",
        headers: &headers,
    };
    let refused = || Unreachable::Refused(format!("{ip}:{port}"));
    let backend = backend(store, serving, &ns, &format!("{name}:{port}"), &call, now)
        .map_err(|_| refused())?;
    let reply =
        reply(backend, serving, (&Method::GET, path, query), b"", now).map_err(|_| refused())?;
    Ok((reply.answer.status.as_u16(), reply.answer.body))
}

/// The Service a host names from a pod in namespace `ns`, whose DNS search path starts
/// with its own namespace: `svc`, `svc.ns`, `svc.ns.svc`, `svc.ns.svc.cluster.local`, or
/// a cluster IP.
pub fn resolve<'a>(store: &'a Store, host: &str, ns: &str) -> Option<&'a Obj> {
    let host = host.trim_end_matches('.');
    let short = host.strip_suffix(".cluster.local").unwrap_or(host);
    let short = short.strip_suffix(".svc").unwrap_or(short);
    let by_name = match short.split('.').collect::<Vec<_>>().as_slice() {
        [name] => store.get(&Key::new("/services", ns, name)),
        [name, ns] => store.get(&Key::new("/services", ns, name)),
        _ => None,
    };
    by_name.or_else(|| {
        store
            .list("/services", None)
            .find(|s| s["spec"]["clusterIP"].as_str() == Some(host))
    })
}
