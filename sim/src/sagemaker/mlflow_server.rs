//! The real MLflow server behind the sim's managed tracking servers: started on the
//! first CreateMlflowTrackingServer when `HYPD_SIM_MLFLOW` names an `mlflow`
//! executable, so hypd and the job pods speak MLflow's own REST API to a real MLflow. One
//! serves every tracking server of the sim (real ones are separate; experiments here
//! differ by name). It dies with the sim however the sim ends: it runs under a small
//! Python guard that stops its whole process group when the sim's end of a pipe closes.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// The environment variable naming the `mlflow` executable.
pub const ENV: &str = "HYPD_SIM_MLFLOW";

/// Stops the server's process group (uvicorn runs as a child of `mlflow server`) once
/// stdin closes (the sim exited, by any signal), then removes its directory (argv[1]).
const GUARD: &str = "import os, shutil, signal, subprocess, sys
p = subprocess.Popen(sys.argv[2:], start_new_session=True, stdin=subprocess.DEVNULL)
sys.stdin.read()
try:
    os.killpg(p.pid, signal.SIGTERM)
    p.wait(timeout=5)
except Exception:
    os.killpg(p.pid, signal.SIGKILL)
shutil.rmtree(sys.argv[1], ignore_errors=True)
";

pub struct Backend {
    pub url: String,
    ready: AtomicBool,
    /// Held so the guard's stdin stays open while the sim runs.
    guard: std::sync::Mutex<Child>,
}

impl Backend {
    /// The `mlflow` executable the environment names, if it is there.
    pub fn configured() -> Option<PathBuf> {
        std::env::var_os(ENV)
            .map(PathBuf::from)
            .filter(|p| p.is_file())
    }

    /// Starts MLflow from `bin` on a free port and watches for it to answer.
    pub fn start(bin: &std::path::Path) -> Result<Arc<Backend>, String> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("no free port for MLflow: {e}"))?
            .port();
        let dir =
            std::env::temp_dir().join(format!("hypd-sim-mlflow-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let python = bin.with_file_name("python3");
        let python = if python.is_file() {
            python
        } else {
            PathBuf::from("python3")
        };
        let log = std::fs::File::create(dir.join("server.log"))
            .map_err(|e| format!("MLflow's log: {e}"))?;
        let child = Command::new(python)
            .arg("-c")
            .arg(GUARD)
            .arg(&dir)
            .arg(bin)
            .args([
                "server",
                "--host",
                "127.0.0.1",
                "--port",
                &port.to_string(),
                "--workers",
                "1",
            ])
            .arg("--backend-store-uri")
            .arg(format!("sqlite:///{}", dir.join("mlflow.db").display()))
            .arg("--default-artifact-root")
            .arg(dir.join("artifacts"))
            // Its job runner (seven task consumers) serves MLflow's GenAI jobs, which no
            // training run here uses; without it MLflow starts in seconds in 250 MB.
            .env("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("starting {}: {e}", bin.display()))?;
        let backend = Arc::new(Backend {
            url: format!("http://127.0.0.1:{port}"),
            ready: AtomicBool::new(false),
            guard: std::sync::Mutex::new(child),
        });
        let watched = backend.clone();
        tokio::spawn(async move {
            let client = reqwest::Client::new();
            for _ in 0..600 {
                let up = client
                    .get(format!("{}/health", watched.url))
                    .timeout(Duration::from_secs(2))
                    .send()
                    .await
                    .is_ok_and(|r| r.status().is_success());
                if up {
                    watched.ready.store(true, Ordering::Release);
                    tracing::info!(url = %watched.url, "MLflow is up");
                    return;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            tracing::error!(url = %watched.url, "MLflow did not answer within two minutes");
        });
        Ok(backend)
    }

    /// Whether it answers: a tracking server on it is Created only then.
    pub fn ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        // Closing the guard's stdin stops MLflow; the guard exits after it.
        if let Ok(mut child) = self.guard.lock() {
            drop(child.stdin.take());
            let _ = child.wait();
        }
    }
}
