//! An EKS add-on at a pinned version. Present: created, or moved to the pinned version
//! once it is ACTIVE; a CREATE_FAILED or DEGRADED add-on is a failure with EKS's health
//! issues, not something to wait out. Absent: deleted if hypd's tags are on it.

use app::api::ApiError;
use app::api::plan::{Action, Change};
use aws_sdk_eks::types::AddonStatus;
use serde_json::json;

use super::{Client, cluster_tags, issues};
use crate::aws::{SdkResultExt, failed_state};
use crate::resources::{Resource, Want, tags};

const KIND: &str = "eks:Addon";

pub struct Addon {
    pub eks: Client,
    pub cluster: String,
    pub name: String,
    /// Present: the pinned version.
    pub want: Want<String>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct State {
    pub status: Option<AddonStatus>,
    pub version: Option<String>,
    pub ours: bool,
    pub issues: Vec<String>,
}

impl State {
    pub fn active(&self) -> bool {
        self.status == Some(AddonStatus::Active)
    }

    /// An error when the add-on has failed in a way waiting cannot mend.
    pub fn check(&self, name: &str) -> Result<(), ApiError> {
        match &self.status {
            Some(s @ (AddonStatus::CreateFailed | AddonStatus::Degraded)) => Err(failed_state(
                "eks",
                "DescribeAddon",
                Some(s.as_str()),
                format!(
                    "add-on {name} is {}: {}",
                    s.as_str(),
                    self.issues.join("; ")
                ),
            )),
            _ => Ok(()),
        }
    }

    /// How it stands, for a progress note.
    pub fn describe(&self, name: &str) -> String {
        format!(
            "{name} {}",
            self.status
                .as_ref()
                .map_or("in an unknown state", |s| s.as_str())
        )
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    Create,
    Update,
    Delete,
}

/// The changes for `want` given what was found. Pure.
pub fn diff(want: &Want<String>, observed: &Option<State>) -> Vec<Op> {
    match (want, observed) {
        (Want::Present(_), None) => vec![Op::Create],
        (Want::Present(version), Some(s))
            if s.active() && s.version.as_deref() != Some(version.as_str()) =>
        {
            vec![Op::Update]
        }
        (Want::Absent, Some(s)) if s.ours && s.status != Some(AddonStatus::Deleting) => {
            vec![Op::Delete]
        }
        _ => Vec::new(),
    }
}

impl Resource for Addon {
    type Observed = Option<State>;
    type Op = Op;

    async fn observe(&self) -> Result<Option<State>, ApiError> {
        let found = self
            .eks
            .describe_addon()
            .cluster_name(&self.cluster)
            .addon_name(&self.name)
            .send()
            .await
            .found("eks", "DescribeAddon")?;
        Ok(found.and_then(|o| o.addon).map(|a| State {
            ours: tags::map_belongs_to(a.tags(), &self.cluster),
            issues: a
                .health()
                .map(|h| {
                    issues(
                        h.issues()
                            .iter()
                            .map(|i| (i.code().map(|c| c.as_str()), i.message())),
                    )
                })
                .unwrap_or_default(),
            status: a.status,
            version: a.addon_version,
        }))
    }

    fn diff(&self, observed: &Option<State>) -> Result<Vec<Op>, ApiError> {
        Ok(diff(&self.want, observed))
    }

    async fn apply(&self, op: &Op, observed: &mut Option<State>) -> Result<(), ApiError> {
        let version = self.want.present().cloned();
        match op {
            Op::Create => {
                self.eks
                    .create_addon()
                    .cluster_name(&self.cluster)
                    .addon_name(&self.name)
                    .set_addon_version(version.clone())
                    .set_tags(Some(cluster_tags(&self.cluster)))
                    .client_request_token(format!("hypd-{}-{}", self.cluster, self.name))
                    .send()
                    .await
                    .allowing("eks", "CreateAddon", &["ResourceInUseException"])?;
                *observed = Some(State {
                    status: Some(AddonStatus::Creating),
                    version,
                    ours: true,
                    issues: Vec::new(),
                });
            }
            Op::Update => {
                self.eks
                    .update_addon()
                    .cluster_name(&self.cluster)
                    .addon_name(&self.name)
                    .set_addon_version(version.clone())
                    .send()
                    .await
                    .upstream("eks", "UpdateAddon")?;
                if let Some(s) = observed {
                    s.status = Some(AddonStatus::Updating);
                    s.version = version;
                }
            }
            Op::Delete => {
                self.eks
                    .delete_addon()
                    .cluster_name(&self.cluster)
                    .addon_name(&self.name)
                    .send()
                    .await
                    .found("eks", "DeleteAddon")?;
                if let Some(s) = observed {
                    s.status = Some(AddonStatus::Deleting);
                }
            }
        }
        Ok(())
    }

    fn describe(&self, op: &Op, observed: &Option<State>) -> Change {
        let change = |action| Change::new(action, KIND, &self.name);
        let wanted = self.want.present().map(|v| json!(v));
        match op {
            Op::Create => change(Action::Create).field("version", None, wanted),
            Op::Update => change(Action::Update).field(
                "version",
                observed
                    .as_ref()
                    .and_then(|s| s.version.clone())
                    .map(|v| json!(v)),
                wanted,
            ),
            Op::Delete => change(Action::Delete),
        }
    }
    /// Assumed made is assumed active (a plan goes on past the wait), and deleted gone.
    fn assume(&self, op: &Op, observed: &mut Option<State>) {
        *observed = match op {
            Op::Create | Op::Update => Some(State {
                status: Some(AddonStatus::Active),
                version: self.want.present().cloned(),
                ours: true,
                issues: Vec::new(),
            }),
            Op::Delete => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(status: AddonStatus, version: &str) -> Option<State> {
        Some(State {
            status: Some(status),
            version: Some(version.into()),
            ours: true,
            issues: vec![],
        })
    }

    #[test]
    fn an_active_addon_at_another_version_is_moved_to_the_pin() {
        let want = Want::Present("v2".to_owned());
        assert_eq!(diff(&want, &None), [Op::Create]);
        assert_eq!(diff(&want, &state(AddonStatus::Active, "v1")), [Op::Update]);
        assert!(diff(&want, &state(AddonStatus::Creating, "v1")).is_empty());
        assert!(diff(&want, &state(AddonStatus::Active, "v2")).is_empty());
        assert_eq!(
            diff(&Want::Absent, &state(AddonStatus::Active, "v2")),
            [Op::Delete]
        );
        let failed = state(AddonStatus::CreateFailed, "v2").unwrap();
        assert!(failed.check("x").is_err());
    }
}
