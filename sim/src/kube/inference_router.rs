//! The router the HyperPod inference operator runs in front of an InferenceEndpointConfig's
//! or a JumpStartModel's workers when intelligent routing is on, as the service proxy
//! finds it behind the
//! routing Service. The sim runs no process, so what the router does follows from its
//! command line alone — the vLLM production-stack router's flags, whose routing logics
//! are the CRD's strategies — and the operator builds that line with [`Router::args`],
//! so what it asks for and what the proxy reads cannot drift apart. Its choice of worker
//! must be deterministic (tests assert where a request went), so "prefix" and "KV"
//! awareness are a hash of the prompt's start: requests that share it share a worker.

use axum::http::HeaderMap;
use serde_json::Value;

use super::model_server::{content_text, flag};
use super::store::Obj;
use crate::world::fnv1a;

/// The router's program; the first word of its container's command.
pub const PROGRAM: &str = "vllm-router";
/// How many characters of a prompt make the prefix that prefix-aware routing keys on: a
/// system prompt and the start of a conversation, not the turn that differs.
const PREFIX_CHARS: usize = 256;

/// The CRD's `intelligentRoutingSpec.routingStrategy` values, which are the router's
/// `--routing-logic` names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logic {
    PrefixAware,
    KvAware,
    Session,
    RoundRobin,
}

impl Logic {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "prefixaware" => Some(Self::PrefixAware),
            "kvaware" => Some(Self::KvAware),
            "session" => Some(Self::Session),
            "roundrobin" => Some(Self::RoundRobin),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::PrefixAware => "prefixaware",
            Self::KvAware => "kvaware",
            Self::Session => "session",
            Self::RoundRobin => "roundrobin",
        }
    }
}

/// A router as its command line configures it.
#[derive(Clone, Debug, PartialEq)]
pub struct Router {
    /// The port it listens on.
    pub port: u16,
    /// Where its Kubernetes service discovery looks for workers: namespace and the
    /// `k=v[,k=v]` label selector.
    pub namespace: String,
    pub selector: String,
    /// The port it reaches each worker pod on.
    pub worker_port: u16,
    pub logic: Logic,
    /// The request header that names a session (session routing).
    pub session_key: Option<String>,
}

impl Router {
    /// The container arguments that start this router.
    pub fn args(&self) -> Vec<String> {
        let mut args: Vec<String> = [
            "--host",
            "0.0.0.0",
            "--port",
            &self.port.to_string(),
            "--service-discovery",
            "k8s",
            "--k8s-namespace",
            &self.namespace,
            "--k8s-label-selector",
            &self.selector,
            "--k8s-port",
            &self.worker_port.to_string(),
            "--routing-logic",
            self.logic.as_str(),
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        if let Some(key) = &self.session_key {
            args.extend(["--session-key".to_owned(), key.clone()]);
        }
        args
    }

    /// The router `pod`'s first container runs, if it runs one.
    pub fn of(pod: &Value) -> Option<Self> {
        let container = &pod["spec"]["containers"][0];
        let words = |k: &str| -> Vec<String> {
            container[k]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|w| w.as_str().map(str::to_owned))
                .collect()
        };
        let command = words("command");
        let program = command.first()?;
        if program.rsplit('/').next() != Some(PROGRAM) {
            return None;
        }
        let args: Vec<String> = command[1..].iter().cloned().chain(words("args")).collect();
        Some(Self {
            port: flag(&args, "--port")?.parse().ok()?,
            namespace: flag(&args, "--k8s-namespace")?.to_owned(),
            selector: flag(&args, "--k8s-label-selector")?.to_owned(),
            worker_port: flag(&args, "--k8s-port")?.parse().ok()?,
            logic: Logic::parse(flag(&args, "--routing-logic").unwrap_or("roundrobin"))?,
            session_key: flag(&args, "--session-key").map(str::to_owned),
        })
    }

    /// Whether pod `labels` are what the router discovers.
    pub fn selects(&self, labels: &Value) -> bool {
        self.selector
            .split(',')
            .filter(|kv| !kv.is_empty())
            .all(|kv| match kv.split_once('=') {
                Some((k, v)) => labels[k.trim()].as_str() == Some(v.trim()),
                None => false,
            })
    }

    /// Which of `workers` (the ready pods it discovered, in a stable order) a request
    /// with `body` and `headers` goes to; `turn` hands out round-robin turns among `n`.
    pub fn pick<'a>(
        &self,
        workers: &'a [Obj],
        body: &[u8],
        headers: &HeaderMap,
        turn: impl FnOnce(usize) -> usize,
    ) -> Option<&'a Obj> {
        if workers.is_empty() {
            return None;
        }
        let by_hash = |key: &str| &workers[(fnv1a(key) % workers.len() as u64) as usize];
        match self.logic {
            Logic::PrefixAware | Logic::KvAware => Some(by_hash(&prefix(body))),
            Logic::Session => {
                let session = self
                    .session_key
                    .as_deref()
                    .and_then(|k| headers.get(k))
                    .and_then(|v| v.to_str().ok());
                match session {
                    Some(s) => Some(by_hash(s)),
                    None => workers.get(turn(workers.len())),
                }
            }
            Logic::RoundRobin => workers.get(turn(workers.len())),
        }
    }
}

/// The start of a request's prompt: its messages' text (chat) or its prompt (text
/// completion), cut at [`PREFIX_CHARS`]. A body that is not such JSON keys as itself.
fn prefix(body: &[u8]) -> String {
    let text = match serde_json::from_slice::<Value>(body) {
        Ok(req) => match (&req["messages"], &req["prompt"]) {
            (Value::Array(messages), _) => messages
                .iter()
                .map(|m| content_text(&m["content"]))
                .collect::<Vec<_>>()
                .join("\n"),
            (_, Value::String(p)) => p.clone(),
            (_, Value::Array(ps)) => ps
                .first()
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
            _ => String::new(),
        },
        Err(_) => String::from_utf8_lossy(body).into_owned(),
    };
    text.chars().take(PREFIX_CHARS).collect()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::json;

    use super::*;

    fn router(logic: Logic) -> Router {
        Router {
            port: 8080,
            namespace: "ml".into(),
            selector: "app=llama".into(),
            worker_port: 8000,
            logic,
            session_key: (logic == Logic::Session).then(|| "x-session-id".to_owned()),
        }
    }

    #[test]
    fn the_command_line_it_is_given_is_the_one_it_reads() {
        for logic in [
            Logic::PrefixAware,
            Logic::KvAware,
            Logic::Session,
            Logic::RoundRobin,
        ] {
            let r = router(logic);
            let pod = json!({ "spec": { "containers": [
                { "name": "router-container", "command": [PROGRAM], "args": r.args() }] } });
            assert_eq!(Router::of(&pod), Some(r));
        }
        let vllm = json!({ "spec": { "containers": [{ "command": ["vllm", "serve", "m"] }] } });
        assert_eq!(Router::of(&vllm), None);
        assert!(router(Logic::RoundRobin).selects(&json!({ "app": "llama", "x": "y" })));
        assert!(!router(Logic::RoundRobin).selects(&json!({ "app": "other" })));
    }

    #[test]
    fn a_shared_prefix_goes_to_one_worker_and_turns_go_round() {
        let workers: Vec<Obj> = (0..3)
            .map(|i| Arc::new(json!({ "metadata": { "name": format!("w{i}") } })))
            .collect();
        let ask = |system: &str, user: &str| {
            json!({ "messages": [{ "role": "system", "content": system },
                                 { "role": "user", "content": user }] })
            .to_string()
        };
        let long_system = "You are a careful assistant. ".repeat(20);
        let r = router(Logic::PrefixAware);
        let headers = HeaderMap::new();
        let first = r.pick(
            &workers,
            ask(&long_system, "one").as_bytes(),
            &headers,
            |_| 0,
        );
        let again = r.pick(
            &workers,
            ask(&long_system, "two").as_bytes(),
            &headers,
            |_| 0,
        );
        assert_eq!(first, again, "the same prefix, the same worker");

        let r = router(Logic::RoundRobin);
        let picks: Vec<_> = (0..3)
            .map(|t| {
                r.pick(&workers, b"{}", &headers, |n| t % n).unwrap()["metadata"]["name"].clone()
            })
            .collect();
        assert_eq!(picks, ["w0", "w1", "w2"]);

        let r = router(Logic::Session);
        let mut headers = HeaderMap::new();
        headers.insert("x-session-id", "alice".parse().unwrap());
        let a = r.pick(&workers, b"{}", &headers, |_| 0);
        let b = r.pick(&workers, b"{\"other\": 1}", &headers, |_| 2);
        assert_eq!(a, b, "one session, one worker");
        assert!(r.pick(&[], b"{}", &headers, |_| 0).is_none());
    }
}
