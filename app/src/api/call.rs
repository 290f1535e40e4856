//! How the console calls commands: one server function that hands the command's name and
//! JSON input to the server's dispatch, which authenticates the session, validates and
//! runs it exactly as for REST and MCP. `call` gives pages a typed front on it.

use leptos::prelude::*;
use leptos::server_fn::codec::{Json, JsonEncoding};
use leptos::server_fn::error::{FromServerFnError, ServerFnErrorErr};

use super::command::Command;
use super::error::{ApiError, FieldError};

impl FromServerFnError for ApiError {
    type Encoder = JsonEncoding;

    fn from_server_fn_error(value: ServerFnErrorErr) -> Self {
        match value {
            // The request did not decode: the same kind of answer as a bad field.
            ServerFnErrorErr::Args(m)
            | ServerFnErrorErr::MissingArg(m)
            | ServerFnErrorErr::Deserialization(m) => ApiError::Validation {
                errors: vec![FieldError::new("", m)],
            },
            other => ApiError::Internal {
                message: other.to_string(),
            },
        }
    }
}

/// What the server provides to server functions: its dispatch, reached with the HTTP
/// request so the session cookie and Origin are checked there, in one place.
#[cfg(feature = "ssr")]
pub trait Dispatcher: Send + Sync {
    fn dispatch_http(
        &self,
        parts: http::request::Parts,
        command: String,
        input: serde_json::Value,
    ) -> std::pin::Pin<Box<dyn Future<Output = Result<serde_json::Value, ApiError>> + Send + '_>>;
}

#[cfg(feature = "ssr")]
pub type SharedDispatcher = std::sync::Arc<dyn Dispatcher>;

/// Runs any command for the console. Input and output are the command's JSON, so a bad
/// field gets the same error here as through REST or MCP.
#[server(prefix = "/fn", endpoint = "run_command", input = Json)]
pub async fn run_command(
    command: String,
    input: serde_json::Value,
) -> Result<serde_json::Value, ApiError> {
    let dispatcher = use_context::<SharedDispatcher>()
        .ok_or_else(|| ApiError::internal("dispatch is not available"))?;
    let parts = use_context::<http::request::Parts>()
        .ok_or_else(|| ApiError::internal("request is not available"))?;
    dispatcher.dispatch_http(parts, command, input).await
}

/// Calls a command from a page with its typed request.
pub async fn call<C: Command>(request: &C) -> Result<C::Output, ApiError> {
    let input = serde_json::to_value(request).map_err(ApiError::internal)?;
    let output = run_command(C::SPEC.name.to_owned(), input).await?;
    // Decoded from text rather than from the `Value`: resources hydrate their data from
    // text, so every output type then has one decoder in the wasm bundle instead of two.
    let text = serde_json::to_string(&output).map_err(ApiError::internal)?;
    serde_json::from_str(&text).map_err(ApiError::internal)
}
