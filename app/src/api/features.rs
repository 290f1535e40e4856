//! A cluster's advanced features (the HyperPod training and inference operators, tiered
//! checkpointing, managed Karpenter autoscaling, the KubeRay operator, KEDA):
//! `get_features` reads each from the world, `update_features` changes only the features
//! its request names. That request has one optional field per feature and
//! no whole-state shape, so a form that still holds a stale value of a feature the user
//! did not touch cannot send it: what is absent is untouched, by type.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::command::{Command, CommandSpec, Effect, HttpMethod, Role};
use super::error::ApiError;
use super::operations::OperationRef;
use super::plan::Gated;
use super::values::{ClusterName, Confirmation, EksClusterName, IdempotencyKey, InstanceGroupName};

/// A feature of a cluster, by its stored name.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Feature {
    TrainingOperator,
    InferenceOperator,
    TieredCheckpointing,
    Autoscaling,
    KuberayOperator,
    Keda,
}

impl Feature {
    pub const ALL: [Feature; 6] = [
        Feature::TrainingOperator,
        Feature::InferenceOperator,
        Feature::TieredCheckpointing,
        Feature::Autoscaling,
        Feature::KuberayOperator,
        Feature::Keda,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Feature::TrainingOperator => "training_operator",
            Feature::InferenceOperator => "inference_operator",
            Feature::TieredCheckpointing => "tiered_checkpointing",
            Feature::Autoscaling => "autoscaling",
            Feature::KuberayOperator => "kuberay_operator",
            Feature::Keda => "keda",
        }
    }

    pub fn title(self) -> &'static str {
        match self {
            Feature::TrainingOperator => "HyperPod training operator",
            Feature::InferenceOperator => "HyperPod inference operator",
            Feature::TieredCheckpointing => "Managed tiered checkpointing",
            Feature::Autoscaling => "Managed Karpenter autoscaling",
            Feature::KuberayOperator => "KubeRay operator",
            Feature::Keda => "KEDA",
        }
    }

    /// What turning it on gives, said wherever the feature is offered.
    pub fn purpose(self) -> &'static str {
        match self {
            Feature::TrainingOperator => {
                "runs HyperPodPyTorchJob training jobs, restarting failed ranks in place"
            }
            Feature::InferenceOperator => {
                "deploys models from S3, FSx or JumpStart as endpoints (InferenceEndpointConfig, JumpStartModel)"
            }
            Feature::TieredCheckpointing => {
                "keeps checkpoints in node memory and copies them to S3"
            }
            Feature::Autoscaling => {
                "scales HyperPod instance groups (only those, never other EC2 capacity) with pending pods, down to zero"
            }
            Feature::KuberayOperator => {
                "runs Ray clusters, jobs and services (RayCluster, RayJob, RayService, RayCronJob): the upstream release, pinned"
            }
            Feature::Keda => {
                "scales workloads on events and metrics (ScaledObject, ScaledJob): the upstream release, pinned; the inference operator brings its own"
            }
        }
    }

    /// The shared components it needs, by name (see [`Component`]).
    pub fn depends_on(self) -> &'static [&'static str] {
        match self {
            Feature::TrainingOperator => &["cert-manager", "eks-pod-identity-agent"],
            Feature::InferenceOperator => &[
                "cert-manager",
                "metrics-server",
                "aws-mountpoint-s3-csi-driver",
                "aws-fsx-csi-driver",
            ],
            Feature::TieredCheckpointing
            | Feature::Autoscaling
            | Feature::KuberayOperator
            | Feature::Keda => &[],
        }
    }
}

impl std::fmt::Display for Feature {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The least share of instance memory tiered checkpointing runs with (AWS's setup guide).
pub const MIN_TIERED_MEMORY_PERCENT: u8 = 20;
/// The most instance groups one HyperpodNodeClass may name (AWS's autoscaling guide).
pub const MAX_AUTOSCALED_GROUPS: usize = 10;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GetFeatures {
    /// The cluster.
    pub name: EksClusterName,
}

/// Each feature and shared component of a cluster as AWS and Kubernetes have it now.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Features {
    pub name: String,
    pub features: Vec<FeatureState>,
    pub components: Vec<ComponentState>,
    /// When AWS was asked (RFC 3339, UTC).
    pub fetched_at: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct FeatureState {
    pub feature: Feature,
    pub title: String,
    pub purpose: String,
    pub enabled: bool,
    /// How it stands: an add-on's status (`ACTIVE`, `CREATING`, `DEGRADED`…), a
    /// HyperPod setting's value, or `absent`.
    pub status: String,
    pub version: Option<String>,
    /// What is there besides, one fact each (its role, its controller's readiness…).
    pub details: Vec<String>,
    /// The shared components it needs.
    pub depends_on: Vec<String>,
    /// `update_features` can change it in this hypd (every feature here can; the field
    /// stays for clients of hypds where one could not).
    pub changeable: bool,
}

/// A shared component: an EKS add-on one or more features need.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ComponentState {
    pub name: String,
    /// The add-on's status, or `absent`.
    pub status: String,
    pub version: Option<String>,
    /// The features that need it.
    pub needed_by: Vec<Feature>,
    /// Installed with the cluster and never removed by a feature change.
    pub with_cluster: bool,
}

impl Command for GetFeatures {
    type Output = Features;
    const SPEC: CommandSpec = CommandSpec {
        name: "get_features",
        summary: "Show a cluster's advanced features as they are now",
        description: "A cluster's advanced features and shared add-ons: on or off, status, version, dependencies.",
        effect: Effect::ReadOnly,
        role: Role::Viewer,
        idempotent: true,
        status_command: None,
        method: HttpMethod::Get,
        path: "/api/v1/clusters/{name}/features",
    };
}

// One field per feature: true turns it on, false off, absent leaves it as it is. Turning
// one off asks for a confirmation. `tiered_memory_percent`: the share of each instance's
// memory tiered checkpointing keeps checkpoints in (20-100; 20 when turned on without
// it), only with `tiered_checkpointing: true`. `autoscaling_groups`: the instance groups
// managed Karpenter may scale (at most 10; every group it supports when absent), only
// with `autoscaling: true`. Plain comments keep tools/list short.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateFeatures {
    /// The cluster.
    pub name: ClusterName,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub training_operator: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inference_operator: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tiered_checkpointing: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tiered_memory_percent: Option<u8>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoscaling: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoscaling_groups: Option<Vec<InstanceGroupName>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kuberay_operator: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keda: Option<bool>,
    /// Re-sending a request with the same key returns the same operation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<IdempotencyKey>,
    /// Only answer with the plan. Nothing is changed or stored.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dry_run: bool,
    /// The confirmation the same call without one returned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confirmation: Option<Confirmation>,
}

impl UpdateFeatures {
    /// The features the request names, with what it wants of each.
    pub fn named(&self) -> Vec<(Feature, bool)> {
        [
            (Feature::TrainingOperator, self.training_operator),
            (Feature::InferenceOperator, self.inference_operator),
            (Feature::TieredCheckpointing, self.tiered_checkpointing),
            (Feature::Autoscaling, self.autoscaling),
            (Feature::KuberayOperator, self.kuberay_operator),
            (Feature::Keda, self.keda),
        ]
        .into_iter()
        .filter_map(|(f, on)| on.map(|on| (f, on)))
        .collect()
    }

    /// The features the request turns on (`on`) or off.
    pub fn turning(&self, on: bool) -> Vec<Feature> {
        self.named()
            .into_iter()
            .filter(|(_, o)| *o == on)
            .map(|(f, _)| f)
            .collect()
    }

    /// Leaves `feature` untouched (its desired state already holds).
    pub fn drop(&mut self, feature: Feature) {
        match feature {
            Feature::TrainingOperator => self.training_operator = None,
            Feature::TieredCheckpointing => {
                self.tiered_checkpointing = None;
                self.tiered_memory_percent = None;
            }
            Feature::Autoscaling => {
                self.autoscaling = None;
                self.autoscaling_groups = None;
            }
            Feature::InferenceOperator => self.inference_operator = None,
            Feature::KuberayOperator => self.kuberay_operator = None,
            Feature::Keda => self.keda = None,
        }
    }
}

impl Command for UpdateFeatures {
    type Output = Gated<OperationRef>;
    const SPEC: CommandSpec = CommandSpec {
        name: "update_features",
        summary: "Turn a cluster's advanced features on or off",
        description: "Turns the named features on or off. On installs what a feature needs (autoscaling scales only the HyperPod groups named, never other EC2 capacity). Off removes only what nothing else uses and needs a confirmation: the first call returns the plan and one; call again with it once the user agrees. Returns an operation for wait_operation; dry_run returns the plan.",
        effect: Effect::Destructive,
        role: Role::Operator,
        idempotent: true,
        status_command: Some("get_operation"),
        method: HttpMethod::Post,
        path: "/api/v1/clusters/{name}/features",
    };

    super::command::gated_request!();

    /// Only turning a feature off removes anything.
    fn needs_confirmation(&self) -> bool {
        self.named().iter().any(|(_, on)| !on)
    }

    fn validate(&self) -> Result<(), ApiError> {
        if self.named().is_empty() {
            return Err(ApiError::field(
                "training_operator",
                "name at least one feature to change (true turns it on, false off)",
            ));
        }
        if let Some(p) = self.tiered_memory_percent {
            if self.tiered_checkpointing != Some(true) {
                return Err(ApiError::field(
                    "tiered_memory_percent",
                    "is given only with tiered_checkpointing: true",
                ));
            }
            if !(MIN_TIERED_MEMORY_PERCENT..=100).contains(&p) {
                return Err(ApiError::field(
                    "tiered_memory_percent",
                    format!(
                        "tiered checkpointing takes {MIN_TIERED_MEMORY_PERCENT} to 100 percent of each instance's memory (got {p})"
                    ),
                ));
            }
        }
        if let Some(groups) = &self.autoscaling_groups {
            let field = "autoscaling_groups";
            if self.autoscaling != Some(true) {
                return Err(ApiError::field(
                    field,
                    "is given only with autoscaling: true",
                ));
            }
            if groups.is_empty() || groups.len() > MAX_AUTOSCALED_GROUPS {
                return Err(ApiError::field(
                    field,
                    format!(
                        "names 1 to {MAX_AUTOSCALED_GROUPS} instance groups (got {})",
                        groups.len()
                    ),
                ));
            }
            for (i, g) in groups.iter().enumerate() {
                if groups[..i].contains(g) {
                    return Err(ApiError::field(
                        format!("{field}[{i}]"),
                        format!("names instance group {g} twice"),
                    ));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_absent_feature_is_not_part_of_the_request() {
        let r: UpdateFeatures =
            serde_json::from_value(serde_json::json!({"name": "ml-1", "training_operator": true}))
                .unwrap();
        assert_eq!(r.named(), [(Feature::TrainingOperator, true)]);
        assert!(!r.needs_confirmation());
        // Serialized back, only what was named is there: nothing else can be replayed.
        assert_eq!(
            serde_json::to_value(&r).unwrap(),
            serde_json::json!({"name": "ml-1", "training_operator": true})
        );
        let off: UpdateFeatures =
            serde_json::from_value(serde_json::json!({"name": "ml-1", "training_operator": false}))
                .unwrap();
        assert!(off.needs_confirmation());
        let none: UpdateFeatures =
            serde_json::from_value(serde_json::json!({"name": "ml-1"})).unwrap();
        match none.validate() {
            Err(ApiError::Validation { errors }) => {
                assert_eq!(errors[0].field, "training_operator")
            }
            other => panic!("{other:?}"),
        }
        for (bad, field) in [
            (
                serde_json::json!({"name": "ml-1", "tiered_checkpointing": true, "tiered_memory_percent": 10}),
                "tiered_memory_percent",
            ),
            (
                serde_json::json!({"name": "ml-1", "training_operator": true, "tiered_memory_percent": 40}),
                "tiered_memory_percent",
            ),
            (
                serde_json::json!({"name": "ml-1", "autoscaling": false, "autoscaling_groups": ["a"]}),
                "autoscaling_groups",
            ),
            (
                serde_json::json!({"name": "ml-1", "autoscaling": true, "autoscaling_groups": []}),
                "autoscaling_groups",
            ),
            (
                serde_json::json!({"name": "ml-1", "autoscaling": true, "autoscaling_groups": ["a", "b", "a"]}),
                "autoscaling_groups[2]",
            ),
        ] {
            match serde_json::from_value::<UpdateFeatures>(bad.clone())
                .unwrap()
                .validate()
            {
                Err(ApiError::Validation { errors }) => assert_eq!(errors[0].field, field, "{bad}"),
                other => panic!("{bad}: {other:?}"),
            }
        }
        // A field no feature has is refused by name, not ignored.
        let e = serde_json::from_value::<UpdateFeatures>(
            serde_json::json!({"name": "ml-1", "cert_manager": false}),
        )
        .unwrap_err();
        assert!(e.to_string().contains("cert_manager"), "{e}");
    }
}
