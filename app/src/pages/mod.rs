//! The console's pages. Each loads what it shows through `api::call` (the same dispatch
//! as REST and MCP) inside a resource, so the server renders it with data and the browser
//! picks up the same data when it hydrates; pages hold no business rules.

pub mod clusters;
pub mod create;
pub mod drift;
pub mod features;
pub mod groups;
pub mod import;
pub mod nodes;
pub mod operations;
pub mod overview;
mod progress;
pub mod tokens;

use leptos::either::EitherOf3;
use leptos::prelude::*;
use leptos_router::{LazyRoute, lazy_route};

use crate::api::inspect::WhoamiOutput;
use crate::api::{ApiError, CommandSpec};
use crate::session::{ErrorPanel, IfRole, use_me};

/// Declares a page as a lazily loaded route: console-build splits the wasm (wasm-split),
/// so its code (and the types only it decodes) ships as a separate wasm chunk that the
/// browser fetches when the route is first shown, so no page pays for every other page's
/// code. An unsplit build compiles the page in as usual. The page still creates its own
/// resources while it renders, so the server's data reaches it through hydration.
macro_rules! lazy_page {
    ($route:ident => $page:path) => {
        pub struct $route;

        #[lazy_route]
        impl LazyRoute for $route {
            fn data() -> Self {
                $route
            }

            fn view(_this: Self) -> AnyView {
                view! { <$page/> }.into_any()
            }
        }
    };
}

lazy_page!(ClusterListRoute => clusters::ClusterList);
lazy_page!(ClusterDetailRoute => clusters::ClusterDetail);
lazy_page!(CreateClusterRoute => create::CreateClusterPage);
lazy_page!(ImportClusterRoute => import::ImportClusterPage);
lazy_page!(OperationListRoute => operations::OperationList);
lazy_page!(OperationRoute => progress::OperationPage);
lazy_page!(TokensRoute => tokens::TokensPage);
lazy_page!(SignInRoute => crate::session::SignIn);
lazy_page!(OverviewRoute => overview::Overview);

/// A coloured status word: `state-<word>` (lowercased, so AWS's `ACTIVE` and
/// `InService` find their colour too, and spaces as `_`: `create failed` is
/// `state-create_failed`, like AWS's `CREATE_FAILED`) picks the colour, the text says it.
#[component]
pub fn StateBadge(#[prop(into)] state: Signal<String>) -> impl IntoView {
    view! {
        <span class=move || format!("badge state state-{}", state.with(|s| s.to_ascii_lowercase().replace(' ', "_")))>
            {state}
        </span>
    }
}

/// A data table that scrolls sideways in its own frame on narrow windows: a caption for
/// screen readers, a header row of `columns`, and the rows given as children.
#[component]
pub fn Table(
    class: &'static str,
    caption: &'static str,
    columns: &'static [&'static str],
    children: Children,
) -> impl IntoView {
    view! {
        <div class="table-wrap">
            <table class=format!("table {class}")>
                <caption class="visually-hidden">{caption}</caption>
                <thead>
                    <tr>{columns.iter().map(|c| view! { <th scope="col">{*c}</th> }).collect_view()}</tr>
                </thead>
                <tbody>{children()}</tbody>
            </table>
        </div>
    }
}

/// The frame of a page that exists to run one command (create, import): breadcrumbs and
/// title, then its form for a caller whose role reaches the command's own least role
/// (`spec.role`, the one the server checks); anyone else is told which role it needs, and
/// a caller without a session is offered sign-in.
#[component]
pub fn CommandPage(
    spec: CommandSpec,
    /// The breadcrumb's parent page: its address and name.
    parent: (&'static str, &'static str),
    crumb: &'static str,
    title: &'static str,
    children: ChildrenFn,
) -> impl IntoView {
    let me = use_me();
    let children = StoredValue::new(children);
    view! {
        <section class="page">
            <nav class="crumbs" aria-label="Breadcrumb">
                <a href=parent.0>{parent.1}</a>
                " / "
                <span aria-current="page">{crumb}</span>
            </nav>
            <header class="page-head">
                <h1>{title}</h1>
            </header>
            <Suspense fallback=loading>
                {move || Suspend::new(async move {
                    let who = match me {
                        Some(me) => me.await,
                        None => Err(ApiError::internal("no session context")),
                    };
                    match who {
                        Ok(w) if w.role >= spec.role => EitherOf3::A(children.read_value()()),
                        Ok(w) => EitherOf3::B(view! {
                            <div class="panel narrow" data-error="forbidden">
                                <p>{refusal(&spec, &w)}</p>
                            </div>
                        }),
                        Err(e) => EitherOf3::C(view! { <ErrorPanel error=e/> }),
                    }
                })}
            </Suspense>
        </section>
    }
}

/// Why a caller gets no form: the server's own wording for the refusal, with who asked.
fn refusal(spec: &CommandSpec, who: &WhoamiOutput) -> String {
    format!(
        "{} needs the {} role; token {} has {}.",
        spec.name,
        spec.role.as_str(),
        who.token_name,
        who.role.as_str()
    )
}

/// A link to a command's page, offered only to callers whose role reaches the command's.
#[component]
pub fn CommandLink(spec: CommandSpec, href: &'static str, label: &'static str) -> impl IntoView {
    view! {
        <IfRole role=spec.role>
            <a class="button primary" href=href>{label}</a>
        </IfRole>
    }
}

pub fn loading() -> impl IntoView {
    view! { <p class="muted" aria-busy="true">"Loading…"</p> }
}

/// What a destructive command will do, as its first (unconfirmed) call answered: the
/// changes grouped by stage, stages with nothing to do left out. Shown in the
/// confirmation before the second call, so nobody confirms what they have not seen.
#[component]
pub fn PlanView(plan: crate::api::plan::Plan) -> impl IntoView {
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

/// A create or import form's two steps: the first submit sends the request as a dry run
/// and shows its plan, the second runs exactly that request. Editing the form goes back
/// to the first step, so what runs is what was reviewed.
#[derive(Clone, Copy)]
pub struct Review(RwSignal<Option<crate::api::plan::Plan>>);

impl Default for Review {
    fn default() -> Self {
        Review(RwSignal::new(None))
    }
}

impl Review {
    pub fn reviewing(self) -> bool {
        self.0.with(Option::is_some)
    }

    pub fn reset(self) {
        if self.0.with_untracked(Option::is_some) {
            self.0.set(None);
        }
    }

    /// Sends `request`: for its plan first (`dry_run` set by `dry`), for real once the
    /// plan is shown. The operation when it ran, `None` when the plan is now shown.
    pub async fn send<C>(
        self,
        mut request: C,
        dry: impl FnOnce(&mut C),
    ) -> Result<Option<crate::api::operations::OperationRef>, ApiError>
    where
        C: crate::api::Command<
                Output = crate::api::plan::Gated<crate::api::operations::OperationRef>,
            >,
    {
        use crate::api::plan::Gated;
        if !self.reviewing() {
            dry(&mut request);
        }
        match crate::api::call::call(&request).await? {
            Gated::Done(op) => Ok(Some(op)),
            Gated::DryRun(d) => {
                self.0.set(Some(d.plan));
                Ok(None)
            }
            Gated::ConfirmationRequired(c) => {
                self.0.set(Some(c.plan));
                Ok(None)
            }
        }
    }
}

/// The end of a reviewed form: the plan a [`Review`] holds once the first submit fetched
/// it, and the submit button, which asks for the plan first and runs it second.
#[component]
pub fn ReviewActions(
    form: crate::form::FormState,
    review: Review,
    /// The command as the button says it, e.g. "Create cluster".
    run: &'static str,
    /// The button while the command is being sent, e.g. "Creating…".
    running: &'static str,
    cancel: &'static str,
) -> impl IntoView {
    let plan = move || {
        review.0.get().map(|plan| {
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
            <button class="primary" type="submit" disabled=move || form.busy.get()>
                {move || match (form.busy.get(), review.reviewing()) {
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
