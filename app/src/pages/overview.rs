//! The console's front page: what needs a person now (failed operations, unhealthy
//! nodes), what is running, and every cluster with its node health, from the read
//! commands the other pages use (`list_clusters`, `list_operations`: the store, no AWS
//! call) and following the live channel. A visitor without a session is sent to sign in;
//! the route renders whole on the server so that is a plain redirect.

use leptos::either::{Either, EitherOf3};
use leptos::prelude::*;
use leptos_router::components::Redirect;

use super::clusters::{NodeHealthSummary, cluster_state, latest_on, live_clusters};
use super::create::CreateButton;
use super::import::ImportButton;
use super::progress::command_title;
use super::{StateBadge, Table, loading};
use crate::api::ApiError;
use crate::api::call::call;
use crate::api::clusters::ClusterSummary;
use crate::api::operations::{ListOperations, Operation, OperationState};
use crate::console::get_console_info;
use crate::live::use_live;
use crate::pages::operations::merged;
use crate::session::{ErrorPanel, use_me};
use crate::time::{elapsed, short};

/// One thing that needs a person, with where to act on it.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Attention {
    /// Stable across reloads, for the list's keys and tests (`operation/<id>`,
    /// `nodes/<cluster>`, `cluster/<name>`).
    pub key: String,
    pub what: String,
    pub detail: Option<String>,
    pub href: String,
    pub action: &'static str,
}

/// What needs attention: every target whose latest operation failed (a later success or
/// a retry clears it), every cluster with unhealthy nodes as last observed, and every
/// cluster the store marks failed that no failed operation explains already.
pub(crate) fn attention(clusters: &[ClusterSummary], operations: &[Operation]) -> Vec<Attention> {
    let mut items = Vec::new();
    let mut targets: Vec<&str> = operations.iter().map(|o| o.target.as_str()).collect();
    targets.sort_unstable();
    targets.dedup();
    for target in targets {
        let Some(op) = latest_on(operations, target) else {
            continue;
        };
        if op.state != OperationState::Failed {
            continue;
        }
        let stage = op.stages.iter().find(|s| s.state == OperationState::Failed);
        let error = stage.and_then(|s| s.error.as_ref()).or(op.error.as_ref());
        let at = stage
            .map(|s| format!(" at {}", s.title))
            .unwrap_or_default();
        // A recorded cluster's page offers Retry and Delete; the operation's page Retry.
        let cluster = target
            .strip_prefix("cluster/")
            .filter(|name| clusters.iter().any(|c| c.name == *name));
        let (href, action) = match cluster {
            Some(name) => (format!("/clusters/{name}"), "Retry or delete"),
            None => (
                format!("/operations/{}", op.operation_id),
                "Open the operation",
            ),
        };
        items.push(Attention {
            key: format!("operation/{}", op.operation_id),
            what: format!("{} on {target} failed{at}", command_title(&op.command)),
            detail: error.map(ToString::to_string),
            href,
            action,
        });
    }
    for c in clusters {
        if let Some(n) = c.nodes.as_ref().filter(|n| n.counts.unhealthy > 0) {
            items.push(Attention {
                key: format!("nodes/{}", c.name),
                what: format!(
                    "{}: {} of {} nodes unhealthy",
                    c.name, n.counts.unhealthy, n.counts.total
                ),
                detail: Some(format!("As of {}", short(&n.observed_at))),
                href: format!("/clusters/{}", c.name),
                action: "Open the cluster",
            });
        }
        let explained = items
            .iter()
            .any(|i| i.href == format!("/clusters/{}", c.name) && i.key.starts_with("operation/"));
        if c.status == "failed" && !explained {
            items.push(Attention {
                key: format!("cluster/{}", c.name),
                what: format!("{} is failed", c.name),
                detail: None,
                href: format!("/clusters/{}", c.name),
                action: "Open the cluster",
            });
        }
    }
    items
}

/// Operations still under way (pending, running, waiting), newest first.
fn in_progress(operations: &[Operation]) -> Vec<Operation> {
    operations
        .iter()
        .filter(|o| !o.state.is_terminal())
        .cloned()
        .collect()
}

#[component]
pub fn Overview() -> impl IntoView {
    let me = use_me();
    view! {
        <Suspense fallback=loading>
            {move || Suspend::new(async move {
                let who = match me {
                    Some(me) => me.await,
                    None => Err(ApiError::internal("no session context")),
                };
                match who {
                    Ok(_) => EitherOf3::A(view! { <Dashboard/> }),
                    Err(ApiError::Unauthorized { .. }) => {
                        EitherOf3::B(view! { <Redirect path="/login?next=/"/> })
                    }
                    Err(e) => EitherOf3::C(view! { <ErrorPanel error=e/> }),
                }
            })}
        </Suspense>
    }
}

#[component]
fn Dashboard() -> impl IntoView {
    let live = use_live();
    let clusters = live_clusters(live);
    let operations = Resource::new(
        move || live.epoch.get(),
        |_| async move { call(&ListOperations::default()).await },
    );
    let info = Resource::new(|| (), |_| get_console_info());
    view! {
        <section class="page overview">
            <header class="page-head">
                <h1>"Overview"</h1>
                <span class="spacer"></span>
                <ImportButton/>
                <CreateButton/>
            </header>
            <Transition fallback=loading>
                {move || Suspend::new(async move {
                    let (clusters, operations) = (clusters.await, operations.await);
                    match (clusters, operations) {
                        (Ok(c), Ok(o)) => Either::Left(view! { <Panels clusters=c loaded=o.operations/> }),
                        (Err(e), _) | (_, Err(e)) => Either::Right(view! { <ErrorPanel error=e/> }),
                    }
                })}
            </Transition>
            <Suspense fallback=|| ()>
                {move || Suspend::new(async move {
                    info.await.ok().map(|info| view! {
                        <dl class="facts about" aria-label="About this console">
                            <dt>"Version"</dt>
                            <dd>{info.version}</dd>
                            <dt>"Mode"</dt>
                            <dd>{if info.sandbox { "sandbox (moto + sim)" } else { "AWS" }}</dd>
                            <dt>"Region"</dt>
                            <dd>{info.region.unwrap_or_else(|| "not configured".to_owned())}</dd>
                        </dl>
                    })
                })}
            </Suspense>
        </section>
    }
}

#[component]
fn Panels(clusters: Vec<ClusterSummary>, loaded: Vec<Operation>) -> impl IntoView {
    let live = use_live();
    let operations = Memo::new(move |_| {
        live.operations.with(|m| {
            let pushed: Vec<Operation> = m.values().cloned().collect();
            merged(&loaded, &pushed, None)
        })
    });
    let needs = {
        let clusters = clusters.clone();
        Memo::new(move |_| operations.with(|o| attention(&clusters, o)))
    };
    let running = Memo::new(move |_| operations.with(|o| in_progress(o)));
    view! {
        <div class="overview-grid">
            <section class="panel attention" aria-labelledby="attention-title"
                data-count=move || needs.with(Vec::len)>
                <h2 id="attention-title">"Needs attention"</h2>
                <Show
                    when=move || needs.with(|n| !n.is_empty())
                    fallback=|| view! { <p class="muted empty">"Nothing needs attention: no failed operations, no unhealthy nodes."</p> }
                >
                    <ul class="items">
                        <For each=move || needs.get() key=|a| a.key.clone() let:item>
                            <li data-attention=item.key.clone()>
                                <span class="item-what">{item.what.clone()}</span>
                                {item.detail.clone().map(|d| view! { <span class="item-detail">{d}</span> })}
                                <a class="item-action" href=item.href.clone()>{item.action}</a>
                            </li>
                        </For>
                    </ul>
                </Show>
            </section>
            <section class="panel running" aria-labelledby="running-title">
                <h2 id="running-title">"In progress"</h2>
                <Show
                    when=move || running.with(|r| !r.is_empty())
                    fallback=|| view! { <p class="muted empty">"Nothing is running."</p> }
                >
                    <ul class="items">
                        <For
                            each=move || running.get()
                            key=|o| (o.operation_id.clone(), o.updated_at.clone())
                            children=move |o| view! { <Running op=o/> }
                        />
                    </ul>
                </Show>
            </section>
        </div>
        <section class="panel" aria-labelledby="clusters-title">
            <h2 id="clusters-title">"Clusters"</h2>
            {if clusters.is_empty() {
                Either::Left(view! { <p class="muted empty">"No clusters yet: create one, or import an EKS cluster."</p> })
            } else {
                Either::Right(view! {
                    <Table class="clusters" caption="Managed clusters" columns={&["Name", "Status", "Nodes", "Region"]}>
                        {clusters
                            .into_iter()
                            .map(|c| {
                                let word = {
                                    let (status, name) = (c.status.clone(), c.name.clone());
                                    Signal::derive(move || operations.with(|o| cluster_state(&status, &name, o).word))
                                };
                                view! {
                                    <tr data-cluster=c.name.clone() data-state=word>
                                        <th scope="row"><a href=format!("/clusters/{}", c.name)>{c.name.clone()}</a></th>
                                        <td><StateBadge state=word/></td>
                                        <td><NodeHealthSummary nodes=c.nodes/></td>
                                        <td>{c.region}</td>
                                    </tr>
                                }
                            })
                            .collect_view()}
                    </Table>
                })
            }}
        </section>
    }
}

/// One operation under way: what, on what, its current stage and how long it has run.
#[component]
fn Running(op: Operation) -> impl IntoView {
    let live = use_live();
    let stage = op.current_stage().map(|s| s.title.clone());
    let created = op.created_at.clone();
    let took = move || elapsed(Some(&created), None, live.now.get());
    view! {
        <li data-operation=op.operation_id.clone() data-state=op.state.as_str()>
            <a class="item-what" href=format!("/operations/{}", op.operation_id)>
                {format!("{} on {}", command_title(&op.command), op.target)}
            </a>
            <StateBadge state=op.state.as_str().to_owned()/>
            {stage.map(|s| view! { <span class="item-detail">{s}</span> })}
            <span class="elapsed muted">{move || took().unwrap_or_default()}</span>
        </li>
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(id: &str, command: &str, target: &str, created: &str, state: &str) -> Operation {
        let failed = state == "failed";
        serde_json::from_value(serde_json::json!({
            "operation_id": id, "command": command, "target": target,
            "state": state, "requested_by": "admin", "created_at": created,
            "updated_at": created, "outputs": {}, "retryable": failed, "cancellable": false,
            "stages": [
                { "name": "network", "title": "Network", "state": "succeeded", "attempts": 1,
                  "started_at": null, "finished_at": null, "next_poll_at": null, "message": null,
                  "error": null, "cancellable": true },
                { "name": "hyperpod", "title": "HyperPod cluster", "state": if failed { "failed" } else { state },
                  "attempts": 1, "started_at": null, "finished_at": null, "next_poll_at": null,
                  "message": null, "cancellable": false,
                  "error": failed.then(|| serde_json::json!({ "kind": "upstream", "service": "sagemaker",
                      "call": "CreateCluster", "code": "ValidationException", "message": "no capacity",
                      "request_id": null })) },
            ],
            "error": null,
        }))
        .unwrap()
    }

    fn cluster(name: &str, status: &str, unhealthy: u32) -> ClusterSummary {
        serde_json::from_value(serde_json::json!({
            "name": name, "region": "us-east-1", "status": status, "kubernetes_version": "1.33",
            "eks_cluster_arn": null, "hyperpod_cluster_arn": null,
            "created_at": "2026-01-01T00:00:00.000Z", "updated_at": "2026-01-01T00:00:00.000Z",
            "nodes": { "counts": { "total": 4, "healthy": 4 - unhealthy, "pending": 0, "unhealthy": unhealthy },
                       "observed_at": "2026-01-01T00:00:05.000Z" },
        }))
        .unwrap()
    }

    const T0: &str = "2026-01-01T00:00:00.000Z";
    const T1: &str = "2026-01-01T00:00:01.000Z";

    #[test]
    fn failures_still_standing_and_unhealthy_nodes_need_attention() {
        let clusters = [
            cluster("broken", "creating", 0),
            cluster("sick", "active", 1),
            cluster("fine", "active", 0),
        ];
        let operations = [
            op("a", "create_cluster", "cluster/broken", T0, "failed"),
            // Failed, then a later deletion succeeded: nothing stands.
            op("b", "create_cluster", "cluster/gone", T0, "failed"),
            op("c", "delete_cluster", "cluster/gone", T1, "succeeded"),
            // Failed before the cluster was recorded: its operation's page.
            op("d", "import_cluster", "cluster/never", T1, "failed"),
            op("e", "create_cluster", "cluster/fine", T0, "succeeded"),
        ];
        let items = attention(&clusters, &operations);
        let keys: Vec<&str> = items.iter().map(|i| i.key.as_str()).collect();
        assert_eq!(keys, ["operation/a", "operation/d", "nodes/sick"]);
        assert_eq!(
            items[0].what,
            "Create cluster on cluster/broken failed at HyperPod cluster"
        );
        assert_eq!(items[0].href, "/clusters/broken");
        assert!(items[0].detail.as_deref().unwrap().contains("no capacity"));
        assert_eq!(items[1].href, "/operations/d");
        assert_eq!(items[2].what, "sick: 1 of 4 nodes unhealthy");
    }

    #[test]
    fn a_failed_cluster_is_listed_once() {
        let clusters = [cluster("x", "failed", 0), cluster("y", "failed", 0)];
        let operations = [op("a", "create_cluster", "cluster/x", T0, "failed")];
        let keys: Vec<String> = attention(&clusters, &operations)
            .into_iter()
            .map(|i| i.key)
            .collect();
        assert_eq!(keys, ["operation/a", "cluster/y"]);
    }

    #[test]
    fn a_failed_creation_reads_as_such_until_something_newer_happens() {
        let failed = [op("a", "create_cluster", "cluster/x", T0, "failed")];
        let state = cluster_state("creating", "x", &failed);
        assert_eq!(state.word, "create failed");
        let failure = state.failed.unwrap();
        assert_eq!(failure.stage.as_deref(), Some("HyperPod cluster"));
        assert!(failure.retryable);
        let retried = [op("a", "create_cluster", "cluster/x", T0, "running")];
        assert_eq!(cluster_state("creating", "x", &retried).word, "creating");
        let deleting = [
            op("a", "create_cluster", "cluster/x", T0, "failed"),
            op("b", "delete_cluster", "cluster/x", T1, "running"),
        ];
        assert_eq!(cluster_state("deleting", "x", &deleting).word, "deleting");
        assert_eq!(cluster_state("active", "x", &[]).word, "active");
        assert_eq!(
            in_progress(&deleting)
                .iter()
                .map(|o| o.operation_id.as_str())
                .collect::<Vec<_>>(),
            ["b"]
        );
    }
}
