//! What hypd installs on every cluster, pinned in one table: the EKS add-ons HyperPod
//! needs, with the versions hypd is tested with. Changing a version here changes it for
//! every new cluster; reconciliation reads the same table.

/// The EKS version new clusters get unless the request names one.
pub const DEFAULT_KUBERNETES_VERSION: &str = "1.33";

/// One EKS add-on and its pinned version.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Addon {
    pub name: &'static str,
    pub version: &'static str,
    /// Why the cluster needs it.
    pub purpose: &'static str,
}

pub const ADDONS: &[Addon] = &[
    Addon {
        name: "eks-pod-identity-agent",
        version: "v1.3.8-eksbuild.2",
        purpose: "IAM roles for pods (the Mountpoint driver and the HyperPod operators use it)",
    },
    Addon {
        name: "aws-mountpoint-s3-csi-driver",
        version: "v2.1.0-eksbuild.1",
        purpose: "mounts the shared S3 bucket as a PersistentVolume",
    },
    Addon {
        name: "cert-manager",
        version: "v1.18.2-eksbuild.2",
        purpose: "certificates for the HyperPod training and inference operators' webhooks",
    },
    Addon {
        name: "metrics-server",
        version: "v0.8.0-eksbuild.2",
        purpose: "resource metrics for autoscaling and kubectl top",
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
}
