//! The import-cluster form: `ImportCluster`'s fields declared once, on `crate::form`, in
//! the page shell gated on the command's own role. The region choices come from
//! `list_regions`; every check is the request type's own.

use leptos::prelude::*;

use super::gate::{Gate, GateActions};
use super::{CommandLink, CommandPage, loading};
use crate::api::Command;
use crate::api::call::call;
use crate::api::clusters::ImportCluster;
use crate::api::inspect::ListRegions;
use crate::form::{Field, FieldInput, FormAlert, FormState, check};

const NAME: Field = Field::text("name", "EKS cluster name")
    .required()
    .placeholder("ml-cluster-1")
    .hint("The existing cluster's name; hypd manages it under the same name.");
const REGION: Field = Field::select("region", "Region").hint("Where the EKS cluster runs.");
const HYPERPOD: Field = Field::text("hyperpod_cluster", "HyperPod cluster")
    .hint("Only when the EKS cluster orchestrates more than one HyperPod cluster.");
const FIELDS: &[Field] = &[NAME, REGION, HYPERPOD];

#[component]
pub fn ImportClusterPage() -> impl IntoView {
    view! {
        <CommandPage
            spec=ImportCluster::SPEC
            parent=("/clusters", "Clusters")
            crumb="Import"
            title="Import an EKS cluster"
        >
            <ImportForm/>
        </CommandPage>
    }
}

/// The "Import cluster" button of the clusters page, for callers allowed to import.
#[component]
pub fn ImportButton() -> impl IntoView {
    view! { <CommandLink spec=ImportCluster::SPEC href="/clusters/import" label="Import cluster"/> }
}

#[component]
fn ImportForm() -> impl IntoView {
    let (form, record) = FormState::declared(FIELDS);
    let regions = Resource::new(|| (), |_| call(&ListRegions { refresh: false }));
    let gate = Gate::default();

    let submit = move |ev: leptos::ev::SubmitEvent| {
        ev.prevent_default();
        // The same decoding and rules as the server: most mistakes never leave the page.
        let checked = check::<ImportCluster>(form.request());
        gate.submit(form, std::future::ready(checked));
    };

    view! {
        <form class="panel form" on:submit=submit on:input=move |_| gate.reset() on:change=move |_| gate.reset() novalidate aria-describedby="import-intro">
            <p id="import-intro" class="muted">
                "hypd adopts an existing, ACTIVE EKS cluster: it grants its own IAM principal cluster-admin through an EKS access entry, finds the HyperPod cluster the EKS cluster orchestrates, and records it. Nothing else changes."
            </p>
            <FieldInput form record field=&NAME/>
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
                        <FieldInput form record field=&REGION options=Signal::stored(choices) empty="hypd's own region"/>
                        {problem.map(|p| view! { <p class="hint error">{p}</p> })}
                    }
                })}
            </Suspense>
            <details class="advanced">
                <summary>"Advanced"</summary>
                <FieldInput form record field=&HYPERPOD/>
            </details>
            <FormAlert form/>
            <GateActions gate run="Import cluster" running="Importing…" cancel="/clusters"/>
        </form>
    }
}
