//! The cluster page's Nodes panel: `list_nodes` a page at a time, filtered by group and
//! health and sorted by any column, each node with its HyperPod status, its Kubernetes
//! health label and readiness, and its GPUs in use. An operator selects nodes and reboots,
//! replaces or deletes them, each after its plan (a replacement or deletion confirmed).
//! What is filtered and selected lives with the page, above the live state that draws the
//! panel again whenever AWS is asked again.

use std::collections::BTreeSet;

use leptos::either::Either;
use leptos::prelude::*;

use super::diagnosis::DiagnosisView;
use super::gate::{Gate, integer, text};
use super::loading;
use crate::api::call::call;
use crate::api::diagnose::{DiagnoseNode, Diagnosis};
use crate::api::nodes::{DeleteNodes, ListNodes, NodeDetail, NodeList, RebootNodes, ReplaceNodes};
use crate::api::software::UpdateClusterSoftware;
use crate::api::{ApiError, Command, decode};
use crate::session::{ErrorPanel, IfRole, use_me};
use crate::time::short;

/// The panel's state: filters, the page, the sort and the selection.
#[derive(Clone, Copy)]
pub struct NodesView {
    group: RwSignal<String>,
    health: RwSignal<String>,
    /// The tokens of the pages before this one; the last is this page's.
    pages: RwSignal<Vec<String>>,
    sort: RwSignal<(Column, bool)>,
    selected: RwSignal<BTreeSet<String>>,
    reboot: Gate,
    replace: Gate,
    delete: Gate,
    software: Gate,
    release: RwSignal<String>,
    batch_percent: RwSignal<String>,
    /// The node diagnosed last, and its diagnosis once it came.
    diagnosed: RwSignal<Option<(String, Option<Answer>)>>,
}

/// `diagnose_node`'s answer.
type Answer = Result<Diagnosis, ApiError>;

impl Default for NodesView {
    /// Inside the page's component (the actions take the router's navigation from there).
    fn default() -> Self {
        NodesView {
            group: RwSignal::new(String::new()),
            health: RwSignal::new(String::new()),
            pages: RwSignal::new(Vec::new()),
            sort: RwSignal::new((Column::Group, true)),
            selected: RwSignal::new(BTreeSet::new()),
            reboot: Gate::default(),
            replace: Gate::default(),
            delete: Gate::default(),
            software: Gate::default(),
            release: RwSignal::new(String::new()),
            batch_percent: RwSignal::new("25".to_owned()),
            diagnosed: RwSignal::new(None),
        }
    }
}

impl NodesView {
    /// The `list_nodes` request for cluster `name`'s page as filtered now (tracked: the
    /// page's resource asks again when a filter or the page changes).
    pub fn request(self, name: &str) -> Result<ListNodes, ApiError> {
        // Empty filters are left out of the request.
        let mut inputs = vec![
            text("name", name),
            text("group", self.group.get()),
            text("health", self.health.get()),
        ];
        if let Some(t) = self.pages.with(|p| p.last().cloned()) {
            inputs.push(text("page_token", t));
        }
        decode::<ListNodes>(crate::form::request(&inputs))
    }

    /// The actions' plans are for the nodes selected when they were asked for.
    fn reset_actions(self) {
        self.reboot.reset();
        self.replace.reset();
        self.delete.reset();
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Column {
    Node,
    Group,
    Health,
    Label,
    Gpus,
    Zone,
    Launched,
}

impl Column {
    const ALL: [(Column, &'static str); 7] = [
        (Column::Node, "Node"),
        (Column::Group, "Group"),
        (Column::Health, "Health"),
        (Column::Label, "Health label"),
        (Column::Gpus, "GPUs in use"),
        (Column::Zone, "Zone"),
        (Column::Launched, "Launched"),
    ];

    fn key(self, n: &NodeDetail) -> (String, String) {
        let id = n.node_id.clone();
        let first = match self {
            Column::Node => String::new(),
            Column::Group => n.instance_group.clone(),
            Column::Health => n.health.as_str().to_owned(),
            Column::Label => n.health_label.clone().unwrap_or_default(),
            Column::Gpus => format!("{:05}{:05}", n.gpus_allocated, n.gpus),
            Column::Zone => n.availability_zone.clone().unwrap_or_default(),
            Column::Launched => n.launch_time.clone().unwrap_or_default(),
        };
        (first, id)
    }
}

/// Nodes of cluster `cluster` (`nodes`: the page [`NodesView::request`] asks for);
/// `groups` are its groups, for the filter.
#[component]
pub fn NodesPanel(
    cluster: String,
    groups: Vec<String>,
    view: NodesView,
    nodes: Resource<Result<NodeList, ApiError>>,
) -> impl IntoView {
    let cluster = StoredValue::new(cluster);
    let me = use_me();
    let refilter = move || {
        view.pages.set(Vec::new());
        view.selected.set(BTreeSet::new());
        view.reset_actions();
    };
    view! {
        <div class="panel nodes-panel">
            <header class="panel-head">
                <h2>"Nodes"</h2>
                <span class="spacer"></span>
                <label>
                    "Group "
                    <select
                        class="node-group-filter"
                        prop:value=move || view.group.get()
                        on:change=move |ev| {
                            view.group.set(event_target_value(&ev));
                            refilter();
                        }
                    >
                        <option value="">"all"</option>
                        {groups.into_iter().map(|g| view! { <option value=g.clone()>{g.clone()}</option> }).collect_view()}
                    </select>
                </label>
                <label>
                    "Health "
                    <select
                        class="node-health-filter"
                        prop:value=move || view.health.get()
                        on:change=move |ev| {
                            view.health.set(event_target_value(&ev));
                            refilter();
                        }
                    >
                        <option value="">"any"</option>
                        <option value="healthy">"healthy"</option>
                        <option value="pending">"pending"</option>
                        <option value="unhealthy">"unhealthy"</option>
                    </select>
                </label>
            </header>
            <IfRole role=RebootNodes::SPEC.role>
                <NodeActions cluster=cluster.get_value() view/>
                <SoftwareUpdate cluster=cluster.get_value() view/>
            </IfRole>
            <Transition fallback=loading>
                {move || Suspend::new(async move {
                    let can_act = match me {
                        Some(me) => matches!(me.await, Ok(who) if who.role >= RebootNodes::SPEC.role),
                        None => false,
                    };
                    match nodes.await {
                        Ok(list) => Either::Left(view! { <NodeTable list view can_act/> }),
                        Err(error) => Either::Right(view! { <ErrorPanel error/> }),
                    }
                })}
            </Transition>
        </div>
    }
}

/// A page of nodes; `can_act`: the caller may act on them (they get a selection box).
#[component]
fn NodeTable(list: NodeList, view: NodesView, can_act: bool) -> impl IntoView {
    let counts = list.counts.clone();
    let next = list.next_page_token.clone();
    let cluster = StoredValue::new(list.name.clone());
    // Any role may ask: a diagnosis reads only.
    let diagnose = move |node_id: String| {
        view.diagnosed.set(Some((node_id.clone(), None)));
        leptos::task::spawn_local(async move {
            let request = decode::<DiagnoseNode>(
                serde_json::json!({ "name": cluster.get_value(), "node_id": node_id }),
            );
            let answer = match request {
                Ok(r) => call(&r).await,
                Err(e) => Err(e),
            };
            view.diagnosed.update(|d| {
                if let Some((id, found)) = d
                    && *id == node_id
                {
                    *found = Some(answer);
                }
            });
        });
    };
    let rows = StoredValue::new(list.nodes);
    let sorted = move || {
        let (column, ascending) = view.sort.get();
        let mut rows = rows.get_value();
        rows.sort_by_key(|n| column.key(n));
        if !ascending {
            rows.reverse();
        }
        rows
    };
    let header = move |(column, title): (Column, &'static str)| {
        let order = move || match view.sort.get() {
            (c, true) if c == column => "ascending",
            (c, false) if c == column => "descending",
            _ => "none",
        };
        view! {
            <th scope="col" aria-sort=order>
                <button
                    type="button"
                    class="sort"
                    on:click=move |_| view.sort.update(|(c, asc)| {
                        *asc = if *c == column { !*asc } else { true };
                        *c = column;
                    })
                >
                    {title}
                </button>
            </th>
        }
    };
    let selectable = move |id: String| {
        let checked = {
            let id = id.clone();
            move || view.selected.with(|s| s.contains(&id))
        };
        can_act.then(|| {
            view! {
                    <input
                        type="checkbox"
                        class="select-node"
                        aria-label=format!("Select {id}")
                        prop:checked=checked.clone()
                        on:change={
                            let id = id.clone();
                            move |ev| {
                                let on = event_target_checked(&ev);
                                view.selected.update(|s| {
                                    if on {
                                        s.insert(id.clone());
                                    } else {
                                        s.remove(&id);
                                    }
                                });
                                view.reset_actions();
                            }
                        }
                    />
            }
        })
    };
    view! {
        <p class="muted node-page-counts" data-total=counts.total data-healthy=counts.healthy>
            {format!(
                "{} nodes match: {} healthy, {} pending, {} unhealthy",
                counts.total, counts.healthy, counts.pending, counts.unhealthy,
            )}
        </p>
        {if counts.total == 0 {
            Either::Left(view! { <p class="muted empty">"No nodes."</p> })
        } else {
            Either::Right(view! {
                <div class="table-wrap">
                    <table class="table nodes">
                        <caption class="visually-hidden">"Nodes"</caption>
                        <thead>
                            <tr>
                                <th scope="col"><span class="visually-hidden">"Select"</span></th>
                                {Column::ALL.into_iter().map(header).collect_view()}
                                <th scope="col">"Status"</th>
                            </tr>
                        </thead>
                        <tbody>
                            {move || sorted().into_iter().map(|n| view! {
                                <tr data-node=n.node_id.clone() data-health=n.health.as_str()>
                                    <td>{selectable(n.node_id.clone())}</td>
                                    <th scope="row" class="mono" title=n.kubernetes_node.clone().map(|k| format!("Kubernetes node {k}"))>
                                        {n.node_id.clone()}
                                    </th>
                                    <td>{n.instance_group.clone()} <span class="muted mono">" " {n.instance_type.clone()}</span></td>
                                    <td><span class=format!("badge health health-{}", n.health.as_str())>{n.health.as_str()}</span></td>
                                    <td class="health-label">
                                        {match n.health_label.clone() {
                                            Some(l) => {
                                                let tone = if l == "Schedulable" { "healthy" } else { "unhealthy" };
                                                Either::Left(view! { <span class=format!("badge health health-{tone}")>{l}</span> })
                                            }
                                            None => Either::Right(view! { <span class="muted">"not in Kubernetes"</span> }),
                                        }}
                                        {(n.ready == Some(false)).then(|| view! { <span class="muted">" NotReady"</span> })}
                                        {(n.health_label.as_deref() != Some("Schedulable") || n.ready != Some(true)).then(|| {
                                            let id = n.node_id.clone();
                                            view! {
                                                " "
                                                <button type="button" class="diagnose-node" on:click=move |_| diagnose(id.clone())>
                                                    "Diagnose"
                                                </button>
                                            }
                                        })}
                                    </td>
                                    <td class="gpus">{gpus(&n)}</td>
                                    <td>{n.availability_zone.clone().unwrap_or_else(|| "—".into())}</td>
                                    <td class="time">{n.launch_time.as_deref().map(short).unwrap_or_else(|| "—".into())}</td>
                                    <td>
                                        {n.status.clone()}
                                        {n.message.clone().map(|m| view! { <span class="muted">" — " {m}</span> })}
                                        {n.image_release.clone().map(|r| view! { <span class="muted image-release" title="HyperPod image release">" · " {r}</span> })}
                                    </td>
                                </tr>
                            }).collect_view()}
                        </tbody>
                    </table>
                </div>
            })
        }}
        {move || view.diagnosed.get().map(|(id, found)| view! {
            <section class="panel node-diagnosis" data-node=id.clone() aria-live="polite">
                <h3>"Diagnosis of " <span class="mono">{id.clone()}</span></h3>
                {match found {
                    None => Either::Left(loading()),
                    Some(Ok(found)) => Either::Right(Either::Left(view! { <DiagnosisView found/> })),
                    Some(Err(error)) => Either::Right(Either::Right(view! { <ErrorPanel error/> })),
                }}
            </section>
        })}
        <nav class="pager" aria-label="Node pages">
            {move || view.pages.with(|p| !p.is_empty()).then(|| view! {
                <button type="button" class="previous-page" on:click=move |_| {
                    view.pages.update(|p| { p.pop(); });
                }>"Previous"</button>
            })}
            {next.map(|t| view! {
                <button type="button" class="next-page" on:click=move |_| {
                    view.pages.update(|p| p.push(t.clone()));
                }>"Next"</button>
            })}
        </nav>
    }
}

/// GPUs in use of the node's, and its EFA interfaces: one text (two adjacent texts would
/// hydrate as one).
fn gpus(n: &NodeDetail) -> String {
    if n.efa_interfaces > 0 {
        format!(
            "{} / {} · EFA {}",
            n.gpus_allocated, n.gpus, n.efa_interfaces
        )
    } else {
        format!("{} / {}", n.gpus_allocated, n.gpus)
    }
}

/// Reboot, replace or delete the selected nodes: each asks for its plan first.
#[component]
fn NodeActions(cluster: String, view: NodesView) -> impl IntoView {
    let cluster = StoredValue::new(cluster);
    let inputs = move || {
        let selected = view.selected.get_untracked();
        let ids = selected
            .into_iter()
            .enumerate()
            .map(|(i, id)| text(format!("node_ids[{i}]"), id));
        std::iter::once(text("name", cluster.get_value()))
            .chain(ids)
            .collect::<Vec<_>>()
    };
    let count = move || view.selected.with(BTreeSet::len);
    let none = move || count() == 0;
    let label = move |gate: Gate, first: &'static str, then: &'static str| {
        move || {
            let n = count();
            if gate.reviewing() {
                format!("{then} {n} node{}", if n == 1 { "" } else { "s" })
            } else {
                first.to_owned()
            }
        }
    };
    let NodesView {
        reboot,
        replace,
        delete,
        ..
    } = view;
    let reboot_them = move |_| reboot.start::<RebootNodes>(&inputs());
    let replace_them = move |_| replace.start::<ReplaceNodes>(&inputs());
    let delete_them = move |_| delete.start::<DeleteNodes>(&inputs());
    view! {
        <div class="node-actions">
            <span class="muted">{move || format!("{} selected", count())}</span>
            <button
                type="button"
                class="reboot-nodes"
                disabled=move || none() || reboot.busy()
                on:click=reboot_them
            >
                {label(reboot, "Reboot", "Reboot")}
            </button>
            <button
                type="button"
                class="danger replace-nodes"
                disabled=move || none() || replace.busy()
                on:click=replace_them
            >
                {label(replace, "Replace", "Replace")}
            </button>
            <button
                type="button"
                class="danger delete-nodes"
                disabled=move || none() || delete.busy()
                on:click=delete_them
            >
                {label(delete, "Delete", "Delete")}
            </button>
            {move || {
                let reviewing = [reboot, replace, delete].iter().any(|g| g.reviewing());
                reviewing.then(|| view! {
                    <button type="button" class="keep-nodes" on:click=move |_| view.reset_actions()>"Cancel"</button>
                })
            }}
            {reboot.view()}
            {replace.view()}
            {delete.view()}
        </div>
    }
}

/// The platform image moved to a release (empty: the newest), a percentage of the nodes
/// at a time: the plan first, then the operation.
#[component]
fn SoftwareUpdate(cluster: String, view: NodesView) -> impl IntoView {
    let NodesView {
        software,
        release,
        batch_percent,
        ..
    } = view;
    let cluster = StoredValue::new(cluster);
    let update = move |_| {
        software.start::<UpdateClusterSoftware>(&[
            text("name", cluster.get_value()),
            // Empty: the newest release.
            text("image_release", release.get_untracked()),
            integer("batch_percent", batch_percent.get_untracked()),
        ])
    };
    view! {
        <div class="node-actions software-update">
            <label>
                "Image release "
                <input
                    type="text"
                    class="software-release"
                    placeholder="newest"
                    prop:value=move || release.get()
                    on:input=move |ev| {
                        release.set(event_target_value(&ev));
                        software.reset();
                    }
                />
            </label>
            <label>
                "Batch % "
                <input
                    type="number"
                    min="1"
                    max="100"
                    class="software-batch"
                    prop:value=move || batch_percent.get()
                    on:input=move |ev| {
                        batch_percent.set(event_target_value(&ev));
                        software.reset();
                    }
                />
            </label>
            <button
                type="button"
                class="update-software"
                disabled=move || software.busy()
                on:click=update
            >
                {move || if software.reviewing() { "Start the update" } else { "Update software" }}
            </button>
            {software.view()}
        </div>
    }
}
