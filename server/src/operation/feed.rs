//! The operation change feed: one task per server reads the store for operations that
//! changed and fans each change out to every follower (the console's live channel, MCP
//! subscriptions, progress and log notifications). Changes are read from the store, not
//! from an in-process bus, so a follower of any replica sees what every replica did; and
//! the store is asked once per tick whatever the number of followers, never once each.
//! A follower that falls behind by more than the channel holds is told how many changes
//! it missed (`Lagged`) instead of growing the server's memory.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use app::api::operations::Operation;
use tokio::sync::broadcast;

use crate::store::Store;

/// How often the store is asked for changes while anyone follows.
const POLL: Duration = Duration::from_millis(250);
/// Changes a follower may be behind before it is told it lagged.
const CAPACITY: usize = 512;

pub struct Feed {
    store: Store,
    tx: broadcast::Sender<Arc<Operation>>,
    poller: OnceLock<()>,
}

impl Feed {
    pub fn new(store: Store) -> Self {
        Self {
            store,
            tx: broadcast::channel(CAPACITY).0,
            poller: OnceLock::new(),
        }
    }

    /// Every operation change from now on. The first follower starts the poller (inside
    /// the runtime, which `Service::new` may not be).
    pub fn follow(self: &Arc<Self>) -> broadcast::Receiver<Arc<Operation>> {
        let rx = self.tx.subscribe();
        self.poller.get_or_init(|| {
            let feed = Arc::downgrade(self);
            tokio::spawn(poll(feed));
        });
        rx
    }
}

async fn poll(feed: std::sync::Weak<Feed>) {
    // Start from now: followers read current state through get/list, then follow.
    let mut cursor = crate::clock::now();
    // Several changes can share a millisecond: remember which were sent at the cursor.
    let mut sent_at_cursor: Vec<(String, String)> = Vec::new();
    let mut ticker = tokio::time::interval(POLL);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let Some(feed) = feed.upgrade() else { return };
        if feed.tx.receiver_count() == 0 {
            // Nobody follows: the cursor moves on so a new follower does not get a backlog.
            cursor = crate::clock::now();
            sent_at_cursor.clear();
            continue;
        }
        let changes = match super::changed_since(&feed.store, &cursor).await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "operation feed: cannot read changes");
                continue;
            }
        };
        for op in changes {
            // An operation is sent again at the same instant only if it changed again
            // (a stage's state moved without the timestamp moving).
            let seen = (op.operation_id.clone(), fingerprint(&op));
            if op.updated_at == cursor && sent_at_cursor.contains(&seen) {
                continue;
            }
            if op.updated_at > cursor {
                cursor = op.updated_at.clone();
                sent_at_cursor.clear();
            }
            sent_at_cursor.push(seen);
            // No follower left between the check and now: nothing to do.
            let _ = feed.tx.send(Arc::new(op));
        }
    }
}

/// What distinguishes two reads of one operation stored within the same millisecond.
fn fingerprint(op: &Operation) -> String {
    let stages: Vec<String> = op.stages.iter().map(|s| format!("{:?}", s.state)).collect();
    format!("{:?}/{}", op.state, stages.join(","))
}
