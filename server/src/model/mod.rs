//! Models in a cluster's storage: `list_models` reads the manifests downloads wrote
//! (`models/<org>/<name>/.hypd-model.json`), and `download` is the `download_model`
//! pipeline. The bucket is read, not hypd's store: a model copied in by hand shows up
//! too (without a manifest, as incomplete).

pub mod download;
pub mod token;

use app::api::ApiError;
use app::api::models::{ListModels, MANIFEST, MODELS_PREFIX, Manifest, ModelEntry, ModelList};
use app::api::storage::{SHARED_CLAIM, path_in_pods};

use crate::auth::Actor;
use crate::aws::SdkResultExt;
use crate::service::{Handler, Service};
use crate::storage::bucket_of;

/// The manifest under `prefix` of `bucket`, if a finished download wrote one.
pub(crate) async fn manifest(
    s3: &aws_sdk_s3::Client,
    bucket: &str,
    prefix: &str,
) -> Result<Option<Manifest>, ApiError> {
    let key = format!("{prefix}/{MANIFEST}");
    let Some(object) = s3
        .get_object()
        .bucket(bucket)
        .key(&key)
        .send()
        .await
        .found("s3", "GetObject")?
    else {
        return Ok(None);
    };
    let bytes = object
        .body
        .collect()
        .await
        .map_err(|e| ApiError::internal(format!("reading s3://{bucket}/{key}: {e}")))?
        .into_bytes();
    serde_json::from_slice(&bytes).map(Some).map_err(|e| {
        ApiError::internal(format!(
            "s3://{bucket}/{key} is not a manifest hypd wrote: {e}"
        ))
    })
}

/// The folders directly under `prefix/` of `bucket` (one page: up to 1,000).
async fn folders(
    s3: &aws_sdk_s3::Client,
    bucket: &str,
    prefix: &str,
) -> Result<Vec<String>, ApiError> {
    let page = s3
        .list_objects_v2()
        .bucket(bucket)
        .prefix(format!("{prefix}/"))
        .delimiter("/")
        .send()
        .await
        .upstream("s3", "ListObjectsV2")?;
    Ok(page
        .common_prefixes()
        .iter()
        .filter_map(|p| p.prefix().map(|p| p.trim_end_matches('/').to_owned()))
        .collect())
}

impl Handler<ListModels> for Service {
    async fn handle(&self, _: &Actor, r: ListModels) -> Result<ModelList, ApiError> {
        let fetched_at = crate::clock::now();
        let storage = r
            .storage
            .as_ref()
            .map_or(SHARED_CLAIM, |s| s.as_str())
            .to_owned();
        let (region, bucket, mount) =
            bucket_of(&self.aws, &self.store, r.name.as_str(), &storage).await?;
        let s3 = self.aws.s3(&region);
        let mut models = Vec::new();
        for org in folders(&s3, &bucket, MODELS_PREFIX).await? {
            for prefix in folders(&s3, &bucket, &org).await? {
                let model = prefix
                    .strip_prefix(&format!("{MODELS_PREFIX}/"))
                    .unwrap_or(&prefix)
                    .to_owned();
                let found = manifest(&s3, &bucket, &prefix).await?;
                models.push(ModelEntry {
                    path_in_pods: path_in_pods(&mount, &prefix),
                    complete: found.is_some(),
                    revision: found.as_ref().map(|m| m.revision.clone()),
                    commit: found.as_ref().map(|m| m.commit.clone()),
                    files: found.as_ref().map(|m| m.files.len() as u32),
                    size_bytes: found.as_ref().map(|m| m.size_bytes),
                    downloaded_at: found.map(|m| m.downloaded_at),
                    model,
                });
            }
        }
        Ok(ModelList {
            name: r.name.to_string(),
            storage,
            models,
            fetched_at,
        })
    }
}
