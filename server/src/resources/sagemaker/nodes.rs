//! HyperPod nodes: the pages of `ListClusterNodes`, and a batch action (reboot, replace,
//! delete) as a resource. The batch calls have no client token and a node shows no mark
//! of what was asked of it, so what a run sent is told from the node's status against
//! the status it had when the action started: a node that was Running then and is
//! rebooting, shutting down or gone now was sent already (an earlier run's answer was
//! lost). A node that was never there is sent anyway, so HyperPod answers for it with its
//! own code.

use std::collections::{BTreeMap, BTreeSet};

use app::api::ApiError;
use app::api::nodes::NodeAction;
use app::api::plan::{Action, Change};
use aws_sdk_sagemaker::operation::RequestId;
use aws_sdk_sagemaker::types::ClusterNodeSummary;
use serde::{Deserialize, Serialize};

use super::Client;
use crate::aws::SdkResultExt;
use crate::resources::Resource;

/// The plan kind of a HyperPod node.
pub const KIND: &str = "sagemaker:ClusterNode";

/// Every node of HyperPod cluster `cluster` (only groups whose name contains `group`, when
/// given), page by page.
pub async fn list(
    sm: &Client,
    cluster: &str,
    group: Option<&str>,
) -> Result<Vec<ClusterNodeSummary>, ApiError> {
    let mut nodes = Vec::new();
    let mut pages = sm
        .list_cluster_nodes()
        .cluster_name(cluster)
        .set_instance_group_name_contains(group.map(str::to_owned))
        .into_paginator()
        .send();
    while let Some(page) = pages.next().await {
        let page = page.upstream("sagemaker", "ListClusterNodes")?;
        nodes.extend(page.cluster_node_summaries().iter().cloned());
    }
    Ok(nodes)
}

/// A node as an action finds it: its group and HyperPod status.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Seen {
    pub group: String,
    pub status: String,
}

/// The nodes of `cluster` by instance id.
pub async fn seen(sm: &Client, cluster: &str) -> Result<BTreeMap<String, Seen>, ApiError> {
    Ok(list(sm, cluster, None)
        .await?
        .into_iter()
        .filter_map(|n| {
            let status = n
                .instance_status()
                .and_then(|s| s.status())
                .map(|s| s.as_str().to_owned())
                .unwrap_or_default();
            Some((
                n.instance_id()?.to_owned(),
                Seen {
                    group: n.instance_group_name().unwrap_or_default().to_owned(),
                    status,
                },
            ))
        })
        .collect())
}

/// One node HyperPod would not act on, in its words.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refused {
    pub node_id: String,
    pub code: String,
    pub message: String,
}

/// What the batch call answered.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Answer {
    pub accepted: Vec<String>,
    pub refused: Vec<Refused>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
}

/// `action` on nodes `asked` of HyperPod cluster `cluster`; each asked node with what the
/// action found of it when it started (`None`: not a node of the cluster then).
pub struct NodeBatch<'a> {
    pub sagemaker: Client,
    pub cluster: String,
    pub action: NodeAction,
    pub asked: &'a BTreeMap<String, Option<Seen>>,
    /// Asked nodes an earlier run is known to have acted on by other means (a reboot
    /// seen in the node's Kubernetes boot id): never sent again. Asked for after
    /// HyperPod's statuses are read, so a reboot that ended before that read (Running
    /// again) is seen by its new boot id, not taken for one never sent.
    pub done: &'a (dyn Fn() -> DoneFuture<'a> + std::marker::Send + Sync),
}

/// What [`NodeBatch::done`] answers with.
pub type DoneFuture<'a> = std::pin::Pin<
    Box<
        dyn std::future::Future<Output = Result<BTreeSet<String>, ApiError>>
            + std::marker::Send
            + 'a,
    >,
>;

/// The nodes now, and what this run's call answered (none before it is made).
#[derive(Debug, Default)]
pub struct Observed {
    pub nodes: BTreeMap<String, Seen>,
    /// Asked nodes acted on by other means (see [`NodeBatch::done`]).
    pub done: BTreeSet<String>,
    pub answer: Answer,
}

/// The one batch call: the nodes to send.
#[derive(Debug)]
pub struct Send(pub Vec<String>);

impl NodeBatch<'_> {
    /// Whether a node still has to be sent, from what it was and what it is.
    fn to_send(&self, then: Option<&Seen>, now: Option<&Seen>) -> bool {
        match (then, now) {
            // Never a node of the cluster: HyperPod says so, per node.
            (None, _) => true,
            // Gone since: replaced or deleted by an earlier run (or by HyperPod).
            (Some(_), None) => false,
            // In the state the action puts it in, and not in it before: an earlier run's
            // call is under way. Otherwise it is sent, and HyperPod says why it cannot.
            (Some(then), Some(now)) => match self.action {
                NodeAction::Delete => {
                    !(now.status == "ShuttingDown" && then.status != "ShuttingDown")
                }
                NodeAction::Reboot | NodeAction::Replace => {
                    !(now.status != "Running" && then.status == "Running")
                }
            },
        }
    }
}

impl Resource for NodeBatch<'_> {
    type Observed = Observed;
    type Op = Send;

    async fn observe(&self) -> Result<Observed, ApiError> {
        let nodes = seen(&self.sagemaker, &self.cluster).await?;
        Ok(Observed {
            nodes,
            done: (self.done)().await?,
            answer: Answer::default(),
        })
    }

    fn diff(&self, observed: &Observed) -> Result<Vec<Send>, ApiError> {
        let ids: Vec<String> = self
            .asked
            .iter()
            .filter(|(id, then)| {
                !observed.done.contains(*id) && self.to_send(then.as_ref(), observed.nodes.get(*id))
            })
            .map(|(id, _)| id.clone())
            .collect();
        Ok(if ids.is_empty() {
            Vec::new()
        } else {
            vec![Send(ids)]
        })
    }

    async fn apply(&self, op: &Send, observed: &mut Observed) -> Result<(), ApiError> {
        let (call, ids) = (self.action.call(), op.0.clone());
        let sm = &self.sagemaker;
        // The three calls differ only in their builder and in the name of a failure's
        // code (`error_code` for reboot and replace, `code` for delete).
        macro_rules! batch {
            ($builder:ident, $code:ident) => {{
                let out = sm
                    .$builder()
                    .cluster_name(&self.cluster)
                    .set_node_ids(Some(ids))
                    .send()
                    .await
                    .upstream("sagemaker", call)?;
                Answer {
                    accepted: out.successful().to_vec(),
                    refused: out
                        .failed()
                        .iter()
                        .map(|f| refused(f.node_id(), f.$code().map(|c| c.as_str()), f.message()))
                        .collect(),
                    request_id: out.request_id().map(str::to_owned),
                }
            }};
        }
        let answer = match self.action {
            NodeAction::Reboot => batch!(batch_reboot_cluster_nodes, error_code),
            NodeAction::Replace => batch!(batch_replace_cluster_nodes, error_code),
            NodeAction::Delete => batch!(batch_delete_cluster_nodes, code),
        };
        observed.answer = answer;
        Ok(())
    }

    fn describe(&self, op: &Send, observed: &Observed) -> Change {
        self.describe_all(op, observed)
            .into_iter()
            .next()
            .unwrap_or_else(|| Change::new(Action::None, KIND, ""))
    }

    /// One change per node, with what it is now and what the action makes of it.
    fn describe_all(&self, op: &Send, observed: &Observed) -> Vec<Change> {
        op.0.iter()
            .map(|id| {
                let now = observed.nodes.get(id);
                let status = now.map(|s| serde_json::json!(s.status));
                let change = match self.action {
                    NodeAction::Reboot => Change::new(Action::Update, KIND, id).field(
                        "status",
                        status,
                        Some(serde_json::json!("rebooted")),
                    ),
                    NodeAction::Replace => Change::new(Action::Update, KIND, id)
                        .field(
                            "instance",
                            Some(serde_json::json!(id)),
                            Some(serde_json::json!("a new instance")),
                        )
                        .field(
                            "instance_volumes",
                            Some(serde_json::json!("kept")),
                            Some(serde_json::json!("wiped")),
                        ),
                    NodeAction::Delete => Change::new(Action::Delete, KIND, id),
                };
                match now {
                    Some(_) => change,
                    // HyperPod will refuse it; the plan says so before it is sent.
                    None => change.field(
                        "found",
                        None,
                        Some(serde_json::json!(format!(
                            "not a node of {} now: HyperPod will refuse it",
                            self.cluster
                        ))),
                    ),
                }
            })
            .collect()
    }

    fn assume(&self, op: &Send, observed: &mut Observed) {
        observed.answer.accepted = op.0.clone();
    }
}

fn refused(id: Option<&str>, code: Option<&str>, message: Option<&str>) -> Refused {
    Refused {
        node_id: id.unwrap_or_default().to_owned(),
        code: code.unwrap_or("Unknown").to_owned(),
        message: message.unwrap_or_default().to_owned(),
    }
}
