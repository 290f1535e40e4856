-- Confirmations of destructive commands: issued with a plan by a first call, redeemed
-- once by the second. Only the hash of a confirmation is kept, like tokens. `answer` is
-- what the confirmed call answered, so replaying it answers the same.
CREATE TABLE confirmations (
    hash TEXT PRIMARY KEY,
    caller TEXT NOT NULL,
    command TEXT NOT NULL,
    request_hash TEXT NOT NULL,
    created_at TEXT NOT NULL,
    expires_at TEXT NOT NULL,
    used_at TEXT,
    answer TEXT
);
CREATE INDEX confirmations_expires ON confirmations (expires_at);
