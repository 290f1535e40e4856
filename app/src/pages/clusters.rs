//! The clusters hypd manages: the list and one cluster's page. The list and the page's
//! overview show what the store knows (`list_clusters`, `get_cluster`: no AWS call per
//! row; node health as last observed); the page adds the cluster's live state
//! (`describe_cluster`: instance groups, nodes and their health, add-ons, components,
//! storage) and the operations on it. The store says `creating` until a creation ends,
//! failed or not, so both read a cluster's state with its latest operation: a failed
//! creation reads "create failed", with the stage and Retry / Delete on its page.

use leptos::either::{Either, EitherOf3};
use leptos::prelude::*;
use leptos_router::hooks::{use_navigate, use_params_map};

use super::drift::DriftPanel;
use super::features::FeaturesPanel;
use super::gate::{Gate, text};
use super::groups::{AddGroup, AddGroupForm, GroupActions};
use super::nodes::{NodesPanel, NodesView};
use super::{StateBadge, Table, loading};
use crate::api::call::call;
use crate::api::clusters::{
    ClusterDescription, ClusterSummary, DeleteCluster, DescribeCluster, GetCluster, ListClusters,
    ObservedNodes,
};
use crate::api::instance_groups::{AddInstanceGroup, UpdateInstanceGroup};
use crate::api::nodes::NodeList;
use crate::api::operations::{ListOperations, Operation, OperationState, RetryOperation};
use crate::api::values::{ClusterName, EksClusterName};
use crate::api::{ApiError, Command};
use crate::live::{Live, use_live};
use crate::pages::create::CreateButton;
use crate::pages::import::ImportButton;
use crate::pages::operations::{OperationsTable, merged};
use crate::pages::progress::{ErrorDetail, command_title};
use crate::session::{ErrorPanel, IfRole};
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
fn unrecorded_status(operations: &[Operation], name: &str) -> String {
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
fn live_operations(
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

#[component]
pub fn ClusterDetail() -> impl IntoView {
    let params = use_params_map();
    let name = move || params.with(|p| p.get("name").unwrap_or_default());
    let live = use_live();
    // The live state is asked of AWS again whenever an operation on this cluster moves
    // (a creation brings its nodes up stage by stage), on each reconnect, and on demand;
    // the stored record too, since operations change it.
    let target = move || format!("cluster/{}", name());
    let moved = Memo::new(move |_| {
        let target = target();
        live.operations.with(|m| {
            m.values()
                .filter(|o| o.target == target)
                .map(|o| o.updated_at.clone())
                .max()
        })
    });
    let cluster = Resource::new(
        move || (name(), live.epoch.get(), moved.get()),
        |(name, ..)| async move {
            let name =
                ClusterName::parse(&name).map_err(|m| crate::api::ApiError::field("name", m))?;
            call(&GetCluster { name }).await
        },
    );
    // Read by the features panel's effect only, in the browser.
    let usable = Signal::derive(move || {
        cluster
            .get()
            .and_then(Result::ok)
            .is_some_and(|c| matches!(c.status.as_str(), "active" | "imported"))
    });
    let refreshed = RwSignal::new(0u32);
    let add_group = AddGroupForm::default();
    let nodes = NodesView::default();
    // The Refresh button has HyperPod read now; the other reasons to ask again (a filter,
    // a page, an operation that moved: the server sees that one itself) take the view.
    let refreshes_seen = StoredValue::new(0u32);
    let node_page = Resource::new(
        move || {
            (
                nodes.request(&name()),
                live.epoch.get(),
                moved.get(),
                refreshed.get(),
            )
        },
        move |(request, _, _, refreshes)| async move {
            let mut request = request?;
            request.refresh = refreshes != refreshes_seen.get_value();
            refreshes_seen.set_value(refreshes);
            call(&request).await
        },
    );
    let described = Resource::new(
        move || (name(), live.epoch.get(), moved.get(), refreshed.get()),
        |(name, ..)| async move {
            let name =
                EksClusterName::parse(&name).map_err(|m| crate::api::ApiError::field("name", m))?;
            call(&DescribeCluster { name }).await
        },
    );
    let operations = Resource::new(
        move || (name(), live.epoch.get()),
        |(name, _)| async move {
            call(&ListOperations {
                state: None,
                target: Some(format!("cluster/{name}")),
            })
            .await
        },
    );
    view! {
        <section class="page">
            <nav class="crumbs" aria-label="Breadcrumb">
                <a href="/clusters">"Clusters"</a>
                " / "
                <span aria-current="page">{name}</span>
            </nav>
            <Transition fallback=loading>
                {move || Suspend::new(async move {
                    let (record, on_it) = (cluster.await, operations.await);
                    let loaded = on_it.map(|l| l.operations).unwrap_or_default();
                    let any_operation = !loaded.is_empty();
                    let operations = live_operations(live, loaded, Some(target()));
                    let status = match &record {
                        Ok(c) => Some(c.status.clone()),
                        Err(_) => None,
                    };
                    let head = view! { <ClusterHead name=name() status operations/> };
                    match record {
                        Ok(c) => {
                            Either::Left(view! {
                                {head}
                                <div class="panel">
                                    <h2>"Overview"</h2>
                                    <dl class="facts cluster-facts">
                                        <dt>"Region"</dt>
                                        <dd>{c.region}</dd>
                                        <dt>"Kubernetes version"</dt>
                                        <dd>{c.kubernetes_version.unwrap_or_else(|| "unknown".into())}</dd>
                                        <dt>"EKS cluster"</dt>
                                        <dd class="arn">{c.eks_cluster_arn.unwrap_or_else(|| "—".into())}</dd>
                                        <dt>"HyperPod cluster"</dt>
                                        <dd class="arn">{c.hyperpod_cluster_arn.unwrap_or_else(|| "none attached".into())}</dd>
                                        <dt>"Managed since"</dt>
                                        <dd>{short(&c.created_at)}</dd>
                                        <dt>"Last change"</dt>
                                        <dd>{short(&c.updated_at)}</dd>
                                    </dl>
                                </div>
                            }
                                )
                        }
                        // Operations on a cluster the store does not know: a creation
                        // that has not recorded it yet, or failed before it could.
                        Err(e) => Either::Right(view! { {any_operation.then_some(head)} <ErrorPanel error=e/> }),
                    }
                })}
            </Transition>
            <Transition fallback=loading>
                {move || Suspend::new(async move {
                    match described.await {
                        Ok(d) => Either::Left(view! { <LiveState d refreshed add_group nodes node_page/> }),
                        Err(e) => {
                            Either::Right(view! {
                                <div class="panel live-state">
                                    <h2>"Live state"</h2>
                                    <ErrorPanel error=e/>
                                    <button type="button" on:click=move |_| refreshed.update(|n| *n += 1)>
                                        "Try again"
                                    </button>
                                </div>
                            }
                                )
                        }
                    }
                })}
            </Transition>
            {move || view! { <FeaturesPanel name=name() usable/> }}
            {move || view! { <DriftPanel name=name()/> }}
            <div class="panel">
                <h2>"Operations on this cluster"</h2>
                <Transition fallback=loading>
                    {move || Suspend::new(async move {
                        match operations.await {
                            Ok(list) => {
                                Either::Left(view! { <OperationsTable loaded=list.operations target=format!("cluster/{}", name())/> }
                                    )
                            }
                            Err(e) => Either::Right(view! { <ErrorPanel error=e/> }),
                        }
                    })}
                </Transition>
            </div>
        </section>
    }
}

/// The cluster's name and state, and when its latest operation failed, what failed and
/// what to do about it. `status` is `None` for a cluster the store has not recorded (a
/// creation that failed before the cluster existed).
#[component]
fn ClusterHead(
    name: String,
    status: Option<String>,
    operations: Memo<Vec<Operation>>,
) -> impl IntoView {
    let recorded = status.is_some();
    let state = {
        let name = name.clone();
        Memo::new(move |_| {
            operations.with(|o| {
                let status = status
                    .clone()
                    .unwrap_or_else(|| unrecorded_status(o, &name));
                cluster_state(&status, &name, o)
            })
        })
    };
    view! {
        <header class="page-head" data-state=move || state.with(|s| s.word.clone())>
            <h1>{name.clone()}</h1>
            <StateBadge state=Signal::derive(move || state.with(|s| s.word.clone()))/>
        </header>
        {move || {
            state
                .with(|s| s.failed.clone())
                .map(|failure| view! { <FailurePanel name=name.clone() failure recorded/> })
        }}
    }
}

/// A failed operation on the cluster: where it failed, the provider's message, and Retry
/// (from the failed stage) and Delete for callers whose role allows them.
#[component]
fn FailurePanel(name: String, failure: Failure, recorded: bool) -> impl IntoView {
    let navigate = use_navigate();
    let busy = RwSignal::new(false);
    let problem = RwSignal::new(None::<String>);
    let id = failure.operation_id.clone();
    // The retried operation's page is where to follow it.
    let follow = move |started: Result<String, ApiError>| match started {
        Ok(operation_id) => navigate(&format!("/operations/{operation_id}"), Default::default()),
        Err(e) => {
            busy.set(false);
            problem.set(Some(e.to_string()));
        }
    };
    // Callbacks are Copy: the buttons that run them sit inside views rendered again and
    // again (role check, confirmation).
    let retry = {
        let (id, follow) = (id.clone(), follow.clone());
        Callback::new(move |()| {
            let (operation_id, follow) = (id.clone(), follow.clone());
            busy.set(true);
            problem.set(None);
            leptos::task::spawn_local(async move {
                let started = call(&RetryOperation {
                    operation_id: operation_id.clone(),
                    dry_run: false,
                })
                .await;
                // Sent without dry_run, the answer is the operation resumed.
                follow(started.map(|r| r.done().map_or(operation_id, |r| r.operation_id)));
            });
        })
    };
    // Deleting is two calls: the first answers with the plan and a confirmation, shown
    // here; the second, sent with that confirmation, starts the deletion.
    let deletion = Gate::default();
    let delete_request = StoredValue::new([text("name", name.clone())]);
    let delete = Callback::new(move |()| {
        deletion.start::<DeleteCluster>(&delete_request.get_value());
    });
    let what = command_title(&failure.command);
    let question = StoredValue::new(format!("Delete {name} and everything hypd created for it?"));
    let heading = match &failure.stage {
        Some(stage) => format!("{what} failed at: {stage}"),
        None => format!("{what} failed"),
    };
    view! {
        <div class="panel failure cluster-failure" role="alert" data-operation=id.clone()>
            <h2>{heading}</h2>
            {failure.error.map(|error| view! { <ErrorDetail error/> })}
            <p class="muted">
                {failure.retryable.then_some("Retry resumes from the failed stage; stages that succeeded are not repeated. ")}
                {recorded.then_some("Delete removes everything hypd created for the cluster.")}
            </p>
            {move || problem.get().map(|p| view! { <div class="form-alert" role="alert">{p}</div> })}
            <div class="actions">
                {failure.retryable.then(|| view! {
                    <IfRole role=RetryOperation::SPEC.role>
                        <button class="primary" type="button" on:click=move |_| retry.run(()) disabled=move || busy.get()>"Retry"</button>
                    </IfRole>
                })}
                {recorded.then(|| view! {
                    <IfRole role=DeleteCluster::SPEC.role>
                        {move || if deletion.reviewing() {
                            view! {
                                <div class="confirm" role="group" aria-label="Confirm deletion">
                                    <p>{question.get_value()}</p>
                                    {deletion.view()}
                                    <button class="danger" type="button" on:click=move |_| delete.run(()) disabled=move || deletion.busy()>"Delete cluster"</button>
                                    <button type="button" on:click=move |_| deletion.reset()>"Keep it"</button>
                                </div>
                            }
                            .into_any()
                        } else {
                            view! {
                                <button class="danger" type="button" on:click=move |_| delete.run(()) disabled=move || deletion.busy()>"Delete"</button>
                                {deletion.view()}
                            }
                            .into_any()
                        }}
                    </IfRole>
                })}
                <a class="button" href=format!("/operations/{id}")>"Open the operation"</a>
            </div>
        </div>
    }
}

/// A panel with a titled table of `columns` (the rows are the children), or a line
/// saying there is nothing to show.
#[component]
fn TablePanel(
    title: &'static str,
    class: &'static str,
    caption: &'static str,
    columns: &'static [&'static str],
    empty: &'static str,
    is_empty: bool,
    children: Children,
) -> impl IntoView {
    view! {
        <div class="panel">
            <h2>{title}</h2>
            {if is_empty {
                Either::Left(view! { <p class="muted empty">{empty}</p> })
            } else {
                Either::Right(view! {
                    <Table class caption columns>{children()}</Table>
                })
            }}
        </div>
    }
}

fn or_dash(v: Option<String>) -> String {
    v.unwrap_or_else(|| "—".into())
}

/// What AWS says about the cluster now: control planes, instance groups, nodes, add-ons,
/// and what runs inside it.
#[component]
fn LiveState(
    d: ClusterDescription,
    refreshed: RwSignal<u32>,
    add_group: AddGroupForm,
    nodes: NodesView,
    node_page: Resource<Result<NodeList, ApiError>>,
) -> impl IntoView {
    let counts = d.node_counts.clone();
    // Groups change on a cluster hypd created and that is in use.
    let changeable = d.cluster.status == "active";
    let name = d.cluster.name.clone();
    let of_cluster = name.clone();
    let of_nodes = name.clone();
    let group_names = d.instance_groups.iter().map(|g| g.name.clone()).collect();
    view! {
        <div class="panel live-state" data-fetched=d.fetched_at.clone()>
            <header class="panel-head">
                <h2>"Live state"</h2>
                <span class="muted">"Asked of AWS at " {short(&d.fetched_at)}</span>
                <span class="spacer"></span>
                <button type="button" on:click=move |_| refreshed.update(|n| *n += 1)>"Refresh"</button>
            </header>
            <dl class="facts live-facts">
                <dt>"EKS control plane"</dt>
                <dd>
                    {match d.eks {
                        Some(e) => Either::Left(view! {
                            <StateBadge state=or_dash(e.status)/>
                            " Kubernetes " {or_dash(e.kubernetes_version)}
                            {e.platform_version.map(|p| format!(" ({p})"))}
                        }),
                        None => Either::Right(view! { <span class="muted">"not created yet"</span> }),
                    }}
                </dd>
                <dt>"HyperPod cluster"</dt>
                <dd>
                    {match d.hyperpod {
                        Some(h) => Either::Left(view! {
                            <StateBadge state=or_dash(h.status)/>
                            " " {or_dash(h.name)}
                            {h.node_recovery.map(|r| format!(" · node recovery {r}"))}
                            {h.failure_message.map(|m| view! { <p class="error">{m}</p> })}
                        }),
                        None => Either::Right(view! { <span class="muted">"none"</span> }),
                    }}
                </dd>
                <dt>"Nodes"</dt>
                <dd class="node-counts" data-total=counts.total data-healthy=counts.healthy>
                    {format!("{} total", counts.total)}
                    " · " <span class="health health-healthy">{format!("{} healthy", counts.healthy)}</span>
                    " · " <span class="health health-pending">{format!("{} pending", counts.pending)}</span>
                    " · " <span class="health health-unhealthy">{format!("{} unhealthy", counts.unhealthy)}</span>
                </dd>
            </dl>
        </div>
        <TablePanel
            title="Instance groups"
            class="instance-groups"
            caption="Instance groups"
            columns={&["Group", "Instance type", "Instances", "Status", "Training plan", "Change"]}
            empty="No instance groups."
            is_empty={d.instance_groups.is_empty()}
        >
            {d.instance_groups.into_iter().map(|g| {
                let (cluster, group, count) = (of_cluster.clone(), g.name.clone(), g.target_count);
                view! {
                    <tr data-group=g.name.clone()>
                        <th scope="row">{g.name.clone()}</th>
                        <td class="mono">{or_dash(g.instance_type)}</td>
                        <td class="count">{format!("{} / {}", g.current_count, g.target_count)}</td>
                        <td><StateBadge state=or_dash(g.status)/></td>
                        <td class="arn">{or_dash(g.training_plan_arn)}</td>
                        <td>
                            {changeable.then(|| view! {
                                <IfRole role=UpdateInstanceGroup::SPEC.role>
                                    <GroupActions cluster=cluster.clone() group=group.clone() count/>
                                </IfRole>
                            })}
                        </td>
                    </tr>
                }
            }).collect_view()}
        </TablePanel>
        {changeable.then(|| view! {
            <IfRole role=AddInstanceGroup::SPEC.role>
                <div class="panel">
                    <AddGroup cluster=name.clone() form=add_group/>
                </div>
            </IfRole>
        })}
        <NodesPanel cluster=of_nodes groups=group_names view=nodes nodes=node_page/>
        <TablePanel
            title="Add-ons and components"
            class="addons"
            caption="EKS add-ons and in-cluster components"
            columns={&["Name", "Kind", "Version", "State"]}
            empty="No add-ons or components reported."
            is_empty={d.addons.is_empty() && d.components.is_empty()}
        >
            {d.addons.into_iter().map(|a| view! {
                <tr data-addon=a.name.clone()>
                    <th scope="row">{a.name.clone()}</th>
                    <td>"EKS add-on"</td>
                    <td class="mono">{or_dash(a.version)}</td>
                    <td>
                        <StateBadge state=or_dash(a.status)/>
                        {(!a.issues.is_empty()).then(|| view! { <p class="error">{a.issues.join("; ")}</p> })}
                    </td>
                </tr>
            }).collect_view()}
            {d.components.into_iter().map(|c| view! {
                <tr data-component=c.name.clone()>
                    <th scope="row">{c.name.clone()}</th>
                    <td>"Component"</td>
                    <td class="mono">{or_dash(c.version)}</td>
                    <td><StateBadge state=c.state.clone()/></td>
                </tr>
            }).collect_view()}
        </TablePanel>
        <TablePanel
            title="Storage"
            class="storage"
            caption="Storage"
            columns={&["Kind", "Bucket", "Claim", "Phase"]}
            empty="No storage reported by the cluster yet."
            is_empty={d.storage.is_empty()}
        >
            {d.storage.into_iter().map(|s| view! {
                <tr>
                    <th scope="row">{s.kind.clone()}</th>
                    <td class="mono">{or_dash(s.bucket)}</td>
                    <td class="mono">
                        {match (s.namespace, s.pvc) {
                            (Some(ns), Some(p)) => format!("{ns}/{p}"),
                            (None, Some(p)) => p,
                            _ => "—".into(),
                        }}
                    </td>
                    <td><StateBadge state=or_dash(s.phase)/></td>
                </tr>
            }).collect_view()}
        </TablePanel>
    }
}
