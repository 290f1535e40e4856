//! EKS add-ons' workloads: each ACTIVE add-on gets the Deployments and DaemonSets (and the
//! namespace) it runs on a real cluster, labelled with the add-on so they go when it
//! goes; the training operator also installs the HyperPodPyTorchJob CRD, the inference
//! operator the InferenceEndpointConfig and JumpStartModel CRDs (AWS's own, from the
//! operator's chart), and with `keda.enabled` in its configuration KEDA's workloads and
//! CRDs (its chart depends on KEDA's). Workloads are
//! created once and then left to their own controllers, as EKS leaves them. HyperPod's
//! own managed daemon (tiered checkpointing's memory manager) is installed the same way,
//! from the HyperPod cluster's settings instead of an add-on.

use std::collections::BTreeSet;

use serde_json::{Value, json};

use crate::kube::admission::{crd_status, namespace, object};
use crate::kube::discovery::CRD_GR;
use crate::kube::store::{Key, Store};
use crate::sagemaker::Features;

pub const PYTORCHJOB_CRD: &str =
    include_str!("../../../crds/sagemaker.amazonaws.com_hyperpodpytorchjobs.yaml");
pub const TRAINING_OPERATOR: &str = "amazon-sagemaker-hyperpod-training-operator";
pub const INFERENCE_OPERATOR: &str = "amazon-sagemaker-hyperpod-inference";
const INFERENCE_ENDPOINT_CONFIG_CRD: &str =
    include_str!("../../../crds/inference.sagemaker.aws.amazon.com_inferenceendpointconfigs.yaml");
const JUMPSTART_MODEL_CRD: &str =
    include_str!("../../../crds/inference.sagemaker.aws.amazon.com_jumpstartmodels.yaml");

/// The CRDs an EKS add-on installs, by name, with their YAML.
fn addon_crds(addon: &str) -> &'static [(&'static str, &'static str)] {
    match addon {
        TRAINING_OPERATOR => &[(
            "hyperpodpytorchjobs.sagemaker.amazonaws.com",
            PYTORCHJOB_CRD,
        )],
        INFERENCE_OPERATOR => &[
            (
                "inferenceendpointconfigs.inference.sagemaker.aws.amazon.com",
                INFERENCE_ENDPOINT_CONFIG_CRD,
            ),
            (
                "jumpstartmodels.inference.sagemaker.aws.amazon.com",
                JUMPSTART_MODEL_CRD,
            ),
        ],
        _ => &[],
    }
}

/// What the inference operator's chart adds with `keda.enabled`: the KEDA chart it
/// depends on (2.17.1), under that chart's names, in the add-on's namespace (a Helm
/// subchart installs into its parent's release namespace), with KEDA's CRDs.
const KEDA_WORKLOADS: &[(&str, &str, &str, u32)] = &[
    (
        "hyperpod-inference-system",
        "Deployment",
        "keda-operator",
        1,
    ),
    (
        "hyperpod-inference-system",
        "Deployment",
        "keda-operator-metrics-apiserver",
        1,
    ),
    (
        "hyperpod-inference-system",
        "Deployment",
        "keda-admission-webhooks",
        1,
    ),
];
const KEDA_CRDS: &[(&str, &str)] = &[
    (
        "scaledobjects.keda.sh",
        include_str!("../../../crds/keda.sh_scaledobjects.yaml"),
    ),
    (
        "triggerauthentications.keda.sh",
        include_str!("../../../crds/keda.sh_triggerauthentications.yaml"),
    ),
    (
        "clustertriggerauthentications.keda.sh",
        include_str!("../../../crds/keda.sh_clustertriggerauthentications.yaml"),
    ),
];

/// Whether add-on `addon` with `config` brings KEDA.
fn with_keda(addon: &str, config: Option<&Value>) -> bool {
    addon == INFERENCE_OPERATOR && config.is_some_and(|c| c["keda"]["enabled"] == true)
}

/// The workloads an EKS add-on runs: namespace, kind, name, replicas (DaemonSets: 0).
fn addon_workloads(addon: &str) -> &'static [(&'static str, &'static str, &'static str, u32)] {
    match addon {
        "coredns" => &[("kube-system", "Deployment", "coredns", 2)],
        "kube-proxy" => &[("kube-system", "DaemonSet", "kube-proxy", 0)],
        "vpc-cni" => &[("kube-system", "DaemonSet", "aws-node", 0)],
        "eks-pod-identity-agent" => &[("kube-system", "DaemonSet", "eks-pod-identity-agent", 0)],
        "metrics-server" => &[("kube-system", "Deployment", "metrics-server", 2)],
        "aws-mountpoint-s3-csi-driver" => &[
            ("kube-system", "DaemonSet", "s3-csi-node", 0),
            ("kube-system", "Deployment", "s3-csi-controller", 1),
        ],
        "aws-fsx-csi-driver" => &[
            ("kube-system", "DaemonSet", "fsx-csi-node", 0),
            ("kube-system", "Deployment", "fsx-csi-controller", 2),
        ],
        "cert-manager" => &[
            ("cert-manager", "Deployment", "cert-manager", 1),
            ("cert-manager", "Deployment", "cert-manager-cainjector", 1),
            ("cert-manager", "Deployment", "cert-manager-webhook", 1),
        ],
        "amazon-cloudwatch-observability" => &[
            ("amazon-cloudwatch", "DaemonSet", "cloudwatch-agent", 0),
            (
                "amazon-cloudwatch",
                "Deployment",
                "amazon-cloudwatch-observability-controller-manager",
                1,
            ),
        ],
        TRAINING_OPERATOR => &[(
            "aws-hyperpod",
            "Deployment",
            "hp-training-operator-hp-training-controller-manager",
            1,
        )],
        // The name the add-on's execution role trusts (its IRSA service account's).
        INFERENCE_OPERATOR => &[(
            "hyperpod-inference-system",
            "Deployment",
            "hyperpod-inference-controller-manager",
            1,
        )],
        "amazon-sagemaker-hyperpod-taskgovernance" => {
            &[("kueue-system", "Deployment", "kueue-controller-manager", 1)]
        }
        _ => &[],
    }
}

const ADDON_LABEL: &str = "eks.amazonaws.com/addon";

/// The workloads of the `active` add-ons (each with its configuration) and of the
/// HyperPod `features` on this cluster.
pub(super) fn addons(
    store: &mut Store,
    active: &[(String, Option<Value>)],
    features: &[Features],
    now: &str,
) {
    tiered_checkpointing(store, features, now);
    let keda: BTreeSet<String> = active
        .iter()
        .filter(|(a, config)| with_keda(a, config.as_ref()))
        .map(|(a, _)| a.clone())
        .collect();
    let active: Vec<String> = active.iter().map(|(a, _)| a.clone()).collect();
    let mut wanted = BTreeSet::new();
    for addon in &active {
        let brings_keda = keda.contains(addon);
        let extra_workloads = if brings_keda { KEDA_WORKLOADS } else { &[] };
        let extra_crds = if brings_keda { KEDA_CRDS } else { &[] };
        for (ns, kind, name, replicas) in addon_workloads(addon).iter().chain(extra_workloads) {
            let (gr, api) = if *kind == "Deployment" {
                ("apps/deployments", "apps/v1")
            } else {
                ("apps/daemonsets", "apps/v1")
            };
            wanted.insert(Key::new(gr, ns, name));
            let ns_key = Key::new("/namespaces", "", ns);
            if store.get(&ns_key).is_none() {
                let o = namespace(store, ns, now);
                store.put(ns_key, o);
            }
            let key = Key::new(gr, ns, name);
            if store.get(&key).is_some() {
                continue;
            }
            let mut o = object(store, api, kind, ns, name, now);
            let labels = json!({ "app.kubernetes.io/name": name, "app.kubernetes.io/managed-by": "EKS", ADDON_LABEL: addon });
            o["metadata"]["labels"] = labels.clone();
            let mut template_spec = json!({ "containers": [{ "name": name, "image": format!("602401143452.dkr.ecr.us-east-1.amazonaws.com/eks/{name}:latest"),
                "resources": { "requests": { "cpu": "100m", "memory": "128Mi" } } }] });
            if *kind == "DaemonSet" {
                template_spec["tolerations"] = json!([{ "operator": "Exists" }]);
            }
            o["spec"] = json!({
                "selector": { "matchLabels": { "app.kubernetes.io/name": name } },
                "template": { "metadata": { "labels": labels }, "spec": template_spec },
            });
            if *kind == "Deployment" {
                o["spec"]["replicas"] = json!(replicas);
            }
            store.put(key, o);
        }
        for (name, yaml) in addon_crds(addon).iter().chain(extra_crds) {
            let key = Key::new(CRD_GR, "", name);
            if store.get(&key).is_none()
                && let Ok(mut crd) = serde_yaml::from_str::<Value>(yaml)
            {
                crd["metadata"]["uid"] = json!(store.uid());
                crd["metadata"]["creationTimestamp"] = json!(now);
                crd["metadata"]["labels"][ADDON_LABEL] = json!(addon);
                crd["status"] = crd_status(&crd, now);
                store.put(key, crd);
            }
        }
    }
    // EKS removes what an add-on installed when the add-on is deleted (without
    // `preserve`): its workloads and its CRDs.
    let stale: Vec<Key> = store
        .keys()
        .filter(|k| {
            let Some(addon) = store.get(k).and_then(|o| {
                o["metadata"]["labels"][ADDON_LABEL]
                    .as_str()
                    .map(str::to_owned)
            }) else {
                return false;
            };
            match k.gr.as_str() {
                "apps/deployments" | "apps/daemonsets" => !wanted.contains(k),
                gr if gr == CRD_GR => {
                    !active.contains(&addon)
                        || (KEDA_CRDS.iter().any(|(n, _)| *n == k.name) && !keda.contains(&addon))
                }
                _ => false,
            }
        })
        .cloned()
        .collect();
    for k in stale {
        store.remove(&k);
    }
}

/// The DaemonSet of HyperPod's memory-management daemon for managed tiered checkpointing.
/// AWS documents the daemon but not its Kubernetes names; this name is the sim's own.
pub const TIERED_CHECKPOINTING: &str = "hyperpod-tiered-checkpointing";

/// Marks what HyperPod itself installed (the sim's own label), so that only that is
/// removed when a feature is turned off.
pub(super) const HYPERPOD_LABEL: (&str, &str) =
    ("app.kubernetes.io/managed-by", "SageMakerHyperPod");

/// While a HyperPod cluster on this EKS cluster runs `TieredStorageConfig` Mode Enable,
/// the memory-management daemon runs in kube-system on that cluster's HyperPod nodes,
/// told its share of each instance's memory; with Disable it is removed (its pods go
/// with it through garbage collection), as the API reference says of both modes.
fn tiered_checkpointing(store: &mut Store, features: &[Features], now: &str) {
    let wanted = features
        .iter()
        .find_map(|f| Some((f.cluster.clone(), f.tiered_storage.clone()?)));
    let key = Key::new("apps/daemonsets", "kube-system", TIERED_CHECKPOINTING);
    let installed = store
        .get(&key)
        .is_some_and(|o| o["metadata"]["labels"][HYPERPOD_LABEL.0] == HYPERPOD_LABEL.1);
    let Some((hyperpod, config)) = wanted else {
        if installed {
            store.remove(&key);
        }
        return;
    };
    let name = TIERED_CHECKPOINTING;
    let labels = json!({ "app.kubernetes.io/name": name, HYPERPOD_LABEL.0: HYPERPOD_LABEL.1,
                         "sagemaker.amazonaws.com/cluster-name": hyperpod });
    let mut container = json!({ "name": name,
        "image": format!("602401143452.dkr.ecr.us-east-1.amazonaws.com/sagemaker/{name}:latest"),
        "resources": { "requests": { "cpu": "100m", "memory": "128Mi" } } });
    if let Some(p) = config["InstanceMemoryAllocationPercentage"].as_i64() {
        container["env"] =
            json!([{ "name": "INSTANCE_MEMORY_ALLOCATION_PERCENTAGE", "value": p.to_string() }]);
    }
    let spec = json!({
        "selector": { "matchLabels": { "app.kubernetes.io/name": name } },
        "template": { "metadata": { "labels": labels }, "spec": {
            "nodeSelector": { "sagemaker.amazonaws.com/compute-type": "hyperpod",
                              "sagemaker.amazonaws.com/cluster-name": hyperpod },
            "tolerations": [{ "operator": "Exists" }],
            "containers": [container],
        } },
    });
    let o = match store.get(&key) {
        // A user's DaemonSet of that name is left alone, as EKS leaves conflicting objects.
        Some(_) if !installed => return,
        Some(old) if old["spec"] == spec => return,
        Some(old) => {
            // A new share of memory: the template changes, as a rollout would start.
            let mut o = (**old).clone();
            let generation = o["metadata"]["generation"].as_i64().unwrap_or(1);
            o["metadata"]["generation"] = json!(generation + 1);
            o["spec"] = spec;
            o
        }
        None => {
            let ns_key = Key::new("/namespaces", "", "kube-system");
            if store.get(&ns_key).is_none() {
                let o = namespace(store, "kube-system", now);
                store.put(ns_key, o);
            }
            let mut o = object(store, "apps/v1", "DaemonSet", "kube-system", name, now);
            o["metadata"]["labels"] = labels;
            o["spec"] = spec;
            o
        }
    };
    store.put(key, o);
}
