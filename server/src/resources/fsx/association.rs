//! A file system's data repository associations: directories linked to S3 paths, made
//! once each (a client request token per directory and operation) and never changed
//! (FSx cannot move an association to another path; one that links a directory
//! elsewhere is an error for the caller to resolve, not something to replace quietly).
//! They go with their file system; hypd never deletes one on its own.

use app::api::ApiError;
use app::api::plan::{Action, Change, KNOWN_AFTER_APPLY};
use aws_sdk_fsx::types::{
    AutoExportPolicy, AutoImportPolicy, EventType, Filter, FilterName,
    S3DataRepositoryConfiguration,
};
use serde_json::json;

use super::{Client, storage_tags};
use crate::aws::{SdkResultExt, failed_state};
use crate::resources::{Resource, known_after_apply};

const KIND: &str = "fsx:DataRepositoryAssociation";

/// One directory linked to an S3 path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Link {
    pub file_system_path: String,
    /// `s3://bucket/prefix/`.
    pub data_repository_path: String,
}

pub struct Associations {
    pub fsx: Client,
    pub cluster: String,
    pub storage: String,
    pub file_system_id: String,
    pub want: Vec<Link>,
    /// The operation whose tokens the creates carry.
    pub operation: String,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Found {
    pub id: String,
    pub link: Link,
    pub lifecycle: String,
    pub failure: Option<String>,
}

impl Found {
    /// An error when it failed in a way waiting cannot mend.
    pub fn check(&self) -> Result<(), ApiError> {
        match self.lifecycle.as_str() {
            s @ ("FAILED" | "MISCONFIGURED") => Err(failed_state(
                "fsx",
                "DescribeDataRepositoryAssociations",
                Some(s),
                format!(
                    "data repository association {} ({} → {}) is {s}: {}",
                    self.id,
                    self.link.file_system_path,
                    self.link.data_repository_path,
                    self.failure.as_deref().unwrap_or("FSx gave no reason")
                ),
            )),
            _ => Ok(()),
        }
    }
}

/// The links to make given what the file system has; an error naming the directory
/// when one is linked elsewhere already. Pure.
pub fn diff(want: &[Link], found: &[Found]) -> Result<Vec<Link>, ApiError> {
    let mut make = Vec::new();
    for (i, w) in want.iter().enumerate() {
        match found
            .iter()
            .find(|f| f.link.file_system_path == w.file_system_path)
        {
            None => make.push(w.clone()),
            Some(f) if f.link.data_repository_path != w.data_repository_path => {
                return Err(ApiError::field(
                    format!("data_repositories[{i}].file_system_path"),
                    format!(
                        "{} is linked to {} already ({})",
                        w.file_system_path, f.link.data_repository_path, f.id
                    ),
                ));
            }
            Some(_) => {}
        }
    }
    Ok(make)
}

impl Resource for Associations {
    type Observed = Vec<Found>;
    type Op = Link;

    async fn observe(&self) -> Result<Vec<Found>, ApiError> {
        if known_after_apply(&self.file_system_id) {
            return Ok(Vec::new());
        }
        let mut next = None;
        let mut found = Vec::new();
        loop {
            let out = self
                .fsx
                .describe_data_repository_associations()
                .filters(
                    Filter::builder()
                        .name(FilterName::FileSystemId)
                        .values(&self.file_system_id)
                        .build(),
                )
                .set_next_token(next)
                .send()
                .await
                .upstream("fsx", "DescribeDataRepositoryAssociations")?;
            found.extend(out.associations().iter().filter_map(|a| {
                Some(Found {
                    id: a.association_id()?.to_owned(),
                    link: Link {
                        file_system_path: a.file_system_path()?.to_owned(),
                        data_repository_path: a.data_repository_path()?.to_owned(),
                    },
                    lifecycle: a.lifecycle().map(|l| l.as_str().to_owned())?,
                    failure: a
                        .failure_details()
                        .and_then(|f| f.message())
                        .map(str::to_owned),
                })
            }));
            next = out.next_token().map(str::to_owned);
            if next.is_none() {
                return Ok(found);
            }
        }
    }

    fn diff(&self, found: &Vec<Found>) -> Result<Vec<Link>, ApiError> {
        diff(&self.want, found)
    }

    async fn apply(&self, link: &Link, found: &mut Vec<Found>) -> Result<(), ApiError> {
        let events = [EventType::New, EventType::Changed, EventType::Deleted];
        let s3 = S3DataRepositoryConfiguration::builder()
            .auto_import_policy(
                AutoImportPolicy::builder()
                    .set_events(Some(events.to_vec()))
                    .build(),
            )
            .auto_export_policy(
                AutoExportPolicy::builder()
                    .set_events(Some(events.to_vec()))
                    .build(),
            )
            .build();
        let index = self.want.iter().position(|w| w == link).unwrap_or_default();
        let out = self
            .fsx
            .create_data_repository_association()
            .client_request_token(super::token(&self.operation, &format!("dra{index}")))
            .file_system_id(&self.file_system_id)
            .file_system_path(&link.file_system_path)
            .data_repository_path(&link.data_repository_path)
            .batch_import_meta_data_on_create(true)
            .s3(s3)
            .set_tags(Some(storage_tags(&self.cluster, &self.storage)))
            .send()
            .await
            .upstream("fsx", "CreateDataRepositoryAssociation")?;
        let id = out
            .association()
            .and_then(|a| a.association_id())
            .ok_or_else(|| ApiError::internal("CreateDataRepositoryAssociation answered no id"))?;
        found.push(Found {
            id: id.to_owned(),
            link: link.clone(),
            lifecycle: "CREATING".to_owned(),
            failure: None,
        });
        Ok(())
    }

    fn describe(&self, link: &Link, _: &Vec<Found>) -> Change {
        Change::new(Action::Create, KIND, &link.file_system_path)
            .field(
                "data_repository_path",
                None,
                Some(json!(link.data_repository_path)),
            )
            .field(
                "sync",
                None,
                Some(json!("import and export new, changed, deleted")),
            )
    }

    fn assume(&self, link: &Link, found: &mut Vec<Found>) {
        found.push(Found {
            id: KNOWN_AFTER_APPLY.to_owned(),
            link: link.clone(),
            lifecycle: "AVAILABLE".to_owned(),
            failure: None,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(fs: &str, s3: &str) -> Link {
        Link {
            file_system_path: fs.into(),
            data_repository_path: s3.into(),
        }
    }

    #[test]
    fn a_directory_is_linked_once_and_never_moved() {
        let want = [link("/a", "s3://b/a/"), link("/b", "s3://b/b/")];
        let found = [Found {
            id: "dra-1".into(),
            link: link("/a", "s3://b/a/"),
            lifecycle: "AVAILABLE".into(),
            failure: None,
        }];
        assert_eq!(diff(&want, &found).unwrap(), [link("/b", "s3://b/b/")]);
        let elsewhere = [Found {
            link: link("/a", "s3://other/"),
            ..found[0].clone()
        }];
        let e = diff(&want, &elsewhere).unwrap_err();
        assert!(e.to_string().contains("data_repositories[0]"), "{e}");
    }
}
