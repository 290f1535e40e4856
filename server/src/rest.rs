//! REST under `/api/v1`, generated from the command registry: one route per command, one
//! generic handler. Path segments, query parameters and the JSON body are merged into
//! the command's input and handed to `dispatch`, so REST validates exactly like MCP and
//! the console.

use std::collections::HashMap;
use std::sync::Arc;

use app::api::{ApiError, COMMANDS, CommandEntry, HttpMethod};
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Json, Response};
use axum::routing::{MethodRouter, delete, get, post};
use serde_json::{Map, Value, json};

use crate::auth::Face;
use crate::http::AppState;

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
/// text, so the command's own decoding reports them with the field's rule.
fn query_value(kind: Kind, raw: &str) -> Value {
    match kind {
        Kind::Boolean => match raw {
            "true" | "1" => Value::Bool(true),
            "false" | "0" => Value::Bool(false),
            _ => Value::String(raw.to_owned()),
        },
        Kind::Integer => raw
            .parse::<i64>()
            .map_or_else(|_| Value::String(raw.to_owned()), Value::from),
        Kind::Array | Kind::Text => Value::String(raw.to_owned()),
    }
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
    for (key, raw) in form_pairs(query.unwrap_or_default()) {
        let kind = kinds.get(&key).copied().unwrap_or(Kind::Text);
        let value = query_value(kind, &raw);
        if kind == Kind::Array {
            match input.entry(key).or_insert_with(|| Value::Array(Vec::new())) {
                Value::Array(items) => items.push(value),
                other => *other = value,
            }
        } else {
            input.insert(key, value);
        }
    }
    for (key, value) in path {
        input.insert(key, Value::String(value));
    }
    Ok(Value::Object(input))
}

/// `application/x-www-form-urlencoded` pairs, percent-decoded.
fn form_pairs(query: &str) -> Vec<(String, String)> {
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect()
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3])
                    .ok()
                    .and_then(|h| u8::from_str_radix(h, 16).ok());
                match hex {
                    Some(b) => {
                        out.push(b);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The error body every REST failure has: `{"error": ApiError}`.
pub fn error_response(e: &ApiError) -> Response {
    let status = StatusCode::from_u16(e.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = (status, Json(json!({ "error": e }))).into_response();
    if status == StatusCode::UNAUTHORIZED
        && let Ok(v) = "Bearer realm=\"hypd\"".parse()
    {
        response
            .headers_mut()
            .insert(axum::http::header::WWW_AUTHENTICATE, v);
    }
    response
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
    path: HashMap<String, String>,
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
    let input = match build_input(&route.kinds, call.path, call.query.as_deref(), &call.body) {
        Ok(i) => i,
        Err(e) => return error_response(&e),
    };
    match state.service.dispatch(&actor, route.name, input).await {
        Ok(output) => Json(output).into_response(),
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
                            Path(path): Path<HashMap<String, String>>,
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

    #[test]
    fn percent_decoding() {
        assert_eq!(percent_decode("cluster%2Fml-1"), "cluster/ml-1");
        assert_eq!(percent_decode("a+b"), "a b");
        assert_eq!(percent_decode("100%"), "100%");
        assert_eq!(percent_decode("%zz"), "%zz");
    }
}
