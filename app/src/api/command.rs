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

    /// True when the caller asked only for the plan (`dry_run: true`).
    fn dry_run(&self) -> bool {
        false
    }

    /// The confirmation a destructive command was sent with. A destructive command
    /// whose request does not carry one never runs: every call answers with its plan.
    fn confirmation(&self) -> Option<&super::values::Confirmation> {
        None
    }

    /// This request runs only with a confirmation: every request of a destructive
    /// command, unless the command knows which of its requests remove nothing.
    fn needs_confirmation(&self) -> bool {
        Self::SPEC.effect == Effect::Destructive
    }

    /// Drops `dry_run` and `confirmation`: what is left is the request a confirmation is
    /// bound to, and what an operation stores.
    fn clear_gate(&mut self) {}

    /// Sets `dry_run` and `confirmation` where the request has them: how the console
    /// sends one request for its plan first and to run second.
    fn set_gate(&mut self, _dry_run: bool, _confirmation: Option<super::values::Confirmation>) {}

    /// Blanks the secrets a request carries (a token) in its JSON, wherever hypd keeps
    /// or derives something from a request: the audit log and the hash that tells a
    /// repeated request. Requests with no secret keep everything.
    fn redact(_request: &mut serde_json::Value) {}
}

/// The `Command` methods of a request with `dry_run: bool` and `confirmation:
/// Option<Confirmation>` fields: every destructive command's.
macro_rules! gated_request {
    () => {
        fn dry_run(&self) -> bool {
            self.dry_run
        }

        fn confirmation(&self) -> Option<&$crate::api::values::Confirmation> {
            self.confirmation.as_ref()
        }

        fn clear_gate(&mut self) {
            self.dry_run = false;
            self.confirmation = None;
        }

        fn set_gate(
            &mut self,
            dry_run: bool,
            confirmation: Option<$crate::api::values::Confirmation>,
        ) {
            self.dry_run = dry_run;
            self.confirmation = confirmation;
        }
    };
}
pub(crate) use gated_request;

/// The `Command` methods of a request with a `dry_run: bool` field: every mutating
/// command that is not destructive (it runs without a confirmation).
macro_rules! dry_run_request {
    () => {
        fn dry_run(&self) -> bool {
            self.dry_run
        }

        fn clear_gate(&mut self) {
            self.dry_run = false;
        }

        fn set_gate(&mut self, dry_run: bool, _: Option<$crate::api::values::Confirmation>) {
            self.dry_run = dry_run;
        }
    };
}
pub(crate) use dry_run_request;

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
///
/// Objects must be objects: serde's derived structs also accept an array, filled by
/// position (`"network": ["10.0.0.0/16"]` would be `vpc_cidr`), so the input is first
/// held against the request's JSON Schema, which knows where an object is expected.
/// Messages and paths that quote the input are cut, so an error stays small whatever
/// the request held.
pub fn decode<C: Command>(input: serde_json::Value) -> Result<C, ApiError> {
    let input = if input.is_null() {
        serde_json::Value::Object(Default::default())
    } else {
        input
    };
    #[cfg(not(target_arch = "wasm32"))]
    shape::check(C::SPEC.name, shape::schema_of::<C>, &input)?;
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
            errors: vec![super::error::FieldError::new(
                cut(&field, FIELD_MAX),
                cut(&cut_quotes(&message), MESSAGE_MAX),
            )],
        }
    })
}

/// The longest field path an error names (a path is built from the request's keys).
const FIELD_MAX: usize = 128;
/// The longest message an error carries.
const MESSAGE_MAX: usize = 1024;

/// `s` cut to `max` characters, marked with `…` when cut.
fn cut(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        None => s.to_owned(),
        Some((at, _)) => format!("{}…", &s[..at]),
    }
}

/// Shortens what serde quotes from the input (`` `name` `` and `"value"`, escapes
/// included) to [`super::values::SHOWN_CHARS`] characters.
fn cut_quotes(message: &str) -> String {
    let limit = super::values::SHOWN_CHARS;
    let mut out = String::with_capacity(message.len().min(MESSAGE_MAX + 8));
    let mut chars = message.chars().peekable();
    while let Some(c) = chars.next() {
        out.push(c);
        if c != '`' && c != '"' {
            continue;
        }
        let mut kept = 0;
        let mut dropped = false;
        let mut escaped = false;
        for q in chars.by_ref() {
            let closes = q == c && !escaped;
            escaped = c == '"' && q == '\\' && !escaped;
            if closes {
                if dropped {
                    out.push('…');
                }
                out.push(q);
                break;
            }
            if kept < limit {
                out.push(q);
                kept += 1;
            } else {
                dropped = true;
            }
        }
    }
    out
}

/// Where the request's JSON Schema expects an object, an array is refused (native only:
/// in the browser the forms build their requests as typed values, and the check would
/// bring the schema generator into the bundle).
#[cfg(not(target_arch = "wasm32"))]
mod shape {
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex, OnceLock};

    use schemars::SchemaGenerator;
    use serde_json::{Map, Value};

    use super::{ApiError, Command};
    use crate::api::error::FieldError;

    /// The request's schema and its definitions.
    pub struct Shapes {
        root: Value,
        defs: Map<String, Value>,
    }

    pub fn schema_of<C: Command>() -> Shapes {
        let mut generator = SchemaGenerator::default();
        let root = serde_json::to_value(generator.subschema_for::<C>()).unwrap_or_default();
        let defs = generator.take_definitions(true);
        Shapes { root, defs }
    }

    /// Schemas are built once per command: decoding is on every request's path.
    fn cached(name: &'static str, build: fn() -> Shapes) -> Arc<Shapes> {
        static CACHE: OnceLock<Mutex<HashMap<&'static str, Arc<Shapes>>>> = OnceLock::new();
        let cache = CACHE.get_or_init(Default::default);
        if let Some(found) = cache.lock().ok().and_then(|c| c.get(name).cloned()) {
            return found;
        }
        let built = Arc::new(build());
        if let Ok(mut c) = cache.lock() {
            c.insert(name, built.clone());
        }
        built
    }

    pub fn check(name: &'static str, build: fn() -> Shapes, input: &Value) -> Result<(), ApiError> {
        let shapes = cached(name, build);
        let mut path = String::new();
        match walk(&shapes, &shapes.root, input, &mut path) {
            Some(field) => Err(ApiError::Validation {
                errors: vec![FieldError::new(
                    super::cut(&field, super::FIELD_MAX),
                    "must be a JSON object ({…}), not an array",
                )],
            }),
            None => Ok(()),
        }
    }

    /// The schemas `schema` stands for: itself with `$ref`s followed, and every branch of
    /// `anyOf`/`oneOf`/`allOf` (how optional fields and tagged enums appear).
    fn branches<'a>(shapes: &'a Shapes, schema: &'a Value, out: &mut Vec<&'a Value>, depth: u8) {
        if depth > 16 {
            return;
        }
        let schema = match schema.get("$ref").and_then(Value::as_str) {
            Some(r) => match shapes.defs.get(r.rsplit('/').next().unwrap_or_default()) {
                Some(def) => def,
                None => return,
            },
            None => schema,
        };
        out.push(schema);
        for key in ["anyOf", "oneOf", "allOf"] {
            for sub in schema
                .get(key)
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                branches(shapes, sub, out, depth + 1);
            }
        }
    }

    fn admits(schemas: &[&Value], kind: &str) -> bool {
        schemas.iter().any(|s| match s.get("type") {
            Some(Value::String(t)) => t == kind,
            Some(Value::Array(ts)) => ts.iter().any(|t| t == kind),
            _ => false,
        })
    }

    /// The path of the first array found where only an object is allowed.
    fn walk(shapes: &Shapes, schema: &Value, value: &Value, path: &mut String) -> Option<String> {
        let mut schemas = Vec::new();
        branches(shapes, schema, &mut schemas, 0);
        match value {
            Value::Array(items) => {
                if admits(&schemas, "object") && !admits(&schemas, "array") {
                    return Some(path.clone());
                }
                let item_schema = schemas.iter().find_map(|s| s.get("items"))?;
                for (i, item) in items.iter().enumerate() {
                    let len = path.len();
                    path.push_str(&format!("[{i}]"));
                    let found = walk(shapes, item_schema, item, path);
                    path.truncate(len);
                    if found.is_some() {
                        return found;
                    }
                }
                None
            }
            Value::Object(map) => {
                for (key, child) in map {
                    let Some(child_schema) = schemas
                        .iter()
                        .find_map(|s| s.get("properties").and_then(|p| p.get(key)))
                    else {
                        continue;
                    };
                    let len = path.len();
                    if !path.is_empty() {
                        path.push('.');
                    }
                    path.push_str(key);
                    let found = walk(shapes, child_schema, child, path);
                    path.truncate(len);
                    if found.is_some() {
                        return found;
                    }
                }
                None
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::clusters::CreateCluster;
    use crate::api::tokens::CreateToken;
    use serde_json::json;

    fn error_of<C: Command + std::fmt::Debug>(input: serde_json::Value) -> (String, String) {
        match decode::<C>(input) {
            Err(ApiError::Validation { errors }) => {
                (errors[0].field.clone(), errors[0].message.clone())
            }
            other => panic!("{other:?}"),
        }
    }

    fn cluster(extra: serde_json::Value) -> serde_json::Value {
        let mut v = json!({"name": "ml-1", "availability_zone": "us-east-1a",
            "instance_groups": [{"name": "gpu", "instance_type": "ml.g5.8xlarge",
                "instance_count": 1}]});
        v.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        v
    }

    #[test]
    fn arrays_are_not_objects() {
        for (field, value) in [
            ("network", json!([])),
            ("network", json!(["10.0.0.0/16"])),
            ("storage", json!([])),
        ] {
            let (f, message) = error_of::<CreateCluster>(cluster(json!({ field: value })));
            assert_eq!(f, field);
            assert_eq!(message, "must be a JSON object ({…}), not an array");
        }
        let mut spot_list = cluster(json!({}));
        spot_list["instance_groups"][0]["capacity"] = json!(["spot"]);
        assert_eq!(
            error_of::<CreateCluster>(spot_list),
            (
                "instance_groups[0].capacity".to_owned(),
                "must be a JSON object ({…}), not an array".to_owned()
            )
        );
        // Arrays where arrays belong, and objects where objects belong, still decode.
        assert!(
            decode::<CreateCluster>(cluster(json!({"network": {"vpc_cidr": "10.1.0.0/16"}})))
                .is_ok()
        );
        assert!(
            decode::<crate::api::inspect::ListInstanceTypes>(
                json!({"instance_types": ["p5.48xlarge"]})
            )
            .is_ok()
        );
        let (f, _) = error_of::<CreateToken>(json!(["ci", "admin"]));
        assert_eq!(f, "", "the request itself must be an object");
    }

    #[test]
    fn errors_quote_only_the_start_of_a_value() {
        let long = "x".repeat(100_000);
        let (field, message) = error_of::<CreateToken>(json!({"name": "ci", "role": long}));
        assert_eq!(field, "role");
        assert!(message.len() < 300, "{message}");
        assert!(message.starts_with("unknown variant `xxxx"), "{message}");
        assert!(message.contains("x…`"), "{message}");
        let (field, message) = error_of::<CreateToken>(json!({ long.clone(): 1 }));
        assert!(field.len() < 200 && field.ends_with('…'), "{field}");
        assert!(message.len() < 400, "{message}");
    }
}
