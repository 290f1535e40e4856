//! Managed Karpenter's two kinds as objects hypd applies: Karpenter's NodePool and
//! HyperPod's HyperpodNodeClass, both cluster-scoped (see [`super::kind`]).

use kube::core::ClusterResourceScope;
use serde_json::Value;

use super::kind::custom_kind;

custom_kind!(
    /// Which pending pods Karpenter may add nodes for, on which node class, and when it
    /// removes nodes again.
    NodePool,
    "karpenter.sh",
    "NodePool",
    "nodepools",
    ClusterResourceScope
);
custom_kind!(
    /// The HyperPod instance groups (at most ten) Karpenter may scale.
    HyperpodNodeClass,
    "karpenter.sagemaker.amazonaws.com",
    "HyperpodNodeClass",
    "hyperpodnodeclasses",
    ClusterResourceScope
);

/// The `kind` condition of an object's status: its status (`True`/`False`) and message.
pub fn condition<'a>(status: &'a Value, kind: &str) -> Option<(&'a str, &'a str)> {
    status["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind)
        .map(|c| {
            (
                c["status"].as_str().unwrap_or_default(),
                c["message"].as_str().unwrap_or_default(),
            )
        })
}
