//! The import-cluster form: the first form built on `crate::form`, so it is also the
//! pattern the create-cluster form follows. Its fields are `ImportCluster`'s; the region
//! choices come from `list_regions`; every check is the request type's own.

use leptos::either::EitherOf3;
use leptos::prelude::*;
use leptos_router::hooks::use_navigate;

use super::loading;
use crate::api::Role;
use crate::api::call::call;
use crate::api::clusters::ImportCluster;
use crate::api::inspect::ListRegions;
use crate::form::{FormAlert, FormState, SelectField, TextField, check, request_json};
use crate::session::{ErrorPanel, IfRole, use_me};

const FIELDS: &[&str] = &["name", "region", "hyperpod_cluster"];

#[component]
pub fn ImportClusterPage() -> impl IntoView {
    let me = use_me();
    view! {
        <section class="page">
            <nav class="crumbs" aria-label="Breadcrumb">
                <a href="/clusters">"Clusters"</a>
                " / "
                <span aria-current="page">"Import"</span>
            </nav>
            <header class="page-head">
                <h1>"Import an EKS cluster"</h1>
            </header>
            <Suspense fallback=loading>
                {move || Suspend::new(async move {
                    let who = match me {
                        Some(me) => me.await,
                        None => Err(crate::api::ApiError::internal("no session context")),
                    };
                    match who {
                        Ok(w) if w.role >= Role::Operator => EitherOf3::A(view! { <ImportForm/> }),
                        Ok(w) => {
                            EitherOf3::B(view! {
                                <div class="panel narrow" data-error="forbidden">
                                    <p>
                                        {format!(
                                            "Importing a cluster needs the operator role; token {} has {}.",
                                            w.token_name,
                                            w.role.as_str(),
                                        )}
                                    </p>
                                </div>
                            }
                                )
                        }
                        Err(e) => EitherOf3::C(view! { <ErrorPanel error=e/> }),
                    }
                })}
            </Suspense>
        </section>
    }
}

/// The "Import cluster" button of the clusters page, for callers allowed to import.
#[component]
pub fn ImportButton() -> impl IntoView {
    view! {
        <IfRole role=Role::Operator>
            <a class="button primary" href="/clusters/import">"Import cluster"</a>
        </IfRole>
    }
}

#[component]
fn ImportForm() -> impl IntoView {
    let form = FormState::new(FIELDS);
    let name = RwSignal::new(String::new());
    let region = RwSignal::new(String::new());
    let hyperpod = RwSignal::new(String::new());
    let regions = Resource::new(|| (), |_| call(&ListRegions { refresh: false }));
    let navigate = use_navigate();

    let submit = move |ev: leptos::ev::SubmitEvent| {
        ev.prevent_default();
        form.clear();
        let input = request_json(&[
            ("name", name.get_untracked()),
            ("region", region.get_untracked()),
            ("hyperpod_cluster", hyperpod.get_untracked()),
        ]);
        // The same decoding and rules as the server: most mistakes never leave the page.
        let request = match check::<ImportCluster>(input) {
            Ok(r) => r,
            Err(e) => return form.show(e),
        };
        form.busy.set(true);
        let navigate = navigate.clone();
        leptos::task::spawn_local(async move {
            match call(&request).await {
                Ok(started) => navigate(
                    &format!("/operations/{}", started.operation_id),
                    Default::default(),
                ),
                Err(e) => {
                    form.busy.set(false);
                    form.show(e);
                }
            }
        });
    };

    view! {
        <form class="panel form" on:submit=submit novalidate aria-describedby="import-intro">
            <p id="import-intro" class="muted">
                "hypd adopts an existing, ACTIVE EKS cluster: it grants its own IAM principal cluster-admin through an EKS access entry, finds the HyperPod cluster the EKS cluster orchestrates, and records it. Nothing else changes."
            </p>
            <TextField
                form
                name="name"
                label="EKS cluster name"
                value=name
                required=true
                placeholder="ml-cluster-1"
                hint="The existing cluster's name; hypd manages it under the same name."
            />
            // Awaited under Suspense so the server renders the choices into the page.
            <Suspense fallback=loading>
                {move || Suspend::new(async move {
                    let (choices, problem): (Vec<(String, String)>, _) = match regions.await {
                        Ok(list) => {
                            (list.regions.into_iter().map(|r| (r.name.clone(), r.name)).collect(), None)
                        }
                        Err(e) => (Vec::new(), Some(format!("Regions could not be listed: {e}"))),
                    };
                    view! {
                        <SelectField
                            form
                            name="region"
                            label="Region"
                            value=region
                            options=Signal::stored(choices)
                            empty="hypd's own region"
                            hint="Where the EKS cluster runs."
                        />
                        {problem.map(|p| view! { <p class="hint error">{p}</p> })}
                    }
                })}
            </Suspense>
            <details class="advanced">
                <summary>"Advanced"</summary>
                <TextField
                    form
                    name="hyperpod_cluster"
                    label="HyperPod cluster"
                    value=hyperpod
                    hint="Only when the EKS cluster orchestrates more than one HyperPod cluster."
                />
            </details>
            <FormAlert form/>
            <div class="actions">
                <button class="primary" type="submit" disabled=move || form.busy.get()>
                    {move || if form.busy.get() { "Importing…" } else { "Import cluster" }}
                </button>
                <a class="button" href="/clusters">"Cancel"</a>
            </div>
        </form>
    }
}
