//! A cluster's storage through REST against moto + hypd-sim: a second bucket mounted
//! (planned, created hardened, its claim bound in the emulated API server), listed with
//! the shared one, browsed and written to at the paths pods see, refused with the field
//! and the rule where it would collide, and deleted only once no pod mounts it — its
//! bucket kept while it holds data.

use base64::Engine;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use reqwest::Method;
use serde_json::{Value, json};

use crate::FAST;
use crate::common::cluster::{kube_client, small, world_with_cluster};
use crate::common::{Hypd, World};

/// Adds storage `storage` (a new bucket) to cluster `name` and waits for it.
pub fn added(hypd: &Hypd, token: &str, name: &str, storage: &str) {
    let path = format!("/api/v1/clusters/{name}/storage");
    let (status, started) = hypd.call(
        token,
        Method::POST,
        &path,
        Some(json!({ "storage": storage })),
    );
    assert_eq!(status, 200, "{started}");
    let op = hypd.finish(token, started["operation_id"].as_str().unwrap());
    assert_eq!(op["state"], "succeeded", "{op:#}");
}

/// Cluster `name` has storage `data` (Bound, on exactly one hardened bucket made for
/// it) beside the shared one, or (`present` false) only the shared one and no bucket
/// made for `data` is left.
pub fn assert_storage(world: &World, hypd: &Hypd, token: &str, name: &str, present: bool) {
    let listed = storage(hypd, token, name);
    let names: Vec<&str> = listed.iter().map(|s| s["name"].as_str().unwrap()).collect();
    let prefix = format!("{}-data-", name.to_lowercase());
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (buckets, hardened, driver_policy) = rt.block_on(async {
        let conf = world.moto_sdk().await;
        let iam = aws_sdk_iam::Client::new(&conf);
        let driver_policy = iam
            .get_role_policy()
            .role_name(format!("hypd-{name}-s3csi"))
            .policy_name("hypd-s3-csi-data")
            .send()
            .await
            .ok()
            .map(|p| hypd::resources::iam::document(p.policy_document()));
        let s3 = aws_sdk_s3::Client::from_conf(
            aws_sdk_s3::config::Builder::from(&conf)
                .force_path_style(true)
                .build(),
        );
        let all = s3.list_buckets().send().await.unwrap();
        let ours: Vec<String> = all
            .buckets()
            .iter()
            .filter_map(|b| {
                b.name()
                    .filter(|n| n.starts_with(&prefix))
                    .map(str::to_owned)
            })
            .collect();
        let mut hardened = true;
        for b in &ours {
            let block = s3.get_public_access_block().bucket(b).send().await.unwrap();
            let c = block.public_access_block_configuration().unwrap();
            hardened &=
                c.block_public_acls() == Some(true) && c.restrict_public_buckets() == Some(true);
            hardened &= s3.get_bucket_encryption().bucket(b).send().await.is_ok();
        }
        (ours, hardened, driver_policy)
    });
    if present {
        assert_eq!(names, ["shared-s3", "data"], "{listed:#?}");
        assert_eq!(listed[1]["phase"], "Bound", "{listed:#?}");
        assert_eq!(buckets.len(), 1, "one bucket for data: {buckets:?}");
        assert_eq!(listed[1]["bucket"], buckets[0], "{listed:#?}");
        assert!(hardened, "{buckets:?}: public access blocked and encrypted");
        // The driver may mount it: its role allows the bucket.
        let policy = driver_policy.expect("the driver's role has the storage's policy");
        assert!(
            policy
                .to_string()
                .contains(&format!("arn:aws:s3:::{}/*", buckets[0])),
            "{policy}"
        );
    } else {
        assert_eq!(names, ["shared-s3"], "{listed:#?}");
        assert!(
            buckets.is_empty(),
            "the empty bucket hypd made is deleted: {buckets:?}"
        );
    }
}

fn field_error(body: &Value) -> (String, String) {
    let e = &body["error"]["errors"][0];
    (
        e["field"].as_str().unwrap_or_default().to_owned(),
        e["message"].as_str().unwrap_or_default().to_owned(),
    )
}

fn storage(hypd: &Hypd, token: &str, name: &str) -> Vec<Value> {
    let (status, list) = hypd.call(
        token,
        Method::GET,
        &format!("/api/v1/clusters/{name}/storage"),
        None,
    );
    assert_eq!(status, 200, "{list}");
    list["storage"].as_array().unwrap().clone()
}

/// A pod of cluster `name` that mounts claim `claim` and keeps running.
fn mounting_pod(world: &World, name: &str, claim: &str, create: bool) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let pods: Api<Pod> = Api::namespaced(kube_client(world, name).await, "default");
        if !create {
            pods.delete("reader", &DeleteParams::default()).await.unwrap();
            return;
        }
        let pod: Pod = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "reader", "annotations": {"sim.hypd.dev/run-seconds": "100000000"}},
            "spec": {
                "containers": [{"name": "c", "image": "python:3.12",
                                "volumeMounts": [{"name": "data", "mountPath": "/mnt/data"}]}],
                "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}],
            },
        }))
        .unwrap();
        pods.create(&PostParams::default(), &pod).await.unwrap();
    });
}

#[test]
fn a_second_bucket_is_mounted_browsed_and_kept_while_used() {
    let name = "ml-st";
    let (world, hypd, token, created) = world_with_cluster(FAST, json!({}), small(name));
    let shared_bucket = created["outputs"]["hyperpod"]["s3_bucket"]
        .as_str()
        .unwrap()
        .to_owned();
    let path = format!("/api/v1/clusters/{name}/storage");

    // The plan: a new bucket, then its volume and claim.
    let (status, plan) = hypd.call(
        &token,
        Method::POST,
        &path,
        Some(json!({"storage": "data", "dry_run": true})),
    );
    assert_eq!(status, 200, "{plan}");
    let stages: Vec<&str> = plan["plan"]["stages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["stage"].as_str().unwrap())
        .collect();
    assert_eq!(stages, ["bucket", "access", "volume", "bound"], "{plan:#}");
    assert_eq!(
        plan["plan"]["stages"][1]["changes"][0]["kind"], "iam:Role",
        "{plan:#}"
    );
    let kinds: Vec<&str> = plan["plan"]["stages"][2]["changes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["kind"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        ["k8s:v1/PersistentVolume", "k8s:v1/PersistentVolumeClaim"],
        "{plan:#}"
    );
    assert_eq!(
        plan["plan"]["stages"][0]["changes"][0]["action"], "create",
        "{plan:#}"
    );

    let (status, started) = hypd.call(
        &token,
        Method::POST,
        &path,
        Some(json!({"storage": "data"})),
    );
    assert_eq!(status, 200, "{started}");
    let op = hypd.finish(&token, started["operation_id"].as_str().unwrap());
    assert_eq!(op["state"], "succeeded", "{op:#}");
    let bucket = op["outputs"]["bucket"].as_str().unwrap().to_owned();
    assert_eq!(bucket, "ml-st-data-123456789012");
    assert_eq!(op["outputs"]["bucket_created"], true, "{op:#}");
    assert_eq!(op["outputs"]["driver_role"], "hypd-ml-st-s3csi", "{op:#}");
    assert_storage(&world, &hypd, &token, name, true);

    let listed = storage(&hypd, &token, name);
    assert_eq!(listed.len(), 2, "{listed:#?}");
    assert_eq!(
        (
            &listed[0]["name"],
            &listed[0]["shared"],
            &listed[0]["mount_path"]
        ),
        (&json!("shared-s3"), &json!(true), &json!("/s3"))
    );
    assert_eq!(listed[0]["bucket"], shared_bucket);
    assert_eq!(
        (
            &listed[1]["name"],
            &listed[1]["bucket"],
            &listed[1]["phase"],
            &listed[1]["mount_path"],
            &listed[1]["kind"]
        ),
        (
            &json!("data"),
            &json!(bucket),
            &json!("Bound"),
            &json!("/mnt/data"),
            &json!("s3")
        ),
        "{listed:#?}"
    );

    // Nothing keeps pods from mounting either; then the driver's access to the bucket
    // is taken away and a bucket policy denies it, outside hypd: both found, with fixes.
    let check = format!("/api/v1/clusters/{name}/storage-check");
    let (status, checked) = hypd.call(&token, Method::GET, &check, None);
    assert_eq!(status, 200, "{checked}");
    assert_eq!(checked["findings"], json!([]), "{checked:#}");
    assert!(
        checked["checked"].as_array().unwrap().len() >= 5,
        "{checked:#}"
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let conf = world.moto_sdk().await;
        aws_sdk_iam::Client::new(&conf)
            .delete_role_policy()
            .role_name("hypd-ml-st-s3csi")
            .policy_name("hypd-s3-csi-data")
            .send()
            .await
            .unwrap();
        let deny = json!({"Version": "2012-10-17", "Statement": [{"Effect": "Deny", "Principal": "*",
            "Action": "s3:*", "Resource": [format!("arn:aws:s3:::{bucket}"), format!("arn:aws:s3:::{bucket}/*")]}]});
        aws_sdk_s3::Client::from_conf(aws_sdk_s3::config::Builder::from(&conf).force_path_style(true).build())
            .put_bucket_policy()
            .bucket(&bucket)
            .policy(deny.to_string())
            .send()
            .await
            .unwrap();
    });
    let (status, checked) = hypd.call(&token, Method::GET, &check, None);
    assert_eq!(status, 200, "{checked}");
    let found: Vec<(&str, &str, &str)> = checked["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["storage"].as_str().unwrap(),
                f["check"].as_str().unwrap(),
                f["severity"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        found,
        [
            ("data", "driver_access", "error"),
            ("data", "bucket_policy", "error")
        ],
        "{checked:#}"
    );
    let fix = checked["findings"][0]["fix"].as_str().unwrap();
    assert!(
        fix.starts_with(
            "aws iam put-role-policy --role-name hypd-ml-st-s3csi --policy-name hypd-s3-csi-data"
        ),
        "{fix}"
    );
    rt.block_on(async {
        let conf = world.moto_sdk().await;
        aws_sdk_s3::Client::from_conf(
            aws_sdk_s3::config::Builder::from(&conf)
                .force_path_style(true)
                .build(),
        )
        .delete_bucket_policy()
        .bucket(&bucket)
        .send()
        .await
        .unwrap();
    });

    // What would make two storages one is refused by field, before anything is made;
    // so is taking over a bucket of someone's that has the name hypd would give.
    rt.block_on(async {
        let conf = world.moto_sdk().await;
        aws_sdk_s3::Client::from_conf(
            aws_sdk_s3::config::Builder::from(&conf)
                .force_path_style(true)
                .build(),
        )
        .create_bucket()
        .bucket("ml-st-someone-123456789012")
        .send()
        .await
        .unwrap();
    });
    for (body, field, rule) in [
        (
            json!({"storage": "data"}),
            "storage",
            "already has storage data",
        ),
        (
            json!({"storage": "more", "bucket": shared_bucket}),
            "bucket",
            "already mounted",
        ),
        (
            json!({"storage": "more", "mount_path": "/mnt/data"}),
            "mount_path",
            "mounted at /mnt/data, which",
        ),
        (
            json!({"storage": "more", "mount_path": "/mnt/data/sub"}),
            "mount_path",
            "would overlap",
        ),
        (
            json!({"storage": "someone", "mount_path": "/mnt/someone"}),
            "bucket",
            "exists without hypd's tags",
        ),
        (
            json!({"storage": "more", "mount_path": "/etc/x"}),
            "mount_path",
            "system directory",
        ),
        (json!({"storage": "shared-s3"}), "storage", "shared bucket"),
    ] {
        let (status, refused) = hypd.call(&token, Method::POST, &path, Some(body.clone()));
        assert_eq!(status, 422, "{body}: {refused}");
        let (f, message) = field_error(&refused);
        assert_eq!(f, field, "{refused}");
        assert!(message.contains(rule), "{refused}");
    }

    // A file put in, at the path pods see; not written over unless asked.
    let files = format!("{path}/data/files");
    let content = base64::engine::general_purpose::STANDARD.encode("print('hi')\n");
    let upload = json!({"key": "scripts/train.py", "content_base64": content});
    let (status, put) = hypd.call(&token, Method::POST, &files, Some(upload.clone()));
    assert_eq!(status, 200, "{put}");
    assert_eq!(
        (&put["path_in_pods"], &put["size_bytes"], &put["replaced"]),
        (
            &json!("/mnt/data/scripts/train.py"),
            &json!(12),
            &json!(false)
        )
    );
    let (status, again) = hypd.call(&token, Method::POST, &files, Some(upload.clone()));
    assert_eq!(status, 422, "{again}");
    assert_eq!(field_error(&again).0, "key");
    let mut replace = upload.clone();
    replace["replace"] = json!(true);
    replace["dry_run"] = json!(true);
    let (status, planned) = hypd.call(&token, Method::POST, &files, Some(replace.clone()));
    assert_eq!(status, 200, "{planned}");
    assert_eq!(
        planned["plan"]["stages"][0]["changes"][0]["action"], "update",
        "{planned:#}"
    );
    replace["dry_run"] = json!(false);
    let (status, put) = hypd.call(&token, Method::POST, &files, Some(replace));
    assert_eq!((status, &put["replaced"]), (200, &json!(true)), "{put}");

    let contents = format!("{path}/data/contents");
    let (status, top) = hypd.call(&token, Method::GET, &contents, None);
    assert_eq!(status, 200, "{top}");
    assert_eq!(
        (&top["folders"], &top["files"]),
        (&json!(["scripts/"]), &json!([])),
        "{top:#}"
    );
    let (status, inside) = hypd.call(
        &token,
        Method::GET,
        &format!("{contents}?prefix=scripts/"),
        None,
    );
    assert_eq!(status, 200, "{inside}");
    assert_eq!(inside["files"][0]["key"], "scripts/train.py", "{inside:#}");
    assert_eq!(inside["files"][0]["size_bytes"], 12);
    assert_eq!(
        inside["files"][0]["path_in_pods"],
        "/mnt/data/scripts/train.py"
    );
    assert_eq!(inside["mount_path"], "/mnt/data/scripts");

    // Mounted by a pod: listed as its user, and deleting it is refused.
    mounting_pod(&world, name, "data", true);
    let listed = storage(&hypd, &token, name);
    assert_eq!(listed[1]["used_by"][0]["pod"], "reader", "{listed:#?}");
    let one = format!("{path}/data");
    let (status, refused) = hypd.call(&token, Method::DELETE, &one, Some(json!({})));
    assert_eq!(status, 422, "{refused}");
    let (f, message) = field_error(&refused);
    assert_eq!(f, "storage");
    assert!(message.contains("default/reader"), "{message}");

    mounting_pod(&world, name, "data", false);
    let (status, started) = hypd.confirmed(&token, Method::DELETE, &one, Some(json!({})));
    assert_eq!(status, 200, "{started}");
    let op = hypd.finish(&token, started["operation_id"].as_str().unwrap());
    assert_eq!(op["state"], "succeeded", "{op:#}");
    assert!(
        op["outputs"]["kept"]
            .as_str()
            .unwrap()
            .contains("holds 1 objects"),
        "{op:#}"
    );
    let listed = storage(&hypd, &token, name);
    assert_eq!(listed.len(), 1, "{listed:#?}");
    // The data is where it was.
    let (status, refused) = hypd.call(&token, Method::GET, &contents, None);
    assert_eq!(status, 404, "{refused}");
}

/// An FSx client on the sim, which answers FSx itself.
async fn fsx(world: &World) -> aws_sdk_fsx::Client {
    let conf = world.moto_sdk().await;
    aws_sdk_fsx::Client::from_conf(
        aws_sdk_fsx::config::Builder::from(&conf)
            .endpoint_url(&world.sim.url)
            .build(),
    )
}

/// The file systems (id, lifecycle) and data repository associations (file system
/// path, S3 path, lifecycle) tagged for storage `storage` of cluster `name`.
pub fn fsx_of(world: &World, name: &str, storage: &str) -> (Vec<(String, String)>, Vec<Value>) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let fsx = fsx(world).await;
        let all = fsx.describe_file_systems().send().await.unwrap();
        let ours: Vec<(String, String)> = all
            .file_systems()
            .iter()
            .filter(|f| {
                let tag = |k: &str, v: &str| {
                    f.tags()
                        .iter()
                        .any(|t| t.key() == Some(k) && t.value() == Some(v))
                };
                tag("hypd:cluster", name) && tag("hypd:storage", storage)
            })
            .map(|f| {
                (
                    f.file_system_id().unwrap().to_owned(),
                    f.lifecycle().unwrap().as_str().to_owned(),
                )
            })
            .collect();
        let mut links = Vec::new();
        for (id, _) in &ours {
            let out = fsx
                .describe_data_repository_associations()
                .filters(
                    aws_sdk_fsx::types::Filter::builder()
                        .name(aws_sdk_fsx::types::FilterName::FileSystemId)
                        .values(id)
                        .build(),
                )
                .send()
                .await
                .unwrap();
            links.extend(out.associations().iter().map(|a| {
                json!([
                    a.file_system_path(),
                    a.data_repository_path(),
                    a.lifecycle().map(|l| l.as_str())
                ])
            }));
        }
        (ours, links)
    })
}

/// The pod `reader`'s phase in cluster `name` once it left Pending, or its events'
/// messages if it did not within `tries` looks.
fn pod_started(world: &World, name: &str, tries: u32) -> Result<String, String> {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let client = kube_client(world, name).await;
        let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
        for _ in 0..tries {
            let pod = pods.get("reader").await.unwrap();
            let phase = pod.status.and_then(|s| s.phase).unwrap_or_default();
            if phase == "Running" {
                return Ok(phase);
            }
            tokio::time::sleep(std::time::Duration::from_millis(250)).await;
        }
        let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(client, "default");
        let listed = events.list(&Default::default()).await.unwrap();
        Err(listed
            .items
            .iter()
            .filter(|e| e.involved_object.name.as_deref() == Some("reader"))
            .filter_map(|e| e.message.clone())
            .collect::<Vec<_>>()
            .join("; "))
    })
}

#[test]
fn an_fsx_file_system_is_made_linked_mounted_and_deleted() {
    let name = "ml-fx";
    let (world, hypd, token, created) = world_with_cluster(FAST, json!({}), small(name));
    let shared_bucket = created["outputs"]["hyperpod"]["s3_bucket"]
        .as_str()
        .unwrap()
        .to_owned();
    let path = format!("/api/v1/clusters/{name}/file-systems");
    // A /28 of the cluster's VPC: 11 addresses free, too few for 28,800 GiB.
    let vpc = created["outputs"]["network"]["vpc_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let small_subnet = tokio::runtime::Runtime::new().unwrap().block_on(async {
        let ec2 = aws_sdk_ec2::Client::new(&world.moto_sdk().await);
        let made = ec2
            .create_subnet()
            .vpc_id(&vpc)
            .cidr_block("10.0.255.240/28")
            .send()
            .await
            .unwrap();
        made.subnet().unwrap().subnet_id().unwrap().to_owned()
    });

    // What FSx or the pods would refuse is refused first, by field and rule.
    for (body, field, rule) in [
        (
            json!({"storage": "fast", "capacity_gib": 1000}),
            "capacity_gib",
            "1200, 2400 or a multiple of 2400",
        ),
        (
            json!({"storage": "fast", "throughput_per_tib": 300}),
            "throughput_per_tib",
            "125, 250, 500 or 1000",
        ),
        (
            json!({"storage": "fast", "deployment_type": "scratch_2", "throughput_per_tib": 125}),
            "throughput_per_tib",
            "persistent_2 only",
        ),
        (
            json!({"storage": "fast", "deployment_type": "scratch_2", "efa": true}),
            "efa",
            "persistent_2",
        ),
        (
            json!({"storage": "fast", "data_repositories": [{"file_system_path": "/a"}, {"file_system_path": "/a/b"}]}),
            "data_repositories[1].file_system_path",
            "none inside another",
        ),
        (
            json!({"storage": "fast", "data_repositories": [{"file_system_path": "/a", "bucket": "no-such-bucket-here"}]}),
            "data_repositories[0].bucket",
            "does not exist",
        ),
        (
            json!({"storage": "fast", "capacity_gib": 28_800, "subnet_id": small_subnet}),
            "subnet_id",
            "has 11 free addresses; a 28800 GiB Lustre file system takes 13",
        ),
        (json!({"storage": "shared-s3"}), "storage", "shared bucket"),
        (
            json!({"storage": "fast", "mount_path": "/s3/x"}),
            "mount_path",
            "",
        ),
    ] {
        let (status, refused) = hypd.call(&token, Method::POST, &path, Some(body.clone()));
        assert_eq!(status, 422, "{body}: {refused}");
        let (f, message) = field_error(&refused);
        assert_eq!(f, field, "{refused}");
        assert!(message.contains(rule), "{refused}");
    }

    // The subnet is the test's, not hypd's: it would keep the VPC from being deleted.
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let ec2 = aws_sdk_ec2::Client::new(&world.moto_sdk().await);
        ec2.delete_subnet()
            .subnet_id(&small_subnet)
            .send()
            .await
            .unwrap();
    });

    // The plan: hypd's group lets everything in from itself (no rule to add), the
    // driver's add-on, the file system, its link to the shared bucket, the volume.
    let body = json!({"storage": "fast", "data_repositories": [{"file_system_path": "/shared"}]});
    let mut dry = body.clone();
    dry["dry_run"] = json!(true);
    let (status, plan) = hypd.call(&token, Method::POST, &path, Some(dry));
    assert_eq!(status, 200, "{plan}");
    let stages = plan["plan"]["stages"].as_array().unwrap();
    let kinds = |i: usize| -> Vec<String> {
        stages[i]["changes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| {
                format!(
                    "{} {}",
                    c["action"].as_str().unwrap(),
                    c["kind"].as_str().unwrap()
                )
            })
            .collect()
    };
    assert_eq!(stages[0]["stage"], "network");
    assert!(kinds(0).is_empty(), "{plan:#}");
    assert!(
        kinds(1).contains(&"create eks:Addon".to_owned()),
        "{plan:#}"
    );
    assert_eq!(kinds(2), ["create fsx:FileSystem"], "{plan:#}");
    assert_eq!(
        kinds(4),
        ["create fsx:DataRepositoryAssociation"],
        "{plan:#}"
    );
    assert_eq!(
        stages[4]["changes"][0]["fields"][0]["new"],
        format!("s3://{shared_bucket}/"),
        "{plan:#}"
    );
    assert_eq!(
        kinds(5),
        [
            "create k8s:v1/PersistentVolume",
            "create k8s:v1/PersistentVolumeClaim"
        ],
        "{plan:#}"
    );

    let (status, started) = hypd.call(&token, Method::POST, &path, Some(body));
    assert_eq!(status, 200, "{started}");
    let op = hypd.finish(&token, started["operation_id"].as_str().unwrap());
    assert_eq!(op["state"], "succeeded", "{op:#}");
    let id = op["outputs"]["file_system"].as_str().unwrap().to_owned();
    assert!(id.starts_with("fs-"), "{op:#}");
    assert_eq!(op["outputs"]["lifecycle"], "AVAILABLE", "{op:#}");
    let (file_systems, links) = fsx_of(&world, name, "fast");
    assert_eq!(file_systems, [(id.clone(), "AVAILABLE".to_owned())]);
    assert_eq!(
        links,
        [json!([
            "/shared",
            format!("s3://{shared_bucket}/"),
            "AVAILABLE"
        ])]
    );

    let listed = storage(&hypd, &token, name);
    assert_eq!(
        (
            &listed[1]["name"],
            &listed[1]["kind"],
            &listed[1]["file_system"],
            &listed[1]["phase"],
            &listed[1]["mount_path"],
            &listed[1]["capacity"]
        ),
        (
            &json!("fast"),
            &json!("fsx"),
            &json!(id),
            &json!("Bound"),
            &json!("/mnt/fast"),
            &json!("1200Gi")
        ),
        "{listed:#?}"
    );

    // A pod mounts it: the driver finds the file system at the volume's DNS and mount
    // name, and the container starts.
    mounting_pod(&world, name, "fast", true);
    pod_started(&world, name, 120).expect("the pod mounting the file system runs");
    let check = format!("/api/v1/clusters/{name}/storage-check");
    let (status, checked) = hypd.call(&token, Method::GET, &check, None);
    assert_eq!(status, 200, "{checked}");
    assert_eq!(checked["findings"], json!([]), "{checked:#}");

    // Lustre's ports closed in the group outside hypd: found, with the fix.
    let group = op["outputs"]["security_group"].as_str().unwrap().to_owned();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let ec2 = aws_sdk_ec2::Client::new(&world.moto_sdk().await);
        ec2.revoke_security_group_ingress()
            .group_id(&group)
            .ip_permissions(
                aws_sdk_ec2::types::IpPermission::builder()
                    .ip_protocol("-1")
                    .user_id_group_pairs(
                        aws_sdk_ec2::types::UserIdGroupPair::builder()
                            .group_id(&group)
                            .build(),
                    )
                    .build(),
            )
            .send()
            .await
            .unwrap();
    });
    let (status, checked) = hypd.call(&token, Method::GET, &check, None);
    assert_eq!(status, 200, "{checked}");
    let found: Vec<&str> = checked["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["check"].as_str().unwrap())
        .collect();
    assert_eq!(found, ["lustre_ports", "lustre_ports"], "{checked:#}");
    assert!(
        checked["findings"][0]["fix"]
            .as_str()
            .unwrap()
            .contains(&format!("--group-id {group} --protocol tcp --port 988-988")),
        "{checked:#}"
    );

    // Deleting it is refused while the pod mounts it; then it goes with its files.
    let one = format!("/api/v1/clusters/{name}/storage/fast");
    let (status, refused) = hypd.call(&token, Method::DELETE, &one, Some(json!({})));
    assert_eq!(status, 422, "{refused}");
    assert!(
        field_error(&refused).1.contains("default/reader"),
        "{refused}"
    );
    mounting_pod(&world, name, "fast", false);
    let (status, gate) = hypd.call(&token, Method::DELETE, &one, Some(json!({})));
    assert_eq!(status, 200, "{gate}");
    let planned: Vec<&str> = gate["plan"]["stages"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["changes"].as_array().unwrap())
        .map(|c| c["kind"].as_str().unwrap())
        .collect();
    assert!(planned.contains(&"fsx:FileSystem"), "{gate:#}");
    let (status, started) = hypd.confirmed(&token, Method::DELETE, &one, Some(json!({})));
    assert_eq!(status, 200, "{started}");
    let op = hypd.finish(&token, started["operation_id"].as_str().unwrap());
    assert_eq!(op["state"], "succeeded", "{op:#}");
    assert_eq!(op["outputs"]["file_system"], id, "{op:#}");
    let (file_systems, _) = fsx_of(&world, name, "fast");
    assert!(file_systems.is_empty(), "{file_systems:?}");
    assert_eq!(storage(&hypd, &token, name).len(), 1);

    // A file system left when the cluster goes goes with it (its interfaces would keep
    // the subnets from being deleted).
    let (status, started) = hypd.call(
        &token,
        Method::POST,
        &path,
        Some(json!({"storage": "left"})),
    );
    assert_eq!(status, 200, "{started}");
    let op = hypd.finish(&token, started["operation_id"].as_str().unwrap());
    assert_eq!(op["state"], "succeeded", "{op:#}");
    let cluster = format!("/api/v1/clusters/{name}");
    let (status, gate) = hypd.call(&token, Method::DELETE, &cluster, Some(json!({})));
    assert_eq!(status, 200, "{gate}");
    let fsx_stage = gate["plan"]["stages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["stage"] == "file_systems")
        .unwrap();
    assert_eq!(
        fsx_stage["changes"][0]["kind"], "fsx:FileSystem",
        "{gate:#}"
    );
    let (status, started) = hypd.confirmed(&token, Method::DELETE, &cluster, Some(json!({})));
    assert_eq!(status, 200, "{started}");
    let op = hypd.finish(&token, started["operation_id"].as_str().unwrap());
    assert_eq!(op["state"], "succeeded", "{op:#}");
    let (file_systems, _) = fsx_of(&world, name, "left");
    assert!(file_systems.is_empty(), "{file_systems:?}");
}
