//! The `services/{id}/proxy` subresource, resolved as the API server resolves it: `id`
//! is `name`, `name:port` or `scheme:name:port`, a port given by number stands for the
//! name of the Service port with that number, and the request goes to an address of the
//! Service's Endpoints that is ready, serves a port of that name, and whose pod still
//! has it. The sim dials nothing: the pod's answer comes from [`model_server`] and is
//! relayed with its status unchanged, plus [`POD_HEADER`] naming the pod. A pod that is
//! an inference router ([`inference_router`]) passes the request on to the worker it
//! picks, whose answer comes back with [`ROUTER_HEADER`] naming the router. Resolving
//! reads the store under the cluster's lock; the answer is computed once it is let go.

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::api::Status;
use super::controllers::is_ready;
use super::inference_router::Router;
use super::model_server::{self, Serving};
use super::store::{Key, Obj, Store, meta};

/// The response header naming the pod that answered.
pub const POD_HEADER: &str = "x-hypd-sim-pod";
/// The response header naming the router a request went through, if it did.
pub const ROUTER_HEADER: &str = "x-hypd-sim-router";

/// Where a proxied request goes: a pod, and the address and port it is reached at.
pub struct Backend {
    pod: Obj,
    ip: String,
    port: u64,
    routed: Option<Routed>,
}

/// What a router made of a request: the worker it passed it to (the backend's pod), or
/// none it could (its own answer).
enum Routed {
    Via(String),
    NoWorker(String),
}

fn no_endpoints(what: &str) -> Status {
    Status::new(
        503,
        "ServiceUnavailable",
        format!("no endpoints available for service \"{what}\""),
    )
}

/// The backend of Service proxy `id` in namespace `ns` for a request with `body` and
/// `headers`; the endpoints that can answer take turns, and a router among them picks
/// its worker.
pub fn backend(
    store: &Store,
    serving: &Serving,
    ns: &str,
    id: &str,
    body: &[u8],
    headers: &HeaderMap,
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
    Ok(match Router::of(&chosen.pod) {
        Some(router) if u64::from(router.port) == chosen.port => {
            route(store, serving, &router, chosen, body, headers)
        }
        _ => chosen,
    })
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

/// What `backend` answers to `method` on `path` (what followed `/proxy` in
/// `request_path`), at sim time `created` (epoch seconds).
#[allow(clippy::too_many_arguments)]
pub fn answer(
    backend: &Backend,
    serving: &Serving,
    method: &Method,
    request_path: &str,
    path: &str,
    query: Option<&str>,
    body: &[u8],
    created: i64,
) -> Response {
    // The API server sends a read of the bare proxy to its root, as a directory.
    if path.is_empty() && matches!(*method, Method::GET | Method::HEAD) {
        let query = query.map(|q| format!("?{q}")).unwrap_or_default();
        let location = format!("{request_path}/{query}");
        return (
            StatusCode::MOVED_PERMANENTLY,
            [(header::LOCATION, location)],
        )
            .into_response();
    }
    let path = if path.is_empty() { "/" } else { path };
    let pod = backend.pod["metadata"]["name"].as_str().unwrap_or_default();
    if let Some(Routed::NoWorker(message)) = &backend.routed {
        let body = json!({ "object": "error", "message": message, "type": "ServiceUnavailableError",
                           "param": null, "code": 503 });
        let mut response = (StatusCode::SERVICE_UNAVAILABLE, body.to_string()).into_response();
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if let Ok(v) = HeaderValue::from_str(pod) {
            headers.insert(POD_HEADER, v);
        }
        return response;
    }
    let server = model_server::of(&backend.pod);
    if let Some(s) = &server
        && u64::from(s.port) != backend.port
    {
        return Status::new(
            503,
            "ServiceUnavailable",
            format!(
                "error trying to reach service: dial tcp {}:{}: connect: connection refused",
                backend.ip, backend.port
            ),
        )
        .into_response();
    }
    let a = model_server::answer(
        &backend.pod,
        server.as_ref(),
        serving,
        method,
        path,
        body,
        created,
    );
    let mut response = (a.status, Body::from(a.body)).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(a.content_type),
    );
    if let Ok(v) = HeaderValue::from_str(pod) {
        headers.insert(POD_HEADER, v);
    }
    if let Some(Routed::Via(router)) = &backend.routed
        && let Ok(v) = HeaderValue::from_str(router)
    {
        headers.insert(ROUTER_HEADER, v);
    }
    response
}
