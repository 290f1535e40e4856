//! The HyperPodPyTorchJob a `submit_training_job` request becomes. Pure: the same
//! request and target give the same object, so the dry run shows exactly what the step
//! applies. Every pod asks for all of its node's GPUs and EFA interfaces (one pod per
//! node), runs on the group's nodes, mounts the shared bucket at `/s3` and a memory-backed
//! `/dev/shm`, and starts through `hyperpodrun`, the launcher the operator's elastic agent
//! provides (installed at start when the image lacks it).

use app::api::ApiError;
use app::api::storage::{SHARED_CLAIM, SHARED_MOUNT};
use app::api::training::{NAMESPACE, Recipe, SubmitTrainingJob};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::{Value, json};

use super::{GROUP_ANNOTATION, JOB_LABEL, NODE_GROUP_LABEL, OPERATION_ANNOTATION, RECIPE_LABEL};
use crate::resources::kube::training::HyperPodPyTorchJob;
use crate::resources::tags::K8S_MANAGED_BY;

/// Where a job runs and what each of its nodes has.
#[derive(Clone, Debug, PartialEq)]
pub struct Target {
    pub group: String,
    /// The HyperPod name, e.g. `ml.p5.48xlarge`.
    pub instance_type: String,
    pub gpus: u32,
    pub efa: u32,
}

/// AWS's PyTorch training image (Deep Learning Containers), pinned; its registry is the
/// cluster's region's.
pub fn default_image(region: &str) -> String {
    format!(
        "763104351884.dkr.ecr.{region}.amazonaws.com/pytorch-training:2.7.1-gpu-py312-cu128-ubuntu22.04-ec2"
    )
}

/// LLaMA-Factory, pinned, installed on the PyTorch image at start.
pub const LLAMA_FACTORY: &str = "llamafactory==0.9.3";
/// The agent the operator talks to (port 8080), which brings `hyperpodrun`.
pub const ELASTIC_AGENT: &str = "hyperpod-elastic-agent";
/// The port the elastic agent listens on, which the operator expects.
pub const AGENT_PORT: i32 = 8080;

/// What the container runs: `hyperpodrun` over the recipe's entry point, with the
/// recipe's arguments as `$@` (never spliced into the script: a path or an argument is
/// never read as shell).
fn script(recipe: &Recipe) -> String {
    let mut s = String::from("set -euo pipefail\n");
    s.push_str(&format!(
        "command -v hyperpodrun >/dev/null 2>&1 || pip install --quiet --no-cache-dir --disable-pip-version-check {ELASTIC_AGENT}\n"
    ));
    if let Recipe::LlamaFactory { .. } = recipe {
        s.push_str(&format!(
            "pip install --quiet --no-cache-dir --disable-pip-version-check '{LLAMA_FACTORY}'\n"
        ));
        // LLaMA-Factory's own multi-node entry point, which reads the config it is given.
        s.push_str(
            "set -- \"$(python -c 'import llamafactory.launcher as m; print(m.__file__)')\" \"$@\"\n",
        );
    }
    s.push_str(&format!(
        "exec hyperpodrun --nnodes=\"$HYPD_NODES\" --nproc-per-node=\"$HYPD_PROCESSES_PER_NODE\" --server-host=0.0.0.0 --server-port={AGENT_PORT} --tee=3 --log_dir=/tmp/hyperpod \"$@\"\n"
    ));
    s
}

/// The recipe's arguments after the script: the entry file first.
fn args(recipe: &Recipe) -> Vec<String> {
    match recipe {
        Recipe::Pytorch { script, args } => std::iter::once(script.to_string())
            .chain(args.iter().cloned())
            .collect(),
        Recipe::LlamaFactory { config } => vec![config.to_string()],
    }
}

/// The EFA and NCCL environment: libfabric's EFA provider with GPUDirect RDMA when the
/// node has EFA, NCCL over TCP otherwise.
fn network_env(efa: u32) -> Vec<Value> {
    let mut env = vec![
        json!({"name": "NCCL_DEBUG", "value": "WARN"}),
        json!({"name": "NCCL_SOCKET_IFNAME", "value": "^lo,docker"}),
    ];
    if efa > 0 {
        env.extend([
            json!({"name": "FI_PROVIDER", "value": "efa"}),
            json!({"name": "FI_EFA_USE_DEVICE_RDMA", "value": "1"}),
            json!({"name": "FI_EFA_FORK_SAFE", "value": "1"}),
            json!({"name": "NCCL_PROTO", "value": "simple"}),
        ]);
    }
    env
}

/// The job object for request `r` on `target`, made by operation `operation`.
pub fn object(
    r: &SubmitTrainingJob,
    target: &Target,
    region: &str,
    operation: &str,
) -> Result<HyperPodPyTorchJob, ApiError> {
    let job = r.job.as_str();
    let procs = r.processes_per_node.map_or(target.gpus.max(1), |p| p.get());
    let nodes = r.nodes.get();
    let labels = json!({ K8S_MANAGED_BY.0: K8S_MANAGED_BY.1, JOB_LABEL: job,
                         RECIPE_LABEL: r.recipe.kind() });
    let mut resources = json!({ "nvidia.com/gpu": target.gpus.to_string() });
    if target.efa > 0 {
        resources["vpc.amazonaws.com/efa"] = json!(target.efa.to_string());
    }
    let mut env = vec![
        json!({"name": "HYPD_JOB", "value": job}),
        json!({"name": "HYPD_NODES", "value": nodes.to_string()}),
        json!({"name": "HYPD_PROCESSES_PER_NODE", "value": procs.to_string()}),
        json!({"name": "HYPD_DATA", "value": SHARED_MOUNT}),
        json!({"name": "PYTHONUNBUFFERED", "value": "1"}),
    ];
    env.extend(network_env(target.efa));
    let command = [
        vec!["bash".to_owned(), "-c".to_owned(), script(&r.recipe)],
        vec!["hypd-train".to_owned()],
        args(&r.recipe),
    ]
    .concat();
    let image = r
        .image
        .as_ref()
        .map_or_else(|| default_image(region), |i| i.to_string());
    let template = json!({
        "metadata": { "labels": labels },
        "spec": {
            "nodeSelector": { NODE_GROUP_LABEL: target.group, "node.kubernetes.io/instance-type": target.instance_type },
            "containers": [{
                "name": "trainer",
                "image": image,
                "command": command,
                "env": env,
                "ports": [{ "containerPort": AGENT_PORT, "name": "agent" }],
                "resources": { "requests": resources, "limits": resources },
                "volumeMounts": [
                    { "name": "shared", "mountPath": SHARED_MOUNT },
                    { "name": "dshm", "mountPath": "/dev/shm" },
                ],
            }],
            "volumes": [
                { "name": "shared", "persistentVolumeClaim": { "claimName": SHARED_CLAIM } },
                { "name": "dshm", "emptyDir": { "medium": "Memory" } },
            ],
        },
    });
    let b = &r.recovery;
    let mut run_policy = json!({
        "jobMaxRetryCount": b.job_max_retry_count.get(),
        "restartPolicy": {
            "numRestartBeforeFullJobRestart": b.restarts_before_full_job_restart.get(),
            "evalPeriodSeconds": b.eval_period_seconds.get(),
            "maxFullJobRestarts": b.max_full_job_restarts.get(),
        },
        // Finished pods stay, so their logs can be read until the job is deleted.
        "cleanPodPolicy": "None",
    });
    if !r.log_monitoring.is_empty() {
        run_policy["logMonitoringConfiguration"] = r
            .log_monitoring
            .iter()
            .map(|rule| {
                let mut v = json!({ "name": rule.name.as_str(), "logPattern": rule.pattern });
                if let Some(s) = rule.start_cutoff_seconds {
                    v["expectedStartCutOffInSeconds"] = json!(s.get());
                }
                if let Some(s) = rule.expected_frequency_seconds {
                    v["expectedRecurringFrequencyInSeconds"] = json!(s.get());
                }
                if let Some(t) = rule.metric_threshold {
                    v["metricThreshold"] = json!(t);
                }
                if let Some(c) = rule.comparison {
                    v["operator"] = json!(c.as_operator());
                }
                if let Some(n) = rule.evaluation_data_points {
                    v["metricEvaluationDataPoints"] = json!(n.get());
                }
                v
            })
            .collect();
    }
    let mut spec = json!({
        "nprocPerNode": procs.to_string(),
        "replicaSpecs": [{ "name": "pods", "replicas": nodes, "template": template }],
        "runPolicy": run_policy,
    });
    if let Some(e) = &r.elastic {
        spec["elasticPolicy"] =
            json!({ "minReplicas": e.min_nodes.get(), "maxReplicas": e.max_nodes.get() });
    }
    let metadata = ObjectMeta {
        name: Some(job.to_owned()),
        namespace: Some(NAMESPACE.to_owned()),
        labels: serde_json::from_value(labels).map_err(ApiError::internal)?,
        annotations: Some(
            [
                (OPERATION_ANNOTATION.to_owned(), operation.to_owned()),
                (GROUP_ANNOTATION.to_owned(), target.group.clone()),
            ]
            .into(),
        ),
        ..ObjectMeta::default()
    };
    Ok(HyperPodPyTorchJob::new(metadata, spec))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(efa: u32) -> Target {
        Target {
            group: "gpu".into(),
            instance_type: "ml.p5.48xlarge".into(),
            gpus: 8,
            efa,
        }
    }

    fn request(body: Value) -> SubmitTrainingJob {
        let mut r = json!({"name": "ml-1", "job": "sft-1"});
        for (k, v) in body.as_object().unwrap() {
            r[k] = v.clone();
        }
        serde_json::from_value(r).unwrap()
    }

    #[test]
    fn a_pytorch_job_asks_for_its_nodes_gpus_and_efa_and_mounts_the_bucket() {
        let r = request(json!({"nodes": 2, "recipe": {"kind": "pytorch",
            "script": "/s3/scripts/train.py", "args": ["--epochs", "3; rm -rf /"]},
            "log_monitoring": [{"name": "loss", "pattern": "loss=([0-9.]+)", "metric_threshold": 0.5, "comparison": "gt"}]}));
        let j =
            serde_json::to_value(object(&r, &target(32), "us-west-2", "op-1").unwrap()).unwrap();
        let spec = &j["spec"];
        assert_eq!(spec["nprocPerNode"], "8");
        assert_eq!(spec["replicaSpecs"][0]["replicas"], 2);
        let pod = &spec["replicaSpecs"][0]["template"]["spec"];
        let c = &pod["containers"][0];
        assert_eq!(c["resources"]["requests"]["nvidia.com/gpu"], "8");
        assert_eq!(c["resources"]["limits"]["vpc.amazonaws.com/efa"], "32");
        assert_eq!(pod["nodeSelector"][NODE_GROUP_LABEL], "gpu");
        assert_eq!(c["volumeMounts"][0]["mountPath"], "/s3");
        assert_eq!(
            pod["volumes"][0]["persistentVolumeClaim"]["claimName"],
            "shared-s3"
        );
        assert_eq!(pod["volumes"][1]["emptyDir"]["medium"], "Memory");
        assert!(c["image"].as_str().unwrap().contains(".us-west-2."));
        // The arguments are hyperpodrun's "$@", never part of the script.
        let command: Vec<&str> = c["command"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        assert_eq!(
            &command[3..],
            [
                "hypd-train",
                "/s3/scripts/train.py",
                "--epochs",
                "3; rm -rf /"
            ]
        );
        assert!(!command[2].contains("rm -rf"));
        assert!(command[2].contains("exec hyperpodrun"));
        let env = c["env"].as_array().unwrap();
        assert!(
            env.iter()
                .any(|e| e["name"] == "FI_PROVIDER" && e["value"] == "efa")
        );
        assert_eq!(spec["runPolicy"]["jobMaxRetryCount"], 50);
        assert_eq!(
            spec["runPolicy"]["logMonitoringConfiguration"][0]["metricThreshold"],
            json!(0.5)
        );
        assert_eq!(j["metadata"]["labels"][RECIPE_LABEL], "pytorch");
    }

    #[test]
    fn llama_factory_runs_its_launcher_on_the_config_and_no_efa_means_no_efa() {
        let r = request(
            json!({"recipe": {"kind": "llama_factory", "config": "/s3/configs/sft.yaml"},
            "processes_per_node": 4}),
        );
        let j = serde_json::to_value(object(&r, &target(0), "us-east-1", "op-1").unwrap()).unwrap();
        let c = &j["spec"]["replicaSpecs"][0]["template"]["spec"]["containers"][0];
        assert_eq!(j["spec"]["nprocPerNode"], "4");
        assert!(
            c["resources"]["requests"]
                .get("vpc.amazonaws.com/efa")
                .is_none()
        );
        assert!(c["command"][2].as_str().unwrap().contains(LLAMA_FACTORY));
        assert_eq!(c["command"][4], "/s3/configs/sft.yaml");
        let env = c["env"].as_array().unwrap();
        assert!(env.iter().all(|e| e["name"] != "FI_PROVIDER"));
    }
}
