//! HyperPod's cluster API on a stopped clock: listing and describing nodes, placement,
//! group checks, cluster-level settings and autoscaling's calls, through the same
//! functions the dispatch calls, so each rule is seen as a client would see it.
use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::clusters::{create_cluster, update_cluster};
use super::instances::{describe_node, list_nodes};
use super::placement::{parse_cidr, private_ip, zone_id};
use super::*;

fn group(name: &str, count: u32) -> Value {
    json!({
        "InstanceGroupName": name, "InstanceType": "ml.g5.8xlarge", "InstanceCount": count,
        "ExecutionRole": "arn:aws:iam::123456789012:role/r",
        "LifeCycleConfig": {"SourceS3Uri": "s3://b/l", "OnCreate": "on_create.sh"}
    })
}

/// Cluster `c` with `groups`, waited for until InService.
fn cluster(w: &mut Aws, groups: Vec<Value>) {
    let body = json!({"ClusterName": "c", "InstanceGroups": groups});
    create_cluster(w, "us-east-1", &body, &Lookups::default()).unwrap();
    w.clock.advance(2000.0);
}

fn update(w: &mut Aws, groups: Vec<Value>) -> Result<Value, AwsError> {
    let body = json!({"ClusterName": "c", "InstanceGroups": groups});
    let out = update_cluster(w, &body, &Lookups::default());
    w.clock.advance(2000.0);
    out
}

fn list(w: &mut Aws, extra: Value) -> Result<Value, AwsError> {
    let mut body = json!({"ClusterName": "c"});
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    list_nodes(w, &body)
}

/// (group, instance id) of each summary.
fn listed(out: &Value) -> Vec<(String, String)> {
    out["ClusterNodeSummaries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            (
                n["InstanceGroupName"].as_str().unwrap().to_owned(),
                n["InstanceId"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// Cluster `c`: group `b` of two nodes launched first, then group `a` of three.
fn two_generations(w: &mut Aws) -> Vec<(String, String)> {
    cluster(w, vec![group("b", 2)]);
    update(w, vec![group("b", 2), group("a", 3)]).unwrap();
    listed(&list(w, json!({})).unwrap())
}

#[test]
fn list_cluster_nodes_sorts_oldest_first_by_default_and_pages_with_opaque_tokens() {
    let mut w = Aws::standalone(0.0);
    let all = two_generations(&mut w);
    let groups: Vec<&str> = all.iter().map(|(g, _)| g.as_str()).collect();
    assert_eq!(
        groups,
        ["b", "b", "a", "a", "a"],
        "Ascending by creation time"
    );

    let mut seen = Vec::new();
    let mut token: Option<String> = None;
    loop {
        let mut extra = json!({"MaxResults": 2});
        if let Some(t) = &token {
            extra["NextToken"] = json!(t);
        }
        let out = list(&mut w, extra).unwrap();
        let page = listed(&out);
        assert!(page.len() <= 2);
        seen.extend(page);
        match out["NextToken"].as_str() {
            Some(t) => {
                assert!(t.parse::<usize>().is_err(), "tokens are not offsets: {t}");
                token = Some(t.to_owned());
            }
            None => break,
        }
    }
    assert_eq!(seen, all);

    let newest_first = listed(&list(&mut w, json!({"SortOrder": "Descending"})).unwrap());
    assert_eq!(newest_first, all.iter().rev().cloned().collect::<Vec<_>>());
    let by_name = listed(&list(&mut w, json!({"SortBy": "NAME"})).unwrap());
    let names: Vec<&str> = by_name.iter().map(|(g, _)| g.as_str()).collect();
    assert_eq!(names, ["a", "a", "a", "b", "b"]);
}

#[test]
fn list_cluster_nodes_filters_by_group_name_and_creation_time() {
    let mut w = Aws::standalone(0.0);
    let all = two_generations(&mut w);
    let only_a = listed(&list(&mut w, json!({"InstanceGroupNameContains": "a"})).unwrap());
    assert_eq!(only_a, all[2..]);
    // Group b launched at the clock's start, group a 2,000 s later.
    let split = w.clock.epoch(1000.0);
    let newer = listed(&list(&mut w, json!({"CreationTimeAfter": split})).unwrap());
    assert_eq!(newer, all[2..]);
    let older = listed(&list(&mut w, json!({"CreationTimeBefore": split})).unwrap());
    assert_eq!(older, all[..2]);
}

#[test]
fn list_cluster_nodes_refuses_what_aws_refuses() {
    let mut w = Aws::standalone(0.0);
    two_generations(&mut w);
    for (extra, says) in [
        (json!({"MaxResults": 0}), "greater than or equal to 1"),
        (json!({"MaxResults": 101}), "less than or equal to 100"),
        (json!({"NextToken": "2"}), "Invalid NextToken"),
        (json!({"SortBy": "STATUS"}), "[CREATION_TIME, NAME]"),
        (json!({"SortOrder": "Up"}), "[Ascending, Descending]"),
    ] {
        let e = list(&mut w, extra.clone()).unwrap_err();
        assert_eq!(e.code, "ValidationException", "{extra}");
        assert!(e.message.contains(says), "{extra}: {}", e.message);
    }
    let out = list(&mut w, json!({"MaxResults": 1})).unwrap();
    let mut garbled = out["NextToken"].as_str().unwrap().to_owned();
    garbled.replace_range(0..1, if garbled.starts_with('0') { "1" } else { "0" });
    let e = list(&mut w, json!({"NextToken": garbled})).unwrap_err();
    assert_eq!(e.code, "ValidationException");
}

fn subnet(id: &str, zone: &str, zone_id: &str, cidr: &str) -> crate::moto::Subnet {
    crate::moto::Subnet {
        id: id.into(),
        vpc_id: "vpc-1".into(),
        availability_zone: zone.into(),
        availability_zone_id: zone_id.into(),
        cidr_block: cidr.into(),
    }
}

fn describe(w: &mut Aws, id: &str) -> Value {
    describe_node(w, &json!({"ClusterName": "c", "NodeId": id})).unwrap()["NodeDetails"].clone()
}

#[test]
fn nodes_are_placed_in_their_groups_subnet_with_a_stable_address() {
    let mut w = Aws::standalone(0.0);
    let lookups = Lookups::default()
        .with_subnet(subnet("subnet-b", "us-east-1b", "use1-az1", "10.0.1.0/24"))
        .with_subnet(subnet("subnet-c", "us-east-1c", "use1-az2", "10.0.2.0/24"))
        .with_subnet(subnet("subnet-d", "us-east-1d", "use1-az4", "10.0.3.0/24"));
    let mut own = group("own", 1);
    own["OverrideVpcConfig"] = json!({"Subnets": ["subnet-c"], "SecurityGroupIds": ["sg-1"]});
    let body = json!({
        "ClusterName": "c",
        "VpcConfig": {"Subnets": ["subnet-b", "subnet-d"], "SecurityGroupIds": ["sg-1"]},
        "InstanceGroups": [group("shared", 2), own],
    });
    create_cluster(&mut w, "us-east-1", &body, &lookups).unwrap();
    w.clock.advance(2000.0);
    let out = list(&mut w, json!({})).unwrap();
    let mut seen = BTreeMap::new();
    for n in out["ClusterNodeSummaries"].as_array().unwrap() {
        let id = n["InstanceId"].as_str().unwrap();
        let d = describe(&mut w, id);
        let ip = d["PrivatePrimaryIp"].as_str().unwrap().to_owned();
        let (zone, zone_id, net) = if n["InstanceGroupName"] == "own" {
            ("us-east-1c", "use1-az2", "10.0.2.")
        } else {
            ("us-east-1b", "use1-az1", "10.0.1.")
        };
        assert_eq!(
            d["Placement"],
            json!({"AvailabilityZone": zone, "AvailabilityZoneId": zone_id})
        );
        assert!(ip.starts_with(net), "{ip}");
        let host: u8 = ip[net.len()..].parse().unwrap();
        assert!((4..255).contains(&host), "{ip}");
        let dns = format!("ip-{}.ec2.internal", ip.replace('.', "-"));
        assert_eq!(n["PrivateDnsHostname"], dns);
        assert_eq!(d["PrivateDnsHostname"], dns);
        assert!(n.get("LastSoftwareUpdateTime").is_none());
        seen.insert(id.to_owned(), ip);
    }
    assert_eq!(seen.len(), 3);
    let distinct: std::collections::BTreeSet<&String> = seen.values().collect();
    assert_eq!(distinct.len(), 3, "{seen:?}");
    // The same node keeps its address.
    for (id, ip) in &seen {
        assert_eq!(describe(&mut w, id)["PrivatePrimaryIp"], json!(ip));
    }
}

#[test]
fn without_moto_nodes_are_in_the_regions_first_zone() {
    let mut w = Aws::standalone(0.0);
    let body = json!({"ClusterName": "c", "InstanceGroups": [group("g", 1)]});
    create_cluster(&mut w, "eu-central-1", &body, &Lookups::default()).unwrap();
    let id = listed(&list(&mut w, json!({})).unwrap())[0].1.clone();
    let d = describe(&mut w, &id);
    assert_eq!(
        d["Placement"],
        json!({"AvailabilityZone": "eu-central-1a", "AvailabilityZoneId": "euc1-az1"})
    );
    let ip = d["PrivatePrimaryIp"].as_str().unwrap();
    assert!(ip.starts_with("10.1."), "{ip}");
    assert_eq!(
        d["PrivateDnsHostname"],
        format!("ip-{}.eu-central-1.compute.internal", ip.replace('.', "-"))
    );
}

#[test]
fn zone_ids_and_cidrs() {
    assert_eq!(zone_id("us-east-1", "us-east-1a"), "use1-az1");
    assert_eq!(zone_id("ap-northeast-1", "ap-northeast-1c"), "apne1-az3");
    assert_eq!(zone_id("us-west-2", "us-west-2b"), "usw2-az2");
    assert_eq!(parse_cidr("10.0.1.7/24"), Some((0x0a00_0100, 24)));
    assert_eq!(parse_cidr("10.0.1.0/33"), None);
    assert_eq!(
        private_ip("i-00000000000000010", Some((0x0a00_0100, 24))),
        "10.0.1.20"
    );
}

#[test]
fn a_finished_software_update_stamps_the_node() {
    let mut w = Aws::standalone(0.0);
    let mut g = group("g", 1);
    g["ImageReleaseVersion"] = json!(nodes::IMAGE_RELEASES[0]);
    cluster(&mut w, vec![g]);
    nodes::update_software(&mut w, &json!({"ClusterName": "c"})).unwrap();
    let started = w.clock.now();
    w.clock.advance(nodes::SOFTWARE_UPDATE_SECS + 1.0);
    let out = list(&mut w, json!({})).unwrap();
    let stamp = w.clock.epoch(started + nodes::SOFTWARE_UPDATE_SECS);
    assert_eq!(
        out["ClusterNodeSummaries"][0]["LastSoftwareUpdateTime"],
        json!(stamp)
    );
    let id = listed(&out)[0].1.clone();
    assert_eq!(
        describe(&mut w, &id)["LastSoftwareUpdateTime"],
        json!(stamp)
    );
}

fn kubernetes_of(w: &mut Aws) -> Value {
    let c = w.hyperpod("c").unwrap().clone();
    w.cluster_json(&c)["InstanceGroups"][0]["KubernetesConfig"].clone()
}

#[test]
fn a_groups_kubernetes_config_is_reported_current_and_desired() {
    let mut w = Aws::standalone(0.0);
    let gpu = json!({"Key": "gpu", "Value": "true", "Effect": "NoSchedule"});
    let mut g = group("g", 1);
    g["KubernetesConfig"] = json!({"Labels": {"team": "a"}, "Taints": [gpu]});
    cluster(&mut w, vec![g.clone()]);
    assert_eq!(
        kubernetes_of(&mut w),
        json!({"CurrentLabels": {"team": "a"}, "DesiredLabels": {"team": "a"},
               "CurrentTaints": [gpu], "DesiredTaints": [gpu]})
    );

    g["KubernetesConfig"] = json!({"Labels": {"team": "b"}});
    let body = json!({"ClusterName": "c", "InstanceGroups": [g]});
    update_cluster(&mut w, &body, &Lookups::default()).unwrap();
    let during = json!({"CurrentLabels": {"team": "a"}, "DesiredLabels": {"team": "b"},
                        "CurrentTaints": [gpu]});
    assert_eq!(kubernetes_of(&mut w), during);
    let id = listed(&list(&mut w, json!({})).unwrap())[0].1.clone();
    assert_eq!(describe(&mut w, &id)["KubernetesConfig"], during);
    w.clock.advance(CLUSTER_UPDATE_SECS);
    assert_eq!(
        kubernetes_of(&mut w),
        json!({"CurrentLabels": {"team": "b"}, "DesiredLabels": {"team": "b"}})
    );
}

#[test]
fn kubernetes_taints_need_a_key_and_a_known_effect() {
    let mut w = Aws::standalone(0.0);
    for (taint, says) in [
        (
            json!({"Key": "gpu", "Effect": "Sometimes"}),
            "Value 'Sometimes' at 'instanceGroups.1.member.kubernetesConfig.taints.1.member.effect'",
        ),
        (json!({"Effect": "NoSchedule"}), "key is required"),
    ] {
        let mut g = group("g", 1);
        g["KubernetesConfig"] = json!({"Taints": [taint]});
        let body = json!({"ClusterName": "c", "InstanceGroups": [g]});
        let e = create_cluster(&mut w, "us-east-1", &body, &Lookups::default()).unwrap_err();
        assert_eq!(e.code, "ValidationException");
        assert!(e.message.contains(says), "{}", e.message);
    }
}

#[test]
fn min_instance_count_is_checked_against_the_count_and_reported_as_min_count() {
    let mut w = Aws::standalone(0.0);
    for (count, min, says) in [
        (
            json!(2),
            json!(3),
            "MinInstanceCount (3) of instance group g must be less than or equal to its InstanceCount (2)",
        ),
        (
            json!(2),
            json!(-1),
            "Value '-1' at 'instanceGroups.1.member.minInstanceCount' failed to satisfy constraint: Member must have value greater than or equal to 0",
        ),
        (
            json!(-1),
            json!(0),
            "Value '-1' at 'instanceGroups.1.member.instanceCount' failed to satisfy constraint: Member must have value greater than or equal to 0",
        ),
        (
            json!(6759),
            json!(0),
            "Member must have value less than or equal to 6758",
        ),
    ] {
        let mut g = group("g", 0);
        g["InstanceCount"] = count;
        g["MinInstanceCount"] = min;
        let body = json!({"ClusterName": "c", "InstanceGroups": [g]});
        let e = create_cluster(&mut w, "us-east-1", &body, &Lookups::default()).unwrap_err();
        assert_eq!(e.code, "ValidationException");
        assert!(e.message.contains(says), "{}", e.message);
    }
    let mut g = group("g", 2);
    g["MinInstanceCount"] = json!(1);
    cluster(&mut w, vec![g.clone()]);
    let c = w.hyperpod("c").unwrap().clone();
    let details = &w.cluster_json(&c)["InstanceGroups"][0];
    assert_eq!(details["MinCount"], 1);
    assert!(details.get("MinInstanceCount").is_none());
    // UpdateCluster checks it too.
    g["MinInstanceCount"] = json!(5);
    let e = update(&mut w, vec![g]).unwrap_err();
    assert!(e.message.contains("MinInstanceCount (5)"), "{}", e.message);
}

const ROLE: &str = "arn:aws:iam::123456789012:role/hyperpod-autoscaling";

/// A CreateCluster body for cluster `c` on an EKS orchestrator with one group of
/// `count`, continuous provisioning and `extra` fields.
fn on_eks(count: u32, extra: Value) -> Value {
    let mut body = json!({"ClusterName": "c", "InstanceGroups": [group("g", count)],
                          "Orchestrator": {"Eks": {}}, "NodeProvisioningMode": "Continuous"});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

fn described(w: &mut Aws) -> Value {
    let c = w.hyperpod("c").unwrap().clone();
    w.cluster_json(&c)
}

fn settings(w: &mut Aws, extra: Value) -> Result<Value, AwsError> {
    let mut body = json!({"ClusterName": "c"});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    update_cluster(w, &body, &Lookups::default())
}

#[test]
fn autoscaling_needs_its_prerequisites_and_holds_its_role() {
    let mut w = Aws::standalone(0.0);
    let enable = json!({"Mode": "Enable", "AutoScalerType": "Karpenter"});
    for (body, says) in [
        (
            on_eks(0, json!({"AutoScaling": enable})),
            "requires a ClusterRole",
        ),
        (
            json!({"ClusterName": "c", "InstanceGroups": [group("g", 0)],
                   "AutoScaling": enable, "ClusterRole": ROLE}),
            "requires an EKS orchestrator",
        ),
        (
            json!({"ClusterName": "c", "InstanceGroups": [group("g", 0)],
                   "Orchestrator": {"Eks": {}}, "AutoScaling": enable, "ClusterRole": ROLE}),
            "requires NodeProvisioningMode Continuous",
        ),
        (
            on_eks(
                0,
                json!({"AutoScaling": enable, "ClusterRole": ROLE, "NodeRecovery": "None"}),
            ),
            "requires NodeRecovery Automatic",
        ),
        (
            on_eks(
                0,
                json!({"AutoScaling": {"Mode": "On"}, "ClusterRole": ROLE}),
            ),
            "Value 'On' at 'autoScaling.mode' failed to satisfy constraint: Member must satisfy enum value set: [Enable, Disable]",
        ),
        (
            on_eks(
                0,
                json!({"AutoScaling": {"AutoScalerType": "Karpenter"}, "ClusterRole": ROLE}),
            ),
            "Value null at 'autoScaling.mode'",
        ),
        (
            on_eks(
                0,
                json!({"AutoScaling": enable, "ClusterRole": "hyperpod-autoscaling"}),
            ),
            "at 'clusterRole' failed to satisfy constraint: Member must satisfy regular expression pattern",
        ),
    ] {
        let e = create_cluster(&mut w, "us-east-1", &body, &Lookups::default()).unwrap_err();
        assert_eq!(e.code, "ValidationException", "{body}");
        assert!(e.message.contains(says), "{body}: {}", e.message);
    }
    assert!(w.sagemaker.clusters.is_empty());

    let body = on_eks(0, json!({"AutoScaling": enable, "ClusterRole": ROLE}));
    create_cluster(&mut w, "us-east-1", &body, &Lookups::default()).unwrap();
    let d = described(&mut w);
    assert_eq!(d["ClusterRole"], ROLE);
    assert_eq!(
        d["AutoScaling"],
        json!({"Mode": "Enable", "AutoScalerType": "Karpenter", "Status": "Creating"})
    );
    // The install waits for the cluster.
    w.clock.advance(AUTOSCALING_SECS);
    assert_eq!(described(&mut w)["AutoScaling"]["Status"], "Creating");
    w.clock.advance(CLUSTER_CREATE_SECS);
    assert_eq!(described(&mut w)["AutoScaling"]["Status"], "InService");

    let other = "arn:aws:iam::123456789012:role/other";
    let e = settings(&mut w, json!({"ClusterRole": other})).unwrap_err();
    assert_eq!(e.code, "ValidationException");
    assert!(
        e.message
            .contains("cannot be updated while autoscaling is enabled"),
        "{}",
        e.message
    );
    // Naming the role it has is no change.
    settings(&mut w, json!({"ClusterRole": ROLE})).unwrap();
    w.clock.advance(CLUSTER_UPDATE_SECS);
    let e = settings(&mut w, json!({"NodeRecovery": "None"})).unwrap_err();
    assert!(
        e.message.contains("requires NodeRecovery Automatic"),
        "{}",
        e.message
    );

    settings(&mut w, json!({"AutoScaling": {"Mode": "Disable"}})).unwrap();
    assert_eq!(
        described(&mut w)["AutoScaling"],
        json!({"Mode": "Disable", "AutoScalerType": "Karpenter", "Status": "Deleting"})
    );
    w.clock.advance(CLUSTER_UPDATE_SECS);
    let d = described(&mut w);
    assert!(d["AutoScaling"].is_null(), "{d}");
    assert_eq!(d["ClusterRole"], ROLE, "the role stays");
    settings(&mut w, json!({"ClusterRole": other})).unwrap();
    assert_eq!(described(&mut w)["ClusterRole"], other);
}

#[test]
fn a_failing_install_ends_failed_with_its_message() {
    let mut w = Aws::standalone(0.0);
    w.faults.add(crate::world::Fault {
        id: 0,
        service: "sagemaker".into(),
        operation: "UpdateCluster".into(),
        kind: crate::world::FaultKind::Fails {
            code: "InternalFailure".into(),
            message: "Karpenter could not be installed".into(),
        },
        times: 1,
        after: 0,
        caller: None,
    });
    create_cluster(
        &mut w,
        "us-east-1",
        &on_eks(0, json!({"ClusterRole": ROLE})),
        &Lookups::default(),
    )
    .unwrap();
    w.clock.advance(CLUSTER_CREATE_SECS);
    settings(&mut w, json!({"AutoScaling": {"Mode": "Enable"}})).unwrap();
    w.clock.advance(AUTOSCALING_SECS);
    assert_eq!(
        described(&mut w)["AutoScaling"],
        json!({"Mode": "Enable", "AutoScalerType": "Karpenter", "Status": "Failed",
               "FailureMessage": "Karpenter could not be installed"})
    );
}

#[test]
fn tiered_storage_is_checked_kept_and_applied_once_the_update_is_over() {
    let mut w = Aws::standalone(0.0);
    for (config, says) in [
        (
            json!({"Mode": "Enable", "InstanceMemoryAllocationPercentage": 101}),
            "Value '101' at 'tieredStorageConfig.instanceMemoryAllocationPercentage' failed to satisfy constraint: Member must have value less than or equal to 100",
        ),
        (
            json!({"Mode": "Enable", "InstanceMemoryAllocationPercentage": -1}),
            "greater than or equal to 0",
        ),
        (
            json!({"InstanceMemoryAllocationPercentage": 20}),
            "Value null at 'tieredStorageConfig.mode'",
        ),
    ] {
        let body = on_eks(1, json!({"TieredStorageConfig": config}));
        let e = create_cluster(&mut w, "us-east-1", &body, &Lookups::default()).unwrap_err();
        assert_eq!(e.code, "ValidationException");
        assert!(e.message.contains(says), "{}", e.message);
    }
    let body = json!({"ClusterName": "c", "InstanceGroups": [group("g", 1)],
                      "TieredStorageConfig": {"Mode": "Enable"}});
    let e = create_cluster(&mut w, "us-east-1", &body, &Lookups::default()).unwrap_err();
    assert!(e.message.contains("EKS orchestrator"), "{}", e.message);

    create_cluster(
        &mut w,
        "us-east-1",
        &on_eks(2, json!({})),
        &Lookups::default(),
    )
    .unwrap();
    w.clock.advance(CLUSTER_CREATE_SECS);
    let before = described(&mut w);
    assert!(before["TieredStorageConfig"].is_null());
    let enable = json!({"Mode": "Enable", "InstanceMemoryAllocationPercentage": 40});
    settings(&mut w, json!({"TieredStorageConfig": enable})).unwrap();
    let d = described(&mut w);
    assert_eq!(d["ClusterStatus"], "Updating");
    assert_eq!(d["TieredStorageConfig"], enable);
    let groups = |d: &Value| {
        let g = &d["InstanceGroups"];
        (
            g.as_array().unwrap().len(),
            g[0]["InstanceGroupName"].clone(),
            g[0]["TargetCount"].clone(),
        )
    };
    assert_eq!(groups(&d), groups(&before), "the groups stay");
    assert_eq!(d["NodeRecovery"], before["NodeRecovery"]);
    let daemon = |w: &mut Aws| {
        let now = w.clock.now();
        w.hyperpod("c").unwrap().applied_tiered(now).cloned()
    };
    assert!(daemon(&mut w).is_none(), "not before the update is over");
    w.clock.advance(CLUSTER_UPDATE_SECS);
    assert_eq!(daemon(&mut w), Some(enable.clone()));

    settings(&mut w, json!({"TieredStorageConfig": {"Mode": "Disable"}})).unwrap();
    assert_eq!(daemon(&mut w), Some(enable), "until the update is over");
    w.clock.advance(CLUSTER_UPDATE_SECS);
    assert_eq!(daemon(&mut w), Some(json!({"Mode": "Disable"})));
    assert_eq!(
        described(&mut w)["TieredStorageConfig"],
        json!({"Mode": "Disable"})
    );
}

#[test]
fn autoscaling_adds_and_deletes_nodes_as_the_batch_calls_do() {
    let mut w = Aws::standalone(0.0);
    create_cluster(
        &mut w,
        "us-east-1",
        &on_eks(0, json!({})),
        &Lookups::default(),
    )
    .unwrap();
    let e = w.autoscale_up("c", "g", 1).unwrap_err();
    assert!(e.message.contains("Creating"), "{}", e.message);
    w.clock.advance(CLUSTER_CREATE_SECS);
    w.autoscale_up("c", "g", 2).unwrap();
    let d = described(&mut w);
    assert_eq!(d["ClusterStatus"], "InService", "no update of the cluster");
    assert_eq!(d["InstanceGroups"][0]["TargetCount"], 2);
    let nodes = listed(&list(&mut w, json!({})).unwrap());
    assert_eq!(nodes.len(), 2);
    w.sagemaker.quotas.insert("ml.g5.8xlarge".into(), 2);
    let e = w.autoscale_up("c", "g", 1).unwrap_err();
    assert_eq!(e.code, "ResourceLimitExceeded");
    w.autoscale_down("c", &[nodes[0].1.clone()]).unwrap();
    assert_eq!(described(&mut w)["InstanceGroups"][0]["TargetCount"], 1);
    assert_eq!(listed(&list(&mut w, json!({})).unwrap()), nodes[1..]);
}

#[test]
fn scaling_down_removes_nodes_not_running_first_then_the_newest() {
    let mut w = Aws::standalone(0.0);
    cluster(&mut w, vec![group("g", 3)]);
    let first = listed(&list(&mut w, json!({})).unwrap());
    update(&mut w, vec![group("g", 5)]).unwrap();
    let all = listed(&list(&mut w, json!({})).unwrap());
    assert_eq!(all[..3], first);
    // The oldest node reboots (Pending) and is the first to go; then the two newest.
    nodes::batch_reboot(
        &mut w,
        &json!({"ClusterName": "c", "NodeIds": [first[0].1]}),
    )
    .unwrap();
    let body = json!({"ClusterName": "c", "InstanceGroups": [group("g", 2)]});
    update_cluster(&mut w, &body, &Lookups::default()).unwrap();
    let kept = listed(&list(&mut w, json!({})).unwrap());
    assert_eq!(kept, first[1..]);
    assert_eq!(w.hyperpod("c").unwrap().groups[0].target, 2);

    // Newest is by launch, not by slot: a replaced node is a new instance.
    w.clock.advance(2000.0);
    nodes::batch_replace(&mut w, &json!({"ClusterName": "c", "NodeIds": [kept[0].1]})).unwrap();
    w.clock.advance(2000.0);
    let replaced = listed(&list(&mut w, json!({})).unwrap());
    assert_eq!(replaced.len(), 2);
    assert!(!replaced.contains(&kept[0]), "{replaced:?}");
    update(&mut w, vec![group("g", 1)]).unwrap();
    assert_eq!(listed(&list(&mut w, json!({})).unwrap()), kept[1..]);
}

/// HyperPod cluster `name` of one node on EKS cluster `eks`, InService.
fn cluster_on(w: &mut Aws, name: &str, eks: &str) {
    let body = json!({"ClusterName": name, "InstanceGroups": [group("g", 1)]});
    create_cluster(w, "us-east-1", &body, &Lookups::default()).unwrap();
    w.sagemaker.clusters.get_mut(name).unwrap().orchestrator =
        json!({"Eks": {"ClusterArn": format!("arn:aws:eks:us-east-1:123456789012:cluster/{eks}")}});
}

#[test]
fn what_an_eks_cluster_reads_settles_only_the_hyperpod_clusters_on_it() {
    let mut w = Aws::standalone(0.0);
    cluster_on(&mut w, "a", "eks-a");
    cluster_on(&mut w, "b", "eks-b");
    w.clock.advance(2000.0);
    let ids: Vec<String> = ["a", "b"]
        .iter()
        .map(|c| w.hyperpod(c).unwrap().groups[0].nodes[0].id.clone())
        .collect();
    for (c, id) in ["a", "b"].iter().zip(&ids) {
        nodes::batch_reboot(&mut w, &json!({"ClusterName": c, "NodeIds": [id]})).unwrap();
    }
    w.clock.advance(nodes::REBOOT_SECS);
    let instances = w.hyperpod_instances("eks-a");
    assert_eq!(instances.len(), 1);
    assert_eq!((instances[0].status, instances[0].boots), ("Running", 1));
    let untouched = &w.sagemaker.clusters["b"].groups[0].nodes[0];
    assert!(
        untouched.action.is_some(),
        "b's reboot is folded in only when b is read"
    );
    assert_eq!(w.hyperpod("b").unwrap().groups[0].nodes[0].boots, 1);

    for c in ["a", "b"] {
        clusters::delete_cluster(&mut w, &json!({"ClusterName": c})).unwrap();
    }
    w.clock.advance(CLUSTER_DELETE_SECS);
    assert!(w.hyperpod_features("eks-b").is_empty());
    assert!(w.hyperpod_instances("eks-b").is_empty());
    assert!(!w.sagemaker.clusters.contains_key("b"));
    assert!(
        w.sagemaker.clusters.contains_key("a"),
        "a is gone once read"
    );
    // Quotas do not count a cluster whose deletion is over, settled or not.
    assert_eq!(clusters::in_use(&w, "ml.g5.8xlarge", None), 0);
    let listed = clusters::list_clusters(&mut w, "us-east-1").unwrap();
    assert_eq!(listed["ClusterSummaries"], json!([]));
    assert!(w.sagemaker.clusters.is_empty());
}

#[test]
fn what_the_controllers_read_says_when_it_changes_next() {
    use crate::clock::recording;
    let mut w = Aws::standalone(0.0);
    let mut g = group("g", 1);
    g["OnStartDeepHealthChecks"] = json!(["InstanceStress"]);
    let body = json!({"ClusterName": "a", "InstanceGroups": [g]});
    create_cluster(&mut w, "us-east-1", &body, &Lookups::default()).unwrap();
    w.sagemaker.clusters.get_mut("a").unwrap().orchestrator =
        json!({"Eks": {"ClusterArn": "arn:aws:eks:us-east-1:123456789012:cluster/eks-a"}});
    let due = |w: &mut Aws| {
        recording(|| {
            w.hyperpod_instances("eks-a");
            w.hyperpod_features("eks-a");
        })
        .1
    };
    assert_eq!(due(&mut w), NODE_BOOT_SECS, "the node boots first");
    w.clock.advance(NODE_BOOT_SECS);
    assert_eq!(
        due(&mut w),
        DEEP_HEALTH_CHECK_SECS,
        "its checks end with the creation"
    );
    w.clock.advance(DEEP_HEALTH_CHECK_SECS);
    assert_eq!(due(&mut w), f64::INFINITY, "nothing is under way");

    let id = w.hyperpod("a").unwrap().groups[0].nodes[0].id.clone();
    nodes::batch_reboot(&mut w, &json!({"ClusterName": "a", "NodeIds": [id]})).unwrap();
    assert_eq!(due(&mut w), nodes::REBOOT_SECS);
    // A stuck fault holds the reboot: nothing is due until the fault goes.
    let fault = w.faults.add(crate::world::Fault {
        id: 0,
        service: "sagemaker".into(),
        operation: "BatchRebootClusterNodes".into(),
        kind: crate::world::FaultKind::Stuck,
        times: 1,
        after: 0,
        caller: None,
    });
    assert_eq!(due(&mut w), f64::INFINITY);
    w.faults.retain(|f| f.id != fault);
    w.clock.advance(10.0);
    assert_eq!(due(&mut w), nodes::REBOOT_SECS - 10.0);
    w.clock.advance(nodes::REBOOT_SECS);

    w.mark_node_for_recovery(
        "a",
        &id,
        Recovery::Replace,
        Some(HealthFault::for_recovery(Recovery::Replace)),
    );
    assert_eq!(due(&mut w), nodes::RECOVERY_DELAY_SECS);
    w.clock.advance(nodes::RECOVERY_DELAY_SECS);
    assert_eq!(due(&mut w), nodes::SHUTDOWN_SECS);
    w.clock.advance(nodes::SHUTDOWN_SECS);
    assert_eq!(due(&mut w), NODE_BOOT_SECS, "the replacement boots");
    w.clock.advance(NODE_BOOT_SECS + DEEP_HEALTH_CHECK_SECS);

    clusters::delete_cluster(&mut w, &json!({"ClusterName": "a"})).unwrap();
    assert_eq!(due(&mut w), CLUSTER_DELETE_SECS, "its nodes go with it");
    w.clock.advance(CLUSTER_DELETE_SECS);
    assert_eq!(due(&mut w), f64::INFINITY);
    assert!(w.hyperpod_instances("eks-a").is_empty());
}
