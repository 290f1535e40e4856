//! A cluster's node view, what `list_nodes` answers from: HyperPod's nodes, read again
//! at most once per freshness interval while someone reads them (and at once after one
//! of the cluster's operations moved), joined with what Kubernetes watches keep current
//! (each Node's readiness, health label, GPUs and EFA; the GPUs pods request). Shaped by
//! a 1,000-node cluster answering in milliseconds to many callers while staying within
//! seconds of the world: no call reads every page and every Pod any more, concurrent
//! readers share one HyperPod read, and a view keeps compact facts, never whole objects,
//! and lets them go when nobody has read it for a while.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use ::kube::api::Api;
use ::kube::runtime::WatchStreamExt;
use ::kube::runtime::watcher::{self, Config, Event};
use app::api::ApiError;
use app::api::clusters::{ClusterSummary, NodeInfo};
use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};

use crate::aws::Aws;
use crate::cluster::components::{GROUP_LABEL, HYPERPOD_NODE_LABEL};
use crate::cluster::describe::node_info;
use crate::resources::kube;
use crate::store::Store;

/// A HyperPod read older than the freshness interval, but younger than this, is answered
/// while a new read runs beside it; an older one is waited for.
const STALE: Duration = Duration::from_secs(5);
/// A view nobody has read for this long stops its watches and lets go of its facts.
const IDLE: Duration = Duration::from_secs(300);
/// How long a first read waits for the watches' first lists before it answers without
/// Kubernetes' side (a cluster whose API does not answer still lists its nodes).
const FIRST_SYNC: Duration = Duration::from_secs(30);

/// Every cluster's view, made on its first read.
pub struct Views {
    views: Mutex<HashMap<String, Arc<View>>>,
    /// A HyperPod read this young is answered as it is (`--min-poll-interval`: the
    /// shortest time between two looks at AWS).
    fresh: Duration,
}

impl Views {
    pub fn new(fresh: Duration) -> Self {
        Views {
            views: Mutex::default(),
            fresh,
        }
    }

    /// The view of the cluster at `at`, started (its watches running) when there was
    /// none or its last one went idle.
    pub fn of(&self, aws: &Arc<Aws>, at: &Place) -> Arc<View> {
        let mut views = self.views.lock().unwrap_or_else(|p| p.into_inner());
        // Views of clusters nobody reads any more (deleted ones among them) go here.
        views.retain(|_, v| !v.ended());
        let key = format!("{}\n{}", at.name, at.hyperpod);
        let view = views
            .entry(key)
            .or_insert_with(|| View::start(aws.clone(), at.clone(), self.fresh));
        view.touch();
        view.clone()
    }
}

/// Which cluster a view is of: hypd's name and its operations' target, its region, EKS
/// and HyperPod cluster names.
#[derive(Clone, Debug)]
pub struct Place {
    pub name: String,
    pub target: String,
    pub region: String,
    pub eks: String,
    pub hyperpod: String,
}

impl Place {
    /// Where stored cluster `cluster`'s nodes are; `None` before it has a HyperPod
    /// cluster (its ARN is recorded once a creation or import has one).
    pub fn of(cluster: &ClusterSummary) -> Option<Place> {
        let arn = cluster.hyperpod_cluster_arn.as_deref()?;
        Some(Place {
            name: cluster.name.clone(),
            target: crate::cluster::target(&cluster.name),
            region: cluster.region.clone(),
            eks: cluster.name.clone(),
            hyperpod: arn.rsplit('/').next().unwrap_or(arn).to_owned(),
        })
    }
}

pub struct View {
    place: Place,
    aws: Arc<Aws>,
    fresh: Duration,
    hyperpod: RwLock<Option<Arc<Snapshot>>>,
    /// Held by the one HyperPod read in flight; the others wait for it and take its result.
    reading: tokio::sync::Mutex<()>,
    kubernetes: Arc<Watched>,
    follow: tokio::task::AbortHandle,
}

impl Drop for View {
    fn drop(&mut self) {
        self.follow.abort();
    }
}

/// HyperPod's nodes as one read found them, sorted by group, then instance id.
pub struct Snapshot {
    pub nodes: Vec<NodeInfo>,
    /// When the read began (RFC 3339): what the answer says it is as of, and what an
    /// operation that changed since makes out of date.
    pub taken_at: String,
    began: Instant,
}

impl View {
    fn start(aws: Arc<Aws>, place: Place, fresh: Duration) -> Arc<View> {
        let kubernetes = Arc::new(Watched::default());
        let follow = tokio::spawn(follow(aws.clone(), place.clone(), kubernetes.clone()));
        Arc::new(View {
            place,
            aws,
            fresh,
            hyperpod: RwLock::new(None),
            reading: tokio::sync::Mutex::new(()),
            kubernetes,
            follow: follow.abort_handle(),
        })
    }

    fn touch(&self) {
        let watched = &self.kubernetes;
        let now = watched.born.elapsed().as_millis() as u64;
        watched.last_read.store(now, Ordering::Relaxed);
    }

    fn ended(&self) -> bool {
        self.follow.is_finished()
    }

    /// HyperPod's nodes, as fresh as asked: `refresh` waits for a read that began after
    /// this call; otherwise a read younger than the freshness interval is answered as it
    /// is, a younger than [`STALE`] one too while a new read runs beside it, and anything
    /// older (or older than the cluster's last operation change) waits for a new read.
    pub async fn hyperpod(
        self: &Arc<Self>,
        store: &Store,
        refresh: bool,
    ) -> Result<Arc<Snapshot>, ApiError> {
        let asked = Instant::now();
        let current = self.current();
        if let Some(s) = current.filter(|_| !refresh) {
            let age = s.began.elapsed();
            // hypd's own node and group operations make a read out of date at once.
            let changed = crate::operation::changed_at(store, &self.place.target)
                .await?
                .is_some_and(|at| at >= s.taken_at);
            if !changed && age < self.fresh {
                return Ok(s);
            }
            if !changed && age < STALE {
                let view = self.clone();
                tokio::spawn(async move {
                    // A read already running will do; its error is the next caller's.
                    if let Ok(_reading) = view.reading.try_lock() {
                        let _ = view.read().await;
                    }
                });
                return Ok(s);
            }
        }
        let _reading = self.reading.lock().await;
        // Another caller's read that began after this call is as fresh as one of its own.
        if let Some(s) = self.current().filter(|s| s.began >= asked) {
            return Ok(s);
        }
        self.read().await
    }

    fn current(&self) -> Option<Arc<Snapshot>> {
        self.hyperpod
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// One read of every HyperPod page; the caller holds `reading`.
    async fn read(&self) -> Result<Arc<Snapshot>, ApiError> {
        let began = Instant::now();
        let taken_at = crate::clock::now();
        let sm = self.aws.sagemaker(&self.place.region);
        let mut nodes: Vec<NodeInfo> =
            crate::resources::sagemaker::nodes::list(&sm, &self.place.hyperpod, None)
                .await?
                .iter()
                .map(node_info)
                .collect();
        nodes.sort_by(|a, b| key(a).cmp(&key(b)));
        let snapshot = Arc::new(Snapshot {
            nodes,
            taken_at,
            began,
        });
        *self.hyperpod.write().unwrap_or_else(|p| p.into_inner()) = Some(snapshot.clone());
        Ok(snapshot)
    }

    /// What the watches know now, once their first lists are in (or the cluster's API
    /// cannot be reached, or [`FIRST_SYNC`] passed); an error when they could not list
    /// and have never listed.
    pub async fn kubernetes(&self) -> Result<Facts, ApiError> {
        let mut state = self.kubernetes.state.subscribe();
        let settled = tokio::time::timeout(
            FIRST_SYNC,
            state.wait_for(|s| !matches!(s, Sync::Connecting)),
        )
        .await;
        let now = match settled {
            Ok(Ok(s)) => s.clone(),
            // Still connecting: answer with HyperPod's side.
            _ => Sync::Unreachable,
        };
        match now {
            Sync::Failed(e) => Err(e),
            Sync::Listed | Sync::Connecting | Sync::Unreachable => Ok(self.facts()),
        }
    }

    fn facts(&self) -> Facts {
        let nodes = self
            .kubernetes
            .nodes
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .live
            .clone();
        let pods = self
            .kubernetes
            .pods
            .read()
            .unwrap_or_else(|p| p.into_inner());
        let mut gpus_used: HashMap<String, u32> = HashMap::new();
        for (node, gpus) in pods.live.values() {
            *gpus_used.entry(node.clone()).or_insert(0) += gpus;
        }
        Facts {
            nodes: Arc::new(nodes),
            gpus_used,
        }
    }
}

pub fn key(n: &NodeInfo) -> (&str, &str) {
    (n.instance_group.as_str(), n.node_id.as_str())
}

/// What Kubernetes says of a cluster's HyperPod nodes.
pub struct Facts {
    /// By instance id.
    pub nodes: Arc<HashMap<String, NodeFacts>>,
    /// GPUs requested by running pods, by Node name.
    pub gpus_used: HashMap<String, u32>,
}

/// What a node's row shows of its Kubernetes Node.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeFacts {
    pub name: String,
    pub group: Option<String>,
    pub ready: bool,
    pub health_label: Option<String>,
    pub zone: Option<String>,
    pub gpus: u32,
    pub efa_interfaces: u32,
}

/// Where the watches stand.
#[derive(Clone, Debug)]
enum Sync {
    Connecting,
    /// Both first lists are in; the watches follow changes.
    Listed,
    /// The cluster's API has no endpoint, or the EKS cluster is gone: nothing to watch.
    Unreachable,
    /// The first lists failed; the watches try again.
    Failed(ApiError),
}

/// What the watches keep, shared with the task that runs them.
struct Watched {
    state: tokio::sync::watch::Sender<Sync>,
    nodes: RwLock<Folded<NodeFacts>>,
    /// Pods that request GPUs: their Node's name and how many.
    pods: RwLock<Folded<(String, u32)>>,
    born: Instant,
    /// Milliseconds after `born` of the view's last read.
    last_read: AtomicU64,
}

impl Default for Watched {
    fn default() -> Self {
        Watched {
            state: tokio::sync::watch::Sender::new(Sync::Connecting),
            nodes: RwLock::default(),
            pods: RwLock::default(),
            born: Instant::now(),
            last_read: AtomicU64::new(0),
        }
    }
}

impl Watched {
    fn idle(&self) -> bool {
        let last = Duration::from_millis(self.last_read.load(Ordering::Relaxed));
        self.born.elapsed().saturating_sub(last) > IDLE
    }
}

/// A watched kind's facts by key: the live ones, and while the watch lists again, the
/// ones listed so far (they replace the live ones when the list is complete, so a
/// relist never shows half a cluster).
struct Folded<V> {
    live: HashMap<String, V>,
    listing: Option<HashMap<String, V>>,
    listed: bool,
}

impl<V> Default for Folded<V> {
    fn default() -> Self {
        Folded {
            live: HashMap::new(),
            listing: None,
            listed: false,
        }
    }
}

impl<V> Folded<V> {
    /// Folds one watch event in; `of` gives an object's key and its facts, or only its
    /// key when it has none worth keeping.
    fn fold<K>(&mut self, event: Event<K>, of: impl Fn(&K) -> (Option<String>, Option<V>)) {
        match event {
            Event::Init => self.listing = Some(HashMap::new()),
            Event::InitApply(o) => {
                if let ((Some(k), Some(v)), Some(listing)) = (of(&o), self.listing.as_mut()) {
                    listing.insert(k, v);
                }
            }
            Event::InitDone => {
                if let Some(listing) = self.listing.take() {
                    self.live = listing;
                }
                self.listed = true;
            }
            Event::Apply(o) => match of(&o) {
                (Some(k), Some(v)) => {
                    self.live.insert(k, v);
                }
                (Some(k), None) => {
                    self.live.remove(&k);
                }
                (None, _) => {}
            },
            Event::Delete(o) => {
                if let (Some(k), _) = of(&o) {
                    self.live.remove(&k);
                }
            }
        }
    }
}

/// Runs the cluster's watches until nobody has read the view for [`IDLE`]: connects
/// (again before each token expires, as EKS wants), watches the HyperPod Nodes and the
/// running Pods, and tells readers where it stands.
async fn follow(aws: Arc<Aws>, at: Place, watched: Arc<Watched>) {
    let mut backoff = Duration::from_secs(1);
    while !watched.idle() {
        let client = match kube::connect_watching(&aws, &at.region, &at.eks).await {
            Ok(c) => c,
            Err(e) => {
                let unreachable =
                    matches!(e, ApiError::NotFound { .. } | ApiError::Conflict { .. });
                let listed = watched.nodes.read().is_ok_and(|n| n.listed);
                if !listed {
                    watched.state.send_replace(if unreachable {
                        Sync::Unreachable
                    } else {
                        Sync::Failed(e)
                    });
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(30));
                continue;
            }
        };
        backoff = Duration::from_secs(1);
        let session = watch(client, &at.hyperpod, &watched);
        let idle = async {
            while !watched.idle() {
                tokio::time::sleep(Duration::from_secs(10)).await;
            }
        };
        tokio::select! {
            () = session => {}
            () = tokio::time::sleep(kube::WATCH_SESSION) => {}
            () = idle => {}
        }
    }
    // Idle: the facts go with the task, the view is replaced on its next read.
    *watched.nodes.write().unwrap_or_else(|p| p.into_inner()) = Folded::default();
    *watched.pods.write().unwrap_or_else(|p| p.into_inner()) = Folded::default();
}

/// Watches Nodes and Pods with `client` until one of the watches ends.
async fn watch(client: ::kube::Client, hyperpod: &str, watched: &Watched) {
    let selector = format!(
        "{}={},sagemaker.amazonaws.com/cluster-name={hyperpod}",
        HYPERPOD_NODE_LABEL.0, HYPERPOD_NODE_LABEL.1
    );
    let nodes = watcher::watcher(
        Api::<Node>::all(client.clone()),
        Config::default().labels(&selector),
    )
    .default_backoff();
    let pods = watcher::watcher(
        Api::<Pod>::all(client),
        Config::default().fields("status.phase!=Succeeded,status.phase!=Failed"),
    )
    .default_backoff();
    let nodes = nodes.for_each(|e| {
        fold(watched, &watched.nodes, e, "Node", |n: &Node| {
            (instance_of(n), node_facts(n))
        });
        async {}
    });
    let pods = pods.for_each(|e| {
        fold(watched, &watched.pods, e, "Pod", |p: &Pod| {
            let key = p.metadata.uid.clone();
            (key, pod_gpus(p))
        });
        async {}
    });
    futures_util::future::join(nodes, pods).await;
}

/// One event of a watch into its facts; readers learn when both first lists are in, and
/// of a failure while neither has ever listed.
fn fold<K, V>(
    watched: &Watched,
    folded: &RwLock<Folded<V>>,
    event: Result<Event<K>, watcher::Error>,
    kind: &str,
    of: impl Fn(&K) -> (Option<String>, Option<V>),
) {
    match event {
        Ok(e) => {
            let done = matches!(e, Event::InitDone);
            folded
                .write()
                .unwrap_or_else(|p| p.into_inner())
                .fold(e, of);
            let listed = |f: &RwLock<Folded<_>>| f.read().is_ok_and(|f| f.listed);
            let pods_listed = watched.pods.read().is_ok_and(|p| p.listed);
            if done && listed(&watched.nodes) && pods_listed {
                watched.state.send_replace(Sync::Listed);
            }
        }
        Err(e) => {
            tracing::debug!(kind, error = %e, "node view: watch failed; it resumes");
            if !folded.read().is_ok_and(|f| f.listed) {
                watched
                    .state
                    .send_replace(Sync::Failed(watch_error(kind, e)));
            }
        }
    }
}

fn watch_error(kind: &str, e: watcher::Error) -> ApiError {
    match e {
        watcher::Error::InitialListFailed(e) => kube::upstream(&format!("list {kind}"), e),
        watcher::Error::WatchStartFailed(e) | watcher::Error::WatchFailed(e) => {
            kube::upstream(&format!("watch {kind}"), e)
        }
        other => ApiError::Upstream {
            service: "kubernetes".into(),
            call: format!("watch {kind}"),
            transient: true,
            code: None,
            message: other.to_string(),
            request_id: None,
        },
    }
}

pub const HEALTH_LABEL: &str = "sagemaker.amazonaws.com/node-health-status";
const ZONE_LABEL: &str = "topology.kubernetes.io/zone";
const GPU: &str = "nvidia.com/gpu";
const EFA: &str = "vpc.amazonaws.com/efa";

/// The instance id a HyperPod Node runs on: the end of its provider id
/// (`aws:///<zone>/sagemaker/cluster/<cluster>-<instance id>`).
pub(crate) fn instance_of(n: &Node) -> Option<String> {
    let provider = n.spec.as_ref()?.provider_id.as_deref()?;
    let at = provider.rfind("i-")?;
    Some(provider[at..].to_owned())
}

fn node_facts(n: &Node) -> Option<NodeFacts> {
    let labels = n.metadata.labels.as_ref();
    let label = |key: &str| labels.and_then(|l| l.get(key)).cloned();
    let status = n.status.as_ref();
    let capacity = |resource: &str| {
        status
            .and_then(|s| s.capacity.as_ref()?.get(resource))
            .and_then(|q| q.0.parse::<u32>().ok())
            .unwrap_or(0)
    };
    Some(NodeFacts {
        name: n.metadata.name.clone()?,
        group: label(GROUP_LABEL),
        ready: status
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True")),
        health_label: label(HEALTH_LABEL),
        zone: label(ZONE_LABEL),
        gpus: capacity(GPU),
        efa_interfaces: capacity(EFA),
    })
}

/// The Node a pod runs on and the GPUs its containers request (their limit when they
/// name no request); none for a pod not yet placed or asking for no GPU.
fn pod_gpus(p: &Pod) -> Option<(String, u32)> {
    let spec = p.spec.as_ref()?;
    let node = spec.node_name.clone()?;
    let gpus: u32 = spec
        .containers
        .iter()
        .filter_map(|c| {
            let r = c.resources.as_ref()?;
            let q = r
                .requests
                .as_ref()
                .and_then(|m| m.get(GPU))
                .or_else(|| r.limits.as_ref()?.get(GPU))?;
            q.0.parse::<u32>().ok()
        })
        .sum();
    (gpus > 0).then_some((node, gpus))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(id: &str, ready: bool) -> Node {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": format!("hyperpod-{id}"), "labels": {HEALTH_LABEL: "Schedulable"}},
            "spec": {"providerID": format!("aws:///us-east-1a/sagemaker/cluster/c-{id}")},
            "status": {
                "capacity": {GPU: "8", EFA: "4"},
                "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}],
            },
        }))
        .unwrap()
    }

    fn folded(f: &mut Folded<NodeFacts>, e: Event<Node>) {
        f.fold(e, |n| (instance_of(n), node_facts(n)));
    }

    #[test]
    fn a_relist_replaces_the_facts_only_when_complete() {
        let mut f = Folded::default();
        folded(&mut f, Event::Init);
        folded(&mut f, Event::InitApply(node("i-01", true)));
        folded(&mut f, Event::InitApply(node("i-02", true)));
        folded(&mut f, Event::InitDone);
        assert!(f.listed);
        assert_eq!(f.live.len(), 2);
        assert_eq!(f.live["i-01"].gpus, 8);
        assert_eq!(f.live["i-01"].efa_interfaces, 4);

        // A relist that has seen one node so far still shows both; once done, one.
        folded(&mut f, Event::Init);
        folded(&mut f, Event::InitApply(node("i-02", false)));
        assert_eq!(f.live.len(), 2);
        assert!(f.live["i-02"].ready);
        folded(&mut f, Event::InitDone);
        assert_eq!(f.live.keys().collect::<Vec<_>>(), ["i-02"]);
        assert!(!f.live["i-02"].ready);

        folded(&mut f, Event::Apply(node("i-03", true)));
        folded(&mut f, Event::Delete(node("i-02", false)));
        assert_eq!(f.live.keys().collect::<Vec<_>>(), ["i-03"]);
    }

    #[test]
    fn only_placed_pods_that_ask_for_gpus_are_kept() {
        let pod = |node: Option<&str>, limit: &str| -> Pod {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "p", "uid": "u1"},
                "spec": {"nodeName": node, "containers": [{"name": "c",
                    "resources": {"limits": {GPU: limit}}}]},
            }))
            .unwrap()
        };
        assert_eq!(pod_gpus(&pod(Some("n1"), "2")), Some(("n1".into(), 2)));
        assert_eq!(pod_gpus(&pod(Some("n1"), "0")), None);
        assert_eq!(pod_gpus(&pod(None, "2")), None);

        // A pod that stops asking (or leaves its node) is let go of.
        let mut f: Folded<(String, u32)> = Folded::default();
        let of = |p: &Pod| (p.metadata.uid.clone(), pod_gpus(p));
        f.fold(Event::Apply(pod(Some("n1"), "2")), of);
        assert_eq!(f.live.len(), 1);
        f.fold(Event::Apply(pod(None, "2")), of);
        assert!(f.live.is_empty());
    }
}
