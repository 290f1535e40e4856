//! Data repository associations: CreateDataRepositoryAssociation,
//! DescribeDataRepositoryAssociations and DeleteDataRepositoryAssociation. AWS takes them
//! only on an AVAILABLE file system of a kind that has them (not SCRATCH_1, not Lustre
//! 2.10), with paths that neither repeat nor nest another association's on the same file
//! system; they move no bytes, so only their records and lifecycles are imitated.

use serde_json::{Value, json};

use super::file_systems::fs_lifecycle;
use super::{Association, FsxError, Lifecycle, hex_id, page, str_of, tags_of, without_token};
use crate::clock::reached;
use crate::world::{ACCOUNT, Aws};

/// AWS publishes no figure for associations; a few minutes, as the console shows.
pub(super) const ASSOCIATION_CREATE_SECS: f64 = 180.0;
pub(super) const ASSOCIATION_DELETE_SECS: f64 = 120.0;
/// Data repository associations per file system.
pub(super) const MAX_ASSOCIATIONS: usize = 8;

pub(super) fn association_lifecycle(
    a: &Association,
    now: f64,
    stuck: &impl Fn(&str) -> bool,
) -> Lifecycle {
    if let Some(since) = a.deleting {
        return if !stuck("DeleteDataRepositoryAssociation")
            && reached(now, since + ASSOCIATION_DELETE_SECS)
        {
            Lifecycle::Gone
        } else {
            Lifecycle::Deleting
        };
    }
    if stuck("CreateDataRepositoryAssociation")
        || !reached(now, a.created + ASSOCIATION_CREATE_SECS)
    {
        Lifecycle::Creating
    } else {
        Lifecycle::Available
    }
}

impl Aws {
    fn describe_association(&self, a: &Association) -> Value {
        let mut out = a.desc.clone();
        out["Lifecycle"] =
            json!(association_lifecycle(a, self.clock.now(), &self.fsx_stuck()).as_str());
        out
    }
}

/// A path with no trailing slash (but the root), so nesting compares whole components.
fn normal_path(p: &str) -> String {
    match p.trim_end_matches('/') {
        "" => "/".to_owned(),
        t => t.to_owned(),
    }
}

/// Whether one path is the other or inside it, component-wise.
fn nested(a: &str, b: &str, sep: char) -> bool {
    let within = |inner: &str, outer: &str| {
        inner == outer
            || outer.ends_with(sep) && inner.starts_with(outer)
            || inner.starts_with(outer) && inner[outer.len()..].starts_with(sep)
    };
    within(a, b) || within(b, a)
}

/// The bucket of an `s3://bucket[/prefix/]` path.
pub(super) fn bucket_of(path: &str) -> Option<&str> {
    let rest = path.strip_prefix("s3://")?;
    let bucket = rest.split('/').next()?;
    (!bucket.is_empty()).then_some(bucket)
}

fn check_events(s3: &Value) -> Result<(), FsxError> {
    for policy in ["AutoImportPolicy", "AutoExportPolicy"] {
        for e in s3[policy]["Events"].as_array().into_iter().flatten() {
            if !["NEW", "CHANGED", "DELETED"].contains(&e.as_str().unwrap_or_default()) {
                return Err(FsxError::bad_request(format!(
                    "Invalid {policy} event {e}: NEW, CHANGED or DELETED"
                )));
            }
        }
    }
    Ok(())
}

/// CreateDataRepositoryAssociation; `bucket_exists` is moto's answer for the path's
/// bucket (none without moto, which checks nothing).
pub(super) fn create_association(
    w: &mut Aws,
    region: &str,
    body: &Value,
    bucket_exists: Option<bool>,
) -> Result<Value, FsxError> {
    let fs_id = str_of(body, "FileSystemId").unwrap_or_default().to_owned();
    let fs = w.file_system(region, &fs_id)?;
    let token = str_of(body, "ClientRequestToken").map(str::to_owned);
    let request = without_token(body);
    if let Some(t) = &token
        && let Some(a) = w
            .fsx
            .associations
            .values()
            .find(|a| a.region == region && a.token.as_ref() == Some(t))
    {
        if a.request != request {
            return Err(FsxError::incompatible(
                "ClientRequestToken",
                format!(
                    "The ClientRequestToken {t} was already used to create association {} with different parameters",
                    a.id
                ),
            ));
        }
        return Ok(json!({ "Association": w.describe_association(a) }));
    }
    let deployment = fs.desc["LustreConfiguration"]["DeploymentType"]
        .as_str()
        .unwrap_or_default();
    if deployment == "SCRATCH_1" || fs.desc["FileSystemTypeVersion"] == "2.10" {
        return Err(FsxError::bad_request(format!(
            "Data repository associations are not supported on file system {fs_id}: SCRATCH_1 file systems and Lustre 2.10 file systems use a file system-level data repository"
        )));
    }
    let lifecycle = fs_lifecycle(fs, w.clock.now(), &w.fsx_stuck());
    if lifecycle != Lifecycle::Available {
        return Err(FsxError::bad_request(format!(
            "File system {fs_id} is {}: data repository associations can be created only on an AVAILABLE file system",
            lifecycle.as_str()
        )));
    }
    let fs_path = str_of(body, "FileSystemPath").unwrap_or_default();
    if !fs_path.starts_with('/') || fs_path.len() > 4096 {
        return Err(FsxError::bad_request(format!(
            "Invalid FileSystemPath {fs_path:?}: it must start with / and be at most 4096 characters"
        )));
    }
    let fs_path = normal_path(fs_path);
    let s3_path = str_of(body, "DataRepositoryPath")
        .unwrap_or_default()
        .to_owned();
    let Some(bucket) = bucket_of(&s3_path) else {
        return Err(FsxError::bad_request(format!(
            "Invalid DataRepositoryPath {s3_path:?}: it must be one S3 path, s3://bucket or s3://bucket/prefix/"
        )));
    };
    if bucket_exists == Some(false) {
        return Err(FsxError::bad_request(format!(
            "The S3 bucket {bucket} of DataRepositoryPath {s3_path} does not exist or is not accessible"
        )));
    }
    let chunk = match &body["ImportedFileChunkSize"] {
        Value::Null => 1024,
        v => v
            .as_u64()
            .filter(|n| (1..=512_000).contains(n))
            .ok_or_else(|| {
                FsxError::bad_request("ImportedFileChunkSize must be from 1 to 512000 MiB")
            })?,
    };
    check_events(&body["S3"])?;
    let siblings: Vec<&Association> = w
        .fsx
        .associations
        .values()
        .filter(|a| a.fs_id == fs_id)
        .collect();
    if siblings.len() >= MAX_ASSOCIATIONS {
        return Err(FsxError::limit(
            "VOLUMES_PER_FILE_SYSTEM",
            format!(
                "File system {fs_id} already has {MAX_ASSOCIATIONS} data repository associations, the most it can have"
            ),
        ));
    }
    for a in &siblings {
        let other = a.desc["FileSystemPath"].as_str().unwrap_or_default();
        if nested(&fs_path, other, '/') {
            return Err(FsxError::bad_request(format!(
                "FileSystemPath {fs_path} overlaps {other} of data repository association {}: paths must be unique and not nested",
                a.id
            )));
        }
        let other_s3 = a.desc["DataRepositoryPath"].as_str().unwrap_or_default();
        if nested(&normal_path(&s3_path), &normal_path(other_s3), '/') {
            return Err(FsxError::bad_request(format!(
                "DataRepositoryPath {s3_path} overlaps {other_s3} of data repository association {}",
                a.id
            )));
        }
    }
    let tags = tags_of(body)?;
    w.fsx.seq += 1;
    let seq = w.fsx.seq;
    let id = format!("dra-{}", hex_id(&format!("{region}/dra/{seq}"), 17));
    let now = w.clock.now();
    let mut desc = json!({
        "AssociationId": id,
        "ResourceARN": format!("arn:aws:fsx:{region}:{ACCOUNT}:association/{fs_id}/{id}"),
        "FileSystemId": fs_id,
        "FileSystemPath": fs_path,
        "DataRepositoryPath": s3_path,
        "BatchImportMetaDataOnCreate": body["BatchImportMetaDataOnCreate"].as_bool().unwrap_or(false),
        "ImportedFileChunkSize": chunk,
        "Tags": tags,
        "CreationTime": w.clock.epoch(now).floor(),
    });
    if body["S3"].is_object() {
        desc["S3"] = body["S3"].clone();
    }
    let a = Association {
        id: id.clone(),
        fs_id,
        region: region.to_owned(),
        seq,
        token,
        request,
        created: now,
        deleting: None,
        desc,
    };
    let out = json!({ "Association": w.describe_association(&a) });
    w.fsx.associations.insert(id, a);
    Ok(out)
}

pub(super) fn describe_associations(
    w: &Aws,
    region: &str,
    body: &Value,
) -> Result<Value, FsxError> {
    let mut chosen: Vec<&Association> = match body["AssociationIds"].as_array() {
        Some(ids) => ids
            .iter()
            .map(|id| {
                let id = id.as_str().unwrap_or_default();
                w.fsx
                    .associations
                    .get(id)
                    .filter(|a| a.region == region)
                    .ok_or_else(|| FsxError::association_not_found(id))
            })
            .collect::<Result<_, _>>()?,
        None => {
            let mut all: Vec<&Association> = w
                .fsx
                .associations
                .values()
                .filter(|a| a.region == region)
                .collect();
            all.sort_by_key(|a| a.seq);
            all
        }
    };
    for f in body["Filters"].as_array().into_iter().flatten() {
        let values: Vec<&str> = f["Values"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        let name = str_of(f, "Name").unwrap_or_default();
        let keep = |a: &Association| match name {
            "file-system-id" => values.contains(&a.fs_id.as_str()),
            "data-repository-type" => values.contains(&"S3"),
            "file-system-type" => values.contains(&"LUSTRE"),
            _ => false,
        };
        if !["file-system-id", "data-repository-type", "file-system-type"].contains(&name) {
            return Err(FsxError::bad_request(format!(
                "Invalid filter {name:?}: file-system-id, data-repository-type or file-system-type"
            )));
        }
        chosen.retain(|a| keep(a));
    }
    let all = chosen
        .into_iter()
        .map(|a| w.describe_association(a))
        .collect();
    page(all, body, 25, "Associations")
}

pub(super) fn delete_association(
    w: &mut Aws,
    region: &str,
    body: &Value,
) -> Result<Value, FsxError> {
    let id = str_of(body, "AssociationId").unwrap_or_default().to_owned();
    let delete_data = body["DeleteDataInFileSystem"].as_bool().unwrap_or(false);
    let answer = json!({ "AssociationId": id, "Lifecycle": "DELETING", "DeleteDataInFileSystem": delete_data });
    let a = w
        .fsx
        .associations
        .get(&id)
        .filter(|a| a.region == region)
        .ok_or_else(|| FsxError::association_not_found(&id))?;
    let lifecycle = association_lifecycle(a, w.clock.now(), &w.fsx_stuck());
    match lifecycle {
        Lifecycle::Creating => Err(FsxError::bad_request(format!(
            "Data repository association {id} is CREATING; it can be deleted once it is AVAILABLE"
        ))),
        Lifecycle::Deleting | Lifecycle::Gone => Ok(answer),
        Lifecycle::Available | Lifecycle::Failed => {
            let now = w.clock.now();
            if let Some(a) = w.fsx.associations.get_mut(&id) {
                a.deleting = Some(now);
            }
            Ok(answer)
        }
    }
}
