//! hypd's state as MCP resources: what an agent would otherwise poll a tool for (a
//! cluster, its nodes, an operation with its stages, a training job and its log tail),
//! addressed by `hypd://` URIs. Every read is the read command REST serves, run as the
//! caller through `dispatch`, so a resource says exactly what the REST answer says, to
//! exactly whom REST would say it; no secret can be in one that is not in that answer.

use app::api::ApiError;
use rmcp::ErrorData as McpError;
use rmcp::model::{Resource, ResourceContents, ResourceTemplate};
use serde_json::{Value, json};

use crate::auth::Actor;
use crate::service::Service;

const SCHEME: &str = "hypd://";
const JSON: &str = "application/json";
/// The log lines a job's log resource carries: a tail, as `get_training_job_logs` reads.
const LOG_TAIL: u32 = 200;

/// One addressable thing. The URI is its only name, so parsing and printing it are the
/// two halves of one mapping, tested against each other.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Uri {
    Cluster { name: String },
    Nodes { name: String },
    Operation { id: String },
    TrainingJob { name: String, job: String },
    TrainingJobLogs { name: String, job: String },
}

impl Uri {
    pub fn parse(uri: &str) -> Option<Self> {
        let path = uri.strip_prefix(SCHEME)?;
        let parts: Vec<&str> = path.split('/').collect();
        if parts.iter().any(|p| p.is_empty()) {
            return None;
        }
        let s = |i: usize| parts[i].to_owned();
        Some(match parts.as_slice() {
            ["clusters", _] => Uri::Cluster { name: s(1) },
            ["clusters", _, "nodes"] => Uri::Nodes { name: s(1) },
            ["operations", _] => Uri::Operation { id: s(1) },
            ["clusters", _, "training-jobs", _] => Uri::TrainingJob {
                name: s(1),
                job: s(3),
            },
            ["clusters", _, "training-jobs", _, "logs"] => Uri::TrainingJobLogs {
                name: s(1),
                job: s(3),
            },
            _ => return None,
        })
    }

    pub fn to_uri(&self) -> String {
        match self {
            Uri::Cluster { name } => format!("{SCHEME}clusters/{name}"),
            Uri::Nodes { name } => format!("{SCHEME}clusters/{name}/nodes"),
            Uri::Operation { id } => format!("{SCHEME}operations/{id}"),
            Uri::TrainingJob { name, job } => {
                format!("{SCHEME}clusters/{name}/training-jobs/{job}")
            }
            Uri::TrainingJobLogs { name, job } => {
                format!("{SCHEME}clusters/{name}/training-jobs/{job}/logs")
            }
        }
    }

    /// The read command that answers it, with its input (the command validates the
    /// names, with the same field errors as REST).
    fn read(&self) -> (&'static str, Value) {
        match self {
            Uri::Cluster { name } => ("get_cluster", json!({ "name": name })),
            Uri::Nodes { name } => ("list_nodes", json!({ "name": name })),
            Uri::Operation { id } => ("get_operation", json!({ "operation_id": id })),
            Uri::TrainingJob { name, job } => {
                ("get_training_job", json!({ "name": name, "job": job }))
            }
            Uri::TrainingJobLogs { name, job } => (
                "get_training_job_logs",
                json!({ "name": name, "job": job, "tail_lines": LOG_TAIL }),
            ),
        }
    }

    /// The cluster a change of it belongs to, if any.
    pub fn cluster(&self) -> Option<&str> {
        match self {
            Uri::Cluster { name }
            | Uri::Nodes { name }
            | Uri::TrainingJob { name, .. }
            | Uri::TrainingJobLogs { name, .. } => Some(name),
            Uri::Operation { .. } => None,
        }
    }
}

pub fn templates() -> Vec<ResourceTemplate> {
    let t = |template: &str, name: &str, description: &str| {
        ResourceTemplate::new(template, name)
            .with_description(description)
            .with_mime_type(JSON)
    };
    vec![
        t(
            "hypd://clusters/{name}",
            "cluster",
            "A cluster as get_cluster answers: status, instance groups, features. Subscribe to follow its status.",
        ),
        t(
            "hypd://clusters/{name}/nodes",
            "nodes",
            "A cluster's nodes as list_nodes answers, with their health. Subscribe to follow it.",
        ),
        t(
            "hypd://operations/{id}",
            "operation",
            "An operation with its stages, as get_operation answers. Subscribe to be told of each stage's start, end or failure.",
        ),
        t(
            "hypd://clusters/{name}/training-jobs/{job}",
            "training-job",
            "A training job as get_training_job answers.",
        ),
        t(
            "hypd://clusters/{name}/training-jobs/{job}/logs",
            "training-job-logs",
            "The last 200 lines of each of a training job's pods.",
        ),
    ]
}

/// The caller's clusters, each with its nodes, and the operations still running: the
/// concrete resources worth following now (templates address the rest).
pub async fn list(service: &Service, actor: &Actor) -> Result<Vec<Resource>, McpError> {
    let clusters = answer(service, actor, "list_clusters", json!({})).await?;
    let mut found = Vec::new();
    for c in clusters["clusters"].as_array().into_iter().flatten() {
        let Some(name) = c["name"].as_str() else {
            continue;
        };
        let status = c["status"].as_str().unwrap_or_default();
        found.push(resource(
            Uri::Cluster { name: name.into() },
            format!("cluster {name}"),
            format!("Cluster {name} ({status})"),
        ));
        found.push(resource(
            Uri::Nodes { name: name.into() },
            format!("nodes of {name}"),
            format!("The nodes of cluster {name}"),
        ));
    }
    let running = answer(
        service,
        actor,
        "list_operations",
        json!({ "state": "running" }),
    )
    .await?;
    for op in running["operations"].as_array().into_iter().flatten() {
        let (Some(id), Some(command), Some(target)) = (
            op["operation_id"].as_str(),
            op["command"].as_str(),
            op["target"].as_str(),
        ) else {
            continue;
        };
        found.push(resource(
            Uri::Operation { id: id.into() },
            format!("operation {id}"),
            format!("{command} on {target}, running"),
        ));
    }
    Ok(found)
}

fn resource(uri: Uri, name: String, description: String) -> Resource {
    Resource::new(uri.to_uri(), name)
        .with_description(description)
        .with_mime_type(JSON)
}

/// The resource's JSON: the read command's answer, as REST sends it.
pub async fn read(service: &Service, actor: &Actor, uri: &str) -> Result<String, McpError> {
    let (command, input) = parse(uri)?.read();
    dispatch(service, actor, command, input).await
}

pub fn contents(uri: &str, json: String) -> ResourceContents {
    ResourceContents::text(json, uri).with_mime_type(JSON)
}

pub fn parse(uri: &str) -> Result<Uri, McpError> {
    Uri::parse(uri).ok_or_else(|| {
        McpError::resource_not_found(
            format!(
                "{uri}: not a hypd resource; the templates are {}",
                templates()
                    .iter()
                    .map(|t| t.uri_template.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            None,
        )
    })
}

/// A read command's JSON answer for the caller, or its refusal as a protocol error.
async fn dispatch(
    service: &Service,
    actor: &Actor,
    command: &str,
    input: Value,
) -> Result<String, McpError> {
    let text = service
        .dispatch(actor, command, input)
        .await
        .map_err(|e| refusal(&e))?;
    Ok(text.get().to_owned())
}

async fn answer(
    service: &Service,
    actor: &Actor,
    command: &str,
    input: Value,
) -> Result<Value, McpError> {
    let text = dispatch(service, actor, command, input).await?;
    serde_json::from_str(&text).map_err(|e| McpError::internal_error(e.to_string(), None))
}

/// A refused read as a protocol error that carries hypd's own error (field path, rule,
/// provider details) as its data, so it reads the same as on every other face.
pub fn refusal(e: &ApiError) -> McpError {
    let data = serde_json::to_value(e).ok().map(|e| json!({ "error": e }));
    let message = e.to_string();
    match e {
        ApiError::NotFound { .. } => McpError::resource_not_found(message, data),
        ApiError::Validation { .. } => McpError::invalid_params(message, data),
        ApiError::Unauthorized { .. } | ApiError::Forbidden { .. } => {
            McpError::invalid_request(message, data)
        }
        _ => McpError::internal_error(message, data),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_uri_prints_back_to_itself() {
        let all = [
            Uri::Cluster {
                name: "ml-1".into(),
            },
            Uri::Nodes {
                name: "ml-1".into(),
            },
            Uri::Operation {
                id: "op-01J".into(),
            },
            Uri::TrainingJob {
                name: "ml-1".into(),
                job: "llama".into(),
            },
            Uri::TrainingJobLogs {
                name: "ml-1".into(),
                job: "llama".into(),
            },
        ];
        for u in all {
            assert_eq!(Uri::parse(&u.to_uri()), Some(u.clone()), "{}", u.to_uri());
        }
    }

    #[test]
    fn every_template_names_a_uri_that_parses() {
        for t in templates() {
            let uri = t
                .uri_template
                .replace("{name}", "a")
                .replace("{id}", "b")
                .replace("{job}", "c");
            assert!(Uri::parse(&uri).is_some(), "{uri}");
        }
    }

    #[test]
    fn other_uris_are_not_hypd_resources() {
        for bad in [
            "test://static-text",
            "hypd://clusters",
            "hypd://clusters/",
            "hypd://clusters/a/",
            "hypd://clusters/a/pods",
            "hypd://operations/a/b",
            "hypd:///clusters/a",
        ] {
            assert_eq!(Uri::parse(bad), None, "{bad}");
        }
    }
}
