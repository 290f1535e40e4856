//! Test peers shared by the sim's tests: moto and hypd-sim processes, moto set-up calls,
//! the control API and polling.
#![allow(dead_code)]

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;

pub struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Proc {
    pub fn new(child: Child) -> Self {
        Proc(child)
    }

    pub fn pid(&self) -> u32 {
        self.0.id()
    }
}

/// A free loopback port below the ephemeral range (32768 and up), which is where `bind(0)`
/// and the local ends of outgoing connections take theirs: the test lanes run at once,
/// and a port one lane was handed by `bind(0)` and closed again could be taken by another
/// lane before its server binds it. Chosen at random and checked free.
pub fn free_port() -> u16 {
    use std::hash::{BuildHasher, RandomState};
    loop {
        let r = RandomState::new().hash_one(std::time::Instant::now());
        let port = 10_000 + (r % 22_000) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

pub fn moto() -> (Proc, String) {
    let port = free_port();
    let bin = std::env::var("HYPD_MOTO_SERVER").unwrap_or_else(|_| "moto_server".into());
    let child = Command::new(bin)
        .args(["-H", "127.0.0.1", "-p", &port.to_string()])
        .env("MOTO_IAM_LOAD_MANAGED_POLICIES", "true")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("moto_server on PATH (scripts/test puts it there)");
    let start = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "moto did not start"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    (Proc(child), format!("http://127.0.0.1:{port}"))
}

pub fn sim(moto_url: &str, time_scale: f64) -> (Proc, String) {
    use std::io::{BufRead, BufReader};
    let mut child = Command::new(env!("CARGO_BIN_EXE_hypd-sim"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--moto-url",
            moto_url,
            "--time-scale",
            &time_scale.to_string(),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let url = line
        .trim()
        .strip_prefix("listening on ")
        .expect("listening line")
        .to_owned();
    (Proc(child), url)
}

/// moto's Query API, for the test's own setup.
pub async fn moto_call(moto: &str, service: &str, params: &[(&str, &str)]) -> String {
    let auth = format!(
        "AWS4-HMAC-SHA256 Credential=testing/20260101/us-east-1/{service}/aws4_request, SignedHeaders=host, Signature=0"
    );
    reqwest::Client::new()
        .post(format!("{moto}/"))
        .header("authorization", auth)
        .form(params)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

pub fn xml_tag(xml: &str, name: &str) -> String {
    let open = format!("<{name}>");
    let start = xml
        .find(&open)
        .unwrap_or_else(|| panic!("no <{name}> in {xml}"))
        + open.len();
    let end = xml[start..].find(&format!("</{name}>")).unwrap() + start;
    xml[start..end].to_owned()
}

pub struct Network {
    pub vpc: String,
    /// In us-east-1a and us-east-1b.
    pub subnets: Vec<String>,
    pub security_group: String,
    pub role_arn: String,
}

impl Network {
    /// Names for a sim without moto, which checks none of them.
    pub fn unchecked() -> Network {
        Network {
            vpc: "vpc-0sim".into(),
            subnets: vec!["subnet-0sima".into(), "subnet-0simb".into()],
            security_group: "sg-0sim".into(),
            role_arn: "arn:aws:iam::123456789012:role/hypd-eks-cluster".into(),
        }
    }
}

pub async fn network(moto: &str) -> Network {
    let vpc = xml_tag(
        &moto_call(
            moto,
            "ec2",
            &[
                ("Action", "CreateVpc"),
                ("Version", "2016-11-15"),
                ("CidrBlock", "10.0.0.0/16"),
            ],
        )
        .await,
        "vpcId",
    );
    let mut subnets = Vec::new();
    for (cidr, az) in [("10.0.0.0/24", "us-east-1a"), ("10.0.1.0/24", "us-east-1b")] {
        let xml = moto_call(
            moto,
            "ec2",
            &[
                ("Action", "CreateSubnet"),
                ("Version", "2016-11-15"),
                ("VpcId", &vpc),
                ("CidrBlock", cidr),
                ("AvailabilityZone", az),
            ],
        )
        .await;
        subnets.push(xml_tag(&xml, "subnetId"));
    }
    let security_group = xml_tag(
        &moto_call(
            moto,
            "ec2",
            &[
                ("Action", "CreateSecurityGroup"),
                ("Version", "2016-11-15"),
                ("VpcId", &vpc),
                ("GroupName", "hypd-nodes"),
                ("GroupDescription", "hypd nodes"),
            ],
        )
        .await,
        "groupId",
    );
    let trust = json!({"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Principal": {"Service": "eks.amazonaws.com"}, "Action": "sts:AssumeRole"}]}).to_string();
    let xml = moto_call(
        moto,
        "iam",
        &[
            ("Action", "CreateRole"),
            ("Version", "2010-05-08"),
            ("RoleName", "hypd-eks-cluster"),
            ("AssumeRolePolicyDocument", &trust),
        ],
    )
    .await;
    Network {
        vpc,
        subnets,
        security_group,
        role_arn: xml_tag(&xml, "Arn"),
    }
}

pub async fn control(
    sim_url: &str,
    method: reqwest::Method,
    path: &str,
    body: serde_json::Value,
) -> serde_json::Value {
    reqwest::Client::new()
        .request(method, format!("{sim_url}{path}"))
        .json(&body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

pub async fn wait_for<F, Fut>(what: &str, check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    wait_for_within(what, Duration::from_secs(20), check).await;
}

pub async fn wait_for_within<F, Fut>(what: &str, patience: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    while !check().await {
        assert!(start.elapsed() < patience, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// AWS SDK configuration pointed at the sim, with fast retries.
pub async fn sdk_config(sim_url: &str) -> aws_config::SdkConfig {
    aws_config::defaults(aws_config::BehaviorVersion::latest())
        .endpoint_url(sim_url)
        .region(aws_config::Region::new("us-east-1"))
        .credentials_provider(aws_sdk_eks::config::Credentials::new(
            "testing", "testing", None, None, "test",
        ))
        .retry_config(
            aws_config::retry::RetryConfig::standard()
                .with_max_attempts(3)
                .with_initial_backoff(Duration::from_millis(10)),
        )
        .load()
        .await
}

pub async fn eks_client(sim_url: &str) -> aws_sdk_eks::Client {
    aws_sdk_eks::Client::new(&sdk_config(sim_url).await)
}

pub async fn create_eks_cluster(
    eks: &aws_sdk_eks::Client,
    net: &Network,
    name: &str,
    mode: aws_sdk_eks::types::AuthenticationMode,
) {
    eks.create_cluster()
        .name(name)
        .role_arn(&net.role_arn)
        .resources_vpc_config(
            aws_sdk_eks::types::VpcConfigRequest::builder()
                .set_subnet_ids(Some(net.subnets.clone()))
                .build(),
        )
        .access_config(
            aws_sdk_eks::types::CreateAccessConfigRequest::builder()
                .authentication_mode(mode)
                .build(),
        )
        .send()
        .await
        .unwrap();
}

pub async fn sagemaker_client(sim_url: &str) -> aws_sdk_sagemaker::Client {
    aws_sdk_sagemaker::Client::new(&sdk_config(sim_url).await)
}

/// Freezes (0) or restarts the sim's clock, so a test can look at a transitional
/// state without racing it.
pub async fn set_time_scale(sim_url: &str, time_scale: f64) {
    control(
        sim_url,
        reqwest::Method::PUT,
        "/_sim/clock",
        json!({ "time_scale": time_scale }),
    )
    .await;
}

/// Injects a fault through the control API and returns its id.
pub async fn inject(sim_url: &str, fault: serde_json::Value) -> u64 {
    control(sim_url, reqwest::Method::POST, "/_sim/faults", fault).await["id"]
        .as_u64()
        .unwrap()
}

/// An EKS cluster in API mode, waited for until ACTIVE; its ARN.
pub async fn active_eks_cluster(eks: &aws_sdk_eks::Client, net: &Network, name: &str) -> String {
    active_eks(eks, net, name).await.arn.unwrap()
}

/// Creates EKS cluster `name` in API mode and waits until it is ACTIVE.
async fn active_eks(
    eks: &aws_sdk_eks::Client,
    net: &Network,
    name: &str,
) -> aws_sdk_eks::types::Cluster {
    create_eks_cluster(eks, net, name, aws_sdk_eks::types::AuthenticationMode::Api).await;
    wait_eks_active(eks, name).await;
    eks_cluster(eks, name).await
}

/// EKS cluster `name` as DescribeCluster reports it (it must exist).
pub async fn eks_cluster(eks: &aws_sdk_eks::Client, name: &str) -> aws_sdk_eks::types::Cluster {
    eks.describe_cluster()
        .name(name)
        .send()
        .await
        .unwrap()
        .cluster
        .unwrap()
}

/// Waits until EKS cluster `name` is ACTIVE.
pub async fn wait_eks_active(eks: &aws_sdk_eks::Client, name: &str) {
    wait_for(&format!("EKS cluster {name} ACTIVE"), || async {
        eks_cluster(eks, name).await.status == Some(aws_sdk_eks::types::ClusterStatus::Active)
    })
    .await;
}

/// Waits until `call` fails with error `code`, how AWS answers for what was deleted.
pub async fn wait_gone<F, Fut, T, E>(what: &str, code: &str, mut call: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
    E: aws_sdk_sagemaker::error::ProvideErrorMetadata,
{
    wait_for(what, || {
        let answer = call();
        async move {
            answer
                .await
                .err()
                .and_then(|e| e.code().map(str::to_owned))
                .as_deref()
                == Some(code)
        }
    })
    .await;
}

pub fn eks_orchestrator(eks_arn: &str) -> aws_sdk_sagemaker::types::ClusterOrchestrator {
    use aws_sdk_sagemaker::types::{ClusterOrchestrator, ClusterOrchestratorEksConfig};
    ClusterOrchestrator::builder()
        .eks(
            ClusterOrchestratorEksConfig::builder()
                .cluster_arn(eks_arn)
                .build(),
        )
        .build()
}

/// A HyperPod instance group named `gpu` with storage, threads per core and deep
/// health checks; tests change its public fields for other cases.
pub fn hyperpod_group(
    net: &Network,
    count: i32,
    instance_type: aws_sdk_sagemaker::types::ClusterInstanceType,
) -> aws_sdk_sagemaker::types::ClusterInstanceGroupSpecification {
    use aws_sdk_sagemaker::types::{
        ClusterEbsVolumeConfig, ClusterInstanceGroupSpecification, ClusterInstanceStorageConfig,
        ClusterLifeCycleConfig, DeepHealthCheckType,
    };
    ClusterInstanceGroupSpecification::builder()
        .instance_group_name("gpu")
        .instance_type(instance_type)
        .instance_count(count)
        .life_cycle_config(
            ClusterLifeCycleConfig::builder()
                .source_s3_uri("s3://sagemaker-hypd-shared/lifecycle/")
                .on_create("on_create.sh")
                .build(),
        )
        .execution_role(&net.role_arn)
        .threads_per_core(2)
        .instance_storage_configs(ClusterInstanceStorageConfig::EbsVolumeConfig(
            ClusterEbsVolumeConfig::builder()
                .volume_size_in_gb(500)
                .build(),
        ))
        .on_start_deep_health_checks(DeepHealthCheckType::InstanceStress)
        .on_start_deep_health_checks(DeepHealthCheckType::InstanceConnectivity)
        .build()
}

/// CreateCluster on an EKS orchestrator in the network's subnets and security group;
/// the caller adds instance groups and sends.
pub fn hyperpod_create(
    sm: &aws_sdk_sagemaker::Client,
    name: &str,
    eks_arn: &str,
    net: &Network,
) -> aws_sdk_sagemaker::operation::create_cluster::builders::CreateClusterFluentBuilder {
    sm.create_cluster()
        .cluster_name(name)
        .vpc_config(
            aws_sdk_sagemaker::types::VpcConfig::builder()
                .set_subnets(Some(net.subnets.clone()))
                .security_group_ids(&net.security_group)
                .build(),
        )
        .orchestrator(eks_orchestrator(eks_arn))
}

/// Waits until every node of a HyperPod cluster is Running and the cluster InService.
pub async fn hyperpod_ready(sm: &aws_sdk_sagemaker::Client, name: &str) {
    hyperpod_ready_within(sm, name, Duration::from_secs(20)).await;
}

/// [`hyperpod_ready`], waiting up to `patience`.
pub async fn hyperpod_ready_within(sm: &aws_sdk_sagemaker::Client, name: &str, patience: Duration) {
    use aws_sdk_sagemaker::types::{ClusterInstanceStatus, ClusterStatus};
    wait_for_within(
        &format!("{name} InService with every node Running"),
        patience,
        || async {
            let d = sm
                .describe_cluster()
                .cluster_name(name)
                .send()
                .await
                .unwrap();
            let nodes = sm
                .list_cluster_nodes()
                .cluster_name(name)
                .send()
                .await
                .unwrap()
                .cluster_node_summaries
                .unwrap_or_default();
            d.cluster_status == Some(ClusterStatus::Inservice)
                && nodes.iter().all(|n| {
                    n.instance_status.as_ref().and_then(|s| s.status.clone())
                        == Some(ClusterInstanceStatus::Running)
                })
        },
    )
    .await;
}

/// The error code and message CreateCluster refuses HyperPod cluster `name` with when
/// its one instance group is `group`.
pub async fn create_refused(
    sm: &aws_sdk_sagemaker::Client,
    name: &str,
    eks_arn: &str,
    net: &Network,
    group: aws_sdk_sagemaker::types::ClusterInstanceGroupSpecification,
) -> (String, String) {
    refused(
        hyperpod_create(sm, name, eks_arn, net)
            .instance_groups(group)
            .send()
            .await
            .unwrap_err(),
    )
}

/// The AWS error code and message of a failed call.
pub fn refused<E: aws_sdk_sagemaker::error::ProvideErrorMetadata, R>(
    err: aws_sdk_sagemaker::error::SdkError<E, R>,
) -> (String, String) {
    use aws_sdk_sagemaker::error::ProvideErrorMetadata;
    (
        err.code().unwrap_or_default().to_owned(),
        err.message().unwrap_or_default().to_owned(),
    )
}

/// An EKS bearer token for `cluster`, as hypd and `aws eks get-token` build it: a
/// presigned STS GetCallerIdentity URL signed with `x-k8s-aws-id`, signed at `at`.
pub fn eks_token_at(
    cluster: &str,
    secret: &str,
    at: std::time::SystemTime,
    expires: u64,
) -> String {
    use aws_sigv4::http_request::{
        SignableBody, SignableRequest, SignatureLocation, SigningSettings, sign,
    };
    use base64::Engine;
    let identity =
        aws_credential_types::Credentials::new("testing", secret, None, None, "test").into();
    let mut settings = SigningSettings::default();
    settings.signature_location = SignatureLocation::QueryParams;
    settings.expires_in = Some(Duration::from_secs(expires));
    let params = aws_sigv4::sign::v4::SigningParams::builder()
        .identity(&identity)
        .region("us-east-1")
        .name("sts")
        .time(at)
        .settings(settings)
        .build()
        .unwrap()
        .into();
    let url = "https://sts.us-east-1.amazonaws.com/?Action=GetCallerIdentity&Version=2011-06-15";
    let headers = [
        ("host", "sts.us-east-1.amazonaws.com"),
        ("x-k8s-aws-id", cluster),
    ];
    let request =
        SignableRequest::new("GET", url, headers.into_iter(), SignableBody::Bytes(&[])).unwrap();
    let (instructions, _) = sign(request, &params).unwrap().into_parts();
    let mut signed = http::Request::builder().uri(url).body(()).unwrap();
    instructions.apply_to_request_http1x(&mut signed);
    format!(
        "k8s-aws-v1.{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(signed.uri().to_string())
    )
}

pub fn eks_token(cluster: &str) -> String {
    eks_token_at(cluster, "testing", std::time::SystemTime::now(), 900)
}

/// Creates EKS cluster `name`, waits until ACTIVE and returns its API endpoint and CA PEM.
pub async fn active_cluster(
    eks: &aws_sdk_eks::Client,
    net: &Network,
    name: &str,
) -> (String, String) {
    use base64::Engine;
    let c = active_eks(eks, net, name).await;
    let ca = c.certificate_authority.unwrap().data.unwrap();
    let ca = String::from_utf8(
        base64::engine::general_purpose::STANDARD
            .decode(ca)
            .unwrap(),
    )
    .unwrap();
    (c.endpoint.unwrap(), ca)
}

/// Registers node `name` as a kubelet would: Ready, with `cpu` allocatable.
pub async fn register_node(client: &kube::Client, name: &str, cpu: &str) {
    use k8s_openapi::api::core::v1::Node;
    use kube::api::{Api, Patch, PatchParams, PostParams};
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({ "metadata": { "name": name } })).unwrap(),
        )
        .await
        .unwrap();
    nodes
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": { "allocatable": { "cpu": cpu },
                "conditions": [{ "type": "Ready", "status": "True" }] } })),
        )
        .await
        .unwrap();
}

/// Waits until pod `name` is Running.
pub async fn wait_pod_running(pods: &kube::Api<k8s_openapi::api::core::v1::Pod>, name: &str) {
    wait_for(&format!("{name} running"), || async {
        pods.get(name)
            .await
            .unwrap()
            .status
            .unwrap()
            .phase
            .as_deref()
            == Some("Running")
    })
    .await;
}

/// A kube-rs client (rustls) for an emulated cluster, as hypd builds one.
pub fn kube_client(endpoint: &str, ca_pem: &str, token: &str) -> kube::Client {
    kube::Client::try_from(kube_config(endpoint, ca_pem, token)).unwrap()
}

/// What a kube-rs client of an emulated cluster is configured with: its endpoint, its CA
/// and the token.
fn kube_config(endpoint: &str, ca_pem: &str, token: &str) -> kube::Config {
    use base64::Engine;
    let _ = rustls::crypto::ring::default_provider().install_default();
    let body: String = ca_pem.lines().filter(|l| !l.starts_with("-----")).collect();
    let der = base64::engine::general_purpose::STANDARD
        .decode(body)
        .unwrap();
    let mut config = kube::Config::new(endpoint.parse().unwrap());
    config.root_cert = Some(vec![der]);
    config.auth_info.token = Some(token.to_owned().into());
    config
}

/// A HyperPod cluster of one instance group ("gpu") orchestrated by EKS cluster `eks_name`.
pub async fn create_hyperpod(
    sim_url: &str,
    net: &Network,
    name: &str,
    eks_name: &str,
    instance_type: &str,
    count: i32,
) {
    use aws_sdk_sagemaker::types::ClusterInstanceType;
    let config = sdk_config(sim_url).await;
    let eks_arn = eks_cluster(&aws_sdk_eks::Client::new(&config), eks_name)
        .await
        .arn
        .unwrap();
    let mut group = hyperpod_group(net, count, ClusterInstanceType::from(instance_type));
    // The kube tests only need nodes: no deep health checks to wait for.
    group.on_start_deep_health_checks = None;
    group.threads_per_core = None;
    hyperpod_create(
        &aws_sdk_sagemaker::Client::new(&config),
        name,
        &eks_arn,
        net,
    )
    .instance_groups(group)
    .send()
    .await
    .unwrap();
}

/// A kube-rs client as hypd builds one for proxy calls: with kube-rs's own retry layer
/// off, which would otherwise retry a 503 fifteen times, backing off for minutes.
pub fn client_without_retries(endpoint: &str, ca_pem: &str, token: &str) -> kube::Client {
    let mut config = kube_config(endpoint, ca_pem, token);
    config.default_retry = false;
    kube::Client::try_from(config).unwrap()
}

/// What a call through a Service's proxy got: the status, the pod that answered and the
/// router it went through (the sim's headers), and the body (JSON, else its text).
pub struct Answer {
    pub status: u16,
    pub pod: Option<String>,
    pub router: Option<String>,
    pub body: serde_json::Value,
}

/// One call through the proxy of `service` (`name[:port]`, in `default`) to `path`.
pub async fn call(
    client: &kube::Client,
    method: &str,
    service: &str,
    path: &str,
    body: Option<serde_json::Value>,
) -> Answer {
    call_in(client, "default", method, service, path, body).await
}

/// [`call`] to a Service of namespace `ns`.
pub async fn call_in(
    client: &kube::Client,
    ns: &str,
    method: &str,
    service: &str,
    path: &str,
    body: Option<serde_json::Value>,
) -> Answer {
    let request = http::Request::builder()
        .method(method)
        .uri(format!(
            "/api/v1/namespaces/{ns}/services/{service}/proxy{path}"
        ))
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(kube::client::Body::from(
            body.map(|b| b.to_string().into_bytes()).unwrap_or_default(),
        ))
        .unwrap();
    let response = client.send(request).await.unwrap();
    let status = response.status().as_u16();
    let (pod, router) = {
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .map(|v| v.to_str().unwrap().to_owned())
        };
        (header("x-hypd-sim-pod"), header("x-hypd-sim-router"))
    };
    let raw = response.into_body().collect_bytes().await.unwrap();
    let body = serde_json::from_slice(&raw)
        .unwrap_or_else(|_| serde_json::Value::String(String::from_utf8_lossy(&raw).into_owned()));
    Answer {
        status,
        pod,
        router,
        body,
    }
}

/// HyperPod cluster `hp-1` on EKS cluster `ml-1` with `count` ml.g5.8xlarge nodes, once
/// every one of them is a Node of `client`'s API server.
pub async fn hyperpod_nodes(client: &kube::Client, sim_url: &str, net: &Network, count: usize) {
    use k8s_openapi::api::core::v1::Node;
    use kube::api::{Api, ListParams};
    create_hyperpod(sim_url, net, "hp-1", "ml-1", "ml.g5.8xlarge", count as i32).await;
    let nodes: Api<Node> = Api::all(client.clone());
    wait_for(&format!("{count} ml.g5.8xlarge nodes"), || async {
        nodes
            .list(&ListParams::default().labels("node.kubernetes.io/instance-type=ml.g5.8xlarge"))
            .await
            .unwrap()
            .items
            .len()
            == count
    })
    .await;
}

/// EKS cluster `ml-1` with HyperPod `hp-1`'s two ml.g5.8xlarge nodes Ready and the
/// inference operator's add-on installed, once it serves the CRD named `crd`: the
/// cluster's client.
pub async fn inference_cluster(sim_url: &str, net: &Network, crd: &str) -> kube::Client {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::api::Api;
    let eks = eks_client(sim_url).await;
    let (endpoint, ca) = active_cluster(&eks, net, "ml-1").await;
    let client = client_without_retries(&endpoint, &ca, &eks_token("ml-1"));
    hyperpod_nodes(&client, sim_url, net, 2).await;
    eks.create_addon()
        .cluster_name("ml-1")
        .addon_name("amazon-sagemaker-hyperpod-inference")
        .send()
        .await
        .unwrap();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    wait_for(&format!("the CRD {crd}"), || async {
        crds.get_opt(crd).await.unwrap().is_some()
    })
    .await;
    client
}
