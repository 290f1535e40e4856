//! The create-cluster form: `CreateCluster`'s fields declared once on `crate::form`, its
//! instance groups a list of them (`instance_groups[1].name`), in the page shell gated on
//! the command's own role. The checks are the request type's own decoding and
//! `validate()`, in a chunk fetched on the first submit; regions, zones and instance
//! types (with their GPU and EFA facts) come from the inspection commands, so only what
//! the account offers is offered.

use leptos::either::Either;
use leptos::prelude::*;

use super::gate::{Gate, GateActions};
use super::{CommandLink, CommandPage, loading};
use crate::api::call::call;
use crate::api::clusters::CreateCluster;
use crate::api::inspect::{
    Capacity, InstanceTypeInfo, InstanceTypeList, ListAvailabilityZones, ListCapacity,
    ListInstanceTypes, ListRegions,
};
use crate::api::values::{AzName, Region};
use crate::api::{ApiError, Command};
use crate::form::{
    Choice, Field, FieldInput, FormAlert, FormState, List, ListErrors, Record, check,
};

const NAME: Field = Field::text("name", "Cluster name")
    .required()
    .placeholder("ml-cluster-1")
    .hint("Used for the EKS and the HyperPod cluster: letters, digits and hyphens.");
const REGION: Field =
    Field::select("region", "Region").hint("Where every part of the cluster is created.");
const ZONE: Field = Field::select("availability_zone", "Availability Zone").hint(
    "Where the accelerated instances run; the zone id matches training plans across accounts.",
);
const BUCKET: Field = Field::text("storage.s3_bucket", "Shared bucket")
    .placeholder("hypd-<cluster>-<account>")
    .hint("For data and checkpoints, mounted through Mountpoint for S3; created if missing.");
const VPC_CIDR: Field = Field::text("network.vpc_cidr", "VPC CIDR")
    .placeholder("10.1.0.0/16")
    .hint("A /16 that overlaps no VPC of the region; hypd chooses one when empty.");
const VPC_ID: Field = Field::text("network.vpc_id", "Existing VPC id")
    .placeholder("vpc-0123456789abcdef0")
    .hint("Instead of a new VPC: hypd adds its subnets to this one.");
const VERSION: Field = Field::text("kubernetes_version", "Kubernetes version")
    .placeholder("1.33")
    .hint("hypd's tested default when empty.");
const FIELDS: &[Field] = &[NAME, REGION, ZONE, BUCKET, VPC_CIDR, VPC_ID, VERSION];
/// Fields behind the "Advanced network" disclosure: it opens when one of them is wrong.
const ADVANCED: &[Field] = &[VPC_CIDR, VPC_ID, VERSION];

const CAPACITY_CHOICES: &[Choice] = &[
    Choice {
        value: "on_demand",
        label: "On-demand",
        hint: "Pay as you go, within the account's SageMaker quota for the type.",
    },
    Choice {
        value: "spot",
        label: "Spot",
        hint: "Spare capacity at a discount; instances can be reclaimed.",
    },
    Choice {
        value: "training_plan",
        label: "Training plan",
        hint: "Capacity reserved with a training plan; the plan fixes the zone.",
    },
];

/// The fields of one instance group, paths relative to `instance_groups[i]`.
const GROUP_NAME: Field = Field::text("name", "Group name")
    .required()
    .default("accelerated-1")
    .hint("Unique in the cluster: letters, digits and hyphens.");
const INSTANCE_TYPE: Field = Field::select("instance_type", "Instance type")
    .hint("Accelerated types offered in the chosen zone, with their GPUs and EFA.");
const COUNT: Field = Field::integer("instance_count", "Instance count")
    .required()
    .default("1")
    .hint("The cluster needs at least 1 instance in one of its groups.");
const CAPACITY: Field =
    Field::choice("capacity.type", "Capacity", CAPACITY_CHOICES).default("on_demand");
const PLAN: Field = Field::text("capacity.training_plan_arn", "Training plan ARN")
    .required()
    .placeholder("arn:aws:sagemaker:us-east-1:123456789012:training-plan/p5-week")
    .when("capacity.type", "training_plan");
const EFA_ONLY: Field = Field::flag("efa_only", "EFA-only network interfaces").hint(
    "Every EFA card carries collective traffic; IP traffic uses the primary interface. Cannot change later.",
);
const DEEP_CHECKS: Field = Field::flag("deep_health_checks", "Deep health checks").hint(
    "Stress and connectivity checks on every new instance before it joins (adds time to each launch).",
);
const VOLUME: Field = Field::integer("volume_size_gb", "Volume size (GB)")
    .required()
    .default("500")
    .hint("The EBS volume each instance gets at /opt/sagemaker.");
const GROUP: &[Field] = &[
    GROUP_NAME,
    INSTANCE_TYPE,
    COUNT,
    CAPACITY,
    PLAN,
    EFA_ONLY,
    DEEP_CHECKS,
    VOLUME,
];

#[component]
pub fn CreateClusterPage() -> impl IntoView {
    view! {
        <CommandPage
            spec=CreateCluster::SPEC
            parent=("/clusters", "Clusters")
            crumb="Create"
            title="Create a cluster"
        >
            <CreateForm/>
        </CommandPage>
    }
}

/// The "Create cluster" button of the clusters page, for callers allowed to create.
#[component]
pub fn CreateButton() -> impl IntoView {
    view! { <CommandLink spec=CreateCluster::SPEC href="/clusters/new" label="Create cluster"/> }
}

/// The first `accelerated-<n>` no other group has.
fn next_group_name(taken: &[String]) -> String {
    (1..)
        .map(|n| format!("accelerated-{n}"))
        .find(|name| !taken.contains(name))
        .unwrap_or_default()
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

type Types = Resource<Result<InstanceTypeList, ApiError>>;

#[component]
fn CreateForm() -> impl IntoView {
    let (form, top) = FormState::declared(FIELDS);
    let groups = List::new(form, "instance_groups", GROUP);
    let region = top.value(REGION.path);
    let zone = top.value(ZONE.path);

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
    let types: Types = Resource::new(
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
    // The facts of the offered types, kept beside the choices: they decide whether
    // EFA-only is offered at all.
    let offered = RwSignal::new(Vec::<InstanceTypeInfo>::new());
    // Opened (never closed) when an error lands inside it, so the error is seen.
    let advanced = NodeRef::<leptos::html::Details>::new();
    Effect::new(move || {
        let invalid = form
            .errors
            .with(|e| e.iter().any(|e| ADVANCED.iter().any(|f| f.path == e.field)));
        if let (true, Some(details)) = (invalid, advanced.get()) {
            details.set_open(true);
        }
    });
    let add_group = move |_| {
        let taken = groups.values_of(GROUP_NAME.path);
        let added = groups.add();
        added.value(GROUP_NAME.path).set(next_group_name(&taken));
    };

    let gate = Gate::default();
    let submit = move |ev: leptos::ev::SubmitEvent| {
        ev.prevent_default();
        // The same decoding and rules as the server: most mistakes never leave the page.
        gate.submit(form, check_create(form.request()));
    };

    view! {
        <form class="panel form" on:submit=submit on:input=move |_| gate.reset() on:change=move |_| gate.reset() novalidate aria-describedby="create-intro">
            <p id="create-intro" class="muted">
                "hypd creates a VPC, IAM roles, the EKS control plane with its add-ons, the HyperPod cluster with automatic node recovery, and the shared bucket. It takes 15 to 30 minutes on AWS; the operation's page follows it live."
            </p>
            <FieldInput form record=top field=&NAME/>
            <Suspense fallback=loading>
                {move || Suspend::new(async move {
                    let (choices, problem) = match regions.await {
                        Ok(list) => (list.regions.into_iter().map(|r| (r.name.clone(), r.name)).collect(), None),
                        Err(e) => (Vec::new(), Some(format!("Regions could not be listed: {e}"))),
                    };
                    view! {
                        <FieldInput form record=top field=&REGION options=Signal::stored(choices) empty="hypd's own region"/>
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
                        <FieldInput form record=top field=&ZONE options=Signal::stored(choices) empty="Choose a zone"/>
                        {problem.map(|p| view! { <p class="hint error">{p}</p> })}
                    }
                })}
            </Transition>
            <section class="groups" aria-labelledby="groups-title">
                <h2 id="groups-title">"Instance groups"</h2>
                <p class="hint">"Each group has its own instance type, count and capacity (for example an on-demand group beside a spot one). Type, capacity and EFA-only cannot change for a group's life."</p>
                <ListErrors form list=groups/>
                <CapacityPanel region/>
                <For
                    each=move || groups.items()
                    key=|(key, _)| *key
                    children=move |(key, record)| view! { <GroupFields form groups key record types offered/> }
                />
                <div class="actions">
                    <button type="button" class="add-group" on:click=add_group>"Add another group"</button>
                </div>
            </section>
            <FieldInput form record=top field=&BUCKET/>
            <details class="advanced" node_ref=advanced>
                <summary>"Advanced network"</summary>
                <FieldInput form record=top field=&VPC_CIDR/>
                <FieldInput form record=top field=&VPC_ID/>
                <FieldInput form record=top field=&VERSION/>
            </details>
            <FormAlert form/>
            <GateActions gate run="Create cluster" running="Creating…" cancel="/clusters"/>
        </form>
    }
}

/// The account's HyperPod quotas (with what its clusters use) and training plans in the
/// region, read on demand: what counts and plans the groups can ask for.
#[component]
fn CapacityPanel(region: RwSignal<String>) -> impl IntoView {
    let found = RwSignal::new(None::<Result<Capacity, ApiError>>);
    let show = move |_| {
        leptos::task::spawn_local(async move {
            let asked = ListCapacity {
                region: Region::parse(&region.get_untracked()).ok(),
                ..Default::default()
            };
            found.set(Some(call(&asked).await));
        });
    };
    view! {
        <div class="capacity">
            <button type="button" class="show-capacity" on:click=show>"Show quotas and training plans"</button>
            {move || found.get().map(|answer| match answer {
                Err(e) => Either::Left(view! { <p class="hint error">{format!("Capacity could not be read: {e}")}</p> }),
                Ok(c) => Either::Right(view! {
                    <table class="table capacity-quotas">
                        <caption>{format!("HyperPod quotas in {}", c.region)}</caption>
                        <thead><tr><th scope="col">"Type"</th><th scope="col">"Quota"</th><th scope="col">"In use"</th><th scope="col">"Free"</th></tr></thead>
                        <tbody>
                            {c.quotas.into_iter().map(|q| view! {
                                <tr data-type=q.instance_type.clone()>
                                    <th scope="row" class="mono">{q.instance_type.clone()}</th>
                                    <td class="num">{q.quota}</td>
                                    <td class="num">{q.in_use}</td>
                                    <td class="num free">{q.free}</td>
                                </tr>
                            }).collect_view()}
                        </tbody>
                    </table>
                    <ul class="training-plans">
                        {c.training_plans.into_iter().map(|p| {
                            let reserved = p.reserved.iter()
                                .map(|r| format!("{} × {} in {}", r.instances, r.instance_type.as_deref().unwrap_or("?"), r.availability_zone.as_deref().unwrap_or("?")))
                                .collect::<Vec<_>>()
                                .join(", ");
                            view! {
                                <li data-plan=p.name.clone()>
                                    <span class="mono">{p.name.clone()}</span>
                                    {format!(" ({}): {reserved}, {} available", p.status, p.available_instances)}
                                </li>
                            }
                        }).collect_view()}
                    </ul>
                }),
            })}
        </div>
    }
}

/// One instance group's inputs, with the chosen type's facts; EFA-only is offered only
/// where that type allows it.
#[component]
fn GroupFields(
    form: FormState,
    groups: List,
    key: u64,
    record: Record,
    types: Types,
    offered: RwSignal<Vec<InstanceTypeInfo>>,
) -> impl IntoView {
    let number = move || groups.index_of(key) + 1;
    let instance_type = record.value(INSTANCE_TYPE.path);
    let chosen = Memo::new(move |_| {
        instance_type.with(|t| {
            offered.with(|all| all.iter().find(|i| i.hyperpod_instance_type == *t).cloned())
        })
    });
    let efa_eligible = move || chosen.with(|c| c.as_ref().is_some_and(|t| t.efa_only_allowed));
    let efa_only = record.value(EFA_ONLY.path);
    Effect::new(move || {
        if !efa_eligible() {
            efa_only.set("false".to_owned());
        }
    });
    view! {
        <fieldset class="group" data-group=move || groups.index_of(key)>
            <legend>{move || format!("Instance group {}", number())}</legend>
            <Show when=move || { groups.len() > 1 }>
                <button
                    type="button"
                    class="remove-group"
                    aria-label=move || format!("Remove instance group {}", number())
                    on:click=move |_| groups.remove(key)
                >
                    "Remove"
                </button>
            </Show>
            <FieldInput form record field=&GROUP_NAME/>
            <Transition fallback=loading>
                {move || Suspend::new(async move {
                    let listed = types
                        .await
                        .and_then(|l| l.instance_types.into_items().map_err(ApiError::internal));
                    let (facts, problem) = match listed {
                        Ok(facts) => (facts, None),
                        Err(e) => (Vec::new(), Some(format!("Instance types could not be listed: {e}"))),
                    };
                    let choices = facts
                        .iter()
                        .map(|t| (t.hyperpod_instance_type.clone(), type_label(t)))
                        .collect();
                    let empty = if facts.is_empty() {
                        "No accelerated type is offered here"
                    } else {
                        "Choose an instance type"
                    };
                    offered.set(facts);
                    view! {
                        <FieldInput form record field=&INSTANCE_TYPE options=Signal::stored(choices) empty/>
                        {problem.map(|p| view! { <p class="hint error">{p}</p> })}
                    }
                })}
            </Transition>
            <p class="type-facts muted" aria-live="polite">
                {move || chosen.get().map(|t| type_facts(&t))}
            </p>
            <FieldInput form record field=&COUNT/>
            <FieldInput form record field=&CAPACITY/>
            <FieldInput form record field=&PLAN/>
            <Show when=efa_eligible>
                <FieldInput form record field=&EFA_ONLY/>
            </Show>
            <FieldInput form record field=&DEEP_CHECKS/>
            <FieldInput form record field=&VOLUME/>
        </fieldset>
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::inspect::{Accelerator, AcceleratorKind};

    #[test]
    fn new_groups_get_a_name_not_taken() {
        assert_eq!(next_group_name(&[]), "accelerated-1");
        let taken = ["accelerated-1".to_owned(), "accelerated-3".to_owned()];
        assert_eq!(next_group_name(&taken), "accelerated-2");
    }

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
