//! IAM for a cluster: the EKS cluster role, the HyperPod execution role and the cluster's
//! OIDC provider. Roles carry hypd's tags and a name derived from the cluster, so a step
//! run again finds them (`GetRole`) instead of making a second one; `EntityAlreadyExists`
//! from a concurrent run is adoption, not failure.

use aws_sdk_iam::Client;
use aws_sdk_iam::error::ProvideErrorMetadata;
use aws_sdk_iam::types::Tag;
use serde_json::json;
use sha2::{Digest, Sha256};

use app::api::ApiError;

pub const EKS_CLUSTER_POLICY: &str = "arn:aws:iam::aws:policy/AmazonEKSClusterPolicy";
pub const HYPERPOD_INSTANCE_POLICY: &str =
    "arn:aws:iam::aws:policy/AmazonSageMakerClusterInstanceRolePolicy";
/// The thumbprint of the root CA EKS's OIDC issuers chain to (IAM verifies the chain
/// itself for these issuers; the field is still required).
const OIDC_THUMBPRINT: &str = "9e99a48a9960b14926bb7f3b02e22da2b0ab7280";

/// `hypd-<cluster>-<suffix>`, shortened with a hash when it would pass IAM's 64
/// characters, so every cluster name maps to one valid role name.
pub fn role_name(cluster: &str, suffix: &str) -> String {
    let name = format!("hypd-{cluster}-{suffix}");
    if name.len() <= 64 {
        return name;
    }
    let hash = format!("{:x}", Sha256::digest(cluster.as_bytes()));
    let keep = 64 - (5 + 1 + 8 + 1 + suffix.len());
    format!("hypd-{}-{}-{suffix}", &cluster[..keep], &hash[..8])
}

fn tags(cluster: &str) -> Vec<Tag> {
    [("hypd:managed", "true"), ("hypd:cluster", cluster)]
        .into_iter()
        .filter_map(|(k, v)| Tag::builder().key(k).value(v).build().ok())
        .collect()
}

/// A role trusted by `service`, with `managed` policies attached and an optional inline
/// policy; returns its ARN.
pub async fn ensure_role(
    iam: &Client,
    cluster: &str,
    name: &str,
    service: &str,
    managed: &[&str],
    inline: Option<(&str, serde_json::Value)>,
) -> Result<String, ApiError> {
    let arn = match iam.get_role().role_name(name).send().await {
        Ok(out) => out.role().map(|r| r.arn().to_owned()),
        Err(e) if e.code() == Some("NoSuchEntity") => None,
        Err(e) => return Err(crate::aws::upstream("iam", "GetRole", e)),
    };
    let arn = match arn {
        Some(a) => a,
        None => {
            let trust = json!({
                "Version": "2012-10-17",
                "Statement": [{
                    "Effect": "Allow",
                    "Principal": { "Service": service },
                    "Action": ["sts:AssumeRole", "sts:TagSession"],
                }],
            });
            match iam
                .create_role()
                .role_name(name)
                .assume_role_policy_document(trust.to_string())
                .description(format!("hypd: {service} for cluster {cluster}"))
                .set_tags(Some(tags(cluster)))
                .send()
                .await
            {
                Ok(out) => out
                    .role()
                    .map(|r| r.arn().to_owned())
                    .ok_or_else(|| ApiError::internal("CreateRole answered without a role"))?,
                Err(e) if e.code() == Some("EntityAlreadyExists") => iam
                    .get_role()
                    .role_name(name)
                    .send()
                    .await
                    .map_err(|e| crate::aws::upstream("iam", "GetRole", e))?
                    .role()
                    .map(|r| r.arn().to_owned())
                    .ok_or_else(|| ApiError::internal("GetRole answered without a role"))?,
                Err(e) => return Err(crate::aws::upstream("iam", "CreateRole", e)),
            }
        }
    };
    let attached = iam
        .list_attached_role_policies()
        .role_name(name)
        .send()
        .await
        .map_err(|e| crate::aws::upstream("iam", "ListAttachedRolePolicies", e))?;
    for policy in managed {
        let present = attached
            .attached_policies()
            .iter()
            .any(|p| p.policy_arn() == Some(policy));
        if !present {
            iam.attach_role_policy()
                .role_name(name)
                .policy_arn(*policy)
                .send()
                .await
                .map_err(|e| crate::aws::upstream("iam", "AttachRolePolicy", e))?;
        }
    }
    if let Some((policy_name, document)) = inline {
        // PutRolePolicy replaces the document: running it again is harmless.
        iam.put_role_policy()
            .role_name(name)
            .policy_name(policy_name)
            .policy_document(document.to_string())
            .send()
            .await
            .map_err(|e| crate::aws::upstream("iam", "PutRolePolicy", e))?;
    }
    Ok(arn)
}

/// The roles hypd makes for a cluster, by `role_name` suffix: EKS's cluster role,
/// HyperPod's execution role, and the Mountpoint for S3 CSI driver's pod identity.
pub const EKS_ROLE: &str = "eks";
pub const HYPERPOD_ROLE: &str = "hyperpod";
pub const S3_CSI_ROLE: &str = "s3csi";
pub const ROLES: [&str; 3] = [EKS_ROLE, HYPERPOD_ROLE, S3_CSI_ROLE];

/// The service EKS Pod Identity roles trust.
pub const POD_IDENTITY_SERVICE: &str = "pods.eks.amazonaws.com";

/// What the Mountpoint for S3 CSI driver may do: read and write the shared bucket only.
pub fn s3_csi_inline_policy(bucket: &str) -> serde_json::Value {
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
pub fn hyperpod_inline_policy(bucket: &str) -> serde_json::Value {
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

/// The IAM OIDC provider for an EKS cluster's issuer (IRSA); returns its ARN.
pub async fn ensure_oidc_provider(
    iam: &Client,
    cluster: &str,
    issuer: &str,
) -> Result<String, ApiError> {
    let host_path = issuer.trim_start_matches("https://");
    let listed = iam
        .list_open_id_connect_providers()
        .send()
        .await
        .map_err(|e| crate::aws::upstream("iam", "ListOpenIDConnectProviders", e))?;
    if let Some(p) = listed
        .open_id_connect_provider_list()
        .iter()
        .filter_map(|p| p.arn())
        .find(|arn| arn.ends_with(&format!(":oidc-provider/{host_path}")))
    {
        return Ok(p.to_owned());
    }
    match iam
        .create_open_id_connect_provider()
        .url(issuer)
        .client_id_list("sts.amazonaws.com")
        .thumbprint_list(OIDC_THUMBPRINT)
        .set_tags(Some(tags(cluster)))
        .send()
        .await
    {
        Ok(out) => out
            .open_id_connect_provider_arn()
            .map(str::to_owned)
            .ok_or_else(|| {
                ApiError::internal("CreateOpenIDConnectProvider answered without an ARN")
            }),
        Err(e) if e.code() == Some("EntityAlreadyExists") => {
            Box::pin(ensure_oidc_provider(iam, cluster, issuer)).await
        }
        Err(e) => Err(crate::aws::upstream(
            "iam",
            "CreateOpenIDConnectProvider",
            e,
        )),
    }
}

fn tagged_for(tags: &[Tag], cluster: &str) -> bool {
    tags.iter()
        .any(|t| t.key() == "hypd:cluster" && t.value() == cluster)
}

/// Deletes role `name` if it is hypd's for `cluster`: its managed policies detached and
/// inline policies deleted first, as IAM requires.
pub async fn delete_role(iam: &Client, cluster: &str, name: &str) -> Result<(), ApiError> {
    let role = match iam.get_role().role_name(name).send().await {
        Ok(out) => out.role,
        Err(e) if e.code() == Some("NoSuchEntity") => return Ok(()),
        Err(e) => return Err(crate::aws::upstream("iam", "GetRole", e)),
    };
    let Some(role) = role else { return Ok(()) };
    // GetRole returns the tags; a role of the same name that hypd did not make stays.
    if !tagged_for(role.tags(), cluster) {
        return Ok(());
    }
    let attached = iam
        .list_attached_role_policies()
        .role_name(name)
        .send()
        .await
        .map_err(|e| crate::aws::upstream("iam", "ListAttachedRolePolicies", e))?;
    for p in attached.attached_policies() {
        iam.detach_role_policy()
            .role_name(name)
            .policy_arn(p.policy_arn().unwrap_or_default())
            .send()
            .await
            .map_err(|e| crate::aws::upstream("iam", "DetachRolePolicy", e))?;
    }
    let inline = iam
        .list_role_policies()
        .role_name(name)
        .send()
        .await
        .map_err(|e| crate::aws::upstream("iam", "ListRolePolicies", e))?;
    for p in inline.policy_names() {
        iam.delete_role_policy()
            .role_name(name)
            .policy_name(p)
            .send()
            .await
            .map_err(|e| crate::aws::upstream("iam", "DeleteRolePolicy", e))?;
    }
    match iam.delete_role().role_name(name).send().await {
        Ok(_) => Ok(()),
        Err(e) if e.code() == Some("NoSuchEntity") => Ok(()),
        Err(e) => Err(crate::aws::upstream("iam", "DeleteRole", e)),
    }
}

/// Deletes the OIDC providers tagged as `cluster`'s.
pub async fn delete_oidc_providers(iam: &Client, cluster: &str) -> Result<(), ApiError> {
    let listed = iam
        .list_open_id_connect_providers()
        .send()
        .await
        .map_err(|e| crate::aws::upstream("iam", "ListOpenIDConnectProviders", e))?;
    for arn in listed
        .open_id_connect_provider_list()
        .iter()
        .filter_map(|p| p.arn())
    {
        let tags = iam
            .list_open_id_connect_provider_tags()
            .open_id_connect_provider_arn(arn)
            .send()
            .await
            .map_err(|e| crate::aws::upstream("iam", "ListOpenIDConnectProviderTags", e))?;
        if tagged_for(tags.tags(), cluster) {
            iam.delete_open_id_connect_provider()
                .open_id_connect_provider_arn(arn)
                .send()
                .await
                .map_err(|e| crate::aws::upstream("iam", "DeleteOpenIDConnectProvider", e))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn role_names_fit_iam() {
        assert_eq!(role_name("ml-1", "eks"), "hypd-ml-1-eks");
        let long = "a".repeat(63);
        let n = role_name(&long, "hyperpod");
        assert_eq!(n.len(), 64, "{n}");
        assert!(n.starts_with("hypd-aaaa") && n.ends_with("-hyperpod"));
        assert_ne!(n, role_name(&format!("{}b", "a".repeat(62)), "hyperpod"));
    }
}
