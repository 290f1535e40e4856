//! A cluster's storage, read from the cluster itself: the PersistentVolumes and claims
//! hypd labelled as storage (`hypd/storage`), the pods that mount them, and the buckets
//! and file systems behind them. What the cluster has is what pods get, so hypd's store
//! keeps no second list that could disagree with it. `create_s3_storage`,
//! `create_fsx_storage` and `delete_storage` are the pipelines (`s3`, `fsx`, `delete`);
//! listing a bucket's contents and putting a small file in it are plain commands here.

pub mod check;
pub mod delete;
pub mod fsx;
pub mod s3;

use std::collections::BTreeMap;

use app::api::ApiError;
use app::api::plan::{Action, Change, Plan, StagePlan};
use app::api::storage::{
    ListStorage, ListStorageContents, StorageContents, StorageDetail, StorageList, StorageUser,
    StoredFile, UPLOAD_MAX_BYTES, UploadStorageFile, UploadedFile, path_in_pods,
};
use base64::Engine;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use kube::Api;
use kube::api::ListParams;
use serde_json::json;

use crate::auth::Actor;
use crate::aws::{Aws, SdkResultExt};
use crate::cluster::addons::S3_CSI_SERVICE_ACCOUNT;
use crate::cluster::managed::Managed;
use crate::cluster::storage::{CLAIM, MOUNT_ANNOTATION, MOUNT_PATH, NAMESPACE, STORAGE_LABEL};
use crate::resources::Want;
use crate::resources::eks::pod_identity::PodIdentity;
use crate::resources::iam::policy::InlinePolicy;
use crate::resources::kube as kubernetes;
use crate::resources::tags::K8S_MANAGED_BY;
use crate::service::{Handler, Service};
use crate::store::Store;

/// The Mountpoint for S3 driver's role on cluster `cluster`, as its pod identity
/// association names it (`None` when the driver has none).
pub(crate) async fn driver_role(
    aws: &Aws,
    region: &str,
    cluster: &str,
) -> Result<Option<String>, ApiError> {
    let (namespace, service_account) = S3_CSI_SERVICE_ACCOUNT;
    let found = crate::resources::Resource::observe(&PodIdentity {
        eks: aws.eks(region),
        cluster: cluster.to_owned(),
        namespace: namespace.to_owned(),
        service_account: service_account.to_owned(),
        want: Want::Absent,
    })
    .await?;
    // A role's name is the last part of its ARN's path.
    Ok(found
        .role_arn
        .map(|arn| arn.rsplit('/').next().unwrap_or(&arn).to_owned()))
}

/// The driver role's inline policy for the bucket of storage `storage`: what lets the
/// driver mount it (the role hypd makes allows the shared bucket only).
pub(crate) fn driver_access(
    aws: &Aws,
    region: &str,
    cluster: &str,
    role: &str,
    storage: &str,
    want: Want<serde_json::Value>,
) -> InlinePolicy {
    InlinePolicy {
        iam: aws.iam(region),
        cluster: cluster.to_owned(),
        role: role.to_owned(),
        name: format!("hypd-s3-csi-{storage}"),
        want,
    }
}

/// What asks for a cluster's storage: an active cluster, or an imported one.
const NEEDS: &str = "its storage is read and changed in an active or imported cluster";

/// The region of cluster `name`, which must be active or imported.
pub(crate) async fn region_of(store: &Store, name: &str) -> Result<String, ApiError> {
    let cluster = Managed::load(store, name).await?;
    cluster.in_status(&["active", "imported"], NEEDS)?;
    Ok(cluster.summary.region.clone())
}

/// One storage as the cluster has it.
#[derive(Clone, Debug)]
pub(crate) struct Found {
    pub claim: PersistentVolumeClaim,
    pub volume: Option<PersistentVolume>,
}

impl Found {
    pub fn name(&self) -> String {
        self.claim.metadata.name.clone().unwrap_or_default()
    }

    pub fn shared(&self) -> bool {
        self.claim.metadata.name.as_deref() == Some(CLAIM)
    }

    /// Made by hypd (an object someone else labelled is not hypd's to delete).
    pub fn ours(&self) -> bool {
        self.claim
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(K8S_MANAGED_BY.0))
            .is_some_and(|v| v == K8S_MANAGED_BY.1)
    }

    pub fn kind(&self) -> String {
        self.claim
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(STORAGE_LABEL).cloned())
            .unwrap_or_default()
    }

    pub fn bucket(&self) -> Option<String> {
        let csi = self.volume.as_ref()?.spec.as_ref()?.csi.as_ref()?;
        csi.volume_attributes.as_ref()?.get("bucketName").cloned()
    }

    /// An FSx storage's file system: its volume's handle.
    pub fn file_system(&self) -> Option<String> {
        let csi = self.volume.as_ref()?.spec.as_ref()?.csi.as_ref()?;
        (csi.driver == fsx::DRIVER).then(|| csi.volume_handle.clone())
    }

    pub fn volume_name(&self) -> Option<String> {
        self.claim.spec.as_ref()?.volume_name.clone()
    }

    /// Where pods mount it: recorded on the claim, `/s3` for the shared one.
    pub fn mount(&self) -> String {
        self.claim
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(MOUNT_ANNOTATION).cloned())
            .unwrap_or_else(|| MOUNT_PATH.to_owned())
    }

    pub fn phase(&self) -> String {
        self.claim
            .status
            .as_ref()
            .and_then(|s| s.phase.clone())
            .unwrap_or_else(|| "Pending".to_owned())
    }
}

/// Storage `name` of the cluster `client` reaches, if it has one hypd labelled.
pub(crate) async fn find(client: &kube::Client, name: &str) -> Result<Option<Found>, ApiError> {
    let claims = Api::<PersistentVolumeClaim>::namespaced(client.clone(), NAMESPACE);
    let Some(claim) = kubernetes::get(&claims, name).await? else {
        return Ok(None);
    };
    let labelled = claim
        .metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key(STORAGE_LABEL));
    if !labelled {
        return Ok(None);
    }
    let volume = match claim.spec.as_ref().and_then(|s| s.volume_name.as_deref()) {
        Some(v) => kubernetes::get(&Api::<PersistentVolume>::all(client.clone()), v).await?,
        None => None,
    };
    Ok(Some(Found { claim, volume }))
}

/// Refuses, by field, what would make a new storage `storage` mounted at `mount` collide
/// with what cluster `cluster` has: a storage or a claim (hypd's or not) of that name, or
/// a mount path one inside the other (pods that mount both would see only one).
pub(crate) async fn claimable(
    aws: &Aws,
    store: &Store,
    client: &kube::Client,
    cluster: &str,
    storage: &str,
    mount: &str,
) -> Result<(), ApiError> {
    if let Some(found) = find(client, storage).await? {
        let what = found
            .bucket()
            .map(|b| format!("bucket {b}"))
            .or_else(|| found.file_system().map(|f| format!("file system {f}")))
            .unwrap_or_else(|| "unknown".into());
        return Err(ApiError::field(
            "storage",
            format!("{cluster} already has storage {storage} ({what})"),
        ));
    }
    // A claim of that name that is not hypd's: applying over it would fail half-way.
    let claims = Api::<PersistentVolumeClaim>::namespaced(client.clone(), NAMESPACE);
    if kubernetes::get(&claims, storage).await?.is_some() {
        return Err(ApiError::field(
            "storage",
            format!(
                "{cluster} has a claim {NAMESPACE}/{storage} hypd did not make; choose another name"
            ),
        ));
    }
    let within =
        |inner: &str, outer: &str| inner == outer || inner.starts_with(&format!("{outer}/"));
    let listed = list(aws, store, cluster).await?;
    if let Some(other) = listed
        .iter()
        .find(|s| within(mount, &s.mount_path) || within(&s.mount_path, mount))
    {
        return Err(ApiError::field(
            "mount_path",
            format!(
                "storage {} is mounted at {}, which {mount} would overlap",
                other.name, other.mount_path
            ),
        ));
    }
    Ok(())
}

/// How often a claim that is not bound yet is looked at again.
const BIND_POLL: std::time::Duration = std::time::Duration::from_secs(2);

/// A creation's last stage: claim `storage` Bound to its volume. Its phase, when read.
pub(crate) async fn bound(
    aws: &Aws,
    region: &str,
    cluster: &str,
    storage: &str,
) -> Result<(crate::operation::pipeline::Progress, Option<String>), ApiError> {
    use crate::operation::pipeline::Progress;
    if crate::resources::is_planning() {
        return Ok((Progress::Done, None));
    }
    let client = kubernetes::connect(aws, region, cluster).await?;
    let phase = required(&client, storage).await?.phase();
    let progress = Progress::unless(
        BIND_POLL,
        (phase != "Bound").then(|| format!("claim {NAMESPACE}/{storage} is {phase}")),
    );
    Ok((progress, Some(phase)))
}

/// Storage `name`, or not found naming it.
pub(crate) async fn required(client: &kube::Client, name: &str) -> Result<Found, ApiError> {
    find(client, name).await?.ok_or_else(|| ApiError::NotFound {
        resource: "storage".into(),
        name: name.to_owned(),
    })
}

/// The pods not finished that mount a claim, by claim name: a claim can only be mounted
/// by pods of its own namespace.
pub(crate) async fn users(
    client: &kube::Client,
) -> Result<BTreeMap<String, Vec<StorageUser>>, ApiError> {
    let pods = Api::<Pod>::namespaced(client.clone(), NAMESPACE);
    let mut by_claim: BTreeMap<String, Vec<StorageUser>> = BTreeMap::new();
    kubernetes::each_listed(&pods, ListParams::default(), |pod| {
        let phase = pod
            .status
            .as_ref()
            .and_then(|s| s.phase.clone())
            .unwrap_or_else(|| "Pending".to_owned());
        if matches!(phase.as_str(), "Succeeded" | "Failed") {
            return;
        }
        let claims = pod
            .spec
            .as_ref()
            .and_then(|s| s.volumes.as_ref())
            .into_iter()
            .flatten()
            .filter_map(|v| {
                v.persistent_volume_claim
                    .as_ref()
                    .map(|c| c.claim_name.clone())
            });
        let owner = pod
            .metadata
            .owner_references
            .as_ref()
            .and_then(|o| o.first())
            .map(|o| format!("{}/{}", o.kind, o.name));
        for claim in claims {
            by_claim.entry(claim).or_default().push(StorageUser {
                namespace: NAMESPACE.to_owned(),
                pod: pod.metadata.name.clone().unwrap_or_default(),
                owner: owner.clone(),
                phase: phase.clone(),
            });
        }
    })
    .await?;
    Ok(by_claim)
}

/// Refuses, naming `storage`, while a pod mounts it.
pub(crate) fn unused(storage: &str, users: &[StorageUser]) -> Result<(), ApiError> {
    if users.is_empty() {
        return Ok(());
    }
    let named: Vec<String> = users
        .iter()
        .take(5)
        .map(|u| match &u.owner {
            Some(o) => format!("{}/{} ({o})", u.namespace, u.pod),
            None => format!("{}/{}", u.namespace, u.pod),
        })
        .collect();
    let more = users.len().saturating_sub(named.len());
    Err(ApiError::field(
        "storage",
        format!(
            "{storage} is mounted by {} pod(s): {}{}; stop what runs them first",
            users.len(),
            named.join(", "),
            if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            }
        ),
    ))
}

fn detail(found: &Found, users: &BTreeMap<String, Vec<StorageUser>>) -> StorageDetail {
    let name = found.name();
    StorageDetail {
        kind: found.kind(),
        shared: found.shared(),
        bucket: found.bucket(),
        file_system: found.file_system(),
        persistent_volume: found.volume_name(),
        namespace: NAMESPACE.to_owned(),
        capacity: found
            .claim
            .status
            .as_ref()
            .and_then(|s| s.capacity.as_ref())
            .and_then(|c| c.get("storage"))
            .map(|q| q.0.clone()),
        phase: found.phase(),
        mount_path: found.mount(),
        used_by: users.get(&name).cloned().unwrap_or_default(),
        name,
    }
}

/// Every storage of cluster `cluster`, the shared bucket first, then by name.
pub(crate) async fn list(
    aws: &Aws,
    store: &Store,
    cluster: &str,
) -> Result<Vec<StorageDetail>, ApiError> {
    let region = region_of(store, cluster).await?;
    let client = kubernetes::connect(aws, &region, cluster).await?;
    let claims = Api::<PersistentVolumeClaim>::namespaced(client.clone(), NAMESPACE);
    let volumes = Api::<PersistentVolume>::all(client.clone());
    let mut found_claims = Vec::new();
    kubernetes::each_listed(&claims, ListParams::default().labels(STORAGE_LABEL), |c| {
        found_claims.push(c)
    })
    .await?;
    let mut by_name = BTreeMap::new();
    kubernetes::each_listed(&volumes, ListParams::default().labels(STORAGE_LABEL), |v| {
        if let Some(n) = v.metadata.name.clone() {
            by_name.insert(n, v);
        }
    })
    .await?;
    let users = users(&client).await?;
    let mut storage: Vec<StorageDetail> = found_claims
        .into_iter()
        .map(|claim| {
            let volume = claim
                .spec
                .as_ref()
                .and_then(|s| s.volume_name.as_ref())
                .and_then(|v| by_name.get(v).cloned());
            detail(&Found { claim, volume }, &users)
        })
        .collect();
    storage.sort_by(|a, b| (!a.shared, &a.name).cmp(&(!b.shared, &b.name)));
    Ok(storage)
}

impl Handler<ListStorage> for Service {
    async fn handle(&self, _: &Actor, r: ListStorage) -> Result<StorageList, ApiError> {
        let fetched_at = crate::clock::now();
        let storage = list(&self.aws, &self.store, r.name.as_str()).await?;
        Ok(StorageList {
            name: r.name.to_string(),
            storage,
            fetched_at,
        })
    }
}

/// A bucket-backed storage of cluster `cluster`: its bucket and mount path.
pub(crate) async fn bucket_of(
    aws: &Aws,
    store: &Store,
    cluster: &str,
    storage: &str,
) -> Result<(String, String, String), ApiError> {
    let region = region_of(store, cluster).await?;
    let client = kubernetes::connect(aws, &region, cluster).await?;
    let found = required(&client, storage).await?;
    let bucket = found.bucket().ok_or_else(|| {
        ApiError::field(
            "storage",
            match found.file_system() {
                Some(fs) => format!(
                    "{storage} is Lustre file system {fs}, whose files only pods read: browse the bucket a data repository links it to"
                ),
                None => format!(
                    "{storage} is not backed by a bucket hypd can read (its volume names none)"
                ),
            },
        )
    })?;
    Ok((region, bucket, found.mount()))
}

impl Handler<ListStorageContents> for Service {
    async fn handle(&self, _: &Actor, r: ListStorageContents) -> Result<StorageContents, ApiError> {
        let (region, bucket, mount) =
            bucket_of(&self.aws, &self.store, r.name.as_str(), r.storage.as_str()).await?;
        // A folder is listed by its key prefix with the trailing slash.
        let prefix = match r.prefix.trim_end_matches('/') {
            "" => String::new(),
            p => format!("{p}/"),
        };
        let page = self
            .aws
            .s3(&region)
            .list_objects_v2()
            .bucket(&bucket)
            .prefix(&prefix)
            .delimiter("/")
            .max_keys(r.limit.unwrap_or(200) as i32)
            .set_continuation_token(r.page_token.clone())
            .send()
            .await
            .upstream("s3", "ListObjectsV2")?;
        let folders = page
            .common_prefixes()
            .iter()
            .filter_map(|p| p.prefix().map(str::to_owned))
            .collect();
        let files = page
            .contents()
            .iter()
            .filter_map(|o| {
                let key = o.key()?;
                // The empty object some tools write to make a folder shows as the folder.
                (key != prefix).then(|| StoredFile {
                    key: key.to_owned(),
                    size_bytes: o.size().unwrap_or(0).max(0) as u64,
                    last_modified: o
                        .last_modified()
                        .and_then(|t| std::time::SystemTime::try_from(*t).ok())
                        .map(crate::clock::format_time),
                    path_in_pods: path_in_pods(&mount, key),
                })
            })
            .collect();
        Ok(StorageContents {
            storage: r.storage.to_string(),
            mount_path: path_in_pods(&mount, prefix.trim_end_matches('/')),
            bucket,
            prefix,
            folders,
            files,
            next_page_token: page.next_continuation_token().map(str::to_owned),
        })
    }
}

/// An upload checked against what is there: the bytes, and the size of the file it
/// would replace.
struct Upload {
    bucket: String,
    region: String,
    mount: String,
    bytes: Vec<u8>,
    replaces: Option<u64>,
}

async fn checked_upload(svc: &Service, r: &UploadStorageFile) -> Result<Upload, ApiError> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(r.content_base64.as_bytes())
        .map_err(|e| ApiError::field("content_base64", format!("not base64: {e}")))?;
    if bytes.len() > UPLOAD_MAX_BYTES {
        return Err(ApiError::field(
            "content_base64",
            format!(
                "{} bytes; at most {} KiB, copy larger files with `aws s3 cp`",
                bytes.len(),
                UPLOAD_MAX_BYTES / 1024
            ),
        ));
    }
    let (region, bucket, mount) =
        bucket_of(&svc.aws, &svc.store, r.name.as_str(), r.storage.as_str()).await?;
    let existing = svc
        .aws
        .s3(&region)
        .head_object()
        .bucket(&bucket)
        .key(&r.key)
        .send()
        .await
        .found("s3", "HeadObject")?;
    let replaces = existing.map(|o| o.content_length().unwrap_or(0).max(0) as u64);
    if let Some(size) = replaces
        && !r.replace
    {
        return Err(ApiError::field(
            "key",
            format!(
                "{} ({size} bytes) is already there; send replace: true to write over it",
                path_in_pods(&mount, &r.key)
            ),
        ));
    }
    Ok(Upload {
        bucket,
        region,
        mount,
        bytes,
        replaces,
    })
}

impl Handler<UploadStorageFile> for Service {
    async fn handle(
        &self,
        _: &Actor,
        r: UploadStorageFile,
    ) -> Result<app::api::plan::Gated<UploadedFile>, ApiError> {
        let u = checked_upload(self, &r).await?;
        let size = u.bytes.len() as u64;
        self.aws
            .s3(&u.region)
            .put_object()
            .bucket(&u.bucket)
            .key(&r.key)
            .body(u.bytes.into())
            .send()
            .await
            .upstream("s3", "PutObject")?;
        Ok(UploadedFile {
            storage: r.storage.to_string(),
            path_in_pods: path_in_pods(&u.mount, &r.key),
            bucket: u.bucket,
            key: r.key,
            size_bytes: size,
            replaced: u.replaces.is_some(),
        }
        .into())
    }

    async fn preview(&self, _: &Actor, r: UploadStorageFile) -> Result<Plan, ApiError> {
        let u = checked_upload(self, &r).await?;
        let action = if u.replaces.is_some() {
            Action::Update
        } else {
            Action::Create
        };
        let change = Change::new(action, "s3:Object", format!("{}/{}", u.bucket, r.key)).field(
            "size_bytes",
            u.replaces.map(|s| json!(s)),
            Some(json!(u.bytes.len())),
        );
        Ok(Plan {
            command: "upload_storage_file".to_owned(),
            target: crate::cluster::target(r.name.as_str()),
            stages: vec![StagePlan {
                stage: "upload".to_owned(),
                title: format!("Put the file at {}", path_in_pods(&u.mount, &r.key)),
                changes: vec![change],
            }],
        })
    }
}
