//! Pruning what the store only accumulates: expired console sessions (as soon as they
//! expire), confirmations a day after they expire, the audit log after `audit_days`, and the events of finished operations
//! after `event_days`. Operations, their stages and tokens are kept: they are the record
//! of what exists. Deletes run in small batches so neither store is locked for long,
//! and every replica may run them (a row is deleted once, whoever gets to it).

use std::time::Duration;

use crate::clock;
use crate::store::{Store, StoreError, on_pool};

pub use crate::config::Retention;

/// How often the pruning runs.
const EVERY: Duration = Duration::from_secs(3600);
/// Rows per delete statement.
const BATCH: i64 = 5000;

/// What one pass deleted.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Pruned {
    pub sessions: u64,
    /// Confirmations a day past their expiry (kept that long so a confirmed call can
    /// be replayed).
    pub confirmations: u64,
    pub audit: u64,
    pub events: u64,
}

fn cutoff(days: u32) -> Option<String> {
    (days > 0).then(|| {
        clock::format_time(
            std::time::SystemTime::now() - Duration::from_secs(u64::from(days) * 86_400),
        )
    })
}

/// Repeats `sql` (a batched DELETE bound to `$1` and `$2` = batch size) until a batch
/// comes back short.
async fn delete_batched(store: &Store, sql: &str, bound: &str) -> Result<u64, StoreError> {
    let mut total = 0;
    loop {
        let n = on_pool!(store, |pool| sqlx::query(sql)
            .bind(bound)
            .bind(BATCH)
            .execute(pool)
            .await
            .map(|r| r.rows_affected()))?;
        total += n;
        if n < BATCH as u64 {
            return Ok(total);
        }
    }
}

/// One pass of the policy.
pub async fn prune(store: &Store, policy: Retention) -> Result<Pruned, StoreError> {
    let mut pruned = Pruned {
        sessions: delete_batched(
            store,
            "DELETE FROM sessions WHERE id_hash IN \
             (SELECT id_hash FROM sessions WHERE expires_at <= $1 LIMIT $2)",
            &clock::now(),
        )
        .await?,
        confirmations: delete_batched(
            store,
            "DELETE FROM confirmations WHERE hash IN \
             (SELECT hash FROM confirmations WHERE expires_at <= $1 LIMIT $2)",
            &clock::format_time(std::time::SystemTime::now() - Duration::from_secs(86_400)),
        )
        .await?,
        ..Pruned::default()
    };
    if let Some(before) = cutoff(policy.audit_days) {
        pruned.audit = delete_batched(
            store,
            "DELETE FROM audit_log WHERE id IN \
             (SELECT id FROM audit_log WHERE at < $1 ORDER BY at LIMIT $2)",
            &before,
        )
        .await?;
    }
    if let Some(before) = cutoff(policy.event_days) {
        pruned.events = delete_batched(
            store,
            "DELETE FROM operation_events WHERE id IN \
             (SELECT e.id FROM operation_events e JOIN operations o ON o.id = e.operation_id \
              WHERE e.at < $1 AND o.state IN ('succeeded', 'failed', 'cancelled') LIMIT $2)",
            &before,
        )
        .await?;
    }
    Ok(pruned)
}

/// Prunes now and then every hour, for the life of the process.
pub async fn run(store: Store, policy: Retention) {
    let mut tick = tokio::time::interval(EVERY);
    loop {
        tick.tick().await;
        match prune(&store, policy).await {
            Ok(p) if p != Pruned::default() => tracing::info!(
                sessions = p.sessions,
                confirmations = p.confirmations,
                audit = p.audit,
                events = p.events,
                "pruned the store"
            ),
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "cannot prune the store"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Database;

    async fn exec(store: &Store, sql: &str) {
        on_pool!(store, |pool| sqlx::query(sql).execute(pool).await.map(drop)).unwrap();
    }

    async fn count(store: &Store, table: &str) -> i64 {
        let sql = format!("SELECT COUNT(*) FROM {table}");
        on_pool!(store, |pool| sqlx::query_scalar(&sql).fetch_one(pool).await).unwrap()
    }

    #[tokio::test]
    async fn old_rows_go_and_recent_or_unfinished_ones_stay() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&Database::Sqlite(dir.path().join("hypd.db")))
            .await
            .unwrap();
        let now = clock::now();
        let old = "2020-01-01T00:00:00.000Z";
        exec(&store, "INSERT INTO api_tokens (name, role, secret_hash, created_at) VALUES ('t', 'admin', 'h', 'x')").await;
        exec(&store, &format!("INSERT INTO sessions VALUES ('gone', 't', '{old}', '{old}'), ('live', 't', '{now}', '9999-01-01T00:00:00.000Z')")).await;
        exec(&store, &format!("INSERT INTO audit_log (id, at, actor, face, command, request, outcome) VALUES ('a1', '{old}', 't', 'rest', 'c', '{{}}', 'ok'), ('a2', '{now}', 't', 'rest', 'c', '{{}}', 'ok')")).await;
        exec(&store, &format!("INSERT INTO operations (id, command, target, state, created_at, updated_at) VALUES ('done', 'c', 'x', 'succeeded', '{old}', '{old}'), ('busy', 'c', 'y', 'running', '{old}', '{old}')")).await;
        exec(&store, &format!("INSERT INTO operation_events (id, operation_id, at, state) VALUES ('e1', 'done', '{old}', 'succeeded'), ('e2', 'busy', '{old}', 'running'), ('e3', 'done', '{now}', 'succeeded')")).await;
        let soon = clock::after(Duration::from_secs(300));
        exec(&store, &format!("INSERT INTO confirmations (hash, caller, command, request_hash, created_at, expires_at) VALUES ('c1', 't', 'c', 'r', '{old}', '{old}'), ('c2', 't', 'c', 'r', '{now}', '{soon}')")).await;

        let pruned = prune(&store, Retention::DEFAULT).await.unwrap();
        assert_eq!(
            pruned,
            Pruned {
                sessions: 1,
                confirmations: 1,
                audit: 1,
                events: 1
            }
        );
        assert_eq!(count(&store, "confirmations").await, 1);
        assert_eq!(count(&store, "sessions").await, 1);
        assert_eq!(count(&store, "audit_log").await, 1);
        assert_eq!(count(&store, "operation_events").await, 2);
        assert_eq!(count(&store, "operations").await, 2, "operations are kept");

        // 0 keeps for ever.
        exec(&store, &format!("INSERT INTO audit_log (id, at, actor, face, command, request, outcome) VALUES ('a3', '{old}', 't', 'rest', 'c', '{{}}', 'ok')")).await;
        let kept = prune(
            &store,
            Retention {
                audit_days: 0,
                event_days: 0,
            },
        )
        .await
        .unwrap();
        assert_eq!(kept, Pruned::default());
        assert_eq!(count(&store, "audit_log").await, 2);
    }
}
