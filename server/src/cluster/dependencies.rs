//! What hypd installs, pinned in one place: the EKS add-ons HyperPod needs on every
//! cluster, the HyperPod node components, and the add-ons of the features a cluster may
//! turn on, with the versions hypd is tested with. Changing a version here changes it for
//! every new cluster (or feature turned on); reconciliation reads the same tables.

/// The EKS version new clusters get unless the request names one.
pub const DEFAULT_KUBERNETES_VERSION: &str = "1.33";

/// One EKS add-on and its pinned version.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Addon {
    pub name: &'static str,
    pub version: &'static str,
    /// Why the cluster needs it.
    pub purpose: &'static str,
    /// The role its pods run as, if hypd makes one for it.
    pub role: Option<AddonRole>,
}

/// A role an add-on's pods run as: trusted by EKS Pod Identity, with one AWS managed
/// policy, bound to the add-on's service account before the add-on is created (its
/// controller must find the role when it starts).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AddonRole {
    pub service_account: (&'static str, &'static str),
    pub policy: &'static str,
    /// The role's `role_name` suffix; the names of roles already made depend on it.
    pub suffix: &'static str,
}

pub const ADDONS: &[Addon] = &[
    Addon {
        name: "eks-pod-identity-agent",
        version: "v1.3.8-eksbuild.2",
        purpose: "IAM roles for pods (the Mountpoint driver and the HyperPod operators use it)",
        role: None,
    },
    Addon {
        name: "aws-mountpoint-s3-csi-driver",
        version: "v2.1.0-eksbuild.1",
        purpose: "mounts the shared S3 bucket as a PersistentVolume",
        role: None,
    },
    Addon {
        name: "cert-manager",
        version: "v1.18.2-eksbuild.2",
        purpose: "certificates for the HyperPod training and inference operators' webhooks",
        role: None,
    },
    Addon {
        name: "metrics-server",
        version: "v0.8.0-eksbuild.2",
        purpose: "resource metrics for autoscaling and kubectl top",
        role: None,
    },
];

/// The HyperPod training operator's add-on. The version is the newest the sim offers; no
/// minimum is published (see ../shared/reference/breadth-facts.md §5).
pub const TRAINING_OPERATOR: Addon = Addon {
    name: "amazon-sagemaker-hyperpod-training-operator",
    version: "v1.1.0-eksbuild.1",
    purpose: "runs HyperPodPyTorchJob training jobs",
    role: None,
};

/// The HyperPod inference operator's add-on: the one version AWS's migration script and
/// the sim name (see ../shared/reference/breadth-facts.md §5).
pub const INFERENCE_OPERATOR: Addon = Addon {
    name: "amazon-sagemaker-hyperpod-inference",
    version: "v1.0.0-eksbuild.1",
    purpose: "deploys models as endpoints (InferenceEndpointConfig, JumpStartModel)",
    role: None,
};

/// Add-ons only features need (not made with the cluster): installed when a feature that
/// needs one is turned on, removed when the last such feature is turned off.
pub const FEATURE_COMPONENTS: &[Addon] = &[Addon {
    name: "aws-fsx-csi-driver",
    version: "v1.6.0-eksbuild.1",
    purpose: "mounts FSx for Lustre file systems the inference operator serves models from",
    role: Some(AddonRole {
        service_account: ("kube-system", "fsx-csi-controller-sa"),
        policy: "arn:aws:iam::aws:policy/AmazonFSxFullAccess",
        suffix: "fsx-csi",
    }),
}];

/// A HyperPod node component: a DaemonSet on every HyperPod node, applied by hypd with
/// server-side apply (see docs/ARCHITECTURE.md, "Cluster dependencies").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeComponent {
    /// The DaemonSet's name.
    pub name: &'static str,
    pub namespace: &'static str,
    pub version: &'static str,
    pub image: Image,
    pub role: ComponentRole,
    pub purpose: &'static str,
}

/// What a component needs from its node, which decides its pod's mounts and rights.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ComponentRole {
    /// Reads the node's logs and devices and labels the Node object with its health.
    HealthAgent,
    /// Registers an extended resource with the kubelet's device-plugin socket.
    DevicePlugin,
}

/// Where a component's image comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Image {
    /// The same reference in every region.
    Global(&'static str),
    /// `<account>.dkr.ecr.<region>.amazonaws.com/<repository>`, one ECR account for
    /// every region (EKS's own images).
    Ecr {
        account: &'static str,
        repository: &'static str,
    },
    /// An ECR repository published from a different account in each region.
    RegionalEcr {
        accounts: &'static [(&'static str, &'static str)],
        repository: &'static str,
    },
}

impl NodeComponent {
    /// The image reference for `region`, or why there is none.
    pub fn image(&self, region: &str) -> Result<String, String> {
        let tag = self.version;
        match self.image {
            Image::Global(repository) => Ok(format!("{repository}:{tag}")),
            Image::Ecr {
                account,
                repository,
            } => Ok(format!(
                "{account}.dkr.ecr.{region}.amazonaws.com/{repository}:{tag}"
            )),
            Image::RegionalEcr {
                accounts,
                repository,
            } => accounts
                .iter()
                .find(|(r, _)| *r == region)
                .map(|(_, account)| {
                    format!("{account}.dkr.ecr.{region}.amazonaws.com/{repository}:{tag}")
                })
                .ok_or_else(|| {
                    let known: Vec<&str> = accounts.iter().map(|(r, _)| *r).collect();
                    format!(
                        "{} is not published in {region}; HyperPod clusters with hypd are supported in {}",
                        self.name,
                        known.join(", ")
                    )
                }),
        }
    }
}

/// The namespace of HyperPod's own components.
pub const HYPERPOD_NAMESPACE: &str = "aws-hyperpod";

pub const NODE_COMPONENTS: &[NodeComponent] = &[
    NodeComponent {
        name: "health-monitoring-agent",
        namespace: HYPERPOD_NAMESPACE,
        version: "1.0.1038.0_1.0.305.0",
        image: Image::RegionalEcr {
            accounts: &[
                ("us-east-1", "767398015722"),
                ("us-east-2", "851725546812"),
                ("us-west-1", "011528288828"),
                ("us-west-2", "905418368575"),
            ],
            repository: "hyperpod-health-monitoring-agent",
        },
        role: ComponentRole::HealthAgent,
        purpose: "watches GPUs, EFA and the kernel log and marks faulty nodes for automatic recovery",
    },
    NodeComponent {
        name: "nvidia-device-plugin-daemonset",
        namespace: "kube-system",
        version: "v0.17.1",
        image: Image::Global("nvcr.io/nvidia/k8s-device-plugin"),
        role: ComponentRole::DevicePlugin,
        purpose: "advertises nvidia.com/gpu to the scheduler",
    },
    NodeComponent {
        name: "aws-efa-k8s-device-plugin-daemonset",
        namespace: "kube-system",
        version: "v0.5.6",
        image: Image::Ecr {
            account: "602401143452",
            repository: "eks/aws-efa-k8s-device-plugin",
        },
        role: ComponentRole::DevicePlugin,
        purpose: "advertises vpc.amazonaws.com/efa to the scheduler",
    },
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_pinned_version_per_addon() {
        let mut names: Vec<&str> = ADDONS.iter().map(|a| a.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), ADDONS.len());
        assert!(
            ADDONS
                .iter()
                .all(|a| a.version.starts_with('v') && a.version.contains("-eksbuild."))
        );
    }

    #[test]
    fn component_images_are_pinned_per_region() {
        let agent = &NODE_COMPONENTS[0];
        assert_eq!(
            agent.image("us-west-2").unwrap(),
            "905418368575.dkr.ecr.us-west-2.amazonaws.com/hyperpod-health-monitoring-agent:1.0.1038.0_1.0.305.0"
        );
        let err = agent.image("af-south-1").unwrap_err();
        assert!(
            err.contains("us-east-1, us-east-2, us-west-1, us-west-2"),
            "{err}"
        );
        assert_eq!(
            NODE_COMPONENTS[2].image("eu-west-1").unwrap(),
            "602401143452.dkr.ecr.eu-west-1.amazonaws.com/eks/aws-efa-k8s-device-plugin:v0.5.6"
        );
    }
}
