//! An EKS add-on at a pinned version, with hypd's configuration values if it has any.
//! Present: created, or moved to the pinned version (and configuration) once it is ACTIVE; a CREATE_FAILED or DEGRADED add-on is a failure with EKS's health
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
    /// Present: the add-on's `configurationValues`, when hypd sets them (none: EKS's
    /// defaults, and whatever someone else set is left as it is).
    pub configuration: Option<serde_json::Value>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct State {
    pub status: Option<AddonStatus>,
    pub version: Option<String>,
    pub ours: bool,
    pub issues: Vec<String>,
    /// Its `configurationValues`, parsed (none when unset or not JSON).
    pub configuration: Option<serde_json::Value>,
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

/// The changes for `want` (and `configuration`, if hypd sets one) given what was found.
/// Pure.
pub fn diff(
    want: &Want<String>,
    configuration: Option<&serde_json::Value>,
    observed: &Option<State>,
) -> Vec<Op> {
    match (want, observed) {
        (Want::Present(_), None) => vec![Op::Create],
        (Want::Present(version), Some(s))
            if s.active()
                && (s.version.as_deref() != Some(version.as_str())
                    || configuration.is_some_and(|c| s.configuration.as_ref() != Some(c))) =>
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
            configuration: a
                .configuration_values
                .as_deref()
                .and_then(|c| serde_json::from_str(c).ok()),
            status: a.status,
            version: a.addon_version,
        }))
    }

    fn diff(&self, observed: &Option<State>) -> Result<Vec<Op>, ApiError> {
        Ok(diff(&self.want, self.configuration.as_ref(), observed))
    }

    async fn apply(&self, op: &Op, observed: &mut Option<State>) -> Result<(), ApiError> {
        let version = self.want.present().cloned();
        let configuration = self.configuration.as_ref().map(|c| c.to_string());
        match op {
            Op::Create => {
                self.eks
                    .create_addon()
                    .cluster_name(&self.cluster)
                    .addon_name(&self.name)
                    .set_addon_version(version.clone())
                    .set_configuration_values(configuration)
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
                    configuration: self.configuration.clone(),
                });
            }
            Op::Update => {
                self.eks
                    .update_addon()
                    .cluster_name(&self.cluster)
                    .addon_name(&self.name)
                    .set_addon_version(version.clone())
                    .set_configuration_values(configuration)
                    .send()
                    .await
                    .upstream("eks", "UpdateAddon")?;
                if let Some(s) = observed {
                    s.status = Some(AddonStatus::Updating);
                    s.version = version;
                    if self.configuration.is_some() {
                        s.configuration = self.configuration.clone();
                    }
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
        let configured = |c: Change, was: Option<serde_json::Value>| match &self.configuration {
            Some(want) if was.as_ref() != Some(want) => {
                c.field("configuration_values", was, Some(want.clone()))
            }
            _ => c,
        };
        match op {
            Op::Create => configured(change(Action::Create).field("version", None, wanted), None),
            Op::Update => {
                let was = observed.as_ref();
                let version = was.and_then(|s| s.version.clone()).map(|v| json!(v));
                let c = if version != wanted {
                    change(Action::Update).field("version", version, wanted)
                } else {
                    change(Action::Update)
                };
                configured(c, was.and_then(|s| s.configuration.clone()))
            }
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
                configuration: self.configuration.clone(),
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
            configuration: None,
        })
    }

    #[test]
    fn an_active_addon_at_another_version_is_moved_to_the_pin() {
        let want = Want::Present("v2".to_owned());
        assert_eq!(diff(&want, None, &None), [Op::Create]);
        assert_eq!(
            diff(&want, None, &state(AddonStatus::Active, "v1")),
            [Op::Update]
        );
        assert!(diff(&want, None, &state(AddonStatus::Creating, "v1")).is_empty());
        assert!(diff(&want, None, &state(AddonStatus::Active, "v2")).is_empty());
        assert_eq!(
            diff(&Want::Absent, None, &state(AddonStatus::Active, "v2")),
            [Op::Delete]
        );
        // hypd's configuration is put back when it differs; none set leaves any alone.
        let config = json!({"executionRoleArn": "arn:r"});
        assert_eq!(
            diff(&want, Some(&config), &state(AddonStatus::Active, "v2")),
            [Op::Update]
        );
        let mut configured = state(AddonStatus::Active, "v2");
        configured.as_mut().unwrap().configuration = Some(config.clone());
        assert!(diff(&want, Some(&config), &configured).is_empty());
        assert!(diff(&want, None, &configured).is_empty());
        let failed = state(AddonStatus::CreateFailed, "v2").unwrap();
        assert!(failed.check("x").is_err());
    }
}
