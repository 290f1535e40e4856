//! Endpoints: for every Service with a selector, an Endpoints object of its name listing
//! the selected pods that have an IP, the ready ones in `addresses` and the others in
//! `notReadyAddresses`, with each Service port's target resolved per pod (a named
//! `targetPort` is the pod's container port of that name) and pods grouped into subsets
//! by the ports they resolve, as Kubernetes' endpoints controller repacks them. As that
//! controller, it labels what it writes as its own and removes that once the Service is
//! gone, leaves selector-less Services' Endpoints to whoever writes them, and sets no
//! owner. The service proxy picks its pod from here, as the API server's does.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::{is_ready, is_terminal, selector_matches, snapshot, upsert};
use crate::kube::admission::object;
use crate::kube::store::{Key, Store, meta};

const MANAGED_BY: (&str, &str) = ("endpoints.kubernetes.io/managed-by", "endpoint-controller");

pub(super) fn endpoints(store: &mut Store, now: &str) {
    for svc in snapshot(store, "/services") {
        let selector = &svc["spec"]["selector"];
        if selector.as_object().is_none_or(|s| s.is_empty()) {
            continue;
        }
        let ns = meta(&svc, "namespace");
        let name = meta(&svc, "name");
        let subsets = subsets(store, &svc, &ns);
        let key = Key::new("/endpoints", &ns, &name);
        let mut eps = match store.get(&key) {
            Some(o) => (**o).clone(),
            None => object(store, "v1", "Endpoints", &ns, &name, now),
        };
        let mut labels = svc["metadata"]["labels"].clone();
        if !labels.is_object() {
            labels = json!({});
        }
        labels[MANAGED_BY.0] = json!(MANAGED_BY.1);
        eps["metadata"]["labels"] = labels;
        match eps.as_object_mut() {
            Some(o) if subsets.is_empty() => {
                o.remove("subsets");
            }
            _ => eps["subsets"] = json!(subsets),
        }
        upsert(store, key, eps);
    }
    let orphans: Vec<Key> = store
        .list("/endpoints", None)
        .filter(|e| e["metadata"]["labels"][MANAGED_BY.0] == MANAGED_BY.1)
        .map(|e| Key::new("/endpoints", &meta(e, "namespace"), &meta(e, "name")))
        .filter(|k| store.get(&Key::new("/services", &k.ns, &k.name)).is_none())
        .collect();
    for k in orphans {
        store.remove(&k);
    }
}

/// The number a Service port targets on `pod`: `targetPort` as a number, or the
/// container port of that name (none when the pod has no such port), else `port`.
fn target_port(port: &Value, pod: &Value) -> Option<u64> {
    match &port["targetPort"] {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => match s.parse() {
            Ok(n) => Some(n),
            Err(_) => pod["spec"]["containers"]
                .as_array()?
                .iter()
                .flat_map(|c| c["ports"].as_array().into_iter().flatten())
                .find(|p| p["name"] == *s)
                .and_then(|p| p["containerPort"].as_u64()),
        },
        _ => port["port"].as_u64(),
    }
}

fn subsets(store: &Store, svc: &Value, ns: &str) -> Vec<Value> {
    let publish = svc["spec"]["publishNotReadyAddresses"] == true;
    let ports = svc["spec"]["ports"].as_array().cloned().unwrap_or_default();
    // One subset per set of ports the pods resolve.
    let mut groups: BTreeMap<String, Value> = BTreeMap::new();
    for pod in store.list("/pods", Some(ns)) {
        let Some(ip) = pod["status"]["podIP"].as_str() else {
            continue;
        };
        let terminating = pod["metadata"]["deletionTimestamp"].is_string();
        if is_terminal(pod)
            || (terminating && !publish)
            || !selector_matches(&svc["spec"]["selector"], &pod["metadata"]["labels"])
        {
            continue;
        }
        let resolved: Vec<Value> = ports
            .iter()
            .filter_map(|p| {
                let mut e = json!({ "port": target_port(p, pod)?,
                                    "protocol": p["protocol"].as_str().unwrap_or("TCP") });
                if let Some(n) = p["name"].as_str().filter(|n| !n.is_empty()) {
                    e["name"] = json!(n);
                }
                Some(e)
            })
            .collect();
        if resolved.is_empty() && !ports.is_empty() {
            continue;
        }
        let address = json!({ "ip": ip, "nodeName": pod["spec"]["nodeName"],
            "targetRef": { "kind": "Pod", "name": meta(pod, "name"), "namespace": ns,
                           "uid": meta(pod, "uid") } });
        let subset = groups
            .entry(Value::Array(resolved.clone()).to_string())
            .or_insert_with(|| {
                // Headless Services may have no ports.
                if resolved.is_empty() {
                    json!({})
                } else {
                    json!({ "ports": resolved })
                }
            });
        let list = if publish || is_ready(pod) {
            "addresses"
        } else {
            "notReadyAddresses"
        };
        match subset.get_mut(list).and_then(Value::as_array_mut) {
            Some(a) => a.push(address),
            None => subset[list] = json!([address]),
        }
    }
    groups
        .into_values()
        .map(|mut subset| {
            for list in ["addresses", "notReadyAddresses"] {
                if let Some(a) = subset.get_mut(list).and_then(Value::as_array_mut) {
                    a.sort_by(|a, b| a["ip"].as_str().cmp(&b["ip"].as_str()));
                }
            }
            subset
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, ip: Option<&str>, ready: bool) -> Value {
        let mut p = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}"),
                         "labels": {"app": "web"}},
            "spec": {"nodeName": "n1", "containers": [{"name": "main",
                "ports": [{"name": "http", "containerPort": 8000}]}]},
            "status": {"phase": "Running", "conditions": [{"type": "Ready",
                "status": if ready { "True" } else { "False" }}]}});
        if let Some(ip) = ip {
            p["status"]["podIP"] = json!(ip);
        }
        p
    }

    #[test]
    fn endpoints_follow_pod_readiness_and_go_with_their_service() {
        let mut store = Store::new();
        let now = "2026-01-01T00:00:00Z";
        store.put(
            Key::new("/services", "default", "web"),
            json!({"metadata": {"name": "web", "namespace": "default", "labels": {"tier": "front"}},
                   "spec": {"selector": {"app": "web"},
                            "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}}),
        );
        store.put(
            Key::new("/services", "default", "external"),
            json!({"metadata": {"name": "external", "namespace": "default"},
                   "spec": {"ports": [{"port": 80}]}}),
        );
        for (name, ip, ready) in [
            ("b", Some("10.1.0.9"), true),
            ("a", Some("10.1.0.3"), true),
            ("loading", Some("10.1.0.5"), false),
            ("pending", None, false),
        ] {
            store.put(Key::new("/pods", "default", name), pod(name, ip, ready));
        }
        endpoints(&mut store, now);
        let eps = store
            .get(&Key::new("/endpoints", "default", "web"))
            .unwrap()
            .clone();
        assert_eq!(eps["kind"], "Endpoints");
        assert_eq!(eps["metadata"]["labels"]["tier"], "front");
        assert_eq!(eps["metadata"]["labels"][MANAGED_BY.0], MANAGED_BY.1);
        let subset = &eps["subsets"][0];
        let ips: Vec<&str> = subset["addresses"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a["ip"].as_str().unwrap())
            .collect();
        assert_eq!(ips, ["10.1.0.3", "10.1.0.9"]);
        assert_eq!(subset["addresses"][0]["targetRef"]["name"], "a");
        assert_eq!(subset["notReadyAddresses"][0]["ip"], "10.1.0.5");
        assert_eq!(
            subset["ports"],
            json!([{"name": "http", "port": 8000, "protocol": "TCP"}])
        );
        assert!(
            store
                .get(&Key::new("/endpoints", "default", "external"))
                .is_none(),
            "a Service without a selector gets no Endpoints from the controller"
        );

        let rv = store.rv();
        endpoints(&mut store, now);
        assert_eq!(store.rv(), rv, "nothing changed, nothing written");

        for name in ["a", "b", "loading", "pending"] {
            store.remove(&Key::new("/pods", "default", name));
        }
        endpoints(&mut store, now);
        let eps = store
            .get(&Key::new("/endpoints", "default", "web"))
            .unwrap();
        assert!(eps.get("subsets").is_none(), "{eps}");
        store.remove(&Key::new("/services", "default", "web"));
        endpoints(&mut store, now);
        assert!(
            store
                .get(&Key::new("/endpoints", "default", "web"))
                .is_none()
        );
    }
}
