//! A cluster's nodes through REST against moto + the sim: listed with what Kubernetes
//! says of each (readiness, the health label, GPUs and what pods use of them), paged and
//! filtered; rebooted with an unknown node among them (HyperPod's refusal reported on
//! the operation, the other node rebooted); replaced and deleted in two steps, the plan
//! saying what is lost; drift follows a deletion.

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use reqwest::Method;
use serde_json::{Value, json};

use crate::FAST;
use crate::common::Hypd;
use crate::common::cluster::{agents_mutating_calls, kube_client, world_with_cluster};
use crate::harness::groups;

const UNKNOWN: &str = "i-00000000000000dea";

fn list(hypd: &Hypd, token: &str, query: &str) -> Value {
    let (status, body) = hypd.call(
        token,
        Method::GET,
        &format!("/api/v1/clusters/nod/nodes{query}"),
        None,
    );
    assert_eq!(status, 200, "{query}: {body}");
    body
}

fn ids(page: &Value) -> Vec<String> {
    page["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["node_id"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn nodes_are_listed_rebooted_replaced_and_deleted() {
    let (world, hypd, token, _) = world_with_cluster(
        FAST,
        json!({"ml.g5.8xlarge": 8}),
        json!({
            "name": "nod", "availability_zone": "us-east-1a",
            "instance_groups": [{"name": "gpu", "instance_type": "ml.g5.8xlarge", "instance_count": 3}],
        }),
    );

    // Every node, joined with its Kubernetes Node.
    let all = list(&hypd, &token, "");
    let nodes = ids(&all);
    assert_eq!(nodes.len(), 3, "{all:#}");
    assert_eq!(all["counts"]["healthy"], 3, "{all:#}");
    assert_eq!(all["next_page_token"], Value::Null);
    for n in all["nodes"].as_array().unwrap() {
        assert_eq!(n["instance_group"], "gpu", "{n}");
        assert_eq!(n["status"], "Running", "{n}");
        assert_eq!(n["ready"], true, "{n}");
        assert_eq!(n["health_label"], "Schedulable", "{n}");
        assert_eq!(n["gpus"], 1, "{n}");
        assert_eq!(n["gpus_allocated"], 0, "{n}");
        assert!(
            n["kubernetes_node"]
                .as_str()
                .unwrap()
                .ends_with(n["node_id"].as_str().unwrap()),
            "{n}"
        );
        assert!(n["image_release"].is_string(), "{n}");
    }
    let mut sorted = nodes.clone();
    sorted.sort();
    assert_eq!(nodes, sorted, "by group, then id");

    // A pod asking for the GPU of the first node is counted there.
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let client = kube_client(&world, "nod").await;
        let node = all["nodes"][0]["kubernetes_node"].as_str().unwrap();
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "train-0"},
            "spec": {"nodeName": node, "containers": [{"name": "t", "image": "pytorch",
                      "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
        }))
        .unwrap();
        Api::<Pod>::namespaced(client, "default")
            .create(&PostParams::default(), &pod)
            .await
            .unwrap();
    });
    // The node view learns of the pod from its watch: within moments, not at once.
    let mut used = list(&hypd, &token, "");
    for _ in 0..100 {
        if used["nodes"][0]["gpus_allocated"] == 1 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
        used = list(&hypd, &token, "");
    }
    assert_eq!(used["nodes"][0]["gpus_allocated"], 1, "{used:#}");

    // A recent read of HyperPod answers; `refresh` asks for one that began after the call.
    let fresh = list(&hypd, &token, "?refresh=true");
    assert!(
        fresh["fetched_at"].as_str() > used["fetched_at"].as_str(),
        "{fresh:#} after {used:#}"
    );
    assert_eq!(ids(&fresh), nodes);

    // Pages of two, then the rest; filters.
    let first = list(&hypd, &token, "?limit=2");
    assert_eq!(ids(&first), nodes[..2]);
    assert_eq!(first["counts"]["total"], 3);
    let token_2 = first["next_page_token"].as_str().unwrap();
    let second = list(&hypd, &token, &format!("?limit=2&page_token={token_2}"));
    assert_eq!(ids(&second), nodes[2..]);
    assert_eq!(second["next_page_token"], Value::Null);
    assert_eq!(ids(&list(&hypd, &token, "?group=gpu")), nodes);
    assert!(ids(&list(&hypd, &token, "?group=cpu")).is_empty());
    assert!(ids(&list(&hypd, &token, "?health=unhealthy")).is_empty());
    for (query, field) in [
        ("?page_token=nonsense", "page_token"),
        ("?limit=0", "limit"),
        ("?health=sick", "health"),
    ] {
        let (status, bad) = hypd.call(
            &token,
            Method::GET,
            &format!("/api/v1/clusters/nod/nodes{query}"),
            None,
        );
        assert_eq!(status, 422, "{query}: {bad}");
        assert_eq!(bad["error"]["errors"][0]["field"], field, "{query}: {bad}");
    }

    // A reboot's plan: the node, what it is now and what it becomes; nothing called.
    let reboot = "/api/v1/clusters/nod/nodes/reboot";
    world.sim.call(Method::DELETE, "/_sim/calls", None);
    let (status, dry) = hypd.call(
        &token,
        Method::POST,
        reboot,
        Some(json!({"node_ids": [nodes[0]], "dry_run": true})),
    );
    assert_eq!(status, 200, "{dry}");
    let action = &dry["plan"]["stages"][1];
    assert_eq!(action["stage"], "action", "{dry:#}");
    assert_eq!(action["changes"][0]["name"], nodes[0].as_str(), "{dry:#}");
    assert_eq!(action["changes"][0]["kind"], "sagemaker:ClusterNode");
    assert_eq!(
        action["changes"][0]["fields"][0]["old"], "Running",
        "{dry:#}"
    );
    assert!(agents_mutating_calls(&world).is_empty());

    // A node HyperPod does not know fails the operation with its code; the other one is
    // rebooted and back.
    let (status, started) = hypd.call(
        &token,
        Method::POST,
        reboot,
        Some(json!({"node_ids": [nodes[0], UNKNOWN]})),
    );
    assert_eq!(status, 200, "{started}");
    let op = hypd.finish(&token, started["operation_id"].as_str().unwrap());
    assert_eq!(op["state"], "failed", "{op:#}");
    let error = &op["error"];
    assert_eq!(error["code"], "InstanceIdNotFound", "{op:#}");
    assert_eq!(error["call"], "BatchRebootClusterNodes", "{op:#}");
    assert!(
        error["message"].as_str().unwrap().contains(UNKNOWN),
        "{op:#}"
    );
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .starts_with("1 of 2 nodes not rebooted"),
        "{op:#}"
    );
    assert_eq!(
        op["outputs"]["answer"]["accepted"],
        json!([nodes[0]]),
        "{op:#}"
    );
    assert_eq!(op["outputs"]["found"][UNKNOWN], Value::Null, "{op:#}");
    let after = list(&hypd, &token, "");
    assert_eq!(ids(&after), nodes, "{after:#}");
    assert_eq!(after["nodes"][0]["status"], "Running", "{after:#}");

    // Replacing asks first, and the plan says the instance volumes are wiped.
    let replace = "/api/v1/clusters/nod/nodes/replace";
    let (status, asked) = hypd.call(
        &token,
        Method::POST,
        replace,
        Some(json!({"node_ids": [nodes[1]]})),
    );
    assert_eq!(status, 200, "{asked}");
    let change = &asked["plan"]["stages"][1]["changes"][0];
    assert!(
        change["fields"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["field"] == "instance_volumes" && f["new"] == "wiped"),
        "{asked:#}"
    );
    let (status, started) = hypd.confirmed(
        &token,
        Method::POST,
        replace,
        Some(json!({"node_ids": [nodes[1]]})),
    );
    assert_eq!(status, 200, "{started}");
    let op = hypd.finish(&token, started["operation_id"].as_str().unwrap());
    assert_eq!(op["state"], "succeeded", "{op:#}");
    let replaced = list(&hypd, &token, "");
    let now = ids(&replaced);
    assert_eq!(now.len(), 3, "{replaced:#}");
    assert!(!now.contains(&nodes[1]), "{replaced:#}");
    assert_eq!(replaced["counts"]["healthy"], 3, "{replaced:#}");

    // Deleting a node lowers its group's count, and drift takes that as meant.
    let (status, started) = hypd.confirmed(
        &token,
        Method::POST,
        "/api/v1/clusters/nod/nodes/delete",
        Some(json!({"node_ids": [nodes[2]]})),
    );
    assert_eq!(status, 200, "{started}");
    let op = hypd.finish(&token, started["operation_id"].as_str().unwrap());
    assert_eq!(op["state"], "succeeded", "{op:#}");
    assert_eq!(groups(&world, "nod"), [("gpu".to_owned(), 2)]);
    assert!(!ids(&list(&hypd, &token, "")).contains(&nodes[2]));
    let (status, drift) = hypd.call(&token, Method::GET, "/api/v1/clusters/nod/drift", None);
    assert_eq!(status, 200, "{drift}");
    assert_eq!(drift["drifted"], json!([]), "{drift:#}");

    // Bad lists are refused by field before anything is called.
    let (status, bad) = hypd.call(
        &token,
        Method::POST,
        reboot,
        Some(json!({"node_ids": [nodes[0], nodes[0]]})),
    );
    assert_eq!(status, 422, "{bad}");
    assert_eq!(bad["error"]["errors"][0]["field"], "node_ids[1]", "{bad}");
}

/// The platform image moved group-wide, two nodes at a time: the plan names the releases
/// and how many nodes reboot, the progress note names each batch as it rolls, and every
/// node ends on the release, Ready; a group the cluster does not have is refused by field.
#[test]
fn software_rolls_batch_by_batch() {
    let (world, hypd, token, _) = world_with_cluster(
        FAST,
        json!({"ml.g5.8xlarge": 8}),
        json!({
            "name": "nod", "availability_zone": "us-east-1a",
            "instance_groups": [{"name": "gpu", "instance_type": "ml.g5.8xlarge", "instance_count": 4}],
        }),
    );
    let newest = list(&hypd, &token, "")["nodes"][0]["image_release"].clone();

    let path = "/api/v1/clusters/nod/software-update";
    let pinned = json!({"image_release": "2025.09.15", "batch_instances": 2});
    let mut dry_run = pinned.clone();
    dry_run["dry_run"] = json!(true);
    let (status, dry) = hypd.call(&token, Method::POST, path, Some(dry_run));
    assert_eq!(status, 200, "{dry}");
    let field = &dry["plan"]["stages"][0]["changes"][0]["fields"][0];
    assert_eq!(
        field["field"], "instance_groups[gpu].image_release",
        "{dry:#}"
    );
    assert_eq!(field["old"], newest, "{dry:#}");
    assert_eq!(
        field["new"], "2025.09.15 (4 nodes, each rebooted)",
        "{dry:#}"
    );

    // Slower, so each batch is seen: 600 simulated seconds a batch take 20 s.
    let (status, _) = world
        .sim
        .call(Method::PUT, "/_sim/clock", Some(json!({"time_scale": 30})));
    assert!(status < 300);
    let (status, started) = hypd.call(&token, Method::POST, path, Some(pinned));
    assert_eq!(status, 200, "{started}");
    let id = started["operation_id"].as_str().unwrap();
    let mut notes = std::collections::BTreeSet::new();
    crate::wait_until("the roll", std::time::Duration::from_secs(180), || {
        let op = crate::get_op(&hypd, &token, id);
        if let Some(m) = crate::stage(&op, "rolled")["message"].as_str() {
            notes.insert(m.split(':').next().unwrap_or(m).to_owned());
        }
        matches!(
            op["state"].as_str(),
            Some("succeeded" | "failed" | "cancelled")
        )
    });
    let (status, _) = world.sim.call(
        Method::PUT,
        "/_sim/clock",
        Some(json!({"time_scale": FAST})),
    );
    assert!(status < 300);
    let op = hypd.finish(&token, id);
    assert_eq!(op["state"], "succeeded", "{op:#}");
    assert!(
        notes.iter().any(|n| n.contains("batch 1 of 2"))
            && notes.iter().any(|n| n.contains("batch 2 of 2")),
        "{notes:?}"
    );
    let nodes = list(&hypd, &token, "");
    for n in nodes["nodes"].as_array().unwrap() {
        assert_eq!(n["image_release"], "2025.09.15", "{n}");
        assert_eq!(n["ready"], true, "{n}");
    }

    // Back to the newest, every group at once.
    let (status, started) = hypd.call(&token, Method::POST, path, Some(json!({})));
    assert_eq!(status, 200, "{started}");
    let op = hypd.finish(&token, started["operation_id"].as_str().unwrap());
    assert_eq!(op["state"], "succeeded", "{op:#}");
    for n in list(&hypd, &token, "")["nodes"].as_array().unwrap() {
        assert_eq!(n["image_release"], newest, "{n}");
    }

    let (status, bad) = hypd.call(&token, Method::POST, path, Some(json!({"groups": ["cpu"]})));
    assert_eq!(status, 422, "{bad}");
    assert_eq!(bad["error"]["errors"][0]["field"], "groups[0]", "{bad}");
    // A release HyperPod does not have: its own refusal, on the operation.
    let (status, started) = hypd.call(
        &token,
        Method::POST,
        path,
        Some(json!({"image_release": "2020.01.01"})),
    );
    assert_eq!(status, 200, "{started}");
    let op = hypd.finish(&token, started["operation_id"].as_str().unwrap());
    assert_eq!(op["state"], "failed", "{op:#}");
    assert_eq!(op["error"]["call"], "UpdateClusterSoftware", "{op:#}");
}
