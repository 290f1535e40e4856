//! Server-side printing: the `meta.k8s.io/v1` Table that `kubectl get` asks for
//! (`Accept: application/json;as=Table;…`), with the columns the real API server prints
//! per kind and a CRD's `additionalPrinterColumns`. Ages are computed here from the sim's
//! clock, as the API server computes them from its own, so they read naturally at any
//! time scale.

use serde_json::{Value, json};

use super::discovery::Resource;
use super::time::parse_rfc3339;

/// Whether the client asked for a Table.
pub fn wanted(accept: &str) -> bool {
    accept.contains("as=Table")
}

/// `5s`, `3m`, `2h`, `4d`, like kubectl's short durations.
pub fn age(seconds: f64) -> String {
    let s = seconds.max(0.0) as u64;
    match s {
        0..=119 => format!("{s}s"),
        120..=7199 => format!("{}m", s / 60),
        7200..=172_799 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86_400),
    }
}

fn s(v: &Value) -> String {
    match v {
        Value::String(x) => x.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

fn n(v: &Value) -> u64 {
    v.as_u64().unwrap_or(0)
}

fn or_none(x: String) -> String {
    if x.is_empty() { "<none>".into() } else { x }
}

fn cond(o: &Value, kind: &str) -> bool {
    o["status"]["conditions"].as_array().is_some_and(|cs| {
        cs.iter()
            .any(|c| c["type"] == kind && c["status"] == "True")
    })
}

/// A simple `.a.b[0].c` JSONPath, as printer columns use.
fn json_path<'a>(o: &'a Value, path: &str) -> &'a Value {
    let mut cur = o;
    for seg in path
        .trim_start_matches('.')
        .split('.')
        .filter(|s| !s.is_empty())
    {
        let (name, index) = match seg.split_once('[') {
            Some((n, rest)) => (n, rest.trim_end_matches(']').parse::<usize>().ok()),
            None => (seg, None),
        };
        cur = &cur[name];
        if let Some(i) = index {
            cur = &cur[i];
        }
    }
    cur
}

fn pod_status(p: &Value) -> String {
    let state = &p["status"]["containerStatuses"][0]["state"];
    if p["metadata"]["deletionTimestamp"].is_string() {
        return "Terminating".into();
    }
    if let Some(r) = state["waiting"]["reason"].as_str() {
        return r.into();
    }
    if let Some(r) = state["terminated"]["reason"].as_str() {
        return r.into();
    }
    s(&p["status"]["phase"])
}

/// An Endpoints' ready `ip:port`s as kubectl prints them: the first three, then how many
/// more; `<none>` with no subsets at all.
fn endpoints(o: &Value) -> String {
    let subsets = o["subsets"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    if subsets.is_empty() {
        return "<none>".into();
    }
    let mut all = Vec::new();
    for ss in subsets {
        let addresses = ss["addresses"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default();
        let ips = addresses.iter().map(|a| s(&a["ip"]));
        match ss["ports"].as_array().filter(|p| !p.is_empty()) {
            // Headless Services may have no ports.
            None => all.extend(ips),
            Some(ports) => {
                for p in ports {
                    all.extend(
                        addresses
                            .iter()
                            .map(|a| format!("{}:{}", s(&a["ip"]), s(&p["port"]))),
                    );
                }
            }
        }
    }
    let shown = all.iter().take(3).cloned().collect::<Vec<_>>().join(",");
    match all.len() {
        n if n > 3 => format!("{shown} + {} more...", n - 3),
        _ => shown,
    }
}

/// Column names and the cells of one object.
fn columns(res: &Resource, o: &Value, now: f64) -> (Vec<&'static str>, Vec<String>) {
    let created = o["metadata"]["creationTimestamp"]
        .as_str()
        .and_then(parse_rfc3339)
        .unwrap_or(now);
    let a = age(now - created);
    let name = s(&o["metadata"]["name"]);
    let st = &o["status"];
    let sp = &o["spec"];
    match (res.group.as_str(), res.plural.as_str()) {
        ("", "pods") => {
            let total = sp["containers"].as_array().map_or(0, Vec::len);
            let ready = st["containerStatuses"]
                .as_array()
                .map_or(0, |c| c.iter().filter(|c| c["ready"] == true).count());
            (
                vec!["Name", "Ready", "Status", "Restarts", "Age"],
                vec![
                    name,
                    format!("{ready}/{total}"),
                    pod_status(o),
                    "0".into(),
                    a,
                ],
            )
        }
        ("apps", "deployments") => (
            vec!["Name", "Ready", "Up-to-date", "Available", "Age"],
            vec![
                name,
                format!("{}/{}", n(&st["readyReplicas"]), n(&sp["replicas"])),
                n(&st["updatedReplicas"]).to_string(),
                n(&st["availableReplicas"]).to_string(),
                a,
            ],
        ),
        ("apps", "replicasets") => (
            vec!["Name", "Desired", "Current", "Ready", "Age"],
            vec![
                name,
                n(&sp["replicas"]).to_string(),
                n(&st["replicas"]).to_string(),
                n(&st["readyReplicas"]).to_string(),
                a,
            ],
        ),
        ("apps", "daemonsets") => (
            vec![
                "Name",
                "Desired",
                "Current",
                "Ready",
                "Up-to-date",
                "Available",
                "Age",
            ],
            vec![
                name,
                n(&st["desiredNumberScheduled"]).to_string(),
                n(&st["currentNumberScheduled"]).to_string(),
                n(&st["numberReady"]).to_string(),
                n(&st["updatedNumberScheduled"]).to_string(),
                n(&st["numberAvailable"]).to_string(),
                a,
            ],
        ),
        ("batch", "jobs") => {
            let status = if cond(o, "Complete") {
                "Complete"
            } else if cond(o, "Failed") {
                "Failed"
            } else {
                "Running"
            };
            (
                vec!["Name", "Status", "Completions", "Age"],
                vec![
                    name,
                    status.into(),
                    format!(
                        "{}/{}",
                        n(&st["succeeded"]),
                        sp["completions"].as_u64().unwrap_or(1)
                    ),
                    a,
                ],
            )
        }
        ("", "nodes") => (
            vec!["Name", "Status", "Roles", "Age", "Version"],
            vec![
                name,
                if cond(o, "Ready") {
                    "Ready"
                } else {
                    "NotReady"
                }
                .into(),
                "<none>".into(),
                a,
                s(&st["nodeInfo"]["kubeletVersion"]),
            ],
        ),
        ("", "namespaces") => (
            vec!["Name", "Status", "Age"],
            vec![name, s(&st["phase"]), a],
        ),
        ("", "services") => {
            let ports: Vec<String> = sp["ports"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|p| {
                    format!(
                        "{}/{}",
                        s(&p["port"]),
                        p["protocol"].as_str().unwrap_or("TCP")
                    )
                })
                .collect();
            let external = st["loadBalancer"]["ingress"][0]["hostname"]
                .as_str()
                .map(str::to_owned)
                .unwrap_or_else(|| {
                    if sp["type"] == "LoadBalancer" {
                        "<pending>".into()
                    } else {
                        "<none>".into()
                    }
                });
            (
                vec![
                    "Name",
                    "Type",
                    "Cluster-IP",
                    "External-IP",
                    "Port(s)",
                    "Age",
                ],
                vec![
                    name,
                    s(&sp["type"]),
                    s(&sp["clusterIP"]),
                    external,
                    or_none(ports.join(",")),
                    a,
                ],
            )
        }
        ("", "endpoints") => (
            vec!["Name", "Endpoints", "Age"],
            vec![name, endpoints(o), a],
        ),
        ("", "persistentvolumeclaims") => (
            vec![
                "Name",
                "Status",
                "Volume",
                "Capacity",
                "Access Modes",
                "StorageClass",
                "Age",
            ],
            vec![
                name,
                s(&st["phase"]),
                s(&sp["volumeName"]),
                s(&st["capacity"]["storage"]),
                st["accessModes"]
                    .as_array()
                    .map(|m| m.iter().map(s).collect::<Vec<_>>().join(","))
                    .unwrap_or_default(),
                or_none(s(&sp["storageClassName"])),
                a,
            ],
        ),
        ("", "persistentvolumes") => {
            let claim = &sp["claimRef"];
            (
                vec!["Name", "Capacity", "Status", "Claim", "StorageClass", "Age"],
                vec![
                    name,
                    s(&sp["capacity"]["storage"]),
                    s(&st["phase"]),
                    if claim.is_object() {
                        format!("{}/{}", s(&claim["namespace"]), s(&claim["name"]))
                    } else {
                        String::new()
                    },
                    s(&sp["storageClassName"]),
                    a,
                ],
            )
        }
        _ => (vec!["Name", "Age"], vec![name, a]),
    }
}

fn row(res: &Resource, o: &Value, now: f64, printer: &[(String, String)]) -> (Vec<String>, Value) {
    let (names, mut cells) = columns(res, o, now);
    let mut all: Vec<String> = names.iter().map(|s| (*s).to_owned()).collect();
    if !printer.is_empty() {
        // A CRD's printer columns replace the default ones, Age last, as kubectl shows.
        let a = cells.pop().unwrap_or_default();
        all = vec!["Name".into()];
        cells.truncate(1);
        for (col, path) in printer {
            if col.eq_ignore_ascii_case("age") {
                continue;
            }
            all.push(col.clone());
            cells.push(s(json_path(o, path)));
        }
        all.push("Age".into());
        cells.push(a);
    }
    let meta = json!({
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": o["metadata"],
    });
    (all, json!({ "cells": cells, "object": meta }))
}

/// The printer columns (name, JSONPath) of a CRD version.
pub fn printer_columns(crd_version: Option<&Value>) -> Vec<(String, String)> {
    crd_version
        .and_then(|v| v["additionalPrinterColumns"].as_array())
        .into_iter()
        .flatten()
        .filter(|c| c["priority"].as_u64().unwrap_or(0) == 0)
        .filter_map(|c| {
            Some((
                c["name"].as_str()?.to_owned(),
                c["jsonPath"].as_str()?.to_owned(),
            ))
        })
        .collect()
}

pub fn table(
    res: &Resource,
    objects: &[&Value],
    now: f64,
    resource_version: &str,
    printer: &[(String, String)],
) -> Value {
    let mut names = None;
    let rows: Vec<Value> = objects
        .iter()
        .map(|o| {
            let (cols, r) = row(res, o, now, printer);
            names.get_or_insert(cols);
            r
        })
        .collect();
    let names = names.unwrap_or_else(|| {
        let (cols, _) = row(res, &json!({ "metadata": {} }), now, printer);
        cols
    });
    let defs: Vec<Value> = names
        .iter()
        .map(|c| {
            json!({ "name": c, "type": "string", "format": if c == "Name" { "name" } else { "" },
                    "description": c, "priority": 0 })
        })
        .collect();
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": { "resourceVersion": resource_version },
        "columnDefinitions": defs,
        "rows": rows,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_read_like_kubectl() {
        assert_eq!(age(5.0), "5s");
        assert_eq!(age(600.0), "10m");
        assert_eq!(age(3.0 * 3600.0), "3h");
        assert_eq!(age(3.0 * 86_400.0), "3d");
    }

    #[test]
    fn printer_columns_follow_json_paths() {
        let o = json!({"status": {"jobStatus": "RUNNING", "list": [{"x": 1}]}});
        assert_eq!(json_path(&o, ".status.jobStatus"), "RUNNING");
        assert_eq!(json_path(&o, ".status.list[0].x"), 1);
    }

    #[test]
    fn endpoints_print_their_first_ready_addresses() {
        let addresses: Vec<Value> = (1..=5)
            .map(|i| json!({"ip": format!("10.0.0.{i}")}))
            .collect();
        let eps = json!({"subsets": [{"addresses": addresses, "notReadyAddresses": [{"ip": "10.0.0.9"}],
            "ports": [{"port": 8000}]}]});
        assert_eq!(
            endpoints(&eps),
            "10.0.0.1:8000,10.0.0.2:8000,10.0.0.3:8000 + 2 more..."
        );
        assert_eq!(
            endpoints(&json!({"subsets": [{"notReadyAddresses": [{"ip": "10.0.0.9"}]}]})),
            ""
        );
        assert_eq!(endpoints(&json!({})), "<none>");
    }
}
