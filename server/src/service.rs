//! The service layer: the one entry point (`dispatch`) that REST, MCP and the console all
//! call. It authorises the actor, decodes the request into the command's type (which
//! rejects bad values, with the field's path), runs the cross-field checks, calls the
//! command's handler and writes mutations to the audit log. Dispatch only: each handler
//! lives in the module of its domain noun (`cluster`, `operation`, `inspect`, `tokens`),
//! and every pipeline is submitted by the one generic handler below.

use std::future::Future;
use std::sync::Arc;

use app::api::plan::{ConfirmationRequired, DryRun, Plan};
use app::api::values::Confirmation;
use app::api::{ApiError, Command, Effect};
use serde_json::Value;
use serde_json::value::RawValue;

use crate::audit;
use crate::auth::{Actor, Auth, authorize};
use crate::aws::Aws;
use crate::confirm;
use crate::inspect::catalogue::Inspector;
use crate::operation::pipeline::{Preflight, Registered};
use crate::operation::submit::submit;
use crate::operation::worker::Wake;
use crate::store::Store;

/// Runs one command type. Each command has exactly one of these.
pub trait Handler<C: Command> {
    fn handle(
        &self,
        actor: &Actor,
        request: C,
    ) -> impl Future<Output = Result<C::Output, ApiError>> + Send;

    /// What `request` would do, for `dry_run` and for the plan a destructive command
    /// answers its first call with. Only commands that offer either have one.
    fn preview(
        &self,
        _actor: &Actor,
        _request: C,
    ) -> impl Future<Output = Result<Plan, ApiError>> + Send {
        async {
            Err(ApiError::internal(format!(
                "{} has no plan preview",
                C::SPEC.name
            )))
        }
    }

    /// What this very request already started under its idempotency key, if anything
    /// (operations only: no other command takes a key).
    fn started(
        &self,
        _request: &C,
    ) -> impl Future<Output = Result<Option<C::Output>, ApiError>> + Send {
        async { Ok(None) }
    }
}

pub struct Service {
    pub store: Store,
    pub auth: Auth,
    pub aws: Arc<Aws>,
    pub sandbox: bool,
    /// Wakes the operations worker when an operation is submitted or retried.
    pub wake: Wake,
    /// What the account offers (regions, zones, instance types), cached.
    pub catalogue: Inspector,
    /// The cluster list as last rendered.
    pub clusters: crate::cluster::rows::ListCache,
    /// Each read cluster's nodes, kept current by watches.
    pub nodes: crate::node::view::Views,
    /// Training pods' logs: one upstream stream per container, shared by every viewer.
    pub logs: crate::training::logs::LogHub,
    /// Every operation change, read from the store once for all who follow it.
    pub changes: Arc<crate::operation::feed::Feed>,
}

impl Service {
    /// `fresh`: how young a read of AWS must be to answer from (`--min-poll-interval`).
    pub fn new(store: Store, aws: Arc<Aws>, sandbox: bool, fresh: std::time::Duration) -> Self {
        Self {
            auth: Auth::new(store.clone()),
            changes: Arc::new(crate::operation::feed::Feed::new(store.clone())),
            store,
            aws,
            sandbox,
            wake: Wake::default(),
            catalogue: Inspector::default(),
            clusters: Default::default(),
            nodes: crate::node::view::Views::new(fresh),
            logs: Default::default(),
        }
    }

    /// Runs the command named `name` with JSON `input` for `actor`. The answer is its
    /// JSON text, serialized once from the typed output (REST sends it as it is).
    pub async fn dispatch(
        &self,
        actor: &Actor,
        name: &str,
        input: Value,
    ) -> Result<Box<RawValue>, ApiError> {
        // Each command's future on the heap: inline, this one would be as large as the
        // largest of them all, and a debug build's worker stack overflowed once a new
        // command made it larger.
        macro_rules! by_name {
            ($($c:ty),* $(,)?) => {
                match name {
                    $(n if n == <$c as Command>::SPEC.name => Box::pin(self.run::<$c>(actor, input)).await,)*
                    _ => Err(ApiError::NotFound { resource: "command".into(), name: name.into() }),
                }
            };
        }
        app::for_each_command!(by_name)
    }

    async fn run<C: Command>(&self, actor: &Actor, input: Value) -> Result<Box<RawValue>, ApiError>
    where
        Self: Handler<C>,
    {
        let spec = C::SPEC;
        // Only mutations are audited, so only they keep a copy of what was asked.
        let audited = (spec.effect != Effect::ReadOnly).then(|| {
            let mut input = input.clone();
            C::redact(&mut input);
            input
        });
        let mut confirmed = None;
        let result = async {
            authorize(actor, spec.role, spec.name)?;
            let request = decode::<C>(input)?;
            request.validate()?;
            let (request, confirmation) = match self.gate(actor, request).await? {
                Gate::Answered(answer) => return Ok(answer),
                Gate::Run(request, confirmation) => (request, confirmation),
            };
            confirmed = confirmation;
            let output = self.handle(actor, request).await?;
            serde_json::value::to_raw_value(&output).map_err(ApiError::internal)
        }
        .await;
        if let Some(confirmation) = &confirmed {
            match &result {
                Ok(answer) => confirm::record(&self.store, confirmation, answer).await,
                Err(_) => confirm::release(&self.store, confirmation).await,
            }
        }
        // Refused attempts are audited too: they are what an audit is read for.
        if let Some(input) = audited {
            audit::record(&self.store, actor, spec.name, &input, &result).await;
        }
        result
    }

    /// `dry_run` answers with the plan; a destructive command runs only with a valid
    /// confirmation, and otherwise answers with the plan and a new confirmation; any
    /// other request runs as it came.
    async fn gate<C: Command>(&self, actor: &Actor, request: C) -> Result<Gate<C>, ApiError>
    where
        Self: Handler<C>,
    {
        let name = C::SPEC.name;
        let dry_run = request.dry_run();
        let confirmation = request.confirmation().cloned();
        let mut bare = request;
        bare.clear_gate();
        if dry_run {
            let plan = self.preview(actor, bare).await?;
            return Gate::answered(&DryRun { plan });
        }
        if !bare.needs_confirmation() {
            return Ok(Gate::Run(bare, None));
        }
        // A retry of a request that already started its operation gets that operation,
        // confirmed or not: the first call was confirmed, and a plan of a deletion that
        // has run would only say the thing is gone.
        if let Some(started) = self.started(&bare).await? {
            return Gate::answered(&started);
        }
        let hash = confirm::request_hash(name, &bare)?;
        let Some(confirmation) = confirmation else {
            let plan = self.preview(actor, bare).await?;
            let (confirmation, expires_at) =
                confirm::issue(&self.store, actor, name, &hash).await?;
            return Gate::answered(&ConfirmationRequired {
                message: format!(
                    "Nothing was done. Review the plan, then send the same request with this confirmation (valid until {expires_at}, once) to run it."
                ),
                plan,
                confirmation,
                expires_at,
            });
        };
        match confirm::redeem(&self.store, actor, name, &hash, &confirmation).await? {
            confirm::Redeemed::Fresh => Ok(Gate::Run(bare, Some(confirmation))),
            confirm::Redeemed::Replay(answer) => Ok(Gate::Answered(self.replayed(&answer).await?)),
        }
    }

    /// A confirmed call's first answer, sent again: an operation is shown as it is now,
    /// and as not created by this call.
    async fn replayed(&self, answer: &str) -> Result<Box<RawValue>, ApiError> {
        let mut value: Value = serde_json::from_str(answer).map_err(ApiError::internal)?;
        if let Some(id) = value.get("operation_id").and_then(Value::as_str)
            && let Some(op) = crate::operation::get(&self.store, id).await?
        {
            value["state"] = serde_json::to_value(op.state).map_err(ApiError::internal)?;
            value["created"] = Value::Bool(false);
        }
        serde_json::value::to_raw_value(&value).map_err(ApiError::internal)
    }

    /// What a pre-flight may read.
    pub fn preflight(&self) -> Preflight<'_> {
        Preflight {
            store: &self.store,
            aws: &self.aws,
            catalogue: &self.catalogue,
        }
    }
}

/// What the gate in front of a destructive or dry-run call decided.
enum Gate<C> {
    /// Answered without running: a plan, a confirmation, a replayed answer.
    Answered(Box<RawValue>),
    /// Run it (with the confirmation it redeemed).
    Run(C, Option<Confirmation>),
}

impl<C> Gate<C> {
    fn answered(answer: &impl serde::Serialize) -> Result<Self, ApiError> {
        serde_json::value::to_raw_value(answer)
            .map(Gate::Answered)
            .map_err(ApiError::internal)
    }
}

/// Decoding lives in the contract so the console's forms decode exactly alike.
pub use app::api::decode;

/// Every pipeline command: its pre-flight, then its plan stored, then the worker woken.
impl<P: Registered> Handler<P> for Service {
    async fn handle(&self, actor: &Actor, request: P) -> Result<P::Output, ApiError> {
        let submitted = submit(&self.store, actor, request, &self.preflight()).await?;
        self.wake.now();
        Ok(submitted.into())
    }

    async fn started(&self, request: &P) -> Result<Option<P::Output>, ApiError> {
        let found = crate::operation::submit::started_by_key(&self.store, request).await?;
        Ok(found.map(Into::into))
    }

    async fn preview(&self, actor: &Actor, request: P) -> Result<Plan, ApiError> {
        crate::operation::submit::check_key(&self.store, &request).await?;
        Box::pin(crate::operation::preview::preview(
            &self.preflight(),
            actor,
            request,
        ))
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use app::api::clusters::{GetCluster, ListClusters};
    use app::api::inspect::ListInstanceTypes;

    /// README's "Commands today" paragraph lists exactly the registry's commands.
    #[test]
    fn the_readme_lists_every_command_and_no_other() {
        let readme = include_str!("../../README.md");
        let start = readme
            .find("Commands today:")
            .expect("README has a \"Commands today:\" paragraph");
        let paragraph = &readme[start..];
        let paragraph = &paragraph[..paragraph.find("\n\n").unwrap_or(paragraph.len())];
        let mut listed: Vec<&str> = paragraph.split('`').skip(1).step_by(2).collect();
        listed.sort_unstable();
        let mut registry: Vec<&str> = app::api::COMMANDS.iter().map(|e| e.spec.name).collect();
        registry.sort_unstable();
        assert_eq!(
            listed, registry,
            "README's command list and the registry differ"
        );
    }

    #[test]
    fn decode_names_nested_and_unknown_fields() {
        let e = decode::<ListInstanceTypes>(serde_json::json!({"availability_zone": "mars"}))
            .unwrap_err();
        let ApiError::Validation { errors } = e else {
            panic!()
        };
        assert_eq!(errors[0].field, "availability_zone");
        assert!(
            errors[0].message.contains("us-east-1a"),
            "{}",
            errors[0].message
        );

        let e = decode::<ListInstanceTypes>(
            serde_json::json!({"instance_types": ["p5.48xlarge", "P5"]}),
        )
        .unwrap_err();
        let ApiError::Validation { errors } = e else {
            panic!()
        };
        assert_eq!(errors[0].field, "instance_types[1]");

        let e = decode::<ListInstanceTypes>(serde_json::json!({"zone": "x"})).unwrap_err();
        let ApiError::Validation { errors } = e else {
            panic!()
        };
        assert_eq!(errors[0].field, "zone");
        assert!(errors[0].message.starts_with("unknown field `zone`"));

        let e = decode::<GetCluster>(serde_json::json!({})).unwrap_err();
        let ApiError::Validation { errors } = e else {
            panic!()
        };
        assert_eq!(errors[0].field, "name");

        assert!(decode::<ListClusters>(Value::Null).is_ok());
    }
}
