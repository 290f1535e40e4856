//! Which resources exist: the built-in kinds the emulator serves plus every served version
//! of the CRDs in the store, and the discovery documents (`/api`, `/apis`, resource lists,
//! OpenAPI v3 index) that kubectl and kube-rs read before their first request. The
//! documents are generated from the same table the handlers use, so discovery never
//! advertises something the server cannot do.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{Value, json};

use super::store::{Key, Store};

pub const CRD_GR: &str = "apiextensions.k8s.io/customresourcedefinitions";

#[derive(Clone, Debug)]
pub struct Resource {
    pub group: String,
    pub version: String,
    pub plural: String,
    pub singular: String,
    pub kind: String,
    pub namespaced: bool,
    pub short_names: Vec<String>,
    pub categories: Vec<String>,
    /// Has a `/status` subresource (writes to the main resource leave status alone).
    pub status: bool,
    /// A CRD version's `openAPIV3Schema`.
    pub schema: Option<Arc<Value>>,
    /// A CRD version's `additionalPrinterColumns` (name, JSONPath).
    pub printer: Vec<(String, String)>,
    /// A CRD version's `scale` subresource: where its Scale's fields live in the object.
    pub scale: Option<ScalePaths>,
}

/// The JSON paths (`.spec.replicas`) a CRD's `subresources.scale` names.
#[derive(Clone, Debug)]
pub struct ScalePaths {
    pub spec_replicas: String,
    pub status_replicas: String,
    pub label_selector: Option<String>,
}

impl ScalePaths {
    fn of(scale: &Value) -> Option<Self> {
        Some(Self {
            spec_replicas: scale["specReplicasPath"].as_str()?.to_owned(),
            status_replicas: scale["statusReplicasPath"].as_str()?.to_owned(),
            label_selector: scale["labelSelectorPath"].as_str().map(str::to_owned),
        })
    }
}

impl Resource {
    /// The storage key prefix: `group/plural`.
    pub fn gr(&self) -> String {
        format!("{}/{}", self.group, self.plural)
    }

    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    pub fn group_version(&self) -> String {
        self.api_version()
    }
}

/// group, version, plural, kind, namespaced, short names, status subresource.
type Builtin = (
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    bool,
    &'static [&'static str],
    bool,
);

const BUILTIN: &[Builtin] = &[
    ("", "v1", "namespaces", "Namespace", false, &["ns"], true),
    ("", "v1", "pods", "Pod", true, &["po"], true),
    ("", "v1", "services", "Service", true, &["svc"], true),
    ("", "v1", "endpoints", "Endpoints", true, &["ep"], false),
    ("", "v1", "configmaps", "ConfigMap", true, &["cm"], false),
    ("", "v1", "secrets", "Secret", true, &[], false),
    (
        "",
        "v1",
        "serviceaccounts",
        "ServiceAccount",
        true,
        &["sa"],
        false,
    ),
    ("", "v1", "nodes", "Node", false, &["no"], true),
    (
        "",
        "v1",
        "persistentvolumes",
        "PersistentVolume",
        false,
        &["pv"],
        true,
    ),
    (
        "",
        "v1",
        "persistentvolumeclaims",
        "PersistentVolumeClaim",
        true,
        &["pvc"],
        true,
    ),
    ("", "v1", "events", "Event", true, &["ev"], false),
    (
        "apps",
        "v1",
        "deployments",
        "Deployment",
        true,
        &["deploy"],
        true,
    ),
    (
        "apps",
        "v1",
        "replicasets",
        "ReplicaSet",
        true,
        &["rs"],
        true,
    ),
    ("apps", "v1", "daemonsets", "DaemonSet", true, &["ds"], true),
    (
        "apps",
        "v1",
        "statefulsets",
        "StatefulSet",
        true,
        &["sts"],
        true,
    ),
    ("batch", "v1", "jobs", "Job", true, &[], true),
    (
        "apiextensions.k8s.io",
        "v1",
        "customresourcedefinitions",
        "CustomResourceDefinition",
        false,
        &["crd", "crds"],
        true,
    ),
    (
        "rbac.authorization.k8s.io",
        "v1",
        "clusterroles",
        "ClusterRole",
        false,
        &[],
        false,
    ),
    (
        "rbac.authorization.k8s.io",
        "v1",
        "clusterrolebindings",
        "ClusterRoleBinding",
        false,
        &[],
        false,
    ),
    (
        "rbac.authorization.k8s.io",
        "v1",
        "roles",
        "Role",
        true,
        &[],
        false,
    ),
    (
        "rbac.authorization.k8s.io",
        "v1",
        "rolebindings",
        "RoleBinding",
        true,
        &[],
        false,
    ),
    // Kept, not acted on: the sim calls no webhook and serves no aggregated API (an
    // APIService's backing Service is never asked), as on a cluster whose webhook
    // services are down and whose failure policies say Ignore.
    (
        "apiregistration.k8s.io",
        "v1",
        "apiservices",
        "APIService",
        false,
        &[],
        true,
    ),
    (
        "admissionregistration.k8s.io",
        "v1",
        "validatingwebhookconfigurations",
        "ValidatingWebhookConfiguration",
        false,
        &[],
        false,
    ),
    (
        "admissionregistration.k8s.io",
        "v1",
        "mutatingwebhookconfigurations",
        "MutatingWebhookConfiguration",
        false,
        &[],
        false,
    ),
    (
        "storage.k8s.io",
        "v1",
        "storageclasses",
        "StorageClass",
        false,
        &["sc"],
        false,
    ),
];

fn builtins() -> impl Iterator<Item = Resource> {
    BUILTIN.iter().map(
        |(group, version, plural, kind, namespaced, short, status)| Resource {
            group: (*group).to_owned(),
            version: (*version).to_owned(),
            plural: (*plural).to_owned(),
            singular: kind.to_lowercase(),
            kind: (*kind).to_owned(),
            namespaced: *namespaced,
            short_names: short.iter().map(|s| (*s).to_owned()).collect(),
            categories: if [
                "pods",
                "services",
                "deployments",
                "replicasets",
                "daemonsets",
                "statefulsets",
                "jobs",
            ]
            .contains(plural)
            {
                vec!["all".to_owned()]
            } else {
                Vec::new()
            },
            status: *status,
            schema: None,
            printer: Vec::new(),
            scale: None,
        },
    )
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

/// The served versions of one CRD object.
pub fn crd_resources(crd: &Value) -> Vec<Resource> {
    let spec = &crd["spec"];
    let names = &spec["names"];
    let (Some(group), Some(plural), Some(kind)) = (
        spec["group"].as_str(),
        names["plural"].as_str(),
        names["kind"].as_str(),
    ) else {
        return Vec::new();
    };
    let singular = names["singular"]
        .as_str()
        .map(str::to_owned)
        .unwrap_or_else(|| kind.to_lowercase());
    let mut out = Vec::new();
    for v in spec["versions"].as_array().into_iter().flatten() {
        if v["served"].as_bool() == Some(false) {
            continue;
        }
        let Some(version) = v["name"].as_str() else {
            continue;
        };
        out.push(Resource {
            group: group.to_owned(),
            version: version.to_owned(),
            plural: plural.to_owned(),
            singular: singular.clone(),
            kind: kind.to_owned(),
            namespaced: spec["scope"].as_str() != Some("Cluster"),
            short_names: strings(&names["shortNames"]),
            categories: strings(&names["categories"]),
            status: v["subresources"]["status"].is_object(),
            schema: v["schema"]["openAPIV3Schema"]
                .is_object()
                .then(|| Arc::new(v["schema"]["openAPIV3Schema"].clone())),
            printer: super::table::printer_columns(Some(v)),
            scale: ScalePaths::of(&v["subresources"]["scale"]),
        });
    }
    out
}

/// Every resource the cluster serves now, built-ins first.
pub fn all(store: &Store) -> Vec<Resource> {
    let mut out: Vec<Resource> = builtins().collect();
    for crd in store.list(CRD_GR, None) {
        // A CRD being deleted stops being served.
        if crd["metadata"]["deletionTimestamp"].is_string() {
            continue;
        }
        out.extend(store.crd_cache.resources(crd));
    }
    store
        .crd_cache
        .forget_except(|name| store.get(&Key::new(CRD_GR, "", name)).is_some());
    out
}

pub fn find(store: &Store, group: &str, version: &str, plural: &str) -> Option<Resource> {
    if let Some(r) =
        builtins().find(|r| r.group == group && r.version == version && r.plural == plural)
    {
        return Some(r);
    }
    all(store)
        .into_iter()
        .find(|r| r.group == group && r.version == version && r.plural == plural)
}

fn verbs(r: &Resource) -> Vec<&'static str> {
    vec![
        "create",
        "delete",
        "deletecollection",
        "get",
        "list",
        "patch",
        "update",
        "watch",
    ]
    .into_iter()
    .filter(|v| r.plural != "events" || *v != "deletecollection")
    .collect()
}

/// The resources served at `group/version`, if any are.
fn served(store: &Store, group: &str, version: &str) -> Option<Vec<Resource>> {
    let rs: Vec<Resource> = all(store)
        .into_iter()
        .filter(|r| r.group == group && r.version == version)
        .collect();
    (!rs.is_empty()).then_some(rs)
}

pub fn resource_list(store: &Store, group: &str, version: &str) -> Option<Value> {
    let rs = served(store, group, version)?;
    let mut resources = Vec::new();
    for r in &rs {
        let mut entry = json!({
            "name": r.plural,
            "singularName": r.singular,
            "namespaced": r.namespaced,
            "kind": r.kind,
            "verbs": verbs(r),
        });
        if !r.short_names.is_empty() {
            entry["shortNames"] = json!(r.short_names);
        }
        if !r.categories.is_empty() {
            entry["categories"] = json!(r.categories);
        }
        resources.push(entry);
        if r.status {
            resources.push(json!({
                "name": format!("{}/status", r.plural),
                "singularName": "",
                "namespaced": r.namespaced,
                "kind": r.kind,
                "verbs": ["get", "patch", "update"],
            }));
        }
        if super::api::SCALABLE.contains(&r.gr().as_str()) || r.scale.is_some() {
            resources.push(json!({
                "name": format!("{}/scale", r.plural), "singularName": "", "namespaced": r.namespaced,
                "group": "autoscaling", "version": "v1", "kind": "Scale", "verbs": ["get", "patch", "update"],
            }));
        }
        if r.plural == "pods" {
            resources.push(json!({
                "name": "pods/log", "singularName": "", "namespaced": true, "kind": "Pod", "verbs": ["get"],
            }));
        }
        if r.gr() == "/services" {
            resources.push(json!({
                "name": "services/proxy", "singularName": "", "namespaced": true, "kind": "ServiceProxyOptions",
                "verbs": ["create", "delete", "get", "patch", "update"],
            }));
        }
    }
    Some(json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": rs[0].group_version(),
        "resources": resources,
    }))
}

/// Groups and their versions, the first version listed preferred.
fn groups(store: &Store) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for r in all(store) {
        let versions = out.entry(r.group.clone()).or_default();
        if !versions.contains(&r.version) {
            versions.push(r.version.clone());
        }
    }
    out
}

fn group_json(name: &str, versions: &[String]) -> Value {
    let vs: Vec<Value> = versions
        .iter()
        .map(|v| json!({ "groupVersion": format!("{name}/{v}"), "version": v }))
        .collect();
    json!({ "name": name, "versions": vs, "preferredVersion": vs.first().cloned().unwrap_or(Value::Null) })
}

pub fn api_group_list(store: &Store) -> Value {
    let groups: Vec<Value> = groups(store)
        .iter()
        .filter(|(g, _)| !g.is_empty())
        .map(|(g, vs)| group_json(g, vs))
        .collect();
    json!({ "kind": "APIGroupList", "apiVersion": "v1", "groups": groups })
}

pub fn api_group(store: &Store, group: &str) -> Option<Value> {
    let groups = groups(store);
    let vs = groups.get(group).filter(|_| !group.is_empty())?;
    let mut g = group_json(group, vs);
    g["kind"] = json!("APIGroup");
    g["apiVersion"] = json!("v1");
    Some(g)
}

/// `/openapi/v3`: one document per group-version.
pub fn openapi_index(store: &Store) -> Value {
    let mut paths = serde_json::Map::new();
    for (g, vs) in groups(store) {
        for v in vs {
            let p = if g.is_empty() {
                format!("api/{v}")
            } else {
                format!("apis/{g}/{v}")
            };
            paths.insert(
                p.clone(),
                json!({ "serverRelativeURL": format!("/openapi/v3/{p}?hash={}", store.rv()) }),
            );
        }
    }
    json!({ "paths": paths })
}

/// `/openapi/v3/apis/{g}/{v}`: the operations, with the `fieldValidation` parameter on
/// PATCH, which is how kubectl learns that the server validates fields itself.
pub fn openapi_group_version(store: &Store, group: &str, version: &str) -> Option<Value> {
    let rs = served(store, group, version)?;
    let mut paths = serde_json::Map::new();
    let mut schemas = serde_json::Map::new();
    for r in &rs {
        let prefix = if group.is_empty() {
            format!("/api/{version}")
        } else {
            format!("/apis/{group}/{version}")
        };
        let path = if r.namespaced {
            format!("{prefix}/namespaces/{{namespace}}/{}/{{name}}", r.plural)
        } else {
            format!("{prefix}/{}/{{name}}", r.plural)
        };
        let gvk = json!({ "group": group, "version": version, "kind": r.kind });
        let param =
            |name: &str| json!({ "name": name, "in": "query", "schema": { "type": "string" } });
        paths.insert(
            path,
            json!({
                "get": { "x-kubernetes-group-version-kind": gvk, "x-kubernetes-action": "get" },
                "put": { "x-kubernetes-group-version-kind": gvk, "x-kubernetes-action": "put",
                         "parameters": [param("fieldValidation"), param("fieldManager"), param("dryRun")] },
                "patch": { "x-kubernetes-group-version-kind": gvk, "x-kubernetes-action": "patch",
                           "parameters": [param("fieldValidation"), param("fieldManager"), param("force"), param("dryRun")] },
                "delete": { "x-kubernetes-group-version-kind": gvk, "x-kubernetes-action": "delete" },
            }),
        );
        if let Some(schema) = &r.schema {
            let mut s = (**schema).clone();
            s["x-kubernetes-group-version-kind"] = json!([gvk]);
            schemas.insert(format!("{}.{}.{}", group, version, r.kind), s);
        }
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": { "title": "Kubernetes (hypd-sim)", "version": "unversioned" },
        "paths": paths,
        "components": { "schemas": schemas },
    }))
}

/// The served resources of each CRD object, parsed once per resourceVersion: CRD schemas
/// run to megabytes (RayJob's is 1.3 MB of YAML) and every request to a custom resource
/// needs them.
#[derive(Default)]
pub struct CrdCache(std::sync::Mutex<BTreeMap<String, (String, Vec<Resource>)>>);

impl CrdCache {
    fn forget_except(&self, exists: impl Fn(&str) -> bool) {
        if let Ok(mut cache) = self.0.lock() {
            cache.retain(|name, _| exists(name));
        }
    }

    fn resources(&self, crd: &Value) -> Vec<Resource> {
        let name = crd["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let rv = crd["metadata"]["resourceVersion"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let Ok(mut cache) = self.0.lock() else {
            return crd_resources(crd);
        };
        match cache.get(&name) {
            Some((cached_rv, rs)) if *cached_rv == rv => rs.clone(),
            _ => {
                let rs = crd_resources(crd);
                cache.insert(name, (rv, rs.clone()));
                rs
            }
        }
    }
}
