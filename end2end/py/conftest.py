"""Real peers for the black-box tests: moto for AWS and a `hypd serve` process, both on
loopback, started per test module and stopped after it."""

import os
import re
import shutil
import socket
import subprocess
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
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
def sim():
    """hypd-sim for EKS and SageMaker, 600x faster than AWS; it does not check names
    against moto, so tests can create EKS clusters with made-up subnets."""
    proc = subprocess.Popen(
        [str(SIM), "--listen", "127.0.0.1:0", "--time-scale", "600"],
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
        "AWS_ENDPOINT_URL": moto,
        "AWS_ENDPOINT_URL_EKS": sim,
        "AWS_ENDPOINT_URL_SAGEMAKER": sim,
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
