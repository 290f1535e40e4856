//! HyperPod's cluster-level settings through the real `aws-sdk-sagemaker` and what they
//! install on the EKS side, seen with kube-rs: AutoScaling, ClusterRole and
//! TieredStorageConfig are kept, returned and refused as the API documents; tiered
//! checkpointing's daemon comes and goes with its Mode; with autoscaling InService,
//! managed Karpenter serves NodePool and HyperpodNodeClass and scales an instance group
//! from 0 for a pending GPU pod and back to 0 once the pod is gone.

use std::time::Duration;

use crate::support::{
    active_cluster, eks_client, eks_cluster, eks_token, hyperpod_create, hyperpod_group,
    kube_client, moto, moto_call, network, refused, sdk_config, sim, wait_for, wait_pod_running,
    xml_tag,
};
use aws_sdk_sagemaker::Client;
use aws_sdk_sagemaker::operation::describe_cluster::DescribeClusterOutput;
use aws_sdk_sagemaker::types::{
    ClusterAutoScalerType, ClusterAutoScalingConfig, ClusterAutoScalingMode,
    ClusterAutoScalingStatus, ClusterConfigMode, ClusterInstanceGroupSpecification,
    ClusterInstanceType, ClusterNodeProvisioningMode, ClusterNodeRecovery, ClusterStatus,
    ClusterTieredStorageConfig,
};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, DynamicObject, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};

/// An IAM role in moto that HyperPod may assume for autoscaling, as AWS's guide sets it up.
async fn cluster_role(moto: &str, name: &str) -> String {
    let trust = json!({"Version": "2012-10-17", "Statement": [{"Effect": "Allow",
        "Principal": {"Service": "hyperpod.sagemaker.amazonaws.com"}, "Action": "sts:AssumeRole"}]})
    .to_string();
    let xml = moto_call(
        moto,
        "iam",
        &[
            ("Action", "CreateRole"),
            ("Version", "2010-05-08"),
            ("RoleName", name),
            ("AssumeRolePolicyDocument", &trust),
        ],
    )
    .await;
    xml_tag(&xml, "Arn")
}

/// A group with no deep health checks (autoscaling refuses those), of `count` nodes.
fn group(
    net: &crate::support::Network,
    name: &str,
    count: i32,
) -> ClusterInstanceGroupSpecification {
    let mut g = hyperpod_group(net, count, ClusterInstanceType::MlG58Xlarge);
    g.instance_group_name = Some(name.to_owned());
    g.on_start_deep_health_checks = None;
    g.threads_per_core = None;
    g
}

fn enable() -> ClusterAutoScalingConfig {
    ClusterAutoScalingConfig::builder()
        .mode(ClusterAutoScalingMode::Enable)
        .auto_scaler_type(ClusterAutoScalerType::Karpenter)
        .build()
        .unwrap()
}

fn tiered(mode: ClusterConfigMode, percentage: Option<i32>) -> ClusterTieredStorageConfig {
    ClusterTieredStorageConfig::builder()
        .mode(mode)
        .set_instance_memory_allocation_percentage(percentage)
        .build()
}

async fn describe(sm: &Client, name: &str) -> DescribeClusterOutput {
    sm.describe_cluster()
        .cluster_name(name)
        .send()
        .await
        .unwrap()
}

fn autoscaling_status(d: &DescribeClusterOutput) -> Option<ClusterAutoScalingStatus> {
    d.auto_scaling.as_ref().map(|a| a.status.clone())
}

async fn wait_in_service(sm: &Client, name: &str) {
    wait_for(&format!("{name} InService"), || async {
        describe(sm, name).await.cluster_status == Some(ClusterStatus::Inservice)
    })
    .await;
}

/// The target count of instance group `group`.
async fn target(sm: &Client, cluster: &str, group: &str) -> Option<i32> {
    describe(sm, cluster)
        .await
        .instance_groups
        .unwrap_or_default()
        .into_iter()
        .find(|g| g.instance_group_name.as_deref() == Some(group))
        .and_then(|g| g.target_count)
}

#[tokio::test(flavor = "multi_thread")]
async fn autoscaling_cluster_role_and_tiered_storage_round_trip() {
    let (_moto, moto_url) = moto();
    let net = network(&moto_url).await;
    let (_sim, sim_url) = sim(&moto_url, 600.0);
    let eks = eks_client(&sim_url).await;
    let sm = Client::new(&sdk_config(&sim_url).await);
    let (endpoint, ca) = active_cluster(&eks, &net, "ml-1").await;
    let eks_arn = eks_cluster(&eks, "ml-1").await.arn.unwrap();
    let client = kube_client(&endpoint, &ca, &eks_token("ml-1"));
    let role = cluster_role(&moto_url, "hypd-hyperpod-autoscaling").await;
    let other = cluster_role(&moto_url, "hypd-hyperpod-autoscaling-2").await;
    let create = || {
        hyperpod_create(&sm, "hp-1", &eks_arn, &net)
            .instance_groups(group(&net, "workers", 1))
            .node_provisioning_mode(ClusterNodeProvisioningMode::Continuous)
    };

    for (request, says) in [
        (create().auto_scaling(enable()), "requires a ClusterRole"),
        (
            hyperpod_create(&sm, "hp-1", &eks_arn, &net)
                .instance_groups(group(&net, "workers", 1))
                .auto_scaling(enable())
                .cluster_role(&role),
            "requires NodeProvisioningMode Continuous",
        ),
        (
            create()
                .auto_scaling(enable())
                .cluster_role(&role)
                .node_recovery(ClusterNodeRecovery::None),
            "requires NodeRecovery Automatic",
        ),
        (
            create()
                .auto_scaling(enable())
                .cluster_role("arn:aws:iam::123456789012:role/nobody"),
            "does not exist",
        ),
        (
            create().cluster_role("hypd-hyperpod-autoscaling"),
            "at 'clusterRole' failed to satisfy constraint",
        ),
        (
            create().tiered_storage_config(tiered(ClusterConfigMode::Enable, Some(101))),
            "Member must have value less than or equal to 100",
        ),
    ] {
        let (code, message) = refused(request.send().await.unwrap_err());
        assert_eq!(code, "ValidationException", "{message}");
        assert!(message.contains(says), "{says}: {message}");
    }

    create()
        .auto_scaling(enable())
        .cluster_role(&role)
        .tiered_storage_config(tiered(ClusterConfigMode::Enable, Some(50)))
        .send()
        .await
        .unwrap();
    let d = describe(&sm, "hp-1").await;
    assert_eq!(d.cluster_role.as_deref(), Some(role.as_str()));
    let a = d.auto_scaling.clone().unwrap();
    assert_eq!(a.mode, ClusterAutoScalingMode::Enable);
    assert_eq!(a.auto_scaler_type, Some(ClusterAutoScalerType::Karpenter));
    assert_eq!(a.status, ClusterAutoScalingStatus::Creating);
    assert_eq!(
        d.tiered_storage_config,
        Some(tiered(ClusterConfigMode::Enable, Some(50)))
    );
    wait_for("autoscaling InService", || async {
        autoscaling_status(&describe(&sm, "hp-1").await)
            == Some(ClusterAutoScalingStatus::Inservice)
    })
    .await;

    // The memory-management daemon runs on the cluster's node, told its share of memory.
    let daemonsets: Api<DaemonSet> = Api::namespaced(client.clone(), "kube-system");
    wait_for(
        "the tiered checkpointing daemon ready on the node",
        || async {
            daemonsets
                .get_opt("hyperpod-tiered-checkpointing")
                .await
                .unwrap()
                .and_then(|ds| ds.status)
                .is_some_and(|s| s.desired_number_scheduled == 1 && s.number_ready == 1)
        },
    )
    .await;
    let ds = serde_json::to_value(
        daemonsets
            .get("hyperpod-tiered-checkpointing")
            .await
            .unwrap(),
    )
    .unwrap();
    assert_eq!(
        ds["spec"]["template"]["spec"]["containers"][0]["env"],
        json!([{"name": "INSTANCE_MEMORY_ALLOCATION_PERCENTAGE", "value": "50"}])
    );

    let (code, message) = refused(
        sm.update_cluster()
            .cluster_name("hp-1")
            .cluster_role(&other)
            .send()
            .await
            .unwrap_err(),
    );
    assert_eq!(code, "ValidationException");
    assert!(
        message.contains("cannot be updated while autoscaling is enabled"),
        "{message}"
    );

    // An update naming only tiered storage changes only that.
    sm.update_cluster()
        .cluster_name("hp-1")
        .tiered_storage_config(tiered(ClusterConfigMode::Disable, None))
        .send()
        .await
        .unwrap();
    let d = describe(&sm, "hp-1").await;
    assert_eq!(d.cluster_status, Some(ClusterStatus::Updating));
    assert_eq!(
        d.tiered_storage_config,
        Some(tiered(ClusterConfigMode::Disable, None))
    );
    assert_eq!(d.cluster_role.as_deref(), Some(role.as_str()));
    assert_eq!(d.auto_scaling.unwrap().mode, ClusterAutoScalingMode::Enable);
    assert_eq!(d.node_recovery, Some(ClusterNodeRecovery::Automatic));
    let groups = d.instance_groups.unwrap();
    assert_eq!(groups.len(), 1);
    assert_eq!(groups[0].target_count, Some(1));
    wait_in_service(&sm, "hp-1").await;
    wait_for("the daemon removed", || async {
        daemonsets
            .get_opt("hyperpod-tiered-checkpointing")
            .await
            .unwrap()
            .is_none()
    })
    .await;

    // Disabled, autoscaling is removed; then the role may change.
    sm.update_cluster()
        .cluster_name("hp-1")
        .auto_scaling(
            ClusterAutoScalingConfig::builder()
                .mode(ClusterAutoScalingMode::Disable)
                .build()
                .unwrap(),
        )
        .send()
        .await
        .unwrap();
    let a = describe(&sm, "hp-1").await.auto_scaling.unwrap();
    assert_eq!(
        (a.mode, a.status),
        (
            ClusterAutoScalingMode::Disable,
            ClusterAutoScalingStatus::Deleting
        )
    );
    wait_for("autoscaling gone", || async {
        describe(&sm, "hp-1").await.auto_scaling.is_none()
    })
    .await;
    wait_in_service(&sm, "hp-1").await;
    sm.update_cluster()
        .cluster_name("hp-1")
        .cluster_role(&other)
        .send()
        .await
        .unwrap();
    assert_eq!(
        describe(&sm, "hp-1").await.cluster_role.as_deref(),
        Some(other.as_str())
    );
}

fn resource(group: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, "v1", kind), plural)
}

fn condition<'a>(o: &'a DynamicObject, kind: &str) -> Option<&'a Value> {
    o.data["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind)
}

/// Waits until the object's `kind` condition has `status`, and returns the object.
async fn wait_condition(
    api: &Api<DynamicObject>,
    name: &str,
    kind: &str,
    status: &str,
) -> DynamicObject {
    wait_for(&format!("{name} {kind}={status}"), || async {
        api.get_opt(name)
            .await
            .unwrap()
            .is_some_and(|o| condition(&o, kind).is_some_and(|c| c["status"] == status))
    })
    .await;
    api.get(name).await.unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn managed_karpenter_scales_a_group_from_zero_for_a_pending_gpu_pod_and_back() {
    let (_moto, moto_url) = moto();
    let net = network(&moto_url).await;
    let (_sim, sim_url) = sim(&moto_url, 600.0);
    let eks = eks_client(&sim_url).await;
    let sm = Client::new(&sdk_config(&sim_url).await);
    let (endpoint, ca) = active_cluster(&eks, &net, "ml-1").await;
    let eks_arn = eks_cluster(&eks, "ml-1").await.arn.unwrap();
    let client = kube_client(&endpoint, &ca, &eks_token("ml-1"));
    let role = cluster_role(&moto_url, "hypd-hyperpod-autoscaling").await;
    let mut checked = hyperpod_group(&net, 0, ClusterInstanceType::MlG58Xlarge);
    checked.instance_group_name = Some("checked".into());
    checked.threads_per_core = None;
    hyperpod_create(&sm, "hp-1", &eks_arn, &net)
        .instance_groups(group(&net, "gpu", 0))
        .instance_groups(checked)
        .node_provisioning_mode(ClusterNodeProvisioningMode::Continuous)
        .cluster_role(&role)
        .auto_scaling(enable())
        .send()
        .await
        .unwrap();

    // Karpenter's resources are served once autoscaling is InService.
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    assert!(
        crds.get_opt("nodepools.karpenter.sh")
            .await
            .unwrap()
            .is_none()
    );
    wait_for("autoscaling InService", || async {
        autoscaling_status(&describe(&sm, "hp-1").await)
            == Some(ClusterAutoScalingStatus::Inservice)
    })
    .await;
    for name in [
        "nodepools.karpenter.sh",
        "hyperpodnodeclasses.karpenter.sagemaker.amazonaws.com",
    ] {
        wait_for(name, || async {
            crds.get_opt(name).await.unwrap().is_some()
        })
        .await;
    }
    let classes: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &resource(
            "karpenter.sagemaker.amazonaws.com",
            "HyperpodNodeClass",
            "hyperpodnodeclasses",
        ),
    );
    let pools: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &resource("karpenter.sh", "NodePool", "nodepools"),
    );
    let class = |name: &str, groups: Vec<String>| -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "karpenter.sagemaker.amazonaws.com/v1", "kind": "HyperpodNodeClass",
            "metadata": {"name": name}, "spec": {"instanceGroups": groups},
        }))
        .unwrap()
    };

    // At most ten groups; groups that do not exist or run deep health checks keep a class
    // from being Ready.
    let eleven = (0..11).map(|i| format!("g{i}")).collect();
    let err = classes
        .create(&PostParams::default(), &class("many", eleven))
        .await
        .unwrap_err();
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 422),
        "{err:?}"
    );
    classes
        .create(
            &PostParams::default(),
            &class("broken", vec!["checked".into(), "nope".into()]),
        )
        .await
        .unwrap();
    let broken = wait_condition(&classes, "broken", "Ready", "False").await;
    let groups_ready = condition(&broken, "InstanceGroupReady").unwrap();
    assert_eq!(groups_ready["reason"], "InstanceGroupNotFound");
    let message = groups_ready["message"].as_str().unwrap();
    assert!(
        message.contains("nope") && message.contains("deep health checks"),
        "{message}"
    );

    classes
        .create(&PostParams::default(), &class("gpu", vec!["gpu".into()]))
        .await
        .unwrap();
    let ready = wait_condition(&classes, "gpu", "Ready", "True").await;
    let entry = &ready.data["status"]["instanceGroups"][0];
    assert_eq!(entry["name"], "gpu");
    assert_eq!(entry["instanceTypes"], json!(["ml.g5.8xlarge"]));
    assert_eq!(entry["subnets"][0]["id"], net.subnets[0].as_str());
    assert_eq!(entry["subnets"][0]["zone"], "us-east-1a");

    let pool: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": "gpu"},
        "spec": {
            "template": {"spec": {
                "nodeClassRef": {"group": "karpenter.sagemaker.amazonaws.com", "kind": "HyperpodNodeClass", "name": "gpu"},
                "requirements": [{"key": "node.kubernetes.io/instance-type", "operator": "Exists"}],
            }},
            // 1,800 sim seconds: three real seconds at this sim's speed.
            "disruption": {"consolidateAfter": "30m"},
        },
    }))
    .unwrap();
    pools.create(&PostParams::default(), &pool).await.unwrap();
    wait_condition(&pools, "gpu", "Ready", "True").await;
    assert_eq!(target(&sm, "hp-1", "gpu").await, Some(0));

    // A pod asking for a GPU nothing has raises the group, and runs on its new node.
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "train"},
        "spec": {"containers": [{"name": "main", "image": "pytorch/pytorch",
                                  "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    wait_for("the gpu group raised to 1", || async {
        target(&sm, "hp-1", "gpu").await == Some(1)
    })
    .await;
    wait_pod_running(&pods, "train").await;
    let node_name = pods
        .get("train")
        .await
        .unwrap()
        .spec
        .unwrap()
        .node_name
        .unwrap();
    assert!(node_name.starts_with("hyperpod-i-"), "{node_name}");
    let nodes: Api<Node> = Api::all(client.clone());
    let labels = nodes
        .get(&node_name)
        .await
        .unwrap()
        .metadata
        .labels
        .unwrap();
    assert_eq!(labels["karpenter.sh/nodepool"], "gpu");
    assert_eq!(labels["sagemaker.amazonaws.com/instance-group-name"], "gpu");
    wait_for("the pool counts its node", || async {
        pools.get("gpu").await.unwrap().data["status"]["nodes"] == 1
    })
    .await;
    assert_eq!(
        target(&sm, "hp-1", "gpu").await,
        Some(1),
        "one node is enough"
    );
    assert_eq!(target(&sm, "hp-1", "checked").await, Some(0));

    // Without the pod, the node is consolidated away after consolidateAfter, to 0.
    pods.delete("train", &DeleteParams::default())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        target(&sm, "hp-1", "gpu").await,
        Some(1),
        "not before consolidateAfter"
    );
    wait_for("the gpu group back to 0", || async {
        target(&sm, "hp-1", "gpu").await == Some(0)
    })
    .await;
    wait_for("its node gone", || async {
        nodes.get_opt(&node_name).await.unwrap().is_none()
    })
    .await;
}
