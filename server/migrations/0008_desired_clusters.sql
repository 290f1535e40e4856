-- What each cluster hypd manages is meant to be: the request that made it (a creation's or
-- an import's) with every later change that finished applied, written by each operation's
-- own hook as it finishes (`cluster::managed`). `operation` is the last operation applied,
-- so a hook that runs again after a crash changes nothing. Stores written before this
-- table existed are filled from their operations when hypd starts (`cluster::replay`).
CREATE TABLE desired_clusters (
    name TEXT PRIMARY KEY,
    made_by TEXT NOT NULL,
    request TEXT NOT NULL,
    outputs TEXT NOT NULL,
    operation TEXT NOT NULL,
    updated_at TEXT NOT NULL
);
