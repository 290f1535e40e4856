//! The wasm entry of the console: it only hydrates what the server rendered, so all
//! markup and logic stay in `app` and are shared with server-side rendering.

// Leptos views are deeply nested types; their layouts need more than the default depth.
#![recursion_limit = "256"]

use leptos::mount::hydrate_from_async;
use leptos::prelude::document;
use wasm_bindgen::prelude::wasm_bindgen;

#[wasm_bindgen]
pub fn hydrate() {
    console_error_panic_hook::set_once();
    // Pages are lazy routes: hydration first loads the current page's wasm chunk, so it
    // finishes asynchronously. (Hydration sets up Leptos's own executor itself.)
    wasm_bindgen_futures::spawn_local(async {
        let body = document().body().expect("the page has a body");
        let app = hydrate_from_async(body, app::App).await;
        app.forget();
        // Only now may live changes reach the page: it has rendered the server's data.
        app::live::page_hydrated();
        // The mark tests (and anything else) wait for before they interact: every
        // handler of the page is attached once this is set, chunk included.
        if let Some(root) = document().document_element() {
            let _ = root.set_attribute("data-hydrated", "true");
        }
    });
}
