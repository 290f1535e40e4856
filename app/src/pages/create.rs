//! The create-cluster form, built on `crate::form` like the import form: its inputs are
//! `CreateCluster`'s fields by path, checked in the browser by the request type's own
//! decoding and `validate()`; regions, zones and instance types (with their GPU and EFA
//! facts) come from the inspection commands, so only what the account offers is offered.

use leptos::either::EitherOf3;
use leptos::prelude::*;
use leptos_router::hooks::use_navigate;

use super::loading;
use crate::api::call::call;
use crate::api::clusters::CreateCluster;
use crate::api::inspect::{
    InstanceTypeInfo, ListAvailabilityZones, ListInstanceTypes, ListRegions,
};
use crate::api::values::{AzName, Region};
use crate::api::{ApiError, Command};
use crate::form::{
    CheckField, ChoiceField, FormAlert, FormState, Input, SelectField, TextField, check, request,
};
use crate::session::{ErrorPanel, IfRole, use_me};

const FIELDS: &[&str] = &[
    "name",
    "region",
    "availability_zone",
    "instance_type",
    "instance_count",
    "capacity",
    "capacity.type",
    "capacity.training_plan_arn",
    "efa_only",
    "deep_health_checks",
    "storage.s3_bucket",
    "network.vpc_cidr",
    "network.vpc_id",
    "kubernetes_version",
];

/// Fields behind the "Advanced network" disclosure: it opens when one of them is wrong.
const ADVANCED: &[&str] = &["network.vpc_cidr", "network.vpc_id", "kubernetes_version"];

const CAPACITY: &[(&str, &str, &str)] = &[
    (
        "on_demand",
        "On-demand",
        "Pay as you go, within the account's SageMaker quota for the type.",
    ),
    (
        "spot",
        "Spot",
        "Spare capacity at a discount; instances can be reclaimed.",
    ),
    (
        "training_plan",
        "Training plan",
        "Capacity reserved with a training plan; the plan fixes the zone.",
    ),
];

#[component]
pub fn CreateClusterPage() -> impl IntoView {
    let me = use_me();
    view! {
        <section class="page">
            <nav class="crumbs" aria-label="Breadcrumb">
                <a href="/clusters">"Clusters"</a>
                " / "
                <span aria-current="page">"Create"</span>
            </nav>
            <header class="page-head">
                <h1>"Create a cluster"</h1>
            </header>
            <Suspense fallback=loading>
                {move || Suspend::new(async move {
                    let who = match me {
                        Some(me) => me.await,
                        None => Err(crate::api::ApiError::internal("no session context")),
                    };
                    match who {
                        Ok(w) if w.role >= CreateCluster::SPEC.role => EitherOf3::A(view! { <CreateForm/> }),
                        Ok(w) => {
                            EitherOf3::B(view! {
                                <div class="panel narrow" data-error="forbidden">
                                    <p>
                                        {format!(
                                            "Creating a cluster needs the operator role; token {} has {}.",
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

/// The "Create cluster" button of the clusters page, for callers allowed to create.
#[component]
pub fn CreateButton() -> impl IntoView {
    view! {
        <IfRole role=CreateCluster::SPEC.role>
            <a class="button primary" href="/clusters/new">"Create cluster"</a>
        </IfRole>
    }
}

/// `p5.48xlarge` facts for a person: accelerators, their memory, EFA.
pub fn type_facts(t: &InstanceTypeInfo) -> String {
    let mut facts = Vec::new();
    if let Some(a) = &t.accelerator {
        let memory = a
            .memory_mib
            .map(|m| format!(" {} GiB", m.div_ceil(1024)))
            .unwrap_or_default();
        facts.push(format!(
            "{} × {} {}{memory}",
            a.count, a.manufacturer, a.name
        ));
    }
    facts.push(format!(
        "{} vCPU, {} GiB",
        t.vcpus,
        t.memory_mib.div_ceil(1024)
    ));
    facts.push(match (t.efa_supported, t.max_efa_interfaces) {
        (false, _) => "no EFA".to_owned(),
        (true, 1) => "1 EFA interface".to_owned(),
        (true, n) => format!("{n} EFA interfaces"),
    });
    if t.efa_only_allowed {
        facts.push("EFA-only capable".to_owned());
    }
    facts.join(" · ")
}

fn type_label(t: &InstanceTypeInfo) -> String {
    format!("{} — {}", t.hyperpod_instance_type, type_facts(t))
}

/// `CreateCluster`'s decoding and `validate()`, run in the browser before the request is
/// sent. With `--split` this is its own wasm chunk, fetched on the first submit: showing
/// and hydrating the form does not need it.
#[leptos::lazy]
fn check_create(input: serde_json::Value) -> Result<CreateCluster, ApiError> {
    check::<CreateCluster>(input)
}

#[component]
fn CreateForm() -> impl IntoView {
    let form = FormState::new(FIELDS);
    let name = RwSignal::new(String::new());
    let region = RwSignal::new(String::new());
    let zone = RwSignal::new(String::new());
    let instance_type = RwSignal::new(String::new());
    let count = RwSignal::new("1".to_owned());
    let capacity = RwSignal::new("on_demand".to_owned());
    let plan = RwSignal::new(String::new());
    let efa_only = RwSignal::new(false);
    let deep_checks = RwSignal::new(false);
    let bucket = RwSignal::new(String::new());
    let vpc_cidr = RwSignal::new(String::new());
    let vpc_id = RwSignal::new(String::new());
    let version = RwSignal::new(String::new());

    let regions = Resource::new(|| (), |_| call(&ListRegions { refresh: false }));
    // Zones follow the region, instance types the zone: only what is offered there.
    let zones = Resource::new(
        move || region.get(),
        |region| async move {
            call(&ListAvailabilityZones {
                region: Region::parse(&region).ok(),
                refresh: false,
            })
            .await
        },
    );
    let types = Resource::new(
        move || (region.get(), zone.get()),
        |(region, zone)| async move {
            call(&ListInstanceTypes {
                region: Region::parse(&region).ok(),
                availability_zone: AzName::parse(&zone).ok(),
                ..Default::default()
            })
            .await
        },
    );
    // The facts of the chosen type, kept beside the choice: they decide whether EFA-only
    // is offered at all.
    let offered = RwSignal::new(Vec::<InstanceTypeInfo>::new());
    let chosen = Memo::new(move |_| {
        instance_type.with(|t| {
            offered.with(|all| all.iter().find(|i| i.hyperpod_instance_type == *t).cloned())
        })
    });
    let efa_eligible = move || chosen.with(|c| c.as_ref().is_some_and(|t| t.efa_only_allowed));
    Effect::new(move || {
        if !efa_eligible() {
            efa_only.set(false);
        }
    });
    // Opened (never closed) when an error lands inside it, so the error is seen.
    let advanced = NodeRef::<leptos::html::Details>::new();
    Effect::new(move || {
        let invalid = form
            .errors
            .with(|e| e.iter().any(|e| ADVANCED.contains(&e.field.as_str())));
        if let (true, Some(details)) = (invalid, advanced.get()) {
            details.set_open(true);
        }
    });

    let navigate = use_navigate();
    let submit = move |ev: leptos::ev::SubmitEvent| {
        ev.prevent_default();
        form.clear();
        let mut inputs = vec![
            ("name", Input::Text(name.get_untracked())),
            ("region", Input::Text(region.get_untracked())),
            ("availability_zone", Input::Text(zone.get_untracked())),
            ("instance_type", Input::Text(instance_type.get_untracked())),
            ("instance_count", Input::Integer(count.get_untracked())),
            ("capacity.type", Input::Text(capacity.get_untracked())),
            ("efa_only", Input::Flag(efa_only.get_untracked())),
            (
                "deep_health_checks",
                Input::Flag(deep_checks.get_untracked()),
            ),
            ("storage.s3_bucket", Input::Text(bucket.get_untracked())),
            ("network.vpc_cidr", Input::Text(vpc_cidr.get_untracked())),
            ("network.vpc_id", Input::Text(vpc_id.get_untracked())),
            ("kubernetes_version", Input::Text(version.get_untracked())),
        ];
        if capacity.get_untracked() == "training_plan" {
            inputs.push((
                "capacity.training_plan_arn",
                Input::Text(plan.get_untracked()),
            ));
        }
        let input = request(&inputs);
        form.busy.set(true);
        let navigate = navigate.clone();
        leptos::task::spawn_local(async move {
            // The same decoding and rules as the server: most mistakes never leave the page.
            let outcome = match check_create(input).await {
                Ok(request) => call(&request).await,
                Err(e) => Err(e),
            };
            match outcome {
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
        <form class="panel form" on:submit=submit novalidate aria-describedby="create-intro">
            <p id="create-intro" class="muted">
                "hypd creates a VPC, IAM roles, the EKS control plane with its add-ons, the HyperPod cluster with automatic node recovery, and the shared bucket. It takes 15 to 30 minutes on AWS; the operation's page follows it live."
            </p>
            <TextField
                form
                name="name"
                label="Cluster name"
                value=name
                required=true
                placeholder="ml-cluster-1"
                hint="Used for the EKS and the HyperPod cluster: letters, digits and hyphens."
            />
            <Suspense fallback=loading>
                {move || Suspend::new(async move {
                    let (choices, problem) = match regions.await {
                        Ok(list) => (list.regions.into_iter().map(|r| (r.name.clone(), r.name)).collect(), None),
                        Err(e) => (Vec::new(), Some(format!("Regions could not be listed: {e}"))),
                    };
                    view! {
                        <SelectField form name="region" label="Region" value=region
                            options=Signal::stored(choices) empty="hypd's own region"
                            hint="Where every part of the cluster is created."/>
                        {problem.map(|p| view! { <p class="hint error">{p}</p> })}
                    }
                })}
            </Suspense>
            <Transition fallback=loading>
                {move || Suspend::new(async move {
                    let (choices, problem) = match zones.await {
                        Ok(list) => (
                            list.zones
                                .into_iter()
                                .map(|z| (z.name.clone(), format!("{} ({})", z.name, z.zone_id)))
                                .collect(),
                            None,
                        ),
                        Err(e) => (Vec::new(), Some(format!("Zones could not be listed: {e}"))),
                    };
                    view! {
                        <SelectField form name="availability_zone" label="Availability Zone" value=zone
                            options=Signal::stored(choices) empty="Choose a zone"
                            hint="Where the accelerated instances run; the zone id matches training plans across accounts."/>
                        {problem.map(|p| view! { <p class="hint error">{p}</p> })}
                    }
                })}
            </Transition>
            <Transition fallback=loading>
                {move || Suspend::new(async move {
                    let (list, problem) = match types.await {
                        Ok(list) => (list.instance_types, None),
                        Err(e) => (Vec::new(), Some(format!("Instance types could not be listed: {e}"))),
                    };
                    let choices = list
                        .iter()
                        .map(|t| (t.hyperpod_instance_type.clone(), type_label(t)))
                        .collect();
                    let empty = if list.is_empty() {
                        "No accelerated type is offered here"
                    } else {
                        "Choose an instance type"
                    };
                    offered.set(list);
                    view! {
                        <SelectField form name="instance_type" label="Instance type" value=instance_type
                            options=Signal::stored(choices) empty
                            hint="Accelerated types offered in the chosen zone, with their GPUs and EFA."/>
                        {problem.map(|p| view! { <p class="hint error">{p}</p> })}
                    }
                })}
            </Transition>
            <p class="type-facts muted" aria-live="polite">
                {move || chosen.get().map(|t| type_facts(&t))}
            </p>
            <TextField form name="instance_count" label="Instance count" value=count required=true numeric=true
                hint="Instances in the first instance group (at least 1)."/>
            <ChoiceField form name="capacity.type" label="Capacity" value=capacity options=CAPACITY/>
            <Show when=move || capacity.with(|c| c == "training_plan")>
                <TextField form name="capacity.training_plan_arn" label="Training plan ARN" value=plan required=true
                    placeholder="arn:aws:sagemaker:us-east-1:123456789012:training-plan/p5-week"/>
            </Show>
            {move || form.errors_for("capacity").first().map(|m| view! { <p class="hint error">{m.clone()}</p> })}
            <Show when=efa_eligible>
                <CheckField form name="efa_only" label="EFA-only network interfaces" checked=efa_only
                    hint="Every EFA card carries collective traffic; IP traffic uses the primary interface. Cannot change later."/>
            </Show>
            <CheckField form name="deep_health_checks" label="Deep health checks" checked=deep_checks
                hint="Stress and connectivity checks on every new instance before it joins (adds time to each launch)."/>
            <TextField form name="storage.s3_bucket" label="Shared bucket" value=bucket
                placeholder="hypd-<cluster>-<account>"
                hint="For data and checkpoints, mounted through Mountpoint for S3; created if missing."/>
            <details class="advanced" node_ref=advanced>
                <summary>"Advanced network"</summary>
                <TextField form name="network.vpc_cidr" label="VPC CIDR" value=vpc_cidr placeholder="10.1.0.0/16"
                    hint="A /16 that overlaps no VPC of the region; hypd chooses one when empty."/>
                <TextField form name="network.vpc_id" label="Existing VPC id" value=vpc_id placeholder="vpc-0123456789abcdef0"
                    hint="Instead of a new VPC: hypd adds its subnets to this one."/>
                <TextField form name="kubernetes_version" label="Kubernetes version" value=version placeholder="1.33"
                    hint="hypd's tested default when empty."/>
            </details>
            <FormAlert form/>
            <div class="actions">
                <button class="primary" type="submit" disabled=move || form.busy.get()>
                    {move || if form.busy.get() { "Creating…" } else { "Create cluster" }}
                </button>
                <a class="button" href="/clusters">"Cancel"</a>
            </div>
        </form>
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::inspect::{Accelerator, AcceleratorKind};

    #[test]
    fn instance_type_facts_read_well() {
        let t = InstanceTypeInfo {
            instance_type: "p5.48xlarge".into(),
            hyperpod_instance_type: "ml.p5.48xlarge".into(),
            vcpus: 192,
            memory_mib: 2_097_152,
            accelerator: Some(Accelerator {
                kind: AcceleratorKind::Gpu,
                manufacturer: "NVIDIA".into(),
                name: "H100".into(),
                count: 8,
                memory_mib: Some(81_920),
            }),
            efa_supported: true,
            max_efa_interfaces: 32,
            efa_only_allowed: true,
            network_performance: None,
            offered_in: vec![],
        };
        assert_eq!(
            type_facts(&t),
            "8 × NVIDIA H100 80 GiB · 192 vCPU, 2048 GiB · 32 EFA interfaces · EFA-only capable"
        );
    }
}
