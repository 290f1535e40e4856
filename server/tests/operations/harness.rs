//! The generic harness: every pipeline, in every stage that calls a provider, through
//! three things the world does to operations:
//! - a provider failure in the stage: the operation fails there, keeping the provider's
//!   code and message, and `retry_operation` finishes it;
//! - a SIGKILL of hypd while the stage has a call in flight: a restart on the same store
//!   resumes it;
//! - a lost answer: the stage's call is carried out but its answer never arrives (a
//!   transient failure), so the engine runs the stage again — which must adopt what the
//!   first run made.
//!
//! After each, the world holds exactly what the pipeline makes (no duplicate AWS or
//! Kubernetes object). A new pipeline gets all three by adding one `Case` to `CASES`.

use std::collections::BTreeSet;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use reqwest::Method;
use serde_json::{Value, json};

use crate::common::{Hypd, Tenant, World};
use crate::{FAST, eks_status, get_op, stage, wait_until};

/// A call a stage makes: the fault is injected into it (a mutating call where the stage
/// has one, so a lost answer means "done but not told").
pub struct Call {
    pub stage: &'static str,
    /// Matching calls that pass before the fault hits (the pre-flight's own reads).
    pub after: u32,
    /// As the sim names services: `ec2`, `iam`, `s3` (forwarded to moto), `eks`,
    /// `sagemaker`, `kubernetes` (`<verb> <Kind>`).
    pub service: &'static str,
    pub operation: &'static str,
    /// The stage makes this call once (one batch call for every node): after a lost
    /// answer it must not be made again. Other calls may be made once per object.
    pub once: bool,
}

/// One pipeline as the harness drives it, for a cluster named `name`.
pub struct Case {
    pub command: &'static str,
    /// Makes what the operation needs first (an EKS cluster to import, a cluster to
    /// delete); `hypd` and `token` are the server under test.
    pub given: fn(&World, &Hypd, &str, &str),
    /// The REST call that starts the operation on cluster `name` (a destructive one is
    /// confirmed, a dry run adds `dry_run`); it may ask `hypd` as `token` first (which
    /// nodes there are).
    pub request: fn(&Hypd, &str, &str) -> (Method, String, Value),
    /// What the world must hold once the operation succeeded.
    pub check: fn(&World, &Hypd, &str, &str),
    pub calls: &'static [Call],
}

const fn call(stage: &'static str, service: &'static str, operation: &'static str) -> Call {
    Call {
        stage,
        after: 0,
        service,
        operation,
        once: false,
    }
}

/// A call the pre-flight (or the request, when it asks which nodes there are) makes
/// too: the fault lets that one through.
const fn after_preflight(
    stage: &'static str,
    service: &'static str,
    operation: &'static str,
) -> Call {
    Call {
        stage,
        after: 1,
        service,
        operation,
        once: false,
    }
}

/// A call the stage makes once, whatever it acts on.
const fn once(stage: &'static str, service: &'static str, operation: &'static str) -> Call {
    Call {
        once: true,
        ..call(stage, service, operation)
    }
}

pub const CASES: &[Case] = &[
    Case {
        command: "create_cluster",
        given: |_, _, _, _| {},
        request: |_, _, name| {
            let path = "/api/v1/clusters".to_owned();
            (Method::POST, path, crate::common::cluster::small(name))
        },
        check: |world, _, _, name| {
            crate::common::cluster::assert_complete(&crate::common::cluster::count(world, name))
        },
        calls: &[
            call("network", "ec2", "AuthorizeSecurityGroupEgress"),
            call("iam", "iam", "PutRolePolicy"),
            call("eks", "eks", "CreateCluster"),
            call("access", "eks", "AssociateAccessPolicy"),
            call("addons", "eks", "CreateAddon"),
            call("components", "kubernetes", "patch DaemonSet"),
            call("hyperpod", "sagemaker", "CreateCluster"),
            call("storage", "kubernetes", "patch PersistentVolumeClaim"),
        ],
    },
    Case {
        command: "import_cluster",
        given: |world, _, _, name| existing_eks(world, name),
        request: |_, _, name| {
            let path = "/api/v1/clusters/import".to_owned();
            (Method::POST, path, json!({ "name": name }))
        },
        check: |world, hypd, token, name| {
            assert_eq!(crate::access_entries(world, name).len(), 1, "{name}");
            let (status, c) = hypd.call(
                token,
                Method::GET,
                &format!("/api/v1/clusters/{name}"),
                None,
            );
            assert_eq!(
                (status, c["status"].as_str()),
                (200, Some("imported")),
                "{c}"
            );
        },
        calls: &[
            after_preflight("eks", "eks", "DescribeCluster"),
            call("access", "eks", "AssociateAccessPolicy"),
            call("hyperpod", "sagemaker", "ListClusters"),
        ],
    },
    Case {
        command: "delete_cluster",
        given: created,
        request: |_, _, name| {
            let path = format!("/api/v1/clusters/{name}");
            (Method::DELETE, path, json!({}))
        },
        check: |world, hypd, token, name| {
            crate::common::cluster::assert_gone(&crate::common::cluster::count(world, name));
            let (status, _) = hypd.call(
                token,
                Method::GET,
                &format!("/api/v1/clusters/{name}"),
                None,
            );
            assert_eq!(status, 404, "{name} is forgotten");
        },
        calls: &[
            call("hyperpod", "sagemaker", "DeleteCluster"),
            call("addons", "eks", "DeleteAddon"),
            call("eks", "eks", "DeleteCluster"),
            call("iam", "iam", "DeleteRole"),
            call("network", "ec2", "DeleteVpc"),
            call("bucket", "s3", "DeleteBucket"),
        ],
    },
    Case {
        command: "reconcile_cluster",
        given: |world, hypd, token, name| {
            created(world, hypd, token, name);
            drift(world, name);
        },
        request: |_, _, name| {
            let path = format!("/api/v1/clusters/{name}/reconcile");
            (Method::POST, path, json!({}))
        },
        check: |world, hypd, token, name| {
            crate::common::cluster::assert_complete(&crate::common::cluster::count(world, name));
            let (status, drift) = hypd.call(
                token,
                Method::GET,
                &format!("/api/v1/clusters/{name}/drift"),
                None,
            );
            assert_eq!(status, 200, "{drift}");
            assert_eq!(drift["drifted"], json!([]), "{drift:#}");
        },
        calls: &[
            call("network", "ec2", "AuthorizeSecurityGroupIngress"),
            call("iam", "iam", "AttachRolePolicy"),
            call("addons", "eks", "CreateAddon"),
            call("components", "kubernetes", "patch DaemonSet"),
            call("hyperpod", "sagemaker", "UpdateCluster"),
            call("storage", "kubernetes", "patch PersistentVolumeClaim"),
        ],
    },
    Case {
        command: "add_instance_group",
        given: created,
        request: |_, _, name| {
            let path = format!("/api/v1/clusters/{name}/instance-groups");
            (Method::POST, path, json!({ "group": spot() }))
        },
        check: |world, hypd, token, name| {
            assert_eq!(
                groups(world, name),
                [("gpu".to_owned(), 2), ("spot".to_owned(), 1)]
            );
            undrifted(hypd, token, name);
        },
        calls: &[
            call("hyperpod", "sagemaker", "UpdateCluster"),
            call("nodes", "kubernetes", "list Node"),
        ],
    },
    Case {
        command: "update_instance_group",
        given: created,
        request: |_, _, name| {
            let path = format!("/api/v1/clusters/{name}/instance-groups/gpu");
            (Method::POST, path, json!({ "instance_count": 3 }))
        },
        check: |world, hypd, token, name| {
            assert_eq!(groups(world, name), [("gpu".to_owned(), 3)]);
            undrifted(hypd, token, name);
        },
        calls: &[
            call("hyperpod", "sagemaker", "UpdateCluster"),
            call("nodes", "kubernetes", "list Node"),
        ],
    },
    Case {
        command: "delete_instance_group",
        given: |world, hypd, token, name| {
            created(world, hypd, token, name);
            let (status, added) = hypd.call(
                token,
                Method::POST,
                &format!("/api/v1/clusters/{name}/instance-groups"),
                Some(json!({ "group": spot() })),
            );
            assert_eq!(status, 200, "{added}");
            let op = hypd.finish(token, added["operation_id"].as_str().unwrap());
            assert_eq!(op["state"], "succeeded", "{op:#}");
        },
        request: |_, _, name| {
            let path = format!("/api/v1/clusters/{name}/instance-groups/spot");
            (Method::DELETE, path, json!({}))
        },
        check: |world, hypd, token, name| {
            assert_eq!(groups(world, name), [("gpu".to_owned(), 2)]);
            undrifted(hypd, token, name);
        },
        calls: &[call("hyperpod", "sagemaker", "UpdateCluster")],
    },
    Case {
        command: "reboot_nodes",
        given: created,
        request: |hypd, token, name| node_action(hypd, token, name, "reboot"),
        check: |world, hypd, token, name| nodes_back(world, hypd, token, name, 2),
        // Nodes are listed by the request's node list, then for their boot ids by the
        // `nodes` and `action` stages, then by `settled`.
        calls: &[
            after_preflight("nodes", "sagemaker", "ListClusterNodes"),
            after_preflight("nodes", "kubernetes", "list Node"),
            once("action", "sagemaker", "BatchRebootClusterNodes"),
            Call {
                stage: "settled",
                after: 3,
                service: "kubernetes",
                operation: "list Node",
                once: false,
            },
        ],
    },
    Case {
        command: "replace_nodes",
        given: created,
        request: |hypd, token, name| node_action(hypd, token, name, "replace"),
        check: |world, hypd, token, name| nodes_back(world, hypd, token, name, 2),
        // The plan a destructive request answers with reads the nodes too, so faults
        // go where only the run calls.
        calls: &[
            once("action", "sagemaker", "BatchReplaceClusterNodes"),
            after_preflight("settled", "kubernetes", "list Node"),
        ],
    },
    Case {
        command: "delete_nodes",
        given: created,
        request: |hypd, token, name| node_action(hypd, token, name, "delete"),
        check: |world, hypd, token, name| nodes_back(world, hypd, token, name, 1),
        calls: &[once("action", "sagemaker", "BatchDeleteClusterNodes")],
    },
    Case {
        command: "update_cluster_software",
        given: created,
        request: |_, _, name| {
            let path = format!("/api/v1/clusters/{name}/software-update");
            (Method::POST, path, json!({ "image_release": "2025.09.15" }))
        },
        check: |world, hypd, token, name| {
            let (status, nodes) = hypd.call(
                token,
                Method::GET,
                &format!("/api/v1/clusters/{name}/nodes"),
                None,
            );
            assert_eq!(status, 200, "{nodes}");
            assert!(
                nodes["nodes"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .all(|n| n["image_release"] == "2025.09.15" && n["ready"] == true),
                "{nodes:#}"
            );
            nodes_back(world, hypd, token, name, 2);
        },
        calls: &[
            call("update", "sagemaker", "UpdateClusterSoftware"),
            call("rolled", "kubernetes", "list Node"),
        ],
    },
    Case {
        command: "update_features",
        given: created_with_burst,
        request: |_, _, name| {
            let path = format!("/api/v1/clusters/{name}/features");
            let body = json!({ "training_operator": true, "inference_operator": true,
                               "tiered_checkpointing": true, "tiered_memory_percent": 30,
                               "autoscaling": true, "kuberay_operator": true });
            (Method::POST, path, body)
        },
        check: |world, hypd, token, name| {
            assert_eq!(
                crate::features::training_parts(world, name),
                (Some("ACTIVE".to_owned()), 1)
            );
            for f in [
                "training_operator",
                "inference_operator",
                "tiered_checkpointing",
                "autoscaling",
                "kuberay_operator",
            ] {
                let f = crate::features::feature(hypd, token, name, f);
                assert_eq!(f["enabled"], true, "{f:#}");
            }
            let ray = crate::features::feature(hypd, token, name, "kuberay_operator");
            assert_eq!(ray["status"], "installed", "{ray:#}");
            let described = crate::common::cluster::sagemaker(
                world,
                "DescribeCluster",
                json!({"ClusterName": name}),
            );
            assert_eq!(
                described["TieredStorageConfig"]["InstanceMemoryAllocationPercentage"], 30,
                "{described:#}"
            );
            assert_eq!(
                described["AutoScaling"]["Status"], "InService",
                "{described:#}"
            );
            // The cluster's three roles, the features' seven and the FSx driver's; the S3
            // and FSx drivers' bindings and the training operator's.
            let c = crate::common::cluster::count(world, name);
            assert_eq!((c.roles, c.pod_identities), (11, 3), "{c:?}");
        },
        // The pre-flight reads each operator's add-on once to see whether it is on. One
        // call a stage: the add-on, role and service account resources have their
        // faults in create_cluster's case; these are the calls only this pipeline makes.
        // The FSx driver's binding (components) comes before the training operator's,
        // autoscaling's UpdateCluster after tiered checkpointing's.
        calls: &[
            Call {
                after: 2,
                ..call("components", "eks", "DescribeAddon")
            },
            Call {
                after: 1,
                ..call("training_operator", "eks", "CreatePodIdentityAssociation")
            },
            call("inference_operator", "s3", "CreateBucket"),
            call("tiered_checkpointing", "sagemaker", "UpdateCluster"),
            Call {
                after: 1,
                ..call("autoscaling", "sagemaker", "UpdateCluster")
            },
            // After the CRDs: the operator's Deployment.
            call("kuberay_operator", "kubernetes", "patch Deployment"),
        ],
    },
    // KEDA on its own: beside the inference operator (above) its add-on brings KEDA.
    Case {
        command: "update_features",
        given: created,
        request: |_, _, name| {
            let path = format!("/api/v1/clusters/{name}/features");
            (Method::POST, path, json!({ "keda": true }))
        },
        check: |_, hypd, token, name| {
            let k = crate::features::feature(hypd, token, name, "keda");
            assert_eq!(
                (&k["status"], &k["version"]),
                (&json!("installed"), &json!("2.20.2")),
                "{k:#}"
            );
        },
        // Near its end, after the namespace, CRDs and Deployments.
        calls: &[call("keda", "kubernetes", "patch APIService")],
    },
    Case {
        command: "create_s3_storage",
        given: created,
        request: |_, _, name| {
            let path = format!("/api/v1/clusters/{name}/storage");
            (Method::POST, path, json!({ "storage": "data" }))
        },
        check: |world, hypd, token, name| {
            crate::storage::assert_storage(world, hypd, token, name, true);
        },
        // The pre-flight (twice: hypd's storage, then any claim of the name) and the
        // volume stage read the claim before `bound` does.
        calls: &[
            call("bucket", "s3", "PutBucketEncryption"),
            call("access", "iam", "PutRolePolicy"),
            call("volume", "kubernetes", "patch PersistentVolumeClaim"),
            Call {
                after: 3,
                ..call("bound", "kubernetes", "get PersistentVolumeClaim")
            },
        ],
    },
    Case {
        command: "delete_storage",
        given: |world, hypd, token, name| {
            created(world, hypd, token, name);
            crate::storage::added(hypd, token, name, "data");
        },
        request: |_, _, name| {
            let path = format!("/api/v1/clusters/{name}/storage/data");
            (Method::DELETE, path, json!({}))
        },
        check: |world, hypd, token, name| {
            crate::storage::assert_storage(world, hypd, token, name, false);
        },
        calls: &[
            call("claim", "kubernetes", "delete PersistentVolumeClaim"),
            call("volume", "kubernetes", "delete PersistentVolume"),
            call("access", "iam", "DeleteRolePolicy"),
            call("bucket", "s3", "DeleteBucket"),
        ],
    },
    Case {
        command: "create_fsx_storage",
        given: created,
        request: |_, _, name| {
            let path = format!("/api/v1/clusters/{name}/file-systems");
            let body = json!({ "storage": "fast", "data_repositories": [{"file_system_path": "/shared"}] });
            (Method::POST, path, body)
        },
        check: |world, hypd, token, name| fsx_storage(world, hypd, token, name, true),
        // The pre-flight reads the group, and the file system stage the file systems,
        // before the stages the fault is for.
        calls: &[
            after_preflight("network", "ec2", "DescribeSecurityGroups"),
            call("driver", "eks", "CreateAddon"),
            call("file_system", "fsx", "CreateFileSystem"),
            after_preflight("available", "fsx", "DescribeFileSystems"),
            call("repositories", "fsx", "CreateDataRepositoryAssociation"),
            call("volume", "kubernetes", "patch PersistentVolumeClaim"),
            Call {
                after: 4,
                ..call("bound", "kubernetes", "get PersistentVolumeClaim")
            },
        ],
    },
    Case {
        command: "delete_storage",
        given: |world, hypd, token, name| {
            created(world, hypd, token, name);
            let (status, started) = hypd.call(
                token,
                Method::POST,
                &format!("/api/v1/clusters/{name}/file-systems"),
                Some(json!({ "storage": "fast" })),
            );
            assert_eq!(status, 200, "{started}");
            let op = hypd.finish(token, started["operation_id"].as_str().unwrap());
            assert_eq!(op["state"], "succeeded", "{op:#}");
        },
        request: |_, _, name| {
            let path = format!("/api/v1/clusters/{name}/storage/fast");
            (Method::DELETE, path, json!({}))
        },
        check: |world, hypd, token, name| fsx_storage(world, hypd, token, name, false),
        // The claim and volume stages are the S3 case's code; the file system is this
        // case's own.
        calls: &[call("file_system", "fsx", "DeleteFileSystem")],
    },
    Case {
        command: "download_model",
        given: created,
        request: |_, _, name| {
            let path = format!("/api/v1/clusters/{name}/models");
            (Method::POST, path, json!({ "model": "Qwen/Qwen2.5-0.5B" }))
        },
        check: |_, hypd, token, name| {
            let (status, models) = hypd.call(
                token,
                Method::GET,
                &format!("/api/v1/clusters/{name}/models"),
                None,
            );
            assert_eq!(status, 200, "{models}");
            assert_eq!(models["models"][0]["complete"], true, "{models:#}");
            assert_eq!(models["models"].as_array().unwrap().len(), 1, "{models:#}");
        },
        // The pre-flight and the job stage read the manifest before `record` does; the
        // job stage reads the Job twice (is it there? then its apply's own look) before
        // `download` does.
        calls: &[
            call("job", "kubernetes", "patch Job"),
            Call {
                after: 2,
                ..call("download", "kubernetes", "get Job")
            },
            Call {
                after: 2,
                ..call("record", "s3", "GetObject")
            },
        ],
    },
    Case {
        command: "submit_training_job",
        given: training_ready,
        request: |_, _, name| {
            let path = format!("/api/v1/clusters/{name}/training-jobs");
            let body = json!({"job": "train", "recipe": {"kind": "pytorch", "script": "/s3/scripts/train.py"}});
            (Method::POST, path, body)
        },
        check: |world, hypd, token, name| training_job(world, hypd, token, name, true),
        // The pre-flight reads the job's name, and the job stage the job twice (is it
        // there? then its apply's own look) before `started` does.
        calls: &[
            call("job", "kubernetes", "patch HyperPodPyTorchJob"),
            Call {
                after: 3,
                ..call("started", "kubernetes", "get HyperPodPyTorchJob")
            },
        ],
    },
    Case {
        command: "create_mlflow_tracking_server",
        given: created,
        request: |_, _, name| {
            let path = format!("/api/v1/clusters/{name}/mlflow");
            (Method::POST, path, json!({}))
        },
        check: |_, hypd, token, name| {
            let (status, listed) = hypd.call(
                token,
                Method::GET,
                &format!("/api/v1/clusters/{name}/training-jobs"),
                None,
            );
            assert_eq!(status, 200, "{listed}");
            assert_eq!(
                listed["mlflow"]["name"],
                format!("{name}-mlflow"),
                "{listed:#}"
            );
            assert_eq!(listed["mlflow"]["status"], "Created", "{listed:#}");
            assert!(
                listed["mlflow"]["artifact_store"]
                    .as_str()
                    .is_some_and(|s| s.starts_with("s3://") && s.ends_with("/mlflow")),
                "{listed:#}"
            );
        },
        // The server stage describes the server before and after creating it.
        calls: &[
            call("role", "iam", "PutRolePolicy"),
            call("server", "sagemaker", "CreateMlflowTrackingServer"),
            Call {
                after: 2,
                ..call("available", "sagemaker", "DescribeMlflowTrackingServer")
            },
        ],
    },
    Case {
        command: "delete_training_job",
        given: |world, hypd, token, name| {
            training_ready(world, hypd, token, name);
            let (status, started) = hypd.call(
                token,
                Method::POST,
                &format!("/api/v1/clusters/{name}/training-jobs"),
                Some(json!({"job": "train", "recipe": {"kind": "pytorch", "script": "/s3/scripts/train.py"}})),
            );
            assert_eq!(status, 200, "{started}");
            let op = hypd.finish(token, started["operation_id"].as_str().unwrap());
            assert_eq!(op["state"], "succeeded", "{op:#}");
        },
        request: |_, _, name| {
            let path = format!("/api/v1/clusters/{name}/training-jobs/train");
            (Method::DELETE, path, json!({}))
        },
        check: |world, hypd, token, name| training_job(world, hypd, token, name, false),
        // The job stage lists the job's pods (to record them) before `pods` does, in the
        // plan that comes with the confirmation and in the run.
        calls: &[
            call("job", "kubernetes", "delete HyperPodPyTorchJob"),
            Call {
                after: 2,
                ..call("pods", "kubernetes", "list Pod")
            },
        ],
    },
    Case {
        command: "deploy_model_server",
        given: model_ready,
        request: |_, _, name| {
            let path = format!("/api/v1/clusters/{name}/endpoints");
            // No token: keeping it is the one write before the operation exists, which
            // the plan trial would count as a call outside any step.
            let mut request = model_server();
            request.as_object_mut().unwrap().remove("hf_token");
            (Method::POST, path, request)
        },
        check: |world, hypd, token, name| endpoint(world, hypd, token, name, Some(1), false),
        calls: &[
            call("workload", "kubernetes", "patch Deployment"),
            call("service", "kubernetes", "patch Service"),
            call("ready", "kubernetes", "list Pod"),
        ],
    },
    Case {
        command: "deploy_model_server",
        given: keda_ready,
        request: |_, _, name| {
            let path = format!("/api/v1/clusters/{name}/endpoints");
            (Method::POST, path, routed_server())
        },
        check: routed_endpoint,
        calls: &[
            call("workload", "kubernetes", "patch Deployment"),
            call("router", "kubernetes", "patch ServiceAccount"),
            call("ready", "kubernetes", "list Pod"),
            call("autoscaling", "kubernetes", "patch ScaledObject"),
        ],
    },
    Case {
        command: "deploy_inference_endpoint",
        given: operator_ready,
        request: |_, _, name| {
            let path = format!("/api/v1/clusters/{name}/inference-endpoints");
            let mut request = model_server();
            request.as_object_mut().unwrap().remove("hf_token");
            request["kv_cache"] =
                json!({"l2": {"backend": "redis", "url": "redis://kv.internal:6379"}});
            request["routing"] = json!("prefix_aware");
            (Method::POST, path, request)
        },
        // The operator's Deployment `serve` and Service `serve-service`, made once.
        check: |world, hypd, token, name| endpoint(world, hypd, token, name, Some(1), false),
        calls: &[
            call("config", "kubernetes", "patch InferenceEndpointConfig"),
            call("ready", "kubernetes", "list Pod"),
        ],
    },
    Case {
        command: "deploy_jumpstart_model",
        given: operator_ready,
        request: |_, _, name| {
            let path = format!("/api/v1/clusters/{name}/jumpstart-endpoints");
            // With the operator's router, as the InferenceEndpointConfig case has it.
            let model = json!({"endpoint": "serve", "model_id": "huggingface-llm-qwen2-5-7b-instruct",
                               "routing": "round_robin"});
            (Method::POST, path, model)
        },
        // The operator's Deployment `serve` and Service `serve-service`, made once.
        check: |world, hypd, token, name| endpoint(world, hypd, token, name, Some(1), false),
        calls: &[
            after_preflight("model", "sagemaker", "DescribeHubContent"),
            call("model", "kubernetes", "patch JumpStartModel"),
            call("ready", "kubernetes", "list Pod"),
        ],
    },
    Case {
        command: "assign_pool_workers",
        given: pool_warm,
        request: |_, _, name| {
            let path = format!("/api/v1/clusters/{name}/endpoints/pool/assign");
            (Method::POST, path, json!({ "model": "sql", "count": 1 }))
        },
        check: |world, hypd, token, name| pool_bound(world, hypd, token, name, 1),
        calls: &[
            call("service", "kubernetes", "patch Service"),
            call("workers", "kubernetes", "patch Pod"),
            call("workers", "kubernetes", "get Endpoints"),
        ],
    },
    Case {
        command: "release_pool_workers",
        given: pool_bound_to_sql,
        request: |_, _, name| {
            let path = format!("/api/v1/clusters/{name}/endpoints/pool/release");
            (Method::POST, path, json!({ "model": "sql" }))
        },
        check: |world, hypd, token, name| pool_bound(world, hypd, token, name, 0),
        calls: &[call("workers", "kubernetes", "patch Pod")],
    },
    Case {
        command: "scale_endpoint",
        given: serving,
        request: |_, _, name| {
            let path = format!("/api/v1/clusters/{name}/endpoints/serve/scale");
            (Method::POST, path, json!({ "replicas": 2 }))
        },
        check: |world, hypd, token, name| endpoint(world, hypd, token, name, Some(2), true),
        calls: &[call("replicas", "kubernetes", "patch Deployment")],
    },
    Case {
        command: "delete_endpoint",
        given: serving,
        request: |_, _, name| {
            let path = format!("/api/v1/clusters/{name}/endpoints/serve");
            (Method::DELETE, path, json!({}))
        },
        check: |world, hypd, token, name| endpoint(world, hypd, token, name, None, false),
        calls: &[
            call("service", "kubernetes", "delete Service"),
            call("workload", "kubernetes", "delete Deployment"),
            call("secret", "kubernetes", "delete Secret"),
        ],
    },
];

/// The model server the inference cases deploy: one replica, its token in a Secret.
fn model_server() -> Value {
    json!({"endpoint": "serve", "engine": "vllm", "hf_token": "hf_harnessToken0123456789",
        "command": "vllm serve /s3/models/qwen --served-model-name qwen"})
}

/// SGLang workers `serve` behind the SGLang router, autoscaled by KEDA on the requests
/// in flight and on the request rate (read from a Prometheus server beside the router).
fn routed_server() -> Value {
    json!({"endpoint": "serve", "engine": "sglang", "router": {"policy": "round_robin"},
        "command": "python3 -m sglang.launch_server --model-path /s3/models/qwen --served-model-name qwen",
        // Down to zero, the way that holds requests at the router; after a day idle, so
        // never while a case looks.
        "autoscaling": {"min_replicas": 0, "max_replicas": 2, "cooldown_seconds": 86400,
            "request_rate": {"target_per_replica": 5}}})
}

/// [`model_ready`] with KEDA installed.
fn keda_ready(world: &World, hypd: &Hypd, token: &str, name: &str) {
    model_ready(world, hypd, token, name);
    let path = format!("/api/v1/clusters/{name}/features");
    crate::inference::run_op(hypd, token, &path, json!({ "keda": true }));
}

/// Cluster `name` serves [`routed_server`]: one ready worker, and each object once — the
/// workers', the router's and the Prometheus server's Deployments and Services, its
/// ConfigMap, the router's Role and the ScaledObject.
fn routed_endpoint(world: &World, hypd: &Hypd, token: &str, name: &str) {
    let (status, got) = hypd.call(
        token,
        Method::GET,
        &format!("/api/v1/clusters/{name}/endpoints/serve"),
        None,
    );
    assert_eq!(status, 200, "{got}");
    assert_eq!(
        (got["phase"].as_str(), got["routing"].as_str()),
        (Some("in_service"), Some("round_robin")),
        "{got:#}"
    );
    assert_eq!(got["autoscaling"]["max_replicas"], 2, "{got:#}");
    let counts = tokio::runtime::Runtime::new().unwrap().block_on(async {
        use crate::inference::{names, scaled_objects};
        let client = crate::common::cluster::kube_client(world, name).await;
        let serve = |n: Vec<String>| -> Vec<String> {
            n.into_iter().filter(|n| n.starts_with("serve")).collect()
        };
        [
            serve(names::<k8s_openapi::api::apps::v1::Deployment>(&client).await),
            serve(names::<k8s_openapi::api::core::v1::Service>(&client).await),
            serve(names::<k8s_openapi::api::rbac::v1::Role>(&client).await),
            serve(names::<k8s_openapi::api::core::v1::ConfigMap>(&client).await),
            serve(scaled_objects(&client).await),
        ]
    });
    assert_eq!(
        counts,
        [
            vec!["serve", "serve-prometheus", "serve-router"],
            vec!["serve", "serve-prometheus", "serve-router"],
            vec!["serve-router"],
            vec!["serve-prometheus"],
            vec!["serve"],
        ]
        .map(|v| v.into_iter().map(str::to_owned).collect::<Vec<_>>())
    );
}

/// [`created`] with a model in the shared bucket.
fn model_ready(world: &World, hypd: &Hypd, token: &str, name: &str) {
    created(world, hypd, token, name);
    crate::inference::model_in_bucket(hypd, token, name);
}

/// [`model_ready`] with a model pool `pool` of two free workers serving `base` and the
/// LoRA adapter `sql`.
fn pool_warm(world: &World, hypd: &Hypd, token: &str, name: &str) {
    model_ready(world, hypd, token, name);
    let path = format!("/api/v1/clusters/{name}/endpoints");
    let pool = json!({"endpoint": "pool", "engine": "vllm", "service": "model_pool", "replicas": 2,
        "command": "vllm serve /s3/models/qwen --served-model-name base --enable-lora --lora-modules sql=/s3/models/qwen/sql"});
    crate::inference::run_op(hypd, token, &path, pool);
}

/// [`pool_warm`] with one worker bound to `sql`.
fn pool_bound_to_sql(world: &World, hypd: &Hypd, token: &str, name: &str) {
    pool_warm(world, hypd, token, name);
    let path = format!("/api/v1/clusters/{name}/endpoints/pool/assign");
    crate::inference::run_op(hypd, token, &path, json!({ "model": "sql", "count": 1 }));
}

/// Pool `pool` of cluster `name` has `sql` workers bound to `sql` (and the rest free),
/// its two pods never replaced, and the Service `pool-sql` once.
fn pool_bound(world: &World, hypd: &Hypd, token: &str, name: &str, sql: u32) {
    let (status, got) = hypd.call(
        token,
        Method::GET,
        &format!("/api/v1/clusters/{name}/endpoints/pool"),
        None,
    );
    assert_eq!(status, 200, "{got}");
    assert_eq!(
        got["pool"],
        json!({"models": [{"model": "base", "workers": 0}, {"model": "sql", "workers": sql}],
            "unassigned": 2 - sql}),
        "{got:#}"
    );
    assert_eq!(got["pods"].as_array().map(Vec::len), Some(2), "{got:#}");
    let services = tokio::runtime::Runtime::new().unwrap().block_on(async {
        let client = crate::common::cluster::kube_client(world, name).await;
        Api::<k8s_openapi::api::core::v1::Service>::namespaced(client, "default")
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|s| s.metadata.name.as_deref() == Some("pool-sql"))
            .count()
    });
    assert_eq!(services, 1, "the model's Service, made once");
}

/// [`model_ready`] with the inference operator on.
fn operator_ready(world: &World, hypd: &Hypd, token: &str, name: &str) {
    model_ready(world, hypd, token, name);
    let path = format!("/api/v1/clusters/{name}/features");
    crate::inference::run_op(hypd, token, &path, json!({ "inference_operator": true }));
}

/// [`model_ready`] with the model server of [`model_server`] serving.
fn serving(world: &World, hypd: &Hypd, token: &str, name: &str) {
    model_ready(world, hypd, token, name);
    let path = format!("/api/v1/clusters/{name}/endpoints");
    crate::inference::run_op(hypd, token, &path, model_server());
}

/// Cluster `name` serves endpoint `serve` with `replicas` ready replicas, made once, with
/// its token's Secret if `secret` (or, `None`, has no endpoint, and none of its objects).
fn endpoint(
    world: &World,
    hypd: &Hypd,
    token: &str,
    name: &str,
    replicas: Option<u64>,
    secret: bool,
) {
    let (status, got) = hypd.call(
        token,
        Method::GET,
        &format!("/api/v1/clusters/{name}/endpoints/serve"),
        None,
    );
    let objects = tokio::runtime::Runtime::new().unwrap().block_on(async {
        let client = crate::common::cluster::kube_client(world, name).await;
        let count = |names: Vec<Option<String>>, prefix: &str| {
            names
                .into_iter()
                .flatten()
                .filter(|n| n.starts_with(prefix))
                .count()
        };
        let list = Default::default;
        let d =
            Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(client.clone(), "default")
                .list(&list())
                .await
                .unwrap();
        let s = Api::<k8s_openapi::api::core::v1::Service>::namespaced(client.clone(), "default")
            .list(&list())
            .await
            .unwrap();
        let secrets = Api::<k8s_openapi::api::core::v1::Secret>::namespaced(client, "default")
            .list(&list())
            .await
            .unwrap();
        [
            count(
                d.items.into_iter().map(|x| x.metadata.name).collect(),
                "serve",
            ),
            count(
                s.items.into_iter().map(|x| x.metadata.name).collect(),
                "serve",
            ),
            count(
                secrets.items.into_iter().map(|x| x.metadata.name).collect(),
                "hypd-hf-token-serve",
            ),
        ]
    });
    match replicas {
        Some(n) => {
            assert_eq!(status, 200, "{got}");
            assert_eq!(
                (
                    got["phase"].as_str(),
                    got["ready"].as_u64(),
                    got["pods"].as_array().map(Vec::len)
                ),
                (Some("in_service"), Some(n), Some(n as usize)),
                "{got:#}"
            );
            assert_eq!(
                objects,
                [1, 1, usize::from(secret)],
                "one Deployment and Service, and the Secret if it has a token"
            );
        }
        None => {
            assert_eq!(status, 404, "{got}");
            assert_eq!(objects, [0, 0, 0], "nothing of the endpoint left");
        }
    }
}

/// [`created`] with the training operator on and a script in the shared bucket.
fn training_ready(world: &World, hypd: &Hypd, token: &str, name: &str) {
    created(world, hypd, token, name);
    crate::training::operator_on(hypd, token, name);
    crate::training::upload(hypd, token, name, "scripts/train.py");
}

/// Cluster `name` runs training job `train`, once, with both its pods (or, `present`
/// false, has no training job and no pod of one).
fn training_job(world: &World, hypd: &Hypd, token: &str, name: &str, present: bool) {
    let (status, listed) = hypd.call(
        token,
        Method::GET,
        &format!("/api/v1/clusters/{name}/training-jobs"),
        None,
    );
    assert_eq!(status, 200, "{listed}");
    let jobs = listed["jobs"].as_array().unwrap();
    let pods = tokio::runtime::Runtime::new().unwrap().block_on(async {
        let client = crate::common::cluster::kube_client(world, name).await;
        kube::Api::<k8s_openapi::api::core::v1::Pod>::namespaced(client, "default")
            .list(&kube::api::ListParams::default().labels("hypd.dev/training-job=train"))
            .await
            .unwrap()
            .items
            .len()
    });
    if present {
        assert_eq!(jobs.len(), 1, "{listed:#}");
        assert_eq!(
            (&jobs[0]["job"], &jobs[0]["phase"]),
            (&json!("train"), &json!("running")),
            "{listed:#}"
        );
        assert_eq!(pods, 1);
    } else {
        assert!(jobs.is_empty(), "{listed:#}");
        assert_eq!(pods, 0);
    }
}

/// Cluster `name` has FSx storage `fast` (Bound, on exactly one AVAILABLE file system
/// with at most one link), or (`present` false) no such storage and no file system.
fn fsx_storage(world: &World, hypd: &Hypd, token: &str, name: &str, present: bool) {
    let (status, listed) = hypd.call(
        token,
        Method::GET,
        &format!("/api/v1/clusters/{name}/storage"),
        None,
    );
    assert_eq!(status, 200, "{listed}");
    let fast: Vec<&Value> = listed["storage"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["name"] == "fast")
        .collect();
    let (file_systems, links) = crate::storage::fsx_of(world, name, "fast");
    if present {
        assert_eq!(fast.len(), 1, "{listed:#}");
        assert_eq!(fast[0]["phase"], "Bound", "{listed:#}");
        assert_eq!(file_systems.len(), 1, "one file system: {file_systems:?}");
        assert_eq!(file_systems[0].1, "AVAILABLE");
        assert_eq!(fast[0]["file_system"], file_systems[0].0, "{listed:#}");
        assert!(links.len() <= 1, "one link at most: {links:?}");
    } else {
        assert!(fast.is_empty(), "{listed:#}");
        assert!(file_systems.is_empty(), "{file_systems:?}");
    }
}

/// The cases to run: all, or those `HYPD_HARNESS_CASES` names (comma-separated
/// commands), to try one pipeline's cases while working on it.
fn cases() -> impl Iterator<Item = &'static Case> {
    let only = std::env::var("HYPD_HARNESS_CASES").ok();
    CASES.iter().filter(move |c| {
        only.as_deref()
            .is_none_or(|o| o.split(',').any(|n| n.trim() == c.command))
    })
}

/// `action` (reboot, replace, delete) on the first node of cluster `name`.
fn node_action(hypd: &Hypd, token: &str, name: &str, action: &str) -> (Method, String, Value) {
    let (status, nodes) = hypd.call(
        token,
        Method::GET,
        &format!("/api/v1/clusters/{name}/nodes"),
        None,
    );
    assert_eq!(status, 200, "{nodes}");
    let first = nodes["nodes"][0]["node_id"].clone();
    let path = format!("/api/v1/clusters/{name}/nodes/{action}");
    (Method::POST, path, json!({ "node_ids": [first] }))
}

/// Cluster `name` has `count` nodes, every one Running and Ready, its group's count is
/// `count`, and drift finds nothing.
fn nodes_back(world: &World, hypd: &Hypd, token: &str, name: &str, count: i32) {
    assert_eq!(groups(world, name), [("gpu".to_owned(), count)]);
    let (status, nodes) = hypd.call(
        token,
        Method::GET,
        &format!("/api/v1/clusters/{name}/nodes"),
        None,
    );
    assert_eq!(status, 200, "{nodes}");
    assert_eq!(nodes["counts"]["healthy"], count, "{nodes:#}");
    assert!(
        nodes["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .all(|n| n["ready"] == true),
        "{nodes:#}"
    );
    undrifted(hypd, token, name);
}

/// The group the instance-group cases add: one spot instance.
fn spot() -> Value {
    json!({"name": "spot", "instance_type": "ml.g5.8xlarge", "instance_count": 1,
           "capacity": {"type": "spot"}})
}

/// HyperPod's groups of cluster `name` (name, target count), as DescribeCluster gives
/// them.
pub fn groups(world: &World, name: &str) -> Vec<(String, i32)> {
    let body =
        crate::common::cluster::sagemaker(world, "DescribeCluster", json!({ "ClusterName": name }));
    body["InstanceGroups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| {
            (
                g["InstanceGroupName"].as_str().unwrap().to_owned(),
                g["TargetCount"].as_i64().unwrap() as i32,
            )
        })
        .collect()
}

/// get_drift finds nothing: the cluster is as its creation and group changes made it.
fn undrifted(hypd: &Hypd, token: &str, name: &str) {
    let (status, drift) = hypd.call(
        token,
        Method::GET,
        &format!("/api/v1/clusters/{name}/drift"),
        None,
    );
    assert_eq!(status, 200, "{drift}");
    assert_eq!(drift["drifted"], json!([]), "{drift:#}");
}

/// Cluster `name`, created through REST and complete.
fn created(world: &World, hypd: &Hypd, token: &str, name: &str) {
    created_from(
        world,
        hypd,
        token,
        name,
        crate::common::cluster::small(name),
    );
}

/// [`created`] with a second group, at 0 and without deep health checks: one managed
/// Karpenter may scale.
fn created_with_burst(world: &World, hypd: &Hypd, token: &str, name: &str) {
    let mut body = crate::common::cluster::small(name);
    body["instance_groups"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "burst", "instance_type": "ml.g5.8xlarge", "instance_count": 0}));
    created_from(world, hypd, token, name, body);
}

fn created_from(world: &World, hypd: &Hypd, token: &str, name: &str, body: Value) {
    crate::common::cluster::created(hypd, token, body);
    crate::common::cluster::assert_complete(&crate::common::cluster::count(world, name));
}

/// Changes cluster `name` outside hypd as a person would, with the AWS SDK and a
/// Kubernetes client: a revoked security-group rule, a detached role policy, a deleted
/// add-on, a deleted node component, node recovery turned off, a relabelled claim: one
/// thing in each stage a reconcile changes.
pub fn drift(world: &World, name: &str) {
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let conf = world.moto_sdk().await;
        let ec2 = aws_sdk_ec2::Client::new(&conf);
        let groups = ec2
            .describe_security_groups()
            .filters(
                aws_sdk_ec2::types::Filter::builder()
                    .name("group-name")
                    .values(format!("hypd-{name}-efa"))
                    .build(),
            )
            .send()
            .await
            .unwrap();
        let id = groups.security_groups()[0].group_id().unwrap().to_owned();
        ec2.revoke_security_group_ingress()
            .group_id(&id)
            .ip_permissions(
                aws_sdk_ec2::types::IpPermission::builder()
                    .ip_protocol("-1")
                    .user_id_group_pairs(
                        aws_sdk_ec2::types::UserIdGroupPair::builder()
                            .group_id(&id)
                            .build(),
                    )
                    .build(),
            )
            .send()
            .await
            .unwrap();
        aws_sdk_iam::Client::new(&conf)
            .detach_role_policy()
            .role_name(format!("hypd-{name}-eks"))
            .policy_arn("arn:aws:iam::aws:policy/AmazonEKSClusterPolicy")
            .send()
            .await
            .unwrap();
        let sim = aws_sdk_eks::config::Builder::from(&conf)
            .endpoint_url(&world.sim.url)
            .build();
        let eks = aws_sdk_eks::Client::from_conf(sim);
        eks.delete_addon()
            .cluster_name(name)
            .addon_name("metrics-server")
            .send()
            .await
            .unwrap();
        let sim = aws_sdk_sagemaker::config::Builder::from(&conf)
            .endpoint_url(&world.sim.url)
            .build();
        let sagemaker = aws_sdk_sagemaker::Client::from_conf(sim);
        sagemaker
            .update_cluster()
            .cluster_name(name)
            .node_recovery(aws_sdk_sagemaker::types::ClusterNodeRecovery::None)
            .send()
            .await
            .unwrap();
        // Settled, as a person finds it later: the add-on gone, HyperPod in service.
        let start = std::time::Instant::now();
        loop {
            let addon = eks
                .describe_addon()
                .cluster_name(name)
                .addon_name("metrics-server")
                .send()
                .await;
            let status = sagemaker
                .describe_cluster()
                .cluster_name(name)
                .send()
                .await
                .unwrap()
                .cluster_status;
            if addon.is_err() && status == Some(aws_sdk_sagemaker::types::ClusterStatus::Inservice)
            {
                break;
            }
            assert!(start.elapsed().as_secs() < 60, "the drift did not settle");
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        let client = crate::common::cluster::kube_client(world, name).await;
        Api::<DaemonSet>::namespaced(client.clone(), "aws-hyperpod")
            .delete("health-monitoring-agent", &DeleteParams::default())
            .await
            .unwrap();
        Api::<PersistentVolumeClaim>::namespaced(client, "default")
            .patch(
                "shared-s3",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {"hypd/storage": "edited"}}})),
            )
            .await
            .unwrap();
    });
}

/// An EKS cluster made outside hypd, on subnets that exist (the world checks them).
fn existing_eks(world: &World, name: &str) {
    let role = format!("their-eks-role-{name}");
    let (role_arn, subnets): (String, Vec<String>) =
        tokio::runtime::Runtime::new().unwrap().block_on(async {
            let conf = world.moto_sdk().await;
            let role_arn = aws_sdk_iam::Client::new(&conf)
                .create_role()
                .role_name(&role)
                .assume_role_policy_document(
                    json!({"Version": "2012-10-17", "Statement": [{"Effect": "Allow",
                       "Principal": {"Service": "eks.amazonaws.com"}, "Action": "sts:AssumeRole"}]})
                    .to_string(),
                )
                .send()
                .await
                .unwrap()
                .role()
                .unwrap()
                .arn()
                .to_owned();
            let ec2 = aws_sdk_ec2::Client::new(&conf);
            let vpc = ec2
                .create_vpc()
                .cidr_block("10.200.0.0/16")
                .send()
                .await
                .unwrap();
            let vpc = vpc.vpc().unwrap().vpc_id().unwrap().to_owned();
            let mut ids = Vec::new();
            for (i, az) in ["us-east-1a", "us-east-1b"].iter().enumerate() {
                let s = ec2
                    .create_subnet()
                    .vpc_id(&vpc)
                    .cidr_block(format!("10.200.{i}.0/24"))
                    .availability_zone(*az)
                    .send()
                    .await
                    .unwrap();
                ids.push(s.subnet().unwrap().subnet_id().unwrap().to_owned());
            }
            (role_arn, ids)
        });
    let (status, body) = world.sim.call(
        Method::POST,
        "/clusters",
        Some(json!({
            "name": name,
            "roleArn": role_arn,
            "resourcesVpcConfig": { "subnetIds": subnets },
            "accessConfig": { "authenticationMode": "API_AND_CONFIG_MAP" },
        })),
    );
    assert_eq!(status, 200, "{body}");
    wait_until("EKS ACTIVE", std::time::Duration::from_secs(30), || {
        eks_status(world, name) == "ACTIVE"
    });
}

/// The one world every scenario shares: moto behind the sim, quotas for many clusters
/// at once.
fn world() -> World {
    let world = World::start_checked(FAST);
    let (status, _) = world.sim.call(
        Method::PUT,
        "/_sim/sagemaker/quotas",
        Some(json!({"ml.g5.8xlarge": 1000})),
    );
    assert!(status < 300);
    world
}

/// The command as a cluster name's start: `delete-instance-group`… (unique: several
/// commands share a verb); a command's second case on gets its number
/// (`update-features-2`), since the cases share a world.
fn short(case: &Case) -> String {
    let base = case.command.replace('_', "-");
    let nth = CASES
        .iter()
        .filter(|c| c.command == case.command)
        .position(|c| std::ptr::eq(c, case))
        .unwrap_or(0);
    match nth {
        0 => base,
        n => format!("{base}-{}", n + 1),
    }
}

/// What the harness does to a pipeline in one scenario.
#[derive(Clone, Copy)]
enum Trial {
    /// A dry run, then the run: each stage's mutating calls change exactly the kinds of
    /// objects its part of the plan lists.
    SameCode,
    /// The call fails with a provider's refusal: the operation fails in the stage,
    /// keeping the code and message, and `retry_operation` finishes it.
    Failure(&'static Call),
    /// hypd is killed while the call is in flight; a restart on the same store resumes.
    Crash(&'static Call),
    /// The call is carried out but its answer lost: the stage runs again and adopts
    /// what the first run made.
    LostAnswer(&'static Call),
}

struct Scenario {
    case: &'static Case,
    trial: Trial,
}

impl Scenario {
    /// Every scenario of the cases to run: for each pipeline, the same-code run, then
    /// each of its faulted calls as a failure, a crash and a lost answer.
    fn all() -> Vec<Scenario> {
        let mut all = Vec::new();
        for case in cases() {
            all.push(Scenario {
                case,
                trial: Trial::SameCode,
            });
            for trial in [Trial::Failure, Trial::Crash, Trial::LostAnswer] {
                all.extend(case.calls.iter().map(|c| Scenario {
                    case,
                    trial: trial(c),
                }));
            }
        }
        all
    }

    fn call(&self) -> Option<&'static Call> {
        match self.trial {
            Trial::SameCode => None,
            Trial::Failure(c) | Trial::Crash(c) | Trial::LostAnswer(c) => Some(c),
        }
    }

    /// The cluster it works on, unique in the world: `{command}-{trial}-{stage}`, with a
    /// number for each call when a stage has several faulted calls (every one numbered:
    /// no name may start another's, since a cluster's objects are found by the prefix
    /// `hypd-{name}-`).
    fn cluster(&self) -> String {
        let kind = match self.trial {
            Trial::SameCode => return format!("{}-same", short(self.case)),
            Trial::Failure(_) => "f",
            Trial::Crash(_) => "k",
            Trial::LostAnswer(_) => "l",
        };
        let c = self.call().unwrap();
        let same_stage = || self.case.calls.iter().filter(|x| x.stage == c.stage);
        let before = same_stage().take_while(|x| !std::ptr::eq(*x, c)).count();
        // Stage names may hold underscores, which cluster names may not.
        let stage = c.stage.replace('_', "-");
        match same_stage().count() {
            1 => format!("{}-{kind}-{stage}", short(self.case)),
            _ => format!("{}-{kind}-{stage}-{}", short(self.case), before + 1),
        }
    }

    /// How a failure names it: pipeline, stage and what was done to which call.
    fn describe(&self) -> String {
        let command = self.case.command;
        let cluster = self.cluster();
        match self.trial {
            Trial::SameCode => format!("{command} (same code as its plan, cluster {cluster})"),
            Trial::Failure(c) | Trial::Crash(c) | Trial::LostAnswer(c) => {
                let what = match self.trial {
                    Trial::Failure(_) => "a provider failure of",
                    Trial::Crash(_) => "a crash of hypd during",
                    _ => "a lost answer of",
                };
                format!(
                    "{command} {}: {what} {} {} (cluster {cluster})",
                    c.stage, c.service, c.operation
                )
            }
        }
    }

    /// Runs it on a tenant of its own (its own hypd, store and access key), then takes
    /// its cluster out of the world.
    fn run(&self, world: &World, key: &str) {
        let mut t = world.tenant(key);
        let name = self.cluster();
        (self.case.given)(world, t.hypd(), &t.token, &name);
        match self.trial {
            Trial::SameCode => same_code(self.case, &t, &name),
            Trial::Failure(c) => failure(self.case, c, &t, &name),
            Trial::Crash(c) => crash(self.case, c, &mut t, &name),
            Trial::LostAnswer(c) => lost_answer(self.case, c, &t, &name),
        }
        (self.case.check)(world, t.hypd(), &t.token, &name);
        t.forget_cluster(&name);
    }
}

fn started(case: &Case, t: &Tenant, name: &str) -> String {
    let (method, path, body) = (case.request)(t.hypd(), &t.token, name);
    let (status, body) = t.hypd().confirmed(&t.token, method, &path, Some(body));
    assert_eq!(status, 200, "{}: {body}", case.command);
    body["operation_id"].as_str().unwrap().to_owned()
}

/// The plan preview of what [`started`] would start.
fn planned(case: &Case, t: &Tenant, name: &str) -> Value {
    let (method, path, mut body) = (case.request)(t.hypd(), &t.token, name);
    body["dry_run"] = json!(true);
    let (status, body) = t.hypd().call(&t.token, method, &path, Some(body));
    assert_eq!(status, 200, "{} dry run: {body}", case.command);
    body["plan"].clone()
}

/// The same code, stage by stage: the mutating calls each stage's step made (told
/// apart by the user agent every step's calls carry, `app/hypd.<operation>.<stage>`)
/// change exactly the kinds of objects that stage's part of the plan preview of the
/// same world lists; a stage planned with no change makes no mutating call, and nothing
/// outside a step changes anything.
fn same_code(case: &Case, t: &Tenant, name: &str) {
    let plan = planned(case, t, name);
    t.clear_calls();
    let id = started(case, t, name);
    let op = t.hypd().finish(&t.token, &id);
    assert_eq!(op["state"], "succeeded", "{}: {op:#}", case.command);
    let calls = crate::common::cluster::mutating(&t.calls());
    let prefix = format!("hypd.{id}.");
    let mut by_stage = std::collections::BTreeMap::<String, BTreeSet<String>>::new();
    for (agent, service, operation) in calls {
        let stage = agent
            .as_deref()
            .and_then(|a| a.strip_prefix(&prefix))
            .unwrap_or_else(|| {
                panic!(
                    "{}: {service} {operation} was called outside a step (agent {agent:?})",
                    case.command
                )
            });
        let kind =
            crate::common::cluster::changed_kind(&service, &operation).unwrap_or_else(|| {
                panic!(
                    "{} {stage} called {service} {operation}, which no plan change names",
                    case.command
                )
            });
        by_stage.entry(stage.to_owned()).or_default().insert(kind);
    }
    for s in plan["stages"].as_array().unwrap() {
        let stage = s["stage"].as_str().unwrap();
        let listed: BTreeSet<String> = s["changes"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| matches!(c["action"].as_str(), Some("create" | "update" | "delete")))
            .map(|c| crate::common::cluster::plan_kind(c["kind"].as_str().unwrap()))
            .filter(|k| !k.starts_with("hypd:"))
            .collect();
        let called = by_stage.remove(stage).unwrap_or_default();
        assert_eq!(
            called, listed,
            "{} {stage}: the kinds its calls changed, then the kinds its plan lists: {s:#}",
            case.command
        );
    }
    assert!(
        by_stage.is_empty(),
        "{}: stages the plan does not list made calls: {by_stage:?}",
        case.command
    );
}

fn failure(case: &Case, c: &Call, t: &Tenant, name: &str) {
    let message = format!("injected into {}", c.operation);
    // A refusal: Kubernetes' status reasons are a closed set.
    let (code, status) = match c.service {
        "kubernetes" => ("Forbidden", 403),
        _ => ("InjectedFault", 400),
    };
    t.fault(
        json!({"service": c.service, "operation": c.operation, "kind": "error",
               "code": code, "status": status, "message": message, "after": c.after}),
    );
    let (hypd, token) = (t.hypd(), t.token.as_str());
    let id = started(case, t, name);
    let op = hypd.finish(token, &id);
    let at = format!("{} {}", case.command, c.stage);
    assert_eq!(op["state"], "failed", "{at}: {op:#}");
    let failed = stage(&op, c.stage);
    assert_eq!(failed["state"], "failed", "{at}: {op:#}");
    assert_eq!(failed["error"]["code"], code, "{at}: {op:#}");
    assert_eq!(failed["error"]["transient"], false, "{at}: {op:#}");
    assert!(
        failed["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with(&message),
        "{at}: {op:#}"
    );
    // What a retry would do, first: the stages left, the failed one's change among
    // them; the operation stays failed.
    let retry = format!("/api/v1/operations/{id}/retry");
    let (status, dry) = hypd.call(token, Method::POST, &retry, Some(json!({"dry_run": true})));
    assert_eq!(status, 200, "{at}: {dry}");
    let left: Vec<&Value> = op["stages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["state"] != "succeeded")
        .map(|s| &s["name"])
        .collect();
    let planned: Vec<&Value> = dry["plan"]["stages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| &s["stage"])
        .collect();
    assert_eq!(planned, left, "{at}: {dry:#}");
    if let Some(kind) = crate::common::cluster::changed_kind(c.service, c.operation) {
        assert!(
            dry["plan"]["stages"][0]["changes"]
                .as_array()
                .unwrap()
                .iter()
                .any(|ch| crate::common::cluster::plan_kind(ch["kind"].as_str().unwrap()) == kind),
            "{at}: the failed call's {kind} in {dry:#}"
        );
    }
    assert_eq!(get_op(hypd, token, &id)["state"], "failed", "{at}");
    let (status, _) = hypd.call(token, Method::POST, &retry, Some(json!({})));
    assert_eq!(status, 200);
    let op = hypd.finish(token, &id);
    assert_eq!(op["state"], "succeeded", "{at} after retry: {op:#}");
}

fn crash(case: &Case, c: &Call, t: &mut Tenant, name: &str) {
    // The call is held in flight; hypd dies while the stage is running it.
    t.clear_calls();
    let hold = t.fault(
        json!({"service": c.service, "operation": c.operation, "kind": "delay", "seconds": 30,
               "after": c.after}),
    );
    let id = started(case, t, name);
    let at = format!("{} {}", case.command, c.stage);
    // The sim logs a call as it takes its fault, before holding it: once the log has
    // the held call, hypd is inside it.
    let held = |t: &Tenant| {
        t.calls()
            .iter()
            .filter(|x| x["service"] == c.service && x["operation"] == c.operation)
            .count()
            > c.after as usize
    };
    wait_until(
        &format!("{at}: the held call in flight"),
        std::time::Duration::from_secs(120),
        || held(t),
    );
    let op = get_op(t.hypd(), &t.token, &id);
    assert!(
        matches!(
            stage(&op, c.stage)["state"].as_str(),
            Some("running" | "waiting")
        ),
        "{at}: the held call is the stage's: {op:#}"
    );
    t.crash_and_restart();
    t.remove_fault(hold);
    let op = t.hypd().finish(&t.token, &id);
    assert_eq!(op["state"], "succeeded", "{at} after a crash: {op:#}");
    // What finished before the crash is not run again.
    let runs = crate::runs_per_stage(&crate::transitions(&crate::sqlite_path(t.hypd()), &id));
    for s in op["stages"].as_array().unwrap() {
        let name = s["name"].as_str().unwrap();
        if name == c.stage {
            break;
        }
        assert_eq!(
            runs.get(&(name.to_owned(), "succeeded".to_owned())),
            Some(&1),
            "{at}: {name} ran again: {runs:?}"
        );
    }
}

fn lost_answer(case: &Case, c: &Call, t: &Tenant, name: &str) {
    t.clear_calls();
    t.fault(
        json!({"service": c.service, "operation": c.operation, "kind": "lost", "after": c.after}),
    );
    let id = started(case, t, name);
    let op = t.hypd().finish(&t.token, &id);
    let at = format!("{} {}", case.command, c.stage);
    assert_eq!(op["state"], "succeeded", "{at}: {op:#}");
    let s = stage(&op, c.stage);
    assert!(
        s["attempts"].as_u64().unwrap() >= 2,
        "{at}: the stage ran again after the lost answer: {s}"
    );
    // The call whose answer was lost was carried out: run again, the stage finds it
    // done (a reboot by the node's new boot id) and does not repeat it.
    if c.once {
        let agent = format!("hypd.{id}.{}", c.stage);
        let repeated = crate::common::cluster::mutating(&t.calls())
            .into_iter()
            .filter(|(a, service, operation)| {
                a.as_deref() == Some(agent.as_str())
                    && *service == c.service
                    && *operation == c.operation
            })
            .count();
        assert!(repeated <= 1, "{at}: {} made {repeated} times", c.operation);
    }
}

/// A positive number from the environment, else `default`.
fn setting(var: &str, default: usize) -> usize {
    std::env::var(var)
        .ok()
        .and_then(|n| n.parse().ok())
        .filter(|n| *n > 0)
        .unwrap_or(default)
}

/// Scenarios run at once (`HYPD_HARNESS_CONCURRENCY`, default 12): each mostly waits on
/// the sim's clock and hypd's polls, so many at once fill the CPU.
fn concurrency() -> usize {
    setting("HYPD_HARNESS_CONCURRENCY", 12)
}

/// Worlds the scenarios are spread over (`HYPD_HARNESS_WORLDS`, default 4): moto answers
/// one call at a time (Python's lock), and its filters scan every object it holds, so
/// each moto serving a quarter of the scenarios keeps it off the critical path (with
/// two, moto spent a fifth more CPU and the run took 10 % longer).
fn worlds() -> usize {
    setting("HYPD_HARNESS_WORLDS", 4)
}

/// What became of one scenario.
struct Outcome {
    trial: &'static str,
    what: String,
    took: std::time::Duration,
    failure: Option<String>,
}

const SAME_CODE: &str = "same code";
const FAILURE: &str = "failure";
const CRASH: &str = "crash";
const LOST_ANSWER: &str = "lost answer";

impl Trial {
    fn name(&self) -> &'static str {
        match self {
            Trial::SameCode => SAME_CODE,
            Trial::Failure(_) => FAILURE,
            Trial::Crash(_) => CRASH,
            Trial::LostAnswer(_) => LOST_ANSWER,
        }
    }
}

/// Every scenario of every trial, run once for the four tests below, many at once in
/// shared worlds: whichever test asks first runs them all, the others wait for the
/// outcomes. Each scenario is isolated by its tenant: its own hypd and store, and its
/// own access key, by which the sim scopes the faults it is given and the calls it is
/// shown; its cluster's name is its own, and it takes its cluster out of the world when
/// done.
fn outcomes() -> &'static [Outcome] {
    static OUTCOMES: std::sync::OnceLock<Vec<Outcome>> = std::sync::OnceLock::new();
    OUTCOMES.get_or_init(run_all)
}

fn run_all() -> Vec<Outcome> {
    let worlds: Vec<World> = std::thread::scope(|s| {
        let started: Vec<_> = (0..worlds()).map(|_| s.spawn(world)).collect();
        started.into_iter().map(|w| w.join().unwrap()).collect()
    });
    // The longest first (a features change runs several operators' installs), so the
    // last scenarios to start are short ones.
    let mut scenarios = Scenario::all();
    scenarios.reverse();
    let next = std::sync::atomic::AtomicUsize::new(0);
    let outcomes = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..concurrency().min(scenarios.len()) {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    let Some(scenario) = scenarios.get(i) else {
                        return;
                    };
                    let started = std::time::Instant::now();
                    let key = format!("AKIDHARNESS{i:09}");
                    let world = &worlds[i % worlds.len()];
                    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        scenario.run(world, &key)
                    }));
                    let failure = outcome.err().map(|panic| {
                        panic
                            .downcast_ref::<String>()
                            .cloned()
                            .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                            .unwrap_or_default()
                    });
                    outcomes.lock().unwrap().push(Outcome {
                        trial: scenario.trial.name(),
                        what: scenario.describe(),
                        took: started.elapsed(),
                        failure,
                    });
                }
            });
        }
    });
    outcomes.into_inner().unwrap()
}

/// Every failure of `trial`'s scenarios, each naming the pipeline, the stage and what
/// was done to which call (every one, not only the first), with the slowest shown.
fn assert_trial(trial: &str) {
    let mut mine: Vec<&Outcome> = outcomes().iter().filter(|o| o.trial == trial).collect();
    assert!(
        !mine.is_empty() || cases().next().is_none(),
        "no {trial} scenario ran"
    );
    mine.sort_by_key(|o| std::cmp::Reverse(o.took));
    println!("{} {trial} scenarios; the slowest:", mine.len());
    for o in mine.iter().take(5) {
        println!("  {:>6.1} s  {}", o.took.as_secs_f64(), o.what);
    }
    let failed: Vec<String> = mine
        .iter()
        .filter_map(|o| Some(format!("{}: {}", o.what, o.failure.as_ref()?)))
        .collect();
    assert!(
        failed.is_empty(),
        "{} of {} scenarios failed:\n{}",
        failed.len(),
        mine.len(),
        failed.join("\n\n")
    );
}

/// The same code, stage by stage: for every pipeline, the mutating calls each stage's
/// step made change exactly the kinds of objects that stage's part of the plan preview
/// of the same world lists; a stage planned with no change makes no mutating call, and
/// nothing outside a step changes anything.
#[test]
fn each_stage_changes_exactly_what_its_plan_lists() {
    assert_trial(SAME_CODE);
}

#[test]
fn a_provider_failure_in_each_stage_fails_it_and_retry_finishes() {
    assert_trial(FAILURE);
}

#[test]
fn a_crash_in_each_stage_resumes_and_makes_nothing_twice() {
    assert_trial(CRASH);
}

#[test]
fn a_lost_answer_in_each_stage_runs_it_again_and_makes_nothing_new() {
    assert_trial(LOST_ANSWER);
}
