//! What a kind of operation is: a command whose request plans a fixed list of typed
//! stages, checks the world in a pre-flight before anything is written, and runs each
//! stage by one idempotent step. The worker knows nothing about clusters; it calls
//! [`run_stage`], which finds the pipeline by the stored command name.
//!
//! A step observes before it acts (through `crate::resources`: observe, diff, apply the
//! changes), because after a crash or a lost lease the same step runs again with the
//! outputs stored before the crash. Stage names are stored with every operation, so a
//! stage's stored name never changes (the `stages!` tables and their tests fix them).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use std::pin::Pin;

use app::api::operations::OperationRef;
use app::api::values::{IdempotencyKey, Region};
use app::api::{ApiError, Command};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::aws::Aws;
use crate::store::Store;

/// One pipeline's stages: an enum whose variants are the stages in order.
pub trait Stage: Copy + Eq + std::fmt::Debug + Send + Sync + 'static {
    /// Every stage, in the order they run.
    const ALL: &'static [Self];
    /// The name stored with the operation. Never renamed: stored operations name it.
    fn name(self) -> &'static str;
    fn title(self) -> &'static str;
    /// Stopping the operation before or during this stage leaves nothing half-made.
    fn cancellable(self) -> bool;

    fn parse(stored: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|s| s.name() == stored)
    }
}

/// Declares a pipeline's stage enum: `Variant = "stored name", "title", cancellable;`.
macro_rules! stages {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident {
            $($(#[$vmeta:meta])* $variant:ident = $stored:literal, $title:literal, $cancellable:expr;)+
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        $vis enum $name {
            $($(#[$vmeta])* $variant,)+
        }

        impl $crate::operation::pipeline::Stage for $name {
            const ALL: &'static [Self] = &[$($name::$variant),+];

            fn name(self) -> &'static str {
                match self {
                    $($name::$variant => $stored,)+
                }
            }

            fn title(self) -> &'static str {
                match self {
                    $($name::$variant => $title,)+
                }
            }

            fn cancellable(self) -> bool {
                match self {
                    $($name::$variant => $cancellable,)+
                }
            }
        }
    };
}
pub(crate) use stages;

/// What one run of a step found.
#[derive(Clone, Debug, PartialEq)]
pub enum Progress {
    /// The stage's goal holds; go on to the next.
    Done,
    /// Not yet (e.g. EKS is still CREATING): look again after `after`.
    Wait { after: Duration, message: String },
}

impl Progress {
    pub fn wait(after: Duration, message: impl Into<String>) -> Self {
        Progress::Wait {
            after,
            message: message.into(),
        }
    }

    /// Done when nothing is `pending`; otherwise look again after `after`, saying what is
    /// still pending (`say` gets the list, comma-separated).
    pub fn unless_pending<S: std::borrow::Borrow<str>>(
        after: Duration,
        pending: &[S],
        say: impl FnOnce(String) -> String,
    ) -> Self {
        if pending.is_empty() {
            Progress::Done
        } else {
            Progress::wait(after, say(pending.join(", ")))
        }
    }

    /// Done when `note` is `None`, else wait after `after` saying it.
    pub fn unless(after: Duration, note: Option<String>) -> Self {
        note.map_or(Progress::Done, |n| Progress::wait(after, n))
    }
}

/// What a step may use.
pub struct Context {
    pub aws: Arc<Aws>,
    pub store: Store,
    pub operation_id: String,
    /// The token that asked for the operation (its active cluster is per user).
    pub requested_by: String,
}

/// What a pre-flight may use: reads of the store and of the account, nothing that
/// writes. It runs before the operation exists.
pub struct Preflight<'a> {
    pub store: &'a Store,
    pub aws: &'a Aws,
    pub catalogue: &'a dyn Catalogue,
}

/// A boxed future a [`Catalogue`] answers with (async functions of a trait used as
/// `dyn` must box theirs).
pub type Asked<'a, T> = Pin<Box<dyn Future<Output = Result<T, ApiError>> + Send + 'a>>;

/// What the account offers, as pre-flights ask it. The inspection cache implements it
/// (`inspect::Inspector`); the engine names only this trait, so it depends on no domain
/// module.
pub trait Catalogue: Send + Sync {
    /// The region `requested` names, which must be enabled in the account, else hypd's
    /// own; a field error on `region` otherwise.
    fn region<'a>(&'a self, aws: &'a Aws, requested: Option<&'a Region>) -> Asked<'a, String>;

    /// A field error on `field` unless `zone` is an Availability Zone of `region`.
    fn check_zone<'a>(
        &'a self,
        aws: &'a Aws,
        region: &'a str,
        zone: &'a str,
        field: &'a str,
    ) -> Asked<'a, ()>;
}

impl Preflight<'_> {
    /// The region a request names (it must be enabled in the account), or hypd's own.
    pub async fn region(&self, requested: Option<&Region>) -> Result<Region, ApiError> {
        let name = self.catalogue.region(self.aws, requested).await?;
        name.parse()
            .map_err(|e: String| ApiError::field("region", e))
    }
}

/// A command that runs as an operation.
pub trait Pipeline: Command<Output: From<OperationRef>> + Clone {
    type Stage: Stage;
    /// What the stages produce, stored on the operation after every step.
    type Outputs: Serialize + DeserializeOwned + Default + Send + Sync;

    /// What the operation acts on, e.g. `cluster/ml-1`: one unfinished operation per
    /// target at a time.
    fn target(&self) -> String;

    /// The caller's idempotency key, if the request carries one.
    fn idempotency_key(&self) -> Option<&IdempotencyKey>;

    /// The stages, in order. Pure: the same request always plans the same stages.
    fn plan(&self) -> Vec<Self::Stage> {
        Self::Stage::ALL.to_vec()
    }

    /// What must hold before anything is written (the name is free, the type is offered
    /// in the zone, the quota covers it…), as field errors; may fill in defaults (the
    /// region, a bucket name), which are stored with the request.
    fn preflight(self, cx: &Preflight<'_>) -> impl Future<Output = Result<Self, ApiError>> + Send;

    /// The pre-flight of a plan preview: [`Pipeline::preflight`], unless asking what a
    /// request would change differs from whether it may run (a creation that already ran
    /// plans nothing to do, where running it again is refused).
    fn plan_preflight(
        self,
        cx: &Preflight<'_>,
    ) -> impl Future<Output = Result<Self, ApiError>> + Send {
        self.preflight(cx)
    }

    /// Puts the secrets the request carries (a token) where its steps will find them
    /// (a Secret in the cluster) and takes them out of the request, which is then
    /// stored: hypd's store never holds one. It runs once the pre-flight passed, right
    /// before the operation is stored, and is the one write made before an operation
    /// exists; requests without secrets have nothing to do.
    fn keep_secrets(
        &mut self,
        _cx: &Preflight<'_>,
    ) -> impl Future<Output = Result<(), ApiError>> + Send {
        async { Ok(()) }
    }

    /// Runs stage `stage` once.
    fn step(
        &self,
        cx: &Context,
        stage: Self::Stage,
        outputs: &mut Self::Outputs,
    ) -> impl Future<Output = Result<Progress, ApiError>> + Send;

    /// Records what this operation, finished, makes its cluster meant to be (through
    /// `cluster::managed`); most change nothing. It runs before the operation is stored
    /// as finished, so hypd stopping between the two runs it again, and what it records
    /// must then change nothing (`managed` applies an operation's change once).
    /// `succeeded` is false when a stage failed for good.
    fn settle(
        &self,
        _cx: &Context,
        _outputs: &Self::Outputs,
        _succeeded: bool,
    ) -> impl Future<Output = Result<(), ApiError>> + Send {
        async { Ok(()) }
    }

    /// Called once the operation has failed for good (the failure is stored first), so
    /// the domain's own record can say so; an error here is logged, not raised.
    fn failed(&self, _cx: &Context) -> impl Future<Output = Result<(), ApiError>> + Send {
        async { Ok(()) }
    }

    /// Reads the request stored with the operation; a pipeline whose request shape
    /// changed reads its earlier shapes here.
    fn from_stored(spec: &str) -> Result<Self, serde_json::Error> {
        serde_json::from_str(spec)
    }
}

/// Marks a pipeline the worker can run; only [`for_each_pipeline!`] implements it, and
/// only registered pipelines can be submitted, so a pipeline left out of the list does
/// not compile rather than failing at run time.
pub trait Registered: Pipeline {}

/// Calls `$m! { Type, … }` with every pipeline: the one list the worker dispatches on
/// and the service submits through.
macro_rules! for_each_pipeline {
    ($m:ident) => {
        $m! {
            app::api::clusters::CreateCluster,
            app::api::clusters::ImportCluster,
            app::api::clusters::DeleteCluster,
            app::api::clusters::ReconcileCluster,
            app::api::instance_groups::AddInstanceGroup,
            app::api::instance_groups::UpdateInstanceGroup,
            app::api::instance_groups::DeleteInstanceGroup,
            app::api::nodes::RebootNodes,
            app::api::nodes::ReplaceNodes,
            app::api::nodes::DeleteNodes,
            app::api::software::UpdateClusterSoftware,
            app::api::features::UpdateFeatures,
            app::api::storage::CreateS3Storage,
            app::api::storage::CreateFsxStorage,
            app::api::storage::DeleteStorage,
            app::api::models::DownloadModel,
            app::api::training::SubmitTrainingJob,
            app::api::training::DeleteTrainingJob,
            app::api::mlflow::CreateMlflowTrackingServer,
            app::api::inference::DeployModelServer,
            app::api::inference::DeployInferenceEndpoint,
            app::api::jumpstart::DeployJumpstartModel,
            app::api::inference::ScaleEndpoint,
            app::api::inference::DeleteEndpoint,
            app::api::inference::AssignPoolWorkers,
            app::api::inference::ReleasePoolWorkers,
        }
    };
}

pub(crate) use for_each_pipeline;

macro_rules! registered {
    ($($p:ty),* $(,)?) => {
        $(impl Registered for $p {})*
    };
}
for_each_pipeline!(registered);

/// The stored stage names of every pipeline, by command name.
pub fn stored_stage_names() -> Vec<(&'static str, Vec<&'static str>)> {
    macro_rules! names {
        ($($p:ty),* $(,)?) => {
            vec![$((
                <$p as Command>::SPEC.name,
                <<$p as Pipeline>::Stage as Stage>::ALL.iter().map(|s| s.name()).collect(),
            )),*]
        };
    }
    for_each_pipeline!(names)
}

/// Runs one step of the operation of command `command`, from its stored spec and
/// outputs; returns the outputs to store.
pub async fn run_stage(
    cx: &Context,
    command: &str,
    stage: &str,
    spec: &str,
    outputs: &str,
) -> (Result<Progress, ApiError>, Option<Value>) {
    macro_rules! by_command {
        ($($p:ty),* $(,)?) => {
            match command {
                // Boxed, as the commands are in `Service::dispatch`: one stage's future,
                // not the size of the largest pipeline's.
                $(c if c == <$p as Command>::SPEC.name => Box::pin(typed::<$p>(cx, stage, spec, outputs)).await,)*
                other => (
                    Err(ApiError::internal(format!("no pipeline runs {other} operations"))),
                    None,
                ),
            }
        };
    }
    for_each_pipeline!(by_command)
}

/// Lets the pipeline of command `command` record what its finished operation makes its
/// cluster meant to be, from its stored spec and outputs.
pub async fn settle(
    cx: &Context,
    command: &str,
    spec: &str,
    outputs: &str,
    succeeded: bool,
) -> Result<(), ApiError> {
    async fn typed<P: Pipeline>(
        cx: &Context,
        spec: &str,
        outputs: &str,
        succeeded: bool,
    ) -> Result<(), ApiError> {
        let request = P::from_stored(spec).map_err(|e| {
            ApiError::internal(format!(
                "stored {} request is unreadable: {e}",
                P::SPEC.name
            ))
        })?;
        let out: P::Outputs = serde_json::from_str(outputs).unwrap_or_default();
        request.settle(cx, &out, succeeded).await
    }
    macro_rules! by_command {
        ($($p:ty),* $(,)?) => {
            match command {
                $(c if c == <$p as Command>::SPEC.name => typed::<$p>(cx, spec, outputs, succeeded).await,)*
                other => Err(ApiError::internal(format!("no pipeline runs {other} operations"))),
            }
        };
    }
    for_each_pipeline!(by_command)
}

/// Tells the pipeline of command `command` that its operation failed for good.
pub async fn failed(cx: &Context, command: &str, spec: &str) -> Result<(), ApiError> {
    macro_rules! by_command {
        ($($p:ty),* $(,)?) => {
            match command {
                $(c if c == <$p as Command>::SPEC.name => match <$p as Pipeline>::from_stored(spec) {
                    Ok(r) => r.failed(cx).await,
                    Err(e) => Err(ApiError::internal(format!("stored {c} request is unreadable: {e}"))),
                },)*
                other => Err(ApiError::internal(format!("no pipeline runs {other} operations"))),
            }
        };
    }
    for_each_pipeline!(by_command)
}

async fn typed<P: Pipeline>(
    cx: &Context,
    stage: &str,
    spec: &str,
    outputs: &str,
) -> (Result<Progress, ApiError>, Option<Value>) {
    let request = match P::from_stored(spec) {
        Ok(r) => r,
        Err(e) => {
            let e = ApiError::internal(format!(
                "stored {} request is unreadable: {e}",
                P::SPEC.name
            ));
            return (Err(e), None);
        }
    };
    let Some(stage) = P::Stage::parse(stage) else {
        let e = ApiError::internal(format!("{} has no stage {stage}", P::SPEC.name));
        return (Err(e), None);
    };
    let mut out: P::Outputs = serde_json::from_str(outputs).unwrap_or_default();
    let result = request.step(cx, stage, &mut out).await;
    // Outputs are kept even when the step failed: what it made before failing is known.
    (result, serde_json::to_value(&out).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Stored operations name their stages: changing one of these breaks every stored
    /// operation of that kind. Add stages; never rename or remove one.
    #[test]
    fn stored_stage_names_never_change() {
        let names = stored_stage_names();
        let of = |c: &str| {
            names
                .iter()
                .find(|(n, _)| *n == c)
                .map(|(_, s)| s.clone())
                .unwrap()
        };
        assert_eq!(
            of("create_cluster"),
            [
                "network",
                "iam",
                "eks",
                "access",
                "activate",
                "addons",
                "components",
                "hyperpod",
                "storage"
            ]
        );
        assert_eq!(
            of("import_cluster"),
            ["eks", "access", "hyperpod", "register"]
        );
        assert_eq!(
            of("delete_cluster"),
            [
                "hyperpod",
                "addons",
                "eks",
                "mlflow",
                "iam",
                "file_systems",
                "network",
                "bucket",
                "forget"
            ]
        );
        assert_eq!(
            of("reconcile_cluster"),
            [
                "network",
                "iam",
                "eks",
                "access",
                "addons",
                "components",
                "hyperpod",
                "storage"
            ]
        );
        for group_change in [
            "add_instance_group",
            "update_instance_group",
            "delete_instance_group",
        ] {
            assert_eq!(of(group_change), ["hyperpod", "nodes"]);
        }
        for node_action in ["reboot_nodes", "replace_nodes", "delete_nodes"] {
            assert_eq!(of(node_action), ["nodes", "action", "settled"]);
        }
        assert_eq!(of("update_cluster_software"), ["update", "rolled"]);
        assert_eq!(
            of("update_features"),
            [
                "components",
                "training_operator",
                "inference_operator",
                "tiered_checkpointing",
                "autoscaling",
                "kuberay_operator",
                "keda",
                "unneeded"
            ]
        );
        assert_eq!(
            of("create_s3_storage"),
            ["bucket", "access", "volume", "bound"]
        );
        assert_eq!(
            of("create_fsx_storage"),
            [
                "network",
                "driver",
                "file_system",
                "available",
                "repositories",
                "volume",
                "bound"
            ]
        );
        assert_eq!(
            of("delete_storage"),
            ["claim", "volume", "file_system", "access", "bucket"]
        );
        assert_eq!(of("download_model"), ["job", "download", "record"]);
        assert_eq!(of("submit_training_job"), ["job", "started"]);
        assert_eq!(of("delete_training_job"), ["job", "pods"]);
        assert_eq!(
            of("create_mlflow_tracking_server"),
            ["role", "server", "available"]
        );
        assert_eq!(
            of("deploy_model_server"),
            ["workload", "service", "router", "ready", "autoscaling"]
        );
        assert_eq!(of("deploy_inference_endpoint"), ["config", "ready"]);
        assert_eq!(of("deploy_jumpstart_model"), ["model", "ready"]);
        assert_eq!(of("assign_pool_workers"), ["service", "workers"]);
        assert_eq!(of("release_pool_workers"), ["workers"]);
        assert_eq!(of("scale_endpoint"), ["replicas", "ready"]);
        assert_eq!(
            of("delete_endpoint"),
            ["service", "router", "workload", "secret", "pods"]
        );
        assert_eq!(names.len(), 26, "a new pipeline: add its stored names here");
    }

    #[test]
    fn every_pipeline_is_a_mutating_command_with_a_status_command() {
        for e in app::api::COMMANDS {
            let is_pipeline = stored_stage_names().iter().any(|(n, _)| *n == e.spec.name);
            if is_pipeline {
                assert_ne!(e.spec.effect, app::api::Effect::ReadOnly, "{}", e.spec.name);
                assert_eq!(
                    e.spec.status_command,
                    Some("get_operation"),
                    "{}",
                    e.spec.name
                );
            }
        }
    }
}
