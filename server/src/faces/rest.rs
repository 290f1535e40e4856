//! REST under `/api/v1`, generated from the command registry: one route per command, one
//! generic handler. Path segments, query parameters and the JSON body are merged into
//! the command's input and handed to `dispatch`, so REST validates exactly like MCP and
//! the console.

use std::collections::HashMap;
use std::sync::Arc;

use app::api::{ApiError, COMMANDS, CommandEntry, FieldError, HttpMethod};
use axum::Router;
use axum::body::Bytes;
use axum::extract::path::ErrorKind;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, Method, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, delete, get, post};
use serde_json::{Map, Value};

use crate::auth::Face;
use crate::faces::errors::error_response;
use crate::faces::state::AppState;
use app::text::form_decode;

/// How a query parameter's text becomes JSON, from the request schema.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Boolean,
    Integer,
    Array,
    Text,
}

/// Field kinds of a command's request, read from its JSON Schema once at start-up.
fn field_kinds(entry: &CommandEntry) -> HashMap<String, Kind> {
    let mut generator = schemars::SchemaGenerator::default();
    let schema = serde_json::to_value((entry.request_schema)(&mut generator)).unwrap_or_default();
    let defs = serde_json::to_value(generator.definitions()).unwrap_or_default();
    let resolve = |s: &Value| -> Value {
        match s.get("$ref").and_then(Value::as_str) {
            Some(r) => defs
                .get(r.rsplit('/').next().unwrap_or_default())
                .cloned()
                .unwrap_or_default(),
            None => s.clone(),
        }
    };
    let root = resolve(&schema);
    let mut kinds = HashMap::new();
    if let Some(props) = root.get("properties").and_then(Value::as_object) {
        for (name, prop) in props {
            let mut types = Vec::new();
            collect_types(prop, &resolve, &mut types);
            let types: Vec<&str> = types.iter().map(String::as_str).collect();
            let kind = if types.contains(&"boolean") {
                Kind::Boolean
            } else if types.contains(&"integer") {
                Kind::Integer
            } else if types.contains(&"array") {
                Kind::Array
            } else {
                Kind::Text
            };
            kinds.insert(name.clone(), kind);
        }
    }
    kinds
}

/// The JSON types a schema admits, through `$ref`, `anyOf` and `oneOf` (how optional
/// and newtype fields appear).
fn collect_types(schema: &Value, resolve: &dyn Fn(&Value) -> Value, out: &mut Vec<String>) {
    let schema = resolve(schema);
    match schema.get("type") {
        Some(Value::String(t)) => out.push(t.clone()),
        Some(Value::Array(ts)) => {
            out.extend(ts.iter().filter_map(Value::as_str).map(str::to_owned))
        }
        _ => {}
    }
    for key in ["anyOf", "oneOf", "allOf"] {
        for sub in schema
            .get(key)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            collect_types(sub, resolve, out);
        }
    }
}

/// Query text to JSON by the field's kind. Values that do not parse are passed on as
/// text, so the command's own decoding reports them with the field's rule. Numbers are
/// read as JSON reads them (`1e9`, `2.5`, `-1`), so an out-of-range or fractional value
/// reaches the field's rule exactly as it would from an MCP or console call.
fn query_value(kind: Kind, raw: &str) -> Value {
    match kind {
        Kind::Boolean => match raw {
            "true" | "1" => Value::Bool(true),
            "false" | "0" => Value::Bool(false),
            _ => Value::String(raw.to_owned()),
        },
        Kind::Integer => serde_json::from_str::<serde_json::Number>(raw)
            .map_or_else(|_| Value::String(raw.to_owned()), Value::Number),
        Kind::Array | Kind::Text => Value::String(raw.to_owned()),
    }
}

/// A field given in two places would otherwise be decided by which place is merged
/// last (`?role=admin` beating `{"role": "viewer"}`): refuse it instead.
fn twice(field: &str, first: &str, second: &str) -> FieldError {
    FieldError::new(
        field,
        format!("given in both the {first} and the {second}: send it in one place"),
    )
}

fn build_input(
    kinds: &HashMap<String, Kind>,
    path: HashMap<String, String>,
    query: Option<&str>,
    body: &[u8],
) -> Result<Value, ApiError> {
    let mut input: Map<String, Value> = if body.iter().all(u8::is_ascii_whitespace) {
        Map::new()
    } else {
        match serde_json::from_slice::<Value>(body) {
            Ok(Value::Object(map)) => map,
            Ok(_) => {
                return Err(ApiError::field(
                    "",
                    "the request body must be a JSON object",
                ));
            }
            Err(e) => {
                return Err(ApiError::field(
                    "",
                    format!("the request body is not valid JSON: {e}"),
                ));
            }
        }
    };
    let mut errors = Vec::new();
    let from_body: Vec<String> = input.keys().cloned().collect();
    let mut from_query: Vec<String> = Vec::new();
    for (key, raw) in form_pairs(query.unwrap_or_default()) {
        let kind = kinds.get(&key).copied().unwrap_or(Kind::Text);
        let value = query_value(kind, &raw);
        if from_body.contains(&key) {
            if !errors.iter().any(|e: &FieldError| e.field == key) {
                errors.push(twice(&key, "query string", "body"));
            }
            continue;
        }
        if kind == Kind::Array {
            if let Value::Array(items) = input
                .entry(key.clone())
                .or_insert_with(|| Value::Array(Vec::new()))
            {
                items.push(value);
            }
        } else if from_query.contains(&key) {
            if !errors.iter().any(|e: &FieldError| e.field == key) {
                errors.push(FieldError::new(
                    &key,
                    "given more than once in the query string: send it once",
                ));
            }
        } else {
            input.insert(key.clone(), value);
        }
        from_query.push(key);
    }
    let mut path: Vec<(String, String)> = path.into_iter().collect();
    path.sort();
    for (key, value) in path {
        if from_body.contains(&key) {
            errors.push(twice(&key, "path", "body"));
        } else if from_query.contains(&key) {
            errors.push(twice(&key, "path", "query string"));
        } else {
            input.insert(key, Value::String(value));
        }
    }
    if errors.is_empty() {
        Ok(Value::Object(input))
    } else {
        Err(ApiError::Validation { errors })
    }
}

/// `application/x-www-form-urlencoded` pairs, percent-decoded.
fn form_pairs(query: &str) -> Vec<(String, String)> {
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (form_decode(k), form_decode(v))
        })
        .collect()
}

/// A path segment that does not decode is the segment's field error, in JSON like every
/// other refusal (axum answers these in plain text).
fn path_error(rejection: &PathRejection) -> ApiError {
    match rejection {
        PathRejection::FailedToDeserializePathParams(e) => match e.kind() {
            ErrorKind::InvalidUtf8InPathParam { key } => {
                ApiError::field(key.as_str(), "is not valid UTF-8 once percent-decoded")
            }
            _ => ApiError::field("", e.body_text()),
        },
        other => ApiError::internal(other.body_text()),
    }
}

/// What a route knows about its command.
struct RouteInfo {
    name: &'static str,
    kinds: HashMap<String, Kind>,
}

/// The parts of an HTTP request a command's input is made of.
struct Call {
    method: Method,
    headers: HeaderMap,
    path: Result<Path<HashMap<String, String>>, PathRejection>,
    query: Option<String>,
    body: Bytes,
}

async fn handle(state: AppState, route: &RouteInfo, call: Call) -> Response {
    let actor = match state
        .service
        .auth
        .authenticate(&call.headers, &call.method, Face::Rest)
        .await
    {
        Ok(a) => a,
        Err(e) => return error_response(&e),
    };
    let path = match call.path {
        Ok(Path(path)) => path,
        Err(rejection) => return error_response(&path_error(&rejection)),
    };
    let input = match build_input(&route.kinds, path, call.query.as_deref(), &call.body) {
        Ok(i) => i,
        Err(e) => return error_response(&e),
    };
    match state.service.dispatch(&actor, route.name, input).await {
        Ok(output) => (
            [(header::CONTENT_TYPE, "application/json")],
            String::from(Box::<str>::from(output)),
        )
            .into_response(),
        Err(e) => error_response(&e),
    }
}

/// One route per command.
pub fn routes() -> Router<AppState> {
    let mut router = Router::new();
    for entry in COMMANDS {
        let route = Arc::new(RouteInfo {
            name: entry.spec.name,
            kinds: field_kinds(entry),
        });
        let handler = move |State(state): State<AppState>,
                            method: Method,
                            headers: HeaderMap,
                            path: Result<Path<HashMap<String, String>>, PathRejection>,
                            RawQuery(query): RawQuery,
                            body: Bytes| {
            let route = route.clone();
            async move {
                handle(
                    state,
                    &route,
                    Call {
                        method,
                        headers,
                        path,
                        query,
                        body,
                    },
                )
                .await
            }
        };
        let method_router: MethodRouter<AppState> = match entry.spec.method {
            HttpMethod::Get => get(handler),
            HttpMethod::Post => post(handler),
            HttpMethod::Delete => delete(handler),
        };
        router = router.route(entry.spec.path, method_router);
    }
    router
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn kinds_of(name: &str) -> HashMap<String, Kind> {
        field_kinds(app::api::find(name).unwrap())
    }

    #[test]
    fn schema_drives_query_coercion() {
        let kinds = kinds_of("list_instance_types");
        assert_eq!(kinds.get("refresh"), Some(&Kind::Boolean));
        assert_eq!(kinds.get("instance_types"), Some(&Kind::Array));
        assert_eq!(kinds.get("availability_zone"), Some(&Kind::Text));
        let input = build_input(
            &kinds,
            HashMap::new(),
            Some("refresh=true&instance_types=p5.48xlarge&instance_types=p4d.24xlarge&availability_zone=us-east-1a"),
            b"",
        )
        .unwrap();
        assert_eq!(input["refresh"], true);
        assert_eq!(
            input["instance_types"],
            json!(["p5.48xlarge", "p4d.24xlarge"])
        );
        assert_eq!(
            kinds_of("wait_operation").get("timeout_seconds"),
            Some(&Kind::Integer)
        );
    }

    #[test]
    fn path_and_body_merge() {
        let kinds = kinds_of("get_cluster");
        let path = HashMap::from([("name".to_owned(), "ml-1".to_owned())]);
        assert_eq!(
            build_input(&kinds, path, None, b"").unwrap(),
            json!({"name": "ml-1"})
        );
        assert!(build_input(&kinds, HashMap::new(), None, b"[1]").is_err());
        assert!(build_input(&kinds, HashMap::new(), None, b"{nope").is_err());
    }
}
