//! The live channel: one WebSocket per console tab to `/api/v1/events`, opened in the
//! browser only (the server's render shows the state as it was), which keeps every pushed
//! operation snapshot in a signal that pages merge over what they loaded. The server sends
//! only changes made after it accepted the socket, so each (re)connect bumps `epoch` and
//! pages reload what they show: nothing that happened while disconnected is missed.
//!
//! Hydration must reproduce the server's markup from the server's data, and it finishes
//! asynchronously (the page's wasm chunk is fetched first, slowly on a loaded machine).
//! So the channel and the clock start only once the page has hydrated: a snapshot pushed
//! earlier would make the browser render something the server did not, which Leptos
//! cannot recover from.

use std::collections::BTreeMap;

use leptos::prelude::*;

use crate::api::operations::Operation;

/// The state of the channel, as the indicator in the top bar shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Link {
    /// Not opened: the page is not hydrated yet, or nobody is signed in.
    Idle,
    Connecting,
    Connected,
    /// Closed; the next attempt starts after this many seconds.
    Reconnecting {
        in_secs: u32,
    },
}

impl Link {
    pub fn class(self) -> &'static str {
        match self {
            Link::Idle => "idle",
            Link::Connecting => "connecting",
            Link::Connected => "connected",
            Link::Reconnecting { .. } => "reconnecting",
        }
    }

    pub fn label(self) -> String {
        match self {
            Link::Idle => "Live: off".to_owned(),
            Link::Connecting => "Connecting…".to_owned(),
            Link::Connected => "Live".to_owned(),
            Link::Reconnecting { in_secs } => format!("Reconnecting in {in_secs} s"),
        }
    }
}

/// Shared through context by every page.
#[derive(Clone, Copy)]
pub struct Live {
    pub link: RwSignal<Link>,
    /// The latest snapshot of every operation pushed since the tab opened, by id.
    pub operations: RwSignal<BTreeMap<String, Operation>>,
    /// Counts successful (re)connections: pages reload their data when it changes.
    pub epoch: RwSignal<u64>,
    /// The browser's clock in ms, ticking each second once hydrated; `None` on the server
    /// and in the first browser render, so both render the same markup.
    pub now: RwSignal<Option<i64>>,
}

impl Live {
    pub fn new() -> Self {
        Self {
            link: RwSignal::new(Link::Idle),
            operations: RwSignal::new(BTreeMap::new()),
            epoch: RwSignal::new(0),
            now: RwSignal::new(None),
        }
    }

    /// The newer of a loaded operation and the last pushed snapshot of it.
    pub fn freshest(&self, loaded: Operation) -> Operation {
        self.operations.with(|m| match m.get(&loaded.operation_id) {
            Some(pushed) if pushed.updated_at >= loaded.updated_at => pushed.clone(),
            _ => loaded,
        })
    }

    /// Applies one message from the channel; returns whether the console must read again
    /// what it shows: after the server's hello, and when the server says this tab fell
    /// behind and changes were dropped (`lagged`).
    pub fn apply(&self, text: &str) -> bool {
        /// One message, decoded straight from text like every other `Operation` the
        /// console reads (one decoder in the bundle).
        #[derive(serde::Deserialize)]
        struct Message {
            #[serde(rename = "type")]
            kind: String,
            operation: Option<Operation>,
        }
        let Ok(message) = serde_json::from_str::<Message>(text) else {
            return false;
        };
        match message.kind.as_str() {
            "hello" | "lagged" => true,
            "operation" => {
                if let Some(op) = message.operation {
                    self.operations.update(|m| {
                        let newer = m
                            .get(&op.operation_id)
                            .is_none_or(|old| op.updated_at >= old.updated_at);
                        if newer {
                            m.insert(op.operation_id.clone(), op);
                        }
                    });
                }
                false
            }
            _ => false,
        }
    }
}

impl Default for Live {
    fn default() -> Self {
        Self::new()
    }
}

pub fn use_live() -> Live {
    use_context::<Live>().unwrap_or_default()
}

/// Starts the channel and the clock once the page has hydrated. Browser only; a no-op in
/// the server's render.
pub fn start(live: Live) {
    after_hydration(move || {
        #[cfg(feature = "hydrate")]
        {
            live.now.set(Some(crate::time::browser_now()));
            // The handle is dropped on purpose: the clock lives as long as the tab.
            let _ = set_interval_with_handle(
                move || live.now.set(Some(crate::time::browser_now())),
                std::time::Duration::from_secs(1),
            );
            leptos::task::spawn_local(browser::run(live));
        }
        #[cfg(not(feature = "hydrate"))]
        let _ = live;
    });
}

/// Runs `f` in the browser once the page has hydrated (at once if it has); never on the
/// server. For anything that would change what the first render shows.
pub fn after_hydration(f: impl FnOnce() + 'static) {
    #[cfg(feature = "hydrate")]
    leptos::task::spawn_local(async move {
        gate::opened().await;
        f();
    });
    #[cfg(not(feature = "hydrate"))]
    let _ = f;
}

/// Called by the wasm entry when hydration has finished: what waited for it runs now.
#[cfg(feature = "hydrate")]
pub fn page_hydrated() {
    gate::open();
}

/// The browser's "hydrated yet?" gate: one per tab (wasm has one thread), open for good
/// once opened.
#[cfg(feature = "hydrate")]
mod gate {
    use std::cell::RefCell;

    use futures::channel::oneshot;

    thread_local! {
        /// Who waits; `None` once open.
        static WAITING: RefCell<Option<Vec<oneshot::Sender<()>>>> =
            const { RefCell::new(Some(Vec::new())) };
    }

    pub fn open() {
        for waiter in WAITING
            .with(|w| w.borrow_mut().take())
            .into_iter()
            .flatten()
        {
            let _ = waiter.send(());
        }
    }

    pub async fn opened() {
        let waiting = WAITING.with(|w| {
            w.borrow_mut().as_mut().map(|list| {
                let (tx, rx) = oneshot::channel();
                list.push(tx);
                rx
            })
        });
        if let Some(rx) = waiting {
            let _ = rx.await;
        }
    }
}

#[cfg(feature = "hydrate")]
mod browser {
    use std::time::Duration;

    use futures::StreamExt;
    use gloo_net::websocket::{Message, futures::WebSocket};
    use leptos::prelude::*;

    use super::{Link, Live};

    const FIRST_BACKOFF: Duration = Duration::from_millis(500);
    const MAX_BACKOFF: Duration = Duration::from_secs(15);

    fn events_url() -> Option<String> {
        let location = web_sys::window()?.location();
        let scheme = if location.protocol().ok()? == "https:" {
            "wss"
        } else {
            "ws"
        };
        Some(format!(
            "{scheme}://{}/api/v1/events",
            location.host().ok()?
        ))
    }

    async fn sleep(d: Duration) {
        let (tx, rx) = futures::channel::oneshot::channel::<()>();
        set_timeout(
            move || {
                let _ = tx.send(());
            },
            d,
        );
        let _ = rx.await;
    }

    /// Connects, reads until the socket closes, waits with exponential backoff, again.
    pub async fn run(live: Live) {
        let Some(url) = events_url() else { return };
        let mut backoff = FIRST_BACKOFF;
        loop {
            live.link.set(Link::Connecting);
            if let Ok(socket) = WebSocket::open(&url) {
                let (_write, mut read) = socket.split();
                while let Some(message) = read.next().await {
                    match message {
                        Ok(Message::Text(text)) => {
                            if live.apply(&text) {
                                backoff = FIRST_BACKOFF;
                                live.link.set(Link::Connected);
                                live.epoch.update(|e| *e += 1);
                            }
                        }
                        Ok(Message::Bytes(_)) => {}
                        Err(_) => break,
                    }
                }
            }
            live.link.set(Link::Reconnecting {
                in_secs: backoff.as_secs_f64().ceil() as u32,
            });
            sleep(backoff).await;
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }
}

/// The dot and label in the top bar.
#[component]
pub fn LinkIndicator() -> impl IntoView {
    let live = use_live();
    view! {
        <span
            class=move || format!("link link-{}", live.link.get().class())
            role="status"
            aria-live="polite"
            title="State of the live update channel (WebSocket)"
        >
            <span class="dot" aria-hidden="true"></span>
            {move || live.link.get().label()}
        </span>
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::operations::OperationState;

    fn op(id: &str, state: &str, updated_at: &str) -> serde_json::Value {
        serde_json::json!({
            "operation_id": id, "command": "import_cluster", "target": "cluster/ml-1",
            "state": state, "requested_by": "admin", "created_at": "2026-01-01T00:00:00.000Z",
            "updated_at": updated_at, "stages": [], "outputs": {}, "error": null,
            "retryable": false, "cancellable": true,
        })
    }

    #[test]
    fn keeps_the_newest_snapshot() {
        let owner = Owner::new();
        owner.set();
        let live = Live::new();
        assert!(live.apply(r#"{"type":"hello","subscriber":"admin","role":"admin"}"#));
        let running = serde_json::json!({ "type": "operation", "operation": op("op-1", "running", "2026-01-01T00:00:01.000Z") });
        let done = serde_json::json!({ "type": "operation", "operation": op("op-1", "succeeded", "2026-01-01T00:00:02.000Z") });
        assert!(!live.apply(&done.to_string()));
        // A late, older snapshot does not undo a newer one.
        assert!(!live.apply(&running.to_string()));
        let got = live.operations.with(|m| m["op-1"].state);
        assert_eq!(got, OperationState::Succeeded);
        assert!(!live.apply("not json"));

        let loaded: Operation =
            serde_json::from_value(op("op-1", "running", "2026-01-01T00:00:01.500Z")).unwrap();
        assert_eq!(live.freshest(loaded).state, OperationState::Succeeded);
    }
}
