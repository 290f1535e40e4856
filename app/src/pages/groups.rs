//! The cluster page's instance-group actions: scale a group, delete one, add one. Each
//! is two clicks: the first asks the server for the plan (a dry run, or for a deletion
//! the plan that comes with its confirmation) and shows it, the second runs exactly that
//! request and opens its operation. Requests are decoded by the commands' own types, so
//! a bad value gets the same field error the server would give.

use leptos::prelude::*;
use leptos_router::hooks::use_navigate;
use serde_json::json;

use super::PlanView;
use crate::api::call::call;
use crate::api::decode;
use crate::api::instance_groups::{AddInstanceGroup, DeleteInstanceGroup, UpdateInstanceGroup};
use crate::api::operations::OperationRef;
use crate::api::plan::{Gated, Plan};
use crate::api::values::Confirmation;
use crate::api::{ApiError, Command};
use crate::session::ErrorPanel;

/// Where a two-step action stands (the node actions take it too).
#[derive(Clone, Copy)]
pub(super) struct Step {
    pub(super) plan: RwSignal<Option<Plan>>,
    confirmation: RwSignal<Option<Confirmation>>,
    error: RwSignal<Option<ApiError>>,
    pub(super) busy: RwSignal<bool>,
    /// Opens a page (an operation's, once one started).
    open: Callback<String>,
}

impl Step {
    /// Inside a component: it takes the router's navigation from there.
    pub(super) fn new() -> Self {
        let navigate = use_navigate();
        Step {
            plan: RwSignal::new(None),
            confirmation: RwSignal::new(None),
            error: RwSignal::new(None),
            busy: RwSignal::new(false),
            open: Callback::new(move |path: String| navigate(&path, Default::default())),
        }
    }

    /// Back to the first step (the request changed, or the user kept things as they are).
    pub(super) fn reset(self) {
        self.plan.set(None);
        self.confirmation.set(None);
    }

    pub(super) fn reviewed(self) -> bool {
        self.plan.with_untracked(Option::is_some)
    }

    /// Sends `input` (the command's JSON, without `dry_run` and `confirmation`): a dry run
    /// on the first step, the run itself on the second, with the confirmation the first
    /// answer gave for a destructive command. A run opens its operation.
    pub(super) fn send<C: Command<Output = Gated<OperationRef>>>(
        self,
        mut input: serde_json::Value,
    ) {
        // Which requests ask for a confirmation is the command's to say (turning a
        // feature on does not; turning one off does).
        let confirmed = decode::<C>(input.clone()).is_ok_and(|r| r.needs_confirmation());
        if self.reviewed() {
            if let Some(c) = self.confirmation.get_untracked() {
                input["confirmation"] = json!(c);
            }
        } else if !confirmed {
            input["dry_run"] = json!(true);
        }
        self.busy.set(true);
        self.error.set(None);
        leptos::task::spawn_local(async move {
            let answer = match decode::<C>(input) {
                Ok(request) => call(&request).await,
                Err(e) => Err(e),
            };
            self.busy.set(false);
            match answer {
                Ok(Gated::Done(op)) => self.open.run(format!("/operations/{}", op.operation_id)),
                Ok(Gated::DryRun(d)) => self.plan.set(Some(d.plan)),
                Ok(Gated::ConfirmationRequired(c)) => {
                    self.confirmation.set(Some(c.confirmation));
                    self.plan.set(Some(c.plan));
                }
                Err(e) => self.error.set(Some(e)),
            }
        });
    }

    pub(super) fn view(self) -> impl IntoView {
        view! {
            {move || self.plan.get().map(|plan| view! { <PlanView plan/> })}
            {move || self.error.get().map(|error| view! { <ErrorPanel error/> })}
        }
    }
}

/// Scale or delete group `group` of cluster `cluster` (now at `count` instances).
#[component]
pub fn GroupActions(cluster: String, group: String, count: u32) -> impl IntoView {
    let scale = Step::new();
    let delete = Step::new();
    let wanted = RwSignal::new(count.to_string());
    let request = StoredValue::new(json!({ "name": cluster, "group": group.clone() }));
    let scaled = move || {
        let mut input = request.get_value();
        // A count that is not a number is sent as typed: the request type names the rule.
        input["instance_count"] = wanted
            .get_untracked()
            .trim()
            .parse::<u64>()
            .map_or_else(|_| json!(wanted.get_untracked()), |n| json!(n));
        input
    };
    let scale_it = move |_| scale.send::<UpdateInstanceGroup>(scaled());
    let delete_it = move |_| delete.send::<DeleteInstanceGroup>(request.get_value());
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
                disabled=move || scale.busy.get()
                on:click=scale_it
            >
                {move || if scale.plan.with(Option::is_some) { "Apply" } else { "Scale" }}
            </button>
            <button
                type="button"
                class="danger delete-group"
                disabled=move || delete.busy.get()
                on:click=delete_it
            >
                {move || if delete.plan.with(Option::is_some) { "Delete group" } else { "Delete" }}
            </button>
            {move || delete.plan.with(Option::is_some).then(|| view! {
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
    step: Step,
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
            step: Step::new(),
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
        step,
        name,
        instance_type,
        count,
        capacity,
        training_plan,
        zone,
        deep_health_checks,
    } = form;
    let cluster = StoredValue::new(cluster);
    let input = move || {
        let count = count.get_untracked();
        let mut capacity = json!({ "type": capacity.get_untracked() });
        if capacity["type"] == "training_plan" {
            capacity["training_plan_arn"] = json!(training_plan.get_untracked().trim());
        }
        let mut input = json!({
            "name": cluster.get_value(),
            "group": {
                "name": name.get_untracked().trim(),
                "instance_type": instance_type.get_untracked().trim(),
                "instance_count": count.trim().parse::<u64>().map_or_else(|_| json!(count), |n| json!(n)),
                "capacity": capacity,
                "deep_health_checks": deep_health_checks.get_untracked(),
            },
        });
        let zone = zone.get_untracked();
        if !zone.trim().is_empty() {
            input["group"]["availability_zone"] = json!(zone.trim());
        }
        input
    };
    // Any edit goes back to the plan: what runs is what was reviewed.
    let edited = move |signal: RwSignal<String>| {
        move |ev| {
            signal.set(event_target_value(&ev));
            step.reset();
        }
    };
    let submit = move |ev: leptos::ev::SubmitEvent| {
        ev.prevent_default();
        step.send::<AddInstanceGroup>(input());
    };
    view! {
        <form class="add-group" aria-label="Add an instance group" on:submit=submit>
            <h3>"Add an instance group"</h3>
            <div class="add-group-fields">
                <label>"Name" <input id="add-group-name" required prop:value=move || name.get() on:input=edited(name)/></label>
                <label>"Instance type" <input id="add-group-type" required prop:value=move || instance_type.get() on:input=edited(instance_type)/></label>
                <label>"Instances" <input id="add-group-count" type="number" min="0" prop:value=move || count.get() on:input=edited(count)/></label>
                <label>"Capacity"
                    <select id="add-group-capacity" on:change=edited(capacity) prop:value=move || capacity.get()>
                        <option value="on_demand">"On-demand"</option>
                        <option value="spot">"Spot"</option>
                        <option value="training_plan">"Training plan"</option>
                    </select>
                </label>
                {move || (capacity.get() == "training_plan").then(|| view! {
                    <label>"Training plan ARN" <input id="add-group-plan" prop:value=move || training_plan.get() on:input=edited(training_plan)/></label>
                })}
                <label>"Zone" <input id="add-group-zone" placeholder="the cluster's" prop:value=move || zone.get() on:input=edited(zone)/></label>
                <label class="check">
                    <input
                        id="add-group-dhc"
                        type="checkbox"
                        prop:checked=move || deep_health_checks.get()
                        on:change=move |ev| {
                            deep_health_checks.set(event_target_checked(&ev));
                            step.reset();
                        }
                    />
                    "Deep health checks"
                </label>
            </div>
            {step.view()}
            <button type="submit" class="primary" disabled=move || step.busy.get()>
                {move || if step.plan.with(Option::is_some) { "Add group" } else { "Review plan" }}
            </button>
        </form>
    }
    .into_any()
}
