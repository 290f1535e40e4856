//! A cluster as the operations tests see it from outside hypd: what moto and the sim
//! hold for it (counted by kind), what kubectl would see, the calls the world logged,
//! and the set-up most tests start from (a world of their own with one cluster
//! created). Shared by every test binary that makes clusters.

use reqwest::Method;
use serde_json::{Value, json};

use super::{Hypd, World};

/// A small cluster `name`: one group of two GPU instances with deep health checks, in
/// `us-east-1a`.
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
        let prefix = format!("hypd-{name}-");
        // Every page: the harness's clusters share one moto, past IAM's 100 a page. IAM
        // pages by position, so a role another test deletes between two pages moves one
        // of ours onto the page already read: ours stay put while this runs, so listings
        // are read until one finds none the others missed.
        let mut roles = std::collections::BTreeSet::new();
        for listing in 0..5 {
            let listed: Vec<aws_sdk_iam::types::Role> = iam
                .list_roles()
                .into_paginator()
                .items()
                .send()
                .collect::<Result<_, _>>()
                .await
                .unwrap();
            let before = roles.len();
            roles.extend(
                listed
                    .iter()
                    .map(|r| r.role_name().to_owned())
                    .filter(|n| n.starts_with(&prefix)),
            );
            if listing > 0 && roles.len() == before {
                break;
            }
        }
        let oidc = iam.list_open_id_connect_providers().send().await.unwrap();
        let mut oidc_providers = 0;
        for p in oidc.open_id_connect_provider_list() {
            // Another cluster's, deleted since the list (tests share a world): not ours.
            let Ok(tags) = iam
                .list_open_id_connect_provider_tags()
                .open_id_connect_provider_arn(p.arn().unwrap())
                .send()
                .await
            else {
                continue;
            };
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
            // By name: a role another test made between two pages can show one of ours
            // twice.
            roles: roles.len(),
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

/// The calls the world saw that are not reads, each with its caller's application name
/// (`hypd.<operation>.<stage>` for a step's).
pub fn agents_mutating_calls(world: &World) -> Vec<(Option<String>, String, String)> {
    let (_, log) = world.sim.call(Method::GET, "/_sim/calls", None);
    mutating(log["calls"].as_array().unwrap())
}

/// Of `calls` as the sim logs them, those that are not reads, each with its caller's
/// application name.
pub fn mutating(calls: &[Value]) -> Vec<(Option<String>, String, String)> {
    calls
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
            (
                "s3",
                "CreateBucket"
                | "PutBucketTagging"
                | "PutPublicAccessBlock"
                | "PutBucketEncryption"
                | "DeleteBucket",
            ) => "s3:Bucket",
            ("s3", "PutObject" | "DeleteObject" | "DeleteObjects") => "s3:Object",
            ("fsx", "CreateFileSystem" | "DeleteFileSystem") => "fsx:FileSystem",
            ("fsx", "CreateDataRepositoryAssociation" | "DeleteDataRepositoryAssociation") => {
                "fsx:DataRepositoryAssociation"
            }
            (
                "sagemaker",
                "CreateCluster" | "UpdateCluster" | "UpdateClusterSoftware" | "DeleteCluster",
            ) => "sagemaker:Cluster",
            (
                "sagemaker",
                "BatchRebootClusterNodes" | "BatchReplaceClusterNodes" | "BatchDeleteClusterNodes",
            ) => "sagemaker:ClusterNode",
            ("sagemaker", "CreateMlflowTrackingServer" | "DeleteMlflowTrackingServer") => {
                "sagemaker:MlflowTrackingServer"
            }
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

/// Creates cluster `body` through REST and waits for it: the finished operation, which
/// must have succeeded.
pub fn created(hypd: &Hypd, token: &str, body: Value) -> Value {
    let (status, started) = hypd.call(token, Method::POST, "/api/v1/clusters", Some(body));
    assert_eq!(status, 200, "{started}");
    let op = hypd.finish(token, started["operation_id"].as_str().unwrap());
    assert_eq!(op["state"], "succeeded", "{op:#}");
    op
}

/// What most operation tests start from: a world of their own at `time_scale` in which
/// every AWS call goes through the sim (so faults reach EC2, IAM and S3 too), with a
/// hypd, the HyperPod quotas `quotas` (instance type to count), and cluster `body`
/// created. The world, hypd, its admin token and the creation's finished operation.
pub fn world_with_cluster(
    time_scale: f64,
    quotas: Value,
    body: Value,
) -> (World, Hypd, String, Value) {
    let world = World::start_checked(time_scale);
    let hypd = world.hypd(None, &[("AWS_ENDPOINT_URL", world.sim.url.as_str())]);
    let token = hypd.admin_token();
    let (status, set) = world
        .sim
        .call(Method::PUT, "/_sim/sagemaker/quotas", Some(quotas));
    assert!(status < 300, "{set}");
    let op = created(&hypd, &token, body);
    (world, hypd, token, op)
}
