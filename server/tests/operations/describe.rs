//! `describe_cluster` against moto + hypd-sim: after `create_cluster` succeeds it shows
//! the instance group with its counts, the group's nodes and their health, and the
//! add-ons; an imported EKS cluster without HyperPod describes fine; a provider failure
//! is the provider's error with its call named.

use crate::common::{Hypd, World};
use reqwest::Method;
use serde_json::{Value, json};

use crate::FAST;

fn describe(hypd: &Hypd, token: &str, name: &str) -> (u16, Value) {
    hypd.call(
        token,
        Method::GET,
        &format!("/api/v1/clusters/{name}/describe"),
        None,
    )
}

#[test]
fn a_created_cluster_shows_its_group_nodes_and_addons() {
    let world = World::start_checked(FAST);
    let hypd = world.hypd(None, &[]);
    let token = hypd.admin_token();
    let (status, started) = hypd.call(
        &token,
        Method::POST,
        "/api/v1/clusters",
        Some(json!({
            "name": "ml-d",
            "availability_zone": "us-east-1a",
            "instance_groups": [{"name": "gpu", "instance_type": "ml.g5.8xlarge", "instance_count": 2}],
        })),
    );
    assert_eq!(status, 200, "{started}");
    let op = hypd.finish(&token, started["operation_id"].as_str().unwrap());
    assert_eq!(op["state"], "succeeded", "{op:#}");

    // The nodes may still be starting when the cluster is InService: wait until both run.
    let mut d = Value::Null;
    for _ in 0..100 {
        let (status, body) = describe(&hypd, &token, "ml-d");
        assert_eq!(status, 200, "{body}");
        d = body;
        if d["node_counts"]["healthy"] == 2 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert_eq!(d["cluster"]["name"], "ml-d", "{d:#}");
    assert_eq!(d["cluster"]["status"], "active", "{d:#}");
    assert_eq!(d["eks"]["status"], "ACTIVE", "{d:#}");
    assert_eq!(d["hyperpod"]["status"], "InService", "{d:#}");
    assert_eq!(d["hyperpod"]["node_recovery"], "Automatic", "{d:#}");
    let groups = d["instance_groups"].as_array().unwrap();
    assert_eq!(groups.len(), 1, "{d:#}");
    assert_eq!(groups[0]["name"], "gpu");
    assert_eq!(groups[0]["instance_type"], "ml.g5.8xlarge");
    assert_eq!(groups[0]["target_count"], 2);
    assert_eq!(groups[0]["current_count"], 2, "{d:#}");
    let nodes = d["nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), 2, "{d:#}");
    for n in nodes {
        assert!(n["node_id"].as_str().unwrap().starts_with("i-"), "{n}");
        assert_eq!(n["instance_group"], "gpu");
        assert_eq!(n["instance_type"], "ml.g5.8xlarge");
        assert_eq!(n["status"], "Running");
        assert_eq!(n["health"], "healthy");
        assert!(n["launch_time"].as_str().unwrap().ends_with('Z'), "{n}");
    }
    assert_eq!(
        d["node_counts"],
        json!({"total": 2, "healthy": 2, "pending": 0, "unhealthy": 0})
    );
    // What was just seen is what the list shows until the next look.
    assert_eq!(d["cluster"]["nodes"]["counts"], d["node_counts"], "{d:#}");
    let (_, list) = hypd.call(&token, Method::GET, "/api/v1/clusters", None);
    assert_eq!(list["clusters"][0]["name"], "ml-d", "{list}");
    assert_eq!(
        list["clusters"][0]["nodes"], d["cluster"]["nodes"],
        "{list}"
    );
    // Its nodes are the ones list_nodes answers with (one read shared by both), and
    // `refresh` reads HyperPod again: the same nodes, from a read that began after the call.
    let (status, listed) = hypd.call(&token, Method::GET, "/api/v1/clusters/ml-d/nodes", None);
    assert_eq!(status, 200, "{listed}");
    let ids = |nodes: &Value| -> Vec<String> {
        let mut ids: Vec<String> = nodes
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n["node_id"].as_str().unwrap().to_owned())
            .collect();
        ids.sort();
        ids
    };
    assert_eq!(ids(&listed["nodes"]), ids(&d["nodes"]), "{listed:#}");
    let (status, fresh) = hypd.call(
        &token,
        Method::GET,
        "/api/v1/clusters/ml-d/describe?refresh=true",
        None,
    );
    assert_eq!(status, 200, "{fresh}");
    assert_eq!(ids(&fresh["nodes"]), ids(&d["nodes"]), "{fresh:#}");
    assert_eq!(fresh["node_counts"], d["node_counts"], "{fresh:#}");
    let addons = d["addons"].as_array().unwrap();
    assert!(addons.len() >= 4, "{d:#}");
    for a in addons {
        assert_eq!(a["status"], "ACTIVE", "{a}");
        assert!(a["version"].is_string(), "{a}");
    }
    // The Kubernetes side: every node component ready on both nodes, the claim Bound.
    let components = d["components"].as_array().unwrap();
    assert_eq!(components.len(), 3, "{d:#}");
    for c in components {
        assert_eq!(c["state"], "ready", "{c}");
        assert!(c["version"].is_string(), "{c}");
    }
    let storage = &d["storage"][0];
    assert_eq!(storage["kind"], "s3", "{d:#}");
    assert_eq!(storage["pvc"], "shared-s3");
    assert_eq!(storage["phase"], "Bound");
    assert_eq!(storage["bucket"], "hypd-ml-d-123456789012");

    // Viewers may read it; a cluster hypd does not manage is not found, whatever AWS has.
    let (_, created) = hypd.call(
        &token,
        Method::POST,
        "/api/v1/tokens",
        Some(json!({"name": "looker", "role": "viewer"})),
    );
    let viewer = created["token"].as_str().unwrap();
    assert_eq!(describe(&hypd, viewer, "ml-d").0, 200);
    assert_eq!(describe(&hypd, &token, "nope").0, 404);
}

#[test]
fn an_imported_eks_cluster_without_hyperpod_describes_fine() {
    let world = World::start(FAST);
    let hypd = world.hypd(None, &[]);
    let token = hypd.admin_token();
    // An EKS cluster made directly in the sim, then imported: no HyperPod orchestrated.
    let (status, made) = world.sim.call(
        Method::POST,
        "/clusters",
        Some(json!({
            "name": "plain-eks",
            "roleArn": "arn:aws:iam::123456789012:role/eks",
            "resourcesVpcConfig": {"subnetIds": ["subnet-0123456789abcdef0", "subnet-0123456789abcdef1"]},
            "accessConfig": {"authenticationMode": "API_AND_CONFIG_MAP"},
        })),
    );
    assert!(status < 300, "{made}");
    let (status, started) = hypd.call(
        &token,
        Method::POST,
        "/api/v1/clusters/import",
        Some(json!({"name": "plain-eks"})),
    );
    assert_eq!(status, 200, "{started}");
    let op = hypd.finish(&token, started["operation_id"].as_str().unwrap());
    assert_eq!(op["state"], "succeeded", "{op:#}");
    // Not observed yet: an import asks nothing of the nodes.
    let (_, stored) = hypd.call(&token, Method::GET, "/api/v1/clusters/plain-eks", None);
    assert_eq!(stored["nodes"], Value::Null, "{stored}");
    let (status, d) = describe(&hypd, &token, "plain-eks");
    assert_eq!(status, 200, "{d}");
    assert_eq!(d["cluster"]["status"], "imported", "{d:#}");
    assert_eq!(d["cluster"]["nodes"]["counts"]["total"], 0, "{d:#}");
    assert_eq!(d["eks"]["status"], "ACTIVE", "{d:#}");
    assert_eq!(d["hyperpod"], Value::Null, "{d:#}");
    assert_eq!(d["instance_groups"], json!([]));
    assert_eq!(d["nodes"], json!([]));
    assert_eq!(d["node_counts"]["total"], 0);

    // A provider failure is the provider's error, with its call named.
    let (status, _) = world.sim.call(
        Method::POST,
        "/_sim/faults",
        Some(
            json!({"service": "eks", "operation": "ListAddons", "kind": "error",
                    "code": "AccessDeniedException", "status": 403,
                    "message": "not authorized to perform: eks:ListAddons"}),
        ),
    );
    assert!(status < 300);
    let (status, err) = describe(&hypd, &token, "plain-eks");
    assert_eq!(status, 502, "{err}");
    assert_eq!(err["error"]["kind"], "upstream", "{err}");
    assert_eq!(err["error"]["call"], "ListAddons", "{err}");
    assert_eq!(err["error"]["code"], "AccessDeniedException", "{err}");
}
