//! The cluster page's Models tab: the models `list_models` finds in the shared bucket
//! (where pods find each, the commit its revision resolved to, its size), and the form
//! that downloads one from the Hugging Face hub. The download is an operation: once it
//! runs, its page follows the Job's progress live. The token field is a password field
//! and is sent once; the server keeps it only as a Secret in the cluster.

use leptos::either::Either;
use leptos::prelude::*;

use super::gate::{Gate, flag, text};
use super::{Table, loading};
use crate::api::ApiError;
use crate::api::call::call;
use crate::api::command::Role;
use crate::api::models::{DownloadModel, ListModels, ModelList};
use crate::api::values::EksClusterName;
use crate::session::{ErrorPanel, IfRole};

#[component]
pub fn ModelsPanel(
    name: String,
    /// The cluster is active or imported: only then is there storage to read.
    usable: Signal<bool>,
) -> impl IntoView {
    let cluster = StoredValue::new(name);
    let reads = RwSignal::new(0u32);
    let listed = Resource::new(
        move || reads.get(),
        move |n| async move {
            if n == 0 {
                return None;
            }
            Some(match EksClusterName::parse(&cluster.get_value()) {
                Ok(name) => {
                    call(&ListModels {
                        name,
                        storage: None,
                    })
                    .await
                }
                Err(m) => Err(ApiError::field("name", m)),
            })
        },
    );
    Effect::new(move || {
        if usable.get() && reads.get_untracked() == 0 {
            reads.set(1);
        }
    });
    let shown = move || {
        Suspend::new(async move {
            match listed.await {
                None => Either::Left(view! {
                    <p class="muted">"Read from the cluster's storage once it is active."</p>
                }),
                Some(Ok(list)) => Either::Right(Either::Left(view! { <Models list/> })),
                Some(Err(error)) => Either::Right(Either::Right(view! { <ErrorPanel error/> })),
            }
        })
    };
    view! {
        <div class="panel models" aria-labelledby="models-title">
            <h2 id="models-title">"Models"</h2>
            <Transition fallback=loading>{shown}</Transition>
            <div class="actions">
                <button type="button" class="refresh-models" on:click=move |_| reads.update(|n| *n += 1)>
                    "Refresh"
                </button>
            </div>
        </div>
        <IfRole role=Role::Operator>
            <Download cluster=cluster.get_value()/>
        </IfRole>
    }
    .into_any()
}

#[component]
fn Models(list: ModelList) -> impl IntoView {
    if list.models.is_empty() {
        return Either::Left(view! {
            <p class="muted empty-models">{format!("No model in {} yet.", list.storage)}</p>
        });
    }
    let rows = list
        .models
        .into_iter()
        .map(|m| {
            let state = if m.complete { "complete" } else { "incomplete" };
            let id = m.model.clone();
            view! {
                <tr data-model=id>
                    <th scope="row" class="mono">{m.model}</th>
                    <td class="mono">{m.path_in_pods}</td>
                    <td>{m.revision.unwrap_or_else(|| "—".into())}</td>
                    <td class="mono commit">{m.commit.map(|c| c.chars().take(12).collect::<String>()).unwrap_or_else(|| "—".into())}</td>
                    <td class="num">{m.size_bytes.map(super::storage::size).unwrap_or_else(|| "—".into())}</td>
                    <td><super::StateBadge state=state.to_owned()/></td>
                </tr>
            }
        })
        .collect_view();
    Either::Right(view! {
        <Table class="model-table" caption="Models" columns={&["Model", "Path in pods", "Revision", "Commit", "Size", "State"]}>
            {rows}
        </Table>
    })
}

/// The download form: the model, its revision, a token for gated models; the plan
/// first, then the operation.
#[component]
fn Download(cluster: String) -> impl IntoView {
    let gate = Gate::default();
    let cluster = StoredValue::new(cluster);
    let model = RwSignal::new(String::new());
    let revision = RwSignal::new(String::new());
    let token = RwSignal::new(String::new());
    let replace = RwSignal::new(false);
    let submit = move |ev: leptos::ev::SubmitEvent| {
        ev.prevent_default();
        gate.start::<DownloadModel>(&[
            text("name", cluster.get_value()),
            text("model", model.get_untracked()),
            // Empty: main, and no token (a public model).
            text("revision", revision.get_untracked()),
            text("hf_token", token.get_untracked()),
            flag("replace", replace.get_untracked()),
        ]);
    };
    view! {
        <form class="panel download-model" aria-label="Download a model" on:submit=submit>
            <h2>"Download a model"</h2>
            <label>"Model "<input type="text" name="model" placeholder="meta-llama/Llama-3.2-1B"
                prop:value=move || model.get() on:input=gate.edit(model)/></label>
            <label>"Revision "<input type="text" name="revision" placeholder="main"
                prop:value=move || revision.get() on:input=gate.edit(revision)/></label>
            <label>"Token "<input type="password" name="hf_token" autocomplete="off" placeholder="for gated models"
                prop:value=move || token.get() on:input=gate.edit(token)/></label>
            <label class="check"><input type="checkbox" name="replace"
                prop:checked=move || replace.get()
                on:change=move |ev| { replace.set(event_target_checked(&ev)); gate.reset(); }/>
                " Replace another revision already there"</label>
            <div class="actions">
                <button class="primary" type="submit" disabled=move || gate.busy()>
                    {move || if gate.reviewing() { "Download" } else { "Review plan" }}
                </button>
            </div>
            {gate.view()}
        </form>
    }
    .into_any()
}
