//! The clusters hypd manages: the list, and how a cluster's state is read (shared with
//! its page, `pages::cluster`, and the overview). The list shows what the store knows
//! (`list_clusters`: no AWS call per row; node health as last observed). The store says
//! `creating` until a creation ends, failed or not, so a cluster's state is read with
//! its latest operation: a failed creation reads "create failed", with the stage and
//! Retry / Delete on its page.

use leptos::either::EitherOf3;
use leptos::prelude::*;

use super::{StateBadge, Table, loading};
use crate::api::call::call;
use crate::api::clusters::{ClusterSummary, DeleteCluster, ListClusters, ObservedNodes};
use crate::api::operations::{ListOperations, Operation, OperationState};
use crate::api::{ApiError, Command};
use crate::live::{Live, use_live};
use crate::pages::create::CreateButton;
use crate::pages::import::ImportButton;
use crate::pages::operations::merged;
use crate::session::ErrorPanel;
use crate::time::short;

/// A cluster's state as a person should read it.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct ClusterState {
    /// The badge's word: the store's status (`active`, `creating`, …), or `create
    /// failed` (`delete failed`, …) when the latest operation on the cluster failed.
    pub word: String,
    pub failed: Option<Failure>,
}

/// The failed operation a cluster's state comes from.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Failure {
    pub operation_id: String,
    pub command: String,
    /// The title of the stage that failed.
    pub stage: Option<String>,
    pub error: Option<ApiError>,
    pub retryable: bool,
}

/// The latest operation on `target` (`cluster/<name>`), by when it was asked for.
pub(crate) fn latest_on<'a>(operations: &'a [Operation], target: &str) -> Option<&'a Operation> {
    operations
        .iter()
        .filter(|o| o.target == target)
        .max_by(|a, b| {
            a.created_at
                .cmp(&b.created_at)
                .then_with(|| a.operation_id.cmp(&b.operation_id))
        })
}

/// Reads a cluster's stored `status` with the operations on it: when the latest failed,
/// its verb and "failed" (`create_cluster` → `create failed`), else the status.
pub(crate) fn cluster_state(status: &str, name: &str, operations: &[Operation]) -> ClusterState {
    match latest_on(operations, &format!("cluster/{name}")) {
        Some(op) if op.state == OperationState::Failed => {
            let verb = op.command.split('_').next().unwrap_or("operation");
            let stage = op.stages.iter().find(|s| s.state == OperationState::Failed);
            ClusterState {
                word: format!("{verb} failed"),
                failed: Some(Failure {
                    operation_id: op.operation_id.clone(),
                    command: op.command.clone(),
                    stage: stage.map(|s| s.title.clone()),
                    error: stage
                        .and_then(|s| s.error.clone())
                        .or_else(|| op.error.clone()),
                    retryable: op.retryable,
                }),
            }
        }
        _ => ClusterState {
            word: status.to_owned(),
            failed: None,
        },
    }
}

/// What a cluster the store has no record of is, by its latest operation: `creating`
/// while a creation runs (the record comes a few stages in), `deleted` after a deletion.
pub(super) fn unrecorded_status(operations: &[Operation], name: &str) -> String {
    match latest_on(operations, &format!("cluster/{name}")) {
        Some(op) if !op.state.is_terminal() => {
            let verb = op.command.split('_').next().unwrap_or("operation");
            format!("{}ing", verb.trim_end_matches('e'))
        }
        Some(op)
            if op.command == DeleteCluster::SPEC.name && op.state == OperationState::Succeeded =>
        {
            "deleted".to_owned()
        }
        _ => "not recorded".to_owned(),
    }
}

/// Loaded operations with the snapshots pushed since (on `target` only, when given):
/// what a cluster's state is read from, following the live channel.
pub(super) fn live_operations(
    live: Live,
    loaded: Vec<Operation>,
    target: Option<String>,
) -> Memo<Vec<Operation>> {
    Memo::new(move |_| {
        live.operations.with(|m| {
            let pushed: Vec<Operation> = m.values().cloned().collect();
            merged(&loaded, &pushed, target.as_deref())
        })
    })
}

/// The cluster list, reloaded when the live channel (re)connects and whenever an
/// operation finishes: finished operations are what change clusters.
pub fn live_clusters(live: Live) -> Resource<Result<Vec<ClusterSummary>, ApiError>> {
    let finished = Memo::new(move |_| {
        live.operations.with(|m| {
            m.values()
                .filter(|o| o.state.is_terminal())
                .map(|o| o.updated_at.clone())
                .max()
        })
    });
    Resource::new(
        move || (live.epoch.get(), finished.get()),
        |_| async {
            let list = call(&ListClusters {}).await?;
            list.clusters.into_items().map_err(ApiError::internal)
        },
    )
}

#[component]
pub fn ClusterList() -> impl IntoView {
    let live = use_live();
    let clusters = live_clusters(live);
    // One read for every row's latest operation: no call per cluster.
    let operations = Resource::new(
        move || live.epoch.get(),
        |_| async move { call(&ListOperations::default()).await },
    );
    view! {
        <section class="page">
            <header class="page-head">
                <h1>"Clusters"</h1>
                <span class="spacer"></span>
                <ImportButton/>
                <CreateButton/>
            </header>
            <Transition fallback=loading>
                {move || Suspend::new(async move {
                    let (clusters, operations) = (clusters.await, operations.await);
                    let loaded = operations.map(|l| l.operations).unwrap_or_default();
                    let operations = live_operations(live, loaded, None);
                    match clusters {
                        Ok(list) if list.is_empty() => {
                            EitherOf3::A(view! {
                                <div class="panel empty">
                                    <p>"No clusters yet."</p>
                                    <p class="muted">
                                        "Clusters that hypd creates or imports are listed here."
                                    </p>
                                </div>
                            }
                                )
                        }
                        Ok(list) => {
                            EitherOf3::B(view! {
                                <Table
                                    class="clusters"
                                    caption="Managed clusters"
                                    columns={&["Name", "Status", "Region", "Kubernetes", "HyperPod", "Nodes", "Updated"]}
                                >
                                    {list
                                        .into_iter()
                                        .map(|c| {
                                            let word = {
                                                let (status, name) = (c.status.clone(), c.name.clone());
                                                Signal::derive(move || operations.with(|o| cluster_state(&status, &name, o).word))
                                            };
                                            view! {
                                                <tr data-cluster=c.name.clone() data-state=word>
                                                    <th scope="row">
                                                        <a href=format!("/clusters/{}", c.name)>{c.name.clone()}</a>
                                                    </th>
                                                    <td><StateBadge state=word/></td>
                                                    <td>{c.region}</td>
                                                    <td>{c.kubernetes_version.unwrap_or_else(|| "—".into())}</td>
                                                    <td>{if c.hyperpod_cluster_arn.is_some() { "attached" } else { "—" }}</td>
                                                    <td><NodeHealthSummary nodes=c.nodes/></td>
                                                    <td class="time">{short(&c.updated_at)}</td>
                                                </tr>
                                            }
                                        })
                                        .collect_view()}
                                </Table>
                            }
                                )
                        }
                        Err(e) => EitherOf3::C(view! { <ErrorPanel error=e/> }),
                    }
                })}
            </Transition>
        </section>
    }
}

/// A list row's node health, as last observed (the list asks AWS nothing per row).
#[component]
pub(crate) fn NodeHealthSummary(nodes: Option<ObservedNodes>) -> impl IntoView {
    match nodes {
        None => EitherOf3::A(view! {
            <span class="muted" title="Not observed yet: the cluster's page asks AWS">"—"</span>
        }),
        Some(n) if n.counts.total == 0 => EitherOf3::B(view! {
            <span class="muted" title=format!("As of {}", short(&n.observed_at))>"no nodes"</span>
        }),
        Some(n) => {
            let c = n.counts;
            let trouble = [(c.pending, "pending"), (c.unhealthy, "unhealthy")]
                .into_iter()
                .filter(|(k, _)| *k > 0)
                .map(|(k, what)| view! {
                    " · " <span class=format!("health health-{what}")>{format!("{k} {what}")}</span>
                })
                .collect_view();
            EitherOf3::C(view! {
                <span
                    class="node-counts"
                    data-total=c.total
                    data-healthy=c.healthy
                    title=format!("As of {}", short(&n.observed_at))
                >
                    <span class="health health-healthy">{format!("{} / {} healthy", c.healthy, c.total)}</span>
                    {trouble}
                </span>
            })
        }
    }
}
