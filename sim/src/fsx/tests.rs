//! FSx for Lustre on a stopped clock, through the functions the dispatch calls: the
//! request checks, the network checks over what moto would answer, idempotency,
//! lifecycles, deletion and associations. The calls to moto themselves are exercised by
//! `tests/world/fsx.rs`.

use serde_json::{Value, json};

use super::associations::{ASSOCIATION_CREATE_SECS, ASSOCIATION_DELETE_SECS, MAX_ASSOCIATIONS};
use super::file_systems::{
    CREATE_SECS, DELETE_SECS, MAX_FILE_SYSTEMS, MAX_TOTAL_STORAGE_GIB, Network, check_create,
    check_limits, check_network, insert, interfaces, replay,
};
use super::*;
use crate::moto::{Rule, SecurityGroup, Subnet};
use crate::world::{Fault, FaultKind};

fn request(deployment: &str, capacity: u64) -> Value {
    let mut body = json!({
        "FileSystemType": "LUSTRE", "StorageCapacity": capacity, "SubnetIds": ["subnet-1"],
        "SecurityGroupIds": ["sg-1"],
        "LustreConfiguration": {"DeploymentType": deployment},
    });
    match deployment {
        "PERSISTENT_1" => body["LustreConfiguration"]["PerUnitStorageThroughput"] = json!(100),
        "PERSISTENT_2" => body["LustreConfiguration"]["PerUnitStorageThroughput"] = json!(250),
        _ => {}
    }
    body
}

fn code(r: Result<impl std::fmt::Debug, FsxError>) -> String {
    r.expect_err("refused").code
}

/// Creates through the same steps as the dispatch, without moto.
fn create(w: &mut Aws, body: &Value) -> Result<Value, FsxError> {
    w.settle_fsx();
    let spec = check_create(body)?;
    if let Some(out) = replay(w, "us-east-1", &spec)? {
        return Ok(out);
    }
    check_limits(w, "us-east-1", spec.capacity)?;
    Ok(insert(w, "us-east-1", spec, "vpc-1", None))
}

fn describe(w: &mut Aws, id: &str) -> Value {
    answer(
        w,
        "DescribeFileSystems",
        "us-east-1",
        &json!({"FileSystemIds": [id]}),
    )
    .unwrap()["FileSystems"][0]
        .clone()
}

fn id_of(out: &Value) -> String {
    out["FileSystem"]["FileSystemId"]
        .as_str()
        .unwrap()
        .to_owned()
}

#[test]
fn capacity_throughput_and_efa_are_checked_per_deployment_type() {
    for (d, ok, bad) in [
        ("SCRATCH_1", [1200, 2400, 3600, 7200], [4800, 0]),
        ("SCRATCH_2", [1200, 2400, 4800, 9600], [3600, 1000]),
        ("PERSISTENT_1", [1200, 2400, 4800, 9600], [3600, 1300]),
        ("PERSISTENT_2", [1200, 2400, 4800, 9600], [3600, 100]),
    ] {
        for c in ok {
            assert!(check_create(&request(d, c)).is_ok(), "{d} {c}");
        }
        for c in bad {
            assert_eq!(code(check_create(&request(d, c))), "BadRequest", "{d} {c}");
        }
    }
    let mut b = request("PERSISTENT_2", 1200);
    b["LustreConfiguration"]["PerUnitStorageThroughput"] = json!(200);
    assert_eq!(code(check_create(&b)), "InvalidPerUnitStorageThroughput");
    b["LustreConfiguration"]
        .as_object_mut()
        .unwrap()
        .remove("PerUnitStorageThroughput");
    assert_eq!(
        code(check_create(&b)),
        "BadRequest",
        "required for PERSISTENT"
    );
    let mut b = request("SCRATCH_2", 1200);
    b["LustreConfiguration"]["PerUnitStorageThroughput"] = json!(125);
    assert_eq!(code(check_create(&b)), "BadRequest", "refused for SCRATCH");
    let mut b = request("PERSISTENT_1", 1200);
    b["LustreConfiguration"]["EfaEnabled"] = json!(true);
    let e = check_create(&b).unwrap_err();
    assert_eq!(
        (e.code.as_str(), &e.extra["Parameter"]),
        ("IncompatibleParameterError", &json!("EfaEnabled"))
    );
    let mut b = request("PERSISTENT_2", 1200);
    b["LustreConfiguration"]["EfaEnabled"] = json!(true);
    assert!(check_create(&b).is_ok());
    let mut b = request("SCRATCH_2", 1200);
    b["FileSystemType"] = json!("ONTAP");
    assert!(
        check_create(&b)
            .unwrap_err()
            .message
            .contains("Lustre only")
    );
    let mut b = request("SCRATCH_2", 1200);
    b["SubnetIds"] = json!(["subnet-1", "subnet-2"]);
    assert_eq!(code(check_create(&b)), "InvalidNetworkSettings");
    let mut b = request("SCRATCH_2", 1200);
    b["FileSystemTypeVersion"] = json!("2.13");
    assert_eq!(code(check_create(&b)), "BadRequest");
}

#[test]
fn the_answer_has_what_aws_answers_and_scratch_1_mounts_as_fsx() {
    let mut w = Aws::standalone(0.0);
    let out = create(&mut w, &request("PERSISTENT_2", 2400)).unwrap();
    let fs = &out["FileSystem"];
    let id = fs["FileSystemId"].as_str().unwrap();
    assert!(id.starts_with("fs-") && id.len() == 20, "{id}");
    assert!(
        id[3..]
            .chars()
            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
    );
    assert_eq!(fs["Lifecycle"], "CREATING");
    assert_eq!(fs["DNSName"], format!("{id}.fsx.us-east-1.amazonaws.com"));
    assert_eq!(
        fs["ResourceARN"],
        format!("arn:aws:fsx:us-east-1:123456789012:file-system/{id}")
    );
    assert_eq!(fs["FileSystemTypeVersion"], "2.15");
    assert_eq!(fs["StorageType"], "SSD");
    assert_eq!(fs["NetworkInterfaceIds"].as_array().unwrap().len(), 2);
    let lustre = &fs["LustreConfiguration"];
    let mount = lustre["MountName"].as_str().unwrap();
    assert!(
        mount.len() == 8
            && mount
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
    );
    assert_eq!(lustre["PerUnitStorageThroughput"], 250);
    assert_eq!(lustre["DataCompressionType"], "NONE");
    assert_eq!(lustre["LogConfiguration"]["Level"], "DISABLED");
    let scratch = create(&mut w, &request("SCRATCH_1", 1200)).unwrap();
    assert_eq!(
        scratch["FileSystem"]["LustreConfiguration"]["MountName"],
        "fsx"
    );
    assert!(scratch["FileSystem"]["LustreConfiguration"]["PerUnitStorageThroughput"].is_null());
}

#[test]
fn the_interface_model_is_one_metadata_server_and_one_per_unit() {
    assert_eq!(interfaces(1200), 2);
    assert_eq!(interfaces(2400), 2);
    assert_eq!(interfaces(3600), 3);
    assert_eq!(interfaces(24000), 11);
}

#[test]
fn a_token_replays_its_file_system_and_refuses_other_parameters() {
    let mut w = Aws::standalone(0.0);
    let mut b = request("SCRATCH_2", 1200);
    b["ClientRequestToken"] = json!("t-1");
    let first = create(&mut w, &b).unwrap();
    let again = create(&mut w, &b).unwrap();
    assert_eq!(id_of(&first), id_of(&again));
    assert_eq!(w.fsx.file_systems.len(), 1);
    b["StorageCapacity"] = json!(2400);
    let e = create(&mut w, &b).unwrap_err();
    assert_eq!(e.code, "IncompatibleParameterError");
    assert_eq!(e.extra["Parameter"], "ClientRequestToken");
}

#[test]
fn file_systems_come_available_fail_under_a_fault_and_are_held_by_stuck() {
    let mut w = Aws::standalone(0.0);
    let id = id_of(&create(&mut w, &request("SCRATCH_2", 1200)).unwrap());
    w.clock.advance(CREATE_SECS - 1.0);
    assert_eq!(describe(&mut w, &id)["Lifecycle"], "CREATING");
    w.clock.advance(1.0);
    assert_eq!(describe(&mut w, &id)["Lifecycle"], "AVAILABLE");

    let fault = |kind| Fault {
        id: 0,
        service: "fsx".into(),
        operation: "CreateFileSystem".into(),
        kind,
        times: 1,
        after: 0,
        caller: None,
    };
    w.faults.add(fault(FaultKind::Fails {
        code: "X".into(),
        message: "no capacity in the zone".into(),
    }));
    let failed = id_of(&create(&mut w, &request("SCRATCH_2", 1200)).unwrap());
    w.faults.clear();
    w.clock.advance(CREATE_SECS);
    let d = describe(&mut w, &failed);
    assert_eq!(d["Lifecycle"], "FAILED");
    assert!(
        d["FailureDetails"]["Message"]
            .as_str()
            .unwrap()
            .contains("no capacity")
    );

    w.faults.add(fault(FaultKind::Stuck));
    let stuck = id_of(&create(&mut w, &request("SCRATCH_2", 1200)).unwrap());
    w.clock.advance(10.0 * CREATE_SECS);
    assert_eq!(describe(&mut w, &stuck)["Lifecycle"], "CREATING");
    w.faults.clear();
    assert_eq!(describe(&mut w, &stuck)["Lifecycle"], "AVAILABLE");
}

#[test]
fn deletion_waits_for_creation_then_takes_the_file_system_its_associations_and_interfaces() {
    let mut w = Aws::standalone(0.0);
    let id = id_of(&create(&mut w, &request("PERSISTENT_2", 1200)).unwrap());
    let del = json!({"FileSystemId": id});
    assert_eq!(
        code(answer(&mut w, "DeleteFileSystem", "us-east-1", &del)),
        "BadRequest"
    );
    w.clock.advance(CREATE_SECS);
    create_association(
        &mut w,
        "us-east-1",
        &json!({"FileSystemId": id, "FileSystemPath": "/ns1", "DataRepositoryPath": "s3://b/p/"}),
        None,
    )
    .unwrap();
    let out = answer(&mut w, "DeleteFileSystem", "us-east-1", &del).unwrap();
    assert_eq!(out, json!({"FileSystemId": id, "Lifecycle": "DELETING"}));
    assert_eq!(describe(&mut w, &id)["Lifecycle"], "DELETING");
    let listed = answer(
        &mut w,
        "DescribeDataRepositoryAssociations",
        "us-east-1",
        &json!({}),
    )
    .unwrap();
    assert_eq!(listed["Associations"][0]["Lifecycle"], "DELETING");
    w.clock.advance(DELETE_SECS);
    let e = answer(
        &mut w,
        "DescribeFileSystems",
        "us-east-1",
        &json!({"FileSystemIds": [id]}),
    )
    .unwrap_err();
    assert_eq!(e.code, "FileSystemNotFound");
    assert!(w.fsx.associations.is_empty());
    assert_eq!(
        w.fsx.released.len(),
        2,
        "its interfaces are to be deleted in moto"
    );
    assert_eq!(
        code(answer(&mut w, "DeleteFileSystem", "us-east-1", &del)),
        "FileSystemNotFound"
    );
    // Another region knows none of it.
    let other = create(&mut w, &request("SCRATCH_2", 1200)).unwrap();
    let e = answer(
        &mut w,
        "DescribeFileSystems",
        "eu-west-1",
        &json!({"FileSystemIds": [id_of(&other)]}),
    );
    assert_eq!(code(e), "FileSystemNotFound");
}

#[test]
fn describe_pages_and_limits_hold() {
    let mut w = Aws::standalone(0.0);
    for _ in 0..3 {
        create(&mut w, &request("SCRATCH_2", 1200)).unwrap();
    }
    let first = answer(
        &mut w,
        "DescribeFileSystems",
        "us-east-1",
        &json!({"MaxResults": 2}),
    )
    .unwrap();
    assert_eq!(first["FileSystems"].as_array().unwrap().len(), 2);
    let token = first["NextToken"].as_str().unwrap();
    let rest = answer(
        &mut w,
        "DescribeFileSystems",
        "us-east-1",
        &json!({"MaxResults": 2, "NextToken": token}),
    )
    .unwrap();
    assert_eq!(rest["FileSystems"].as_array().unwrap().len(), 1);
    assert!(rest["NextToken"].is_null());
    assert_eq!(
        code(answer(
            &mut w,
            "DescribeFileSystems",
            "us-east-1",
            &json!({"MaxResults": 0})
        )),
        "BadRequest"
    );
    let e = create(&mut w, &request("SCRATCH_2", MAX_TOTAL_STORAGE_GIB)).unwrap_err();
    assert_eq!(
        (e.code.as_str(), &e.extra["Limit"]),
        ("ServiceLimitExceeded", &json!("TOTAL_STORAGE"))
    );
    while w.fsx.file_systems.len() < MAX_FILE_SYSTEMS {
        let spec = check_create(&request("SCRATCH_2", 1200)).unwrap();
        insert(&mut w, "us-east-1", spec, "vpc-1", None);
    }
    let e = create(&mut w, &request("SCRATCH_2", 1200)).unwrap_err();
    assert_eq!(e.extra["Limit"], "FILE_SYSTEM_COUNT");
}

#[test]
fn tags_are_read_and_written_by_arn() {
    let mut w = Aws::standalone(0.0);
    let mut b = request("SCRATCH_2", 1200);
    b["Tags"] = json!([{"Key": "a", "Value": "1"}]);
    let arn = create(&mut w, &b).unwrap()["FileSystem"]["ResourceARN"].clone();
    answer(&mut w, "TagResource", "us-east-1", &json!({"ResourceARN": arn, "Tags": [{"Key": "a", "Value": "2"}, {"Key": "b", "Value": "3"}]})).unwrap();
    let tags = answer(
        &mut w,
        "ListTagsForResource",
        "us-east-1",
        &json!({"ResourceARN": arn}),
    )
    .unwrap();
    assert_eq!(
        tags["Tags"],
        json!([{"Key": "a", "Value": "2"}, {"Key": "b", "Value": "3"}])
    );
    let e = answer(
        &mut w,
        "ListTagsForResource",
        "us-east-1",
        &json!({"ResourceARN": "arn:aws:fsx:us-east-1:123456789012:file-system/fs-0"}),
    )
    .unwrap_err();
    assert_eq!(
        (e.code.as_str(), e.extra.contains_key("ResourceARN")),
        ("ResourceNotFound", true)
    );
}

fn subnet(free: u32) -> Option<(Subnet, u32)> {
    Some((
        Subnet {
            id: "subnet-1".into(),
            vpc_id: "vpc-1".into(),
            availability_zone: "us-east-1a".into(),
            availability_zone_id: "use1-az1".into(),
            cidr_block: "10.0.1.0/24".into(),
        },
        free,
    ))
}

fn group(rules: Vec<Rule>) -> (String, Option<SecurityGroup>) {
    (
        "sg-1".into(),
        Some(SecurityGroup {
            id: "sg-1".into(),
            inbound: rules,
        }),
    )
}

fn tcp(lo: u16, hi: u16, groups: &[&str], cidrs: &[&str]) -> Rule {
    Rule {
        protocol: "tcp".into(),
        ports: Some((lo, hi)),
        groups: groups.iter().map(|s| s.to_string()).collect(),
        cidrs: cidrs.iter().map(|s| s.to_string()).collect(),
    }
}

#[test]
fn the_network_must_exist_admit_lnet_and_have_free_addresses() {
    let spec = check_create(&request("SCRATCH_2", 4800)).unwrap();
    let open = vec![
        tcp(988, 988, &["sg-1"], &[]),
        tcp(1018, 1023, &[], &["10.0.0.0/16"]),
    ];
    let net = |subnet, groups| Network { subnet, groups };
    assert!(check_network(&spec, &net(subnet(3), vec![group(open.clone())])).is_ok());
    let all = Rule {
        protocol: "-1".into(),
        ports: None,
        groups: vec!["sg-1".into()],
        cidrs: vec![],
    };
    assert!(check_network(&spec, &net(subnet(3), vec![group(vec![all])])).is_ok());

    let e = check_network(&spec, &net(None, vec![group(open.clone())])).unwrap_err();
    assert_eq!(
        (e.code.as_str(), &e.extra["InvalidSubnetId"]),
        ("InvalidNetworkSettings", &json!("subnet-1"))
    );
    let e = check_network(&spec, &net(subnet(3), vec![("sg-9".into(), None)])).unwrap_err();
    assert_eq!(e.extra["InvalidSecurityGroupId"], "sg-9");

    // 988 only from another group; 1018-1023 from a CIDR that does not hold the subnet.
    let closed = vec![
        tcp(988, 988, &["sg-7"], &[]),
        tcp(1018, 1023, &[], &["10.0.1.0/16"]),
    ];
    let e = check_network(&spec, &net(subnet(3), vec![group(closed)])).unwrap_err();
    assert_eq!(e.code, "InvalidNetworkSettings");
    assert!(
        e.message
            .contains("do not permit Amazon FSx for Lustre LNET network traffic on port 988"),
        "{}",
        e.message
    );
    let partial = vec![
        tcp(988, 988, &["sg-1"], &[]),
        tcp(1018, 1020, &["sg-1"], &[]),
    ];
    let e = check_network(&spec, &net(subnet(3), vec![group(partial)])).unwrap_err();
    assert!(e.message.contains("port 1021"), "{}", e.message);

    let e = check_network(&spec, &net(subnet(2), vec![group(open)])).unwrap_err();
    assert_eq!(e.code, "InvalidNetworkSettings");
    assert!(e.message.contains("needs 3 and has 2"), "{}", e.message);
}

#[test]
fn associations_follow_awss_rules() {
    let mut w = Aws::standalone(0.0);
    let scratch = id_of(&create(&mut w, &request("SCRATCH_1", 1200)).unwrap());
    let mut old = request("PERSISTENT_1", 1200);
    old["FileSystemTypeVersion"] = json!("2.10");
    let old = id_of(&create(&mut w, &old).unwrap());
    let fs = id_of(&create(&mut w, &request("PERSISTENT_2", 1200)).unwrap());
    let dra = |fs: &str, path: &str, s3: &str| json!({"FileSystemId": fs, "FileSystemPath": path, "DataRepositoryPath": s3});
    let mk = |w: &mut Aws, body: Value| create_association(w, "us-east-1", &body, Some(true));
    assert_eq!(
        code(mk(&mut w, dra(&fs, "/a", "s3://b/a/"))),
        "BadRequest",
        "file system CREATING"
    );
    w.clock.advance(CREATE_SECS);
    assert_eq!(
        code(mk(&mut w, dra(&scratch, "/a", "s3://b/a/"))),
        "BadRequest"
    );
    assert_eq!(code(mk(&mut w, dra(&old, "/a", "s3://b/a/"))), "BadRequest");
    assert_eq!(
        code(mk(&mut w, dra("fs-00000000000000000", "/a", "s3://b/a/"))),
        "FileSystemNotFound"
    );
    assert_eq!(code(mk(&mut w, dra(&fs, "a", "s3://b/a/"))), "BadRequest");
    assert_eq!(
        code(mk(&mut w, dra(&fs, "/a", "https://b/a/"))),
        "BadRequest"
    );
    let e = create_association(
        &mut w,
        "us-east-1",
        &dra(&fs, "/a", "s3://nope/a/"),
        Some(false),
    )
    .unwrap_err();
    assert!(e.message.contains("nope"));

    let mut body = dra(&fs, "/ns1/", "s3://b/ns1/");
    body["ClientRequestToken"] = json!("t");
    body["S3"] = json!({"AutoImportPolicy": {"Events": ["NEW", "CHANGED"]}});
    let out = mk(&mut w, body.clone()).unwrap();
    let a = &out["Association"];
    let id = a["AssociationId"].as_str().unwrap().to_owned();
    assert!(id.starts_with("dra-") && id.len() == 21);
    assert_eq!(a["Lifecycle"], "CREATING");
    assert_eq!(a["FileSystemPath"], "/ns1");
    assert_eq!(a["ImportedFileChunkSize"], 1024);
    assert_eq!(
        a["ResourceARN"],
        format!("arn:aws:fsx:us-east-1:123456789012:association/{fs}/{id}")
    );
    assert_eq!(
        mk(&mut w, body.clone()).unwrap()["Association"]["AssociationId"],
        id.as_str()
    );
    body["ImportedFileChunkSize"] = json!(2048);
    assert_eq!(code(mk(&mut w, body)), "IncompatibleParameterError");

    assert_eq!(
        code(mk(&mut w, dra(&fs, "/ns1/sub", "s3://b/other/"))),
        "BadRequest",
        "nested"
    );
    assert_eq!(
        code(mk(&mut w, dra(&fs, "/", "s3://b/other/"))),
        "BadRequest",
        "contains"
    );
    assert_eq!(
        code(mk(&mut w, dra(&fs, "/ns2", "s3://b/ns1/"))),
        "BadRequest",
        "same S3 path"
    );
    for i in 2..=MAX_ASSOCIATIONS {
        mk(
            &mut w,
            dra(&fs, &format!("/ns{i}"), &format!("s3://b/ns{i}/")),
        )
        .unwrap();
    }
    let e = mk(&mut w, dra(&fs, "/ns9", "s3://b/ns9/")).unwrap_err();
    assert_eq!(e.code, "ServiceLimitExceeded");

    let d = |w: &mut Aws, body: Value| {
        answer(w, "DescribeDataRepositoryAssociations", "us-east-1", &body)
    };
    let filtered = d(
        &mut w,
        json!({"Filters": [{"Name": "file-system-id", "Values": [fs]}], "MaxResults": 5}),
    )
    .unwrap();
    assert_eq!(filtered["Associations"].as_array().unwrap().len(), 5);
    assert!(filtered["NextToken"].is_string());
    let none = d(
        &mut w,
        json!({"Filters": [{"Name": "file-system-id", "Values": [scratch]}]}),
    )
    .unwrap();
    assert_eq!(none["Associations"], json!([]));
    assert_eq!(code(d(&mut w, json!({"MaxResults": 26}))), "BadRequest");
    assert_eq!(
        code(d(&mut w, json!({"AssociationIds": ["dra-0"]}))),
        "DataRepositoryAssociationNotFound"
    );

    let del = json!({"AssociationId": id, "DeleteDataInFileSystem": false});
    assert_eq!(
        code(answer(
            &mut w,
            "DeleteDataRepositoryAssociation",
            "us-east-1",
            &del
        )),
        "BadRequest",
        "CREATING"
    );
    w.clock.advance(ASSOCIATION_CREATE_SECS);
    let one = d(&mut w, json!({"AssociationIds": [id]})).unwrap();
    assert_eq!(one["Associations"][0]["Lifecycle"], "AVAILABLE");
    let out = answer(&mut w, "DeleteDataRepositoryAssociation", "us-east-1", &del).unwrap();
    assert_eq!(out["Lifecycle"], "DELETING");
    w.clock.advance(ASSOCIATION_DELETE_SECS);
    assert_eq!(
        code(d(&mut w, json!({"AssociationIds": [id]}))),
        "DataRepositoryAssociationNotFound"
    );
    mk(&mut w, dra(&fs, "/ns1", "s3://b/ns1/")).expect("its path is free again");
}

#[test]
fn the_mountable_view_reports_lifecycle_and_when_it_became_available() {
    let w = {
        let mut w = Aws::standalone(0.0);
        create(&mut w, &request("PERSISTENT_2", 1200)).unwrap();
        w
    };
    let ((), due) = crate::clock::recording(|| {
        let m = w.fsx_mountable("us-east-1");
        assert_eq!(m.len(), 1);
        assert_eq!(m[0].lifecycle, Lifecycle::Creating);
        assert_eq!(m[0].available_at, w.clock.epoch(CREATE_SECS));
    });
    assert_eq!(
        due, CREATE_SECS,
        "a pass reading it is due when it comes available"
    );
    assert!(w.fsx_mountable("eu-west-1").is_empty());
}
