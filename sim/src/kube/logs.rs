//! `pods/{name}/log`: a container's output is a function of the sim's clock — line `i`
//! is written at `start + i × interval` until the container terminates — so nothing is
//! stored: any window (`tailLines`, `sinceSeconds`, `follow`) is generated on demand,
//! and a follow of any length holds only one batch of lines at a time.

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
}

impl Source {
    /// Lines written by sim epoch `t`.
    fn count_at(&self, t: f64) -> u64 {
        let t = self.end.map_or(t, |e| t.min(e));
        let t = self.silent.map_or(t, |s| t.min(s));
        if t < self.start {
            return 0;
        }
        ((t - self.start) / self.interval).floor() as u64 + 1
    }

    fn finished_at(&self, t: f64) -> bool {
        self.end.is_some_and(|e| t >= e)
    }

    fn line(&self, i: u64, timestamps: bool) -> String {
        let at = self.start + i as f64 * self.interval;
        let text = match &self.download {
            Some((model, revision)) => download_line(model, revision, i),
            None => {
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
    let interval = pod["metadata"]["annotations"][INTERVAL_ANNOTATION]
        .as_str()
        .and_then(|s| s.parse::<f64>().ok())
        .filter(|i| *i > 0.0)
        .unwrap_or(1.0);
    // The controllers record the exit a pass late; the log ends when the container does.
    let end = state["terminated"]["finishedAt"]
        .as_str()
        .and_then(parse_rfc3339)
        .or_else(|| super::controllers::run_seconds(pod).map(|run| start + run));
    let download =
        super::controllers::download_of(pod).map(|(model, revision, _)| (model, revision));
    let silent = pod["metadata"]["annotations"][HANG_ANNOTATION]
        .as_str()
        .and_then(|s| s.parse::<f64>().ok())
        .map(|after| start + after);
    Ok(Source {
        pod: name.to_owned(),
        container,
        start,
        end,
        silent,
        interval,
        download,
    })
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
    Some((
        src.line(i, false).trim_end().to_owned(),
        src.start + i as f64 * src.interval,
    ))
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
    let count = src.count_at(now);
    let mut first = 0;
    if let Some(since) = q.get("sinceSeconds").and_then(|s| s.parse::<f64>().ok()) {
        let cutoff = now - since;
        if cutoff > src.start {
            first = ((cutoff - src.start) / src.interval).ceil() as u64;
        }
    }
    if let Some(tail) = q.get("tailLines").and_then(|s| s.parse::<u64>().ok()) {
        first = first.max(count.saturating_sub(tail));
    }
    let first = first.min(count);
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
}
