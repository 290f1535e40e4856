//! Creating a cluster from decision-level inputs: network → IAM → EKS control plane →
//! access → active cluster → EKS add-ons → HyperPod node components → shared bucket and
//! HyperPod cluster with its instance groups and Ready nodes → shared storage. Each stage
//! observes, diffs and applies only the changes (`crate::resources`), so a stage run again
//! after a crash or a retry adopts what it made and makes nothing twice.

use std::collections::BTreeMap;
use std::time::Duration;

use app::api::clusters::CreateCluster;
use app::api::values::IdempotencyKey;
use app::api::{ApiError, Command};
use serde::{Deserialize, Serialize};

use super::dependencies::DEFAULT_KUBERNETES_VERSION;
use super::managed::{self, Desired, Managed};
use super::network::{self, Network};
use super::{access, addons, components, hyperpod, identity, storage};
use crate::operation::pipeline::{Context, Pipeline, Preflight, Progress, stages};
use crate::resources::eks::cluster::{ControlPlaneSpec, EksCluster};
use crate::resources::sagemaker::cluster::Unlisted;
use crate::resources::{Want, converge, is_planning, kube, missing};

const EKS_POLL: Duration = Duration::from_secs(30);
const NODE_POLL: Duration = Duration::from_secs(30);

stages! {
    pub enum Stage {
        Network = "network", "Network: VPC, subnets, NAT, S3 endpoint, EFA security group", true;
        Iam = "iam", "IAM: EKS cluster role, HyperPod execution role, S3 CSI driver role", true;
        Eks = "eks", "EKS control plane (about 10 minutes on AWS)", false;
        Access = "access", "OIDC provider and hypd's cluster-admin access entry", true;
        Activate = "activate", "Record the cluster and make it your active cluster", true;
        Addons = "addons", "EKS add-ons: pod identity agent, Mountpoint for S3 CSI driver, cert-manager, metrics-server", true;
        Components = "components", "HyperPod node components: health-monitoring agent, NVIDIA and EFA device plugins", true;
        Hyperpod = "hyperpod", "Shared bucket and lifecycle script; HyperPod cluster with automatic node recovery, nodes Ready (15-20 minutes on AWS)", false;
        Storage = "storage", "Shared storage: the S3 bucket as a Mountpoint PersistentVolume and claim", true;
    }
}

/// What the stages made, stored with the operation. Field names are stored: never rename.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Outputs {
    #[serde(default)]
    pub network: Network,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eks_role_arn: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub execution_role_arn: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub s3_csi_role_arn: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eks_cluster_arn: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kubernetes_version: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub oidc_issuer: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub oidc_provider_arn: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub principal_arn: Option<String>,
    /// Add-on name → installed version.
    #[serde(default)]
    pub addons: BTreeMap<String, String>,
    /// HyperPod node component name → version applied.
    #[serde(default)]
    pub components: BTreeMap<String, String>,
    #[serde(default)]
    pub hyperpod: hyperpod::Made,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub storage: Option<storage::Storage>,
}

impl Pipeline for CreateCluster {
    type Stage = Stage;
    type Outputs = Outputs;

    fn target(&self) -> String {
        super::target(self.name.as_str())
    }

    fn idempotency_key(&self) -> Option<&IdempotencyKey> {
        self.idempotency_key.as_ref()
    }

    fn from_stored(spec: &str) -> Result<Self, serde_json::Error> {
        CreateCluster::from_stored(spec)
    }

    /// The name is free in hypd, EKS and HyperPod; the zone, instance types, quota,
    /// training plans and network fit. Fills in the region and the bucket name.
    async fn preflight(self, cx: &Preflight<'_>) -> Result<Self, ApiError> {
        let request = with_defaults(self, cx).await?;
        check_free_and_fitting(&request, cx).await?;
        Ok(request)
    }

    /// The request that made cluster `name`, sent again, plans what it would change now
    /// (nothing, unless the cluster drifted: the same stages as `get_drift`) instead of
    /// being refused for the taken name. Any other request is planned as a creation.
    async fn plan_preflight(self, cx: &Preflight<'_>) -> Result<Self, ApiError> {
        let request = with_defaults(self, cx).await?;
        let made = match Managed::load(cx.store, request.name.as_str()).await {
            Ok(cluster) => cluster.desired().cloned(),
            Err(ApiError::NotFound { .. }) => None,
            Err(e) => return Err(e),
        };
        if let Some(Desired::Created(made)) = made
            && made
                == (CreateCluster {
                    idempotency_key: made.idempotency_key.clone(),
                    ..request.clone()
                })
        {
            return Ok(request);
        }
        check_free_and_fitting(&request, cx).await?;
        Ok(request)
    }

    /// The request is what the cluster is meant to be from now on, with what it made.
    async fn settle(&self, cx: &Context, out: &Outputs, succeeded: bool) -> Result<(), ApiError> {
        if succeeded {
            let desired = Desired::Created(self.clone());
            managed::made(
                &cx.store,
                self.name.as_str(),
                &cx.operation_id,
                &desired,
                out,
            )
            .await?;
        }
        Ok(())
    }

    /// The record says the creation failed (the operation says where and why).
    async fn failed(&self, cx: &Context) -> Result<(), ApiError> {
        super::set_status(&cx.store, self.name.as_str(), &["creating"], "failed").await?;
        Ok(())
    }

    async fn step(
        &self,
        cx: &Context,
        stage: Stage,
        out: &mut Outputs,
    ) -> Result<Progress, ApiError> {
        converge_stage(self, cx, stage, out, true).await
    }
}

/// The request with what it left out filled in: hypd's region, the bucket named for the
/// cluster and the account.
async fn with_defaults(
    mut r: CreateCluster,
    cx: &Preflight<'_>,
) -> Result<CreateCluster, ApiError> {
    let region = cx.region(r.region.as_ref()).await?;
    if r.storage.s3_bucket.is_none() {
        let account = cx.aws.identity().await?.account;
        let bucket = format!("hypd-{}-{account}", r.name).to_lowercase();
        r.storage.s3_bucket = Some(
            bucket
                .parse()
                .map_err(|e: String| ApiError::field("storage.s3_bucket", e))?,
        );
    }
    r.region = Some(region);
    Ok(r)
}

/// The name is free in hypd, EKS and HyperPod; the zone, instance types, quota, training
/// plans and network fit.
async fn check_free_and_fitting(r: &CreateCluster, cx: &Preflight<'_>) -> Result<(), ApiError> {
    let region = super::stored_region(r.region.as_ref(), CreateCluster::SPEC.name)?;
    let zone = r.availability_zone.as_str();
    cx.catalogue
        .check_zone(cx.aws, region.as_str(), zone, "availability_zone")
        .await?;
    let name = r.name.as_str();
    if super::get(cx.store, name).await?.is_some() {
        return Err(ApiError::field(
            "name",
            format!("hypd already manages a cluster named {name}"),
        ));
    }
    if crate::resources::eks::cluster::describe(&cx.aws.eks(region.as_str()), name)
        .await?
        .is_some()
    {
        return Err(ApiError::field(
            "name",
            format!(
                "an EKS cluster named {name} already exists in {region}; import it with import_cluster or choose another name"
            ),
        ));
    }
    hyperpod::check_name_free(cx.aws, region.as_str(), name).await?;
    hyperpod::check_capacity(cx.aws, region.as_str(), zone, &r.instance_groups, |i| {
        format!("instance_groups[{i}]")
    })
    .await?;
    // The node components' images are published per region.
    components::manifests(region.as_str()).map_err(|e| ApiError::field("region", e))?;
    network::check(cx.aws, region.as_str(), &r.network).await?;
    Ok(())
}

/// Runs stage `stage` of the creation; with `records`, it also writes hypd's record of
/// the cluster as a creation does (a reconcile runs the stages without: the record
/// stays as it is).
pub async fn converge_stage(
    r: &CreateCluster,
    cx: &Context,
    stage: Stage,
    out: &mut Outputs,
    records: bool,
) -> Result<Progress, ApiError> {
    let region = super::stored_region(r.region.as_ref(), CreateCluster::SPEC.name)?;
    let name = r.name.as_str();
    // A plan writes nothing of hypd's own but the change it lists at Activate.
    let writes = records && !is_planning();
    if writes {
        // A retried creation is creating again.
        super::set_status(&cx.store, name, &["failed"], "creating").await?;
    }
    match stage {
        Stage::Network => {
            if writes {
                super::record(&cx.store, &record(r, &region, "creating", out)).await?;
            }
            let zone = r.availability_zone.as_str();
            let here: u32 = r
                .instance_groups
                .iter()
                .filter(|g| {
                    g.availability_zone
                        .as_ref()
                        .is_none_or(|z| z.as_str() == zone)
                })
                .map(|g| g.instance_count.get())
                .sum();
            network::ensure(
                &cx.aws,
                &region,
                name,
                zone,
                &r.network,
                network::room_for(here),
                &mut out.network,
            )
            .await
        }
        Stage::Iam => {
            let arns = identity::ensure_roles(&cx.aws, &region, name, bucket(r)?).await?;
            let [eks, execution, s3_csi] = <[String; 3]>::try_from(arns)
                .map_err(|_| ApiError::internal("three cluster roles expected"))?;
            out.eks_role_arn = Some(eks);
            out.execution_role_arn = Some(execution);
            out.s3_csi_role_arn = Some(s3_csi);
            Ok(Progress::Done)
        }
        Stage::Eks => {
            let spec = ControlPlaneSpec {
                kubernetes_version: r
                    .kubernetes_version
                    .as_ref()
                    .map_or(DEFAULT_KUBERNETES_VERSION, |v| v.as_str())
                    .to_owned(),
                role_arn: out
                    .eks_role_arn
                    .clone()
                    .ok_or_else(|| missing("the EKS role"))?,
                subnet_ids: out.network.private_subnet_ids.clone(),
                security_group_id: out.network.security_group_id.clone(),
            };
            let state = converge(&EksCluster {
                eks: cx.aws.eks(&region),
                name: name.to_owned(),
                want: Want::Present(spec),
            })
            .await?;
            let Some(c) = state else {
                return Ok(Progress::wait(
                    EKS_POLL,
                    format!("EKS cluster {name} is CREATING"),
                ));
            };
            out.eks_cluster_arn = c.arn.clone();
            out.kubernetes_version = c.version.clone();
            out.oidc_issuer = c.oidc_issuer.clone();
            Ok(Progress::unless(EKS_POLL, c.progress(name)?))
        }
        Stage::Access => {
            let issuer = out
                .oidc_issuer
                .clone()
                .ok_or_else(|| missing("the OIDC issuer"))?;
            out.oidc_provider_arn =
                Some(identity::ensure_oidc_provider(&cx.aws, &region, name, &issuer).await?);
            match access::grant(&cx.aws, &region, name).await? {
                access::Access::Granted { principal, .. } => {
                    out.principal_arn = Some(principal);
                    Ok(Progress::Done)
                }
                access::Access::Wait(p) => Ok(p),
            }
        }
        Stage::Activate => {
            super::record_and_activate(
                &cx.store,
                &record(r, &region, "creating", out),
                &cx.requested_by,
            )
            .await?;
            Ok(Progress::Done)
        }
        Stage::Addons => {
            let role = out
                .s3_csi_role_arn
                .clone()
                .ok_or_else(|| missing("the S3 CSI role"))?;
            addons::ensure(&cx.aws, &region, name, &role, &mut out.addons).await
        }
        Stage::Components => {
            let client = kube::connect(&cx.aws, &region, name).await?;
            out.components = components::apply(&client, &region).await?;
            Ok(Progress::Done)
        }
        Stage::Hyperpod => {
            let every = Groups {
                groups: &r.instance_groups,
                unlisted: Unlisted::Refuse,
                delete: &[],
            };
            match ensure_hyperpod(r, cx, &region, out, every).await? {
                Progress::Done => nodes_ready(r, cx, &region).await,
                waiting => Ok(waiting),
            }
        }
        Stage::Storage => {
            let client = kube::connect(&cx.aws, &region, name).await?;
            let made = storage::ensure(&client, bucket(r)?, &region).await?;
            let bound = made.phase == "Bound";
            let message = format!("claim {}/{} is {}", made.namespace, made.claim, made.phase);
            out.storage = Some(made);
            if !bound {
                return Ok(Progress::wait(Duration::from_secs(5), message));
            }
            if !writes {
                return Ok(Progress::Done);
            }
            // The list shows node health without asking AWS: seed it here.
            let nodes = super::describe::node_counts(&cx.aws, &region, name).await?;
            super::record(&cx.store, &record(r, &region, "active", out)).await?;
            super::observe_nodes(&cx.store, name, &nodes).await?;
            Ok(Progress::Done)
        }
    }
}

/// What a HyperPod update is about: `groups` as hypd decides them, what becomes of the
/// live groups they do not list, and the groups to delete.
pub(crate) struct Groups<'a> {
    pub groups: &'a [app::api::clusters::InstanceGroupSpec],
    pub unlisted: Unlisted,
    pub delete: &'a [String],
}

/// The HyperPod stage's work on the cluster `r` and its earlier stages made (`out`): the
/// bucket, the lifecycle script, then the HyperPod cluster with `groups`; what it makes
/// is recorded in `out.hyperpod`. Creation and every later change of groups run it.
pub(crate) async fn ensure_hyperpod(
    r: &CreateCluster,
    cx: &Context,
    region: &str,
    out: &mut Outputs,
    groups: Groups<'_>,
) -> Result<Progress, ApiError> {
    let eks_arn = out
        .eks_cluster_arn
        .clone()
        .ok_or_else(|| missing("the EKS cluster ARN"))?;
    let role = out
        .execution_role_arn
        .clone()
        .ok_or_else(|| missing("the execution role"))?;
    let network = out.network.clone();
    let hcx = hyperpod::Context {
        region,
        cluster: r.name.as_str(),
        bucket: bucket(r)?,
        groups: groups.groups,
        eks_cluster_arn: &eks_arn,
        execution_role: &role,
        network: &network,
        unlisted: groups.unlisted,
        delete: groups.delete,
    };
    hyperpod::ensure(&cx.aws, &hcx, &mut out.hyperpod).await
}

/// The shared bucket; filled in at submission when the request named none.
pub fn bucket(r: &CreateCluster) -> Result<&str, ApiError> {
    r.storage
        .s3_bucket
        .as_ref()
        .map(|b| b.as_str())
        .ok_or_else(|| ApiError::internal("create_cluster stored without a bucket"))
}

fn record<'a>(
    r: &'a CreateCluster,
    region: &'a str,
    status: &'a str,
    out: &'a Outputs,
) -> super::Record<'a> {
    super::Record {
        name: r.name.as_str(),
        region,
        status,
        kubernetes_version: out.kubernetes_version.as_deref(),
        eks_cluster_arn: out.eks_cluster_arn.as_deref(),
        hyperpod_cluster_arn: out.hyperpod.hyperpod_cluster_arn.as_deref(),
    }
}

/// HyperPod reports InService once its instances run; the cluster is usable when every
/// group's instances are Ready Kubernetes nodes and every node component runs on each.
pub(crate) async fn nodes_ready(
    r: &CreateCluster,
    cx: &Context,
    region: &str,
) -> Result<Progress, ApiError> {
    let name = r.name.as_str();
    let client = kube::connect(&cx.aws, region, name).await?;
    let ready = components::hyperpod_nodes(&client, name).await?;
    let short: Vec<String> = r
        .instance_groups
        .iter()
        .filter_map(|g| {
            let want = g.instance_count.get() as usize;
            let (got, seen) = ready.get(g.name.as_str()).copied().unwrap_or((0, 0));
            (got < want).then(|| format!("{}: {got} of {want} Ready ({seen} registered)", g.name))
        })
        .collect();
    if !short.is_empty() {
        return Ok(Progress::wait(
            NODE_POLL,
            format!("HyperPod nodes in Kubernetes: {}", short.join("; ")),
        ));
    }
    let total: usize = ready.values().map(|(r, _)| r).sum();
    let waiting: Vec<String> = components::states(&client)
        .await?
        .iter()
        .filter(|c| !c.is_ready())
        .map(|c| c.describe())
        .collect();
    Ok(Progress::unless_pending(NODE_POLL, &waiting, |w| {
        format!("{total} nodes Ready; waiting for {w}")
    }))
}
