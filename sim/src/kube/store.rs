//! One cluster's objects, its resourceVersion counter and watch fan-out. Memory is bounded
//! by design: objects are shared (`Arc`) between the store, the event history and every
//! watcher; the history keeps the last [`HISTORY`] events (older resourceVersions get
//! 410 Gone, as etcd compaction does), and each watcher's backlog is capped at
//! [`FANOUT`] events, after which it is dropped instead of buffering without bound.
//! Every change also wakes the cluster's controllers, which sleep until something they
//! watch changes.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use serde_json::{Value, json};
use tokio::sync::{Notify, broadcast};

use crate::world::fnv1a;

pub type Obj = Arc<Value>;

/// Events kept for watches that resume from a resourceVersion.
pub const HISTORY: usize = 1024;
/// Events a watcher may fall behind before it is dropped (it sees 410 Gone).
pub const FANOUT: usize = 1024;

/// A metadata field (`name`, `namespace`, `uid`, …) as an owned string, empty when absent:
/// controllers build keys and names from it while they go on mutating the store.
pub fn meta(o: &Value, k: &str) -> String {
    o["metadata"][k].as_str().unwrap_or_default().to_owned()
}

/// Where an object lives: `group/plural` (core group empty), namespace ("" for
/// cluster-scoped), name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Key {
    pub gr: String,
    pub ns: String,
    pub name: String,
}

impl Key {
    pub fn new(gr: &str, ns: &str, name: &str) -> Self {
        Self {
            gr: gr.to_owned(),
            ns: ns.to_owned(),
            name: name.to_owned(),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    Added,
    Modified,
    Deleted,
}

impl EventKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Added => "ADDED",
            Self::Modified => "MODIFIED",
            Self::Deleted => "DELETED",
        }
    }
}

#[derive(Debug)]
pub struct Event {
    pub rv: u64,
    pub kind: EventKind,
    pub key: Key,
    pub object: Obj,
    /// The version a MODIFIED event replaced (selector watches turn it into ADDED or
    /// DELETED when the object starts or stops matching).
    pub prev: Option<Obj>,
}

pub struct Store {
    rv: u64,
    uid: u64,
    objects: BTreeMap<Key, Obj>,
    history: VecDeque<Arc<Event>>,
    tx: broadcast::Sender<Arc<Event>>,
    /// Told of every change, whoever made it (see [`Store::changes`]).
    changed: Arc<Notify>,
    pub crd_cache: super::discovery::CrdCache,
}

impl Default for Store {
    fn default() -> Self {
        Self::new()
    }
}

/// The resourceVersion asked for is older than the history: the client must relist.
#[derive(Debug)]
pub struct Gone;

impl Store {
    pub fn new() -> Self {
        let (tx, _) = broadcast::channel(FANOUT);
        Self {
            rv: 1,
            uid: 0,
            objects: BTreeMap::new(),
            history: VecDeque::new(),
            tx,
            changed: Arc::new(Notify::new()),
            crd_cache: Default::default(),
        }
    }

    pub fn rv(&self) -> u64 {
        self.rv
    }

    /// A fresh UID (the UUID layout clients expect).
    pub fn uid(&mut self) -> String {
        self.uid += 1;
        format!("5157d000-0000-4000-8000-{:012x}", self.uid)
    }

    /// Five characters for a `generateName` or a controller's child: derived from a fresh
    /// UID so they never repeat, in the consonants-and-digits alphabet Kubernetes uses so
    /// no word can be spelled by accident.
    pub fn name_suffix(&mut self) -> String {
        const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
        let mut n = fnv1a(&self.uid());
        (0..5)
            .map(|_| {
                let c = ALPHABET[(n % ALPHABET.len() as u64) as usize] as char;
                n /= ALPHABET.len() as u64;
                c
            })
            .collect()
    }

    pub fn get(&self, key: &Key) -> Option<&Obj> {
        self.objects.get(key)
    }

    pub fn keys(&self) -> impl Iterator<Item = &Key> {
        self.objects.keys()
    }

    /// Objects of one resource, optionally in one namespace, in key order.
    pub fn list<'a>(&'a self, gr: &'a str, ns: Option<&'a str>) -> impl Iterator<Item = &'a Obj> {
        let start = Key::new(gr, ns.unwrap_or(""), "");
        self.objects
            .range(start..)
            .take_while(move |(k, _)| k.gr == gr && ns.is_none_or(|n| k.ns == n))
            .map(|(_, v)| v)
    }

    /// Stores `value` under a new resourceVersion and tells the watchers.
    pub fn put(&mut self, key: Key, mut value: Value) -> Obj {
        self.rv += 1;
        if let Some(meta) = value.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.insert("resourceVersion".into(), json!(self.rv.to_string()));
        }
        let object = Arc::new(value);
        let prev = self.objects.insert(key.clone(), object.clone());
        let kind = if prev.is_some() {
            EventKind::Modified
        } else {
            EventKind::Added
        };
        self.emit(kind, key, object.clone(), prev);
        object
    }

    pub fn remove(&mut self, key: &Key) -> Option<Obj> {
        let old = self.objects.remove(key)?;
        self.rv += 1;
        let mut last = (*old).clone();
        if let Some(meta) = last.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.insert("resourceVersion".into(), json!(self.rv.to_string()));
        }
        let last = Arc::new(last);
        self.emit(EventKind::Deleted, key.clone(), last.clone(), None);
        Some(last)
    }

    fn emit(&mut self, kind: EventKind, key: Key, object: Obj, prev: Option<Obj>) {
        let event = Arc::new(Event {
            rv: self.rv,
            kind,
            key,
            object,
            prev,
        });
        if self.history.len() == HISTORY {
            self.history.pop_front();
        }
        self.history.push_back(event.clone());
        // No receiver is not an error: nobody is watching.
        let _ = self.tx.send(event);
        self.changed.notify_one();
    }

    /// What every change notifies: one waiter (the cluster's controllers) is woken, or the
    /// next to wait finds the wake-up waiting, so no change between two waits is missed.
    pub fn changes(&self) -> Arc<Notify> {
        self.changed.clone()
    }

    pub fn subscribe(&self) -> broadcast::Receiver<Arc<Event>> {
        self.tx.subscribe()
    }

    /// Events after `rv`, if the history still reaches back that far.
    pub fn since(&self, rv: u64) -> Result<Vec<Arc<Event>>, Gone> {
        if rv >= self.rv {
            return Ok(Vec::new());
        }
        match self.history.front() {
            Some(first) if first.rv <= rv + 1 => {
                Ok(self.history.iter().filter(|e| e.rv > rv).cloned().collect())
            }
            // Nothing happened since the store started: everything is still there.
            None => Ok(Vec::new()),
            _ => Err(Gone),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(name: &str) -> Value {
        json!({ "metadata": { "name": name } })
    }

    #[test]
    fn versions_grow_and_events_replay() {
        let mut s = Store::new();
        let start = s.rv();
        let a = s.put(Key::new("/configmaps", "default", "a"), obj("a"));
        assert_eq!(
            a["metadata"]["resourceVersion"],
            json!((start + 1).to_string())
        );
        s.put(Key::new("/configmaps", "default", "a"), obj("a"));
        s.put(Key::new("/configmaps", "other", "b"), obj("b"));
        s.remove(&Key::new("/configmaps", "default", "a"));
        let kinds: Vec<_> = s.since(start).unwrap().iter().map(|e| e.kind).collect();
        assert_eq!(
            kinds,
            [
                EventKind::Added,
                EventKind::Modified,
                EventKind::Added,
                EventKind::Deleted
            ]
        );
        assert_eq!(s.list("/configmaps", None).count(), 1);
        assert_eq!(s.list("/configmaps", Some("default")).count(), 0);
    }

    #[test]
    fn old_versions_are_gone_once_history_rolls_over() {
        let mut s = Store::new();
        for i in 0..HISTORY + 10 {
            s.put(Key::new("/configmaps", "default", &i.to_string()), obj("x"));
        }
        assert!(s.since(1).is_err());
        assert_eq!(s.since(s.rv() - 3).unwrap().len(), 3);
    }
}
