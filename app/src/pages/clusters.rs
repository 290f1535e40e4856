//! The clusters hypd manages: the list and one cluster's page. The list and the page's
//! overview show what the store knows (`list_clusters`, `get_cluster`: no AWS call per
//! row; node health as last observed); the page adds the cluster's live state
//! (`describe_cluster`: instance groups, nodes and their health, add-ons, components,
//! storage) and the operations on it.

use leptos::either::{Either, EitherOf3};
use leptos::prelude::*;
use leptos_router::hooks::use_params_map;

use super::{StateBadge, Table, loading};
use crate::api::call::call;
use crate::api::clusters::{
    ClusterDescription, DescribeCluster, GetCluster, ListClusters, ObservedNodes,
};
use crate::api::operations::ListOperations;
use crate::api::values::{ClusterName, EksClusterName};
use crate::live::use_live;
use crate::pages::create::CreateButton;
use crate::pages::import::ImportButton;
use crate::pages::operations::OperationsTable;
use crate::session::ErrorPanel;
use crate::time::short;

#[component]
pub fn ClusterList() -> impl IntoView {
    let live = use_live();
    // Reloaded when the live channel (re)connects and whenever an operation finishes:
    // finished operations are what change clusters.
    let finished = Memo::new(move |_| {
        live.operations.with(|m| {
            m.values()
                .filter(|o| o.state.is_terminal())
                .map(|o| o.updated_at.clone())
                .max()
        })
    });
    let clusters = Resource::new(
        move || (live.epoch.get(), finished.get()),
        |_| call(&ListClusters {}),
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
                    match clusters.await {
                        Ok(list) if list.clusters.is_empty() => {
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
                                        .clusters
                                        .into_iter()
                                        .map(|c| {
                                            view! {
                                                <tr data-cluster=c.name.clone()>
                                                    <th scope="row">
                                                        <a href=format!("/clusters/{}", c.name)>{c.name.clone()}</a>
                                                    </th>
                                                    <td><StateBadge state=c.status/></td>
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
fn NodeHealthSummary(nodes: Option<ObservedNodes>) -> impl IntoView {
    match nodes {
        None => Either::Left(view! {
            <span class="muted" title="Not observed yet: the cluster's page asks AWS">"—"</span>
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
            Either::Right(view! {
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
    let cluster = Resource::new(
        move || (name(), live.epoch.get()),
        |(name, _)| async move {
            let name =
                ClusterName::parse(&name).map_err(|m| crate::api::ApiError::field("name", m))?;
            call(&GetCluster { name }).await
        },
    );
    // The live state is asked of AWS again whenever an operation on this cluster moves
    // (a creation brings its nodes up stage by stage), on each reconnect, and on demand.
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
    let refreshed = RwSignal::new(0u32);
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
                    match cluster.await {
                        Ok(c) => {
                            Either::Left(view! {
                                <header class="page-head">
                                    <h1>{c.name.clone()}</h1>
                                    <StateBadge state=c.status.clone()/>
                                </header>
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
                        Err(e) => Either::Right(view! { <ErrorPanel error=e/> }),
                    }
                })}
            </Transition>
            <Transition fallback=loading>
                {move || Suspend::new(async move {
                    match described.await {
                        Ok(d) => Either::Left(view! { <LiveState d refreshed/> }),
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
fn LiveState(d: ClusterDescription, refreshed: RwSignal<u32>) -> impl IntoView {
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
        <TablePanel
            title="Instance groups"
            class="instance-groups"
            caption="Instance groups"
            columns={&["Group", "Instance type", "Instances", "Status", "Training plan"]}
            empty="No instance groups."
            is_empty={d.instance_groups.is_empty()}
        >
            {d.instance_groups.into_iter().map(|g| view! {
                <tr data-group=g.name.clone()>
                    <th scope="row">{g.name.clone()}</th>
                    <td class="mono">{or_dash(g.instance_type)}</td>
                    <td class="count">{format!("{} / {}", g.current_count, g.target_count)}</td>
                    <td><StateBadge state=or_dash(g.status)/></td>
                    <td class="arn">{or_dash(g.training_plan_arn)}</td>
                </tr>
            }).collect_view()}
        </TablePanel>
        <TablePanel
            title="Nodes"
            class="nodes"
            caption="Nodes"
            columns={&["Node", "Health", "Status", "Instance type", "Group", "Launched"]}
            empty="No nodes."
            is_empty={d.nodes.is_empty()}
        >
            {d.nodes.into_iter().map(|n| view! {
                <tr data-node=n.node_id.clone() data-health=n.health.as_str()>
                    <th scope="row" class="mono">{n.node_id.clone()}</th>
                    <td><span class=format!("badge health health-{}", n.health.as_str())>{n.health.as_str()}</span></td>
                    <td>
                        {n.status.clone()}
                        {n.message.map(|m| view! { <span class="muted">" — " {m}</span> })}
                    </td>
                    <td class="mono">{n.instance_type.clone()}</td>
                    <td>{n.instance_group.clone()}</td>
                    <td class="time">{or_dash(n.launch_time.as_deref().map(short))}</td>
                </tr>
            }).collect_view()}
        </TablePanel>
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
