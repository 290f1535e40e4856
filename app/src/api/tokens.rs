//! API tokens: how people and agents authenticate on every face. Tokens are shown once
//! and stored only as hashes; roles are viewer, operator and admin.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::command::{Command, CommandSpec, Effect, HttpMethod, Role};
use super::plan::Gated;
use super::values::{Confirmation, TokenName};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct TokenInfo {
    pub name: String,
    pub role: Role,
    pub created_at: String,
    pub last_used_at: Option<String>,
    pub revoked_at: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateToken {
    pub name: TokenName,
    pub role: Role,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct CreatedToken {
    pub info: TokenInfo,
    /// The secret, shown this once: store it now.
    pub token: String,
}

impl Command for CreateToken {
    type Output = CreatedToken;
    const SPEC: CommandSpec = CommandSpec {
        name: "create_token",
        summary: "Create an API token with a role (viewer, operator or admin)",
        description: "Creates a named API token with a role and returns its secret once; hypd keeps only a hash.",
        effect: Effect::Mutating,
        role: Role::Admin,
        idempotent: false,
        status_command: Some("list_tokens"),
        method: HttpMethod::Post,
        path: "/api/v1/tokens",
    };
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListTokens {}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct TokenList {
    pub tokens: Vec<TokenInfo>,
}

impl Command for ListTokens {
    type Output = TokenList;
    const SPEC: CommandSpec = CommandSpec {
        name: "list_tokens",
        summary: "List API tokens (names, roles, last use; never the secrets)",
        description: "Every API token's name, role, last use and whether it was revoked; never secrets.",
        effect: Effect::ReadOnly,
        role: Role::Admin,
        idempotent: true,
        status_command: None,
        method: HttpMethod::Get,
        path: "/api/v1/tokens",
    };
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RevokeToken {
    pub name: TokenName,
    /// Only answer with the plan: what would be revoked. Nothing is changed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dry_run: bool,
    /// The confirmation the same call without one returned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confirmation: Option<Confirmation>,
}

impl Command for RevokeToken {
    type Output = Gated<TokenInfo>;
    const SPEC: CommandSpec = CommandSpec {
        name: "revoke_token",
        summary: "Revoke an API token; it stops working at once",
        description: "Revokes a token and ends its console sessions; a token cannot revoke itself. The first call returns the plan and a confirmation; call again with it once the user agrees.",
        effect: Effect::Destructive,
        role: Role::Admin,
        idempotent: true,
        status_command: Some("list_tokens"),
        method: HttpMethod::Delete,
        path: "/api/v1/tokens/{name}",
    };

    super::command::gated_request!();
}
