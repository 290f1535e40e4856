//! The HyperPod training operator's HyperPodPyTorchJob (`sagemaker.amazonaws.com/v1`,
//! namespaced) as an object hypd applies (see [`super::kind`]). It has no public CRD:
//! its fields follow AWS's documentation of the operator.

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
