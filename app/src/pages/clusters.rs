//! The clusters hypd manages: the list and one cluster's page. They show what the store
//! knows (`list_clusters`, `get_cluster`) and the operations that act on a cluster.

use leptos::prelude::*;
use leptos_router::hooks::use_params_map;

use super::{StateBadge, loading};
use crate::api::call::call;
use crate::api::clusters::{GetCluster, ListClusters};
use crate::api::operations::ListOperations;
use crate::api::values::ClusterName;
use crate::live::use_live;
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
            </header>
            <Transition fallback=loading>
                {move || Suspend::new(async move {
                    match clusters.await {
                        Ok(list) if list.clusters.is_empty() => {
                            view! {
                                <div class="panel empty">
                                    <p>"No clusters yet."</p>
                                    <p class="muted">
                                        "Clusters that hypd creates or imports are listed here."
                                    </p>
                                </div>
                            }
                                .into_any()
                        }
                        Ok(list) => {
                            view! {
                                <div class="table-wrap">
                                    <table class="table clusters">
                                        <caption class="visually-hidden">"Managed clusters"</caption>
                                        <thead>
                                            <tr>
                                                <th scope="col">"Name"</th>
                                                <th scope="col">"Status"</th>
                                                <th scope="col">"Region"</th>
                                                <th scope="col">"Kubernetes"</th>
                                                <th scope="col">"HyperPod"</th>
                                                <th scope="col">"Updated"</th>
                                            </tr>
                                        </thead>
                                        <tbody>
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
                                                            <td class="time">{short(&c.updated_at)}</td>
                                                        </tr>
                                                    }
                                                })
                                                .collect_view()}
                                        </tbody>
                                    </table>
                                </div>
                            }
                                .into_any()
                        }
                        Err(e) => view! { <ErrorPanel error=e/> }.into_any(),
                    }
                })}
            </Transition>
        </section>
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
                            view! {
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
                                .into_any()
                        }
                        Err(e) => view! { <ErrorPanel error=e/> }.into_any(),
                    }
                })}
            </Transition>
            <div class="panel">
                <h2>"Operations on this cluster"</h2>
                <Transition fallback=loading>
                    {move || Suspend::new(async move {
                        match operations.await {
                            Ok(list) => {
                                view! { <OperationsTable loaded=list.operations target=format!("cluster/{}", name())/> }
                                    .into_any()
                            }
                            Err(e) => view! { <ErrorPanel error=e/> }.into_any(),
                        }
                    })}
                </Transition>
            </div>
        </section>
    }
}
