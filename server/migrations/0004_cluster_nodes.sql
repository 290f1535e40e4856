-- The clusters' HyperPod node health as last observed (after a creation, on each
-- describe_cluster), so the cluster list shows it without asking AWS per row.
ALTER TABLE clusters ADD COLUMN nodes_total BIGINT;
ALTER TABLE clusters ADD COLUMN nodes_healthy BIGINT;
ALTER TABLE clusters ADD COLUMN nodes_pending BIGINT;
ALTER TABLE clusters ADD COLUMN nodes_unhealthy BIGINT;
ALTER TABLE clusters ADD COLUMN nodes_observed_at TEXT;
