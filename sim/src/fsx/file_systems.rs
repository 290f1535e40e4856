//! Lustre file systems: CreateFileSystem, DescribeFileSystems, DeleteFileSystem, and what
//! a pod's mount reads of them. Every check of a request, then of its network in moto,
//! runs before anything is made, and moto is asked with the world unlocked (an HTTP
//! round trip per subnet, group and interface would otherwise hold every other service
//! up), so a refused or failed creation leaves neither a file system nor an interface.

use serde_json::{Value, json};

use super::{FileSystem, FsxError, Lifecycle, hex_id, page, str_of, tags_of, without_token};
use crate::clock::reached;
use crate::moto::{Moto, SecurityGroup, Subnet};
use crate::world::{ACCOUNT, Aws, Shared, fnv1a};

/// Real Lustre creations take 5-10 minutes; the sim takes as long as an EKS cluster.
pub(super) const CREATE_SECS: f64 = 600.0;
pub(super) const DELETE_SECS: f64 = 300.0;
/// The default per-region quotas for Lustre.
pub(super) const MAX_FILE_SYSTEMS: usize = 100;
pub(super) const MAX_TOTAL_STORAGE_GIB: u64 = 100_800;
/// LNET's ports, which a file system's security groups must admit from themselves.
const LUSTRE_PORTS: [(u16, u16); 2] = [(988, 988), (1018, 1023)];

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
pub(super) fn interfaces(capacity: u64) -> u32 {
    1 + capacity.div_ceil(2400) as u32
}

pub(super) fn fs_lifecycle(fs: &FileSystem, now: f64, stuck: &impl Fn(&str) -> bool) -> Lifecycle {
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

impl Aws {
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

/// What a CreateFileSystem asks for, checked as FSx checks it before looking at the
/// network.
#[derive(Clone, Debug)]
pub(super) struct Spec {
    token: Option<String>,
    request: Value,
    pub(super) capacity: u64,
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

pub(super) fn check_create(body: &Value) -> Result<Spec, FsxError> {
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
pub(super) fn replay(w: &Aws, region: &str, spec: &Spec) -> Result<Option<Value>, FsxError> {
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

pub(super) fn check_limits(w: &Aws, region: &str, capacity: u64) -> Result<(), FsxError> {
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
pub(super) struct Network {
    /// The subnet and its free addresses, if it exists.
    pub(super) subnet: Option<(Subnet, u32)>,
    /// Each security group, if it exists.
    pub(super) groups: Vec<(String, Option<SecurityGroup>)>,
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
pub(super) fn check_network(spec: &Spec, net: &Network) -> Result<(), FsxError> {
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
pub(super) fn insert(
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
pub(super) async fn create_file_system(
    state: &Shared,
    region: &str,
    body: &Value,
) -> Result<Value, FsxError> {
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

pub(super) fn describe_file_systems(
    w: &Aws,
    region: &str,
    body: &Value,
) -> Result<Value, FsxError> {
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

pub(super) fn delete_file_system(
    w: &mut Aws,
    region: &str,
    body: &Value,
) -> Result<Value, FsxError> {
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

/// Deletes in moto the network interfaces of file systems that are gone.
pub(super) async fn release_interfaces(state: &Shared) {
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
