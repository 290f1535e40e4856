//! An upstream release installed from its pinned manifest: objects of any kind, kept by
//! server-side apply in the release's own order and deleted in the reverse one, as one
//! resource. The manifest is data `scripts/manifests` generates from the upstream tag
//! (never hand-written YAML), so hypd installs exactly what the project ships. Each
//! object gets hypd's label when applied, and only objects carrying it are deleted: a
//! release someone else installed under the same names is never removed by hypd.

use app::api::ApiError;
use app::api::plan::{Action, Change, FieldChange};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::core::{ApiResource, DynamicObject, GroupVersion};
use serde::Deserialize;
use serde_json::{Value, json};

use super::object::differences;
use super::{FIELD_MANAGER, upstream};
use crate::resources::{Resource, Want, tags};

/// Where a release's manifest came from: its data file's first line.
#[derive(Clone, Debug, Deserialize)]
pub struct Source {
    pub name: String,
    pub version: String,
    pub repository: String,
    pub tag: String,
    pub commit: String,
}

/// A release: where it came from and its objects, in upstream's order.
#[derive(Debug)]
pub struct Release {
    pub source: Source,
    pub objects: Vec<Value>,
}

impl Release {
    /// A data file of `scripts/manifests`: the source line, then one object per line.
    pub fn parse(text: &str) -> Result<Release, String> {
        let mut lines = text.lines().filter(|l| !l.trim().is_empty());
        let header = lines.next().ok_or("the manifest is empty")?;
        let source: Source =
            serde_json::from_str(header).map_err(|e| format!("its source line: {e}"))?;
        let mut objects = Vec::new();
        for (i, line) in lines.enumerate() {
            let o: Value = serde_json::from_str(line).map_err(|e| format!("object {i}: {e}"))?;
            for field in ["apiVersion", "kind"] {
                if !o[field].is_string() {
                    return Err(format!("object {i} has no {field}"));
                }
            }
            if !o["metadata"]["name"].is_string() {
                return Err(format!("object {i} has no metadata.name"));
            }
            objects.push(o);
        }
        Ok(Release { source, objects })
    }

    /// The objects of `kind`, as upstream ships them.
    pub fn of_kind<'a>(&'a self, kind: &'a str) -> impl Iterator<Item = &'a Value> + 'a {
        self.objects.iter().filter(move |o| o["kind"] == kind)
    }
}

/// `namespace/name` (or `name` for a cluster-scoped object).
pub fn object_name(o: &Value) -> String {
    let name = o["metadata"]["name"].as_str().unwrap_or_default();
    match o["metadata"]["namespace"].as_str() {
        Some(ns) => format!("{ns}/{name}"),
        None => name.to_owned(),
    }
}

/// Whether hypd applied `o` (it carries hypd's label).
pub fn ours(o: &Value) -> bool {
    o["metadata"]["labels"][tags::K8S_MANAGED_BY.0] == tags::K8S_MANAGED_BY.1
}

/// The API of `o`'s kind, in its namespace when it names one (kustomize names the
/// namespace of every namespaced object of a release, and none of a cluster-scoped one).
pub fn api_of(client: &kube::Client, o: &Value) -> Result<Api<DynamicObject>, ApiError> {
    let api_version = o["apiVersion"].as_str().unwrap_or_default();
    let gv: GroupVersion = api_version
        .parse()
        .map_err(|e| ApiError::internal(format!("apiVersion {api_version}: {e}")))?;
    let ar = ApiResource::from_gvk(&gv.with_kind(o["kind"].as_str().unwrap_or_default()));
    Ok(match o["metadata"]["namespace"].as_str() {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
        None => Api::all_with(client.clone(), &ar),
    })
}

/// Reads `o` as it is in the cluster, as JSON; absent is `None`.
pub async fn read(client: &kube::Client, o: &Value) -> Result<Option<Value>, ApiError> {
    let name = o["metadata"]["name"].as_str().unwrap_or_default();
    let found = api_of(client, o)?
        .get_opt(name)
        .await
        .map_err(|e| upstream(&format!("get {} {}", o["kind"], object_name(o)), e))?;
    found
        .map(|d| serde_json::to_value(d).map_err(ApiError::internal))
        .transpose()
}

/// A release wanted installed or gone on one cluster.
pub struct Manifest<'a> {
    pub client: kube::Client,
    pub release: &'a Release,
    pub want: Want<()>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// Server-side apply of object `index`; the fields it sets or changes (none listed
    /// when it creates the object).
    Apply {
        index: usize,
        fields: Vec<FieldChange>,
    },
    Delete {
        index: usize,
    },
}

impl Manifest<'_> {
    /// Object `index` as hypd applies it: upstream's, with hypd's label.
    fn desired(&self, index: usize) -> Value {
        let mut o = self.release.objects[index].clone();
        o["metadata"]["labels"][tags::K8S_MANAGED_BY.0] = json!(tags::K8S_MANAGED_BY.1);
        o
    }

    /// What keeps the release from being whole and ready, one line each: an object
    /// missing, a CRD not established, a Deployment with no available replica; or, for a
    /// release wanted gone, one of hypd's objects still there (a namespace or CRD
    /// finalizing). Empty when it stands as wanted.
    pub fn pending(&self, live: &[Option<Value>]) -> Vec<String> {
        let mut out = Vec::new();
        for (o, l) in self.release.objects.iter().zip(live) {
            let what = format!(
                "{} {}",
                o["kind"].as_str().unwrap_or_default(),
                object_name(o)
            );
            match (&self.want, l) {
                (Want::Present(()), None) => out.push(format!("{what} missing")),
                (Want::Present(()), Some(l)) => {
                    if o["kind"] == "CustomResourceDefinition" && !established(l) {
                        out.push(format!("{what} not established"));
                    }
                    if o["kind"] == "Deployment"
                        && l["status"]["availableReplicas"].as_i64().unwrap_or(0) < 1
                    {
                        out.push(format!("{what} not available"));
                    }
                }
                (Want::Absent, Some(l)) if ours(l) => out.push(format!("{what} being deleted")),
                (Want::Absent, _) => {}
            }
        }
        out
    }
}

fn established(crd: &Value) -> bool {
    crd["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Established" && c["status"] == "True")
}

/// The changes for `want` given each object's live state (same order as the release).
/// Pure. Being deleted already is not a change to make again.
pub fn diff(want: &Want<()>, desired: impl Fn(usize) -> Value, live: &[Option<Value>]) -> Vec<Op> {
    match want {
        Want::Present(()) => live
            .iter()
            .enumerate()
            .filter_map(|(index, l)| match l {
                None => Some(Op::Apply {
                    index,
                    fields: Vec::new(),
                }),
                Some(l) => {
                    let fields: Vec<FieldChange> = differences(&desired(index), l)
                        .into_iter()
                        .filter(|f| !f.field.starts_with("status"))
                        .collect();
                    (!fields.is_empty()).then_some(Op::Apply { index, fields })
                }
            })
            .collect(),
        Want::Absent => live
            .iter()
            .enumerate()
            .rev()
            .filter(|(_, l)| {
                l.as_ref()
                    .is_some_and(|l| ours(l) && l["metadata"]["deletionTimestamp"].is_null())
            })
            .map(|(index, _)| Op::Delete { index })
            .collect(),
    }
}

impl Resource for Manifest<'_> {
    /// Each of the release's objects as it is, in the release's order.
    type Observed = Vec<Option<Value>>;
    type Op = Op;

    async fn observe(&self) -> Result<Vec<Option<Value>>, ApiError> {
        let mut live = Vec::with_capacity(self.release.objects.len());
        for o in &self.release.objects {
            live.push(read(&self.client, o).await?);
        }
        Ok(live)
    }

    fn diff(&self, live: &Vec<Option<Value>>) -> Result<Vec<Op>, ApiError> {
        Ok(diff(&self.want, |i| self.desired(i), live))
    }

    async fn apply(&self, op: &Op, live: &mut Vec<Option<Value>>) -> Result<(), ApiError> {
        match op {
            Op::Apply { index, .. } => {
                let o = self.desired(*index);
                let name = o["metadata"]["name"].as_str().unwrap_or_default();
                let params = PatchParams::apply(FIELD_MANAGER).force();
                let applied = api_of(&self.client, &o)?
                    .patch(name, &params, &Patch::Apply(&o))
                    .await
                    .map_err(|e| {
                        upstream(&format!("apply {} {}", o["kind"], object_name(&o)), e)
                    })?;
                live[*index] = Some(serde_json::to_value(applied).map_err(ApiError::internal)?);
            }
            Op::Delete { index } => {
                let o = &self.release.objects[*index];
                let name = o["metadata"]["name"].as_str().unwrap_or_default();
                match api_of(&self.client, o)?
                    .delete(name, &DeleteParams::background())
                    .await
                {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if s.code == 404 => {}
                    Err(e) => {
                        return Err(upstream(
                            &format!("delete {} {}", o["kind"], object_name(o)),
                            e,
                        ));
                    }
                }
                live[*index] = None;
            }
        }
        Ok(())
    }

    fn describe(&self, op: &Op, live: &Vec<Option<Value>>) -> Change {
        let (action, index, fields) = match op {
            Op::Apply { index, .. } if live[*index].is_none() => {
                (Action::Create, *index, Vec::new())
            }
            Op::Apply { index, fields } => (Action::Update, *index, fields.clone()),
            Op::Delete { index } => (Action::Delete, *index, Vec::new()),
        };
        let o = &self.release.objects[index];
        let kind = format!(
            "k8s:{}/{}",
            o["apiVersion"].as_str().unwrap_or_default(),
            o["kind"].as_str().unwrap_or_default()
        );
        let mut change = Change::new(
            action,
            kind,
            o["metadata"]["name"].as_str().unwrap_or_default(),
        );
        change.fields = fields;
        change.namespace = o["metadata"]["namespace"].as_str().map(str::to_owned);
        change
    }

    fn assume(&self, op: &Op, live: &mut Vec<Option<Value>>) {
        match op {
            Op::Apply { index, .. } => live[*index] = Some(self.desired(*index)),
            Op::Delete { index } => live[*index] = None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn release() -> Release {
        Release::parse(concat!(
            r#"{"name":"x","version":"1.0","repository":"r","tag":"v1.0","commit":"c"}"#,
            "\n",
            r#"{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"x"}}"#,
            "\n",
            r#"{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"op","namespace":"x"},"spec":{"replicas":1}}"#,
        ))
        .unwrap()
    }

    fn labelled(mut o: Value) -> Value {
        o["metadata"]["labels"][tags::K8S_MANAGED_BY.0] = json!(tags::K8S_MANAGED_BY.1);
        o
    }

    #[test]
    fn installs_what_is_missing_or_differs_and_removes_only_its_own_in_reverse() {
        let r = release();
        let desired = |i: usize| labelled(r.objects[i].clone());
        // Nothing there: both applied, in the release's order.
        let ops = diff(&Want::Present(()), desired, &[None, None]);
        assert_eq!(
            ops.iter()
                .map(|o| match o {
                    Op::Apply { index, .. } => *index,
                    Op::Delete { .. } => 99,
                })
                .collect::<Vec<_>>(),
            [0, 1]
        );
        // What the server adds is no difference; a changed field is.
        let mut dep = desired(1);
        dep["status"] = json!({"availableReplicas": 1});
        dep["metadata"]["uid"] = json!("u");
        let live = [Some(desired(0)), Some(dep.clone())];
        assert!(diff(&Want::Present(()), desired, &live).is_empty());
        dep["spec"]["replicas"] = json!(3);
        let ops = diff(&Want::Present(()), desired, &[Some(desired(0)), Some(dep)]);
        match &ops[..] {
            [Op::Apply { index: 1, fields }] => assert_eq!(fields[0].field, "spec.replicas"),
            other => panic!("{other:?}"),
        }
        // Gone: only hypd's objects, the namespace last, none already being deleted.
        let live = [Some(desired(0)), Some(desired(1))];
        assert_eq!(
            diff(&Want::Absent, desired, &live),
            [Op::Delete { index: 1 }, Op::Delete { index: 0 }]
        );
        let mut theirs = r.objects[1].clone();
        theirs["metadata"]["labels"] = json!({"app.kubernetes.io/managed-by": "Helm"});
        let mut terminating = desired(0);
        terminating["metadata"]["deletionTimestamp"] = json!("2026-12-03T00:00:00Z");
        assert!(diff(&Want::Absent, desired, &[Some(terminating), Some(theirs)]).is_empty());
    }

    #[test]
    fn a_manifest_without_a_source_line_or_names_is_refused() {
        assert!(Release::parse("").is_err());
        let header = r#"{"name":"x","version":"1","repository":"r","tag":"t","commit":"c"}"#;
        assert!(
            Release::parse(&format!(
                "{header}\n{{\"apiVersion\":\"v1\",\"kind\":\"Namespace\",\"metadata\":{{}}}}"
            ))
            .is_err()
        );
        assert_eq!(release().of_kind("Deployment").count(), 1);
    }
}
