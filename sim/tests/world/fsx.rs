//! FSx for Lustre over the wire (JSON 1.1, signed for `fsx`) against moto: the network
//! checks read moto's subnets and security groups, the file system's interfaces are made
//! and deleted in moto, faults and the call log apply as to SageMaker's calls.

use reqwest::Method;
use serde_json::{Value, json};

use crate::support::*;

/// An FSx call as `aws-sdk-fsx` sends it: status and body.
async fn fsx(sim: &str, op: &str, body: Value) -> (u16, Value) {
    let response = reqwest::Client::new()
        .post(format!("{sim}/"))
        .header("x-amz-target", format!("AWSSimbaAPIService_v20180301.{op}"))
        .header("content-type", "application/x-amz-json-1.1")
        .header(
            "authorization",
            "AWS4-HMAC-SHA256 Credential=AKIDFSX/20260101/us-east-1/fsx/aws4_request, SignedHeaders=host, Signature=0",
        )
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap())
}

async fn free_ips(moto: &str, subnet: &str) -> u32 {
    let xml = moto_call(
        moto,
        "ec2",
        &[
            ("Action", "DescribeSubnets"),
            ("Version", "2016-11-15"),
            ("SubnetId.1", subnet),
        ],
    )
    .await;
    xml_tag(&xml, "availableIpAddressCount").parse().unwrap()
}

async fn allow(moto: &str, group: &str, from: &str, to: &str) {
    moto_call(
        moto,
        "ec2",
        &[
            ("Action", "AuthorizeSecurityGroupIngress"),
            ("Version", "2016-11-15"),
            ("GroupId", group),
            ("IpPermissions.1.IpProtocol", "tcp"),
            ("IpPermissions.1.FromPort", from),
            ("IpPermissions.1.ToPort", to),
            ("IpPermissions.1.Groups.1.GroupId", group),
        ],
    )
    .await;
}

#[tokio::test]
async fn lustre_is_checked_against_moto_and_takes_its_interfaces_there() {
    let (_moto, moto) = moto();
    let (_sim, sim) = sim(&moto, 6000.0);
    let net = network(&moto).await;
    let subnet = &net.subnets[0];
    let create = json!({
        "FileSystemType": "LUSTRE", "StorageCapacity": 2400, "SubnetIds": [subnet],
        "SecurityGroupIds": [net.security_group], "ClientRequestToken": "t-1",
        "LustreConfiguration": {"DeploymentType": "PERSISTENT_2", "PerUnitStorageThroughput": 125},
    });

    let (status, e) = fsx(&sim, "CreateFileSystem", create.clone()).await;
    assert_eq!(
        (status, e["__type"].as_str()),
        (400, Some("InvalidNetworkSettings")),
        "{e}"
    );
    assert!(e["Message"].as_str().unwrap().contains("port 988"), "{e}");
    allow(&moto, &net.security_group, "988", "988").await;
    let (_, e) = fsx(&sim, "CreateFileSystem", create.clone()).await;
    assert!(e["Message"].as_str().unwrap().contains("1018-1023"), "{e}");
    allow(&moto, &net.security_group, "1018", "1023").await;

    let mut missing = create.clone();
    missing["SecurityGroupIds"] = json!(["sg-00000000000000000"]);
    let (_, e) = fsx(&sim, "CreateFileSystem", missing).await;
    assert_eq!(e["InvalidSecurityGroupId"], "sg-00000000000000000", "{e}");

    let before = free_ips(&moto, subnet).await;
    let (status, out) = fsx(&sim, "CreateFileSystem", create.clone()).await;
    assert_eq!(status, 200, "{out}");
    let fs = &out["FileSystem"];
    let id = fs["FileSystemId"].as_str().unwrap().to_owned();
    assert_eq!(fs["Lifecycle"], "CREATING");
    assert_eq!(fs["VpcId"], net.vpc.as_str());
    assert_eq!(fs["NetworkInterfaceIds"].as_array().unwrap().len(), 2);
    assert_eq!(
        free_ips(&moto, subnet).await,
        before - 2,
        "its interfaces hold addresses"
    );
    let (_, again) = fsx(&sim, "CreateFileSystem", create.clone()).await;
    assert_eq!(
        again["FileSystem"]["FileSystemId"],
        id.as_str(),
        "the token replays"
    );
    assert_eq!(free_ips(&moto, subnet).await, before - 2);

    // A subnet without room for the interfaces: a /28 has 11 free addresses.
    let small = xml_tag(
        &moto_call(
            &moto,
            "ec2",
            &[
                ("Action", "CreateSubnet"),
                ("Version", "2016-11-15"),
                ("VpcId", &net.vpc),
                ("CidrBlock", "10.0.9.0/28"),
                ("AvailabilityZone", "us-east-1a"),
            ],
        )
        .await,
        "subnetId",
    );
    let mut big = create.clone();
    big["SubnetIds"] = json!([small]);
    big["StorageCapacity"] = json!(33600);
    big["ClientRequestToken"] = json!("t-2");
    let (_, e) = fsx(&sim, "CreateFileSystem", big).await;
    assert_eq!(e["InvalidSubnetId"], small.as_str(), "{e}");
    assert!(
        e["Message"]
            .as_str()
            .unwrap()
            .contains("needs 15 and has 11"),
        "{e}"
    );

    // Faults by operation, and the call log.
    let fault = json!({"service": "fsx", "operation": "DescribeFileSystems", "kind": "error",
        "code": "InternalServerError", "status": 500, "message": "boom"});
    control(&sim, Method::POST, "/_sim/faults", fault).await;
    let (status, e) = fsx(&sim, "DescribeFileSystems", json!({})).await;
    assert_eq!(
        (status, e["__type"].as_str()),
        (500, Some("InternalServerError"))
    );
    let calls = control(&sim, Method::GET, "/_sim/calls", json!({})).await;
    assert!(
        calls["calls"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["service"] == "fsx" && c["operation"] == "DescribeFileSystems")
    );

    wait_for("the file system to be AVAILABLE", || {
        let (sim, id) = (sim.clone(), id.clone());
        async move {
            let (_, out) = fsx(&sim, "DescribeFileSystems", json!({"FileSystemIds": [id]})).await;
            out["FileSystems"][0]["Lifecycle"] == "AVAILABLE"
        }
    })
    .await;
    let (status, _) = fsx(&sim, "DeleteFileSystem", json!({"FileSystemId": id})).await;
    assert_eq!(status, 200);
    wait_for("the file system to be gone with its interfaces", || {
        let (sim, id, moto, subnet) = (sim.clone(), id.clone(), moto.clone(), subnet.clone());
        async move {
            let (_, out) = fsx(&sim, "DescribeFileSystems", json!({"FileSystemIds": [id]})).await;
            out["__type"] == "FileSystemNotFound" && free_ips(&moto, &subnet).await == before
        }
    })
    .await;
}
