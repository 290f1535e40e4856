//! Managed Karpenter's two kinds as objects hypd applies: Karpenter's NodePool and
//! HyperPod's HyperpodNodeClass. Neither has a Rust type in k8s-openapi and kube's
//! `derive` would cost a proc-macro crate on the 2-core builders, so each is a plain
//! struct with its spec as JSON and a hand-written `kube::Resource` (both are
//! cluster-scoped, version v1); that is what lets [`super::object::Applied`] keep them by
//! server-side apply with the same diff as every built-in kind.

use std::borrow::Cow;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::core::ClusterResourceScope;
use serde::{Deserialize, Serialize};
use serde_json::Value;

macro_rules! cluster_kind {
    ($(#[$doc:meta])* $name:ident, $group:literal, $kind:literal, $plural:literal) => {
        $(#[$doc])*
        #[derive(Clone, Debug, Serialize, Deserialize)]
        pub struct $name {
            #[serde(rename = "apiVersion")]
            pub api_version: String,
            pub kind: String,
            pub metadata: ObjectMeta,
            #[serde(default)]
            pub spec: Value,
            /// What the controller reports; never applied.
            #[serde(default, skip_serializing_if = "Value::is_null")]
            pub status: Value,
        }

        impl $name {
            pub const GROUP: &str = $group;
            pub const KIND: &str = $kind;

            /// Its status, if written for its current spec (every condition observed
            /// this generation); one written for an earlier spec says nothing of it.
            pub fn current_status(&self) -> Option<&Value> {
                let generation = self.metadata.generation;
                self.status["conditions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .all(|c| {
                        c["observedGeneration"]
                            .as_i64()
                            .is_none_or(|g| Some(g) == generation)
                    })
                    .then_some(&self.status)
            }

            /// An object of this kind with `metadata` and `spec`.
            pub fn new(metadata: ObjectMeta, spec: Value) -> Self {
                Self {
                    api_version: concat!($group, "/v1").to_owned(),
                    kind: $kind.to_owned(),
                    metadata,
                    spec,
                    status: Value::Null,
                }
            }
        }

        impl kube::Resource for $name {
            type DynamicType = ();
            type Scope = ClusterResourceScope;

            fn kind(_: &()) -> Cow<'_, str> {
                Cow::Borrowed($kind)
            }
            fn group(_: &()) -> Cow<'_, str> {
                Cow::Borrowed($group)
            }
            fn version(_: &()) -> Cow<'_, str> {
                Cow::Borrowed("v1")
            }
            fn plural(_: &()) -> Cow<'_, str> {
                Cow::Borrowed($plural)
            }
            fn meta(&self) -> &ObjectMeta {
                &self.metadata
            }
            fn meta_mut(&mut self) -> &mut ObjectMeta {
                &mut self.metadata
            }
        }
    };
}

cluster_kind!(
    /// Which pending pods Karpenter may add nodes for, on which node class, and when it
    /// removes nodes again.
    NodePool,
    "karpenter.sh",
    "NodePool",
    "nodepools"
);
cluster_kind!(
    /// The HyperPod instance groups (at most ten) Karpenter may scale.
    HyperpodNodeClass,
    "karpenter.sagemaker.amazonaws.com",
    "HyperpodNodeClass",
    "hyperpodnodeclasses"
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
