//! The service layer: the one entry point (`dispatch`) that REST, MCP and the console all
//! call. It authorises the actor, decodes the request into the command's type (which
//! rejects bad values, with the field's path), runs the cross-field checks, calls the
//! command's handler and writes mutations to the audit log. Dispatch only: each handler
//! lives in the module of its domain noun (`cluster`, `operation`, `inspect`, `tokens`),
//! and every pipeline is submitted by the one generic handler below.

use std::future::Future;
use std::sync::Arc;

use app::api::operations::OperationRef;
use app::api::{ApiError, Command, Effect};
use serde_json::Value;
use serde_json::value::RawValue;

use crate::audit;
use crate::auth::{Actor, Auth, authorize};
use crate::aws::Aws;
use crate::inspect::Inspector;
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
}

impl Service {
    pub fn new(store: Store, aws: Arc<Aws>, sandbox: bool) -> Self {
        Self {
            auth: Auth::new(store.clone()),
            store,
            aws,
            sandbox,
            wake: Wake::default(),
            catalogue: Inspector::default(),
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
        macro_rules! by_name {
            ($($c:ty),* $(,)?) => {
                match name {
                    $(n if n == <$c as Command>::SPEC.name => self.run::<$c>(actor, input).await,)*
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
        let audited = (spec.effect != Effect::ReadOnly).then(|| input.clone());
        let result = async {
            authorize(actor, spec.role, spec.name)?;
            let request = decode::<C>(input)?;
            request.validate()?;
            self.handle(actor, request).await
        }
        .await;
        // Refused attempts are audited too: they are what an audit is read for.
        if let Some(input) = audited {
            audit::record(&self.store, actor, spec.name, &input, &result).await;
        }
        let output = result?;
        serde_json::value::to_raw_value(&output).map_err(ApiError::internal)
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

/// Decoding lives in the contract so the console's forms decode exactly alike.
pub use app::api::decode;

/// Every pipeline command: its pre-flight, then its plan stored, then the worker woken.
impl<P: Registered> Handler<P> for Service {
    async fn handle(&self, actor: &Actor, request: P) -> Result<OperationRef, ApiError> {
        let submitted = submit(&self.store, actor, request, &self.preflight()).await?;
        self.wake.now();
        Ok(submitted)
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
