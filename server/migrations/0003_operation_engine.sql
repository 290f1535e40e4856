-- The operations engine: an operation's plan (its stages), what it needs to resume after a
-- crash (spec, outputs), and the lease a worker holds while it advances it.

ALTER TABLE operations ADD COLUMN requested_by TEXT NOT NULL DEFAULT '';
-- The decoded request, as JSON: stages are run from it, so a restart needs nothing else.
ALTER TABLE operations ADD COLUMN spec TEXT NOT NULL DEFAULT '{}';
-- Typed stage outputs (vpc_id, eks_cluster_arn, ...), as one JSON object.
ALTER TABLE operations ADD COLUMN outputs TEXT NOT NULL DEFAULT '{}';
-- The failing stage's ApiError, as JSON.
ALTER TABLE operations ADD COLUMN error TEXT;
-- A caller-chosen key: unique for ever, so a re-sent request finds its operation.
ALTER TABLE operations ADD COLUMN idempotency_key TEXT;
-- SHA-256 of command + target + spec: the same request sent again while the first is
-- still in progress is the same operation.
ALTER TABLE operations ADD COLUMN request_hash TEXT NOT NULL DEFAULT '';
-- The target while the operation is unfinished, NULL after: the unique index below makes
-- the store itself refuse a second unfinished operation on one target.
ALTER TABLE operations ADD COLUMN active_target TEXT;
ALTER TABLE operations ADD COLUMN cancel_requested BIGINT NOT NULL DEFAULT 0;
-- When a worker should next advance it (NULL when finished).
ALTER TABLE operations ADD COLUMN next_run_at TEXT;
-- The worker advancing it, until when; an expired lease may be taken over.
ALTER TABLE operations ADD COLUMN lease_owner TEXT;
ALTER TABLE operations ADD COLUMN lease_until TEXT;

CREATE UNIQUE INDEX operations_idempotency_key ON operations (idempotency_key);
CREATE UNIQUE INDEX operations_active_target ON operations (active_target);
CREATE INDEX operations_next_run ON operations (next_run_at);

CREATE TABLE operation_stages (
    operation_id  TEXT NOT NULL REFERENCES operations (id),
    idx           BIGINT NOT NULL,
    name          TEXT NOT NULL,
    title         TEXT NOT NULL,
    state         TEXT NOT NULL CHECK (state IN ('pending', 'running', 'waiting', 'succeeded', 'failed', 'cancelled')),
    cancellable   BIGINT NOT NULL,
    attempts      BIGINT NOT NULL DEFAULT 0,
    -- Transient failures (throttling, 5xx) in a row: retried with backoff up to a limit.
    retries       BIGINT NOT NULL DEFAULT 0,
    started_at    TEXT,
    finished_at   TEXT,
    next_poll_at  TEXT,
    message       TEXT,
    error         TEXT,
    PRIMARY KEY (operation_id, idx)
);

-- Every transition, in order: the audit trail of what the engine did.
CREATE TABLE operation_events (
    id            TEXT PRIMARY KEY NOT NULL,
    operation_id  TEXT NOT NULL REFERENCES operations (id),
    at            TEXT NOT NULL,
    stage         TEXT,
    state         TEXT NOT NULL,
    message       TEXT
);

CREATE INDEX operation_events_operation ON operation_events (operation_id, at);

-- Each user's (token's) active cluster: the default target of later commands.
CREATE TABLE active_clusters (
    actor       TEXT PRIMARY KEY NOT NULL,
    cluster     TEXT NOT NULL REFERENCES clusters (name),
    updated_at  TEXT NOT NULL
);
