//! The sim as a front for moto: the real `aws-sdk-ec2`, `-iam`, `-s3` and `-sts` clients
//! pointed at the sim reach moto unchanged, and faults injected for those services
//! answer in each service's protocol, parsed by the SDKs into their code and message
//! and, for throttling, absorbed by their retry.

use aws_sdk_ec2::error::ProvideErrorMetadata;
use aws_sdk_ec2::operation::RequestId;
use aws_sdk_s3::primitives::ByteStream;
use serde_json::json;
use crate::support::{control, inject, moto, moto_call, sdk_config, sim, xml_tag};

const TRUST: &str = r#"{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Principal":{"Service":"eks.amazonaws.com"},"Action":"sts:AssumeRole"}]}"#;

struct Clients {
    ec2: aws_sdk_ec2::Client,
    iam: aws_sdk_iam::Client,
    s3: aws_sdk_s3::Client,
    sts: aws_sdk_sts::Client,
}

/// Clients whose endpoint is the sim; `attempts` 1 shows what the SDK saw before
/// retrying.
async fn clients(sim_url: &str, attempts: u32) -> Clients {
    let conf = sdk_config(sim_url).await;
    let conf = conf
        .to_builder()
        .retry_config(
            aws_config::retry::RetryConfig::standard()
                .with_max_attempts(attempts)
                .with_initial_backoff(std::time::Duration::from_millis(10)),
        )
        .build();
    Clients {
        ec2: aws_sdk_ec2::Client::new(&conf),
        iam: aws_sdk_iam::Client::new(&conf),
        s3: aws_sdk_s3::Client::from_conf(
            aws_sdk_s3::config::Builder::from(&conf)
                .force_path_style(true)
                .build(),
        ),
        sts: aws_sdk_sts::Client::new(&conf),
    }
}

/// The VPC ids moto holds, asked of moto directly.
async fn moto_vpcs(moto_url: &str) -> Vec<String> {
    let xml = moto_call(
        moto_url,
        "ec2",
        &[("Action", "DescribeVpcs"), ("Version", "2016-11-15")],
    )
    .await;
    xml.split("<vpcId>")
        .skip(1)
        .filter_map(|s| s.split("</vpcId>").next())
        .map(str::to_owned)
        .collect()
}

async fn faults_left(sim_url: &str) -> usize {
    control(sim_url, reqwest::Method::GET, "/_sim/faults", json!({})).await["faults"]
        .as_array()
        .unwrap()
        .len()
}

#[tokio::test(flavor = "multi_thread")]
async fn ec2_iam_s3_sts_pass_through_to_moto() {
    let (_moto, moto_url) = moto();
    let (_sim, sim_url) = sim(&moto_url, 60.0);
    let c = clients(&sim_url, 3).await;

    let vpc = c
        .ec2
        .create_vpc()
        .cidr_block("10.7.0.0/16")
        .send()
        .await
        .unwrap()
        .vpc
        .unwrap();
    let vpc_id = vpc.vpc_id.unwrap();
    assert_eq!(vpc.cidr_block.as_deref(), Some("10.7.0.0/16"));
    let described = c
        .ec2
        .describe_vpcs()
        .vpc_ids(&vpc_id)
        .send()
        .await
        .unwrap()
        .vpcs
        .unwrap();
    assert_eq!(described.len(), 1);
    assert_eq!(described[0].cidr_block.as_deref(), Some("10.7.0.0/16"));
    assert!(
        moto_vpcs(&moto_url).await.contains(&vpc_id),
        "the VPC is moto's"
    );
    // An unknown id gets moto's own error, passed back unchanged.
    let err = c
        .ec2
        .describe_vpcs()
        .vpc_ids("vpc-00000000000000000")
        .send()
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("InvalidVpcID.NotFound"));

    let role = c
        .iam
        .create_role()
        .role_name("hypd-proxy")
        .assume_role_policy_document(TRUST)
        .send()
        .await
        .unwrap()
        .role
        .unwrap();
    let got = c
        .iam
        .get_role()
        .role_name("hypd-proxy")
        .send()
        .await
        .unwrap()
        .role
        .unwrap();
    assert_eq!(got.arn, role.arn);
    assert!(got.arn.ends_with(":role/hypd-proxy"));

    // A bucket named like an EKS path: signed for s3, it is moto's.
    for bucket in ["hypd-artifacts", "clusters"] {
        c.s3.create_bucket().bucket(bucket).send().await.unwrap();
        c.s3.head_bucket().bucket(bucket).send().await.unwrap();
        c.s3.put_object()
            .bucket(bucket)
            .key("runs/one.txt")
            .body(ByteStream::from_static(b"hello moto"))
            .send()
            .await
            .unwrap();
        let object =
            c.s3.get_object()
                .bucket(bucket)
                .key("runs/one.txt")
                .send()
                .await
                .unwrap();
        assert_eq!(
            object.body.collect().await.unwrap().into_bytes().as_ref(),
            b"hello moto"
        );
    }
    let listed =
        c.s3.list_objects_v2()
            .bucket("clusters")
            .send()
            .await
            .unwrap();
    assert_eq!(listed.key_count, Some(1));
    let missing = c.s3.head_bucket().bucket("no-such-bucket").send().await;
    assert!(missing.unwrap_err().into_service_error().is_not_found());

    let me = c.sts.get_caller_identity().send().await.unwrap();
    assert_eq!(me.account.as_deref(), Some("123456789012"));
}

#[tokio::test(flavor = "multi_thread")]
async fn an_error_fault_on_create_vpc_creates_nothing() {
    let (_moto, moto_url) = moto();
    let (_sim, sim_url) = sim(&moto_url, 60.0);
    let c = clients(&sim_url, 3).await;
    let before = moto_vpcs(&moto_url).await;

    inject(
        &sim_url,
        json!({"service": "ec2", "operation": "CreateVpc", "kind": "error",
               "code": "VpcLimitExceeded", "status": 400,
               "message": "The maximum number of VPCs has been reached."}),
    )
    .await;
    let err = c
        .ec2
        .create_vpc()
        .cidr_block("10.8.0.0/16")
        .send()
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("VpcLimitExceeded"));
    assert!(
        err.message()
            .unwrap()
            .starts_with("The maximum number of VPCs has been reached."),
        "{err:?}"
    );
    assert!(err.meta().request_id().is_some(), "EC2's RequestID is read");
    assert_eq!(moto_vpcs(&moto_url).await, before, "moto was not called");
    // Used once; the next call goes through.
    c.ec2
        .create_vpc()
        .cidr_block("10.8.0.0/16")
        .send()
        .await
        .unwrap();
    assert_eq!(moto_vpcs(&moto_url).await.len(), before.len() + 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn throttling_is_shaped_per_service_and_absorbed_by_the_retry() {
    let (_moto, moto_url) = moto();
    let (_sim, sim_url) = sim(&moto_url, 60.0);
    let once = clients(&sim_url, 1).await;
    let retrying = clients(&sim_url, 3).await;
    once.s3.create_bucket().bucket("bkt").send().await.unwrap();
    moto_call(
        &moto_url,
        "iam",
        &[
            ("Action", "CreateRole"),
            ("Version", "2010-05-08"),
            ("RoleName", "r"),
            ("AssumeRolePolicyDocument", TRUST),
        ],
    )
    .await;

    let throttle = |service: &str, operation: &str| json!({"service": service, "operation": operation, "kind": "throttle", "times": 1});
    // What each SDK sees without retrying: AWS's throttling code for the service.
    inject(&sim_url, throttle("ec2", "DescribeVpcs")).await;
    let err = once.ec2.describe_vpcs().send().await.unwrap_err();
    assert_eq!(err.code(), Some("RequestLimitExceeded"));
    assert_eq!(err.raw_response().unwrap().status().as_u16(), 503);
    inject(&sim_url, throttle("iam", "GetRole")).await;
    let err = once.iam.get_role().role_name("r").send().await.unwrap_err();
    assert_eq!(
        aws_sdk_iam::error::ProvideErrorMetadata::code(&err),
        Some("Throttling")
    );
    assert_eq!(err.raw_response().unwrap().status().as_u16(), 400);
    inject(&sim_url, throttle("s3", "HeadBucket")).await;
    let err = once
        .s3
        .head_bucket()
        .bucket("bkt")
        .send()
        .await
        .unwrap_err();
    assert_eq!(err.raw_response().unwrap().status().as_u16(), 503);
    inject(&sim_url, throttle("s3", "ListObjectsV2")).await;
    let err = once
        .s3
        .list_objects_v2()
        .bucket("bkt")
        .send()
        .await
        .unwrap_err();
    assert_eq!(
        aws_sdk_s3::error::ProvideErrorMetadata::code(&err),
        Some("SlowDown")
    );
    inject(&sim_url, throttle("sts", "GetCallerIdentity")).await;
    let err = once.sts.get_caller_identity().send().await.unwrap_err();
    assert_eq!(
        aws_sdk_sts::error::ProvideErrorMetadata::code(&err),
        Some("Throttling")
    );
    assert_eq!(faults_left(&sim_url).await, 0);

    // With retries, one throttle each is absorbed (IAM's 400 included: the SDK retries
    // it because of its code, not its status).
    for (service, operation) in [
        ("ec2", "DescribeVpcs"),
        ("iam", "GetRole"),
        ("s3", "ListObjectsV2"),
        ("sts", "GetCallerIdentity"),
    ] {
        inject(&sim_url, throttle(service, operation)).await;
    }
    retrying.ec2.describe_vpcs().send().await.unwrap();
    retrying.iam.get_role().role_name("r").send().await.unwrap();
    retrying
        .s3
        .list_objects_v2()
        .bucket("bkt")
        .send()
        .await
        .unwrap();
    retrying.sts.get_caller_identity().send().await.unwrap();
    assert_eq!(faults_left(&sim_url).await, 0, "every throttle was hit");
}

#[tokio::test(flavor = "multi_thread")]
async fn faults_hit_their_service_and_operation_only() {
    let (_moto, moto_url) = moto();
    let (_sim, sim_url) = sim(&moto_url, 60.0);
    let c = clients(&sim_url, 1).await;
    c.s3.create_bucket().bucket("models").send().await.unwrap();

    inject(
        &sim_url,
        json!({"service": "s3", "operation": "PutObject", "kind": "error",
               "code": "AccessDenied", "status": 403, "message": "Access Denied"}),
    )
    .await;
    inject(
        &sim_url,
        json!({"service": "iam", "operation": "*", "kind": "error",
               "code": "AccessDenied", "status": 403,
               "message": "User is not authorized to perform iam:*"}),
    )
    .await;
    // Neither touches EC2, STS or other S3 operations.
    c.ec2
        .create_vpc()
        .cidr_block("10.9.0.0/16")
        .send()
        .await
        .unwrap();
    c.sts.get_caller_identity().send().await.unwrap();
    c.s3.head_bucket().bucket("models").send().await.unwrap();
    assert_eq!(faults_left(&sim_url).await, 2);

    let err =
        c.s3.put_object()
            .bucket("models")
            .key("weights.bin")
            .body(ByteStream::from_static(b"w"))
            .send()
            .await
            .unwrap_err();
    assert_eq!(
        aws_sdk_s3::error::ProvideErrorMetadata::code(&err),
        Some("AccessDenied")
    );
    assert!(
        aws_sdk_s3::error::ProvideErrorMetadata::message(&err)
            .unwrap()
            .starts_with("Access Denied")
    );
    let head =
        c.s3.head_object()
            .bucket("models")
            .key("weights.bin")
            .send()
            .await;
    assert!(
        head.unwrap_err().into_service_error().is_not_found(),
        "the object never reached moto"
    );

    let err = c
        .iam
        .create_role()
        .role_name("x")
        .assume_role_policy_document(TRUST)
        .send()
        .await
        .unwrap_err();
    assert_eq!(
        aws_sdk_iam::error::ProvideErrorMetadata::code(&err),
        Some("AccessDenied")
    );
    assert_eq!(
        aws_sdk_iam::error::ProvideErrorMetadata::message(&err),
        Some("User is not authorized to perform iam:* (injected by hypd-sim)")
    );
    let role = moto_call(
        &moto_url,
        "iam",
        &[
            ("Action", "GetRole"),
            ("Version", "2010-05-08"),
            ("RoleName", "x"),
        ],
    )
    .await;
    assert_eq!(xml_tag(&role, "Code"), "NoSuchEntity");

    // An EKS fault does not leak onto the proxied services, nor theirs onto EKS.
    control(&sim_url, reqwest::Method::DELETE, "/_sim/faults", json!({})).await;
    inject(
        &sim_url,
        json!({"service": "eks", "operation": "*", "kind": "server_error", "times": 5}),
    )
    .await;
    c.ec2.describe_vpcs().send().await.unwrap();
    control(&sim_url, reqwest::Method::DELETE, "/_sim/faults", json!({})).await;
    inject(
        &sim_url,
        json!({"service": "ec2", "operation": "*", "kind": "server_error", "times": 5}),
    )
    .await;
    let eks = crate::support::eks_client(&sim_url).await;
    eks.list_clusters().send().await.unwrap();
    let err = c.ec2.describe_vpcs().send().await.unwrap_err();
    assert_eq!(err.code(), Some("InternalError"));
}

#[tokio::test(flavor = "multi_thread")]
async fn stuck_faults_are_refused_for_moto_services() {
    let (_moto, moto_url) = moto();
    let (_sim, sim_url) = sim(&moto_url, 60.0);
    let answer = control(
        &sim_url,
        reqwest::Method::POST,
        "/_sim/faults",
        json!({"service": "ec2", "operation": "CreateVpc", "kind": "stuck"}),
    )
    .await;
    assert!(answer.get("id").is_none(), "{answer}");
    let answer = control(
        &sim_url,
        reqwest::Method::POST,
        "/_sim/faults",
        json!({"service": "dynamodb", "operation": "*", "kind": "throttle"}),
    )
    .await;
    assert!(answer.get("id").is_none(), "{answer}");
}
