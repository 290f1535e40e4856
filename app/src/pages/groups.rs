//! The cluster page's instance-group actions: scale a group, delete one, add one. Each
//! is two clicks: the first asks the server for the plan (a dry run, or for a deletion
//! the plan that comes with its confirmation) and shows it, the second runs exactly that
//! request and opens its operation. Requests are decoded by the commands' own types, so
//! a bad value gets the same field error the server would give.

use leptos::prelude::*;

use super::gate::{Gate, flag, integer, text};
use crate::api::instance_groups::{AddInstanceGroup, DeleteInstanceGroup, UpdateInstanceGroup};

/// Scale or delete group `group` of cluster `cluster` (now at `count` instances).
#[component]
pub fn GroupActions(cluster: String, group: String, count: u32) -> impl IntoView {
    let scale = Gate::default();
    let delete = Gate::default();
    let wanted = RwSignal::new(count.to_string());
    let named = StoredValue::new([text("name", cluster), text("group", group.clone())]);
    let scale_it = move |_| {
        let mut inputs = named.get_value().to_vec();
        inputs.push(integer("instance_count", wanted.get_untracked()));
        scale.start::<UpdateInstanceGroup>(&inputs);
    };
    let delete_it = move |_| delete.start::<DeleteInstanceGroup>(&named.get_value());
    view! {
        <div class="group-actions" data-group=group.clone()>
            <label class="scale">
                <span class="visually-hidden">{format!("Instances in {group}")}</span>
                <input
                    type="number"
                    min="0"
                    class="group-count"
                    prop:value=move || wanted.get()
                    on:input=move |ev| {
                        wanted.set(event_target_value(&ev));
                        scale.reset();
                    }
                />
            </label>
            <button
                type="button"
                class="scale-group"
                disabled=move || scale.busy()
                on:click=scale_it
            >
                {move || if scale.reviewing() { "Apply" } else { "Scale" }}
            </button>
            <button
                type="button"
                class="danger delete-group"
                disabled=move || delete.busy()
                on:click=delete_it
            >
                {move || if delete.reviewing() { "Delete group" } else { "Delete" }}
            </button>
            {move || delete.reviewing().then(|| view! {
                <button type="button" class="keep-group" on:click=move |_| delete.reset()>"Keep it"</button>
            })}
            {scale.view()}
            {delete.view()}
        </div>
    }
    .into_any()
}

/// What the add form holds. Made by the page, above the live state it is shown in: the
/// live state is drawn again whenever AWS is asked again (an operation moved, the live
/// channel reconnected), and what the user typed and the plan they reviewed must outlive
/// that.
#[derive(Clone, Copy)]
pub struct AddGroupForm {
    gate: Gate,
    name: RwSignal<String>,
    instance_type: RwSignal<String>,
    count: RwSignal<String>,
    capacity: RwSignal<String>,
    training_plan: RwSignal<String>,
    zone: RwSignal<String>,
    deep_health_checks: RwSignal<bool>,
}

impl Default for AddGroupForm {
    /// Inside the page's component (it takes the router's navigation from there).
    fn default() -> Self {
        AddGroupForm {
            gate: Gate::default(),
            name: RwSignal::new(String::new()),
            instance_type: RwSignal::new("ml.g5.8xlarge".to_owned()),
            count: RwSignal::new("1".to_owned()),
            capacity: RwSignal::new("on_demand".to_owned()),
            training_plan: RwSignal::new(String::new()),
            zone: RwSignal::new(String::new()),
            deep_health_checks: RwSignal::new(false),
        }
    }
}

/// Adds a group to cluster `cluster`: the decisions a group is made of, the plan, then
/// the operation.
#[component]
pub fn AddGroup(cluster: String, form: AddGroupForm) -> impl IntoView {
    let AddGroupForm {
        gate,
        name,
        instance_type,
        count,
        capacity,
        training_plan,
        zone,
        deep_health_checks,
    } = form;
    let cluster = StoredValue::new(cluster);
    let inputs = move || {
        let capacity = capacity.get_untracked();
        let mut inputs = vec![
            text("name", cluster.get_value()),
            text("group.name", name.get_untracked()),
            text("group.instance_type", instance_type.get_untracked()),
            integer("group.instance_count", count.get_untracked()),
            flag(
                "group.deep_health_checks",
                deep_health_checks.get_untracked(),
            ),
            // Empty: the cluster's zone.
            text("group.availability_zone", zone.get_untracked()),
        ];
        if capacity == "training_plan" {
            inputs.push(text(
                "group.capacity.training_plan_arn",
                training_plan.get_untracked(),
            ));
        }
        inputs.push(text("group.capacity.type", capacity));
        inputs
    };
    let submit = move |ev: leptos::ev::SubmitEvent| {
        ev.prevent_default();
        gate.start::<AddInstanceGroup>(&inputs());
    };
    view! {
        <form class="add-group" aria-label="Add an instance group" on:submit=submit>
            <h3>"Add an instance group"</h3>
            <div class="add-group-fields">
                <label>"Name" <input id="add-group-name" required prop:value=move || name.get() on:input=gate.edit(name)/></label>
                <label>"Instance type" <input id="add-group-type" required prop:value=move || instance_type.get() on:input=gate.edit(instance_type)/></label>
                <label>"Instances" <input id="add-group-count" type="number" min="0" prop:value=move || count.get() on:input=gate.edit(count)/></label>
                <label>"Capacity"
                    <select id="add-group-capacity" on:change=gate.edit(capacity) prop:value=move || capacity.get()>
                        <option value="on_demand">"On-demand"</option>
                        <option value="spot">"Spot"</option>
                        <option value="training_plan">"Training plan"</option>
                    </select>
                </label>
                {move || (capacity.get() == "training_plan").then(|| view! {
                    <label>"Training plan ARN" <input id="add-group-plan" prop:value=move || training_plan.get() on:input=gate.edit(training_plan)/></label>
                })}
                <label>"Zone" <input id="add-group-zone" placeholder="the cluster's" prop:value=move || zone.get() on:input=gate.edit(zone)/></label>
                <label class="check">
                    <input
                        id="add-group-dhc"
                        type="checkbox"
                        prop:checked=move || deep_health_checks.get()
                        on:change=move |ev| {
                            deep_health_checks.set(event_target_checked(&ev));
                            gate.reset();
                        }
                    />
                    "Deep health checks"
                </label>
            </div>
            {gate.view()}
            <button type="submit" class="primary" disabled=move || gate.busy()>
                {move || if gate.reviewing() { "Add group" } else { "Review plan" }}
            </button>
        </form>
    }
    .into_any()
}
