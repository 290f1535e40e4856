//! The OpenAPI 3.1 document at `/api/v1/openapi.json`, generated from the command
//! registry and the same `schemars` schemas the MCP tools use, so the document cannot
//! drift from what the server accepts.

use app::api::{COMMANDS, CommandEntry, Effect, HttpMethod};
use schemars::generate::SchemaSettings;
use serde_json::{Map, Value, json};

/// Builds the document (cheap enough to build once at start-up).
pub fn document() -> Value {
    let mut settings = SchemaSettings::draft2020_12();
    settings.definitions_path = "/components/schemas".into();
    let mut generator = settings.into_generator();
    let error_schema = generator.subschema_for::<app::api::ApiError>();

    let mut paths: Map<String, Value> = Map::new();
    for entry in COMMANDS {
        let request =
            serde_json::to_value((entry.request_schema)(&mut generator)).unwrap_or_default();
        let output =
            serde_json::to_value((entry.output_schema)(&mut generator)).unwrap_or_default();
        let op = operation(entry, request, output, &error_schema, &generator);
        let path = paths
            .entry(entry.spec.path.to_owned())
            .or_insert_with(|| json!({}));
        path[entry.spec.method.as_str()] = op;
    }

    let schemas = serde_json::to_value(generator.definitions()).unwrap_or_default();
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "hypd",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Control plane for GPU training and inference clusters on AWS (EKS + SageMaker HyperPod). Every operation here is also an MCP tool of the same name at /mcp, with the same validation."
        },
        "servers": [{ "url": "/" }],
        "security": [{ "bearer": [] }],
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {
                "bearer": { "type": "http", "scheme": "bearer", "description": "An API token (hypd_…); the first admin token is in <data dir>/admin-token." }
            }
        }
    })
}

/// The properties of a request schema, following one `$ref`.
fn properties(
    request: &Value,
    generator: &schemars::SchemaGenerator,
) -> (Map<String, Value>, Vec<String>) {
    let resolved = match request.get("$ref").and_then(Value::as_str) {
        Some(r) => {
            let name = r.rsplit('/').next().unwrap_or_default();
            generator
                .definitions()
                .get(name)
                .cloned()
                .unwrap_or_default()
        }
        None => request.clone(),
    };
    let props = resolved
        .get("properties")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let required = resolved
        .get("required")
        .and_then(Value::as_array)
        .map(|r| {
            r.iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    (props, required)
}

fn operation(
    entry: &CommandEntry,
    request: Value,
    output: Value,
    error_schema: &schemars::Schema,
    generator: &schemars::SchemaGenerator,
) -> Value {
    let spec = entry.spec;
    let path_params: Vec<&str> = spec.path_params().collect();
    let (props, required) = properties(&request, generator);
    let mut parameters: Vec<Value> = path_params
        .iter()
        .map(|p| {
            json!({
                "name": p, "in": "path", "required": true,
                "schema": props.get(*p).cloned().unwrap_or_else(|| json!({ "type": "string" }))
            })
        })
        .collect();
    let mut op = json!({
        "operationId": spec.name,
        "summary": spec.summary,
        "description": description(entry),
        "tags": [tag(spec.path)],
        "x-hypd-effect": spec.effect,
        "x-hypd-role": spec.role,
        "responses": {
            "200": { "description": "Success", "content": { "application/json": { "schema": output } } },
            "default": {
                "description": "Failure: validation (422), unauthorized (401), forbidden (403), not found (404), conflict (409), upstream (502)",
                "content": { "application/json": { "schema": {
                    "type": "object", "required": ["error"], "properties": { "error": error_schema }
                } } }
            }
        }
    });
    if spec.method == HttpMethod::Get {
        for (name, schema) in &props {
            if path_params.contains(&name.as_str()) {
                continue;
            }
            let is_array = schema.get("type").and_then(Value::as_str) == Some("array");
            let mut p = json!({
                "name": name, "in": "query", "required": required.contains(name),
                "schema": schema,
            });
            if is_array {
                p["style"] = json!("form");
                p["explode"] = json!(true);
            }
            parameters.push(p);
        }
    } else if !props.keys().all(|k| path_params.contains(&k.as_str())) {
        op["requestBody"] = json!({
            "required": true,
            "content": { "application/json": { "schema": request } }
        });
    }
    op["parameters"] = Value::Array(parameters);
    op
}

fn description(entry: &CommandEntry) -> String {
    let spec = entry.spec;
    let mut text = spec.description.to_owned();
    match (spec.effect, spec.status_command) {
        (Effect::ReadOnly, _) => {}
        (_, Some(status)) => text.push_str(&format!(" Completion is decided by `{status}`.")),
        (_, None) => {}
    }
    text.push_str(&format!(" Requires the {} role.", spec.role.as_str()));
    text
}

fn tag(path: &str) -> String {
    path.trim_start_matches("/api/v1/")
        .split('/')
        .next()
        .unwrap_or("api")
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_command_is_an_operation_with_resolvable_refs() {
        let doc = document();
        assert_eq!(doc["openapi"], "3.1.0");
        let mut count = 0;
        for entry in COMMANDS {
            let op = &doc["paths"][entry.spec.path][entry.spec.method.as_str()];
            assert_eq!(op["operationId"], entry.spec.name);
            count += 1;
        }
        assert_eq!(count, COMMANDS.len());
        let text = doc.to_string();
        for r in text.split("\"$ref\":\"").skip(1) {
            let target = r.split('"').next().unwrap();
            let name = target.strip_prefix("#/components/schemas/").expect(target);
            assert!(
                doc["components"]["schemas"].get(name).is_some(),
                "dangling {target}"
            );
        }
        let wait = &doc["paths"]["/api/v1/operations/{operation_id}/wait"]["get"];
        let names: Vec<&str> = wait["parameters"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["name"].as_str().unwrap())
            .collect();
        assert!(
            names.contains(&"operation_id") && names.contains(&"timeout_seconds"),
            "{names:?}"
        );
    }
}
