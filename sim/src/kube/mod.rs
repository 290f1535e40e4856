//! A Kubernetes API server per EKS cluster, faithful enough for `kubectl` and kube-rs:
//! HTTPS with a per-cluster CA, EKS token authentication, discovery, CRUD, server-side
//! apply, watch, CRDs, `pods/log`, and a world (nodes, workloads, logs) driven by the
//! sim's clock. Its state lives in the [`World`] under the same lock as EKS and
//! SageMaker, so what HyperPod reports and what the cluster shows never disagree.
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
mod logs;
mod scheduler;
mod schema;
mod store;
mod table;
mod time;
mod tls;

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use axum::Router;
use base64::Engine;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use tokio::sync::watch;

use crate::world::{Shared, World};

pub use store::Store;

/// Real time between two runs of the cluster's controllers.
const TICK: Duration = Duration::from_millis(100);

/// Every cluster's API server.
pub struct Kube {
    clusters: BTreeMap<String, ClusterApi>,
    /// The secret access key tokens must be signed with (`--aws-secret-access-key`).
    pub secret: String,
}

impl Default for Kube {
    fn default() -> Self {
        Self {
            clusters: BTreeMap::new(),
            secret: "testing".to_owned(),
        }
    }
}

/// One cluster's API server: its address, CA and objects.
pub struct ClusterApi {
    pub endpoint: String,
    pub ca_pem: String,
    pub store: Store,
    pub version: String,
    pub region: String,
    /// Dropping it stops the listener, its connections and the controllers.
    _shutdown: watch::Sender<()>,
}

impl Kube {
    /// Starts the API server of EKS cluster `name` (Kubernetes `version`, e.g. "1.33").
    pub fn start(
        &mut self,
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
        let router = api::router(world.clone(), name.to_owned());
        let acceptor = tokio_rustls::TlsAcceptor::from(tls.config.clone());
        tokio::spawn(serve(listener, acceptor, router, stopped.clone()));
        tokio::spawn(controllers::run(world, name.to_owned(), stopped));
        let mut store = Store::new();
        admission::bootstrap(&mut store, &time::rfc3339(now_epoch));
        self.clusters.insert(
            name.to_owned(),
            ClusterApi {
                endpoint: format!("https://{addr}"),
                ca_pem: tls.ca_pem,
                store,
                version: version.to_owned(),
                region: region.to_owned(),
                _shutdown: shutdown,
            },
        );
        tracing::info!(cluster = name, %addr, "Kubernetes API server started");
        Ok(())
    }

    /// Stops the servers of clusters that no longer exist.
    pub fn retain(&mut self, exists: impl Fn(&str) -> bool) {
        self.clusters.retain(|name, _| exists(name));
    }

    /// `(endpoint, base64 of the CA PEM)` as DescribeCluster reports them.
    pub fn connection(&self, name: &str) -> Option<(String, String)> {
        let c = self.clusters.get(name)?;
        Some((
            c.endpoint.clone(),
            base64::engine::general_purpose::STANDARD.encode(&c.ca_pem),
        ))
    }

    pub fn cluster_mut(&mut self, name: &str) -> Option<&mut ClusterApi> {
        self.clusters.get_mut(name)
    }
}

impl World {
    /// The API server state of `cluster`, if it is running.
    pub(crate) fn kube_cluster(&mut self, cluster: &str) -> Option<&mut ClusterApi> {
        self.kube.cluster_mut(cluster)
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

/// Sim time as Kubernetes writes timestamps.
pub(crate) fn timestamp(w: &World) -> String {
    time::rfc3339(w.clock.epoch(w.clock.now()))
}
