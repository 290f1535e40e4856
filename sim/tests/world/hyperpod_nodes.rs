//! The real `aws-sdk-sagemaker` client drives HyperPod node actions against hypd-sim:
//! reboot, replace and delete with per-node failures (unknown nodes, nodes of another
//! cluster, nodes already busy), a platform software update rolling over the nodes,
//! and a throttled call absorbed by the SDK's retry. ListClusterNodes pages through the
//! SDK's paginator, each node's zone and address agree between DescribeClusterNode and
//! its Kubernetes Node, and a group's Kubernetes labels and taints follow UpdateCluster
//! onto its Nodes beside what kubectl added. A health-agent fault marks a Node for
//! reboot or replacement until BatchReplaceClusterNodes recovers it, with the agent's
//! fault labels, condition and Event (the condition False once a reboot recovered it),
//! and a user's node-health-status label gets a node rebooted, with a new boot ID.

use crate::support::{
    active_cluster, active_eks_cluster, control, eks_client, eks_cluster, eks_token,
    hyperpod_create, hyperpod_group, hyperpod_ready, inject, kube_client, moto, moto_call, network,
    sagemaker_client, set_time_scale, sim, wait_for, xml_tag,
};
use aws_sdk_sagemaker::Client;
use aws_sdk_sagemaker::error::ProvideErrorMetadata;
use aws_sdk_sagemaker::types::{
    CapacitySizeConfig, ClusterInstanceStatus, ClusterInstanceType, ClusterKubernetesConfig,
    ClusterKubernetesTaint, ClusterKubernetesTaintEffect, ClusterNodeRecovery, ClusterStatus,
    DeploymentConfiguration, InstanceGroupStatus, NodeUnavailabilityType, RollingDeploymentPolicy,
    SortOrder, UpdateClusterSoftwareInstanceGroupSpecification, VpcConfig,
};
use k8s_openapi::api::core::v1::{Event, Node};
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;

const SCALE: f64 = 600.0;

async fn node_ids(sm: &Client, cluster: &str) -> Vec<(String, String)> {
    sm.list_cluster_nodes()
        .cluster_name(cluster)
        .send()
        .await
        .unwrap()
        .cluster_node_summaries
        .unwrap_or_default()
        .into_iter()
        .map(|n| (n.instance_id.unwrap(), n.node_logical_id.unwrap()))
        .collect()
}

async fn node_status(sm: &Client, cluster: &str, id: &str) -> ClusterInstanceStatus {
    sm.describe_cluster_node()
        .cluster_name(cluster)
        .node_id(id)
        .send()
        .await
        .unwrap()
        .node_details
        .unwrap()
        .instance_status
        .unwrap()
        .status
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn node_actions_and_software_update() {
    let (_moto, moto_url) = moto();
    let net = network(&moto_url).await;
    let (_sim, sim_url) = sim(&moto_url, SCALE);
    let eks = eks_client(&sim_url).await;
    let sm = sagemaker_client(&sim_url).await;
    let eks_arn = active_eks_cluster(&eks, &net, "ml").await;

    let mut old = hyperpod_group(&net, 3, ClusterInstanceType::MlP548Xlarge);
    old.image_release_version = Some("2025.06.04".into());
    hyperpod_create(&sm, "hp-a", &eks_arn, &net)
        .instance_groups(old)
        .send()
        .await
        .unwrap();
    hyperpod_create(&sm, "hp-b", &eks_arn, &net)
        .instance_groups(hyperpod_group(&net, 1, ClusterInstanceType::MlG58Xlarge))
        .send()
        .await
        .unwrap();
    hyperpod_ready(&sm, "hp-a").await;
    hyperpod_ready(&sm, "hp-b").await;
    let a = node_ids(&sm, "hp-a").await;
    let b = node_ids(&sm, "hp-b").await;
    assert_eq!((a.len(), b.len()), (3, 1));

    // A throttled reboot is retried by the SDK and goes through.
    inject(
        &sim_url,
        json!({"service": "sagemaker", "operation": "BatchRebootClusterNodes", "kind": "throttle"}),
    )
    .await;
    set_time_scale(&sim_url, 0.0).await;
    let out = sm
        .batch_reboot_cluster_nodes()
        .cluster_name("hp-a")
        .node_ids(&a[0].0)
        .send()
        .await
        .unwrap();
    assert_eq!(out.successful(), [a[0].0.clone()]);
    assert!(out.failed().is_empty());
    let faults = control(&sim_url, reqwest::Method::GET, "/_sim/faults", json!({})).await;
    assert_eq!(faults["faults"], json!([]), "the throttle was consumed");
    assert_eq!(
        node_status(&sm, "hp-a", &a[0].0).await,
        ClusterInstanceStatus::Pending
    );

    // A node already rebooting, an unknown node and another cluster's node fail one by one.
    let out = sm
        .batch_reboot_cluster_nodes()
        .cluster_name("hp-a")
        .node_ids(&a[0].0)
        .node_ids("i-0000000000000dead")
        .node_ids(&b[0].0)
        .send()
        .await
        .unwrap();
    assert!(out.successful().is_empty());
    let failed: Vec<(String, String)> = out
        .failed()
        .iter()
        .map(|f| {
            (
                f.node_id().unwrap().to_owned(),
                f.error_code().unwrap().as_str().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        failed,
        [
            (a[0].0.clone(), "InstanceIdInUse".to_owned()),
            (
                "i-0000000000000dead".to_owned(),
                "InstanceIdNotFound".to_owned()
            ),
            (b[0].0.clone(), "InstanceIdNotFound".to_owned()),
        ]
    );
    assert!(
        out.failed()[2].message().unwrap().contains("hp-b"),
        "{:?}",
        out.failed()[2].message()
    );

    // Replace: the node shuts down, then comes back as a new instance in the same slot.
    let out = sm
        .batch_replace_cluster_nodes()
        .cluster_name("hp-a")
        .node_ids(&a[1].0)
        .send()
        .await
        .unwrap();
    assert_eq!(out.successful(), [a[1].0.clone()]);
    assert_eq!(
        node_status(&sm, "hp-a", &a[1].0).await,
        ClusterInstanceStatus::ShuttingDown
    );
    set_time_scale(&sim_url, SCALE).await;
    hyperpod_ready(&sm, "hp-a").await;
    let after = node_ids(&sm, "hp-a").await;
    assert_eq!(after.len(), 3);
    assert!(after.contains(&a[0]), "the rebooted node keeps its id");
    assert!(!after.iter().any(|(id, _)| *id == a[1].0), "{after:?}");
    let replaced = after.iter().find(|(_, l)| *l == a[1].1).unwrap();
    assert_ne!(replaced.0, a[1].0, "a replaced node gets a new instance id");

    // Delete by instance id and by logical id; the group shrinks.
    let out = sm
        .batch_delete_cluster_nodes()
        .cluster_name("hp-a")
        .node_ids(&a[2].0)
        .node_ids("i-0000000000000beef")
        .node_logical_ids(&a[0].1)
        .send()
        .await
        .unwrap();
    assert_eq!(out.successful(), [a[2].0.clone()]);
    assert_eq!(out.successful_node_logical_ids(), [a[0].1.clone()]);
    assert_eq!(out.failed().len(), 1);
    assert_eq!(out.failed()[0].code().unwrap().as_str(), "NodeIdNotFound");
    assert_eq!(out.failed()[0].node_id(), Some("i-0000000000000beef"));
    let remaining = node_ids(&sm, "hp-a").await;
    assert_eq!(remaining.as_slice(), std::slice::from_ref(replaced));
    let d = sm
        .describe_cluster()
        .cluster_name("hp-a")
        .send()
        .await
        .unwrap();
    let g = &d.instance_groups()[0];
    assert_eq!((g.target_count, g.current_count), (Some(1), Some(1)));
    let err = sm
        .batch_delete_cluster_nodes()
        .cluster_name("hp-a")
        .send()
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("ValidationException"));
    let err = sm
        .batch_replace_cluster_nodes()
        .cluster_name("hp-a")
        .node_ids("i-nope")
        .send()
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("ValidationException"));
    assert!(
        err.message().unwrap().contains("at 'nodeIds'"),
        "{:?}",
        err.message()
    );

    // The platform software update rolls the group to a newer release.
    set_time_scale(&sim_url, 0.0).await;
    sm.update_cluster_software()
        .cluster_name("hp-a")
        .instance_groups(
            UpdateClusterSoftwareInstanceGroupSpecification::builder()
                .instance_group_name("gpu")
                .image_release_version("2025.11.20")
                .build(),
        )
        .deployment_config(
            DeploymentConfiguration::builder()
                .rolling_update_policy(
                    RollingDeploymentPolicy::builder()
                        .maximum_batch_size(
                            CapacitySizeConfig::builder()
                                .r#type(NodeUnavailabilityType::CapacityPercentage)
                                .value(50)
                                .build(),
                        )
                        .build(),
                )
                .wait_interval_in_seconds(0)
                .build(),
        )
        .send()
        .await
        .unwrap();
    let d = sm
        .describe_cluster()
        .cluster_name("hp-a")
        .send()
        .await
        .unwrap();
    assert_eq!(d.cluster_status, Some(ClusterStatus::Systemupdating));
    let g = &d.instance_groups()[0];
    assert_eq!(g.status, Some(InstanceGroupStatus::Systemupdating));
    assert_eq!(
        g.current_image_release_version.as_deref(),
        Some("2025.06.04")
    );
    assert_eq!(
        g.desired_image_release_version.as_deref(),
        Some("2025.11.20")
    );
    assert_eq!(
        node_status(&sm, "hp-a", &replaced.0).await,
        ClusterInstanceStatus::SystemUpdating
    );
    let err = sm
        .update_cluster_software()
        .cluster_name("hp-a")
        .send()
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("ConflictException"), "{:?}", err.message());
    let err = sm
        .update_cluster_software()
        .cluster_name("hp-b")
        .instance_groups(
            UpdateClusterSoftwareInstanceGroupSpecification::builder()
                .instance_group_name("cpu")
                .build(),
        )
        .send()
        .await
        .unwrap_err();
    assert_eq!(
        err.code(),
        Some("ValidationException"),
        "{:?}",
        err.message()
    );
    set_time_scale(&sim_url, SCALE).await;
    hyperpod_ready(&sm, "hp-a").await;
    wait_for("release applied", || async {
        let d = sm
            .describe_cluster()
            .cluster_name("hp-a")
            .send()
            .await
            .unwrap();
        d.instance_groups()[0]
            .current_image_release_version
            .as_deref()
            == Some("2025.11.20")
    })
    .await;
    let node = sm
        .describe_cluster_node()
        .cluster_name("hp-a")
        .node_id(&replaced.0)
        .send()
        .await
        .unwrap()
        .node_details
        .unwrap();
    assert_eq!(
        node.current_image_release_version.as_deref(),
        Some("2025.11.20")
    );

    let err = sm
        .batch_reboot_cluster_nodes()
        .cluster_name("absent")
        .node_ids(&a[0].0)
        .send()
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("ResourceNotFound"));
}

/// moto's zone id for `zone` (`use1-az6` for us-east-1a), through its own DescribeSubnets.
async fn zone_id_of(moto_url: &str, subnet: &str) -> String {
    let xml = moto_call(
        moto_url,
        "ec2",
        &[
            ("Action", "DescribeSubnets"),
            ("Version", "2016-11-15"),
            ("SubnetId.1", subnet),
        ],
    )
    .await;
    xml_tag(&xml, "availabilityZoneId")
}

#[tokio::test(flavor = "multi_thread")]
async fn nodes_page_and_run_in_their_groups_zone() {
    let (_moto, moto_url) = moto();
    let net = network(&moto_url).await;
    let (_sim, sim_url) = sim(&moto_url, SCALE);
    let eks = eks_client(&sim_url).await;
    let sm = sagemaker_client(&sim_url).await;
    let (endpoint, ca) = active_cluster(&eks, &net, "ml").await;
    let eks_arn = eks_cluster(&eks, "ml").await.arn.unwrap();

    // "gpu" overrides the cluster's subnets (us-east-1a first) with the one in us-east-1b.
    let mut gpu = hyperpod_group(&net, 3, ClusterInstanceType::MlG58Xlarge);
    gpu.on_start_deep_health_checks = None;
    gpu.override_vpc_config = Some(
        VpcConfig::builder()
            .subnets(&net.subnets[1])
            .security_group_ids(&net.security_group)
            .build(),
    );
    let mut cpu = hyperpod_group(&net, 2, ClusterInstanceType::MlM52Xlarge);
    cpu.instance_group_name = Some("cpu".into());
    cpu.on_start_deep_health_checks = None;
    cpu.threads_per_core = None;
    hyperpod_create(&sm, "hp", &eks_arn, &net)
        .instance_groups(gpu)
        .instance_groups(cpu)
        .send()
        .await
        .unwrap();
    hyperpod_ready(&sm, "hp").await;

    let all = sm
        .list_cluster_nodes()
        .cluster_name("hp")
        .send()
        .await
        .unwrap();
    assert_eq!(all.next_token(), None);
    let all = all.cluster_node_summaries.unwrap();
    assert_eq!(all.len(), 5);
    let paged: Vec<_> = sm
        .list_cluster_nodes()
        .cluster_name("hp")
        .max_results(2)
        .into_paginator()
        .items()
        .send()
        .try_collect()
        .await
        .unwrap();
    assert_eq!(
        paged, all,
        "three pages of the SDK's paginator list what one call does"
    );
    let newest_first = sm
        .list_cluster_nodes()
        .cluster_name("hp")
        .sort_order(SortOrder::Descending)
        .send()
        .await
        .unwrap()
        .cluster_node_summaries
        .unwrap();
    let launches: Vec<_> = newest_first
        .iter()
        .map(|n| n.launch_time.unwrap())
        .collect();
    assert!(launches.windows(2).all(|w| w[0] >= w[1]), "{launches:?}");
    for bad in [0, 101] {
        let err = sm
            .list_cluster_nodes()
            .cluster_name("hp")
            .max_results(bad)
            .send()
            .await
            .unwrap_err();
        assert_eq!(err.code(), Some("ValidationException"), "{bad}");
    }
    let err = sm
        .list_cluster_nodes()
        .cluster_name("hp")
        .next_token("not-a-token")
        .send()
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("ValidationException"));

    let zones = [
        (
            "us-east-1b",
            zone_id_of(&moto_url, &net.subnets[1]).await,
            "10.0.1.",
        ),
        (
            "us-east-1a",
            zone_id_of(&moto_url, &net.subnets[0]).await,
            "10.0.0.",
        ),
    ];
    let client = kube_client(&endpoint, &ca, &eks_token("ml"));
    let kube_nodes: Api<Node> = Api::all(client);
    wait_for("five HyperPod Nodes", || async {
        kube_nodes
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len()
            == 5
    })
    .await;
    for n in &all {
        let id = n.instance_id().unwrap();
        let d = sm
            .describe_cluster_node()
            .cluster_name("hp")
            .node_id(id)
            .send()
            .await
            .unwrap()
            .node_details
            .unwrap();
        let (zone, zone_id, net_prefix) = if n.instance_group_name() == Some("gpu") {
            &zones[0]
        } else {
            &zones[1]
        };
        let placement = d.placement().unwrap();
        assert_eq!(placement.availability_zone(), Some(*zone));
        assert_eq!(placement.availability_zone_id(), Some(zone_id.as_str()));
        let ip = d.private_primary_ip().unwrap();
        assert!(ip.starts_with(net_prefix), "{ip}");
        let dns = format!("ip-{}.ec2.internal", ip.replace('.', "-"));
        assert_eq!(n.private_dns_hostname(), Some(dns.as_str()));
        assert_eq!(d.private_dns_hostname(), Some(dns.as_str()));

        let node = kube_nodes.get(&format!("hyperpod-{id}")).await.unwrap();
        let labels = node.metadata.labels.unwrap();
        assert_eq!(labels["topology.kubernetes.io/zone"], *zone);
        assert_eq!(labels["topology.k8s.aws/zone-id"], *zone_id);
        assert_eq!(labels["topology.kubernetes.io/region"], "us-east-1");
        let provider = node.spec.unwrap().provider_id.unwrap();
        assert!(
            provider.starts_with(&format!("aws:///{zone}/")),
            "{provider}"
        );
        let addresses = node.status.unwrap().addresses.unwrap();
        assert_eq!(
            (addresses[0].type_.as_str(), addresses[0].address.as_str()),
            ("InternalIP", ip)
        );
    }
}

fn taint(key: &str, effect: ClusterKubernetesTaintEffect) -> ClusterKubernetesTaint {
    ClusterKubernetesTaint::builder()
        .key(key)
        .value("true")
        .effect(effect)
        .build()
        .unwrap()
}

/// The Node's labels and its taints as `key=value:Effect`.
async fn labels_and_taints(
    nodes: &Api<Node>,
    name: &str,
) -> (std::collections::BTreeMap<String, String>, Vec<String>) {
    let node = nodes.get(name).await.unwrap();
    let taints = node
        .spec
        .and_then(|s| s.taints)
        .unwrap_or_default()
        .into_iter()
        .map(|t| format!("{}={}:{}", t.key, t.value.unwrap_or_default(), t.effect))
        .collect();
    (node.metadata.labels.unwrap_or_default(), taints)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_groups_kubernetes_labels_and_taints_follow_it_onto_its_nodes() {
    let (_moto, moto_url) = moto();
    let net = network(&moto_url).await;
    let (_sim, sim_url) = sim(&moto_url, SCALE);
    let eks = eks_client(&sim_url).await;
    let sm = sagemaker_client(&sim_url).await;
    let (endpoint, ca) = active_cluster(&eks, &net, "ml").await;
    let eks_arn = eks_cluster(&eks, "ml").await.arn.unwrap();

    let mut gpu = hyperpod_group(&net, 1, ClusterInstanceType::MlG58Xlarge);
    gpu.on_start_deep_health_checks = None;
    gpu.min_instance_count = Some(1);
    gpu.kubernetes_config = Some(
        ClusterKubernetesConfig::builder()
            .labels("team", "a")
            .labels("tier", "1")
            .taints(taint("gpu", ClusterKubernetesTaintEffect::NoSchedule))
            .build(),
    );
    hyperpod_create(&sm, "hp", &eks_arn, &net)
        .instance_groups(gpu.clone())
        .send()
        .await
        .unwrap();
    hyperpod_ready(&sm, "hp").await;
    let id = node_ids(&sm, "hp").await.remove(0).0;
    let name = format!("hyperpod-{id}");
    let nodes: Api<Node> = Api::all(kube_client(&endpoint, &ca, &eks_token("ml")));
    wait_for("the gpu group's Node", || async {
        nodes.get_opt(&name).await.unwrap().is_some()
    })
    .await;
    let (labels, taints) = labels_and_taints(&nodes, &name).await;
    assert_eq!(
        (labels["team"].as_str(), labels["tier"].as_str()),
        ("a", "1")
    );
    assert_eq!(taints, ["gpu=true:NoSchedule"]);
    let d = sm
        .describe_cluster()
        .cluster_name("hp")
        .send()
        .await
        .unwrap();
    assert_eq!(d.instance_groups()[0].min_count(), Some(1));
    let k = d.instance_groups()[0].kubernetes_config().unwrap();
    assert_eq!(k.current_labels().unwrap()["team"], "a");
    assert_eq!(k.desired_taints()[0].key(), "gpu");

    // What a user adds with kubectl is theirs to keep.
    nodes
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({
                "metadata": {"labels": {"owner": "me"}},
                "spec": {"taints": [
                    {"key": "gpu", "value": "true", "effect": "NoSchedule"},
                    {"key": "mine", "value": "x", "effect": "NoExecute"}
                ]}
            })),
        )
        .await
        .unwrap();

    // The group moves to team=b, drops tier and the gpu taint, and gains a spot taint.
    gpu.kubernetes_config = Some(
        ClusterKubernetesConfig::builder()
            .labels("team", "b")
            .taints(taint(
                "spot",
                ClusterKubernetesTaintEffect::PreferNoSchedule,
            ))
            .build(),
    );
    sm.update_cluster()
        .cluster_name("hp")
        .instance_groups(gpu)
        .send()
        .await
        .unwrap();
    wait_for("the Node to follow its group", || async {
        let (labels, _) = labels_and_taints(&nodes, &name).await;
        labels.get("team").map(String::as_str) == Some("b")
    })
    .await;
    let (labels, mut taints) = labels_and_taints(&nodes, &name).await;
    assert!(!labels.contains_key("tier"), "{labels:?}");
    assert_eq!(labels["owner"], "me");
    assert_eq!(labels["sagemaker.amazonaws.com/instance-group-name"], "gpu");
    taints.sort();
    assert_eq!(taints, ["mine=x:NoExecute", "spot=true:PreferNoSchedule"]);
    hyperpod_ready(&sm, "hp").await;
    let d = sm
        .describe_cluster()
        .cluster_name("hp")
        .send()
        .await
        .unwrap();
    let k = d.instance_groups()[0].kubernetes_config().unwrap();
    assert_eq!(k.current_labels(), k.desired_labels());
    assert_eq!(k.desired_labels().unwrap().len(), 1);
    assert_eq!(k.current_taints()[0].key(), "spot");
    // Settled, the Node is not written again tick after tick.
    let version = nodes.get(&name).await.unwrap().metadata.resource_version;
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let again = nodes.get(&name).await.unwrap().metadata.resource_version;
    assert_eq!(again, version);
}

async fn node_fault(sim_url: &str, cluster: &str, id: &str, recovery: &str) -> reqwest::Response {
    node_fault_with(sim_url, cluster, id, json!({ "recovery": recovery })).await
}

async fn node_fault_with(
    sim_url: &str,
    cluster: &str,
    id: &str,
    body: serde_json::Value,
) -> reqwest::Response {
    reqwest::Client::new()
        .put(format!(
            "{sim_url}/_sim/sagemaker/clusters/{cluster}/nodes/{id}/fault"
        ))
        .json(&body)
        .send()
        .await
        .unwrap()
}

/// The Node's condition of type `kind`, as (status, reason, message).
async fn fault_condition(
    nodes: &Api<Node>,
    name: &str,
    kind: &str,
) -> Option<(String, String, String)> {
    let node = nodes.get_opt(name).await.unwrap()?;
    let c = node
        .status?
        .conditions?
        .into_iter()
        .find(|c| c.type_ == kind)?;
    Some((
        c.status,
        c.reason.unwrap_or_default(),
        c.message.unwrap_or_default(),
    ))
}

async fn health_and_boot(nodes: &Api<Node>, name: &str) -> Option<(String, String)> {
    let node = nodes.get_opt(name).await.unwrap()?;
    let health = node.metadata.labels?["sagemaker.amazonaws.com/node-health-status"].clone();
    Some((health, node.status?.node_info?.boot_id))
}

#[tokio::test(flavor = "multi_thread")]
async fn health_faults_wait_for_recovery_and_labels_ask_for_it() {
    let (_moto, moto_url) = moto();
    let net = network(&moto_url).await;
    let (_sim, sim_url) = sim(&moto_url, SCALE);
    let eks = eks_client(&sim_url).await;
    let sm = sagemaker_client(&sim_url).await;
    let (endpoint, ca) = active_cluster(&eks, &net, "ml").await;
    let eks_arn = eks_cluster(&eks, "ml").await.arn.unwrap();
    let mut group = hyperpod_group(&net, 2, ClusterInstanceType::MlG58Xlarge);
    group.on_start_deep_health_checks = None;
    hyperpod_create(&sm, "hp", &eks_arn, &net)
        .instance_groups(group)
        .node_recovery(ClusterNodeRecovery::None)
        .send()
        .await
        .unwrap();
    hyperpod_ready(&sm, "hp").await;
    let ids: Vec<String> = node_ids(&sm, "hp")
        .await
        .into_iter()
        .map(|(i, _)| i)
        .collect();
    let nodes: Api<Node> = Api::all(kube_client(&endpoint, &ca, &eks_token("ml")));
    let (a, b) = (
        format!("hyperpod-{}", ids[0]),
        format!("hyperpod-{}", ids[1]),
    );
    wait_for("both Nodes", || async {
        nodes.get_opt(&a).await.unwrap().is_some() && nodes.get_opt(&b).await.unwrap().is_some()
    })
    .await;

    let missing = node_fault(&sim_url, "hp", "i-0123456789abcdef0", "reboot").await;
    assert_eq!(missing.status(), 404);
    let body: serde_json::Value = missing.json().await.unwrap();
    assert_eq!(body["__type"], "ResourceNotFound");
    assert_eq!(
        node_fault(&sim_url, "nope", &ids[0], "reboot")
            .await
            .status(),
        404
    );

    // Without automatic recovery the faulty node waits for BatchReplaceClusterNodes.
    assert!(
        node_fault(&sim_url, "hp", &ids[0], "replace")
            .await
            .status()
            .is_success()
    );
    wait_for("the Node marked for replacement", || async {
        health_and_boot(&nodes, &a).await.map(|(h, _)| h)
            == Some("UnschedulablePendingReplacement".into())
    })
    .await;
    let (labels, taints) = labels_and_taints(&nodes, &a).await;
    assert_eq!(
        taints,
        ["sagemaker.amazonaws.com/node-health-status=UnschedulablePendingReplacement:NoSchedule"]
    );
    assert_eq!(
        labels["sagemaker.amazonaws.com/fault-type"],
        "NvidiaErrorTerminate"
    );
    assert_eq!(
        labels["sagemaker.amazonaws.com/fault-reason"],
        "XidHardwareFailure"
    );
    let (status, reason, message) = fault_condition(&nodes, &a, "NvidiaErrorTerminate")
        .await
        .unwrap();
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("True", "XidHardwareFailure")
    );
    assert!(message.contains("GPU has fallen off the bus"), "{message}");
    let events: Api<Event> = Api::namespaced(nodes.clone().into_client(), "default");
    let reported: Vec<Event> = events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.involved_object.name.as_deref() == Some(a.as_str()))
        .collect();
    assert_eq!(reported.len(), 1);
    let e = &reported[0];
    assert_eq!(
        (
            e.type_.as_deref(),
            e.reason.as_deref(),
            e.message.as_deref()
        ),
        (
            Some("Warning"),
            Some("XidHardwareFailure"),
            Some(message.as_str())
        )
    );
    assert_eq!(e.involved_object.kind.as_deref(), Some("Node"));
    let source = e.source.clone().unwrap();
    assert_eq!(
        (source.component.as_deref(), source.host.as_deref()),
        (Some("sagemaker-health-monitoring-agent"), Some(a.as_str()))
    );
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert_eq!(
        node_status(&sm, "hp", &ids[0]).await,
        ClusterInstanceStatus::Failure
    );
    let out = sm
        .batch_replace_cluster_nodes()
        .cluster_name("hp")
        .node_ids(&ids[0])
        .send()
        .await
        .unwrap();
    assert_eq!(out.successful(), [ids[0].clone()]);
    wait_for("the replacement's Node, Schedulable", || async {
        let now = node_ids(&sm, "hp").await;
        let Some((new, _)) = now.iter().find(|(i, _)| *i != ids[0] && *i != ids[1]) else {
            return false;
        };
        nodes.get_opt(&a).await.unwrap().is_none()
            && health_and_boot(&nodes, &format!("hyperpod-{new}"))
                .await
                .map(|(h, _)| h)
                == Some("Schedulable".into())
    })
    .await;

    // A fault a reboot recovers from: the condition stays, False, and the fault labels go.
    let ecc = "NVRM: Xid (PCI:0000:10:00): 48, pid=<unknown>, name=<unknown>, DBE";
    let body = json!({ "recovery": "reboot", "fault_reason": "XidEccError", "message": ecc });
    assert!(
        node_fault_with(&sim_url, "hp", &ids[1], body)
            .await
            .status()
            .is_success()
    );
    wait_for("the Node's fault condition", || async {
        fault_condition(&nodes, &b, "NvidiaErrorReboot").await
            == Some(("True".into(), "XidEccError".into(), ecc.into()))
    })
    .await;
    sm.batch_reboot_cluster_nodes()
        .cluster_name("hp")
        .node_ids(&ids[1])
        .send()
        .await
        .unwrap();
    wait_for("the rebooted Node's fault condition False", || async {
        fault_condition(&nodes, &b, "NvidiaErrorReboot").await
            == Some(("False".into(), "XidEccError".into(), ecc.into()))
    })
    .await;
    let (labels, taints) = labels_and_taints(&nodes, &b).await;
    assert_eq!(
        labels["sagemaker.amazonaws.com/node-health-status"],
        "Schedulable"
    );
    assert!(
        !labels.contains_key("sagemaker.amazonaws.com/fault-type"),
        "{labels:?}"
    );
    assert!(
        !labels.contains_key("sagemaker.amazonaws.com/fault-reason"),
        "{labels:?}"
    );
    assert!(taints.is_empty(), "{taints:?}");
    let annotations = nodes.get(&b).await.unwrap().metadata.annotations.unwrap();
    assert!(
        annotations["sagemaker.amazonaws.com/fault-details"].contains("XidEccError"),
        "{annotations:?}"
    );

    // A user's label asks for a reboot, which HyperPod does whatever NodeRecovery says;
    // the Node comes back with a new boot ID.
    let (_, boot) = health_and_boot(&nodes, &b).await.unwrap();
    nodes
        .patch(
            &b,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {
                "sagemaker.amazonaws.com/node-health-status": "UnschedulablePendingReboot"}}})),
        )
        .await
        .unwrap();
    wait_for(
        "the rebooted Node, Schedulable with a new boot ID",
        || async {
            health_and_boot(&nodes, &b)
                .await
                .is_some_and(|(h, id)| h == "Schedulable" && id != boot)
        },
    )
    .await;
}
