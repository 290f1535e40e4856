//! The wasm entry of the console: it only hydrates what the server rendered, so all
//! markup and logic stay in `app` and are shared with server-side rendering.

// Leptos views are deeply nested types; their layouts need more than the default depth.
#![recursion_limit = "256"]

use wasm_bindgen::prelude::wasm_bindgen;

#[wasm_bindgen]
pub fn hydrate() {
    console_error_panic_hook::set_once();
    leptos::mount::hydrate_body(app::App);
}
