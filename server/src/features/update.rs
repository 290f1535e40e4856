//! `update_features`: the pre-flight reads each named feature as it is and drops those
//! already as asked, so the operation stores (and runs) only real changes, and has no
//! stage at all when there are none. Then: the shared add-ons the features turned on
//! need, each feature's own parts, and last the shared add-ons nothing needs any more.
//! KEDA and the inference operator share one rule: its add-on brings its own KEDA, so
//! hypd's KEDA and the add-on's are never on the same cluster.

use std::collections::BTreeSet;

use app::api::ApiError;
use app::api::features::{Feature, UpdateFeatures};
use app::api::values::IdempotencyKey;
use serde::{Deserialize, Serialize};

use super::autoscaling::Autoscaling;
use super::inference::Inference;
use super::release::{Installed, Installer, KEDA_OPERATOR, KUBERAY_OPERATOR};
use super::tiered::Tiered;
use super::training::TrainingOperator;
use super::{POLL, addon, component_identity, components};
use crate::cluster::dependencies::INFERENCE_OPERATOR;
use crate::cluster::managed::{Where, locate};
use crate::operation::pipeline::{Context, Pipeline, Preflight, Progress, stages};
use crate::resources::{Want, converge, missing};

stages! {
    pub enum Stage {
        Components = "components", "The shared add-ons the features turned on need, ACTIVE", true;
        TrainingOperator = "training_operator", "Training operator: pod identity role, binding and add-on (ACTIVE, controller available), or all three removed", false;
        InferenceOperator = "inference_operator", "Inference operator: TLS bucket, its four OIDC roles and the configured add-on (ACTIVE, controller available), or all removed", false;
        TieredCheckpointing = "tiered_checkpointing", "Tiered checkpointing: OIDC role, service account and HyperPod's TieredStorageConfig (InService again), or all three removed", false;
        Autoscaling = "autoscaling", "Managed Karpenter: cluster role, HyperPod's AutoScaling (InService), HyperpodNodeClass (Ready) and NodePool, or all four removed", false;
        KuberayOperator = "kuberay_operator", "KubeRay operator: the pinned upstream release applied (CRDs established, operator available), or removed", false;
        Keda = "keda", "KEDA: the pinned upstream release applied (CRDs established, its three Deployments available), or removed", false;
        Unneeded = "unneeded", "Shared add-ons no feature on needs any more removed (never those the cluster was made with)", false;
    }
}

/// What the stages found, stored with the operation: nothing yet, each stage reads the
/// world afresh. Field names are stored: never rename.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Outputs {}

/// The features on now, as get_features reads them.
async fn on_now(cx: &Context, at: &Where) -> Result<BTreeSet<Feature>, ApiError> {
    let (features, _) = super::read(&cx.aws, &cx.store, at).await?;
    Ok(features
        .into_iter()
        .filter(|f| f.enabled)
        .map(|f| f.feature)
        .collect())
}

impl Pipeline for UpdateFeatures {
    type Stage = Stage;
    type Outputs = Outputs;

    fn target(&self) -> String {
        crate::cluster::target(self.name.as_str())
    }

    fn idempotency_key(&self) -> Option<&IdempotencyKey> {
        self.idempotency_key.as_ref()
    }

    /// A shared-add-on stage only where a feature changed needs one: `unneeded` when
    /// one turned off needs an add-on the cluster was not made with (it may go).
    fn plan(&self) -> Vec<Stage> {
        let none = BTreeSet::new();
        let mut stages = Vec::new();
        if !components(&none, &self.turning(true), &[]).0.is_empty() {
            stages.push(Stage::Components);
        }
        if self.training_operator.is_some() {
            stages.push(Stage::TrainingOperator);
        }
        if self.inference_operator.is_some() {
            stages.push(Stage::InferenceOperator);
        }
        if self.tiered_checkpointing.is_some() {
            stages.push(Stage::TieredCheckpointing);
        }
        if self.autoscaling.is_some() {
            stages.push(Stage::Autoscaling);
        }
        if self.kuberay_operator.is_some() {
            stages.push(Stage::KuberayOperator);
        }
        if self.keda.is_some() {
            stages.push(Stage::Keda);
        }
        if !components(&none, &[], &self.turning(false)).1.is_empty() {
            stages.push(Stage::Unneeded);
        }
        stages
    }

    /// The cluster is active with a HyperPod cluster; every feature already as asked is
    /// dropped from the request, and turning off one hypd did not install is refused.
    /// The groups autoscaling is turned on for are settled here and stored with the
    /// request, so a resumed or retried run scales the ones the plan showed.
    async fn preflight(mut self, cx: &Preflight<'_>) -> Result<Self, ApiError> {
        let at = locate(cx.store, self.name.as_str(), super::NEEDS).await?;
        for (feature, on) in self.named() {
            match feature {
                Feature::TrainingOperator => {
                    let t = TrainingOperator::new(cx.aws, &at).await?;
                    if !on && let Some(why) = t.not_ours().await? {
                        return Err(ApiError::field(feature.as_str(), why));
                    }
                    if !on && let Some(why) = t.jobs_left().await? {
                        return Err(ApiError::field(feature.as_str(), why));
                    }
                    if t.holds(on).await? {
                        self.drop(feature);
                    }
                }
                Feature::TieredCheckpointing => {
                    let t = Tiered::new(cx.aws, &at, cx.store).await?;
                    if t.holds(on, self.tiered_memory_percent).await? {
                        self.drop(feature);
                    }
                }
                Feature::Autoscaling => {
                    let a = Autoscaling::new(cx.aws, &at).await?;
                    if on {
                        self.autoscaling_groups =
                            Some(a.groups(self.autoscaling_groups.as_deref()).await?);
                    }
                    if a.holds(on, self.autoscaling_groups.as_deref()).await? {
                        self.drop(feature);
                    }
                }
                Feature::InferenceOperator => {
                    if !on
                        && let Some(why) = super::not_ours(cx.aws, &at, &INFERENCE_OPERATOR).await?
                    {
                        return Err(ApiError::field(feature.as_str(), why));
                    }
                    if Inference::new(cx.aws, &at).await?.holds(on).await? {
                        self.drop(feature);
                    } else if on
                        && let Some(other) = Installed::new(cx.aws, &at, &KEDA_OPERATOR)
                            .await?
                            .installer()
                            .await?
                            .filter(|i| !matches!(i, Installer::Addon(_)))
                    {
                        // Its add-on installs KEDA itself: a second KEDA beside one
                        // already there would fight it for the same API.
                        return Err(ApiError::field(
                            feature.as_str(),
                            format!(
                                "its add-on installs KEDA itself, and KEDA on {} was {}; turn keda off first, in a request of its own",
                                at.eks,
                                other.said()
                            ),
                        ));
                    }
                }
                Feature::KuberayOperator => {
                    let r = Installed::new(cx.aws, &at, &KUBERAY_OPERATOR).await?;
                    if !on && let Some(why) = r.refusal_to_remove().await? {
                        return Err(ApiError::field(feature.as_str(), why));
                    }
                    if r.holds(on).await? {
                        self.drop(feature);
                    }
                }
                Feature::Keda => {
                    let k = Installed::new(cx.aws, &at, &KEDA_OPERATOR).await?;
                    let installer = k.installer().await?;
                    let with_inference = matches!(installer, Some(Installer::Addon(_)));
                    match (on, self.inference_operator) {
                        // The inference operator's add-on, turned on in this request,
                        // brings KEDA.
                        (true, Some(true)) => self.drop(feature),
                        (true, Some(false)) if with_inference => {
                            return Err(ApiError::field(
                                feature.as_str(),
                                format!(
                                    "KEDA on {} came with the inference operator's add-on, which this request removes; turn keda on once it is gone",
                                    at.eks
                                ),
                            ));
                        }
                        // KEDA goes with the inference operator's add-on.
                        (false, Some(false)) if with_inference => self.drop(feature),
                        (false, _) if with_inference => {
                            return Err(ApiError::field(
                                feature.as_str(),
                                format!(
                                    "KEDA on {} came with the inference operator's add-on; it goes when inference_operator is turned off",
                                    at.eks
                                ),
                            ));
                        }
                        _ => {
                            if !on && let Some(why) = k.refusal_to_remove().await? {
                                return Err(ApiError::field(feature.as_str(), why));
                            }
                            if k.holds(on).await? {
                                self.drop(feature);
                            }
                        }
                    }
                }
            }
        }
        Ok(self)
    }

    async fn step(
        &self,
        cx: &Context,
        stage: Stage,
        _: &mut Outputs,
    ) -> Result<Progress, ApiError> {
        let at = locate(&cx.store, self.name.as_str(), super::NEEDS).await?;
        match stage {
            Stage::Components => {
                let (ensure, _) = components(&BTreeSet::new(), &self.turning(true), &[]);
                let mut pending = Vec::new();
                for a in ensure {
                    pending.extend(super::ensure_component(&cx.aws, &at, a).await?);
                }
                Ok(Progress::unless_pending(POLL, &pending, |p| {
                    format!("waiting for add-ons: {p}")
                }))
            }
            Stage::TrainingOperator => {
                let on = self
                    .training_operator
                    .ok_or_else(|| missing("the training operator's wanted state"))?;
                TrainingOperator::new(&cx.aws, &at).await?.step(on).await
            }
            Stage::InferenceOperator => {
                let on = self
                    .inference_operator
                    .ok_or_else(|| missing("the inference operator's wanted state"))?;
                Inference::new(&cx.aws, &at).await?.step(on).await
            }
            Stage::TieredCheckpointing => {
                let on = self
                    .tiered_checkpointing
                    .ok_or_else(|| missing("tiered checkpointing's wanted state"))?;
                Tiered::new(&cx.aws, &at, &cx.store)
                    .await?
                    .step(on, self.tiered_memory_percent)
                    .await
            }
            Stage::Autoscaling => {
                let on = self
                    .autoscaling
                    .ok_or_else(|| missing("autoscaling's wanted state"))?;
                Autoscaling::new(&cx.aws, &at)
                    .await?
                    .step(on, self.autoscaling_groups.as_deref())
                    .await
            }
            Stage::KuberayOperator => {
                let on = self
                    .kuberay_operator
                    .ok_or_else(|| missing("the KubeRay operator's wanted state"))?;
                Installed::new(&cx.aws, &at, &KUBERAY_OPERATOR)
                    .await?
                    .step(on)
                    .await
            }
            Stage::Keda => {
                let on = self.keda.ok_or_else(|| missing("KEDA's wanted state"))?;
                Installed::new(&cx.aws, &at, &KEDA_OPERATOR)
                    .await?
                    .step(on)
                    .await
            }
            Stage::Unneeded => {
                // What this request leaves on: read, then the request's own changes laid
                // over it, so a plan (run before anything is turned off) frees what the
                // run will.
                let mut on_after = on_now(cx, &at).await?;
                on_after.extend(self.turning(true));
                for f in self.turning(false) {
                    on_after.remove(&f);
                }
                let (_, remove) = components(&on_after, &[], &self.turning(false));
                // The FSx driver stays while a storage of the cluster mounts through it.
                let fsx_mounted = crate::storage::fsx::mounted(&cx.aws, &at).await?;
                let mut deleting = Vec::new();
                for a in remove
                    .into_iter()
                    .filter(|a| !(fsx_mounted && a.name == crate::storage::fsx::DRIVER_ADDON))
                {
                    let after = converge(&addon(&cx.aws, &at, a, Want::Absent)).await?;
                    if after.as_ref().is_some_and(|s| s.ours) {
                        deleting.push(a.name);
                    } else if after.is_none()
                        && let Some((role, binding)) =
                            component_identity(&cx.aws, &at, a, false).await?
                    {
                        converge(&binding).await?;
                        converge(&role).await?;
                    }
                }
                Ok(Progress::unless_pending(POLL, &deleting, |d| {
                    format!("deleting add-ons: {d}")
                }))
            }
        }
    }
}

/// `have` is an older add-on version than `pin` (`v1.17.2-eksbuild.1` < `v1.18.2-eksbuild.2`):
/// compared number by number, the EKS build last.
pub(super) fn older(have: &str, pin: &str) -> bool {
    let numbers = |v: &str| -> Vec<u64> {
        v.trim_start_matches('v')
            .split(['.', '-'])
            .filter_map(|p| p.trim_start_matches("eksbuild").parse().ok())
            .collect()
    };
    numbers(have) < numbers(pin)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shared_addon_is_raised_to_the_pin_never_lowered() {
        assert!(older("v1.17.2-eksbuild.1", "v1.18.2-eksbuild.2"));
        assert!(older("v1.18.2-eksbuild.1", "v1.18.2-eksbuild.2"));
        assert!(!older("v1.18.2-eksbuild.2", "v1.18.2-eksbuild.2"));
        assert!(!older("v1.19.0-eksbuild.1", "v1.18.2-eksbuild.2"));
        assert!(!older("v1.18.10-eksbuild.1", "v1.18.2-eksbuild.2"));
    }

    fn request(v: serde_json::Value) -> UpdateFeatures {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn only_what_changes_is_staged() {
        use crate::operation::pipeline::Stage as _;
        let names = |r: &UpdateFeatures| r.plan().iter().map(|s| s.name()).collect::<Vec<_>>();
        let mut on = request(serde_json::json!({"name": "ml-1", "training_operator": true}));
        assert_eq!(names(&on), ["components", "training_operator"]);
        // Turned off, it frees nothing the cluster was not made with.
        let off = request(serde_json::json!({"name": "ml-1", "training_operator": false}));
        assert_eq!(names(&off), ["training_operator"]);
        let tiered = request(serde_json::json!({"name": "ml-1", "tiered_checkpointing": true}));
        assert_eq!(names(&tiered), ["tiered_checkpointing"]);
        on.drop(Feature::TrainingOperator);
        assert!(names(&on).is_empty());
        let both = request(
            serde_json::json!({"name": "ml-1", "training_operator": false,
                                              "tiered_checkpointing": true}),
        );
        assert_eq!(names(&both), ["training_operator", "tiered_checkpointing"]);
        // The upstream releases need no shared add-on, on or off.
        let releases =
            request(serde_json::json!({"name": "ml-1", "kuberay_operator": true, "keda": false}));
        assert_eq!(names(&releases), ["kuberay_operator", "keda"]);
    }
}
