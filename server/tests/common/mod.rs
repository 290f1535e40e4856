//! Test peers for integration tests: a real `hypd` process, moto, and a private
//! PostgreSQL cluster. Each is started on loopback on a free port and stopped on drop.
#![allow(dead_code)]

pub mod cluster;

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A free loopback port below the ephemeral range (32768 and up), which is where `bind(0)`
/// and the local ends of outgoing connections take theirs: the test lanes run at once,
/// and a port one lane was handed by `bind(0)` and closed again could be taken by another
/// lane before its server binds it. Chosen at random and checked free.
pub fn free_port() -> u16 {
    use std::hash::{BuildHasher, RandomState};
    loop {
        let r = RandomState::new().hash_one(std::time::Instant::now());
        let port = 10_000 + (r % 22_000) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

pub fn wait_for_port(port: u16, limit: Duration) -> bool {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let start = Instant::now();
    while start.elapsed() < limit {
        if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

/// The `hypd` under test: `HYPD_BIN` when set (as for the browser tests), so a run can pin
/// a build while the shared target dir is rebuilt from another checkout.
pub fn hypd_bin() -> PathBuf {
    std::env::var_os("HYPD_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_hypd")))
}

/// A command for `hypd` with a clean, AWS-free environment.
pub fn hypd_command(data_dir: &Path) -> Command {
    let mut cmd = Command::new(hypd_bin());
    cmd.env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", data_dir)
        .env("HYPD_DATA_DIR", data_dir)
        .env("HYPD_PORT", "0")
        .env("AWS_CONFIG_FILE", "/dev/null")
        .env("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
        .env("AWS_EC2_METADATA_DISABLED", "true");
    for var in ["HYPD_MOTO_SERVER", "HYPD_SIM_BIN", "HYPD_SITE_ROOT"] {
        if let Some(v) = std::env::var_os(var) {
            cmd.env(var, v);
        }
    }
    cmd
}

/// A running `hypd serve`.
pub struct Hypd {
    pub child: Child,
    pub url: String,
    /// Shared so that a restarted process can use the same data dir.
    pub data_dir: std::sync::Arc<tempfile::TempDir>,
    pub stderr_path: PathBuf,
}

impl Hypd {
    /// Starts `hypd serve ARGS` with `envs` and waits for its listening line.
    pub fn start(args: &[&str], envs: &[(&str, &str)]) -> Hypd {
        Hypd::start_in(
            std::sync::Arc::new(tempfile::tempdir().unwrap()),
            args,
            envs,
        )
    }

    /// Starts `hypd serve` on an existing data dir (e.g. after killing the previous one).
    pub fn start_in(
        data_dir: std::sync::Arc<tempfile::TempDir>,
        args: &[&str],
        envs: &[(&str, &str)],
    ) -> Hypd {
        // Each start appends to its own log, so a restart's output is not lost.
        let stderr_path = (0..)
            .map(|i| data_dir.path().join(format!("hypd-{i}.stderr")))
            .find(|p| !p.exists())
            .unwrap();
        let stderr = std::fs::File::create(&stderr_path).unwrap();
        let mut cmd = hypd_command(data_dir.path());
        cmd.arg("serve")
            .args(args)
            .stdout(Stdio::piped())
            .stderr(stderr);
        for (k, v) in envs {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawn hypd");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(url) = line.strip_prefix("hypd listening on ") {
                    let _ = tx.send(url.to_owned());
                }
            }
        });
        let url = match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(url) => url,
            Err(_) => {
                let _ = child.kill();
                panic!(
                    "hypd did not start; stderr:\n{}",
                    std::fs::read_to_string(&stderr_path).unwrap_or_default()
                );
            }
        };
        Hypd {
            child,
            url,
            data_dir,
            stderr_path,
        }
    }

    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }

    /// The first admin token this data dir's hypd wrote.
    pub fn admin_token(&self) -> String {
        std::fs::read_to_string(self.data_dir.path().join("admin-token"))
            .unwrap()
            .trim()
            .to_owned()
    }

    /// Ends the process as a crash would: SIGKILL, no clean-up.
    pub fn kill(mut self) -> std::sync::Arc<tempfile::TempDir> {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.data_dir.clone()
    }

    /// Calls the REST API as `token`; returns the status and the JSON body.
    pub fn call(
        &self,
        token: &str,
        method: reqwest::Method,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> (u16, serde_json::Value) {
        let mut req = reqwest::blocking::Client::new()
            .request(method, format!("{}{path}", self.url))
            .bearer_auth(token)
            .timeout(Duration::from_secs(120));
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().unwrap();
        let status = resp.status().as_u16();
        let text = resp.text().unwrap();
        let json = serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text));
        (status, json)
    }

    /// Runs one SQL statement on the SQLite store (as the engine or an operator would
    /// write it); returns how many rows it changed.
    #[allow(dead_code)]
    pub fn sql(&self, statement: &str) -> usize {
        let db = self.data_dir.path().join("hypd.db");
        let out = std::process::Command::new("python3")
            .args([
                "-c",
                "import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); n=c.execute(sys.argv[2]).rowcount; c.commit(); print(n)",
            ])
            .arg(&db)
            .arg(statement)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
    }

    /// Calls a destructive command as `token` the way a client that has reviewed the
    /// plan does: once for the plan and its confirmation, then again with it.
    #[allow(dead_code)]
    pub fn confirmed(
        &self,
        token: &str,
        method: reqwest::Method,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> (u16, serde_json::Value) {
        let (status, first) = self.call(token, method.clone(), path, body.clone());
        let Some(confirmation) = first.get("confirmation").filter(|_| status == 200) else {
            return (status, first);
        };
        let mut body = body.unwrap_or_else(|| serde_json::json!({}));
        body["confirmation"] = confirmation.clone();
        self.call(token, method, path, Some(body))
    }

    /// Waits (with wait_operation) until operation `id` is final; returns it.
    #[allow(dead_code)]
    pub fn finish(&self, token: &str, id: &str) -> serde_json::Value {
        for _ in 0..20 {
            let (status, body) = self.call(
                token,
                reqwest::Method::GET,
                &format!("/api/v1/operations/{id}/wait?timeout_seconds=60"),
                None,
            );
            assert_eq!(status, 200, "{body}");
            if body["timed_out"] == false {
                return body["operation"].clone();
            }
        }
        panic!("operation {id} did not finish in 20 minutes");
    }

    /// A GET as the data dir's admin (the real store's token, else the sandbox's), so
    /// probes show their details; [`Hypd::get_anonymous`] sends no token.
    pub fn get(&self, path: &str) -> reqwest::blocking::Response {
        let token = ["admin-token", "sandbox/admin-token"]
            .iter()
            .find_map(|f| std::fs::read_to_string(self.data_dir.path().join(f)).ok());
        let mut req = reqwest::blocking::Client::new()
            .get(format!("{}{path}", self.url))
            .timeout(Duration::from_secs(30));
        if let Some(token) = token {
            req = req.bearer_auth(token.trim());
        }
        req.send().unwrap()
    }

    /// `/readyz` once it says ready, or its last answer after 90 s. Ready means AWS (moto)
    /// answered a first call, which a loaded machine can hold past the probe's own 10 s
    /// limit; until then the probe says not ready, which is its job.
    pub fn ready(&self, anonymous: bool) -> reqwest::blocking::Response {
        let get = || {
            if anonymous {
                self.get_anonymous("/readyz")
            } else {
                self.get("/readyz")
            }
        };
        let start = std::time::Instant::now();
        let mut answer = get();
        while answer.status() != 200 && start.elapsed() < Duration::from_secs(90) {
            std::thread::sleep(Duration::from_millis(500));
            answer = get();
        }
        answer
    }

    pub fn get_anonymous(&self, path: &str) -> reqwest::blocking::Response {
        reqwest::blocking::Client::new()
            .get(format!("{}{path}", self.url))
            .timeout(Duration::from_secs(30))
            .send()
            .unwrap()
    }
}

impl Drop for Hypd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A hypd serving against its own moto, with the first admin token it wrote.
pub fn hypd_with_moto() -> (Hypd, String, Moto) {
    let moto = Moto::start();
    let env = moto.aws_env();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let hypd = Hypd::start(&[], &env);
    let token = hypd.admin_token();
    (hypd, token, moto)
}

pub fn moto_server_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("HYPD_MOTO_SERVER") {
        return PathBuf::from(p);
    }
    std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .map(|d| d.join("moto_server"))
        .find(|p| p.is_file())
        .expect("moto_server not on PATH: run scripts/setup and put its virtualenv's bin/ on PATH (scripts/test does)")
}

/// A private moto server.
pub struct Moto {
    child: Child,
    pub url: String,
}

impl Moto {
    pub fn start() -> Moto {
        let port = free_port();
        let child = Command::new(moto_server_bin())
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .env("MOTO_IAM_LOAD_MANAGED_POLICIES", "true")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn moto_server");
        assert!(
            wait_for_port(port, Duration::from_secs(30)),
            "moto did not start"
        );
        Moto {
            child,
            url: format!("http://127.0.0.1:{port}"),
        }
    }

    /// The standard variables that point the AWS SDK at this moto.
    pub fn aws_env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AWS_ENDPOINT_URL", self.url.clone()),
            ("AWS_ACCESS_KEY_ID", "testing".into()),
            ("AWS_SECRET_ACCESS_KEY", "testing".into()),
            ("AWS_REGION", "us-east-1".into()),
        ]
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A private PostgreSQL cluster in a temporary directory (Debian's postgresql package).
pub struct Postgres {
    dir: tempfile::TempDir,
    bin: PathBuf,
    pub url: String,
}

fn pg_bin_dir() -> PathBuf {
    let on_path = std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .find(|d| d.join("initdb").is_file() && d.join("pg_ctl").is_file());
    if let Some(d) = on_path {
        return d;
    }
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .expect("PostgreSQL not installed: run scripts/setup --tests")
        .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
        .filter(|d| d.join("initdb").is_file())
        .collect();
    versions.sort();
    versions
        .pop()
        .expect("no initdb found under /usr/lib/postgresql")
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Runs a PostgreSQL tool as the `postgres` user when we are root (PostgreSQL refuses
/// to run as root).
fn pg_command(bin: &Path, tool: &str) -> Command {
    if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(bin.join(tool));
        c
    } else {
        Command::new(bin.join(tool))
    }
}

impl Postgres {
    pub fn start() -> Postgres {
        let bin = pg_bin_dir();
        let dir = tempfile::Builder::new()
            .prefix("hypd-pg-")
            .tempdir()
            .unwrap();
        let data = dir.path().join("data");
        if is_root() {
            let status = Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(dir.path())
                .status()
                .unwrap();
            assert!(status.success());
        }
        let out = pg_command(&bin, "initdb")
            .args(["-A", "trust", "-U", "hypd", "-D"])
            .arg(&data)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "initdb: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let port = free_port();
        let opts = format!(
            "-p {port} -k {} -c listen_addresses=127.0.0.1 -c fsync=off",
            dir.path().display()
        );
        let out = pg_command(&bin, "pg_ctl")
            .args(["-w", "-D"])
            .arg(&data)
            .args(["-o", &opts, "-l"])
            .arg(dir.path().join("pg.log"))
            .arg("start")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "pg_ctl start: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Postgres {
            url: format!("postgres://hypd@127.0.0.1:{port}/postgres"),
            dir,
            bin,
        }
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let _ = pg_command(&self.bin, "pg_ctl")
            .args(["-D"])
            .arg(self.dir.path().join("data"))
            .args(["-m", "immediate", "stop"])
            .output();
    }
}

pub fn sim_bin() -> PathBuf {
    std::env::var_os("HYPD_SIM_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| hypd_bin().with_file_name("hypd-sim"))
}

/// A private hypd-sim (EKS + SageMaker HyperPod), outliving any hypd it serves.
pub struct Sim {
    child: Child,
    pub url: String,
}

impl Sim {
    /// `time_scale` simulated seconds pass per real second. Without moto the sim does
    /// not check that subnets and roles exist.
    pub fn start(moto_url: Option<&str>, time_scale: f64) -> Sim {
        let mut cmd = Command::new(sim_bin());
        cmd.args(["--listen", "127.0.0.1:0"]);
        if let Some(m) = moto_url {
            cmd.args(["--moto-url", m]);
        }
        let mut child = cmd
            .args(["--time-scale", &time_scale.to_string()])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn hypd-sim (build it with `cargo build -p sim`)");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let url = line
            .trim()
            .strip_prefix("listening on ")
            .expect("hypd-sim's first line names its address")
            .to_owned();
        Sim { child, url }
    }

    /// A JSON request to the sim (its EKS REST API or its `/_sim` control API).
    pub fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> (u16, serde_json::Value) {
        let mut req = reqwest::blocking::Client::new()
            .request(method, format!("{}{path}", self.url))
            .timeout(Duration::from_secs(30));
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().unwrap();
        let status = resp.status().as_u16();
        (status, resp.json().unwrap_or(serde_json::Value::Null))
    }
}

impl Drop for Sim {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// moto + hypd-sim: the AWS a hypd under test talks to, which survives hypd's crashes.
pub struct World {
    pub moto: Moto,
    pub sim: Sim,
}

impl World {
    /// moto serves STS, EC2 and IAM; the sim, not checking names against moto, EKS and
    /// SageMaker.
    pub fn start(time_scale: f64) -> World {
        let moto = Moto::start();
        let sim = Sim::start(None, time_scale);
        World { moto, sim }
    }

    /// As `start`, but the sim asks moto whether the subnets, roles and buckets EKS and
    /// HyperPod are given exist, as AWS would.
    pub fn start_checked(time_scale: f64) -> World {
        let moto = Moto::start();
        let sim = Sim::start(Some(&moto.url), time_scale);
        World { moto, sim }
    }

    /// An AWS SDK configuration for reading moto directly (to count what hypd made).
    pub async fn moto_sdk(&self) -> aws_config::SdkConfig {
        aws_config::defaults(aws_config::BehaviorVersion::latest())
            .endpoint_url(&self.moto.url)
            .region(aws_config::Region::new("us-east-1"))
            .credentials_provider(aws_sdk_sts::config::Credentials::new(
                "testing", "testing", None, None, "test",
            ))
            .load()
            .await
    }

    /// The standard AWS variables that point a hypd at this world, and the worker's
    /// pace for a world whose clock runs fast (hypd's defaults suit AWS's minutes).
    pub fn aws_env(&self) -> Vec<(&'static str, String)> {
        let mut env = self.moto.aws_env();
        env.push(("AWS_ENDPOINT_URL_EKS", self.sim.url.clone()));
        env.push(("AWS_ENDPOINT_URL_SAGEMAKER", self.sim.url.clone()));
        env.push(("AWS_ENDPOINT_URL_SERVICE_QUOTAS", self.sim.url.clone()));
        env.push(("AWS_ENDPOINT_URL_FSX", self.sim.url.clone()));
        env.push(("HYPD_MIN_POLL_INTERVAL", TEST_MIN_POLL.into()));
        // Most of the hundreds of hypd starts in a world never open the create form;
        // each warm-up costs moto about a second of CPU.
        env.push(("HYPD_WARM_CATALOGUE", "false".into()));
        env.push(("HYPD_RETRY_BACKOFF", TEST_RETRY_BACKOFF.into()));
        env
    }

    /// Takes cluster `name` out of the world once a test is done with it, so the
    /// world's cost stays that of the clusters in use: the sim forgets the EKS cluster
    /// (with its HyperPod clusters and API server), and moto's EC2 objects of the
    /// cluster lose their tags. moto finds an object's tags by scanning every tag it
    /// holds, and filters by tag object by object, so each tagged object left behind
    /// would slow every later tag-filtered call; hypd finds its objects by their tags,
    /// so untagged ones are no one's.
    pub fn forget_cluster(&self, name: &str) {
        // Its issuer, while the sim still knows the cluster: the OIDC provider made for
        // it goes too, or every later teardown that never read its own issuer (it then
        // asks IAM for the tags of every provider in the account) pays for this one.
        let (_, described) =
            self.sim
                .call(reqwest::Method::GET, &format!("/clusters/{name}"), None);
        let issuer = described["cluster"]["identity"]["oidc"]["issuer"]
            .as_str()
            .map(str::to_owned);
        let (status, body) = self.sim.call(
            reqwest::Method::DELETE,
            &format!("/_sim/clusters/{name}"),
            None,
        );
        assert!(status < 300 || status == 404, "{body}");
        tokio::runtime::Runtime::new().unwrap().block_on(async {
            use aws_sdk_ec2::types::{Filter, Tag};
            let sdk = self.moto_sdk().await;
            if let Some(issuer) = issuer {
                // moto's account; absent when hypd never made it, or deleted it itself.
                let arn = hypd::resources::iam::oidc_provider::arn("123456789012", &issuer);
                let _ = aws_sdk_iam::Client::new(&sdk)
                    .delete_open_id_connect_provider()
                    .open_id_connect_provider_arn(arn)
                    .send()
                    .await;
            }
            let ec2 = aws_sdk_ec2::Client::new(&sdk);
            let filter = |key: &str, values: Vec<String>| {
                Filter::builder().name(key).set_values(Some(values)).build()
            };
            let ours = ec2
                .describe_tags()
                .filters(filter("key", vec!["hypd:cluster".into()]))
                .filters(filter("value", vec![name.into()]))
                .send()
                .await
                .unwrap();
            let ids: Vec<String> = ours
                .tags()
                .iter()
                .filter_map(|t| t.resource_id().map(str::to_owned))
                .collect();
            if ids.is_empty() {
                return;
            }
            let all = ec2
                .describe_tags()
                .filters(filter("resource-id", ids.clone()))
                .send()
                .await
                .unwrap();
            let mut keys: Vec<String> = all
                .tags()
                .iter()
                .filter_map(|t| t.key().map(str::to_owned))
                .collect();
            keys.sort();
            keys.dedup();
            ec2.delete_tags()
                .set_resources(Some(ids))
                .set_tags(Some(
                    keys.iter().map(|k| Tag::builder().key(k).build()).collect(),
                ))
                .send()
                .await
                .unwrap();
        });
    }

    /// A hypd of its own on this world, every AWS call of which (EC2, IAM and S3 too)
    /// goes through the sim, signed with access key `key`: the sim scopes faults and
    /// its call log by the key, so tenants sharing the world never see each other's.
    pub fn tenant(&self, key: &str) -> Tenant<'_> {
        let extra = [
            ("AWS_ENDPOINT_URL", self.sim.url.as_str()),
            ("AWS_ACCESS_KEY_ID", key),
        ];
        let hypd = self.hypd(None, &extra);
        let token = hypd.admin_token();
        Tenant {
            world: self,
            hypd: Some(hypd),
            token,
            key: key.to_owned(),
        }
    }

    /// Starts a hypd against this world on `data_dir` (a new one when None), with `extra`
    /// variables.
    pub fn hypd(
        &self,
        data_dir: Option<std::sync::Arc<tempfile::TempDir>>,
        extra: &[(&str, &str)],
    ) -> Hypd {
        let env = self.aws_env();
        let mut env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        env.extend_from_slice(extra);
        let dir = data_dir.unwrap_or_else(|| std::sync::Arc::new(tempfile::tempdir().unwrap()));
        Hypd::start_in(dir, &[], &env)
    }
}

/// The worker's floors in the test world (`--min-poll-interval`, `--retry-backoff`):
/// its clock runs hundreds of times faster than AWS's.
pub const TEST_MIN_POLL: &str = "50ms";
pub const TEST_RETRY_BACKOFF: &str = "100ms";

/// One hypd on a shared [`World`] with its own store and access key (see
/// [`World::tenant`]).
pub struct Tenant<'w> {
    pub world: &'w World,
    hypd: Option<Hypd>,
    /// Its first admin token.
    pub token: String,
    /// The access key id its AWS calls and Kubernetes tokens are signed with.
    pub key: String,
}

impl Tenant<'_> {
    pub fn hypd(&self) -> &Hypd {
        self.hypd.as_ref().expect("a running hypd")
    }

    /// Injects `fault` into this tenant's calls only; returns its id.
    pub fn fault(&self, mut fault: serde_json::Value) -> u64 {
        fault["caller"] = serde_json::json!(self.key);
        let (status, body) =
            self.world
                .sim
                .call(reqwest::Method::POST, "/_sim/faults", Some(fault));
        assert!(status < 300, "{body}");
        body["id"].as_u64().unwrap()
    }

    pub fn remove_fault(&self, id: u64) {
        let (status, body) =
            self.world
                .sim
                .call(reqwest::Method::DELETE, &format!("/_sim/faults/{id}"), None);
        assert!(status < 300, "{body}");
    }

    /// The calls this tenant made that the world answered, oldest first, as the sim
    /// logs them (`service`, `operation`, `agent`).
    pub fn calls(&self) -> Vec<serde_json::Value> {
        let (status, log) = self.world.sim.call(
            reqwest::Method::GET,
            &format!("/_sim/calls?caller={}", self.key),
            None,
        );
        assert_eq!(status, 200, "{log}");
        log["calls"].as_array().cloned().unwrap_or_default()
    }

    pub fn clear_calls(&self) {
        let (status, _) = self.world.sim.call(
            reqwest::Method::DELETE,
            &format!("/_sim/calls?caller={}", self.key),
            None,
        );
        assert!(status < 300);
    }

    /// Kills hypd as a crash would (SIGKILL) and starts it again on the same store.
    pub fn crash_and_restart(&mut self) {
        let data_dir = self.hypd.take().expect("a running hypd").kill();
        let extra = [
            ("AWS_ENDPOINT_URL", self.world.sim.url.as_str()),
            ("AWS_ACCESS_KEY_ID", self.key.as_str()),
        ];
        self.hypd = Some(self.world.hypd(Some(data_dir), &extra));
    }

    /// Takes cluster `name` out of the shared world once a test is done with it (see
    /// [`World::forget_cluster`]).
    pub fn forget_cluster(&self, name: &str) {
        self.world.forget_cluster(name);
    }
}

/// `host:port` of a hypd's URL, for raw sockets.
pub fn authority(url: &str) -> String {
    url.trim_start_matches("http://")
        .trim_end_matches('/')
        .to_owned()
}

/// One HTTP/1.1 response read off a socket: status, lowercase headers, body.
pub struct RawResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl RawResponse {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", self.body))
    }
}

/// Reads one response (with a `content-length` or chunked body) from `stream`; `None`
/// when the server closed the connection before answering.
pub fn read_response(stream: &mut TcpStream) -> Option<RawResponse> {
    use std::io::Read;
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        match stream.read(&mut byte) {
            Ok(0) | Err(_) => return None,
            Ok(_) => buf.push(byte[0]),
        }
    }
    let head = String::from_utf8_lossy(&buf).into_owned();
    let mut lines = head.split("\r\n");
    let status = lines.next()?.split(' ').nth(1)?.parse().ok()?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let find = |name: &str| {
        headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    let mut body = Vec::new();
    if let Some(len) = find("content-length").and_then(|v| v.parse::<usize>().ok()) {
        body.resize(len, 0);
        stream.read_exact(&mut body).ok()?;
    } else if find("transfer-encoding").is_some_and(|v| v.contains("chunked")) {
        let mut reader = BufReader::new(stream);
        loop {
            let mut size = String::new();
            reader.read_line(&mut size).ok()?;
            let n = usize::from_str_radix(size.trim(), 16).ok()?;
            let mut chunk = vec![0u8; n + 2];
            reader.read_exact(&mut chunk).ok()?;
            if n == 0 {
                break;
            }
            body.extend_from_slice(&chunk[..n]);
        }
    }
    Some(RawResponse {
        status,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    })
}

/// Sends `request` (a whole HTTP/1.1 request, head and body) on a new connection and
/// reads the answer.
pub fn raw_request(authority: &str, request: &str) -> RawResponse {
    use std::io::Write;
    let mut stream = TcpStream::connect(authority).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    stream.write_all(request.as_bytes()).unwrap();
    read_response(&mut stream).expect("an answer")
}
