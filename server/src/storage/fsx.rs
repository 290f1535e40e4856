//! `create_fsx_storage`: an FSx for Lustre file system in the cluster's compute subnet,
//! with its security group, mounted through the FSx CSI driver as a static volume and
//! claim. A file system takes minutes to become AVAILABLE and cannot be renamed or
//! found by name, so it is made once (tags and a client token) and everything that
//! would make FSx refuse it or leave pods hanging is refused before: the sizes the
//! deployment type allows (the request's own validation), a subnet without the
//! addresses the file system takes, a security group that is not in the subnet's VPC,
//! EFA without a group open to itself, a linked bucket that does not exist. Lustre's
//! ports are opened within the group by the first stage where they are not.

use std::time::Duration;

use app::api::ApiError;
use app::api::storage::{CreateFsxStorage, SHARED_CLAIM, lustre_addresses};
use app::api::values::IdempotencyKey;
use k8s_openapi::api::core::v1::{Node, PersistentVolume};
use kube::Api;
use kube::api::ListParams;
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::check::Findings;
use super::find;
use crate::aws::{Aws, SdkResultExt};
use crate::cluster::dependencies::FEATURE_COMPONENTS;
use crate::cluster::managed::{Where, locate};
use crate::cluster::storage::{Claimed, NAMESPACE, STORAGE_LABEL, claimed_volume};
use crate::operation::pipeline::{Context, Pipeline, Preflight, Progress, stages};
use crate::resources::ec2::lustre_ports::{self, LustrePorts};
use crate::resources::fsx::association::{Associations, Link};
use crate::resources::fsx::file_system::{self, FileSystem, Spec};
use crate::resources::kube::object::Applied;
use crate::resources::kube::{self as kubernetes};
use crate::resources::s3::bucket::{Bucket, Files};
use crate::resources::{Resource, Want, converge, is_planning, missing};

/// The FSx CSI driver's name, as volumes name it.
pub const DRIVER: &str = "fsx.csi.aws.com";
/// The EKS add-on that brings it.
pub const DRIVER_ADDON: &str = "aws-fsx-csi-driver";

stages! {
    pub enum Stage {
        Network = "network", "Lustre's ports (TCP 988, 1018-1023) open within the security group, added only where missing", true;
        Driver = "driver", "The FSx CSI driver add-on installed and ACTIVE (when the cluster has none)", true;
        FileSystem = "file_system", "The Lustre file system created, tagged for the storage", true;
        Available = "available", "The file system AVAILABLE (FSx takes minutes)", true;
        Repositories = "repositories", "The data repository associations created and AVAILABLE", true;
        Volume = "volume", "The PersistentVolume (FSx CSI, the file system's DNS and mount name) and its claim applied", true;
        Bound = "bound", "The claim Bound to its volume", true;
    }
}

/// What the stages made, stored with the operation. Field names are stored: never rename.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Outputs {
    /// Where the file system is: its subnet and security group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subnet: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub security_group: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file_system: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lifecycle: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dns_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mount_name: Option<String>,
    /// The associations' ids.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub associations: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub persistent_volume: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
}

const POLL: Duration = Duration::from_secs(15);

/// What reading or changing a cluster's file systems needs of it.
const NEEDS: &str = "its storage is read and changed in an active or imported cluster";

/// The driver's add-on as hypd pins it.
fn driver_addon() -> &'static crate::cluster::dependencies::Addon {
    FEATURE_COMPONENTS
        .iter()
        .find(|a| a.name == DRIVER_ADDON)
        .expect("the FSx CSI driver is pinned with the feature components")
}

/// Whether any storage of the cluster at `at` mounts through the FSx driver.
pub(crate) async fn mounted(aws: &Aws, at: &Where) -> Result<bool, ApiError> {
    let client = kubernetes::connect(aws, &at.region, &at.eks).await?;
    let volumes = Api::<PersistentVolume>::all(client);
    let mut any = false;
    kubernetes::each_listed(
        &volumes,
        ListParams::default().labels(&format!("{STORAGE_LABEL}=fsx")),
        |_| any = true,
    )
    .await?;
    Ok(any)
}

fn subnet(r: &CreateFsxStorage) -> Result<&str, ApiError> {
    r.subnet_id
        .as_deref()
        .ok_or_else(|| missing("the file system's subnet"))
}

fn group(r: &CreateFsxStorage) -> Result<&str, ApiError> {
    r.security_group_id
        .as_deref()
        .ok_or_else(|| missing("the file system's security group"))
}

/// The links as FSx takes them (buckets filled in by the pre-flight).
fn links(r: &CreateFsxStorage) -> Result<Vec<Link>, ApiError> {
    r.data_repositories
        .iter()
        .map(|d| {
            let bucket = d
                .bucket
                .as_ref()
                .ok_or_else(|| missing("a data repository's bucket"))?;
            Ok(Link {
                file_system_path: d.file_system_path.clone(),
                data_repository_path: d.s3_path(bucket.as_str()),
            })
        })
        .collect()
}

fn file_system(r: &CreateFsxStorage, aws: &Aws, region: &str, cx: Option<&Context>) -> FileSystem {
    FileSystem {
        fsx: aws.fsx(region),
        cluster: r.name.to_string(),
        storage: r.storage.to_string(),
        want: match cx {
            Some(cx) => Want::Present(Spec {
                deployment: r.deployment_type.as_aws(),
                capacity_gib: r.capacity_gib,
                throughput: r.throughput(),
                efa: r.efa,
                subnet_id: r.subnet_id.clone().unwrap_or_default(),
                security_group_id: r.security_group_id.clone().unwrap_or_default(),
                token: crate::resources::fsx::token(&cx.operation_id, "fs"),
            }),
            None => Want::Absent,
        },
    }
}

impl Pipeline for CreateFsxStorage {
    type Stage = Stage;
    type Outputs = Outputs;

    fn target(&self) -> String {
        crate::cluster::target(self.name.as_str())
    }

    fn idempotency_key(&self) -> Option<&IdempotencyKey> {
        self.idempotency_key.as_ref()
    }

    /// Fills in the mount path, subnet, security group and linked buckets (stored with
    /// the request, so a resumed run makes what the plan showed) and refuses what FSx
    /// would refuse or pods could not mount.
    async fn preflight(mut self, cx: &Preflight<'_>) -> Result<Self, ApiError> {
        let cluster = self.name.to_string();
        let at = locate(cx.store, &cluster, NEEDS).await?;
        if self.mount_path.is_none() {
            self.mount_path = Some(
                self.mount()
                    .parse()
                    .map_err(|e: String| ApiError::field("mount_path", e))?,
            );
        }
        let client = kubernetes::connect(cx.aws, &at.region, &cluster).await?;
        super::claimable(
            cx.aws,
            cx.store,
            &client,
            &cluster,
            self.storage.as_str(),
            &self.mount(),
        )
        .await?;

        // Where the nodes are: the HyperPod cluster's subnets and security group.
        let described = cx
            .aws
            .sagemaker(&at.region)
            .describe_cluster()
            .cluster_name(&at.hyperpod)
            .send()
            .await
            .upstream("sagemaker", "DescribeCluster")?;
        let vpc = described.vpc_config();
        if self.subnet_id.is_none() {
            self.subnet_id = vpc.and_then(|v| v.subnets().first()).cloned();
        }
        if self.security_group_id.is_none() {
            self.security_group_id = vpc.and_then(|v| v.security_group_ids().first()).cloned();
        }
        let (subnet, group) = (
            self.subnet_id.clone().ok_or_else(|| {
                ApiError::field("subnet_id", "the cluster has no subnet: name one")
            })?,
            self.security_group_id.clone().ok_or_else(|| {
                ApiError::field("security_group_id", "the cluster has no security group")
            })?,
        );
        let ec2 = cx.aws.ec2(&at.region);
        let subnets = ec2
            .describe_subnets()
            .subnet_ids(&subnet)
            .send()
            .await
            .found("ec2", "DescribeSubnets")?;
        let Some(found) = subnets.as_ref().and_then(|s| s.subnets().first()) else {
            return Err(ApiError::field(
                "subnet_id",
                format!("subnet {subnet} does not exist in {}", at.region),
            ));
        };
        // A file system takes addresses in its subnet; one that runs it dry leaves no
        // room for the nodes HyperPod replaces.
        let needed = lustre_addresses(self.capacity_gib);
        let free = found.available_ip_address_count().unwrap_or(0).max(0) as u32;
        if free < needed {
            return Err(ApiError::field(
                "subnet_id",
                format!(
                    "subnet {subnet} has {free} free addresses; a {} GiB Lustre file system takes {needed}",
                    self.capacity_gib
                ),
            ));
        }
        let groups = ec2
            .describe_security_groups()
            .group_ids(&group)
            .send()
            .await
            .found("ec2", "DescribeSecurityGroups")?;
        let Some(g) = groups.as_ref().and_then(|g| g.security_groups().first()) else {
            return Err(ApiError::field(
                "security_group_id",
                format!("security group {group} does not exist"),
            ));
        };
        if g.vpc_id() != found.vpc_id() {
            return Err(ApiError::field(
                "subnet_id",
                format!(
                    "subnet {subnet} is in {}, security group {group} in {}: they must share a VPC",
                    found.vpc_id().unwrap_or("?"),
                    g.vpc_id().unwrap_or("?")
                ),
            ));
        }
        if self.efa
            && !lustre_ports::lacking(g.ip_permissions(), g.ip_permissions_egress(), &group)
                .all_within
        {
            return Err(ApiError::field(
                "efa",
                format!(
                    "an EFA file system needs all traffic allowed within security group {group}, both in and out; allow it (aws ec2 authorize-security-group-ingress/-egress --group-id {group} --protocol all --source-group {group}) or omit efa"
                ),
            ));
        }

        // Linked buckets: the shared one unless named, each there.
        let shared = find(&client, SHARED_CLAIM).await?.and_then(|f| f.bucket());
        for (i, r) in self.data_repositories.iter_mut().enumerate() {
            let field = format!("data_repositories[{i}].bucket");
            if r.bucket.is_none() {
                let name = shared.clone().ok_or_else(|| {
                    ApiError::field(&field, "the cluster has no shared bucket: name one")
                })?;
                r.bucket = Some(
                    name.parse()
                        .map_err(|e: String| ApiError::field(&field, e))?,
                );
            }
            let bucket = r.bucket.as_ref().map(|b| b.to_string()).unwrap_or_default();
            let there = Bucket {
                s3: cx.aws.s3(&at.region),
                name: bucket.clone(),
                region: at.region.clone(),
                cluster: cluster.clone(),
                want: Want::Present(()),
                hypd_files: Files::None,
                field: "data_repositories",
                adopt: false,
                harden: false,
            }
            .observe()
            .await?
            .exists;
            if !there {
                return Err(ApiError::field(
                    field,
                    format!("bucket {bucket} does not exist in {}", at.region),
                ));
            }
        }
        // Two links to one S3 path would import the same objects twice.
        let links = links(&self)?;
        for (i, l) in links.iter().enumerate() {
            if let Some(j) = links[..i]
                .iter()
                .position(|o| o.data_repository_path == l.data_repository_path)
            {
                return Err(ApiError::field(
                    format!("data_repositories[{i}].prefix"),
                    format!(
                        "{} is linked by data_repositories[{j}] already: one association per S3 path",
                        l.data_repository_path
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
        let at = locate(&cx.store, cluster, NEEDS).await?;
        let region = at.region.clone();
        match stage {
            Stage::Network => {
                converge(&LustrePorts {
                    ec2: cx.aws.ec2(&region),
                    group_id: group(self)?.to_owned(),
                })
                .await?;
                out.subnet = Some(subnet(self)?.to_owned());
                out.security_group = Some(group(self)?.to_owned());
                Ok(Progress::Done)
            }
            Stage::Driver => {
                let pending =
                    crate::features::ensure_component(&cx.aws, &at, driver_addon()).await?;
                if is_planning() {
                    return Ok(Progress::Done);
                }
                Ok(Progress::unless(
                    POLL,
                    pending.map(|p| format!("waiting for the add-on: {p}")),
                ))
            }
            Stage::FileSystem => {
                subnet(self)?;
                let found = converge(&file_system(self, &cx.aws, &region, Some(cx))).await?;
                out.file_system = found.id;
                out.lifecycle = found.lifecycle;
                Ok(Progress::Done)
            }
            Stage::Available => {
                if is_planning() {
                    return Ok(Progress::Done);
                }
                let found = file_system(self, &cx.aws, &region, Some(cx))
                    .observe()
                    .await?;
                let id = found
                    .id
                    .clone()
                    .ok_or_else(|| missing("the storage's file system"))?;
                found.check()?;
                out.file_system = Some(id.clone());
                out.lifecycle = found.lifecycle.clone();
                out.dns_name = found.dns_name.clone();
                out.mount_name = found.mount_name.clone();
                Ok(Progress::unless(
                    POLL,
                    (!found.available()).then(|| {
                        format!(
                            "file system {id} is {}",
                            found.lifecycle.as_deref().unwrap_or("being created")
                        )
                    }),
                ))
            }
            Stage::Repositories => {
                let id = out
                    .file_system
                    .clone()
                    .ok_or_else(|| missing("the storage's file system"))?;
                let found = converge(&Associations {
                    fsx: cx.aws.fsx(&region),
                    cluster: cluster.to_owned(),
                    storage: self.storage.to_string(),
                    file_system_id: id,
                    want: links(self)?,
                    operation: cx.operation_id.clone(),
                })
                .await?;
                let mut pending = Vec::new();
                for a in &found {
                    a.check()?;
                    if a.lifecycle != "AVAILABLE" {
                        pending.push(format!(
                            "{} → {} {}",
                            a.link.file_system_path, a.link.data_repository_path, a.lifecycle
                        ));
                    }
                }
                out.associations = found.iter().map(|a| a.id.clone()).collect();
                if is_planning() {
                    return Ok(Progress::Done);
                }
                Ok(Progress::unless_pending(POLL, &pending, |p| {
                    format!("data repository associations: {p}")
                }))
            }
            Stage::Volume => {
                let client = kubernetes::connect(&cx.aws, &region, cluster).await?;
                let known = |v: &Option<String>, what: &str| {
                    v.clone()
                        .or_else(|| {
                            is_planning().then(|| app::api::plan::KNOWN_AFTER_APPLY.to_owned())
                        })
                        .ok_or_else(|| missing(what))
                };
                let id = known(&out.file_system, "the storage's file system")?;
                let dns = known(&out.dns_name, "the file system's DNS name")?;
                let mount_name = known(&out.mount_name, "the file system's mount name")?;
                let name = volume_name(&id);
                let capacity = format!("{}Gi", self.capacity_gib);
                let mount = self.mount();
                let (pv, pvc) = claimed_volume(Claimed {
                    volume: &name,
                    kind: "fsx",
                    capacity: &capacity,
                    claim: self.storage.as_str(),
                    mount: Some(&mount),
                    // Without flock, applications that lock files fail on Lustre.
                    mount_options: json!(["flock"]),
                    csi: json!({
                        "driver": DRIVER,
                        "volumeHandle": id,
                        "volumeAttributes": { "dnsname": dns, "mountname": mount_name },
                    }),
                });
                converge(&Applied::cluster(&client, pv)).await?;
                converge(&Applied::namespaced(&client, pvc)).await?;
                out.persistent_volume = Some(name);
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

/// The volume of file system `id`: one per file system, so two claims never share it.
pub fn volume_name(id: &str) -> String {
    format!("fsx-{id}")
}

/// Where `delete_storage`'s file system stands.
pub(crate) enum Deleted {
    Gone,
    /// Not hypd's for this storage: why it stays.
    Kept(String),
    /// FSx is deleting it: a progress note.
    Deleting(String),
}

/// `delete_storage`'s file system `id`: deleted if hypd made it for storage `storage`
/// (its tags), else kept.
pub(crate) async fn delete(
    aws: &Aws,
    region: &str,
    cluster: &str,
    storage: &str,
    id: &str,
) -> Result<Deleted, ApiError> {
    let fs = FileSystem {
        fsx: aws.fsx(region),
        cluster: cluster.to_owned(),
        storage: storage.to_owned(),
        want: Want::Absent,
    };
    let after = converge(&fs).await?;
    if is_planning() {
        return Ok(Deleted::Gone);
    }
    Ok(match after.id {
        Some(found) => Deleted::Deleting(format!(
            "file system {found} is {}",
            after.lifecycle.as_deref().unwrap_or("being deleted")
        )),
        // None carries hypd's tags for this storage: the volume named someone else's.
        None if file_system::by_id(&aws.fsx(region), id).await?.is_some() => Deleted::Kept(
            format!("kept file system {id}: hypd did not make it for {storage}"),
        ),
        None => Deleted::Gone,
    })
}

/// `delete_cluster`'s file systems: each one hypd made for a storage of cluster
/// `cluster` deleted (`delete`), or named in what is kept (an imported cluster keeps its
/// EKS cluster, whose pods may still mount them). Progress while FSx deletes them.
pub(crate) async fn teardown(
    aws: &Aws,
    region: &str,
    cluster: &str,
    delete: bool,
) -> Result<(Progress, Vec<String>), ApiError> {
    let mut storages = std::collections::BTreeMap::new();
    for fs in file_system::all(&aws.fsx(region)).await? {
        let tag = |k: &str| {
            fs.tags()
                .iter()
                .find(|t| t.key() == Some(k))
                .and_then(|t| t.value())
        };
        if tag(crate::resources::tags::CLUSTER) == Some(cluster)
            && let (Some(storage), Some(id)) =
                (tag(crate::resources::tags::STORAGE), fs.file_system_id())
        {
            storages.insert(storage.to_owned(), id.to_owned());
        }
    }
    if !delete {
        let kept = storages
            .iter()
            .map(|(storage, id)| {
                format!(
                    "kept file system {id} (storage {storage}): the imported EKS cluster may still mount it; aws fsx delete-file-system --file-system-id {id} deletes it"
                )
            })
            .collect();
        return Ok((Progress::Done, kept));
    }
    let mut deleting = Vec::new();
    for (storage, id) in &storages {
        if let Deleted::Deleting(note) = self::delete(aws, region, cluster, storage, id).await? {
            deleting.push(note);
        }
    }
    Ok((
        Progress::unless_pending(POLL, &deleting, |d| format!("deleting: {d}")),
        Vec::new(),
    ))
}

/// The Lustre client version of a node image, as the images HyperPod and EKS nodes run
/// ship it: Amazon Linux 2's is 2.12, Amazon Linux 2023's and Ubuntu 22.04's 2.15.
fn client_version(os_image: &str) -> Option<&'static str> {
    if os_image.starts_with("Amazon Linux 2023") || os_image.starts_with("Ubuntu 22.04") {
        Some("2.15")
    } else if os_image.starts_with("Amazon Linux 2") || os_image.starts_with("Ubuntu 20.04") {
        Some("2.12")
    } else {
        None
    }
}

/// `check_storage`'s rules for FSx storage `storage` mounted from volume `pv`: the
/// driver installed, the file system AVAILABLE at the DNS and mount name the volume
/// names, Lustre's ports open in its security group, and every node's Lustre client
/// able to mount it (EFA file systems need 2.15 clients).
pub(crate) async fn check(
    aws: &Aws,
    region: &str,
    cluster: &str,
    storage: &str,
    pv: &PersistentVolume,
    findings: &mut Findings,
) -> Result<(), ApiError> {
    let at = Some(storage);
    let Some(csi) = pv.spec.as_ref().and_then(|s| s.csi.as_ref()) else {
        return Ok(());
    };
    let attrs = csi.volume_attributes.clone().unwrap_or_default();
    let id = csi.volume_handle.clone();
    let client = kubernetes::connect(aws, region, cluster).await?;
    let daemonsets =
        Api::<k8s_openapi::api::apps::v1::DaemonSet>::namespaced(client.clone(), "kube-system");
    if kubernetes::get(&daemonsets, "fsx-csi-node")
        .await?
        .is_none()
    {
        findings.add(
            at,
            "fsx_driver",
            true,
            format!("the FSx CSI driver is not installed on {cluster}: pods that mount {storage} wait in ContainerCreating"),
            Some(format!("aws eks create-addon --cluster-name {cluster} --addon-name {DRIVER_ADDON}")),
        );
    }
    let Some(fs) = file_system::by_id(&aws.fsx(region), &id).await? else {
        findings.add(
            at,
            "file_system_exists",
            true,
            format!("file system {id} does not exist in {region}"),
            Some(format!(
                "delete_storage {storage}, then create_fsx_storage again"
            )),
        );
        return Ok(());
    };
    let lifecycle = fs.lifecycle().map_or("UNKNOWN", |l| l.as_str());
    if lifecycle != "AVAILABLE" {
        findings.add(
            at,
            "file_system_available",
            lifecycle != "CREATING" && lifecycle != "UPDATING",
            format!("file system {id} is {lifecycle}"),
            Some(format!(
                "aws fsx describe-file-systems --file-system-ids {id}"
            )),
        );
    }
    let mount_name = fs.lustre_configuration().and_then(|l| l.mount_name());
    if attrs.get("dnsname").map(String::as_str) != fs.dns_name()
        || attrs.get("mountname").map(String::as_str) != mount_name
    {
        findings.add(
            at,
            "volume_attributes",
            true,
            format!(
                "volume {} mounts {}@tcp:/{}, but file system {id} is {}@tcp:/{}",
                pv.metadata.name.as_deref().unwrap_or("?"),
                attrs.get("dnsname").map_or("?", String::as_str),
                attrs.get("mountname").map_or("?", String::as_str),
                fs.dns_name().unwrap_or("?"),
                mount_name.unwrap_or("?")
            ),
            Some(format!(
                "delete_storage {storage}, then create_fsx_storage again"
            )),
        );
    }
    // Lustre's ports, in every group the file system's interfaces have.
    let interfaces = aws
        .ec2(region)
        .describe_network_interfaces()
        .set_network_interface_ids(Some(fs.network_interface_ids().to_vec()))
        .send()
        .await
        .found("ec2", "DescribeNetworkInterfaces")?;
    let groups: std::collections::BTreeSet<String> = interfaces
        .iter()
        .flat_map(|o| o.network_interfaces())
        .flat_map(|n| n.groups())
        .filter_map(|g| g.group_id().map(str::to_owned))
        .collect();
    for group in groups {
        let ports = LustrePorts {
            ec2: aws.ec2(region),
            group_id: group.clone(),
        }
        .observe()
        .await?;
        for r in ports.missing {
            findings.add(
                at,
                "lustre_ports",
                true,
                format!(
                    "security group {group} does not let TCP {}-{} in from itself: Lustre mounts time out",
                    r.start(),
                    r.end()
                ),
                Some(format!(
                    "aws ec2 authorize-security-group-ingress --group-id {group} --protocol tcp --port {}-{} --source-group {group}",
                    r.start(),
                    r.end()
                )),
            );
        }
    }
    // Each node's Lustre client, from its image.
    let efa = fs
        .lustre_configuration()
        .and_then(|l| l.efa_enabled())
        .unwrap_or(false);
    let nodes = Api::<Node>::all(client);
    let mut old = Vec::new();
    kubernetes::each_listed(&nodes, ListParams::default(), |n| {
        let image = n
            .status
            .as_ref()
            .and_then(|s| s.node_info.as_ref())
            .map(|i| i.os_image.clone())
            .unwrap_or_default();
        let version = client_version(&image);
        let too_old = match version {
            Some("2.12") => efa,
            Some(_) => false,
            None => false,
        };
        if too_old {
            old.push(format!(
                "{} ({image})",
                n.metadata.name.clone().unwrap_or_default()
            ));
        }
    })
    .await?;
    if !old.is_empty() {
        findings.add(
            at,
            "lustre_client",
            true,
            format!(
                "file system {id} uses EFA, which needs Lustre 2.15 clients; these nodes have 2.12: {}",
                old.join(", ")
            ),
            Some("update_cluster_software (to an image with Amazon Linux 2023)".to_owned()),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_images_name_their_lustre_client() {
        assert_eq!(client_version("Amazon Linux 2"), Some("2.12"));
        assert_eq!(client_version("Amazon Linux 2023.6.20241010"), Some("2.15"));
        assert_eq!(client_version("Ubuntu 22.04.5 LTS"), Some("2.15"));
        assert_eq!(client_version("Bottlerocket"), None);
    }

    #[test]
    fn a_filled_request_plans_the_same_file_system() {
        let r: CreateFsxStorage = serde_json::from_value(serde_json::json!({
            "name": "ml-1", "storage": "scratch", "capacity_gib": 2400,
            "subnet_id": "subnet-1", "security_group_id": "sg-1",
            "data_repositories": [{"file_system_path": "/data", "bucket": "my-data", "prefix": "datasets"}]
        }))
        .unwrap();
        assert_eq!(r.throughput(), Some(250));
        assert_eq!(r.mount(), "/mnt/scratch");
        assert_eq!(
            links(&r).unwrap(),
            [Link {
                file_system_path: "/data".into(),
                data_repository_path: "s3://my-data/datasets/".into()
            }]
        );
    }
}
