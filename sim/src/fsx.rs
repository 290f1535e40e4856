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

use std::collections::BTreeMap;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Json, Response};
use serde_json::{Map, Value, json};

use crate::clock::reached;
use crate::moto::{Moto, SecurityGroup, Subnet};
use crate::world::{ACCOUNT, Aws, AwsError, FaultKind, Shared, fnv1a, region_of};

pub const TARGET_PREFIX: &str = "AWSSimbaAPIService_v20180301.";

/// Real Lustre creations take 5-10 minutes; the sim takes as long as an EKS cluster.
pub const CREATE_SECS: f64 = 600.0;
pub const DELETE_SECS: f64 = 300.0;
/// AWS publishes no figure for associations; a few minutes, as the console shows.
pub const ASSOCIATION_CREATE_SECS: f64 = 180.0;
pub const ASSOCIATION_DELETE_SECS: f64 = 120.0;
/// The default per-region quotas for Lustre.
pub const MAX_FILE_SYSTEMS: usize = 100;
pub const MAX_TOTAL_STORAGE_GIB: u64 = 100_800;
/// Data repository associations per file system.
pub const MAX_ASSOCIATIONS: usize = 8;
/// LNET's ports, which a file system's security groups must admit from themselves.
const LUSTRE_PORTS: [(u16, u16); 2] = [(988, 988), (1018, 1023)];

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

/// A file system as a pod's mount sees it (see `kube::controllers::mounts`).
#[derive(Clone, Debug)]
pub struct Mountable {
    pub dns_name: String,
    pub mount_name: String,
    pub lifecycle: Lifecycle,
    /// When it became (or becomes) AVAILABLE, epoch seconds.
    pub available_at: f64,
}

/// The network interfaces a file system of `capacity` GiB takes: the sim's model, one
/// for the metadata server and one per 2,400 GiB unit of storage servers.
pub fn interfaces(capacity: u64) -> u32 {
    1 + capacity.div_ceil(2400) as u32
}

fn fs_lifecycle(fs: &FileSystem, now: f64, stuck: &impl Fn(&str) -> bool) -> Lifecycle {
    if let Some(since) = fs.deleting {
        return if !stuck("DeleteFileSystem") && reached(now, since + DELETE_SECS) {
            Lifecycle::Gone
        } else {
            Lifecycle::Deleting
        };
    }
    if stuck("CreateFileSystem") || !reached(now, fs.created + CREATE_SECS) {
        Lifecycle::Creating
    } else if fs.failure.is_some() {
        Lifecycle::Failed
    } else {
        Lifecycle::Available
    }
}

fn association_lifecycle(a: &Association, now: f64, stuck: &impl Fn(&str) -> bool) -> Lifecycle {
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

    /// The file systems of `region` a mount can reach, with their state now (each
    /// transition to come is a deadline of the pass reading them).
    pub fn fsx_mountable(&self, region: &str) -> Vec<Mountable> {
        let now = self.clock.now();
        let stuck = self.fsx_stuck();
        self.fsx
            .file_systems
            .values()
            .filter(|fs| fs.region == region)
            .map(|fs| Mountable {
                dns_name: fs.desc["DNSName"].as_str().unwrap_or_default().to_owned(),
                mount_name: fs.desc["LustreConfiguration"]["MountName"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                lifecycle: fs_lifecycle(fs, now, &stuck),
                available_at: self.clock.epoch(fs.created + CREATE_SECS),
            })
            .filter(|m| m.lifecycle != Lifecycle::Gone)
            .collect()
    }

    fn describe_fs(&self, fs: &FileSystem) -> Value {
        let lifecycle = fs_lifecycle(fs, self.clock.now(), &self.fsx_stuck());
        let mut out = fs.desc.clone();
        out["Lifecycle"] = json!(lifecycle.as_str());
        if lifecycle == Lifecycle::Failed {
            out["FailureDetails"] = json!({ "Message": fs.failure });
        }
        out
    }

    fn describe_association(&self, a: &Association) -> Value {
        let mut out = a.desc.clone();
        out["Lifecycle"] =
            json!(association_lifecycle(a, self.clock.now(), &self.fsx_stuck()).as_str());
        out
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

/// Eight lowercase alphanumerics, as FSx names a file system's Lustre mount.
fn mount_name(seed: &str) -> String {
    let mut h = fnv1a(seed);
    (0..8)
        .map(|_| {
            let c = b"abcdefghijklmnopqrstuvwxyz0123456789"[(h % 36) as usize];
            h /= 36;
            char::from(c)
        })
        .collect()
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

/// What a CreateFileSystem asks for, checked as FSx checks it before looking at the
/// network.
#[derive(Clone, Debug)]
pub struct Spec {
    token: Option<String>,
    request: Value,
    capacity: u64,
    storage_type: String,
    subnet: String,
    groups: Vec<String>,
    tags: Value,
    version: String,
    deployment: String,
    throughput: Option<u64>,
    compression: String,
    efa: bool,
    metadata: Option<Value>,
    maintenance: Option<String>,
}

fn check_create(body: &Value) -> Result<Spec, FsxError> {
    let fs_type = str_of(body, "FileSystemType").unwrap_or_default();
    if fs_type != "LUSTRE" {
        return Err(FsxError::bad_request(format!(
            "hypd-sim serves Amazon FSx for Lustre only; FileSystemType {fs_type:?} is not imitated"
        )));
    }
    let lustre = &body["LustreConfiguration"];
    let deployment = str_of(lustre, "DeploymentType")
        .unwrap_or("SCRATCH_1")
        .to_owned();
    if !["SCRATCH_1", "SCRATCH_2", "PERSISTENT_1", "PERSISTENT_2"].contains(&deployment.as_str()) {
        return Err(FsxError::bad_request(format!(
            "Invalid DeploymentType {deployment}: it must be SCRATCH_1, SCRATCH_2, PERSISTENT_1 or PERSISTENT_2"
        )));
    }
    let storage_type = str_of(body, "StorageType").unwrap_or("SSD").to_owned();
    let hdd = match storage_type.as_str() {
        "SSD" => false,
        "HDD" if deployment == "PERSISTENT_1" => true,
        "HDD" => {
            return Err(FsxError::incompatible(
                "StorageType",
                format!(
                    "HDD storage is supported only with the PERSISTENT_1 deployment type, not {deployment}"
                ),
            ));
        }
        other => {
            return Err(FsxError::bad_request(format!(
                "StorageType {other} is not imitated by hypd-sim for Lustre (SSD, or HDD with PERSISTENT_1)"
            )));
        }
    };
    let version = str_of(body, "FileSystemTypeVersion")
        .unwrap_or("2.15")
        .to_owned();
    if !["2.10", "2.12", "2.15"].contains(&version.as_str()) {
        return Err(FsxError::bad_request(format!(
            "FileSystemTypeVersion {version} is not supported: use 2.10, 2.12 or 2.15"
        )));
    }
    if version == "2.10" && deployment == "PERSISTENT_2" {
        return Err(FsxError::incompatible(
            "FileSystemTypeVersion",
            "PERSISTENT_2 file systems require Lustre version 2.12 or later",
        ));
    }
    let persistent = deployment.starts_with("PERSISTENT");
    let throughput = lustre["PerUnitStorageThroughput"].as_u64();
    let allowed: &[u64] = match (deployment.as_str(), hdd) {
        ("PERSISTENT_1", false) => &[50, 100, 200],
        ("PERSISTENT_1", true) => &[12, 40],
        ("PERSISTENT_2", _) => &[125, 250, 500, 1000],
        _ => &[],
    };
    match throughput {
        Some(_) if !persistent => {
            return Err(FsxError::bad_request(format!(
                "PerUnitStorageThroughput is only supported for PERSISTENT deployment types, not {deployment}"
            )));
        }
        None if persistent => {
            return Err(FsxError::bad_request(format!(
                "PerUnitStorageThroughput is required for the {deployment} deployment type"
            )));
        }
        Some(t) if !allowed.contains(&t) => {
            return Err(FsxError::new(
                400,
                "InvalidPerUnitStorageThroughput",
                format!(
                    "An invalid value for PerUnitStorageThroughput was provided: {t} is not one of {allowed:?} MB/s/TiB for {deployment}"
                ),
            ));
        }
        _ => {}
    }
    let capacity = body["StorageCapacity"].as_u64().unwrap_or(0);
    let (rule, ok) = match (deployment.as_str(), throughput) {
        ("SCRATCH_1", _) => (
            "1200, 2400 or a multiple of 3600 GiB",
            capacity == 1200 || capacity == 2400 || (capacity > 0 && capacity.is_multiple_of(3600)),
        ),
        ("PERSISTENT_1", Some(12)) if hdd => (
            "a multiple of 6000 GiB",
            capacity > 0 && capacity.is_multiple_of(6000),
        ),
        ("PERSISTENT_1", Some(40)) if hdd => (
            "a multiple of 1800 GiB",
            capacity > 0 && capacity.is_multiple_of(1800),
        ),
        _ => (
            "1200 GiB or a multiple of 2400 GiB",
            capacity == 1200 || (capacity > 0 && capacity.is_multiple_of(2400)),
        ),
    };
    if !ok {
        return Err(FsxError::bad_request(format!(
            "Invalid storage capacity {capacity} GiB: a {deployment} {storage_type} file system takes {rule}"
        )));
    }
    let efa = lustre["EfaEnabled"].as_bool().unwrap_or(false);
    if efa && deployment != "PERSISTENT_2" {
        return Err(FsxError::incompatible(
            "EfaEnabled",
            format!("EFA is supported only on PERSISTENT_2 file systems, not {deployment}"),
        ));
    }
    let metadata = lustre.get("MetadataConfiguration").cloned();
    if metadata.is_some() && deployment != "PERSISTENT_2" {
        return Err(FsxError::incompatible(
            "MetadataConfiguration",
            "MetadataConfiguration is supported only on PERSISTENT_2 file systems",
        ));
    }
    let compression = str_of(lustre, "DataCompressionType")
        .unwrap_or("NONE")
        .to_owned();
    if !["NONE", "LZ4"].contains(&compression.as_str()) {
        return Err(FsxError::bad_request(format!(
            "Invalid DataCompressionType {compression}: NONE or LZ4"
        )));
    }
    let maintenance = str_of(lustre, "WeeklyMaintenanceStartTime").map(str::to_owned);
    if let Some(m) = &maintenance {
        let b = m.as_bytes();
        let ok = b.len() == 7
            && (b'1'..=b'7').contains(&b[0])
            && b[1] == b':'
            && b[4] == b':'
            && m[2..4].parse::<u8>().is_ok_and(|h| h < 24)
            && m[5..7].parse::<u8>().is_ok_and(|mm| mm < 60);
        if !ok {
            return Err(FsxError::bad_request(format!(
                "Invalid WeeklyMaintenanceStartTime {m}: it must be d:HH:MM with d from 1 (Monday) to 7"
            )));
        }
    }
    let subnets: Vec<String> = body["SubnetIds"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s.as_str().map(str::to_owned))
        .collect();
    let [subnet] = subnets.as_slice() else {
        return Err(FsxError::network(format!(
            "Amazon FSx for Lustre file systems take exactly one subnet ID; {} were given",
            subnets.len()
        )));
    };
    let groups: Vec<String> = body["SecurityGroupIds"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s.as_str().map(str::to_owned))
        .collect();
    if groups.len() > 50 {
        return Err(FsxError::bad_request("At most 50 security group IDs"));
    }
    Ok(Spec {
        token: str_of(body, "ClientRequestToken").map(str::to_owned),
        request: without_token(body),
        capacity,
        storage_type,
        subnet: subnet.clone(),
        groups,
        tags: tags_of(body)?,
        version,
        deployment,
        throughput,
        compression,
        efa,
        metadata,
        maintenance,
    })
}

/// A retry of a CreateFileSystem with the same token: its file system, or the token's
/// reuse refused.
fn replay(w: &Aws, region: &str, spec: &Spec) -> Result<Option<Value>, FsxError> {
    let Some(token) = &spec.token else {
        return Ok(None);
    };
    let Some(fs) = w
        .fsx
        .file_systems
        .values()
        .find(|fs| fs.region == region && fs.token.as_ref() == Some(token))
    else {
        return Ok(None);
    };
    if fs.request != spec.request {
        return Err(FsxError::incompatible(
            "ClientRequestToken",
            format!(
                "The ClientRequestToken {token} was already used to create file system {} with different parameters",
                fs.id
            ),
        ));
    }
    Ok(Some(json!({ "FileSystem": w.describe_fs(fs) })))
}

fn check_limits(w: &Aws, region: &str, capacity: u64) -> Result<(), FsxError> {
    let mine: Vec<&FileSystem> = w
        .fsx
        .file_systems
        .values()
        .filter(|fs| fs.region == region)
        .collect();
    if mine.len() >= MAX_FILE_SYSTEMS {
        return Err(FsxError::limit(
            "FILE_SYSTEM_COUNT",
            format!(
                "Account {ACCOUNT} has reached its limit of {MAX_FILE_SYSTEMS} file systems in {region}"
            ),
        ));
    }
    let used: u64 = mine.iter().map(|fs| fs.storage).sum();
    if used + capacity > MAX_TOTAL_STORAGE_GIB {
        return Err(FsxError::limit(
            "TOTAL_STORAGE",
            format!(
                "Total storage capacity in {region} would be {} GiB, over the account's limit of {MAX_TOTAL_STORAGE_GIB} GiB",
                used + capacity
            ),
        ));
    }
    Ok(())
}

/// What moto says of a file system's network.
#[derive(Clone, Debug, Default)]
pub struct Network {
    /// The subnet and its free addresses, if it exists.
    pub subnet: Option<(Subnet, u32)>,
    /// Each security group, if it exists.
    pub groups: Vec<(String, Option<SecurityGroup>)>,
}

/// Whether CIDR block `outer` holds all of `inner` (IPv4).
fn covers(outer: &str, inner: &str) -> bool {
    let parse = |c: &str| -> Option<(u32, u32)> {
        let (ip, len) = c.split_once('/')?;
        let ip: std::net::Ipv4Addr = ip.parse().ok()?;
        let len: u32 = len.parse().ok().filter(|l| *l <= 32)?;
        Some((u32::from(ip), len))
    };
    let (Some((o, ol)), Some((i, il))) = (parse(outer), parse(inner)) else {
        return false;
    };
    let mask = |l: u32| if l == 0 { 0 } else { u32::MAX << (32 - l) };
    ol <= il && (o & mask(ol)) == (i & mask(ol))
}

/// The first LNET port the groups do not admit from themselves or from the subnet.
fn closed_lustre_port(groups: &[SecurityGroup], subnet_cidr: &str) -> Option<u16> {
    let ids: Vec<&str> = groups.iter().map(|g| g.id.as_str()).collect();
    let admits = |port: u16| {
        groups.iter().flat_map(|g| &g.inbound).any(|r| {
            let covers_port = r.protocol == "-1"
                || ((r.protocol == "tcp" || r.protocol == "6")
                    && r.ports.is_some_and(|(lo, hi)| lo <= port && port <= hi));
            let from_us = r.groups.iter().any(|g| ids.contains(&g.as_str()))
                || r.cidrs.iter().any(|c| covers(c, subnet_cidr));
            covers_port && from_us
        })
    };
    LUSTRE_PORTS
        .iter()
        .flat_map(|&(lo, hi)| lo..=hi)
        .find(|&p| !admits(p))
}

/// FSx's checks of the network: the subnet and groups exist, the groups let LNET
/// through, and the subnet has an address for every interface.
fn check_network(spec: &Spec, net: &Network) -> Result<(), FsxError> {
    let Some((subnet, free)) = &net.subnet else {
        return Err(
            FsxError::network(format!("The subnet ID '{}' does not exist", spec.subnet))
                .with("InvalidSubnetId", spec.subnet.as_str()),
        );
    };
    let mut groups = Vec::new();
    for (id, group) in &net.groups {
        match group {
            Some(g) => groups.push(g.clone()),
            None => {
                return Err(FsxError::network(format!(
                    "The security group ID '{id}' does not exist"
                ))
                .with("InvalidSecurityGroupId", id.as_str()));
            }
        }
    }
    if let Some(port) = closed_lustre_port(&groups, &subnet.cidr_block) {
        let ids: Vec<&str> = groups.iter().map(|g| g.id.as_str()).collect();
        let what = if port == 988 {
            "port 988".to_owned()
        } else {
            format!("ports 1018-1023 (port {port})")
        };
        return Err(FsxError::network(format!(
            "The security group(s) {} do not permit Amazon FSx for Lustre LNET network traffic on {what}. Allow inbound TCP on port 988 and ports 1018-1023 from the file system's security groups or its subnet's CIDR block {}.",
            ids.join(", "),
            subnet.cidr_block
        ))
        .with("InvalidSecurityGroupId", ids.first().copied().unwrap_or_default()));
    }
    let need = interfaces(spec.capacity);
    if *free < need {
        return Err(FsxError::network(format!(
            "The subnet {} does not have enough free IP addresses for the file system: it needs {need} and has {free}",
            subnet.id
        ))
        .with("InvalidSubnetId", subnet.id.as_str()));
    }
    Ok(())
}

/// Makes the file system; `interfaces` are made-up ids when there is no moto.
fn insert(
    w: &mut Aws,
    region: &str,
    spec: Spec,
    vpc: &str,
    interfaces_made: Option<Vec<String>>,
) -> Value {
    w.fsx.seq += 1;
    let seq = w.fsx.seq;
    let seed = format!(
        "{region}/{seq}/{}",
        spec.token.as_deref().unwrap_or_default()
    );
    let id = format!("fs-{}", hex_id(&seed, 17));
    let enis = interfaces_made.unwrap_or_else(|| {
        (0..interfaces(spec.capacity))
            .map(|i| format!("eni-{}", hex_id(&format!("{id}/{i}"), 17)))
            .collect()
    });
    let now = w.clock.now();
    let h = fnv1a(&id);
    let maintenance = spec.maintenance.clone().unwrap_or_else(|| {
        format!(
            "{}:{:02}:{:02}",
            h % 7 + 1,
            (h >> 8) % 24,
            ((h >> 16) % 2) * 30
        )
    });
    let mut lustre = json!({
        "WeeklyMaintenanceStartTime": maintenance,
        "DeploymentType": spec.deployment,
        "MountName": if spec.deployment == "SCRATCH_1" { "fsx".to_owned() } else { mount_name(&id) },
        "DataCompressionType": spec.compression,
        "EfaEnabled": spec.efa,
        "LogConfiguration": { "Level": "DISABLED" },
    });
    if let Some(t) = spec.throughput {
        lustre["PerUnitStorageThroughput"] = json!(t);
    }
    if let Some(m) = &spec.metadata {
        lustre["MetadataConfiguration"] = m.clone();
    }
    let desc = json!({
        "OwnerId": ACCOUNT,
        "CreationTime": w.clock.epoch(now).floor(),
        "FileSystemId": id,
        "FileSystemType": "LUSTRE",
        "StorageCapacity": spec.capacity,
        "StorageType": spec.storage_type,
        "VpcId": vpc,
        "SubnetIds": [spec.subnet],
        "NetworkInterfaceIds": enis,
        "DNSName": format!("{id}.fsx.{region}.amazonaws.com"),
        "ResourceARN": format!("arn:aws:fsx:{region}:{ACCOUNT}:file-system/{id}"),
        "Tags": spec.tags,
        "FileSystemTypeVersion": spec.version,
        "LustreConfiguration": lustre,
    });
    let fs = FileSystem {
        id: id.clone(),
        region: region.to_owned(),
        seq,
        token: spec.token,
        request: spec.request,
        created: now,
        deleting: None,
        failure: w
            .failing("fsx", "CreateFileSystem")
            .map(|(code, message)| format!("{code}: {message}")),
        storage: spec.capacity,
        desc,
    };
    let out = json!({ "FileSystem": w.describe_fs(&fs) });
    w.fsx.file_systems.insert(id, fs);
    w.kube.wake_all();
    out
}

/// CreateFileSystem: checked, then the network asked of moto and the interfaces made
/// there with no lock held, then recorded.
async fn create_file_system(state: &Shared, region: &str, body: &Value) -> Result<Value, FsxError> {
    let mut spec = check_create(body)?;
    {
        let mut w = state.aws.lock().await;
        w.settle_fsx();
        if let Some(out) = replay(&w, region, &spec)? {
            return Ok(out);
        }
        check_limits(&w, region, spec.capacity)?;
    }
    let (vpc, enis) = match &state.moto {
        Some(moto) => {
            let subnet = moto.subnet_with_free_ips(region, &spec.subnet).await?;
            if spec.groups.is_empty()
                && let Some((s, _)) = &subnet
                && let Some(default) = moto.default_security_group(region, &s.vpc_id).await?
            {
                spec.groups.push(default);
            }
            let mut groups = Vec::new();
            for id in &spec.groups {
                groups.push((id.clone(), moto.security_group(region, id).await?));
            }
            let net = Network { subnet, groups };
            check_network(&spec, &net)?;
            let vpc = net.subnet.map(|(s, _)| s.vpc_id).unwrap_or_default();
            let enis = make_interfaces(moto, region, &spec).await?;
            (vpc, Some(enis))
        }
        None => (format!("vpc-{}", hex_id(&spec.subnet, 17)), None),
    };
    let mut w = state.aws.lock().await;
    w.settle_fsx();
    Ok(insert(&mut w, region, spec, &vpc, enis))
}

async fn make_interfaces(moto: &Moto, region: &str, spec: &Spec) -> Result<Vec<String>, FsxError> {
    let mut made = Vec::new();
    for _ in 0..interfaces(spec.capacity) {
        match moto
            .create_network_interface(
                region,
                &spec.subnet,
                &spec.groups,
                "Amazon FSx for Lustre network interface",
            )
            .await
        {
            Ok(id) => made.push(id),
            Err(e) => {
                for id in &made {
                    let _ = moto.delete_network_interface(region, id).await;
                }
                return Err(e.into());
            }
        }
    }
    Ok(made)
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

fn describe_file_systems(w: &Aws, region: &str, body: &Value) -> Result<Value, FsxError> {
    let all: Vec<Value> = match body["FileSystemIds"].as_array() {
        Some(ids) => ids
            .iter()
            .map(|id| {
                let id = id.as_str().unwrap_or_default();
                w.file_system(region, id).map(|fs| w.describe_fs(fs))
            })
            .collect::<Result<_, _>>()?,
        None => {
            let mut mine: Vec<&FileSystem> = w
                .fsx
                .file_systems
                .values()
                .filter(|fs| fs.region == region)
                .collect();
            mine.sort_by_key(|fs| fs.seq);
            mine.into_iter().map(|fs| w.describe_fs(fs)).collect()
        }
    };
    page(all, body, i32::MAX as u64, "FileSystems")
}

fn delete_file_system(w: &mut Aws, region: &str, body: &Value) -> Result<Value, FsxError> {
    let id = str_of(body, "FileSystemId").unwrap_or_default().to_owned();
    let fs = w.file_system(region, &id)?;
    match fs_lifecycle(fs, w.clock.now(), &w.fsx_stuck()) {
        Lifecycle::Available | Lifecycle::Failed => {}
        Lifecycle::Deleting | Lifecycle::Gone => {
            return Ok(json!({ "FileSystemId": id, "Lifecycle": "DELETING" }));
        }
        Lifecycle::Creating => {
            return Err(FsxError::bad_request(format!(
                "Unable to delete file system {id}: it is in the CREATING lifecycle state; a file system can be deleted once it is AVAILABLE or FAILED"
            )));
        }
    }
    let now = w.clock.now();
    if let Some(fs) = w.fsx.file_systems.get_mut(&id) {
        fs.deleting = Some(now);
    }
    for a in w.fsx.associations.values_mut() {
        if a.fs_id == id && a.deleting.is_none() {
            a.deleting = Some(now);
        }
    }
    w.kube.wake_all();
    Ok(json!({ "FileSystemId": id, "Lifecycle": "DELETING" }))
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
pub fn bucket_of(path: &str) -> Option<&str> {
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
fn create_association(
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

fn describe_associations(w: &Aws, region: &str, body: &Value) -> Result<Value, FsxError> {
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

fn delete_association(w: &mut Aws, region: &str, body: &Value) -> Result<Value, FsxError> {
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

/// Deletes in moto the network interfaces of file systems that are gone.
async fn release_interfaces(state: &Shared) {
    let released = {
        let mut w = state.aws.lock().await;
        w.settle_fsx();
        std::mem::take(&mut w.fsx.released)
    };
    if let Some(moto) = &state.moto {
        for (region, eni) in released {
            if let Err(e) = moto.delete_network_interface(&region, &eni).await {
                tracing::warn!(%eni, message = %e.message, "cannot delete an FSx interface in moto");
            }
        }
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
