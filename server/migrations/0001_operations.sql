-- Operations: every mutation is a row before anything is called (see docs/ARCHITECTURE.md).
-- Portable SQL: the same files migrate SQLite and PostgreSQL. Timestamps are RFC 3339
-- UTC text written by hypd, so both backends sort and compare them alike.
CREATE TABLE operations (
    id          TEXT PRIMARY KEY NOT NULL,
    command     TEXT NOT NULL,
    target      TEXT NOT NULL,
    state       TEXT NOT NULL CHECK (state IN ('pending', 'running', 'waiting', 'succeeded', 'failed', 'cancelled')),
    created_at  TEXT NOT NULL,
    updated_at  TEXT NOT NULL
);

CREATE INDEX operations_state ON operations (state);
CREATE INDEX operations_target ON operations (target);
