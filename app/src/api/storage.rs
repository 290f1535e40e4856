//! A cluster's storage: the buckets (and, later, file systems) hypd mounts in it as
//! PersistentVolumes with claims, what is in them, and small files put into them. One
//! rule holds every path together: what is at `s3://<bucket>/<key>` is at
//! `<mount path>/<key>` in every pod that mounts the storage (`/s3/<key>` for the
//! cluster's shared bucket), so the browser and the jobs name the same file alike.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::command::{Command, CommandSpec, Effect, HttpMethod, Role};
use super::error::{ApiError, Problems};
use super::operations::OperationRef;
use super::plan::Gated;
use super::values::{
    BucketName, ClusterName, Confirmation, EksClusterName, IdempotencyKey, MountPath, StorageName,
};

/// The shared bucket's claim, made with the cluster and mounted at [`SHARED_MOUNT`].
pub const SHARED_CLAIM: &str = "shared-s3";
pub const SHARED_MOUNT: &str = "/s3";
/// The largest file `upload_storage_file` takes (a request body is at most 1 MiB, and
/// base64 is 4/3 of its bytes): scripts, configs, a small dataset.
pub const UPLOAD_MAX_BYTES: usize = 512 * 1024;
/// The most entries one page of `list_storage_contents` holds.
pub const CONTENTS_PAGE_MAX: u32 = 1000;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListStorage {
    /// The cluster.
    pub name: EksClusterName,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct StorageList {
    pub name: String,
    pub storage: Vec<StorageDetail>,
    /// When the cluster was asked (RFC 3339, UTC).
    pub fetched_at: String,
}

/// One storage as the cluster has it now.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct StorageDetail {
    /// The claim's name, which the storage commands take.
    pub name: String,
    /// `s3` (Mountpoint for S3) or `fsx` (FSx for Lustre).
    pub kind: String,
    /// The cluster's shared bucket (made and deleted with the cluster).
    pub shared: bool,
    pub bucket: Option<String>,
    /// An FSx storage's file system (`fs-…`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file_system: Option<String>,
    pub persistent_volume: Option<String>,
    pub namespace: String,
    pub capacity: Option<String>,
    /// The claim's phase: `Pending`, `Bound`, `Lost`.
    pub phase: String,
    /// Where pods mount it.
    pub mount_path: String,
    /// Pods not finished that mount it, with what runs them.
    pub used_by: Vec<StorageUser>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct StorageUser {
    pub namespace: String,
    pub pod: String,
    /// e.g. `Job/llama-sft`, `ReplicaSet/vllm-7d9f`.
    pub owner: Option<String>,
    pub phase: String,
}

impl Command for ListStorage {
    type Output = StorageList;
    const SPEC: CommandSpec = CommandSpec {
        name: "list_storage",
        summary: "List the storage hypd mounts in a cluster",
        description: "A cluster's storage (the shared bucket, and any create_s3_storage or create_fsx_storage added) and where pods mount it: s3://bucket/key is at <mount path>/key.",
        effect: Effect::ReadOnly,
        role: Role::Viewer,
        idempotent: true,
        status_command: None,
        method: HttpMethod::Get,
        path: "/api/v1/clusters/{name}/storage",
    };
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateS3Storage {
    /// The cluster.
    pub name: ClusterName,
    pub storage: StorageName,
    // An existing bucket is used as it is and never deleted; omitted, hypd creates
    // `<cluster>-<storage>-<account>` (tagged, public access blocked, encrypted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bucket: Option<BucketName>,
    // Default /mnt/<storage>.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mount_path: Option<MountPath>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<IdempotencyKey>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dry_run: bool,
}

impl CreateS3Storage {
    /// Where pods mount it: the path asked for, or `/mnt/<storage>`.
    pub fn mount(&self) -> String {
        default_mount(self.mount_path.as_ref(), &self.storage)
    }
}

/// The path asked for, or `/mnt/<storage>`.
fn default_mount(asked: Option<&MountPath>, storage: &StorageName) -> String {
    asked.map_or_else(|| format!("/mnt/{storage}"), |m| m.to_string())
}

impl Command for CreateS3Storage {
    type Output = Gated<OperationRef>;
    const SPEC: CommandSpec = CommandSpec {
        name: "create_s3_storage",
        summary: "Mount another S3 bucket in a cluster",
        description: "Adds an S3 bucket as storage mounted in pods: a named bucket (never deleted) or a new private one. Returns an operation for wait_operation; dry_run returns the plan.",
        effect: Effect::Mutating,
        role: Role::Operator,
        idempotent: true,
        status_command: Some("get_operation"),
        method: HttpMethod::Post,
        path: "/api/v1/clusters/{name}/storage",
    };

    super::command::dry_run_request!();

    fn validate(&self) -> Result<(), ApiError> {
        if self.storage.as_str() == SHARED_CLAIM {
            return Err(ApiError::field(
                "storage",
                format!("{SHARED_CLAIM} is the cluster's shared bucket; choose another name"),
            ));
        }
        Ok(())
    }
}

/// An FSx for Lustre deployment type hypd makes: the two current ones (the older
/// `SCRATCH_1` and `PERSISTENT_1` are not offered).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum LustreDeployment {
    /// Temporary storage, no replication: for scratch data of one run.
    #[serde(rename = "scratch_2")]
    Scratch2,
    /// Replicated within its Availability Zone, with a chosen throughput per TiB.
    #[default]
    #[serde(rename = "persistent_2")]
    Persistent2,
}

impl LustreDeployment {
    /// As the FSx API names it.
    pub fn as_aws(self) -> &'static str {
        match self {
            LustreDeployment::Scratch2 => "SCRATCH_2",
            LustreDeployment::Persistent2 => "PERSISTENT_2",
        }
    }
}

/// PERSISTENT_2's throughputs, MB/s per TiB of storage.
pub const PERSISTENT_2_THROUGHPUTS: [u32; 4] = [125, 250, 500, 1000];
/// The most data repository associations one file system has.
pub const MAX_DATA_REPOSITORIES: usize = 8;

/// A directory of the file system linked to a bucket (a data repository association):
/// objects appear as files there, and files written there go back to the bucket.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DataRepository {
    /// The directory in the file system, e.g. `/datasets` (pods see it under the mount
    /// path).
    pub file_system_path: String,
    // Default: the cluster's shared bucket.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bucket: Option<BucketName>,
    /// A prefix in the bucket (default: all of it), e.g. `datasets/`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub prefix: String,
}

impl DataRepository {
    /// The `s3://` path it links, once the bucket is known.
    pub fn s3_path(&self, bucket: &str) -> String {
        let prefix = self.prefix.trim_matches('/');
        if prefix.is_empty() {
            format!("s3://{bucket}/")
        } else {
            format!("s3://{bucket}/{prefix}/")
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateFsxStorage {
    /// The cluster.
    pub name: ClusterName,
    pub storage: StorageName,
    #[serde(default)]
    pub deployment_type: LustreDeployment,
    /// GiB: 1200, 2400, or a multiple of 2400.
    #[serde(default = "default_capacity")]
    pub capacity_gib: u32,
    // MB/s per TiB, persistent_2 only: 125, 250, 500 or 1000 (default 250).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub throughput_per_tib: Option<u32>,
    /// Elastic Fabric Adapter between the file system and EFA nodes (persistent_2 only).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub efa: bool,
    /// Directories linked to buckets (at most 8, none inside another).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub data_repositories: Vec<DataRepository>,
    // Default /mnt/<storage>.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mount_path: Option<MountPath>,
    // Default: the cluster's compute subnet (where its HyperPod nodes are).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subnet_id: Option<String>,
    // Filled in: the cluster's security group, which its nodes have.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub security_group_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<IdempotencyKey>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dry_run: bool,
}

fn default_capacity() -> u32 {
    1200
}

impl CreateFsxStorage {
    /// Where pods mount it: the path asked for, or `/mnt/<storage>`.
    pub fn mount(&self) -> String {
        default_mount(self.mount_path.as_ref(), &self.storage)
    }

    /// MB/s per TiB as the file system gets it (none for scratch).
    pub fn throughput(&self) -> Option<u32> {
        match self.deployment_type {
            LustreDeployment::Persistent2 => Some(self.throughput_per_tib.unwrap_or(250)),
            LustreDeployment::Scratch2 => None,
        }
    }
}

/// The network interfaces (so addresses of its subnet) an FSx for Lustre file system of
/// `capacity_gib` takes: one for its metadata server and one per 2.4 TiB of storage
/// servers. AWS publishes no formula; this is hypd's estimate (the sim uses the same), and
/// it errs high, which only refuses a subnet that is nearly full.
pub fn lustre_addresses(capacity_gib: u32) -> u32 {
    1 + capacity_gib.div_ceil(2400)
}

/// A file system path's problems: absolute, parts neither empty nor `.`/`..`, no
/// trailing `/` (but `/` itself), at most 4,096 bytes.
fn file_system_path_problems(field: &str, path: &str, errors: &mut Problems) {
    let parts: Vec<&str> = path.split('/').skip(1).collect();
    if !path.starts_with('/') {
        errors.add(
            field,
            "must be an absolute path in the file system, e.g. /datasets",
        );
    } else if path != "/"
        && parts
            .iter()
            .any(|p| p.is_empty() || *p == "." || *p == ".." || p.chars().any(char::is_control))
    {
        errors.add(
            field,
            "parts between / must be names (not empty, . or ..), with no trailing /",
        );
    } else if path.len() > 4096 {
        errors.add(field, "must be at most 4096 bytes");
    }
}

/// `inner` is `outer` or a directory inside it.
fn nested(inner: &str, outer: &str) -> bool {
    inner == outer || outer == "/" || inner.starts_with(&format!("{outer}/"))
}

impl Command for CreateFsxStorage {
    type Output = Gated<OperationRef>;
    const SPEC: CommandSpec = CommandSpec {
        name: "create_fsx_storage",
        summary: "Create an FSx for Lustre file system and mount it in a cluster",
        description: "Creates an FSx for Lustre file system, optionally linked to buckets, mounted in pods. Ask the user the deployment type and capacity. Returns an operation for wait_operation; dry_run returns the plan.",
        effect: Effect::Mutating,
        role: Role::Operator,
        idempotent: true,
        status_command: Some("get_operation"),
        method: HttpMethod::Post,
        path: "/api/v1/clusters/{name}/file-systems",
    };

    super::command::dry_run_request!();

    fn validate(&self) -> Result<(), ApiError> {
        let mut errors = Problems::default();
        if self.storage.as_str() == SHARED_CLAIM {
            errors.add(
                "storage",
                format!("{SHARED_CLAIM} is the cluster's shared bucket; choose another name"),
            );
        }
        let c = self.capacity_gib;
        if !(c == 1200 || c == 2400 || (c > 0 && c.is_multiple_of(2400))) {
            errors.add(
                "capacity_gib",
                format!(
                    "{} takes 1200, 2400 or a multiple of 2400 GiB, not {c}",
                    self.deployment_type.as_aws()
                ),
            );
        }
        match (self.deployment_type, self.throughput_per_tib) {
            (LustreDeployment::Persistent2, Some(t)) if !PERSISTENT_2_THROUGHPUTS.contains(&t) => {
                errors.add(
                    "throughput_per_tib",
                    format!("PERSISTENT_2 takes 125, 250, 500 or 1000 MB/s per TiB, not {t}"),
                )
            }
            (LustreDeployment::Scratch2, Some(_)) => errors.add(
                "throughput_per_tib",
                "applies to persistent_2 only: SCRATCH_2's throughput is fixed (200 MB/s per TiB)",
            ),
            _ => {}
        }
        if self.efa && self.deployment_type != LustreDeployment::Persistent2 {
            errors.add("efa", "EFA is supported on persistent_2 file systems only");
        }
        if self.data_repositories.len() > MAX_DATA_REPOSITORIES {
            errors.add(
                "data_repositories",
                format!(
                    "a file system has at most {MAX_DATA_REPOSITORIES} data repository associations, not {}",
                    self.data_repositories.len()
                ),
            );
        }
        for (i, r) in self.data_repositories.iter().enumerate() {
            let field = format!("data_repositories[{i}].file_system_path");
            file_system_path_problems(&field, &r.file_system_path, &mut errors);
            if let Some(j) = self.data_repositories[..i].iter().position(|o| {
                nested(&r.file_system_path, &o.file_system_path)
                    || nested(&o.file_system_path, &r.file_system_path)
            }) {
                errors.add(
                    field,
                    format!(
                        "one association per directory, none inside another: {} overlaps data_repositories[{j}] ({})",
                        r.file_system_path, self.data_repositories[j].file_system_path
                    ),
                );
            }
            if r.prefix.split('/').any(|p| p == "." || p == "..") || r.prefix.starts_with('/') {
                errors.add(
                    format!("data_repositories[{i}].prefix"),
                    "must be a key prefix in the bucket (no leading /, no . or .. parts)",
                );
            }
        }
        errors.into_result()
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeleteStorage {
    /// The cluster.
    pub name: ClusterName,
    pub storage: StorageName,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<IdempotencyKey>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dry_run: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confirmation: Option<Confirmation>,
}

impl Command for DeleteStorage {
    type Output = Gated<OperationRef>;
    const SPEC: CommandSpec = CommandSpec {
        name: "delete_storage",
        summary: "Unmount a storage from a cluster",
        description: "Deletes a storage, refused while a pod mounts it; its bucket only if hypd made it and it is empty, an FSx file system with its files. The first call returns the plan and a confirmation; call again with it once the user agrees. Returns an operation for wait_operation.",
        effect: Effect::Destructive,
        role: Role::Operator,
        idempotent: true,
        status_command: Some("get_operation"),
        method: HttpMethod::Delete,
        path: "/api/v1/clusters/{name}/storage/{storage}",
    };

    super::command::gated_request!();

    fn validate(&self) -> Result<(), ApiError> {
        if self.storage.as_str() == SHARED_CLAIM {
            return Err(ApiError::field(
                "storage",
                format!(
                    "{SHARED_CLAIM} is the cluster's shared bucket: it goes with delete_cluster"
                ),
            ));
        }
        Ok(())
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListStorageContents {
    /// The cluster.
    pub name: EksClusterName,
    pub storage: StorageName,
    // A folder, e.g. `data/` (default: the top).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub prefix: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub page_token: Option<String>,
    // 1-1000, default 200.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct StorageContents {
    pub storage: String,
    pub bucket: String,
    pub prefix: String,
    /// Where `prefix` is in pods.
    pub mount_path: String,
    /// Folders directly under `prefix`, each ending in `/`.
    pub folders: Vec<String>,
    pub files: Vec<StoredFile>,
    /// Send it back as `page_token` for the next page.
    pub next_page_token: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct StoredFile {
    pub key: String,
    pub size_bytes: u64,
    pub last_modified: Option<String>,
    /// The file's path in pods.
    pub path_in_pods: String,
}

impl Command for ListStorageContents {
    type Output = StorageContents;
    const SPEC: CommandSpec = CommandSpec {
        name: "list_storage_contents",
        summary: "List the folders and files of a bucket-backed storage",
        description: "Folders and files directly under a prefix of a storage's bucket, with their paths in pods.",
        effect: Effect::ReadOnly,
        role: Role::Viewer,
        idempotent: true,
        status_command: None,
        method: HttpMethod::Get,
        path: "/api/v1/clusters/{name}/storage/{storage}/contents",
    };

    fn validate(&self) -> Result<(), ApiError> {
        let mut errors = Problems::default();
        if !self.prefix.is_empty() {
            key_problems("prefix", self.prefix.trim_end_matches('/'), &mut errors);
        }
        if let Some(l) = self.limit
            && !(1..=CONTENTS_PAGE_MAX).contains(&l)
        {
            errors.add(
                "limit",
                format!("a page holds 1-{CONTENTS_PAGE_MAX} entries"),
            );
        }
        if self.page_token.as_ref().is_some_and(|t| t.len() > 2048) {
            errors.add(
                "page_token",
                "a page token is the next_page_token an earlier page returned",
            );
        }
        errors.into_result()
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct UploadStorageFile {
    /// The cluster.
    pub name: ClusterName,
    pub storage: StorageName,
    // The file's key, e.g. `scripts/train.py` (at <mount path>/scripts/train.py in pods).
    pub key: String,
    // The file's bytes, base64 (at most 512 KiB once decoded).
    pub content_base64: String,
    // Write over a file already at `key` (default: refused).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub replace: bool,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dry_run: bool,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct UploadedFile {
    pub storage: String,
    pub bucket: String,
    pub key: String,
    pub size_bytes: u64,
    pub path_in_pods: String,
    /// A file was at `key` before and is now replaced.
    pub replaced: bool,
}

impl Command for UploadStorageFile {
    type Output = Gated<UploadedFile>;
    const SPEC: CommandSpec = CommandSpec {
        name: "upload_storage_file",
        summary: "Put a small file (script, config, dataset) into a storage's bucket",
        description: "Writes a small file to a storage's bucket, seen at <mount path>/<key> in pods. dry_run returns the plan.",
        effect: Effect::Mutating,
        role: Role::Operator,
        idempotent: true,
        status_command: Some("list_storage_contents"),
        method: HttpMethod::Post,
        path: "/api/v1/clusters/{name}/storage/{storage}/files",
    };

    super::command::dry_run_request!();

    fn validate(&self) -> Result<(), ApiError> {
        let mut errors = Problems::default();
        key_problems("key", &self.key, &mut errors);
        // Base64 of the largest file, padded.
        if self.content_base64.len() > UPLOAD_MAX_BYTES.div_ceil(3) * 4 {
            errors.add(
                "content_base64",
                format!(
                    "at most {} KiB once decoded; copy larger files with `aws s3 cp`",
                    UPLOAD_MAX_BYTES / 1024
                ),
            );
        }
        errors.into_result()
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CheckStorage {
    /// The cluster.
    pub name: EksClusterName,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct StorageCheck {
    pub name: String,
    /// What was checked, for each storage and the driver.
    pub checked: Vec<String>,
    /// Empty: every storage can be mounted.
    pub findings: Vec<StorageFinding>,
    pub fetched_at: String,
}

/// One thing that would keep pods from mounting a storage.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct StorageFinding {
    /// None: the cluster's driver, not one storage.
    pub storage: Option<String>,
    /// e.g. `claim_bound`, `driver_access`.
    pub check: String,
    /// `error` (pods will hang) or `warning` (hypd could not confirm).
    pub severity: String,
    pub message: String,
    /// The command that would fix it.
    pub fix: Option<String>,
}

impl Command for CheckStorage {
    type Output = StorageCheck;
    const SPEC: CommandSpec = CommandSpec {
        name: "check_storage",
        summary: "Check that pods can mount a cluster's storage",
        description: "Diagnoses why pods hang in ContainerCreating on a storage; each finding names the command that fixes it.",
        effect: Effect::ReadOnly,
        role: Role::Viewer,
        idempotent: true,
        status_command: None,
        method: HttpMethod::Get,
        path: "/api/v1/clusters/{name}/storage-check",
    };
}

/// Where `key` of a storage mounted at `mount` is in pods.
pub fn path_in_pods(mount: &str, key: &str) -> String {
    if key.is_empty() {
        mount.to_owned()
    } else {
        format!("{mount}/{key}")
    }
}

/// A key must be a path inside the mount: parts separated by `/`, none empty, `.` or
/// `..` (Mountpoint could not show them as files), no control characters, at most S3's
/// 1,024 bytes.
fn key_problems(field: &str, key: &str, errors: &mut Problems) {
    let parts_ok = key
        .split('/')
        .all(|p| !p.is_empty() && p != "." && p != "..");
    let chars_ok = !key.chars().any(char::is_control);
    if key.is_empty() || key.len() > 1024 || !parts_ok || !chars_ok {
        errors.add(
            field,
            "a path inside the storage, e.g. scripts/train.py: 1-1024 bytes, parts separated by '/', none empty, '.' or '..', no leading '/', no control characters",
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field_of(r: Result<(), ApiError>) -> String {
        match r {
            Err(ApiError::Validation { errors }) => errors[0].field.clone(),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn keys_are_paths_inside_the_mount() {
        let upload = |key: &str| UploadStorageFile {
            name: "ml-1".parse().unwrap(),
            storage: "data".parse().unwrap(),
            key: key.to_owned(),
            content_base64: "aGk=".to_owned(),
            replace: false,
            dry_run: false,
        };
        assert!(upload("scripts/train.py").validate().is_ok());
        for bad in ["", "/etc/passwd", "a//b", "a/../b", "a/", "./a", "a\nb"] {
            assert_eq!(field_of(upload(bad).validate()), "key", "{bad:?}");
        }
        let mut big = upload("x");
        big.content_base64 = "A".repeat(UPLOAD_MAX_BYTES / 3 * 4 + 8);
        assert_eq!(field_of(big.validate()), "content_base64");
        assert_eq!(path_in_pods("/s3", "data/x.jsonl"), "/s3/data/x.jsonl");
    }

    #[test]
    fn the_shared_bucket_is_not_created_or_deleted_here() {
        let create: CreateS3Storage =
            serde_json::from_value(serde_json::json!({"name": "ml-1", "storage": "shared-s3"}))
                .unwrap();
        assert_eq!(field_of(create.validate()), "storage");
        let other: CreateS3Storage =
            serde_json::from_value(serde_json::json!({"name": "ml-1", "storage": "data"})).unwrap();
        assert_eq!(other.mount(), "/mnt/data");
        for bad in ["/s3", "/s3/x", "/etc", "relative", "/mnt/../etc", "/mnt/"] {
            assert!(bad.parse::<MountPath>().is_err(), "{bad}");
        }
        assert!("/mnt/data".parse::<MountPath>().is_ok());
        assert!("/s3data".parse::<MountPath>().is_ok());
    }

    #[test]
    fn lustre_sizes_and_links_are_checked_as_fsx_checks_them() {
        let fsx = |extra: serde_json::Value| -> CreateFsxStorage {
            let mut v = serde_json::json!({"name": "ml-1", "storage": "fast"});
            v.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            serde_json::from_value(v).unwrap()
        };
        for ok in [1200, 2400, 4800, 9600] {
            assert!(
                fsx(serde_json::json!({"capacity_gib": ok}))
                    .validate()
                    .is_ok(),
                "{ok}"
            );
        }
        for bad in [0, 1000, 3600, 6000] {
            let r = fsx(serde_json::json!({"capacity_gib": bad}));
            assert_eq!(field_of(r.validate()), "capacity_gib", "{bad}");
        }
        for t in PERSISTENT_2_THROUGHPUTS {
            assert!(
                fsx(serde_json::json!({"throughput_per_tib": t}))
                    .validate()
                    .is_ok()
            );
        }
        let odd = fsx(serde_json::json!({"throughput_per_tib": 200}));
        assert_eq!(field_of(odd.validate()), "throughput_per_tib");
        let scratch = fsx(serde_json::json!({"deployment_type": "scratch_2", "efa": true}));
        assert_eq!(field_of(scratch.validate()), "efa");
        assert_eq!(scratch.throughput(), None);
        let nested = fsx(serde_json::json!({"data_repositories": [
            {"file_system_path": "/data"}, {"file_system_path": "/data/sub"}]}));
        assert_eq!(
            field_of(nested.validate()),
            "data_repositories[1].file_system_path"
        );
        let root = fsx(serde_json::json!({"data_repositories": [
            {"file_system_path": "/"}, {"file_system_path": "/x"}]}));
        assert!(root.validate().is_err());
        let nine: Vec<serde_json::Value> = (0..9)
            .map(|i| serde_json::json!({"file_system_path": format!("/d{i}")}))
            .collect();
        let many = fsx(serde_json::json!({ "data_repositories": nine }));
        assert_eq!(field_of(many.validate()), "data_repositories");
        for bad in ["data", "/a/", "/a//b", "/a/../b"] {
            let r = fsx(serde_json::json!({"data_repositories": [{"file_system_path": bad}]}));
            assert_eq!(
                field_of(r.validate()),
                "data_repositories[0].file_system_path",
                "{bad}"
            );
        }
        assert_eq!(lustre_addresses(1200), 2);
        assert_eq!(lustre_addresses(4800), 3);
        let link = DataRepository {
            file_system_path: "/d".into(),
            bucket: None,
            prefix: "datasets/".into(),
        };
        assert_eq!(link.s3_path("b"), "s3://b/datasets/");
    }
}
