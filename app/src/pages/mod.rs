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

pub fn loading() -> impl IntoView {
    view! { <p class="muted" aria-busy="true">"Loading…"</p> }
}
