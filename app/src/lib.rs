//! The hypd console: pages rendered on the server and hydrated in the browser. It compiles
//! to wasm as well as natively, so nothing here may depend on tokio, AWS or the store;
//! whatever the server knows reaches the pages through server functions.

pub mod api;
pub mod console;
pub mod form;
pub mod live;
pub mod pages;
pub mod session;
pub mod text;
pub mod time;

pub use console::{App, ConsoleInfo, shell};
