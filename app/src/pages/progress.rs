//! One operation's progress panel: its stages in order with state, elapsed time and the
//! latest note; for a failure, the failing call and the provider's own message; retry and
//! cancel where the server says they are allowed. It renders the state the server had
//! and then follows the live channel, so it moves on its own while the work runs.

use leptos::either::Either;
use leptos::prelude::*;

use super::diagnosis::DiagnosisView;
use super::operations::{operation_resource, use_operation_id};
use super::{StateBadge, loading};
use crate::api::call::call;
use crate::api::diagnose::{DiagnoseOperation, Diagnosis};
use crate::api::operations::{CancelOperation, Operation, RetryOperation, Stage};
use crate::api::{ApiError, Role};
use crate::live::use_live;
use crate::session::{ErrorPanel, IfRole};
use crate::time::{elapsed, short};

#[component]
pub fn OperationPage() -> impl IntoView {
    let id = use_operation_id();
    let operation = operation_resource(id);
    view! {
        <section class="page">
            <nav class="crumbs" aria-label="Breadcrumb">
                <a href="/operations">"Operations"</a>
                " / "
                <span aria-current="page" class="mono">{id}</span>
            </nav>
            <Transition fallback=loading>
                {move || Suspend::new(async move {
                    match operation.await {
                        Ok(op) => Either::Left(view! { <ProgressPanel loaded=op/> }),
                        Err(e) => Either::Right(view! { <ErrorPanel error=e/> }),
                    }
                })}
            </Transition>
        </section>
    }
}

pub(crate) fn command_title(command: &str) -> String {
    let mut words = command.replace('_', " ");
    if let Some(first) = words.get_mut(..1) {
        first.make_ascii_uppercase();
    }
    words
}

#[component]
fn ProgressPanel(loaded: Operation) -> impl IntoView {
    let live = use_live();
    // A retry or cancel answers before the live channel pushes the change: keep the
    // answer too, and show whichever snapshot is newest.
    let answered = RwSignal::new(None::<Operation>);
    let first = loaded.clone();
    let op = Memo::new(move |_| {
        let base = match answered.get() {
            Some(a) if a.updated_at >= first.updated_at => a,
            _ => first.clone(),
        };
        live.freshest(base)
    });
    let action_error = RwSignal::new(None::<String>);
    let busy = RwSignal::new(false);
    // Each change is announced to screen readers as it happens; the state on arrival is
    // on the page already. (An effect runs only in the browser, after hydration.)
    let announced = RwSignal::new(String::new());
    let seen = StoredValue::new(None::<Operation>);
    Effect::new(move || {
        let now = op.get();
        if let Some(news) = seen.with_value(|before| before.as_ref().and_then(|b| changes(b, &now)))
        {
            announced.set(news);
        }
        seen.set_value(Some(now));
    });

    let retry = move |_| {
        let operation_id = op.with_untracked(|o| o.operation_id.clone());
        busy.set(true);
        action_error.set(None);
        leptos::task::spawn_local(async move {
            let result = call(&RetryOperation {
                operation_id: operation_id.clone(),
                dry_run: false,
            })
            .await;
            let result = match result {
                Ok(_) => call(&crate::api::operations::GetOperation { operation_id }).await,
                Err(e) => Err(e),
            };
            settle(result, answered, action_error, busy);
        });
    };
    let cancel = move |_| {
        let operation_id = op.with_untracked(|o| o.operation_id.clone());
        busy.set(true);
        action_error.set(None);
        leptos::task::spawn_local(async move {
            let result = call(&CancelOperation { operation_id }).await;
            settle(result, answered, action_error, busy);
        });
    };

    let state = move || op.with(|o| o.state.as_str().to_owned());
    let total = move || {
        op.with(|o| {
            let end = o.state.is_terminal().then_some(o.updated_at.as_str());
            elapsed(Some(&o.created_at), end, live.now.get())
        })
    };
    let cluster_link = move || {
        op.with(|o| {
            o.target
                .strip_prefix("cluster/")
                .map(|name| (name.to_owned(), o.state.as_str() == "succeeded"))
        })
    };
    view! {
        <div class="progress" data-state=state data-operation=loaded.operation_id.clone()>
            <header class="page-head">
                <h1>{command_title(&loaded.command)}</h1>
                <StateBadge state=Signal::derive(state)/>
                <span class="spacer"></span>
                <IfRole role=Role::Operator>
                    <Show when=move || op.with(|o| o.retryable)>
                        <button class="primary" type="button" on:click=retry disabled=move || busy.get()>
                            "Retry"
                        </button>
                    </Show>
                    <Show when=move || op.with(|o| o.cancellable)>
                        <button class="danger" type="button" on:click=cancel disabled=move || busy.get()>
                            "Cancel"
                        </button>
                    </Show>
                </IfRole>
            </header>
            <p class="visually-hidden announcer" role="status" aria-live="polite" aria-atomic="true">
                {announced}
            </p>
            {move || action_error.get().map(|e| view! { <div class="form-alert" role="alert">{e}</div> })}
            <div class="panel">
                <dl class="facts op-facts">
                    <dt>"Target"</dt>
                    <dd class="mono">
                        {move || match cluster_link() {
                            Some((name, true)) => Either::Left(view! { <a href=format!("/clusters/{name}")>{format!("cluster/{name}")}</a> }),
                            _ => Either::Right(op.with(|o| o.target.clone())),
                        }}
                    </dd>
                    <dt>"Requested by"</dt>
                    <dd>{loaded.requested_by.clone()}</dd>
                    <dt>"Started"</dt>
                    <dd>{short(&loaded.created_at)}</dd>
                    <dt>"Elapsed"</dt>
                    <dd class="elapsed">{move || total().unwrap_or_else(|| "—".into())}</dd>
                </dl>
            </div>
            {move || {
                op.with(|o| {
                    let error = o.error.clone()?;
                    let at = o.stages.iter().find(|s| s.error.is_some()).map(|s| s.title.clone());
                    let retry_note = if o.retryable {
                        " Retry resumes from that stage; stages that succeeded are not repeated."
                    } else {
                        ""
                    };
                    let id = o.operation_id.clone();
                    Some(match at {
                        // The details are shown with the stage; say where to look.
                        Some(title) => Either::Left(view! {
                            <div class="panel failure" role="alert">
                                <h2>"Failed at: " {title}</h2>
                                <p class="muted">{format!("The failing call and the provider's message are shown with the stage below.{retry_note}")}</p>
                                <DiagnosisPanel operation_id=id/>
                            </div>
                        }
                        ),
                        None => Either::Right(view! {
                            <div class="panel failure" role="alert">
                                <h2>"Failed"</h2>
                                <ErrorDetail error/>
                            </div>
                        }
                        ),
                    })
                })
            }}
            <div class="panel">
                <h2>"Stages"</h2>
                <ol class="stages">
                    <For
                        each=move || op.with(|o| o.stages.clone())
                        key=|s| (s.name.clone(), s.state.as_str(), s.attempts, s.message.clone(), s.finished_at.clone())
                        children=move |s| view! { <StageRow stage=s/> }
                    />
                </ol>
            </div>
            <Show when=move || op.with(|o| !o.outputs.is_empty())>
                <div class="panel">
                    <h2>"Outputs"</h2>
                    <dl class="facts outputs">
                        {move || op.with(|o| {
                            o.outputs
                                .iter()
                                .map(|(k, v)| {
                                    let v = v.as_str().map(str::to_owned).unwrap_or_else(|| v.to_string());
                                    view! { <dt>{k.clone()}</dt><dd class="mono">{v}</dd> }
                                })
                                .collect_view()
                        })}
                    </dl>
                </div>
            </Show>
            <Show when=move || cluster_link().is_some_and(|(_, done)| done)>
                <p>
                    <a class="button" href=move || format!("/clusters/{}", cluster_link().map(|(n, _)| n).unwrap_or_default())>
                        "Open the cluster"
                    </a>
                </p>
            </Show>
        </div>
    }
}

/// `diagnose_operation` on demand, its answer shown by [`DiagnosisView`].
#[component]
fn DiagnosisPanel(operation_id: String) -> impl IntoView {
    let found = RwSignal::new(None::<Result<Diagnosis, ApiError>>);
    let busy = RwSignal::new(false);
    let diagnose = move |_| {
        let operation_id = operation_id.clone();
        busy.set(true);
        leptos::task::spawn_local(async move {
            found.set(Some(call(&DiagnoseOperation { operation_id }).await));
            busy.set(false);
        });
    };
    view! {
        <button class="diagnose" type="button" on:click=diagnose disabled=move || busy.get()>
            "Diagnose"
        </button>
        {move || found.get().map(|answer| match answer {
            Err(e) => Either::Left(view! { <ErrorDetail error=e/> }),
            Ok(found) => Either::Right(view! { <DiagnosisView found/> }),
        })}
    }
}

/// What changed from one snapshot of an operation to the next, in words for a screen
/// reader: each stage whose state moved, then the operation's end if it came.
fn changes(before: &Operation, after: &Operation) -> Option<String> {
    let mut said: Vec<String> = after
        .stages
        .iter()
        .filter(|s| {
            let was = before.stages.iter().find(|b| b.name == s.name);
            was.is_none_or(|b| b.state != s.state)
        })
        .map(|s| format!("{}: {}.", s.title, s.state.as_str()))
        .collect();
    if before.state != after.state && after.state.is_terminal() {
        said.push(format!(
            "{} {}.",
            command_title(&after.command),
            after.state.as_str()
        ));
    }
    (!said.is_empty()).then(|| said.join(" "))
}

fn settle(
    result: Result<Operation, ApiError>,
    answered: RwSignal<Option<Operation>>,
    action_error: RwSignal<Option<String>>,
    busy: RwSignal<bool>,
) {
    busy.set(false);
    match result {
        Ok(op) => answered.set(Some(op)),
        Err(e) => action_error.set(Some(e.to_string())),
    }
}

#[component]
fn StageRow(stage: Stage) -> impl IntoView {
    let live = use_live();
    let state = stage.state.as_str();
    let started = stage.started_at.clone();
    let finished = stage.finished_at.clone();
    let took = move || elapsed(started.as_deref(), finished.as_deref(), live.now.get());
    view! {
        <li class=format!("stage stage-{state}") data-stage=stage.name.clone() data-state=state>
            <span class="marker" aria-hidden="true"></span>
            <div class="stage-body">
                <div class="stage-head">
                    <span class="stage-title">{stage.title.clone()}</span>
                    <StateBadge state=state.to_owned()/>
                    {(stage.attempts > 1).then(|| view! { <span class="muted">{format!("attempt {}", stage.attempts)}</span> })}
                    <span class="spacer"></span>
                    <span class="elapsed muted">{move || took().unwrap_or_default()}</span>
                </div>
                {stage.message.clone().map(|m| view! { <p class="stage-message">{m}</p> })}
                {stage.next_poll_at.clone().filter(|_| state == "waiting").map(|t| view! {
                    <p class="muted">"Next check at " {short(&t)}</p>
                })}
                {stage.error.clone().map(|e| view! { <ErrorDetail error=e/> })}
            </div>
        </li>
    }
}

/// A failure as an operator needs it: for a provider failure the call that failed, the
/// provider's code and message and the request id to quote to support.
#[component]
pub(crate) fn ErrorDetail(error: ApiError) -> impl IntoView {
    match error {
        ApiError::Upstream {
            service,
            call,
            code,
            message,
            request_id,
            ..
        } => Either::Left(view! {
            <dl class="facts error-detail">
                <dt>"Failing call"</dt>
                <dd class="mono failing-call">{format!("{service}.{call}")}</dd>
                <dt>"Error code"</dt>
                <dd class="mono">{code.unwrap_or_else(|| "—".into())}</dd>
                <dt>"Provider's message"</dt>
                <dd class="provider-message">{message}</dd>
                <dt>"Request id"</dt>
                <dd class="mono">{request_id.map_or_else(|| "—".to_owned(), String::from)}</dd>
            </dl>
        }),
        other => Either::Right(view! { <p class="error provider-message">{other.to_string()}</p> }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snapshot(state: &str, stages: &[(&str, &str)]) -> Operation {
        let stages: Vec<serde_json::Value> = stages
            .iter()
            .map(|(name, state)| {
                serde_json::json!({
                    "name": name, "title": format!("The {name}"), "state": state, "attempts": 1,
                    "started_at": null, "finished_at": null, "next_poll_at": null,
                    "message": null, "error": null, "cancellable": false,
                })
            })
            .collect();
        serde_json::from_value(serde_json::json!({
            "operation_id": "op-1", "command": "import_cluster", "target": "cluster/x",
            "state": state, "requested_by": "admin", "created_at": "2026-01-01T00:00:00.000Z",
            "updated_at": "2026-01-01T00:00:01.000Z", "stages": stages, "outputs": {},
            "error": null, "retryable": false, "cancellable": false,
        }))
        .unwrap()
    }

    #[test]
    fn stage_changes_are_said_in_order_then_the_end() {
        let a = snapshot("running", &[("eks", "waiting"), ("access", "pending")]);
        let b = snapshot("running", &[("eks", "succeeded"), ("access", "running")]);
        assert_eq!(
            changes(&a, &b).as_deref(),
            Some("The eks: succeeded. The access: running.")
        );
        let c = snapshot(
            "succeeded",
            &[("eks", "succeeded"), ("access", "succeeded")],
        );
        assert_eq!(
            changes(&b, &c).as_deref(),
            Some("The access: succeeded. Import cluster succeeded.")
        );
        // Nothing moved (a new note, another attempt): nothing to say.
        assert_eq!(changes(&c, &c), None);
    }

    #[test]
    fn command_names_read_as_titles() {
        assert_eq!(command_title("import_cluster"), "Import cluster");
        assert_eq!(command_title(""), "");
    }
}
