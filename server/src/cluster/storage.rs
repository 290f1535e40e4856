//! The cluster's shared storage: its S3 bucket mounted through the Mountpoint for S3 CSI
//! driver as a statically provisioned PersistentVolume and a ReadWriteMany claim that
//! every training job and endpoint mounts at the same path, so what one job writes the
//! next one reads.

use app::api::ApiError;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::Api;
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::resources::converge;
use crate::resources::kube::object::Applied;
use crate::resources::kube::{self as kubernetes};
use crate::resources::tags::K8S_MANAGED_BY;

/// The claim workloads mount, in this namespace, at `MOUNT_PATH`.
pub const CLAIM: &str = app::api::storage::SHARED_CLAIM;
pub const NAMESPACE: &str = "default";
pub const MOUNT_PATH: &str = app::api::storage::SHARED_MOUNT;
/// Mountpoint's CSI driver name.
pub const DRIVER: &str = "s3.csi.aws.com";

/// What the storage stage made, stored on the operation.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Storage {
    pub bucket: String,
    pub persistent_volume: String,
    pub claim: String,
    pub namespace: String,
    /// The claim's phase when last looked at (`Bound` once usable).
    pub phase: String,
}

pub fn volume_name(bucket: &str) -> String {
    // PersistentVolumes are cluster-wide; naming it after the bucket keeps two buckets
    // apart and makes a re-run find the same one.
    format!("s3-{bucket}")
}

/// The PersistentVolume and claim of the cluster's shared `bucket` in `region`.
pub fn manifests(bucket: &str, region: &str) -> (PersistentVolume, PersistentVolumeClaim) {
    volume(bucket, region, CLAIM, None)
}

/// The label every storage hypd mounts carries (its value the kind, `s3`): how
/// `list_storage` finds them.
pub const STORAGE_LABEL: &str = "hypd/storage";
/// The claim's annotation saying where pods mount it (the shared claim has none: `/s3`).
pub const MOUNT_ANNOTATION: &str = "hypd.dev/mount-path";

/// The PersistentVolume for `bucket` in `region` and its claim `claim`, which pods
/// mount at `mount` (recorded on the claim).
pub fn volume(
    bucket: &str,
    region: &str,
    claim: &str,
    mount: Option<&str>,
) -> (PersistentVolume, PersistentVolumeClaim) {
    // Mountpoint ignores capacity; Kubernetes requires one, and the claim must ask for
    // no more than the volume offers.
    claimed_volume(Claimed {
        volume: &volume_name(bucket),
        kind: "s3",
        capacity: "1200Gi",
        claim,
        mount,
        mount_options: json!(["allow-delete", "allow-other", format!("region {region}")]),
        csi: json!({
            "driver": DRIVER,
            // Unique per bucket: two volumes with one handle are mounted as one.
            "volumeHandle": format!("s3-csi-{bucket}"),
            "volumeAttributes": { "bucketName": bucket },
        }),
    })
}

/// A statically provisioned volume and the one claim it is bound to.
pub struct Claimed<'a> {
    pub volume: &'a str,
    /// The `hypd/storage` label's value: `s3` or `fsx`.
    pub kind: &'a str,
    pub capacity: &'a str,
    pub claim: &'a str,
    pub mount: Option<&'a str>,
    pub mount_options: serde_json::Value,
    /// The volume's `csi` source.
    pub csi: serde_json::Value,
}

/// The PersistentVolume and claim of `c`, labelled as hypd's storage of its kind.
pub fn claimed_volume(c: Claimed<'_>) -> (PersistentVolume, PersistentVolumeClaim) {
    let labels = json!({ K8S_MANAGED_BY.0: K8S_MANAGED_BY.1, STORAGE_LABEL: c.kind });
    let pv = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": { "name": c.volume, "labels": labels },
        "spec": {
            "capacity": { "storage": c.capacity },
            "accessModes": ["ReadWriteMany"],
            "persistentVolumeReclaimPolicy": "Retain",
            // Empty: bound only to the claim below, never by a storage class.
            "storageClassName": "",
            "claimRef": { "namespace": NAMESPACE, "name": c.claim },
            "mountOptions": c.mount_options,
            "csi": c.csi,
        },
    }))
    .expect("the PersistentVolume matches its type");
    let mut metadata = json!({ "name": c.claim, "namespace": NAMESPACE, "labels": labels });
    if let Some(mount) = c.mount {
        metadata["annotations"] = json!({ MOUNT_ANNOTATION: mount });
    }
    let pvc = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": metadata,
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "storageClassName": "",
            "volumeName": c.volume,
            "resources": { "requests": { "storage": c.capacity } },
        },
    }))
    .expect("the PersistentVolumeClaim matches its type");
    (pv, pvc)
}

/// Applies the volume and claim where they differ from what the cluster has, and reads
/// the claim's phase. A bound claim's spec is immutable but for its size, which is why
/// applying only what differs matters here: the claim as hypd wrote it is what binds.
pub async fn ensure(
    client: &kube::Client,
    bucket: &str,
    region: &str,
) -> Result<Storage, ApiError> {
    let (pv, pvc) = manifests(bucket, region);
    let volume = converge(&Applied::cluster(client, pv)).await?;
    let claim = converge(&Applied::namespaced(client, pvc))
        .await?
        .ok_or_else(|| {
            ApiError::internal("the shared claim vanished right after it was applied")
        })?;
    Ok(storage(claim, volume))
}

/// The shared claim as the cluster has it now; `None` when it has none (an imported
/// cluster, or one whose storage stage has not run).
pub async fn current(client: &kube::Client) -> Result<Option<Storage>, ApiError> {
    let claims = Api::<PersistentVolumeClaim>::namespaced(client.clone(), NAMESPACE);
    let Some(claim) = kubernetes::get(&claims, CLAIM).await? else {
        return Ok(None);
    };
    let volume = match claim.spec.as_ref().and_then(|s| s.volume_name.as_deref()) {
        Some(v) => kubernetes::get(&Api::<PersistentVolume>::all(client.clone()), v).await?,
        None => None,
    };
    Ok(Some(storage(claim, volume)))
}

/// What the claim and the volume it names say of the shared storage.
fn storage(claim: PersistentVolumeClaim, volume: Option<PersistentVolume>) -> Storage {
    let name = claim.spec.as_ref().and_then(|s| s.volume_name.clone());
    let bucket = volume.and_then(|pv| pv.spec?.csi?.volume_attributes?.get("bucketName").cloned());
    Storage {
        bucket: bucket.unwrap_or_default(),
        persistent_volume: name.unwrap_or_default(),
        claim: CLAIM.to_owned(),
        namespace: NAMESPACE.to_owned(),
        phase: claim
            .status
            .and_then(|s| s.phase)
            .unwrap_or_else(|| "Pending".to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_claim_binds_only_to_its_bucket_volume() {
        let (pv, pvc) = manifests("hypd-ml-123456789012", "us-east-1");
        let pv_spec = pv.spec.unwrap();
        let csi = pv_spec.csi.unwrap();
        assert_eq!(csi.driver, DRIVER);
        assert_eq!(
            csi.volume_attributes.unwrap()["bucketName"],
            "hypd-ml-123456789012"
        );
        assert_eq!(
            pvc.spec.as_ref().unwrap().volume_name.as_deref(),
            pv.metadata.name.as_deref()
        );
        assert_eq!(pv_spec.claim_ref.unwrap().name.as_deref(), Some(CLAIM));
        assert_eq!(
            pvc.spec.unwrap().access_modes.unwrap(),
            vec!["ReadWriteMany".to_owned()]
        );
    }
}
