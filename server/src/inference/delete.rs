//! `delete_endpoint`: the Service goes first (clients stop reaching the replicas), then
//! the autoscaler and the router (KEDA stops resizing what is being deleted), then the
//! Deployment (its pods stop) or the InferenceEndpointConfig (the operator removes
//! what it made of it), then the token's Secret if hypd made it, then the pods are
//! waited for until gone. Only objects carrying hypd's label are deleted: a Secret of
//! the user's that the endpoint read stays, and so does anything the operator made.

use std::time::Duration;

use app::api::ApiError;
use app::api::inference::{DeleteEndpoint, ENDPOINT_LABEL, NAMESPACE};
use app::api::values::IdempotencyKey;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Secret, Service as KubeService};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::ListParams;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::Record;
use super::deploy::token_secret;
use crate::cluster::managed::locate;
use crate::operation::pipeline::{Context, Pipeline, Preflight, Progress, stages};
use crate::resources::converge;
use crate::resources::is_planning;
use crate::resources::kube::inference::{InferenceEndpointConfig, JumpStartModel};
use crate::resources::kube::object::{Applied, made_by_hypd};
use crate::resources::kube::{self as kubernetes};

stages! {
    pub enum Stage {
        Service = "service", "The endpoint's Service deleted (its load balancer goes with it), and a pool's models' Services", false;
        Router = "router", "The endpoint's autoscaler (KEDA's ScaledObject) and SGLang router deleted, if it has them", false;
        Workload = "workload", "The Deployment, or the operator's InferenceEndpointConfig or JumpStartModel, deleted (its replicas stop)", false;
        Secret = "secret", "The Secret hypd kept the endpoint's token in deleted, if it has one", false;
        Pods = "pods", "Every replica gone", false;
    }
}

/// What the stages found, stored with the operation. Field names are stored: never rename.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Outputs {
    /// The pods the endpoint had when its Deployment was deleted.
    #[serde(default)]
    pub pods: Vec<String>,
}

const POLL: Duration = Duration::from_secs(2);

fn named(name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_owned()),
        namespace: Some(NAMESPACE.to_owned()),
        ..ObjectMeta::default()
    }
}

impl Pipeline for DeleteEndpoint {
    type Stage = Stage;
    type Outputs = Outputs;

    fn target(&self) -> String {
        super::target(&self.name, &self.endpoint)
    }

    fn idempotency_key(&self) -> Option<&IdempotencyKey> {
        self.idempotency_key.as_ref()
    }

    /// The endpoint exists and hypd made it.
    async fn preflight(self, cx: &Preflight<'_>) -> Result<Self, ApiError> {
        let cluster = self.name.as_str();
        let at = locate(cx.store, cluster, "to delete endpoints").await?;
        let client = kubernetes::connect(cx.aws, &at.region, &at.eks).await?;
        match super::find(&client, self.endpoint.as_str()).await? {
            Some(live) if made_by_hypd(live.record.meta()) => Ok(self),
            Some(_) => Err(ApiError::field(
                "endpoint",
                format!(
                    "{} was not made by hypd: delete it where it was made (kubectl delete deployment,service {} -n {NAMESPACE})",
                    self.endpoint, self.endpoint
                ),
            )),
            None => Err(ApiError::field(
                "endpoint",
                format!("{cluster} has no endpoint {}", self.endpoint),
            )),
        }
    }

    async fn step(
        &self,
        cx: &Context,
        stage: Stage,
        out: &mut Outputs,
    ) -> Result<Progress, ApiError> {
        let at = locate(&cx.store, self.name.as_str(), "to delete endpoints").await?;
        let client = kubernetes::connect(&cx.aws, &at.region, &at.eks).await?;
        let endpoint = self.endpoint.as_str();
        match stage {
            Stage::Service => {
                // Its own Service, and a pool's models' Services (labelled with it).
                let mut names = vec![endpoint.to_owned()];
                let api = Api::<KubeService>::namespaced(client.clone(), NAMESPACE);
                let selector = format!("{ENDPOINT_LABEL}={endpoint}");
                kubernetes::each_listed(&api, ListParams::default().labels(&selector), |s| {
                    names.extend(s.metadata.name.filter(|n| n != endpoint))
                })
                .await?;
                for name in names {
                    let service = KubeService {
                        metadata: named(&name),
                        ..KubeService::default()
                    };
                    converge(&Applied::namespaced(&client, service).absent()).await?;
                }
                Ok(Progress::Done)
            }
            Stage::Router => {
                super::router::remove(&client, endpoint).await?;
                Ok(Progress::Done)
            }
            Stage::Workload => {
                let Some(live) = super::find(&client, endpoint).await? else {
                    return Ok(Progress::Done);
                };
                if out.pods.is_empty() {
                    out.pods = live
                        .pods
                        .iter()
                        .filter_map(|p| p.metadata.name.clone())
                        .collect();
                }
                match live.record {
                    Record::Server(_) => {
                        let deployment = Deployment {
                            metadata: named(endpoint),
                            ..Deployment::default()
                        };
                        converge(&Applied::namespaced(&client, deployment).absent()).await?;
                    }
                    Record::Managed(_) => {
                        let config = InferenceEndpointConfig::new(named(endpoint), Value::Null);
                        converge(&Applied::namespaced(&client, config).absent()).await?;
                    }
                    Record::JumpStart(_) => {
                        let model = JumpStartModel::new(named(endpoint), Value::Null);
                        converge(&Applied::namespaced(&client, model).absent()).await?;
                    }
                }
                Ok(Progress::Done)
            }
            Stage::Secret => {
                let secret = Secret {
                    metadata: named(&token_secret(endpoint)),
                    ..Secret::default()
                };
                converge(&Applied::namespaced(&client, secret).absent()).await?;
                Ok(Progress::Done)
            }
            Stage::Pods => {
                // The pods go with their ReplicaSet: nothing of hypd's to delete here.
                if is_planning() {
                    return Ok(Progress::Done);
                }
                // By name: the operator's pods carry no label of hypd's.
                let pods = Api::<Pod>::namespaced(client.clone(), NAMESPACE);
                let mut left = Vec::new();
                for pod in &out.pods {
                    if kubernetes::get(&pods, pod).await?.is_some() {
                        left.push(pod.clone());
                    }
                }
                Ok(Progress::unless_pending(POLL, &left, |pods| {
                    format!("waiting for the endpoint's pods to go: {pods}")
                }))
            }
        }
    }
}
