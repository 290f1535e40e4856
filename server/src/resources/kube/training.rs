//! The kinds training jobs are made of, as objects hypd applies (see [`super::kind`]):
//! the HyperPod training operator's HyperPodPyTorchJob (`sagemaker.amazonaws.com/v1`,
//! which has no public CRD: its fields follow AWS's documentation of the operator) and
//! KubeRay's RayJob (`ray.io/v1`, checked against KubeRay's published CRD).

use kube::core::NamespaceResourceScope;

use super::kind::custom_kind;

custom_kind!(
    /// A distributed PyTorch job: replica specs of pods the operator launches together,
    /// restarts within its run policy, and watches through log rules.
    HyperPodPyTorchJob,
    "sagemaker.amazonaws.com",
    "HyperPodPyTorchJob",
    "hyperpodpytorchjobs",
    NamespaceResourceScope
);

custom_kind!(
    /// KubeRay's RayJob (`ray.io/v1`): a Ray cluster of head and worker pods made for one
    /// entrypoint, which a submitter runs with `ray job submit`.
    RayJob,
    "ray.io",
    "RayJob",
    "rayjobs",
    NamespaceResourceScope
);
