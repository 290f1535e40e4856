//! hypd's faces and the process around them: the HTTP router (`http`) serving the console,
//! REST (`rest`, described by `openapi`) and MCP (`mcp`) on one port, the live channel
//! (`events`), the stdio bridge `hypd mcp` (`bridge`), the accept loop (`listener`), what a
//! caller may ask on the way in (`limits`), and the command line (`cli`). They reach the
//! product only through the service layer (`crate::service`): nothing below imports them.

pub mod bridge;
pub mod cli;
pub mod errors;
pub mod events;
pub mod http;
pub mod limits;
pub mod listener;
pub mod logs;
pub mod mcp;
pub mod openapi;
pub mod rest;
pub mod state;
