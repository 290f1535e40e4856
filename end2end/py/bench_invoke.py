"""What `invoke_endpoint` adds to a chat completion: a hypd (HYPD_BIN) against moto and
hypd-sim, one cluster `bench` created through REST with one group of two
ml.g5.8xlarge, a vLLM model server of two replicas deployed through REST, then the same
chat completion sent by --callers concurrent callers (after a warm-up) two ways:
directly to the sim's model server through the cluster's API server
(`services/<endpoint>:8000/proxy/v1/chat/completions`, an EKS token, as kubectl would
reach it), and through hypd (`POST /api/v1/clusters/bench/endpoints/<endpoint>/invoke`,
which looks the endpoint up and goes through that same proxy). Prints p50/p90/p99/max
of both and their difference, a human table, then one line of JSON. Nothing is
asserted; answers that are not 200 are counted as problems.

    ~/.cache/hypd/venv/bin/python end2end/py/bench_invoke.py [--requests 400] [--callers 8]

Binaries: HYPD_BIN and HYPD_SIM_BIN, else hypd and hypd-sim in $CARGO_TARGET_DIR/debug.
"""

import argparse
import base64
import json
import ssl
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from bench_nodes import SIM, HYPD, create_cluster, percentile, start_hypd, start_moto, start_sim, stop
from conftest import eks_token

ENDPOINT = "bench-chat"
MESSAGES = [{"role": "user", "content": "What does SageMaker HyperPod recover from when a GPU fails?"}]


def operation(api, path, body):
    """Runs the operation `body` starts at `path` to its end; the finished operation."""
    r = api.post(path, json=body)
    if r.status_code != 200:
        raise RuntimeError(f"{path} answered {r.status_code}: {r.text[:500]}")
    op_id = r.json()["operation_id"]
    while True:
        w = api.get(f"/api/v1/operations/{op_id}/wait", params={"timeout_seconds": 60}, timeout=120).json()
        if not w["timed_out"]:
            op = w["operation"]
            if op["state"] != "succeeded":
                raise RuntimeError(f"{path}: {op['state']}: {json.dumps(op.get('error'))[:800]}")
            return op


def run(send, requests, callers, warmup):
    """`send()` `warmup` times in each of `callers` threads (each opens its connections
    then), then `requests` times from those threads: the latencies in ms, sorted, and
    the answers that were not 200."""
    latencies, problems = [], []
    lock = threading.Lock()
    left = iter(range(requests))

    def caller():
        for _ in range(warmup):
            send()
        while True:
            with lock:
                if next(left, None) is None:
                    return
            started = time.perf_counter()
            status = send()
            ms = (time.perf_counter() - started) * 1000
            with lock:
                latencies.append(ms)
                if status != 200:
                    problems.append(status)

    threads = [threading.Thread(target=caller) for _ in range(callers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sorted(latencies), problems


def per_thread(make):
    """A client per caller thread (its own connections, as separate callers have)."""
    local = threading.local()

    def get():
        if not hasattr(local, "client"):
            local.client = make()
        return local.client

    return get


def figures(ms):
    return {p: round(percentile(ms, p), 2) for p in (50, 90, 99)} | {"max": round(ms[-1], 2)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--callers", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=5, help="requests per caller before counting")
    args = parser.parse_args()
    print(f"hypd {HYPD}\nhypd-sim {SIM}", file=sys.stderr)
    procs = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        try:
            moto, moto_url = start_moto()
            procs.append(moto)
            sim, sim_url = start_sim(600)
            procs.append(sim)
            httpx.put(f"{sim_url}/_sim/sagemaker/quotas", json={"ml.g5.8xlarge": 10}).raise_for_status()
            hypd, url = start_hypd(work, moto_url, sim_url, work)
            procs.append(hypd)
            token = (work / "admin-token").read_text().strip()
            api = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=120)
            create_cluster(api, sim_url, 1, 2, 600)
            key = "models/qwen/config.json"
            api.post("/api/v1/clusters/bench/storage/shared-s3/files",
                     json={"key": key, "content_base64": base64.b64encode(b"{}").decode()}).raise_for_status()
            operation(api, "/api/v1/clusters/bench/endpoints", {
                "endpoint": ENDPOINT, "engine": "vllm", "replicas": 2,
                "command": "vllm serve /s3/models/qwen --served-model-name qwen"})

            import boto3

            eks = boto3.client("eks", endpoint_url=sim_url, region_name="us-east-1",
                               aws_access_key_id="testing", aws_secret_access_key="testing")
            cluster = eks.describe_cluster(name="bench")["cluster"]
            ca = work / "ca.pem"
            ca.write_bytes(base64.b64decode(cluster["certificateAuthority"]["data"]))
            direct_path = f"/api/v1/namespaces/default/services/{ENDPOINT}:8000/proxy/v1/chat/completions"
            direct_body = {"model": "qwen", "messages": MESSAGES}
            via_path = f"/api/v1/clusters/bench/endpoints/{ENDPOINT}/invoke"
            via_body = {"messages": MESSAGES}
            verify = ssl.create_default_context(cafile=str(ca))
            kube_client = per_thread(lambda: httpx.Client(
                base_url=cluster["endpoint"], verify=verify, timeout=60,
                headers={"Authorization": f"Bearer {eks_token('bench')}"}))
            hypd_client = per_thread(lambda: httpx.Client(
                base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60))
            direct = run(lambda: kube_client().post(direct_path, json=direct_body).status_code,
                         args.requests, args.callers, args.warmup)
            via = run(lambda: hypd_client().post(via_path, json=via_body).status_code,
                      args.requests, args.callers, args.warmup)
        finally:
            for p in reversed(procs):
                stop(p)
    d, v = figures(direct[0]), figures(via[0])
    added = {k: round(v[k] - d[k], 2) for k in d}
    print(f"{args.requests} chat completions from {args.callers} callers, ms")
    print(f"  {'':<28}{'p50':>8}{'p90':>8}{'p99':>8}{'max':>8}")
    for name, f in (("direct (API server proxy)", d), ("through hypd", v), ("added by hypd", added)):
        print(f"  {name:<28}{f[50]:>8}{f[90]:>8}{f[99]:>8}{f['max']:>8}")
    print(f"  problems: direct {direct[1][:5]}, through hypd {via[1][:5]}")
    print(json.dumps({"requests": args.requests, "callers": args.callers, "direct_ms": d, "hypd_ms": v,
                      "added_ms": added, "problems": {"direct": len(direct[1]), "hypd": len(via[1])}}))


if __name__ == "__main__":
    main()
