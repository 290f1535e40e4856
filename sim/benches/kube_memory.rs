//! Memory of the Kubernetes API emulator under the two loads that could grow it without
//! bound: a watch over 10,000 objects (plus a watcher that stops reading while 20,000
//! more events happen) and a follow of a 100,000-line pod log. Reports hypd-sim's
//! VmRSS/VmHWM (from /proc) at each step. `cargo bench -p sim --bench kube_memory` runs
//! the full sizes; under `cargo test` (no `--bench` argument) it runs a smoke-sized pass.

#[path = "../tests/world/support.rs"]
mod support;

use std::time::Instant;

use futures::{AsyncBufReadExt, StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{
    Api, ListParams, LogParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use serde_json::json;

fn status_kb(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn report(pid: u32, step: &str) {
    println!(
        "{step:<58} VmRSS {:>7} kB   VmHWM {:>7} kB",
        status_kb(pid, "VmRSS:"),
        status_kb(pid, "VmHWM:")
    );
}

/// `count` merge patches over the `objects` ConfigMaps, 16 at a time; the n-th sets `n`
/// to `value(n)`.
async fn patch_all(
    cms: &Api<ConfigMap>,
    count: usize,
    objects: usize,
    value: impl Fn(usize) -> String,
) {
    futures::stream::iter(0..count)
        .map(|i| {
            let cms = cms.clone();
            let value = value(i);
            async move {
                let name = format!("cm-{:05}", i % objects);
                cms.patch(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({ "data": { "n": value } })),
                )
                .await
                .unwrap();
            }
        })
        .buffer_unordered(16)
        .collect::<Vec<()>>()
        .await;
}

#[tokio::main]
async fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let (objects, extra_events, log_lines) = if full {
        (10_000, 20_000, 100_000)
    } else {
        (200, 300, 2_000)
    };
    let (_moto, moto_url) = support::moto();
    let net = support::network(&moto_url).await;
    let (sim, sim_url) = support::sim(&moto_url, 600.0);
    let pid = sim.pid();
    let eks = support::eks_client(&sim_url).await;
    let (endpoint, ca) = support::active_cluster(&eks, &net, "bench").await;
    let client = support::kube_client(&endpoint, &ca, &support::eks_token("bench"));
    report(pid, "cluster ACTIVE, API server idle");

    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let start = Instant::now();
    futures::stream::iter(0..objects)
        .map(|i| {
            let cms = cms.clone();
            async move {
                let cm: ConfigMap = serde_json::from_value(json!({
                    "metadata": { "name": format!("cm-{i:05}"), "labels": { "bench": "watch" } },
                    "data": { "payload": "x".repeat(512) },
                }))
                .unwrap();
                cms.create(&PostParams::default(), &cm).await.unwrap();
            }
        })
        .buffer_unordered(16)
        .collect::<Vec<()>>()
        .await;
    report(
        pid,
        &format!("{objects} ConfigMaps stored ({:.1?})", start.elapsed()),
    );

    let start = Instant::now();
    let mut stream = cms
        .watch(&WatchParams::default().labels("bench=watch"), "0")
        .await
        .unwrap()
        .boxed();
    let mut added = 0;
    while added < objects {
        if let WatchEvent::Added(_) = stream.try_next().await.unwrap().unwrap() {
            added += 1;
        }
    }
    report(
        pid,
        &format!(
            "watch from 0 delivered {added} ADDED events ({:.1?})",
            start.elapsed()
        ),
    );

    // A watcher that stops reading while many events happen must be dropped, not buffered.
    let rv = cms
        .list(&ListParams::default().limit(1))
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let mut stalled = cms
        .watch(&WatchParams::default(), &rv)
        .await
        .unwrap()
        .boxed();
    let start = Instant::now();
    patch_all(&cms, extra_events, objects, |i| i.to_string()).await;
    report(
        pid,
        &format!(
            "{extra_events} updates with a stalled watcher ({:.1?})",
            start.elapsed()
        ),
    );
    let mut outcome = "stream ended".to_owned();
    let mut delivered = 0;
    loop {
        match stalled.try_next().await {
            Ok(Some(WatchEvent::Error(e))) => {
                outcome = format!("{} {} after {delivered} events", e.code, e.reason);
                break;
            }
            Ok(Some(WatchEvent::Modified(_))) => {
                delivered += 1;
                if delivered == extra_events {
                    outcome = format!("kept up: all {delivered} events delivered");
                    break;
                }
            }
            Ok(Some(_)) => {}
            Ok(None) => break,
            Err(e) => {
                outcome = format!("error {e} after {delivered} events");
                break;
            }
        }
    }
    drop(stream);
    drop(stalled);
    println!("stalled watcher, once it reads again: {outcome}");
    report(pid, "after the watches");
    // Memory must level off: the same number of updates again, nobody watching.
    patch_all(&cms, extra_events, objects, |i| format!("again-{i}")).await;
    report(pid, &format!("{extra_events} more updates"));

    support::register_node(&client, "cpu-1", "8").await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    pods.create(
        &PostParams::default(),
        &serde_json::from_value(json!({
            "metadata": { "name": "chatty", "annotations": { "sim.hypd.dev/log-interval-seconds": "0.01" } },
            "spec": { "containers": [{ "name": "main", "image": "busybox" }] },
        }))
        .unwrap(),
    )
    .await
    .unwrap();
    support::wait_pod_running(&pods, "chatty").await;
    let start = Instant::now();
    let lp = LogParams {
        follow: true,
        tail_lines: Some(0),
        ..LogParams::default()
    };
    let mut lines = pods.log_stream("chatty", &lp).await.unwrap().lines();
    let mut read = 0;
    let mut peak_during = 0;
    while read < log_lines {
        lines.next().await.unwrap().unwrap();
        read += 1;
        if read % 1_000 == 0 {
            peak_during = peak_during.max(status_kb(pid, "VmRSS:"));
        }
    }
    report(
        pid,
        &format!("followed {read} log lines ({:.1?})", start.elapsed()),
    );
    println!("VmRSS peak sampled during the follow: {peak_during} kB");
}
