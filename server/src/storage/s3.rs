//! `create_s3_storage`: another bucket mounted in a cluster through Mountpoint for S3, as
//! the shared one is (a static PersistentVolume bound only to its claim), with its mount
//! path recorded on the claim. Everything that could make two storages one is refused
//! before anything is made: a claim name in use, a bucket another storage mounts (one
//! volume handle per bucket), a mount path another storage has.

use app::api::ApiError;
use app::api::storage::CreateS3Storage;
use app::api::values::{BucketName, IdempotencyKey};
use serde::{Deserialize, Serialize};

use super::region_of;
use crate::cluster::identity::s3_csi_inline_policy;
use crate::cluster::storage::{NAMESPACE, volume, volume_name};
use crate::operation::pipeline::{Context, Pipeline, Preflight, Progress, stages};
use crate::resources::kube::object::Applied;
use crate::resources::kube::{self as kubernetes};
use crate::resources::s3::bucket::{Bucket, Files};
use crate::resources::{Resource, Want, converge, missing};

stages! {
    pub enum Stage {
        Bucket = "bucket", "The bucket: a named one that exists as it is, else created with hypd's tags, public access blocked and encryption on", true;
        Access = "access", "The Mountpoint driver's role allowed the bucket (an inline policy of its own)", true;
        Volume = "volume", "The PersistentVolume (Mountpoint for S3) and its claim applied", true;
        Bound = "bound", "The claim Bound to its volume", true;
    }
}

/// What the stages made, stored with the operation. Field names are stored: never rename.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Outputs {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bucket: Option<String>,
    /// hypd created the bucket (else it was there and stays when the storage goes).
    #[serde(default)]
    pub bucket_created: bool,
    /// The role the Mountpoint driver runs as.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver_role: Option<String>,
    /// Why the driver's role was left as it is (it is not hypd's), when it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access_note: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub persistent_volume: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
}

/// The bucket the pre-flight settled on.
fn bucket_name(r: &CreateS3Storage) -> Result<&BucketName, ApiError> {
    r.bucket
        .as_ref()
        .ok_or_else(|| missing("the storage's bucket name"))
}

/// The bucket hypd names when none is asked for: only hypd makes a bucket of this name.
async fn default_bucket(r: &CreateS3Storage, aws: &crate::aws::Aws) -> Result<String, ApiError> {
    let account = aws.identity().await.map_err(ApiError::from)?.account;
    Ok(format!("{}-{}-{account}", r.name, r.storage).to_lowercase())
}

impl Pipeline for CreateS3Storage {
    type Stage = Stage;
    type Outputs = Outputs;

    fn target(&self) -> String {
        crate::cluster::target(self.name.as_str())
    }

    fn idempotency_key(&self) -> Option<&IdempotencyKey> {
        self.idempotency_key.as_ref()
    }

    /// Fills in the bucket and mount path (stored with the request, so a resumed run
    /// makes what the plan showed) and refuses what would collide.
    async fn preflight(mut self, cx: &Preflight<'_>) -> Result<Self, ApiError> {
        let cluster = self.name.as_str();
        let region = region_of(cx.store, cluster).await?;
        if self.bucket.is_none() {
            let name = default_bucket(&self, cx.aws).await?;
            self.bucket = Some(name.parse().map_err(|e: String| {
                ApiError::field(
                    "bucket",
                    format!("name one: the default {name} is not a bucket name ({e})"),
                )
            })?);
        }
        if self.mount_path.is_none() {
            self.mount_path = Some(
                self.mount()
                    .parse()
                    .map_err(|e: String| ApiError::field("mount_path", e))?,
            );
        }
        let bucket = bucket_name(&self)?.to_string();
        let client = kubernetes::connect(cx.aws, &region, cluster).await?;
        super::claimable(
            cx.aws,
            cx.store,
            &client,
            cluster,
            self.storage.as_str(),
            &self.mount(),
        )
        .await?;
        let volumes =
            kube::Api::<k8s_openapi::api::core::v1::PersistentVolume>::all(client.clone());
        if let Some(pv) = kubernetes::get(&volumes, &volume_name(&bucket)).await? {
            let by = pv
                .spec
                .and_then(|s| s.claim_ref)
                .and_then(|c| c.name)
                .unwrap_or_else(|| "another volume".into());
            return Err(ApiError::field(
                "bucket",
                format!("bucket {bucket} is already mounted in {cluster} as storage {by}"),
            ));
        }
        // What every storage of the cluster needs of the driver, checked as
        // check_storage does.
        let mut findings = super::check::Findings::default();
        super::check::driver(cx.aws, &region, cluster, &mut findings).await?;
        findings.refuse("name")?;
        // The default name is hypd's own: a bucket of that name without hypd's tags is
        // someone's, and hypd would take it over.
        if self.bucket.as_ref().map(|b| b.as_str())
            == Some(default_bucket(&self, cx.aws).await?.as_str())
        {
            // Read as the bucket stage will read it: there, and whether hypd's tags are on it.
            let found = Bucket {
                s3: cx.aws.s3(&region),
                name: bucket.clone(),
                region: region.clone(),
                cluster: cluster.to_owned(),
                want: Want::Present(()),
                hypd_files: Files::None,
                field: "bucket",
                adopt: false,
                harden: false,
            }
            .observe()
            .await?;
            if found.exists && !found.ours {
                return Err(ApiError::field(
                    "bucket",
                    format!(
                        "a bucket {bucket} exists without hypd's tags; name it in `bucket` to mount it as it is, or choose another storage name"
                    ),
                ));
            }
        }
        Ok(self)
    }

    async fn step(
        &self,
        cx: &Context,
        stage: Stage,
        out: &mut Outputs,
    ) -> Result<Progress, ApiError> {
        let cluster = self.name.as_str();
        let region = region_of(&cx.store, cluster).await?;
        let bucket = bucket_name(self)?.to_string();
        match stage {
            Stage::Bucket => {
                let made = converge(&Bucket {
                    s3: cx.aws.s3(&region),
                    name: bucket.clone(),
                    region: region.clone(),
                    cluster: cluster.to_owned(),
                    want: Want::Present(()),
                    hypd_files: Files::None,
                    field: "bucket",
                    // A name the user gave may be a bucket of theirs; the default is
                    // hypd's own.
                    adopt: bucket == default_bucket(self, &cx.aws).await?,
                    harden: true,
                })
                .await?;
                out.bucket_created |= made.created;
                out.bucket = Some(bucket);
                Ok(Progress::Done)
            }
            Stage::Access => {
                let role = super::driver_role(&cx.aws, &region, cluster)
                    .await?
                    .ok_or_else(|| missing("the Mountpoint driver's role"))?;
                let policy = s3_csi_inline_policy(&bucket);
                let access = super::driver_access(
                    &cx.aws,
                    &region,
                    cluster,
                    &role,
                    self.storage.as_str(),
                    Want::Present(policy),
                );
                let found = converge(&access).await?;
                out.access_note = (found.role_exists && !found.ours).then(|| {
                    format!(
                        "the Mountpoint driver's role {role} is not hypd's and was left as it is: it must allow s3:ListBucket on arn:aws:s3:::{bucket} and object reads and writes on arn:aws:s3:::{bucket}/*"
                    )
                });
                out.driver_role = Some(role);
                Ok(Progress::Done)
            }
            Stage::Volume => {
                let client = kubernetes::connect(&cx.aws, &region, cluster).await?;
                let (pv, pvc) =
                    volume(&bucket, &region, self.storage.as_str(), Some(&self.mount()));
                converge(&Applied::cluster(&client, pv)).await?;
                converge(&Applied::namespaced(&client, pvc)).await?;
                out.persistent_volume = Some(volume_name(&bucket));
                out.claim = Some(format!("{NAMESPACE}/{}", self.storage));
                Ok(Progress::Done)
            }
            Stage::Bound => {
                let (progress, phase) =
                    super::bound(&cx.aws, &region, cluster, self.storage.as_str()).await?;
                out.phase = phase;
                Ok(progress)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_filled_request_plans_the_same_mount() {
        let r: CreateS3Storage = serde_json::from_value(serde_json::json!({
            "name": "ml-1", "storage": "data", "bucket": "my-data",
            "mount_path": "/mnt/datasets"
        }))
        .unwrap();
        assert_eq!(r.mount(), "/mnt/datasets");
        let _: app::api::values::MountPath = r.mount().parse().unwrap();
    }
}
