//! The console's pages. Each loads what it shows through `api::call` (the same dispatch
//! as REST and MCP) inside a resource, so the server renders it with data and the browser
//! picks up the same data when it hydrates; pages hold no business rules.

pub mod cluster;
pub mod clusters;
pub mod create;
mod diagnosis;
pub mod drift;
pub mod features;
pub mod gate;
pub mod groups;
pub mod import;
pub mod inference;
pub mod models;
pub mod nodes;
pub mod operations;
pub mod overview;
mod progress;
pub mod storage;
pub mod tokens;
pub mod training;

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
lazy_page!(ClusterOverviewRoute => cluster::OverviewTab);
lazy_page!(ClusterNodesRoute => cluster::NodesTab);
lazy_page!(ClusterFeaturesRoute => cluster::FeaturesTab);
lazy_page!(ClusterStorageRoute => cluster::StorageTab);
lazy_page!(ClusterModelsRoute => cluster::ModelsTab);
lazy_page!(ClusterTrainingRoute => cluster::TrainingTab);
lazy_page!(ClusterInferenceRoute => cluster::InferenceTab);
lazy_page!(ClusterDriftRoute => cluster::DriftTab);
lazy_page!(ClusterOperationsRoute => cluster::OperationsTab);
lazy_page!(CreateClusterRoute => create::CreateClusterPage);
lazy_page!(ImportClusterRoute => import::ImportClusterPage);
lazy_page!(OperationListRoute => operations::OperationList);
lazy_page!(EndpointsRoute => inference::EndpointsPage);
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
