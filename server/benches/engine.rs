//! Benchmark of the operations engine's own overhead (not a test): `import_cluster`
//! operations against moto + hypd-sim, on SQLite and on PostgreSQL.
//!
//! - sequential: operations one at a time on an idle engine; the engine's overhead per
//!   operation is its stored lifetime minus the time its steps spent in provider calls,
//!   and the store time per transition comes from hypd's own
//!   `hypd_operation_transition_seconds` histogram.
//! - concurrent: 1,000 operations submitted at once, timed until all have succeeded.
//!
//! Run: `cargo bench -p server --bench engine` (after `cargo build -p sim --bins`; needs
//! moto and PostgreSQL as `scripts/setup --tests` installs them). `HYPD_BENCH_OPS` sets
//! the concurrent count.

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use common::{Hypd, Postgres, World};
use reqwest::Method;
use serde_json::json;

const TIME_SCALE: f64 = 100_000.0;

fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && !l.starts_with('#'))
        .filter_map(|l| {
            let rest = &l[name.len()..];
            // `name{labels} value` or `name value`, and not a longer metric name.
            (rest.starts_with('{') || rest.starts_with(' '))
                .then(|| l.rsplit(' ').next()?.parse::<f64>().ok())
                .flatten()
        })
        .sum()
}

/// The smallest bucket bound holding `q` of the observations.
fn quantile(text: &str, name: &str, q: f64) -> f64 {
    let bucket = format!("{name}_bucket");
    let mut buckets: Vec<(f64, f64)> = text
        .lines()
        .filter(|l| l.starts_with(&bucket))
        .filter_map(|l| {
            let le = l.split("le=\"").nth(1)?.split('"').next()?;
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            Some((le, l.rsplit(' ').next()?.parse().ok()?))
        })
        .collect();
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    let total = buckets.last().map_or(0.0, |b| b.1);
    buckets
        .iter()
        .find(|(_, n)| *n >= q * total)
        .map_or(f64::NAN, |b| b.0)
}

fn metrics(hypd: &Hypd) -> String {
    hypd.get("/metrics").text().unwrap()
}

fn create_clusters(world: &World, prefix: &str, n: usize) -> Vec<String> {
    let names: Vec<String> = (0..n).map(|i| format!("{prefix}-{i}")).collect();
    std::thread::scope(|s| {
        for chunk in names.chunks(n.div_ceil(8).max(1)) {
            s.spawn(move || {
                for name in chunk {
                    let (status, body) = world.sim.call(
                        Method::POST,
                        "/clusters",
                        Some(json!({
                            "name": name,
                            "roleArn": "arn:aws:iam::123456789012:role/eks-cluster",
                            "resourcesVpcConfig": { "subnetIds": ["subnet-0a", "subnet-0b"] },
                            "accessConfig": { "authenticationMode": "API" },
                        })),
                    );
                    assert_eq!(status, 200, "{body}");
                }
            });
        }
    });
    names
}

fn import(hypd: &Hypd, token: &str, name: &str) -> String {
    let (status, body) = hypd.call(
        token,
        Method::POST,
        "/api/v1/clusters/import",
        Some(json!({ "name": name })),
    );
    assert_eq!(status, 200, "{body}");
    body["operation_id"].as_str().unwrap().to_owned()
}

fn succeeded(hypd: &Hypd) -> f64 {
    let text = metrics(hypd);
    text.lines()
        .find(|l| l.starts_with("hypd_operations{state=\"succeeded\"}"))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0.0)
}

fn run(backend: &str, database_url: Option<&str>, sequential: usize, concurrent: usize) {
    let world = World::start(TIME_SCALE);
    let mut extra = vec![("HYPD_LOG", "warn")];
    if let Some(url) = database_url {
        extra.push(("HYPD_DATABASE_URL", url));
    }
    let hypd = world.hypd(None, &extra);
    let token = hypd.admin_token();

    // Sequential: the engine's overhead around each step.
    let names = create_clusters(&world, "seq", sequential);
    let before = metrics(&hypd);
    let mut lifetimes = Vec::new();
    for name in &names {
        let id = import(&hypd, &token, name);
        let (_, wait) = hypd.call(
            &token,
            Method::GET,
            &format!("/api/v1/operations/{id}/wait?timeout_seconds=60"),
            None,
        );
        let op = &wait["operation"];
        assert_eq!(op["state"], "succeeded", "{op}");
        let created = hypd::clock::parse_time(op["created_at"].as_str().unwrap()).unwrap();
        let updated = hypd::clock::parse_time(op["updated_at"].as_str().unwrap()).unwrap();
        lifetimes.push(updated.duration_since(created).unwrap().as_secs_f64());
    }
    let after = metrics(&hypd);
    let delta = |name: &str| metric(&after, name) - metric(&before, name);
    let steps = delta("hypd_operation_step_seconds_sum");
    let transitions = delta("hypd_operation_transition_seconds_count");
    let transition_time = delta("hypd_operation_transition_seconds_sum");
    let lifetime: f64 = lifetimes.iter().sum();
    let n = sequential as f64;
    println!("== {backend}: {sequential} operations one at a time (4 stages each)");
    println!(
        "   operation lifetime       mean {:7.2} ms",
        lifetime / n * 1e3
    );
    println!(
        "   in provider calls        mean {:7.2} ms",
        steps / n * 1e3
    );
    println!(
        "   engine overhead          mean {:7.2} ms per operation, {:.2} ms per transition ({} transitions)",
        (lifetime - steps) / n * 1e3,
        (lifetime - steps) / transitions * 1e3,
        transitions
    );
    println!(
        "   store write/transition   mean {:7.3} ms, p50 <= {} ms, p99 <= {} ms",
        transition_time / transitions * 1e3,
        quantile(&after, "hypd_operation_transition_seconds", 0.5) * 1e3,
        quantile(&after, "hypd_operation_transition_seconds", 0.99) * 1e3,
    );

    // Concurrent: many operations progressing at once.
    let names = create_clusters(&world, "many", concurrent);
    let base = succeeded(&hypd);
    let start = Instant::now();
    let mut submit: Vec<f64> = std::thread::scope(|s| {
        let handles: Vec<_> = names
            .chunks(concurrent.div_ceil(16).max(1))
            .map(|chunk| {
                let (hypd, token) = (&hypd, &token);
                s.spawn(move || {
                    chunk
                        .iter()
                        .map(|name| {
                            let t = Instant::now();
                            import(hypd, token, name);
                            t.elapsed().as_secs_f64()
                        })
                        .collect::<Vec<f64>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    let submitted = start.elapsed();
    while succeeded(&hypd) < base + concurrent as f64 {
        assert!(
            start.elapsed() < Duration::from_secs(600),
            "operations did not finish"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let total = start.elapsed();
    submit.sort_by(f64::total_cmp);
    let pct = |q: f64| submit[((submit.len() as f64 - 1.0) * q) as usize] * 1e3;
    let rss = std::fs::read_to_string(format!("/proc/{}/status", hypd.child.id()))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM"))
                .map(|l| l.split_whitespace().nth(1).unwrap_or("?").to_owned())
        })
        .unwrap_or_default();
    println!("== {backend}: {concurrent} operations at once (16 submitting clients)");
    println!(
        "   submit (plan + store)    p50 {:.1} ms, p99 {:.1} ms; all submitted in {:.2} s",
        pct(0.5),
        pct(0.99),
        submitted.as_secs_f64()
    );
    println!(
        "   all succeeded after      {:.2} s ({:.0} operations/s, {:.0} stage transitions/s); hypd peak RSS {rss} kB",
        total.as_secs_f64(),
        concurrent as f64 / total.as_secs_f64(),
        concurrent as f64 * 9.0 / total.as_secs_f64()
    );
}

fn main() {
    // `cargo bench` passes `--bench`; under `cargo test` a smoke-sized pass keeps the
    // bench compiling and working without spending CI minutes on figures nobody reads.
    let full = std::env::args().any(|a| a == "--bench");
    let (sequential, default_concurrent) = if full { (50, 1000) } else { (3, 20) };
    let concurrent = std::env::var("HYPD_BENCH_OPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default_concurrent);
    run("sqlite", None, sequential, concurrent);
    let pg = Postgres::start();
    run("postgres", Some(&pg.url), sequential, concurrent);
}
