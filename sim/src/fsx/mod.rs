//! Amazon FSx for Lustre, as `aws-sdk-fsx` sees it (JSON 1.1: `POST /` with
//! `X-Amz-Target: AWSSimbaAPIService_v20180301.<Operation>`, SigV4 service `fsx`), served by
//! the sim because moto's FSx answers neither `Lifecycle` nor `MountName`, which is what a
//! client waits on and what a pod mounts.
//!
//! Imitated: CreateFileSystem (Lustre only) with AWS's checks of capacity per deployment
//! type, per-unit throughput, EFA, versions and ClientRequestToken idempotency; the network
//! as FSx checks it against moto (the subnet and security groups exist, the groups admit
//! LNET traffic, TCP 988 and 1018-1023, from themselves or the subnet's CIDR block, and the
//! subnet has the free addresses); the per-region limits (100 file systems, 100,800 GiB);
//! CREATING → AVAILABLE (or FAILED under a `fails` fault) on the sim's clock, held by a
//! `stuck` fault; DescribeFileSystems, DeleteFileSystem (DELETING, then gone with its
//! associations and network interfaces), tags; data repository associations (create,
//! describe with filters, delete) with AWS's rules on paths and counts.
//!
//! The sim's model of a file system's network interfaces (AWS publishes no formula): one
//! for the metadata server plus one per 2,400 GiB storage unit, `1 + ceil(capacity /
//! 2400)`. They are made in moto with EC2 CreateNetworkInterface, so the subnet's
//! `AvailableIpAddressCount` goes down and `NetworkInterfaceIds` are real, and deleted in
//! moto at the first FSx call after the file system is gone.
//!
//! Not imitated: other file system types (BadRequest), HDD beyond PERSISTENT_1,
//! INTELLIGENT_TIERING, KMS keys, backups, UpdateFileSystem, data repository tasks, file
//! caches, import/export of data (associations move no bytes), MISCONFIGURED, and checks
//! that need more of the VPC than moto keeps (routes, NACLs). Without moto the network is
//! not checked and interface ids are made up.
//!
//! Here: the dispatch, FSx's errors, the state the world holds, the helpers both parts
//! share (ids, tags, JSON, paging) and the tag operations, which find a file system or an
//! association by its ARN. File systems (creation's checks, the network, the lifecycle,
//! network interfaces, limits, what a mount reads) are in `file_systems`; data repository
//! associations in `associations`.

use std::collections::BTreeMap;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Json, Response};
use serde_json::{Map, Value, json};

use crate::world::{Aws, AwsError, FaultKind, Shared, fnv1a, region_of};

mod associations;
mod file_systems;

use associations::{
    association_lifecycle, bucket_of, create_association, delete_association, describe_associations,
};
pub use file_systems::Mountable;
use file_systems::{
    create_file_system, delete_file_system, describe_file_systems, fs_lifecycle, release_interfaces,
};

pub const TARGET_PREFIX: &str = "AWSSimbaAPIService_v20180301.";

/// An FSx error: JSON 1.1 with `Message` (FSx's member name) and the members some errors
/// add (`Parameter`, `Limit`, `InvalidSubnetId`...).
#[derive(Debug, Clone)]
pub struct FsxError {
    pub status: StatusCode,
    pub code: String,
    pub message: String,
    pub extra: Map<String, Value>,
}

impl FsxError {
    fn new(status: u16, code: &str, message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST),
            code: code.to_owned(),
            message: message.into(),
            extra: Map::new(),
        }
    }

    fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    fn with(mut self, member: &str, value: impl Into<Value>) -> Self {
        self.extra.insert(member.to_owned(), value.into());
        self
    }

    fn incompatible(parameter: &str, message: impl Into<String>) -> Self {
        Self::new(400, "IncompatibleParameterError", message).with("Parameter", parameter)
    }

    fn network(message: impl Into<String>) -> Self {
        Self::new(400, "InvalidNetworkSettings", message)
    }

    fn limit(limit: &str, message: impl Into<String>) -> Self {
        Self::new(400, "ServiceLimitExceeded", message).with("Limit", limit)
    }

    fn file_system_not_found(id: &str) -> Self {
        Self::new(
            400,
            "FileSystemNotFound",
            format!("File system '{id}' does not exist."),
        )
    }

    fn association_not_found(id: &str) -> Self {
        Self::new(
            400,
            "DataRepositoryAssociationNotFound",
            format!("Data repository association '{id}' does not exist."),
        )
    }
}

impl From<AwsError> for FsxError {
    fn from(e: AwsError) -> Self {
        Self {
            status: e.status,
            code: e.code,
            message: e.message,
            extra: Map::new(),
        }
    }
}

impl IntoResponse for FsxError {
    fn into_response(self) -> Response {
        let mut body = self.extra;
        body.insert("__type".into(), json!(self.code));
        body.insert("Message".into(), json!(self.message));
        let mut headers = HeaderMap::new();
        headers.insert(
            "x-amzn-requestid",
            HeaderValue::from_static("00000000-0000-4000-8000-00000000sim0"),
        );
        (self.status, headers, Json(Value::Object(body))).into_response()
    }
}

/// Where a file system or association is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lifecycle {
    Creating,
    Available,
    Failed,
    Deleting,
    Gone,
}

impl Lifecycle {
    pub fn as_str(self) -> &'static str {
        match self {
            Lifecycle::Creating => "CREATING",
            Lifecycle::Available => "AVAILABLE",
            Lifecycle::Failed => "FAILED",
            Lifecycle::Deleting => "DELETING",
            Lifecycle::Gone => "DELETED",
        }
    }
}

#[derive(Clone, Debug)]
struct FileSystem {
    id: String,
    region: String,
    /// Creation order: what DescribeFileSystems lists by.
    seq: u64,
    token: Option<String>,
    /// The request without its token, to tell a retry from a reuse of the token.
    request: Value,
    created: f64,
    deleting: Option<f64>,
    /// `FailureDetails.Message` once creation is over, from a `fails` fault.
    failure: Option<String>,
    storage: u64,
    /// What DescribeFileSystems answers, but `Lifecycle` and `FailureDetails`.
    desc: Value,
}

#[derive(Clone, Debug)]
struct Association {
    id: String,
    fs_id: String,
    region: String,
    seq: u64,
    token: Option<String>,
    request: Value,
    created: f64,
    deleting: Option<f64>,
    desc: Value,
}

/// FSx's state: file systems and associations of every region, by id.
#[derive(Default)]
pub struct Fsx {
    file_systems: BTreeMap<String, FileSystem>,
    associations: BTreeMap<String, Association>,
    seq: u64,
    /// (region, interface id) of file systems gone, still to delete in moto.
    released: Vec<(String, String)>,
}

impl Aws {
    /// Whether a `stuck` fault holds what an FSx operation started; owns what it reads,
    /// so the state can change while it is at hand.
    fn fsx_stuck(&self) -> impl Fn(&str) -> bool + use<> {
        let faults = self.faults.clone();
        move |op: &str| faults.stuck("fsx", op)
    }

    /// Forgets what is gone; a file system takes its associations with it and leaves its
    /// network interfaces to be deleted in moto.
    fn settle_fsx(&mut self) {
        let now = self.clock.now();
        let stuck = self.fsx_stuck();
        let gone: Vec<String> = self
            .fsx
            .file_systems
            .values()
            .filter(|fs| fs_lifecycle(fs, now, &stuck) == Lifecycle::Gone)
            .map(|fs| fs.id.clone())
            .collect();
        let gone_associations: Vec<String> = self
            .fsx
            .associations
            .values()
            .filter(|a| {
                gone.contains(&a.fs_id) || association_lifecycle(a, now, &stuck) == Lifecycle::Gone
            })
            .map(|a| a.id.clone())
            .collect();
        for id in gone {
            if let Some(fs) = self.fsx.file_systems.remove(&id) {
                for eni in fs.desc["NetworkInterfaceIds"]
                    .as_array()
                    .into_iter()
                    .flatten()
                {
                    if let Some(eni) = eni.as_str() {
                        self.fsx.released.push((fs.region.clone(), eni.to_owned()));
                    }
                }
            }
        }
        for id in gone_associations {
            self.fsx.associations.remove(&id);
        }
    }

    fn file_system(&self, region: &str, id: &str) -> Result<&FileSystem, FsxError> {
        self.fsx
            .file_systems
            .get(id)
            .filter(|fs| fs.region == region)
            .ok_or_else(|| FsxError::file_system_not_found(id))
    }
}

/// A hex id of `len` digits derived from `seed`, the same on every run.
fn hex_id(seed: &str, len: usize) -> String {
    let mut out = String::new();
    let mut h = fnv1a(seed);
    while out.len() < len {
        out.push_str(&format!("{h:016x}"));
        h = fnv1a(&format!("{seed}/{out}"));
    }
    out.truncate(len);
    out
}

fn str_of<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key).and_then(Value::as_str)
}

/// The request without its ClientRequestToken: what a retry repeats.
fn without_token(body: &Value) -> Value {
    let mut request = body.clone();
    if let Some(o) = request.as_object_mut() {
        o.remove("ClientRequestToken");
    }
    request
}

fn tags_of(v: &Value) -> Result<Value, FsxError> {
    let tags = v.get("Tags").cloned().unwrap_or_else(|| json!([]));
    let ok = tags.as_array().is_some_and(|ts| {
        ts.iter().all(|t| {
            str_of(t, "Key").is_some_and(|k| (1..=128).contains(&k.len()))
                && str_of(t, "Value").is_some_and(|v| v.len() <= 256)
        })
    });
    if ok && tags.as_array().is_some_and(|t| t.len() <= 50) {
        Ok(tags)
    } else {
        Err(FsxError::bad_request(
            "Tags must be at most 50 {Key, Value} pairs with keys of 1-128 and values of at most 256 characters",
        ))
    }
}

/// One page of `all` from `NextToken` (an index, opaque to clients).
fn page(all: Vec<Value>, body: &Value, max: u64, key: &str) -> Result<Value, FsxError> {
    let limit = match &body["MaxResults"] {
        Value::Null => max,
        v => v
            .as_u64()
            .filter(|n| (1..=max).contains(n))
            .ok_or_else(|| FsxError::bad_request(format!("MaxResults must be from 1 to {max}")))?,
    } as usize;
    let start = match str_of(body, "NextToken") {
        None => 0,
        Some(t) => t
            .parse::<usize>()
            .ok()
            .filter(|s| *s <= all.len())
            .ok_or_else(|| FsxError::bad_request("Invalid NextToken"))?,
    };
    let end = start.saturating_add(limit).min(all.len());
    let mut out = json!({ key: all[start..end].to_vec() });
    if end < all.len() {
        out["NextToken"] = json!(end.to_string());
    }
    Ok(out)
}

/// The description (with its `Tags`) behind a file system's or association's ARN.
fn tagged<'a>(w: &'a mut Aws, region: &str, arn: &str) -> Result<&'a mut Value, FsxError> {
    let not_found = || {
        FsxError::new(
            400,
            "ResourceNotFound",
            format!("Resource {arn} does not exist"),
        )
        .with("ResourceARN", arn)
    };
    if !arn.starts_with(&format!("arn:aws:fsx:{region}:")) {
        return Err(not_found());
    }
    if let Some(fs) = w
        .fsx
        .file_systems
        .values_mut()
        .find(|fs| fs.desc["ResourceARN"] == arn)
    {
        return Ok(&mut fs.desc);
    }
    w.fsx
        .associations
        .values_mut()
        .find(|a| a.desc["ResourceARN"] == arn)
        .map(|a| &mut a.desc)
        .ok_or_else(not_found)
}

fn tag_resource(w: &mut Aws, region: &str, body: &Value) -> Result<Value, FsxError> {
    let arn = str_of(body, "ResourceARN").unwrap_or_default();
    let new = tags_of(body)?;
    let desc = tagged(w, region, arn)?;
    let mut tags = desc["Tags"].as_array().cloned().unwrap_or_default();
    for t in new.as_array().into_iter().flatten() {
        tags.retain(|old| old["Key"] != t["Key"]);
        tags.push(t.clone());
    }
    desc["Tags"] = json!(tags);
    Ok(json!({}))
}

fn untag_resource(w: &mut Aws, region: &str, body: &Value) -> Result<Value, FsxError> {
    let arn = str_of(body, "ResourceARN").unwrap_or_default();
    let keys = body["TagKeys"].as_array().cloned().unwrap_or_default();
    let desc = tagged(w, region, arn)?;
    if let Some(tags) = desc["Tags"].as_array_mut() {
        tags.retain(|t| !keys.contains(&t["Key"]));
    }
    Ok(json!({}))
}

fn list_tags(w: &mut Aws, region: &str, body: &Value) -> Result<Value, FsxError> {
    let arn = str_of(body, "ResourceARN").unwrap_or_default();
    let tags = tagged(w, region, arn)?["Tags"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    page(tags, body, i32::MAX as u64, "Tags")
}

/// The operations answered under the AWS lock alone.
fn answer(w: &mut Aws, op: &str, region: &str, body: &Value) -> Result<Value, FsxError> {
    w.settle_fsx();
    match op {
        "DescribeFileSystems" => describe_file_systems(w, region, body),
        "DeleteFileSystem" => delete_file_system(w, region, body),
        "TagResource" => tag_resource(w, region, body),
        "UntagResource" => untag_resource(w, region, body),
        "ListTagsForResource" => list_tags(w, region, body),
        "DescribeDataRepositoryAssociations" => describe_associations(w, region, body),
        "DeleteDataRepositoryAssociation" => delete_association(w, region, body),
        other => Err(FsxError::new(
            400,
            "UnknownOperationException",
            format!("hypd-sim does not implement FSx {other}"),
        )),
    }
}

/// `POST /` with `X-Amz-Target: AWSSimbaAPIService_v20180301.<Operation>`.
pub async fn dispatch(State(state): State<Shared>, headers: HeaderMap, body: Bytes) -> Response {
    let op = headers
        .get("x-amz-target")
        .and_then(|v| v.to_str().ok())
        .and_then(|t| t.strip_prefix(TARGET_PREFIX))
        .unwrap_or_default()
        .to_owned();
    let region = region_of(&headers);
    let body: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => return FsxError::bad_request(format!("invalid JSON: {e}")).into_response(),
    };
    let fault = crate::world::injected(&state, "fsx", &op).await;
    let lost = matches!(fault, Some(FaultKind::Lost));
    if let Some(e) = fault.filter(|_| !lost).and_then(crate::world::aws_error) {
        return FsxError::from(e).into_response();
    }
    let result = match op.as_str() {
        "CreateFileSystem" => create_file_system(&state, &region, &body).await,
        "CreateDataRepositoryAssociation" => {
            let bucket = str_of(&body, "DataRepositoryPath").and_then(bucket_of);
            let exists = match (&state.moto, bucket) {
                (Some(moto), Some(b)) => match moto.bucket_exists(&region, b).await {
                    Ok(e) => Some(e),
                    Err(e) => return FsxError::from(e).into_response(),
                },
                _ => None,
            };
            let mut w = state.aws.lock().await;
            w.settle_fsx();
            create_association(&mut w, &region, &body, exists)
        }
        _ => answer(&mut *state.aws.lock().await, &op, &region, &body),
    };
    release_interfaces(&state).await;
    if lost {
        return crate::world::aws_error(FaultKind::Lost)
            .map(|e| FsxError::from(e).into_response())
            .unwrap_or_default();
    }
    match result {
        Ok(v) => Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

#[cfg(test)]
mod tests;
