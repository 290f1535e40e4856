//! Acting on a cluster's nodes: reboot, replace or delete some, through HyperPod's batch
//! calls. Each is a pipeline on the cluster's target, so it waits behind any other
//! change of the cluster. The batch calls answer per node, and a node HyperPod refuses
//! does not fail the others: the accepted ones are seen through, then the operation fails
//! naming each refused node with HyperPod's code and message. Deleted nodes lower their
//! groups' counts, as HyperPod does: each deletion's `settle` folds them into what the
//! cluster is meant to be, so drift does not bring them back.

pub mod diagnose;
pub mod list;
pub mod view;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use app::api::nodes::{DeleteNodes, NodeAction, NodeRequest, RebootNodes, ReplaceNodes};
use app::api::values::IdempotencyKey;
use app::api::{ApiError, Command};
use serde::{Deserialize, Serialize};

use crate::cluster::components;
use crate::cluster::managed::{self, Where, locate};
use crate::operation::pipeline::{Context, Pipeline, Preflight, Progress, stages};
use crate::resources::sagemaker::nodes::{Answer, DoneFuture, NodeBatch, Seen, seen};
use crate::resources::{converge, is_planning, kube};

stages! {
    pub enum Stage {
        Nodes = "nodes", "HyperPod: the named nodes as they are now (group and status)", true;
        Action = "action", "HyperPod: the batch call on the nodes", false;
        Settled = "settled", "The nodes rebooted and Ready, replaced, or gone; then each node HyperPod refused is reported", true;
    }
}

/// What the stages found, stored with the operation. Field names are stored: never rename.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Outputs {
    /// Each node asked for, as the operation first found it; `null`: not a node of the
    /// cluster then.
    #[serde(default)]
    pub found: BTreeMap<String, Option<Seen>>,
    /// What HyperPod answered: the nodes it took on, and each it refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer: Option<Answer>,
    /// For a reboot: each node's Kubernetes boot id when the operation found it. HyperPod
    /// says Running both before a reboot and after it, so a run whose answer was lost
    /// tells a node it already rebooted by a new boot id.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub boots: BTreeMap<String, String>,
}

const POLL: Duration = Duration::from_secs(20);

/// What a node operation needs of its cluster.
const NEEDS: &str = "nodes are acted on in an active or imported cluster";

async fn step<R: NodeRequest>(
    request: &R,
    cx: &Context,
    stage: Stage,
    out: &mut Outputs,
) -> Result<Progress, ApiError> {
    let at = locate(&cx.store, request.cluster().as_str(), NEEDS).await?;
    let sm = cx.aws.sagemaker(&at.region);
    match stage {
        Stage::Nodes => {
            // Found once: what the later stages tell their own work from.
            if out.found.is_empty() {
                let nodes = seen(&sm, &at.hyperpod).await?;
                out.found = request
                    .node_ids()
                    .iter()
                    .map(|id| (id.to_string(), nodes.get(id.as_str()).cloned()))
                    .collect();
                if R::ACTION == NodeAction::Reboot {
                    let mut boots = list::boot_ids(&cx.aws, &at).await?;
                    boots.retain(|id, _| out.found.contains_key(id));
                    out.boots = boots;
                }
            }
            Ok(Progress::Done)
        }
        Stage::Action => {
            if out.answer.is_some() {
                return Ok(Progress::Done);
            }
            let (boots, aws, place) = (&out.boots, &cx.aws, &at);
            let rebooted = move || -> DoneFuture<'_> {
                Box::pin(async move {
                    if boots.is_empty() {
                        return Ok(BTreeSet::new());
                    }
                    let now = list::boot_ids(aws, place).await?;
                    Ok(boots
                        .iter()
                        .filter(|(id, then)| now.get(*id).is_some_and(|b| b != *then))
                        .map(|(id, _)| id.clone())
                        .collect())
                })
            };
            let batch = NodeBatch {
                sagemaker: sm,
                cluster: at.hyperpod.clone(),
                action: R::ACTION,
                asked: &out.found,
                done: &rebooted,
            };
            let mut answer = converge(&batch).await?.answer;
            // Nodes not sent now were taken on by an earlier run whose answer was lost.
            let answered: BTreeSet<String> = answer
                .accepted
                .iter()
                .cloned()
                .chain(answer.refused.iter().map(|r| r.node_id.clone()))
                .collect();
            answer.accepted.extend(
                out.found
                    .keys()
                    .filter(|id| !answered.contains(*id))
                    .cloned(),
            );
            answer.accepted.sort();
            out.answer = Some(answer);
            Ok(Progress::Done)
        }
        Stage::Settled => {
            let answer = out.answer.clone().unwrap_or_default();
            if !answer.accepted.is_empty() && !is_planning() {
                let note = unsettled(R::ACTION, &answer, &out.found, cx, &at).await?;
                if let Some(note) = note {
                    return Ok(Progress::wait(POLL, note));
                }
            }
            refusals(R::ACTION, &answer)
        }
    }
}

/// What the accepted nodes still wait for, if anything: HyperPod to finish with them,
/// then (for a reboot or a replacement) Kubernetes to have their groups' nodes Ready.
async fn unsettled(
    action: NodeAction,
    answer: &Answer,
    found: &BTreeMap<String, Option<Seen>>,
    cx: &Context,
    at: &Where,
) -> Result<Option<String>, ApiError> {
    let now = seen(&cx.aws.sagemaker(&at.region), &at.hyperpod).await?;
    let groups: BTreeSet<&str> = answer
        .accepted
        .iter()
        .filter_map(|id| found.get(id)?.as_ref().map(|s| s.group.as_str()))
        .collect();
    let mut waiting: Vec<String> = answer
        .accepted
        .iter()
        .filter_map(|id| {
            let status = &now.get(id)?.status;
            let done = action == NodeAction::Reboot && status == "Running";
            (!done).then(|| format!("{id} {status}"))
        })
        .collect();
    if action != NodeAction::Delete {
        // A replacement comes up under a new id; a rebooted node runs its health checks.
        waiting.extend(
            now.iter()
                .filter(|(id, s)| {
                    groups.contains(s.group.as_str())
                        && !answer.accepted.contains(*id)
                        && matches!(s.status.as_str(), "Pending" | "DeepHealthCheckInProgress")
                })
                .map(|(id, s)| format!("{id} {}", s.status)),
        );
    }
    if !waiting.is_empty() {
        return Ok(Some(format!("HyperPod: {}", waiting.join(", "))));
    }
    if action == NodeAction::Delete {
        return Ok(None);
    }
    let mut running: BTreeMap<&str, usize> = groups.iter().map(|g| (*g, 0)).collect();
    for s in now.values().filter(|s| s.status == "Running") {
        if let Some(n) = running.get_mut(s.group.as_str()) {
            *n += 1;
        }
    }
    kubernetes_behind(cx, at, &running).await
}

/// Which of the groups have fewer Ready Kubernetes Nodes than HyperPod has Running
/// instances (`running`, by group), said as a progress note; `None` when none has.
pub(crate) async fn kubernetes_behind(
    cx: &Context,
    at: &Where,
    running: &BTreeMap<&str, usize>,
) -> Result<Option<String>, ApiError> {
    let client = kube::connect(&cx.aws, &at.region, &at.eks).await?;
    let ready = components::hyperpod_nodes(&client, &at.hyperpod).await?;
    let short: Vec<String> = running
        .iter()
        .filter_map(|(g, running)| {
            let (got, _) = ready.get(*g).copied().unwrap_or((0, 0));
            (got < *running).then(|| format!("{g}: {got} of {running} Ready"))
        })
        .collect();
    Ok((!short.is_empty()).then(|| format!("Kubernetes nodes: {}", short.join("; "))))
}

/// Done when HyperPod took on every node; else the refusals, each with its code.
fn refusals(action: NodeAction, answer: &Answer) -> Result<Progress, ApiError> {
    let Some(first) = answer.refused.first() else {
        return Ok(Progress::Done);
    };
    let asked = answer.accepted.len() + answer.refused.len();
    let each: Vec<String> = answer
        .refused
        .iter()
        .map(|r| format!("{}: {}: {}", r.node_id, r.code, r.message))
        .collect();
    Err(ApiError::Upstream {
        service: "sagemaker".into(),
        call: action.call().into(),
        code: Some(first.code.clone()),
        message: format!(
            "{} of {asked} nodes not {}: {}",
            answer.refused.len(),
            action.done(),
            each.join("; ")
        ),
        request_id: answer.request_id.clone().map(Into::into),
        transient: false,
    })
}

/// The instances deleted from each group by a `delete_nodes` operation, from its stored
/// outputs (any state: what HyperPod took on is gone whether or not others were refused).
pub fn deleted_per_group(outputs: &str) -> Result<BTreeMap<String, u32>, ApiError> {
    let out: Outputs = serde_json::from_str(outputs).map_err(|e| {
        ApiError::internal(format!(
            "the stored {} outputs are unreadable: {e}",
            DeleteNodes::SPEC.name
        ))
    })?;
    Ok(deleted(&out))
}

fn deleted(out: &Outputs) -> BTreeMap<String, u32> {
    let mut per_group = BTreeMap::new();
    for id in out.answer.iter().flat_map(|a| &a.accepted) {
        if let Some(Some(s)) = out.found.get(id) {
            *per_group.entry(s.group.clone()).or_insert(0) += 1;
        }
    }
    per_group
}

macro_rules! node_pipeline {
    ($t:ty) => {
        impl Pipeline for $t {
            type Stage = Stage;
            type Outputs = Outputs;

            fn target(&self) -> String {
                crate::cluster::target(self.name.as_str())
            }

            fn idempotency_key(&self) -> Option<&IdempotencyKey> {
                self.idempotency_key.as_ref()
            }

            /// The cluster is hypd's and has a HyperPod cluster; which nodes exist is
            /// HyperPod's to answer, node by node.
            async fn preflight(self, cx: &Preflight<'_>) -> Result<Self, ApiError> {
                locate(cx.store, self.name.as_str(), NEEDS).await?;
                Ok(self)
            }

            async fn step(
                &self,
                cx: &Context,
                stage: Stage,
                out: &mut Outputs,
            ) -> Result<Progress, ApiError> {
                step(self, cx, stage, out).await
            }

            /// Nodes deleted leave their groups' counts lower (HyperPod lowers them), so
            /// drift does not bring them back: also when not every node went.
            async fn settle(
                &self,
                cx: &Context,
                out: &Outputs,
                _succeeded: bool,
            ) -> Result<(), ApiError> {
                if <$t as NodeRequest>::ACTION != NodeAction::Delete {
                    return Ok(());
                }
                let per_group = deleted(out);
                managed::change(&cx.store, self.name.as_str(), &cx.operation_id, |d| {
                    d.without_nodes(&per_group)
                })
                .await
            }
        }
    };
}

node_pipeline!(RebootNodes);
node_pipeline!(ReplaceNodes);
node_pipeline!(DeleteNodes);
