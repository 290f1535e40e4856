//! MCP prompts and completion: every playbook hypd ships is a prompt (the file itself,
//! byte for byte, is its first message), and `completion/complete` offers the values of
//! the playbooks' arguments and of the resource templates' variables. Those values come
//! from hypd's own read commands run as the caller through `dispatch`, so a caller is
//! offered only what its role may read; a read that fails (no such cluster yet, AWS
//! unreachable) offers nothing instead of failing the request.

use std::collections::{HashMap, HashSet};

use app::api::inference::Engine;
use app::api::training::Recipe;
use app::api::values::PageSize;
use rmcp::ErrorData as McpError;
use rmcp::model::{
    CompleteRequestParams, CompleteResult, CompletionInfo, GetPromptResult, JsonObject, Prompt,
    PromptArgument, PromptMessage, Reference, Role,
};
use serde_json::Value;

use crate::agent::{Playbook, playbooks};
use crate::auth::Actor;
use crate::service::Service;

/// What each argument a playbook declares is, for the form a client shows. Every
/// argument is optional: the playbook asks for whatever the user has not chosen.
const ARGUMENTS: &[(&str, &str)] = &[
    ("name", "Cluster name"),
    ("region", "AWS region, e.g. us-east-1"),
    (
        "availability_zone",
        "Availability Zone of the accelerated instances, e.g. us-east-1a",
    ),
    ("node_id", "HyperPod node id, e.g. i-0123456789abcdef0"),
    ("operation_id", "Operation id"),
    ("job", "Training job name"),
    ("endpoint", "Model endpoint name"),
    ("recipe", "Training recipe kind"),
    ("engine", "Serving engine"),
    ("model", "Hugging Face model id, e.g. Qwen/Qwen2.5-0.5B"),
    ("model_id", "SageMaker JumpStart model id"),
    (
        "command",
        "Serve command, e.g. vllm serve /s3/models/Qwen/Qwen2.5-0.5B",
    ),
];

/// The most values one completion answer may carry (MCP's limit).
const MAX_VALUES: usize = CompletionInfo::MAX_VALUES;

fn find(name: &str) -> Option<Playbook<'static>> {
    playbooks().find(|p| p.name == name)
}

/// The H1 title, the version and kind, then what the playbook does.
fn description(playbook: &Playbook) -> String {
    let mut text = playbook.title.unwrap_or(playbook.name).to_owned();
    if let (Some(version), Some(kind)) = (playbook.version, playbook.kind) {
        text.push_str(&format!(" (v{version}, {kind})"));
    }
    if let Some(intro) = &playbook.intro {
        text.push_str(". ");
        text.push_str(intro);
    }
    text
}

fn prompt(playbook: &Playbook) -> Prompt {
    let arguments: Vec<PromptArgument> = playbook
        .arguments
        .iter()
        .map(|name| {
            let argument = PromptArgument::new(*name).with_required(false);
            match ARGUMENTS.iter().find(|(n, _)| n == name) {
                Some((_, described)) => argument.with_description(*described),
                None => argument,
            }
        })
        .collect();
    let prompt = Prompt::new(
        playbook.name,
        Some(description(playbook)),
        (!arguments.is_empty()).then_some(arguments),
    );
    match playbook.title {
        Some(title) => prompt.with_title(title),
        None => prompt,
    }
}

/// Every playbook as a prompt, in `PLAYBOOKS` order.
pub(super) fn list() -> Vec<Prompt> {
    playbooks().map(|p| prompt(&p)).collect()
}

/// The playbook `name`, unchanged, and what the user already chose among its arguments.
/// An empty value is no choice (forms send every field).
pub(super) fn get(name: &str, arguments: Option<JsonObject>) -> Result<GetPromptResult, McpError> {
    let playbook = find(name)
        .ok_or_else(|| McpError::invalid_params(format!("unknown prompt {name}"), None))?;
    let given = arguments.unwrap_or_default();
    for (key, value) in &given {
        if !playbook.arguments.contains(&key.as_str()) {
            return Err(McpError::invalid_params(
                format!(
                    "prompt {name} takes no argument {key}: it takes {}",
                    playbook.arguments.join(", ")
                ),
                None,
            ));
        }
        if !value.is_string() {
            return Err(McpError::invalid_params(
                format!("argument {key} of prompt {name} is a string"),
                None,
            ));
        }
    }
    let chosen: Vec<String> = playbook
        .arguments
        .iter()
        .filter_map(|a| {
            let value = given.get(*a)?.as_str()?.trim();
            (!value.is_empty()).then(|| format!("{a} = {value}"))
        })
        .collect();
    let mut messages = vec![PromptMessage::new_text(Role::User, playbook.text)];
    if !chosen.is_empty() {
        messages.push(PromptMessage::new_text(
            Role::User,
            format!("The user has already chosen: {}.", chosen.join(", ")),
        ));
    }
    Ok(GetPromptResult::new(messages).with_description(description(&playbook)))
}

/// Values for a prompt's argument or a resource template's variable that start with what
/// the user typed. Anything hypd does not know (another prompt, an argument it has no
/// values for, a failed read) completes to no values, never an error.
pub(super) async fn complete(
    service: &Service,
    actor: &Actor,
    request: CompleteRequestParams,
) -> Result<CompleteResult, McpError> {
    let context = request
        .context
        .and_then(|c| c.arguments)
        .unwrap_or_default();
    let argument = request.argument.name.as_str();
    let argument = match &request.r#ref {
        Reference::Prompt(p) => find(&p.name)
            .is_some_and(|playbook| playbook.arguments.contains(&argument))
            .then_some(argument),
        Reference::Resource(r) => template_argument(&r.uri, argument),
        _ => None,
    };
    let values = match argument.and_then(|a| source(a, &context)) {
        Some(Source::Read {
            command,
            input,
            list,
            field,
        }) => match service.dispatch(actor, command, input).await {
            Ok(answer) => serde_json::from_str(answer.get())
                .map(|answer| read(&answer, list, field))
                .unwrap_or_default(),
            Err(_) => Vec::new(),
        },
        Some(Source::Fixed(values)) => values,
        None => Vec::new(),
    };
    Ok(CompleteResult::new(matching(
        values,
        &request.argument.value,
    )))
}

/// The playbook argument a resource template's variable takes its values from: `name`
/// (a cluster), `id` (an operation) or `job` (a training job of the cluster `name`), when
/// the template is one of hypd's and has that variable.
fn template_argument(uri: &str, variable: &str) -> Option<&'static str> {
    if !uri.starts_with("hypd://") || !uri.contains(&format!("{{{variable}}}")) {
        return None;
    }
    match variable {
        "name" => Some("name"),
        "id" => Some("operation_id"),
        "job" => Some("job"),
        _ => None,
    }
}

/// Where an argument's values come from.
#[derive(Debug, PartialEq)]
enum Source {
    /// A read command, with its input, and where its answer has the values: the string
    /// `field` of each object of the array `list`.
    Read {
        command: &'static str,
        input: Value,
        list: &'static str,
        field: &'static str,
    },
    /// The values a request field allows.
    Fixed(Vec<String>),
}

/// The source of `argument`'s values, given what the user chose so far (`context`): the
/// zones of the chosen region, the nodes and jobs of the chosen cluster. `None` for an
/// argument of free text, or one that needs a cluster when none is chosen.
fn source(argument: &str, context: &HashMap<String, String>) -> Option<Source> {
    let chosen = |key: &str| {
        context
            .get(key)
            .map(|v| v.trim())
            .filter(|v| !v.is_empty())
            .map(|v| Value::String(v.to_owned()))
    };
    let input = |fields: Vec<(&str, Option<Value>)>| -> Value {
        Value::Object(
            fields
                .into_iter()
                .filter_map(|(k, v)| Some((k.to_owned(), v?)))
                .collect(),
        )
    };
    let read = |command, input, list, field| {
        Some(Source::Read {
            command,
            input,
            list,
            field,
        })
    };
    match argument {
        "name" => read("list_clusters", input(vec![]), "clusters", "name"),
        "region" => read("list_regions", input(vec![]), "regions", "name"),
        "availability_zone" => read(
            "list_availability_zones",
            input(vec![("region", chosen("region"))]),
            "zones",
            "name",
        ),
        // HyperPod's name (`ml.p5.48xlarge`): the one its requests take.
        "instance_type" => read(
            "list_instance_types",
            input(vec![
                ("region", chosen("region")),
                ("availability_zone", chosen("availability_zone")),
                (
                    "fields",
                    Some(serde_json::json!(["hyperpod_instance_type"])),
                ),
            ]),
            "instance_types",
            "hyperpod_instance_type",
        ),
        // Newest first, as the command answers.
        "operation_id" => read(
            "list_operations",
            input(vec![]),
            "operations",
            "operation_id",
        ),
        "node_id" => read(
            "list_nodes",
            input(vec![
                ("name", Some(chosen("name")?)),
                ("limit", Some(Value::from(PageSize::MAX))),
            ]),
            "nodes",
            "node_id",
        ),
        "job" => read(
            "list_training_jobs",
            input(vec![("name", Some(chosen("name")?))]),
            "jobs",
            "job",
        ),
        "endpoint" => read(
            "list_endpoints",
            input(vec![("name", chosen("name"))]),
            "endpoints",
            "endpoint",
        ),
        "recipe" => Some(Source::Fixed(allowed(&schema::<Recipe>(), Some("kind")))),
        "engine" => Some(Source::Fixed(allowed(&schema::<Engine>(), None))),
        _ => None,
    }
}

/// The string `field` of each object of the array `list` in a command's answer.
fn read(answer: &Value, list: &str, field: &str) -> Vec<String> {
    answer
        .get(list)
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|item| item.get(field)?.as_str().map(str::to_owned))
        .collect()
}

fn schema<T: schemars::JsonSchema>() -> Value {
    serde_json::to_value(schemars::schema_for!(T)).unwrap_or_default()
}

/// The strings a schema allows (its `enum` and `const`, and its branches'), or for an
/// internally tagged enum those of each branch's `tag` property: the names the request
/// type itself accepts, so a new variant is offered without a list to keep in step.
fn allowed(schema: &Value, tag: Option<&str>) -> Vec<String> {
    let branches = ["oneOf", "anyOf"]
        .into_iter()
        .filter_map(|k| schema.get(k).and_then(Value::as_array))
        .flatten();
    let mut values: Vec<String> = branches.flat_map(|b| allowed(b, tag)).collect();
    let own = match tag {
        Some(tag) => schema.get("properties").and_then(|p| p.get(tag)),
        None => Some(schema),
    };
    if let Some(own) = own {
        let listed = own
            .get("enum")
            .and_then(Value::as_array)
            .into_iter()
            .flatten();
        values.extend(
            listed
                .chain(own.get("const"))
                .filter_map(Value::as_str)
                .map(str::to_owned),
        );
    }
    values
}

/// The values that start with `typed`, ignoring case, each once and in the order given;
/// at most `MAX_VALUES`, with how many matched in all.
fn matching(values: Vec<String>, typed: &str) -> CompletionInfo {
    let typed = typed.to_lowercase();
    let mut seen = HashSet::new();
    let mut values: Vec<String> = values
        .into_iter()
        .filter(|v| v.to_lowercase().starts_with(&typed) && seen.insert(v.clone()))
        .collect();
    let total = values.len();
    values.truncate(MAX_VALUES);
    let mut info = CompletionInfo::default();
    info.values = values;
    info.total = Some(u32::try_from(total).unwrap_or(u32::MAX));
    info.has_more = Some(total > MAX_VALUES);
    info
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::sync::Arc;

    use app::api::{COMMANDS, Effect};
    use rmcp::model::{ArgumentInfo, CompletionContext, ContentBlock, ErrorCode};
    use serde_json::json;

    use super::*;
    use crate::agent::PLAYBOOKS;
    use crate::faces::mcp::compact_schema;

    fn text(message: &PromptMessage) -> &str {
        match &message.content {
            ContentBlock::Text(t) => &t.text,
            other => panic!("not text: {other:?}"),
        }
    }

    fn object(v: Value) -> JsonObject {
        v.as_object().expect("an object").clone()
    }

    fn strings(values: &[&str]) -> Vec<String> {
        values.iter().map(|v| (*v).to_owned()).collect()
    }

    #[test]
    fn every_playbook_is_a_prompt_with_its_declared_arguments() {
        let prompts = list();
        let names: Vec<&str> = prompts.iter().map(|p| p.name.as_str()).collect();
        let stems: Vec<&str> = PLAYBOOKS
            .iter()
            .map(|(file, _)| file.strip_suffix(".md").expect("markdown"))
            .collect();
        assert_eq!(names, stems);
        for (prompt, playbook) in prompts.iter().zip(playbooks()) {
            let name = &prompt.name;
            let arguments = prompt.arguments.as_deref().unwrap_or_default();
            let declared: Vec<&str> = arguments.iter().map(|a| a.name.as_str()).collect();
            assert_eq!(declared, playbook.arguments, "{name}");
            assert!(!declared.is_empty(), "{name} declares no arguments");
            for a in arguments {
                assert_eq!(a.required, Some(false), "{name}: {}", a.name);
                assert!(
                    a.description.as_deref().is_some_and(|d| !d.is_empty()),
                    "{name}: argument {} is not described in prompts::ARGUMENTS",
                    a.name
                );
            }
            let title = playbook.title.expect("titled");
            let description = prompt.description.as_deref().unwrap_or_default();
            let head = format!(
                "{title} (v{}, {}). ",
                playbook.version.expect("versioned"),
                playbook.kind.expect("of a kind")
            );
            assert!(description.starts_with(&head), "{description}");
            assert!(
                description.ends_with(playbook.intro.as_deref().expect("introduced")),
                "{description}"
            );
            assert_eq!(prompt.title.as_deref(), Some(title));
        }
        let create = prompts.iter().find(|p| p.name == "create-cluster");
        assert_eq!(
            create.and_then(|p| p.description.as_deref()),
            Some(
                "Create a GPU cluster (v1.2.0, workflow). Makes a HyperPod-on-EKS cluster from \
                 the user's decisions only: region, Availability Zone, and per instance group \
                 its instance type, count and capacity type. Everything else (VPC, subnets, \
                 routes, security groups, IAM, add-ons, storage) is hypd's to choose."
            )
        );
    }

    #[test]
    fn a_prompt_is_its_playbook_file_byte_for_byte() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../playbooks");
        for prompt in list() {
            let file = std::fs::read(dir.join(format!("{}.md", prompt.name))).unwrap();
            for arguments in [None, Some(JsonObject::new())] {
                let got = get(&prompt.name, arguments).unwrap();
                assert_eq!(got.messages.len(), 1, "{}", prompt.name);
                assert_eq!(got.messages[0].role, Role::User);
                assert!(
                    text(&got.messages[0]).as_bytes() == file.as_slice(),
                    "{} differs from its file",
                    prompt.name
                );
                assert_eq!(got.description, prompt.description);
            }
        }
    }

    #[test]
    fn what_the_user_chose_follows_the_playbook_in_declared_order() {
        let got = get(
            "create-cluster",
            Some(object(
                json!({"availability_zone": "us-east-1a", "region": "us-east-1"}),
            )),
        )
        .unwrap();
        assert_eq!(got.messages.len(), 2);
        assert_eq!(got.messages[1].role, Role::User);
        assert_eq!(
            text(&got.messages[1]),
            "The user has already chosen: region = us-east-1, availability_zone = us-east-1a."
        );
        let got = get(
            "create-cluster",
            Some(object(
                json!({"region": " ", "availability_zone": "us-east-1b"}),
            )),
        )
        .unwrap();
        assert_eq!(
            text(&got.messages[1]),
            "The user has already chosen: availability_zone = us-east-1b."
        );
    }

    #[test]
    fn unknown_prompts_and_arguments_and_non_strings_are_refused() {
        let e = get("create-clusters", None).unwrap_err();
        assert_eq!(e.code, ErrorCode::INVALID_PARAMS);
        assert_eq!(e.message, "unknown prompt create-clusters");
        let e = get("create-cluster", Some(object(json!({"name": "ml-1"})))).unwrap_err();
        assert_eq!(e.code, ErrorCode::INVALID_PARAMS);
        assert_eq!(
            e.message,
            "prompt create-cluster takes no argument name: it takes region, availability_zone"
        );
        for value in [json!(1), json!(null), json!(["us-east-1"])] {
            let e = get("create-cluster", Some(object(json!({"region": value})))).unwrap_err();
            assert_eq!(e.code, ErrorCode::INVALID_PARAMS);
            assert!(
                e.message
                    .starts_with("argument region of prompt create-cluster is a string"),
                "{}",
                e.message
            );
        }
    }

    #[test]
    fn completion_keeps_the_values_that_start_with_what_was_typed() {
        let regions = strings(&["us-east-1", "US-west-2", "eu-west-1", "us-east-1"]);
        let got = matching(regions.clone(), "Us");
        assert_eq!(got.values, ["us-east-1", "US-west-2"]);
        assert_eq!((got.total, got.has_more), (Some(2), Some(false)));
        assert_eq!(matching(regions.clone(), "").values.len(), 3, "each once");
        assert_eq!(matching(regions.clone(), "us-east-1").values, ["us-east-1"]);
        assert_eq!(
            matching(regions.clone(), "west").values,
            Vec::<String>::new()
        );
        let got = matching(regions, "ap");
        assert_eq!((got.values.len(), got.total), (0, Some(0)));

        let many: Vec<String> = (0..150).map(|i| format!("ml-{i:03}")).collect();
        let got = matching(many, "ML-");
        assert_eq!(got.values.len(), 100);
        assert_eq!(got.values[0], "ml-000", "in the order given");
        assert_eq!((got.total, got.has_more), (Some(150), Some(true)));
    }

    fn chosen(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    /// `#/$defs/X` read in `root`, or `v` itself.
    fn resolved<'a>(root: &'a JsonObject, v: &'a Value) -> &'a Value {
        v.get("$ref")
            .and_then(Value::as_str)
            .and_then(|r| r.strip_prefix("#/$defs/"))
            .and_then(|name| root.get("$defs")?.get(name))
            .unwrap_or(v)
    }

    /// Every read a completion makes is a read-only command a viewer may run, sent only
    /// fields its request has, and reading a string field every item of its answer has.
    #[test]
    fn completion_reads_fields_the_commands_have() {
        let context = chosen(&[
            ("name", "ml-1"),
            ("region", "us-west-2"),
            ("availability_zone", "us-west-2a"),
        ]);
        let names = ARGUMENTS.iter().map(|(n, _)| *n).chain(["instance_type"]);
        let mut commands = Vec::new();
        for argument in names {
            let Some(Source::Read {
                command,
                input,
                list,
                field,
            }) = source(argument, &context)
            else {
                continue;
            };
            commands.push(command);
            let entry = COMMANDS
                .iter()
                .find(|e| e.spec.name == command)
                .unwrap_or_else(|| panic!("{argument}: no command {command}"));
            assert_eq!(entry.spec.effect, Effect::ReadOnly, "{command}");
            assert_eq!(entry.spec.role, app::api::Role::Viewer, "{command}");
            let request = compact_schema(entry.request_schema);
            for key in input.as_object().expect("an object").keys() {
                assert!(
                    request["properties"].get(key).is_some(),
                    "{command} takes no {key}"
                );
            }
            let output = compact_schema(entry.output_schema);
            let array = resolved(&output, &output["properties"][list]);
            let item = resolved(&output, &array["items"]);
            assert_eq!(
                item["properties"][field]["type"], "string",
                "{command}: {list}[].{field}"
            );
            let required = item["required"].as_array().cloned().unwrap_or_default();
            assert!(
                required.contains(&json!(field)),
                "{command}: {list}[].{field}"
            );
        }
        assert_eq!(
            commands,
            [
                "list_clusters",
                "list_regions",
                "list_availability_zones",
                "list_nodes",
                "list_operations",
                "list_training_jobs",
                "list_endpoints",
                "list_instance_types",
            ]
        );
    }

    #[test]
    fn completion_reads_within_what_was_chosen_so_far() {
        let input =
            |argument: &str, context: &[(&str, &str)]| match source(argument, &chosen(context)) {
                Some(Source::Read { input, .. }) => Some(input),
                _ => None,
            };
        assert_eq!(
            input("availability_zone", &[("region", "us-west-2")]),
            Some(json!({"region": "us-west-2"}))
        );
        assert_eq!(input("availability_zone", &[]), Some(json!({})));
        assert_eq!(
            input("node_id", &[("name", "ml-1")]),
            Some(json!({"name": "ml-1", "limit": PageSize::MAX}))
        );
        // Nodes and jobs are a cluster's: none is listed before the cluster is chosen.
        assert_eq!(input("node_id", &[]), None);
        assert_eq!(input("job", &[("name", "  ")]), None);
        assert_eq!(
            input("job", &[("name", "ml-1")]),
            Some(json!({"name": "ml-1"}))
        );
        assert_eq!(input("endpoint", &[]), Some(json!({})));
        assert_eq!(
            input("endpoint", &[("name", "ml-1")]),
            Some(json!({"name": "ml-1"}))
        );
        // Free text.
        for argument in ["command", "model", "model_id", "test_argument"] {
            assert_eq!(source(argument, &chosen(&[])), None, "{argument}");
        }
    }

    #[test]
    fn recipes_and_engines_complete_to_what_their_requests_accept() {
        let Some(Source::Fixed(recipes)) = source("recipe", &chosen(&[])) else {
            panic!("recipes are fixed values");
        };
        assert_eq!(
            recipes,
            ["pytorch", "llama_factory", "ms_swift", "verl", "custom"]
        );
        let Some(Source::Fixed(engines)) = source("engine", &chosen(&[])) else {
            panic!("engines are fixed values");
        };
        assert_eq!(engines, ["vllm", "sglang", "custom"]);
        for engine in engines {
            let parsed: Engine = serde_json::from_value(json!(engine)).unwrap();
            assert_eq!(parsed.as_str(), engine);
        }
    }

    #[test]
    fn resource_templates_complete_clusters_operations_and_jobs() {
        let jobs = "hypd://clusters/{name}/training-jobs/{job}";
        assert_eq!(template_argument(jobs, "name"), Some("name"));
        assert_eq!(template_argument(jobs, "job"), Some("job"));
        assert_eq!(
            template_argument("hypd://operations/{id}", "id"),
            Some("operation_id")
        );
        assert_eq!(
            template_argument("hypd://clusters/{name}/nodes", "name"),
            Some("name")
        );
        assert_eq!(template_argument("hypd://operations/{id}", "name"), None);
        assert_eq!(template_argument("test://static/{name}", "name"), None);
        assert_eq!(
            template_argument("hypd://clusters/{cluster}", "cluster"),
            None
        );
    }

    /// A viewer's completion runs the reads as that viewer; what cannot be read (here
    /// AWS, with no credentials) and what hypd does not know (the conformance suite's own
    /// prompt) complete to no values.
    #[tokio::test]
    async fn completion_runs_hypd_reads_as_the_caller() {
        let dir = tempfile::tempdir().unwrap();
        let store =
            crate::store::Store::open(&crate::config::Database::Sqlite(dir.path().join("hypd.db")))
                .await
                .unwrap();
        for name in ["ml-1", "ml-2", "prod"] {
            crate::cluster::rows::record(
                &store,
                &crate::cluster::rows::Record {
                    name,
                    region: "us-east-1",
                    status: "active",
                    kubernetes_version: None,
                    eks_cluster_arn: None,
                    hyperpod_cluster_arn: None,
                },
            )
            .await
            .unwrap();
        }
        let aws = aws_config::SdkConfig::builder()
            .behavior_version(aws_config::BehaviorVersion::latest())
            .build();
        let service = Service::new(
            store,
            Arc::new(crate::aws::Aws::new(aws)),
            false,
            std::time::Duration::from_secs(1),
        );
        let viewer = Actor {
            name: "viewer".into(),
            role: app::api::Role::Viewer,
            face: crate::auth::Face::Mcp,
        };
        let complete = |reference: Reference, argument: &str, typed: &str| {
            let request = CompleteRequestParams::new(reference, ArgumentInfo::new(argument, typed))
                .with_context(CompletionContext::with_arguments(chosen(&[(
                    "region",
                    "us-east-1",
                )])));
            let (service, viewer) = (&service, &viewer);
            async move { complete(service, viewer, request).await.unwrap().completion }
        };
        let got = complete(Reference::for_prompt("delete-safely"), "name", "ML").await;
        assert_eq!(got.values, ["ml-1", "ml-2"]);
        assert_eq!((got.total, got.has_more), (Some(2), Some(false)));
        let got = complete(
            Reference::for_resource("hypd://clusters/{name}"),
            "name",
            "p",
        )
        .await;
        assert_eq!(got.values, ["prod"]);
        let got = complete(Reference::for_prompt("submit-training-job"), "recipe", "MS").await;
        assert_eq!(got.values, ["ms_swift"]);
        let none: [(Reference, &str); 4] = [
            // AWS cannot be asked.
            (Reference::for_prompt("create-cluster"), "region"),
            // create-cluster declares no `name`.
            (Reference::for_prompt("create-cluster"), "name"),
            (Reference::for_prompt("test_prompt_with_arguments"), "arg1"),
            (Reference::for_resource("test://template/{id}"), "id"),
        ];
        for (reference, argument) in none {
            let got = complete(reference, argument, "").await;
            assert_eq!(got.values, Vec::<String>::new(), "{argument}");
            assert_eq!(got.total, Some(0));
        }
    }
}
