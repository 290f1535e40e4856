//! The cluster page's Advanced features panel: each feature as `get_features` reads it
//! (state, version, what it depends on), a toggle for those `update_features` can
//! change, and the shared add-ons with the features that need them. The form remembers
//! only the toggles the user touched and sends only those, so a feature nobody touched
//! is never part of the request; the plan is shown before anything runs. Tiered
//! checkpointing's memory share and the groups autoscaling may scale are typed beside
//! their toggles and sent only with them.

use std::collections::BTreeMap;

use leptos::either::Either;
use leptos::prelude::*;

use super::gate::{Gate, flag, integer, text};
use super::loading;
use crate::api::ApiError;
use crate::api::call::call;
use crate::api::features::{
    ComponentState, Feature, FeatureState, Features, GetFeatures, MIN_TIERED_MEMORY_PERCENT,
    UpdateFeatures,
};
use crate::api::values::EksClusterName;
use crate::session::{ErrorPanel, IfRole};
use crate::time::short;

#[component]
pub fn FeaturesPanel(
    name: String,
    /// The cluster is active or imported: only then are there features to read.
    usable: Signal<bool>,
) -> impl IntoView {
    let name = StoredValue::new(name);
    let reads = RwSignal::new(0u32);
    // Asked from the browser once the page is up (an effect runs only there): the read
    // takes a dozen AWS and Kubernetes calls, which the page's first answer should not
    // wait for. Read 0 is the server's and the first hydration's: nothing asked yet.
    let features = Resource::new(
        move || reads.get(),
        move |n| async move {
            if n == 0 {
                return None;
            }
            let name =
                EksClusterName::parse(&name.get_value()).map_err(|m| ApiError::field("name", m));
            Some(match name {
                Ok(name) => call(&GetFeatures { name }).await,
                Err(e) => Err(e),
            })
        },
    );
    Effect::new(move || {
        if usable.get() && reads.get_untracked() == 0 {
            reads.set(1);
        }
    });
    // Made here, above the state it is drawn in, so what the user touched and the plan
    // they reviewed outlive a refresh.
    let touched = RwSignal::new(BTreeMap::<Feature, bool>::new());
    // Tiered checkpointing's share of memory, as typed (empty: left as it is).
    let percent = RwSignal::new(String::new());
    // The groups autoscaling may scale, as typed (empty: those it scales now, or on
    // first use every group it supports).
    let groups = RwSignal::new(String::new());
    let gate = Gate::default();
    let apply = move |()| {
        let touched = touched.get_untracked();
        let mut inputs = vec![text("name", name.get_value())];
        inputs.extend(touched.iter().map(|(f, on)| flag(f.as_str(), *on)));
        // Sent only with the feature they belong to, turned on.
        if touched.get(&Feature::TieredCheckpointing) == Some(&true) {
            inputs.push(integer("tiered_memory_percent", percent.get_untracked()));
        }
        if touched.get(&Feature::Autoscaling) == Some(&true) {
            let groups = groups.get_untracked();
            let named = groups.split([',', ' ']).filter(|g| !g.is_empty());
            inputs.extend(
                named
                    .enumerate()
                    .map(|(i, g)| text(format!("autoscaling_groups[{i}]"), g)),
            );
        }
        gate.start::<UpdateFeatures>(&inputs);
    };
    let refresh = Callback::new(move |()| {
        gate.reset();
        reads.update(|n| *n += 1);
    });
    let apply = Callback::new(apply);
    let shown = move || {
        Suspend::new(async move {
            match features.await {
                None => Either::Left(view! {
                    <p class="muted">"Read from AWS and Kubernetes once the cluster is active."</p>
                }),
                Some(Ok(f)) => Either::Right(Either::Left(view! {
                    <Shown f touched percent groups gate/>
                    <Actions touched gate apply refresh/>
                })),
                Some(Err(e)) => Either::Right(Either::Right(view! {
                    <ErrorPanel error=e/>
                    <Actions touched gate apply refresh/>
                })),
            }
        })
    };
    view! {
        <div class="panel features" aria-labelledby="features-title">
            <h2 id="features-title">"Advanced features"</h2>
            <Transition fallback=loading>{shown}</Transition>
        </div>
    }
    .into_any()
}

/// The plan or error of the last try, "Review changes" / "Apply" (for those who may
/// change features) and "Refresh". Drawn inside the loaded state, where the session's
/// role is known.
#[component]
fn Actions(
    touched: RwSignal<BTreeMap<Feature, bool>>,
    gate: Gate,
    apply: Callback<()>,
    refresh: Callback<()>,
) -> impl IntoView {
    let role = <UpdateFeatures as crate::api::Command>::SPEC.role;
    view! {
        {gate.view()}
        <div class="actions">
            <IfRole role>
                <button
                    type="button"
                    class="primary apply-features"
                    disabled=move || gate.busy() || touched.with(BTreeMap::is_empty)
                    on:click=move |_| apply.run(())
                >
                    {move || if gate.reviewing() { "Apply" } else { "Review changes" }}
                </button>
            </IfRole>
            <button type="button" class="refresh-features" on:click=move |_| refresh.run(())>
                "Refresh"
            </button>
        </div>
    }
}

#[component]
fn Shown(
    f: Features,
    touched: RwSignal<BTreeMap<Feature, bool>>,
    percent: RwSignal<String>,
    groups: RwSignal<String>,
    gate: Gate,
) -> impl IntoView {
    let rows = f
        .features
        .into_iter()
        .map(|s| view! { <FeatureRow s touched percent groups gate/> })
        .collect_view();
    let components = f
        .components
        .into_iter()
        .map(|c| view! { <ComponentRow c/> })
        .collect_view();
    view! {
        <p class="muted">{format!("As AWS and Kubernetes have them (read {}).", short(&f.fetched_at))}</p>
        <ul class="feature-list">{rows}</ul>
        <h3>"Shared add-ons"</h3>
        <div class="table-wrap">
            <table class="table components">
                <thead>
                    <tr><th>"Add-on"</th><th>"Status"</th><th>"Needed by"</th><th>"Removed"</th></tr>
                </thead>
                <tbody>{components}</tbody>
            </table>
        </div>
    }
}

#[component]
fn FeatureRow(
    s: FeatureState,
    touched: RwSignal<BTreeMap<Feature, bool>>,
    percent: RwSignal<String>,
    groups: RwSignal<String>,
    gate: Gate,
) -> impl IntoView {
    let feature = s.feature;
    let live = s.enabled;
    // What the toggle shows: the user's choice if they touched it, else what is there.
    let checked = move || touched.with(|t| t.get(&feature).copied().unwrap_or(live));
    let toggle = move |ev| {
        let on = event_target_checked(&ev);
        touched.update(|t| {
            // Back to what is there is no change: the feature leaves the request.
            if on == live {
                t.remove(&feature);
            } else {
                t.insert(feature, on);
            }
        });
        gate.reset();
    };
    let label = format!("Turn {} on", s.title);
    let state = if s.enabled { "on" } else { "off" };
    let status = match &s.version {
        Some(v) => format!("{} {v}", s.status),
        None => s.status.clone(),
    };
    let depends = (!s.depends_on.is_empty()).then(|| format!("Needs {}.", s.depends_on.join(", ")));
    let details = s
        .details
        .into_iter()
        .map(|d| view! { <li>{d}</li> })
        .collect_view();
    // A value typed for a feature that stays on (a new share of memory, other groups to
    // scale) is a change of it; cleared again, it is none.
    let typed_into = move |value: RwSignal<String>| {
        move |ev| {
            let typed = event_target_value(&ev);
            let changed = !typed.trim().is_empty();
            value.set(typed);
            touched.update(|t| {
                if changed {
                    t.insert(feature, true);
                } else if live {
                    t.remove(&feature);
                }
            });
            gate.reset();
        }
    };
    let memory = (feature == Feature::TieredCheckpointing).then(|| {
        view! {
            <label class="memory-share" class:hidden=move || !checked()>
                <span>"% of memory"</span>
                <input
                    type="number"
                    min=MIN_TIERED_MEMORY_PERCENT
                    max="100"
                    class="tiered-percent"
                    placeholder=if live { "as now" } else { "20" }
                    prop:value=move || percent.get()
                    on:input=typed_into(percent)
                />
            </label>
        }
    });
    // Which groups managed Karpenter may scale: when turning it on, or to change them.
    let scaled = (feature == Feature::Autoscaling).then(|| {
        view! {
            <label class="scaled-groups" class:hidden=move || !checked()>
                <span>"Instance groups"</span>
                <input
                    type="text"
                    class="autoscaling-groups"
                    placeholder=if live { "as now" } else { "all it can scale" }
                    prop:value=move || groups.get()
                    on:input=typed_into(groups)
                />
            </label>
        }
    });
    let control = view! {
        {memory}
        {scaled}
        <label class="toggle">
            <input type="checkbox" class="feature-toggle" aria-label=label prop:checked=checked on:change=toggle/>
            <span>{move || if checked() { "On" } else { "Off" }}</span>
        </label>
    };
    view! {
        <li class="feature" data-feature=feature.as_str() data-state=state>
            <div class="feature-head">
                <strong>{s.title}</strong>
                " "
                <span class=format!("badge feature-{state}")>{status}</span>
                {control}
            </div>
            <p class="muted">{s.purpose}</p>
            <p class="muted">{depends}</p>
            <ul class="feature-details">{details}</ul>
        </li>
    }
}

#[component]
fn ComponentRow(c: ComponentState) -> impl IntoView {
    let status = match &c.version {
        Some(v) => format!("{} {v}", c.status),
        None => c.status.clone(),
    };
    let needed_by = if c.needed_by.is_empty() {
        "—".to_owned()
    } else {
        c.needed_by
            .iter()
            .map(|f| f.title())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let removed = if c.with_cluster {
        "never (made with the cluster)"
    } else {
        "with the last feature that needs it"
    };
    let id = c.name.clone();
    view! {
        <tr data-component=id>
            <td><code>{c.name}</code></td>
            <td>{status}</td>
            <td>{needed_by}</td>
            <td>{removed}</td>
        </tr>
    }
}
