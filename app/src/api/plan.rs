//! What a mutation does to the world, one change per AWS or Kubernetes object. A stage's
//! step computes these from what it observed (a pure diff) and then applies exactly them,
//! so a plan shown before a run and the calls made by the run come from the same code.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Shown in place of a value that exists only once an earlier change has been applied
/// (a VPC id before the VPC is made, an OIDC issuer before EKS answers).
pub const KNOWN_AFTER_APPLY: &str = "(known after apply)";

/// What a change does to its object.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    Create,
    Update,
    Delete,
    /// The object exists already and hypd takes it as its own (a re-run, an import).
    Adopt,
    /// The object is as hypd wants it.
    None,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Create => "create",
            Action::Update => "update",
            Action::Delete => "delete",
            Action::Adopt => "adopt",
            Action::None => "none",
        }
    }

    /// True when applying it makes a mutating call.
    pub fn mutates(self) -> bool {
        matches!(self, Action::Create | Action::Update | Action::Delete)
    }
}

/// One field an update changes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct FieldChange {
    /// Path of the field in the object, e.g. `routes[0.0.0.0/0]` or `spec.replicas`.
    pub field: String,
    /// Absent when the field is being set for the first time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub old: Option<serde_json::Value>,
    /// Absent when the field is being removed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub new: Option<serde_json::Value>,
}

/// One change to one object.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Change {
    pub action: Action,
    /// `service:Type` for AWS (`ec2:Vpc`, `iam:Role`, `eks:Addon`, `sagemaker:Cluster`),
    /// `k8s:group/version/Kind` for Kubernetes (`k8s:apps/v1/DaemonSet`).
    pub kind: String,
    /// The object's name or id ([`KNOWN_AFTER_APPLY`] when it is made by this change).
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// For updates: the fields that change.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fields: Vec<FieldChange>,
    /// For a Kubernetes object: the field managers other than hypd that wrote it (from
    /// its `managedFields`), e.g. `kubectl-edit`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub changed_by: Vec<String>,
}

impl Change {
    pub fn new(action: Action, kind: impl Into<String>, name: impl Into<String>) -> Self {
        Change {
            action,
            kind: kind.into(),
            name: name.into(),
            namespace: None,
            fields: Vec::new(),
            changed_by: Vec::new(),
        }
    }

    pub fn in_namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = Some(namespace.into());
        self
    }

    /// Adds a field that changes from `old` to `new`.
    pub fn field(
        mut self,
        field: impl Into<String>,
        old: Option<serde_json::Value>,
        new: Option<serde_json::Value>,
    ) -> Self {
        self.fields.push(FieldChange {
            field: field.into(),
            old,
            new,
        });
        self
    }
}

impl std::fmt::Display for Change {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {} ", self.action.as_str(), self.kind)?;
        if let Some(ns) = &self.namespace {
            write!(f, "{ns}/")?;
        }
        write!(f, "{}", self.name)?;
        for c in &self.fields {
            let show = |v: &Option<serde_json::Value>| {
                v.as_ref()
                    .map_or_else(|| "(none)".to_owned(), |v| v.to_string())
            };
            write!(f, "; {}: {} -> {}", c.field, show(&c.old), show(&c.new))?;
        }
        Ok(())
    }
}

/// What one stage would change.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct StagePlan {
    /// The stage's stored name, as operations show it.
    pub stage: String,
    pub title: String,
    /// Empty when the stage would find nothing to do.
    pub changes: Vec<Change>,
}

/// What a mutation would do, stage by stage. Computed by the same observe and diff its
/// stages' steps run, with every mutating call refused, so it is what the run would do
/// to the world as it is now.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Plan {
    pub command: String,
    /// What the command acts on (`cluster/ml-1`).
    pub target: String,
    pub stages: Vec<StagePlan>,
}

impl Plan {
    /// Every change, in order.
    pub fn changes(&self) -> impl Iterator<Item = &Change> {
        self.stages.iter().flat_map(|s| s.changes.iter())
    }
}

/// The answer to a destructive command sent without `confirmation`: nothing was done.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ConfirmationRequired {
    /// What the command will do once confirmed.
    pub plan: Plan,
    /// Send the same request again with this as `confirmation` to run it. Single use,
    /// bound to the caller and to this exact request.
    pub confirmation: super::values::Confirmation,
    /// When the confirmation stops being accepted (RFC 3339, UTC).
    pub expires_at: String,
    pub message: String,
}

/// The answer to a request sent with `dry_run: true`: nothing was done.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct DryRun {
    pub plan: Plan,
}

/// What a command that can be previewed or must be confirmed answers: its result once
/// it ran, or why it did not run yet. On the wire a result is exactly `T`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum Gated<T> {
    ConfirmationRequired(ConfirmationRequired),
    DryRun(DryRun),
    Done(T),
}

impl<T> From<T> for Gated<T> {
    fn from(t: T) -> Self {
        Gated::Done(t)
    }
}

impl<T> Gated<T> {
    pub fn done(self) -> Option<T> {
        match self {
            Gated::Done(t) => Some(t),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_reads_as_one_line() {
        let c = Change::new(Action::Update, "eks:Addon", "cert-manager").field(
            "version",
            Some("v1.17".into()),
            Some("v1.18".into()),
        );
        assert_eq!(
            c.to_string(),
            "update eks:Addon cert-manager; version: \"v1.17\" -> \"v1.18\""
        );
        assert!(c.action.mutates() && !Action::Adopt.mutates());
    }
}
