//! Model endpoints in the console: the Endpoints page (every cluster's, each linking to
//! its cluster's tab) and the cluster page's Inference tab: the cluster's endpoints
//! (phase, replicas ready of asked, address, cold start), the form that deploys a model
//! server, the forms that scale or delete one (plan, then run, as every change), and a
//! test panel that sends a chat completion through `invoke_endpoint`. Every request is
//! the command's own type, so a bad serve command is refused here with the server's
//! words.

use leptos::either::Either;
use leptos::prelude::*;

use super::gate::{Gate, integer, text};
use super::{StateBadge, Table, loading};
use crate::api::ApiError;
use crate::api::call::call;
use crate::api::command::Role;
use crate::api::inference::{
    ChatMessage, ChatRole, DeleteEndpoint, DeployModelServer, EndpointList, InvokeEndpoint,
    ListEndpoints, ScaleEndpoint,
};
use crate::api::values::{ClusterName, EndpointName};
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
        <IfRole role=Role::Operator>
            <TryEndpoint cluster=cluster.get_value()/>
            <Deploy cluster=cluster.get_value()/>
            <Scale cluster=cluster.get_value()/>
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
                    <td>{e.service}</td>
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
    let submit = move |ev: leptos::ev::SubmitEvent| {
        ev.prevent_default();
        gate.start::<DeployModelServer>(&[
            text("name", cluster.get_value()),
            text("endpoint", endpoint.get_untracked()),
            text("engine", engine.get_untracked()),
            text("command", command.get_untracked()),
            // Empty: the engine's pinned image, the cluster's GPU group, no token.
            text("image", image.get_untracked()),
            integer("gpus_per_replica", gpus.get_untracked()),
            integer("replicas", replicas.get_untracked()),
            text("instance_group", group.get_untracked()),
            text("service", service.get_untracked()),
            text("hf_token", token.get_untracked()),
        ]);
    };
    let choice = move |signal: RwSignal<String>| {
        move |ev: leptos::ev::Event| {
            signal.set(event_target_value(&ev));
            gate.reset();
        }
    };
    view! {
        <form class="panel deploy-model-server" aria-label="Deploy a model server" on:submit=submit>
            <h2>"Deploy a model server"</h2>
            <label>"Endpoint "<input type="text" name="endpoint" placeholder="qwen-chat"
                prop:value=move || endpoint.get() on:input=gate.edit(endpoint)/></label>
            <label>"Engine "<select name="engine" on:change=choice(engine)>
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
            <label>"Service "<select name="service" on:change=choice(service)>
                <option value="cluster_ip" selected=true>"In the cluster"</option>
                <option value="load_balancer">"Network load balancer"</option>
            </select></label>
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

/// The test panel: one user message to an endpoint, its answer, token counts and the
/// latency hypd measured.
#[component]
fn TryEndpoint(cluster: String) -> impl IntoView {
    let cluster = StoredValue::new(cluster);
    let endpoint = RwSignal::new(String::new());
    let prompt = RwSignal::new(String::new());
    let answer = RwSignal::new(None::<Result<crate::api::inference::Invocation, ApiError>>);
    let busy = RwSignal::new(false);
    let send = move |ev: leptos::ev::SubmitEvent| {
        ev.prevent_default();
        let request = ClusterName::parse(&cluster.get_value())
            .map_err(|m| ApiError::field("name", m))
            .and_then(|name| {
                let endpoint = EndpointName::parse(&endpoint.get_untracked())
                    .map_err(|m| ApiError::field("endpoint", m))?;
                let r = InvokeEndpoint {
                    name,
                    endpoint,
                    messages: vec![ChatMessage {
                        role: ChatRole::User,
                        content: prompt.get_untracked(),
                    }],
                    max_tokens: None,
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
