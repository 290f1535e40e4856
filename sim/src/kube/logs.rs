//! `pods/{name}/log`: a container's output is a function of the sim's clock — line `i`
//! is written at `start + i × interval` until the container terminates — so nothing is
//! stored: any window (`tailLines`, `sinceSeconds`, `follow`) is generated on demand,
//! and a follow of any length holds only one batch of lines at a time. A container whose
//! collective hangs ([`NCCL_TIMEOUT_ANNOTATION`]) ends with what PyTorch prints when
//! NCCL's watchdog takes the process down.

use std::convert::Infallible;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::WeakApi;
use super::api::{Query, Status};
use super::store::Key;
use super::time::{parse_rfc3339, rfc3339};
use crate::world::Shared;

/// Pod annotation: sim seconds between two log lines (default 1).
pub const INTERVAL_ANNOTATION: &str = "sim.hypd.dev/log-interval-seconds";
/// Pod annotation: sim seconds after its start when the container stops printing but
/// keeps running (a hang).
pub const HANG_ANNOTATION: &str = "sim.hypd.dev/hang-after-seconds";
/// Pod annotation: sim seconds after its start when one of the container's collectives
/// hangs: it prints nothing more, and [`NCCL_TIMEOUT_SECS`] later NCCL's watchdog reports
/// the timeout and takes the process down (see [`nccl_timeout`]).
pub const NCCL_TIMEOUT_ANNOTATION: &str = "sim.hypd.dev/nccl-timeout-after-seconds";
/// PyTorch's default process-group timeout (10 minutes).
pub const NCCL_TIMEOUT_SECS: f64 = 600.0;
/// Pod annotation: the process group's timeout in sim seconds, when the job set its own
/// (`init_process_group(timeout=…)`, the HF Trainer's `ddp_timeout`); default
/// [`NCCL_TIMEOUT_SECS`].
pub const NCCL_PG_TIMEOUT_ANNOTATION: &str = "sim.hypd.dev/nccl-timeout-seconds";
/// Lines PyTorch prints as the watchdog takes the process down (see [`watchdog_line`]).
const WATCHDOG_LINES: u64 = 5;
/// The watchdog thread's id in glog's prefix: any number, as long as it stays put.
const WATCHDOG_THREAD: u32 = 42;
/// Lines generated per chunk of a response.
const BATCH: u64 = 1000;
/// Real time between two looks at a followed container.
const POLL: Duration = Duration::from_millis(50);

/// What determines one container's log.
#[derive(Clone, Debug)]
struct Source {
    pod: String,
    container: String,
    start: f64,
    end: Option<f64>,
    /// When it stops printing while it runs on (a hang).
    silent: Option<f64>,
    interval: f64,
    /// A model download's container: its model and revision (it prints progress).
    download: Option<(String, String)>,
    /// When NCCL's watchdog takes the process down, ending its log (see
    /// [`NCCL_TIMEOUT_ANNOTATION`]).
    watchdog: Option<Watchdog>,
}

#[derive(Clone, Copy, Debug)]
struct Watchdog {
    at: f64,
    /// The process group's timeout it gave up after, in seconds.
    timeout: f64,
    /// The process's rank: the index at the end of its pod's name, as the training
    /// operator names replicas (`<job>-pod-<index>`).
    rank: u64,
}

impl Source {
    /// Lines written by sim epoch `t`.
    fn count_at(&self, t: f64) -> u64 {
        let steps = self.steps_at(t);
        match self.watchdog {
            Some(w) if t >= w.at => steps + WATCHDOG_LINES,
            _ => steps,
        }
    }

    /// Step (or download progress) lines written by sim epoch `t`: the watchdog's come
    /// after them.
    fn steps_at(&self, t: f64) -> u64 {
        let t = self.end.map_or(t, |e| t.min(e));
        let t = self.silent.map_or(t, |s| t.min(s));
        if t < self.start {
            return 0;
        }
        ((t - self.start) / self.interval).floor() as u64 + 1
    }

    /// The index of the first line written at or after sim epoch `cutoff`.
    fn first_since(&self, cutoff: f64) -> u64 {
        let step = if cutoff > self.start {
            ((cutoff - self.start) / self.interval).ceil() as u64
        } else {
            0
        };
        match self.watchdog {
            Some(w) if cutoff <= w.at => step.min(self.steps_at(w.at)),
            _ => step,
        }
    }

    /// The lines a read at sim epoch `now` returns, `first..count`: those of the last
    /// `since` seconds and the last `tail` lines, where asked.
    fn window(&self, now: f64, since: Option<f64>, tail: Option<u64>) -> (u64, u64) {
        let count = self.count_at(now);
        let first = since.map_or(0, |s| self.first_since(now - s));
        let first = tail.map_or(first, |t| first.max(count.saturating_sub(t)));
        (first.min(count), count)
    }

    /// When line `i` was written.
    fn at(&self, i: u64) -> f64 {
        self.watchdog_part(i)
            .map_or(self.start + i as f64 * self.interval, |(w, ..)| w.at)
    }

    /// If line `i` is one the watchdog prints: the watchdog, the collective that hung
    /// (each step printed completed one: the hung one is the next) and the line's index
    /// among the watchdog's.
    fn watchdog_part(&self, i: u64) -> Option<(Watchdog, u64, u64)> {
        let w = self.watchdog?;
        let steps = self.steps_at(w.at);
        i.checked_sub(steps).map(|k| (w, steps, k))
    }

    fn finished_at(&self, t: f64) -> bool {
        self.end.is_some_and(|e| t >= e)
    }

    fn line(&self, i: u64, timestamps: bool) -> String {
        let at = self.at(i);
        let text = match (self.watchdog_part(i), &self.download) {
            (Some((w, seq, k)), _) => watchdog_line(w, seq, k),
            (None, Some((model, revision))) => download_line(model, revision, i),
            (None, None) => {
                let loss = 2.5 * 0.9995_f64.powf(i as f64);
                format!(
                    "[{}] {} step {i}: loss={loss:.4} tokens/s=41{:03}",
                    self.container,
                    self.pod,
                    i % 1000
                )
            }
        };
        if timestamps {
            format!("{} {text}\n", rfc3339(at).replace('Z', ".000000000Z"))
        } else {
            format!("{text}\n")
        }
    }
}

/// Line `k` of what PyTorch prints when NCCL's watchdog gives up on collective `seq`
/// (`TORCH_NCCL_ASYNC_ERROR_HANDLING` on, the default): glog lines stamped within the
/// second it fires, then the C++ runtime's as the exception aborts the process.
fn watchdog_line(w: Watchdog, seq: u64, k: u64) -> String {
    let rank = w.rank;
    let t = rfc3339(w.at);
    let glog = |micros: u32, source_line: u32| {
        format!(
            "[rank{rank}]:[E{}{} {}.{micros:06} {WATCHDOG_THREAD} ProcessGroupNCCL.cpp:{source_line}]",
            &t[5..7],
            &t[8..10],
            &t[11..19]
        )
    };
    let timeout_ms = (w.timeout * 1000.0) as u64;
    match k {
        0 => format!(
            "{} [Rank {rank}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, NumelIn=131072, NumelOut=131072, Timeout(ms)={timeout_ms}) ran for {} milliseconds before timing out.",
            glog(123_456, 632),
            // The watchdog looks now and then: it notices a little after the deadline.
            timeout_ms + 41
        ),
        1 => format!(
            "{} [PG 0 (default_pg) Rank {rank}] Timeout at NCCL work: {seq}, last enqueued NCCL work: {seq}, last completed NCCL work: {}.",
            glog(123_789, 2168),
            seq.saturating_sub(1)
        ),
        2 => format!(
            "{} [Rank {rank}] Some NCCL operations have failed or timed out. Due to the asynchronous nature of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data.",
            glog(124_001, 681)
        ),
        3 => format!(
            "{} [Rank {rank}] To avoid data inconsistency, we are taking the entire process down.",
            glog(124_113, 687)
        ),
        _ => "terminate called after throwing an instance of 'c10::DistBackendError'".to_owned(),
    }
}

/// Line `i` of a download's output: one file more per line, as the hub lists them,
/// then the same total again (the container waits for its writes to return).
fn download_line(model: &str, revision: &str, i: u64) -> String {
    let snapshot = crate::hub::snapshot(model, revision);
    let n = snapshot.files.len();
    let done = (i as usize + 1).min(n);
    let bytes: usize = snapshot.files[..done].iter().map(|f| f.bytes.len()).sum();
    let total: usize = snapshot.files.iter().map(|f| f.bytes.len()).sum();
    format!(
        "hypd-progress files={done}/{n} bytes={bytes}/{total} commit={} file={}",
        snapshot.commit,
        snapshot.files[done - 1].path
    )
}

fn source(pod: &Value, container: Option<&str>) -> Result<Source, Status> {
    let name = pod["metadata"]["name"].as_str().unwrap_or_default();
    let containers: Vec<&str> = pod["spec"]["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["name"].as_str())
        .collect();
    let container = match container {
        Some(c) if containers.contains(&c) => c.to_owned(),
        Some(c) => {
            return Err(Status::new(
                400,
                "BadRequest",
                format!("container {c} is not valid for pod {name}"),
            ));
        }
        None => match (
            pod["metadata"]["annotations"]["kubectl.kubernetes.io/default-container"].as_str(),
            containers.as_slice(),
        ) {
            (Some(d), _) => d.to_owned(),
            (None, [one]) => (*one).to_owned(),
            (None, _) => {
                return Err(Status::new(
                    400,
                    "BadRequest",
                    format!(
                        "a container name must be specified for pod {name}, choose one of: [{}]",
                        containers.join(" ")
                    ),
                ));
            }
        },
    };
    let status = pod["status"]["containerStatuses"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|s| s["name"].as_str() == Some(&container))
        .cloned()
        .unwrap_or(Value::Null);
    let state = &status["state"];
    let started = state["running"]["startedAt"]
        .as_str()
        .or(state["terminated"]["startedAt"].as_str())
        .and_then(parse_rfc3339);
    let Some(start) = started else {
        let reason = state["waiting"]["reason"]
            .as_str()
            .unwrap_or("ContainerCreating");
        return Err(Status::new(
            400,
            "BadRequest",
            format!("container \"{container}\" in pod \"{name}\" is waiting to start: {reason}"),
        ));
    };
    let interval = seconds(pod, INTERVAL_ANNOTATION)
        .filter(|i| *i > 0.0)
        .unwrap_or(1.0);
    // The controllers record the exit a pass late; the log ends when the container does.
    let end = state["terminated"]["finishedAt"]
        .as_str()
        .and_then(parse_rfc3339)
        .or_else(|| super::controllers::run_seconds(pod).map(|run| start + run));
    let download =
        super::controllers::download_of(pod).map(|(model, revision, _)| (model, revision));
    // A hung collective silences the container as a hang does, until the watchdog.
    let silent = [HANG_ANNOTATION, NCCL_TIMEOUT_ANNOTATION]
        .into_iter()
        .filter_map(|a| seconds(pod, a))
        .reduce(f64::min)
        .map(|after| start + after);
    // It prints as the process goes down: at the end, as the status records it.
    let watchdog = end.filter(|_| watchdog_ends(pod)).map(|at| Watchdog {
        at,
        timeout: pg_timeout(pod),
        rank: rank(name),
    });
    Ok(Source {
        pod: name.to_owned(),
        container,
        start,
        end,
        silent,
        interval,
        download,
        watchdog,
    })
}

/// Pod annotation `annotation`'s sim seconds, if it has a number.
fn seconds(pod: &Value, annotation: &str) -> Option<f64> {
    pod["metadata"]["annotations"][annotation]
        .as_str()
        .and_then(|s| s.parse::<f64>().ok())
}

/// Sim seconds from pod `pod`'s container start until NCCL's watchdog would take it down,
/// if one of its collectives hangs ([`NCCL_TIMEOUT_ANNOTATION`]).
pub fn nccl_timeout(pod: &Value) -> Option<f64> {
    seconds(pod, NCCL_TIMEOUT_ANNOTATION)
        .filter(|s| s.is_finite())
        .map(|after| after + pg_timeout(pod))
}

/// The process group's timeout of pod `pod`'s processes, in sim seconds.
fn pg_timeout(pod: &Value) -> f64 {
    seconds(pod, NCCL_PG_TIMEOUT_ANNOTATION)
        .filter(|s| s.is_finite() && *s > 0.0)
        .unwrap_or(NCCL_TIMEOUT_SECS)
}

/// Whether pod `pod`'s container ends by NCCL's watchdog: a collective hangs, and nothing
/// ends its run sooner.
pub fn watchdog_ends(pod: &Value) -> bool {
    nccl_timeout(pod).is_some_and(|t| super::controllers::run_seconds(pod) == Some(t))
}

/// The number at the end of a pod's name (`sft-pod-1` is rank 1), else 0.
fn rank(pod: &str) -> u64 {
    let digits = pod.trim_end_matches(|c: char| c.is_ascii_digit());
    pod[digits.len()..].parse().unwrap_or(0)
}

/// Whether pod `pod`'s (only or default) container has ended its run by sim epoch `now`,
/// whether or not a controller pass (late under load) has recorded the exit yet.
pub fn run_over(pod: &Value, now: f64) -> bool {
    source(pod, None).is_ok_and(|src| src.finished_at(now))
}

/// The last line pod `pod`'s (only or default) container printed by sim epoch `now`, and
/// when; None before its first, or when its log cannot be read.
pub fn last_line(pod: &Value, now: f64) -> Option<(String, f64)> {
    let src = source(pod, None).ok()?;
    let i = src.count_at(now).checked_sub(1)?;
    Some((src.line(i, false).trim_end().to_owned(), src.at(i)))
}

fn render(src: &Source, from: u64, to: u64, timestamps: bool) -> Bytes {
    let mut out = String::new();
    for i in from..to {
        out.push_str(&src.line(i, timestamps));
    }
    Bytes::from(out)
}

async fn look(
    world: &Shared,
    api: &WeakApi,
    ns: &str,
    name: &str,
    container: Option<&str>,
) -> Result<(Source, f64), Status> {
    let api = api
        .upgrade()
        .ok_or_else(|| Status::new(503, "ServiceUnavailable", "the cluster is gone"))?;
    let store = api.store.lock().await;
    let now = world.clock.epoch(world.clock.now());
    let pod = store
        .get(&Key::new("/pods", ns, name))
        .ok_or_else(|| Status::new(404, "NotFound", format!("pods \"{name}\" not found")))?;
    Ok((source(pod, container)?, now))
}

pub async fn serve(world: Shared, api: WeakApi, ns: String, name: String, q: Query) -> Response {
    let container = q.get("container").cloned();
    let (src, now) = match look(&world, &api, &ns, &name, container.as_deref()).await {
        Ok(x) => x,
        Err(s) => return s.into_response(),
    };
    let timestamps = q.get("timestamps").is_some_and(|v| v == "true");
    let follow = q.get("follow").is_some_and(|v| v == "true");
    let since = q.get("sinceSeconds").and_then(|s| s.parse::<f64>().ok());
    let tail = q.get("tailLines").and_then(|s| s.parse::<u64>().ok());
    let (first, count) = src.window(now, since, tail);
    let (tx, rx) = mpsc::channel::<Result<Bytes, Infallible>>(4);
    tokio::spawn(async move {
        let mut next = first;
        let mut src = src;
        let mut count = count;
        loop {
            while next < count {
                let to = count.min(next + BATCH);
                if tx
                    .send(Ok(render(&src, next, to, timestamps)))
                    .await
                    .is_err()
                {
                    return;
                }
                next = to;
            }
            if !follow {
                return;
            }
            tokio::time::sleep(POLL).await;
            let Ok((fresh, now)) = look(&world, &api, &ns, &name, Some(&src.container)).await
            else {
                return;
            };
            src = fresh;
            count = src.count_at(now);
            if src.finished_at(now) && next >= count {
                return;
            }
        }
    });
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "text/plain")],
        Body::from_stream(ReceiverStream::new(rx)),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn lines_follow_the_clock_and_stop_at_termination() {
        let pod = json!({
            "metadata": {"name": "p", "annotations": {INTERVAL_ANNOTATION: "2"}},
            "spec": {"containers": [{"name": "main"}]},
            "status": {"containerStatuses": [{"name": "main", "state": {"terminated": {
                "startedAt": "2026-01-01T00:00:00Z", "finishedAt": "2026-01-01T00:00:10Z"}}}]}
        });
        let src = source(&pod, None).unwrap();
        let t0 = parse_rfc3339("2026-01-01T00:00:00Z").unwrap();
        assert_eq!(src.count_at(t0 - 1.0), 0);
        assert_eq!(src.count_at(t0 + 5.0), 3);
        assert_eq!(src.count_at(t0 + 1000.0), 6);
        assert!(
            src.line(1, true)
                .starts_with("2026-01-01T00:00:02.000000000Z [main] p step 1:")
        );
        let running = json!({
            "metadata": {"name": "p", "annotations": {"sim.hypd.dev/run-seconds": "4"}},
            "spec": {"containers": [{"name": "main"}], "restartPolicy": "Never"},
            "status": {"containerStatuses": [{"name": "main", "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}]}
        });
        let src = source(&running, None).unwrap();
        assert_eq!(
            src.count_at(t0 + 100.0),
            5,
            "ends with the container, even before its status says so"
        );
        assert!(src.finished_at(t0 + 4.0));
        let waiting = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "a"}, {"name": "b"}]}});
        assert!(
            source(&waiting, None).unwrap_err().to_json()["message"]
                .as_str()
                .unwrap()
                .contains("choose one of")
        );
        assert!(
            source(&waiting, Some("a")).unwrap_err().to_json()["message"]
                .as_str()
                .unwrap()
                .contains("waiting to start")
        );
    }

    /// A training pod (as a HyperPodPyTorchJob makes it) whose collective hangs 30 s in.
    fn hung_collective(state: Value) -> Value {
        json!({
            "metadata": {"name": "sft-pod-1", "annotations": {
                NCCL_TIMEOUT_ANNOTATION: "30", "sim.hypd.dev/run-seconds": "inf"}},
            "spec": {"containers": [{"name": "main"}], "restartPolicy": "Never"},
            "status": {"containerStatuses": [{"name": "main", "state": state}]}
        })
    }

    #[test]
    fn a_job_with_its_own_process_group_timeout_is_taken_down_after_it() {
        let mut pod = hung_collective(json!({"running": {"startedAt": "2026-12-06T05:01:39Z"}}));
        pod["metadata"]["annotations"][NCCL_PG_TIMEOUT_ANNOTATION] = json!("45");
        assert_eq!(nccl_timeout(&pod), Some(75.0));
        let t0 = parse_rfc3339("2026-12-06T05:01:39Z").unwrap();
        let src = source(&pod, None).unwrap();
        assert_eq!((src.count_at(t0 + 74.0), src.count_at(t0 + 75.0)), (31, 36));
        let text = String::from_utf8(render(&src, 31, 32, false).to_vec()).unwrap();
        assert!(
            text.contains("Timeout(ms)=45000) ran for 45041 milliseconds"),
            "{text}"
        );
    }

    #[test]
    fn a_hung_collective_goes_silent_then_the_watchdog_takes_the_process_down() {
        let t0 = parse_rfc3339("2026-12-06T05:01:39Z").unwrap();
        let running = hung_collective(json!({"running": {"startedAt": "2026-12-06T05:01:39Z"}}));
        let src = source(&running, None).unwrap();
        assert_eq!(src.count_at(t0 + 29.0), 30);
        assert_eq!(src.count_at(t0 + 30.0), 31, "steps 0 to 30, then the hang");
        assert_eq!(src.count_at(t0 + 629.0), 31, "silent for NCCL's timeout");
        assert!(!src.finished_at(t0 + 629.0));
        assert_eq!(src.count_at(t0 + 630.0), 36);
        assert_eq!(src.count_at(t0 + 5000.0), 36, "the log ends with them");
        assert!(src.finished_at(t0 + 630.0));
        assert!(watchdog_ends(&running));

        let text = String::from_utf8(render(&src, 30, 36, false).to_vec()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("[main] sft-pod-1 step 30: loss="));
        assert_eq!(
            &lines[1..],
            [
                "[rank1]:[E1206 05:12:09.123456 42 ProcessGroupNCCL.cpp:632] [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=31, OpType=ALLREDUCE, NumelIn=131072, NumelOut=131072, Timeout(ms)=600000) ran for 600041 milliseconds before timing out.",
                "[rank1]:[E1206 05:12:09.123789 42 ProcessGroupNCCL.cpp:2168] [PG 0 (default_pg) Rank 1] Timeout at NCCL work: 31, last enqueued NCCL work: 31, last completed NCCL work: 30.",
                "[rank1]:[E1206 05:12:09.124001 42 ProcessGroupNCCL.cpp:681] [Rank 1] Some NCCL operations have failed or timed out. Due to the asynchronous nature of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data.",
                "[rank1]:[E1206 05:12:09.124113 42 ProcessGroupNCCL.cpp:687] [Rank 1] To avoid data inconsistency, we are taking the entire process down.",
                "terminate called after throwing an instance of 'c10::DistBackendError'",
            ]
        );
        assert!(
            src.line(33, true)
                .starts_with("2026-12-06T05:12:09.000000000Z [rank1]:[E1206 05:12:09.124001 ")
        );
        let (last, at) = last_line(&running, t0 + 700.0).unwrap();
        assert_eq!(
            (last.as_str(), at),
            (
                "terminate called after throwing an instance of 'c10::DistBackendError'",
                t0 + 630.0
            )
        );
        assert!(
            last_line(&running, t0 + 629.0)
                .unwrap()
                .0
                .contains("step 30:")
        );

        // Windows across the silence and the watchdog's lines.
        let now = t0 + 640.0;
        assert_eq!(src.window(now, None, Some(7)), (29, 36));
        assert_eq!(src.window(now, None, Some(100)), (0, 36));
        assert_eq!(
            src.window(now, Some(60.0), None),
            (31, 36),
            "only the watchdog's"
        );
        assert_eq!(
            src.window(now, Some(5.0), None),
            (36, 36),
            "nothing that recent"
        );
        assert_eq!(src.window(now, Some(620.0), Some(3)), (33, 36));
        assert_eq!(src.window(t0 + 400.0, Some(380.0), None), (20, 31));
        assert_eq!(src.window(t0 + 400.0, Some(300.0), None), (31, 31));

        // Once the exit is recorded the log reads the same.
        let ended = hung_collective(json!({"terminated": {"exitCode": 134, "reason": "Error",
            "startedAt": "2026-12-06T05:01:39Z", "finishedAt": "2026-12-06T05:12:09Z"}}));
        let after = source(&ended, None).unwrap();
        assert_eq!(after.count_at(t0 + 5000.0), 36);
        assert_eq!(
            render(&after, 0, 36, true),
            render(&src, 0, 36, true),
            "the same lines at the same times"
        );

        // A run that ends sooner ends it without the watchdog.
        let mut short = running.clone();
        short["metadata"]["annotations"]["sim.hypd.dev/run-seconds"] = json!("100");
        let src = source(&short, None).unwrap();
        assert!(!watchdog_ends(&short));
        assert_eq!(src.count_at(t0 + 5000.0), 31);
        assert!(src.finished_at(t0 + 100.0));
        assert_eq!(rank("sft-pod-12"), 12);
        assert_eq!(rank("worker"), 0);
    }
}
