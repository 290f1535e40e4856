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

custom_kind!(
    /// A SageMaker public hub model the operator deploys: the model and version, the
    /// instance type, whether its licence is accepted; the hub says the rest.
    JumpStartModel,
    "inference.sagemaker.aws.amazon.com",
    "JumpStartModel",
    "jumpstartmodels",
    NamespaceResourceScope
);
