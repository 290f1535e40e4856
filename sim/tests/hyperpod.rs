//! The real `aws-sdk-sagemaker` client against hypd-sim: a HyperPod cluster on an
//! ACTIVE EKS cluster comes InService with its nodes through deep health checks, grows
//! through UpdateCluster, refuses immutable changes and quota overruns, and goes away.

mod support;

use aws_sdk_eks::types::AuthenticationMode;
use aws_sdk_sagemaker::Client;
use aws_sdk_sagemaker::error::ProvideErrorMetadata;
use aws_sdk_sagemaker::types::{
    ClusterEbsVolumeConfig, ClusterInstanceGroupSpecification, ClusterInstanceStatus,
    ClusterInstanceStorageConfig, ClusterInstanceType, ClusterLifeCycleConfig,
    ClusterNodeProvisioningMode, ClusterNodeRecovery, ClusterOrchestrator,
    ClusterOrchestratorEksConfig, ClusterStatus, DeepHealthCheckType, VpcConfig,
};
use serde_json::json;
use support::{
    Network, control, create_eks_cluster, eks_client, moto, network, sdk_config, sim, wait_for,
};

fn group(
    net: &Network,
    count: i32,
    instance_type: ClusterInstanceType,
) -> ClusterInstanceGroupSpecification {
    ClusterInstanceGroupSpecification::builder()
        .instance_group_name("gpu")
        .instance_type(instance_type)
        .instance_count(count)
        .life_cycle_config(
            ClusterLifeCycleConfig::builder()
                .source_s3_uri("s3://sagemaker-hypd-shared/lifecycle/")
                .on_create("on_create.sh")
                .build(),
        )
        .execution_role(&net.role_arn)
        .threads_per_core(2)
        .instance_storage_configs(ClusterInstanceStorageConfig::EbsVolumeConfig(
            ClusterEbsVolumeConfig::builder()
                .volume_size_in_gb(500)
                .build(),
        ))
        .on_start_deep_health_checks(DeepHealthCheckType::InstanceStress)
        .on_start_deep_health_checks(DeepHealthCheckType::InstanceConnectivity)
        .build()
}

async fn status(sm: &Client, name: &str) -> Option<ClusterStatus> {
    sm.describe_cluster()
        .cluster_name(name)
        .send()
        .await
        .ok()
        .and_then(|o| o.cluster_status)
}

#[tokio::test(flavor = "multi_thread")]
async fn hyperpod_lifecycle_on_eks() {
    let (_moto, moto_url) = moto();
    let net = network(&moto_url).await;
    let (_sim, sim_url) = sim(&moto_url, 600.0);
    let eks = eks_client(&sim_url).await;
    let sm = Client::new(&sdk_config(&sim_url).await);

    create_eks_cluster(&eks, &net, "ml-1", AuthenticationMode::Api).await;
    let eks_arn = eks
        .describe_cluster()
        .name("ml-1")
        .send()
        .await
        .unwrap()
        .cluster
        .unwrap()
        .arn
        .unwrap();
    let create = |count: i32| {
        sm.create_cluster()
            .cluster_name("ml-1")
            .instance_groups(group(&net, count, ClusterInstanceType::MlP548Xlarge))
            .vpc_config(
                VpcConfig::builder()
                    .set_subnets(Some(net.subnets.clone()))
                    .security_group_ids(&net.security_group)
                    .build(),
            )
            .orchestrator(
                ClusterOrchestrator::builder()
                    .eks(
                        ClusterOrchestratorEksConfig::builder()
                            .cluster_arn(&eks_arn)
                            .build(),
                    )
                    .build(),
            )
            .node_recovery(ClusterNodeRecovery::Automatic)
            .node_provisioning_mode(ClusterNodeProvisioningMode::Continuous)
            .send()
    };
    // The EKS cluster is still CREATING: HyperPod refuses it.
    let err = create(2).await.unwrap_err();
    assert_eq!(
        err.code(),
        Some("ValidationException"),
        "{:?}",
        err.message()
    );
    wait_for("EKS ACTIVE", || async {
        eks.describe_cluster()
            .name("ml-1")
            .send()
            .await
            .unwrap()
            .cluster
            .unwrap()
            .status
            == Some(aws_sdk_eks::types::ClusterStatus::Active)
    })
    .await;

    let arn = create(2).await.unwrap().cluster_arn.unwrap();
    assert!(arn.starts_with("arn:aws:sagemaker:us-east-1:123456789012:cluster/"));
    let d = sm
        .describe_cluster()
        .cluster_name("ml-1")
        .send()
        .await
        .unwrap();
    assert_eq!(d.cluster_status, Some(ClusterStatus::Creating));
    assert_eq!(d.node_recovery, Some(ClusterNodeRecovery::Automatic));
    assert_eq!(
        d.orchestrator.unwrap().eks.unwrap().cluster_arn.as_deref(),
        Some(eks_arn.as_str())
    );
    let g = &d.instance_groups.unwrap()[0];
    assert_eq!((g.current_count, g.target_count), (Some(0), Some(2)));
    assert_eq!(
        g.on_start_deep_health_checks().len(),
        2,
        "deep health checks kept"
    );

    wait_for("InService", || async {
        status(&sm, "ml-1").await == Some(ClusterStatus::Inservice)
    })
    .await;
    let nodes = sm
        .list_cluster_nodes()
        .cluster_name("ml-1")
        .send()
        .await
        .unwrap()
        .cluster_node_summaries
        .unwrap();
    assert_eq!(nodes.len(), 2);
    assert!(
        nodes
            .iter()
            .all(|n| n.instance_status.as_ref().unwrap().status
                == Some(ClusterInstanceStatus::Running)),
        "{nodes:?}"
    );
    let node = sm
        .describe_cluster_node()
        .cluster_name("ml-1")
        .node_id(nodes[0].instance_id.clone().unwrap())
        .send()
        .await
        .unwrap()
        .node_details
        .unwrap();
    assert_eq!(node.instance_group_name.as_deref(), Some("gpu"));

    // Growing the group: nodes launch and go through their health checks again.
    sm.update_cluster()
        .cluster_name("ml-1")
        .instance_groups(group(&net, 3, ClusterInstanceType::MlP548Xlarge))
        .send()
        .await
        .unwrap();
    assert_eq!(status(&sm, "ml-1").await, Some(ClusterStatus::Updating));
    wait_for("update done", || async {
        status(&sm, "ml-1").await == Some(ClusterStatus::Inservice)
    })
    .await;
    wait_for("three nodes running", || async {
        let d = sm
            .describe_cluster()
            .cluster_name("ml-1")
            .send()
            .await
            .unwrap();
        d.instance_groups.unwrap()[0].current_count == Some(3)
    })
    .await;

    // What AWS keeps immutable stays so.
    let err = sm
        .update_cluster()
        .cluster_name("ml-1")
        .instance_groups(group(&net, 3, ClusterInstanceType::MlP4D24Xlarge))
        .send()
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("ValidationException"));
    assert!(
        err.message().unwrap().contains("InstanceType"),
        "{:?}",
        err.message()
    );

    // Quotas come from a table a test can set.
    control(
        &sim_url,
        reqwest::Method::PUT,
        "/_sim/sagemaker/quotas",
        json!({"ml.p5.48xlarge": 3}),
    )
    .await;
    let err = sm
        .update_cluster()
        .cluster_name("ml-1")
        .instance_groups(group(&net, 4, ClusterInstanceType::MlP548Xlarge))
        .send()
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("ResourceLimitExceeded"));

    sm.delete_cluster()
        .cluster_name("ml-1")
        .send()
        .await
        .unwrap();
    assert_eq!(status(&sm, "ml-1").await, Some(ClusterStatus::Deleting));
    wait_for("gone", || async {
        sm.describe_cluster()
            .cluster_name("ml-1")
            .send()
            .await
            .err()
            .and_then(|e| e.code().map(str::to_owned))
            .as_deref()
            == Some("ResourceNotFound")
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn hyperpod_refuses_bad_input() {
    let (_moto, moto_url) = moto();
    let net = network(&moto_url).await;
    let (_sim, sim_url) = sim(&moto_url, 600.0);
    let sm = Client::new(&sdk_config(&sim_url).await);
    let orchestrator = |arn: &str| {
        ClusterOrchestrator::builder()
            .eks(
                ClusterOrchestratorEksConfig::builder()
                    .cluster_arn(arn)
                    .build(),
            )
            .build()
    };

    let err = sm
        .create_cluster()
        .cluster_name("bad_name")
        .instance_groups(group(&net, 1, ClusterInstanceType::MlP548Xlarge))
        .send()
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("ValidationException"));

    let err = sm
        .create_cluster()
        .cluster_name("c1")
        .instance_groups(group(&net, 1, ClusterInstanceType::MlP548Xlarge))
        .orchestrator(orchestrator(
            "arn:aws:eks:us-east-1:123456789012:cluster/nope",
        ))
        .send()
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("ValidationException"));
    assert!(
        err.message().unwrap().contains("does not exist"),
        "{:?}",
        err.message()
    );

    let mut missing_role = group(&net, 1, ClusterInstanceType::MlP548Xlarge);
    missing_role.execution_role = Some("arn:aws:iam::123456789012:role/absent".into());
    let err = sm
        .create_cluster()
        .cluster_name("c2")
        .instance_groups(missing_role)
        .send()
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("ValidationException"));

    let err = sm
        .describe_cluster()
        .cluster_name("absent")
        .send()
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("ResourceNotFound"));
}
