"""The deployment artefacts: the CloudFormation template lints clean and deploys into
moto's CloudFormation with a TLS-only private bucket, an instance role trusted by EC2
only, IMDSv2, and no inbound rule anywhere; the Dockerfile passes hadolint."""

import json
import shutil
import subprocess
import time

import boto3
import pytest

from conftest import REPO

TEMPLATE = REPO / "cloudformation" / "management.yaml"


def test_cfn_lint_is_clean():
    run = subprocess.run([shutil.which("cfn-lint") or "cfn-lint", str(TEMPLATE)], capture_output=True, text=True)
    assert run.returncode == 0 and run.stdout == "", run.stdout + run.stderr


def test_hadolint_is_clean():
    run = subprocess.run(
        [shutil.which("hadolint") or "hadolint", str(REPO / "Dockerfile")], capture_output=True, text=True
    )
    assert run.returncode == 0 and run.stdout == "", run.stdout + run.stderr


def template():
    from cfnlint.decode import decode

    parsed, errors = decode(str(TEMPLATE))
    assert not errors, errors
    return parsed


def test_bucket_is_private_versioned_and_encrypted():
    # moto's CloudFormation creates the bucket but ignores these properties, so they are
    # checked in the template itself.
    props = template()["Resources"]["SharedBucket"]["Properties"]
    assert props["VersioningConfiguration"] == {"Status": "Enabled"}
    assert all(props["PublicAccessBlockConfiguration"].values())
    [rule] = props["BucketEncryption"]["ServerSideEncryptionConfiguration"]
    assert rule["ServerSideEncryptionByDefault"]["SSEAlgorithm"] == "aws:kms"
    assert props["OwnershipControls"]["Rules"] == [{"ObjectOwnership": "BucketOwnerEnforced"}]


def test_instance_policy_grants_no_admin_and_scopes_iam():
    resources = template()["Resources"]
    role = resources["InstanceRole"]["Properties"]
    # The only managed policy is SSM's core; never AdministratorAccess or PowerUserAccess.
    [managed] = role["ManagedPolicyArns"]
    assert managed == {"Fn::Sub": "arn:${AWS::Partition}:iam::aws:policy/AmazonSSMManagedInstanceCore"}
    statements = [s for p in role["Policies"] for s in p["PolicyDocument"]["Statement"]]
    for s in statements:
        actions = s["Action"] if isinstance(s["Action"], list) else [s["Action"]]
        assert "*" not in actions and "iam:*" not in actions, s
        if any(a.startswith("iam:") and a not in ("iam:CreateServiceLinkedRole",) for a in actions) and not any(
            "OpenIDConnectProvider" in a for a in actions
        ):
            resource = json.dumps(s["Resource"])
            assert "ManagedRolePrefix" in resource, s
    [create] = [s for s in statements if "iam:CreateRole" in s["Action"]]
    assert create["Condition"]["StringEquals"]["iam:PermissionsBoundary"] == {"Ref": "ManagedRoleBoundary"}
    [teardown] = [s for s in statements if s.get("Sid") == "NetworkTeardownOfWhatHypdMade"]
    assert teardown["Condition"]["StringEquals"] == {"aws:ResourceTag/hypd:managed": "true"}


def aws(moto, service):
    return boto3.client(
        service,
        endpoint_url=moto,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


def deploy(moto, name, extra=()):
    cfn = aws(moto, "cloudformation")
    params = [{"ParameterKey": "ImageUri", "ParameterValue": "public.ecr.aws/hypd/hypd:0.1.0"}, *extra]
    cfn.create_stack(
        StackName=name,
        TemplateBody=TEMPLATE.read_text(),
        Parameters=params,
        Capabilities=["CAPABILITY_IAM"],
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        stack = cfn.describe_stacks(StackName=name)["Stacks"][0]
        if not stack["StackStatus"].endswith("IN_PROGRESS"):
            break
        time.sleep(0.5)
    assert stack["StackStatus"] == "CREATE_COMPLETE", stack
    summaries = cfn.list_stack_resources(StackName=name)["StackResourceSummaries"]
    resources = {r["LogicalResourceId"]: r["PhysicalResourceId"] for r in summaries}
    outputs = {o["OutputKey"]: o["OutputValue"] for o in stack.get("Outputs", [])}
    return resources, outputs


def rendered_bucket_policy(bucket):
    """The template's bucket policy with the bucket's ARN substituted."""
    document = template()["Resources"]["SharedBucketPolicy"]["Properties"]["PolicyDocument"]
    arn = f"arn:aws:s3:::{bucket}"

    def resolve(v):
        if isinstance(v, dict):
            if "Fn::GetAtt" in v:
                assert list(v["Fn::GetAtt"]) == ["SharedBucket", "Arn"], v
                return arn
            if "Fn::Sub" in v:
                return v["Fn::Sub"].replace("${SharedBucket.Arn}", arn)
            return {k: resolve(x) for k, x in v.items()}
        if isinstance(v, list):
            return [resolve(x) for x in v]
        return v

    return resolve(document)


def assert_no_inbound(moto, group_id):
    [group] = aws(moto, "ec2").describe_security_groups(GroupIds=[group_id])["SecurityGroups"]
    assert group["IpPermissions"] == [], group["IpPermissions"]
    return group


def test_deploys_into_moto_safely(moto):
    resources, outputs = deploy(moto, "hypd-mgmt")

    bucket = resources["SharedBucket"]
    s3 = aws(moto, "s3")
    # moto's CloudFormation completes AWS::S3::BucketPolicy without applying it, so the
    # template's own policy document is rendered and applied here, then read back.
    if "SharedBucketPolicy" not in resources or not resources["SharedBucketPolicy"]:
        s3.put_bucket_policy(Bucket=bucket, Policy=json.dumps(rendered_bucket_policy(bucket)))
    policy = json.loads(s3.get_bucket_policy(Bucket=bucket)["Policy"])
    [deny] = [s for s in policy["Statement"] if s["Effect"] == "Deny"]
    assert deny["Condition"]["Bool"]["aws:SecureTransport"] == "false"
    assert deny["Action"] == "s3:*"

    iam = aws(moto, "iam")
    role = iam.get_role(RoleName=resources["InstanceRole"])["Role"]
    trust = role["AssumeRolePolicyDocument"]
    if isinstance(trust, str):
        trust = json.loads(trust)
    assert [s["Principal"] for s in trust["Statement"]] == [{"Service": "ec2.amazonaws.com"}]
    profile = iam.get_instance_profile(InstanceProfileName=resources["InstanceProfile"])["InstanceProfile"]
    assert [r["RoleName"] for r in profile["Roles"]] == [role["RoleName"]]

    group = assert_no_inbound(moto, resources["SecurityGroup"])
    assert group["VpcId"] == resources["Vpc"]

    ec2 = aws(moto, "ec2")
    template = ec2.describe_launch_template_versions(LaunchTemplateId=resources["LaunchTemplate"])
    data = template["LaunchTemplateVersions"][0]["LaunchTemplateData"]
    assert data["MetadataOptions"]["HttpTokens"] == "required"
    assert all(b["Ebs"]["Encrypted"] for b in data["BlockDeviceMappings"])

    image = aws(moto, "ssm").get_parameter(Name="/hypd-mgmt/hypd/image")["Parameter"]["Value"]
    assert image == "public.ecr.aws/hypd/hypd:0.1.0", "the service reads its image from this parameter"

    instance_id = resources["Instance"]
    assert outputs["ConsoleTunnelCommand"] == (
        f"aws ssm start-session --region us-east-1 --target {instance_id} "
        "--document-name AWS-StartPortForwardingSession --parameters portNumber=3099,localPortNumber=3099"
    )
    assert "/var/lib/hypd/admin-token" in outputs["AdminTokenCommand"]


def test_deploys_into_an_existing_subnet(moto):
    ec2 = aws(moto, "ec2")
    vpc = ec2.create_vpc(CidrBlock="10.77.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.77.1.0/24")["Subnet"]["SubnetId"]
    resources, _ = deploy(
        moto,
        "hypd-mgmt-existing",
        [
            {"ParameterKey": "SubnetId", "ParameterValue": subnet},
            {"ParameterKey": "VpcId", "ParameterValue": vpc},
        ],
    )
    assert "Vpc" not in resources
    group = assert_no_inbound(moto, resources["SecurityGroup"])
    assert group["VpcId"] == vpc
    [instance] = ec2.describe_instances(InstanceIds=[resources["Instance"]])["Reservations"][0]["Instances"]
    assert instance["SubnetId"] == subnet
