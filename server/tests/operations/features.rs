//! Advanced features through REST against moto + the sim: the training operator turned
//! on (only its own parts are touched: the shared add-ons it needs are already there),
//! the same request again with nothing to do (no stage, no mutating call), tiered
//! checkpointing turned on beside it without touching it (its OIDC identity chain checked
//! link by link), its memory share changed, then both turned off in two steps, after
//! which AWS and Kubernetes hold exactly what they held before. The inference operator
//! and the stale-field replay, and managed Karpenter, each on a cluster of their own.

use std::collections::BTreeSet;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, ListParams};
use reqwest::Method;
use serde_json::{Value, json};

use crate::FAST;
use crate::common::cluster::{
    Counts, agents_mutating_calls, count, kube_client, world_with_cluster,
};
use crate::common::{Hypd, World};

pub const TRAINING_ADDON: &str = "amazon-sagemaker-hyperpod-training-operator";

/// What AWS and Kubernetes hold for cluster `name`: hypd's objects by kind, and every
/// Deployment and CRD in its Kubernetes.
#[derive(Debug, PartialEq)]
pub struct Inventory {
    counts: Counts,
    kubernetes: BTreeSet<String>,
}

fn named(kind: &str, m: &ObjectMeta) -> String {
    format!(
        "{kind} {}/{}",
        m.namespace.as_deref().unwrap_or_default(),
        m.name.as_deref().unwrap_or_default()
    )
}

pub fn inventory(world: &World, name: &str) -> Inventory {
    let kubernetes = tokio::runtime::Runtime::new().unwrap().block_on(async {
        let client = kube_client(world, name).await;
        let lp = ListParams::default();
        let deployments = Api::<Deployment>::all(client.clone())
            .list(&lp)
            .await
            .unwrap();
        let daemonsets = Api::<DaemonSet>::all(client.clone())
            .list(&lp)
            .await
            .unwrap();
        let accounts = Api::<ServiceAccount>::all(client.clone())
            .list(&lp)
            .await
            .unwrap();
        let crds = Api::<CustomResourceDefinition>::all(client)
            .list(&lp)
            .await
            .unwrap();
        deployments
            .items
            .iter()
            .map(|d| named("Deployment", &d.metadata))
            .chain(
                daemonsets
                    .items
                    .iter()
                    .map(|d| named("DaemonSet", &d.metadata)),
            )
            .chain(
                accounts
                    .items
                    .iter()
                    .map(|a| named("ServiceAccount", &a.metadata)),
            )
            .chain(crds.items.iter().map(|c| named("CRD", &c.metadata)))
            .collect()
    });
    Inventory {
        counts: count(world, name),
        kubernetes,
    }
}

/// The feature `feature` as get_features reads it.
pub fn feature(hypd: &Hypd, token: &str, name: &str, feature: &str) -> Value {
    let (status, body) = hypd.call(
        token,
        Method::GET,
        &format!("/api/v1/clusters/{name}/features"),
        None,
    );
    assert_eq!(status, 200, "{body}");
    body["features"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["feature"] == feature)
        .cloned()
        .unwrap_or_else(|| panic!("no {feature} in {body:#}"))
}

/// The training operator's parts in the world: add-on status, pod identity bindings of
/// its service account.
pub fn training_parts(world: &World, name: &str) -> (Option<String>, usize) {
    let (status, addon) = world.sim.call(
        Method::GET,
        &format!("/clusters/{name}/addons/{TRAINING_ADDON}"),
        None,
    );
    let addon = (status == 200).then(|| addon["addon"]["status"].as_str().unwrap().to_owned());
    let (_, bound) = world.sim.call(
        Method::GET,
        &format!(
            "/clusters/{name}/pod-identity-associations?namespace=aws-hyperpod&serviceAccount=hp-training-operator-controller-manager"
        ),
        None,
    );
    (addon, bound["associations"].as_array().map_or(0, Vec::len))
}

/// The mutating calls since the call log was last cleared, in order; each must have been
/// made by stage `stage` of operation `op` (as its user agent says).
fn calls_of(world: &World, op: &Value, stage: &str) -> Vec<String> {
    let calls = agents_mutating_calls(world);
    let agent = format!("hypd.{}.{stage}", op["operation_id"].as_str().unwrap());
    assert!(
        calls
            .iter()
            .all(|(a, _, _)| a.as_deref() == Some(agent.as_str())),
        "{calls:?}"
    );
    calls.into_iter().map(|(_, _, o)| o).collect()
}

/// The trust policy of IAM role `role`, from moto.
fn trust(world: &World, role: &str) -> Value {
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let iam = aws_sdk_iam::Client::new(&world.moto_sdk().await);
        let got = iam.get_role().role_name(role).send().await.unwrap();
        let raw = got
            .role()
            .unwrap()
            .assume_role_policy_document()
            .unwrap()
            .to_owned();
        serde_json::from_str(&raw)
            .or_else(|_| serde_json::from_str(&app::text::percent_decode(&raw)))
            .unwrap()
    })
}

/// `update_features` with `body`, which must start an operation that succeeds: the
/// answer and the finished operation.
fn applied(hypd: &Hypd, token: &str, name: &str, body: Value) -> (Value, Value) {
    let (status, started) = update(hypd, token, name, body);
    assert_eq!(status, 200, "{started}");
    let op = hypd.finish(token, started["operation_id"].as_str().unwrap());
    assert_eq!(op["state"], "succeeded", "{op:#}");
    (started, op)
}

/// A world of its own with cluster `body` created in it: the world, hypd, an admin token.
fn with_cluster(body: Value) -> (World, Hypd, String) {
    let (world, hypd, token, _) = world_with_cluster(FAST, json!({}), body);
    (world, hypd, token)
}

/// [`applied`] for a request that removes something: confirmed, then finished; the
/// finished operation.
fn confirmed(hypd: &Hypd, token: &str, name: &str, body: Value) -> Value {
    let (status, started) = hypd.confirmed(
        token,
        Method::POST,
        &format!("/api/v1/clusters/{name}/features"),
        Some(body),
    );
    assert_eq!(status, 200, "{started}");
    let op = hypd.finish(token, started["operation_id"].as_str().unwrap());
    assert_eq!(op["state"], "succeeded", "{op:#}");
    op
}

fn update(hypd: &Hypd, token: &str, name: &str, body: Value) -> (u16, Value) {
    hypd.call(
        token,
        Method::POST,
        &format!("/api/v1/clusters/{name}/features"),
        Some(body),
    )
}

#[test]
fn features_are_turned_on_and_off_each_touching_only_its_own_parts() {
    let name = "feat";
    let (world, hypd, token) = with_cluster(crate::common::cluster::small(name));

    let off = feature(&hypd, &token, name, "training_operator");
    assert_eq!(
        (&off["enabled"], &off["status"], &off["changeable"]),
        (&json!(false), &json!("absent"), &json!(true)),
        "{off:#}"
    );
    let before = inventory(&world, name);

    // Refused by field before anything is called.
    world.sim.call(Method::DELETE, "/_sim/calls", None);
    let (status, none) = update(&hypd, &token, name, json!({}));
    assert_eq!(status, 422, "{none}");
    assert_eq!(none["error"]["errors"][0]["field"], "training_operator");
    let (status, unknown) = update(&hypd, &token, name, json!({"cert_manager": false}));
    assert_eq!(status, 422, "{unknown}");
    assert!(unknown.to_string().contains("cert_manager"), "{unknown}");
    // Autoscaling with no group it can scale (this cluster's one runs deep health checks).
    let (status, none) = update(&hypd, &token, name, json!({"autoscaling": true}));
    assert_eq!(status, 422, "{none}");
    assert_eq!(none["error"]["errors"][0]["field"], "autoscaling", "{none}");
    assert!(none.to_string().contains("deep health checks"), "{none}");

    // The plan: the role, its binding and the add-on; cert-manager and the pod identity
    // agent, which the cluster was made with, are not in it.
    let (status, dry) = update(
        &hypd,
        &token,
        name,
        json!({"training_operator": true, "dry_run": true}),
    );
    assert_eq!(status, 200, "{dry}");
    let kinds: Vec<(&str, &str)> = dry["plan"]["stages"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["changes"].as_array().unwrap())
        .map(|c| (c["kind"].as_str().unwrap(), c["action"].as_str().unwrap()))
        .collect();
    assert!(kinds.contains(&("iam:Role", "create")), "{dry:#}");
    assert!(
        kinds.contains(&("eks:PodIdentityAssociation", "create")),
        "{dry:#}"
    );
    assert!(kinds.contains(&("eks:Addon", "create")), "{dry:#}");
    assert_eq!(
        kinds.iter().filter(|(k, _)| *k == "eks:Addon").count(),
        1,
        "only the operator's add-on: {dry:#}"
    );
    assert!(agents_mutating_calls(&world).is_empty());

    // On: every mutating call is the training operator stage's own, none touches another
    // add-on.
    let (on, _) = applied(&hypd, &token, name, json!({"training_operator": true}));
    // Exactly the operator's parts, each made once, all by its own stage.
    assert_eq!(
        calls_of(&world, &on, "training_operator"),
        [
            "CreateRole",
            "AttachRolePolicy",
            "CreatePodIdentityAssociation",
            "CreateAddon"
        ]
    );
    assert_eq!(training_parts(&world, name), (Some("ACTIVE".to_owned()), 1));
    let on = feature(&hypd, &token, name, "training_operator");
    assert_eq!(on["enabled"], true, "{on:#}");
    assert_eq!(on["status"], "ACTIVE", "{on:#}");
    assert!(
        on["details"]
            .as_array()
            .unwrap()
            .iter()
            .any(|d| d == "controller available"),
        "{on:#}"
    );

    // The same request again: nothing to do, no stage, no mutating call; the plan says so.
    world.sim.call(Method::DELETE, "/_sim/calls", None);
    let (status, dry) = update(
        &hypd,
        &token,
        name,
        json!({"training_operator": true, "dry_run": true}),
    );
    assert_eq!(status, 200, "{dry}");
    assert_eq!(dry["plan"]["stages"], json!([]), "{dry:#}");
    let (_, op) = applied(&hypd, &token, name, json!({"training_operator": true}));
    assert_eq!(op["stages"], json!([]), "{op:#}");
    assert!(op.to_string().contains("nothing to do"), "{op:#}");
    assert_eq!(agents_mutating_calls(&world), []);

    // Tiered checkpointing on, naming only it: its stage makes exactly its chain and the
    // setting, and the training operator (on) is not touched.
    let (tiered, _) = applied(
        &hypd,
        &token,
        name,
        json!({"tiered_checkpointing": true, "tiered_memory_percent": 40}),
    );
    assert_eq!(
        calls_of(&world, &tiered, "tiered_checkpointing"),
        [
            "CreateRole",
            "PutRolePolicy",
            "patch ServiceAccount",
            "UpdateCluster"
        ]
    );
    assert_eq!(training_parts(&world, name), (Some("ACTIVE".to_owned()), 1));
    let described =
        crate::common::cluster::sagemaker(&world, "DescribeCluster", json!({"ClusterName": name}));
    assert_eq!(
        described["TieredStorageConfig"],
        json!({"Mode": "Enable", "InstanceMemoryAllocationPercentage": 40}),
        "{described:#}"
    );
    // The role trusts exactly the one service account, through the cluster's provider.
    let role = format!("hypd-{name}-tiered-ckpt");
    let trusted = trust(&world, &role);
    let statement = &trusted["Statement"][0];
    assert_eq!(
        statement["Action"], "sts:AssumeRoleWithWebIdentity",
        "{trusted:#}"
    );
    assert!(
        statement["Principal"]["Federated"]
            .as_str()
            .unwrap()
            .contains(":oidc-provider/"),
        "{trusted:#}"
    );
    let conditions = statement["Condition"]["StringEquals"].as_object().unwrap();
    let sub = conditions
        .iter()
        .find(|(k, _)| k.ends_with(":sub"))
        .unwrap()
        .1;
    let aud = conditions
        .iter()
        .find(|(k, _)| k.ends_with(":aud"))
        .unwrap()
        .1;
    assert_eq!(
        (sub, aud),
        (
            &json!("system:serviceaccount:default:hypd-tiered-checkpointing"),
            &json!("sts.amazonaws.com")
        )
    );
    let annotated = tokio::runtime::Runtime::new().unwrap().block_on(async {
        let client = kube_client(&world, name).await;
        Api::<ServiceAccount>::namespaced(client, "default")
            .get("hypd-tiered-checkpointing")
            .await
            .unwrap()
    });
    assert_eq!(
        annotated.metadata.annotations.unwrap()["eks.amazonaws.com/role-arn"],
        format!("arn:aws:iam::123456789012:role/{role}")
    );
    let t = feature(&hypd, &token, name, "tiered_checkpointing");
    assert_eq!(t["enabled"], true, "{t:#}");
    assert!(
        t["details"].to_string().contains("identity chain complete"),
        "{t:#}"
    );
    assert!(
        inventory(&world, name)
            .kubernetes
            .contains("DaemonSet kube-system/hyperpod-tiered-checkpointing"),
        "HyperPod's memory daemon runs"
    );

    // A new share of memory is one UpdateCluster, nothing else.
    world.sim.call(Method::DELETE, "/_sim/calls", None);
    let (more, _) = applied(
        &hypd,
        &token,
        name,
        json!({"tiered_checkpointing": true, "tiered_memory_percent": 60}),
    );
    assert_eq!(
        calls_of(&world, &more, "tiered_checkpointing"),
        ["UpdateCluster"]
    );

    // Both off, in two steps: the first answers with the plan and changes nothing; after
    // the second, AWS and Kubernetes hold what they held before either was turned on.
    let both_off = json!({"training_operator": false, "tiered_checkpointing": false});
    let (status, asked) = update(&hypd, &token, name, both_off.clone());
    assert_eq!(status, 200, "{asked}");
    assert!(asked["confirmation"].is_string(), "{asked:#}");
    let deleted: BTreeSet<&str> = asked["plan"]["stages"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["changes"].as_array().unwrap())
        .filter(|c| c["action"] == "delete")
        .map(|c| c["kind"].as_str().unwrap())
        .collect();
    assert_eq!(
        deleted,
        BTreeSet::from([
            "eks:Addon",
            "eks:PodIdentityAssociation",
            "iam:Role",
            "k8s:v1/ServiceAccount"
        ]),
        "{asked:#}"
    );
    world.sim.call(Method::DELETE, "/_sim/calls", None);
    confirmed(&hypd, &token, name, both_off);
    assert_eq!(training_parts(&world, name), (None, 0));
    assert_eq!(inventory(&world, name), before);
    for f in ["training_operator", "tiered_checkpointing"] {
        let off = feature(&hypd, &token, name, f);
        assert_eq!(off["enabled"], false, "{off:#}");
    }
}

/// The target count of instance group `group` of HyperPod cluster `name`.
fn target(world: &World, name: &str, group: &str) -> Option<i64> {
    let d =
        crate::common::cluster::sagemaker(world, "DescribeCluster", json!({"ClusterName": name}));
    d["InstanceGroups"]
        .as_array()?
        .iter()
        .find(|g| g["InstanceGroupName"] == group)
        .and_then(|g| g["TargetCount"].as_i64())
}

/// The kinds the plan's changes name, with their actions.
fn planned_changes(answer: &Value) -> BTreeSet<(String, String)> {
    answer["plan"]["stages"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["changes"].as_array().unwrap())
        .map(|c| {
            (
                c["kind"].as_str().unwrap().to_owned(),
                c["action"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// Managed Karpenter: refused for groups it cannot scale; turned on for one group with
/// exactly its four parts, and left on that group by a request that names none; a group at 0 raised for a pending GPU pod, which runs, and back to 0 once the pod
/// is gone; turned off in two steps, after which AWS and Kubernetes hold what they held
/// before (HyperPod's own Karpenter CRDs aside, which stay as they do on AWS).
#[test]
fn autoscaling_scales_a_group_from_zero_and_back_and_is_turned_off_whole() {
    let name = "scale";
    let mut body = crate::common::cluster::small(name);
    body["instance_groups"][0]["instance_count"] = json!(1);
    for group in ["burst", "spare"] {
        body["instance_groups"].as_array_mut().unwrap().push(json!({
            "name": group, "instance_type": "ml.g5.8xlarge", "instance_count": 0,
        }));
    }
    let (world, hypd, token) = with_cluster(body);
    let before = inventory(&world, name);

    // A group autoscaling cannot scale, or none there, is refused by its field.
    world.sim.call(Method::DELETE, "/_sim/calls", None);
    for (groups, field, says) in [
        (
            json!(["gpu"]),
            "autoscaling_groups[0]",
            "deep health checks",
        ),
        (
            json!(["burst", "nope"]),
            "autoscaling_groups[1]",
            "no instance group nope",
        ),
    ] {
        let (status, refused) = update(
            &hypd,
            &token,
            name,
            json!({"autoscaling": true, "autoscaling_groups": groups}),
        );
        assert_eq!(status, 422, "{refused}");
        let error = &refused["error"]["errors"][0];
        assert_eq!(error["field"], field, "{refused}");
        assert!(
            error["message"].as_str().unwrap().contains(says),
            "{refused}"
        );
    }
    assert_eq!(agents_mutating_calls(&world), []);

    // The plan names the four parts; run, each is made once by the stage.
    let burst = json!({"autoscaling": true, "autoscaling_groups": ["burst"]});
    let mut dry_run = burst.clone();
    dry_run["dry_run"] = json!(true);
    let (status, dry) = update(&hypd, &token, name, dry_run);
    assert_eq!(status, 200, "{dry}");
    // The role's inline policy is an update of the role it creates.
    let expected: BTreeSet<(String, String)> = [
        ("iam:Role", "create"),
        ("iam:Role", "update"),
        ("sagemaker:Cluster", "update"),
        (
            "k8s:karpenter.sagemaker.amazonaws.com/v1/HyperpodNodeClass",
            "create",
        ),
        ("k8s:karpenter.sh/v1/NodePool", "create"),
    ]
    .map(|(k, a)| (k.to_owned(), a.to_owned()))
    .into();
    assert_eq!(planned_changes(&dry), expected, "{dry:#}");
    let (on, _) = applied(&hypd, &token, name, burst);
    assert_eq!(
        calls_of(&world, &on, "autoscaling"),
        [
            "CreateRole",
            "PutRolePolicy",
            "UpdateCluster",
            "patch HyperpodNodeClass",
            "patch NodePool"
        ]
    );
    let trusted = trust(&world, &format!("hypd-{name}-autoscaling"));
    assert_eq!(
        trusted["Statement"][0]["Principal"]["Service"], "hyperpod.sagemaker.amazonaws.com",
        "{trusted:#}"
    );
    let a = feature(&hypd, &token, name, "autoscaling");
    assert_eq!(
        (&a["enabled"], &a["status"]),
        (&json!(true), &json!("Enable (InService)")),
        "{a:#}"
    );
    for says in ["scales instance groups burst", "node class Ready"] {
        assert!(a["details"].to_string().contains(says), "{says}: {a:#}");
    }

    // Asked again without groups: the ones it scales stay (not every group it could
    // scale, which would add `spare`): nothing to do, no mutating call.
    world.sim.call(Method::DELETE, "/_sim/calls", None);
    let (_, op) = applied(&hypd, &token, name, json!({"autoscaling": true}));
    assert_eq!(op["stages"], json!([]), "{op:#}");
    assert_eq!(agents_mutating_calls(&world), []);

    // A pending GPU pod for the burst group raises it from 0 and runs on the new node;
    // deleted, the group goes back to 0 (the pool's consolidateAfter is seconds here).
    assert_eq!(target(&world, name, "burst"), Some(0));
    let rt = tokio::runtime::Runtime::new().unwrap();
    let pods: Api<k8s_openapi::api::core::v1::Pod> =
        rt.block_on(async { Api::namespaced(kube_client(&world, name).await, "default") });
    let pod = serde_json::from_value(json!({
        "metadata": {"name": "train"},
        "spec": {
            "nodeSelector": {"sagemaker.amazonaws.com/instance-group-name": "burst"},
            "containers": [{"name": "main", "image": "pytorch/pytorch",
                            "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
        },
    }))
    .unwrap();
    rt.block_on(pods.create(&Default::default(), &pod)).unwrap();
    let limit = std::time::Duration::from_secs(60);
    crate::wait_until("burst raised to 1", limit, || {
        target(&world, name, "burst") == Some(1)
    });
    crate::wait_until("the pod running on the new node", limit, || {
        rt.block_on(pods.get("train"))
            .unwrap()
            .status
            .and_then(|s| s.phase)
            .as_deref()
            == Some("Running")
    });
    // Karpenter's count is not drift: a reconcile must not take the pod's node away.
    let (status, drift) = hypd.call(
        &token,
        Method::GET,
        &format!("/api/v1/clusters/{name}/drift"),
        None,
    );
    assert_eq!(status, 200, "{drift}");
    assert_eq!(drift["drifted"], json!([]), "{drift:#}");
    rt.block_on(pods.delete("train", &Default::default()))
        .unwrap();
    crate::wait_until("burst back to 0", limit, || {
        target(&world, name, "burst") == Some(0)
    });

    // Off in two steps: the plan deletes the role, class and pool and disables the
    // setting; after it, everything hypd made is gone.
    let off = json!({"autoscaling": false});
    let (status, asked) = update(&hypd, &token, name, off.clone());
    assert_eq!(status, 200, "{asked}");
    let expected: BTreeSet<(String, String)> = [
        ("iam:Role", "update"),
        ("iam:Role", "delete"),
        ("sagemaker:Cluster", "update"),
        (
            "k8s:karpenter.sagemaker.amazonaws.com/v1/HyperpodNodeClass",
            "delete",
        ),
        ("k8s:karpenter.sh/v1/NodePool", "delete"),
    ]
    .map(|(k, a)| (k.to_owned(), a.to_owned()))
    .into();
    assert_eq!(planned_changes(&asked), expected, "{asked:#}");
    confirmed(&hypd, &token, name, off);
    let mut after = inventory(&world, name);
    for crd in [
        "CRD /hyperpodnodeclasses.karpenter.sagemaker.amazonaws.com",
        "CRD /nodepools.karpenter.sh",
    ] {
        assert!(after.kubernetes.remove(crd), "{crd}: {after:?}");
    }
    assert_eq!(after, before);
    let a = feature(&hypd, &token, name, "autoscaling");
    assert_eq!(
        (&a["enabled"], &a["status"]),
        (&json!(false), &json!("Disable")),
        "{a:#}"
    );
}

pub const INFERENCE_ADDON: &str = "amazon-sagemaker-hyperpod-inference";

/// Add-on `addon` of cluster `name` as the sim describes it, if there is one.
fn addon(world: &World, name: &str, addon: &str) -> Option<Value> {
    let (status, body) = world.sim.call(
        Method::GET,
        &format!("/clusters/{name}/addons/{addon}"),
        None,
    );
    (status == 200).then(|| body["addon"].clone())
}

/// Whether S3 bucket `bucket` exists in moto; `put` writes one object into it first.
fn bucket_exists(world: &World, bucket: &str, put: Option<&str>) -> bool {
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let conf = world.moto_sdk().await;
        let s3 = aws_sdk_s3::Client::from_conf(
            aws_sdk_s3::config::Builder::from(&conf)
                .force_path_style(true)
                .build(),
        );
        if let Some(key) = put {
            s3.put_object()
                .bucket(bucket)
                .key(key)
                .body(b"certificate".to_vec().into())
                .send()
                .await
                .unwrap();
        }
        s3.head_bucket().bucket(bucket).send().await.is_ok()
    })
}

/// The mutating calls since the log was cleared, by the stage (of the user agent) that
/// made each.
fn calls_by_stage(world: &World) -> Vec<(String, String)> {
    agents_mutating_calls(world)
        .into_iter()
        .map(|(agent, _, op)| {
            let agent = agent.unwrap_or_default();
            (agent.rsplit('.').next().unwrap_or_default().to_owned(), op)
        })
        .collect()
}

/// The inference operator: on, it makes its TLS bucket, its four roles (each trusted by
/// its own service accounts) and the add-on configured with them, after the FSx CSI
/// driver (with its role) it needs. Then the stale-field replay the issue names: a
/// request that names only the training operator touches nothing of the inference
/// operator or cert-manager. Both on again is nothing to do; both off in two steps
/// leaves AWS and Kubernetes as they were, bucket included.
#[test]
fn inference_operator_on_then_a_training_only_request_leaves_it_untouched() {
    let name = "infer";
    let (world, hypd, token) = with_cluster(crate::common::cluster::small(name));
    let before = inventory(&world, name);
    let bucket = format!("hypd-{name}-123456789012-tls");

    // The plan: the FSx driver with its role and binding, then the operator's parts.
    world.sim.call(Method::DELETE, "/_sim/calls", None);
    let (status, dry) = update(
        &hypd,
        &token,
        name,
        json!({"inference_operator": true, "dry_run": true}),
    );
    assert_eq!(status, 200, "{dry}");
    let stages: Vec<&str> = dry["plan"]["stages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["stage"].as_str().unwrap())
        .collect();
    assert_eq!(stages, ["components", "inference_operator"], "{dry:#}");
    let created = |stage: usize, kind: &str| {
        dry["plan"]["stages"][stage]["changes"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["kind"] == kind && c["action"] == "create")
            .count()
    };
    assert_eq!(
        (
            created(0, "iam:Role"),
            created(0, "eks:PodIdentityAssociation"),
            created(0, "eks:Addon")
        ),
        (1, 1, 1),
        "{dry:#}"
    );
    assert_eq!(
        (
            created(1, "s3:Bucket"),
            created(1, "iam:Role"),
            created(1, "eks:Addon")
        ),
        (1, 4, 1),
        "{dry:#}"
    );
    assert!(agents_mutating_calls(&world).is_empty());

    let (on, _) = applied(&hypd, &token, name, json!({"inference_operator": true}));
    let id = on["operation_id"].as_str().unwrap();
    let calls = agents_mutating_calls(&world);
    assert!(
        calls.iter().all(|(a, _, _)| a
            .as_deref()
            .unwrap_or_default()
            .starts_with(&format!("hypd.{id}."))),
        "{calls:?}"
    );
    let ops = |stage: &str| -> Vec<String> {
        calls_by_stage(&world)
            .into_iter()
            .filter(|(s, _)| s == stage)
            .map(|(_, o)| o)
            .collect()
    };
    assert_eq!(
        ops("components"),
        [
            "CreateRole",
            "AttachRolePolicy",
            "CreatePodIdentityAssociation",
            "CreateAddon"
        ]
    );
    let made = ops("inference_operator");
    let n = |op: &str| made.iter().filter(|o| *o == op).count();
    assert_eq!(
        (
            n("CreateBucket"),
            n("CreateRole"),
            n("AttachRolePolicy"),
            n("PutRolePolicy"),
            n("CreateAddon")
        ),
        (1, 4, 3, 3, 1),
        "{made:?}"
    );
    assert!(bucket_exists(&world, &bucket, None));
    assert_eq!(
        addon(&world, name, "aws-fsx-csi-driver").unwrap()["status"],
        "ACTIVE"
    );

    // The add-on carries the configuration that names what hypd made.
    let inference = addon(&world, name, INFERENCE_ADDON).unwrap();
    assert_eq!(inference["status"], "ACTIVE", "{inference:#}");
    let config: Value =
        serde_json::from_str(inference["configurationValues"].as_str().unwrap()).unwrap();
    let role = |suffix: &str| format!("arn:aws:iam::123456789012:role/hypd-{name}-{suffix}");
    assert_eq!(
        config["executionRoleArn"],
        role("inference-exec"),
        "{config:#}"
    );
    assert_eq!(config["tlsCertificateS3Bucket"], bucket.as_str());
    assert_eq!(
        config["jumpstartGatedModelDownloadRoleArn"],
        role("inference-gated")
    );
    assert_eq!(
        config["alb"]["serviceAccount"]["roleArn"],
        role("inference-alb")
    );
    assert_eq!(
        config["keda"]["auth"]["aws"]["irsa"]["roleArn"],
        role("inference-keda")
    );
    assert!(
        config["hyperpodClusterArn"]
            .as_str()
            .unwrap()
            .contains(":cluster/"),
        "{config:#}"
    );
    // The gated-model role trusts SageMaker and the operator's per-model accounts only.
    let gated = trust(&world, &format!("hypd-{name}-inference-gated"));
    assert_eq!(
        gated["Statement"][0]["Principal"]["Service"],
        "sagemaker.amazonaws.com"
    );
    let like = gated["Statement"][1]["Condition"]["StringLike"]
        .as_object()
        .unwrap();
    assert_eq!(
        like.values().next().unwrap(),
        "system:serviceaccount:*:hyperpod-inference-service-account*",
        "{gated:#}"
    );
    let f = feature(&hypd, &token, name, "inference_operator");
    assert_eq!(
        (&f["enabled"], &f["status"]),
        (&json!(true), &json!("ACTIVE")),
        "{f:#}"
    );
    let details = f["details"].to_string();
    assert!(details.contains("controller available"), "{f:#}");
    assert!(
        details.contains(&format!("TLS certificates in bucket {bucket}")),
        "{f:#}"
    );
    assert!(!details.contains("missing or changed"), "{f:#}");
    let crds = inventory(&world, name).kubernetes;
    assert!(
        crds.contains("CRD /inferenceendpointconfigs.inference.sagemaker.aws.amazon.com"),
        "{crds:?}"
    );
    // Its add-on brings KEDA (its chart depends on KEDA's): KEDA reads as on, and as
    // the add-on's, which hypd does not remove on its own.
    assert!(crds.contains("CRD /scaledobjects.keda.sh"), "{crds:?}");
    let k = feature(&hypd, &token, name, "keda");
    assert_eq!(
        (&k["enabled"], &k["status"]),
        (
            &json!(true),
            &json!(format!("installed by the EKS add-on {INFERENCE_ADDON}"))
        ),
        "{k:#}"
    );
    let (status, refused) = update(&hypd, &token, name, json!({"keda": false}));
    assert_eq!(status, 422, "{refused}");
    assert_eq!(refused["error"]["errors"][0]["field"], "keda", "{refused}");

    // The stale-field replay: a request naming only the training operator makes the
    // training operator's calls and nothing else; the inference add-on and cert-manager
    // are as they were.
    let cert_manager = addon(&world, name, "cert-manager").unwrap();
    world.sim.call(Method::DELETE, "/_sim/calls", None);
    let (training, _) = applied(&hypd, &token, name, json!({"training_operator": true}));
    assert_eq!(
        calls_of(&world, &training, "training_operator"),
        [
            "CreateRole",
            "AttachRolePolicy",
            "CreatePodIdentityAssociation",
            "CreateAddon"
        ]
    );
    assert_eq!(addon(&world, name, INFERENCE_ADDON).unwrap(), inference);
    assert_eq!(addon(&world, name, "cert-manager").unwrap(), cert_manager);

    // Both already on: nothing to do.
    world.sim.call(Method::DELETE, "/_sim/calls", None);
    let (_, op) = applied(
        &hypd,
        &token,
        name,
        json!({"inference_operator": true, "training_operator": true}),
    );
    assert_eq!(op["stages"], json!([]), "{op:#}");
    assert_eq!(agents_mutating_calls(&world), []);

    // Both off, confirmed; the certificates the operator wrote go with its bucket, and
    // the FSx driver only it needed goes with it (after the add-on, its binding and role).
    assert!(bucket_exists(
        &world,
        &bucket,
        Some("certificates/endpoint-1.pem")
    ));
    let both_off = json!({"inference_operator": false, "training_operator": false});
    let (status, asked) = update(&hypd, &token, name, both_off.clone());
    assert_eq!(status, 200, "{asked}");
    let freed: Vec<(&str, &str)> = asked["plan"]["stages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["stage"] == "unneeded")
        .flat_map(|s| s["changes"].as_array().unwrap())
        .map(|c| (c["kind"].as_str().unwrap(), c["action"].as_str().unwrap()))
        .collect();
    assert_eq!(
        freed,
        [
            ("eks:Addon", "delete"),
            ("eks:PodIdentityAssociation", "delete"),
            ("iam:Role", "update"),
            ("iam:Role", "delete")
        ],
        "the FSx driver, its binding and its role (its policy detached first): {asked:#}"
    );
    confirmed(&hypd, &token, name, both_off);
    assert!(!bucket_exists(&world, &bucket, None));
    assert!(addon(&world, name, "aws-fsx-csi-driver").is_none());
    assert_eq!(inventory(&world, name), before);
    let f = feature(&hypd, &token, name, "inference_operator");
    assert_eq!(f["enabled"], false, "{f:#}");
}

/// The objects of `kind` (`group/version`, plural) in cluster `name`'s Kubernetes, by
/// `namespace/name`.
fn kube_objects(
    world: &World,
    name: &str,
    api_version: &str,
    kind: &str,
    plural: &str,
) -> Vec<String> {
    use kube::api::DynamicObject;
    use kube::core::{ApiResource, GroupVersion};
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let client = kube_client(world, name).await;
        let gv: GroupVersion = api_version.parse().unwrap();
        let ar = ApiResource::from_gvk_with_plural(&gv.with_kind(kind), plural);
        Api::<DynamicObject>::all_with(client, &ar)
            .list(&ListParams::default())
            .await
            .map(|l| l.items.iter().map(|o| named(kind, &o.metadata)).collect())
            .unwrap_or_default()
    })
}

/// Creates (`Some`) or deletes (`None`) RayJob `job` in namespace default.
fn ray_job(world: &World, name: &str, job: &str, create: bool) {
    use kube::api::{DeleteParams, DynamicObject, PostParams};
    use kube::core::{ApiResource, GroupVersionKind};
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let client = kube_client(world, name).await;
        let ar = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("ray.io", "v1", "RayJob"),
            "rayjobs",
        );
        let jobs = Api::<DynamicObject>::namespaced_with(client, "default", &ar);
        if create {
            let o: DynamicObject = serde_json::from_value(json!({
                "apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"name": job},
                "spec": {"entrypoint": "python train.py", "rayClusterSpec": {"headGroupSpec": {
                    "rayStartParams": {},
                    "template": {"spec": {"containers": [{"name": "ray-head", "image": "rayproject/ray:2.46.0"}]}}}}}
            }))
            .unwrap();
            jobs.create(&PostParams::default(), &o).await.unwrap();
        } else {
            jobs.delete(job, &DeleteParams::default()).await.unwrap();
        }
    })
}

/// KubeRay and KEDA: the plan lists every object of their pinned upstream releases, one
/// server-side apply each makes them, get_features says which release from where; the
/// inference operator (whose add-on brings its own KEDA) is refused beside hypd's KEDA; a
/// RayJob keeps KubeRay from being turned off (its CRD would take the job with it); once
/// it is gone both go, and Kubernetes holds exactly what it held before.
#[test]
fn kuberay_and_keda_are_their_pinned_releases_and_never_take_users_objects_with_them() {
    let name = "rays";
    let (world, hypd, token) = with_cluster(crate::common::cluster::small(name));
    let before = inventory(&world, name);
    let both = json!({"kuberay_operator": true, "keda": true});

    let mut dry_body = both.clone();
    dry_body["dry_run"] = json!(true);
    let (status, dry) = update(&hypd, &token, name, dry_body);
    assert_eq!(status, 200, "{dry}");
    let stages = dry["plan"]["stages"].as_array().unwrap();
    let names: Vec<&str> = stages
        .iter()
        .map(|s| s["stage"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["kuberay_operator", "keda"], "{dry:#}");
    let creates = |i: usize| -> Vec<(String, String)> {
        stages[i]["changes"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["action"] == "create")
            .map(|c| {
                (
                    c["kind"].as_str().unwrap().to_owned(),
                    c["name"].as_str().unwrap().to_owned(),
                )
            })
            .collect()
    };
    let (kuberay, keda) = (creates(0), creates(1));
    assert_eq!((kuberay.len(), keda.len()), (11, 24), "{dry:#}");
    assert!(kuberay.contains(&(
        "k8s:apiextensions.k8s.io/v1/CustomResourceDefinition".to_owned(),
        "rayjobs.ray.io".to_owned()
    )));
    assert!(keda.contains(&(
        "k8s:apiregistration.k8s.io/v1/APIService".to_owned(),
        "v1beta1.external.metrics.k8s.io".to_owned()
    )));

    world.sim.call(Method::DELETE, "/_sim/calls", None);
    let (_, op) = applied(&hypd, &token, name, both.clone());
    assert_eq!(op["stages"].as_array().unwrap().len(), 2, "{op:#}");
    let applies = |stage: &str| {
        calls_by_stage(&world)
            .iter()
            .filter(|(s, o)| s == stage && o.starts_with("patch "))
            .count()
    };
    assert_eq!((applies("kuberay_operator"), applies("keda")), (11, 24));
    assert_eq!(
        calls_by_stage(&world).len(),
        35,
        "one apply per object, nothing else"
    );
    let f = feature(&hypd, &token, name, "kuberay_operator");
    assert_eq!(
        (&f["enabled"], &f["status"], &f["version"]),
        (&json!(true), &json!("installed"), &json!("v1.7.0")),
        "{f:#}"
    );
    let details = f["details"].to_string();
    assert!(
        details.contains("github.com/ray-project/kuberay (tag v1.7.0, commit 59d663aeec13)"),
        "{f:#}"
    );
    assert!(
        details.contains("Deployment default/kuberay-operator available"),
        "{f:#}"
    );
    let k = feature(&hypd, &token, name, "keda");
    assert_eq!(
        (&k["status"], &k["version"]),
        (&json!("installed"), &json!("2.20.2")),
        "{k:#}"
    );
    assert!(
        k["details"]
            .to_string()
            .contains("Deployment keda/keda-operator available"),
        "{k:#}"
    );
    assert_eq!(
        kube_objects(
            &world,
            name,
            "admissionregistration.k8s.io/v1",
            "ValidatingWebhookConfiguration",
            "validatingwebhookconfigurations"
        ),
        ["ValidatingWebhookConfiguration /keda-admission"]
    );

    // Both already on: nothing to do, nothing called.
    world.sim.call(Method::DELETE, "/_sim/calls", None);
    let (_, op) = applied(&hypd, &token, name, both);
    assert_eq!(op["stages"], json!([]), "{op:#}");
    assert_eq!(agents_mutating_calls(&world), []);

    // The inference operator's add-on would install a second KEDA.
    let (status, refused) = update(&hypd, &token, name, json!({"inference_operator": true}));
    assert_eq!(status, 422, "{refused}");
    assert_eq!(
        refused["error"]["errors"][0]["field"], "inference_operator",
        "{refused}"
    );
    assert!(
        refused.to_string().contains("installed by hypd"),
        "{refused}"
    );

    // A RayJob keeps KubeRay on.
    ray_job(&world, name, "train", true);
    let f = feature(&hypd, &token, name, "kuberay_operator");
    assert!(
        f["details"].to_string().contains("in use: 1 RayJob"),
        "{f:#}"
    );
    let (status, refused) = update(&hypd, &token, name, json!({"kuberay_operator": false}));
    assert_eq!(status, 422, "{refused}");
    assert_eq!(
        refused["error"]["errors"][0]["field"], "kuberay_operator",
        "{refused}"
    );
    assert!(refused.to_string().contains("1 RayJob exist"), "{refused}");
    ray_job(&world, name, "train", false);

    let off = json!({"kuberay_operator": false, "keda": false});
    let (status, asked) = update(&hypd, &token, name, off.clone());
    assert_eq!(status, 200, "{asked}");
    let deletes: usize = asked["plan"]["stages"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["changes"].as_array().unwrap())
        .filter(|c| c["action"] == "delete")
        .count();
    assert_eq!(deletes, 35, "{asked:#}");
    confirmed(&hypd, &token, name, off);
    assert_eq!(inventory(&world, name), before);
    assert!(
        kube_objects(
            &world,
            name,
            "apiregistration.k8s.io/v1",
            "APIService",
            "apiservices"
        )
        .is_empty()
    );
    for f in ["kuberay_operator", "keda"] {
        let f = feature(&hypd, &token, name, f);
        assert_eq!(
            (&f["enabled"], &f["status"]),
            (&json!(false), &json!("absent")),
            "{f:#}"
        );
    }
}
