//! The HyperPod inference operator's InferenceEndpointConfig (`inference.sagemaker.aws.amazon.com/v1`)
//! as an object hypd applies (see [`super::kind`]); its fields are those of AWS's own CRD,
//! which the API server validates every object against.

use kube::core::NamespaceResourceScope;

use super::kind::custom_kind;

custom_kind!(
    /// A model deployment the operator runs: workers of an image and arguments, the
    /// model's source, the instance type, and its managed options (KV cache tiers,
    /// intelligent routing); its status says how far the deployment got.
    InferenceEndpointConfig,
    "inference.sagemaker.aws.amazon.com",
    "InferenceEndpointConfig",
    "inferenceendpointconfigs",
    NamespaceResourceScope
);
