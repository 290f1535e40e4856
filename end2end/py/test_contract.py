"""One contract, three faces: the same bad request gets the same field errors from REST,
the console's server function and MCP; authentication and roles hold on every face; the
OpenAPI document is valid and a property-based run against it finds no server error."""

import json
import os
import shutil
import sqlite3
import subprocess

import anyio
import httpx
from mcp.client import Client
from openapi_spec_validator import validate

from test_mcp import http_transport

BAD_REQUESTS = [
    # (command, REST path and query, input)
    ("list_instance_types", "/api/v1/instance-types?availability_zone=mars-1", {"availability_zone": "mars-1"}),
    (
        "list_instance_types",
        "/api/v1/instance-types?instance_types=p5.48xlarge&instance_types=P5",
        {"instance_types": ["p5.48xlarge", "P5"]},
    ),
    ("get_cluster", "/api/v1/clusters/Bad_Name!", {"name": "Bad_Name!"}),
    ("wait_operation", "/api/v1/operations/x/wait?timeout_seconds=301", {"operation_id": "x", "timeout_seconds": 301}),
]


def rest_errors(hypd, path):
    with hypd.client(hypd.admin_token) as c:
        r = c.get(path)
    assert r.status_code == 422, r.text
    return r.json()["error"]


def console_session(hypd):
    """Signs in like the console does and returns a client carrying the session cookie."""
    c = httpx.Client(base_url=hypd.url, headers={"Origin": hypd.url}, timeout=30)
    r = c.post("/auth/login", json={"token": hypd.admin_token})
    assert r.status_code == 200, r.text
    cookie = r.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
    return c


def server_fn_errors(session, command, data):
    r = session.post("/fn/run_command", json={"command": command, "input": data})
    assert r.status_code >= 400, r.text
    return r.json()


def mcp_errors(hypd, command, data):
    async def call():
        async with Client(http_transport(hypd, hypd.admin_token)) as client:
            result = await client.call_tool(command, data)
            assert result.is_error
            return result.structured_content["error"]

    return anyio.run(call)


def test_same_field_errors_on_every_face(hypd):
    session = console_session(hypd)
    for command, path, data in BAD_REQUESTS:
        rest = rest_errors(hypd, path)
        fn = server_fn_errors(session, command, data)
        mcp = mcp_errors(hypd, command, data)
        assert rest["kind"] == "validation", rest
        assert rest == fn == mcp, (command, rest, fn, mcp)
        assert rest["errors"][0]["field"] in {"availability_zone", "instance_types[1]", "name", "timeout_seconds"}


def test_console_session_refuses_other_origins(hypd):
    session = console_session(hypd)
    ok = session.post("/fn/run_command", json={"command": "list_clusters", "input": {}})
    assert ok.status_code == 200, ok.text
    assert ok.json() == {"clusters": []}
    evil = session.post(
        "/fn/run_command", json={"command": "list_clusters", "input": {}}, headers={"Origin": "http://evil.example"}
    )
    assert evil.status_code >= 400
    assert evil.json()["kind"] == "forbidden"
    cross_login = httpx.post(
        f"{hypd.url}/auth/login", json={"token": hypd.admin_token}, headers={"Origin": "http://evil.example"}
    )
    assert cross_login.status_code == 403


def token_names(hypd):
    with hypd.client(hypd.admin_token) as c:
        return {t["name"] for t in c.get("/api/v1/tokens").json()["tokens"]}


def test_rest_auth_401_401_403_and_nothing_changes(hypd):
    viewer = hypd.create_token("rest-viewer", "viewer")
    before = token_names(hypd)
    body = {"name": "intruder", "role": "admin"}
    for token, status, kind in [(None, 401, "unauthorized"), ("hypd_wrong", 401, "unauthorized"), (viewer, 403, "forbidden")]:
        with hypd.client(token) as c:
            r = c.post("/api/v1/tokens", json=body)
        assert r.status_code == status, (token, r.text)
        assert r.json()["error"]["kind"] == kind
    assert token_names(hypd) == before
    # The viewer can still read.
    with hypd.client(viewer) as c:
        assert c.get("/api/v1/whoami").json()["role"] == "viewer"


def test_mutations_are_audited_without_secrets(hypd):
    viewer = hypd.create_token("audited-viewer", "viewer")
    with hypd.client(viewer) as c:
        assert c.delete("/api/v1/tokens/admin").status_code == 403
    db = sqlite3.connect(hypd.data_dir / "hypd.db")
    rows = db.execute("SELECT actor, face, command, request, outcome FROM audit_log ORDER BY at").fetchall()
    assert ("admin", "rest", "create_token") in {r[:3] for r in rows}
    assert ("audited-viewer", "rest", "revoke_token", "forbidden") in {(r[0], r[1], r[2], r[4]) for r in rows}
    assert not any(viewer in r[3] for r in rows), "a token secret reached the audit log"


def test_openapi_document_is_valid_and_fuzzing_finds_no_5xx(hypd):
    doc = httpx.get(f"{hypd.url}/api/v1/openapi.json").json()
    validate(doc)
    ops = {op["operationId"] for path in doc["paths"].values() for op in path.values()}
    assert {"whoami", "list_instance_types", "wait_operation", "create_token"} <= ops

    # Property-based run against every operation, with a viewer token so generated
    # requests can read but never change anything.
    viewer = hypd.create_token("fuzz-viewer", "viewer")
    cmd = [
        shutil.which("schemathesis") or "schemathesis",
        "run",
        f"{hypd.url}/api/v1/openapi.json",
        "--url",
        hypd.url,
        "--checks",
        "not_a_server_error",
        "--max-examples",
        os.environ.get("HYPD_FUZZ_EXAMPLES", "25"),
        "--header",
        f"Authorization: Bearer {viewer}",
        "--seed",
        "1",
    ]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
