//! Live logs of training pods: one upstream Kubernetes log stream per (cluster, pod,
//! container), shared by every viewer. Each stream keeps its last lines in a ring (for
//! viewers that join late or reconnect with the last line they saw) and fans new lines
//! out through one bounded broadcast channel, so memory does not grow with viewers or
//! with a viewer that stops reading: a viewer that falls a whole channel behind is told
//! how many lines it missed and cut off. The stream ends when the container does, and
//! goes (with its upstream request) shortly after its last viewer left.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use futures_util::{AsyncBufReadExt, TryStreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::LogParams;
use serde_json::json;
use tokio::sync::broadcast;

/// Lines a stream keeps for late joiners and reconnects.
pub const RING: usize = 5000;
/// Lines a viewer may fall behind before it is cut off.
pub const CHANNEL: usize = 4096;
/// How long a stream outlives its last viewer (a reconnect finds its lines).
const LINGER: Duration = Duration::from_secs(30);

/// One stream: which pod's container of which cluster.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct StreamKey {
    pub cluster: String,
    pub namespace: String,
    pub pod: String,
    pub container: String,
}

/// What a viewer is sent: a line (numbered from 1 in the stream, rendered once as the
/// JSON every viewer gets) or the end.
#[derive(Clone, Debug)]
pub enum Event {
    Line { seq: u64, json: Arc<str> },
    End(Arc<str>),
}

struct Ring {
    lines: VecDeque<(u64, Option<String>, Arc<str>)>,
    next: u64,
    ended: Option<Arc<str>>,
}

/// One upstream log stream and its viewers' channel.
pub struct Stream {
    ring: Mutex<Ring>,
    tx: broadcast::Sender<Event>,
    upstream: Mutex<Option<tokio::task::AbortHandle>>,
}

/// Upstream log streams open now: the figure that says viewers share them.
pub const STREAMS_METRIC: &str = "hypd_log_streams_open";

impl Drop for Stream {
    fn drop(&mut self) {
        metrics::gauge!(STREAMS_METRIC).decrement(1.0);
        if let Some(task) = self
            .upstream
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            task.abort();
        }
    }
}

/// What a viewer starts from: the lines it asked for that the ring holds, how many it
/// asked for that the ring no longer holds, and the channel for what comes next.
pub struct Joined {
    pub backlog: Vec<Event>,
    pub missed: u64,
    pub live: broadcast::Receiver<Event>,
    pub stream: Arc<Stream>,
}

/// Where a viewer starts.
#[derive(Clone, Copy, Debug)]
pub enum From {
    /// After the line it saw last (a reconnect).
    After(u64),
    /// The last `n` lines.
    Tail(u64),
    /// Lines written within the last `n` seconds.
    Since(u64),
}

impl Stream {
    fn new() -> Stream {
        Stream {
            ring: Mutex::new(Ring {
                lines: VecDeque::new(),
                next: 1,
                ended: None,
            }),
            tx: broadcast::channel(CHANNEL).0,
            upstream: Mutex::new(None),
        }
    }

    /// Adds a line read upstream (`at` its RFC 3339 time) and sends it to every viewer.
    pub fn push(&self, at: Option<String>, text: &str) {
        let mut ring = self.ring.lock().unwrap_or_else(|e| e.into_inner());
        let seq = ring.next;
        ring.next += 1;
        let json: Arc<str> = json!({ "seq": seq, "at": at, "text": text })
            .to_string()
            .into();
        ring.lines.push_back((seq, at, json.clone()));
        if ring.lines.len() > RING {
            ring.lines.pop_front();
        }
        // Sent under the lock, so a viewer joining sees each line once: in its backlog
        // or on its channel. No viewer is not an error.
        let _ = self.tx.send(Event::Line { seq, json });
    }

    /// The stream is over (the container ended, or reading it failed).
    pub fn end(&self, reason: &str) {
        let mut ring = self.ring.lock().unwrap_or_else(|e| e.into_inner());
        let reason: Arc<str> = reason.into();
        ring.ended = Some(reason.clone());
        let _ = self.tx.send(Event::End(reason));
    }

    /// A new viewer starting `from`.
    pub fn join(self: &Arc<Self>, from: From, now: std::time::SystemTime) -> Joined {
        let ring = self.ring.lock().unwrap_or_else(|e| e.into_inner());
        let first_held = ring.lines.front().map_or(ring.next, |(s, _, _)| *s);
        let (start, missed) = match from {
            From::After(seen) => {
                let wanted = seen + 1;
                (wanted.max(first_held), first_held.saturating_sub(wanted))
            }
            From::Tail(n) => (ring.next.saturating_sub(n).max(first_held), 0),
            From::Since(secs) => {
                let cut = crate::clock::format_time(now - Duration::from_secs(secs));
                let start = ring
                    .lines
                    .iter()
                    .find(|(_, at, _)| at.as_deref().is_none_or(|a| a >= cut.as_str()))
                    .map_or(ring.next, |(s, _, _)| *s);
                (start, 0)
            }
        };
        let mut backlog: Vec<Event> = ring
            .lines
            .iter()
            .filter(|(s, _, _)| *s >= start)
            .map(|(seq, _, json)| Event::Line {
                seq: *seq,
                json: json.clone(),
            })
            .collect();
        if let Some(reason) = &ring.ended {
            backlog.push(Event::End(reason.clone()));
        }
        Joined {
            backlog,
            missed,
            live: self.tx.subscribe(),
            stream: self.clone(),
        }
    }
}

/// Every live stream, by key; a stream lives while a viewer (or its linger) holds it.
#[derive(Clone, Default)]
pub struct LogHub {
    streams: Arc<Mutex<HashMap<StreamKey, Weak<Stream>>>>,
}

impl LogHub {
    /// The stream of `key`, following it upstream through `pods` if no viewer does yet.
    pub fn stream(&self, key: StreamKey, pods: Api<Pod>) -> Arc<Stream> {
        let mut streams = self.streams.lock().unwrap_or_else(|e| e.into_inner());
        streams.retain(|_, w| w.strong_count() > 0);
        if let Some(s) = streams.get(&key).and_then(Weak::upgrade) {
            return s;
        }
        let stream = Arc::new(Stream::new());
        metrics::gauge!(STREAMS_METRIC).increment(1.0);
        let task = tokio::spawn(follow(Arc::downgrade(&stream), pods, key.clone()));
        *stream.upstream.lock().unwrap_or_else(|e| e.into_inner()) = Some(task.abort_handle());
        streams.insert(key, Arc::downgrade(&stream));
        stream
    }

    /// Keeps `stream` for a while after a viewer left, so a reconnect resumes from it.
    pub fn linger(stream: Arc<Stream>) {
        tokio::spawn(async move {
            tokio::time::sleep(LINGER).await;
            drop(stream);
        });
    }
}

/// Reads one container's log from Kubernetes (its last [`RING`] lines, then as written)
/// into `stream` until the container ends or no viewer holds the stream.
async fn follow(stream: Weak<Stream>, pods: Api<Pod>, key: StreamKey) {
    let params = LogParams {
        container: Some(key.container.clone()),
        follow: true,
        tail_lines: Some(RING as i64),
        timestamps: true,
        ..LogParams::default()
    };
    let said = match pods.log_stream(&key.pod, &params).await {
        Ok(reader) => {
            let mut lines = reader.lines();
            loop {
                match lines.try_next().await {
                    Ok(Some(line)) => {
                        let Some(s) = stream.upgrade() else { return };
                        // `timestamps` puts the RFC 3339 time first.
                        match line.split_once(' ') {
                            Some((at, text)) if at.ends_with('Z') => {
                                s.push(Some(normalise(at)), text)
                            }
                            _ => s.push(None, &line),
                        }
                    }
                    Ok(None) => break "the container ended".to_owned(),
                    Err(e) => break format!("reading the log failed: {e}"),
                }
            }
        }
        Err(e) => {
            let e = crate::resources::kube::upstream(&format!("log Pod/{}", key.pod), e);
            format!("the log cannot be read: {e}")
        }
    };
    if let Some(s) = stream.upgrade() {
        s.end(&said);
    }
}

/// `2026-01-01T00:00:01.000000000Z` as hypd writes times (milliseconds).
fn normalise(at: &str) -> String {
    crate::clock::parse_time(at).map_or_else(|| at.to_owned(), crate::clock::format_time)
}

/// Drains what a viewer's channel holds now without waiting, up to `max` events: one
/// frame carries them all. `Err(n)`: the viewer fell `n` lines behind.
pub fn drain(
    live: &mut broadcast::Receiver<Event>,
    into: &mut Vec<Event>,
    max: usize,
) -> Result<(), u64> {
    while into.len() < max {
        match live.try_recv() {
            Ok(e) => into.push(e),
            Err(broadcast::error::TryRecvError::Lagged(n)) => return Err(n),
            Err(_) => break,
        }
    }
    Ok(())
}

/// The frame of a batch of lines: `{"type":"lines","lines":[…]}` (each line rendered once
/// for every viewer), then `{"type":"end",…}` if the batch ends the stream.
pub fn frames(batch: &[Event]) -> Vec<String> {
    let mut out = Vec::new();
    let lines: Vec<&str> = batch
        .iter()
        .filter_map(|e| match e {
            Event::Line { json, .. } => Some(&**json),
            Event::End(_) => None,
        })
        .collect();
    if !lines.is_empty() {
        let mut f = String::with_capacity(lines.iter().map(|l| l.len() + 1).sum::<usize>() + 32);
        f.push_str(r#"{"type":"lines","lines":["#);
        f.push_str(&lines.join(","));
        f.push_str("]}");
        out.push(f);
    }
    if let Some(Event::End(reason)) = batch.iter().find(|e| matches!(e, Event::End(_))) {
        out.push(json!({ "type": "end", "reason": &**reason }).to_string());
    }
    out
}

/// The last line a batch carries.
pub fn last_seq(batch: &[Event]) -> Option<u64> {
    batch.iter().rev().find_map(|e| match e {
        Event::Line { seq, .. } => Some(*seq),
        Event::End(_) => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(events: &[Event]) -> Vec<u64> {
        events
            .iter()
            .filter_map(|e| match e {
                Event::Line { seq, .. } => Some(*seq),
                Event::End(_) => None,
            })
            .collect()
    }

    #[test]
    fn a_viewer_resumes_after_its_last_line_and_is_told_what_the_ring_lost() {
        let s = Arc::new(Stream::new());
        for i in 0..(RING + 10) {
            s.push(
                Some(format!("2026-01-01T00:00:{:02}.000Z", i % 60)),
                &format!("step {i}"),
            );
        }
        let now = std::time::SystemTime::now();
        let j = s.join(From::After(RING as u64 + 5), now);
        assert_eq!(
            lines(&j.backlog),
            (RING as u64 + 6..=RING as u64 + 10).collect::<Vec<_>>()
        );
        assert_eq!(j.missed, 0);
        // The first ten lines left the ring: a viewer that saw line 3 missed 7.
        let j = s.join(From::After(3), now);
        assert_eq!((j.missed, lines(&j.backlog)[0]), (7, 11));
        let j = s.join(From::Tail(2), now);
        assert_eq!(lines(&j.backlog), [RING as u64 + 9, RING as u64 + 10]);
        s.end("the container ended");
        let j = s.join(From::Tail(0), now);
        assert!(matches!(j.backlog.as_slice(), [Event::End(_)]));
    }

    #[test]
    fn a_viewer_that_falls_a_channel_behind_is_told_how_far() {
        let s = Arc::new(Stream::new());
        let mut j = s.join(From::Tail(0), std::time::SystemTime::now());
        for i in 0..(CHANNEL + 100) {
            s.push(None, &format!("step {i}"));
        }
        let mut batch = Vec::new();
        assert_eq!(drain(&mut j.live, &mut batch, 10), Err(100));
        let frames = frames(&[Event::Line {
            seq: 1,
            json: r#"{"seq":1,"at":null,"text":"a"}"#.into(),
        }]);
        let v: serde_json::Value = serde_json::from_str(&frames[0]).unwrap();
        assert_eq!(v["lines"][0]["text"], "a");
    }
}
