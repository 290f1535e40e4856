-- Reads that order or filter by time: the operation lists (newest first, optionally by
-- state or target), the live channel's change poll (updated_at after a cursor), and the
-- pruning of old events, audit rows and expired sessions. Without them each is a scan
-- and sort of the whole table.
CREATE INDEX operations_created ON operations (created_at, id);
CREATE INDEX operations_updated ON operations (updated_at, id);
CREATE INDEX operations_state_created ON operations (state, created_at);
CREATE INDEX operations_target_created ON operations (target, created_at);
CREATE INDEX operation_events_at ON operation_events (at);
CREATE INDEX sessions_expires ON sessions (expires_at);
