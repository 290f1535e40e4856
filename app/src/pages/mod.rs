//! The console's pages. Each loads what it shows through `api::call` (the same dispatch
//! as REST and MCP) inside a resource, so the server renders it with data and the browser
//! picks up the same data when it hydrates; pages hold no business rules.

pub mod clusters;
pub mod create;
pub mod import;
pub mod operations;
mod progress;
pub mod tokens;

use leptos::prelude::*;
use leptos_router::{LazyRoute, lazy_route};

/// Declares a page as a lazily loaded route: built with `cargo leptos build --split`, its
/// code (and the types only it decodes) ships as a separate wasm chunk that the browser
/// fetches when the route is first shown, so no page pays for every other page's code.
/// Without `--split` the page is compiled in as usual. The page still creates its own
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
lazy_page!(OverviewRoute => crate::console::Overview);

/// A coloured status word: `state-<word>` (lowercased, so AWS's `ACTIVE` and
/// `InService` find their colour too) picks the colour, the text says it.
#[component]
pub fn StateBadge(#[prop(into)] state: Signal<String>) -> impl IntoView {
    view! {
        <span class=move || format!("badge state state-{}", state.with(|s| s.to_ascii_lowercase()))>
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

pub fn loading() -> impl IntoView {
    view! { <p class="muted" aria-busy="true">"Loading…"</p> }
}
