//! Who is calling, on every face. REST and MCP send `Authorization: Bearer <token>`; the
//! console signs in with a token and then carries an HttpOnly, SameSite=Strict session
//! cookie. Secrets are stored only as SHA-256 hashes (they are 256-bit random, so a fast
//! hash is enough). A cookie alone never authorises a write or a WebSocket from another
//! origin.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use app::api::tokens::TokenInfo;
use app::api::{ApiError, Role};
use http::{HeaderMap, Method, header};
use sha2::{Digest, Sha256};

use crate::clock;
use crate::store::{Store, StoreError, on_pool};

pub const SESSION_COOKIE: &str = "hypd_session";
const SESSION_TTL: Duration = Duration::from_secs(12 * 3600);
const TOKEN_PREFIX: &str = "hypd_";
pub const ADMIN_TOKEN_FILE: &str = "admin-token";
const FIRST_ADMIN: &str = "admin";

/// Which door a call came through (kept in the audit log).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Face {
    Rest,
    Mcp,
    Console,
}

impl Face {
    pub fn as_str(self) -> &'static str {
        match self {
            Face::Rest => "rest",
            Face::Mcp => "mcp",
            Face::Console => "console",
        }
    }
}

/// An authenticated caller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Actor {
    /// The token's name.
    pub name: String,
    pub role: Role,
    pub face: Face,
}

/// 32 random bytes, hex: 256 bits of entropy.
pub(crate) fn random_hex() -> Result<String, ApiError> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| ApiError::internal(format!("no randomness: {e}")))?;
    Ok(hex(&bytes))
}

/// Lowercase hex without a `String` per byte: every request hashes its credential twice
/// (rate limit, then authentication).
fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0x0f)]));
    }
    out
}

pub fn hash_secret(secret: &str) -> String {
    hex(&Sha256::digest(secret.as_bytes()))
}

fn unauthorized(message: &str) -> ApiError {
    ApiError::Unauthorized {
        message: message.to_owned(),
    }
}

fn store_err(e: impl std::fmt::Display) -> ApiError {
    ApiError::internal(format!("store: {e}"))
}

type TokenRow = (String, String, String, Option<String>, Option<String>);

fn token_info((name, role, created_at, last_used_at, revoked_at): TokenRow) -> TokenInfo {
    TokenInfo {
        name,
        role: Role::parse(&role).unwrap_or(Role::Viewer),
        created_at,
        last_used_at,
        revoked_at,
    }
}

/// How long a verified token is trusted without asking the store again. Revocation is
/// immediate on the replica that revokes (it clears this cache) and takes at most this
/// long on the others.
/// Sessions are cached the same way, for the same bound: the live channel re-checks its
/// caller on every poll, and this keeps that off the store.
pub const TOKEN_CACHE_TTL: Duration = Duration::from_secs(2);

/// `last_used_at` is written at most this often per token: a token used a hundred
/// times a second must not cost a hundred writes, and a minute is as precise as anyone
/// reading "last used" needs.
const LAST_USED_EVERY: Duration = Duration::from_secs(60);

type TokenCache = std::sync::Mutex<HashMap<String, (String, Role, Instant)>>;

#[derive(Clone, Debug)]
pub struct Auth {
    store: Store,
    verified: Arc<TokenCache>,
    /// Session hashes verified recently, like `verified` for tokens.
    sessions: Arc<TokenCache>,
    /// When this replica last wrote each token's `last_used_at`.
    used: Arc<std::sync::Mutex<HashMap<String, Instant>>>,
}

impl Auth {
    pub fn new(store: Store) -> Self {
        Self {
            store,
            verified: Arc::default(),
            sessions: Arc::default(),
            used: Arc::default(),
        }
    }

    /// Records that token `name` was just used, unless that was recorded less than
    /// [`LAST_USED_EVERY`] ago (here, or by another replica: the store checks too).
    async fn touch(&self, name: &str) {
        let due = match self.used.lock() {
            Ok(mut used) => {
                let due = used
                    .get(name)
                    .is_none_or(|at| at.elapsed() >= LAST_USED_EVERY);
                if due {
                    used.insert(name.to_owned(), Instant::now());
                }
                due
            }
            Err(_) => false,
        };
        if !due {
            return;
        }
        let now = clock::now();
        let stale = clock::format_time(std::time::SystemTime::now() - LAST_USED_EVERY);
        let written = on_pool!(&self.store, |pool| sqlx::query(
            "UPDATE api_tokens SET last_used_at = $1 WHERE name = $2 \
             AND (last_used_at IS NULL OR last_used_at < $3)"
        )
        .bind(&now)
        .bind(name)
        .bind(&stale)
        .execute(pool)
        .await
        .map(drop));
        if let Err(e) = written {
            // Not worth failing a request over: the next use tries again.
            if let Ok(mut used) = self.used.lock() {
                used.remove(name);
            }
            tracing::warn!(token = name, error = %e, "cannot record the token's last use");
        }
    }

    /// On the first start (no token at all) creates the `admin` token, writes it to
    /// `<data dir>/admin-token` with mode 0600 and returns it so it can be printed once.
    pub async fn ensure_first_admin(
        &self,
        data_dir: &Path,
    ) -> Result<Option<(String, PathBuf)>, ApiError> {
        let count: i64 = on_pool!(&self.store, |pool| sqlx::query_scalar(
            "SELECT COUNT(*) FROM api_tokens"
        )
        .fetch_one(pool)
        .await)
        .map_err(store_err)?;
        if count > 0 {
            return Ok(None);
        }
        let secret = match self.insert_token(FIRST_ADMIN, Role::Admin).await {
            Ok((_, secret)) => secret,
            // Another replica created it first.
            Err(ApiError::Conflict { .. }) => return Ok(None),
            Err(e) => return Err(e),
        };
        let path = data_dir.join(ADMIN_TOKEN_FILE);
        write_private(&path, &format!("{secret}\n"))
            .map_err(|e| ApiError::internal(format!("cannot write {}: {e}", path.display())))?;
        Ok(Some((secret, path)))
    }

    async fn insert_token(&self, name: &str, role: Role) -> Result<(TokenInfo, String), ApiError> {
        let secret = format!("{TOKEN_PREFIX}{}", random_hex()?);
        let now = clock::now();
        let result = on_pool!(&self.store, |pool| {
            sqlx::query(
            "INSERT INTO api_tokens (name, role, secret_hash, created_at) VALUES ($1, $2, $3, $4)"
        )
        .bind(name)
        .bind(role.as_str())
        .bind(hash_secret(&secret))
        .bind(&now)
        .execute(pool)
        .await
        .map(drop)
        });
        match result {
            Ok(()) => Ok((
                TokenInfo {
                    name: name.to_owned(),
                    role,
                    created_at: now,
                    last_used_at: None,
                    revoked_at: None,
                },
                secret,
            )),
            Err(sqlx::Error::Database(e)) if e.is_unique_violation() => Err(ApiError::Conflict {
                message: format!("a token named {name} already exists"),
                operation_id: None,
                field: Some("name".to_owned()),
            }),
            Err(e) => Err(store_err(e)),
        }
    }

    pub async fn create_token(
        &self,
        name: &str,
        role: Role,
    ) -> Result<(TokenInfo, String), ApiError> {
        self.insert_token(name, role).await
    }

    pub async fn list_tokens(&self) -> Result<Vec<TokenInfo>, ApiError> {
        let rows: Vec<TokenRow> = on_pool!(&self.store, |pool| {
            sqlx::query_as(
            "SELECT name, role, created_at, last_used_at, revoked_at FROM api_tokens ORDER BY name"
        )
        .fetch_all(pool)
        .await
        })
        .map_err(store_err)?;
        Ok(rows.into_iter().map(token_info).collect())
    }

    /// Revokes a token and ends its sessions. Revoking twice changes nothing.
    pub async fn revoke_token(&self, name: &str) -> Result<TokenInfo, ApiError> {
        let now = clock::now();
        for cache in [&self.verified, &self.sessions] {
            if let Ok(mut cache) = cache.lock() {
                cache.retain(|_, (token, _, _)| token != name);
            }
        }
        on_pool!(&self.store, |pool| async {
            let mut tx = pool.begin().await?;
            sqlx::query(
                "UPDATE api_tokens SET revoked_at = $1 WHERE name = $2 AND revoked_at IS NULL",
            )
            .bind(&now)
            .bind(name)
            .execute(&mut *tx)
            .await?;
            sqlx::query("DELETE FROM sessions WHERE token_name = $1")
                .bind(name)
                .execute(&mut *tx)
                .await?;
            tx.commit().await
        }
        .await)
        .map_err(store_err)?;
        let row: Option<TokenRow> = on_pool!(&self.store, |pool| sqlx::query_as(
            "SELECT name, role, created_at, last_used_at, revoked_at FROM api_tokens WHERE name = $1"
        )
        .bind(name)
        .fetch_optional(pool)
        .await)
        .map_err(store_err)?;
        row.map(token_info).ok_or_else(|| ApiError::NotFound {
            resource: "token".into(),
            name: name.into(),
        })
    }

    /// The live token a secret belongs to.
    async fn token_for_secret(&self, secret: &str) -> Result<(String, Role), ApiError> {
        let (name, role) = self.verify_secret(secret).await?;
        self.touch(&name).await;
        Ok((name, role))
    }

    async fn verify_secret(&self, secret: &str) -> Result<(String, Role), ApiError> {
        let hash = hash_secret(secret);
        if let Some(hit) = cached(&self.verified, &hash) {
            return Ok(hit);
        }
        let row: Option<(String, String)> = on_pool!(&self.store, |pool| sqlx::query_as(
            "SELECT name, role FROM api_tokens WHERE secret_hash = $1 AND revoked_at IS NULL"
        )
        .bind(&hash)
        .fetch_optional(pool)
        .await)
        .map_err(store_err)?;
        let (name, role) =
            row.ok_or_else(|| unauthorized("the token is not valid (unknown or revoked)"))?;
        let role = Role::parse(&role)
            .ok_or_else(|| ApiError::internal("stored token has an unknown role"))?;
        remember(&self.verified, hash, &name, role);
        Ok((name, role))
    }

    /// Signs in to the console: a session for the token, as a cookie secret.
    pub async fn login(&self, token: &str) -> Result<(String, Actor), ApiError> {
        let (name, role) = self.token_for_secret(token.trim()).await?;
        let session = random_hex()?;
        on_pool!(&self.store, |pool| sqlx::query(
            "INSERT INTO sessions (id_hash, token_name, created_at, expires_at) VALUES ($1, $2, $3, $4)"
        )
        .bind(hash_secret(&session))
        .bind(&name)
        .bind(clock::now())
        .bind(clock::after(SESSION_TTL))
        .execute(pool)
        .await
        .map(drop))
        .map_err(store_err)?;
        Ok((
            session,
            Actor {
                name,
                role,
                face: Face::Console,
            },
        ))
    }

    pub async fn logout(&self, session: &str) -> Result<(), ApiError> {
        let hash = hash_secret(session);
        if let Ok(mut cache) = self.sessions.lock() {
            cache.remove(&hash);
        }
        on_pool!(&self.store, |pool| sqlx::query(
            "DELETE FROM sessions WHERE id_hash = $1"
        )
        .bind(&hash)
        .execute(pool)
        .await
        .map(drop))
        .map_err(store_err)
    }

    async fn actor_for_session(&self, session: &str) -> Result<(String, Role), ApiError> {
        let hash = hash_secret(session);
        let (name, role) = match cached(&self.sessions, &hash) {
            Some(hit) => hit,
            None => {
                let found = self.session_row(&hash).await?;
                remember(&self.sessions, hash, &found.0, found.1);
                found
            }
        };
        self.touch(&name).await;
        Ok((name, role))
    }

    async fn session_row(&self, hash: &str) -> Result<(String, Role), ApiError> {
        let row: Option<(String, String)> = on_pool!(&self.store, |pool| sqlx::query_as(
            "SELECT t.name, t.role FROM sessions s JOIN api_tokens t ON t.name = s.token_name \
             WHERE s.id_hash = $1 AND s.expires_at > $2 AND t.revoked_at IS NULL"
        )
        .bind(hash)
        .bind(clock::now())
        .fetch_optional(pool)
        .await)
        .map_err(store_err)?;
        let (name, role) =
            row.ok_or_else(|| unauthorized("the session has expired or was ended: sign in again"))?;
        let role = Role::parse(&role)
            .ok_or_else(|| ApiError::internal("stored token has an unknown role"))?;
        Ok((name, role))
    }

    /// Whether the credential a live stream (a WebSocket, an MCP subscription) was opened
    /// with is refused now, through the 2 s token and session caches. A store that
    /// cannot answer is not a revocation: only a refusal ends the stream.
    pub async fn revoked(&self, headers: &HeaderMap, method: &Method, face: Face) -> bool {
        matches!(
            self.authenticate(headers, method, face).await,
            Err(ApiError::Unauthorized { .. } | ApiError::Forbidden { .. })
        )
    }

    /// Authenticates a request. A bearer token wins; otherwise the session cookie, which
    /// for anything but a plain read (and for WebSocket upgrades) must come from our own
    /// origin.
    pub async fn authenticate(
        &self,
        headers: &HeaderMap,
        method: &Method,
        face: Face,
    ) -> Result<Actor, ApiError> {
        if let Some(value) = headers.get(header::AUTHORIZATION) {
            let value = value.to_str().unwrap_or_default();
            let token = value
                .strip_prefix("Bearer ")
                .or_else(|| value.strip_prefix("bearer "))
                .ok_or_else(|| unauthorized("the Authorization header must be `Bearer <token>`"))?;
            let (name, role) = self.token_for_secret(token.trim()).await?;
            return Ok(Actor { name, role, face });
        }
        if let Some(session) = session_cookie(headers) {
            let is_upgrade = headers.contains_key(header::UPGRADE);
            if (!matches!(*method, Method::GET | Method::HEAD) || is_upgrade)
                && !same_origin(headers)
            {
                return Err(ApiError::Forbidden {
                    message:
                        "cross-origin request refused: the Origin header must match this console"
                            .into(),
                });
            }
            let (name, role) = self.actor_for_session(&session).await?;
            return Ok(Actor { name, role, face });
        }
        Err(unauthorized(
            "authentication required: send `Authorization: Bearer <token>` (the first admin token is in <data dir>/admin-token)",
        ))
    }
}

/// A verification made less than [`TOKEN_CACHE_TTL`] ago.
fn cached(cache: &TokenCache, hash: &str) -> Option<(String, Role)> {
    let cache = cache.lock().ok()?;
    let (name, role, at) = cache.get(hash)?;
    (at.elapsed() < TOKEN_CACHE_TTL).then(|| (name.clone(), *role))
}

fn remember(cache: &TokenCache, hash: String, name: &str, role: Role) {
    if let Ok(mut cache) = cache.lock() {
        cache.retain(|_, (_, _, at)| at.elapsed() < TOKEN_CACHE_TTL);
        cache.insert(hash, (name.to_owned(), role, Instant::now()));
    }
}

/// Forbidden unless the actor's role reaches the command's.
pub fn authorize(actor: &Actor, needed: Role, command: &str) -> Result<(), ApiError> {
    if actor.role >= needed {
        Ok(())
    } else {
        Err(ApiError::Forbidden {
            message: format!(
                "{command} needs the {} role; token {} has {}",
                needed.as_str(),
                actor.name,
                actor.role.as_str()
            ),
        })
    }
}

pub fn session_cookie(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == SESSION_COOKIE)
        .map(|(_, v)| v.to_owned())
}

/// The Origin header names the host this request was sent to.
pub fn same_origin(headers: &HeaderMap) -> bool {
    let origin = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok());
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok());
    match (origin, host) {
        (Some(origin), Some(host)) => {
            let authority = origin
                .strip_prefix("http://")
                .or_else(|| origin.strip_prefix("https://"));
            authority == Some(host)
        }
        _ => false,
    }
}

/// The request reached a proxy over HTTPS (`X-Forwarded-Proto: https`, or
/// `Forwarded: proto=https`): its cookies must then be `Secure`, so a browser never sends
/// them over plain HTTP. hypd itself serves plain HTTP (loopback, SSM tunnels), where a
/// `Secure` cookie would never come back.
pub fn via_https(headers: &HeaderMap) -> bool {
    let forwarded_proto = headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(',').next())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("https"));
    let forwarded = headers
        .get_all(header::FORWARDED)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split([';', ',']))
        .filter_map(|kv| kv.trim().split_once('='))
        .any(|(k, v)| {
            k.eq_ignore_ascii_case("proto") && v.trim_matches('"').eq_ignore_ascii_case("https")
        });
    forwarded_proto || forwarded
}

pub fn session_set_cookie(session: &str, secure: bool) -> String {
    format!(
        "{SESSION_COOKIE}={session}; HttpOnly; SameSite=Strict; Path=/; Max-Age={}{}",
        SESSION_TTL.as_secs(),
        if secure { "; Secure" } else { "" }
    )
}

pub fn session_clear_cookie(secure: bool) -> String {
    format!(
        "{SESSION_COOKIE}=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0{}",
        if secure { "; Secure" } else { "" }
    )
}

fn write_private(path: &Path, contents: &str) -> std::io::Result<()> {
    use std::io::Write;
    let mut opts = std::fs::File::options();
    opts.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    let mut f = opts.open(path)?;
    f.write_all(contents.as_bytes())
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        store_err(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Database;

    async fn auth() -> (Auth, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&Database::Sqlite(dir.path().join("hypd.db")))
            .await
            .unwrap();
        (Auth::new(store), dir)
    }

    fn bearer(token: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            header::AUTHORIZATION,
            format!("Bearer {token}").parse().unwrap(),
        );
        h
    }

    #[tokio::test]
    async fn first_admin_is_created_once_and_written_privately() {
        let (auth, dir) = auth().await;
        let (secret, path) = auth.ensure_first_admin(dir.path()).await.unwrap().unwrap();
        assert!(secret.starts_with("hypd_") && secret.len() == 69);
        assert_eq!(std::fs::read_to_string(&path).unwrap().trim(), secret);
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert!(auth.ensure_first_admin(dir.path()).await.unwrap().is_none());
        let actor = auth
            .authenticate(&bearer(&secret), &Method::POST, Face::Rest)
            .await
            .unwrap();
        assert_eq!((actor.name.as_str(), actor.role), ("admin", Role::Admin));
    }

    #[tokio::test]
    async fn revoked_and_unknown_tokens_are_refused() {
        let (auth, _dir) = auth().await;
        let (_, secret) = auth.create_token("ci", Role::Viewer).await.unwrap();
        assert!(
            auth.authenticate(&bearer(&secret), &Method::GET, Face::Mcp)
                .await
                .is_ok()
        );
        assert!(matches!(
            auth.create_token("ci", Role::Admin).await,
            Err(ApiError::Conflict { .. })
        ));
        let info = auth.revoke_token("ci").await.unwrap();
        assert!(info.revoked_at.is_some());
        let again = auth.revoke_token("ci").await.unwrap();
        assert_eq!(
            again.revoked_at, info.revoked_at,
            "revoking twice changes nothing"
        );
        let err = auth
            .authenticate(&bearer(&secret), &Method::GET, Face::Mcp)
            .await
            .unwrap_err();
        assert!(matches!(err, ApiError::Unauthorized { .. }));
        let err = auth
            .authenticate(&bearer("hypd_nope"), &Method::GET, Face::Rest)
            .await
            .unwrap_err();
        assert!(matches!(err, ApiError::Unauthorized { .. }));
        let err = auth
            .authenticate(&HeaderMap::new(), &Method::GET, Face::Rest)
            .await
            .unwrap_err();
        assert!(matches!(err, ApiError::Unauthorized { .. }));
    }

    #[tokio::test]
    async fn session_cookies_check_origin_for_writes() {
        let (auth, _dir) = auth().await;
        let (_, secret) = auth.create_token("alice", Role::Operator).await.unwrap();
        let (session, _) = auth.login(&secret).await.unwrap();
        let mut h = HeaderMap::new();
        h.insert(
            header::COOKIE,
            format!("theme=dark; {SESSION_COOKIE}={session}")
                .parse()
                .unwrap(),
        );
        h.insert(header::HOST, "127.0.0.1:3099".parse().unwrap());
        // A read needs no Origin.
        assert_eq!(
            auth.authenticate(&h, &Method::GET, Face::Console)
                .await
                .unwrap()
                .name,
            "alice"
        );
        // A write from elsewhere is refused, from here accepted.
        h.insert(header::ORIGIN, "http://evil.example".parse().unwrap());
        assert!(matches!(
            auth.authenticate(&h, &Method::POST, Face::Console).await,
            Err(ApiError::Forbidden { .. })
        ));
        h.insert(header::ORIGIN, "http://127.0.0.1:3099".parse().unwrap());
        assert!(
            auth.authenticate(&h, &Method::POST, Face::Console)
                .await
                .is_ok()
        );
        // Revoking the token ends the session.
        auth.revoke_token("alice").await.unwrap();
        assert!(matches!(
            auth.authenticate(&h, &Method::GET, Face::Console).await,
            Err(ApiError::Unauthorized { .. })
        ));
    }

    async fn last_used(auth: &Auth, name: &str) -> Option<String> {
        auth.list_tokens()
            .await
            .unwrap()
            .into_iter()
            .find(|t| t.name == name)
            .unwrap()
            .last_used_at
    }

    #[tokio::test]
    async fn last_use_is_recorded_once_a_minute() {
        let (auth, _dir) = auth().await;
        let (_, secret) = auth.create_token("ci", Role::Viewer).await.unwrap();
        assert_eq!(last_used(&auth, "ci").await, None);
        auth.authenticate(&bearer(&secret), &Method::GET, Face::Rest)
            .await
            .unwrap();
        let first = last_used(&auth, "ci").await.expect("written on first use");
        // Pretend it was written long ago, in the store only: this replica's throttle
        // still holds, so a use now writes nothing.
        on_pool!(&auth.store, |pool| sqlx::query(
            "UPDATE api_tokens SET last_used_at = '2020-01-01T00:00:00.000Z'"
        )
        .execute(pool)
        .await
        .map(drop))
        .unwrap();
        auth.authenticate(&bearer(&secret), &Method::GET, Face::Rest)
            .await
            .unwrap();
        assert_eq!(
            last_used(&auth, "ci").await.as_deref(),
            Some("2020-01-01T00:00:00.000Z")
        );
        // A minute on, the next use writes it again.
        auth.used.lock().unwrap().clear();
        auth.authenticate(&bearer(&secret), &Method::GET, Face::Rest)
            .await
            .unwrap();
        let again = last_used(&auth, "ci").await.unwrap();
        assert!(again >= first, "{again} < {first}");
    }

    #[test]
    fn hashes_are_lowercase_hex_sha256() {
        assert_eq!(
            hash_secret("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn cookies_are_secure_behind_https() {
        let mut h = HeaderMap::new();
        assert!(!via_https(&h));
        assert!(!session_set_cookie("s", via_https(&h)).contains("Secure"));
        h.insert("x-forwarded-proto", "https".parse().unwrap());
        assert!(via_https(&h));
        assert!(session_set_cookie("s", true).ends_with("; Secure"));
        let mut h = HeaderMap::new();
        h.insert(
            header::FORWARDED,
            "for=10.0.0.1;proto=https;host=hypd.example"
                .parse()
                .unwrap(),
        );
        assert!(via_https(&h));
        h.insert(header::FORWARDED, "proto=http".parse().unwrap());
        assert!(!via_https(&h));
    }

    #[test]
    fn roles_are_ordered() {
        let viewer = Actor {
            name: "v".into(),
            role: Role::Viewer,
            face: Face::Rest,
        };
        assert!(authorize(&viewer, Role::Viewer, "list_clusters").is_ok());
        let err = authorize(&viewer, Role::Operator, "create_cluster").unwrap_err();
        assert_eq!(
            err.to_string(),
            "create_cluster needs the operator role; token v has viewer"
        );
    }
}
