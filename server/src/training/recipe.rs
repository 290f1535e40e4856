//! The object a `submit_training_job` request becomes: a HyperPodPyTorchJob, or for VERL
//! a KubeRay RayJob. Pure: the same request and target give the same object, so the dry
//! run shows exactly what the step applies. Every pod asks for all of its node's GPUs and
//! EFA interfaces (one pod per node), runs on the group's nodes, mounts the shared bucket
//! at `/s3` and a memory-backed `/dev/shm`; the operator's pods start through
//! `hyperpodrun`, the launcher its elastic agent provides (installed at start when the
//! image lacks it), Ray's through KubeRay's `ray start` after the recipe's set-up.

use app::api::ApiError;
use app::api::storage::{SHARED_CLAIM, SHARED_MOUNT};
use app::api::training::{NAMESPACE, PYTORCH_JOB, Recipe, SubmitTrainingJob};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::{Value, json};

use super::job::Job;
use super::{GROUP_ANNOTATION, JOB_LABEL, NODE_GROUP_LABEL, OPERATION_ANNOTATION, RECIPE_LABEL};
use crate::resources::kube::training::{HyperPodPyTorchJob, RayJob};
use crate::resources::tags::K8S_MANAGED_BY;

/// Where a job runs and what each of its nodes has (nothing for a custom job, whose
/// spec says).
#[derive(Clone, Debug, Default, PartialEq)]
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
/// ms-swift, pinned, installed on the PyTorch image at start.
pub const MS_SWIFT: &str = "ms-swift==4.6.0";
/// VERL, pinned (it brings Ray), installed on the image at start when missing.
pub const VERL: &str = "verl==0.9.1";
/// MLflow and AWS's plugin that signs its requests for a SageMaker tracking server
/// (the tracking URI is the server's ARN).
pub const MLFLOW: &str = "mlflow==3.18.0 sagemaker-mlflow==0.5.0";

/// The MLflow tracking server and experiment a job reports to.
#[derive(Clone, Debug, PartialEq)]
pub struct Tracking {
    pub arn: String,
    pub experiment: String,
}

/// `s` as one shell word.
fn quoted(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// `pip install` of `packages`, quiet.
fn pip(packages: &str) -> String {
    format!("pip install --quiet --no-cache-dir --disable-pip-version-check {packages}\n")
}
/// The agent the operator talks to (port 8080), which brings `hyperpodrun`.
pub const ELASTIC_AGENT: &str = "hyperpod-elastic-agent";
/// The port the elastic agent listens on, which the operator expects.
pub const AGENT_PORT: i32 = 8080;

/// What the container runs: `hyperpodrun` over the recipe's entry point, with the
/// recipe's arguments as `$@` (never spliced into the script: a path or an argument is
/// never read as shell).
fn script(recipe: &Recipe, tracking: bool) -> String {
    let mut s = String::from("set -euo pipefail\n");
    s.push_str(&format!(
        "command -v hyperpodrun >/dev/null 2>&1 || {}",
        pip(ELASTIC_AGENT)
    ));
    if tracking {
        s.push_str(&pip(MLFLOW));
    }
    // An installed tool's own multi-node entry point, as the file of its module (what
    // its CLI would run under torchrun).
    let entry = |package: &str, module: &str| {
        format!(
            "{}set -- \"$(python -c 'import {module} as m; print(m.__file__)')\" \"$@\"\n",
            pip(&quoted(package))
        )
    };
    match recipe {
        Recipe::LlamaFactory { .. } => s.push_str(&entry(LLAMA_FACTORY, "llamafactory.launcher")),
        Recipe::MsSwift { command, .. } => s.push_str(&entry(MS_SWIFT, command.module())),
        _ => {}
    }
    s.push_str(&format!(
        "exec hyperpodrun --nnodes=\"$HYPD_NODES\" --nproc-per-node=\"$HYPD_PROCESSES_PER_NODE\" --server-host=0.0.0.0 --server-port={AGENT_PORT} --tee=3 --log_dir=/tmp/hyperpod \"$@\"\n"
    ));
    s
}

/// The recipe's arguments after the script: the entry file first, then what makes the
/// tool report to MLflow when the job has a tracking server.
fn args(recipe: &Recipe, tracking: bool) -> Vec<String> {
    let mut args: Vec<String> = match recipe {
        Recipe::Pytorch { script, args } => std::iter::once(script.to_string())
            .chain(args.iter().cloned())
            .collect(),
        Recipe::LlamaFactory { config } => vec![config.to_string()],
        Recipe::MsSwift { config, .. } => vec!["--config".into(), config.to_string()],
        Recipe::Verl { .. } | Recipe::Custom { .. } => Vec::new(),
    };
    if tracking {
        match recipe {
            // LLaMA-Factory merges `key=value` after its config.
            Recipe::LlamaFactory { .. } => args.push("report_to=mlflow".into()),
            Recipe::MsSwift { .. } => args.extend(["--report_to".into(), "mlflow".into()]),
            _ => {}
        }
    }
    args
}

/// The MLflow environment: the tracking server's ARN (which `sagemaker-mlflow` signs
/// for), the experiment, and tags naming the job (HF Trainer's MLflow callback puts
/// `MLFLOW_TAGS` on its run), by which hypd finds the job's runs.
fn tracking_env(tracking: &Tracking, cluster: &str, job: &str) -> Vec<Value> {
    let tags = json!({ super::metrics::CLUSTER_TAG: cluster, super::metrics::JOB_TAG: job });
    vec![
        json!({"name": "MLFLOW_TRACKING_URI", "value": tracking.arn}),
        json!({"name": "MLFLOW_EXPERIMENT_NAME", "value": tracking.experiment}),
        json!({"name": "MLFLOW_TAGS", "value": tags.to_string()}),
        json!({"name": "MLFLOW_RUN_NAME", "value": job}),
    ]
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

/// The pod template every node of a job runs: the type's GPUs and EFA, the group's
/// node selector, the shared bucket at `/s3`, `/dev/shm`, the network and MLflow
/// environment, and `container` (name, image, command or args) over it.
fn pod_template(
    r: &SubmitTrainingJob,
    target: &Target,
    tracking: Option<&Tracking>,
    labels: &Value,
    procs: u32,
    mut container: Value,
) -> Value {
    let job = r.job.as_str();
    let mut resources = json!({ "nvidia.com/gpu": target.gpus.to_string() });
    if target.efa > 0 {
        resources["vpc.amazonaws.com/efa"] = json!(target.efa.to_string());
    }
    let mut env = vec![
        json!({"name": "HYPD_JOB", "value": job}),
        json!({"name": "HYPD_NODES", "value": r.nodes.get().to_string()}),
        json!({"name": "HYPD_PROCESSES_PER_NODE", "value": procs.to_string()}),
        json!({"name": "HYPD_DATA", "value": SHARED_MOUNT}),
        json!({"name": "PYTHONUNBUFFERED", "value": "1"}),
    ];
    env.extend(network_env(target.efa));
    if let Some(t) = tracking {
        env.extend(tracking_env(t, r.name.as_str(), job));
    }
    container["env"] = json!(env);
    container["resources"] = json!({ "requests": resources, "limits": resources });
    container["volumeMounts"] = json!([
        { "name": "shared", "mountPath": SHARED_MOUNT },
        { "name": "dshm", "mountPath": "/dev/shm" },
    ]);
    json!({
        "metadata": { "labels": labels },
        "spec": {
            "nodeSelector": { NODE_GROUP_LABEL: target.group, "node.kubernetes.io/instance-type": target.instance_type },
            "containers": [container],
            "volumes": [
                { "name": "shared", "persistentVolumeClaim": { "claimName": SHARED_CLAIM } },
                { "name": "dshm", "emptyDir": { "medium": "Memory" } },
            ],
        },
    })
}

/// The HyperPodPyTorchJob's run policy: the recovery budget and the log rules.
fn run_policy(r: &SubmitTrainingJob) -> Value {
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
    run_policy
}

/// VERL's command: the script (or VERL's PPO trainer) with the arguments, each one shell
/// word; the trainer is told the nodes and GPUs the Ray cluster has, and the MLflow
/// logger when tracked, unless the arguments say otherwise.
fn verl_entrypoint(
    script: Option<&app::api::values::PodPath>,
    args: &[String],
    nodes: u32,
    gpus: u32,
    tracking: bool,
) -> String {
    let mut words = vec!["python3".to_owned()];
    match script {
        Some(s) => words.push(quoted(s.as_str())),
        None => {
            words.extend(["-m".to_owned(), "verl.trainer.main_ppo".to_owned()]);
            let given = |key: &str| args.iter().any(|a| a.starts_with(&format!("{key}=")));
            let mut implied = vec![
                ("trainer.nnodes", nodes.to_string()),
                ("trainer.n_gpus_per_node", gpus.to_string()),
            ];
            if tracking {
                implied.push(("trainer.logger", "['console','mlflow']".to_owned()));
            }
            for (key, value) in implied {
                if !given(key) {
                    words.push(quoted(&format!("{key}={value}")));
                }
            }
        }
    }
    words.extend(args.iter().map(|a| quoted(a)));
    words.join(" ")
}

/// The job object for request `r` on `target`, made by operation `operation`, reporting
/// to `tracking` when given.
pub fn object(
    r: &SubmitTrainingJob,
    target: &Target,
    region: &str,
    operation: &str,
    tracking: Option<&Tracking>,
) -> Result<Job, ApiError> {
    let job = r.job.as_str();
    let procs = r.processes_per_node.map_or(target.gpus.max(1), |p| p.get());
    let nodes = r.nodes.get();
    let labels = json!({ K8S_MANAGED_BY.0: K8S_MANAGED_BY.1, JOB_LABEL: job,
                         RECIPE_LABEL: r.recipe.kind() });
    let image = r
        .image
        .as_ref()
        .map_or_else(|| default_image(region), |i| i.to_string());
    let metadata = ObjectMeta {
        name: Some(job.to_owned()),
        namespace: Some(NAMESPACE.to_owned()),
        labels: serde_json::from_value(labels.clone()).map_err(ApiError::internal)?,
        annotations: Some(
            [
                Some((OPERATION_ANNOTATION.to_owned(), operation.to_owned())),
                (!target.group.is_empty())
                    .then(|| (GROUP_ANNOTATION.to_owned(), target.group.clone())),
            ]
            .into_iter()
            .flatten()
            .collect(),
        ),
        ..ObjectMeta::default()
    };
    let spec = match &r.recipe {
        Recipe::Custom { object } => {
            let mut custom = object.clone();
            let mut meta: ObjectMeta =
                serde_json::from_value(object["metadata"].clone()).unwrap_or_default();
            meta.name = metadata.name;
            meta.namespace = metadata.namespace;
            meta.labels
                .get_or_insert_default()
                .extend(metadata.labels.unwrap_or_default());
            meta.annotations
                .get_or_insert_default()
                .extend(metadata.annotations.unwrap_or_default());
            custom["metadata"] = serde_json::to_value(&meta).map_err(ApiError::internal)?;
            return if r.recipe.object_kind() == PYTORCH_JOB {
                serde_json::from_value(custom).map(Job::PyTorch)
            } else {
                serde_json::from_value(custom).map(Job::Ray)
            }
            .map_err(|e| ApiError::field("recipe.object", e.to_string()));
        }
        Recipe::Verl {
            script,
            args: verl_args,
        } => {
            // Ray starts after the set-up (KubeRay runs a container's args, then `ray
            // start`), so the image needs VERL only by the time Ray does.
            let setup = format!(
                "python3 -c 'import verl' 2>/dev/null || {}{}",
                pip(&quoted(VERL)).trim_end(),
                if tracking.is_some() {
                    format!(" && {}", pip(MLFLOW).trim_end())
                } else {
                    String::new()
                }
            );
            let container = |name: &str| {
                json!({
                    "name": name,
                    "image": image,
                    "args": [setup],
                    "ports": [{ "containerPort": 6379, "name": "gcs" },
                              { "containerPort": 8265, "name": "dashboard" },
                              { "containerPort": 10001, "name": "client" }],
                })
            };
            let head = pod_template(r, target, tracking, &labels, procs, container("ray-head"));
            let mut spec = json!({
                "entrypoint": verl_entrypoint(script.as_ref(), verl_args, nodes, procs, tracking.is_some()),
                "submissionMode": "K8sJobMode",
                // A finished job gives its GPUs back; its pods' logs are kept 10 minutes.
                "shutdownAfterJobFinishes": true,
                "ttlSecondsAfterFinished": 600,
                // A retry is a whole new Ray cluster: what the budget calls a full-job
                // restart.
                "backoffLimit": r.recovery.max_full_job_restarts.get(),
                "rayClusterSpec": {
                    "headGroupSpec": { "rayStartParams": { "dashboard-host": "0.0.0.0" }, "template": head },
                    "workerGroupSpecs": [],
                },
            });
            if nodes > 1 {
                let worker =
                    pod_template(r, target, tracking, &labels, procs, container("ray-worker"));
                spec["rayClusterSpec"]["workerGroupSpecs"] = json!([{
                    "groupName": "workers",
                    "replicas": nodes - 1,
                    "minReplicas": nodes - 1,
                    "maxReplicas": nodes - 1,
                    "rayStartParams": {},
                    "template": worker,
                }]);
            }
            return Ok(Job::Ray(RayJob::new(metadata, spec)));
        }
        _ => {
            let tracked = tracking.is_some();
            let command = [
                vec![
                    "bash".to_owned(),
                    "-c".to_owned(),
                    script(&r.recipe, tracked),
                ],
                vec!["hypd-train".to_owned()],
                args(&r.recipe, tracked),
            ]
            .concat();
            let container = json!({
                "name": "trainer",
                "image": image,
                "command": command,
                "ports": [{ "containerPort": AGENT_PORT, "name": "agent" }],
            });
            let template = pod_template(r, target, tracking, &labels, procs, container);
            let mut spec = json!({
                "nprocPerNode": procs.to_string(),
                "replicaSpecs": [{ "name": "pods", "replicas": nodes, "template": template }],
                "runPolicy": run_policy(r),
            });
            if let Some(e) = &r.elastic {
                spec["elasticPolicy"] =
                    json!({ "minReplicas": e.min_nodes.get(), "maxReplicas": e.max_nodes.get() });
            }
            spec
        }
    };
    Ok(Job::PyTorch(HyperPodPyTorchJob::new(metadata, spec)))
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

    fn pytorch(j: Job) -> HyperPodPyTorchJob {
        match j {
            Job::PyTorch(j) => j,
            other => panic!("{other:?}"),
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
        let j = serde_json::to_value(pytorch(
            object(&r, &target(32), "us-west-2", "op-1", None).unwrap(),
        ))
        .unwrap();
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
        let j = serde_json::to_value(pytorch(
            object(&r, &target(0), "us-east-1", "op-1", None).unwrap(),
        ))
        .unwrap();
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

    #[test]
    fn verl_is_a_rayjob_of_head_and_workers_with_the_nodes_gpus_and_quoted_args() {
        let r = request(json!({"nodes": 3, "recipe": {"kind": "verl",
            "args": ["data.train_files=/s3/data/gsm8k/train.parquet", "x='; rm -rf /"]}}));
        let tracking = Tracking {
            arn: "arn:aws:sagemaker:us-east-1:1:mlflow-tracking-server/ml-1-mlflow".into(),
            experiment: "ml-1".into(),
        };
        let Job::Ray(j) = object(&r, &target(32), "us-east-1", "op-1", Some(&tracking)).unwrap()
        else {
            panic!("a verl job is a RayJob")
        };
        let spec = &j.spec;
        let entry = spec["entrypoint"].as_str().unwrap();
        assert!(
            entry.starts_with("python3 -m verl.trainer.main_ppo 'trainer.nnodes=3' 'trainer.n_gpus_per_node=8' 'trainer.logger=['\\''console'\\'','\\''mlflow'\\'']'"),
            "{entry}"
        );
        assert!(entry.ends_with("'x='\\''; rm -rf /'"), "{entry}");
        let head = &spec["rayClusterSpec"]["headGroupSpec"]["template"];
        let workers = &spec["rayClusterSpec"]["workerGroupSpecs"][0];
        assert_eq!(workers["replicas"], 2);
        for t in [head, &workers["template"]] {
            let c = &t["spec"]["containers"][0];
            assert_eq!(c["resources"]["limits"]["nvidia.com/gpu"], "8");
            assert_eq!(c["resources"]["limits"]["vpc.amazonaws.com/efa"], "32");
            assert_eq!(c["volumeMounts"][0]["mountPath"], "/s3");
            assert!(c["args"][0].as_str().unwrap().contains(VERL));
            assert!(
                c.get("command").is_none(),
                "KubeRay runs ray start after args"
            );
            assert_eq!(t["spec"]["nodeSelector"][NODE_GROUP_LABEL], "gpu");
            let env = c["env"].as_array().unwrap();
            assert!(
                env.iter()
                    .any(|e| e["name"] == "MLFLOW_TRACKING_URI" && e["value"] == tracking.arn)
            );
        }
        // Arguments that set what hypd would imply win.
        let r = request(json!({"recipe": {"kind": "verl", "args": ["trainer.nnodes=1"]}}));
        let Job::Ray(j) = object(&r, &target(0), "us-east-1", "op-1", None).unwrap() else {
            panic!()
        };
        let entry = j.spec["entrypoint"].as_str().unwrap();
        assert_eq!(entry.matches("trainer.nnodes").count(), 1, "{entry}");
        assert!(!entry.contains("mlflow"));
        assert_eq!(j.spec["rayClusterSpec"]["workerGroupSpecs"], json!([]));
    }

    #[test]
    fn ms_swift_runs_its_commands_entry_on_the_config_and_reports_when_tracked() {
        let r = request(
            json!({"recipe": {"kind": "ms_swift", "command": "megatron_sft",
            "config": "/s3/configs/swift.yaml"}}),
        );
        let tracking = Tracking {
            arn: "arn:aws:sagemaker:us-east-1:1:mlflow-tracking-server/t".into(),
            experiment: "e".into(),
        };
        let j = pytorch(object(&r, &target(0), "us-east-1", "op-1", Some(&tracking)).unwrap());
        let c = &j.spec["replicaSpecs"][0]["template"]["spec"]["containers"][0];
        let script = c["command"][2].as_str().unwrap();
        assert!(script.contains("swift.cli._megatron.sft"), "{script}");
        assert!(script.contains(MS_SWIFT) && script.contains("sagemaker-mlflow"));
        let args: Vec<&str> = c["command"].as_array().unwrap()[4..]
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        assert_eq!(
            args,
            [
                "--config",
                "/s3/configs/swift.yaml",
                "--report_to",
                "mlflow"
            ]
        );
        let tags = c["env"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == "MLFLOW_TAGS")
            .unwrap()["value"]
            .as_str()
            .unwrap()
            .to_owned();
        assert_eq!(
            serde_json::from_str::<Value>(&tags).unwrap(),
            json!({"hypd.cluster": "ml-1", "hypd.job": "sft-1"})
        );
    }

    #[test]
    fn a_custom_object_is_applied_as_given_under_the_jobs_name_and_labels() {
        let r = request(json!({"recipe": {"kind": "custom", "object": {
            "apiVersion": "ray.io/v1", "kind": "RayJob",
            "metadata": {"labels": {"team": "rl"}},
            "spec": {"entrypoint": "python3 x.py", "rayClusterSpec": {"headGroupSpec": {}}}}}}));
        let Job::Ray(j) = object(&r, &Target::default(), "us-east-1", "op-1", None).unwrap() else {
            panic!()
        };
        assert_eq!(j.metadata.name.as_deref(), Some("sft-1"));
        let labels = j.metadata.labels.clone().unwrap();
        assert_eq!(labels["team"], "rl");
        assert_eq!(labels[RECIPE_LABEL], "custom");
        let annotations = j.metadata.annotations.clone().unwrap();
        assert_eq!(annotations[OPERATION_ANNOTATION], "op-1");
        assert!(!annotations.contains_key(GROUP_ANNOTATION));
        assert_eq!(j.spec["entrypoint"], "python3 x.py");
    }
}
