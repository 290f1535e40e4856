//! Kinds of other projects' CRDs as objects hypd applies. None has a Rust type in
//! k8s-openapi and kube's `derive` would cost a proc-macro crate on the 2-core builders,
//! so each is a plain struct with its spec as JSON and a hand-written `kube::Resource`
//! (version v1 unless named); that is what lets [`super::object::Applied`] keep them by server-side
//! apply with the same diff as every built-in kind.

macro_rules! custom_kind {
    ($(#[$doc:meta])* $name:ident, $group:literal, $kind:literal, $plural:literal, $scope:ty) => {
        $crate::resources::kube::kind::custom_kind!(
            $(#[$doc])* $name, $group, "v1", $kind, $plural, $scope
        );
    };
    ($(#[$doc:meta])* $name:ident, $group:literal, $version:literal, $kind:literal, $plural:literal, $scope:ty) => {
        $(#[$doc])*
        #[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
        pub struct $name {
            #[serde(rename = "apiVersion")]
            pub api_version: String,
            pub kind: String,
            pub metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
            #[serde(default)]
            pub spec: serde_json::Value,
            /// What the controller reports; never applied.
            #[serde(default, skip_serializing_if = "serde_json::Value::is_null")]
            pub status: serde_json::Value,
        }

        impl $name {
            pub const GROUP: &str = $group;
            pub const KIND: &str = $kind;

            /// Its status, if written for its current spec (every condition observed
            /// this generation); one written for an earlier spec says nothing of it.
            pub fn current_status(&self) -> Option<&serde_json::Value> {
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
            pub fn new(
                metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
                spec: serde_json::Value,
            ) -> Self {
                Self {
                    api_version: concat!($group, "/", $version).to_owned(),
                    kind: $kind.to_owned(),
                    metadata,
                    spec,
                    status: serde_json::Value::Null,
                }
            }
        }

        impl kube::Resource for $name {
            type DynamicType = ();
            type Scope = $scope;

            fn kind(_: &()) -> std::borrow::Cow<'_, str> {
                std::borrow::Cow::Borrowed($kind)
            }
            fn group(_: &()) -> std::borrow::Cow<'_, str> {
                std::borrow::Cow::Borrowed($group)
            }
            fn version(_: &()) -> std::borrow::Cow<'_, str> {
                std::borrow::Cow::Borrowed($version)
            }
            fn plural(_: &()) -> std::borrow::Cow<'_, str> {
                std::borrow::Cow::Borrowed($plural)
            }
            fn meta(&self) -> &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                &self.metadata
            }
            fn meta_mut(&mut self) -> &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                &mut self.metadata
            }
        }
    };
}

pub(crate) use custom_kind;
