//! The store: SQLite (a file in the data dir, one replica) or PostgreSQL (several replicas
//! sharing one database). Both run the same portable migrations, applied at start before
//! anything else touches the database, and the same SQL (`$n` placeholders work in both).

use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};

use crate::config::Database;

/// Runs the same sqlx expression on whichever pool the store has: the body is compiled
/// once per backend, so one SQL string serves both.
macro_rules! on_pool {
    ($store:expr, |$pool:ident| $body:expr) => {
        match $store {
            $crate::store::Store::Sqlite($pool) => $body,
            $crate::store::Store::Postgres($pool) => $body,
        }
    };
}
pub(crate) use on_pool;

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

/// The states an operation can be in, in the order they are reported.
pub const OPERATION_STATES: [&str; 6] = [
    "pending",
    "running",
    "waiting",
    "succeeded",
    "failed",
    "cancelled",
];

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot create the directory for the SQLite store {path}: {source}")]
    CreateDir {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot open the {backend} store: {source}")]
    Connect {
        backend: &'static str,
        #[source]
        source: sqlx::Error,
    },
    #[error("cannot migrate the {backend} store: {source}")]
    Migrate {
        backend: &'static str,
        #[source]
        source: sqlx::migrate::MigrateError,
    },
    #[error("store query failed: {0}")]
    Query(#[from] sqlx::Error),
}

#[derive(Clone, Debug)]
pub enum Store {
    Sqlite(SqlitePool),
    Postgres(PgPool),
}

impl Store {
    pub async fn open(db: &Database) -> Result<Self, StoreError> {
        let store = match db {
            Database::Sqlite(path) => Store::Sqlite(open_sqlite(path).await?),
            Database::Postgres(url) => {
                let opts =
                    PgConnectOptions::from_str(url).map_err(|source| StoreError::Connect {
                        backend: "postgres",
                        source,
                    })?;
                let pool = PgPoolOptions::new()
                    .max_connections(16)
                    .acquire_timeout(Duration::from_secs(10))
                    .connect_with(opts)
                    .await
                    .map_err(|source| StoreError::Connect {
                        backend: "postgres",
                        source,
                    })?;
                Store::Postgres(pool)
            }
        };
        store.migrate().await?;
        Ok(store)
    }

    async fn migrate(&self) -> Result<(), StoreError> {
        let backend = self.backend();
        let result = on_pool!(self, |pool| MIGRATOR.run(pool).await);
        result.map_err(|source| StoreError::Migrate { backend, source })
    }

    pub fn backend(&self) -> &'static str {
        match self {
            Store::Sqlite(_) => "sqlite",
            Store::Postgres(_) => "postgres",
        }
    }

    /// A round trip to the database, for readiness.
    pub async fn ping(&self) -> Result<(), StoreError> {
        on_pool!(self, |pool| sqlx::query("SELECT 1")
            .execute(pool)
            .await
            .map(drop))?;
        Ok(())
    }

    /// How many operations are in each state (every state listed, zeros included).
    pub async fn operations_by_state(&self) -> Result<Vec<(&'static str, i64)>, StoreError> {
        const SQL: &str = "SELECT state, COUNT(*) FROM operations GROUP BY state";
        let rows: Vec<(String, i64)> =
            on_pool!(self, |pool| sqlx::query_as(SQL).fetch_all(pool).await)?;
        Ok(OPERATION_STATES
            .iter()
            .map(|s| {
                let n = rows
                    .iter()
                    .find(|(state, _)| state == s)
                    .map_or(0, |(_, n)| *n);
                (*s, n)
            })
            .collect())
    }
}

async fn open_sqlite(path: &Path) -> Result<SqlitePool, StoreError> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|source| StoreError::CreateDir {
            path: dir.display().to_string(),
            source,
        })?;
    }
    let opts = SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true)
        // WAL lets readers (the console, /metrics) run while the worker writes.
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Normal)
        .busy_timeout(Duration::from_secs(5))
        .foreign_keys(true);
    SqlitePoolOptions::new()
        .max_connections(8)
        .connect_with(opts)
        .await
        .map_err(|source| StoreError::Connect {
            backend: "sqlite",
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn sqlite_opens_migrates_and_counts() {
        let dir = tempfile::tempdir().unwrap();
        let db = Database::Sqlite(dir.path().join("nested/hypd.db"));
        let store = Store::open(&db).await.unwrap();
        store.ping().await.unwrap();
        let Store::Sqlite(pool) = &store else {
            unreachable!()
        };
        sqlx::query("INSERT INTO operations (id, command, target, state, created_at, updated_at) VALUES ('a', 'create_cluster', 'c1', 'running', 'x', 'x')")
            .execute(pool)
            .await
            .unwrap();
        let counts = store.operations_by_state().await.unwrap();
        assert_eq!(counts.len(), OPERATION_STATES.len());
        assert!(counts.contains(&("running", 1)));
        assert!(counts.contains(&("failed", 0)));
        // Opening again re-runs no migration and keeps the data.
        drop(store);
        let again = Store::open(&db).await.unwrap();
        assert!(
            again
                .operations_by_state()
                .await
                .unwrap()
                .contains(&("running", 1))
        );
    }

    #[tokio::test]
    async fn sqlite_rejects_unknown_states() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&Database::Sqlite(dir.path().join("hypd.db")))
            .await
            .unwrap();
        let Store::Sqlite(pool) = &store else {
            unreachable!()
        };
        let err = sqlx::query("INSERT INTO operations (id, command, target, state, created_at, updated_at) VALUES ('a', 'x', 'y', 'exploded', 'x', 'x')")
            .execute(pool)
            .await;
        assert!(err.is_err());
    }
}
