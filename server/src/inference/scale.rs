//! `scale_endpoint`: the replicas of the Deployment (or of the InferenceEndpointConfig,
//! which the operator passes on) set through its `scale` subresource (only that field
//! changes: the pod template, and so every running replica, stays), then followed until
//! that many replicas are ready; 0 scales the endpoint to zero.

use app::api::ApiError;
use app::api::inference::{NAMESPACE, ScaleEndpoint, ServiceShape};
use app::api::plan::{Action, Change, FieldChange};
use app::api::values::IdempotencyKey;
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::deploy::{self, Outputs as Followed};
use crate::cluster::managed::locate;
use crate::operation::pipeline::{Context, Pipeline, Preflight, Progress, stages};
use crate::resources::kube::{self as kubernetes};
use crate::resources::planned;

stages! {
    pub enum Stage {
        Replicas = "replicas", "The replicas set (the Deployment's, or the InferenceEndpointConfig's)", true;
        Ready = "ready", "That many replicas ready (none left, when scaled to zero)", true;
    }
}

/// What the stages found, stored with the operation. Field names are stored: never rename.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Outputs {
    /// Replicas before the change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub before: Option<u32>,
    #[serde(default)]
    pub ready: u32,
    #[serde(default)]
    pub replicas: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cold_start_seconds: Option<f64>,
}

impl Pipeline for ScaleEndpoint {
    type Stage = Stage;
    type Outputs = Outputs;

    fn target(&self) -> String {
        super::target(&self.name, &self.endpoint)
    }

    fn idempotency_key(&self) -> Option<&IdempotencyKey> {
        self.idempotency_key.as_ref()
    }

    /// The endpoint exists (hypd's).
    async fn preflight(self, cx: &Preflight<'_>) -> Result<Self, ApiError> {
        let cluster = self.name.as_str();
        let at = locate(cx.store, cluster, "to scale endpoints").await?;
        let client = kubernetes::connect(cx.aws, &at.region, &at.eks).await?;
        let Some(live) = super::find(&client, self.endpoint.as_str()).await? else {
            return Err(ApiError::field(
                "endpoint",
                format!("{cluster} has no endpoint {}", self.endpoint),
            ));
        };
        // KEDA would undo a count set by hand at its next look.
        if let Some(scaler) = &live.scaler {
            let bounds = super::router::state(scaler);
            return Err(ApiError::field(
                "replicas",
                format!(
                    "KEDA sizes {} between {} and {} replicas on its router's requests in flight, and would undo a count set here: deploy it again without autoscaling to size it by hand",
                    self.endpoint, bounds.min_replicas, bounds.max_replicas
                ),
            ));
        }
        Ok(self)
    }

    async fn step(
        &self,
        cx: &Context,
        stage: Stage,
        out: &mut Outputs,
    ) -> Result<Progress, ApiError> {
        let cluster = self.name.as_str();
        let at = locate(&cx.store, cluster, "to scale endpoints").await?;
        let client = kubernetes::connect(&cx.aws, &at.region, &at.eks).await?;
        let endpoint = self.endpoint.as_str();
        let live = super::required(&client, cluster, endpoint).await?;
        let wanted = self.replicas.get();
        match stage {
            Stage::Replicas => {
                let now = live.replicas();
                out.before.get_or_insert(now);
                if now == wanted {
                    return Ok(Progress::Done);
                }
                let kind = live.record.kind();
                let change = || {
                    let mut c = Change::new(Action::Update, kind, endpoint);
                    c.namespace = Some(NAMESPACE.to_owned());
                    c.fields = vec![FieldChange {
                        field: "spec.replicas".into(),
                        old: Some(json!(now)),
                        new: Some(json!(wanted)),
                    }];
                    c
                };
                if planned(change) {
                    return Ok(Progress::Done);
                }
                let patch = json!({ "spec": { "replicas": wanted } });
                live.record.patch(&client, &patch, true).await?;
                Ok(Progress::Done)
            }
            Stage::Ready => {
                let shape = match live.summary(cluster).service.as_str() {
                    "load_balancer" => ServiceShape::LoadBalancer,
                    _ => ServiceShape::ClusterIp,
                };
                let mut followed = Followed::default();
                let at = (cluster, endpoint);
                let kind = live.record.kind();
                let progress = deploy::ready(&client, at, kind, wanted, shape, &mut followed).await;
                out.ready = followed.ready;
                out.replicas = followed.replicas;
                out.cold_start_seconds = followed.cold_start_seconds;
                progress
            }
        }
    }
}
