//! Store reads at scale: `list_operations` (no filter, by state, by target) and the live
//! channel's change poll (`changed_since`, run every 250 ms per open console tab), with
//! `HYPD_BENCH_STORE_OPS` operations (default 100,000) of nine stages each in the store,
//! and one pass of the retention pruning over them. SQLite in a temporary directory by
//! default; `HYPD_BENCH_DATABASE_URL=postgres://…` measures a PostgreSQL database
//! instead (it must be empty: the bench fills it).
//!
//! `cargo bench -p server --bench store` prints the median and p95 of each read. Under
//! `cargo test` (no `--bench` argument) it runs a smoke-sized pass of 2,000 operations:
//! the full fill alone takes about a minute of CI's time for figures nobody reads there.

use std::time::{Duration, Instant, SystemTime};

use app::api::operations::OperationState;
use hypd::config::Database;
use hypd::store::Store;
use hypd::{clock, operation, retention};

const STAGES: [&str; 9] = [
    "network",
    "iam",
    "eks",
    "access",
    "activate",
    "addons",
    "components",
    "hyperpod",
    "storage",
];

/// Runs one sqlx statement on whichever pool the store has.
macro_rules! on_pool {
    ($store:expr, |$pool:ident| $body:expr) => {
        match $store {
            Store::Sqlite($pool) => $body,
            Store::Postgres($pool) => $body,
        }
    };
}

async fn exec(store: &Store, sql: &str) {
    on_pool!(store, |pool| sqlx::query(sql).execute(pool).await.map(drop)).expect(sql);
}

/// `n` operations created one a minute back from now, the newest 20 unfinished; every
/// one with nine stages and one event.
async fn fill(store: &Store, n: usize) {
    let now = SystemTime::now();
    let batch = 500;
    for start in (0..n).step_by(batch) {
        let end = (start + batch).min(n);
        let mut ops = Vec::new();
        let mut stages = Vec::new();
        let mut events = Vec::new();
        for i in start..end {
            let created = clock::format_time(now - Duration::from_secs(60 * (n - i) as u64));
            let updated = clock::format_time(now - Duration::from_secs(60 * (n - i) as u64 - 30));
            let state = if i + 20 >= n { "running" } else { "succeeded" };
            ops.push(format!(
                "('op-{i:08}', 'create_cluster', 'cluster/c-{}', '{state}', 'bench', '{created}', '{updated}')",
                i % 1000
            ));
            for (idx, stage) in STAGES.iter().enumerate() {
                stages.push(format!(
                    "('op-{i:08}', {idx}, '{stage}', 'Stage {stage}', 'succeeded', 0, 1, '{created}', '{updated}')"
                ));
            }
            events.push(format!(
                "('ev-{i:08}', 'op-{i:08}', '{updated}', 'storage', '{state}', 'done')"
            ));
        }
        exec(store, &format!(
            "INSERT INTO operations (id, command, target, state, requested_by, created_at, updated_at) VALUES {}",
            ops.join(", ")
        ))
        .await;
        exec(store, &format!(
            "INSERT INTO operation_stages (operation_id, idx, name, title, state, cancellable, attempts, started_at, finished_at) VALUES {}",
            stages.join(", ")
        ))
        .await;
        exec(store, &format!(
            "INSERT INTO operation_events (id, operation_id, at, stage, state, message) VALUES {}",
            events.join(", ")
        ))
        .await;
    }
    if let Store::Postgres(_) = store {
        exec(store, "ANALYZE").await;
    }
}

async fn measure<F, Fut>(name: &str, runs: usize, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = usize>,
{
    let mut times = Vec::with_capacity(runs);
    let mut rows = 0;
    for _ in 0..runs {
        let t = Instant::now();
        rows = f().await;
        times.push(t.elapsed());
    }
    times.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "{name:<40} rows {rows:>4}   median {:>8.2} ms   p95 {:>8.2} ms",
        ms(times[runs / 2]),
        ms(times[runs * 95 / 100])
    );
}

#[tokio::main]
async fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let n: usize = std::env::var("HYPD_BENCH_STORE_OPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if full { 100_000 } else { 2_000 });
    let dir = tempfile::tempdir().unwrap();
    let db = match std::env::var("HYPD_BENCH_DATABASE_URL") {
        Ok(url) => Database::Postgres(url),
        Err(_) => Database::Sqlite(dir.path().join("hypd.db")),
    };
    let store = Store::open(&db).await.unwrap();
    let t = Instant::now();
    fill(&store, n).await;
    println!(
        "{} store, {n} operations ({} stages) written in {:.1} s",
        store.backend(),
        n * STAGES.len(),
        t.elapsed().as_secs_f64()
    );
    measure("list_operations", 30, || async {
        operation::list(&store, None, None).await.unwrap().len()
    })
    .await;
    measure("list_operations state=running", 30, || async {
        operation::list(&store, Some(OperationState::Running), None)
            .await
            .unwrap()
            .len()
    })
    .await;
    measure("list_operations target=cluster/c-42", 30, || async {
        operation::list(&store, None, Some("cluster/c-42"))
            .await
            .unwrap()
            .len()
    })
    .await;
    let cursor = clock::now();
    measure("changed_since (live poll, no change)", 100, || async {
        operation::changed_since(&store, &cursor)
            .await
            .unwrap()
            .len()
    })
    .await;
    let recent = clock::format_time(SystemTime::now() - Duration::from_secs(600));
    measure("changed_since (last 10 minutes)", 100, || async {
        operation::changed_since(&store, &recent)
            .await
            .unwrap()
            .len()
    })
    .await;
    let t = Instant::now();
    let pruned = retention::prune(&store, retention::Retention::DEFAULT)
        .await
        .unwrap();
    println!(
        "retention pass: {pruned:?} in {:.1} ms",
        t.elapsed().as_secs_f64() * 1000.0
    );
}
