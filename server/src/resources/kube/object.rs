//! One Kubernetes object hypd owns, kept by server-side apply as field manager `hypd`.
//! The diff is the object's fields that the live object lacks or holds differently
//! (what the API server adds — defaults, status, metadata it keeps — is not a
//! difference), so applying only when it is non-empty leaves a cluster that already
//! matches untouched. Applying takes over fields another manager changed: these objects
//! are hypd's, and a hand edit should not wedge a stage.

use app::api::ApiError;
use app::api::plan::{Action, Change, FieldChange};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::core::NamespaceResourceScope;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::{FIELD_MANAGER, get, upstream};
use crate::resources::{Resource, Want, tags};

pub struct Applied<K> {
    api: Api<K>,
    object: K,
    want: Want<()>,
}

/// What the objects hypd applies must be.
pub trait Object:
    kube::Resource<DynamicType = ()>
    + Clone
    + Serialize
    + DeserializeOwned
    + std::fmt::Debug
    + Send
    + Sync
{
}

impl<K> Object for K where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + Serialize
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
{
}

impl<K: Object> Applied<K> {
    /// A cluster-scoped object.
    pub fn cluster(client: &kube::Client, object: K) -> Self {
        Self {
            api: Api::all(client.clone()),
            object,
            want: Want::Present(()),
        }
    }

    /// A namespaced object, in the namespace it names (`default` when it names none).
    pub fn namespaced(client: &kube::Client, object: K) -> Self
    where
        K: kube::Resource<Scope = NamespaceResourceScope>,
    {
        let ns = object
            .meta()
            .namespace
            .clone()
            .unwrap_or_else(|| "default".to_owned());
        Self {
            api: Api::namespaced(client.clone(), &ns),
            object,
            want: Want::Present(()),
        }
    }

    /// The same object, wanted gone (if it carries hypd's label).
    pub fn absent(mut self) -> Self {
        self.want = Want::Absent;
        self
    }

    fn name(&self) -> &str {
        self.object.meta().name.as_deref().unwrap_or_default()
    }

    fn kind(&self) -> String {
        format!("k8s:{}/{}", K::api_version(&()), K::kind(&()))
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// Server-side apply; the fields it sets or changes (all of them when creating).
    Apply {
        fields: Vec<FieldChange>,
    },
    Delete,
}

/// The fields of `desired` that `live` lacks or holds differently, as paths. Pure.
pub fn differences(desired: &Value, live: &Value) -> Vec<FieldChange> {
    let mut out = Vec::new();
    walk(desired, Some(live), String::new(), &mut out);
    out
}

fn walk(desired: &Value, live: Option<&Value>, path: String, out: &mut Vec<FieldChange>) {
    match (desired, live) {
        (Value::Object(d), Some(Value::Object(l))) => {
            for (k, dv) in d {
                let at = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                walk(dv, l.get(k), at, out);
            }
        }
        (Value::Array(d), Some(Value::Array(l))) if d.len() == l.len() => {
            for (i, (dv, lv)) in d.iter().zip(l).enumerate() {
                walk(dv, Some(lv), format!("{path}[{i}]"), out);
            }
        }
        (d, Some(l)) if d == l => {}
        // An absent field and an explicit null mean the same to the API server.
        (Value::Null, None) => {}
        (d, l) => out.push(FieldChange {
            field: path,
            old: l.cloned(),
            new: Some(d.clone()),
        }),
    }
}

/// The field managers other than hypd that wrote `live` (status writers aside).
fn other_managers<K: Object>(live: &K) -> Vec<String> {
    let mut managers: Vec<String> = live
        .meta()
        .managed_fields
        .iter()
        .flatten()
        .filter(|m| m.subresource.as_deref() != Some("status"))
        .filter_map(|m| m.manager.clone())
        .filter(|m| m != FIELD_MANAGER)
        .collect();
    managers.sort();
    managers.dedup();
    managers
}

/// Whether an object carries hypd's label: only those hypd deletes.
pub fn made_by_hypd(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> bool {
    meta.labels
        .as_ref()
        .and_then(|l| l.get(tags::K8S_MANAGED_BY.0))
        .is_some_and(|v| v == tags::K8S_MANAGED_BY.1)
}

/// The changes for `want` given the live object. Pure.
pub fn diff<K: Object>(
    want: &Want<()>,
    desired: &K,
    live: &Option<K>,
) -> Result<Vec<Op>, ApiError> {
    match (want, live) {
        (Want::Present(()), None) => Ok(vec![Op::Apply { fields: Vec::new() }]),
        (Want::Present(()), Some(live)) => {
            let d = serde_json::to_value(desired).map_err(ApiError::internal)?;
            let l = serde_json::to_value(live).map_err(ApiError::internal)?;
            let fields: Vec<FieldChange> = differences(&d, &l)
                .into_iter()
                // What the live object reports about itself is not hypd's to set.
                .filter(|f| !f.field.starts_with("status"))
                .collect();
            Ok(if fields.is_empty() {
                Vec::new()
            } else {
                vec![Op::Apply { fields }]
            })
        }
        (Want::Absent, Some(live)) => Ok(if made_by_hypd(live.meta()) {
            vec![Op::Delete]
        } else {
            Vec::new()
        }),
        (Want::Absent, None) => Ok(Vec::new()),
    }
}

impl<K: Object> Resource for Applied<K> {
    /// The live object, `None` when there is none.
    type Observed = Option<K>;
    type Op = Op;

    async fn observe(&self) -> Result<Option<K>, ApiError> {
        // Named after something this plan makes (a file system's id): not there yet.
        if crate::resources::known_after_apply(self.name()) {
            return Ok(None);
        }
        get(&self.api, self.name()).await
    }

    fn diff(&self, live: &Option<K>) -> Result<Vec<Op>, ApiError> {
        diff(&self.want, &self.object, live)
    }

    async fn apply(&self, op: &Op, live: &mut Option<K>) -> Result<(), ApiError> {
        let name = self.name().to_owned();
        let call = |verb: &str| format!("{verb} {}/{name}", K::kind(&()));
        match op {
            Op::Apply { .. } => {
                let params = PatchParams::apply(FIELD_MANAGER).force();
                let applied = self
                    .api
                    .patch(&name, &params, &Patch::Apply(&self.object))
                    .await
                    .map_err(|e| upstream(&call("apply"), e))?;
                *live = Some(applied);
            }
            Op::Delete => {
                match self.api.delete(&name, &DeleteParams::background()).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if s.code == 404 => {}
                    Err(e) => return Err(upstream(&call("delete"), e)),
                }
                *live = None;
            }
        }
        Ok(())
    }

    fn describe(&self, op: &Op, live: &Option<K>) -> Change {
        let mut change = match (op, live) {
            (Op::Apply { .. }, None) => {
                let mut c = Change::new(Action::Create, self.kind(), self.name());
                // A new object's spec is shown whole: it is what will be applied. (Only
                // the spec: a Secret's data never reaches a plan.)
                if let Ok(Value::Object(desired)) = serde_json::to_value(&self.object)
                    && let Some(spec) = desired.get("spec").filter(|s| !s.is_null())
                {
                    c.fields = vec![FieldChange {
                        field: "spec".into(),
                        old: None,
                        new: Some(spec.clone()),
                    }];
                }
                c
            }
            (Op::Apply { fields }, Some(live)) => {
                let mut c = Change::new(Action::Update, self.kind(), self.name());
                c.fields = fields.clone();
                c.changed_by = other_managers(live);
                c
            }
            (Op::Delete, _) => Change::new(Action::Delete, self.kind(), self.name()),
        };
        change.namespace = self.object.meta().namespace.clone();
        change
    }
    fn assume(&self, op: &Op, live: &mut Option<K>) {
        *live = match op {
            Op::Apply { .. } => Some(self.object.clone()),
            Op::Delete => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn only_what_the_live_object_lacks_or_holds_differently_differs() {
        let desired = json!({
            "metadata": {"name": "a", "labels": {"x": "1"}},
            "spec": {"replicas": 2, "template": {"containers": [{"name": "c", "image": "i:2"}]}},
        });
        let live = json!({
            "metadata": {"name": "a", "uid": "u", "labels": {"x": "1", "added": "by-server"}},
            "spec": {"replicas": 2, "template": {"containers": [{"name": "c", "image": "i:1", "imagePullPolicy": "IfNotPresent"}]}},
            "status": {"ready": 1},
        });
        let d = differences(&desired, &live);
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].field, "spec.template.containers[0].image");
        assert_eq!(d[0].old, Some(json!("i:1")));
        assert!(differences(&desired, &desired).is_empty());
        let fewer = json!({"spec": {"template": {"containers": []}}});
        assert_eq!(
            differences(&desired, &fewer)
                .iter()
                .map(|f| f.field.as_str())
                .collect::<Vec<_>>(),
            ["metadata", "spec.replicas", "spec.template.containers"]
        );
    }
}
