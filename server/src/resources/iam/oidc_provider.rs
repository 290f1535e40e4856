//! The IAM OIDC provider for an EKS cluster's issuer (IAM roles for service accounts). Its
//! ARN follows from the account and the issuer, so it is read directly by ARN: deleting
//! one cluster never lists, or depends on, another cluster's provider, and a provider that
//! vanishes meanwhile is simply gone.

use app::api::ApiError;
use app::api::plan::{Action, Change};
use serde_json::json;

use super::{Client, cluster_tags, pairs};
use crate::aws::SdkResultExt;
use crate::resources::{Resource, Want, known_after_apply, tags};

const KIND: &str = "iam:OpenIDConnectProvider";
/// The thumbprint of the root CA EKS's OIDC issuers chain to (IAM verifies the chain
/// itself for these issuers; the field is still required).
const THUMBPRINT: &str = "9e99a48a9960b14926bb7f3b02e22da2b0ab7280";
/// The audience tokens for AWS STS carry.
pub const AUDIENCE: &str = "sts.amazonaws.com";

/// The provider's ARN for `issuer` (`https://oidc.eks.<region>.amazonaws.com/id/<id>`).
pub fn arn(account: &str, issuer: &str) -> String {
    format!(
        "arn:aws:iam::{account}:oidc-provider/{}",
        issuer.trim_start_matches("https://")
    )
}

pub struct OidcProvider {
    pub iam: Client,
    pub cluster: String,
    pub arn: String,
    /// Present: the issuer URL it is made for.
    pub want: Want<String>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Observed {
    pub exists: bool,
    pub ours: bool,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Op {
    Create,
    Delete,
}

/// The changes for `want` given what was found. Pure.
pub fn diff(want: &Want<String>, observed: &Observed) -> Vec<Op> {
    match want {
        Want::Present(_) if !observed.exists => vec![Op::Create],
        Want::Absent if observed.exists && observed.ours => vec![Op::Delete],
        _ => Vec::new(),
    }
}

impl Resource for OidcProvider {
    type Observed = Observed;
    type Op = Op;

    async fn observe(&self) -> Result<Observed, ApiError> {
        // The issuer of a cluster this plan makes: no provider can be there for it.
        if known_after_apply(&self.arn) {
            return Ok(Observed::default());
        }
        let found = self
            .iam
            .get_open_id_connect_provider()
            .open_id_connect_provider_arn(&self.arn)
            .send()
            .await
            .found("iam", "GetOpenIDConnectProvider")?;
        let Some(p) = found else {
            return Ok(Observed::default());
        };
        let mut ours = tags::belongs_to(pairs(p.tags()), &self.cluster);
        // Not every IAM implementation answers the tags with the provider.
        if !ours && p.tags().is_empty() {
            ours = self
                .iam
                .list_open_id_connect_provider_tags()
                .open_id_connect_provider_arn(&self.arn)
                .send()
                .await
                .found("iam", "ListOpenIDConnectProviderTags")?
                .is_some_and(|t| tags::belongs_to(pairs(t.tags()), &self.cluster));
        }
        Ok(Observed { exists: true, ours })
    }

    fn diff(&self, observed: &Observed) -> Result<Vec<Op>, ApiError> {
        Ok(diff(&self.want, observed))
    }

    async fn apply(&self, op: &Op, observed: &mut Observed) -> Result<(), ApiError> {
        match (op, &self.want) {
            (Op::Create, Want::Present(issuer)) => {
                self.iam
                    .create_open_id_connect_provider()
                    .url(issuer)
                    .client_id_list(AUDIENCE)
                    .thumbprint_list(THUMBPRINT)
                    .set_tags(Some(cluster_tags(&self.cluster)))
                    .send()
                    .await
                    .allowing(
                        "iam",
                        "CreateOpenIDConnectProvider",
                        &["EntityAlreadyExists"],
                    )?;
                *observed = Observed {
                    exists: true,
                    ours: true,
                };
            }
            (Op::Delete, _) => {
                self.iam
                    .delete_open_id_connect_provider()
                    .open_id_connect_provider_arn(&self.arn)
                    .send()
                    .await
                    .found("iam", "DeleteOpenIDConnectProvider")?;
                *observed = Observed::default();
            }
            (Op::Create, Want::Absent) => {}
        }
        Ok(())
    }

    fn describe(&self, op: &Op, _: &Observed) -> Change {
        match op {
            Op::Create => Change::new(Action::Create, KIND, &self.arn).field(
                "url",
                None,
                self.want.present().map(|i| json!(i)),
            ),
            Op::Delete => Change::new(Action::Delete, KIND, &self.arn),
        }
    }
    fn assume(&self, op: &Op, observed: &mut Observed) {
        *observed = match op {
            Op::Create => Observed {
                exists: true,
                ours: true,
            },
            Op::Delete => Observed::default(),
        }
    }
}

/// The ARNs of the providers tagged for `cluster`: for a teardown that no longer knows
/// the issuer (its EKS cluster went before hypd could read it). A provider removed while
/// this lists (another cluster's deletion) is skipped, not an error.
pub async fn tagged_for(iam: &Client, cluster: &str) -> Result<Vec<String>, ApiError> {
    let listed = iam
        .list_open_id_connect_providers()
        .send()
        .await
        .upstream("iam", "ListOpenIDConnectProviders")?;
    let mut ours = Vec::new();
    for arn in listed
        .open_id_connect_provider_list()
        .iter()
        .filter_map(|p| p.arn())
    {
        let Some(t) = iam
            .list_open_id_connect_provider_tags()
            .open_id_connect_provider_arn(arn)
            .send()
            .await
            .found("iam", "ListOpenIDConnectProviderTags")?
        else {
            continue;
        };
        if tags::belongs_to(pairs(t.tags()), cluster) {
            ours.push(arn.to_owned());
        }
    }
    Ok(ours)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_arn_follows_from_the_issuer_and_only_ours_is_deleted() {
        assert_eq!(
            arn(
                "123456789012",
                "https://oidc.eks.us-east-1.amazonaws.com/id/ABC"
            ),
            "arn:aws:iam::123456789012:oidc-provider/oidc.eks.us-east-1.amazonaws.com/id/ABC"
        );
        let theirs = Observed {
            exists: true,
            ours: false,
        };
        assert!(diff(&Want::Absent, &theirs).is_empty());
        assert_eq!(
            diff(&Want::Present("https://x".into()), &Observed::default()),
            [Op::Create]
        );
    }
}
