//! The Kubernetes API emulator through the clients hypd uses: DescribeCluster's endpoint
//! and CA with an EKS token (reqwest for the raw 401s, kube-rs with rustls for the API):
//! CRUD, selectors, optimistic concurrency, server-side apply, merge patch, watch, CRDs
//! with schema validation, finalizers, pod logs, and the world's controllers.

use std::time::{Duration, SystemTime};

use crate::support::{
    active_cluster, eks_client, eks_token, eks_token_at, kube_client, moto, network, sim,
};
use futures::{AsyncBufReadExt, StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    Api, DeleteParams, DynamicObject, ListParams, LogParams, Patch, PatchParams, PostParams,
    WatchEvent, WatchParams,
};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};

/// Where a watch of config maps that misses nothing starts: the list's resourceVersion.
async fn list_rv(cms: &Api<ConfigMap>) -> String {
    cms.list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap()
}

/// The next `n` events of a config map watch as (type, name), bookmarks aside.
async fn next_events(
    events: &mut (impl futures::Stream<Item = kube::Result<WatchEvent<ConfigMap>>> + Unpin),
    n: usize,
) -> Vec<(&'static str, String)> {
    let mut seen = Vec::new();
    while seen.len() < n {
        match events.try_next().await.unwrap().unwrap() {
            WatchEvent::Added(c) => seen.push(("ADDED", c.metadata.name.unwrap())),
            WatchEvent::Modified(c) => seen.push(("MODIFIED", c.metadata.name.unwrap())),
            WatchEvent::Deleted(c) => seen.push(("DELETED", c.metadata.name.unwrap())),
            WatchEvent::Bookmark(_) => {}
            WatchEvent::Error(e) => panic!("{e:?}"),
        }
    }
    seen
}

async fn raw_get(endpoint: &str, ca: &str, path: &str, token: Option<&str>) -> (u16, Value) {
    let client = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(ca.as_bytes()).unwrap())
        .build()
        .unwrap();
    let mut req = client.get(format!("{endpoint}{path}"));
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let resp = req.send().await.unwrap();
    (resp.status().as_u16(), resp.json().await.unwrap())
}

#[tokio::test(flavor = "multi_thread")]
async fn api_server_per_cluster_takes_only_its_own_tokens() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let (_moto, moto_url) = moto();
    let net = network(&moto_url).await;
    let (_sim, sim_url) = sim(&moto_url, 600.0);
    let eks = eks_client(&sim_url).await;
    let (endpoint, ca) = active_cluster(&eks, &net, "ml-1").await;
    let (other_endpoint, other_ca) = active_cluster(&eks, &net, "ml-2").await;
    assert!(endpoint.starts_with("https://127.0.0.1:"), "{endpoint}");
    assert_ne!(endpoint, other_endpoint);
    assert_ne!(ca, other_ca, "each cluster has its own CA");
    assert!(ca.starts_with("-----BEGIN CERTIFICATE-----"));

    let (code, body) = raw_get(&endpoint, &ca, "/version", Some(&eks_token("ml-1"))).await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["major"], "1");
    assert_eq!(body["minor"], "33");

    let (code, body) = raw_get(&endpoint, &ca, "/version", None).await;
    assert_eq!(
        (code, body["kind"].as_str()),
        (401, Some("Status")),
        "{body}"
    );
    let (code, body) = raw_get(&endpoint, &ca, "/api", Some(&eks_token("ml-2"))).await;
    assert_eq!(code, 401, "a token for another cluster: {body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("signature does not match")
    );
    let old = SystemTime::now() - Duration::from_secs(1000);
    let (code, body) = raw_get(
        &endpoint,
        &ca,
        "/api",
        Some(&eks_token_at("ml-1", "testing", old, 900)),
    )
    .await;
    assert_eq!(code, 401, "expired: {body}");
    assert!(body["message"].as_str().unwrap().contains("expired"));
    let (code, _) = raw_get(
        &endpoint,
        &ca,
        "/api",
        Some(&eks_token_at(
            "ml-1",
            "wrong-secret",
            SystemTime::now(),
            900,
        )),
    )
    .await;
    assert_eq!(code, 401, "signed with another key");
    let (code, _) = raw_get(&endpoint, &ca, "/api", Some("k8s-aws-v1.bm90LWEtdXJs")).await;
    assert_eq!(code, 401, "malformed");

    // The CA of one cluster does not vouch for the other's server.
    let client = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(other_ca.as_bytes()).unwrap())
        .tls_built_in_root_certs(false)
        .build()
        .unwrap();
    assert!(
        client
            .get(format!("{endpoint}/version"))
            .send()
            .await
            .is_err()
    );

    // Deleting the EKS cluster stops its API server.
    eks.delete_cluster().name("ml-2").send().await.unwrap();
    crate::support::wait_for("ml-2 API server gone", || async {
        let _ = eks.describe_cluster().name("ml-2").send().await;
        reqwest::Client::builder()
            .add_root_certificate(reqwest::Certificate::from_pem(other_ca.as_bytes()).unwrap())
            .timeout(Duration::from_secs(2))
            .build()
            .unwrap()
            .get(format!("{other_endpoint}/version"))
            .send()
            .await
            .is_err()
    })
    .await;
}

fn config_map(name: &str, value: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": { "name": name, "labels": { "app.kubernetes.io/managed-by": "hypd", "tier": "a" } },
        "data": { "key": value },
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn kube_crate_crud_apply_watch_and_logs() {
    let (_moto, moto_url) = moto();
    let net = network(&moto_url).await;
    let (_sim, sim_url) = sim(&moto_url, 600.0);
    let eks = eks_client(&sim_url).await;
    let (endpoint, ca) = active_cluster(&eks, &net, "ml-1").await;
    let client = kube_client(&endpoint, &ca, &eks_token("ml-1"));

    let info = client.apiserver_version().await.unwrap();
    assert_eq!(info.minor, "33");
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let ns = namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "ml"}})).unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(ns.status.unwrap().phase.as_deref(), Some("Active"));

    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "ml");
    let ssa = PatchParams::apply("hypd");
    let first = cms
        .patch("settings", &ssa, &Patch::Apply(config_map("settings", "1")))
        .await
        .unwrap();
    let again = cms
        .patch("settings", &ssa, &Patch::Apply(config_map("settings", "1")))
        .await
        .unwrap();
    assert_eq!(
        first.metadata.resource_version, again.metadata.resource_version,
        "applying the same configuration twice is a no-op"
    );
    let managed = again.metadata.managed_fields.unwrap();
    assert_eq!(managed[0].manager.as_deref(), Some("hypd"));
    assert_eq!(managed[0].operation.as_deref(), Some("Apply"));
    let changed = cms
        .patch("settings", &ssa, &Patch::Apply(config_map("settings", "2")))
        .await
        .unwrap();
    assert_ne!(
        changed.metadata.resource_version,
        again.metadata.resource_version
    );

    // Lists page with `limit` and `continue`, as kubectl's and kube-rs' pagers expect.
    for i in 0..5 {
        cms.create(
            &PostParams::default(),
            &serde_json::from_value(config_map(&format!("page-{i}"), "x")).unwrap(),
        )
        .await
        .unwrap();
    }
    let whole: Vec<String> = cms
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|c| c.metadata.name)
        .collect();
    assert_eq!(whole.len(), 6, "{whole:?}");
    let (mut paged, mut params, mut pages) = (Vec::new(), ListParams::default().limit(2), 0);
    loop {
        let page = cms.list(&params).await.unwrap();
        pages += 1;
        assert!(page.items.len() <= 2);
        paged.extend(page.items.into_iter().filter_map(|c| c.metadata.name));
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => {
                assert_eq!(
                    page.metadata.remaining_item_count,
                    Some((whole.len() - paged.len()) as i64)
                );
                params = params.continue_token(&token);
            }
            None => break,
        }
    }
    assert_eq!((paged, pages), (whole, 3));
    let err = cms
        .list(&ListParams::default().limit(2).continue_token("garbled"))
        .await
        .unwrap_err();
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 400),
        "{err:?}"
    );
    for i in 0..5 {
        cms.delete(&format!("page-{i}"), &DeleteParams::default())
            .await
            .unwrap();
    }

    // Another manager may not take a field hypd owns, unless it forces.
    let err = cms
        .patch(
            "settings",
            &PatchParams::apply("someone"),
            &Patch::Apply(config_map("settings", "3")),
        )
        .await
        .unwrap_err();
    let kube::Error::Api(status) = err else {
        panic!("{err:?}")
    };
    assert_eq!(status.code, 409);
    assert!(
        status.message.contains("conflict with \"hypd\""),
        "{}",
        status.message
    );
    cms.patch(
        "settings",
        &PatchParams::apply("someone").force(),
        &Patch::Apply(config_map("settings", "3")),
    )
    .await
    .unwrap();

    // Selectors.
    cms.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "other", "labels": {"tier": "b"}}}))
            .unwrap(),
    )
    .await
    .unwrap();
    let names = |l: kube::core::ObjectList<ConfigMap>| -> Vec<String> {
        l.items
            .into_iter()
            .map(|c| c.metadata.name.unwrap())
            .collect()
    };
    for (params, expected) in [
        (ListParams::default().labels("tier=a"), "settings"),
        (
            ListParams::default().labels("tier in (a,b),tier!=a"),
            "other",
        ),
        (ListParams::default().fields("metadata.name=other"), "other"),
    ] {
        assert_eq!(names(cms.list(&params).await.unwrap()), [expected]);
    }

    // Optimistic concurrency: a stale resourceVersion is refused.
    let mut stale = cms.get("other").await.unwrap();
    cms.patch(
        "other",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"x": "1"}})),
    )
    .await
    .unwrap();
    stale.data = Some([("y".to_owned(), "2".to_owned())].into());
    let err = cms
        .replace("other", &PostParams::default(), &stale)
        .await
        .unwrap_err();
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 409),
        "{err:?}"
    );

    // A watch from a resourceVersion sees what happens after it, in order.
    let rv = list_rv(&cms).await;
    let mut events = cms
        .watch(&WatchParams::default(), &rv)
        .await
        .unwrap()
        .boxed();
    cms.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "w"}})).unwrap(),
    )
    .await
    .unwrap();
    cms.patch(
        "w",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"a": "b"}})),
    )
    .await
    .unwrap();
    cms.delete("w", &DeleteParams::default()).await.unwrap();
    assert_eq!(
        next_events(&mut events, 3).await,
        [
            ("ADDED", "w".to_owned()),
            ("MODIFIED", "w".to_owned()),
            ("DELETED", "w".to_owned())
        ]
    );

    // Finalizers hold a deletion until they are removed.
    cms.create(
        &PostParams::default(),
        &serde_json::from_value(
            json!({"metadata": {"name": "held", "finalizers": ["hypd.dev/cleanup"]}}),
        )
        .unwrap(),
    )
    .await
    .unwrap();
    cms.delete("held", &DeleteParams::default()).await.unwrap();
    let held = cms.get("held").await.unwrap();
    assert!(held.metadata.deletion_timestamp.is_some());
    cms.patch(
        "held",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    assert!(cms.get_opt("held").await.unwrap().is_none());

    // A node registers (as a kubelet would) and a pod's log is followed.
    crate::support::register_node(&client, "cpu-1", "4").await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "ml");
    pods.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "trainer"},
            "spec": {"containers": [{"name": "main", "image": "busybox", "resources": {"requests": {"cpu": "1"}}}]}}))
        .unwrap(),
    )
    .await
    .unwrap();
    crate::support::wait_pod_running(&pods, "trainer").await;
    let lp = LogParams {
        follow: true,
        tail_lines: Some(1),
        ..LogParams::default()
    };
    let mut lines = pods.log_stream("trainer", &lp).await.unwrap().lines();
    let step = |l: &str| -> u64 {
        l.split(" step ")
            .nth(1)
            .unwrap()
            .split(':')
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    let first = step(&lines.next().await.unwrap().unwrap());
    for expected in first + 1..first + 20 {
        let line = lines.next().await.unwrap().unwrap();
        assert_eq!(step(&line), expected, "{line}");
        assert!(line.starts_with("[main] trainer step "), "{line}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn crds_registered_through_the_api_validate_their_objects() {
    let (_moto, moto_url) = moto();
    let net = network(&moto_url).await;
    let (_sim, sim_url) = sim(&moto_url, 600.0);
    let eks = eks_client(&sim_url).await;
    let (endpoint, ca) = active_cluster(&eks, &net, "ml-1").await;
    let client = kube_client(&endpoint, &ca, &eks_token("ml-1"));

    let crd: CustomResourceDefinition =
        serde_yaml::from_str(include_str!("../../crds/ray.io_rayjobs.yaml")).unwrap();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let created = crds.create(&PostParams::default(), &crd).await.unwrap();
    let established = created.status.unwrap().conditions.unwrap();
    assert!(
        established
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True")
    );

    let gvk = GroupVersionKind::gvk("ray.io", "v1", "RayJob");
    let ar = ApiResource::from_gvk_with_plural(&gvk, "rayjobs");
    let jobs: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &ar);
    let bad: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"name": "bad"},
        "spec": {"entrypoint": 42, "deletionStrategy": {"onSuccess": {"policy": "DeleteCluster"}}}
    }))
    .unwrap();
    let err = jobs.create(&PostParams::default(), &bad).await.unwrap_err();
    let kube::Error::Api(status) = err else {
        panic!("{err:?}")
    };
    assert_eq!(status.code, 422);
    assert!(
        status.message.contains("spec.entrypoint: Invalid value: \"integer\": spec.entrypoint in body must be of type string"),
        "{}",
        status.message
    );
    assert!(
        status
            .message
            .contains("deletionStrategy requires either BOTH onSuccess and onFailure"),
        "the CRD's own rule message: {}",
        status.message
    );

    let good: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"name": "good"},
        "spec": {"entrypoint": "python train.py", "rayClusterSpec": {"headGroupSpec": {"rayStartParams": {},
            "template": {"spec": {"containers": [{"name": "ray-head", "image": "rayproject/ray:2.46.0"}]}}}}}
    }))
    .unwrap();
    jobs.create(&PostParams::default(), &good).await.unwrap();
    let listed = jobs.list(&ListParams::default()).await.unwrap();
    assert_eq!(listed.items.len(), 1);

    // Deleting the CRD takes its objects with it.
    crds.delete("rayjobs.ray.io", &DeleteParams::default())
        .await
        .unwrap();
    assert!(jobs.list(&ListParams::default()).await.is_err());
}

#[tokio::test(flavor = "multi_thread")]
async fn deployments_get_pods_scheduled_by_gpus_on_hyperpod_nodes() {
    let (_moto, moto_url) = moto();
    let net = network(&moto_url).await;
    let (_sim, sim_url) = sim(&moto_url, 600.0);
    let eks = eks_client(&sim_url).await;
    let (endpoint, ca) = active_cluster(&eks, &net, "ml-1").await;
    let client = kube_client(&endpoint, &ca, &eks_token("ml-1"));
    crate::support::create_hyperpod(&sim_url, &net, "hp-1", "ml-1", "ml.p5.48xlarge", 1).await;

    let nodes: Api<Node> = Api::all(client.clone());
    crate::support::wait_for("a HyperPod node", || async {
        !nodes
            .list(
                &ListParams::default()
                    .labels("sagemaker.amazonaws.com/node-health-status=Schedulable"),
            )
            .await
            .unwrap()
            .items
            .is_empty()
    })
    .await;
    let node = nodes
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .remove(0);
    let labels = node.metadata.labels.unwrap();
    assert_eq!(labels["node.kubernetes.io/instance-type"], "ml.p5.48xlarge");
    assert_eq!(labels["sagemaker.amazonaws.com/instance-group-name"], "gpu");
    let allocatable = node.status.unwrap().allocatable.unwrap();
    assert_eq!(allocatable["nvidia.com/gpu"].0, "8");
    assert_eq!(allocatable["vpc.amazonaws.com/efa"].0, "32");

    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "default");
    let deploy = json!({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "vllm"},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "vllm"}},
            "template": {"metadata": {"labels": {"app": "vllm"}},
                "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai",
                    "resources": {"limits": {"nvidia.com/gpu": "8", "vpc.amazonaws.com/efa": "32"}}}]}}}
    });
    deployments
        .patch("vllm", &PatchParams::apply("hypd"), &Patch::Apply(deploy))
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    crate::support::wait_for("one running vllm pod and one pending", || async {
        let l = pods
            .list(&ListParams::default().labels("app=vllm"))
            .await
            .unwrap();
        let phases: Vec<(String, bool)> = l
            .items
            .iter()
            .map(|p| {
                (
                    p.status.as_ref().unwrap().phase.clone().unwrap_or_default(),
                    p.spec.as_ref().unwrap().node_name.is_some(),
                )
            })
            .collect();
        phases.contains(&("Running".into(), true)) && phases.contains(&("Pending".into(), false))
    })
    .await;
    let pending = pods
        .list(
            &ListParams::default()
                .labels("app=vllm")
                .fields("status.phase=Pending"),
        )
        .await
        .unwrap()
        .items
        .remove(0);
    let cond = &pending.status.unwrap().conditions.unwrap()[0];
    assert_eq!(cond.reason.as_deref(), Some("Unschedulable"));
    assert!(
        cond.message
            .as_deref()
            .unwrap()
            .contains("Insufficient nvidia.com/gpu"),
        "{cond:?}"
    );
    crate::support::wait_for("the Deployment counting 1 of 2 ready", || async {
        let d = deployments.get("vllm").await.unwrap().status.unwrap();
        (d.replicas, d.ready_replicas) == (Some(2), Some(1))
    })
    .await;

    // Scaling to what fits makes the Deployment Available.
    deployments
        .patch(
            "vllm",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 1}})),
        )
        .await
        .unwrap();
    crate::support::wait_for("vllm Available", || async {
        deployments
            .get("vllm")
            .await
            .unwrap()
            .status
            .unwrap()
            .conditions
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_.as_deref() == Some("Available") && c.status.as_deref() == Some("True"))
    })
    .await;

    // A cordoned node keeps its cordon across the controllers' ticks and takes no pods.
    let node_name = node.metadata.name.unwrap();
    nodes
        .patch(
            &node_name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"unschedulable": true}})),
        )
        .await
        .unwrap();
    let running = pods
        .list(&ListParams::default().labels("app=vllm"))
        .await
        .unwrap()
        .items
        .remove(0);
    pods.delete(&running.metadata.name.unwrap(), &DeleteParams::default())
        .await
        .unwrap();
    crate::support::wait_for("the replacement pod held back by the cordon", || async {
        pods.list(&ListParams::default().labels("app=vllm"))
            .await
            .unwrap()
            .items
            .iter()
            .any(|p| {
                p.status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|cs| {
                        cs.iter().any(|c| {
                            c.message.as_deref()
                                == Some("0/1 nodes are available: 1 node(s) were unschedulable.")
                        })
                    })
            })
    })
    .await;
    assert_eq!(
        nodes
            .get(&node_name)
            .await
            .unwrap()
            .spec
            .unwrap()
            .unschedulable,
        Some(true)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn add_ons_services_claims_and_training_jobs_come_alive() {
    let (_moto, moto_url) = moto();
    let net = network(&moto_url).await;
    let (_sim, sim_url) = sim(&moto_url, 600.0);
    let eks = eks_client(&sim_url).await;
    let (endpoint, ca) = active_cluster(&eks, &net, "ml-1").await;
    let client = kube_client(&endpoint, &ca, &eks_token("ml-1"));
    crate::support::hyperpod_nodes(&client, &sim_url, &net, 2).await;
    crate::support::control(
        &sim_url,
        reqwest::Method::PUT,
        "/_sim/clock",
        json!({ "time_scale": 60.0 }),
    )
    .await;

    for addon in ["kube-proxy", "amazon-sagemaker-hyperpod-training-operator"] {
        eks.create_addon()
            .cluster_name("ml-1")
            .addon_name(addon)
            .send()
            .await
            .unwrap();
    }
    let daemonsets: Api<k8s_openapi::api::apps::v1::DaemonSet> =
        Api::namespaced(client.clone(), "kube-system");
    crate::support::wait_for("kube-proxy on both nodes", || async {
        daemonsets
            .get_opt("kube-proxy")
            .await
            .unwrap()
            .and_then(|d| d.status)
            .is_some_and(|s| s.number_ready == 2 && s.desired_number_scheduled == 2)
    })
    .await;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crate::support::wait_for("the training operator's CRD", || async {
        crds.get_opt("hyperpodpytorchjobs.sagemaker.amazonaws.com")
            .await
            .unwrap()
            .is_some()
    })
    .await;

    // The inference operator's add-on brings AWS's CRDs and its controller under the
    // name its IRSA service account has; deleting the add-on takes the CRDs away again.
    const INFERENCE: &str = "amazon-sagemaker-hyperpod-inference";
    const IEC: &str = "inferenceendpointconfigs.inference.sagemaker.aws.amazon.com";
    const JSM: &str = "jumpstartmodels.inference.sagemaker.aws.amazon.com";
    eks.create_addon()
        .cluster_name("ml-1")
        .addon_name(INFERENCE)
        .send()
        .await
        .unwrap();
    let controllers: Api<k8s_openapi::api::apps::v1::Deployment> =
        Api::namespaced(client.clone(), "hyperpod-inference-system");
    crate::support::wait_for("the inference operator's CRDs and controller", || async {
        crds.get_opt(IEC).await.unwrap().is_some()
            && crds.get_opt(JSM).await.unwrap().is_some()
            && controllers
                .get_opt("hyperpod-inference-controller-manager")
                .await
                .unwrap()
                .is_some()
    })
    .await;
    eks.delete_addon()
        .cluster_name("ml-1")
        .addon_name(INFERENCE)
        .send()
        .await
        .unwrap();
    crate::support::wait_for("the inference operator's CRDs gone with it", || async {
        crds.get_opt(IEC).await.unwrap().is_none() && crds.get_opt(JSM).await.unwrap().is_none()
    })
    .await;
    assert!(
        crds.get_opt("hyperpodpytorchjobs.sagemaker.amazonaws.com")
            .await
            .unwrap()
            .is_some(),
        "another add-on's CRD stays"
    );

    let gvk = GroupVersionKind::gvk("sagemaker.amazonaws.com", "v1", "HyperPodPyTorchJob");
    let ar = ApiResource::from_gvk_with_plural(&gvk, "hyperpodpytorchjobs");
    let jobs: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &ar);
    let job: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "sagemaker.amazonaws.com/v1", "kind": "HyperPodPyTorchJob",
        "metadata": { "name": "llama", "annotations": { "sim.hypd.dev/run-seconds": "120" } },
        "spec": { "nprocPerNode": "1", "runPolicy": { "jobMaxRetryCount": 1, "cleanPodPolicy": "None" },
            "replicaSpecs": [{ "name": "pods", "replicas": 2, "template": { "spec": { "containers": [{
                "name": "pytorch", "image": "pytorch", "command": ["hyperpodrun"],
                "resources": { "limits": { "nvidia.com/gpu": 1, "vpc.amazonaws.com/efa": 1 } } }] } } }] }
    }))
    .unwrap();
    jobs.create(&PostParams::default(), &job).await.unwrap();
    let has = |o: &DynamicObject, t: &str| {
        o.data["status"]["conditions"]
            .as_array()
            .is_some_and(|cs| cs.iter().any(|c| c["type"] == t && c["status"] == "True"))
    };
    crate::support::wait_for("llama running on both nodes", || async {
        has(&jobs.get("llama").await.unwrap(), "Running")
    })
    .await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let on: std::collections::BTreeSet<String> = pods
        .list(&ListParams::default().labels("sagemaker.amazonaws.com/job-name=llama"))
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|p| p.spec.unwrap().node_name.unwrap())
        .collect();
    assert_eq!(on.len(), 2, "one GPU per node: the pods are spread");
    crate::support::wait_for("llama completed", || async {
        has(&jobs.get("llama").await.unwrap(), "Completed")
    })
    .await;

    let services: Api<k8s_openapi::api::core::v1::Service> =
        Api::namespaced(client.clone(), "default");
    services
        .create(&PostParams::default(), &serde_json::from_value(json!({
            "metadata": { "name": "vllm" },
            "spec": { "type": "LoadBalancer", "selector": { "app": "vllm" }, "ports": [{ "port": 8000 }] }
        })).unwrap())
        .await
        .unwrap();
    crate::support::wait_for("a load balancer hostname", || async {
        services
            .get("vllm")
            .await
            .unwrap()
            .status
            .and_then(|s| s.load_balancer)
            .and_then(|l| l.ingress)
            .is_some_and(|i| {
                i[0].hostname
                    .as_deref()
                    .is_some_and(|h| h.ends_with(".elb.us-east-1.amazonaws.com"))
            })
    })
    .await;

    let pvs: Api<k8s_openapi::api::core::v1::PersistentVolume> = Api::all(client.clone());
    pvs.create(&PostParams::default(), &serde_json::from_value(json!({
        "metadata": { "name": "s3-shared" },
        "spec": { "capacity": { "storage": "1200Gi" }, "accessModes": ["ReadWriteMany"], "storageClassName": "",
                  "csi": { "driver": "s3.csi.aws.com", "volumeHandle": "s3-csi-driver-volume" } }
    })).unwrap())
    .await
    .unwrap();
    let pvcs: Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> =
        Api::namespaced(client.clone(), "default");
    pvcs.create(&PostParams::default(), &serde_json::from_value(json!({
        "metadata": { "name": "shared" },
        "spec": { "accessModes": ["ReadWriteMany"], "storageClassName": "", "resources": { "requests": { "storage": "100Gi" } } }
    })).unwrap())
    .await
    .unwrap();
    crate::support::wait_for("the claim bound", || async {
        pvcs.get("shared")
            .await
            .unwrap()
            .status
            .and_then(|s| s.phase)
            .as_deref()
            == Some("Bound")
    })
    .await;
    assert_eq!(
        pvcs.get("shared")
            .await
            .unwrap()
            .spec
            .unwrap()
            .volume_name
            .as_deref(),
        Some("s3-shared")
    );
    assert_eq!(
        pvs.get("s3-shared")
            .await
            .unwrap()
            .spec
            .unwrap()
            .claim_ref
            .unwrap()
            .name
            .as_deref(),
        Some("shared")
    );

    // Removing the add-on removes its workloads.
    eks.delete_addon()
        .cluster_name("ml-1")
        .addon_name("kube-proxy")
        .send()
        .await
        .unwrap();
    crate::support::wait_for("kube-proxy gone", || async {
        let _ = eks.list_addons().cluster_name("ml-1").send().await;
        daemonsets.get_opt("kube-proxy").await.unwrap().is_none()
    })
    .await;
}

/// Reads a raw watch stream line by line until `done` says so.
async fn watch_lines(
    endpoint: &str,
    ca: &str,
    path: &str,
    mut done: impl FnMut(&[Value]) -> bool,
) -> Vec<Value> {
    let client = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(ca.as_bytes()).unwrap())
        .build()
        .unwrap();
    let mut resp = client
        .get(format!("{endpoint}{path}"))
        .bearer_auth(eks_token("ml-1"))
        .send()
        .await
        .unwrap();
    let mut buf = Vec::new();
    let mut events = Vec::new();
    while let Some(chunk) = resp.chunk().await.unwrap() {
        buf.extend_from_slice(&chunk);
        while let Some(i) = buf.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buf.drain(..=i).collect();
            events.push(serde_json::from_slice(&line).unwrap());
            if done(&events) {
                return events;
            }
        }
    }
    events
}

#[tokio::test(flavor = "multi_thread")]
async fn watches_stream_initial_events_bookmarks_and_expire() {
    let (_moto, moto_url) = moto();
    let net = network(&moto_url).await;
    let (_sim, sim_url) = sim(&moto_url, 600.0);
    let eks = eks_client(&sim_url).await;
    let (endpoint, ca) = active_cluster(&eks, &net, "ml-1").await;
    let client = kube_client(&endpoint, &ca, &eks_token("ml-1"));
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let first_rv = list_rv(&cms).await;
    for i in 0..3 {
        cms.create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": format!("c{i}")}})).unwrap(),
        )
        .await
        .unwrap();
    }

    // Streaming list: the objects, then a bookmark marking the end of the initial events.
    let events = watch_lines(
        &endpoint,
        &ca,
        "/api/v1/namespaces/default/configmaps?watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true",
        |e| e.last().is_some_and(|l| l["type"] == "BOOKMARK"),
    )
    .await;
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["ADDED", "ADDED", "ADDED", "BOOKMARK"]);
    assert_eq!(
        events[3]["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"],
        "true"
    );

    // Bookmarks keep an idle watch's resourceVersion fresh.
    let rv = list_rv(&cms).await;
    let events = watch_lines(
        &endpoint,
        &ca,
        &format!("/api/v1/namespaces/default/configmaps?watch=true&resourceVersion={rv}&allowWatchBookmarks=true"),
        |e| !e.is_empty(),
    )
    .await;
    assert_eq!(events[0]["type"], "BOOKMARK");
    assert_eq!(
        events[0]["object"]["metadata"]["resourceVersion"],
        rv.as_str()
    );

    // A selector watch sees objects enter (ADDED) and leave (DELETED) its selection.
    let rv = list_rv(&cms).await;
    let mut selected = cms
        .watch(&WatchParams::default().labels("pick=yes"), &rv)
        .await
        .unwrap()
        .boxed();
    for value in ["yes", "no"] {
        cms.patch(
            "c1",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"pick": value}}})),
        )
        .await
        .unwrap();
    }
    assert_eq!(
        next_events(&mut selected, 2).await,
        [("ADDED", "c1".to_owned()), ("DELETED", "c1".to_owned())]
    );

    // Once the history has rolled past a resourceVersion, watching from it is 410 Gone.
    futures::stream::iter(0..1100)
        .map(|i| {
            let cms = cms.clone();
            async move {
                cms.patch(
                    "c0",
                    &PatchParams::default(),
                    &Patch::Merge(json!({"data": {"n": i.to_string()}})),
                )
                .await
                .unwrap();
            }
        })
        .buffer_unordered(8)
        .collect::<Vec<()>>()
        .await;
    let events = watch_lines(
        &endpoint,
        &ca,
        &format!("/api/v1/namespaces/default/configmaps?watch=true&resourceVersion={first_rv}"),
        |e| !e.is_empty(),
    )
    .await;
    assert_eq!(events[0]["type"], "ERROR");
    assert_eq!(events[0]["object"]["code"], 410);
    assert_eq!(events[0]["object"]["reason"], "Expired");
}
