//! `create_cluster` end to end against moto + hypd-sim (which checks subnets, roles and
//! buckets against moto as AWS would): the operation succeeds and the world holds exactly
//! the expected resources; bad inputs are field errors with nothing created; a provider
//! failure in a stage stops the operation there and `retry_operation` finishes it with
//! no duplicates.

use crate::common::{Hypd, World};
use reqwest::Method;
use serde_json::{Value, json};

use crate::FAST;

fn create(hypd: &Hypd, token: &str, body: Value) -> (u16, Value) {
    hypd.call(token, Method::POST, "/api/v1/clusters", Some(body))
}

pub fn small(name: &str) -> Value {
    json!({
        "name": name,
        "availability_zone": "us-east-1a",
        "instance_groups": [{
            "name": "gpu",
            "instance_type": "ml.g5.8xlarge",
            "instance_count": 2,
            "deep_health_checks": true,
        }],
    })
}

/// Two groups of different capacity types: what a platform team starts with.
fn two_groups(name: &str) -> Value {
    let mut body = small(name);
    body["instance_groups"].as_array_mut().unwrap().push(
        json!({"name": "spot", "instance_type": "ml.g5.8xlarge", "instance_count": 1,
                     "capacity": {"type": "spot"}, "volume_size_gb": 200}),
    );
    body
}

/// What moto and the sim hold for cluster `name`, counted by kind.
#[derive(Debug, PartialEq)]
pub struct Counts {
    pub vpcs: usize,
    pub subnets: usize,
    pub nat_gateways: usize,
    pub addresses: usize,
    pub internet_gateways: usize,
    pub route_tables: usize,
    pub s3_endpoints: usize,
    pub security_groups: usize,
    pub roles: usize,
    pub oidc_providers: usize,
    pub lifecycle_scripts: usize,
    pub eks_clusters: usize,
    pub addons: usize,
    pub pod_identities: usize,
    pub hyperpod_clusters: usize,
}

pub fn count(world: &World, name: &str) -> Counts {
    // The sim is asked with a blocking client, outside the runtime that asks moto.
    let (_, eks) = world.sim.call(Method::GET, "/clusters", None);
    let eks_clusters = eks["clusters"]
        .as_array()
        .map_or(0, |a| a.iter().filter(|c| *c == name).count());
    let (_, addons) = world
        .sim
        .call(Method::GET, &format!("/clusters/{name}/addons"), None);
    let (_, identities) = world.sim.call(
        Method::GET,
        &format!("/clusters/{name}/pod-identity-associations"),
        None,
    );
    let hyperpod = hyperpod_clusters(world, name);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let conf = world.moto_sdk().await;
        let ec2 = aws_sdk_ec2::Client::new(&conf);
        let ours = || {
            aws_sdk_ec2::types::Filter::builder()
                .name("tag:hypd:cluster")
                .values(name)
                .build()
        };
        let vpcs = ec2.describe_vpcs().filters(ours()).send().await.unwrap();
        let vpc_ids: Vec<String> = vpcs
            .vpcs()
            .iter()
            .filter_map(|v| v.vpc_id().map(str::to_owned))
            .collect();
        let in_vpc = || {
            aws_sdk_ec2::types::Filter::builder()
                .name("vpc-id")
                .set_values(Some(vpc_ids.clone()))
                .build()
        };
        let subnets = ec2.describe_subnets().filters(ours()).send().await.unwrap();
        let nats = ec2
            .describe_nat_gateways()
            .filter(ours())
            .send()
            .await
            .unwrap();
        // moto ignores tag filters on DescribeNatGateways and DescribeAddresses: the
        // tags are matched here.
        let tagged = |tags: &[aws_sdk_ec2::types::Tag]| {
            tags.iter()
                .any(|t| t.key() == Some("hypd:cluster") && t.value() == Some(name))
        };
        let live_nats = nats
            .nat_gateways()
            .iter()
            .filter(|g| g.state() != Some(&aws_sdk_ec2::types::NatGatewayState::Deleted))
            .filter(|g| tagged(g.tags()))
            .count();
        let eips = ec2.describe_addresses().send().await.unwrap();
        let eips = eips.addresses().iter().filter(|a| tagged(a.tags())).count();
        let igws = ec2
            .describe_internet_gateways()
            .filters(ours())
            .send()
            .await
            .unwrap();
        let rts = ec2
            .describe_route_tables()
            .filters(ours())
            .send()
            .await
            .unwrap();
        // Endpoints and the security group are counted in the cluster's VPC: none
        // when the VPC is gone.
        let (endpoints, sgs) = if vpc_ids.is_empty() {
            (0, 0)
        } else {
            let endpoints = ec2
                .describe_vpc_endpoints()
                .filters(in_vpc())
                .send()
                .await
                .unwrap();
            let sgs = ec2
                .describe_security_groups()
                .filters(in_vpc())
                .filters(
                    aws_sdk_ec2::types::Filter::builder()
                        .name("group-name")
                        .values(format!("hypd-{name}-efa"))
                        .build(),
                )
                .send()
                .await
                .unwrap();
            (endpoints.vpc_endpoints().len(), sgs.security_groups().len())
        };
        let iam = aws_sdk_iam::Client::new(&conf);
        // Every page: the harness's clusters share one moto, past IAM's 100 a page.
        let roles: Vec<aws_sdk_iam::types::Role> = iam
            .list_roles()
            .into_paginator()
            .items()
            .send()
            .collect::<Result<_, _>>()
            .await
            .unwrap();
        let prefix = format!("hypd-{name}-");
        let oidc = iam.list_open_id_connect_providers().send().await.unwrap();
        let mut oidc_providers = 0;
        for p in oidc.open_id_connect_provider_list() {
            let tags = iam
                .list_open_id_connect_provider_tags()
                .open_id_connect_provider_arn(p.arn().unwrap())
                .send()
                .await
                .unwrap();
            oidc_providers += usize::from(
                tags.tags()
                    .iter()
                    .any(|t| t.key() == "hypd:cluster" && t.value() == name),
            );
        }
        let s3 = aws_sdk_s3::Client::from_conf(
            aws_sdk_s3::config::Builder::from(&conf)
                .force_path_style(true)
                .build(),
        );
        let scripts = s3
            .list_objects_v2()
            .bucket(format!("hypd-{name}-123456789012"))
            .prefix("hypd/lifecycle/")
            .send()
            .await
            .map(|o| o.contents().len())
            .unwrap_or(0);
        Counts {
            vpcs: vpcs.vpcs().len(),
            subnets: subnets.subnets().len(),
            nat_gateways: live_nats,
            addresses: eips,
            internet_gateways: igws.internet_gateways().len(),
            route_tables: rts.route_tables().len(),
            s3_endpoints: endpoints,
            security_groups: sgs,
            roles: roles
                .iter()
                .filter(|r| r.role_name().starts_with(&prefix))
                .count(),
            oidc_providers,
            lifecycle_scripts: scripts,
            eks_clusters,
            addons: addons["addons"].as_array().map_or(0, Vec::len),
            pod_identities: identities["associations"].as_array().map_or(0, Vec::len),
            hyperpod_clusters: hyperpod,
        }
    })
}

/// What a user sees with kubectl on the new cluster: every HyperPod instance of each
/// group a Ready node with GPUs, the node components running on each, and the shared
/// claim Bound.
pub fn assert_kubernetes_ready(world: &World, name: &str, groups: &[(&str, usize)]) {
    let nodes: usize = groups.iter().map(|(_, n)| n).sum();
    use k8s_openapi::api::apps::v1::DaemonSet;
    use k8s_openapi::api::core::v1::{Node, PersistentVolumeClaim};
    use kube::api::{Api, ListParams};
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let client = kube_client(world, name).await;
        let listed = Api::<Node>::all(client.clone())
            .list(&ListParams::default().labels("sagemaker.amazonaws.com/compute-type=hyperpod"))
            .await
            .unwrap();
        let ready_gpu: Vec<&Node> = listed
            .items
            .iter()
            .filter(|n| {
                let s = n.status.as_ref().unwrap();
                s.conditions
                    .as_ref()
                    .unwrap()
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True")
                    && s.allocatable
                        .as_ref()
                        .unwrap()
                        .contains_key("nvidia.com/gpu")
            })
            .collect();
        assert_eq!(ready_gpu.len(), nodes, "Ready GPU nodes");
        for (group, want) in groups {
            let in_group = ready_gpu
                .iter()
                .filter(|n| {
                    n.metadata.labels.as_ref().unwrap()["sagemaker.amazonaws.com/instance-group-name"]
                        == *group
                })
                .count();
            assert_eq!(in_group, *want, "Ready GPU nodes in group {group}");
        }
        for (ns, ds) in [
            ("aws-hyperpod", "health-monitoring-agent"),
            ("kube-system", "nvidia-device-plugin-daemonset"),
            ("kube-system", "aws-efa-k8s-device-plugin-daemonset"),
        ] {
            let d = Api::<DaemonSet>::namespaced(client.clone(), ns)
                .get(ds)
                .await
                .unwrap();
            let st = d.status.unwrap();
            assert_eq!(
                (st.desired_number_scheduled, st.number_ready),
                (nodes as i32, nodes as i32),
                "{ds} on every node"
            );
            let managers: Vec<String> = d
                .metadata
                .managed_fields
                .unwrap_or_default()
                .into_iter()
                .filter_map(|m| m.manager)
                .collect();
            assert!(managers.contains(&"hypd".to_owned()), "{ds}: {managers:?}");
        }
        let claim = Api::<PersistentVolumeClaim>::namespaced(client, "default")
            .get("shared-s3")
            .await
            .unwrap();
        assert_eq!(claim.status.unwrap().phase.as_deref(), Some("Bound"));
    });
}

/// A client of cluster `name`'s Kubernetes API, reached hypd's own way (DescribeCluster's
/// endpoint and CA, an STS-signed token) at the sim's API server, which checks the
/// token's signature.
pub async fn kube_client(world: &World, name: &str) -> kube::Client {
    let conf = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .endpoint_url(&world.sim.url)
        .region(aws_config::Region::new("us-east-1"))
        .credentials_provider(aws_sdk_sts::config::Credentials::new(
            "testing", "testing", None, None, "test",
        ))
        .load()
        .await;
    let aws = hypd::aws::Aws::new(conf);
    hypd::resources::kube::connect(&aws, "us-east-1", name)
        .await
        .unwrap()
}

/// SageMaker's answer to `operation` with `body`, as the sim gives it (unsigned: the sim
/// serves SageMaker itself).
pub fn sagemaker(world: &World, operation: &str, body: Value) -> Value {
    let resp = reqwest::blocking::Client::new()
        .post(&world.sim.url)
        .header("x-amz-target", format!("SageMaker.{operation}"))
        .header("content-type", "application/x-amz-json-1.1")
        .body(body.to_string())
        .send()
        .unwrap();
    resp.json().unwrap()
}

fn hyperpod_clusters(world: &World, name: &str) -> usize {
    let body = sagemaker(world, "ListClusters", json!({}));
    body["ClusterSummaries"]
        .as_array()
        .map_or(0, |a| a.iter().filter(|c| c["ClusterName"] == name).count())
}

pub fn assert_complete(c: &Counts) {
    assert_eq!(c.vpcs, 1, "VPC");
    assert_eq!(c.subnets, 5, "2 public, 2 private, 1 compute subnet");
    assert_eq!(c.nat_gateways, 1, "NAT gateway");
    assert_eq!(c.addresses, 1, "NAT gateway's Elastic IP");
    assert_eq!(c.oidc_providers, 1, "OIDC provider");
    assert_eq!(c.internet_gateways, 1, "Internet gateway");
    assert_eq!(c.route_tables, 2, "public and private route tables");
    assert_eq!(c.s3_endpoints, 1, "S3 gateway endpoint");
    assert_eq!(c.security_groups, 1, "EFA security group");
    assert_eq!(
        c.roles, 3,
        "EKS cluster role, HyperPod execution role, S3 CSI driver role"
    );
    assert_eq!(c.pod_identities, 1, "S3 CSI driver's pod identity");
    assert_eq!(c.lifecycle_scripts, 1, "lifecycle script");
    assert_eq!(c.eks_clusters, 1, "EKS cluster");
    assert_eq!(c.addons, 4, "EKS add-ons");
    assert_eq!(c.hyperpod_clusters, 1, "HyperPod cluster");
}

/// Nothing of the cluster's is left: what `delete_cluster` promises for a cluster hypd
/// created.
pub fn assert_gone(c: &Counts) {
    let left = [
        ("VPC", c.vpcs),
        ("subnets", c.subnets),
        ("NAT gateways", c.nat_gateways),
        ("Elastic IPs", c.addresses),
        ("Internet gateways", c.internet_gateways),
        ("route tables", c.route_tables),
        ("S3 endpoints", c.s3_endpoints),
        ("security groups", c.security_groups),
        ("roles", c.roles),
        ("OIDC providers", c.oidc_providers),
        ("lifecycle scripts", c.lifecycle_scripts),
        ("EKS clusters", c.eks_clusters),
        ("add-ons", c.addons),
        ("pod identities", c.pod_identities),
        ("HyperPod clusters", c.hyperpod_clusters),
    ];
    let left: Vec<_> = left.into_iter().filter(|(_, n)| *n > 0).collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

#[test]
fn create_through_rest_makes_exactly_the_expected_resources() {
    let world = World::start_checked(FAST);
    // Every AWS call through the sim's front (it relays moto's), so its call log sees
    // what the deletion at the end calls.
    let hypd = world.hypd(None, &[("AWS_ENDPOINT_URL", world.sim.url.as_str())]);
    let token = hypd.admin_token();

    // A dry run on the empty account makes nothing, stores nothing, and lists, stage by
    // stage, every object the creation then makes.
    world.sim.call(Method::DELETE, "/_sim/calls", None);
    let mut dry_request = two_groups("ml-a");
    dry_request["dry_run"] = json!(true);
    let (status, dry) = create(&hypd, &token, dry_request);
    assert_eq!(status, 200, "{dry}");
    let changed = mutating_calls(&world);
    assert!(changed.is_empty(), "a dry run called {changed:?}");
    let (_, listed) = hypd.call(&token, Method::GET, "/api/v1/operations", None);
    assert_eq!(
        listed["operations"],
        json!([]),
        "a dry run stores no operation"
    );
    let (_, clusters) = hypd.call(&token, Method::GET, "/api/v1/clusters", None);
    assert_eq!(clusters["clusters"], json!([]), "nor a cluster");
    let plan = dry["plan"].clone();
    let planned_stages: Vec<&str> = plan["stages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["stage"].as_str().unwrap())
        .collect();
    assert_eq!(planned_stages[0], "network");
    assert_eq!(planned_stages.len(), 9, "{plan:#}");
    assert!(
        creates(&plan).any(|c| c["kind"] == "ec2:Subnet"
            && c["fields"]
                .as_array()
                .unwrap()
                .iter()
                .any(|f| f["new"] == "(known after apply)")),
        "ids made by the run are known after apply: {plan:#}"
    );
    for kind in [
        "eks:AccessEntry",
        "hypd:Cluster",
        "k8s:v1/PersistentVolumeClaim",
    ] {
        assert!(
            creates(&plan).any(|c| c["kind"] == kind),
            "{kind} in {plan:#}"
        );
    }
    // Distinct blocks for the subnets a new VPC gets, as the run carves them.
    let blocks: Vec<&Value> = creates(&plan)
        .filter(|c| c["kind"] == "ec2:Subnet")
        .flat_map(|c| c["fields"].as_array().unwrap())
        .filter(|f| f["field"] == "cidr_block")
        .map(|f| &f["new"])
        .collect();
    let distinct: std::collections::BTreeSet<String> =
        blocks.iter().map(|b| b.to_string()).collect();
    assert_eq!(distinct.len(), blocks.len(), "{blocks:?}");

    world.sim.call(Method::DELETE, "/_sim/calls", None);
    let (status, started) = create(&hypd, &token, two_groups("ml-a"));
    assert_eq!(status, 200, "{started}");
    let id = started["operation_id"].as_str().unwrap().to_owned();
    let op = hypd.finish(&token, &id);
    assert_eq!(op["state"], "succeeded", "{op:#}");
    assert_eq!(
        planned_creates(&plan),
        present(&count(&world, "ml-a")),
        "the plan lists what the run made: {plan:#}"
    );
    // The same code: the kinds the run changed are the kinds the plan lists.
    let called: std::collections::BTreeSet<String> = mutating_calls(&world)
        .into_iter()
        .map(|(service, operation)| {
            changed_kind(&service, &operation).unwrap_or_else(|| {
                panic!("the creation called {service} {operation}, which no plan change names")
            })
        })
        .collect();
    let planned: std::collections::BTreeSet<String> = creates(&plan)
        .chain(changes_of(&plan).filter(|c| c["action"] == "update"))
        .map(|c| plan_kind(c["kind"].as_str().unwrap()))
        .filter(|k| k != "hypd:Cluster")
        .collect();
    assert_eq!(called, planned);
    let names: Vec<&str> = op["stages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "network",
            "iam",
            "eks",
            "access",
            "activate",
            "addons",
            "components",
            "hyperpod",
            "storage"
        ]
    );

    let out = &op["outputs"];
    assert!(
        out["network"]["vpc_cidr"]
            .as_str()
            .unwrap()
            .ends_with(".0.0/16")
    );
    assert_eq!(
        out["network"]["private_subnet_ids"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    assert_eq!(out["network"]["availability_zones"][0], "us-east-1a");
    assert!(
        out["hyperpod"]["hyperpod_cluster_arn"]
            .as_str()
            .unwrap()
            .contains(":cluster/")
    );
    assert_eq!(out["addons"].as_object().unwrap().len(), 4);
    assert_eq!(out["components"].as_object().unwrap().len(), 3);
    assert_eq!(out["storage"]["phase"], "Bound");
    assert_complete(&count(&world, "ml-a"));
    assert_kubernetes_ready(&world, "ml-a", &[("gpu", 2), ("spot", 1)]);

    let (_, cluster) = hypd.call(&token, Method::GET, "/api/v1/clusters/ml-a", None);
    assert_eq!(cluster["status"], "active", "{cluster}");
    assert!(cluster["hyperpod_cluster_arn"].is_string());
    // The finished creation recorded its nodes, so the list shows them without AWS.
    assert_eq!(cluster["nodes"]["counts"]["total"], 3, "{cluster}");
    assert!(cluster["nodes"]["observed_at"].is_string(), "{cluster}");

    // Nothing drifted right after creation: an empty report, from read-only calls only.
    world.sim.call(Method::DELETE, "/_sim/calls", None);
    let (status, drift) = hypd.call(&token, Method::GET, "/api/v1/clusters/ml-a/drift", None);
    assert_eq!(status, 200, "{drift}");
    assert_eq!(drift["made_by"], "create_cluster");
    assert_eq!(drift["drifted"], json!([]), "{drift:#}");
    let changed = mutating_calls(&world);
    assert!(changed.is_empty(), "get_drift called {changed:?}");
    let (_, log) = world.sim.call(Method::GET, "/_sim/calls", None);
    let calls = log["calls"].as_array().unwrap();
    let kube = calls
        .iter()
        .filter(|c| c["service"] == "kubernetes")
        .count();
    eprintln!(
        "get_drift on a clean cluster: {} AWS and {kube} Kubernetes calls",
        calls.len() - kube
    );

    // The request that made it, planned again, has nothing to do (from read-only calls).
    world.sim.call(Method::DELETE, "/_sim/calls", None);
    let mut replan = two_groups("ml-a");
    replan["dry_run"] = json!(true);
    let (status, replan) = create(&hypd, &token, replan);
    assert_eq!(status, 200, "{replan}");
    assert_eq!(replan["plan"]["stages"].as_array().unwrap().len(), 9);
    let to_do: Vec<&Value> = changes_of(&replan["plan"])
        .filter(|c| c["action"] != "none")
        .collect();
    assert!(to_do.is_empty(), "nothing to do: {replan:#}");
    let changed = mutating_calls(&world);
    assert!(changed.is_empty(), "the dry run called {changed:?}");
    // Another request for the same name is planned as a creation: refused, name taken.
    let mut other = small("ml-a");
    other["dry_run"] = json!(true);
    let (status, other) = create(&hypd, &token, other);
    assert_eq!(status, 422, "{other}");
    assert_eq!(other["error"]["errors"][0]["field"], "name");

    // Its name is now taken: refused before anything is made.
    let (status, again) = create(&hypd, &token, two_groups("ml-a"));
    assert_eq!(status, 422, "a created cluster's name is taken: {again}");
    assert_eq!(again["error"]["errors"][0]["field"], "name");

    // A second cluster gets its own, non-overlapping VPC.
    let (_, second) = create(&hypd, &token, small("ml-b"));
    let op_b = hypd.finish(&token, second["operation_id"].as_str().unwrap());
    assert_eq!(op_b["state"], "succeeded", "{op_b:#}");
    assert_ne!(
        op_b["outputs"]["network"]["vpc_cidr"],
        out["network"]["vpc_cidr"]
    );
    assert_complete(&count(&world, "ml-b"));

    // A dry run of deleting ml-b lists exactly what the deletion then removes, and
    // neither changes the world nor writes an operation.
    let operations = || {
        let (_, list) = hypd.call(&token, Method::GET, "/api/v1/operations", None);
        list["operations"].as_array().unwrap().len()
    };
    let before = (operations(), count(&world, "ml-b"));
    let path = "/api/v1/clusters/ml-b";
    world.sim.call(Method::DELETE, "/_sim/calls", None);
    let (status, dry) = hypd.call(&token, Method::DELETE, path, Some(json!({"dry_run": true})));
    let changed = mutating_calls(&world);
    assert!(changed.is_empty(), "a dry run called {changed:?}");
    assert_eq!(status, 200, "{dry}");
    let plan = &dry["plan"];
    assert_eq!(plan["target"], "cluster/ml-b");
    let stages: Vec<&str> = plan["stages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["stage"].as_str().unwrap())
        .collect();
    assert_eq!(
        stages,
        [
            "hyperpod", "addons", "eks", "iam", "network", "bucket", "forget"
        ]
    );
    assert_eq!(planned_deletes(plan), present(&before.1), "{plan:#}");
    for kind in ["s3:Bucket", "hypd:Cluster"] {
        assert!(
            deletes(plan).any(|c| c["kind"] == kind),
            "{kind} in {plan:#}"
        );
    }
    assert_eq!(
        (operations(), count(&world, "ml-b")),
        before,
        "a dry run changes nothing"
    );
    // The first call without a confirmation answers with the same plan.
    let (_, first) = hypd.call(&token, Method::DELETE, path, None);
    assert_eq!(&first["plan"], plan);
    assert!(first["confirmation"].is_string());
    assert_eq!(operations(), before.0);

    world.sim.call(Method::DELETE, "/_sim/calls", None);
    let (status, deleted) = hypd.confirmed(&token, Method::DELETE, path, None);
    assert_eq!(status, 200, "{deleted}");
    let op = hypd.finish(&token, deleted["operation_id"].as_str().unwrap());
    assert_eq!(op["state"], "succeeded", "{op:#}");
    assert_gone(&count(&world, "ml-b"));
    // The same code: every kind of object the deletion changed is in the plan, and the
    // deletion changed every kind the plan lists (retries make call counts differ).
    let mut called = std::collections::BTreeSet::new();
    for (service, operation) in mutating_calls(&world) {
        let kind = changed_kind(&service, &operation).unwrap_or_else(|| {
            panic!("the deletion called {service} {operation}, which no plan change names")
        });
        called.insert(kind);
    }
    let planned: std::collections::BTreeSet<String> = plan["stages"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["changes"].as_array().unwrap())
        .filter(|c| c["action"] != "none" && c["action"] != "adopt" && c["kind"] != "hypd:Cluster")
        .map(|c| plan_kind(c["kind"].as_str().unwrap()))
        .collect();
    assert_eq!(called, planned);
}

/// The calls the world saw that are not reads.
fn mutating_calls(world: &World) -> Vec<(String, String)> {
    agents_mutating_calls(world)
        .into_iter()
        .map(|(_, service, operation)| (service, operation))
        .collect()
}

/// The calls the world saw that are not reads, each with its caller's application name
/// (`hypd.<operation>.<stage>` for a step's).
pub fn agents_mutating_calls(world: &World) -> Vec<(Option<String>, String, String)> {
    let (_, log) = world.sim.call(Method::GET, "/_sim/calls", None);
    log["calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["agent"].as_str().map(str::to_owned),
                c["service"].as_str().unwrap().to_owned(),
                c["operation"].as_str().unwrap().to_owned(),
            )
        })
        // AWS reads by their names, Kubernetes reads by their verbs.
        .filter(|(_, _, op)| {
            !["Describe", "List", "Get", "Head", "get ", "list ", "watch "]
                .iter()
                .any(|p| op.starts_with(p))
        })
        .collect()
}

/// The plan kind a mutating call changes; a Kubernetes call (`patch DaemonSet`) as
/// [`plan_kind`] shortens Kubernetes kinds (`k8s:DaemonSet`).
pub fn changed_kind(service: &str, operation: &str) -> Option<String> {
    if service == "kubernetes" {
        let (verb, kind) = operation.split_once(' ')?;
        return (!matches!(verb, "get" | "list" | "watch")).then(|| format!("k8s:{kind}"));
    }
    Some(
        match (service, operation) {
            ("ec2", "CreateVpc" | "ModifyVpcAttribute" | "DeleteVpc") => "ec2:Vpc",
            (
                "ec2",
                "CreateInternetGateway"
                | "AttachInternetGateway"
                | "DetachInternetGateway"
                | "DeleteInternetGateway",
            ) => "ec2:InternetGateway",
            ("ec2", "CreateSubnet" | "DeleteSubnet") => "ec2:Subnet",
            ("ec2", "AllocateAddress" | "ReleaseAddress") => "ec2:ElasticIp",
            ("ec2", "CreateNatGateway" | "DeleteNatGateway") => "ec2:NatGateway",
            (
                "ec2",
                "CreateRouteTable"
                | "CreateRoute"
                | "ReplaceRoute"
                | "DeleteRoute"
                | "AssociateRouteTable"
                | "ReplaceRouteTableAssociation"
                | "DisassociateRouteTable"
                | "DeleteRouteTable",
            ) => "ec2:RouteTable",
            ("ec2", "CreateVpcEndpoint" | "DeleteVpcEndpoints") => "ec2:VpcEndpoint",
            (
                "ec2",
                "CreateSecurityGroup"
                | "AuthorizeSecurityGroupIngress"
                | "AuthorizeSecurityGroupEgress"
                | "RevokeSecurityGroupIngress"
                | "RevokeSecurityGroupEgress"
                | "DeleteSecurityGroup",
            ) => "ec2:SecurityGroup",
            (
                "iam",
                "CreateRole"
                | "AttachRolePolicy"
                | "PutRolePolicy"
                | "UpdateAssumeRolePolicy"
                | "DeleteRole"
                | "DetachRolePolicy"
                | "DeleteRolePolicy",
            ) => "iam:Role",
            ("iam", "CreateOpenIDConnectProvider" | "DeleteOpenIDConnectProvider") => {
                "iam:OpenIDConnectProvider"
            }
            ("eks", "CreateCluster" | "DeleteCluster") => "eks:Cluster",
            ("eks", "CreateAccessEntry" | "AssociateAccessPolicy" | "DeleteAccessEntry") => {
                "eks:AccessEntry"
            }
            ("eks", "CreateAddon" | "UpdateAddon" | "DeleteAddon") => "eks:Addon",
            ("eks", "CreatePodIdentityAssociation" | "DeletePodIdentityAssociation") => {
                "eks:PodIdentityAssociation"
            }
            ("s3", "CreateBucket" | "PutBucketTagging" | "DeleteBucket") => "s3:Bucket",
            ("s3", "PutObject" | "DeleteObject" | "DeleteObjects") => "s3:Object",
            (
                "sagemaker",
                "CreateCluster" | "UpdateCluster" | "UpdateClusterSoftware" | "DeleteCluster",
            ) => "sagemaker:Cluster",
            (
                "sagemaker",
                "BatchRebootClusterNodes" | "BatchReplaceClusterNodes" | "BatchDeleteClusterNodes",
            ) => "sagemaker:ClusterNode",
            _ => return None,
        }
        .to_owned(),
    )
}

/// A plan change's kind as [`changed_kind`] names it: Kubernetes kinds without their
/// group and version (calls name only the kind).
pub fn plan_kind(kind: &str) -> String {
    match kind.strip_prefix("k8s:") {
        Some(k) => format!("k8s:{}", k.rsplit('/').next().unwrap_or(k)),
        None => kind.to_owned(),
    }
}

fn changes_of(plan: &Value) -> impl Iterator<Item = &Value> {
    plan["stages"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["changes"].as_array().unwrap())
}

fn creates(plan: &Value) -> impl Iterator<Item = &Value> {
    changes_of(plan).filter(|c| c["action"] == "create")
}

fn deletes(plan: &Value) -> impl Iterator<Item = &Value> {
    changes_of(plan).filter(|c| c["action"] == "delete")
}

/// Creations per kind in a plan, for the kinds [`Counts`] counts.
fn planned_creates(plan: &Value) -> std::collections::BTreeMap<String, usize> {
    let mut by_kind = std::collections::BTreeMap::new();
    for c in creates(plan) {
        let kind = c["kind"].as_str().unwrap();
        if COUNTED_KINDS.contains(&kind) {
            *by_kind.entry(kind.to_owned()).or_insert(0) += 1;
        }
    }
    by_kind
}

/// Deletions per kind in a plan, for the kinds [`Counts`] counts.
fn planned_deletes(plan: &Value) -> std::collections::BTreeMap<String, usize> {
    let mut by_kind = std::collections::BTreeMap::new();
    for c in deletes(plan) {
        let kind = c["kind"].as_str().unwrap();
        if !matches!(kind, "s3:Bucket" | "hypd:Cluster") {
            *by_kind.entry(kind.to_owned()).or_insert(0) += 1;
        }
    }
    by_kind
}

/// The plan kinds [`present`] counts, in its order.
const COUNTED_KINDS: [&str; 14] = [
    "ec2:Vpc",
    "ec2:Subnet",
    "ec2:NatGateway",
    "ec2:ElasticIp",
    "ec2:InternetGateway",
    "ec2:RouteTable",
    "ec2:VpcEndpoint",
    "ec2:SecurityGroup",
    "iam:Role",
    "iam:OpenIDConnectProvider",
    "s3:Object",
    "eks:Cluster",
    "eks:Addon",
    "sagemaker:Cluster",
];

/// What exists, per plan kind. Pod identity associations go with their EKS cluster,
/// so no stage deletes them one by one.
fn present(c: &Counts) -> std::collections::BTreeMap<String, usize> {
    let counts = [
        c.vpcs,
        c.subnets,
        c.nat_gateways,
        c.addresses,
        c.internet_gateways,
        c.route_tables,
        c.s3_endpoints,
        c.security_groups,
        c.roles,
        c.oidc_providers,
        c.lifecycle_scripts,
        c.eks_clusters,
        c.addons,
        c.hyperpod_clusters,
    ];
    COUNTED_KINDS
        .into_iter()
        .zip(counts)
        .filter(|(_, n)| *n > 0)
        .map(|(k, n)| (k.to_owned(), n))
        .collect()
}

#[test]
fn bad_inputs_are_refused_before_anything_is_created() {
    let world = World::start_checked(FAST);
    let hypd = world.hypd(None, &[]);
    let token = hypd.admin_token();
    // A VPC the user already has.
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let ec2 = aws_sdk_ec2::Client::new(&world.moto_sdk().await);
        ec2.create_vpc()
            .cidr_block("10.7.0.0/16")
            .send()
            .await
            .unwrap();
    });
    // (what changes: top-level fields, or the first group's; the field named; words)
    let cases = [
        (
            json!({"network": {"vpc_cidr": "10.7.0.0/16"}}),
            json!({}),
            "network.vpc_cidr",
            "overlaps",
        ),
        (
            json!({}),
            json!({"efa_only": true}),
            "instance_groups[0].efa_only",
            "EFA",
        ),
        (
            json!({"availability_zone": "us-east-1z"}),
            json!({}),
            "availability_zone",
            "not an Availability Zone",
        ),
        (
            json!({}),
            json!({"instance_count": 0}),
            "instance_groups[0].instance_count",
            "at least 1",
        ),
        (
            json!({}),
            json!({"instance_type": "ml.nope.8xlarge"}),
            "instance_groups[0].instance_type",
            "not an instance type",
        ),
        // A type EC2 offers but HyperPod cannot build (Graviton).
        (
            json!({}),
            json!({"instance_type": "ml.g5g.xlarge"}),
            "instance_groups[0].instance_type",
            "HyperPod clusters support",
        ),
        (json!({"name": "bad_name"}), json!({}), "name", ""),
    ];
    for (change, group_change, field, words) in cases {
        let mut body = small("ml-bad");
        body.as_object_mut()
            .unwrap()
            .extend(change.as_object().unwrap().clone());
        body["instance_groups"][0]
            .as_object_mut()
            .unwrap()
            .extend(group_change.as_object().unwrap().clone());
        let (status, answer) = create(&hypd, &token, body);
        assert_eq!(status, 422, "{field}: {answer}");
        let err = &answer["error"]["errors"][0];
        assert_eq!(err["field"], field, "{answer}");
        assert!(err["message"].as_str().unwrap().contains(words), "{answer}");
    }
    // Only types HyperPod builds are offered (EC2 offers Graviton GPUs such as g5g too).
    let (status, offered) = hypd.call(
        &token,
        Method::GET,
        "/api/v1/instance-types?availability_zone=us-east-1a",
        None,
    );
    assert_eq!(status, 200, "{offered}");
    let names: Vec<&str> = offered["instance_types"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["hyperpod_instance_type"].as_str())
        .collect();
    assert!(
        names.contains(&"ml.g5.8xlarge") && names.contains(&"ml.p5.48xlarge"),
        "{names:?}"
    );
    assert!(!names.iter().any(|n| n.starts_with("ml.g5g.")), "{names:?}");
    // The account's cluster-usage quota (Service Quotas) is below the request.
    let (status, _) = world.sim.call(
        Method::PUT,
        "/_sim/sagemaker/quotas",
        Some(json!({"ml.g5.8xlarge": 1})),
    );
    assert!(status < 300);
    let (status, answer) = create(&hypd, &token, small("ml-bad"));
    assert_eq!(status, 422, "{answer}");
    let err = &answer["error"]["errors"][0];
    assert_eq!(
        err["field"], "instance_groups[0].instance_count",
        "{answer}"
    );
    assert!(
        err["message"]
            .as_str()
            .unwrap()
            .contains("\"ml.g5.8xlarge for cluster usage\" in us-east-1 is 1"),
        "{answer}"
    );
    let (_, ops) = hypd.call(&token, Method::GET, "/api/v1/operations", None);
    assert_eq!(ops["operations"].as_array().unwrap().len(), 0, "{ops}");
    let counts = count(&world, "ml-bad");
    assert_eq!((counts.vpcs, counts.roles, counts.eks_clusters), (0, 0, 0));
}

/// Deleting one cluster never depends on another's objects: four clusters deleted at
/// once all go, each taking exactly its own (issue: the IAM stage listed every OIDC
/// provider of the account and read each one's tags, failing when a concurrent delete
/// removed one in between).
#[test]
fn concurrent_deletes_each_take_their_own_cluster() {
    let world = World::start_checked(FAST);
    let hypd = world.hypd(None, &[]);
    let token = hypd.admin_token();
    let names: Vec<String> = (0..4).map(|i| format!("many-{i}")).collect();
    let created: Vec<String> = names
        .iter()
        .map(|n| {
            let (status, body) = create(&hypd, &token, small(n));
            assert_eq!(status, 200, "{body}");
            body["operation_id"].as_str().unwrap().to_owned()
        })
        .collect();
    for id in &created {
        let op = hypd.finish(&token, id);
        assert_eq!(op["state"], "succeeded", "{op:#}");
    }
    let deletes: Vec<String> = std::thread::scope(|s| {
        let calls: Vec<_> = names
            .iter()
            .map(|n| {
                let (hypd, token) = (&hypd, &token);
                s.spawn(move || {
                    let (status, body) = hypd.confirmed(
                        token,
                        Method::DELETE,
                        &format!("/api/v1/clusters/{n}"),
                        None,
                    );
                    assert_eq!(status, 200, "{body}");
                    body["operation_id"].as_str().unwrap().to_owned()
                })
            })
            .collect();
        calls.into_iter().map(|c| c.join().unwrap()).collect()
    });
    for (id, name) in deletes.iter().zip(&names) {
        let op = hypd.finish(&token, id);
        assert_eq!(op["state"], "succeeded", "{name}: {op:#}");
        assert_gone(&count(&world, name));
    }
}

/// A throttled Kubernetes API is the engine's wait, with a note and backoff, as for AWS
/// (the Kubernetes client's own retries are off: they kept the stage `running` with no
/// word for up to 90 s).
#[test]
fn kubernetes_throttling_is_a_wait_with_a_note() {
    let world = World::start_checked(FAST);
    let hypd = world.hypd(None, &[]);
    let token = hypd.admin_token();
    let (status, _) = world.sim.call(
        Method::POST,
        "/_sim/faults",
        Some(json!({"service": "kubernetes", "operation": "patch DaemonSet", "kind": "throttle", "times": 2})),
    );
    assert!(status < 300);
    let (_, started) = create(&hypd, &token, small("ml-throttled"));
    let id = started["operation_id"].as_str().unwrap().to_owned();
    let mut noted = None;
    crate::wait_until(
        "the components stage to wait",
        std::time::Duration::from_secs(120),
        || {
            let op = crate::get_op(&hypd, &token, &id);
            let s = crate::stage(&op, "components");
            if s["state"] == "waiting" {
                noted = s["message"].as_str().map(str::to_owned);
            }
            noted.is_some() || op["state"] == "succeeded" || op["state"] == "failed"
        },
    );
    let note = noted.expect("the throttled stage waited");
    assert!(
        note.contains("TooManyRequests") && note.contains("trying again in"),
        "{note}"
    );
    let op = hypd.finish(&token, &id);
    assert_eq!(op["state"], "succeeded", "{op:#}");
}

/// An EKS control plane that ends FAILED fails the eks stage at once with EKS's health
/// issue, not after six retries: no retry of the same call can change a failed cluster.
#[test]
fn a_failed_control_plane_fails_the_stage_at_once() {
    let world = World::start_checked(FAST);
    let hypd = world.hypd(None, &[]);
    let token = hypd.admin_token();
    let (status, _) = world.sim.call(
        Method::POST,
        "/_sim/faults",
        Some(
            json!({"service": "eks", "operation": "CreateCluster", "kind": "fails",
                    "code": "Ec2SubnetInvalidConfiguration",
                    "message": "One or more Amazon EC2 Subnets for the cluster are invalid"}),
        ),
    );
    assert!(status < 300);
    let (_, started) = create(&hypd, &token, small("ml-failed"));
    let op = hypd.finish(&token, started["operation_id"].as_str().unwrap());
    assert_eq!(op["state"], "failed", "{op:#}");
    let eks = crate::stage(&op, "eks");
    assert_eq!(eks["state"], "failed", "{op:#}");
    assert_eq!(eks["error"]["code"], "FAILED", "{eks}");
    assert_eq!(eks["error"]["transient"], false, "{eks}");
    assert!(
        eks["error"]["message"]
            .as_str()
            .unwrap()
            .contains("Ec2SubnetInvalidConfiguration: One or more Amazon EC2 Subnets"),
        "{eks}"
    );
    // Failed on its first look at the finished cluster: no backoff retries.
    assert!(eks["attempts"].as_u64().unwrap() <= 2, "{eks}");
}

/// An operation stored before instance groups were a list still resumes: a creation
/// stopped mid-way, its stored request rewritten to the single-group shape of then, is
/// finished by a restarted hypd, whose HyperPod group gets the name those clusters'
/// groups had.
#[test]
fn a_creation_stored_in_the_single_group_shape_resumes() {
    let world = World::start_checked(FAST);
    let hypd = world.hypd(None, &[]);
    let token = hypd.admin_token();
    // Throttled, HyperPod's CreateCluster never happens: the stage waits to try again.
    let hold = crate::fault(
        &world,
        json!({"service": "sagemaker", "operation": "CreateCluster", "kind": "throttle", "times": 1_000_000}),
    );
    let (_, started) = create(&hypd, &token, small("ml-old"));
    let id = started["operation_id"].as_str().unwrap().to_owned();
    crate::wait_until(
        "the hyperpod stage",
        std::time::Duration::from_secs(120),
        || {
            let op = crate::get_op(&hypd, &token, &id);
            crate::stage(&op, "hyperpod")["state"] == "waiting"
        },
    );
    let data_dir = hypd.kill();
    world
        .sim
        .call(Method::DELETE, &format!("/_sim/faults/{hold}"), None);
    let db = data_dir.path().join("hypd.db");
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let store = hypd::store::Store::open(&hypd::config::Database::Sqlite(db))
            .await
            .unwrap();
        let hypd::store::Store::Sqlite(pool) = store else {
            panic!("a SQLite store")
        };
        let (spec,): (String,) = sqlx::query_as("SELECT spec FROM operations WHERE id = $1")
            .bind(&id)
            .fetch_one(&pool)
            .await
            .unwrap();
        let mut old: Value = serde_json::from_str(&spec).unwrap();
        let group = old["instance_groups"][0].clone();
        let o = old.as_object_mut().unwrap();
        o.remove("instance_groups");
        for field in ["instance_type", "instance_count", "deep_health_checks"] {
            o.insert(field.to_owned(), group[field].clone());
        }
        sqlx::query("UPDATE operations SET spec = $1 WHERE id = $2")
            .bind(old.to_string())
            .bind(&id)
            .execute(&pool)
            .await
            .unwrap();
    });
    let hypd = world.hypd(Some(data_dir), &[]);
    let op = hypd.finish(&token, &id);
    assert_eq!(op["state"], "succeeded", "{op:#}");
    let (status, described) = hypd.call(
        &token,
        Method::GET,
        "/api/v1/clusters/ml-old/describe",
        None,
    );
    assert_eq!(status, 200, "{described}");
    assert_eq!(
        described["instance_groups"][0]["name"], "accelerated-1",
        "{described}"
    );
    assert_eq!(
        described["instance_groups"][0]["target_count"], 2,
        "{described}"
    );
}
