//! Benchmark (not a test) of live-log fan-out: lines per second hypd delivers over its
//! log WebSocket to 100 viewers of one pod's stream, and to 100 viewers spread over ten
//! pods' streams; and hypd's resident memory while a viewer that never reads stays
//! attached to a fast stream. The sim writes each pod's log as fast as its follow
//! serves it (a line every 10 simulated ms, some 20,000 lines a second), so what is
//! measured is hypd's: one upstream read per stream, each line rendered once, batches
//! written to every viewer.
//!
//! Run: `HYPD_SIM_BIN=$CARGO_TARGET_DIR/debug/hypd-sim cargo bench -p server --bench
//! log_fanout` (after `cargo build -p sim --bins`; a release build has no sim of its own
//! unless `cargo build --release -p sim`; needs moto as `scripts/setup --tests` installs
//! it). Under `cargo test` it runs a smoke-sized pass (2 viewers, a second each) and
//! measures nothing.

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use reqwest::Method;
use serde_json::json;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

const TIME_SCALE: f64 = 1000.0;

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
        .unwrap_or(0)
}

fn request(url: &str, token: &str) -> tokio_tungstenite::tungstenite::handshake::client::Request {
    let mut r = url.into_client_request().unwrap();
    r.headers_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    r
}

/// Lines `viewers` clients receive in `secs`, each on the stream of pod
/// `pods[i % pods.len()]`; counted by their numbers, not parsed.
async fn delivered(
    base: &str,
    token: &str,
    pods: &[String],
    viewers: usize,
    secs: f64,
) -> (u64, f64) {
    let mut sockets = Vec::new();
    for i in 0..viewers {
        let url = format!("{base}?tail_lines=0&pod={}", pods[i % pods.len()]);
        let (ws, _) = tokio_tungstenite::connect_async(request(&url, token))
            .await
            .unwrap();
        sockets.push(ws);
    }
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(secs);
    let counts = sockets.into_iter().map(|mut ws| {
        tokio::spawn(async move {
            let mut n = 0u64;
            while let Ok(Some(Ok(msg))) = tokio::time::timeout_at(deadline.into(), ws.next()).await
            {
                if let Message::Text(t) = msg {
                    n += t.matches("\"seq\":").count() as u64;
                }
            }
            n
        })
    });
    let total: u64 = futures_util::future::join_all(counts)
        .await
        .into_iter()
        .map(|n| n.unwrap())
        .sum();
    (total, start.elapsed().as_secs_f64())
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let (viewers, secs, pods_n) = if full { (100, 10.0, 10) } else { (2, 1.0, 2) };
    let world = common::World::start_checked(TIME_SCALE);
    let hypd = world.hypd(None, &[("HYPD_LOG", "warn")]);
    let token = hypd.admin_token();
    let name = "bench-logs";
    let (status, _) = world.sim.call(
        Method::PUT,
        "/_sim/sagemaker/quotas",
        Some(json!({ "ml.g5.8xlarge": pods_n })),
    );
    assert!(status < 300);
    let mut body = common::cluster::small(name);
    body["instance_groups"][0]["instance_count"] = json!(pods_n);
    common::cluster::created(&hypd, &token, body);
    let call = |method: Method, path: &str, body: Option<serde_json::Value>| {
        let (status, out) = hypd.call(&token, method, path, body);
        assert!(status < 300, "{path}: {out}");
        out
    };
    let op = call(
        Method::POST,
        &format!("/api/v1/clusters/{name}/features"),
        Some(json!({"training_operator": true})),
    );
    assert_eq!(
        hypd.finish(&token, op["operation_id"].as_str().unwrap())["state"],
        "succeeded"
    );
    call(
        Method::POST,
        &format!("/api/v1/clusters/{name}/storage/shared-s3/files"),
        Some(json!({"key": "train.py", "content_base64": "cHJpbnQoMSkK"})),
    );
    let op = call(
        Method::POST,
        &format!("/api/v1/clusters/{name}/training-jobs"),
        Some(
            json!({"job": "fan", "nodes": pods_n, "recipe": {"kind": "pytorch", "script": "/s3/train.py"}}),
        ),
    );
    assert_eq!(
        hypd.finish(&token, op["operation_id"].as_str().unwrap())["state"],
        "succeeded"
    );
    let job = call(
        Method::GET,
        &format!("/api/v1/clusters/{name}/training-jobs/fan"),
        None,
    );
    let pods: Vec<String> = job["pods"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["pod"].as_str().unwrap().to_owned())
        .collect();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let client = common::cluster::kube_client(&world, name).await;
        let api = kube::Api::<k8s_openapi::api::core::v1::Pod>::namespaced(client, "default");
        for p in &pods {
            let patch =
                json!({"metadata": {"annotations": {"sim.hypd.dev/log-interval-seconds": "0.01"}}});
            api.patch(
                p,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(patch),
            )
            .await
            .unwrap();
        }
    });
    let base = format!(
        "{}/api/v1/clusters/{name}/training-jobs/fan/logs/stream",
        hypd.url.replace("http://", "ws://")
    );
    let pid = hypd.child.id();
    rt.block_on(async {
        let (n, took) = delivered(&base, &token, &pods[..1], viewers, secs).await;
        println!("== log fan-out, {viewers} viewers of 1 stream: {n} lines in {took:.1} s = {:.0} lines/s delivered", n as f64 / took);
        let (n, took) = delivered(&base, &token, &pods, viewers, secs).await;
        println!(
            "== log fan-out, {viewers} viewers over {} streams: {n} lines in {took:.1} s = {:.0} lines/s delivered",
            pods.len(),
            n as f64 / took
        );
        // A viewer that never reads, on a stream that keeps writing.
        let before = rss_kib(pid);
        let url = format!("{base}?tail_lines=0&pod={}", pods[0]);
        let (slow, _) = tokio_tungstenite::connect_async(request(&url, &token)).await.unwrap();
        let mut peak = before;
        let watch = Instant::now();
        while watch.elapsed().as_secs_f64() < secs * 2.0 {
            tokio::time::sleep(Duration::from_millis(250)).await;
            peak = peak.max(rss_kib(pid));
        }
        println!(
            "== a viewer that never reads, {:.0} s: hypd VmRSS {before} kB before, peak {peak} kB (+{} kB)",
            secs * 2.0,
            peak.saturating_sub(before)
        );
        drop(slow);
    });
}
