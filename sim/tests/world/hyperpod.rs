//! The real `aws-sdk-sagemaker` client against hypd-sim: a HyperPod cluster on an
//! ACTIVE EKS cluster comes InService with its nodes through deep health checks, grows
//! through UpdateCluster, refuses immutable changes and quota overruns, and goes away.

use crate::support::{
    control, create_eks_cluster, create_refused, eks_client, eks_cluster, eks_orchestrator,
    hyperpod_create, hyperpod_group, moto, network, refused, sdk_config, sim, wait_eks_active,
    wait_for, wait_gone,
};
use aws_sdk_eks::types::AuthenticationMode;
use aws_sdk_sagemaker::Client;
use aws_sdk_sagemaker::error::ProvideErrorMetadata;
use aws_sdk_sagemaker::types::{
    ClusterInstanceStatus, ClusterInstanceType, ClusterNodeProvisioningMode, ClusterNodeRecovery,
    ClusterStatus,
};
use serde_json::json;

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
    let eks_arn = eks_cluster(&eks, "ml-1").await.arn.unwrap();
    let create = |count: i32| {
        hyperpod_create(&sm, "ml-1", &eks_arn, &net)
            .instance_groups(hyperpod_group(
                &net,
                count,
                ClusterInstanceType::MlP548Xlarge,
            ))
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
    wait_eks_active(&eks, "ml-1").await;

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

    let update = |count: i32, instance_type: ClusterInstanceType| {
        sm.update_cluster()
            .cluster_name("ml-1")
            .instance_groups(hyperpod_group(&net, count, instance_type))
            .send()
    };
    // Growing the group: nodes launch and go through their health checks again.
    update(3, ClusterInstanceType::MlP548Xlarge).await.unwrap();
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

    // InstanceGroups is optional: node recovery alone changes, the groups stay.
    sm.update_cluster()
        .cluster_name("ml-1")
        .node_recovery(ClusterNodeRecovery::None)
        .send()
        .await
        .unwrap();
    wait_for("node recovery updated", || async {
        status(&sm, "ml-1").await == Some(ClusterStatus::Inservice)
    })
    .await;
    let d = sm
        .describe_cluster()
        .cluster_name("ml-1")
        .send()
        .await
        .unwrap();
    assert_eq!(d.node_recovery, Some(ClusterNodeRecovery::None));
    assert_eq!(d.instance_groups.unwrap()[0].target_count, Some(3));

    // What AWS keeps immutable stays so.
    let (code, message) = refused(
        update(3, ClusterInstanceType::MlP4D24Xlarge)
            .await
            .unwrap_err(),
    );
    assert_eq!(code, "ValidationException");
    assert!(message.contains("InstanceType"), "{message}");

    // Quotas come from a table a test can set.
    control(
        &sim_url,
        reqwest::Method::PUT,
        "/_sim/sagemaker/quotas",
        json!({"ml.p5.48xlarge": 3}),
    )
    .await;
    let (code, _) = refused(
        update(4, ClusterInstanceType::MlP548Xlarge)
            .await
            .unwrap_err(),
    );
    assert_eq!(code, "ResourceLimitExceeded");

    sm.delete_cluster()
        .cluster_name("ml-1")
        .send()
        .await
        .unwrap();
    assert_eq!(status(&sm, "ml-1").await, Some(ClusterStatus::Deleting));
    wait_gone("gone", "ResourceNotFound", || {
        sm.describe_cluster().cluster_name("ml-1").send()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn hyperpod_refuses_bad_input() {
    let (_moto, moto_url) = moto();
    let net = network(&moto_url).await;
    let (_sim, sim_url) = sim(&moto_url, 600.0);
    let sm = Client::new(&sdk_config(&sim_url).await);

    let err = sm
        .create_cluster()
        .cluster_name("bad_name")
        .instance_groups(hyperpod_group(&net, 1, ClusterInstanceType::MlP548Xlarge))
        .send()
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("ValidationException"));
    let (code, message) = refused(
        sm.create_cluster()
            .cluster_name("c".repeat(64))
            .instance_groups(hyperpod_group(&net, 1, ClusterInstanceType::MlP548Xlarge))
            .send()
            .await
            .unwrap_err(),
    );
    assert_eq!(code, "ValidationException");
    assert!(
        message.contains("at 'clusterName' failed to satisfy constraint"),
        "{message}"
    );
    let (code, message) = refused(
        sm.create_cluster()
            .cluster_name("c0")
            .instance_groups(hyperpod_group(&net, 1, ClusterInstanceType::MlP548Xlarge))
            .vpc_config(
                aws_sdk_sagemaker::types::VpcConfig::builder()
                    .subnets("subnet-0000dead")
                    .security_group_ids(&net.security_group)
                    .build(),
            )
            .send()
            .await
            .unwrap_err(),
    );
    assert_eq!(code, "ValidationException");
    assert!(
        message.contains("Invalid subnet ID 'subnet-0000dead' in VpcConfig"),
        "{message}"
    );

    let err = sm
        .create_cluster()
        .cluster_name("c1")
        .instance_groups(hyperpod_group(&net, 1, ClusterInstanceType::MlP548Xlarge))
        .orchestrator(eks_orchestrator(
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

    let mut missing_role = hyperpod_group(&net, 1, ClusterInstanceType::MlP548Xlarge);
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

/// The instance-type table's rules (EFA-only, threads per core, Spot), VPC overrides
/// that must exist in moto, and fields UpdateCluster refuses to change.
#[tokio::test(flavor = "multi_thread")]
async fn hyperpod_instance_type_and_network_rules() {
    use aws_sdk_sagemaker::types::{
        ClusterCapacityRequirements, ClusterInterfaceType, ClusterNetworkInterface,
        ClusterOnDemandOptions, ClusterSpotOptions, VpcConfig,
    };
    let (_moto, moto_url) = moto();
    let net = network(&moto_url).await;
    let (_sim, sim_url) = sim(&moto_url, 600.0);
    let eks = eks_client(&sim_url).await;
    let sm = Client::new(&sdk_config(&sim_url).await);
    let eks_arn = crate::support::active_eks_cluster(&eks, &net, "ml").await;
    let efa_only = || {
        ClusterNetworkInterface::builder()
            .interface_type(ClusterInterfaceType::EfaOnly)
            .build()
    };

    // EFA-only needs several EFA cards: g5.8xlarge has one.
    let mut g = hyperpod_group(&net, 1, ClusterInstanceType::MlG58Xlarge);
    g.network_interface = Some(efa_only());
    let (code, message) = create_refused(&sm, "efa-g5", &eks_arn, &net, g).await;
    assert_eq!(code, "ValidationException");
    assert!(message.contains("efa-only"), "{message}");

    // ThreadsPerCore values come from the table, which a test can change.
    let mut g = hyperpod_group(&net, 1, ClusterInstanceType::MlP548Xlarge);
    g.threads_per_core = Some(4);
    let (code, message) = create_refused(&sm, "threads", &eks_arn, &net, g).await;
    assert_eq!(code, "ValidationException");
    assert!(message.contains("ThreadsPerCore 4"), "{message}");
    let table = control(
        &sim_url,
        reqwest::Method::PUT,
        "/_sim/sagemaker/instance-types",
        json!({"ml.trn1.32xlarge": {
            "gpus": 0, "gpu_memory_gib": 512, "efa_interfaces": 8, "efa_only": false,
            "vcpus": 128, "memory_gib": 512, "threads_per_core": [1], "spot": false,
            "default_quota": 4
        }}),
    )
    .await;
    assert_eq!(
        table["instance_types"]["ml.p5.48xlarge"]["efa_interfaces"],
        32
    );
    let trn1 = hyperpod_group(&net, 1, ClusterInstanceType::MlTrn132Xlarge);
    let (code, message) = create_refused(&sm, "threads", &eks_arn, &net, trn1).await;
    assert_eq!(code, "ValidationException");
    assert!(message.contains("supported values: [1]"), "{message}");

    // Spot: EKS with continuous provisioning only, and not where the type has none.
    let spot = || {
        ClusterCapacityRequirements::builder()
            .spot(ClusterSpotOptions::builder().build())
            .build()
    };
    let mut g = hyperpod_group(&net, 1, ClusterInstanceType::MlG58Xlarge);
    g.capacity_requirements = Some(spot());
    let (code, message) = create_refused(&sm, "spot", &eks_arn, &net, g.clone()).await;
    assert_eq!(code, "ValidationException");
    assert!(message.contains("Continuous"), "{message}");
    let mut p4de = hyperpod_group(&net, 1, ClusterInstanceType::MlP4De24Xlarge);
    p4de.capacity_requirements = Some(spot());
    let (code, message) = refused(
        hyperpod_create(&sm, "spot", &eks_arn, &net)
            .node_provisioning_mode(ClusterNodeProvisioningMode::Continuous)
            .instance_groups(p4de)
            .send()
            .await
            .unwrap_err(),
    );
    assert_eq!(code, "ValidationException");
    assert!(
        message.contains("Spot capacity is not available"),
        "{message}"
    );

    // OverrideVpcConfig: its subnets and security groups must exist.
    for (subnet, group, what) in [
        ("subnet-0000dead", net.security_group.as_str(), "subnet"),
        (net.subnets[0].as_str(), "sg-0000dead", "security group"),
    ] {
        let mut g = hyperpod_group(&net, 1, ClusterInstanceType::MlG58Xlarge);
        g.override_vpc_config = Some(
            VpcConfig::builder()
                .subnets(subnet)
                .security_group_ids(group)
                .build(),
        );
        let (code, message) = create_refused(&sm, "override", &eks_arn, &net, g).await;
        assert_eq!(code, "ValidationException");
        assert!(
            message.contains(what) && message.contains("OverrideVpcConfig"),
            "{message}"
        );
    }

    // Accepted: EFA-only on p5, Spot on g5 with continuous provisioning.
    let mut p5 = hyperpod_group(&net, 1, ClusterInstanceType::MlP548Xlarge);
    p5.network_interface = Some(efa_only());
    p5.override_vpc_config = Some(
        VpcConfig::builder()
            .subnets(&net.subnets[0])
            .security_group_ids(&net.security_group)
            .build(),
    );
    let mut spot_group = g.clone();
    spot_group.instance_group_name = Some("spot".into());
    hyperpod_create(&sm, "fabric", &eks_arn, &net)
        .node_provisioning_mode(ClusterNodeProvisioningMode::Continuous)
        .instance_groups(p5.clone())
        .instance_groups(spot_group.clone())
        .send()
        .await
        .unwrap();
    crate::support::hyperpod_ready(&sm, "fabric").await;
    let nodes = sm
        .list_cluster_nodes()
        .cluster_name("fabric")
        .instance_group_name_contains("spot")
        .send()
        .await
        .unwrap()
        .cluster_node_summaries
        .unwrap();
    let node = sm
        .describe_cluster_node()
        .cluster_name("fabric")
        .node_id(nodes[0].instance_id.clone().unwrap())
        .send()
        .await
        .unwrap()
        .node_details
        .unwrap();
    assert_eq!(
        node.capacity_type,
        Some(aws_sdk_sagemaker::types::ClusterCapacityType::Spot)
    );

    // UpdateCluster keeps the interface type, the capacity type and the VPC override.
    let mut plain = p5.clone();
    plain.network_interface = None;
    let mut on_demand = spot_group.clone();
    on_demand.capacity_requirements = Some(
        ClusterCapacityRequirements::builder()
            .on_demand(ClusterOnDemandOptions::builder().build())
            .build(),
    );
    let mut moved = p5.clone();
    moved.override_vpc_config = Some(
        VpcConfig::builder()
            .subnets(&net.subnets[1])
            .security_group_ids(&net.security_group)
            .build(),
    );
    for (groups, field) in [
        (vec![plain, spot_group.clone()], "NetworkInterface"),
        (vec![p5.clone(), on_demand], "CapacityRequirements"),
        (vec![moved, spot_group.clone()], "OverrideVpcConfig"),
    ] {
        let (code, message) = refused(
            sm.update_cluster()
                .cluster_name("fabric")
                .set_instance_groups(Some(groups))
                .send()
                .await
                .unwrap_err(),
        );
        assert_eq!(code, "ValidationException");
        assert!(
            message.starts_with(field) && message.contains("cannot be updated"),
            "{message}"
        );
    }

    // More instances than the quota.
    let five = hyperpod_group(&net, 5, ClusterInstanceType::MlP548Xlarge);
    let (code, message) = create_refused(&sm, "big", &eks_arn, &net, five).await;
    assert_eq!(code, "ResourceLimitExceeded");
    assert!(
        message.contains("ml.p5.48xlarge for cluster usage"),
        "{message}"
    );
}
