//! "Plan, then run": the one way the console sends a command that changes something. The
//! first send asks for the plan (a dry run, or for a destructive command the plan that
//! comes with its confirmation) and shows it; the second sends exactly that request again,
//! with the confirmation when one was given. Requests are the commands' own types, made
//! from inputs by the commands' own decoding and rules (`form::check`), so a bad value
//! gets the field error the server would give; any edit goes back to the first step, so
//! what runs is what was reviewed.

use leptos::prelude::*;
use leptos_router::hooks::use_navigate;

use crate::api::call::call;
use crate::api::operations::OperationRef;
use crate::api::plan::{Gated, Plan};
use crate::api::values::Confirmation;
use crate::api::{ApiError, Command};
use crate::form::{FormState, Input, check, request};
use crate::session::ErrorPanel;

/// Where one gated action stands: the plan it was shown, the confirmation that came with
/// it, the last error, and whether a call is on its way.
#[derive(Clone, Copy)]
pub struct Gate {
    plan: RwSignal<Option<Plan>>,
    confirmation: RwSignal<Option<Confirmation>>,
    error: RwSignal<Option<ApiError>>,
    busy: RwSignal<bool>,
    /// Opens an operation's page once one started.
    open: Callback<String>,
}

impl Default for Gate {
    /// Inside a component: it takes the router's navigation from there.
    fn default() -> Self {
        let navigate = use_navigate();
        Gate {
            plan: RwSignal::new(None),
            confirmation: RwSignal::new(None),
            error: RwSignal::new(None),
            busy: RwSignal::new(false),
            open: Callback::new(move |path: String| navigate(&path, Default::default())),
        }
    }
}

impl Gate {
    /// A plan is shown: the next send runs it (tracked).
    pub fn reviewing(self) -> bool {
        self.plan.with(Option::is_some)
    }

    /// A call is on its way (tracked).
    pub fn busy(self) -> bool {
        self.busy.get()
    }

    /// Back to the first step: the request changed, or the user kept things as they are.
    pub fn reset(self) {
        if self.plan.with_untracked(Option::is_some) {
            self.plan.set(None);
        }
        self.confirmation.set(None);
    }

    /// Sends `request`: for its plan on the first step (`dry_run`, unless the command
    /// asks for a confirmation of this request, whose first answer is its plan), for real
    /// on the second, with the confirmation the first answer gave. What the command
    /// returned once it ran; `None` while its plan is shown. The caller shows the error.
    pub async fn send<C, T>(self, mut request: C) -> Result<Option<T>, ApiError>
    where
        C: Command<Output = Gated<T>>,
    {
        if self.plan.with_untracked(Option::is_some) {
            request.set_gate(false, self.confirmation.get_untracked());
        } else {
            request.set_gate(!request.needs_confirmation(), None);
        }
        self.busy.set(true);
        let answer = call(&request).await;
        self.busy.set(false);
        match answer? {
            Gated::Done(done) => {
                self.reset();
                Ok(Some(done))
            }
            Gated::DryRun(d) => {
                self.plan.set(Some(d.plan));
                Ok(None)
            }
            Gated::ConfirmationRequired(c) => {
                self.confirmation.set(Some(c.confirmation));
                self.plan.set(Some(c.plan));
                Ok(None)
            }
        }
    }

    /// For an action whose result is an operation: sends the request made of `inputs`
    /// (paths of the request and their values), and once it runs opens the operation's
    /// page; a bad input or a refusal is shown by [`Gate::view`].
    pub fn start<C>(self, inputs: &[(String, Input)])
    where
        C: Command<Output = Gated<OperationRef>>,
    {
        self.error.set(None);
        let request = check::<C>(request(inputs));
        leptos::task::spawn_local(async move {
            let sent = match request {
                Ok(r) => self.send(r).await,
                Err(e) => Err(e),
            };
            match sent {
                Ok(Some(op)) => self.open.run(format!("/operations/{}", op.operation_id)),
                Ok(None) => {}
                Err(e) => self.error.set(Some(e)),
            }
        });
    }

    /// For a form (create, import): sends the request `checked` makes once its checks
    /// pass, and once it runs opens the operation's page; an error is shown beside the
    /// form's inputs.
    pub fn submit<C>(
        self,
        form: FormState,
        checked: impl std::future::Future<Output = Result<C, ApiError>> + 'static,
    ) where
        C: Command<Output = Gated<OperationRef>>,
    {
        form.clear();
        self.busy.set(true);
        leptos::task::spawn_local(async move {
            let sent = match checked.await {
                Ok(r) => self.send(r).await,
                Err(e) => Err(e),
            };
            self.busy.set(false);
            match sent {
                Ok(Some(op)) => self.open.run(format!("/operations/{}", op.operation_id)),
                Ok(None) => {}
                Err(e) => form.show(e),
            }
        });
    }

    /// An input handler that keeps the typed value in `signal` and goes back to the
    /// first step: what runs is what was reviewed.
    pub fn edit(self, signal: RwSignal<String>) -> impl Fn(leptos::ev::Event) + Copy {
        move |ev| {
            signal.set(event_target_value(&ev));
            self.reset();
        }
    }

    /// Shows `error` under the gate's plan (for callers that send with [`Gate::send`]).
    pub fn fail(self, error: ApiError) {
        self.error.set(Some(error));
    }

    /// The plan while one is shown, and the last error.
    pub fn view(self) -> impl IntoView {
        view! {
            {move || self.plan.get().map(|plan| view! { <PlanView plan/> })}
            {move || self.error.get().map(|error| view! { <ErrorPanel error/> })}
        }
    }
}

/// A text input's value at `path`.
pub fn text(path: impl Into<String>, value: impl Into<String>) -> (String, Input) {
    (path.into(), Input::Text(value.into()))
}

/// A whole number typed at `path` (text that is not one is sent as typed: the request's
/// type names the rule).
pub fn integer(path: impl Into<String>, value: impl Into<String>) -> (String, Input) {
    (path.into(), Input::Integer(value.into()))
}

/// A number that may have a fraction, typed at `path` (sent as typed if it is none).
pub fn number(path: impl Into<String>, value: impl Into<String>) -> (String, Input) {
    (path.into(), Input::Number(value.into()))
}

/// A checkbox at `path`.
pub fn flag(path: impl Into<String>, on: bool) -> (String, Input) {
    (path.into(), Input::Flag(on))
}

/// The end of a reviewed form (create, import): the plan once the first submit fetched
/// it, and the submit button, which asks for the plan first and runs it second.
#[component]
pub fn GateActions(
    gate: Gate,
    /// The command as the button says it, e.g. "Create cluster".
    run: &'static str,
    /// The button while the command is being sent, e.g. "Creating…".
    running: &'static str,
    cancel: &'static str,
) -> impl IntoView {
    let plan = move || {
        gate.plan.get().map(|plan| {
            view! {
                <section class="review" aria-labelledby="review-title">
                    <h2 id="review-title">"Review the plan"</h2>
                    <p class="hint">"Nothing has been made yet. Submit again to run exactly this; change the form to plan again."</p>
                    <PlanView plan/>
                </section>
            }
            .into_any()
        })
    };
    // Type-erased: the forms around it are deep enough already.
    view! {
        {plan}
        <div class="actions">
            <button class="primary" type="submit" disabled=move || gate.busy()>
                {move || match (gate.busy(), gate.reviewing()) {
                    (true, false) => "Planning…",
                    (true, true) => running,
                    (false, false) => "Review plan",
                    (false, true) => run,
                }}
            </button>
            <a class="button" href=cancel>"Cancel"</a>
        </div>
    }
    .into_any()
}

/// What a command will do, as its first call answered: the changes grouped by stage,
/// stages with nothing to do left out. Shown before the second call, so nobody runs or
/// confirms what they have not seen.
#[component]
pub fn PlanView(plan: Plan) -> impl IntoView {
    let total = plan.changes().count();
    let stages = plan
        .stages
        .into_iter()
        .filter(|s| !s.changes.is_empty())
        .map(|s| {
            let changes = s
                .changes
                .into_iter()
                .map(|c| {
                    let action = c.action.as_str();
                    let fields = (!c.fields.is_empty()).then(|| {
                        let fields = c
                            .fields
                            .into_iter()
                            .map(|f| view! {
                                <li><code>{f.field}</code>" "{shown(f.old)}" → "{shown(f.new)}</li>
                            })
                            .collect_view();
                        view! { <ul class="plan-fields">{fields}</ul> }
                    });
                    view! {
                        <li data-action=action data-kind=c.kind.clone()>
                            <span class=format!("badge action-{action}")>{action}</span>
                            " "
                            <code>{c.kind.clone()}</code>
                            " "
                            {c.namespace.map(|ns| format!("{ns}/"))}
                            {c.name}
                            {fields}
                        </li>
                    }
                })
                .collect_view();
            view! {
                <li class="plan-stage" data-stage=s.stage>
                    <span class="plan-stage-title">{s.title}</span>
                    <ul class="plan-changes">{changes}</ul>
                </li>
            }
        })
        .collect_view();
    view! {
        <div class="plan" aria-label="Plan">
            <p class="muted">
                {match total {
                    0 => "Nothing to do: everything is already as asked.".to_owned(),
                    1 => "1 change:".to_owned(),
                    n => format!("{n} changes:"),
                }}
            </p>
            <ol class="plan-stages">{stages}</ol>
        </div>
    }
}

/// A plan field's value as a line shows it: JSON, cut to a line's worth; `—` for none.
fn shown(v: Option<serde_json::Value>) -> String {
    const MAX: usize = 80;
    let Some(v) = v else {
        return "—".to_owned();
    };
    let text = match v {
        serde_json::Value::String(s) => s,
        other => other.to_string(),
    };
    match text.char_indices().nth(MAX) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text,
    }
}
