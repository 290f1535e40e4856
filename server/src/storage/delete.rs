//! `delete_storage`: a storage's claim, then its volume, then an FSx storage's file
//! system if hypd made it, then a bucket if hypd created it and it is empty. Refused while any pod mounts the claim, in the pre-flight and
//! again when the claim is deleted (a job may have started in between). The claim's
//! stage records the bucket and volume before it deletes anything, so a run resumed
//! after the claim is gone still knows what is left to delete.

use std::time::Duration;

use app::api::ApiError;
use app::api::storage::DeleteStorage;
use app::api::values::IdempotencyKey;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::Api;
use kube::api::ListParams;
use serde::{Deserialize, Serialize};

use super::fsx::Deleted;
use super::{find, region_of, required, unused, users};
use crate::cluster::storage::{NAMESPACE, STORAGE_LABEL, volume};
use crate::operation::pipeline::{Context, Pipeline, Preflight, Progress, stages};
use crate::resources::kube::object::Applied;
use crate::resources::kube::{self as kubernetes};
use crate::resources::s3::bucket::{Bucket, Files};
use crate::resources::{Want, converge, is_planning};

stages! {
    pub enum Stage {
        Claim = "claim", "The claim deleted, once no pod mounts it", false;
        Volume = "volume", "The PersistentVolume deleted (the bucket's data stays)", false;
        FileSystem = "file_system", "An FSx storage's file system deleted with its files, if hypd made it", false;
        Access = "access", "The Mountpoint driver's role no longer allowed the bucket", false;
        Bucket = "bucket", "The bucket deleted if hypd created it and it is empty, else kept", false;
    }
}

/// What the stages found, stored with the operation. Field names are stored: never rename.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Outputs {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bucket: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub persistent_volume: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mount_path: Option<String>,
    /// An FSx storage's file system.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file_system: Option<String>,
    /// Why the bucket stays, when it does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kept: Option<String>,
}

const POLL: Duration = Duration::from_secs(2);
/// FSx takes minutes to delete a file system.
const FSX_POLL: Duration = Duration::from_secs(15);

impl Pipeline for DeleteStorage {
    type Stage = Stage;
    type Outputs = Outputs;

    fn target(&self) -> String {
        crate::cluster::target(self.name.as_str())
    }

    fn idempotency_key(&self) -> Option<&IdempotencyKey> {
        self.idempotency_key.as_ref()
    }

    /// The storage exists, is hypd's, and no pod mounts it.
    async fn preflight(self, cx: &Preflight<'_>) -> Result<Self, ApiError> {
        let cluster = self.name.as_str();
        let region = region_of(cx.store, cluster).await?;
        let client = kubernetes::connect(cx.aws, &region, cluster).await?;
        let storage = self.storage.as_str();
        let found = required(&client, storage).await?;
        if !found.ours() {
            return Err(ApiError::field(
                "storage",
                format!("{storage} was not made by hypd: delete it where it was made"),
            ));
        }
        let users = users(&client).await?;
        unused(storage, users.get(storage).map_or(&[], Vec::as_slice))?;
        Ok(self)
    }

    async fn step(
        &self,
        cx: &Context,
        stage: Stage,
        out: &mut Outputs,
    ) -> Result<Progress, ApiError> {
        let cluster = self.name.as_str();
        let storage = self.storage.as_str();
        let region = region_of(&cx.store, cluster).await?;
        match stage {
            Stage::Claim => {
                let client = kubernetes::connect(&cx.aws, &region, cluster).await?;
                // The claim names its volume; once the claim is gone (a run cut off
                // after deleting it lost what it recorded), the volume bound to it.
                let claimed = match find(&client, storage).await? {
                    Some(f) => f.volume,
                    None => volume_claimed_by(&client, storage).await?,
                };
                if out.persistent_volume.is_none()
                    && let Some(pv) = claimed
                {
                    out.bucket = pv
                        .spec
                        .as_ref()
                        .and_then(|s| s.csi.as_ref())
                        .and_then(|c| c.volume_attributes.as_ref())
                        .and_then(|a| a.get("bucketName").cloned());
                    out.file_system = pv
                        .spec
                        .as_ref()
                        .and_then(|s| s.csi.as_ref())
                        .filter(|c| c.driver == super::fsx::DRIVER)
                        .map(|c| c.volume_handle.clone());
                    out.persistent_volume = pv.metadata.name;
                }
                let Some(found) = find(&client, storage).await? else {
                    return Ok(Progress::Done);
                };
                out.mount_path = Some(found.mount());
                let users = users(&client).await?;
                unused(storage, users.get(storage).map_or(&[], Vec::as_slice))?;
                let claim = claim_object(storage);
                converge(&Applied::namespaced(&client, claim).absent()).await?;
                if is_planning() {
                    return Ok(Progress::Done);
                }
                let left = find(&client, storage).await?.map(|f| f.phase());
                Ok(Progress::unless(
                    POLL,
                    left.map(|p| format!("claim {NAMESPACE}/{storage} ({p}) is being deleted")),
                ))
            }
            Stage::Volume => {
                let Some(name) = out.persistent_volume.clone() else {
                    return Ok(Progress::Done);
                };
                let client = kubernetes::connect(&cx.aws, &region, cluster).await?;
                let mut pv = PersistentVolume::default();
                pv.metadata.name = Some(name.clone());
                converge(&Applied::cluster(&client, pv).absent()).await?;
                if is_planning() {
                    return Ok(Progress::Done);
                }
                let volumes = Api::<PersistentVolume>::all(client.clone());
                let left = kubernetes::get(&volumes, &name).await?.is_some();
                Ok(Progress::unless(
                    POLL,
                    left.then(|| format!("volume {name} is being deleted")),
                ))
            }
            Stage::FileSystem => {
                let Some(id) = out.file_system.clone() else {
                    return Ok(Progress::Done);
                };
                match super::fsx::delete(&cx.aws, &region, cluster, storage, &id).await? {
                    Deleted::Gone => Ok(Progress::Done),
                    Deleted::Kept(why) => {
                        out.kept = Some(why);
                        Ok(Progress::Done)
                    }
                    Deleted::Deleting(note) => Ok(Progress::wait(FSX_POLL, note)),
                }
            }
            Stage::Access => {
                if let Some(role) = super::driver_role(&cx.aws, &region, cluster).await? {
                    converge(&super::driver_access(
                        &cx.aws,
                        &region,
                        cluster,
                        &role,
                        storage,
                        Want::Absent,
                    ))
                    .await?;
                }
                Ok(Progress::Done)
            }
            Stage::Bucket => {
                let Some(name) = out.bucket.clone() else {
                    return Ok(Progress::Done);
                };
                let b = Bucket {
                    s3: cx.aws.s3(&region),
                    name: name.clone(),
                    region: region.clone(),
                    cluster: cluster.to_owned(),
                    want: Want::Absent,
                    hypd_files: Files::None,
                    field: "storage",
                    // Only a bucket with hypd's tags for this cluster is hypd's.
                    adopt: false,
                    harden: false,
                };
                let after = converge(&b).await?;
                out.kept = b.kept(&after).or_else(|| {
                    (after.exists && !after.ours)
                        .then(|| format!("kept bucket {name}: hypd did not create it"))
                });
                Ok(Progress::Done)
            }
        }
    }
}

/// The storage volume hypd made for claim `storage`, bound or not.
async fn volume_claimed_by(
    client: &kube::Client,
    storage: &str,
) -> Result<Option<PersistentVolume>, ApiError> {
    let volumes = Api::<PersistentVolume>::all(client.clone());
    let mut found = Vec::new();
    kubernetes::each_listed(
        &volumes,
        ListParams::default().labels(STORAGE_LABEL),
        |pv| {
            let claimed = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref());
            if claimed.is_some_and(|c| {
                c.name.as_deref() == Some(storage) && c.namespace.as_deref() == Some(NAMESPACE)
            }) {
                found.push(pv);
            }
        },
    )
    .await?;
    // Two volumes once bound to a claim of this name (one left by an earlier storage):
    // which is this one's cannot be told, so neither is deleted.
    if found.len() > 1 {
        let names: Vec<String> = found
            .iter()
            .filter_map(|v| v.metadata.name.clone())
            .collect();
        return Err(ApiError::Conflict {
            message: format!(
                "volumes {} were all bound to {NAMESPACE}/{storage}: delete the one that is not this storage's (kubectl delete pv …), then retry",
                names.join(", ")
            ),
            operation_id: None,
            field: None,
        });
    }
    Ok(found.pop())
}

/// The claim as `Applied` names it: its name and namespace are all a deletion needs.
fn claim_object(storage: &str) -> PersistentVolumeClaim {
    let (_, mut claim) = volume("unused", "unused", storage, None);
    claim.spec = None;
    claim
}
