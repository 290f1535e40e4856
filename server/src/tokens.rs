//! The commands that manage API tokens (admins only): create (the secret is answered
//! once and stored only as its hash), list, revoke. A token cannot revoke itself, so an
//! admin cannot lock the last admin out by accident.

use app::api::plan::{Action, Change, Gated, Plan, StagePlan};
use app::api::tokens::{CreateToken, CreatedToken, ListTokens, RevokeToken, TokenInfo, TokenList};
use app::api::{ApiError, Command};

use crate::auth::Actor;
use crate::service::{Handler, Service};

impl Handler<CreateToken> for Service {
    async fn handle(&self, _: &Actor, r: CreateToken) -> Result<CreatedToken, ApiError> {
        let (info, token) = self.auth.create_token(r.name.as_str(), r.role).await?;
        Ok(CreatedToken { info, token })
    }
}

impl Handler<ListTokens> for Service {
    async fn handle(&self, _: &Actor, _: ListTokens) -> Result<TokenList, ApiError> {
        Ok(TokenList {
            tokens: self.auth.list_tokens().await?,
        })
    }
}

impl Handler<RevokeToken> for Service {
    async fn handle(&self, actor: &Actor, r: RevokeToken) -> Result<Gated<TokenInfo>, ApiError> {
        not_itself(actor, &r)?;
        self.auth
            .revoke_token(r.name.as_str())
            .await
            .map(Gated::Done)
    }

    async fn preview(&self, actor: &Actor, r: RevokeToken) -> Result<Plan, ApiError> {
        not_itself(actor, &r)?;
        let name = r.name.as_str();
        let token = self
            .auth
            .list_tokens()
            .await?
            .into_iter()
            .find(|t| t.name == name)
            .ok_or_else(|| ApiError::NotFound {
                resource: "token".into(),
                name: name.to_owned(),
            })?;
        // Revoking a revoked token changes nothing, and the plan says so.
        let changes = if token.revoked_at.is_some() {
            Vec::new()
        } else {
            vec![Change::new(Action::Delete, "hypd:Token", name)]
        };
        Ok(Plan {
            command: RevokeToken::SPEC.name.to_owned(),
            target: format!("token/{name}"),
            stages: vec![StagePlan {
                stage: "revoke".to_owned(),
                title: "Revoke the token and end its console sessions".to_owned(),
                changes,
            }],
        })
    }
}

fn not_itself(actor: &Actor, r: &RevokeToken) -> Result<(), ApiError> {
    if r.name.as_str() == actor.name {
        return Err(ApiError::field(
            "name",
            "a token cannot revoke itself: use another admin token",
        ));
    }
    Ok(())
}
