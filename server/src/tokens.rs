//! The commands that manage API tokens (admins only): create (the secret is answered
//! once and stored only as its hash), list, revoke. A token cannot revoke itself, so an
//! admin cannot lock the last admin out by accident.

use app::api::ApiError;
use app::api::tokens::{CreateToken, CreatedToken, ListTokens, RevokeToken, TokenInfo, TokenList};

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
    async fn handle(&self, actor: &Actor, r: RevokeToken) -> Result<TokenInfo, ApiError> {
        if r.name.as_str() == actor.name {
            return Err(ApiError::field(
                "name",
                "a token cannot revoke itself: use another admin token",
            ));
        }
        self.auth.revoke_token(r.name.as_str()).await
    }
}
