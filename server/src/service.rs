//! The service layer: the one entry point (`dispatch`) that REST, MCP and the console all
//! call. It authorises the actor, decodes the request into the command's type (which
//! rejects bad values, with the field's path), runs the cross-field checks, calls the
//! command's handler and writes mutations to the audit log. Faces only translate.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use app::api::clusters::{
    ClusterDescription, ClusterList, ClusterSummary, CreateCluster, DeleteCluster, DescribeCluster,
    GetCluster, ImportCluster, ListClusters,
};
use app::api::inspect::{
    AvailabilityZoneList, InstanceTypeList, ListAvailabilityZones, ListInstanceTypes, ListRegions,
    RegionList, Whoami, WhoamiOutput,
};
use app::api::operations::{
    CancelOperation, GetOperation, ListOperations, Operation, OperationList, OperationRef,
    RetryOperation, WaitOperation, WaitResult,
};
use app::api::tokens::{CreateToken, CreatedToken, ListTokens, RevokeToken, TokenInfo, TokenList};
use app::api::values::Region;
use app::api::{ApiError, Command, Effect};
use serde_json::Value;

use crate::auth::{Actor, Auth, authorize};
use crate::aws::Aws;
use crate::inspect::Inspector;
use crate::operation::control;
use crate::operation::submit::submit;
use crate::operation::worker::Wake;
use crate::store::Store;
use crate::{audit, cluster, operation};

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
    inspector: Inspector,
}

impl Service {
    pub fn new(store: Store, aws: Arc<Aws>, sandbox: bool) -> Self {
        Self {
            auth: Auth::new(store.clone()),
            store,
            aws,
            sandbox,
            wake: Wake::default(),
            inspector: Inspector::default(),
        }
    }

    /// Runs the command named `name` with JSON `input` for `actor`.
    pub async fn dispatch(
        &self,
        actor: &Actor,
        name: &str,
        input: Value,
    ) -> Result<Value, ApiError> {
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

    async fn run<C: Command>(&self, actor: &Actor, input: Value) -> Result<Value, ApiError>
    where
        Self: Handler<C>,
    {
        let spec = C::SPEC;
        let result = async {
            authorize(actor, spec.role, spec.name)?;
            let request = decode::<C>(input.clone())?;
            request.validate()?;
            self.handle(actor, request).await
        }
        .await;
        // Refused attempts are audited too: they are what an audit is read for.
        if spec.effect != Effect::ReadOnly {
            audit::record(&self.store, actor, spec.name, &input, &result).await;
        }
        let output = result?;
        serde_json::to_value(output).map_err(ApiError::internal)
    }
}

/// Decoding lives in the contract so the console's forms decode exactly alike.
pub use app::api::decode;

impl Service {
    /// The region a request names, or hypd's own; a named one must be enabled in the
    /// account, so a typo is a field error rather than a failed AWS call.
    async fn region(&self, requested: Option<&Region>) -> Result<String, ApiError> {
        let Some(region) = requested else {
            return self.aws.region().ok_or_else(|| {
                ApiError::field(
                    "region",
                    "no region given and hypd has none configured (set AWS_REGION)",
                )
            });
        };
        let (regions, _) = self.inspector.regions(&self.aws, false).await?;
        if regions.iter().any(|r| r.name == region.as_str()) {
            Ok(region.to_string())
        } else {
            Err(ApiError::field(
                "region",
                format!(
                    "{region} is not a region enabled for this account; choose one of: {}",
                    regions
                        .iter()
                        .map(|r| r.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ))
        }
    }
}

impl Handler<Whoami> for Service {
    async fn handle(&self, actor: &Actor, _: Whoami) -> Result<WhoamiOutput, ApiError> {
        let id = self.aws.identity().await?;
        Ok(WhoamiOutput {
            account: id.account,
            arn: id.arn,
            region: self.aws.region(),
            sandbox: self.sandbox,
            role: actor.role,
            token_name: actor.name.clone(),
        })
    }
}

impl Handler<ListRegions> for Service {
    async fn handle(&self, _: &Actor, r: ListRegions) -> Result<RegionList, ApiError> {
        let (regions, freshness) = self.inspector.regions(&self.aws, r.refresh).await?;
        Ok(RegionList { regions, freshness })
    }
}

impl Handler<ListAvailabilityZones> for Service {
    async fn handle(
        &self,
        _: &Actor,
        r: ListAvailabilityZones,
    ) -> Result<AvailabilityZoneList, ApiError> {
        let region = self.region(r.region.as_ref()).await?;
        let (zones, freshness) = self.inspector.zones(&self.aws, &region, r.refresh).await?;
        Ok(AvailabilityZoneList {
            region,
            zones,
            freshness,
        })
    }
}

impl Handler<ListInstanceTypes> for Service {
    async fn handle(&self, _: &Actor, r: ListInstanceTypes) -> Result<InstanceTypeList, ApiError> {
        let region = self.region(r.region.as_ref()).await?;
        if let Some(az) = &r.availability_zone {
            // The zone must be in the region, and exist there.
            let (zones, _) = self.inspector.zones(&self.aws, &region, false).await?;
            if !zones.iter().any(|z| z.name == az.as_str()) {
                return Err(ApiError::field(
                    "availability_zone",
                    format!(
                        "{az} is not an Availability Zone of {region}; choose one of: {}",
                        zones
                            .iter()
                            .map(|z| z.name.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                ));
            }
        }
        let (all, freshness) = self
            .inspector
            .instance_types(&self.aws, &region, r.refresh)
            .await?;
        let instance_types = all
            .into_iter()
            .filter(|t| !r.accelerated_only || t.accelerator.is_some())
            .filter(|t| {
                r.instance_types.is_empty()
                    || r.instance_types
                        .iter()
                        .any(|w| w.as_str() == t.instance_type)
            })
            .filter(|t| {
                r.availability_zone
                    .as_ref()
                    .is_none_or(|az| t.offered_in.iter().any(|z| z == az.as_str()))
            })
            .collect();
        Ok(InstanceTypeList {
            region,
            instance_types,
            freshness,
        })
    }
}

impl Handler<ListClusters> for Service {
    async fn handle(&self, _: &Actor, _: ListClusters) -> Result<ClusterList, ApiError> {
        Ok(ClusterList {
            clusters: cluster::list(&self.store).await?,
        })
    }
}

impl Handler<GetCluster> for Service {
    async fn handle(&self, _: &Actor, r: GetCluster) -> Result<ClusterSummary, ApiError> {
        cluster::get(&self.store, r.name.as_str())
            .await?
            .ok_or_else(|| ApiError::NotFound {
                resource: "cluster".into(),
                name: r.name.to_string(),
            })
    }
}

impl Handler<DescribeCluster> for Service {
    async fn handle(&self, _: &Actor, r: DescribeCluster) -> Result<ClusterDescription, ApiError> {
        let stored = cluster::get(&self.store, r.name.as_str())
            .await?
            .ok_or_else(|| ApiError::NotFound {
                resource: "cluster".into(),
                name: r.name.to_string(),
            })?;
        let mut described = cluster::describe::describe(&self.aws, stored).await?;
        // What the list shows until the next look.
        let observed =
            cluster::observe_nodes(&self.store, r.name.as_str(), &described.node_counts).await?;
        described.cluster.nodes = Some(observed);
        Ok(described)
    }
}

impl Handler<ListOperations> for Service {
    async fn handle(&self, _: &Actor, r: ListOperations) -> Result<OperationList, ApiError> {
        Ok(OperationList {
            operations: operation::list(&self.store, r.state, r.target.as_deref()).await?,
        })
    }
}

async fn find_operation(store: &Store, id: &str) -> Result<Operation, ApiError> {
    operation::get(store, id)
        .await?
        .ok_or_else(|| ApiError::NotFound {
            resource: "operation".into(),
            name: id.into(),
        })
}

impl Handler<GetOperation> for Service {
    async fn handle(&self, _: &Actor, r: GetOperation) -> Result<Operation, ApiError> {
        find_operation(&self.store, &r.operation_id).await
    }
}

/// How often a waiting call re-reads the store. The store is the truth shared by every
/// replica, so a change made by another replica is seen within this period.
const WAIT_POLL: Duration = Duration::from_millis(250);

impl Handler<WaitOperation> for Service {
    async fn handle(&self, _: &Actor, r: WaitOperation) -> Result<WaitResult, ApiError> {
        let limit = Duration::from_secs(r.timeout_seconds.map_or(60, |t| u64::from(t.get())));
        let start = Instant::now();
        loop {
            let op = find_operation(&self.store, &r.operation_id).await?;
            let elapsed = start.elapsed();
            if op.state.is_terminal() || elapsed >= limit {
                return Ok(WaitResult {
                    timed_out: !op.state.is_terminal(),
                    operation: op,
                    waited_seconds: elapsed.as_secs_f64(),
                });
            }
            tokio::time::sleep(WAIT_POLL.min(limit - elapsed)).await;
        }
    }
}

impl Handler<RetryOperation> for Service {
    async fn handle(&self, actor: &Actor, r: RetryOperation) -> Result<OperationRef, ApiError> {
        control::retry(&self.store, &self.wake, actor, &r.operation_id).await
    }
}

impl Handler<CancelOperation> for Service {
    async fn handle(&self, actor: &Actor, r: CancelOperation) -> Result<Operation, ApiError> {
        control::cancel(&self.store, &self.wake, actor, &r.operation_id).await
    }
}

impl Service {
    /// Pre-flight: `zone` is an AZ of `region` and offers the HyperPod type's instances.
    async fn check_zone_and_type(
        &self,
        region: &str,
        zone: &str,
        ml_type: &str,
    ) -> Result<(), ApiError> {
        let (zones, _) = self.inspector.zones(&self.aws, region, false).await?;
        if !zones.iter().any(|z| z.name == zone) {
            return Err(ApiError::field(
                "availability_zone",
                format!(
                    "{zone} is not an Availability Zone of {region}; choose one of: {}",
                    zones
                        .iter()
                        .map(|z| z.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ));
        }
        let (types, _) = self
            .inspector
            .instance_types(&self.aws, region, false)
            .await?;
        match types.iter().find(|t| t.hyperpod_instance_type == ml_type) {
            None => Err(ApiError::field(
                "instance_type",
                format!("{ml_type} is not an instance type EC2 offers in {region}"),
            )),
            Some(t) if !t.offered_in.iter().any(|z| z == zone) => Err(ApiError::field(
                "instance_type",
                format!(
                    "{ml_type} is not offered in {zone}; it is offered in: {}",
                    if t.offered_in.is_empty() {
                        "no zone of this region".to_owned()
                    } else {
                        t.offered_in.join(", ")
                    }
                ),
            )),
            Some(_) => Ok(()),
        }
    }
}

impl Handler<CreateCluster> for Service {
    async fn handle(&self, actor: &Actor, r: CreateCluster) -> Result<OperationRef, ApiError> {
        let submitted = submit(&self.store, actor, r, |r| async move {
            let region = self.region(r.region.as_ref()).await?;
            self.check_zone_and_type(
                &region,
                r.availability_zone.as_str(),
                r.instance_type.as_str(),
            )
            .await?;
            cluster::create::preflight(self, r, region).await
        })
        .await?;
        self.wake.now();
        Ok(submitted)
    }
}

impl Handler<DeleteCluster> for Service {
    async fn handle(&self, actor: &Actor, r: DeleteCluster) -> Result<OperationRef, ApiError> {
        let submitted = submit(&self.store, actor, r, |r| async move {
            if cluster::get(&self.store, r.name.as_str()).await?.is_none() {
                return Err(ApiError::NotFound {
                    resource: "cluster".into(),
                    name: r.name.to_string(),
                });
            }
            Ok(r)
        })
        .await?;
        self.wake.now();
        Ok(submitted)
    }
}

impl Handler<ImportCluster> for Service {
    async fn handle(&self, actor: &Actor, r: ImportCluster) -> Result<OperationRef, ApiError> {
        let submitted = submit(&self.store, actor, r, |mut r| async move {
            let region = self.region(r.region.as_ref()).await?;
            if cluster::get(&self.store, r.name.as_str()).await?.is_some() {
                return Err(ApiError::field(
                    "name",
                    format!("{} is already managed by hypd", r.name),
                ));
            }
            cluster::import::describe_eks(&self.aws, &region, r.name.as_str()).await?;
            if let Some(hp) = &r.hyperpod_cluster {
                cluster::import::describe_hyperpod(&self.aws, &region, hp.as_str()).await?;
            }
            r.region = Some(
                region
                    .parse()
                    .map_err(|e: String| ApiError::field("region", e))?,
            );
            Ok(r)
        })
        .await?;
        self.wake.now();
        Ok(submitted)
    }
}

impl Handler<CreateToken> for Service {
    async fn handle(&self, _: &Actor, r: CreateToken) -> Result<CreatedToken, ApiError> {
        let (info, token) = self.auth.create_token(r.name.as_str(), r.role).await?;
        Ok(CreatedToken { info, token })
    }
}

impl Handler<ListTokens> for Service {
    async fn handle(&self, _: &Actor, _: ListTokens) -> Result<TokenList, ApiError> {
        Ok(TokenList {
            tokens: self.auth.list_tokens().await?,
        })
    }
}

impl Handler<RevokeToken> for Service {
    async fn handle(&self, actor: &Actor, r: RevokeToken) -> Result<TokenInfo, ApiError> {
        if r.name.as_str() == actor.name {
            return Err(ApiError::field(
                "name",
                "a token cannot revoke itself: use another admin token",
            ));
        }
        self.auth.revoke_token(r.name.as_str()).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use app::api::inspect::ListInstanceTypes;

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
