//! MCP for agents, over streamable HTTP at `/mcp` (and stdio through `hypd mcp`, which
//! relays to this endpoint). Tools are the command registry: names, descriptions, input
//! schemas and annotations come from it, and every call goes through the same `dispatch`
//! as REST and the console. A tool that fails returns the `ApiError` as a tool error the
//! agent can read; only protocol problems are JSON-RPC errors. Beyond tools, the same
//! registry and store serve the playbooks as prompts (`prompts`), hypd's state as
//! resources an agent reads and subscribes to (`resources`, `session`), and a wait's
//! progress (`progress`), each as the caller: nothing is shown that REST would not show.

use std::sync::Arc;

use app::api::{ApiError, COMMANDS, CommandEntry, Effect, Role};
use rmcp::ErrorData as McpError;
use rmcp::handler::server::ServerHandler;
use rmcp::model::{
    CacheScope, CallToolRequestParams, CallToolResponse, CallToolResult, CompleteRequestParams,
    CompleteResult, ContentBlock, GetPromptRequestParams, GetPromptResponse, Implementation,
    InitializeRequestParams, InitializeResult, JsonObject, ListPromptsResult,
    ListResourceTemplatesResult, ListResourcesResult, ListToolsResult, PaginatedRequestParams,
    ReadResourceRequestParams, ReadResourceResponse, ReadResourceResult, ServerCapabilities,
    ServerConfig, SubscribeRequestParams, SubscriptionFilter, Tool, ToolAnnotations,
    UnsubscribeRequestParams,
};
use rmcp::service::SubscriptionContext;
use rmcp::service::{RequestContext, RoleServer};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use schemars::generate::SchemaSettings;
use serde_json::Value;

use crate::auth::Actor;
use crate::service::Service;
use resources::Uri;
use session::Session;

mod progress;
mod prompts;
mod resources;
mod session;

const INSTRUCTIONS: &str = "hypd manages GPU training and inference clusters on AWS (EKS + SageMaker HyperPod). \
Inspect before you change anything: whoami, list_clusters, list_regions, list_availability_zones, list_instance_types. \
Ask the user only decision-level questions (region, Availability Zone, instance type, capacity type), never about CIDRs, subnets or security groups. \
Every mutating tool returns an operation or names the tool that decides completion: follow it (wait_operation) to a final state and report that state, not the submission. \
The same three fields work alike on every tool that takes them: `dry_run: true` answers with the plan and changes nothing; \
a destructive tool's first call answers with its plan and a `confirmation` (single use, 5 minutes), to send back unchanged once the user agrees; \
`idempotency_key`: re-sending a request with the same key returns the same operation.";

/// The request fields every mutation shares, described once in the instructions
/// instead of in every tool that takes them.
const GATE_FIELDS: [&str; 3] = ["dry_run", "confirmation", "idempotency_key"];

/// One tool per command. Each tool's schemas are self-contained (MCP has no shared
/// definitions across tools), so they are made compact: a type used once is written in
/// place, a type used more than once is written once under `$defs`, and what only
/// repeats or decorates (titles, examples, trivial defaults, `$schema`: 2020-12 is MCP's
/// default dialect) is left out. Every rule decode enforces (types, patterns, lengths,
/// ranges, enums, required and unknown fields) stays.
fn tools() -> Vec<(Role, Tool)> {
    COMMANDS
        .iter()
        .map(|entry| (entry.spec.role, tool(entry)))
        .collect()
}

/// `schema` (from a generator that keeps definitions apart) made self-contained and
/// compact.
pub(crate) fn compact_schema(
    make: fn(&mut schemars::SchemaGenerator) -> schemars::Schema,
) -> JsonObject {
    let mut generator = SchemaSettings::draft2020_12().into_generator();
    let root = serde_json::to_value(make(&mut generator)).unwrap_or_default();
    let defs = generator.take_definitions(true);
    let mut uses = std::collections::BTreeMap::new();
    count_refs(&root, &defs, &mut uses);
    let shared: std::collections::BTreeSet<String> = uses
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(name, _)| name.clone())
        .collect();
    let mut out = match inline(&root, &defs, &shared, 0) {
        Value::Object(map) => map,
        _ => JsonObject::new(),
    };
    if !shared.is_empty() {
        let kept: JsonObject = shared
            .iter()
            .filter_map(|name| {
                let def = defs.get(name)?;
                Some((name.clone(), inline(def, &defs, &shared, 0)))
            })
            .collect();
        out.insert("$defs".into(), Value::Object(kept));
    }
    out
}

fn ref_name(v: &Value) -> Option<&str> {
    v.get("$ref")
        .and_then(Value::as_str)
        .and_then(|r| r.rsplit('/').next())
}

/// How many places refer to each definition (a definition's own body counted once).
fn count_refs(v: &Value, defs: &JsonObject, uses: &mut std::collections::BTreeMap<String, usize>) {
    match v {
        Value::Object(map) => {
            if let Some(name) = ref_name(v) {
                let n = uses.entry(name.to_owned()).or_insert(0);
                *n += 1;
                if *n == 1
                    && let Some(def) = defs.get(name)
                {
                    count_refs(def, defs, uses);
                }
            }
            for (k, child) in map {
                if k != "$ref" {
                    count_refs(child, defs, uses);
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|i| count_refs(i, defs, uses)),
        _ => {}
    }
}

/// Keys that inform no agent and check nothing (`format` is an annotation in 2020-12).
const DECORATION: [&str; 4] = ["$schema", "title", "examples", "format"];

fn trivial_default(v: &Value) -> bool {
    match v {
        Value::Null | Value::Bool(false) => true,
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        _ => false,
    }
}

fn inline(
    v: &Value,
    defs: &JsonObject,
    shared: &std::collections::BTreeSet<String>,
    depth: u8,
) -> Value {
    let Value::Object(map) = v else {
        return match v {
            Value::Array(items) => Value::Array(
                items
                    .iter()
                    .map(|i| inline(i, defs, shared, depth))
                    .collect(),
            ),
            other => other.clone(),
        };
    };
    let mut out = JsonObject::new();
    if let Some(name) = ref_name(v) {
        if shared.contains(name) || depth > 32 {
            out.insert("$ref".into(), Value::String(format!("#/$defs/{name}")));
        } else if let Some(def @ Value::Object(_)) = defs.get(name)
            && let Value::Object(body) = inline(def, defs, shared, depth + 1)
        {
            out = body;
        }
    }
    for (k, child) in map {
        if k == "$ref" || DECORATION.contains(&k.as_str()) {
            continue;
        }
        if k == "default" && trivial_default(child) {
            continue;
        }
        let value = if matches!(k.as_str(), "default" | "const" | "enum" | "required") {
            // Values, not schemas.
            child.clone()
        } else if k == "properties" || k == "$defs" {
            // Property names are not schema keywords: keep every one.
            match child {
                Value::Object(props) => Value::Object(
                    props
                        .iter()
                        .map(|(name, p)| (name.clone(), inline(p, defs, shared, depth)))
                        .collect(),
                ),
                other => other.clone(),
            }
        } else {
            inline(child, defs, shared, depth)
        };
        out.insert(k.clone(), value);
    }
    // A default the description already states is said twice.
    if let (Some(Value::String(d)), Some(_)) = (out.get("description"), out.get("default"))
        && d.contains("default")
    {
        out.remove("default");
    }
    // So is an object's default that is only its properties' own defaults.
    if let (Some(Value::Object(default)), Some(Value::Object(properties))) =
        (out.get("default"), out.get("properties"))
        && default
            .iter()
            .all(|(k, v)| properties.get(k).and_then(|p| p.get("default")) == Some(v))
    {
        out.remove("default");
    }
    nullable(out)
}

/// `anyOf: [X, {type: null}]` (how schemars writes `Option<X>`) as X with `null` added
/// to its type, when X is a plain typed schema: the same values validate.
fn nullable(mut schema: JsonObject) -> Value {
    let Some(Value::Array(branches)) = schema.get("anyOf") else {
        return Value::Object(schema);
    };
    let is_null = |b: &Value| {
        b.get("type").and_then(Value::as_str) == Some("null")
            && b.as_object().is_some_and(|o| o.len() == 1)
    };
    let [a, b] = branches.as_slice() else {
        return Value::Object(schema);
    };
    let some = match (is_null(a), is_null(b)) {
        (false, true) => a,
        (true, false) => b,
        _ => return Value::Object(schema),
    };
    let Some(Value::Object(some)) = Some(some) else {
        return Value::Object(schema);
    };
    let Some(Value::String(kind)) = some.get("type") else {
        return Value::Object(schema);
    };
    let combinators = ["anyOf", "oneOf", "allOf", "$ref", "enum", "const"];
    if combinators.iter().any(|k| some.contains_key(*k)) {
        return Value::Object(schema);
    }
    let mut merged = some.clone();
    merged.insert("type".into(), serde_json::json!([kind, "null"]));
    schema.remove("anyOf");
    for (k, v) in schema {
        merged.insert(k, v);
    }
    Value::Object(merged)
}

/// A tool: its description, input schema and the hints that differ from MCP's defaults
/// (`readOnlyHint` false, `destructiveHint` true, `idempotentHint` false,
/// `openWorldHint` true; the last three mean nothing for a read-only tool).
///
/// No output schema is sent: even compact, they were 40 kB of a 57 kB `tools/list` (an
/// operation's, with every error variant, on four tools), context an agent pays for in
/// every session while every result carries its data, field names and all. They are
/// in the OpenAPI document, under the same names.
fn tool(entry: &CommandEntry) -> Tool {
    let spec = entry.spec;
    let mut description = spec.description.to_owned();
    // Most descriptions already say to follow the operation with wait_operation, which
    // reads the status command's answer until it ends: the sentence would say it twice.
    if let Some(status) = spec.status_command
        && !description.contains("wait_operation")
        && !description.contains(status)
    {
        description.push_str(&format!(" Completion: call {status}."));
    }
    // No title: the name says as much, and the summaries were 3.6 kB of every list.
    let annotations = ToolAnnotations::new();
    let annotations = if spec.effect == Effect::ReadOnly {
        annotations.read_only(true)
    } else {
        annotations
            .destructive(spec.effect == Effect::Destructive)
            .idempotent(spec.idempotent)
    };
    let mut input = compact_schema(entry.request_schema);
    // The request type's own doc says again what the tool's description says.
    input.remove("description");
    if let Some(Value::Object(properties)) = input.get_mut("properties") {
        for field in GATE_FIELDS {
            if let Some(Value::Object(p)) = properties.get_mut(field) {
                p.remove("description");
            }
        }
    }
    Tool::new(spec.name, description, Arc::new(input)).with_annotations(annotations)
}

/// One per MCP session (the HTTP service makes one at each `initialize`): the registry's
/// tools, shared by all, and the session's own live state.
#[derive(Clone)]
pub struct McpServer {
    service: Arc<Service>,
    tools: Arc<Vec<(Role, Tool)>>,
    session: Arc<Session>,
}

impl McpServer {
    pub fn new(service: Arc<Service>, tools: Arc<Vec<(Role, Tool)>>) -> Self {
        Self {
            session: Session::new(service.clone()),
            service,
            tools,
        }
    }

    /// The caller, authenticated by the HTTP layer for this very request, and admitted to
    /// this session only if it is the caller that opened it.
    fn actor(&self, context: &RequestContext<RoleServer>) -> Result<Actor, McpError> {
        let parts = context.extensions.get::<http::request::Parts>();
        let actor = parts
            .and_then(|p| p.extensions.get::<Actor>())
            .cloned()
            .ok_or_else(|| McpError::invalid_request("not authenticated", None))?;
        self.session
            .admit(&actor, parts.map(|p| &p.headers), &context.peer)
            .map_err(|e| McpError::invalid_request(e, None))?;
        Ok(actor)
    }

    /// The start of following `uri` (a subscription of either protocol): a resource
    /// that can be followed, read once as the caller, since only what the caller may
    /// read can be followed; its JSON is where its updates start from.
    async fn first_read(&self, actor: &Actor, uri: &str) -> Result<(Uri, String), McpError> {
        let parsed = resources::parse(uri)?;
        followable(&parsed)?;
        let now = resources::read(&self.service, actor, uri).await?;
        Ok((parsed, now))
    }
}

/// A result carries its data once as `structuredContent`, and, as the MCP specification
/// asks of tools with an output schema (for clients that read only `content`), the same
/// JSON serialized compactly as text: no pretty-printing, no second rendering.
fn data_result(value: Value, is_error: bool) -> CallToolResult {
    let text = serde_json::to_string(&value).unwrap_or_default();
    let mut result = if is_error {
        CallToolResult::error(vec![ContentBlock::text(text)])
    } else {
        CallToolResult::success(vec![ContentBlock::text(text)])
    };
    if value.is_object() {
        result.structured_content = Some(value);
    }
    result
}

/// A command's answer, parsed once for `structuredContent`; the text block is written
/// from that same value, so both carry the same JSON in the same key order.
fn answer_result(output: &serde_json::value::RawValue) -> CallToolResult {
    match serde_json::from_str(output.get()) {
        Ok(value) => data_result(value, false),
        Err(e) => error_result(&ApiError::internal(e)),
    }
}

fn error_result(e: &ApiError) -> CallToolResult {
    data_result(serde_json::json!({ "error": e }), true)
}

impl ServerHandler for McpServer {
    fn get_info(&self) -> ServerConfig {
        let mut server = Implementation::new("hypd", env!("CARGO_PKG_VERSION"));
        server.title = Some("hypd control plane".to_owned());
        // Exactly what is served: no list changes (the lists are fixed for a build).
        #[expect(
            deprecated,
            reason = "logging is what 2025-era clients (the conformance suite among them) ask for"
        )]
        let capabilities = ServerCapabilities::builder()
            .enable_tools()
            .enable_prompts()
            .enable_resources()
            .enable_resources_subscribe()
            .enable_logging()
            .enable_completions()
            .build();
        ServerConfig::new(capabilities)
            .with_server_info(server)
            .with_instructions(INSTRUCTIONS)
    }

    /// The handshake binds the session to the caller that opens it.
    async fn initialize(
        &self,
        request: InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<InitializeResult, McpError> {
        self.actor(&context)?;
        context.peer.set_peer_info(request.clone());
        self.negotiate_initialize(&request)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let actor = self.actor(&context)?;
        let visible = self
            .tools
            .iter()
            .filter(|(role, _)| actor.role >= *role)
            .map(|(_, t)| t.clone())
            .collect();
        // The list depends on the caller's role.
        Ok(ListToolsResult::with_all_items(visible).with_cache_scope(CacheScope::Private))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let actor = self.actor(&context)?;
        let input = request.arguments.map(Value::Object).unwrap_or(Value::Null);
        let followed = progress::followed(&request.name, &input);
        let dispatch = self.service.dispatch(&actor, &request.name, input);
        let reporter =
            followed.and_then(|id| progress::Reporter::new(&self.service, &actor, &context, id));
        let work = async move {
            match reporter {
                Some(reporter) => reporter.around(dispatch).await,
                None => dispatch.await,
            }
        };
        // Cancelling the call stops the wait, never the operation: the operation runs in
        // the worker, not in this future.
        let outcome = tokio::select! {
            outcome = work => outcome,
            () = context.ct.cancelled() => return Err(cancelled()),
        };
        let result = match outcome {
            Ok(output) => {
                let result = answer_result(&output);
                if let Some(id) = started_operation(&result) {
                    self.session.started(id);
                }
                result
            }
            Err(ApiError::NotFound { resource, name }) if resource == "command" => {
                return Err(McpError::invalid_params(
                    format!("unknown tool {name}"),
                    None,
                ));
            }
            Err(e) => error_result(&e),
        };
        Ok(CallToolResponse::Complete(result))
    }

    async fn list_prompts(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, McpError> {
        self.actor(&context)?;
        Ok(ListPromptsResult::with_all_items(prompts::list()))
    }

    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, McpError> {
        self.actor(&context)?;
        prompts::get(&request.name, request.arguments).map(GetPromptResponse::from)
    }

    async fn complete(
        &self,
        request: CompleteRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CompleteResult, McpError> {
        let actor = self.actor(&context)?;
        prompts::complete(&self.service, &actor, request).await
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, McpError> {
        let actor = self.actor(&context)?;
        let found = resources::list(&self.service, &actor).await?;
        Ok(ListResourcesResult::with_all_items(found))
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, McpError> {
        self.actor(&context)?;
        Ok(ListResourceTemplatesResult::with_all_items(
            resources::templates(),
        ))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, McpError> {
        let actor = self.actor(&context)?;
        let json = resources::read(&self.service, &actor, &request.uri).await?;
        Ok(ReadResourceResult::new(vec![resources::contents(&request.uri, json)]).into())
    }

    /// The resources of a 2026-07-28 `subscriptions/listen` hypd can follow; no list
    /// changes (the lists are fixed for a build).
    fn accepted_subscription_filter(
        &self,
        requested: &SubscriptionFilter,
    ) -> Option<SubscriptionFilter> {
        let mut accepted = SubscriptionFilter::new();
        accepted.resource_subscriptions = requested.resource_subscriptions.as_ref().map(|uris| {
            uris.iter()
                .filter(|u| resources::parse(u).is_ok_and(|u| followable(&u).is_ok()))
                .cloned()
                .collect()
        });
        Some(accepted)
    }

    async fn listen(&self, context: SubscriptionContext) -> Result<(), McpError> {
        let request = context.request_context();
        let actor = self.actor(request)?;
        let credential = request
            .extensions
            .get::<http::request::Parts>()
            .map(|p| p.headers.clone())
            .unwrap_or_default();
        let mut follower = session::Follower::default();
        for uri in context.accepted().resource_subscriptions.iter().flatten() {
            let (uri, now) = self.first_read(&actor, uri).await?;
            follower.add(uri, &now);
        }
        session::listen(&self.service, credential, follower, context).await
    }

    async fn subscribe(
        &self,
        request: SubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        let actor = self.actor(&context)?;
        let (uri, now) = self.first_read(&actor, &request.uri).await?;
        self.session.subscribe(uri, &now);
        Ok(())
    }

    async fn unsubscribe(
        &self,
        request: UnsubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        self.actor(&context)?;
        let uri = resources::parse(&request.uri)?;
        self.session.unsubscribe(&uri);
        Ok(())
    }

    #[expect(
        deprecated,
        reason = "logging/setLevel is how 2025-era clients ask for log messages"
    )]
    async fn set_level(
        &self,
        request: rmcp::model::SetLevelRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        self.actor(&context)?;
        self.session.set_level(request.level);
        Ok(())
    }
}

/// What a subscription can follow: what operations change (an operation, a cluster, its
/// nodes). A training job moves on its own, outside any operation, so it is read instead.
fn followable(uri: &Uri) -> Result<(), McpError> {
    match uri {
        Uri::TrainingJob { .. } | Uri::TrainingJobLogs { .. } => Err(McpError::invalid_params(
            format!(
                "{}: a training job is read, not followed; its logs stream from get_training_job_logs' WebSocket",
                uri.to_uri()
            ),
            None,
        )),
        _ => Ok(()),
    }
}

fn cancelled() -> McpError {
    McpError::internal_error("the call was cancelled by the client", None)
}

/// The operation a successful call started (its answer is an `OperationRef`), which the
/// session then reports on in its log messages.
fn started_operation(result: &CallToolResult) -> Option<&str> {
    let answer = result.structured_content.as_ref()?;
    answer.get("status_command")?;
    answer.get("operation_id")?.as_str()
}

/// The `/mcp` endpoint as a tower service. Each `initialize` opens a session (its id in
/// `Mcp-Session-Id`), which is what lets a client hold a stream for the notifications of
/// its subscriptions and logs and get a wait's progress; every request still carries its
/// token, checked by the HTTP layer and against the session's owner. A session idle for
/// 5 minutes ends.
pub fn service(service: Arc<Service>) -> StreamableHttpService<McpServer, LocalSessionManager> {
    let tools = Arc::new(tools());
    StreamableHttpService::new(
        move || Ok(McpServer::new(service.clone(), tools.clone())),
        LocalSessionManager::default().into(),
        StreamableHttpServerConfig::default(),
    )
}
