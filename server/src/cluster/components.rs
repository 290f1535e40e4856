//! The HyperPod node components (health-monitoring agent, NVIDIA and EFA device plugins)
//! as Kubernetes objects generated from the one table in `dependencies`, applied with
//! server-side apply as hypd's field manager, and their state read back from the
//! DaemonSets' status. Why SSA and not a Helm chart: docs/ARCHITECTURE.md, "Cluster
//! dependencies".

use std::collections::BTreeMap;

use app::api::ApiError;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Namespace, Node, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::Api;
use kube::api::ListParams;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::dependencies::{ComponentRole, HYPERPOD_NAMESPACE, NODE_COMPONENTS, NodeComponent};
use crate::resources::converge;
use crate::resources::kube::object::Applied;
use crate::resources::kube::{self as kubernetes};
use crate::resources::tags::K8S_MANAGED_BY as MANAGED_BY;

/// The label every HyperPod node carries; the components run on these nodes only.
pub const HYPERPOD_NODE_LABEL: (&str, &str) = ("sagemaker.amazonaws.com/compute-type", "hyperpod");

/// Everything one cluster's components need, in the order they must be applied.
#[derive(Debug)]
pub struct Manifests {
    pub namespaces: Vec<Namespace>,
    pub service_accounts: Vec<ServiceAccount>,
    pub cluster_roles: Vec<ClusterRole>,
    pub cluster_role_bindings: Vec<ClusterRoleBinding>,
    pub daemon_sets: Vec<DaemonSet>,
}

fn typed<T: DeserializeOwned>(v: Value) -> T {
    // The JSON below is written to the Kubernetes schema; a mismatch is a bug in this
    // file, caught by its unit test.
    serde_json::from_value(v).expect("a component manifest matches its Kubernetes type")
}

fn labels(c: &NodeComponent) -> Value {
    json!({
        "app.kubernetes.io/name": c.name,
        "app.kubernetes.io/version": c.version,
        "app.kubernetes.io/part-of": "hyperpod-node-components",
        MANAGED_BY.0: MANAGED_BY.1,
    })
}

/// The objects for `region` (image registries differ by region), or why the region
/// cannot have them.
pub fn manifests(region: &str) -> Result<Manifests, String> {
    let mut m = Manifests {
        namespaces: vec![typed(json!({
            "apiVersion": "v1", "kind": "Namespace",
            "metadata": { "name": HYPERPOD_NAMESPACE, "labels": { MANAGED_BY.0: MANAGED_BY.1 } },
        }))],
        service_accounts: Vec::new(),
        cluster_roles: Vec::new(),
        cluster_role_bindings: Vec::new(),
        daemon_sets: Vec::new(),
    };
    for c in NODE_COMPONENTS {
        let image = c.image(region)?;
        let (service_account, container, volumes) = match c.role {
            ComponentRole::HealthAgent => {
                let rbac_name = format!("hypd:{}", c.name);
                m.service_accounts.push(typed(json!({
                    "apiVersion": "v1", "kind": "ServiceAccount",
                    "metadata": { "name": c.name, "namespace": c.namespace, "labels": labels(c) },
                })));
                // It marks a faulty node Unschedulable through the Node's labels and
                // taints, which is what triggers HyperPod's automatic recovery.
                m.cluster_roles.push(typed(json!({
                    "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                    "metadata": { "name": rbac_name, "labels": labels(c) },
                    "rules": [
                        { "apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch", "patch", "update"] },
                        { "apiGroups": [""], "resources": ["nodes/status"], "verbs": ["get", "patch", "update"] },
                        { "apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"] },
                    ],
                })));
                m.cluster_role_bindings.push(typed(json!({
                    "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                    "metadata": { "name": rbac_name, "labels": labels(c) },
                    "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": rbac_name },
                    "subjects": [{ "kind": "ServiceAccount", "name": c.name, "namespace": c.namespace }],
                })));
                (
                    Some(c.name),
                    json!({
                        "name": c.name, "image": image,
                        "env": [{ "name": "NODE_NAME", "valueFrom": { "fieldRef": { "fieldPath": "spec.nodeName" } } }],
                        "securityContext": { "privileged": true, "runAsUser": 0 },
                        "resources": { "requests": { "cpu": "500m", "memory": "512Mi" }, "limits": { "memory": "1Gi" } },
                        "volumeMounts": [
                            { "name": "log", "mountPath": "/var/log", "readOnly": true },
                            { "name": "kmsg", "mountPath": "/dev/kmsg", "readOnly": true },
                        ],
                    }),
                    json!([
                        { "name": "log", "hostPath": { "path": "/var/log" } },
                        { "name": "kmsg", "hostPath": { "path": "/dev/kmsg" } },
                    ]),
                )
            }
            ComponentRole::DevicePlugin => (
                None,
                json!({
                    "name": c.name, "image": image,
                    "securityContext": { "allowPrivilegeEscalation": false, "capabilities": { "drop": ["ALL"] } },
                    "resources": { "requests": { "cpu": "10m", "memory": "20Mi" } },
                    "volumeMounts": [{ "name": "device-plugin", "mountPath": "/var/lib/kubelet/device-plugins" }],
                }),
                json!([{ "name": "device-plugin", "hostPath": { "path": "/var/lib/kubelet/device-plugins" } }]),
            ),
        };
        let mut pod = json!({
            "nodeSelector": { HYPERPOD_NODE_LABEL.0: HYPERPOD_NODE_LABEL.1 },
            // Device plugins and the health agent must run on nodes the agent has just
            // tainted as unhealthy, or recovery could not see them.
            "tolerations": [{ "operator": "Exists" }],
            "priorityClassName": "system-node-critical",
            "containers": [container],
            "volumes": volumes,
        });
        if let Some(sa) = service_account {
            pod["serviceAccountName"] = json!(sa);
        }
        m.daemon_sets.push(typed(json!({
            "apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": { "name": c.name, "namespace": c.namespace, "labels": labels(c) },
            "spec": {
                "selector": { "matchLabels": { "app.kubernetes.io/name": c.name } },
                "updateStrategy": { "type": "RollingUpdate", "rollingUpdate": { "maxUnavailable": "10%" } },
                "template": { "metadata": { "labels": labels(c) }, "spec": pod },
            },
        })));
    }
    Ok(m)
}

/// Applies every component object that differs from what the cluster has; a second run
/// with nothing changed makes no call but reads. Returns component name → version.
pub async fn apply(
    client: &kube::Client,
    region: &str,
) -> Result<BTreeMap<String, String>, ApiError> {
    let m = manifests(region).map_err(|e| ApiError::field("region", e))?;
    for ns in m.namespaces {
        converge(&Applied::cluster(client, ns)).await?;
    }
    for sa in m.service_accounts {
        converge(&Applied::namespaced(client, sa)).await?;
    }
    for role in m.cluster_roles {
        converge(&Applied::cluster(client, role)).await?;
    }
    for binding in m.cluster_role_bindings {
        converge(&Applied::cluster(client, binding)).await?;
    }
    for ds in m.daemon_sets {
        converge(&Applied::namespaced(client, ds)).await?;
    }
    Ok(NODE_COMPONENTS
        .iter()
        .map(|c| (c.name.to_owned(), c.version.to_owned()))
        .collect())
}

/// One component as the cluster runs it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ComponentState {
    pub name: String,
    pub namespace: String,
    /// The version the DaemonSet runs (its label), `None` when it is missing.
    pub version: Option<String>,
    /// Nodes it should run on, and pods ready there.
    pub desired: i32,
    pub ready: i32,
}

impl ComponentState {
    /// Installed, on at least one node, and ready everywhere it should run.
    pub fn is_ready(&self) -> bool {
        self.version.is_some() && self.desired > 0 && self.ready >= self.desired
    }

    /// One word for a console badge.
    pub fn state(&self) -> &'static str {
        match (&self.version, self.desired) {
            (None, _) => "missing",
            (Some(_), 0) => "no-nodes",
            _ if self.ready >= self.desired => "ready",
            _ => "progressing",
        }
    }

    pub fn describe(&self) -> String {
        match &self.version {
            None => format!("{} is not installed", self.name),
            Some(v) => format!("{} {v}: {}/{} ready", self.name, self.ready, self.desired),
        }
    }
}

/// The state of every component in the table.
pub async fn states(client: &kube::Client) -> Result<Vec<ComponentState>, ApiError> {
    let mut out = Vec::new();
    for c in NODE_COMPONENTS {
        let api = Api::<DaemonSet>::namespaced(client.clone(), c.namespace);
        let ds = kubernetes::get(&api, c.name).await?;
        let status = ds.as_ref().and_then(|d| d.status.clone());
        out.push(ComponentState {
            name: c.name.to_owned(),
            namespace: c.namespace.to_owned(),
            version: ds.as_ref().and_then(|d| {
                d.metadata
                    .labels
                    .as_ref()?
                    .get("app.kubernetes.io/version")
                    .cloned()
            }),
            desired: status.as_ref().map_or(0, |s| s.desired_number_scheduled),
            ready: status.as_ref().map_or(0, |s| s.number_ready),
        });
    }
    Ok(out)
}

/// The label HyperPod puts on each node naming its instance group.
pub const GROUP_LABEL: &str = "sagemaker.amazonaws.com/instance-group-name";

/// Per instance group of HyperPod cluster `hyperpod_cluster`: its nodes that are Ready
/// in Kubernetes, and how many have registered in all.
pub async fn hyperpod_nodes(
    client: &kube::Client,
    hyperpod_cluster: &str,
) -> Result<BTreeMap<String, (usize, usize)>, ApiError> {
    let selector = format!(
        "{}={},sagemaker.amazonaws.com/cluster-name={hyperpod_cluster}",
        HYPERPOD_NODE_LABEL.0, HYPERPOD_NODE_LABEL.1
    );
    let mut groups: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    kubernetes::each_listed(
        &Api::<Node>::all(client.clone()),
        ListParams::default().labels(&selector),
        |n| {
            let group = n
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(GROUP_LABEL))
                .cloned()
                .unwrap_or_default();
            let ready = n
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
            let entry = groups.entry(group).or_default();
            entry.0 += usize::from(ready);
            entry.1 += 1;
        },
    )
    .await?;
    Ok(groups)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_component_becomes_a_daemon_set_on_hyperpod_nodes() {
        let m = manifests("us-west-2").unwrap();
        assert_eq!(m.daemon_sets.len(), NODE_COMPONENTS.len());
        for (ds, c) in m.daemon_sets.iter().zip(NODE_COMPONENTS) {
            assert_eq!(ds.metadata.name.as_deref(), Some(c.name));
            let pod = ds.spec.template.spec.as_ref().unwrap();
            assert_eq!(
                pod.node_selector.as_ref().unwrap()[HYPERPOD_NODE_LABEL.0],
                HYPERPOD_NODE_LABEL.1
            );
            assert!(
                pod.containers[0]
                    .image
                    .as_ref()
                    .unwrap()
                    .ends_with(c.version)
            );
        }
        // The health agent's account exists: its binding names its service account.
        let binding = &m.cluster_role_bindings[0];
        assert_eq!(
            binding.subjects.as_ref().unwrap()[0].name,
            m.service_accounts[0].metadata.name.clone().unwrap()
        );
        assert!(manifests("af-south-1").is_err());
    }
}
