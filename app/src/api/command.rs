//! What a command is, described once. From these descriptions the server builds its REST
//! routes, the OpenAPI document and the MCP tool list; the console calls commands through
//! one server function. Adding a command is: its request and output types, its `Command`
//! impl, one line in [`crate::for_each_command!`], and its handler in the server module
//! of its domain noun (a pipeline's handler is the generic one).

use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde::{Deserialize, Serialize, de::DeserializeOwned};

use super::error::ApiError;

/// What calling the command does to the world.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Effect {
    /// Reads only; safe to call any number of times.
    ReadOnly,
    /// Changes state; returns an operation (or a record) to follow.
    Mutating,
    /// Deletes or replaces something that cannot be recovered.
    Destructive,
}

/// Who may call what: each role includes the ones below it.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Read-only: inspection, lists, operation status.
    Viewer,
    /// Viewer plus every cluster, workload and operation mutation.
    Operator,
    /// Operator plus managing API tokens.
    Admin,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Operator => "operator",
            Role::Admin => "admin",
        }
    }

    pub fn parse(s: &str) -> Option<Role> {
        match s {
            "viewer" => Some(Role::Viewer),
            "operator" => Some(Role::Operator),
            "admin" => Some(Role::Admin),
            _ => None,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HttpMethod {
    Get,
    Post,
    Delete,
}

impl HttpMethod {
    pub fn as_str(self) -> &'static str {
        match self {
            HttpMethod::Get => "get",
            HttpMethod::Post => "post",
            HttpMethod::Delete => "delete",
        }
    }
}

/// The description of one command, shared by every face.
#[derive(Clone, Copy, Debug)]
pub struct CommandSpec {
    /// Tool name = REST operationId = the name the console dispatches.
    pub name: &'static str,
    /// One line.
    pub summary: &'static str,
    /// For agents: what it does, what it returns, and for mutations which tool to poll.
    pub description: &'static str,
    pub effect: Effect,
    /// The least role allowed to call it.
    pub role: Role,
    /// Calling it twice with the same input has the effect of calling it once.
    pub idempotent: bool,
    /// For mutations: the command that tells when the change is complete.
    pub status_command: Option<&'static str>,
    pub method: HttpMethod,
    /// REST path under the server root, with `{field}` taken from the request.
    pub path: &'static str,
}

impl CommandSpec {
    /// Names of the `{…}` segments of the path.
    pub fn path_params(&self) -> impl Iterator<Item = &'static str> {
        self.path
            .split('/')
            .filter_map(|seg| seg.strip_prefix('{').and_then(|s| s.strip_suffix('}')))
    }
}

/// A request type that is a command.
pub trait Command: Serialize + DeserializeOwned + JsonSchema + Send + Sync + 'static {
    type Output: Serialize + DeserializeOwned + JsonSchema + Send + Sync + 'static;
    const SPEC: CommandSpec;

    /// Rules across fields, beyond what each field's type already enforces.
    fn validate(&self) -> Result<(), ApiError> {
        Ok(())
    }
}

/// A command's description with its schemas, as the registry lists it.
#[derive(Clone, Copy)]
pub struct CommandEntry {
    pub spec: CommandSpec,
    pub request_schema: fn(&mut SchemaGenerator) -> Schema,
    pub output_schema: fn(&mut SchemaGenerator) -> Schema,
}

impl CommandEntry {
    pub const fn of<C: Command>() -> Self {
        CommandEntry {
            spec: C::SPEC,
            request_schema: request_schema::<C>,
            output_schema: output_schema::<C>,
        }
    }
}

fn request_schema<C: Command>(g: &mut SchemaGenerator) -> Schema {
    g.subschema_for::<C>()
}

fn output_schema<C: Command>(g: &mut SchemaGenerator) -> Schema {
    g.subschema_for::<C::Output>()
}

/// Decodes a request, naming the field that broke a rule by its path.
pub fn decode<C: Command>(input: serde_json::Value) -> Result<C, ApiError> {
    let input = if input.is_null() {
        serde_json::Value::Object(Default::default())
    } else {
        input
    };
    serde_path_to_error::deserialize::<_, C>(input).map_err(|e| {
        let path = e.path().to_string();
        let message = e.inner().to_string();
        // serde reports unknown and missing fields at their parent: name the field itself.
        let named = ["unknown field `", "missing field `"]
            .iter()
            .find_map(|p| message.strip_prefix(p))
            .and_then(|rest| rest.split('`').next());
        let field = match (path.as_str(), named) {
            (".", Some(f)) => f.to_owned(),
            (p, Some(f)) if p != f && !p.ends_with(&format!(".{f}")) => format!("{p}.{f}"),
            (".", None) => String::new(),
            (p, _) => p.to_owned(),
        };
        ApiError::Validation {
            errors: vec![super::error::FieldError::new(field, message)],
        }
    })
}
