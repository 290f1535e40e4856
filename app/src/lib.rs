//! The hypd console: pages rendered on the server and hydrated in the browser. It compiles
//! to wasm as well as natively, so nothing here may depend on tokio, AWS or the store;
//! whatever the server knows reaches the pages through server functions.
// The hydrating build lays out each view's async hydration, whose type nests as deep as
// the view (a table row with inputs, buttons and a plan); the frontend crate needs the
// same for the shell.
#![recursion_limit = "256"]

pub mod api;
pub mod console;
pub mod form;
pub mod live;
pub mod pages;
pub mod session;
pub mod text;
pub mod time;

pub use console::{App, ConsoleInfo, shell};
