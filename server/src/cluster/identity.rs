//! Who a cluster's parts act as: the EKS cluster role, the HyperPod execution role, the
//! Mountpoint for S3 CSI driver's pod identity role (each with the policies it needs and
//! no more), and the cluster's IAM OIDC provider. What each role may do is decided here;
//! making them is `resources::iam`'s.

use std::collections::BTreeMap;

use app::api::ApiError;
use serde_json::{Value, json};

use crate::aws::Aws;
use crate::resources::iam::oidc_provider::{self, OidcProvider};
use crate::resources::iam::role::{Role, RoleSpec, Trust};
use crate::resources::iam::{Client, role_name};
use crate::resources::{Want, converge};

pub const EKS_CLUSTER_POLICY: &str = "arn:aws:iam::aws:policy/AmazonEKSClusterPolicy";
pub const HYPERPOD_INSTANCE_POLICY: &str =
    "arn:aws:iam::aws:policy/AmazonSageMakerClusterInstanceRolePolicy";
/// The service EKS Pod Identity roles trust.
pub const POD_IDENTITY_SERVICE: &str = "pods.eks.amazonaws.com";

/// The roles hypd makes for a cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClusterRole {
    /// EKS's cluster role.
    Eks,
    /// HyperPod's execution role (its instances act as it).
    HyperPod,
    /// The Mountpoint for S3 CSI driver's pod identity.
    S3Csi,
}

impl ClusterRole {
    pub const ALL: [ClusterRole; 3] = [ClusterRole::Eks, ClusterRole::HyperPod, ClusterRole::S3Csi];

    /// The `role_name` suffix; names of roles already made depend on it.
    fn suffix(self) -> &'static str {
        match self {
            ClusterRole::Eks => "eks",
            ClusterRole::HyperPod => "hyperpod",
            ClusterRole::S3Csi => "s3csi",
        }
    }

    pub fn name(self, cluster: &str) -> String {
        role_name(cluster, self.suffix())
    }

    /// What the role is trusted by and allowed, for a cluster whose bucket is `bucket`.
    pub fn spec(self, bucket: &str) -> RoleSpec {
        let (service, managed, inline): (&str, &[&str], Option<(&str, Value)>) = match self {
            ClusterRole::Eks => ("eks.amazonaws.com", &[EKS_CLUSTER_POLICY], None),
            ClusterRole::HyperPod => (
                "sagemaker.amazonaws.com",
                &[HYPERPOD_INSTANCE_POLICY],
                Some(("hypd-hyperpod", hyperpod_inline_policy(bucket))),
            ),
            ClusterRole::S3Csi => (
                POD_IDENTITY_SERVICE,
                &[],
                Some(("hypd-s3-csi", s3_csi_inline_policy(bucket))),
            ),
        };
        RoleSpec {
            trust: Trust::Service(service.to_owned()),
            managed: managed.iter().map(|p| (*p).to_owned()).collect(),
            inline: inline
                .into_iter()
                .map(|(n, d)| (n.to_owned(), d))
                .collect::<BTreeMap<_, _>>(),
        }
    }

    pub fn resource(self, iam: &Client, cluster: &str, want: Want<RoleSpec>) -> Role {
        Role {
            iam: iam.clone(),
            cluster: cluster.to_owned(),
            name: self.name(cluster),
            want,
        }
    }
}

/// What the Mountpoint for S3 CSI driver may do: read and write the shared bucket only.
pub fn s3_csi_inline_policy(bucket: &str) -> Value {
    json!({
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Action": ["s3:ListBucket"],
                "Resource": format!("arn:aws:s3:::{bucket}"),
            },
            {
                "Effect": "Allow",
                "Action": ["s3:GetObject", "s3:PutObject", "s3:AbortMultipartUpload", "s3:DeleteObject"],
                "Resource": format!("arn:aws:s3:::{bucket}/*"),
            },
        ],
    })
}

/// What HyperPod's instances may do besides the managed policy: read the lifecycle
/// scripts and manage their network interfaces in the cluster's VPC.
pub fn hyperpod_inline_policy(bucket: &str) -> Value {
    json!({
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Action": ["s3:GetObject", "s3:ListBucket"],
                "Resource": [format!("arn:aws:s3:::{bucket}"), format!("arn:aws:s3:::{bucket}/*")],
            },
            {
                "Effect": "Allow",
                "Action": [
                    "ec2:AssignPrivateIpAddresses", "ec2:CreateNetworkInterface",
                    "ec2:CreateNetworkInterfacePermission", "ec2:DeleteNetworkInterface",
                    "ec2:DeleteNetworkInterfacePermission", "ec2:DescribeNetworkInterfaces",
                    "ec2:DescribeVpcs", "ec2:DescribeDhcpOptions", "ec2:DescribeSubnets",
                    "ec2:DescribeSecurityGroups", "ec2:DetachNetworkInterface",
                    "ec2:ModifyNetworkInterfaceAttribute", "ec2:UnassignPrivateIpAddresses",
                    "ecr:BatchGetImage", "ecr:GetAuthorizationToken",
                    "ecr:GetDownloadUrlForLayer", "eks-auth:AssumeRoleForPodIdentity",
                ],
                "Resource": "*",
            },
            {
                "Effect": "Allow",
                "Action": ["ec2:CreateTags"],
                "Resource": "arn:aws:ec2:*:*:network-interface/*",
            },
        ],
    })
}

/// Makes (or puts right) the cluster's roles; returns their ARNs in `ClusterRole::ALL`'s
/// order.
pub async fn ensure_roles(
    aws: &Aws,
    region: &str,
    cluster: &str,
    bucket: &str,
) -> Result<Vec<String>, ApiError> {
    let iam = aws.iam(region);
    let mut arns = Vec::new();
    for role in ClusterRole::ALL {
        let made =
            converge(&role.resource(&iam, cluster, Want::Present(role.spec(bucket)))).await?;
        arns.push(
            made.arn
                .ok_or_else(|| crate::resources::missing("a cluster role"))?,
        );
    }
    Ok(arns)
}

/// The cluster's OIDC provider for `issuer`; returns its ARN.
pub async fn ensure_oidc_provider(
    aws: &Aws,
    region: &str,
    cluster: &str,
    issuer: &str,
) -> Result<String, ApiError> {
    let account = aws.identity().await?.account;
    let arn = oidc_provider::arn(&account, issuer);
    converge(&OidcProvider {
        iam: aws.iam(region),
        cluster: cluster.to_owned(),
        arn: arn.clone(),
        want: Want::Present(issuer.to_owned()),
    })
    .await?;
    Ok(arn)
}

/// Deletes the cluster's roles and OIDC providers: the provider named by `known` (read
/// from the cluster before EKS went), or, when no issuer was ever read, any provider
/// tagged for the cluster. Roles and providers without hypd's tags stay.
pub async fn teardown(
    aws: &Aws,
    region: &str,
    cluster: &str,
    known: Option<&str>,
) -> Result<(), ApiError> {
    let iam = aws.iam(region);
    for role in ClusterRole::ALL {
        converge(&role.resource(&iam, cluster, Want::Absent)).await?;
    }
    let providers = match known {
        Some(arn) => vec![arn.to_owned()],
        None => oidc_provider::tagged_for(&iam, cluster).await?,
    };
    for arn in providers {
        converge(&OidcProvider {
            iam: iam.clone(),
            cluster: cluster.to_owned(),
            arn,
            want: Want::Absent,
        })
        .await?;
    }
    Ok(())
}
