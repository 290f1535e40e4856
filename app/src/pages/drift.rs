//! The cluster page's Drift panel: `get_drift` on demand (it reads the whole cluster from
//! AWS and Kubernetes, so it is asked for, not loaded with the page), and "Reconcile",
//! which shows `reconcile_cluster`'s plan before it runs it.

use leptos::either::Either;
use leptos::prelude::*;

use super::gate::{Gate, text};
use super::loading;
use crate::api::call::call;
use crate::api::clusters::{DriftReport, DriftState, Drifted, GetDrift, ReconcileCluster};
use crate::api::values::EksClusterName;
use crate::api::{ApiError, Command};
use crate::session::{ErrorPanel, IfRole};
use crate::time::short;

#[component]
pub fn DriftPanel(name: String) -> impl IntoView {
    let name = StoredValue::new(name);
    let checks = RwSignal::new(0u32);
    let report = Resource::new(
        move || checks.get(),
        move |n| async move {
            if n == 0 {
                return None;
            }
            let name =
                EksClusterName::parse(&name.get_value()).map_err(|m| ApiError::field("name", m));
            Some(match name {
                Ok(name) => call(&GetDrift { name }).await,
                Err(e) => Err(e),
            })
        },
    );
    let shown = move || {
        Suspend::new(async move {
            match report.await {
                None => Either::Left(view! {
                    <p class="muted">"Compares what hypd made with what is there now (a few dozen read-only calls)."</p>
                }),
                Some(Ok(r)) => Either::Right(Either::Left(
                    view! { <Report report=r name=name.get_value()/> },
                )),
                Some(Err(e)) => Either::Right(Either::Right(view! { <ErrorPanel error=e/> })),
            }
        })
    };
    view! {
        <div class="panel drift" aria-labelledby="drift-title">
            <h2 id="drift-title">"Drift"</h2>
            <Transition fallback=loading>{shown}</Transition>
            <div class="actions">
                <button type="button" class="check-drift" on:click=move |_| checks.update(|n| *n += 1)>
                    "Check for drift"
                </button>
            </div>
        </div>
    }
    .into_any()
}

#[component]
fn Report(report: DriftReport, name: String) -> impl IntoView {
    if report.drifted.is_empty() {
        return Either::Left(view! {
            <p class="drift-none">{format!("Nothing drifted (checked {}).", short(&report.checked_at))}</p>
        });
    }
    let count = report.drifted.len();
    let rows = report
        .drifted
        .into_iter()
        .map(|d| view! { <Row d/> })
        .collect_view();
    Either::Right(view! {
        <p>{format!(
            "{} from what hypd made (checked {}).",
            if count == 1 { "1 object differs".to_owned() } else { format!("{count} objects differ") },
            short(&report.checked_at),
        )}</p>
        <ul class="drift-list">{rows}</ul>
        <IfRole role=ReconcileCluster::SPEC.role>
            <Reconcile name=name.clone()/>
        </IfRole>
    })
}

#[component]
fn Row(d: Drifted) -> impl IntoView {
    let state = match d.state {
        DriftState::Missing => "missing",
        DriftState::Differs => "differs",
        DriftState::Unexpected => "unexpected",
    };
    let fields = d
        .fields
        .into_iter()
        .map(|f| {
            let show = |v: Option<serde_json::Value>| v.map_or_else(|| "—".to_owned(), |v| v.to_string());
            view! {
                <li><code>{f.field}</code>": expected "{show(f.expected)}", is "{show(f.actual)}</li>
            }
        })
        .collect_view();
    let by =
        (!d.changed_by.is_empty()).then(|| format!(" (changed by {})", d.changed_by.join(", ")));
    let kind = d.kind.clone();
    view! {
        <li data-kind=kind data-state=state>
            <span class=format!("badge drift-{state}")>{state}</span>
            " "
            <code>{d.kind}</code>
            " "
            {d.namespace.map(|ns| format!("{ns}/"))}
            {d.name}
            {by}
            <ul class="drift-fields">{fields}</ul>
        </li>
    }
}

/// Reconcile in two steps: the plan (what putting it back changes), then the run.
#[component]
fn Reconcile(name: String) -> impl IntoView {
    let gate = Gate::default();
    let name = StoredValue::new([text("name", name)]);
    let send = move |_| gate.start::<ReconcileCluster>(&name.get_value());
    view! {
        {gate.view()}
        <button type="button" class="primary reconcile" disabled=move || gate.busy() on:click=send>
            {move || if gate.reviewing() { "Run reconcile" } else { "Reconcile" }}
        </button>
    }
    .into_any()
}
