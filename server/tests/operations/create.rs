//! `create_cluster` end to end against moto + hypd-sim (which checks subnets, roles and
//! buckets against moto as AWS would): the operation succeeds and the world holds exactly
//! the expected resources; bad inputs are field errors with nothing created; a provider
//! failure in a stage stops the operation there and `retry_operation` finishes it with
//! no duplicates.

use crate::common::cluster::*;
use crate::common::{Hypd, World};
use reqwest::Method;
use serde_json::{Value, json};

use crate::FAST;

fn create(hypd: &Hypd, token: &str, body: Value) -> (u16, Value) {
    hypd.call(token, Method::POST, "/api/v1/clusters", Some(body))
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
            "hyperpod",
            "addons",
            "eks",
            "mlflow",
            "iam",
            "file_systems",
            "network",
            "bucket",
            "forget"
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
