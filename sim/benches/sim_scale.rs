//! How hypd-sim scales with clusters, through its APIs as tests drive it: each cluster
//! is an EKS cluster (API mode) with the vpc-cni, kube-proxy and coredns add-ons and an
//! InService HyperPod cluster of two ml.g5.8xlarge nodes, waited for until Kubernetes
//! shows both Nodes Ready and every kube-system pod Running.
//!
//! `idle N`: N such clusters, then the sim's CPU (utime + stime from `/proc/<pid>/stat`)
//! over 30 s of nothing happening, as a share of one core. `busy N`: the wall time of N
//! clusters made at once, each timed from CreateCluster to its Ready Nodes. `--moto`
//! puts moto behind the sim (`--moto-url`); `--idle-first M` makes M idle clusters before
//! a busy run. The sim binary is `HYPD_SIM_BIN` if set (to compare builds), else the one
//! cargo built. Without `--bench` (under `cargo test`) it runs a smoke-sized pass and
//! measures nothing. `scripts/bench-sim` runs it.

#[path = "../tests/world/support.rs"]
mod support;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams};

/// Simulated seconds per real second, as the server's tests run the sim.
const TIME_SCALE: f64 = 600.0;
const ADDONS: &[&str] = &["vpc-cni", "kube-proxy", "coredns"];
/// Real time a cluster may take to become ready before the run is called stuck.
const PATIENCE: Duration = Duration::from_secs(600);

struct Args {
    mode: String,
    count: usize,
    moto: bool,
    idle_first: usize,
    seconds: u64,
}

fn args() -> Option<Args> {
    let all: Vec<String> = std::env::args().skip(1).collect();
    if !all.iter().any(|a| a == "--bench") {
        return None;
    }
    let words: Vec<&String> = all.iter().filter(|a| !a.starts_with("--")).collect();
    let value = |flag: &str| -> Option<u64> {
        all.iter()
            .position(|a| a == flag)
            .and_then(|i| all.get(i + 1))
            .and_then(|v| v.parse().ok())
    };
    Some(Args {
        mode: words.first().map_or("idle".to_owned(), |w| (*w).clone()),
        count: words.get(1).and_then(|n| n.parse().ok()).unwrap_or(50),
        moto: all.iter().any(|a| a == "--moto"),
        idle_first: value("--idle-first").unwrap_or(0) as usize,
        seconds: value("--seconds").unwrap_or(30),
    })
}

/// hypd-sim at [`TIME_SCALE`], behind which moto is or is not.
fn start_sim(moto_url: Option<&str>) -> (support::Proc, String) {
    use std::io::{BufRead, BufReader};
    let bin =
        std::env::var("HYPD_SIM_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_hypd-sim").into());
    let mut cmd = Command::new(bin);
    cmd.args([
        "--listen",
        "127.0.0.1:0",
        "--time-scale",
        &TIME_SCALE.to_string(),
    ]);
    if let Some(m) = moto_url {
        cmd.args(["--moto-url", m]);
    }
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let url = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap()
        .to_owned();
    (support::Proc::new(child), url)
}

/// Room for every cluster's nodes (the default quota is 8 instances of the type).
async fn raise_quota(sim_url: &str) {
    support::control(
        sim_url,
        reqwest::Method::PUT,
        "/_sim/sagemaker/quotas",
        serde_json::json!({ "ml.g5.8xlarge": 100_000 }),
    )
    .await;
}

/// utime + stime of `pid`, in seconds.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // The command name is in parentheses and may hold spaces: count fields after it.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // Fields 14 and 15 of stat(5) are the 12th and 13th after the name.
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    ticks as f64 / clock_ticks()
}

fn clock_ticks() -> f64 {
    let out = Command::new("getconf").arg("CLK_TCK").output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or(100.0)
}

fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

async fn poll<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    while !check().await {
        assert!(start.elapsed() < PATIENCE, "stuck waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One cluster as described at the top, from nothing to Ready Nodes; how long it took.
async fn ready_cluster(sim_url: &str, net: &support::Network, name: &str) -> Duration {
    use aws_sdk_eks::types::{AddonStatus, AuthenticationMode, ClusterStatus};
    let start = Instant::now();
    let config = support::sdk_config(sim_url).await;
    let eks = aws_sdk_eks::Client::new(&config);
    support::create_eks_cluster(&eks, net, name, AuthenticationMode::Api).await;
    poll(&format!("{name} ACTIVE"), || async {
        eks.describe_cluster()
            .name(name)
            .send()
            .await
            .ok()
            .and_then(|c| c.cluster?.status)
            == Some(ClusterStatus::Active)
    })
    .await;
    for addon in ADDONS {
        eks.create_addon()
            .cluster_name(name)
            .addon_name(*addon)
            .send()
            .await
            .unwrap();
    }
    support::create_hyperpod(sim_url, net, name, name, "ml.g5.8xlarge", 2).await;
    let sm = aws_sdk_sagemaker::Client::new(&config);
    support::hyperpod_ready_within(&sm, name, PATIENCE).await;
    poll(&format!("{name}'s add-ons ACTIVE"), || async {
        let mut active = 0;
        for addon in ADDONS {
            let a = eks
                .describe_addon()
                .cluster_name(name)
                .addon_name(*addon)
                .send()
                .await;
            if a.ok().and_then(|a| a.addon?.status) == Some(AddonStatus::Active) {
                active += 1;
            }
        }
        active == ADDONS.len()
    })
    .await;
    let c = support::eks_cluster(&eks, name).await;
    let ca = {
        use base64::Engine;
        let data = c.certificate_authority.unwrap().data.unwrap();
        String::from_utf8(
            base64::engine::general_purpose::STANDARD
                .decode(data)
                .unwrap(),
        )
        .unwrap()
    };
    let client = support::kube_client(&c.endpoint.unwrap(), &ca, &support::eks_token(name));
    let nodes: Api<Node> = Api::all(client.clone());
    let pods: Api<Pod> = Api::namespaced(client, "kube-system");
    poll(
        &format!("{name}'s Nodes Ready and kube-system pods Running"),
        || async {
            let Ok(nodes) = nodes.list(&ListParams::default()).await else {
                return false;
            };
            let ready = nodes
                .items
                .iter()
                .filter(|n| {
                    n.status
                        .as_ref()
                        .and_then(|s| s.conditions.as_ref())
                        .is_some_and(|cs| {
                            cs.iter().any(|c| c.type_ == "Ready" && c.status == "True")
                        })
                })
                .count();
            let Ok(pods) = pods.list(&ListParams::default()).await else {
                return false;
            };
            // Two DaemonSets' pods per node and coredns's two replicas.
            ready == 2
                && pods.items.len() == 2 * 2 + 2
                && pods
                    .items
                    .iter()
                    .all(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        },
    )
    .await;
    start.elapsed()
}

/// `count` clusters named `<prefix>-<i>`, `at_once` at a time; each one's time.
async fn clusters(
    sim_url: &str,
    net: &support::Network,
    prefix: &str,
    count: usize,
    at_once: usize,
) -> Vec<Duration> {
    futures::stream::iter(0..count)
        .map(|i| async move { ready_cluster(sim_url, net, &format!("{prefix}-{i}")).await })
        .buffer_unordered(at_once)
        .collect()
        .await
}

fn summary(times: &mut [Duration]) -> String {
    times.sort();
    let secs = |d: Duration| d.as_secs_f64();
    format!(
        "per cluster: min {:.2} s, median {:.2} s, max {:.2} s",
        secs(times[0]),
        secs(times[times.len() / 2]),
        secs(times[times.len() - 1])
    )
}

#[tokio::main]
async fn main() {
    let Some(args) = args() else {
        // Smoke pass under `cargo test`: two clusters at once, nothing measured.
        let (_sim, sim_url) = start_sim(None);
        raise_quota(&sim_url).await;
        let times = clusters(&sim_url, &support::Network::unchecked(), "smoke", 2, 2).await;
        assert_eq!(times.len(), 2);
        return;
    };
    let (_moto, moto_url) = if args.moto {
        let (p, url) = support::moto();
        (Some(p), Some(url))
    } else {
        (None, None)
    };
    let net = match &moto_url {
        Some(m) => support::network(m).await,
        None => support::Network::unchecked(),
    };
    let (sim, sim_url) = start_sim(moto_url.as_deref());
    raise_quota(&sim_url).await;
    let pid = sim.pid();
    let with = if args.moto {
        "with moto"
    } else {
        "without moto"
    };
    match args.mode.as_str() {
        "idle" => {
            let start = Instant::now();
            let mut times = clusters(&sim_url, &net, "idle", args.count, 8).await;
            println!(
                "{} clusters ready in {:.1} s (8 at a time, {with}); {}",
                args.count,
                start.elapsed().as_secs_f64(),
                summary(&mut times)
            );
            // Every transition of the last cluster is over by now (its nodes booted,
            // its pods run): what follows is an idle world.
            tokio::time::sleep(Duration::from_secs(5)).await;
            let (cpu0, t0, load0) = (cpu_seconds(pid), Instant::now(), load());
            tokio::time::sleep(Duration::from_secs(args.seconds)).await;
            let (cpu1, wall) = (cpu_seconds(pid), t0.elapsed().as_secs_f64());
            println!(
                "idle: {:.2} s of CPU in {wall:.1} s = {:.2} % of one core ({} clusters, {with}); load before {load0}, after {}",
                cpu1 - cpu0,
                100.0 * (cpu1 - cpu0) / wall,
                args.count,
                load()
            );
        }
        "busy" => {
            if args.idle_first > 0 {
                clusters(&sim_url, &net, "idle", args.idle_first, 8).await;
                println!("{} idle clusters made first", args.idle_first);
            }
            let (cpu0, load0) = (cpu_seconds(pid), load());
            let start = Instant::now();
            let mut times = clusters(&sim_url, &net, "busy", args.count, args.count).await;
            let wall = start.elapsed().as_secs_f64();
            println!(
                "busy: {} clusters at once ready in {wall:.2} s, sim CPU {:.2} s ({with}); {}; load before {load0}, after {}",
                args.count,
                cpu_seconds(pid) - cpu0,
                summary(&mut times),
                load()
            );
        }
        other => panic!("unknown mode {other}: idle N or busy N"),
    }
}
