"""What idle MCP subscribers cost hypd: a sandbox hypd (HYPD_BIN) against moto and
hypd-sim, one imported cluster `subs`, then --subscribers MCP sessions (2025-11-25, as
the conformance suite and Kiro speak it) that each subscribe to hypd://clusters/subs and
open their notification stream (GET /mcp) over a raw socket they never read from: a
client that stopped reading. Then --changes reconciles of the cluster, each an operation
on it, so each is an update every subscriber is sent. Prints hypd's memory (VmRSS and
VmHWM, from /proc/<pid>/status) before the sessions, once they are open, after the
changes and after a rest, as a table and one line of JSON. Nothing is asserted: the
figure is for the issue's note.

    ~/.cache/hypd/venv/bin/python end2end/py/bench_subscribers.py [--subscribers 100] [--changes 200]
"""

import argparse
import json
import socket
import sys
import tempfile
import time
from pathlib import Path

import httpx

from bench_nodes import memory, start_hypd, start_moto, start_sim, stop

CLUSTER = "subs"
PROTOCOL = "2025-11-25"


def rest(api, doc, operation_id, args):
    """`operation_id` through REST as the OpenAPI document routes it (path parameters
    from `args`, the rest the body); a destructive one confirmed."""
    for path, methods in doc["paths"].items():
        for method, op in methods.items():
            if op.get("operationId") != operation_id:
                continue
            body = dict(args)
            for p in op.get("parameters", []):
                if p["in"] == "path":
                    path = path.replace("{" + p["name"] + "}", str(body.pop(p["name"])))
            r = api.request(method.upper(), path, json=body if method != "get" else None)
            r.raise_for_status()
            return r.json()
    raise KeyError(operation_id)


def wait_done(api, operation_id):
    while True:
        op = api.get(f"/api/v1/operations/{operation_id}/wait", params={"timeout_seconds": 60}).json()["operation"]
        if op["state"] in ("succeeded", "failed", "cancelled"):
            return op


def sse_json(text):
    """The first JSON-RPC message of an answer that may be an event stream."""
    for line in text.splitlines():
        if line.startswith("data:") and line[5:].strip():
            return json.loads(line[5:])
    return json.loads(text)


def open_subscriber(url, token):
    """One session subscribed to the cluster, its notification stream opened on a socket
    nobody reads. Returns the socket (kept open)."""
    headers = {"Authorization": f"Bearer {token}", "Accept": "application/json, text/event-stream"}
    with httpx.Client(base_url=url, headers=headers, timeout=30) as c:
        init = c.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": PROTOCOL, "capabilities": {}, "clientInfo": {"name": "bench", "version": "1"}}})
        init.raise_for_status()
        session = init.headers["mcp-session-id"]
        headers = {"Mcp-Session-Id": session, "MCP-Protocol-Version": PROTOCOL}
        c.post("/mcp", headers=headers, json={"jsonrpc": "2.0", "method": "notifications/initialized"}).raise_for_status()
        answer = sse_json(c.post("/mcp", headers=headers, json={
            "jsonrpc": "2.0", "id": 2, "method": "resources/subscribe", "params": {"uri": f"hypd://clusters/{CLUSTER}"}}).text)
        if "error" in answer:
            raise RuntimeError(f"subscribe refused: {answer}")
    host, port = url.removeprefix("http://").split(":")
    s = socket.socket()
    # Smallest receive buffer the kernel allows, set before connecting (it bounds the
    # window): the stream backs up into hypd as soon as it can.
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
    s.connect((host, int(port)))
    s.sendall(
        (f"GET /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAccept: text/event-stream\r\n"
         f"Authorization: Bearer {token}\r\nMcp-Session-Id: {session}\r\nMCP-Protocol-Version: {PROTOCOL}\r\n\r\n").encode()
    )
    return s


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--subscribers", type=int, default=100)
    ap.add_argument("--changes", type=int, default=200, help="reconciles of the cluster, each an update to every subscriber")
    ap.add_argument("--rest-seconds", type=int, default=20, help="pause after the changes before the last reading")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="hypd-bench-subs-"))
    (work / "site").mkdir()
    moto = sim = hypd = None
    sockets = []
    try:
        moto, moto_url = start_moto()
        sim, sim_url = start_sim(600)
        hypd, url = start_hypd(work, moto_url, sim_url, work / "site")
        token = (work / "admin-token").read_text().strip()
        httpx.post(f"{sim_url}/clusters", json={
            "name": CLUSTER, "roleArn": "arn:aws:iam::123456789012:role/eks-cluster",
            "resourcesVpcConfig": {"subnetIds": ["subnet-0a", "subnet-0b"]},
            "accessConfig": {"authenticationMode": "API"}}).raise_for_status()
        at = {}
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=120) as api:
            doc = api.get("/api/v1/openapi.json").json()
            wait_done(api, rest(api, doc, "import_cluster", {"name": CLUSTER})["operation_id"])
            time.sleep(2)
            at["no subscriber"] = memory(hypd.pid)
            for _ in range(args.subscribers):
                sockets.append(open_subscriber(url, token))
            time.sleep(2)
            at[f"{args.subscribers} idle subscribers"] = memory(hypd.pid)
            t0 = time.monotonic()
            for _ in range(args.changes):
                wait_done(api, rest(api, doc, "reconcile_cluster", {"name": CLUSTER})["operation_id"])
            changes_seconds = time.monotonic() - t0
            at[f"after {args.changes} changes"] = memory(hypd.pid)
            time.sleep(args.rest_seconds)
            at[f"{args.rest_seconds} s later"] = memory(hypd.pid)
        print(f"{'when':<32} {'VmRSS MiB':>10} {'VmHWM MiB':>10}")
        for when, m in at.items():
            print(f"{when:<32} {m['VmRSS']:>10.1f} {m['VmHWM']:>10.1f}")
        print(json.dumps({"subscribers": args.subscribers, "changes": args.changes,
                          "changes_seconds": round(changes_seconds, 1), "memory_mib": at}))
    finally:
        for s in sockets:
            s.close()
        for p in (hypd, sim, moto):
            stop(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
