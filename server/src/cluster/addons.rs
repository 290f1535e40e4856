//! The EKS add-ons of the one table in `dependencies`, on a cluster: installed at their
//! pinned versions (the Mountpoint for S3 CSI driver with its pod identity role bound
//! first), waited for until ACTIVE, and removed with the cluster.

use std::collections::BTreeMap;
use std::time::Duration;

use app::api::ApiError;

use super::dependencies::{ADDONS, FEATURE_COMPONENTS, TRAINING_OPERATOR};
use crate::aws::Aws;
use crate::operation::pipeline::Progress;
use crate::resources::eks::addon::Addon;
use crate::resources::eks::pod_identity::PodIdentity;
use crate::resources::{Want, converge};

const POLL: Duration = Duration::from_secs(15);
const DELETE_POLL: Duration = Duration::from_secs(30);

/// The Mountpoint for S3 CSI driver's service account, which its pod identity names.
pub const S3_CSI_SERVICE_ACCOUNT: (&str, &str) = ("kube-system", "s3-csi-driver-sa");

fn addon(aws: &Aws, region: &str, cluster: &str, name: &str, want: Want<String>) -> Addon {
    Addon {
        eks: aws.eks(region),
        cluster: cluster.to_owned(),
        name: name.to_owned(),
        want,
        configuration: None,
    }
}

/// Binds the S3 CSI driver's role, creates the missing add-ons and waits until all are
/// ACTIVE; a failed one is an error naming it with EKS's health issues. `installed`
/// records add-on → version once ACTIVE.
pub async fn ensure(
    aws: &Aws,
    region: &str,
    cluster: &str,
    s3_csi_role: &str,
    installed: &mut BTreeMap<String, String>,
) -> Result<Progress, ApiError> {
    let (namespace, service_account) = S3_CSI_SERVICE_ACCOUNT;
    converge(&PodIdentity {
        eks: aws.eks(region),
        cluster: cluster.to_owned(),
        namespace: namespace.to_owned(),
        service_account: service_account.to_owned(),
        want: Want::Present(s3_csi_role.to_owned()),
    })
    .await?;
    let mut pending = Vec::new();
    for a in ADDONS {
        let state = converge(&addon(
            aws,
            region,
            cluster,
            a.name,
            Want::Present(a.version.to_owned()),
        ))
        .await?
        .ok_or_else(|| crate::resources::missing("an add-on"))?;
        state.check(a.name)?;
        if state.active() {
            installed.insert(
                a.name.to_owned(),
                state.version.unwrap_or_else(|| a.version.to_owned()),
            );
        } else {
            pending.push(state.describe(a.name));
        }
    }
    Ok(Progress::unless_pending(POLL, &pending, |p| {
        format!("waiting for add-ons: {p}")
    }))
}

/// Deletes hypd's add-ons (those with hypd's tags), the features' first, and waits until
/// they are gone.
pub async fn teardown(aws: &Aws, region: &str, cluster: &str) -> Result<Progress, ApiError> {
    let mut deleting = Vec::new();
    for a in [TRAINING_OPERATOR]
        .iter()
        .chain(FEATURE_COMPONENTS)
        .chain(ADDONS)
    {
        let after = converge(&addon(aws, region, cluster, a.name, Want::Absent)).await?;
        if after.is_some_and(|s| s.ours) {
            deleting.push(a.name);
        }
    }
    Ok(Progress::unless_pending(DELETE_POLL, &deleting, |d| {
        format!("deleting add-ons: {d}")
    }))
}
