//! The things hypd makes in AWS and Kubernetes, one home per kind, each in three parts:
//! `observe` (read-only calls), a pure `diff` of what is wanted against what was observed,
//! and `apply` of one change. A stage's step observes, diffs, applies exactly the changes
//! and reports progress, so what a step would do can be said before it does it and a step
//! run again after a crash finds nothing left to do. Resources know nothing of operations,
//! stages or requests: they take plain specs and return what they found.

pub mod ec2;
pub mod eks;
pub mod iam;
pub mod kube;
pub mod s3;
pub mod sagemaker;
pub mod tags;

use std::future::Future;

use app::api::ApiError;
use app::api::plan::Change;

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
}

/// Observes `r`, applies the changes its diff finds, and returns what is there after.
/// Inside [`planning`], the changes are recorded instead of applied and what was
/// observed is returned as it is: a step run for a plan calls exactly this code, so the
/// plan holds the changes the step would make.
pub async fn converge<R: Resource>(r: &R) -> Result<R::Observed, ApiError> {
    let mut observed = r.observe().await?;
    let ops = r.diff(&observed)?;
    let planned = PLANNED.try_with(|p| {
        lock(p).extend(ops.iter().map(|op| r.describe(op, &observed)));
    });
    if planned.is_ok() {
        return Ok(observed);
    }
    for op in ops {
        r.apply(&op, &mut observed).await?;
    }
    Ok(observed)
}

tokio::task_local! {
    /// The changes recorded while a step runs for a plan.
    static PLANNED: std::sync::Mutex<Vec<Change>>;
}

fn lock(p: &std::sync::Mutex<Vec<Change>>) -> std::sync::MutexGuard<'_, Vec<Change>> {
    p.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs `f` (a stage's step) for a plan: every [`converge`] in it records its changes
/// instead of making them. Returns what `f` returned and the changes, in order. The
/// clients `f` uses should be read-only as well ([`crate::aws::Aws::read_only`]).
pub async fn planning<F: Future>(f: F) -> (F::Output, Vec<Change>) {
    PLANNED
        .scope(std::sync::Mutex::new(Vec::new()), async move {
            let out = f.await;
            let changes = PLANNED.with(|p| std::mem::take(&mut *lock(p)));
            (out, changes)
        })
        .await
}

/// True inside [`planning`]: a step asks before it writes hypd's own store, or waits on
/// a change the plan only recorded.
pub fn is_planning() -> bool {
    PLANNED.try_with(|_| ()).is_ok()
}

/// Records a change that is not a [`Resource`]'s (hypd's own records) when planning.
/// Returns true when it was recorded, i.e. the caller must not make it.
pub fn planned(change: impl FnOnce() -> Change) -> bool {
    PLANNED.try_with(|p| lock(p).push(change())).is_ok()
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
}
