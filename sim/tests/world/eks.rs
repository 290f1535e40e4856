//! The real `aws-sdk-eks` client against hypd-sim (with moto for subnets and roles):
//! transitions, AWS's error codes for bad input, injected faults and the SDK's retry.

use std::time::Duration;

use crate::support::{
    control, create_eks_cluster, eks_client, eks_cluster, moto, network, sim, wait_eks_active,
    wait_for, wait_gone,
};
use aws_sdk_eks::Client;
use aws_sdk_eks::error::ProvideErrorMetadata;
use aws_sdk_eks::types::{
    AccessScope, AccessScopeType, AddonStatus, AuthenticationMode, ClusterStatus,
};
use serde_json::json;

#[tokio::test(flavor = "multi_thread")]
async fn cluster_access_and_addon_lifecycles() {
    let (_moto, moto_url) = moto();
    let net = network(&moto_url).await;
    // 600 simulated seconds per real second: EKS's 10-minute creation takes 1 s.
    let (_sim, sim_url) = sim(&moto_url, 600.0);
    let eks = eks_client(&sim_url).await;

    create_eks_cluster(&eks, &net, "ml-1", AuthenticationMode::ApiAndConfigMap).await;
    let c = eks_cluster(&eks, "ml-1").await;
    assert_eq!(c.status, Some(ClusterStatus::Creating));
    assert!(c.endpoint.is_none(), "no endpoint while creating");
    assert!(
        c.identity
            .unwrap()
            .oidc
            .unwrap()
            .issuer
            .unwrap()
            .starts_with("https://oidc.eks.us-east-1.amazonaws.com/id/")
    );
    assert!(
        c.resources_vpc_config
            .unwrap()
            .vpc_id
            .unwrap()
            .starts_with("vpc-")
    );

    wait_eks_active(&eks, "ml-1").await;
    assert_eq!(
        eks.list_clusters().send().await.unwrap().clusters.unwrap(),
        vec!["ml-1"]
    );

    let principal = "arn:aws:iam::123456789012:role/hypd";
    eks.create_access_entry()
        .cluster_name("ml-1")
        .principal_arn(principal)
        .send()
        .await
        .unwrap();
    eks.associate_access_policy()
        .cluster_name("ml-1")
        .principal_arn(principal)
        .policy_arn("arn:aws:eks::aws:cluster-access-policy/AmazonEKSClusterAdminPolicy")
        .access_scope(
            AccessScope::builder()
                .r#type(AccessScopeType::Cluster)
                .build(),
        )
        .send()
        .await
        .unwrap();
    let policies = eks
        .list_associated_access_policies()
        .cluster_name("ml-1")
        .principal_arn(principal)
        .send()
        .await
        .unwrap()
        .associated_access_policies
        .unwrap();
    assert_eq!(policies.len(), 1);
    let again = eks
        .create_access_entry()
        .cluster_name("ml-1")
        .principal_arn(principal)
        .send()
        .await
        .unwrap_err();
    assert_eq!(again.code(), Some("ResourceInUseException"));

    let association = eks
        .create_pod_identity_association()
        .cluster_name("ml-1")
        .namespace("kube-system")
        .service_account("s3-csi-driver-sa")
        .role_arn(&net.role_arn)
        .send()
        .await
        .unwrap()
        .association
        .unwrap();
    let id = association.association_id.unwrap();
    let listed = eks
        .list_pod_identity_associations()
        .cluster_name("ml-1")
        .namespace("kube-system")
        .send()
        .await
        .unwrap()
        .associations
        .unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(
        listed[0].service_account.as_deref(),
        Some("s3-csi-driver-sa")
    );
    let dup = eks
        .create_pod_identity_association()
        .cluster_name("ml-1")
        .namespace("kube-system")
        .service_account("s3-csi-driver-sa")
        .role_arn(&net.role_arn)
        .send()
        .await
        .unwrap_err();
    assert_eq!(dup.code(), Some("ResourceInUseException"));
    eks.delete_pod_identity_association()
        .cluster_name("ml-1")
        .association_id(&id)
        .send()
        .await
        .unwrap();
    let gone = eks
        .describe_pod_identity_association()
        .cluster_name("ml-1")
        .association_id(&id)
        .send()
        .await
        .unwrap_err();
    assert_eq!(gone.code(), Some("ResourceNotFoundException"));

    let versions = eks
        .describe_addon_versions()
        .addon_name("eks-pod-identity-agent")
        .send()
        .await
        .unwrap();
    let latest = versions.addons.unwrap()[0].addon_versions.clone().unwrap()[0]
        .addon_version
        .clone()
        .unwrap();
    let older = "v1.3.7-eksbuild.2";
    eks.create_addon()
        .cluster_name("ml-1")
        .addon_name("eks-pod-identity-agent")
        .addon_version(older)
        .send()
        .await
        .unwrap();
    let status = |eks: Client| async move {
        eks.describe_addon()
            .cluster_name("ml-1")
            .addon_name("eks-pod-identity-agent")
            .send()
            .await
            .map(|o| o.addon.unwrap())
    };
    assert_eq!(
        status(eks.clone()).await.unwrap().status,
        Some(AddonStatus::Creating)
    );
    wait_for("add-on ACTIVE", || async {
        status(eks.clone()).await.unwrap().status == Some(AddonStatus::Active)
    })
    .await;
    eks.update_addon()
        .cluster_name("ml-1")
        .addon_name("eks-pod-identity-agent")
        .addon_version(&latest)
        .send()
        .await
        .unwrap();
    let updating = status(eks.clone()).await.unwrap();
    assert_eq!(updating.status, Some(AddonStatus::Updating));
    assert_eq!(updating.addon_version.as_deref(), Some(latest.as_str()));
    wait_for("add-on updated", || async {
        status(eks.clone()).await.unwrap().status == Some(AddonStatus::Active)
    })
    .await;

    eks.delete_addon()
        .cluster_name("ml-1")
        .addon_name("eks-pod-identity-agent")
        .send()
        .await
        .unwrap();
    wait_gone("add-on gone", "ResourceNotFoundException", || {
        status(eks.clone())
    })
    .await;

    // The inference operator's configuration is checked against its schema, as EKS does:
    // an unknown key and a missing required one are refused, nothing is created.
    let inference = |config: serde_json::Value| {
        eks.create_addon()
            .cluster_name("ml-1")
            .addon_name("amazon-sagemaker-hyperpod-inference")
            .configuration_values(config.to_string())
            .send()
    };
    let whole = json!({
        "executionRoleArn": "arn:aws:iam::123456789012:role/x",
        "tlsCertificateS3Bucket": "b",
        "hyperpodClusterArn": "arn:aws:sagemaker:us-east-1:123456789012:cluster/abc",
    });
    let mut unknown = whole.clone();
    unknown["certManager"] = json!({"enabled": false});
    for (bad, says) in [
        (unknown, "$.certManager: is not defined in the schema"),
        (
            json!({"executionRoleArn": "arn:aws:iam::123456789012:role/x"}),
            "$.tlsCertificateS3Bucket: is missing",
        ),
    ] {
        let err = inference(bad).await.unwrap_err();
        assert_eq!(err.code(), Some("InvalidParameterException"));
        assert!(err.message().unwrap().contains(says), "{:?}", err.message());
    }
    assert!(
        eks.list_addons()
            .cluster_name("ml-1")
            .send()
            .await
            .unwrap()
            .addons()
            .is_empty()
    );
    inference(whole).await.unwrap();
    wait_for("inference add-on ACTIVE", || async {
        eks.describe_addon()
            .cluster_name("ml-1")
            .addon_name("amazon-sagemaker-hyperpod-inference")
            .send()
            .await
            .unwrap()
            .addon
            .unwrap()
            .status
            == Some(AddonStatus::Active)
    })
    .await;

    eks.delete_cluster().name("ml-1").send().await.unwrap();
    let c = eks_cluster(&eks, "ml-1").await;
    assert_eq!(c.status, Some(ClusterStatus::Deleting));
    wait_gone("cluster gone", "ResourceNotFoundException", || {
        eks.describe_cluster().name("ml-1").send()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_input_gets_eks_error_codes() {
    let (_moto, moto_url) = moto();
    let net = network(&moto_url).await;
    let (_sim, sim_url) = sim(&moto_url, 600.0);
    let eks = eks_client(&sim_url).await;
    let create = |name: &str, role: &str, subnets: Vec<String>| {
        eks.create_cluster()
            .name(name)
            .role_arn(role)
            .resources_vpc_config(
                aws_sdk_eks::types::VpcConfigRequest::builder()
                    .set_subnet_ids(Some(subnets))
                    .build(),
            )
    };

    let err = create(
        "x",
        &net.role_arn,
        vec![net.subnets[0].clone(), "subnet-0000000000000dead".into()],
    )
    .send()
    .await
    .unwrap_err();
    assert_eq!(err.code(), Some("InvalidParameterException"));
    assert!(
        err.message().unwrap().contains("subnet-0000000000000dead"),
        "{:?}",
        err.message()
    );

    let err = create(&"a".repeat(101), &net.role_arn, net.subnets.clone())
        .send()
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("InvalidParameterException"));

    let err = create(
        "x",
        "arn:aws:iam::123456789012:role/missing",
        net.subnets.clone(),
    )
    .send()
    .await
    .unwrap_err();
    assert_eq!(err.code(), Some("InvalidParameterException"));
    assert!(err.message().unwrap().contains("does not exist"));

    let err = create("x", &net.role_arn, net.subnets.clone())
        .version("1.12")
        .send()
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("InvalidParameterException"));

    create_eks_cluster(&eks, &net, "dup", AuthenticationMode::ConfigMap).await;
    let err = create("dup", &net.role_arn, net.subnets.clone())
        .send()
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("ResourceInUseException"));

    let err = eks
        .describe_cluster()
        .name("nope")
        .send()
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("ResourceNotFoundException"));
}

#[tokio::test(flavor = "multi_thread")]
async fn injected_faults_throttle_fail_and_stick() {
    let (_moto, moto_url) = moto();
    let net = network(&moto_url).await;
    let (_sim, sim_url) = sim(&moto_url, 600.0);
    let eks = eks_client(&sim_url).await;

    // Two throttles: the SDK's third attempt succeeds.
    control(
        &sim_url,
        reqwest::Method::POST,
        "/_sim/faults",
        json!({"service": "eks", "operation": "ListClusters", "kind": "throttle", "times": 2}),
    )
    .await;
    assert!(eks.list_clusters().send().await.is_ok());
    // Three throttles exhaust three attempts.
    control(
        &sim_url,
        reqwest::Method::POST,
        "/_sim/faults",
        json!({"service": "eks", "operation": "ListClusters", "kind": "throttle", "times": 3}),
    )
    .await;
    let err = eks.list_clusters().send().await.unwrap_err();
    assert_eq!(err.code(), Some("ThrottlingException"));

    control(
            &sim_url,
            reqwest::Method::POST,
            "/_sim/faults",
            json!({"service": "eks", "operation": "CreateCluster", "kind": "error", "code": "AccessDeniedException", "status": 403, "message": "not allowed"}),
        )
    .await;
    let err = eks
        .create_cluster()
        .name("denied")
        .role_arn(&net.role_arn)
        .resources_vpc_config(
            aws_sdk_eks::types::VpcConfigRequest::builder()
                .set_subnet_ids(Some(net.subnets.clone()))
                .build(),
        )
        .send()
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("AccessDeniedException"));
    assert_eq!(err.message(), Some("not allowed"));

    // A stuck creation stays CREATING until the fault is removed.
    let stuck = control(
        &sim_url,
        reqwest::Method::POST,
        "/_sim/faults",
        json!({"service": "eks", "operation": "CreateCluster", "kind": "stuck"}),
    )
    .await;
    create_eks_cluster(&eks, &net, "slow", AuthenticationMode::Api).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let c = eks_cluster(&eks, "slow").await;
    assert_eq!(
        c.status,
        Some(ClusterStatus::Creating),
        "held by the stuck fault"
    );
    let id = stuck["id"].as_u64().unwrap();
    control(
        &sim_url,
        reqwest::Method::DELETE,
        &format!("/_sim/faults/{id}"),
        json!({}),
    )
    .await;
    let c = eks_cluster(&eks, "slow").await;
    assert_eq!(c.status, Some(ClusterStatus::Active));
}

/// Managed node groups: CREATING → ACTIVE, UPDATING on a scaling change, DELETING →
/// gone, a cluster that keeps its node groups cannot be deleted, and EKS's error codes
/// for bad names, scaling, subnets, roles and a cluster that is not ACTIVE.
#[tokio::test(flavor = "multi_thread")]
async fn managed_node_groups() {
    use crate::support::{moto_call, set_time_scale, xml_tag};
    use aws_sdk_eks::types::{NodegroupScalingConfig, NodegroupStatus};
    let (_moto, moto_url) = moto();
    let net = network(&moto_url).await;
    let (_sim, sim_url) = sim(&moto_url, 600.0);
    let eks = eks_client(&sim_url).await;
    let trust = json!({"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"}, "Action": "sts:AssumeRole"}]}).to_string();
    let node_role = xml_tag(
        &moto_call(
            &moto_url,
            "iam",
            &[
                ("Action", "CreateRole"),
                ("Version", "2010-05-08"),
                ("RoleName", "hypd-nodes"),
                ("AssumeRolePolicyDocument", &trust),
            ],
        )
        .await,
        "Arn",
    );
    let other_vpc = xml_tag(
        &moto_call(
            &moto_url,
            "ec2",
            &[
                ("Action", "CreateVpc"),
                ("Version", "2016-11-15"),
                ("CidrBlock", "10.9.0.0/16"),
            ],
        )
        .await,
        "vpcId",
    );
    let foreign_subnet = xml_tag(
        &moto_call(
            &moto_url,
            "ec2",
            &[
                ("Action", "CreateSubnet"),
                ("Version", "2016-11-15"),
                ("VpcId", &other_vpc),
                ("CidrBlock", "10.9.0.0/24"),
                ("AvailabilityZone", "us-east-1a"),
            ],
        )
        .await,
        "subnetId",
    );
    let scaling = |min, desired, max| {
        NodegroupScalingConfig::builder()
            .min_size(min)
            .desired_size(desired)
            .max_size(max)
            .build()
    };
    let create = |name: &str, subnets: Vec<String>, role: &str, s: NodegroupScalingConfig| {
        eks.create_nodegroup()
            .cluster_name("ml-1")
            .nodegroup_name(name)
            .set_subnets(Some(subnets))
            .node_role(role)
            .scaling_config(s)
            .instance_types("m5.2xlarge")
            .labels("role", "system")
            .send()
    };

    create_eks_cluster(&eks, &net, "ml-1", AuthenticationMode::Api).await;
    let err = create("system", net.subnets.clone(), &node_role, scaling(1, 2, 3))
        .await
        .unwrap_err();
    assert_eq!(
        err.code(),
        Some("InvalidRequestException"),
        "cluster not ACTIVE yet"
    );
    wait_eks_active(&eks, "ml-1").await;

    for (name, subnets, role, s, expected) in [
        (
            "bad name!",
            net.subnets.clone(),
            node_role.as_str(),
            scaling(1, 2, 3),
            "is invalid",
        ),
        (
            "system",
            vec!["subnet-0000dead".to_owned()],
            &node_role,
            scaling(1, 2, 3),
            "does not exist",
        ),
        (
            "system",
            vec![foreign_subnet.clone()],
            &node_role,
            scaling(1, 2, 3),
            "is not in the VPC of cluster ml-1",
        ),
        (
            "system",
            net.subnets.clone(),
            "arn:aws:iam::123456789012:role/absent",
            scaling(1, 2, 3),
            "role doesn't exist",
        ),
        (
            "system",
            net.subnets.clone(),
            &node_role,
            scaling(3, 2, 4),
            "Minimum capacity 3 can't be greater than desired size 2",
        ),
    ] {
        let err = create(name, subnets, role, s).await.unwrap_err();
        assert_eq!(err.code(), Some("InvalidParameterException"));
        assert!(
            err.message().unwrap().contains(expected),
            "{:?}",
            err.message()
        );
    }

    let err = eks
        .create_nodegroup()
        .cluster_name("ml-1")
        .nodegroup_name("al2")
        .set_subnets(Some(net.subnets.clone()))
        .node_role(&node_role)
        .ami_type(aws_sdk_eks::types::AmiTypes::Al2X8664Gpu)
        .send()
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("InvalidParameterException"));
    assert!(
        err.message()
            .unwrap()
            .contains("not supported for Kubernetes version 1.33"),
        "{:?}",
        err.message()
    );

    set_time_scale(&sim_url, 0.0).await;
    let ng = create("system", net.subnets.clone(), &node_role, scaling(1, 2, 3))
        .await
        .unwrap()
        .nodegroup
        .unwrap();
    assert_eq!(ng.status, Some(NodegroupStatus::Creating));
    assert!(
        ng.nodegroup_arn
            .as_deref()
            .unwrap()
            .starts_with("arn:aws:eks:us-east-1:123456789012:nodegroup/ml-1/system/")
    );
    assert_eq!(ng.version.as_deref(), Some("1.33"));
    let err = create("system", net.subnets.clone(), &node_role, scaling(1, 2, 3))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("ResourceInUseException"));
    let err = eks
        .update_nodegroup_config()
        .cluster_name("ml-1")
        .nodegroup_name("system")
        .scaling_config(scaling(1, 3, 3))
        .send()
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("ResourceInUseException"), "still CREATING");
    set_time_scale(&sim_url, 600.0).await;
    let status = || async {
        eks.describe_nodegroup()
            .cluster_name("ml-1")
            .nodegroup_name("system")
            .send()
            .await
            .ok()
            .and_then(|o| o.nodegroup)
            .and_then(|n| n.status)
    };
    wait_for("node group ACTIVE", || async {
        status().await == Some(NodegroupStatus::Active)
    })
    .await;

    set_time_scale(&sim_url, 0.0).await;
    let update = eks
        .update_nodegroup_config()
        .cluster_name("ml-1")
        .nodegroup_name("system")
        .scaling_config(scaling(1, 3, 3))
        .send()
        .await
        .unwrap()
        .update
        .unwrap();
    assert_eq!(
        update.r#type,
        Some(aws_sdk_eks::types::UpdateType::ConfigUpdate)
    );
    assert_eq!(status().await, Some(NodegroupStatus::Updating));
    set_time_scale(&sim_url, 600.0).await;
    wait_for("update done", || async {
        status().await == Some(NodegroupStatus::Active)
    })
    .await;
    let ng = eks
        .describe_nodegroup()
        .cluster_name("ml-1")
        .nodegroup_name("system")
        .send()
        .await
        .unwrap()
        .nodegroup
        .unwrap();
    assert_eq!(ng.scaling_config.unwrap().desired_size, Some(3));
    assert_eq!(
        ng.labels.unwrap().get("role").map(String::as_str),
        Some("system")
    );
    let err = eks
        .update_nodegroup_config()
        .cluster_name("ml-1")
        .nodegroup_name("system")
        .scaling_config(scaling(1, 5, 3))
        .send()
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("InvalidParameterException"));
    let listed = eks
        .list_nodegroups()
        .cluster_name("ml-1")
        .send()
        .await
        .unwrap()
        .nodegroups
        .unwrap();
    assert_eq!(listed, ["system"]);

    let err = eks.delete_cluster().name("ml-1").send().await.unwrap_err();
    assert_eq!(err.code(), Some("ResourceInUseException"));
    let deleted = eks
        .delete_nodegroup()
        .cluster_name("ml-1")
        .nodegroup_name("system")
        .send()
        .await
        .unwrap()
        .nodegroup
        .unwrap();
    assert_eq!(deleted.status, Some(NodegroupStatus::Deleting));
    wait_for("node group gone", || async { status().await.is_none() }).await;
    let err = eks
        .describe_nodegroup()
        .cluster_name("ml-1")
        .nodegroup_name("system")
        .send()
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("ResourceNotFoundException"));
    eks.delete_cluster().name("ml-1").send().await.unwrap();
}
