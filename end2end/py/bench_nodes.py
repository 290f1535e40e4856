"""What a cluster of 1,000 HyperPod nodes costs hypd: a hypd (HYPD_BIN, a release build
for real figures) against moto and hypd-sim (a fast clock), one cluster `bench` created
through REST with two instance groups of 500 ml.g5.8xlarge, then requests (sequential, or from --callers concurrent callers),
after a warm-up, to the node list (the default page of 100, a page of 500, a filtered
page) and to the cluster page's server render, signed in as the console is (a session
cookie from POST /auth/login). Prints p50/p90/p99/max per endpoint and hypd's memory
(VmRSS, VmHWM from /proc/<pid>/status) before the cluster exists, after its creation,
during and after the requests; a human table, then one line of JSON. Nothing here is
asserted: answers that are not 200 or not the size they should be are listed as problems,
and a per-endpoint time budget (--budget-seconds) keeps a slow world from running for hours.
Each endpoint also gets the CPU time hypd and hypd-sim spent per request: hypd-sim
answers every call under the world's one lock, which its Kubernetes controllers also take
(at most a fifth of the time), so a 1,000-node request partly waits for the sim; hypd's
own share is the "hypd cpu" column. A release hypd-sim (HYPD_SIM_BIN) makes that wait
small.

    ~/.cache/hypd/venv/bin/python end2end/py/bench_nodes.py [--requests 200] [--warmup 10]

Binaries: HYPD_BIN and HYPD_SIM_BIN, else hypd and hypd-sim in $CARGO_TARGET_DIR/debug
(default ~/.cache/hypd-target/debug).
"""

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from conftest import free_port, wait_port

TARGET = Path(os.environ.get("CARGO_TARGET_DIR") or Path.home() / ".cache" / "hypd-target")
HYPD = Path(os.environ.get("HYPD_BIN", TARGET / "debug" / "hypd"))
SIM = Path(os.environ.get("HYPD_SIM_BIN", TARGET / "debug" / "hypd-sim"))
CLUSTER = "bench"
INSTANCE_TYPE = "ml.g5.8xlarge"


def tool(name):
    """A console script of this virtualenv (run with its python, not activated), else PATH."""
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.exists() else (shutil.which(name) or name)


def drain(stream):
    """Reads a child's pipe to its end so a chatty child never blocks on a full pipe."""
    threading.Thread(target=lambda: [None for _ in stream], daemon=True).start()


def start_moto():
    port = free_port()
    proc = subprocess.Popen(
        [tool("moto_server"), "-H", "127.0.0.1", "-p", str(port)],
        env={**os.environ, "MOTO_IAM_LOAD_MANAGED_POLICIES": "true"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_port(port)
    return proc, f"http://127.0.0.1:{port}"


def start_sim(time_scale):
    proc = subprocess.Popen(
        [str(SIM), "--listen", "127.0.0.1:0", "--time-scale", str(time_scale)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    line = proc.stdout.readline()
    m = re.search(r"listening on (http://\S+)", line)
    if not m:
        raise RuntimeError(f"hypd-sim did not start: {line!r}")
    drain(proc.stdout)
    return proc, m.group(1)


def start_hypd(work, moto_url, sim_url, site_root):
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(work),
        "HYPD_DATA_DIR": str(work),
        "HYPD_PORT": "0",
        # Warnings, and hypd's own lifecycle lines (a shutdown signal, for one).
        "HYPD_LOG": "warn,hypd::http=info",
        # Sequential requests from one token, faster than anyone: no per-token limit.
        "HYPD_RATE_LIMIT": "0",
        "HYPD_SITE_ROOT": str(site_root),
        "AWS_ENDPOINT_URL": moto_url,
        "AWS_ENDPOINT_URL_EKS": sim_url,
        "AWS_ENDPOINT_URL_SAGEMAKER": sim_url,
        "AWS_ENDPOINT_URL_SERVICE_QUOTAS": sim_url,
        "AWS_ENDPOINT_URL_FSX": sim_url,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_REGION": "us-east-1",
        "AWS_CONFIG_FILE": "/dev/null",
        "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    log = open(work / "hypd.log", "w")
    proc = subprocess.Popen([str(HYPD), "serve"], env=env, stdout=subprocess.PIPE, stderr=log, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        m = re.search(r"hypd listening on (http://\S+)", line)
        if m:
            drain(proc.stdout)
            return proc, m.group(1)
    proc.kill()
    proc.wait()
    raise RuntimeError(f"hypd did not start; its log:\n{tail(work / 'hypd.log')}")


def stop(proc):
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def tail(path, lines=30):
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def memory(pid):
    """VmRSS and VmHWM of a process, in MiB (None once it has exited)."""
    out = {"VmRSS": None, "VmHWM": None}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in out:
                    out[key] = int(value.split()[0]) / 1024  # kB (KiB) → MiB
    except OSError:
        pass
    return out


def exited(proc):
    """How a child ended, or None while it runs."""
    code = proc.poll()
    if code is None:
        # Its main thread has gone (a zombie leader) while other threads finish.
        return "exiting" if memory(proc.pid)["VmRSS"] is None else None
    return f"killed by signal {-code}" if code < 0 else f"exited with code {code}"


class Sampler:
    """Samples VmRSS every `interval` seconds in a thread; the peak it saw while running."""

    def __init__(self, pid, interval=0.02):
        self.pid, self.interval = pid, interval
        self.peak = 0.0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            rss = memory(self.pid)["VmRSS"]
            if rss is None:
                return
            self.peak = max(self.peak, rss)
            self.samples += 1
            self._stop.wait(self.interval)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *_):
        self._stop.set()
        self._thread.join()


def percentile(sorted_ms, p):
    """Nearest rank: the smallest value with at least p% of the values at or below it."""
    rank = max(1, -(-len(sorted_ms) * p // 100))
    return sorted_ms[int(rank) - 1]


def create_cluster(api, sim_url, groups, per_group, timeout):
    total = groups * per_group
    httpx.put(f"{sim_url}/_sim/sagemaker/quotas", json={INSTANCE_TYPE: total + 200}).raise_for_status()
    request = {
        "name": CLUSTER,
        "availability_zone": "us-east-1a",
        "instance_groups": [
            {"name": chr(ord("a") + i), "instance_type": INSTANCE_TYPE, "instance_count": per_group} for i in range(groups)
        ],
    }
    started = time.monotonic()
    r = api.post("/api/v1/clusters", json=request)
    if r.status_code != 200:
        raise RuntimeError(f"create_cluster answered {r.status_code}: {r.text[:500]}")
    op_id = r.json()["operation_id"]
    while True:
        w = api.get(f"/api/v1/operations/{op_id}/wait", params={"timeout_seconds": 60}, timeout=120)
        if w.status_code != 200:
            raise RuntimeError(f"wait_operation answered {w.status_code}: {w.text[:500]}")
        body = w.json()
        op = body["operation"]
        if not body["timed_out"]:
            break
        current = next((s for s in op["stages"] if s["state"] != "succeeded"), None)
        note = f"{current['name']}: {current.get('message') or current['state']}" if current else op["state"]
        print(f"  ... {time.monotonic() - started:.0f} s, {note}", file=sys.stderr)
        if time.monotonic() - started > timeout:
            raise RuntimeError(f"create_cluster still {op['state']} after {timeout} s ({note})")
    seconds = time.monotonic() - started
    if op["state"] != "succeeded":
        failed = [s for s in op["stages"] if s["state"] == "failed"]
        raise RuntimeError(f"create_cluster {op['state']} after {seconds:.0f} s: {json.dumps(failed or op.get('error'))[:1500]}")
    return op, seconds


def stage_seconds(op):
    """How long each stage of an operation took, from its stored times."""
    from datetime import datetime

    at = lambda t: datetime.fromisoformat(t.replace("Z", "+00:00"))  # noqa: E731
    return {
        s["name"]: round((at(s["finished_at"]) - at(s["started_at"])).total_seconds(), 1)
        for s in op["stages"]
        if s.get("started_at") and s.get("finished_at")
    }


def check_nodes(expect_total, expect_page):
    def check(r):
        body = r.json()
        got_total, got_page = body["counts"]["total"], len(body["nodes"])
        if (got_total, got_page) != (expect_total, expect_page):
            return f"counts.total {got_total} (expected {expect_total}), {got_page} nodes on the page (expected {expect_page})"
        return None

    return check


def check_page(expect_rows, expect_total):
    def check(r):
        html = r.text
        rows = html.count("data-node=")
        # The Nodes panel's count line (the page streams, so attributes come in any order).
        tags = [t for t in re.findall(r"<p [^>]*>", html) if "node-page-counts" in t]
        m = re.search(r'data-total="(\d+)"', tags[0]) if tags else None
        total = int(m.group(1)) if m else None
        if rows != expect_rows or total != expect_total:
            return f"{rows} node rows (expected {expect_rows}), node total {total} (expected {expect_total})"
        return None

    return check


def cpu_seconds(pid):
    """User + system CPU time a process has used so far (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def get(client, path):
    """One GET: (milliseconds, status or "timeout"/"error", response or None)."""
    t = time.perf_counter()
    try:
        r = client.get(path)
    except httpx.TimeoutException:
        return (time.perf_counter() - t) * 1000, "timeout", None
    except httpx.HTTPError as e:
        # e.g. RemoteProtocolError: the connection closed before the whole body came.
        return (time.perf_counter() - t) * 1000, f"error: {type(e).__name__} ({str(e)[:80]})", None
    return (time.perf_counter() - t) * 1000, r.status_code, r


def measure(client, path, check, requests, warmup, budget, hypd, sim, interrupted, callers=1):
    """A first request (checked), a warm-up, then up to `requests` GETs from `callers`
    concurrent callers (each sends its next request when its last is answered), all
    within `budget` seconds (0: no limit): latencies, statuses, CPU and memory. A signal
    during the measured requests ends them (noted in `interrupted`) with what was measured."""
    hypd_pid, sim_pid = hypd.pid, sim.pid
    problems = []
    began = time.monotonic()
    left = lambda share: not budget or time.monotonic() - began < budget * share  # noqa: E731
    first_ms, status, first = get(client, path)
    result = {"path": path, "first_ms": round(first_ms, 2), "bytes": len(first.content) if first else None}
    if status != 200:
        problems.append(f"first answer {status} after {first_ms / 1000:.1f} s: {first.text[:300] if first else ''}")
        if first is None or exited(hypd) or exited(sim):
            # A world that cannot answer once in the timeout will not answer 200 times.
            return {**result, "requests": 0, "warmup": 0, "statuses": {str(status): 1}, "problems": problems}
    else:
        wrong = check(first)
        if wrong:
            problems.append(wrong)
    warmed = 0
    while warmed < warmup and left(0.25) and not exited(hypd):
        get(client, path)
        warmed += 1
    times, statuses = [], {}
    cpu_hypd, cpu_sim = cpu_seconds(hypd_pid), cpu_seconds(sim_pid)
    run_began = time.monotonic()
    lock = threading.Lock()
    started = [0]

    def caller():
        """Sends requests until the run has its count (taken before sending, so
        `callers` threads never send more than `requests` between them)."""
        while not interrupted and not exited(hypd) and not exited(sim):
            with lock:
                if started[0] >= requests or not (left(1.0) or not times):
                    return
                started[0] += 1
            ms, status, _ = get(client, path)
            with lock:
                times.append(ms)
                statuses[status] = statuses.get(status, 0) + 1

    with Sampler(hypd_pid) as sampler:
        threads = [threading.Thread(target=caller, daemon=True) for _ in range(callers)]
        try:
            for t in threads:
                t.start()
            for t in threads:
                # Joined with a timeout, so a signal reaches this (main) thread.
                while t.is_alive():
                    t.join(0.2)
        except Interrupted as e:
            interrupted.append(f"interrupted by {e}")
            problems.append(f"interrupted by {e} after {len(times)} measured requests")
            for t in threads:
                t.join()
    wall = time.monotonic() - run_began
    cpu_hypd, cpu_sim = cpu_seconds(hypd_pid) - cpu_hypd, cpu_seconds(sim_pid) - cpu_sim
    after = memory(hypd_pid)
    for name, proc in (("hypd", hypd), ("hypd-sim", sim)):
        if exited(proc):
            problems.append(f"{name} {exited(proc)} during the run")
    if not times:
        return {**result, "requests": 0, "warmup": warmed, "statuses": {}, "problems": problems}
    if (warmed < warmup or len(times) < requests) and not (exited(hypd) or exited(sim) or interrupted):
        problems.append(f"time budget of {budget} s spent: {warmed} warm-up and {len(times)} measured requests of {warmup} + {requests}")
    bad = {k: v for k, v in statuses.items() if k != 200}
    if bad:
        problems.append(f"answers other than 200 during the run: {bad}")
    times.sort()
    n = len(times)
    return {
        **result,
        "requests": n,
        "warmup": warmed,
        "statuses": {str(k): v for k, v in statuses.items()},
        "p50_ms": round(percentile(times, 50), 2),
        "p90_ms": round(percentile(times, 90), 2),
        "p99_ms": round(percentile(times, 99), 2),
        "max_ms": round(times[-1], 2),
        "min_ms": round(times[0], 2),
        "mean_ms": round(sum(times) / n, 2),
        "wall_s": round(wall, 2),
        # CPU per measured request: hypd's own work, and the sim's (which answers the
        # ListClusterNodes pages and the Kubernetes lists, and runs its controllers).
        "hypd_cpu_ms_per_request": round(cpu_hypd * 1000 / n, 2),
        "sim_cpu_ms_per_request": round(cpu_sim * 1000 / n, 2),
        "rss_peak_during_mib": round(sampler.peak, 1),
        "rss_samples": sampler.samples,
        "rss_after_mib": after["VmRSS"] and round(after["VmRSS"], 1),
        "hwm_after_mib": after["VmHWM"] and round(after["VmHWM"], 1),
        "problems": problems,
    }


class Interrupted(Exception):
    """A signal asked this benchmark to stop."""


def main():
    ap = argparse.ArgumentParser(
        description="Latency of hypd's node list and cluster page, and hypd's memory, with one cluster of "
        "1,000 HyperPod nodes (moto + hypd-sim). Prints a table, then a JSON summary on the last line.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    ap.add_argument("--requests", "-n", type=int, default=200, help="measured requests per endpoint, from all callers")
    ap.add_argument("--callers", "-c", type=int, default=1, help="concurrent callers (1: sequential requests)")
    ap.add_argument("--warmup", type=int, default=10, help="unmeasured requests per endpoint before the measured ones")
    ap.add_argument("--groups", type=int, default=2, help="instance groups (named a, b, …)")
    ap.add_argument("--per-group", type=int, default=500, help="ml.g5.8xlarge nodes per instance group")
    ap.add_argument(
        "--budget-seconds",
        type=int,
        default=600,
        help="at most this long per endpoint (warm-up at most a quarter of it), whatever --requests says; 0: no limit",
    )
    ap.add_argument("--request-timeout", type=float, default=300, help="seconds one request may take")
    ap.add_argument("--time-scale", type=int, default=600, help="hypd-sim's simulated seconds per real second")
    ap.add_argument("--create-timeout", type=int, default=900, help="seconds to wait for the cluster's creation")
    ap.add_argument(
        "--page-auth",
        choices=["cookie", "bearer"],
        default="cookie",
        help="how the console page is asked for: the session cookie of POST /auth/login (as a browser), or the bearer token",
    )
    ap.add_argument("--gzip", action="store_true", help="ask for gzip, as browsers do (otherwise Accept-Encoding: identity)")
    ap.add_argument(
        "--site-root",
        default=os.environ.get("HYPD_SITE_ROOT"),
        help="the built console (default HYPD_SITE_ROOT, else an empty directory: pages render but would not hydrate)",
    )
    ap.add_argument("--json-out", help="also write the JSON summary to this file")
    args = ap.parse_args()

    for binary in (HYPD, SIM):
        if not binary.is_file():
            print(f"bench_nodes: {binary} is missing (build it, or set HYPD_BIN / HYPD_SIM_BIN)", file=sys.stderr)
            return 2

    # A signal ends the measuring with what was measured, then tears everything down.
    interrupted = []

    def on_signal(signum, _frame):
        raise Interrupted(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGHUP, on_signal)

    total = args.groups * args.per_group
    work = Path(tempfile.mkdtemp(prefix="hypd-bench-nodes-"))
    site_root = Path(args.site_root) if args.site_root else work / "site"
    if not args.site_root:
        site_root.mkdir()
    moto = sim = hypd = None
    failed = False
    try:
        moto, moto_url = start_moto()
        sim, sim_url = start_sim(args.time_scale)
        hypd, url = start_hypd(work, moto_url, sim_url, site_root)
        token = (work / "admin-token").read_text().strip()
        encoding = {"Accept-Encoding": "gzip" if args.gzip else "identity"}
        memory_at = {"started": memory(hypd.pid)}

        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}", **encoding}, timeout=args.request_timeout) as api:
            print(f"creating {CLUSTER}: {args.groups} groups x {args.per_group} {INSTANCE_TYPE} ({total} nodes)", file=sys.stderr)
            op, create_seconds = create_cluster(api, sim_url, args.groups, args.per_group, args.create_timeout)
            memory_at["created"] = memory(hypd.pid)

            if args.page_auth == "cookie":
                login = httpx.post(f"{url}/auth/login", json={"token": token})
                if login.status_code != 200:
                    raise RuntimeError(f"sign-in answered {login.status_code}: {login.text[:300]}")
                name, _, value = login.headers["set-cookie"].split(";")[0].partition("=")
                page_client = httpx.Client(base_url=url, headers=encoding, cookies={name: value}, timeout=args.request_timeout)
            else:
                page_client = api

            half = args.per_group  # group a's nodes; the sim's nodes are all healthy once Ready
            endpoints = [
                ("nodes (default page)", api, f"/api/v1/clusters/{CLUSTER}/nodes", check_nodes(total, min(100, total))),
                ("nodes?limit=500", api, f"/api/v1/clusters/{CLUSTER}/nodes?limit=500", check_nodes(total, min(500, total))),
                (
                    "nodes?health=healthy&group=a",
                    api,
                    f"/api/v1/clusters/{CLUSTER}/nodes?health=healthy&group=a",
                    check_nodes(half, min(100, half)),
                ),
                # The cluster page's tab with the node table.
                (
                    f"page /clusters/{CLUSTER}/nodes ({args.page_auth})",
                    page_client,
                    f"/clusters/{CLUSTER}/nodes",
                    check_page(min(100, total), total),
                ),
            ]
            results = {}
            try:
                for label, client, path, check in endpoints:
                    if interrupted:
                        results[label] = {"path": path, "requests": 0, "statuses": {}, "problems": [f"not measured: {interrupted[0]}"]}
                        continue
                    if exited(hypd) or exited(sim):
                        results[label] = {"path": path, "requests": 0, "statuses": {}, "problems": ["not measured: hypd or hypd-sim is gone"]}
                        continue
                    print(f"measuring {label}: {args.warmup} + {args.requests} requests", file=sys.stderr, flush=True)
                    try:
                        results[label] = measure(
                            client, path, check, args.requests, args.warmup, args.budget_seconds, hypd, sim, interrupted,
                            args.callers,
                        )
                    except Interrupted as e:
                        interrupted.append(f"interrupted by {e}")
                        results[label] = {"path": path, "requests": 0, "statuses": {}, "problems": [f"{interrupted[0]} before any measured request"]}
                        continue
                    r = results[label]
                    if r["requests"]:
                        print(f"  {r['requests']} requests: p50 {r['p50_ms']:.1f} ms, max {r['max_ms']:.1f} ms, {r['statuses']}", file=sys.stderr, flush=True)
            finally:
                if page_client is not api:
                    page_client.close()
            memory_at["after_requests"] = memory(hypd.pid)

        problems = [f"{label}: {p}" for label, r in results.items() for p in r["problems"]]
        peaks = [r["rss_peak_during_mib"] for r in results.values() if "rss_peak_during_mib" in r]
        summary = {
            "hypd": str(HYPD),
            "nodes": total,
            "groups": args.groups,
            "time_scale": args.time_scale,
            "create_operation": op["operation_id"],
            "create_seconds": round(create_seconds, 1),
            "create_stage_seconds": stage_seconds(op),
            "requests": args.requests,
            "callers": args.callers,
            "warmup": args.warmup,
            "gzip": args.gzip,
            "page_auth": args.page_auth,
            "cpus": os.cpu_count(),
            "loadavg_after": open("/proc/loadavg").read().split()[:3],
            "endpoints": results,
            "memory_mib": {k: {m: v and round(v, 1) for m, v in mem.items()} for k, mem in memory_at.items()},
            "hypd_exited": exited(hypd),
            "sim_exited": exited(sim),
            "rss_peak_during_requests_mib": max(peaks) if peaks else None,
            "problems": problems,
        }

        print(f"\n== {total} HyperPod nodes in {args.groups} groups, created in {create_seconds:.1f} s "
              f"(sim x{args.time_scale}); up to {args.requests} requests per endpoint from {args.callers} "
              f"caller(s) after {args.warmup} warm-up ({HYPD})")
        print("   stages (s): " + ", ".join(f"{k} {v}" for k, v in summary["create_stage_seconds"].items()))
        head = (f"{'endpoint':<34} {'n':>4} {'bytes':>8} {'p50 ms':>9} {'p90 ms':>9} {'p99 ms':>9} {'max ms':>9} "
                f"{'hypd cpu':>9} {'sim cpu':>9} {'RSS peak':>9}  statuses")
        print(head)
        print("-" * len(head))
        for label, r in results.items():
            if not r["requests"]:
                print(f"{label:<34} {0:>4} {'-':>8}  {'; '.join(r['problems']) or 'not measured'}")
                continue
            print(f"{label:<34} {r['requests']:>4} {r['bytes'] or 0:>8} {r['p50_ms']:>9.1f} {r['p90_ms']:>9.1f} {r['p99_ms']:>9.1f} "
                  f"{r['max_ms']:>9.1f} {r['hypd_cpu_ms_per_request']:>7.1f}ms {r['sim_cpu_ms_per_request']:>7.1f}ms "
                  f"{r['rss_peak_during_mib']:>8.1f}M  {r['statuses']}")
        print("(cpu: CPU time per measured request, of hypd and of hypd-sim)")
        print("\nhypd memory (MiB)          VmRSS    VmHWM")
        for label, key in [("before the cluster", "started"), ("after creation", "created"), ("after the requests", "after_requests")]:
            m = memory_at[key]
            mib = lambda v: f"{v:>8.1f}" if v is not None else f"{'gone':>8}"  # noqa: E731
            print(f"  {label:<22} {mib(m['VmRSS'])} {mib(m['VmHWM'])}")
        if peaks:
            print(f"  {'peak during requests':<22} {max(peaks):>8.1f}")
        for name, proc in (("hypd", hypd), ("hypd-sim", sim)):
            if exited(proc) == "exiting":
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    pass
            if exited(proc):
                summary[f"{'sim' if proc is sim else 'hypd'}_exited"] = exited(proc)
                problems.append(f"{name} {exited(proc)} before the end (its log: {tail(work / 'hypd.log', 5) if name == 'hypd' else '-'})")
        summary["problems"] = problems
        print("\nproblems: " + ("; ".join(problems) if problems else "none"))
        line = json.dumps(summary, separators=(",", ":"))
        if args.json_out:
            Path(args.json_out).write_text(json.dumps(summary, indent=2) + "\n")
        print(line)
    except Exception:
        failed = True
        raise
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, signal.SIG_IGN)  # the teardown runs to its end
        if failed:
            state = (hypd and exited(hypd)) or "running"
            print(f"hypd ({state}), its log (tail):\n{tail(work / 'hypd.log')}", file=sys.stderr)
        stop(hypd)
        stop(sim)
        stop(moto)
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
