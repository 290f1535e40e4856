//! The FSx for Lustre file system of one storage. Found by hypd's tags among the
//! account's file systems (FSx has no names); made once, with the operation's client
//! request token; deleted only when it carries hypd's tags, with no final backup (hypd
//! offers no restore from one). Its settings are not changed once it exists: changing
//! capacity or throughput is an hours-long update hypd does not offer, so a request
//! that differs from what exists is answered by the storage's pre-flight, not here.

use app::api::ApiError;
use app::api::plan::{Action, Change, KNOWN_AFTER_APPLY};
use aws_sdk_fsx::types::{
    CreateFileSystemLustreConfiguration, DeleteFileSystemLustreConfiguration, FileSystemLifecycle,
    FileSystemType, LustreDeploymentType, StorageType,
};
use serde_json::json;

use super::{Client, is_storage, storage_tags};
use crate::aws::{SdkResultExt, failed_state};
use crate::resources::{Resource, Want};

const KIND: &str = "fsx:FileSystem";

pub struct FileSystem {
    pub fsx: Client,
    pub cluster: String,
    pub storage: String,
    pub want: Want<Spec>,
}

/// What a new file system is made with.
#[derive(Clone, Debug, PartialEq)]
pub struct Spec {
    /// `PERSISTENT_2` or `SCRATCH_2`.
    pub deployment: &'static str,
    pub capacity_gib: u32,
    /// MB/s per TiB (persistent only).
    pub throughput: Option<u32>,
    pub efa: bool,
    pub subnet_id: String,
    pub security_group_id: String,
    /// The client request token of the create.
    pub token: String,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Observed {
    pub id: Option<String>,
    /// `CREATING`, `AVAILABLE`, `FAILED`, `DELETING`, …
    pub lifecycle: Option<String>,
    pub failure: Option<String>,
    pub dns_name: Option<String>,
    pub mount_name: Option<String>,
    pub capacity_gib: Option<i32>,
    pub version: Option<String>,
    pub efa: bool,
}

impl Observed {
    pub fn available(&self) -> bool {
        self.lifecycle.as_deref() == Some("AVAILABLE")
    }

    /// An error when it failed in a way waiting cannot mend.
    pub fn check(&self) -> Result<(), ApiError> {
        match self.lifecycle.as_deref() {
            Some(s @ ("FAILED" | "MISCONFIGURED" | "MISCONFIGURED_UNAVAILABLE")) => {
                Err(failed_state(
                    "fsx",
                    "DescribeFileSystems",
                    Some(s),
                    format!(
                        "file system {} is {s}: {}",
                        self.id.as_deref().unwrap_or("?"),
                        self.failure.as_deref().unwrap_or("FSx gave no reason")
                    ),
                ))
            }
            _ => Ok(()),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Create,
    Delete,
}

/// The change for `want` given what was found. Pure.
pub fn diff<S>(want: &Want<S>, observed: &Observed) -> Vec<Op> {
    match (want, observed.id.is_some()) {
        (Want::Present(_), false) => vec![Op::Create],
        (Want::Absent, true) if observed.lifecycle.as_deref() != Some("DELETING") => {
            vec![Op::Delete]
        }
        _ => Vec::new(),
    }
}

/// Every file system of the account in the client's region (DescribeFileSystems, all
/// pages).
pub async fn all(fsx: &Client) -> Result<Vec<aws_sdk_fsx::types::FileSystem>, ApiError> {
    let mut next = None;
    let mut all = Vec::new();
    loop {
        let out = fsx
            .describe_file_systems()
            .set_next_token(next)
            .send()
            .await
            .upstream("fsx", "DescribeFileSystems")?;
        all.extend(out.file_systems().iter().cloned());
        next = out.next_token().map(str::to_owned);
        if next.is_none() {
            return Ok(all);
        }
    }
}

/// File system `id`, if it exists.
pub async fn by_id(
    fsx: &Client,
    id: &str,
) -> Result<Option<aws_sdk_fsx::types::FileSystem>, ApiError> {
    Ok(fsx
        .describe_file_systems()
        .file_system_ids(id)
        .send()
        .await
        .found("fsx", "DescribeFileSystems")?
        .and_then(|o| o.file_systems().first().cloned()))
}

impl FileSystem {
    /// The file system of this storage, by hypd's tags (one not being deleted first).
    async fn find(&self) -> Result<Option<aws_sdk_fsx::types::FileSystem>, ApiError> {
        let deleting = |f: &aws_sdk_fsx::types::FileSystem| {
            f.lifecycle() == Some(&FileSystemLifecycle::Deleting)
        };
        let mut found: Option<aws_sdk_fsx::types::FileSystem> = None;
        for fs in all(&self.fsx).await? {
            if is_storage(fs.tags(), &self.cluster, &self.storage)
                && found.as_ref().is_none_or(|f| deleting(f) && !deleting(&fs))
            {
                found = Some(fs);
            }
        }
        Ok(found)
    }
}

fn observed(fs: &aws_sdk_fsx::types::FileSystem) -> Observed {
    let lustre = fs.lustre_configuration();
    Observed {
        id: fs.file_system_id().map(str::to_owned),
        lifecycle: fs.lifecycle().map(|l| l.as_str().to_owned()),
        failure: fs
            .failure_details()
            .and_then(|f| f.message())
            .map(str::to_owned),
        dns_name: fs.dns_name().map(str::to_owned),
        mount_name: lustre.and_then(|l| l.mount_name()).map(str::to_owned),
        capacity_gib: fs.storage_capacity(),
        version: fs.file_system_type_version().map(str::to_owned),
        efa: lustre.and_then(|l| l.efa_enabled()).unwrap_or(false),
    }
}

impl Resource for FileSystem {
    type Observed = Observed;
    type Op = Op;

    async fn observe(&self) -> Result<Observed, ApiError> {
        Ok(self
            .find()
            .await?
            .as_ref()
            .map(observed)
            .unwrap_or_default())
    }

    fn diff(&self, observed: &Observed) -> Result<Vec<Op>, ApiError> {
        Ok(diff(&self.want, observed))
    }

    async fn apply(&self, op: &Op, found: &mut Observed) -> Result<(), ApiError> {
        match op {
            Op::Create => {
                let spec = self
                    .want
                    .present()
                    .ok_or_else(|| ApiError::internal("a create of a file system not wanted"))?;
                let lustre = CreateFileSystemLustreConfiguration::builder()
                    .deployment_type(LustreDeploymentType::from(spec.deployment))
                    .set_per_unit_storage_throughput(spec.throughput.map(|t| t as i32))
                    .set_efa_enabled(spec.efa.then_some(true))
                    .build();
                let out = self
                    .fsx
                    .create_file_system()
                    .client_request_token(&spec.token)
                    .file_system_type(FileSystemType::Lustre)
                    .file_system_type_version("2.15")
                    .storage_capacity(spec.capacity_gib as i32)
                    .storage_type(StorageType::Ssd)
                    .subnet_ids(&spec.subnet_id)
                    .security_group_ids(&spec.security_group_id)
                    .set_tags(Some(storage_tags(&self.cluster, &self.storage)))
                    .lustre_configuration(lustre)
                    .send()
                    .await
                    .upstream("fsx", "CreateFileSystem")?;
                let fs = out.file_system().ok_or_else(|| {
                    ApiError::internal("CreateFileSystem answered no file system")
                })?;
                *found = observed(fs);
            }
            Op::Delete => {
                let Some(id) = found.id.clone() else {
                    return Ok(());
                };
                self.fsx
                    .delete_file_system()
                    .file_system_id(&id)
                    .lustre_configuration(
                        DeleteFileSystemLustreConfiguration::builder()
                            .skip_final_backup(true)
                            .build(),
                    )
                    .send()
                    .await
                    .found("fsx", "DeleteFileSystem")?;
                found.lifecycle = Some("DELETING".to_owned());
            }
        }
        Ok(())
    }

    fn describe(&self, op: &Op, observed: &Observed) -> Change {
        let name = observed
            .id
            .clone()
            .unwrap_or_else(|| format!("{}-{}", self.cluster, self.storage));
        match (op, self.want.present()) {
            (Op::Create, Some(s)) => Change::new(Action::Create, KIND, name)
                .field("deployment_type", None, Some(json!(s.deployment)))
                .field("storage_capacity_gib", None, Some(json!(s.capacity_gib)))
                .field(
                    "throughput_mbps_per_tib",
                    None,
                    s.throughput.map(|t| json!(t)),
                )
                .field("efa", None, Some(json!(s.efa)))
                .field("subnet", None, Some(json!(s.subnet_id)))
                .field("security_group", None, Some(json!(s.security_group_id)))
                .field("file_system_id", None, Some(json!(KNOWN_AFTER_APPLY))),
            _ => Change::new(Action::Delete, KIND, name).field(
                "files",
                Some(json!(format!(
                    "{} GiB file system and every file on it (no final backup)",
                    observed.capacity_gib.unwrap_or_default()
                ))),
                None,
            ),
        }
    }

    /// Assumed made is assumed available (a plan goes on past the wait), and deleted gone.
    fn assume(&self, op: &Op, observed: &mut Observed) {
        *observed = match op {
            Op::Create => Observed {
                id: Some(KNOWN_AFTER_APPLY.to_owned()),
                lifecycle: Some("AVAILABLE".to_owned()),
                dns_name: Some(KNOWN_AFTER_APPLY.to_owned()),
                mount_name: Some(KNOWN_AFTER_APPLY.to_owned()),
                ..Observed::default()
            },
            Op::Delete => Observed::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn made_once_and_deleted_once() {
        let none = Observed::default();
        let there = Observed {
            id: Some("fs-1".into()),
            lifecycle: Some("CREATING".into()),
            ..Observed::default()
        };
        assert_eq!(diff(&Want::Present(()), &none), [Op::Create]);
        assert!(diff(&Want::Present(()), &there).is_empty());
        assert_eq!(diff::<()>(&Want::Absent, &there), [Op::Delete]);
        let deleting = Observed {
            lifecycle: Some("DELETING".into()),
            ..there.clone()
        };
        assert!(diff::<()>(&Want::Absent, &deleting).is_empty());
        assert!(diff::<()>(&Want::Absent, &none).is_empty());
        let failed = Observed {
            lifecycle: Some("FAILED".into()),
            failure: Some("no".into()),
            ..there
        };
        assert!(failed.check().is_err());
    }
}
