//! `hypd serve --sandbox`: runs hypd against a local test world instead of AWS. It starts
//! moto (EC2, IAM, S3, STS, CloudFormation) and `hypd-sim` (EKS, SageMaker HyperPod,
//! Kubernetes) on loopback and points the standard `AWS_*` variables at them; the rest of
//! hypd cannot tell the difference, which is the point.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Where the store file and the admin token live. The sandbox keeps its own, beside the
/// real ones, because the world it describes (moto's memory) is gone when it stops, and
/// a sandbox must never replace a real account's admin token.
pub fn state_dir(data_dir: &Path, sandbox: bool) -> PathBuf {
    if sandbox {
        data_dir.join("sandbox")
    } else {
        data_dir.to_path_buf()
    }
}

pub fn store_file(data_dir: &Path, sandbox: bool) -> PathBuf {
    state_dir(data_dir, sandbox).join("hypd.db")
}

#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error(
        "{0} not found: run scripts/setup (it installs moto into a virtualenv), or set HYPD_MOTO_SERVER to moto_server's path"
    )]
    MotoMissing(String),
    #[error(
        "hypd-sim not found beside hypd or on PATH: build it with `cargo build -p sim`, or set HYPD_SIM_BIN"
    )]
    SimMissing,
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{name} did not become ready within {secs} s; see {log}")]
    NotReady {
        name: &'static str,
        secs: u64,
        log: String,
    },
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> SandboxError {
    let what = what.into();
    move |source| SandboxError::Io { what, source }
}

/// What the running server needs to know about the sandbox.
#[derive(Debug, Clone)]
pub struct SandboxInfo {
    pub moto_url: String,
    pub sim_url: String,
}

/// The running test world. Dropping it stops both processes.
pub struct Sandbox {
    moto: Child,
    sim: Child,
    info: SandboxInfo,
}

const REGION: &str = "us-east-1";

impl Sandbox {
    /// Starts moto and sim, waits until both answer, then points this process's AWS
    /// configuration at them. Must run before any other thread exists (it sets
    /// environment variables).
    pub fn start(data_dir: &Path) -> Result<Self, SandboxError> {
        let dir = data_dir.join("sandbox");
        // A previous sandbox's store describes a world that no longer exists.
        if dir.exists() {
            std::fs::remove_dir_all(&dir).map_err(io(format!("cannot reset {}", dir.display())))?;
        }
        std::fs::create_dir_all(&dir).map_err(io(format!("cannot create {}", dir.display())))?;

        let moto_port = free_port()?;
        let moto_log = dir.join("moto.log");
        let mut moto = spawn(
            Command::new(moto_binary()?)
                .args(["-H", "127.0.0.1", "-p", &moto_port.to_string()])
                .env("MOTO_IAM_LOAD_MANAGED_POLICIES", "true")
                .stdout(log_file(&moto_log)?)
                .stderr(log_file(&moto_log)?),
            "moto_server",
        )?;
        let moto_addr = SocketAddr::from(([127, 0, 0, 1], moto_port));
        if let Err(e) = wait_for_port(moto_addr, Duration::from_secs(30), "moto", &moto_log) {
            let _ = moto.kill();
            return Err(e);
        }
        let moto_url = format!("http://{moto_addr}");

        let sim_log = dir.join("sim.log");
        let mut sim = match spawn(
            Command::new(sim_binary()?)
                .args(["--listen", "127.0.0.1:0", "--moto-url", &moto_url])
                .stdout(Stdio::piped())
                .stderr(log_file(&sim_log)?),
            "hypd-sim",
        ) {
            Ok(c) => c,
            Err(e) => {
                let _ = moto.kill();
                return Err(e);
            }
        };
        let sim_url = match read_listen_line(&mut sim, &sim_log) {
            Ok(url) => url,
            Err(e) => {
                let _ = moto.kill();
                let _ = sim.kill();
                return Err(e);
            }
        };

        let info = SandboxInfo { moto_url, sim_url };
        for (key, value) in sandbox_env(&info) {
            // SAFETY: called from `cli::run_serve` before the runtime (or any other
            // thread) starts, so nothing reads the environment concurrently.
            unsafe { std::env::set_var(key, value) };
        }
        for key in [
            "AWS_PROFILE",
            "AWS_SESSION_TOKEN",
            "AWS_ROLE_ARN",
            "AWS_WEB_IDENTITY_TOKEN_FILE",
        ] {
            // SAFETY: as above.
            unsafe { std::env::remove_var(key) };
        }
        tracing::warn!(
            moto = %info.moto_url,
            sim = %info.sim_url,
            logs = %dir.display(),
            "SANDBOX MODE: hypd talks to a local test world (moto + hypd-sim), not to AWS"
        );
        Ok(Self { moto, sim, info })
    }

    pub fn info(&self) -> SandboxInfo {
        self.info.clone()
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        for child in [&mut self.sim, &mut self.moto] {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The standard variables the AWS SDK reads; a user's own profile and credentials are
/// ignored so a sandbox can never touch a real account.
fn sandbox_env(info: &SandboxInfo) -> Vec<(&'static str, String)> {
    let region = std::env::var("AWS_REGION").unwrap_or_else(|_| REGION.to_owned());
    vec![
        ("AWS_ENDPOINT_URL", info.moto_url.clone()),
        ("AWS_ENDPOINT_URL_EKS", info.sim_url.clone()),
        ("AWS_ENDPOINT_URL_SAGEMAKER", info.sim_url.clone()),
        ("AWS_ENDPOINT_URL_SERVICE_QUOTAS", info.sim_url.clone()),
        ("AWS_ENDPOINT_URL_FSX", info.sim_url.clone()),
        ("AWS_ACCESS_KEY_ID", "testing".to_owned()),
        ("AWS_SECRET_ACCESS_KEY", "testing".to_owned()),
        ("AWS_REGION", region),
        ("AWS_EC2_METADATA_DISABLED", "true".to_owned()),
        ("AWS_CONFIG_FILE", "/dev/null".to_owned()),
        ("AWS_SHARED_CREDENTIALS_FILE", "/dev/null".to_owned()),
    ]
}

fn moto_binary() -> Result<PathBuf, SandboxError> {
    if let Ok(p) = std::env::var("HYPD_MOTO_SERVER") {
        return Ok(PathBuf::from(p));
    }
    find_on_path("moto_server").ok_or_else(|| SandboxError::MotoMissing("moto_server".to_owned()))
}

fn sim_binary() -> Result<PathBuf, SandboxError> {
    if let Ok(p) = std::env::var("HYPD_SIM_BIN") {
        return Ok(PathBuf::from(p));
    }
    let beside = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|d| d.join("hypd-sim")))
        .filter(|p| p.is_file());
    beside
        .or_else(|| find_on_path("hypd-sim"))
        .ok_or(SandboxError::SimMissing)
}

fn find_on_path(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

fn log_file(path: &Path) -> Result<File, SandboxError> {
    File::options()
        .create(true)
        .append(true)
        .open(path)
        .map_err(io(format!("cannot open {}", path.display())))
}

fn spawn(cmd: &mut Command, name: &str) -> Result<Child, SandboxError> {
    cmd.stdin(Stdio::null());
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::process::CommandExt;
        // SAFETY: prctl is async-signal-safe; it only asks the kernel to stop the child
        // when hypd dies, even by SIGKILL, so no test world outlives its server.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                Ok(())
            });
        }
    }
    cmd.spawn().map_err(io(format!("cannot start {name}")))
}

fn free_port() -> Result<u16, SandboxError> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(io("cannot find a free port"))?;
    l.local_addr()
        .map(|a| a.port())
        .map_err(io("cannot find a free port"))
}

fn wait_for_port(
    addr: SocketAddr,
    limit: Duration,
    name: &'static str,
    log: &Path,
) -> Result<(), SandboxError> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err(SandboxError::NotReady {
        name,
        secs: limit.as_secs(),
        log: log.display().to_string(),
    })
}

/// hypd-sim prints `listening on http://ADDR` as its first stdout line once bound. The
/// reader thread is joined before returning, so no thread outlives this call.
fn read_listen_line(sim: &mut Child, log: &Path) -> Result<String, SandboxError> {
    let not_ready = || SandboxError::NotReady {
        name: "hypd-sim",
        secs: 30,
        log: log.display().to_string(),
    };
    let stdout = sim.stdout.take().ok_or_else(not_ready)?;
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = rx.recv_timeout(Duration::from_secs(30));
    if line.is_err() {
        // Killing the child closes the pipe, which ends the blocked read.
        let _ = sim.kill();
    }
    let _ = reader.join();
    let line = line.map_err(|_| not_ready())?;
    line.trim()
        .strip_prefix("listening on ")
        .map(str::to_owned)
        .ok_or_else(not_ready)
}
