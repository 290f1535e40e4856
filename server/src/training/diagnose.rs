//! `diagnose_training_job`: why a job fails, restarts or hangs, from its pods (phase,
//! restarts, exit code), the NCCL, EFA and GPU error lines in each pod's recent log (with
//! the pod, the line's place in the window read and its time) and the nodes those pods
//! ran on. It reads only; what it suggests next is read-only too (the nodes' own
//! diagnosis, the log around the error), since only a node's diagnosis can tell a
//! reboot or a replacement from a straggling rank.

use std::collections::BTreeMap;

use app::api::ApiError;
use app::api::diagnose::{DiagnoseTrainingJob, Diagnosis, Finding, Severity, Suggestion};
use app::api::training::LedgerEntry;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::LogParams;
use serde_json::json;

use app::api::training::NAMESPACE;

use super::read_job;
use crate::auth::Actor;
use crate::node::view::{HEALTH_LABEL, instance_of};
use crate::resources::kube as kubernetes;
use crate::service::{Handler, Service};
use crate::storage::region_of;

/// Lines of each pod's log read: enough to hold a watchdog's report and what led to it.
const WINDOW: i64 = 500;
/// The latest entries of the recovery ledger looked at: a restarted pod's log is gone
/// with it, its entry (pod, node, exit code or log rule) is what is left.
const RECENT: usize = 3;

/// A kind of error a log line shows, most telling first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Fault {
    /// NCCL's watchdog gave up on a collective (a rank stopped taking part).
    CollectiveTimeout,
    /// NCCL reported an error of its own or of the transport beneath it.
    Nccl,
    /// The EFA provider (libfabric, aws-ofi-nccl) failed.
    Efa,
    /// The GPU driver reported an Xid.
    Xid,
}

impl Fault {
    fn of(line: &str) -> Option<Fault> {
        let lower = line.to_ascii_lowercase();
        if line.contains("Watchdog caught collective operation timeout")
            || line.contains("Timeout at NCCL work")
        {
            Some(Fault::CollectiveTimeout)
        } else if (lower.contains("net/ofi")
            || lower.contains("libfabric")
            || (lower.contains("fi_") && lower.contains("efa")))
            && ["error", "fail", "abort", "timeout", "timed out"]
                .iter()
                .any(|w| lower.contains(w))
        {
            Some(Fault::Efa)
        } else if line.contains("NCCL WARN")
            || line.contains("ncclSystemError")
            || line.contains("ncclInternalError")
            || line.contains("ncclRemoteError")
            || line.contains("ncclUnhandledCudaError")
            || (line.contains("NCCL") && lower.contains("error"))
        {
            Some(Fault::Nccl)
        } else if line.contains("Xid") && line.contains("NVRM") {
            Some(Fault::Xid)
        } else {
            None
        }
    }

    fn said(self) -> &'static str {
        match self {
            Fault::CollectiveTimeout => "an NCCL collective timed out",
            Fault::Nccl => "NCCL reported an error",
            Fault::Efa => "the EFA transport failed",
            Fault::Xid => "the GPU driver reported an Xid error",
        }
    }
}

/// The first line of each kind in one pod's window, and how many lines had it.
#[derive(Debug, PartialEq)]
pub struct Hit {
    pub fault: Fault,
    /// 1-based, in the window read.
    pub line: usize,
    pub of: usize,
    pub at: Option<String>,
    pub text: String,
    pub count: usize,
}

/// The error lines of a log read with timestamps (`<RFC 3339> <text>`). Pure.
pub fn scan(lines: &[&str]) -> Vec<Hit> {
    let mut hits: BTreeMap<Fault, Hit> = BTreeMap::new();
    for (i, raw) in lines.iter().enumerate() {
        let (at, text) = match raw.split_once(' ') {
            Some((t, rest)) if t.len() >= 20 && t.as_bytes().get(4) == Some(&b'-') => {
                (Some(t.to_owned()), rest)
            }
            _ => (None, *raw),
        };
        let Some(fault) = Fault::of(text) else {
            continue;
        };
        hits.entry(fault)
            .and_modify(|h| h.count += 1)
            .or_insert(Hit {
                fault,
                line: i + 1,
                of: lines.len(),
                at,
                text: text.to_owned(),
                count: 1,
            });
    }
    hits.into_values().collect()
}

/// One pod of the job as the diagnosis needs it.
pub struct PodFacts {
    pub name: String,
    pub phase: String,
    pub restarts: i32,
    pub exit_code: Option<i32>,
    pub waiting: Option<String>,
    /// Its Kubernetes node, that node's instance id and health label.
    pub node: Option<(String, Option<String>, Option<String>)>,
    pub hits: Vec<Hit>,
    /// Why its log could not be read, if it could not.
    pub unread: Option<String>,
}

impl Handler<DiagnoseTrainingJob> for Service {
    async fn handle(&self, _: &Actor, r: DiagnoseTrainingJob) -> Result<Diagnosis, ApiError> {
        let cluster = r.name.as_str();
        let region = region_of(&self.store, cluster).await?;
        let client = kubernetes::connect(&self.aws, &region, cluster).await?;
        let job = read_job(&client, cluster, r.job.as_str()).await?;
        let pods = job.pods_among(&super::job::all_pods(&client).await?);
        let phase = job.phase(&pods);
        let failure = (phase == "failed").then(|| job.failure());
        let mut nodes: BTreeMap<String, (Option<String>, Option<String>)> = BTreeMap::new();
        let api = Api::<Pod>::namespaced(client.clone(), NAMESPACE);
        let node_api = Api::<Node>::all(client.clone());
        let ledger = job.ledger(&crate::clock::now()).entries;
        let recent = &ledger[ledger.len().saturating_sub(RECENT)..];
        let named = pods
            .iter()
            .filter_map(|p| p.spec.as_ref()?.node_name.clone())
            .chain(recent.iter().filter_map(|e| e.node.clone()));
        for n in named {
            if nodes.contains_key(&n) {
                continue;
            }
            let node = node_api
                .get_opt(&n)
                .await
                .map_err(|e| kubernetes::upstream("get Node", e))?;
            let health = node
                .as_ref()
                .and_then(|n| n.metadata.labels.as_ref()?.get(HEALTH_LABEL).cloned());
            nodes.insert(n, (node.as_ref().and_then(instance_of), health));
        }
        let mut facts = Vec::new();
        for pod in &pods {
            let name = pod.metadata.name.clone().unwrap_or_default();
            let node_name = pod.spec.as_ref().and_then(|s| s.node_name.clone());
            let params = LogParams {
                tail_lines: Some(WINDOW),
                timestamps: true,
                ..LogParams::default()
            };
            let (hits, unread) = match api.logs(&name, &params).await {
                Ok(text) => (scan(&text.lines().collect::<Vec<_>>()), None),
                Err(kube::Error::Api(s)) => (Vec::new(), Some(s.message)),
                Err(e) => return Err(kubernetes::upstream(&format!("log Pod/{name}"), e)),
            };
            let status = pod.status.as_ref();
            let first = status.and_then(|s| s.container_statuses.as_ref()?.first().cloned());
            facts.push(PodFacts {
                phase: status
                    .and_then(|s| s.phase.clone())
                    .unwrap_or_else(|| "Pending".into()),
                restarts: first.as_ref().map_or(0, |c| c.restart_count),
                // Its exit, or the last one before a restart in place.
                exit_code: first.as_ref().and_then(|c| {
                    [c.state.as_ref(), c.last_state.as_ref()]
                        .into_iter()
                        .flatten()
                        .find_map(|s| s.terminated.as_ref())
                        .map(|t| t.exit_code)
                }),
                waiting: kubernetes::not_running(pod),
                node: node_name.map(|n| {
                    let (id, health) = nodes.get(&n).cloned().unwrap_or_default();
                    (n, id, health)
                }),
                name,
                hits,
                unread,
            });
        }
        let recent: Vec<(LedgerEntry, Option<String>)> = recent
            .iter()
            .map(|e| {
                let id = e.node.as_ref().and_then(|n| nodes.get(n)?.0.clone());
                (e.clone(), id)
            })
            .collect();
        Ok(diagnose(
            cluster,
            r.job.as_str(),
            phase,
            failure,
            &facts,
            &recent,
        ))
    }
}

/// The diagnosis of job `job` on cluster `cluster`, in phase `phase` (failing for
/// `failure`), given its pods and its latest recovery ledger entries (each with the
/// instance id of its node). Pure.
pub fn diagnose(
    cluster: &str,
    job: &str,
    phase: &str,
    failure: Option<String>,
    pods: &[PodFacts],
    recent: &[(LedgerEntry, Option<String>)],
) -> Diagnosis {
    let mut findings = Vec::new();
    findings.push(Finding {
        severity: if failure.is_some() {
            Severity::Error
        } else {
            Severity::Info
        },
        summary: format!(
            "the job is {phase}, {} pod{}",
            pods.len(),
            if pods.len() == 1 { "" } else { "s" }
        ),
        evidence: failure,
    });
    let mut suspects: Vec<(String, &PodFacts)> = Vec::new();
    for p in pods {
        let on = p
            .node
            .as_ref()
            .map(|(n, id, _)| format!(" on {}", id.as_deref().unwrap_or(n)))
            .unwrap_or_default();
        for h in &p.hits {
            let at =
                h.at.as_deref()
                    .map(|t| format!(" at {t}"))
                    .unwrap_or_default();
            let more = if h.count > 1 {
                format!(" ({} such lines)", h.count)
            } else {
                String::new()
            };
            findings.push(Finding {
                severity: Severity::Error,
                summary: format!(
                    "{} in pod {}{on}: line {} of its last {}{at}{more}",
                    h.fault.said(),
                    p.name,
                    h.line,
                    h.of
                ),
                evidence: Some(h.text.clone()),
            });
        }
        if !p.hits.is_empty() {
            suspects.push((p.name.clone(), p));
        }
        if let Some(code) = p.exit_code.filter(|c| *c != 0) {
            let meaning = match code {
                134 => ": SIGABRT, as PyTorch ends a process after a collective timeout",
                137 => ": SIGKILL, most often the memory limit (OOMKilled) or an eviction",
                139 => ": SIGSEGV",
                _ => "",
            };
            findings.push(Finding {
                severity: Severity::Warning,
                summary: format!(
                    "pod {} exited with code {code}{meaning}; restarted {} times",
                    p.name, p.restarts
                ),
                evidence: None,
            });
        } else if p.restarts > 0 {
            findings.push(Finding {
                severity: Severity::Warning,
                summary: format!("pod {} restarted {} times", p.name, p.restarts),
                evidence: None,
            });
        }
        if let Some(why) = &p.waiting {
            findings.push(Finding {
                severity: Severity::Warning,
                summary: format!("pod {} is not running: {why}", p.name),
                evidence: None,
            });
        }
        if let Some((node, _, Some(health))) = &p.node
            && health != "Schedulable"
        {
            findings.push(Finding {
                severity: Severity::Warning,
                summary: format!("pod {}'s node {node} is {health}", p.name),
                evidence: None,
            });
        }
        if let Some(why) = &p.unread {
            findings.push(Finding {
                severity: Severity::Info,
                summary: format!("pod {}'s log could not be read: {why}", p.name),
                evidence: None,
            });
        }
    }
    for (e, _) in recent {
        let at =
            e.at.as_deref()
                .map(|t| format!(" at {t}"))
                .unwrap_or_default();
        findings.push(Finding {
            severity: Severity::Warning,
            summary: format!("attempt {} ended{at} ({})", e.attempt, e.action),
            evidence: Some(e.message.clone()),
        });
    }
    // Stable: within a severity, pods in order.
    findings.sort_by_key(|f| std::cmp::Reverse(f.severity));

    let mut suggestions = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    // The ranks that reported first, and the nodes under every rank in trouble.
    for (_, p) in &suspects {
        if let Some((_, Some(id), _)) = &p.node
            && seen.insert(id.clone())
        {
            suggestions.push(Suggestion::new(
                "diagnose_node",
                json!({ "name": cluster, "node_id": id }),
                format!("{} ran there: its GPUs, EFA and health agent decide between waiting, a reboot and a replacement", p.name),
            ));
        }
    }
    for p in pods {
        if let Some((_, Some(id), Some(health))) = &p.node
            && health != "Schedulable"
            && seen.insert(id.clone())
        {
            suggestions.push(Suggestion::new(
                "diagnose_node",
                json!({ "name": cluster, "node_id": id }),
                format!("{} runs on a node marked {health}", p.name),
            ));
        }
    }
    // The nodes under the latest failures, newest first: the pods that ran there may be
    // gone with their logs.
    for (e, id) in recent.iter().rev() {
        if let Some(id) = id
            && seen.insert(id.clone())
        {
            suggestions.push(Suggestion::new(
                "diagnose_node",
                json!({ "name": cluster, "node_id": id }),
                format!(
                    "attempt {} ended there ({}): its GPUs, EFA and health agent decide between waiting, a reboot and a replacement",
                    e.attempt,
                    e.pod.as_deref().unwrap_or("a pod")
                ),
            ));
        }
    }
    if let Some((pod, _)) = suspects.first() {
        suggestions.push(Suggestion::new(
            "get_training_job_logs",
            json!({ "name": cluster, "job": job, "pod": pod, "tail_lines": 200 }),
            "the lines before the first error: which step and collective it was in",
        ));
    }
    Diagnosis {
        subject: format!("training_job/{cluster}/{job}"),
        findings,
        suggestions,
        remaining: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use app::api::command::Effect;

    const TIMEOUT: &str = "[rank1]:[E1206 05:12:09.123456 42 ProcessGroupNCCL.cpp:632] [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=41, OpType=ALLREDUCE, NumelIn=131072, NumelOut=131072, Timeout(ms)=600000) ran for 600041 milliseconds before timing out.";

    fn log() -> Vec<String> {
        let mut lines: Vec<String> = (0..3)
            .map(|i| {
                format!("2026-12-06T05:0{i}:00.000000000Z [pytorch] sft-pod-1 step {i}: loss=2.4")
            })
            .collect();
        lines.push(format!("2026-12-06T05:12:09.000000000Z {TIMEOUT}"));
        lines.push("2026-12-06T05:12:09.000000000Z [rank1]:[E1206 05:12:09.123789 42 ProcessGroupNCCL.cpp:2168] [PG 0 (default_pg) Rank 1] Timeout at NCCL work: 41, last enqueued NCCL work: 41, last completed NCCL work: 40.".into());
        lines.push("2026-12-06T05:12:09.000000000Z terminate called after throwing an instance of 'c10::DistBackendError'".into());
        lines
    }

    #[test]
    fn a_watchdog_timeout_is_found_with_its_place_and_time() {
        let lines = log();
        let hits = scan(&lines.iter().map(String::as_str).collect::<Vec<_>>());
        assert_eq!(hits.len(), 1, "{hits:?}");
        let h = &hits[0];
        assert_eq!(
            (h.fault, h.line, h.of, h.count),
            (Fault::CollectiveTimeout, 4, 6, 2)
        );
        assert_eq!(h.at.as_deref(), Some("2026-12-06T05:12:09.000000000Z"));
        assert_eq!(h.text, TIMEOUT);
    }

    #[test]
    fn other_faults_are_told_apart_and_ordinary_lines_are_not_faults() {
        let kinds: Vec<Option<Fault>> = [
            "ip-10-1-2-3:42:99 [0] NCCL INFO NET/OFI Selected Provider is efa",
            "NET/OFI Request 0x1 completed with error. RC: 21. Error: unknown error",
            "ip:42:99 [0] NCCL WARN Cuda failure 'out of memory'",
            "NVRM: Xid (PCI:0000:b9:00): 79, GPU has fallen off the bus.",
            "[pytorch] sft-pod-0 step 7: loss=2.1 tokens/s=41007",
        ]
        .iter()
        .map(|l| Fault::of(l))
        .collect();
        // NCCL INFO lines naming the provider are news only with an error in them.
        assert_eq!(
            kinds,
            [
                None,
                Some(Fault::Efa),
                Some(Fault::Nccl),
                Some(Fault::Xid),
                None
            ]
        );
    }

    fn pod(name: &str, node: &str, id: &str, hits: Vec<Hit>, exit: Option<i32>) -> PodFacts {
        PodFacts {
            name: name.into(),
            phase: if exit.is_some() { "Failed" } else { "Running" }.into(),
            restarts: i32::from(exit.is_some()),
            exit_code: exit,
            waiting: None,
            node: Some((node.into(), Some(id.into()), Some("Schedulable".into()))),
            hits,
            unread: None,
        }
    }

    #[test]
    fn the_rank_that_timed_out_points_at_its_node_and_its_log() {
        let lines = log();
        let hits = scan(&lines.iter().map(String::as_str).collect::<Vec<_>>());
        let pods = [
            pod("sft-pod-0", "hyperpod-i-0a", "i-0a", Vec::new(), None),
            pod("sft-pod-1", "hyperpod-i-0b", "i-0b", hits, Some(134)),
        ];
        let d = diagnose("ml", "sft", "restarting", None, &pods, &[]);
        assert_eq!(d.subject, "training_job/ml/sft");
        assert_eq!(d.findings[0].severity, Severity::Error);
        assert_eq!(
            d.findings[0].summary,
            "an NCCL collective timed out in pod sft-pod-1 on i-0b: line 4 of its last 6 at 2026-12-06T05:12:09.000000000Z (2 such lines)"
        );
        assert!(d.findings.iter().any(|f| {
            f.summary
                .starts_with("pod sft-pod-1 exited with code 134: SIGABRT")
        }));
        assert_eq!(
            d.suggested(),
            [
                ("diagnose_node", Effect::ReadOnly),
                ("get_training_job_logs", Effect::ReadOnly)
            ]
        );
        assert_eq!(d.suggestions[0].arguments["node_id"], "i-0b");
        assert_eq!(d.suggestions[1].arguments["pod"], "sft-pod-1");
    }

    #[test]
    fn a_quiet_running_job_suggests_nothing() {
        let pods = [pod("sft-pod-0", "hyperpod-i-0a", "i-0a", Vec::new(), None)];
        let d = diagnose("ml", "sft", "running", None, &pods, &[]);
        assert!(d.suggestions.is_empty());
        assert_eq!(d.findings.len(), 1);
    }
}
