//! One cluster's page, in tabs with their own addresses (overview, instance groups and
//! nodes, features, storage, drift, operations), so a link can point at a node table or
//! a drift report. Each tab is a lazily loaded route: it fetches its own code (one pack,
//! see docs/ARCHITECTURE.md) and asks for its own data only. What every tab shows, the
//! cluster's name and state and a failed operation's Retry / Delete, is the [`Frame`],
//! read from the store (`get_cluster`) and the operations on the cluster; the live state
//! (`describe_cluster`) is asked of AWS by the tabs that show it.

use leptos::either::Either;
use leptos::prelude::*;
use leptos_router::components::A;
use leptos_router::hooks::{use_navigate, use_params_map};

use super::clusters::{Failure, cluster_state, live_operations, unrecorded_status};
use super::drift::DriftPanel;
use super::features::FeaturesPanel;
use super::gate::{Gate, text};
use super::groups::{AddGroup, AddGroupForm, GroupActions};
use super::inference::InferencePanel;
use super::models::ModelsPanel;
use super::nodes::{NodesPanel, NodesView};
use super::storage::StoragePanel;
use super::training::TrainingPanel;
use super::{StateBadge, Table, loading};
use crate::api::call::call;
use crate::api::clusters::{
    ClusterDescription, ClusterSummary, DeleteCluster, DescribeCluster, GetCluster,
};
use crate::api::instance_groups::{AddInstanceGroup, UpdateInstanceGroup};
use crate::api::operations::{ListOperations, Operation, OperationList, RetryOperation};
use crate::api::values::{ClusterName, EksClusterName};
use crate::api::{ApiError, Command};
use crate::live::{Live, use_live};
use crate::pages::operations::OperationsTable;
use crate::pages::progress::{ErrorDetail, command_title};
use crate::session::{ErrorPanel, IfRole};
use crate::time::short;

/// The tabs of a cluster's page, in the order shown. Their paths are addresses people
/// keep: never renamed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tab {
    Overview,
    Nodes,
    Features,
    Storage,
    Models,
    Training,
    Inference,
    Drift,
    Operations,
}

impl Tab {
    pub const ALL: [Tab; 9] = [
        Tab::Overview,
        Tab::Nodes,
        Tab::Features,
        Tab::Storage,
        Tab::Models,
        Tab::Training,
        Tab::Inference,
        Tab::Drift,
        Tab::Operations,
    ];

    /// The tab's path under `/clusters/<name>` (empty for the overview).
    pub fn path(self) -> &'static str {
        match self {
            Tab::Overview => "",
            Tab::Nodes => "/nodes",
            Tab::Features => "/features",
            Tab::Storage => "/storage",
            Tab::Models => "/models",
            Tab::Training => "/training",
            Tab::Inference => "/inference",
            Tab::Drift => "/drift",
            Tab::Operations => "/operations",
        }
    }

    fn label(self) -> &'static str {
        match self {
            Tab::Overview => "Overview",
            Tab::Nodes => "Instance groups and nodes",
            Tab::Features => "Features",
            Tab::Storage => "Storage",
            Tab::Models => "Models",
            Tab::Training => "Training",
            Tab::Inference => "Inference",
            Tab::Drift => "Drift",
            Tab::Operations => "Operations",
        }
    }
}

/// What every tab reads: the cluster's name (from the address), its stored record and
/// the operations on it, and when one of those last moved (a creation brings its nodes
/// up stage by stage), for the tabs' own data to be asked again.
#[derive(Clone, Copy)]
struct At {
    name: Memo<String>,
    live: Live,
    moved: Memo<Option<String>>,
    record: Resource<Result<ClusterSummary, ApiError>>,
    operations: Resource<Result<OperationList, ApiError>>,
}

impl At {
    fn new() -> Self {
        let params = use_params_map();
        let name = Memo::new(move |_| params.with(|p| p.get("name").unwrap_or_default()));
        let live = use_live();
        let moved = Memo::new(move |_| {
            let target = format!("cluster/{}", name.get());
            live.operations.with(|m| {
                m.values()
                    .filter(|o| o.target == target)
                    .map(|o| o.updated_at.clone())
                    .max()
            })
        });
        let record = Resource::new(
            move || (name.get(), live.epoch.get(), moved.get()),
            |(name, ..)| async move {
                let name = ClusterName::parse(&name).map_err(|m| ApiError::field("name", m))?;
                call(&GetCluster { name }).await
            },
        );
        let operations = Resource::new(
            move || (name.get(), live.epoch.get()),
            |(name, _)| async move {
                call(&ListOperations {
                    state: None,
                    target: Some(format!("cluster/{name}")),
                })
                .await
            },
        );
        At {
            name,
            live,
            moved,
            record,
            operations,
        }
    }

    fn target(self) -> String {
        format!("cluster/{}", self.name.get())
    }

    /// Whether the cluster is active or imported: only then are there features and
    /// storage to read from it.
    fn usable(self) -> Signal<bool> {
        Signal::derive(move || {
            self.record
                .get()
                .and_then(Result::ok)
                .is_some_and(|c| matches!(c.status.as_str(), "active" | "imported"))
        })
    }

    /// What AWS says about the cluster now, asked again when an operation on it moves,
    /// the live channel reconnects, or `refreshed` counts a Refresh (which has HyperPod's
    /// nodes read now rather than taken from a read a few seconds old).
    fn described(self, refreshed: RwSignal<u32>) -> Resource<Result<ClusterDescription, ApiError>> {
        let refreshes = Refreshes::new(refreshed);
        Resource::new(
            move || {
                (
                    self.name.get(),
                    self.live.epoch.get(),
                    self.moved.get(),
                    refreshed.get(),
                )
            },
            move |(name, _, _, count)| async move {
                let name = EksClusterName::parse(&name).map_err(|m| ApiError::field("name", m))?;
                let refresh = refreshes.asked(count);
                call(&DescribeCluster { name, refresh }).await
            },
        )
    }
}

/// Whether a read was asked for by Refresh (`refreshed` counts the clicks), rather than
/// by a filter, a page, the live channel or an operation: only then is HyperPod read now
/// (`refresh: true`) instead of answered from the node view's recent read.
#[derive(Clone, Copy)]
struct Refreshes(StoredValue<u32>);

impl Refreshes {
    fn new(refreshed: RwSignal<u32>) -> Self {
        Refreshes(StoredValue::new(refreshed.get_untracked()))
    }

    /// Whether the count moved since the last read (which `count` now is).
    fn asked(self, count: u32) -> bool {
        let asked = count != self.0.get_value();
        self.0.set_value(count);
        asked
    }
}

/// The page around a tab: breadcrumbs, the cluster's head (state, and a failed
/// operation's panel) and the tab bar.
#[component]
fn Frame(at: At, tab: Tab, children: Children) -> impl IntoView {
    let name = at.name;
    view! {
        <section class="page cluster-page" data-tab=tab.label()>
            <nav class="crumbs" aria-label="Breadcrumb">
                <a href="/clusters">"Clusters"</a>
                " / "
                <span aria-current="page">{move || name.get()}</span>
            </nav>
            <Transition fallback=loading>
                {move || Suspend::new(async move {
                    let (record, on_it) = (at.record.await, at.operations.await);
                    let loaded = on_it.map(|l| l.operations).unwrap_or_default();
                    let any_operation = !loaded.is_empty();
                    let operations = live_operations(at.live, loaded, Some(at.target()));
                    let status = record.as_ref().ok().map(|c| c.status.clone());
                    let head = view! { <ClusterHead name=name.get() status operations/> };
                    match record {
                        Ok(_) => Either::Left(head),
                        // Operations on a cluster the store does not know: a creation
                        // that has not recorded it yet, or failed before it could.
                        Err(e) => Either::Right(view! { {any_operation.then_some(head)} <ErrorPanel error=e/> }),
                    }
                })}
            </Transition>
            <nav class="tabs" aria-label="Cluster sections">
                {Tab::ALL
                    .into_iter()
                    .map(|t| {
                        view! {
                            <A href=move || format!("/clusters/{}{}", name.get(), t.path()) exact=true>
                                {t.label()}
                            </A>
                        }
                    })
                    .collect_view()}
            </nav>
            {children()}
        </section>
    }
}

/// What the store knows of the cluster, and what AWS says now of its control planes,
/// nodes, add-ons and components.
#[component]
pub fn OverviewTab() -> impl IntoView {
    let at = At::new();
    let refreshed = RwSignal::new(0u32);
    let described = at.described(refreshed);
    view! {
        <Frame at tab=Tab::Overview>
            <Transition fallback=loading>
                {move || Suspend::new(async move {
                    at.record.await.ok().map(|c| view! {
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
                    })
                })}
            </Transition>
            <Described described refreshed show=|d, refreshed| view! {
                <LiveFacts d=d.clone() refreshed/>
                <AddonsTable d/>
            }/>
        </Frame>
    }
}

/// The instance groups (scaled, added, software updated here) and the node table.
#[component]
pub fn NodesTab() -> impl IntoView {
    let at = At::new();
    let refreshed = RwSignal::new(0u32);
    let described = at.described(refreshed);
    let add_group = AddGroupForm::default();
    let nodes = NodesView::default();
    // The Refresh button has HyperPod read now; the other reasons to ask again (a filter,
    // a page, an operation that moved: the server sees that one itself) take the view.
    let refreshes = Refreshes::new(refreshed);
    let node_page = Resource::new(
        move || {
            (
                nodes.request(&at.name.get()),
                at.live.epoch.get(),
                at.moved.get(),
                refreshed.get(),
            )
        },
        move |(request, _, _, count)| async move {
            let mut request = request?;
            request.refresh = refreshes.asked(count);
            call(&request).await
        },
    );
    view! {
        <Frame at tab=Tab::Nodes>
            <Described described refreshed show=move |d, refreshed| view! {
                <LiveFacts d=d.clone() refreshed/>
                <Groups d add_group nodes node_page/>
            }/>
        </Frame>
    }
}

/// The managed features, read from the browser once the page is up.
#[component]
pub fn FeaturesTab() -> impl IntoView {
    let at = At::new();
    let usable = at.usable();
    view! {
        <Frame at tab=Tab::Features>
            {move || view! { <FeaturesPanel name=at.name.get() usable/> }}
        </Frame>
    }
}

/// The cluster's storage, its files, and the forms that change them, read from the
/// browser once the page is up.
#[component]
pub fn StorageTab() -> impl IntoView {
    let at = At::new();
    let usable = at.usable();
    view! {
        <Frame at tab=Tab::Storage>
            {move || view! { <StoragePanel name=at.name.get() usable/> }}
        </Frame>
    }
}

/// The models in the cluster's shared bucket, and the download form.
#[component]
pub fn ModelsTab() -> impl IntoView {
    let at = At::new();
    let usable = at.usable();
    view! {
        <Frame at tab=Tab::Models>
            {move || view! { <ModelsPanel name=at.name.get() usable/> }}
        </Frame>
    }
}

/// The cluster's training jobs, one job's ledger, and the submit form.
#[component]
pub fn TrainingTab() -> impl IntoView {
    let at = At::new();
    let usable = at.usable();
    view! {
        <Frame at tab=Tab::Training>
            {move || view! { <TrainingPanel name=at.name.get() usable/> }}
        </Frame>
    }
}

/// The cluster's model endpoints, the forms that deploy, scale and delete them, and a
/// test panel.
#[component]
pub fn InferenceTab() -> impl IntoView {
    let at = At::new();
    let usable = at.usable();
    view! {
        <Frame at tab=Tab::Inference>
            {move || view! { <InferencePanel name=at.name.get() usable/> }}
        </Frame>
    }
}

/// Where the cluster differs from what hypd made of it.
#[component]
pub fn DriftTab() -> impl IntoView {
    let at = At::new();
    view! {
        <Frame at tab=Tab::Drift>
            {move || view! { <DriftPanel name=at.name.get()/> }}
        </Frame>
    }
}

/// Every operation on the cluster, following the live channel.
#[component]
pub fn OperationsTab() -> impl IntoView {
    let at = At::new();
    view! {
        <Frame at tab=Tab::Operations>
            <div class="panel">
                <h2>"Operations on this cluster"</h2>
                <Transition fallback=loading>
                    {move || Suspend::new(async move {
                        match at.operations.await {
                            Ok(list) => Either::Left(view! { <OperationsTable loaded=list.operations target=at.target()/> }),
                            Err(e) => Either::Right(view! { <ErrorPanel error=e/> }),
                        }
                    })}
                </Transition>
            </div>
        </Frame>
    }
}

/// The live state once AWS has answered (`show` renders it), or what went wrong, with
/// Try again.
#[component]
fn Described<F, V>(
    described: Resource<Result<ClusterDescription, ApiError>>,
    refreshed: RwSignal<u32>,
    show: F,
) -> impl IntoView
where
    F: Fn(ClusterDescription, RwSignal<u32>) -> V + Copy + Send + Sync + 'static,
    V: IntoView + 'static,
{
    view! {
        <Transition fallback=loading>
            {move || Suspend::new(async move {
                match described.await {
                    Ok(d) => Either::Left(show(d, refreshed)),
                    Err(e) => Either::Right(view! {
                        <div class="panel live-state">
                            <h2>"Live state"</h2>
                            <ErrorPanel error=e/>
                            <button type="button" on:click=move |_| refreshed.update(|n| *n += 1)>
                                "Try again"
                            </button>
                        </div>
                    }),
                }
            })}
        </Transition>
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

/// What AWS says about the control planes and the nodes' health now, with Refresh.
#[component]
fn LiveFacts(d: ClusterDescription, refreshed: RwSignal<u32>) -> impl IntoView {
    let counts = d.node_counts.clone();
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
    }
}

/// The instance groups with their changes, adding one, and the node table.
#[component]
fn Groups(
    d: ClusterDescription,
    add_group: AddGroupForm,
    nodes: NodesView,
    node_page: Resource<Result<crate::api::nodes::NodeList, ApiError>>,
) -> impl IntoView {
    // Groups change on a cluster hypd created and that is in use.
    let changeable = d.cluster.status == "active";
    let name = d.cluster.name.clone();
    let of_cluster = name.clone();
    let of_nodes = name.clone();
    let group_names = d.instance_groups.iter().map(|g| g.name.clone()).collect();
    view! {
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
    }
}

/// The EKS add-ons and the components running inside the cluster.
#[component]
fn AddonsTable(d: ClusterDescription) -> impl IntoView {
    view! {
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
    }
}
