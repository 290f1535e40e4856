-- API tokens: only a SHA-256 of the secret is kept; the secret is shown once.
CREATE TABLE api_tokens (
    name          TEXT PRIMARY KEY NOT NULL,
    role          TEXT NOT NULL CHECK (role IN ('viewer', 'operator', 'admin')),
    secret_hash   TEXT NOT NULL UNIQUE,
    created_at    TEXT NOT NULL,
    last_used_at  TEXT,
    revoked_at    TEXT
);

-- Console sessions (HttpOnly cookie); the cookie holds a secret, the row its hash.
CREATE TABLE sessions (
    id_hash     TEXT PRIMARY KEY NOT NULL,
    token_name  TEXT NOT NULL REFERENCES api_tokens (name),
    created_at  TEXT NOT NULL,
    expires_at  TEXT NOT NULL
);

CREATE INDEX sessions_token ON sessions (token_name);

-- Every mutation, whichever face it came through.
CREATE TABLE audit_log (
    id          TEXT PRIMARY KEY NOT NULL,
    at          TEXT NOT NULL,
    actor       TEXT NOT NULL,
    face        TEXT NOT NULL,
    command     TEXT NOT NULL,
    request     TEXT NOT NULL,
    outcome     TEXT NOT NULL,
    detail      TEXT
);

CREATE INDEX audit_log_at ON audit_log (at);

-- The clusters hypd manages (created or imported).
CREATE TABLE clusters (
    name                  TEXT PRIMARY KEY NOT NULL,
    region                TEXT NOT NULL,
    status                TEXT NOT NULL,
    kubernetes_version    TEXT,
    eks_cluster_arn       TEXT,
    hyperpod_cluster_arn  TEXT,
    created_at            TEXT NOT NULL,
    updated_at            TEXT NOT NULL
);
