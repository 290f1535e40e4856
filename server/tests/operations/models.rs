//! `download_model` through REST against moto + hypd-sim: the Job it names exists and
//! mounts the shared bucket, the sim's download container writes the model and its
//! manifest into the bucket (moto), `list_models` and the storage browser find it at the
//! path pods see, a commit already there needs no Job, another revision is refused
//! unless replaced, and the token is kept only as a Secret in the cluster: never in the
//! store, the log or an answer.

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use reqwest::Method;
use serde_json::json;

use crate::FAST;
use crate::common::Hypd;
use crate::common::cluster::{kube_client, small, world_with_cluster};

const TOKEN: &str = "hf_sEcReTtOkEnDoNoTlEaK0123456789";

#[test]
fn a_model_lands_in_the_shared_bucket_and_the_token_only_in_a_secret() {
    let name = "ml-mod";
    let (world, hypd, token, _) = world_with_cluster(FAST, json!({}), small(name));
    let path = format!("/api/v1/clusters/{name}/models");
    let model = "Qwen/Qwen2.5-0.5B";

    // A mistyped token is refused by field, and not quoted back.
    let (status, refused) = hypd.call(
        &token,
        Method::POST,
        &path,
        Some(json!({"model": model, "hf_token": format!("{TOKEN}!")})),
    );
    assert_eq!(status, 422, "{refused}");
    assert_eq!(
        refused["error"]["errors"][0]["field"], "hf_token",
        "{refused}"
    );
    assert!(!refused.to_string().contains("sEcReT"), "{refused}");

    let (status, plan) = hypd.call(
        &token,
        Method::POST,
        &path,
        Some(json!({"model": model, "hf_token": TOKEN, "dry_run": true})),
    );
    assert_eq!(status, 200, "{plan}");
    let kinds: Vec<&str> = plan["plan"]["stages"][0]["changes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["k8s:v1/Secret", "k8s:batch/v1/Job"], "{plan:#}");

    let (status, started) = hypd.call(
        &token,
        Method::POST,
        &path,
        Some(json!({"model": model, "hf_token": TOKEN})),
    );
    assert_eq!(status, 200, "{started}");
    let op = hypd.finish(&token, started["operation_id"].as_str().unwrap());
    assert_eq!(op["state"], "succeeded", "{op:#}");
    let out = &op["outputs"];
    assert_eq!(
        out["path_in_pods"], "/s3/models/Qwen/Qwen2.5-0.5B",
        "{op:#}"
    );
    assert_eq!(
        (&out["files"], &out["commit"].as_str().unwrap().len()),
        (&json!(4), &40),
        "{op:#}"
    );
    assert!(
        out["progress"].as_str().unwrap().starts_with("files 4/4"),
        "{op:#}"
    );
    let job = out["job"]
        .as_str()
        .unwrap()
        .strip_prefix("default/")
        .unwrap()
        .to_owned();
    let commit = out["commit"].as_str().unwrap().to_owned();

    // The Job the status names exists, mounting the shared claim, and read the token
    // from a Secret of its own, which is gone now that it finished.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (found, secrets) = rt.block_on(async {
        let client = kube_client(&world, name).await;
        let job = Api::<Job>::namespaced(client.clone(), "default")
            .get(&job)
            .await
            .unwrap();
        let secrets = Api::<Secret>::namespaced(client, "default")
            .list(&Default::default())
            .await
            .unwrap();
        (job, secrets)
    });
    let spec = serde_json::to_value(&found.spec).unwrap();
    assert_eq!(
        spec["template"]["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"],
        "shared-s3"
    );
    let env = spec["template"]["spec"]["containers"][0]["env"]
        .as_array()
        .unwrap()
        .clone();
    let read = env.iter().find(|e| e["name"] == "HF_TOKEN").unwrap();
    let secret = read["valueFrom"]["secretKeyRef"]["name"].as_str().unwrap();
    assert!(secret.starts_with("hypd-hf-token-"), "{secret}");
    assert!(
        secrets
            .items
            .iter()
            .all(|s| s.metadata.name.as_deref() != Some(secret)),
        "the token's Secret outlived its Job"
    );
    assert!(
        !spec.to_string().contains("sEcReT"),
        "the token is in the Job"
    );

    let (status, models) = hypd.call(&token, Method::GET, &path, None);
    assert_eq!(status, 200, "{models}");
    assert_eq!(
        models["models"],
        json!([{"model": model, "path_in_pods": "/s3/models/Qwen/Qwen2.5-0.5B", "complete": true, "revision": "main",
                "commit": commit, "files": 4, "size_bytes": out["size_bytes"], "downloaded_at": models["models"][0]["downloaded_at"]}]),
        "{models:#}"
    );
    let contents = format!(
        "/api/v1/clusters/{name}/storage/shared-s3/contents?prefix=models/Qwen/Qwen2.5-0.5B/"
    );
    let (status, listed) = hypd.call(&token, Method::GET, &contents, None);
    assert_eq!(status, 200, "{listed}");
    let keys: Vec<&str> = listed["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["path_in_pods"].as_str().unwrap())
        .collect();
    assert!(
        keys.contains(&"/s3/models/Qwen/Qwen2.5-0.5B/model.safetensors"),
        "{listed:#}"
    );

    // The commit already there: no Job. Another revision: refused unless replaced.
    let (status, again) = hypd.call(
        &token,
        Method::POST,
        &path,
        Some(json!({"model": model, "revision": commit})),
    );
    assert_eq!(status, 200, "{again}");
    let op = hypd.finish(&token, again["operation_id"].as_str().unwrap());
    assert_eq!(
        (&op["state"], &op["outputs"]["job"]),
        (&json!("succeeded"), &serde_json::Value::Null),
        "{op:#}"
    );
    let (status, refused) = hypd.call(
        &token,
        Method::POST,
        &path,
        Some(json!({"model": model, "revision": "v2.0"})),
    );
    assert_eq!(status, 422, "{refused}");
    assert_eq!(
        refused["error"]["errors"][0]["field"], "revision",
        "{refused}"
    );
    let (status, replaced) = hypd.call(
        &token,
        Method::POST,
        &path,
        Some(json!({"model": model, "revision": "v2.0", "replace": true})),
    );
    assert_eq!(status, 200, "{replaced}");
    let op = hypd.finish(&token, replaced["operation_id"].as_str().unwrap());
    assert_eq!(op["state"], "succeeded", "{op:#}");
    assert_ne!(op["outputs"]["commit"], json!(commit), "{op:#}");

    nowhere_kept(&hypd, &token, TOKEN);
}

/// `secret` is nowhere hypd keeps or says anything: its operations (requests, plans,
/// outputs), its store and the store's log (the audit log is in it), its own log.
pub fn nowhere_kept(hypd: &Hypd, token: &str, secret: &str) {
    let (_, ops) = hypd.call(token, Method::GET, "/api/v1/operations", None);
    assert!(
        !ops.to_string().contains(secret),
        "the token is in an operation"
    );
    let store = std::fs::read(hypd.data_dir.path().join("hypd.db")).unwrap();
    assert!(
        !store.windows(secret.len()).any(|w| w == secret.as_bytes()),
        "the token is in the store"
    );
    let wal = hypd.data_dir.path().join("hypd.db-wal");
    if let Ok(wal) = std::fs::read(wal) {
        assert!(
            !wal.windows(secret.len()).any(|w| w == secret.as_bytes()),
            "the token is in the store's log"
        );
    }
    assert!(
        !hypd.stderr().contains(secret),
        "the token is in hypd's log"
    );
}
