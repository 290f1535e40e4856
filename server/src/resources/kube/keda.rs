//! KEDA's ScaledObject (`keda.sh/v1alpha1`) as an object hypd applies (see [`super::kind`]):
//! its fields are those of KEDA's own CRD, which the API server validates every object
//! against, and KEDA (not hypd) keeps the target's replica count from then on.

use kube::core::NamespaceResourceScope;

use super::kind::custom_kind;

custom_kind!(
    /// Scaling of a Deployment between min and max replicas on its triggers' metrics;
    /// its status says whether the triggers are active and which HPA KEDA drives.
    ScaledObject,
    "keda.sh",
    "v1alpha1",
    "ScaledObject",
    "scaledobjects",
    NamespaceResourceScope
);
