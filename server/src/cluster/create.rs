//! Creating a cluster from decision-level inputs: network → IAM → EKS control plane →
//! access → active cluster → EKS add-ons → HyperPod node components → shared bucket and
//! HyperPod cluster with Ready nodes → shared storage. Each stage observes before it
//! acts (find by name or tag, then create what is missing; server-side apply on the
//! Kubernetes side), so a stage run again after a crash or a retry adopts what it made.

use std::time::Duration;

use app::api::ApiError;
use app::api::clusters::{Capacity, CreateCluster};
use app::api::values::IdempotencyKey;
use aws_sdk_eks::error::ProvideErrorMetadata;
use aws_sdk_eks::types::{
    AddonStatus, AuthenticationMode, ClusterStatus, CreateAccessConfigRequest, VpcConfigRequest,
};
use serde::{Deserialize, Serialize};

use super::dependencies::{ADDONS, DEFAULT_KUBERNETES_VERSION};
use super::import::{Access, grant_access};
use super::{components, storage};
use crate::network::{self, Network};
use crate::operation::pipeline::{Context, Pipeline, Progress, StagePlan};
use crate::{hyperpod, iam, kubernetes};

const EKS_POLL: Duration = Duration::from_secs(30);
const ADDON_POLL: Duration = Duration::from_secs(15);

const STAGES: [StagePlan; 9] = [
    StagePlan {
        name: "network",
        title: "Network: VPC, subnets, NAT, S3 endpoint, EFA security group",
        cancellable: true,
    },
    StagePlan {
        name: "iam",
        title: "IAM: EKS cluster role, HyperPod execution role, S3 CSI driver role",
        cancellable: true,
    },
    StagePlan {
        name: "eks",
        title: "EKS control plane (about 10 minutes on AWS)",
        cancellable: false,
    },
    StagePlan {
        name: "access",
        title: "OIDC provider and hypd's cluster-admin access entry",
        cancellable: true,
    },
    StagePlan {
        name: "activate",
        title: "Record the cluster and make it your active cluster",
        cancellable: true,
    },
    StagePlan {
        name: "addons",
        title: "EKS add-ons: pod identity agent, Mountpoint for S3 CSI driver, cert-manager, metrics-server",
        cancellable: true,
    },
    StagePlan {
        name: "components",
        title: "HyperPod node components: health-monitoring agent, NVIDIA and EFA device plugins",
        cancellable: true,
    },
    StagePlan {
        name: "hyperpod",
        title: "Shared bucket and lifecycle script; HyperPod cluster with automatic node recovery, nodes Ready (15-20 minutes on AWS)",
        cancellable: false,
    },
    StagePlan {
        name: "storage",
        title: "Shared storage: the S3 bucket as a Mountpoint PersistentVolume and claim",
        cancellable: true,
    },
];

/// The Mountpoint for S3 CSI driver's service account, which its pod identity names.
const S3_CSI_SERVICE_ACCOUNT: (&str, &str) = ("kube-system", "s3-csi-driver-sa");
const NODE_POLL: Duration = Duration::from_secs(30);

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
    pub addons: std::collections::BTreeMap<String, String>,
    /// HyperPod node component name → version applied.
    #[serde(default)]
    pub components: std::collections::BTreeMap<String, String>,
    #[serde(default)]
    pub hyperpod: hyperpod::Made,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub storage: Option<storage::Storage>,
}

impl Pipeline for CreateCluster {
    type Outputs = Outputs;

    fn target(&self) -> String {
        format!("cluster/{}", self.name)
    }

    fn idempotency_key(&self) -> Option<&IdempotencyKey> {
        self.idempotency_key.as_ref()
    }

    fn plan(&self) -> Vec<StagePlan> {
        STAGES.to_vec()
    }

    async fn step(
        &self,
        cx: &Context,
        stage: &str,
        out: &mut Outputs,
    ) -> Result<Progress, ApiError> {
        let region = self
            .region
            .as_ref()
            .map(|r| r.to_string())
            .ok_or_else(|| ApiError::internal("create_cluster stored without a region"))?;
        let name = self.name.as_str();
        match stage {
            "network" => {
                super::record(&cx.store, &record(self, &region, "creating", out)).await?;
                network::ensure(
                    &cx.aws,
                    &region,
                    name,
                    self.availability_zone.as_str(),
                    &self.network,
                    &mut out.network,
                )
                .await
            }
            "iam" => {
                let iam_client = cx.aws.iam(&region);
                let bucket = bucket(self)?;
                out.eks_role_arn = Some(
                    iam::ensure_role(
                        &iam_client,
                        name,
                        &iam::role_name(name, iam::EKS_ROLE),
                        "eks.amazonaws.com",
                        &[iam::EKS_CLUSTER_POLICY],
                        None,
                    )
                    .await?,
                );
                out.execution_role_arn = Some(
                    iam::ensure_role(
                        &iam_client,
                        name,
                        &iam::role_name(name, iam::HYPERPOD_ROLE),
                        "sagemaker.amazonaws.com",
                        &[iam::HYPERPOD_INSTANCE_POLICY],
                        Some(("hypd-hyperpod", iam::hyperpod_inline_policy(bucket))),
                    )
                    .await?,
                );
                out.s3_csi_role_arn = Some(
                    iam::ensure_role(
                        &iam_client,
                        name,
                        &iam::role_name(name, iam::S3_CSI_ROLE),
                        iam::POD_IDENTITY_SERVICE,
                        &[],
                        Some(("hypd-s3-csi", iam::s3_csi_inline_policy(bucket))),
                    )
                    .await?,
                );
                Ok(Progress::Done)
            }
            "eks" => ensure_eks(self, cx, &region, out).await,
            "access" => {
                let issuer = out
                    .oidc_issuer
                    .clone()
                    .ok_or_else(|| ApiError::internal("the eks stage stored no OIDC issuer"))?;
                out.oidc_provider_arn =
                    Some(iam::ensure_oidc_provider(&cx.aws.iam(&region), name, &issuer).await?);
                match grant_access(cx, &region, name).await? {
                    Access::Granted { principal, .. } => {
                        out.principal_arn = Some(principal);
                        Ok(Progress::Done)
                    }
                    Access::Wait(p) => Ok(p),
                }
            }
            "activate" => {
                super::record_and_activate(
                    &cx.store,
                    &record(self, &region, "creating", out),
                    &cx.requested_by,
                )
                .await?;
                Ok(Progress::Done)
            }
            "addons" => {
                let role = out
                    .s3_csi_role_arn
                    .clone()
                    .ok_or_else(|| ApiError::internal("the iam stage stored no S3 CSI role"))?;
                ensure_pod_identity(cx, &region, name, S3_CSI_SERVICE_ACCOUNT, &role).await?;
                ensure_addons(cx, &region, name, out).await
            }
            "components" => {
                let client = kubernetes::connect(&cx.aws, &region, name).await?;
                out.components = components::apply(&client, &region).await?;
                Ok(Progress::Done)
            }
            "hyperpod" => {
                let spec = hyperpod::Spec {
                    region: &region,
                    cluster: name,
                    bucket: bucket(self)?,
                    instance_type: self.instance_type.as_str(),
                    instance_count: self.instance_count.get(),
                    capacity: &self.capacity,
                    efa_only: self.efa_only,
                    deep_health_checks: self.deep_health_checks,
                };
                let eks_arn = out
                    .eks_cluster_arn
                    .clone()
                    .ok_or_else(|| ApiError::internal("the eks stage stored no cluster ARN"))?;
                let role = out
                    .execution_role_arn
                    .clone()
                    .ok_or_else(|| ApiError::internal("the iam stage stored no execution role"))?;
                let network = out.network.clone();
                match hyperpod::ensure(&cx.aws, &spec, &eks_arn, &role, &network, &mut out.hyperpod)
                    .await?
                {
                    Progress::Done => nodes_ready(self, cx, &region).await,
                    waiting => Ok(waiting),
                }
            }
            "storage" => {
                let client = kubernetes::connect(&cx.aws, &region, name).await?;
                let made = storage::ensure(&client, bucket(self)?, &region).await?;
                let bound = made.phase == "Bound";
                let message = format!("claim {}/{} is {}", made.namespace, made.claim, made.phase);
                out.storage = Some(made);
                if !bound {
                    return Ok(Progress::wait(Duration::from_secs(5), message));
                }
                // The list shows node health without asking AWS: seed it here.
                let nodes = super::describe::node_counts(&cx.aws, &region, name).await?;
                super::record(&cx.store, &record(self, &region, "active", out)).await?;
                super::observe_nodes(&cx.store, name, &nodes).await?;
                Ok(Progress::Done)
            }
            other => Err(ApiError::internal(format!(
                "create_cluster has no stage {other}"
            ))),
        }
    }
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

async fn ensure_eks(
    r: &CreateCluster,
    cx: &Context,
    region: &str,
    out: &mut Outputs,
) -> Result<Progress, ApiError> {
    let name = r.name.as_str();
    let eks = cx.aws.eks(region);
    let cluster = match eks.describe_cluster().name(name).send().await {
        Ok(o) => o.cluster,
        Err(e) if e.code() == Some("ResourceNotFoundException") => None,
        Err(e) => return Err(crate::aws::upstream("eks", "DescribeCluster", e)),
    };
    let Some(c) = cluster else {
        let role = out
            .eks_role_arn
            .clone()
            .ok_or_else(|| ApiError::internal("the iam stage stored no EKS role"))?;
        let version = r
            .kubernetes_version
            .as_ref()
            .map_or(DEFAULT_KUBERNETES_VERSION, |v| v.as_str());
        let sg = out.network.security_group_id.clone();
        let vpc = VpcConfigRequest::builder()
            .set_subnet_ids(Some(out.network.private_subnet_ids.clone()))
            .set_security_group_ids(sg.map(|s| vec![s]))
            .endpoint_public_access(true)
            .endpoint_private_access(true)
            .build();
        match eks
            .create_cluster()
            .name(name)
            .version(version)
            .role_arn(role)
            .resources_vpc_config(vpc)
            .access_config(
                CreateAccessConfigRequest::builder()
                    .authentication_mode(AuthenticationMode::ApiAndConfigMap)
                    .bootstrap_cluster_creator_admin_permissions(true)
                    .build(),
            )
            .tags("hypd:managed", "true")
            .tags("hypd:cluster", name)
            // A repeated call after a crash is recognised by EKS as the same request.
            .client_request_token(format!("hypd-{name}"))
            .send()
            .await
        {
            Ok(_) => {}
            Err(e) if e.code() == Some("ResourceInUseException") => {}
            Err(e) => return Err(crate::aws::upstream("eks", "CreateCluster", e)),
        }
        return Ok(Progress::wait(
            EKS_POLL,
            format!("EKS cluster {name} is CREATING"),
        ));
    };
    out.eks_cluster_arn = c.arn().map(str::to_owned);
    out.kubernetes_version = c.version().map(str::to_owned);
    out.oidc_issuer = c
        .identity()
        .and_then(|i| i.oidc())
        .and_then(|o| o.issuer())
        .map(str::to_owned);
    match c.status() {
        Some(ClusterStatus::Active) => Ok(Progress::Done),
        Some(ClusterStatus::Creating | ClusterStatus::Updating | ClusterStatus::Pending) => {
            Ok(Progress::wait(
                EKS_POLL,
                format!(
                    "EKS cluster {name} is {}",
                    c.status().map_or("", |s| s.as_str())
                ),
            ))
        }
        s => Err(ApiError::Upstream {
            service: "eks".into(),
            call: "DescribeCluster".into(),
            code: None,
            message: format!(
                "EKS cluster {name} is {}{}",
                s.map_or("in an unknown state", |s| s.as_str()),
                c.health()
                    .map(|h| format!(": {:?}", h.issues()))
                    .unwrap_or_default()
            ),
            request_id: None,
        }),
    }
}

/// HyperPod reports InService once its instances run; the cluster is usable when they
/// are Ready Kubernetes nodes and every node component runs on each of them.
async fn nodes_ready(r: &CreateCluster, cx: &Context, region: &str) -> Result<Progress, ApiError> {
    let name = r.name.as_str();
    let client = kubernetes::connect(&cx.aws, region, name).await?;
    let want = usize::try_from(r.instance_count.get()).unwrap_or(usize::MAX);
    let (ready, seen) = components::hyperpod_nodes(&client, name).await?;
    if ready < want {
        return Ok(Progress::wait(
            NODE_POLL,
            format!("{ready} of {want} HyperPod nodes Ready in Kubernetes ({seen} registered)"),
        ));
    }
    let waiting: Vec<String> = components::states(&client)
        .await?
        .iter()
        .filter(|c| !c.is_ready())
        .map(|c| c.describe())
        .collect();
    Ok(Progress::unless_pending(NODE_POLL, &waiting, |w| {
        format!("{ready} nodes Ready; waiting for {w}")
    }))
}

/// An EKS Pod Identity association for `service_account`, made once.
async fn ensure_pod_identity(
    cx: &Context,
    region: &str,
    cluster: &str,
    (namespace, service_account): (&str, &str),
    role_arn: &str,
) -> Result<(), ApiError> {
    let eks = cx.aws.eks(region);
    let found = eks
        .list_pod_identity_associations()
        .cluster_name(cluster)
        .namespace(namespace)
        .service_account(service_account)
        .send()
        .await
        .map_err(|e| crate::aws::upstream("eks", "ListPodIdentityAssociations", e))?;
    if !found.associations().is_empty() {
        return Ok(());
    }
    match eks
        .create_pod_identity_association()
        .cluster_name(cluster)
        .namespace(namespace)
        .service_account(service_account)
        .role_arn(role_arn)
        .tags("hypd:managed", "true")
        .tags("hypd:cluster", cluster)
        .client_request_token(format!("hypd-{cluster}-{namespace}-{service_account}"))
        .send()
        .await
    {
        Ok(_) => Ok(()),
        Err(e) if e.code() == Some("ResourceInUseException") => Ok(()),
        Err(e) => Err(crate::aws::upstream(
            "eks",
            "CreatePodIdentityAssociation",
            e,
        )),
    }
}

/// Creates the missing add-ons of the one table and waits until all are ACTIVE; a failed
/// one is an error naming it with EKS's health issues.
async fn ensure_addons(
    cx: &Context,
    region: &str,
    cluster: &str,
    out: &mut Outputs,
) -> Result<Progress, ApiError> {
    let eks = cx.aws.eks(region);
    let mut pending = Vec::new();
    for addon in ADDONS {
        let found = match eks
            .describe_addon()
            .cluster_name(cluster)
            .addon_name(addon.name)
            .send()
            .await
        {
            Ok(o) => o.addon,
            Err(e) if e.code() == Some("ResourceNotFoundException") => None,
            Err(e) => return Err(crate::aws::upstream("eks", "DescribeAddon", e)),
        };
        let Some(a) = found else {
            match eks
                .create_addon()
                .cluster_name(cluster)
                .addon_name(addon.name)
                .addon_version(addon.version)
                .tags("hypd:managed", "true")
                .tags("hypd:cluster", cluster)
                .client_request_token(format!("hypd-{cluster}-{}", addon.name))
                .send()
                .await
            {
                Ok(_) => {}
                Err(e) if e.code() == Some("ResourceInUseException") => {}
                Err(e) => return Err(crate::aws::upstream("eks", "CreateAddon", e)),
            }
            pending.push(format!("{} CREATING", addon.name));
            continue;
        };
        match a.status() {
            Some(AddonStatus::Active) => {
                out.addons.insert(
                    addon.name.to_owned(),
                    a.addon_version().unwrap_or(addon.version).to_owned(),
                );
            }
            Some(s @ (AddonStatus::CreateFailed | AddonStatus::Degraded)) => {
                let issues: Vec<String> = a
                    .health()
                    .map(|h| {
                        h.issues()
                            .iter()
                            .map(|i| i.message().unwrap_or_default().to_owned())
                            .collect()
                    })
                    .unwrap_or_default();
                return Err(ApiError::Upstream {
                    service: "eks".into(),
                    call: "DescribeAddon".into(),
                    code: Some(s.as_str().to_owned()),
                    message: format!(
                        "add-on {} is {}: {}",
                        addon.name,
                        s.as_str(),
                        issues.join("; ")
                    ),
                    request_id: None,
                });
            }
            Some(s) => pending.push(format!("{} {}", addon.name, s.as_str())),
            None => pending.push(format!("{} in an unknown state", addon.name)),
        }
    }
    Ok(Progress::unless_pending(ADDON_POLL, &pending, |p| {
        format!("waiting for add-ons: {p}")
    }))
}

/// Pre-flight for a new cluster: the name is free in hypd, EKS and HyperPod, the AZ and
/// instance type exist, the network fits. Fills in the region and the bucket name.
pub async fn preflight(
    svc: &crate::service::Service,
    mut r: CreateCluster,
    region: String,
) -> Result<CreateCluster, ApiError> {
    let name = r.name.as_str();
    if super::get(&svc.store, name).await?.is_some() {
        return Err(ApiError::field(
            "name",
            format!("hypd already manages a cluster named {name}"),
        ));
    }
    match svc
        .aws
        .eks(&region)
        .describe_cluster()
        .name(name)
        .send()
        .await
    {
        Ok(_) => {
            return Err(ApiError::field(
                "name",
                format!(
                    "an EKS cluster named {name} already exists in {region}; import it with import_cluster or choose another name"
                ),
            ));
        }
        Err(e) if e.code() == Some("ResourceNotFoundException") => {}
        Err(e) => return Err(crate::aws::upstream("eks", "DescribeCluster", e)),
    }
    hyperpod::check(&svc.aws, &region, &r).await?;
    hyperpod::check_quota(&svc.aws, &region, &r).await?;
    // The node components' images are published per region.
    components::manifests(&region).map_err(|e| ApiError::field("region", e))?;
    network::check(&svc.aws, &region, &r.network).await?;
    if r.storage.s3_bucket.is_none() {
        let account = svc.aws.identity().await?.account;
        let bucket = format!("hypd-{name}-{account}").to_lowercase();
        r.storage.s3_bucket = Some(
            bucket
                .parse()
                .map_err(|e: String| ApiError::field("storage.s3_bucket", e))?,
        );
    }
    r.region = Some(
        region
            .parse()
            .map_err(|e: String| ApiError::field("region", e))?,
    );
    if let Capacity::TrainingPlan { .. } = &r.capacity {
        hyperpod::check_training_plan(&svc.aws, &r).await?;
    }
    Ok(r)
}
