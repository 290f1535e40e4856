//! Model endpoints in the console: the Endpoints page (every cluster's, each linking to
//! its cluster's tab) and the cluster page's Inference tab: the cluster's endpoints
//! (phase, replicas ready of asked, address, cold start), one endpoint's pods, the form
//! that deploys a model server or an inference operator's endpoint, the forms that
//! scale or delete one and bind or release a pool's workers (plan, then run, as every
//! change), and a test panel that sends a chat completion through `invoke_endpoint`. Every request is
//! the command's own type, so a bad serve command is refused here with the server's
//! words.

use leptos::either::Either;
use leptos::prelude::*;

use super::gate::{Gate, flag, integer, number, text};
use super::{StateBadge, Table, loading};
use crate::api::ApiError;
use crate::api::call::call;
use crate::api::command::Role;
use crate::api::inference::{
    AssignPoolWorkers, ChatMessage, ChatRole, DeleteEndpoint, DeployInferenceEndpoint,
    DeployModelServer, Endpoint, EndpointList, GetEndpoint, InvokeEndpoint, ListEndpoints,
    ReleasePoolWorkers, ScaleEndpoint,
};
use crate::api::jumpstart::{DeployJumpstartModel, ListJumpstartModels};
use crate::api::values::{ClusterName, EndpointName, ServedName};
use crate::session::{ErrorPanel, IfRole};

#[component]
pub fn InferencePanel(
    name: String,
    /// The cluster is active or imported: only then is there a cluster to read.
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
            Some(match ClusterName::parse(&cluster.get_value()) {
                Ok(name) => call(&ListEndpoints { name: Some(name) }).await,
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
                    <p class="muted">"Read from the cluster once it is active."</p>
                }),
                Some(Ok(list)) => {
                    Either::Right(Either::Left(view! { <Endpoints list across=false/> }))
                }
                Some(Err(error)) => Either::Right(Either::Right(view! { <ErrorPanel error/> })),
            }
        })
    };
    view! {
        <div class="panel endpoints" aria-labelledby="endpoints-title">
            <h2 id="endpoints-title">"Model endpoints"</h2>
            <Transition fallback=loading>{shown}</Transition>
            <div class="actions">
                <button type="button" class="refresh-endpoints" on:click=move |_| reads.update(|n| *n += 1)>
                    "Refresh"
                </button>
            </div>
        </div>
        <EndpointDetail cluster=cluster.get_value()/>
        <IfRole role=Role::Operator>
            <TryEndpoint cluster=cluster.get_value()/>
            <Deploy cluster=cluster.get_value()/>
            <Catalogue cluster=cluster.get_value()/>
            <Scale cluster=cluster.get_value()/>
            <Pool cluster=cluster.get_value()/>
        </IfRole>
    }
    .into_any()
}

/// Every cluster's endpoints, each linking to its cluster's Inference tab; clusters that
/// could not be read are named with why.
#[component]
pub fn EndpointsPage() -> impl IntoView {
    let listed = Resource::new(
        || (),
        |_| async move { call(&ListEndpoints { name: None }).await },
    );
    view! {
        <section class="page">
            <header class="page-head">
                <h1>"Endpoints"</h1>
            </header>
            <div class="panel endpoints">
                <Transition fallback=loading>
                    {move || Suspend::new(async move {
                        match listed.await {
                            Ok(list) => {
                                let unreadable = list
                                    .unreadable
                                    .iter()
                                    .map(|c| view! { <li class="unreadable"><span class="mono">{c.name.clone()}</span>": "{c.error.clone()}</li> })
                                    .collect_view();
                                Either::Left(view! {
                                    <Endpoints list across=true/>
                                    <ul class="muted">{unreadable}</ul>
                                })
                            }
                            Err(error) => Either::Right(view! { <ErrorPanel error/> }),
                        }
                    })}
                </Transition>
            </div>
        </section>
    }
}

#[component]
fn Endpoints(
    list: EndpointList,
    /// Endpoints of several clusters: each row names and links to its cluster.
    across: bool,
) -> impl IntoView {
    if list.endpoints.is_empty() {
        return Either::Left(view! {
            <p class="muted empty-endpoints">"No model endpoint yet."</p>
        });
    }
    let rows = list
        .endpoints
        .into_iter()
        .map(|e| {
            let id = e.endpoint.clone();
            // The operator's endpoints say how they route and cache.
            let service = if e.kind == "inference_endpoint" {
                let options: Vec<String> = [
                    Some("operator".to_owned()),
                    e.routing.map(|r| format!("routing {r}")),
                    e.kv_cache.map(|k| format!("KV cache {k}")),
                ]
                .into_iter()
                .flatten()
                .collect();
                options.join(" · ")
            } else if let Some(pool) = &e.pool {
                let bound: Vec<String> = pool
                    .models
                    .iter()
                    .map(|m| format!("{} {}", m.model, m.workers))
                    .collect();
                format!("pool · {} · free {}", bound.join(", "), pool.unassigned)
            } else {
                [
                    Some(e.service),
                    e.routing.map(|r| format!("router {r}")),
                    e.autoscaling
                        .map(|a| format!("KEDA {}–{}", a.min_replicas, a.max_replicas)),
                ]
                .into_iter()
                .flatten()
                .collect::<Vec<_>>()
                .join(" · ")
            };
            let cluster = across.then(|| {
                let href = format!("/clusters/{}/inference", e.name);
                view! { <td><a href=href>{e.name.clone()}</a></td> }
            });
            view! {
                <tr data-endpoint=id>
                    <th scope="row" class="mono">{e.endpoint}</th>
                    {cluster}
                    <td>{e.engine}</td>
                    <td class="mono">{e.model}</td>
                    <td>{service}</td>
                    <td class="num replicas">{format!("{} / {}", e.ready, e.replicas)}</td>
                    <td class="mono">{e.address.unwrap_or_else(|| "—".into())}</td>
                    <td class="num">{e.cold_start_seconds.map(|s| format!("{s:.0} s")).unwrap_or_else(|| "—".into())}</td>
                    <td><StateBadge state=e.phase/></td>
                </tr>
            }
        })
        .collect_view();
    let columns: &'static [&'static str] = if across {
        &[
            "Endpoint",
            "Cluster",
            "Engine",
            "Model",
            "Service",
            "Ready",
            "Address",
            "Cold start",
            "Phase",
        ]
    } else {
        &[
            "Endpoint",
            "Engine",
            "Model",
            "Service",
            "Ready",
            "Address",
            "Cold start",
            "Phase",
        ]
    };
    Either::Right(view! {
        <Table class="endpoint-table" caption="Model endpoints" columns>
            {rows}
        </Table>
    })
}

/// The deploy form: the serving program and its command line, the GPUs and replicas,
/// how it is reached, a token for gated models; the plan first, then the operation.
#[component]
fn Deploy(cluster: String) -> impl IntoView {
    let gate = Gate::default();
    let cluster = StoredValue::new(cluster);
    let endpoint = RwSignal::new(String::new());
    let engine = RwSignal::new("vllm".to_owned());
    let command = RwSignal::new(String::new());
    let image = RwSignal::new(String::new());
    let gpus = RwSignal::new("1".to_owned());
    let replicas = RwSignal::new("1".to_owned());
    let group = RwSignal::new(String::new());
    let service = RwSignal::new("cluster_ip".to_owned());
    let token = RwSignal::new(String::new());
    // The inference operator's path and its options.
    let managed = RwSignal::new(false);
    let options = OperatorOptions::new(gate);
    // SGLang's router and KEDA's bounds (self-managed SGLang only).
    let router = RwSignal::new(String::new());
    let min = RwSignal::new(String::new());
    let max = RwSignal::new(String::new());
    let target = RwSignal::new(String::new());
    let cooldown = RwSignal::new(String::new());
    let rate = RwSignal::new(String::new());
    let window = RwSignal::new(String::new());
    let submit = move |ev: leptos::ev::SubmitEvent| {
        ev.prevent_default();
        let mut inputs = vec![
            text("name", cluster.get_value()),
            text("endpoint", endpoint.get_untracked()),
            text("engine", engine.get_untracked()),
            text("command", command.get_untracked()),
            // Empty: the engine's pinned image, the cluster's GPU group, no token.
            text("image", image.get_untracked()),
            integer("gpus_per_replica", gpus.get_untracked()),
            integer("replicas", replicas.get_untracked()),
            text("instance_group", group.get_untracked()),
            text("hf_token", token.get_untracked()),
        ];
        if !managed.get_untracked() {
            inputs.push(text("service", service.get_untracked()));
            inputs.push(text("router.policy", router.get_untracked()));
            // Bounds without a maximum are no autoscaling: the request needs one.
            if !max.get_untracked().is_empty() {
                inputs.push(integer("autoscaling.min_replicas", min.get_untracked()));
                inputs.push(integer("autoscaling.max_replicas", max.get_untracked()));
                inputs.push(integer(
                    "autoscaling.target_requests_per_replica",
                    target.get_untracked(),
                ));
                inputs.push(integer(
                    "autoscaling.cooldown_seconds",
                    cooldown.get_untracked(),
                ));
                // No rate: requests in flight are the only signal.
                if !rate.get_untracked().is_empty() {
                    inputs.push(number(
                        "autoscaling.request_rate.target_per_replica",
                        rate.get_untracked(),
                    ));
                    inputs.push(integer(
                        "autoscaling.request_rate.window_seconds",
                        window.get_untracked(),
                    ));
                }
            }
            gate.start::<DeployModelServer>(&inputs);
            return;
        }
        inputs.extend(options.inputs());
        gate.start::<DeployInferenceEndpoint>(&inputs);
    };
    view! {
        <form class="panel deploy-model-server" aria-label="Deploy a model server" on:submit=submit>
            <h2>"Deploy a model server"</h2>
            <label>"Path "<select name="path" on:change=move |ev| {
                managed.set(event_target_value(&ev) == "operator");
                gate.reset();
            }>
                <option value="model_server" selected=true>"Model server (a Deployment of hypd's)"</option>
                <option value="operator">"HyperPod inference operator"</option>
            </select></label>
            <label>"Endpoint "<input type="text" name="endpoint" placeholder="qwen-chat"
                prop:value=move || endpoint.get() on:input=gate.edit(endpoint)/></label>
            <label>"Engine "<select name="engine" on:change=gate.edit(engine)>
                <option value="vllm" selected=true>"vLLM"</option>
                <option value="sglang">"SGLang"</option>
                <option value="custom">"Custom"</option>
            </select></label>
            <label class="wide">"Serve command "<input type="text" name="command" class="mono"
                placeholder="vllm serve /s3/models/Qwen/Qwen2.5-0.5B --served-model-name qwen"
                prop:value=move || command.get() on:input=gate.edit(command)/></label>
            <label>"Image "<input type="text" name="image" placeholder="the engine's pinned image"
                prop:value=move || image.get() on:input=gate.edit(image)/></label>
            <label>"GPUs per replica "<input type="number" name="gpus_per_replica" min="1"
                prop:value=move || gpus.get() on:input=gate.edit(gpus)/></label>
            <label>"Replicas "<input type="number" name="replicas" min="0"
                prop:value=move || replicas.get() on:input=gate.edit(replicas)/></label>
            <label>"Instance group "<input type="text" name="instance_group" placeholder="the GPU group"
                prop:value=move || group.get() on:input=gate.edit(group)/></label>
            {move || if managed.get() {
                options.view().into_any()
            } else {
                view! {
                    <label>"Service "<select name="service" on:change=gate.edit(service)>
                        <option value="cluster_ip" selected=true>"In the cluster"</option>
                        <option value="load_balancer">"Network load balancer"</option>
                        <option value="model_pool">"Model pool (warm, bound later)"</option>
                    </select></label>
                    <fieldset class="router" disabled=move || engine.get() != "sglang">
                        <legend>"SGLang router and KEDA autoscaling"</legend>
                        <label>"Router "<select name="router.policy" on:change=gate.edit(router)>
                            <option value="" selected=true>"None"</option>
                            <option value="cache_aware">"Cache-aware"</option>
                            <option value="round_robin">"Round-robin"</option>
                            <option value="random">"Random"</option>
                            <option value="power_of_two">"Power of two"</option>
                        </select></label>
                        <label>"Min replicas "<input type="number" name="autoscaling.min_replicas" min="0" placeholder="1 (0 scales to zero)"
                            prop:value=move || min.get() on:input=gate.edit(min)/></label>
                        <label>"Max replicas "<input type="number" name="autoscaling.max_replicas" min="1" placeholder="no autoscaling"
                            prop:value=move || max.get() on:input=gate.edit(max)/></label>
                        <label>"Requests in flight a replica "<input type="number" name="autoscaling.target_requests_per_replica" min="1" placeholder="4"
                            prop:value=move || target.get() on:input=gate.edit(target)/></label>
                        <label>"Cooldown (s) "<input type="number" name="autoscaling.cooldown_seconds" min="0" placeholder="300"
                            prop:value=move || cooldown.get() on:input=gate.edit(cooldown)/></label>
                        <label>"Requests a second a replica "<input type="number" name="autoscaling.request_rate.target_per_replica" min="0.01" step="any" placeholder="not a signal"
                            prop:value=move || rate.get() on:input=gate.edit(rate)/></label>
                        <label>"Rate window (s) "<input type="number" name="autoscaling.request_rate.window_seconds" min="60" max="900" placeholder="60"
                            prop:value=move || window.get() on:input=gate.edit(window)/></label>
                    </fieldset>
                }
                .into_any()
            }}
            <label>"Token "<input type="password" name="hf_token" autocomplete="off" placeholder="for gated models"
                prop:value=move || token.get() on:input=gate.edit(token)/></label>
            <div class="actions">
                <button class="primary" type="submit" disabled=move || gate.busy()>
                    {move || if gate.reviewing() { "Deploy" } else { "Review plan" }}
                </button>
            </div>
            {gate.view()}
        </form>
    }
    .into_any()
}

/// The inference operator's own options (KV cache tiers, routing), which its
/// InferenceEndpointConfig and JumpStartModel forms both offer.
#[derive(Clone, Copy)]
struct OperatorOptions {
    gate: Gate,
    kv: RwSignal<String>,
    redis: RwSignal<String>,
    routing: RwSignal<String>,
}

impl OperatorOptions {
    fn new(gate: Gate) -> Self {
        OperatorOptions {
            gate,
            kv: RwSignal::new(String::new()),
            redis: RwSignal::new(String::new()),
            routing: RwSignal::new(String::new()),
        }
    }

    /// The request's `kv_cache` and `routing`, as chosen.
    fn inputs(self) -> Vec<(String, crate::form::Input)> {
        let tier = self.kv.get_untracked();
        let mut inputs = Vec::new();
        if !tier.is_empty() {
            inputs.push(flag("kv_cache.cpu_offload", true));
        }
        if tier == "tiered_storage" || tier == "redis" {
            inputs.push(text("kv_cache.l2.backend", tier.clone()));
        }
        if tier == "redis" {
            inputs.push(text("kv_cache.l2.url", self.redis.get_untracked()));
        }
        inputs.push(text("routing", self.routing.get_untracked()));
        inputs
    }

    fn view(self) -> impl IntoView {
        let OperatorOptions {
            gate,
            kv,
            redis,
            routing,
        } = self;
        view! {
            <label>"KV cache "<select name="kv_cache" on:change=gate.edit(kv)>
                <option value="" selected=true>"None"</option>
                <option value="cpu">"CPU memory (L1)"</option>
                <option value="tiered_storage">"L1 + tiered storage (L2)"</option>
                <option value="redis">"L1 + Redis (L2)"</option>
            </select></label>
            <label>"Redis URL "<input type="text" name="kv_cache.l2.url" class="mono"
                placeholder="redis://kv.internal:6379" disabled=move || kv.get() != "redis"
                prop:value=move || redis.get() on:input=gate.edit(redis)/></label>
            <label>"Routing "<select name="routing" on:change=gate.edit(routing)>
                <option value="" selected=true>"None"</option>
                <option value="prefix_aware">"Prefix-aware"</option>
                <option value="kv_aware">"KV-aware"</option>
                <option value="session">"Session"</option>
                <option value="round_robin">"Round-robin"</option>
            </select></label>
        }
    }
}

/// A JumpStart catalogue model deployed by the inference operator, behind a button: the
/// form's code is its own wasm chunk (with `--split`), fetched when asked for, so the
/// tab loads no more for it than the button.
#[component]
fn Catalogue(cluster: String) -> impl IntoView {
    let open = RwSignal::new(false);
    let cluster = StoredValue::new(cluster);
    view! {
        {move || if open.get() {
            let cluster = cluster.get_value();
            Either::Left(view! {
                <Suspense fallback=loading>{Suspend::new(async move { catalogue_form(cluster).await })}</Suspense>
            })
        } else {
            Either::Right(view! {
                <div class="panel deploy-jumpstart-closed">
                    <button type="button" class="open-catalogue" on:click=move |_| open.set(true)>
                        "Deploy a JumpStart model"
                    </button>
                </div>
            })
        }}
    }
}

/// The catalogue is read only when asked for (each model is a hub call away), and
/// choosing one fills the form.
#[leptos::lazy]
fn catalogue_form(cluster: String) -> AnyView {
    let gate = Gate::default();
    let cluster = StoredValue::new(cluster);
    let endpoint = RwSignal::new(String::new());
    let model = RwSignal::new(String::new());
    let version = RwSignal::new(String::new());
    let eula = RwSignal::new(false);
    let replicas = RwSignal::new("1".to_owned());
    let group = RwSignal::new(String::new());
    let search = RwSignal::new(String::new());
    let browse = RwSignal::new(0u32);
    let options = OperatorOptions::new(gate);
    let listed = Resource::new(
        move || browse.get(),
        move |n| async move {
            if n == 0 {
                return None;
            }
            let search = Some(search.get_untracked()).filter(|s| !s.is_empty());
            Some(match ClusterName::parse(&cluster.get_value()) {
                Ok(name) => call(&ListJumpstartModels { name, search }).await,
                Err(m) => Err(ApiError::field("name", m)),
            })
        },
    );
    let submit = move |ev: leptos::ev::SubmitEvent| {
        ev.prevent_default();
        let mut inputs = vec![
            text("name", cluster.get_value()),
            text("endpoint", endpoint.get_untracked()),
            text("model_id", model.get_untracked()),
            // Empty: the latest version, the one group of a type the model runs on.
            text("model_version", version.get_untracked()),
            flag("accept_eula", eula.get_untracked()),
            integer("replicas", replicas.get_untracked()),
            text("instance_group", group.get_untracked()),
        ];
        inputs.extend(options.inputs());
        gate.start::<DeployJumpstartModel>(&inputs);
    };
    let models = move || {
        Suspend::new(async move {
            match listed.await {
                None => Either::Left(().into_any()),
                Some(Ok(catalogue)) => {
                    let rows = catalogue.models.into_iter().map(|m| {
                        let id = m.model_id.clone();
                        let fits = m.groups.first().cloned().unwrap_or_default();
                        let licence = match (m.gated, m.eula) {
                            (true, Some(uri)) => format!("gated ({uri})"),
                            (true, None) => "gated".to_owned(),
                            _ => String::new(),
                        };
                        view! {
                            <tr>
                                <td><button type="button" class="link mono" on:click=move |_| {
                                    model.set(id.clone());
                                    group.set(fits.clone());
                                    gate.reset();
                                }>{m.model_id.clone()}</button></td>
                                <td>{m.display_name}" "{m.version}</td>
                                <td>{licence}</td>
                                <td class="mono">{m.instance_types.join(" ")}</td>
                                <td>{if m.groups.is_empty() { "none".to_owned() } else { m.groups.join(", ") }}</td>
                            </tr>
                        }
                    }).collect_view();
                    let more = (catalogue.more > 0)
                        .then(|| view! { <p class="muted">{format!("{} more: narrow the search", catalogue.more)}</p> });
                    Either::Left(view! {
                        <Table class="catalogue" caption="JumpStart models" columns=&["Model", "Name", "Licence", "Instance types", "Groups that fit"]>
                            {rows}
                        </Table>
                        {more}
                    }.into_any())
                }
                Some(Err(error)) => Either::Right(view! { <ErrorPanel error/> }),
            }
        })
    };
    view! {
        <form class="panel deploy-jumpstart" aria-label="Deploy a JumpStart model" on:submit=submit>
            <h2>"Deploy a JumpStart model"</h2>
            <label>"Search "<input type="text" name="search" placeholder="llama"
                prop:value=move || search.get() on:input=move |ev| search.set(event_target_value(&ev))/></label>
            <div class="actions">
                <button type="button" class="browse-catalogue" on:click=move |_| browse.update(|n| *n += 1)>"Browse the catalogue"</button>
            </div>
            <Transition fallback=loading>{models}</Transition>
            <label>"Endpoint "<input type="text" name="endpoint" placeholder="llama-chat"
                prop:value=move || endpoint.get() on:input=gate.edit(endpoint)/></label>
            <label>"Model "<input type="text" name="model_id" class="mono"
                prop:value=move || model.get() on:input=gate.edit(model)/></label>
            <label>"Version "<input type="text" name="model_version" placeholder="latest"
                prop:value=move || version.get() on:input=gate.edit(version)/></label>
            <label>"Replicas "<input type="number" name="replicas" min="1"
                prop:value=move || replicas.get() on:input=gate.edit(replicas)/></label>
            <label>"Instance group "<input type="text" name="instance_group" placeholder="the one that fits"
                prop:value=move || group.get() on:input=gate.edit(group)/></label>
            {options.view()}
            <label class="check"><input type="checkbox" name="accept_eula"
                prop:checked=move || eula.get() on:change=move |ev| { eula.set(event_target_checked(&ev)); gate.reset(); }/>
                " I accept the model's licence (gated models)"</label>
            <div class="actions">
                <button class="primary" type="submit" disabled=move || gate.busy()>
                    {move || if gate.reviewing() { "Deploy" } else { "Review plan" }}
                </button>
            </div>
            {gate.view()}
        </form>
    }
    .into_any()
}

/// Scaling (0 scales to zero) and deleting an endpoint, each planned first.
#[component]
fn Scale(cluster: String) -> impl IntoView {
    let scale = Gate::default();
    let delete = Gate::default();
    let cluster = StoredValue::new(cluster);
    let endpoint = RwSignal::new(String::new());
    let replicas = RwSignal::new("1".to_owned());
    let edit = move |signal: RwSignal<String>| {
        move |ev: leptos::ev::Event| {
            signal.set(event_target_value(&ev));
            scale.reset();
            delete.reset();
        }
    };
    let on_scale = move |ev: leptos::ev::SubmitEvent| {
        ev.prevent_default();
        delete.reset();
        scale.start::<ScaleEndpoint>(&[
            text("name", cluster.get_value()),
            text("endpoint", endpoint.get_untracked()),
            integer("replicas", replicas.get_untracked()),
        ]);
    };
    let on_delete = move |_| {
        scale.reset();
        delete.start::<DeleteEndpoint>(&[
            text("name", cluster.get_value()),
            text("endpoint", endpoint.get_untracked()),
        ]);
    };
    view! {
        <form class="panel scale-endpoint" aria-label="Scale or delete an endpoint" on:submit=on_scale>
            <h2>"Scale or delete an endpoint"</h2>
            <label>"Endpoint "<input type="text" name="endpoint"
                prop:value=move || endpoint.get() on:input=edit(endpoint)/></label>
            <label>"Replicas "<input type="number" name="replicas" min="0"
                prop:value=move || replicas.get() on:input=edit(replicas)/></label>
            <div class="actions">
                <button class="primary" type="submit" disabled=move || scale.busy()>
                    {move || if scale.reviewing() { "Scale" } else { "Review scaling" }}
                </button>
                <button type="button" class="danger delete-endpoint" disabled=move || delete.busy() on:click=on_delete>
                    {move || if delete.reviewing() { "Delete" } else { "Review deletion" }}
                </button>
            </div>
            {scale.view()}
            {delete.view()}
        </form>
    }
    .into_any()
}

/// Binding a pool's free workers to one of its models, and releasing them, each planned
/// first.
#[component]
fn Pool(cluster: String) -> impl IntoView {
    let assign = Gate::default();
    let release = Gate::default();
    let cluster = StoredValue::new(cluster);
    let pool = RwSignal::new(String::new());
    let model = RwSignal::new(String::new());
    let count = RwSignal::new("1".to_owned());
    let edit = move |signal: RwSignal<String>| {
        move |ev: leptos::ev::Event| {
            signal.set(event_target_value(&ev));
            assign.reset();
            release.reset();
        }
    };
    let inputs = move || {
        vec![
            text("name", cluster.get_value()),
            text("pool", pool.get_untracked()),
            text("model", model.get_untracked()),
            integer("count", count.get_untracked()),
        ]
    };
    let on_assign = move |ev: leptos::ev::SubmitEvent| {
        ev.prevent_default();
        release.reset();
        assign.start::<AssignPoolWorkers>(&inputs());
    };
    let on_release = move |_| {
        assign.reset();
        release.start::<ReleasePoolWorkers>(&inputs());
    };
    view! {
        <form class="panel pool-workers" aria-label="Bind or release a pool's workers" on:submit=on_assign>
            <h2>"Bind or release a pool's workers"</h2>
            <label>"Pool "<input type="text" name="pool"
                prop:value=move || pool.get() on:input=edit(pool)/></label>
            <label>"Model "<input type="text" name="model"
                prop:value=move || model.get() on:input=edit(model)/></label>
            <label>"Workers "<input type="number" name="count" min="1"
                prop:value=move || count.get() on:input=edit(count)/></label>
            <div class="actions">
                <button class="primary" type="submit" disabled=move || assign.busy()>
                    {move || if assign.reviewing() { "Bind" } else { "Review binding" }}
                </button>
                <button type="button" class="release-workers" disabled=move || release.busy() on:click=on_release>
                    {move || if release.reviewing() { "Release" } else { "Review release" }}
                </button>
            </div>
            {assign.view()}
            {release.view()}
        </form>
    }
    .into_any()
}

/// One endpoint as get_endpoint reads it: what runs (image, command, GPUs, group), how it
/// routes and caches, a pool's bindings, why it waits, and each pod.
#[component]
fn EndpointDetail(cluster: String) -> impl IntoView {
    let cluster = StoredValue::new(cluster);
    let endpoint = RwSignal::new(String::new());
    let got = RwSignal::new(None::<Result<Endpoint, ApiError>>);
    let busy = RwSignal::new(false);
    let show = move |ev: leptos::ev::SubmitEvent| {
        ev.prevent_default();
        let request = ClusterName::parse(&cluster.get_value())
            .map_err(|m| ApiError::field("name", m))
            .and_then(|name| {
                let endpoint = EndpointName::parse(&endpoint.get_untracked())
                    .map_err(|m| ApiError::field("endpoint", m))?;
                Ok(GetEndpoint { name, endpoint })
            });
        busy.set(true);
        leptos::task::spawn_local(async move {
            let answer = match request {
                Ok(r) => call(&r).await,
                Err(e) => Err(e),
            };
            got.set(Some(answer));
            busy.set(false);
        });
    };
    let shown = move || {
        got.get().map(|answer| match answer {
            Ok(e) => {
                let options = [
                    Some(format!("{} · {}", e.summary.kind, e.summary.service)),
                    e.summary.routing.clone().map(|r| format!("routing {r}")),
                    e.summary.kv_cache.clone().map(|k| format!("KV cache {k}")),
                    e.summary.autoscaling.as_ref().map(|a| {
                        format!(
                            "KEDA {}–{} replicas at {} requests in flight each{}, cooldown {} s{}",
                            a.min_replicas,
                            a.max_replicas,
                            a.target_requests_per_replica,
                            a.request_rate_per_replica
                                .map(|r| format!(" or {r} requests a second each"))
                                .unwrap_or_default(),
                            a.cooldown_seconds,
                            match (a.active, &a.problem) {
                                (_, Some(p)) => format!(" ({p})"),
                                (Some(true), None) => " (active)".to_owned(),
                                _ => String::new(),
                            }
                        )
                    }),
                    e.instance_group.clone().map(|g| format!("group {g}")),
                    Some(format!("{} GPU a replica, port {}", e.gpus_per_replica, e.port)),
                ]
                .into_iter()
                .flatten()
                .collect::<Vec<_>>()
                .join(" · ");
                let pods = e
                    .pods
                    .into_iter()
                    .map(|p| {
                        let id = p.pod.clone();
                        view! {
                            <tr data-pod=id>
                                <th scope="row" class="mono">{p.pod}</th>
                                <td class="mono">{p.uid}</td>
                                <td class="mono">{p.node.unwrap_or_else(|| "—".into())}</td>
                                <td>{if p.ready { "ready" } else { "not ready" }}</td>
                                <td class="num">{p.cold_start_seconds.map(|s| format!("{s:.0} s")).unwrap_or_else(|| "—".into())}</td>
                                <td class="num">{p.restarts}</td>
                                <td class="serves">{p.serves.unwrap_or_else(|| "—".into())}</td>
                            </tr>
                        }
                    })
                    .collect_view();
                let columns: &'static [&'static str] =
                    &["Pod", "UID", "Node", "Ready", "Cold start", "Restarts", "Serves"];
                Either::Left(view! {
                    <div class="endpoint-detail" data-endpoint=e.summary.endpoint.clone()>
                        <p class="muted options">{options}</p>
                        <p class="mono">{e.image}" "{e.command.join(" ")}</p>
                        {e.waiting.map(|w| view! { <p class="waiting">{w}</p> })}
                        {e.summary.autoscaling.as_ref().map(|a| {
                            replica_chart(&e.replica_history, e.summary.replicas, a.max_replicas)
                        })}
                        <Table class="pod-table" caption="Pods" columns>{pods}</Table>
                    </div>
                })
            }
            Err(error) => Either::Right(view! { <ErrorPanel error/> }),
        })
    };
    view! {
        <form class="panel endpoint-details" aria-label="An endpoint's pods" on:submit=show>
            <h2>"An endpoint's pods"</h2>
            <label>"Endpoint "<input type="text" name="endpoint"
                prop:value=move || endpoint.get() on:input=move |ev| endpoint.set(event_target_value(&ev))/></label>
            <div class="actions">
                <button type="submit" disabled=move || busy.get()>"Show"</button>
            </div>
            {shown}
        </form>
    }
    .into_any()
}

/// Replicas over time as KEDA set them: a step line from the first change to now, on a
/// scale up to the maximum. Drawn as one SVG path, so it costs no chart library.
fn replica_chart(
    history: &[crate::api::inference::ReplicaChange],
    now: u32,
    max: u32,
) -> impl IntoView + use<> {
    const W: f64 = 320.0;
    const H: f64 = 80.0;
    let seconds = |at: &str| crate::time::parse_millis(at).map(|ms| ms as f64 / 1000.0);
    let points: Vec<(f64, u32)> = history
        .iter()
        .filter_map(|c| Some((seconds(&c.at)?, c.replicas)))
        .collect();
    let summary = match points.first() {
        None => format!("No change of replicas in the cluster's events; {now} now."),
        Some(_) => format!(
            "{} changes: {}; {now} now.",
            points.len(),
            history
                .iter()
                .map(|c| c.replicas.to_string())
                .collect::<Vec<_>>()
                .join(" → ")
        ),
    };
    let (start, end) = match (points.first(), points.last()) {
        (Some(a), Some(b)) => (a.0, (b.0 + 1.0).max(a.0 + 1.0)),
        _ => (0.0, 1.0),
    };
    // The last change holds until now: a last step a tenth of the width long.
    let span = (end - start) * 1.1;
    let x = |t: f64| (t - start) / span * W;
    let y = |n: u32| H - f64::from(n) / f64::from(max.max(1)) * (H - 4.0);
    let mut d = String::new();
    for (i, (t, n)) in points.iter().enumerate() {
        if i == 0 {
            d.push_str(&format!("M{:.1},{:.1}", x(*t), y(*n)));
        } else {
            d.push_str(&format!("H{:.1}V{:.1}", x(*t), y(*n)));
        }
    }
    if !points.is_empty() {
        d.push_str(&format!("H{W:.1}"));
    }
    view! {
        <figure class="replica-chart">
            <svg viewBox=format!("0 0 {W} {H}") role="img" aria-label=summary.clone()>
                <line x1="0" x2=W y1=y(max) y2=y(max) class="max"/>
                <path d=d/>
            </svg>
            <figcaption class="muted">{format!("Replicas over time (max {max}). ")}{summary}</figcaption>
        </figure>
    }
}

/// The test panel: one user message to an endpoint, its answer, token counts and the
/// latency hypd measured.
#[component]
fn TryEndpoint(cluster: String) -> impl IntoView {
    let cluster = StoredValue::new(cluster);
    let endpoint = RwSignal::new(String::new());
    let prompt = RwSignal::new(String::new());
    let model = RwSignal::new(String::new());
    let answer = RwSignal::new(None::<Result<crate::api::inference::Invocation, ApiError>>);
    let busy = RwSignal::new(false);
    let send = move |ev: leptos::ev::SubmitEvent| {
        ev.prevent_default();
        let request = ClusterName::parse(&cluster.get_value())
            .map_err(|m| ApiError::field("name", m))
            .and_then(|name| {
                let endpoint = EndpointName::parse(&endpoint.get_untracked())
                    .map_err(|m| ApiError::field("endpoint", m))?;
                let model = match model.get_untracked() {
                    m if m.is_empty() => None,
                    m => Some(ServedName::parse(&m).map_err(|e| ApiError::field("model", e))?),
                };
                let r = InvokeEndpoint {
                    name,
                    endpoint,
                    messages: vec![ChatMessage {
                        role: ChatRole::User,
                        content: prompt.get_untracked(),
                    }],
                    max_tokens: None,
                    model,
                };
                crate::api::Command::validate(&r).map(|()| r)
            });
        busy.set(true);
        leptos::task::spawn_local(async move {
            let got = match request {
                Ok(r) => call(&r).await,
                Err(e) => Err(e),
            };
            answer.set(Some(got));
            busy.set(false);
        });
    };
    let shown = move || {
        answer.get().map(|got| match got {
            Ok(a) => Either::Left(view! {
                <div class="invocation">
                    <p class="answer">{a.answer}</p>
                    <p class="muted">{format!(
                        "{} · {} prompt + {} completion tokens · {} ms",
                        a.model, a.prompt_tokens, a.completion_tokens, a.latency_ms
                    )}</p>
                </div>
            }),
            Err(error) => Either::Right(view! { <ErrorPanel error/> }),
        })
    };
    view! {
        <form class="panel try-endpoint" aria-label="Try an endpoint" on:submit=send>
            <h2>"Try an endpoint"</h2>
            <label>"Endpoint "<input type="text" name="endpoint"
                prop:value=move || endpoint.get() on:input=move |ev| endpoint.set(event_target_value(&ev))/></label>
            <label>"Model "<input type="text" name="model" placeholder="a pool's model"
                prop:value=move || model.get() on:input=move |ev| model.set(event_target_value(&ev))/></label>
            <label class="wide">"Message "<textarea name="prompt" rows="3"
                prop:value=move || prompt.get() on:input=move |ev| prompt.set(event_target_value(&ev))/></label>
            <div class="actions">
                <button class="primary" type="submit" disabled=move || busy.get()>"Send"</button>
            </div>
            {shown}
        </form>
    }
    .into_any()
}
