//! A Kubernetes API server per EKS cluster, faithful enough for `kubectl` and kube-rs:
//! HTTPS with a per-cluster CA, EKS token authentication, discovery, CRUD, server-side
//! apply, watch, CRDs, `pods/log`, `services/proxy` (answered by the pods' model
//! servers), and a world (nodes, workloads, logs) driven by the sim's clock. Each
//! cluster's objects are behind a lock of their own, as each real EKS cluster has its
//! own etcd: a request to one cluster never waits for another's, nor for EKS or
//! SageMaker. Its controllers read HyperPod and EKS under the AWS lock and
//! then write the objects under the cluster's, never holding both (see `world`).
//!
//! Lifecycle (documented choice): the server starts when CreateCluster is accepted and
//! DescribeCluster reveals its endpoint and CA once the cluster is ACTIVE, as EKS does; it
//! stops when the cluster is gone (deleted, or the sim reset).

mod admission;
mod api;
mod apply;
mod auth;
mod controllers;
mod discovery;
mod inference_router;
mod logs;
mod model_server;
mod prometheus;
mod scheduler;
mod schema;
mod service_proxy;
mod sglang_router;
mod store;
mod table;
mod time;
mod tls;

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use axum::Router;
use base64::Engine;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use tokio::sync::{Notify, watch};

use crate::world::Shared;

pub use auth::access_key as token_access_key;
pub use store::Store;

/// Every cluster's API server, by EKS cluster name. The table is a leaf lock: a request
/// takes its cluster out of it and lets go before touching the cluster's objects.
pub struct Kube {
    clusters: Mutex<BTreeMap<String, Arc<ClusterApi>>>,
    /// The secret access key tokens must be signed with (`--aws-secret-access-key`).
    pub secret: String,
}

/// One cluster's API server: its address, CA and objects.
pub struct ClusterApi {
    pub name: String,
    pub endpoint: String,
    pub ca_pem: String,
    pub version: String,
    pub region: String,
    pub store: tokio::sync::Mutex<Store>,
    /// What its pods' model servers have served, and whose turn it is behind each
    /// Service (see [`service_proxy`]).
    pub serving: model_server::Serving,
    /// What KEDA's scale loops and the HPAs they drive remember between passes.
    pub autoscalers: controllers::Autoscalers,
    /// Wakes the controllers: every change of the store does, and whatever changes in
    /// EKS or HyperPod for this cluster (see [`Kube::wake`]).
    wake: Arc<Notify>,
    /// Dropping it stops the listener, its connections and the controllers.
    _shutdown: watch::Sender<()>,
}

impl Kube {
    pub fn new(secret: String) -> Self {
        Self {
            clusters: Mutex::new(BTreeMap::new()),
            secret,
        }
    }

    fn table(&self) -> MutexGuard<'_, BTreeMap<String, Arc<ClusterApi>>> {
        self.clusters.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts the API server of EKS cluster `name` (Kubernetes `version`, e.g. "1.33").
    pub fn start(
        &self,
        name: &str,
        version: &str,
        region: &str,
        world: Shared,
        now_epoch: f64,
    ) -> Result<(), String> {
        let tls = tls::generate(name).map_err(|e| e.to_string())?;
        let listener = std::net::TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))
            .map_err(|e| format!("cannot listen for the Kubernetes API: {e}"))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| format!("cannot listen for the Kubernetes API: {e}"))?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        let listener = tokio::net::TcpListener::from_std(listener).map_err(|e| e.to_string())?;
        let (shutdown, stopped) = watch::channel(());
        let mut store = Store::new();
        admission::bootstrap(&mut store, &time::rfc3339(now_epoch));
        let wake = store.changes();
        let api = Arc::new(ClusterApi {
            name: name.to_owned(),
            endpoint: format!("https://{addr}"),
            ca_pem: tls.ca_pem,
            store: tokio::sync::Mutex::new(store),
            serving: model_server::Serving::default(),
            autoscalers: controllers::Autoscalers::default(),
            version: version.to_owned(),
            region: region.to_owned(),
            wake: wake.clone(),
            _shutdown: shutdown,
        });
        // The server and the controllers hold the cluster weakly: dropping it from the
        // table is what stops them.
        let router = api::router(world.clone(), Arc::downgrade(&api));
        let acceptor = tokio_rustls::TlsAcceptor::from(tls.config.clone());
        tokio::spawn(serve(listener, acceptor, router, stopped.clone()));
        tokio::spawn(controllers::run(world, Arc::downgrade(&api), wake, stopped));
        let replaced = self.table().insert(name.to_owned(), api);
        drop(replaced);
        tracing::info!(cluster = name, %addr, "Kubernetes API server started");
        Ok(())
    }

    /// Cluster `name`'s objects and controllers' wake-up, served by no listener, for
    /// unit tests of the controllers; with what tells them it is stopped.
    #[cfg(test)]
    pub fn serve_nothing(&self, name: &str) -> (Arc<ClusterApi>, watch::Receiver<()>) {
        let (shutdown, stopped) = watch::channel(());
        let mut store = Store::new();
        admission::bootstrap(&mut store, "2026-01-01T00:00:00Z");
        let api = Arc::new(ClusterApi {
            name: name.to_owned(),
            endpoint: String::new(),
            ca_pem: String::new(),
            wake: store.changes(),
            store: tokio::sync::Mutex::new(store),
            serving: model_server::Serving::default(),
            autoscalers: controllers::Autoscalers::default(),
            version: "1.33".to_owned(),
            region: "us-east-1".to_owned(),
            _shutdown: shutdown,
        });
        self.table().insert(name.to_owned(), api.clone());
        (api, stopped)
    }

    /// Stops the server of cluster `name`, if it runs.
    pub fn stop(&self, name: &str) {
        let stopped = self.table().remove(name);
        drop(stopped);
    }

    /// Stops every server.
    pub fn clear(&self) {
        let stopped = std::mem::take(&mut *self.table());
        drop(stopped);
    }

    /// `(endpoint, base64 of the CA PEM)` as DescribeCluster reports them.
    pub fn connection(&self, name: &str) -> Option<(String, String)> {
        let c = self.get(name)?;
        Some((
            c.endpoint.clone(),
            base64::engine::general_purpose::STANDARD.encode(&c.ca_pem),
        ))
    }

    pub fn get(&self, name: &str) -> Option<Arc<ClusterApi>> {
        self.table().get(name).cloned()
    }

    /// Wakes the controllers of cluster `name`, if it runs: something they read of EKS
    /// or HyperPod changed.
    pub fn wake(&self, name: &str) {
        if let Some(api) = self.get(name) {
            api.wake.notify_one();
        }
    }

    /// Wakes every cluster's controllers: something all of them read changed (the
    /// clock's speed, the faults, the quotas or the instance-type table).
    pub fn wake_all(&self) {
        for api in self.table().values() {
            api.wake.notify_one();
        }
    }

    /// Whether `api` is still the server of its cluster (not stopped, nor replaced by
    /// a cluster of the same name created since).
    pub fn is_current(&self, api: &ClusterApi) -> bool {
        self.table()
            .get(&api.name)
            .is_some_and(|c| std::ptr::eq(Arc::as_ptr(c), api))
    }
}

async fn serve(
    listener: tokio::net::TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
    router: Router,
    mut stopped: watch::Receiver<()>,
) {
    loop {
        tokio::select! {
            _ = stopped.changed() => return,
            accepted = listener.accept() => {
                let Ok((tcp, _)) = accepted else { continue };
                let acceptor = acceptor.clone();
                let router = router.clone();
                let mut stopped = stopped.clone();
                tokio::spawn(async move {
                    let Ok(Ok(tls)) = tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp)).await else {
                        return;
                    };
                    let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                    let conn = builder.serve_connection_with_upgrades(
                        TokioIo::new(tls),
                        TowerToHyperService::new(router),
                    );
                    tokio::select! {
                        _ = conn => {}
                        _ = stopped.changed() => {}
                    }
                });
            }
        }
    }
}

/// Holds a cluster's server weakly, for what must not keep it running.
pub(crate) type WeakApi = Weak<ClusterApi>;
