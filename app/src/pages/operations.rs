//! Operations: the list, and one operation's page with its progress panel. Both render
//! what the server had when the page loaded and then follow the live channel, so a
//! change shows up without reloading.

use leptos::either::Either;
use leptos::prelude::*;
use leptos_router::hooks::use_params_map;

use super::{StateBadge, Table, loading};
use crate::api::call::call;
use crate::api::operations::{GetOperation, ListOperations, Operation};
use crate::live::use_live;
use crate::session::ErrorPanel;
use crate::time::short;

pub use super::progress::OperationPage;

#[component]
pub fn OperationList() -> impl IntoView {
    let live = use_live();
    let operations = Resource::new(
        move || live.epoch.get(),
        |_| async move { call(&ListOperations::default()).await },
    );
    view! {
        <section class="page">
            <header class="page-head">
                <h1>"Operations"</h1>
            </header>
            <div class="panel">
                <Transition fallback=loading>
                    {move || Suspend::new(async move {
                        match operations.await {
                            Ok(list) => Either::Left(view! { <OperationsTable loaded=list.operations/> }),
                            Err(e) => Either::Right(view! { <ErrorPanel error=e/> }),
                        }
                    })}
                </Transition>
            </div>
        </section>
    }
}

/// Loaded operations, each replaced by its newer pushed snapshot, plus operations pushed
/// since (on `target` only, when given), newest first.
pub(crate) fn merged(
    loaded: &[Operation],
    pushed: &[Operation],
    target: Option<&str>,
) -> Vec<Operation> {
    let mut all: Vec<Operation> = loaded.to_vec();
    for p in pushed {
        match all.iter_mut().find(|o| o.operation_id == p.operation_id) {
            Some(o) if p.updated_at >= o.updated_at => *o = p.clone(),
            Some(_) => {}
            None if target.is_none_or(|t| t == p.target) => all.push(p.clone()),
            None => {}
        }
    }
    all.sort_by(|a, b| {
        b.created_at
            .cmp(&a.created_at)
            .then_with(|| b.operation_id.cmp(&a.operation_id))
    });
    all
}

#[component]
pub fn OperationsTable(
    loaded: Vec<Operation>,
    /// Only operations pushed for this target are added (a cluster's page).
    #[prop(optional, into)]
    target: Option<String>,
) -> impl IntoView {
    let live = use_live();
    let rows = Memo::new(move |_| {
        live.operations.with(|m| {
            let pushed: Vec<Operation> = m.values().cloned().collect();
            merged(&loaded, &pushed, target.as_deref())
        })
    });
    view! {
        <Show
            when=move || rows.with(|r| !r.is_empty())
            fallback=|| view! { <p class="muted empty">"No operations yet."</p> }
        >
            <Table
                class="operations"
                caption="Operations, newest first"
                columns={&["Operation", "Command", "Target", "State", "Requested by", "Started"]}
            >
                <For
                    each=move || rows.get()
                    key=|o| (o.operation_id.clone(), o.updated_at.clone())
                    children=|o| {
                        view! {
                            <tr data-operation=o.operation_id.clone() data-state=o.state.as_str()>
                                <th scope="row">
                                    <a class="mono" href=format!("/operations/{}", o.operation_id)>
                                        {o.operation_id.clone()}
                                    </a>
                                </th>
                                <td>{o.command.clone()}</td>
                                <td class="mono">{o.target.clone()}</td>
                                <td><StateBadge state=o.state.as_str().to_owned()/></td>
                                <td>{o.requested_by.clone()}</td>
                                <td class="time">{short(&o.created_at)}</td>
                            </tr>
                        }
                    }
                />
            </Table>
        </Show>
    }
}

/// One operation, loaded by id and reloaded on each (re)connect of the live channel.
pub fn operation_resource(
    id: impl Fn() -> String + Send + Sync + 'static,
) -> Resource<Result<Operation, crate::api::ApiError>> {
    let live = use_live();
    Resource::new(
        move || (id(), live.epoch.get()),
        |(operation_id, _)| async move { call(&GetOperation { operation_id }).await },
    )
}

pub fn use_operation_id() -> impl Fn() -> String + Copy + Send + Sync + 'static {
    let params = use_params_map();
    move || params.with(|p| p.get("id").unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(id: &str, target: &str, created: &str, updated: &str, state: &str) -> Operation {
        serde_json::from_value(serde_json::json!({
            "operation_id": id, "command": "import_cluster", "target": target,
            "state": state, "requested_by": "admin", "created_at": created,
            "updated_at": updated, "stages": [], "outputs": {}, "error": null,
            "retryable": false, "cancellable": false,
        }))
        .unwrap()
    }

    #[test]
    fn pushed_snapshots_replace_older_rows_and_add_new_ones() {
        let t0 = "2026-01-01T00:00:00.000Z";
        let t1 = "2026-01-01T00:00:01.000Z";
        let t2 = "2026-01-01T00:00:02.000Z";
        let loaded = vec![op("a", "cluster/x", t0, t1, "running")];
        let pushed = vec![
            op("a", "cluster/x", t0, t2, "succeeded"),
            op("b", "cluster/y", t2, t2, "pending"),
        ];
        let all = merged(&loaded, &pushed, None);
        let ids: Vec<_> = all.iter().map(|o| o.operation_id.as_str()).collect();
        assert_eq!(ids, ["b", "a"]);
        assert_eq!(all[1].state.as_str(), "succeeded");

        let only_x = merged(&loaded, &pushed, Some("cluster/x"));
        assert_eq!(only_x.len(), 1);

        // An older push does not roll a row back.
        let stale = vec![op("a", "cluster/x", t0, t0, "pending")];
        assert_eq!(merged(&loaded, &stale, None)[0].state.as_str(), "running");
    }
}
