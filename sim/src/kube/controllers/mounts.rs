//! Pods' FSx for Lustre volumes, as the scheduler and kubelet treat them: a pod whose
//! claim is bound to a volume of the `fsx.csi.aws.com` driver starts its containers only
//! once the driver's node plugin runs (the `aws-fsx-csi-driver` add-on's
//! `kube-system/fsx-csi-node` DaemonSet) and the file system its volume names (by
//! `dnsname`, in the cluster's region) is AVAILABLE with that `mountname`; until then it
//! stays ContainerCreating with kubelet's `FailedMount` event. An FSx claim that is not
//! bound keeps the pod from being scheduled. Only volumes of that driver are looked at,
//! so every other pod runs as it did.
//!
//! Every answer is a function of the stored objects and of FSx's state, which the pass
//! read under the AWS lock (mounting asks nothing of AWS).

use serde_json::{Value, json};

use super::super::admission::object;
use crate::fsx::{Lifecycle, Mountable};
use crate::kube::store::{Key, Store, meta};
use crate::kube::time::parse_rfc3339;
use crate::world::fnv1a;

pub const DRIVER: &str = "fsx.csi.aws.com";
const NODE_PLUGIN: (&str, &str) = ("kube-system", "fsx-csi-node");

/// What a pod's FSx volumes allow.
#[derive(Debug, PartialEq)]
pub enum Mounts {
    /// The pod has none.
    None,
    /// All can be mounted since this instant (epoch seconds).
    Ready(f64),
    /// One cannot, in kubelet's words.
    Failed(String),
}

/// The claims of the pod's volumes, by name, that exist.
fn claims<'a>(store: &'a Store, pod: &Value) -> Vec<&'a Value> {
    let ns = meta(pod, "namespace");
    pod["spec"]["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v["persistentVolumeClaim"]["claimName"].as_str())
        .filter_map(|c| store.get(&Key::new("/persistentvolumeclaims", &ns, c)))
        .map(|c| &**c)
        .collect()
}

fn is_fsx_volume(pv: &Value) -> bool {
    pv["spec"]["csi"]["driver"] == DRIVER
}

/// Whether a claim is for FSx: the volume it names is of the driver, or its class is
/// provisioned by it.
fn is_fsx_claim(store: &Store, claim: &Value) -> bool {
    let named = claim["spec"]["volumeName"]
        .as_str()
        .and_then(|v| store.get(&Key::new("/persistentvolumes", "", v)))
        .is_some_and(|pv| is_fsx_volume(pv));
    let provisioned = claim["spec"]["storageClassName"]
        .as_str()
        .and_then(|c| store.get(&Key::new("storage.k8s.io/storageclasses", "", c)))
        .is_some_and(|sc| sc["provisioner"] == DRIVER);
    named || provisioned
}

/// Whether one of the pod's FSx claims is not bound yet.
pub fn unbound_claims(store: &Store, pod: &Value) -> bool {
    claims(store, pod)
        .into_iter()
        .any(|c| c["status"]["phase"] != "Bound" && is_fsx_claim(store, c))
}

/// Marks a pod the scheduler leaves for its unbound claims, in kube-scheduler's words
/// (keeping the condition's time while they stay the same).
pub fn unschedulable(pod: &mut Value, nodes: usize, now: &str) {
    let message = format!(
        "0/{nodes} nodes are available: pod has unbound immediate PersistentVolumeClaims. preemption: 0/{nodes} nodes are available: {nodes} Preemption is not helpful for scheduling."
    );
    let old = pod["status"]["conditions"][0].clone();
    let since = if old["message"] == message.as_str() {
        old["lastTransitionTime"].clone()
    } else {
        json!(now)
    };
    pod["status"] = json!({
        "phase": "Pending",
        "qosClass": "BestEffort",
        "conditions": [{ "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                         "message": message, "lastTransitionTime": since }],
    });
}

/// Whether, and since when, the pod's FSx volumes can all be mounted.
pub fn mounts(store: &Store, pod: &Value, file_systems: &[Mountable]) -> Mounts {
    let volumes: Vec<&Value> = claims(store, pod)
        .into_iter()
        .filter(|c| c["status"]["phase"] == "Bound")
        .filter_map(|c| c["spec"]["volumeName"].as_str())
        .filter_map(|v| store.get(&Key::new("/persistentvolumes", "", v)))
        .map(|pv| &**pv)
        .filter(|pv| is_fsx_volume(pv))
        .collect();
    if volumes.is_empty() {
        return Mounts::None;
    }
    let plugin = store.get(&Key::new("apps/daemonsets", NODE_PLUGIN.0, NODE_PLUGIN.1));
    let mut since = plugin
        .and_then(|ds| ds["metadata"]["creationTimestamp"].as_str())
        .and_then(parse_rfc3339)
        .unwrap_or(f64::NEG_INFINITY);
    for pv in volumes {
        let name = meta(pv, "name");
        if plugin.is_none() {
            return Mounts::Failed(format!(
                "MountVolume.SetUp failed for volume \"{name}\" : kubernetes.io/csi: mounter.SetUpAt failed to get CSI client: driver name {DRIVER} not found in the list of registered CSI drivers"
            ));
        }
        let attributes = &pv["spec"]["csi"]["volumeAttributes"];
        let dns = attributes["dnsname"].as_str().unwrap_or_default();
        let mount = attributes["mountname"].as_str().unwrap_or_default();
        let source = format!("{dns}@tcp:/{mount}");
        let target = format!(
            "/var/lib/kubelet/pods/{}/volumes/kubernetes.io~csi/{name}/mount",
            meta(pod, "uid")
        );
        let failed = |status: u8, output: &str| {
            Mounts::Failed(format!(
                "MountVolume.SetUp failed for volume \"{name}\" : rpc error: code = Internal desc = Could not mount \"{source}\" at \"{target}\": mount failed: exit status {status}\nMounting command: mount\nMounting arguments: -t lustre -o flock {source} {target}\nOutput: {output}"
            ))
        };
        let Some(fs) = file_systems.iter().find(|fs| fs.dns_name == dns) else {
            return failed(
                2,
                &format!(
                    "mount.lustre: Can't parse NID '{source}'\nThis mount.lustre version supports the following NIDs: tcp"
                ),
            );
        };
        if fs.lifecycle != Lifecycle::Available {
            return failed(
                5,
                &format!(
                    "mount.lustre: mount {source} at {target} failed: Input/output error\nIs the MGS running?"
                ),
            );
        }
        if fs.mount_name != mount {
            return failed(
                2,
                &format!(
                    "mount.lustre: mount {source} at {target} failed: No such file or directory\nIs the MGS specification correct?\nIs the filesystem name correct?"
                ),
            );
        }
        since = since.max(fs.available_at);
    }
    Mounts::Ready(since)
}

/// kubelet's `FailedMount` Warning on the pod: one event per pod, written again only
/// when its message changes (kubelet would retry and count; a quiet cluster must not
/// write).
pub fn failed_mount(store: &mut Store, pod: &Value, message: &str, now: &str) {
    let ns = meta(pod, "namespace");
    let pod_name = meta(pod, "name");
    let uid = meta(pod, "uid");
    let name = format!("{pod_name}.{:016x}", fnv1a(&format!("{uid}/FailedMount")));
    let key = Key::new("/events", &ns, &name);
    let event = match store.get(&key) {
        Some(old) if old["message"] == message => return,
        Some(old) => {
            let mut e = (**old).clone();
            e["message"] = json!(message);
            e["lastTimestamp"] = json!(now);
            e["count"] = json!(old["count"].as_u64().unwrap_or(1) + 1);
            e
        }
        None => {
            let node = pod["spec"]["nodeName"].clone();
            let mut e = object(store, "v1", "Event", &ns, &name, now);
            e["involvedObject"] = json!({ "apiVersion": "v1", "kind": "Pod", "namespace": ns,
                                          "name": pod_name, "uid": uid });
            e["reason"] = json!("FailedMount");
            e["message"] = json!(message);
            e["type"] = json!("Warning");
            e["source"] = json!({ "component": "kubelet", "host": node });
            e["reportingComponent"] = json!("kubelet");
            e["reportingInstance"] = node;
            e["firstTimestamp"] = json!(now);
            e["lastTimestamp"] = json!(now);
            e["count"] = json!(1);
            e
        }
    };
    store.put(key, event);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kube::admission::bootstrap;
    use crate::kube::controllers::pods::{START_SECS, pods};
    use crate::kube::time::rfc3339;

    const DNS: &str = "fs-0123456789abcdef0.fsx.us-east-1.amazonaws.com";

    fn fs(lifecycle: Lifecycle, available_at: f64) -> Mountable {
        Mountable {
            dns_name: DNS.into(),
            mount_name: "abcd1234".into(),
            lifecycle,
            available_at,
        }
    }

    /// A node, a pod on claim `data`, and the claim (bound or not) to an FSx volume.
    fn world(bound: bool) -> Store {
        let mut store = Store::new();
        bootstrap(&mut store, "2026-01-01T00:00:00Z");
        store.put(
            Key::new("/nodes", "", "n1"),
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "labels": {}},
                "spec": {}, "status": {"allocatable": {"cpu": "8"}, "conditions": [{"type": "Ready", "status": "True"}]}}),
        );
        store.put(
            Key::new("/persistentvolumes", "", "fsx-pv"),
            json!({"metadata": {"name": "fsx-pv"}, "spec": {"csi": {"driver": DRIVER, "volumeHandle": "fs-0123456789abcdef0",
                "volumeAttributes": {"dnsname": DNS, "mountname": "abcd1234"}}}}),
        );
        store.put(
            Key::new("/persistentvolumeclaims", "default", "data"),
            json!({"metadata": {"name": "data", "namespace": "default"}, "spec": {"volumeName": "fsx-pv"},
                "status": {"phase": if bound { "Bound" } else { "Pending" }}}),
        );
        store.put(
            Key::new("/pods", "default", "p"),
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "default", "uid": "u1"},
                "spec": {"containers": [{"name": "main"}],
                         "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": "data"}}]}}),
        );
        store
    }

    fn plugin(store: &mut Store, created: &str) {
        store.put(
            Key::new("apps/daemonsets", "kube-system", "fsx-csi-node"),
            json!({"metadata": {"name": "fsx-csi-node", "namespace": "kube-system", "creationTimestamp": created}}),
        );
    }

    fn pod(store: &Store) -> Value {
        (**store.get(&Key::new("/pods", "default", "p")).unwrap()).clone()
    }

    fn events(store: &Store) -> Vec<Value> {
        store
            .list("/events", Some("default"))
            .map(|e| (**e).clone())
            .collect()
    }

    #[test]
    fn an_unbound_fsx_claim_keeps_the_pod_unscheduled() {
        let mut store = world(false);
        let t0 = parse_rfc3339("2026-01-01T00:00:00Z").unwrap();
        pods(&mut store, &[], t0, &rfc3339(t0));
        let p = pod(&store);
        assert!(p["spec"]["nodeName"].is_null());
        let message = p["status"]["conditions"][0]["message"].as_str().unwrap();
        assert!(
            message.contains("pod has unbound immediate PersistentVolumeClaims"),
            "{message}"
        );
    }

    #[test]
    fn without_the_csi_node_plugin_the_mount_fails_as_kubelet_says() {
        let mut store = world(true);
        let t0 = parse_rfc3339("2026-01-01T00:00:00Z").unwrap();
        let available = [fs(Lifecycle::Available, t0 - 100.0)];
        pods(&mut store, &available, t0 + 60.0, &rfc3339(t0 + 60.0));
        let p = pod(&store);
        assert_eq!(p["spec"]["nodeName"], "n1");
        assert_eq!(p["status"]["phase"], "Pending");
        assert_eq!(
            p["status"]["containerStatuses"][0]["state"]["waiting"]["reason"],
            "ContainerCreating"
        );
        let e = events(&store);
        assert_eq!(e.len(), 1);
        assert_eq!(e[0]["reason"], "FailedMount");
        assert_eq!(e[0]["type"], "Warning");
        assert_eq!(e[0]["involvedObject"]["name"], "p");
        assert!(e[0]["message"].as_str().unwrap().contains(
            "driver name fsx.csi.aws.com not found in the list of registered CSI drivers"
        ));
        let rv = store.rv();
        pods(&mut store, &available, t0 + 90.0, &rfc3339(t0 + 90.0));
        assert_eq!(store.rv(), rv, "the same failure writes nothing");
    }

    #[test]
    fn the_pod_starts_once_its_file_system_is_available_with_that_mount_name() {
        let mut store = world(true);
        let t0 = parse_rfc3339("2026-01-01T00:00:00Z").unwrap();
        plugin(&mut store, "2026-01-01T00:00:00Z");
        let creating = [fs(Lifecycle::Creating, t0 + 600.0)];
        pods(&mut store, &creating, t0, &rfc3339(t0));
        assert_eq!(pod(&store)["status"]["phase"], "Pending");
        let message = events(&store)[0]["message"].as_str().unwrap().to_owned();
        assert!(
            message.starts_with("MountVolume.SetUp failed for volume \"fsx-pv\" : rpc error: code = Internal desc = Could not mount \"fs-0123456789abcdef0.fsx.us-east-1.amazonaws.com@tcp:/abcd1234\" at \"/var/lib/kubelet/pods/u1/volumes/kubernetes.io~csi/fsx-pv/mount\": mount failed:"),
            "{message}"
        );
        // Available, but not under the mount name the volume names.
        let mut renamed = fs(Lifecycle::Available, t0 + 600.0);
        renamed.mount_name = "zzzz9999".into();
        pods(&mut store, &[renamed], t0 + 600.0, &rfc3339(t0 + 600.0));
        assert_eq!(pod(&store)["status"]["phase"], "Pending");
        assert!(
            events(&store)[0]["message"]
                .as_str()
                .unwrap()
                .contains("Is the filesystem name correct?")
        );
        // Unknown DNS name: a file system elsewhere (or none).
        assert!(matches!(
            mounts(&store, &pod(&store), &[]),
            Mounts::Failed(m) if m.contains("Can't parse NID")
        ));
        let available = [fs(Lifecycle::Available, t0 + 600.0)];
        assert_eq!(
            mounts(&store, &pod(&store), &available),
            Mounts::Ready(t0 + 600.0)
        );
        pods(&mut store, &available, t0 + 600.0, &rfc3339(t0 + 600.0));
        assert_eq!(pod(&store)["status"]["phase"], "Pending", "starting");
        let at = t0 + 600.0 + START_SECS;
        pods(&mut store, &available, at, &rfc3339(at));
        assert_eq!(pod(&store)["status"]["phase"], "Running");
    }

    #[test]
    fn pods_without_fsx_volumes_are_not_looked_at() {
        let mut store = world(true);
        // An S3 (Mountpoint) volume behind the claim instead.
        store.put(
            Key::new("/persistentvolumes", "", "fsx-pv"),
            json!({"metadata": {"name": "fsx-pv"}, "spec": {"csi": {"driver": "s3.csi.aws.com",
                "volumeAttributes": {"bucketName": "b"}}}}),
        );
        assert_eq!(mounts(&store, &pod(&store), &[]), Mounts::None);
        let mut unbound = world(false);
        unbound.put(
            Key::new("/persistentvolumes", "", "fsx-pv"),
            json!({"metadata": {"name": "fsx-pv"}, "spec": {"csi": {"driver": "s3.csi.aws.com"}}}),
        );
        assert!(!unbound_claims(&unbound, &pod(&unbound)));
    }
}
