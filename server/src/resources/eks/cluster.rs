//! An EKS control plane: made by hypd (API_AND_CONFIG_MAP authentication, both endpoints,
//! its private subnets and the EFA security group) or imported. Its status is observed, not
//! changed: a caller waits while it is CREATING or DELETING and fails at once on FAILED,
//! which no retry of the same call can change.

use app::api::ApiError;
use app::api::plan::{Action, Change, KNOWN_AFTER_APPLY};
use aws_sdk_eks::types::{
    AuthenticationMode, ClusterStatus, CreateAccessConfigRequest, VpcConfigRequest,
};
use serde_json::json;

use super::{Client, cluster_tags, issues};
use crate::aws::{SdkResultExt, failed_state};
use crate::resources::{Resource, Want, assume_made, made_in_plan, missing, tags};

const KIND: &str = "eks:Cluster";

#[derive(Clone, Debug, PartialEq)]
pub struct ControlPlaneSpec {
    pub kubernetes_version: String,
    pub role_arn: String,
    pub subnet_ids: Vec<String>,
    pub security_group_id: Option<String>,
}

pub struct EksCluster {
    pub eks: Client,
    pub name: String,
    pub want: Want<ControlPlaneSpec>,
}

/// The control plane as EKS describes it.
#[derive(Clone, Debug, PartialEq)]
pub struct State {
    pub arn: Option<String>,
    pub status: Option<ClusterStatus>,
    pub version: Option<String>,
    pub platform_version: Option<String>,
    pub oidc_issuer: Option<String>,
    pub endpoint: Option<String>,
    pub certificate_authority: Option<String>,
    pub authentication_mode: Option<AuthenticationMode>,
    /// hypd made it (its tags say so); an imported cluster is not deleted.
    pub ours: bool,
    pub health_issues: Vec<String>,
}

impl State {
    fn status_str(&self) -> &str {
        self.status
            .as_ref()
            .map_or("in an unknown state", |s| s.as_str())
    }

    /// Ready to use, still on its way (with a note), or failed for good.
    pub fn progress(&self, name: &str) -> Result<Option<String>, ApiError> {
        match &self.status {
            Some(ClusterStatus::Active) => Ok(None),
            Some(
                ClusterStatus::Creating
                | ClusterStatus::Updating
                | ClusterStatus::Pending
                | ClusterStatus::Deleting,
            ) => Ok(Some(format!("EKS cluster {name} is {}", self.status_str()))),
            _ => Err(failed_state(
                "eks",
                "DescribeCluster",
                self.status.as_ref().map(|s| s.as_str()),
                format!(
                    "EKS cluster {name} is {}{}",
                    self.status_str(),
                    if self.health_issues.is_empty() {
                        String::new()
                    } else {
                        format!(": {}", self.health_issues.join("; "))
                    }
                ),
            )),
        }
    }
}

/// What EKS has now under `name`, `None` when nothing.
/// Whether the plan being made creates EKS cluster `name` (so it is not there to read).
pub fn made_by_this_plan(name: &str) -> bool {
    !made_in_plan(KIND, name).is_empty()
}

pub async fn describe(eks: &Client, name: &str) -> Result<Option<State>, ApiError> {
    let found = eks
        .describe_cluster()
        .name(name)
        .send()
        .await
        .found("eks", "DescribeCluster")?;
    Ok(found.and_then(|o| o.cluster).map(|c| State {
        ours: tags::map_belongs_to(c.tags(), name),
        health_issues: c
            .health()
            .map(|h| {
                issues(
                    h.issues()
                        .iter()
                        .map(|i| (i.code().map(|c| c.as_str()), i.message())),
                )
            })
            .unwrap_or_default(),
        arn: c.arn,
        status: c.status,
        version: c.version,
        platform_version: c.platform_version,
        oidc_issuer: c.identity.and_then(|i| i.oidc).and_then(|o| o.issuer),
        endpoint: c.endpoint,
        certificate_authority: c.certificate_authority.and_then(|a| a.data),
        authentication_mode: c.access_config.and_then(|a| a.authentication_mode),
    }))
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Op {
    Create,
    Delete,
}

/// The changes for `want` given what was found. Pure.
pub fn diff(want: &Want<ControlPlaneSpec>, observed: &Option<State>) -> Vec<Op> {
    match (want, observed) {
        (Want::Present(_), None) => vec![Op::Create],
        (Want::Absent, Some(s)) if s.ours && s.status != Some(ClusterStatus::Deleting) => {
            vec![Op::Delete]
        }
        _ => Vec::new(),
    }
}

impl Resource for EksCluster {
    type Observed = Option<State>;
    type Op = Op;

    async fn observe(&self) -> Result<Option<State>, ApiError> {
        describe(&self.eks, &self.name).await
    }

    fn diff(&self, observed: &Option<State>) -> Result<Vec<Op>, ApiError> {
        Ok(diff(&self.want, observed))
    }

    async fn apply(&self, op: &Op, observed: &mut Option<State>) -> Result<(), ApiError> {
        match op {
            Op::Create => {
                let spec = self
                    .want
                    .present()
                    .ok_or_else(|| missing("the control plane's spec"))?;
                let vpc = VpcConfigRequest::builder()
                    .set_subnet_ids(Some(spec.subnet_ids.clone()))
                    .set_security_group_ids(spec.security_group_id.clone().map(|s| vec![s]))
                    .endpoint_public_access(true)
                    .endpoint_private_access(true)
                    .build();
                self.eks
                    .create_cluster()
                    .name(&self.name)
                    .version(&spec.kubernetes_version)
                    .role_arn(&spec.role_arn)
                    .resources_vpc_config(vpc)
                    .access_config(
                        CreateAccessConfigRequest::builder()
                            .authentication_mode(AuthenticationMode::ApiAndConfigMap)
                            .bootstrap_cluster_creator_admin_permissions(true)
                            .build(),
                    )
                    .set_tags(Some(cluster_tags(&self.name)))
                    .client_request_token(format!("hypd-{}", self.name))
                    .send()
                    .await
                    .allowing("eks", "CreateCluster", &["ResourceInUseException"])?;
                *observed = describe(&self.eks, &self.name).await?;
            }
            Op::Delete => {
                self.eks
                    .delete_cluster()
                    .name(&self.name)
                    .send()
                    .await
                    .found("eks", "DeleteCluster")?;
                if let Some(s) = observed {
                    s.status = Some(ClusterStatus::Deleting);
                }
            }
        }
        Ok(())
    }

    fn describe(&self, op: &Op, _: &Option<State>) -> Change {
        match (op, &self.want) {
            (Op::Create, Want::Present(spec)) => Change::new(Action::Create, KIND, &self.name)
                .field("version", None, Some(json!(spec.kubernetes_version)))
                .field(
                    "authentication_mode",
                    None,
                    Some(json!("API_AND_CONFIG_MAP")),
                )
                .field("oidc_issuer", None, Some(json!(KNOWN_AFTER_APPLY))),
            (Op::Create, Want::Absent) => Change::new(Action::Create, KIND, &self.name),
            (Op::Delete, _) => Change::new(Action::Delete, KIND, &self.name),
        }
    }
    /// Assumed made is assumed active (a plan goes on past the wait), and deleted gone.
    fn assume(&self, op: &Op, observed: &mut Option<State>) {
        if let Op::Create = op {
            assume_made(KIND, &self.name, String::new());
        }
        *observed = match (op, &self.want) {
            (Op::Create, Want::Present(spec)) => Some(State {
                arn: Some(KNOWN_AFTER_APPLY.to_owned()),
                status: Some(ClusterStatus::Active),
                version: Some(spec.kubernetes_version.clone()),
                platform_version: None,
                oidc_issuer: Some(KNOWN_AFTER_APPLY.to_owned()),
                endpoint: None,
                certificate_authority: None,
                authentication_mode: Some(AuthenticationMode::ApiAndConfigMap),
                ours: true,
                health_issues: Vec::new(),
            }),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(status: ClusterStatus) -> State {
        State {
            arn: None,
            status: Some(status),
            version: None,
            platform_version: None,
            oidc_issuer: None,
            endpoint: None,
            certificate_authority: None,
            authentication_mode: None,
            ours: true,
            health_issues: vec!["SubnetNotFound: subnet-1 does not exist".into()],
        }
    }

    #[test]
    fn a_failed_control_plane_fails_at_once_and_a_creating_one_waits() {
        assert!(
            state(ClusterStatus::Creating)
                .progress("ml")
                .unwrap()
                .is_some()
        );
        assert!(
            state(ClusterStatus::Active)
                .progress("ml")
                .unwrap()
                .is_none()
        );
        let e = state(ClusterStatus::Failed).progress("ml").unwrap_err();
        let ApiError::Upstream {
            code,
            message,
            transient,
            ..
        } = e
        else {
            panic!()
        };
        assert_eq!(code.as_deref(), Some("FAILED"));
        assert!(!transient);
        assert!(message.contains("SubnetNotFound"), "{message}");
    }

    #[test]
    fn only_hypds_own_control_plane_is_deleted() {
        let mut imported = state(ClusterStatus::Active);
        imported.ours = false;
        assert!(diff(&Want::Absent, &Some(imported)).is_empty());
        assert_eq!(
            diff(&Want::Absent, &Some(state(ClusterStatus::Active))),
            [Op::Delete]
        );
        assert!(diff(&Want::Absent, &Some(state(ClusterStatus::Deleting))).is_empty());
    }
}
