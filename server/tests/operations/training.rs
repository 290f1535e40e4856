//! Training jobs through REST against moto + hypd-sim: the pre-flight's verdicts (the
//! operator off, the script missing, too many processes, elastic on spot), a dry run
//! showing the object as applied, a PyTorch job whose pods run on the group's nodes with
//! its GPUs, EFA and the shared bucket at /s3, failures spending the recovery budget as
//! the ledger shows, the budget running out failing the job with the reason, and the
//! job deleted with its pods.

use base64::Engine;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use reqwest::Method;
use serde_json::{Value, json};

use crate::FAST;
use crate::common::Hypd;
use crate::common::cluster::{kube_client, small, world_with_cluster};

/// Puts `key` in the shared bucket through hypd, as a user would from the Storage tab.
pub fn upload(hypd: &Hypd, token: &str, name: &str, key: &str) {
    let (status, put) = hypd.call(
        token,
        Method::POST,
        &format!("/api/v1/clusters/{name}/storage/shared-s3/files"),
        Some(json!({"key": key, "content_base64":
            base64::engine::general_purpose::STANDARD.encode("import torch\nprint('step 1 loss=2.5')\n")})),
    );
    assert_eq!(status, 200, "{put}");
}

/// Turns the training operator on.
pub fn operator_on(hypd: &Hypd, token: &str, name: &str) {
    let (status, started) = hypd.call(
        token,
        Method::POST,
        &format!("/api/v1/clusters/{name}/features"),
        Some(json!({"training_operator": true})),
    );
    assert_eq!(status, 200, "{started}");
    let op = hypd.finish(token, started["operation_id"].as_str().unwrap());
    assert_eq!(op["state"], "succeeded", "{op:#}");
}

fn verdicts(checks: &Value) -> Vec<(String, bool)> {
    checks["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            (
                v["check"].as_str().unwrap().to_owned(),
                v["passed"].as_bool().unwrap(),
            )
        })
        .collect()
}

fn failed(checks: &Value) -> Vec<String> {
    verdicts(checks)
        .into_iter()
        .filter(|(_, ok)| !ok)
        .map(|(c, _)| c)
        .collect()
}

async fn annotate(world: &crate::common::World, name: &str, job: &str, annotations: Value) {
    let client = kube_client(world, name).await;
    let gvk = GroupVersionKind::gvk("sagemaker.amazonaws.com", "v1", "HyperPodPyTorchJob");
    let ar = ApiResource::from_gvk_with_plural(&gvk, "hyperpodpytorchjobs");
    let jobs: Api<DynamicObject> = Api::namespaced_with(client, "default", &ar);
    jobs.patch(
        job,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": annotations}})),
    )
    .await
    .unwrap();
}

fn get_job(hypd: &Hypd, token: &str, name: &str, job: &str) -> Value {
    let (status, got) = hypd.call(
        token,
        Method::GET,
        &format!("/api/v1/clusters/{name}/training-jobs/{job}"),
        None,
    );
    assert_eq!(status, 200, "{got}");
    got
}

fn wait_for_job(
    hypd: &Hypd,
    token: &str,
    name: &str,
    job: &str,
    what: &str,
    done: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let got = get_job(hypd, token, name, job);
        if done(&got) {
            return got;
        }
        assert!(std::time::Instant::now() < deadline, "{what}: {got:#}");
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

#[test]
fn a_training_job_runs_spends_its_budget_as_the_ledger_shows_and_is_deleted() {
    let name = "ml-train";
    let (world, hypd, token, _) = world_with_cluster(FAST, json!({}), small(name));
    let rt = tokio::runtime::Runtime::new().unwrap();
    let jobs = format!("/api/v1/clusters/{name}/training-jobs");
    let body = json!({"job": "sft", "nodes": 2,
        "recipe": {"kind": "pytorch", "script": "/s3/scripts/train.py", "args": ["--epochs", "1"]},
        "recovery": {"job_max_retry_count": 3, "restarts_before_full_job_restart": 5}});

    // Nothing is ready: the operator is off and the script not uploaded; both say so, by
    // field, in the check and in the refusal alike.
    let (status, checks) = hypd.call(
        &token,
        Method::POST,
        &format!("{jobs}/check"),
        Some(body.clone()),
    );
    assert_eq!(status, 200, "{checks}");
    assert_eq!(checks["ready"], false);
    assert_eq!(failed(&checks), ["feature", "file"], "{checks:#}");
    let (status, refused) = hypd.call(&token, Method::POST, &jobs, Some(body.clone()));
    assert_eq!(status, 422, "{refused}");
    let fields: Vec<&str> = refused["error"]["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["field"].as_str().unwrap())
        .collect();
    assert_eq!(fields, ["name", "recipe.script"], "{refused:#}");
    assert!(refused.to_string().contains("update_features"), "{refused}");

    operator_on(&hypd, &token, name);
    upload(&hypd, &token, name, "scripts/train.py");

    // More processes than the type has GPUs, and elastic below the nodes asked for.
    let mut too_many = body.clone();
    too_many["processes_per_node"] = json!(4);
    let (_, checks) = hypd.call(
        &token,
        Method::POST,
        &format!("{jobs}/check"),
        Some(too_many),
    );
    assert_eq!(failed(&checks), ["gpus"], "{checks:#}");
    let mut elastic = body.clone();
    elastic["elastic"] = json!({"min_nodes": 3, "max_nodes": 4});
    let (status, refused) = hypd.call(&token, Method::POST, &jobs, Some(elastic));
    assert_eq!(
        (status, &refused["error"]["errors"][0]["field"]),
        (422, &json!("nodes")),
        "{refused}"
    );

    let (status, checks) = hypd.call(
        &token,
        Method::POST,
        &format!("{jobs}/check"),
        Some(body.clone()),
    );
    assert_eq!(status, 200, "{checks}");
    assert_eq!(checks["ready"], true, "{checks:#}");

    // The dry run shows the object's spec as it will be applied.
    let mut dry = body.clone();
    dry["dry_run"] = json!(true);
    let (status, plan) = hypd.call(&token, Method::POST, &jobs, Some(dry));
    assert_eq!(status, 200, "{plan}");
    let change = &plan["plan"]["stages"][0]["changes"][0];
    assert_eq!(
        change["kind"], "k8s:sagemaker.amazonaws.com/v1/HyperPodPyTorchJob",
        "{plan:#}"
    );
    let spec = &change["fields"][0]["new"];
    let container = &spec["replicaSpecs"][0]["template"]["spec"]["containers"][0];
    assert_eq!(
        container["resources"]["requests"],
        json!({"nvidia.com/gpu": "1", "vpc.amazonaws.com/efa": "1"})
    );
    assert_eq!(spec["runPolicy"]["jobMaxRetryCount"], 3);

    let (status, started) = hypd.call(&token, Method::POST, &jobs, Some(body.clone()));
    assert_eq!(status, 200, "{started}");
    let op = hypd.finish(&token, started["operation_id"].as_str().unwrap());
    assert_eq!(op["state"], "succeeded", "{op:#}");
    assert_eq!(
        (&op["outputs"]["running"], &op["outputs"]["instance_group"]),
        (&json!(2), &json!("gpu")),
        "{op:#}"
    );

    // kubectl's view: the pods run on the group's two nodes, one each, with the bucket at
    // /s3 and the GPUs and EFA of the type.
    let pods: Vec<Pod> = rt.block_on(async {
        let client = kube_client(&world, name).await;
        Api::<Pod>::namespaced(client, "default")
            .list(&ListParams::default().labels("hypd.dev/training-job=sft"))
            .await
            .unwrap()
            .items
    });
    assert_eq!(pods.len(), 2);
    let nodes: std::collections::BTreeSet<String> = pods
        .iter()
        .map(|p| p.spec.as_ref().unwrap().node_name.clone().unwrap())
        .collect();
    assert_eq!(nodes.len(), 2, "one pod per node");
    let pod = serde_json::to_value(&pods[0]).unwrap();
    assert_eq!(
        pod["spec"]["containers"][0]["volumeMounts"][0]["mountPath"],
        "/s3"
    );
    assert_eq!(
        pod["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"],
        "shared-s3"
    );

    let (status, listed) = hypd.call(&token, Method::GET, &jobs, None);
    assert_eq!(status, 200, "{listed}");
    assert_eq!(
        (
            &listed["jobs"][0]["job"],
            &listed["jobs"][0]["recipe"],
            &listed["jobs"][0]["phase"]
        ),
        (&json!("sft"), &json!("pytorch"), &json!("running")),
        "{listed:#}"
    );

    // Two failures: two units of the budget, each with its pod, node and exit code.
    rt.block_on(annotate(
        &world,
        name,
        "sft",
        json!({"sim.hypd.dev/exit-code": "3", "sim.hypd.dev/failures": "2"}),
    ));
    let got = wait_for_job(
        &hypd,
        &token,
        name,
        "sft",
        "two restarts, then running",
        |j| j["recovery"]["restarts_used"] == 2 && j["phase"] == "running",
    );
    let ledger = &got["recovery"];
    assert_eq!(
        (&ledger["restarts_left"], &got["attempt"]),
        (&json!(1), &json!(3)),
        "{got:#}"
    );
    let entries = ledger["entries"].as_array().unwrap();
    assert_eq!(entries.len(), 2, "{got:#}");
    for (i, e) in entries.iter().enumerate() {
        assert_eq!(
            (&e["action"], &e["exit_code"], &e["attempt"]),
            (&json!("pod_restart"), &json!(3), &json!(i + 1)),
            "{e}"
        );
        assert!(nodes.contains(e["node"].as_str().unwrap()), "{e}");
    }
    assert!(
        ledger["next_failure"]
            .as_str()
            .unwrap()
            .starts_with("the failed pod restarts (restart 3 of 3)"),
        "{got:#}"
    );
    assert!(
        got["events"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["reason"] == "PodRestart"),
        "{got:#}"
    );

    // Failing for good: the last restart, then the job fails with the reason.
    rt.block_on(annotate(
        &world,
        name,
        "sft",
        json!({"sim.hypd.dev/failures": null}),
    ));
    let got = wait_for_job(&hypd, &token, name, "sft", "the budget spent", |j| {
        j["phase"] == "failed"
    });
    let failed_with = got["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["kind"] == "Failed")
        .unwrap();
    assert_eq!(failed_with["reason"], "RetryLimitExceeded", "{got:#}");
    assert_eq!(got["recovery"]["restarts_left"], 0, "{got:#}");
    assert_eq!(
        got["recovery"]["entries"]
            .as_array()
            .unwrap()
            .last()
            .unwrap()["action"],
        "failed"
    );

    // The name is taken until the job is deleted; deleting it takes its pods.
    let (status, taken) = hypd.call(&token, Method::POST, &jobs, Some(body.clone()));
    assert_eq!(
        (status, &taken["error"]["errors"][0]["field"]),
        (422, &json!("job")),
        "{taken}"
    );
    let (status, deleting) = hypd.confirmed(&token, Method::DELETE, &format!("{jobs}/sft"), None);
    assert_eq!(status, 200, "{deleting}");
    let op = hypd.finish(&token, deleting["operation_id"].as_str().unwrap());
    assert_eq!(op["state"], "succeeded", "{op:#}");
    let (status, listed) = hypd.call(&token, Method::GET, &jobs, None);
    assert_eq!(
        (status, listed["jobs"].as_array().unwrap().len()),
        (200, 0),
        "{listed}"
    );
    let (status, gone) = hypd.call(
        &token,
        Method::DELETE,
        &format!("{jobs}/sft"),
        Some(json!({})),
    );
    assert_eq!(
        (status, &gone["error"]["errors"][0]["field"]),
        (422, &json!("job")),
        "{gone}"
    );
}
