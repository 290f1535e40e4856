//! Benchmark (not a test) of `create_cluster`'s orchestration overhead: the time the
//! nine stages take when the providers take none. The sim runs with a time scale so
//! large that EKS's ten minutes and HyperPod's fifteen pass in milliseconds, so what is
//! left of the wall time is hypd's: its calls to moto and the sim, its polling latency
//! (a waiting stage is looked at again after at least a second), and the engine's own
//! store transitions.
//!
//! Run: `cargo bench -p server --bench cluster_create` (after `cargo build -p sim --bins`;
//! needs moto as `scripts/setup --tests` installs it). `HYPD_BENCH_CREATES` sets how many
//! clusters are created one after another (default 5; 1 under `cargo test`).

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::Instant;

use common::World;
use reqwest::Method;
use serde_json::{Value, json};

/// Simulated seconds per real second: a 25-minute creation's provider waits take ~2 ms.
const TIME_SCALE: f64 = 1_000_000.0;

fn seconds_between(a: &Value, b: &Value) -> f64 {
    let parse = |v: &Value| hypd::clock::parse_time(v.as_str().unwrap()).unwrap();
    parse(b)
        .duration_since(parse(a))
        .map_or(0.0, |d| d.as_secs_f64())
}

fn metric_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && !l.starts_with('#'))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let creates: usize = std::env::var("HYPD_BENCH_CREATES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if full { 5 } else { 1 });
    let world = World::start_checked(TIME_SCALE);
    let hypd = world.hypd(None, &[("HYPD_LOG", "warn")]);
    let token = hypd.admin_token();
    // Every cluster keeps its two instances: lift the cluster-usage quota above them all.
    let quota = u32::try_from(creates * 2).unwrap_or(u32::MAX);
    let (status, _) = world.sim.call(
        Method::PUT,
        "/_sim/sagemaker/quotas",
        Some(json!({ "ml.g5.8xlarge": quota })),
    );
    assert!(status < 300);
    let mut per_stage: std::collections::BTreeMap<String, Vec<f64>> = Default::default();
    let mut totals = Vec::new();
    let mut in_calls = Vec::new();
    for i in 0..creates {
        let before = hypd.get("/metrics").text().unwrap();
        let start = Instant::now();
        let (status, started) = hypd.call(
            &token,
            Method::POST,
            "/api/v1/clusters",
            Some(json!({
                "name": format!("bench-{i}"),
                "availability_zone": "us-east-1a",
                "instance_groups": [{"name": "gpu", "instance_type": "ml.g5.8xlarge", "instance_count": 2}],
            })),
        );
        assert_eq!(status, 200, "{started}");
        let id = started["operation_id"].as_str().unwrap();
        let op = hypd.finish(&token, id);
        let total = start.elapsed().as_secs_f64();
        assert_eq!(op["state"], "succeeded", "{op:#}");
        let after = hypd.get("/metrics").text().unwrap();
        in_calls.push(
            metric_sum(&after, "hypd_operation_step_seconds_sum")
                - metric_sum(&before, "hypd_operation_step_seconds_sum"),
        );
        totals.push(total);
        for s in op["stages"].as_array().unwrap() {
            per_stage
                .entry(s["name"].as_str().unwrap().to_owned())
                .or_default()
                .push(seconds_between(&s["started_at"], &s["finished_at"]));
        }
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    println!(
        "== create_cluster, {creates} clusters one after another, provider waits ~0 (time scale {TIME_SCALE})"
    );
    println!(
        "   wall time, request to succeeded   mean {:6.2} s  (min {:.2}, max {:.2})",
        mean(&totals),
        totals.iter().copied().fold(f64::INFINITY, f64::min),
        totals.iter().copied().fold(0.0, f64::max)
    );
    println!(
        "   of which in calls to moto/sim     mean {:6.2} s",
        mean(&in_calls)
    );
    println!(
        "   of which polling and engine       mean {:6.2} s",
        mean(&totals) - mean(&in_calls)
    );
    println!("   per stage (started → finished, mean):");
    for (stage, secs) in &per_stage {
        println!("     {stage:<11} {:6.2} s", mean(secs));
    }
}
