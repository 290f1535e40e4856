//! Instance groups after creation, through REST against moto + the sim: a spot group
//! added beside an EFA-only group with deep health checks (which keeps both settings, as
//! list_instance_groups reads back), scaled, refused what is fixed for its life, and deleted in two steps; quota and
//! last-group refusals before anything is called; drift follows every change.

use reqwest::Method;
use serde_json::{Value, json};

use crate::FAST;
use crate::common::cluster::{
    agents_mutating_calls, assert_kubernetes_ready, sagemaker, world_with_cluster,
};
use crate::harness::groups;

fn group_of<'a>(described: &'a Value, name: &str) -> &'a Value {
    described["InstanceGroups"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["InstanceGroupName"] == name)
        .unwrap_or_else(|| panic!("no group {name} in {described:#}"))
}

#[test]
fn groups_are_added_scaled_refused_and_deleted() {
    let (world, hypd, token, _) = world_with_cluster(
        FAST,
        json!({"ml.p5.48xlarge": 4, "ml.g5.8xlarge": 8, "ml.g6e.48xlarge": 4}),
        json!({
            "name": "grp", "availability_zone": "us-east-1a",
            "instance_groups": [{"name": "p5", "instance_type": "ml.p5.48xlarge",
                                 "instance_count": 1, "efa_only": true, "deep_health_checks": true}],
        }),
    );

    let path = "/api/v1/clusters/grp/instance-groups";
    let spot = json!({"name": "spot", "instance_type": "ml.g5.8xlarge", "instance_count": 1,
                      "capacity": {"type": "spot"}});
    // The plan first: HyperPod's cluster gains the group; nothing is stored or called.
    world.sim.call(Method::DELETE, "/_sim/calls", None);
    let (status, dry) = hypd.call(
        &token,
        Method::POST,
        path,
        Some(json!({"group": spot, "dry_run": true})),
    );
    assert_eq!(status, 200, "{dry}");
    let changes: Vec<&Value> = dry["plan"]["stages"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["changes"].as_array().unwrap())
        .collect();
    assert_eq!(changes.len(), 1, "{dry:#}");
    assert_eq!(changes[0]["kind"], "sagemaker:Cluster");
    assert_eq!(changes[0]["fields"][0]["field"], "instance_groups[spot]");
    let planned = &changes[0]["fields"][0]["new"];
    assert_eq!(
        planned,
        &json!({"instance_type": "ml.g5.8xlarge", "instance_count": 1,
                "capacity": {"type": "spot"}, "efa_only": false, "deep_health_checks": false,
                "volume_size_gb": 500, "threads_per_core": null, "kubernetes_labels": {},
                "kubernetes_taints": [], "availability_zone": "us-east-1a",
                "subnet": "the cluster's compute subnet"}),
        "a plan shows every setting the request decides: {dry:#}"
    );
    // The same group on demand: its plan differs from the spot group's in capacity alone.
    let mut on_demand = spot.clone();
    on_demand["capacity"] = json!({"type": "on_demand"});
    let (status, dry_on_demand) = hypd.call(
        &token,
        Method::POST,
        path,
        Some(json!({"group": on_demand, "dry_run": true})),
    );
    assert_eq!(status, 200, "{dry_on_demand}");
    let mut expected = dry.clone();
    expected["plan"]["stages"][0]["changes"][0]["fields"][0]["new"]["capacity"] =
        json!({"type": "on_demand"});
    assert_eq!(dry_on_demand, expected);
    assert!(agents_mutating_calls(&world).is_empty());

    // Refused before anything is called: a taken name, more than the quota.
    let (status, taken) = hypd.call(
        &token,
        Method::POST,
        path,
        Some(
            json!({"group": {"name": "p5", "instance_type": "ml.g5.8xlarge", "instance_count": 1}}),
        ),
    );
    assert_eq!(status, 422, "{taken}");
    assert_eq!(taken["error"]["errors"][0]["field"], "group.name");
    let (status, over) = hypd.call(
        &token,
        Method::POST,
        path,
        Some(json!({"group": {"name": "big", "instance_type": "ml.g5.8xlarge", "instance_count": 9}})),
    );
    assert_eq!(status, 422, "{over}");
    assert_eq!(over["error"]["errors"][0]["field"], "group.instance_count");
    assert!(agents_mutating_calls(&world).is_empty());

    let (status, added) = hypd.call(&token, Method::POST, path, Some(json!({"group": spot})));
    assert_eq!(status, 200, "{added}");
    let op = hypd.finish(&token, added["operation_id"].as_str().unwrap());
    assert_eq!(op["state"], "succeeded", "{op:#}");
    // The first group keeps what hypd did not send again: EFA-only, deep health checks.
    let described = sagemaker(&world, "DescribeCluster", json!({"ClusterName": "grp"}));
    let p5 = group_of(&described, "p5");
    assert_eq!(
        p5["NetworkInterface"]["InterfaceType"], "efa-only",
        "{p5:#}"
    );
    assert_eq!(p5["OnStartDeepHealthChecks"].as_array().unwrap().len(), 2);
    assert!(group_of(&described, "spot")["CapacityRequirements"]["Spot"].is_object());
    assert_kubernetes_ready(&world, "grp", &[("p5", 1), ("spot", 1)]);
    // As list_instance_groups reads them back from AWS.
    let (status, listed) = hypd.call(&token, Method::GET, path, None);
    assert_eq!(status, 200, "{listed}");
    let listed = &listed["instance_groups"];
    assert_eq!(listed[0]["name"], "p5", "{listed:#}");
    assert_eq!(listed[0]["capacity"], "on_demand");
    assert_eq!(listed[0]["efa_only"], true);
    assert_eq!(
        listed[0]["deep_health_checks"],
        json!(["InstanceStress", "InstanceConnectivity"])
    );
    assert_eq!(listed[0]["volume_size_gb"], 500);
    assert_eq!(listed[0]["availability_zones"], json!(["us-east-1a"]));
    assert_eq!(listed[0]["nodes"]["total"], 1);
    assert_eq!(listed[1]["name"], "spot");
    assert_eq!(listed[1]["capacity"], "spot");
    assert_eq!(listed[1]["efa_only"], false);
    assert_eq!(
        (&listed[1]["target_count"], &listed[1]["nodes"]["healthy"]),
        (&json!(1), &json!(1)),
        "{listed:#}"
    );

    // What is fixed for a group's life is refused, naming the field, with no call.
    world.sim.call(Method::DELETE, "/_sim/calls", None);
    for (body, field) in [
        (json!({"instance_type": "ml.g5.12xlarge"}), "instance_type"),
        (json!({"capacity": {"type": "on_demand"}}), "capacity"),
        (json!({"efa_only": true, "instance_count": 2}), "efa_only"),
    ] {
        let (status, refused) =
            hypd.call(&token, Method::POST, &format!("{path}/spot"), Some(body));
        assert_eq!(status, 409, "{refused}");
        assert_eq!(refused["error"]["kind"], "immutable");
        assert_eq!(refused["error"]["field"], field, "{refused}");
    }
    assert!(agents_mutating_calls(&world).is_empty());

    // Scaled, then drift holds the cluster to what the changes made.
    let (status, scaled) = hypd.call(
        &token,
        Method::POST,
        &format!("{path}/spot"),
        Some(json!({"instance_count": 2})),
    );
    assert_eq!(status, 200, "{scaled}");
    let op = hypd.finish(&token, scaled["operation_id"].as_str().unwrap());
    assert_eq!(op["state"], "succeeded", "{op:#}");
    assert_eq!(
        groups(&world, "grp"),
        [("p5".into(), 1), ("spot".into(), 2)]
    );
    let (_, drift) = hypd.call(&token, Method::GET, "/api/v1/clusters/grp/drift", None);
    assert_eq!(drift["drifted"], json!([]), "{drift:#}");

    // Labels, taints and the volume of new instances change; the plan lists each, the
    // group's Nodes carry them, drift takes them as meant. A key HyperPod keeps is refused.
    let (status, bad) = hypd.call(
        &token,
        Method::POST,
        &format!("{path}/spot"),
        Some(json!({"kubernetes_labels": {"sagemaker.amazonaws.com/x": "y"}})),
    );
    assert_eq!(status, 422, "{bad}");
    assert_eq!(
        bad["error"]["errors"][0]["field"],
        "kubernetes_labels.sagemaker.amazonaws.com/x"
    );
    let settings = json!({"kubernetes_labels": {"team": "research"},
                          "kubernetes_taints": [{"key": "dedicated", "value": "spot", "effect": "NoSchedule"}],
                          "volume_size_gb": 800});
    let mut dry = settings.clone();
    dry["dry_run"] = json!(true);
    let (status, planned) = hypd.call(&token, Method::POST, &format!("{path}/spot"), Some(dry));
    assert_eq!(status, 200, "{planned}");
    let fields: Vec<&str> = planned["plan"]["stages"][0]["changes"][0]["fields"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["field"].as_str().unwrap())
        .collect();
    assert_eq!(
        fields,
        [
            "instance_groups[spot].volume_size_gb",
            "instance_groups[spot].kubernetes_labels",
            "instance_groups[spot].kubernetes_taints"
        ],
        "{planned:#}"
    );
    let (status, changed) = hypd.call(
        &token,
        Method::POST,
        &format!("{path}/spot"),
        Some(settings),
    );
    assert_eq!(status, 200, "{changed}");
    let op = hypd.finish(&token, changed["operation_id"].as_str().unwrap());
    assert_eq!(op["state"], "succeeded", "{op:#}");
    let (_, listed) = hypd.call(&token, Method::GET, path, None);
    let spot_now = &listed["instance_groups"][1];
    assert_eq!(
        spot_now["kubernetes_labels"],
        json!({"team": "research"}),
        "{listed:#}"
    );
    assert_eq!(
        spot_now["kubernetes_taints"],
        json!(["dedicated=spot:NoSchedule"]),
        "{listed:#}"
    );
    assert_eq!(spot_now["volume_size_gb"], 800, "{listed:#}");
    // The p5 group kept its own settings.
    assert_eq!(listed["instance_groups"][0]["efa_only"], true, "{listed:#}");
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        use k8s_openapi::api::core::v1::Node;
        let client = crate::common::cluster::kube_client(&world, "grp").await;
        let nodes = kube::Api::<Node>::all(client)
            .list(
                &kube::api::ListParams::default()
                    .labels("sagemaker.amazonaws.com/instance-group-name=spot"),
            )
            .await
            .unwrap();
        for n in &nodes.items {
            let labels = n.metadata.labels.clone().unwrap_or_default();
            assert_eq!(
                labels.get("team").map(String::as_str),
                Some("research"),
                "{labels:?}"
            );
            let taints = n
                .spec
                .as_ref()
                .and_then(|s| s.taints.clone())
                .unwrap_or_default();
            assert!(
                taints
                    .iter()
                    .any(|t| t.key == "dedicated" && t.effect == "NoSchedule"),
                "{taints:?}"
            );
        }
    });
    let (_, drift) = hypd.call(&token, Method::GET, "/api/v1/clusters/grp/drift", None);
    assert_eq!(drift["drifted"], json!([]), "{drift:#}");

    // Deleting takes two calls; the plan names the group; the last group stays.
    let (_, first) = hypd.call(&token, Method::DELETE, &format!("{path}/spot"), None);
    assert!(first["confirmation"].is_string(), "{first}");
    let field = &first["plan"]["stages"][0]["changes"][0]["fields"][0];
    assert_eq!(field["field"], "instance_groups[spot]", "{first:#}");
    assert!(field.get("new").is_none_or(Value::is_null), "{first:#}");
    let (status, deleted) = hypd.confirmed(&token, Method::DELETE, &format!("{path}/spot"), None);
    assert_eq!(status, 200, "{deleted}");
    let op = hypd.finish(&token, deleted["operation_id"].as_str().unwrap());
    assert_eq!(op["state"], "succeeded", "{op:#}");
    assert_eq!(groups(&world, "grp"), [("p5".into(), 1)]);
    let (status, last) = hypd.call(&token, Method::DELETE, &format!("{path}/p5"), None);
    assert_eq!(status, 422, "{last}");
    assert_eq!(last["error"]["errors"][0]["field"], "group");
    let (_, drift) = hypd.call(&token, Method::GET, "/api/v1/clusters/grp/drift", None);
    assert_eq!(drift["drifted"], json!([]), "{drift:#}");

    // A training plan bought for the big run (two g6e in us-east-1a): a group asking more
    // than it holds, or another type, is refused before anything is called; one that fits
    // runs on it, and the first group keeps its settings.
    let bought = sagemaker(
        &world,
        "CreateTrainingPlan",
        json!({"TrainingPlanName": "big-run", "TrainingPlanOfferingId": "tpo-g6e-2-use1a"}),
    );
    let plan = bought["TrainingPlanArn"].as_str().unwrap().to_owned();
    // Pending while it is paid for, then Active: only then does it provide capacity.
    crate::wait_until(
        "the plan Active",
        std::time::Duration::from_secs(30),
        || {
            sagemaker(
                &world,
                "DescribeTrainingPlan",
                json!({"TrainingPlanName": "big-run"}),
            )["Status"]
                == "Active"
        },
    );
    let on_plan = |instance_type: &str, count: u32| {
        json!({"group": {"name": "tp", "instance_type": instance_type, "instance_count": count,
                         "capacity": {"type": "training_plan", "training_plan_arn": plan}}})
    };
    world.sim.call(Method::DELETE, "/_sim/calls", None);
    for (body, field) in [
        (
            on_plan("ml.g6e.48xlarge", 3),
            "group.capacity.training_plan_arn",
        ),
        (
            on_plan("ml.p5.48xlarge", 1),
            "group.capacity.training_plan_arn",
        ),
    ] {
        let (status, refused) = hypd.call(&token, Method::POST, path, Some(body));
        assert_eq!(status, 422, "{refused}");
        assert_eq!(refused["error"]["errors"][0]["field"], field, "{refused}");
    }
    assert!(agents_mutating_calls(&world).is_empty());
    let (status, added) = hypd.call(
        &token,
        Method::POST,
        path,
        Some(on_plan("ml.g6e.48xlarge", 2)),
    );
    assert_eq!(status, 200, "{added}");
    let op = hypd.finish(&token, added["operation_id"].as_str().unwrap());
    assert_eq!(op["state"], "succeeded", "{op:#}");
    let described = sagemaker(&world, "DescribeCluster", json!({"ClusterName": "grp"}));
    assert_eq!(group_of(&described, "tp")["TrainingPlanArn"], plan.as_str());
    let p5 = group_of(&described, "p5");
    assert_eq!(
        p5["NetworkInterface"]["InterfaceType"], "efa-only",
        "{p5:#}"
    );
    assert_eq!(p5["OnStartDeepHealthChecks"].as_array().unwrap().len(), 2);
    assert_kubernetes_ready(&world, "grp", &[("p5", 1), ("tp", 2)]);
    let (_, listed) = hypd.call(&token, Method::GET, path, None);
    let tp = &listed["instance_groups"][1];
    assert_eq!(tp["capacity"], "training_plan", "{listed:#}");
    assert_eq!(tp["training_plan_available"], 0, "{listed:#}");
    let (_, drift) = hypd.call(&token, Method::GET, "/api/v1/clusters/grp/drift", None);
    assert_eq!(drift["drifted"], json!([]), "{drift:#}");
}

/// Where a new group's instances go: another zone gets its own /20, routed like the
/// first; a second group in the cluster's zone shares its compute subnet; once that
/// subnet is full (someone else's interfaces took its addresses) the next group gets the
/// next free /20. No block overlaps another, and drift takes it all as meant.
#[test]
fn groups_go_where_there_is_room() {
    let (world, hypd, token, op) = world_with_cluster(
        FAST,
        json!({"ml.g5.8xlarge": 16}),
        json!({
            "name": "net", "availability_zone": "us-east-1a",
            "instance_groups": [{"name": "a1", "instance_type": "ml.g5.8xlarge", "instance_count": 1}],
        }),
    );
    let cluster_subnet = op["outputs"]["network"]["compute_subnet_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let path = "/api/v1/clusters/net/instance-groups";
    let add = |body: Value| {
        let (status, added) = hypd.call(&token, Method::POST, path, Some(json!({ "group": body })));
        assert_eq!(status, 200, "{added}");
        let op = hypd.finish(&token, added["operation_id"].as_str().unwrap());
        assert_eq!(op["state"], "succeeded", "{op:#}");
    };
    let subnet_of = |group: &str| -> Option<String> {
        let described = sagemaker(&world, "DescribeCluster", json!({"ClusterName": "net"}));
        group_of(&described, group)["OverrideVpcConfig"]["Subnets"][0]
            .as_str()
            .map(str::to_owned)
    };

    // Another zone: a /20 of its own there, the group's override, routed privately.
    add(
        json!({"name": "b1", "instance_type": "ml.g5.8xlarge", "instance_count": 1,
               "availability_zone": "us-east-1b"}),
    );
    let b = subnet_of("b1").expect("b1 runs in a subnet of its zone");
    // The cluster's zone: its compute subnet, no override.
    add(json!({"name": "a2", "instance_type": "ml.g5.8xlarge", "instance_count": 1}));
    assert_eq!(subnet_of("a2"), None);

    let rt = tokio::runtime::Runtime::new().unwrap();
    let ec2 = rt.block_on(async { aws_sdk_ec2::Client::new(&world.moto_sdk().await) });
    let describe = |id: &str| {
        rt.block_on(ec2.describe_subnets().subnet_ids(id).send())
            .unwrap()
            .subnets()[0]
            .clone()
    };
    let sb = describe(&b);
    assert_eq!(sb.availability_zone(), Some("us-east-1b"));
    assert!(sb.cidr_block().unwrap().ends_with("/20"), "{sb:?}");
    let routed = rt
        .block_on(
            ec2.describe_route_tables()
                .filters(
                    aws_sdk_ec2::types::Filter::builder()
                        .name("association.subnet-id")
                        .values(&b)
                        .build(),
                )
                .send(),
        )
        .unwrap();
    assert_eq!(routed.route_tables().len(), 1, "{routed:?}");
    assert!(
        routed.route_tables()[0]
            .routes()
            .iter()
            .any(|r| r.nat_gateway_id().is_some()),
        "{routed:?}"
    );

    // Someone else's interfaces take the cluster subnet's addresses: the next group in the
    // zone gets the next free /20, which overlaps nothing.
    rt.block_on(
        ec2.create_network_interface()
            .subnet_id(&cluster_subnet)
            .secondary_private_ip_address_count(4000)
            .send(),
    )
    .unwrap();
    add(json!({"name": "a3", "instance_type": "ml.g5.8xlarge", "instance_count": 3}));
    let a3 = subnet_of("a3").expect("a3 runs in a new subnet");
    assert_ne!(a3, cluster_subnet);
    let s3 = describe(&a3);
    assert_eq!(s3.availability_zone(), Some("us-east-1a"));
    let vpc = s3.vpc_id().unwrap().to_owned();
    let all = rt
        .block_on(
            ec2.describe_subnets()
                .filters(
                    aws_sdk_ec2::types::Filter::builder()
                        .name("vpc-id")
                        .values(&vpc)
                        .build(),
                )
                .send(),
        )
        .unwrap();
    let blocks: Vec<app::api::values::Cidr> = all
        .subnets()
        .iter()
        .map(|s| app::api::values::Cidr::parse(s.cidr_block().unwrap()).unwrap())
        .collect();
    for (i, x) in blocks.iter().enumerate() {
        for y in &blocks[i + 1..] {
            assert!(!x.overlaps(*y), "{x} overlaps {y}");
        }
    }
    assert_kubernetes_ready(&world, "net", &[("a1", 1), ("b1", 1), ("a2", 1), ("a3", 3)]);
    let (_, listed) = hypd.call(&token, Method::GET, path, None);
    let zones: Vec<&Value> = listed["instance_groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| &g["availability_zones"])
        .collect();
    assert_eq!(
        zones,
        [
            &json!(["us-east-1a"]),
            &json!(["us-east-1b"]),
            &json!(["us-east-1a"]),
            &json!(["us-east-1a"])
        ],
        "{listed:#}"
    );
    let (_, drift) = hypd.call(&token, Method::GET, "/api/v1/clusters/net/drift", None);
    assert_eq!(drift["drifted"], json!([]), "{drift:#}");

    // A group grows where it runs: a2 shares the cluster's subnet, which the interfaces
    // above left 90 addresses; three more instances need 96, two need 64.
    world.sim.call(Method::DELETE, "/_sim/calls", None);
    let grow = |count: u32| {
        hypd.call(
            &token,
            Method::POST,
            &format!("{path}/a2"),
            Some(json!({"instance_count": count, "dry_run": true})),
        )
    };
    let (status, refused) = grow(4);
    assert_eq!(status, 422, "{refused}");
    assert_eq!(
        refused["error"]["errors"][0]["field"], "instance_count",
        "{refused}"
    );
    let message = refused["error"]["errors"][0]["message"].as_str().unwrap();
    assert!(
        message.contains(&cluster_subnet) && message.contains("96"),
        "{message}"
    );
    let (status, planned) = grow(3);
    assert_eq!(status, 200, "{planned}");
    assert!(agents_mutating_calls(&world).is_empty());

    // Once the VPC has no /20 left, a group in a zone with no compute subnet is refused
    // before anything is made.
    let cidr = rt
        .block_on(ec2.describe_vpcs().vpc_ids(&vpc).send())
        .unwrap()
        .vpcs()[0]
        .cidr_block()
        .unwrap()
        .to_owned();
    let second: u8 = cidr.split('.').nth(1).unwrap().parse().unwrap();
    for k in 0..16u8 {
        // Blocks already taken are refused by EC2; the rest fill the VPC.
        let _ = rt.block_on(
            ec2.create_subnet()
                .vpc_id(&vpc)
                .cidr_block(format!("10.{second}.{}.0/20", k * 16))
                .availability_zone("us-east-1c")
                .send(),
        );
    }
    world.sim.call(Method::DELETE, "/_sim/calls", None);
    let (status, refused) = hypd.call(
        &token,
        Method::POST,
        path,
        Some(
            json!({"group": {"name": "c1", "instance_type": "ml.g5.8xlarge", "instance_count": 1,
                              "availability_zone": "us-east-1c"}}),
        ),
    );
    assert_eq!(status, 422, "{refused}");
    assert_eq!(
        refused["error"]["errors"][0]["field"], "group.availability_zone",
        "{refused}"
    );
    assert!(agents_mutating_calls(&world).is_empty());
}
