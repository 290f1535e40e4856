//! Everything that runs operations against a real world (moto + hypd-sim, PostgreSQL)
//! with `hypd` as a process, in one test binary: each integration-test binary links the
//! whole server, and on two cores one link instead of five is minutes per build.
//! `harness` drives every pipeline through a fault, a crash and a lost answer in each
//! stage; the other modules test one pipeline (`groups`: instance groups after creation)
//! or the engine in depth.

#[path = "../common/mod.rs"]
mod common;

mod create;
mod describe;
mod engine;
mod features;
mod groups;
mod harness;
mod inference;
mod models;
mod nodes;
mod sandbox;
mod storage;
mod training;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::{Hypd, World};
use reqwest::Method;
use serde_json::{Value, json};

/// 600 simulated seconds per real second: EKS's ~10-minute creation takes ~1 s.
pub const FAST: f64 = 600.0;

/// Creates an EKS cluster in the sim and waits until it is ACTIVE.
pub fn create_eks(world: &World, name: &str) {
    start_eks(world, name);
    wait_until("EKS ACTIVE", Duration::from_secs(30), || {
        eks_status(world, name) == "ACTIVE"
    });
}

/// Starts creating an EKS cluster in the sim (it is CREATING for a moment).
pub fn start_eks(world: &World, name: &str) {
    let (status, body) = world.sim.call(
        Method::POST,
        "/clusters",
        Some(json!({
            "name": name,
            "roleArn": "arn:aws:iam::123456789012:role/eks-cluster",
            "resourcesVpcConfig": { "subnetIds": ["subnet-0a", "subnet-0b"] },
            "accessConfig": { "authenticationMode": "API_AND_CONFIG_MAP" },
        })),
    );
    assert_eq!(status, 200, "{body}");
}

pub fn eks_status(world: &World, name: &str) -> String {
    // A read settles the sim's transitions; a stuck fault holds them.
    let (_, body) = world
        .sim
        .call(Method::GET, &format!("/clusters/{name}"), None);
    body["cluster"]["status"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

pub fn wait_until(what: &str, limit: Duration, mut check: impl FnMut() -> bool) {
    let start = Instant::now();
    while !check() {
        assert!(start.elapsed() < limit, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

pub fn access_entries(world: &World, cluster: &str) -> Vec<String> {
    let (_, body) = world.sim.call(
        Method::GET,
        &format!("/clusters/{cluster}/access-entries"),
        None,
    );
    body["accessEntries"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

pub fn admin_policies(world: &World, cluster: &str, principal: &str) -> usize {
    let (_, body) = world.sim.call(
        Method::GET,
        &format!(
            "/clusters/{cluster}/access-entries/{}/access-policies",
            principal.replace('/', "%2F").replace(':', "%3A")
        ),
        None,
    );
    body["associatedAccessPolicies"]
        .as_array()
        .map_or(0, Vec::len)
}

pub fn fault(world: &World, fault: Value) -> u64 {
    let (status, body) = world.sim.call(Method::POST, "/_sim/faults", Some(fault));
    assert!(status < 300, "{body}");
    body["id"].as_u64().unwrap()
}

pub fn import(hypd: &Hypd, token: &str, body: Value) -> (u16, Value) {
    hypd.call(token, Method::POST, "/api/v1/clusters/import", Some(body))
}

pub fn get_op(hypd: &Hypd, token: &str, id: &str) -> Value {
    let (status, body) = hypd.call(
        token,
        Method::GET,
        &format!("/api/v1/operations/{id}"),
        None,
    );
    assert_eq!(status, 200, "{body}");
    body
}

pub fn stage<'a>(op: &'a Value, name: &str) -> &'a Value {
    op["stages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == name)
        .unwrap_or_else(|| panic!("no stage {name} in {op}"))
}

pub fn stage_states(op: &Value) -> Vec<(String, String)> {
    op["stages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["name"].as_str().unwrap().to_owned(),
                s["state"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// `(stage, state)` pairs of the engine's recorded transitions, read from the store.
pub fn transitions(store_url_or_path: &str, id: &str) -> Vec<(Option<String>, String)> {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let db = if store_url_or_path.starts_with("postgres://") {
            hypd::config::Database::Postgres(store_url_or_path.to_owned())
        } else {
            hypd::config::Database::Sqlite(store_url_or_path.into())
        };
        let store = hypd::store::Store::open(&db).await.unwrap();
        hypd::operation::events(&store, id)
            .await
            .unwrap()
            .into_iter()
            .map(|e| (e.stage, e.state))
            .collect()
    })
}

pub fn sqlite_path(hypd: &Hypd) -> String {
    hypd.data_dir
        .path()
        .join("hypd.db")
        .to_string_lossy()
        .into_owned()
}

/// How many times each stage started and finished, from the recorded transitions.
pub fn runs_per_stage(events: &[(Option<String>, String)]) -> BTreeMap<(String, String), usize> {
    let mut n = BTreeMap::new();
    for (stage, state) in events {
        if let Some(s) = stage {
            *n.entry((s.clone(), state.clone())).or_default() += 1;
        }
    }
    n
}
