//! `diagnose_node`: what ails one HyperPod node, read now from HyperPod (its status),
//! the cluster's node recovery mode, and the node's Kubernetes side: the four-part mark
//! HyperPod's health-monitoring agent leaves (health label, fault labels, the fault's
//! condition, its details annotation), kubelet's conditions, recent Warning events and
//! the pods a reboot or replacement would stop. It changes nothing; its suggestions
//! escalate one step at a time: wait for HyperPod's own recovery, then reboot, then
//! replace.

use ::kube::api::{Api, ListParams};
use app::api::ApiError;
use app::api::clusters::NodeInfo;
use app::api::diagnose::{DiagnoseNode, Diagnosis, Finding, Severity, Suggestion};
use k8s_openapi::api::core::v1::{Event, Node, NodeCondition, Pod};
use serde_json::json;

use super::view::{HEALTH_LABEL, Place, instance_of};
use crate::auth::Actor;
use crate::cluster::components::HYPERPOD_NODE_LABEL;
use crate::resources::kube as kubernetes;
use crate::service::{Handler, Service};

/// The health-monitoring agent's fault labels. AWS's pages spell them singular, some of
/// its tools plural: either is read.
const FAULT_TYPE: [&str; 2] = [
    "sagemaker.amazonaws.com/fault-type",
    "sagemaker.amazonaws.com/fault-types",
];
const FAULT_REASON: [&str; 2] = [
    "sagemaker.amazonaws.com/fault-reason",
    "sagemaker.amazonaws.com/fault-reasons",
];
/// kubelet's own conditions; any other is an agent's (the health-monitoring agent's).
const KUBELET: [&str; 5] = [
    "Ready",
    "MemoryPressure",
    "DiskPressure",
    "PIDPressure",
    "NetworkUnavailable",
];
/// The Warning events shown, newest first.
const EVENTS: usize = 5;

impl Handler<DiagnoseNode> for Service {
    async fn handle(&self, _: &Actor, r: DiagnoseNode) -> Result<Diagnosis, ApiError> {
        let name = r.name.as_str();
        let id = r.node_id.as_str();
        let cluster = crate::cluster::required(&self.store, name).await?;
        let not_found = || ApiError::NotFound {
            resource: "node".into(),
            name: format!("{name}/{id}"),
        };
        let place = Place::of(&cluster).ok_or_else(not_found)?;
        // A diagnosis reads now, not the list's recent read.
        let snapshot = self
            .nodes
            .of(&self.aws, &place)
            .hyperpod(&self.store, true)
            .await?;
        let node = snapshot
            .nodes
            .iter()
            .find(|n| n.node_id == id)
            .ok_or_else(not_found)?;
        let sm = self.aws.sagemaker(&place.region);
        let recovery = crate::resources::sagemaker::cluster::describe(&sm, &place.hyperpod, false)
            .await?
            .and_then(|c| c.node_recovery);
        let client = kubernetes::connect(&self.aws, &place.region, &place.eks).await?;
        let kube = kube_side(&client, id).await?;
        Ok(diagnose(name, node, recovery.as_deref(), &kube))
    }
}

/// What Kubernetes says of the node: the Node, its recent events, the pods on it.
#[derive(Default)]
pub struct KubeSide {
    pub node: Option<Node>,
    pub events: Vec<Event>,
    pub pods: Vec<Pod>,
}

async fn kube_side(client: &::kube::Client, id: &str) -> Result<KubeSide, ApiError> {
    let selector = format!("{}={}", HYPERPOD_NODE_LABEL.0, HYPERPOD_NODE_LABEL.1);
    let nodes = Api::<Node>::all(client.clone())
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(|e| kubernetes::upstream("list Node", e))?;
    let Some(node) = nodes
        .items
        .into_iter()
        .find(|n| instance_of(n).as_deref() == Some(id))
    else {
        return Ok(KubeSide::default());
    };
    let node_name = node.metadata.name.clone().unwrap_or_default();
    let on_node = format!("involvedObject.kind=Node,involvedObject.name={node_name}");
    let events = Api::<Event>::all(client.clone())
        .list(&ListParams::default().fields(&on_node))
        .await
        .map_err(|e| kubernetes::upstream("list Event", e))?
        .items
        .into_iter()
        .filter(|e| e.involved_object.name.as_deref() == Some(node_name.as_str()))
        .collect();
    let placed = format!("spec.nodeName={node_name}");
    let pods = Api::<Pod>::all(client.clone())
        .list(&ListParams::default().fields(&placed))
        .await
        .map_err(|e| kubernetes::upstream("list Pod", e))?
        .items
        .into_iter()
        .filter(|p| {
            p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node_name.as_str())
        })
        .filter(|p| {
            let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
            !matches!(phase, Some("Succeeded" | "Failed"))
        })
        .collect();
    Ok(KubeSide {
        node: Some(node),
        events,
        pods,
    })
}

fn label<'a>(node: &'a Node, keys: &[&str]) -> Option<&'a str> {
    let labels = node.metadata.labels.as_ref()?;
    keys.iter().find_map(|k| labels.get(*k)).map(String::as_str)
}

fn condition_evidence(c: &NodeCondition) -> Option<String> {
    c.message.clone().filter(|m| !m.is_empty())
}

/// The diagnosis of HyperPod node `node` of cluster `cluster`, under node recovery
/// `recovery` (`Automatic` or `None`), given what Kubernetes says of it. Pure.
pub fn diagnose(
    cluster: &str,
    node: &NodeInfo,
    recovery: Option<&str>,
    kube: &KubeSide,
) -> Diagnosis {
    let id = node.node_id.as_str();
    let mut findings = Vec::new();
    let automatic = recovery == Some("Automatic");
    let health = kube.node.as_ref().and_then(|n| label(n, &[HEALTH_LABEL]));
    let conditions: &[NodeCondition] = kube
        .node
        .as_ref()
        .and_then(|n| n.status.as_ref()?.conditions.as_deref())
        .unwrap_or_default();

    // What the health-monitoring agent found: its condition is the fault's type.
    let mut agent_fault = false;
    for c in conditions
        .iter()
        .filter(|c| !KUBELET.contains(&c.type_.as_str()))
    {
        let reason = c.reason.as_deref().unwrap_or("no reason given");
        if c.status == "True" {
            agent_fault = true;
            findings.push(Finding {
                severity: Severity::Error,
                summary: format!(
                    "HyperPod's health-monitoring agent reports {} ({reason})",
                    c.type_
                ),
                evidence: condition_evidence(c),
            });
        } else {
            let since = c
                .last_transition_time
                .as_ref()
                .map(|t| format!(" since {}", t.0))
                .unwrap_or_default();
            findings.push(Finding {
                severity: Severity::Info,
                summary: format!(
                    "an earlier fault, {} ({reason}), is cleared{since}",
                    c.type_
                ),
                evidence: condition_evidence(c),
            });
        }
    }
    if let Some(n) = &kube.node
        && let (Some(kind), Some(reason)) = (label(n, &FAULT_TYPE), label(n, &FAULT_REASON))
        && !agent_fault
    {
        agent_fault = true;
        findings.push(Finding {
            severity: Severity::Error,
            summary: format!("the node is labelled with a fault: {kind} ({reason})"),
            evidence: None,
        });
    }
    let pending = match health {
        Some("UnschedulablePendingReboot") => Some("reboot"),
        Some("UnschedulablePendingReplacement") => Some("replacement"),
        _ => None,
    };
    if let Some(what) = pending {
        findings.push(Finding {
            severity: Severity::Warning,
            summary: format!(
                "marked for {what} ({HEALTH_LABEL}={}); no new pod is scheduled on it",
                health.unwrap_or_default()
            ),
            evidence: None,
        });
    } else if health == Some("Unschedulable") {
        findings.push(Finding {
            severity: Severity::Info,
            summary: "deep health checks are running on it; it takes no pods until they pass"
                .into(),
            evidence: None,
        });
    }

    // kubelet's side.
    let ready = conditions.iter().find(|c| c.type_ == "Ready");
    match (kube.node.as_ref(), ready) {
        (None, _) => findings.push(Finding {
            severity: Severity::Warning,
            summary: "no Kubernetes Node runs on this instance (it has not joined, or has left)"
                .into(),
            evidence: None,
        }),
        (Some(_), Some(c)) if c.status != "True" => findings.push(Finding {
            severity: Severity::Error,
            summary: format!(
                "kubelet is not Ready ({})",
                c.reason.as_deref().unwrap_or("no reason given")
            ),
            evidence: condition_evidence(c),
        }),
        _ => {}
    }
    for c in conditions
        .iter()
        .filter(|c| c.type_ != "Ready" && KUBELET.contains(&c.type_.as_str()) && c.status == "True")
    {
        findings.push(Finding {
            severity: Severity::Warning,
            summary: format!("kubelet reports {}", c.type_),
            evidence: condition_evidence(c),
        });
    }

    // HyperPod's side.
    let recovering = match node.status.as_str() {
        "Running" => false,
        "Pending" if pending.is_some() => true,
        "ShuttingDown" => true,
        status => {
            findings.push(Finding {
                severity: if status == "Failure" {
                    Severity::Error
                } else {
                    Severity::Warning
                },
                summary: format!("HyperPod reports the instance {status}"),
                evidence: node.message.clone(),
            });
            false
        }
    };
    if recovering {
        findings.push(Finding {
            severity: Severity::Info,
            summary: format!(
                "HyperPod is {} it now ({})",
                if node.status == "ShuttingDown" {
                    "replacing"
                } else {
                    "rebooting"
                },
                node.status
            ),
            evidence: node.message.clone(),
        });
    }

    let mut warnings: Vec<&Event> = kube
        .events
        .iter()
        .filter(|e| e.type_.as_deref() == Some("Warning"))
        .collect();
    warnings.sort_by_key(|e| std::cmp::Reverse(event_time(e)));
    for e in warnings.iter().take(EVENTS) {
        let count = e
            .count
            .filter(|c| *c > 1)
            .map(|c| format!(", {c} times"))
            .unwrap_or_default();
        findings.push(Finding {
            severity: Severity::Info,
            summary: format!(
                "event {}{count}, last at {}",
                e.reason.as_deref().unwrap_or("(no reason)"),
                event_time(e)
            ),
            evidence: e.message.clone(),
        });
    }
    let troubled =
        agent_fault || pending.is_some() || findings.iter().any(|f| f.severity == Severity::Error);
    if !kube.pods.is_empty() && troubled {
        let names: Vec<String> = kube
            .pods
            .iter()
            .take(5)
            .map(|p| {
                format!(
                    "{}/{}",
                    p.metadata.namespace.as_deref().unwrap_or("default"),
                    p.metadata.name.as_deref().unwrap_or_default()
                )
            })
            .collect();
        let more = kube.pods.len().saturating_sub(names.len());
        let more = if more > 0 {
            format!(" and {more} more")
        } else {
            String::new()
        };
        findings.push(Finding {
            severity: Severity::Warning,
            summary: format!(
                "{} pods run on it ({}{more}): a reboot or replacement stops them",
                kube.pods.len(),
                names.join(", ")
            ),
            evidence: None,
        });
    }
    if !troubled && findings.iter().all(|f| f.severity == Severity::Info) {
        findings.insert(
            0,
            Finding {
                severity: Severity::Info,
                summary: format!(
                    "healthy: HyperPod {}, kubelet Ready, {}",
                    node.status,
                    health.unwrap_or("no health label")
                ),
                evidence: None,
            },
        );
    }
    findings.sort_by_key(|f| std::cmp::Reverse(f.severity));

    let nodes = json!({ "name": cluster, "node_ids": [id] });
    let follow = Suggestion::new(
        "list_nodes",
        json!({ "name": cluster, "group": node.instance_group, "refresh": true }),
        "HyperPod recovers it on its own (node recovery Automatic): follow it until it is Running and Schedulable",
    );
    let reboot = |why: &str| Suggestion::new("reboot_nodes", nodes.clone(), why);
    let replace = |why: &str| Suggestion::new("replace_nodes", nodes.clone(), why);
    let kubelet_down = ready.is_some_and(|c| c.status != "True");
    let suggestions = if recovering || (pending.is_some() && automatic) {
        let mut s = vec![follow];
        if pending == Some("reboot") || node.status == "Pending" {
            s.push(replace(
                "only if the fault comes back after HyperPod's reboot: a new instance, its volumes wiped",
            ));
        }
        s
    } else if pending == Some("replacement") {
        vec![replace(
            "the health agent asks for a new instance (node recovery is not Automatic): its volumes are wiped",
        )]
    } else if pending == Some("reboot") || agent_fault || kubelet_down || node.status == "Failure" {
        vec![
            reboot("first: a reboot keeps the instance and its volumes"),
            replace("if the fault persists after the reboot: a new instance, its volumes wiped"),
        ]
    } else {
        Vec::new()
    };
    Diagnosis {
        subject: format!("node/{cluster}/{id}"),
        findings,
        suggestions,
        remaining: None,
    }
}

fn event_time(e: &Event) -> String {
    e.last_timestamp
        .as_ref()
        .map(|t| t.0.to_string())
        .or_else(|| e.event_time.as_ref().map(|t| t.0.to_string()))
        .or_else(|| e.first_timestamp.as_ref().map(|t| t.0.to_string()))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use app::api::command::Effect;
    use serde_json::Value;

    fn hyperpod(status: &str) -> NodeInfo {
        serde_json::from_value(json!({
            "node_id": "i-0a", "instance_group": "gpu", "instance_type": "ml.g5.8xlarge",
            "status": status, "health": if status == "Running" { "healthy" } else { "pending" },
            "message": null, "launch_time": null,
        }))
        .unwrap()
    }

    /// A Node as HyperPod's agent leaves it: with its fault's condition (`fault`: its
    /// status) or none.
    fn node(health: &str, fault: Option<&str>, ready: &str) -> Node {
        let mut labels =
            json!({ HEALTH_LABEL: health, HYPERPOD_NODE_LABEL.0: HYPERPOD_NODE_LABEL.1 });
        let mut conditions =
            vec![json!({ "type": "Ready", "status": ready, "reason": "KubeletReady" })];
        if let Some(status) = fault {
            // The fault's labels go once it is cleared; its condition stays, False.
            if status == "True" {
                labels["sagemaker.amazonaws.com/fault-type"] = json!("NvidiaErrorReboot");
                labels["sagemaker.amazonaws.com/fault-reason"] = json!("XidHardwareFailure");
            }
            conditions.push(json!({ "type": "NvidiaErrorReboot", "status": status,
                "reason": "XidHardwareFailure", "message": "NVRM: Xid 79, GPU has fallen off the bus." }));
        }
        serde_json::from_value(json!({
            "metadata": { "name": "hyperpod-i-0a", "labels": labels },
            "spec": { "providerID": "aws:///us-east-1a/sagemaker/cluster/ml-i-0a" },
            "status": { "conditions": conditions },
        }))
        .unwrap()
    }

    fn side(node: Node, pods: usize) -> KubeSide {
        let pod = |i: usize| -> Pod {
            serde_json::from_value(json!({ "metadata": { "name": format!("train-{i}"), "namespace": "default" },
                                           "spec": { "containers": [], "nodeName": "hyperpod-i-0a" } }))
            .unwrap()
        };
        let event: Event = serde_json::from_value(json!({
            "metadata": { "name": "e1", "namespace": "default" },
            "involvedObject": { "kind": "Node", "name": "hyperpod-i-0a" },
            "type": "Warning", "reason": "XidHardwareFailure", "message": "Xid 79",
            "lastTimestamp": "2026-12-06T05:00:00Z", "count": 2,
        }))
        .unwrap();
        KubeSide {
            node: Some(node),
            events: vec![event],
            pods: (0..pods).map(pod).collect(),
        }
    }

    #[test]
    fn an_agent_fault_under_automatic_recovery_is_waited_for_then_escalated_to_replacement() {
        let kube = side(node("UnschedulablePendingReboot", Some("True"), "True"), 2);
        let d = diagnose("ml", &hyperpod("Running"), Some("Automatic"), &kube);
        assert_eq!(d.subject, "node/ml/i-0a");
        assert_eq!(d.findings[0].severity, Severity::Error);
        assert!(
            d.findings[0]
                .summary
                .contains("NvidiaErrorReboot (XidHardwareFailure)"),
            "{d:#?}"
        );
        assert!(
            d.findings[0]
                .evidence
                .as_deref()
                .unwrap()
                .contains("fallen off the bus")
        );
        let said: Vec<&str> = d.findings.iter().map(|f| f.summary.as_str()).collect();
        assert!(
            said.iter().any(|s| s.starts_with("marked for reboot")),
            "{said:?}"
        );
        assert!(
            said.iter()
                .any(|s| s.starts_with("2 pods run on it (default/train-0, default/train-1)")),
            "{said:?}"
        );
        assert!(
            said.iter()
                .any(|s| s.starts_with("event XidHardwareFailure, 2 times")),
            "{said:?}"
        );
        assert_eq!(
            d.suggested(),
            [
                ("list_nodes", Effect::ReadOnly),
                ("replace_nodes", Effect::Destructive)
            ]
        );
        assert_eq!(d.suggestions[1].arguments["node_ids"], json!(["i-0a"]));
    }

    #[test]
    fn without_automatic_recovery_a_reboot_comes_before_a_replacement() {
        let kube = side(node("UnschedulablePendingReboot", Some("True"), "True"), 0);
        let d = diagnose("ml", &hyperpod("Running"), Some("None"), &kube);
        assert_eq!(
            d.suggested(),
            [
                ("reboot_nodes", Effect::Mutating),
                ("replace_nodes", Effect::Destructive)
            ]
        );
        let kube = side(node("UnschedulablePendingReplacement", None, "True"), 0);
        let d = diagnose("ml", &hyperpod("Running"), Some("None"), &kube);
        assert_eq!(d.suggested(), [("replace_nodes", Effect::Destructive)]);
    }

    #[test]
    fn a_node_hyperpod_is_rebooting_is_followed() {
        let kube = side(node("UnschedulablePendingReboot", Some("True"), "False"), 0);
        let d = diagnose("ml", &hyperpod("Pending"), Some("Automatic"), &kube);
        assert_eq!(d.suggested()[0], ("list_nodes", Effect::ReadOnly));
        assert!(
            d.findings
                .iter()
                .any(|f| f.summary == "HyperPod is rebooting it now (Pending)")
        );
    }

    #[test]
    fn a_healthy_node_with_a_cleared_fault_needs_nothing() {
        let kube = side(node("Schedulable", Some("False"), "True"), 3);
        let mut d = diagnose("ml", &hyperpod("Running"), Some("Automatic"), &kube);
        assert!(d.suggestions.is_empty(), "{d:#?}");
        assert!(
            d.findings[0]
                .summary
                .starts_with("healthy: HyperPod Running, kubelet Ready, Schedulable")
        );
        d.findings.retain(|f| f.summary.contains("cleared"));
        assert_eq!(d.findings.len(), 1);
        // Pods on a healthy node are not news.
        let text: Value = serde_json::to_value(&d).unwrap();
        assert!(!text.to_string().contains("pods run on it"));
    }
}
