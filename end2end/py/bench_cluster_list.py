"""How `GET /api/v1/clusters` scales with the clusters stored: a hypd (HYPD_BIN, a
release build for real figures) against moto, with 1 and then 100 cluster rows written
into its store, measured with wrk (8 connections, 2 threads). With --callgrind the hypd
runs under valgrind's callgrind instead and serves a fixed number of requests, for a
profile of where the per-request cost goes (`callgrind_annotate` the output file).

    python end2end/py/bench_cluster_list.py [--seconds 10] [--callgrind OUT] [--requests N]
"""

import argparse
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from conftest import HYPD, free_port, wait_port


def start(binary, data_dir, moto_url, wrapper=()):
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(data_dir),
        "HYPD_DATA_DIR": str(data_dir),
        "HYPD_PORT": "0",
        "HYPD_LOG": "warn",
        "HYPD_RATE_LIMIT": "0",
        "HYPD_SITE_ROOT": str(data_dir / "site"),
        "AWS_ENDPOINT_URL": moto_url,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_REGION": "us-east-1",
        "AWS_CONFIG_FILE": "/dev/null",
        "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    proc = subprocess.Popen([*wrapper, str(binary), "serve"], env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    for line in proc.stdout:
        m = re.search(r"hypd listening on (http://\S+)", line)
        if m:
            return proc, m.group(1)
    raise RuntimeError("hypd did not start")


def set_clusters(db, n):
    c = sqlite3.connect(db)
    c.execute("DELETE FROM clusters")
    now = "2026-01-01T00:00:00.000Z"
    c.executemany(
        "INSERT INTO clusters (name, region, status, kubernetes_version, eks_cluster_arn, hyperpod_cluster_arn, created_at, updated_at, "
        "nodes_total, nodes_healthy, nodes_pending, nodes_unhealthy, nodes_observed_at) VALUES (?, 'us-east-1', 'active', '1.33', ?, ?, ?, ?, 4, 4, 0, 0, ?)",
        [
            (
                f"ml-{i:03}",
                f"arn:aws:eks:us-east-1:123456789012:cluster/ml-{i:03}",
                f"arn:aws:sagemaker:us-east-1:123456789012:cluster/abcdef{i:06}",
                now,
                now,
                now,
            )
            for i in range(n)
        ],
    )
    # As hypd's own writes do: the cached list is served while the revision stands.
    c.execute("UPDATE revisions SET revision = revision + 1 WHERE name = 'clusters'")
    c.commit()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=int, default=10)
    ap.add_argument("--callgrind", help="write a callgrind profile of 100 clusters here")
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--counts", default="1,100")
    ap.add_argument("--gzip", action="store_true", help="ask for gzip, as browsers do")
    args = ap.parse_args()
    binary = Path(os.environ.get("HYPD_BIN", HYPD))
    work = Path(tempfile.mkdtemp(prefix="hypd-bench-"))
    (work / "site").mkdir()
    moto_port = free_port()
    moto = subprocess.Popen(
        [shutil.which("moto_server") or "moto_server", "-H", "127.0.0.1", "-p", str(moto_port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_port(moto_port)
    wrapper = ()
    if args.callgrind:
        wrapper = ("valgrind", "--tool=callgrind", f"--callgrind-out-file={args.callgrind}", "--instr-atstart=no")
    hypd, url = start(binary, work, f"http://127.0.0.1:{moto_port}", wrapper)
    try:
        token = (work / "admin-token").read_text().strip()
        # As wrk sends them: no Accept-Encoding, so no compression (--gzip asks for it).
        headers = {"Authorization": f"Bearer {token}", "Accept-Encoding": "gzip" if args.gzip else "identity"}
        with httpx.Client(base_url=url, headers=headers, timeout=120) as c:
            for n in [int(x) for x in args.counts.split(",")]:
                set_clusters(work / "hypd.db", n)
                body = c.get("/api/v1/clusters")
                assert body.status_code == 200 and len(body.json()["clusters"]) == n, body.text[:200]
                if args.callgrind:
                    for _ in range(20):
                        c.get("/api/v1/clusters")
                    subprocess.run(["callgrind_control", "-i", "on", str(hypd.pid)], check=True, capture_output=True)
                    t = time.monotonic()
                    for _ in range(args.requests):
                        c.get("/api/v1/clusters")
                    subprocess.run(["callgrind_control", "-i", "off", str(hypd.pid)], check=True, capture_output=True)
                    print(f"{n} clusters: {args.requests} requests profiled in {time.monotonic() - t:.1f} s ({len(body.content)} bytes each)")
                    continue
                gzip = ["-H", "Accept-Encoding: gzip"] if args.gzip else []
                run = subprocess.run(
                    ["wrk", "-t2", "-c8", f"-d{args.seconds}s", "-H", f"Authorization: Bearer {token}", *gzip, f"{url}/api/v1/clusters"],
                    capture_output=True,
                    text=True,
                )
                rate = re.search(r"Requests/sec:\s+([\d.]+)", run.stdout)
                latency = re.search(r"Latency\s+(\S+)", run.stdout)
                print(f"{n:>4} clusters: {rate.group(1) if rate else '?'} req/s, mean latency {latency.group(1) if latency else '?'}, {len(body.content)} bytes per answer")
    finally:
        hypd.terminate()
        hypd.wait()
        moto.terminate()
        moto.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
