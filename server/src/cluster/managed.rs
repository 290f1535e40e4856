//! One place to find a cluster hypd manages and what it is meant to be: its row, and its
//! desired state (the request that made it with every later change applied), which each
//! pipeline updates from its own `settle` hook as it finishes. No list of commands is kept:
//! a pipeline that changes what a cluster is meant to be says so in its hook, and a store
//! written before the state was kept is filled from its operations at start (`replay`).
//! This module knows no pipeline, so every pipeline can use it without a circle.

use app::api::ApiError;
use app::api::clusters::{ClusterSummary, CreateCluster, ImportCluster};
use app::api::{Command, values::InstanceCount};
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::collections::BTreeMap;

use crate::store::{Store, StoreError, on_pool};

/// The request that made a cluster, as every change since left it.
#[derive(Debug, Clone, PartialEq)]
pub enum Desired {
    Created(CreateCluster),
    Imported(ImportCluster),
}

impl Desired {
    /// The command whose request this is (stored as `made_by`).
    pub fn command(&self) -> &'static str {
        match self {
            Desired::Created(_) => CreateCluster::SPEC.name,
            Desired::Imported(_) => ImportCluster::SPEC.name,
        }
    }

    fn request(&self) -> Result<String, ApiError> {
        match self {
            Desired::Created(r) => serde_json::to_string(r),
            Desired::Imported(r) => serde_json::to_string(r),
        }
        .map_err(ApiError::internal)
    }

    fn decode(made_by: &str, request: &str) -> Result<Self, ApiError> {
        let unreadable = |e: serde_json::Error| {
            ApiError::internal(format!(
                "the desired state's {made_by} request is unreadable: {e}"
            ))
        };
        match made_by {
            c if c == CreateCluster::SPEC.name => CreateCluster::from_stored(request)
                .map(Desired::Created)
                .map_err(unreadable),
            c if c == ImportCluster::SPEC.name => serde_json::from_str(request)
                .map(Desired::Imported)
                .map_err(unreadable),
            other => Err(ApiError::internal(format!(
                "the desired state names {other}, which makes no cluster"
            ))),
        }
    }

    /// Lowers the created groups' counts by the nodes deleted from each (HyperPod lowers
    /// them itself, so drift must not bring the nodes back). An imported cluster's groups
    /// are managed where it was created.
    pub fn without_nodes(mut self, per_group: &BTreeMap<String, u32>) -> Result<Self, ApiError> {
        if let Desired::Created(r) = &mut self {
            for g in &mut r.instance_groups {
                if let Some(n) = per_group.get(g.name.as_str()) {
                    let left = g.instance_count.get().saturating_sub(*n);
                    g.instance_count = InstanceCount::new(left).map_err(ApiError::internal)?;
                }
            }
        }
        Ok(self)
    }
}

/// Where a cluster is, from hypd's record of it.
pub(crate) struct Where {
    pub region: String,
    /// hypd's name for it, which is its EKS cluster's.
    pub eks: String,
    pub hyperpod: String,
}

/// A cluster hypd manages, read once: its row and, once a creation or import finished,
/// what it is meant to be and what its creation made.
pub struct Managed {
    pub summary: ClusterSummary,
    desired: Option<(Desired, String)>,
}

impl Managed {
    /// Cluster `name`, or not found.
    pub async fn load(store: &Store, name: &str) -> Result<Managed, ApiError> {
        let summary = super::rows::required(store, name).await?;
        let row: Option<(String, String, String)> = on_pool!(store, |pool| sqlx::query_as(
            "SELECT made_by, request, outputs FROM desired_clusters WHERE name = $1"
        )
        .bind(name)
        .fetch_optional(pool)
        .await)
        .map_err(StoreError::from)?;
        let desired = row
            .map(|(made_by, request, outputs)| {
                Desired::decode(&made_by, &request).map(|d| (d, outputs))
            })
            .transpose()?;
        Ok(Managed { summary, desired })
    }

    pub fn name(&self) -> &str {
        &self.summary.name
    }

    /// What the cluster is meant to be; none until its creation or import finished.
    pub fn desired(&self) -> Option<&Desired> {
        self.desired.as_ref().map(|(d, _)| d)
    }

    /// What it is meant to be, or a field error saying there is nothing to hold it to.
    pub fn required(&self) -> Result<&Desired, ApiError> {
        self.desired().ok_or_else(|| {
            ApiError::field(
                "name",
                format!(
                    "{} has no finished creation or import to hold it to: retry or delete the one that failed",
                    self.name()
                ),
            )
        })
    }

    /// Refuses, by the field `name`, a cluster in none of `statuses`; `needs` says what
    /// asks for them ("nodes are acted on in an active or imported cluster").
    pub fn in_status(&self, statuses: &[&str], needs: &str) -> Result<&Self, ApiError> {
        if statuses.contains(&self.summary.status.as_str()) {
            return Ok(self);
        }
        Err(ApiError::field(
            "name",
            format!("{} is {}: {needs}", self.name(), self.summary.status),
        ))
    }

    /// The outputs of the creation that made it (the default when it was imported).
    pub fn created<T: DeserializeOwned + Default>(&self) -> Result<T, ApiError> {
        match &self.desired {
            Some((Desired::Created(_), outputs)) => serde_json::from_str(outputs).map_err(|e| {
                ApiError::internal(format!("the stored creation outputs are unreadable: {e}"))
            }),
            _ => Ok(T::default()),
        }
    }

    /// An output of its creation (a JSON pointer, e.g. `/hyperpod/s3_bucket`), if hypd
    /// created it.
    pub fn creation_output(&self, pointer: &str) -> Option<String> {
        match &self.desired {
            Some((Desired::Created(_), outputs)) => {
                serde_json::from_str::<serde_json::Value>(outputs)
                    .ok()?
                    .pointer(pointer)?
                    .as_str()
                    .map(str::to_owned)
            }
            _ => None,
        }
    }

    /// Where it is, for acting on its nodes and features: an active or imported cluster
    /// with a HyperPod cluster.
    pub(crate) fn at(&self, needs: &str) -> Result<Where, ApiError> {
        self.in_status(&["active", "imported"], needs)?;
        let name = self.name();
        let hyperpod = self
            .summary
            .hyperpod_cluster_arn
            .as_deref()
            .map(|arn| arn.rsplit('/').next().unwrap_or(arn).to_owned())
            .ok_or_else(|| ApiError::field("name", format!("{name} has no HyperPod cluster")))?;
        Ok(Where {
            region: self.summary.region.clone(),
            eks: name.to_owned(),
            hyperpod,
        })
    }
}

/// Where cluster `name` is, for acting on it: `needs` says what for.
pub(crate) async fn locate(store: &Store, name: &str, needs: &str) -> Result<Where, ApiError> {
    Managed::load(store, name).await?.at(needs)
}

/// Records that operation `operation` made cluster `name` (a creation or an import that
/// succeeded): its request is what the cluster is meant to be from now on.
pub async fn made(
    store: &Store,
    name: &str,
    operation: &str,
    desired: &Desired,
    outputs: &impl Serialize,
) -> Result<(), ApiError> {
    let request = desired.request()?;
    let outputs = serde_json::to_string(outputs).map_err(ApiError::internal)?;
    let now = crate::clock::now();
    on_pool!(store, |pool| sqlx::query(
        "INSERT INTO desired_clusters (name, made_by, request, outputs, operation, updated_at) \
         VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (name) DO UPDATE SET made_by = excluded.made_by, \
         request = excluded.request, outputs = excluded.outputs, operation = excluded.operation, \
         updated_at = excluded.updated_at"
    )
    .bind(name)
    .bind(desired.command())
    .bind(&request)
    .bind(&outputs)
    .bind(operation)
    .bind(&now)
    .execute(pool)
    .await
    .map(drop))
    .map_err(StoreError::from)?;
    Ok(())
}

/// Applies operation `operation`'s change to what cluster `name` is meant to be, once:
/// run again (hypd stopped before the operation was stored as finished), it changes
/// nothing. A change that leaves the state as it was records nothing. A cluster with no
/// desired state yet (its creation has not finished) is left.
pub async fn change(
    store: &Store,
    name: &str,
    operation: &str,
    apply: impl FnOnce(Desired) -> Result<Desired, ApiError> + Send,
) -> Result<(), ApiError> {
    // Operations on one cluster run one at a time, so nothing else writes the row
    // between this read and the write below.
    let row: Option<(String, String, String)> = on_pool!(store, |pool| sqlx::query_as(
        "SELECT made_by, request, operation FROM desired_clusters WHERE name = $1"
    )
    .bind(name)
    .fetch_optional(pool)
    .await)
    .map_err(StoreError::from)?;
    let Some((made_by, request, last)) = row else {
        return Ok(());
    };
    if last == operation {
        return Ok(());
    }
    let before = Desired::decode(&made_by, &request)?;
    let after = apply(before.clone())?;
    // Nothing changed (a deletion that failed before HyperPod took a node): nothing is
    // recorded, so a retry of the same operation that does change it still applies.
    if after == before {
        return Ok(());
    }
    let changed = after.request()?;
    let now = crate::clock::now();
    on_pool!(store, |pool| sqlx::query(
        "UPDATE desired_clusters SET request = $2, operation = $3, updated_at = $4 WHERE name = $1"
    )
    .bind(name)
    .bind(&changed)
    .bind(operation)
    .bind(&now)
    .execute(pool)
    .await
    .map(drop))
    .map_err(StoreError::from)?;
    Ok(())
}

/// Fills in the desired state of a cluster that has none, as `replay` read it from the
/// operations of a store written before the state was kept. Another replica doing the
/// same first wins; nothing is overwritten.
pub(crate) async fn fill(
    store: &Store,
    name: &str,
    operation: &str,
    desired: &Desired,
    outputs: &str,
) -> Result<(), ApiError> {
    let request = desired.request()?;
    let now = crate::clock::now();
    on_pool!(store, |pool| sqlx::query(
        "INSERT INTO desired_clusters (name, made_by, request, outputs, operation, updated_at) \
         VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (name) DO NOTHING"
    )
    .bind(name)
    .bind(desired.command())
    .bind(&request)
    .bind(outputs)
    .bind(operation)
    .bind(&now)
    .execute(pool)
    .await
    .map(drop))
    .map_err(StoreError::from)?;
    Ok(())
}
