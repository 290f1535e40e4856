-- A counter per table whose whole content is served from a cache: every write of the
-- table bumps it in the same transaction, so a list rendered at revision n is still the
-- table's content while the counter reads n, on every replica sharing the database.
CREATE TABLE revisions (
    name TEXT PRIMARY KEY,
    revision BIGINT NOT NULL
);
INSERT INTO revisions (name, revision) VALUES ('clusters', 0);
