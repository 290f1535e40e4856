//! The things hypd makes in AWS and Kubernetes, one home per kind, each in three parts:
//! `observe` (read-only calls), a pure `diff` of what is wanted against what was observed,
//! and `apply` of one change. A stage's step observes, diffs, applies exactly the changes
//! and reports progress, so what a step would do can be said before it does it and a step
//! run again after a crash finds nothing left to do. Resources know nothing of operations,
//! stages or requests: they take plain specs and return what they found.

pub mod ec2;
pub mod eks;
pub mod fsx;
pub mod iam;
pub mod kube;
pub mod s3;
pub mod sagemaker;
pub mod tags;

use std::future::Future;

use app::api::ApiError;
use app::api::plan::{Change, KNOWN_AFTER_APPLY};

/// What hypd wants of an object: to exist as specified, or to be gone.
#[derive(Clone, Debug, PartialEq)]
pub enum Want<S> {
    Present(S),
    /// Gone, if hypd made it (an object without hypd's tags is left alone).
    Absent,
}

impl<S> Want<S> {
    pub fn present(&self) -> Option<&S> {
        match self {
            Want::Present(s) => Some(s),
            Want::Absent => None,
        }
    }
}

/// One kind of object, bound to its desired state and the client that reaches it.
pub trait Resource: Sync {
    /// What is there now.
    type Observed: Send;
    /// One mutating call's worth of change.
    type Op: Send + Sync;

    /// Read-only calls only.
    fn observe(&self) -> impl Future<Output = Result<Self::Observed, ApiError>> + Send;

    /// The changes that take `observed` to what is wanted, in the order they must be
    /// applied; empty when it holds already. Pure. An error when no change can get there
    /// (a named VPC that does not exist, no free address block).
    fn diff(&self, observed: &Self::Observed) -> Result<Vec<Self::Op>, ApiError>;

    /// Makes one change, and records its result in `observed` (a new id, a new state),
    /// so the next change and the caller see the world as it now is.
    fn apply(
        &self,
        op: &Self::Op,
        observed: &mut Self::Observed,
    ) -> impl Future<Output = Result<(), ApiError>> + Send;

    /// The change as a plan shows it.
    fn describe(&self, op: &Self::Op, observed: &Self::Observed) -> Change;

    /// The changes one op makes, for an op that acts on several objects at once (a batch
    /// call on nodes): one per object.
    fn describe_all(&self, op: &Self::Op, observed: &Self::Observed) -> Vec<Change> {
        vec![self.describe(op, observed)]
    }

    /// What `apply` would record in `observed` for `op`, without a call: the values only
    /// the provider gives (ids, ARNs, an issuer) as [`KNOWN_AFTER_APPLY`]. A plan goes on
    /// from there, so what later changes and stages would do with the object is planned
    /// too (a subnet in the VPC this plan creates).
    fn assume(&self, op: &Self::Op, observed: &mut Self::Observed);
}

/// How a plan names an object: by its id once it has one, else (not made yet, or made
/// by this plan) by `name`.
pub fn shown(id: Option<&str>, name: impl FnOnce() -> String) -> String {
    match id {
        Some(id) if !known_after_apply(id) => id.to_owned(),
        _ => name(),
    }
}

/// Whether `value` is one a plan has not got yet. Observes given one find nothing (an
/// object inside a VPC the plan creates does not exist) without asking.
pub fn known_after_apply(value: &str) -> bool {
    value.contains(KNOWN_AFTER_APPLY)
}

/// Observes `r`, applies the changes its diff finds, and returns what is there after.
/// Inside [`planning`], each change is recorded instead of applied and assumed made
/// ([`Resource::assume`]): a step run for a plan calls exactly this code, so the plan
/// holds the changes the step would make.
pub async fn converge<R: Resource>(r: &R) -> Result<R::Observed, ApiError> {
    let mut observed = r.observe().await?;
    let ops = r.diff(&observed)?;
    if is_planning() {
        for op in &ops {
            let changes = r.describe_all(op, &observed);
            PLANNED.with(|p| lock(p).changes.extend(changes));
            r.assume(op, &mut observed);
        }
        return Ok(observed);
    }
    for op in ops {
        r.apply(&op, &mut observed).await?;
    }
    Ok(observed)
}

tokio::task_local! {
    /// What a step run for a plan has recorded so far.
    static PLANNED: std::sync::Mutex<Planned>;
}

#[derive(Default)]
struct Planned {
    changes: Vec<Change>,
    /// Objects assumed made, by kind and scope: what later observes of the same plan see.
    made: Vec<(&'static str, String, String)>,
}

fn lock(p: &std::sync::Mutex<Planned>) -> std::sync::MutexGuard<'_, Planned> {
    p.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs `f` (a pipeline's steps) for a plan: every [`converge`] in it records its
/// changes instead of making them, and what one step assumed made, the next one's
/// observes see. [`take_planned`] hands over the changes recorded so far. The clients `f`
/// uses should be read-only as well ([`crate::aws::Aws::read_only`]).
pub async fn planning<F: Future>(f: F) -> F::Output {
    PLANNED.scope(std::sync::Mutex::default(), f).await
}

/// The changes recorded since the last take (one stage's), in order; none outside a plan.
pub fn take_planned() -> Vec<Change> {
    PLANNED
        .try_with(|p| std::mem::take(&mut lock(p).changes))
        .unwrap_or_default()
}

/// True inside [`planning`]: a step asks before it writes hypd's own store, or waits on
/// a change the plan only recorded.
pub fn is_planning() -> bool {
    PLANNED.try_with(|_| ()).is_ok()
}

/// Records a change that is not a [`Resource`]'s (hypd's own records) when planning.
/// Returns true when it was recorded, i.e. the caller must not make it.
pub fn planned(change: impl FnOnce() -> Change) -> bool {
    PLANNED.try_with(|p| lock(p).changes.push(change())).is_ok()
}

/// Inside a plan, notes that an object of `kind` in `scope` (a VPC id) is assumed made
/// with `value` (its block): an observe of the same plan adds it to what it found.
pub fn assume_made(kind: &'static str, scope: &str, value: String) {
    let _ = PLANNED.try_with(|p| lock(p).made.push((kind, scope.to_owned(), value)));
}

/// The values of the objects of `kind` in `scope` this plan assumed made (none outside
/// a plan).
pub fn made_in_plan(kind: &str, scope: &str) -> Vec<String> {
    PLANNED
        .try_with(|p| {
            lock(p)
                .made
                .iter()
                .filter(|(k, s, _)| *k == kind && s == scope)
                .map(|(_, _, v)| v.clone())
                .collect()
        })
        .unwrap_or_default()
}

/// The changes `converge` would make now, without making them.
pub async fn plan<R: Resource>(r: &R) -> Result<Vec<Change>, ApiError> {
    let observed = r.observe().await?;
    Ok(r.diff(&observed)?
        .iter()
        .map(|op| r.describe(op, &observed))
        .collect())
}

/// The internal error for a value an earlier change should have produced.
pub(crate) fn missing(what: &str) -> ApiError {
    ApiError::internal(format!("{what} is not known: it should exist by now"))
}

/// A kind whose teardown is "delete each of the objects hypd made, by id": the listing
/// and the one call differ per kind, the rest is [`DeleteEach`]'s.
pub trait Listed: Sync {
    /// The kind as plans show it (`ec2:Subnet`).
    const KIND: &'static str;
    /// The ids of the objects to delete.
    fn list(&self) -> impl Future<Output = Result<Vec<String>, ApiError>> + Send;
    /// Deletes one; an object already gone is not an error.
    fn delete(&self, id: &str) -> impl Future<Output = Result<(), ApiError>> + Send;
}

/// Teardown of every object a [`Listed`] lists.
pub struct DeleteEach<K>(pub K);

impl<K: Listed> Resource for DeleteEach<K> {
    type Observed = Vec<String>;
    type Op = String;

    async fn observe(&self) -> Result<Vec<String>, ApiError> {
        self.0.list().await
    }

    fn diff(&self, observed: &Vec<String>) -> Result<Vec<String>, ApiError> {
        Ok(observed.clone())
    }

    async fn apply(&self, id: &String, observed: &mut Vec<String>) -> Result<(), ApiError> {
        self.0.delete(id).await?;
        observed.retain(|o| o != id);
        Ok(())
    }

    fn describe(&self, id: &String, _: &Vec<String>) -> Change {
        Change::new(app::api::plan::Action::Delete, K::KIND, id)
    }

    fn assume(&self, id: &String, observed: &mut Vec<String>) {
        observed.retain(|o| o != id);
    }
}
