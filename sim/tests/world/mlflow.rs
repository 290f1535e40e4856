//! The real `aws-sdk-sagemaker` client drives managed MLflow tracking servers on
//! hypd-sim: Creating → Created, Updating → Updated, Deleting → gone, with the artifact
//! store and role checked as SageMaker checks them, a throttled create absorbed by the
//! SDK's retry, and (with a real MLflow configured) MLflow's own API at the server's URL.

use crate::support::{
    control, inject, moto, network, refused, sagemaker_client, set_time_scale, sim, wait_for,
    wait_for_within,
};
use aws_sdk_sagemaker::Client;
use aws_sdk_sagemaker::types::{IsTrackingServerActive, TrackingServerSize, TrackingServerStatus};
use serde_json::json;
use std::time::Duration;

const SCALE: f64 = 600.0;

async fn status(sm: &Client, name: &str) -> Option<TrackingServerStatus> {
    sm.describe_mlflow_tracking_server()
        .tracking_server_name(name)
        .send()
        .await
        .ok()
        .and_then(|d| d.tracking_server_status)
}

#[tokio::test(flavor = "multi_thread")]
async fn mlflow_tracking_server_lifecycle() {
    let (_moto, moto_url) = moto();
    let net = network(&moto_url).await;
    let (_sim, sim_url) = sim(&moto_url, SCALE);
    let sm = sagemaker_client(&sim_url).await;
    let create = |name: &str, uri: &str, role: &str| {
        sm.create_mlflow_tracking_server()
            .tracking_server_name(name)
            .artifact_store_uri(uri)
            .role_arn(role)
            .tracking_server_size(TrackingServerSize::S)
            .weekly_maintenance_window_start("Tue:03:30")
            .send()
    };

    let (code, message) = refused(
        create("exp", "https://bucket/mlflow", &net.role_arn)
            .await
            .unwrap_err(),
    );
    assert_eq!(code, "ValidationException");
    assert!(message.contains("artifactStoreUri"), "{message}");
    let (code, message) = refused(
        create(
            "exp",
            "s3://hypd-mlflow/exp",
            "arn:aws:iam::123456789012:role/absent",
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(code, "ValidationException");
    assert!(message.contains("does not exist"), "{message}");

    // Two throttles, then success: the SDK's retry (3 attempts) absorbs them.
    inject(
        &sim_url,
        json!({"service": "sagemaker", "operation": "CreateMlflowTrackingServer",
               "kind": "throttle", "times": 2}),
    )
    .await;
    set_time_scale(&sim_url, 0.0).await;
    let arn = create("exp", "s3://hypd-mlflow/exp", &net.role_arn)
        .await
        .unwrap()
        .tracking_server_arn
        .unwrap();
    assert_eq!(
        arn,
        "arn:aws:sagemaker:us-east-1:123456789012:mlflow-tracking-server/exp"
    );
    let faults = control(&sim_url, reqwest::Method::GET, "/_sim/faults", json!({})).await;
    assert_eq!(faults["faults"], json!([]), "both throttles were used");
    let d = sm
        .describe_mlflow_tracking_server()
        .tracking_server_name("exp")
        .send()
        .await
        .unwrap();
    assert_eq!(
        d.tracking_server_status,
        Some(TrackingServerStatus::Creating)
    );
    assert_eq!(d.is_active, Some(IsTrackingServerActive::Inactive));
    assert_eq!(
        d.artifact_store_uri.as_deref(),
        Some("s3://hypd-mlflow/exp")
    );
    let url = d.tracking_server_url.unwrap();
    // With a real MLflow (HYPD_SIM_MLFLOW, as scripts/env.sh sets it) the server is that
    // MLflow; without one, a URL of AWS's shape that nothing answers.
    let real =
        std::env::var_os("HYPD_SIM_MLFLOW").is_some_and(|p| std::path::Path::new(&p).is_file());
    if real {
        assert!(url.starts_with("http://127.0.0.1:"), "{url}");
    } else {
        assert!(
            url.starts_with("https://t-") && url.ends_with(".us-east-1.experiments.sagemaker.aws"),
            "{url}"
        );
    }
    let (code, _) = refused(
        sm.create_presigned_mlflow_tracking_server_url()
            .tracking_server_name("exp")
            .send()
            .await
            .unwrap_err(),
    );
    assert_eq!(
        code, "ValidationException",
        "no URL before the server is up"
    );
    let (code, _) = refused(
        create("exp", "s3://hypd-mlflow/exp", &net.role_arn)
            .await
            .unwrap_err(),
    );
    assert_eq!(code, "ValidationException", "the name is taken");
    let (code, _) = refused(
        sm.update_mlflow_tracking_server()
            .tracking_server_name("exp")
            .tracking_server_size(TrackingServerSize::M)
            .send()
            .await
            .unwrap_err(),
    );
    assert_eq!(code, "ConflictException");

    set_time_scale(&sim_url, SCALE).await;
    // Created waits for the real MLflow to answer /health: a Python server that starts in
    // ~6 s alone and far slower while CI's three lanes share two cores.
    wait_for_within("Created", Duration::from_secs(180), || async {
        status(&sm, "exp").await == Some(TrackingServerStatus::Created)
    })
    .await;
    if real {
        // It is MLflow: its own API answers at the server's URL.
        let searched: serde_json::Value = reqwest::Client::new()
            .post(format!("{url}/api/2.0/mlflow/experiments/search"))
            .json(&json!({ "max_results": 10 }))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(searched["experiments"][0]["name"], "Default", "{searched}");
    }
    let signed = sm
        .create_presigned_mlflow_tracking_server_url()
        .tracking_server_name("exp")
        .expires_in_seconds(60)
        .send()
        .await
        .unwrap()
        .authorized_url
        .unwrap();
    assert!(
        signed.starts_with(&format!("{url}/auth?authToken=")),
        "{signed}"
    );
    let (code, _) = refused(
        sm.create_presigned_mlflow_tracking_server_url()
            .tracking_server_name("exp")
            .expires_in_seconds(3600)
            .send()
            .await
            .unwrap_err(),
    );
    assert_eq!(code, "ValidationException");

    set_time_scale(&sim_url, 0.0).await;
    sm.update_mlflow_tracking_server()
        .tracking_server_name("exp")
        .tracking_server_size(TrackingServerSize::M)
        .send()
        .await
        .unwrap();
    assert_eq!(
        status(&sm, "exp").await,
        Some(TrackingServerStatus::Updating)
    );
    let listed = sm
        .list_mlflow_tracking_servers()
        .tracking_server_status(TrackingServerStatus::Updating)
        .send()
        .await
        .unwrap()
        .tracking_server_summaries
        .unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].tracking_server_name.as_deref(), Some("exp"));
    set_time_scale(&sim_url, SCALE).await;
    wait_for("Updated", || async {
        status(&sm, "exp").await == Some(TrackingServerStatus::Updated)
    })
    .await;
    let d = sm
        .describe_mlflow_tracking_server()
        .tracking_server_name("exp")
        .send()
        .await
        .unwrap();
    assert_eq!(d.tracking_server_size, Some(TrackingServerSize::M));
    assert_eq!(d.is_active, Some(IsTrackingServerActive::Active));

    sm.delete_mlflow_tracking_server()
        .tracking_server_name("exp")
        .send()
        .await
        .unwrap();
    wait_for("gone", || async {
        sm.describe_mlflow_tracking_server()
            .tracking_server_name("exp")
            .send()
            .await
            .is_err()
    })
    .await;
    let (code, _) = refused(
        sm.describe_mlflow_tracking_server()
            .tracking_server_name("exp")
            .send()
            .await
            .unwrap_err(),
    );
    assert_eq!(code, "ResourceNotFound");
    let listed = sm
        .list_mlflow_tracking_servers()
        .send()
        .await
        .unwrap()
        .tracking_server_summaries
        .unwrap_or_default();
    assert!(listed.is_empty());
}
