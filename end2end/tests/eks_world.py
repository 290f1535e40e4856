"""Builds, in the sandbox's moto and sim, what an existing EKS cluster needs (a VPC with
subnets in two zones, a cluster role) and the ACTIVE cluster itself, so the console can
import it. Prints the cluster's facts as JSON.

Usage: eks_world.py MOTO_URL SIM_URL NAME [active|creating]
  active    wait until the cluster is ACTIVE (the sim's clock runs 2000x)
  creating  the cluster stays CREATING until the printed `fault` is deleted from the sim
            (DELETE /_sim/faults/<id>); then it is ACTIVE at once"""

import json
import sys
import time
import urllib.request

import boto3

moto_url, sim_url, name = sys.argv[1:4]
mode = sys.argv[4] if len(sys.argv) > 4 else "active"
region = "us-east-1"
creds = dict(aws_access_key_id="testing", aws_secret_access_key="testing", region_name=region)

ec2 = boto3.client("ec2", endpoint_url=moto_url, **creds)
iam = boto3.client("iam", endpoint_url=moto_url, **creds)
eks = boto3.client("eks", endpoint_url=sim_url, **creds)

vpc = ec2.create_vpc(CidrBlock="10.42.0.0/16")["Vpc"]["VpcId"]
subnets = [
    ec2.create_subnet(VpcId=vpc, CidrBlock=f"10.42.{i}.0/24", AvailabilityZone=f"{region}{az}")[
        "Subnet"
    ]["SubnetId"]
    for i, az in enumerate("ab")
]
trust = {
    "Version": "2012-10-17",
    "Statement": [
        {"Effect": "Allow", "Principal": {"Service": "eks.amazonaws.com"}, "Action": "sts:AssumeRole"}
    ],
}
role = iam.create_role(RoleName=f"{name}-cluster", AssumeRolePolicyDocument=json.dumps(trust))[
    "Role"
]["Arn"]


def sim(method, path, body):
    req = urllib.request.Request(
        f"{sim_url}{path}",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json"},
        method=method,
    )
    with urllib.request.urlopen(req) as r:
        return json.loads(r.read())


# The sim's clock runs fast for the test: a 10-minute creation takes 0.3 s.
sim("PUT", "/_sim/clock", {"time_scale": 2000})
# A test that watches hypd wait holds the cluster in CREATING for as long as it likes.
fault = None
if mode == "creating":
    fault = sim("POST", "/_sim/faults", {"service": "eks", "operation": "CreateCluster", "kind": "stuck"})["id"]

eks.create_cluster(
    name=name,
    roleArn=role,
    resourcesVpcConfig={"subnetIds": subnets},
    accessConfig={"authenticationMode": "API_AND_CONFIG_MAP"},
)
deadline = time.monotonic() + 60
while mode == "active":
    cluster = eks.describe_cluster(name=name)["cluster"]
    if cluster["status"] == "ACTIVE":
        break
    if time.monotonic() > deadline:
        raise SystemExit(f"EKS cluster {name} is still {cluster['status']}")
    time.sleep(0.2)
cluster = eks.describe_cluster(name=name)["cluster"]
print(
    json.dumps(
        {"name": name, "arn": cluster["arn"], "status": cluster["status"], "vpc": vpc, "fault": fault}
    )
)
