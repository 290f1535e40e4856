"""The official MCP conformance suite (@modelcontextprotocol/conformance, pinned and
installed by scripts/setup --tests) against a sandbox hypd, through conformance.py's
token-adding proxy. The scenarios that need the suite's own fixtures are listed in
end2end/conformance-expected-failures.yml; every other one must pass, and a listed one
that passes fails the run too (the suite checks both)."""

import json
import os
import re
import subprocess
from pathlib import Path

import httpx

import conformance
from conftest import REPO

SUITE = Path(os.environ.get("HYPD_CONFORMANCE", Path.home() / ".cache" / "hypd" / "conformance"))
EXPECTED_FAILURES = REPO / "end2end" / "conformance-expected-failures.yml"


def test_mcp_needs_a_token_the_suite_does_not_send(hypd):
    """Why the proxy exists: the suite's first request, as it sends it, is refused."""
    initialize = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
    }
    r = httpx.post(f"{hypd.url}/mcp", json=initialize, headers={"Accept": "application/json, text/event-stream"})
    assert r.status_code == 401, r.text


def not_passed(results: Path) -> str:
    """Each failed or warned check in the suite's results (the suite counts a warning as a
    failure, but its summary shows only failures), one line each."""
    lines = []
    for checks in sorted(results.glob("*/checks.json")):
        # The suite names each result directory server-<scenario>-<time>.
        scenario = re.sub(r"^server-|-\d{4}-\d\d-\d\dT[\d-]+Z$", "", checks.parent.name)
        for c in json.loads(checks.read_text()):
            if c["status"] in ("FAILURE", "WARNING"):
                lines.append(f"{scenario}: {c['status']} {c['name']}: {c.get('errorMessage', '')}")
    return "\n".join(lines)


def test_conformance_suite(hypd, tmp_path):
    bin_dir = SUITE / "node_modules" / ".bin"
    assert (bin_dir / "conformance").exists(), f"no conformance suite in {SUITE}: scripts/setup --tests installs it"
    token = hypd.create_token("conformance", "admin")
    with conformance.proxy(hypd.url, token) as url:
        # 127.0.0.1, not localhost: Node may try ::1 first, where the proxy does not listen.
        done = subprocess.run(
            [
                str(bin_dir / "conformance"),
                "server",
                "--url",
                f"{url}/mcp",
                "--expected-failures",
                str(EXPECTED_FAILURES),
                "-o",
                str(tmp_path),
            ],
            # The suite's `#!/usr/bin/env node` must find the Node 22 installed beside it.
            env={**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"},
            capture_output=True,
            text=True,
            timeout=600,
        )
    summary = done.stdout[done.stdout.find("=== SUMMARY ===") :]
    assert done.returncode == 0, f"{summary}\n{done.stderr}\nchecks not passed:\n{not_passed(tmp_path)}"
