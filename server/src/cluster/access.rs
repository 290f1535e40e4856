//! hypd's own access to a cluster's Kubernetes API: an EKS access entry with the
//! cluster-admin policy for the IAM principal hypd acts as, made when a cluster is created
//! or imported and removed (only if hypd made it) when hypd lets go of an imported one.

use std::time::Duration;

use app::api::ApiError;

use crate::aws::Aws;
use crate::operation::pipeline::Progress;
use crate::resources::eks::access_entry::AccessEntry;
use crate::resources::{Want, converge};

const POLL: Duration = Duration::from_secs(15);

/// The IAM principal an access entry names: an assumed role's session ARN becomes the
/// role's ARN (EKS refuses session ARNs), and an STS-form user ARN (as some emulators
/// answer GetCallerIdentity) its IAM form.
pub fn principal_arn(caller: &str) -> String {
    let Some(rest) = caller.strip_prefix("arn:aws:sts::") else {
        return caller.to_owned();
    };
    if let Some((account, role_session)) = rest.split_once(":assumed-role/") {
        let role = role_session.split('/').next().unwrap_or(role_session);
        return format!("arn:aws:iam::{account}:role/{role}");
    }
    match rest.split_once(":user/") {
        Some((account, user)) => format!("arn:aws:iam::{account}:user/{user}"),
        None => caller.to_owned(),
    }
}

/// Where granting hypd's access stands.
pub enum Access {
    /// hypd's principal has cluster-admin; `managed` when the entry carries hypd's tag.
    Granted { principal: String, managed: bool },
    /// The cluster must change first (its authentication mode).
    Wait(Progress),
}

async fn entry(
    aws: &Aws,
    region: &str,
    cluster: &str,
    want: Want<()>,
) -> Result<AccessEntry, ApiError> {
    Ok(AccessEntry {
        eks: aws.eks(region),
        cluster: cluster.to_owned(),
        principal_arn: principal_arn(&aws.identity().await?.arn),
        want,
    })
}

/// Gives hypd's own principal cluster-admin through an access entry tagged as hypd's,
/// switching a CONFIG_MAP-only cluster to API_AND_CONFIG_MAP first.
pub async fn grant(aws: &Aws, region: &str, cluster: &str) -> Result<Access, ApiError> {
    let e = entry(aws, region, cluster, Want::Present(())).await?;
    let o = converge(&e).await?;
    if o.waiting() {
        return Ok(Access::Wait(Progress::wait(
            POLL,
            format!(
                "EKS cluster {cluster} is switching its authentication mode to API_AND_CONFIG_MAP"
            ),
        )));
    }
    Ok(Access::Granted {
        principal: e.principal_arn,
        managed: o.managed,
    })
}

/// Removes hypd's access entry if hypd made it; says what it kept otherwise.
pub async fn revoke(aws: &Aws, region: &str, cluster: &str) -> Result<Option<String>, ApiError> {
    let e = entry(aws, region, cluster, Want::Absent).await?;
    let o = converge(&e).await?;
    Ok(o.exists.then(|| {
        format!(
            "kept the access entry of {} on {cluster}: hypd did not create it",
            e.principal_arn
        )
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn assumed_role_sessions_become_their_role() {
        assert_eq!(
            principal_arn("arn:aws:sts::123456789012:assumed-role/hypd-admin/i-0abc"),
            "arn:aws:iam::123456789012:role/hypd-admin"
        );
        assert_eq!(
            principal_arn("arn:aws:iam::123456789012:user/moto"),
            "arn:aws:iam::123456789012:user/moto"
        );
        assert_eq!(
            principal_arn("arn:aws:sts::123456789012:user/moto"),
            "arn:aws:iam::123456789012:user/moto"
        );
    }
}
