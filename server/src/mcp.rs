//! MCP for agents, over streamable HTTP at `/mcp` (and stdio through `hypd mcp`, which
//! relays to this endpoint). Tools are the command registry: names, descriptions, input
//! and output schemas and annotations come from it, and every call goes through the same
//! `dispatch` as REST and the console. A tool that fails returns the `ApiError` as a tool
//! error the agent can read; only protocol problems are JSON-RPC errors.

use std::sync::Arc;

use app::api::{ApiError, COMMANDS, CommandEntry, Effect, Role};
use rmcp::ErrorData as McpError;
use rmcp::handler::server::ServerHandler;
use rmcp::model::{
    CacheScope, CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock,
    Implementation, JsonObject, ListToolsResult, PaginatedRequestParams, ServerCapabilities,
    ServerConfig, Tool, ToolAnnotations,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use schemars::generate::SchemaSettings;
use serde_json::Value;

use crate::auth::Actor;
use crate::service::Service;

const INSTRUCTIONS: &str = "hypd manages GPU training and inference clusters on AWS (EKS + SageMaker HyperPod). \
Inspect before you change anything: whoami, list_clusters, list_regions, list_availability_zones, list_instance_types. \
Ask the user only decision-level questions (region, Availability Zone, instance type, capacity type), never about CIDRs, subnets or security groups. \
Every mutating tool returns an operation or names the tool that decides completion: follow it (wait_operation) to a final state and report that state, not the submission.";

/// One tool per command, with schemas inlined (MCP tools must be self-contained).
fn tools() -> Vec<(Role, Tool)> {
    let mut settings = SchemaSettings::draft2020_12();
    settings.inline_subschemas = true;
    let mut generator = settings.into_generator();
    COMMANDS
        .iter()
        .map(|entry| (entry.spec.role, tool(entry, &mut generator)))
        .collect()
}

fn as_object(schema: schemars::Schema) -> JsonObject {
    match serde_json::to_value(schema) {
        Ok(Value::Object(map)) => map,
        _ => JsonObject::new(),
    }
}

fn tool(entry: &CommandEntry, generator: &mut schemars::SchemaGenerator) -> Tool {
    let spec = entry.spec;
    let mut description = spec.description.to_owned();
    if let Some(status) = spec.status_command {
        description.push_str(&format!(" Completion: call {status}."));
    }
    let annotations = ToolAnnotations::with_title(spec.summary)
        .read_only(spec.effect == Effect::ReadOnly)
        .destructive(spec.effect == Effect::Destructive)
        .idempotent(spec.idempotent)
        .open_world(true);
    let input = as_object((entry.request_schema)(generator));
    let output = as_object((entry.output_schema)(generator));
    let mut tool = Tool::new(spec.name, description, Arc::new(input)).with_annotations(annotations);
    // MCP output schemas must describe an object.
    if output.get("type").and_then(Value::as_str) == Some("object") {
        tool = tool.with_raw_output_schema(Arc::new(output));
    }
    tool
}

#[derive(Clone)]
pub struct McpServer {
    service: Arc<Service>,
    tools: Arc<Vec<(Role, Tool)>>,
}

impl McpServer {
    pub fn new(service: Arc<Service>) -> Self {
        Self {
            service,
            tools: Arc::new(tools()),
        }
    }

    fn actor(context: &RequestContext<RoleServer>) -> Result<Actor, McpError> {
        context
            .extensions
            .get::<http::request::Parts>()
            .and_then(|p| p.extensions.get::<Actor>())
            .cloned()
            .ok_or_else(|| McpError::invalid_request("not authenticated", None))
    }
}

fn error_result(e: &ApiError) -> CallToolResult {
    let value = serde_json::to_value(e).unwrap_or_default();
    let mut result = CallToolResult::error(vec![ContentBlock::text(format!("{e}\n{value}"))]);
    result.structured_content = Some(serde_json::json!({ "error": value }));
    result
}

impl ServerHandler for McpServer {
    fn get_info(&self) -> ServerConfig {
        let mut server = Implementation::new("hypd", env!("CARGO_PKG_VERSION"));
        server.title = Some("hypd control plane".to_owned());
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(server)
            .with_instructions(INSTRUCTIONS)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let actor = Self::actor(&context)?;
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
        let actor = Self::actor(&context)?;
        let input = request.arguments.map(Value::Object).unwrap_or(Value::Null);
        let result = match self.service.dispatch(&actor, &request.name, input).await {
            Ok(output) => {
                let text = serde_json::to_string_pretty(&output).unwrap_or_default();
                let mut r = CallToolResult::success(vec![ContentBlock::text(text)]);
                if output.is_object() {
                    r.structured_content = Some(output);
                }
                r
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
}

/// The `/mcp` endpoint as a tower service. Sessions are not needed (every request carries
/// its token), so it runs stateless and answers plain JSON where it can.
pub fn service(service: Arc<Service>) -> StreamableHttpService<McpServer, LocalSessionManager> {
    let server = McpServer::new(service);
    let config = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(false)
        .with_json_response(true)
        .with_sse_keep_alive(None);
    StreamableHttpService::new(
        move || Ok(server.clone()),
        LocalSessionManager::default().into(),
        config,
    )
}
