"""The official MCP Python client against hypd: streamable HTTP and stdio (`hypd mcp`),
each in the client's default mode (server/discover first) and legacy mode (initialize)."""

import base64
import json
import math
import time

import anyio
import httpx
import pytest
from mcp.client import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.client.subscriptions import SubscriptionLost
from mcp.shared._httpx_utils import create_mcp_http_client

import mcp_types as types

import playbook_flow
from conftest import HYPD, REPO, kubectl, mcp_session, rpc_answer

INSPECTION = ["whoami", "list_regions", "list_availability_zones", "list_instance_types", "list_clusters"]


def http_transport(hypd, token):
    return streamable_http_client(
        f"{hypd.url}/mcp", http_client=create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
    )


def stdio_transport(hypd, token):
    env = {**hypd.env, "HYPD_URL": hypd.url, "HYPD_TOKEN": token}
    return StdioServerParameters(command=str(HYPD), args=["mcp"], env=env)


async def finished(client, operation_id):
    """wait_operation until operation `operation_id` is final; its last answer."""
    while True:
        waited = structured(
            await client.call_tool("wait_operation", {"operation_id": operation_id, "timeout_seconds": 60})
        )
        if not waited["timed_out"]:
            return waited


def structured(result):
    assert not result.is_error, result.content
    return result.structured_content or json.loads(result.content[0].text)


def rest_call(hypd, tool, args):
    """`tool` with `args` through REST, as the OpenAPI document routes it: its path
    parameters taken from `args`, the rest the JSON body. Answers (status, JSON)."""
    with hypd.client(hypd.admin_token) as rest:
        doc = rest.get("/api/v1/openapi.json").json()
        for path, methods in doc["paths"].items():
            for method, op in methods.items():
                if op.get("operationId") != tool:
                    continue
                body = dict(args)
                for p in op.get("parameters", []):
                    if p["in"] == "path":
                        path = path.replace("{" + p["name"] + "}", str(body.pop(p["name"])))
                r = rest.request(method.upper(), path, json=body)
                return r.status_code, r.json()
    raise AssertionError(f"no REST route for {tool}")


async def call_confirmed(client, tool, args):
    """`tool` with `args` as an agent that read the plan sends it: a destructive request
    answered with a confirmation is sent again with it."""
    answer = await client.call_tool(tool, args)
    if not answer.is_error and "confirmation" in (answer.structured_content or {}):
        answer = await client.call_tool(tool, {**args, "confirmation": answer.structured_content["confirmation"]})
    return answer


async def keyed(client, hypd, tool, request, other, watch=None):
    """Starts `tool` with a new idempotency key and holds the key to that request (see
    `key_held`). Returns the operation the key started, finished. `watch(operation_id)`,
    when given, follows the operation meanwhile."""
    key = f"key-{tool}-{time.monotonic_ns()}"
    started = structured(await call_confirmed(client, tool, {**request, "idempotency_key": key}))
    assert started["created"] is True, started
    async with anyio.create_task_group() as watching:
        if watch:
            watching.start_soon(watch, started["operation_id"])
        await key_held(client, hypd, tool, {**request, "idempotency_key": key}, other, started["operation_id"])
        op = (await finished(client, started["operation_id"]))["operation"]
    # Retried once it has run (an answer lost on the way back): the same operation, with no
    # new plan or confirmation, even where what it deleted could no longer be planned.
    status, answer = rest_call(hypd, tool, {**request, "idempotency_key": key})
    assert status == 200 and (answer.get("operation_id"), answer.get("created")) == (started["operation_id"], False), (tool, status, answer)
    return op


async def key_held(client, hypd, tool, request, other, operation_id):
    """`request` (with its idempotency key) started `operation_id`: sent again, through MCP
    or REST, it answers with that operation, not created again; the key with `other`, a
    different request, is a conflict (409) naming `idempotency_key` and the operation,
    the same error on both faces, before any plan, and starts nothing."""
    async def operations():
        return [o["operation_id"] for o in structured(await client.call_tool("list_operations", {}))["operations"]]

    before = await operations()
    assert operation_id in before
    again = structured(await call_confirmed(client, tool, request))
    assert (again["operation_id"], again["created"]) == (operation_id, False), again
    other = {**other, "idempotency_key": request["idempotency_key"]}
    refused = await client.call_tool(tool, other)
    assert refused.is_error, refused.content
    error = refused.structured_content["error"]
    assert error["kind"] == "conflict" and error["field"] == "idempotency_key", error
    assert error["operation_id"] == operation_id, error
    status, answer = rest_call(hypd, tool, other)
    assert (status, answer) == (409, refused.structured_content), (tool, status, answer)
    status, answer = rest_call(hypd, tool, request)
    if status == 200 and "confirmation" in answer:
        status, answer = rest_call(hypd, tool, {**request, "confirmation": answer["confirmation"]})
    assert status == 200 and (answer["operation_id"], answer["created"]) == (operation_id, False), (tool, status, answer)
    assert await operations() == before, f"{tool}: a repeated or refused request started nothing"


async def exercise(server, mode):
    async with Client(server, mode=mode) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        for name in INSPECTION + ["wait_operation", "create_token", "revoke_token"]:
            assert name in tools, name
        # Annotations come from the registry.
        assert tools["list_regions"].annotations.read_only_hint is True
        assert tools["revoke_token"].annotations.destructive_hint is True
        assert "wait_operation" in tools["get_operation"].description

        who = structured(await client.call_tool("whoami", {}))
        assert who["account"] == "123456789012"
        assert who["role"] == "admin"

        zones = structured(await client.call_tool("list_availability_zones", {}))
        assert {"us-east-1a", "us-east-1b"} <= {z["name"] for z in zones["zones"]}
        assert all(z["zone_id"].startswith("use1-az") for z in zones["zones"])

        regions = structured(await client.call_tool("list_regions", {}))
        assert "us-west-2" in {r["name"] for r in regions["regions"]}

        types = structured(
            await client.call_tool(
                "list_instance_types", {"availability_zone": "us-east-1a", "instance_types": ["p5.48xlarge"]}
            )
        )
        [p5] = types["instance_types"]
        assert p5["hyperpod_instance_type"] == "ml.p5.48xlarge"
        assert p5["accelerator"]["count"] == 8 and p5["accelerator"]["kind"] == "gpu"
        assert p5["efa_supported"] and p5["max_efa_interfaces"] == 32 and p5["efa_only_allowed"]
        short = structured(
            await client.call_tool("list_instance_types", {"availability_zone": "us-east-1a", "fields": ["accelerator"]})
        )
        assert short["instance_types"] and all(set(t) == {"instance_type", "accelerator"} for t in short["instance_types"])

        clusters = structured(await client.call_tool("list_clusters", {}))
        assert clusters == {"clusters": []}

        # A bad field is a tool error naming the field, not a protocol error.
        bad = await client.call_tool("list_instance_types", {"availability_zone": "mars-1"})
        assert bad.is_error
        err = bad.structured_content["error"]
        assert err["kind"] == "validation"
        assert err["errors"][0]["field"] == "availability_zone"


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_streamable_http(hypd, mode):
    anyio.run(exercise, http_transport(hypd, hypd.admin_token), mode)


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_stdio_bridge(hypd, mode):
    anyio.run(exercise, stdio_transport(hypd, hypd.admin_token), mode)


def test_viewer_sees_only_read_only_tools_and_cannot_mutate(hypd):
    viewer = hypd.create_token("mcp-viewer", "viewer")

    async def check():
        async with Client(http_transport(hypd, viewer)) as client:
            tools = (await client.list_tools()).tools
            names = {t.name for t in tools}
            assert "whoami" in names
            assert not names & {"create_token", "revoke_token", "list_tokens"}
            assert all(t.annotations.read_only_hint for t in tools)
            refused = await client.call_tool("create_token", {"name": "sneaky", "role": "admin"})
            assert refused.is_error
            assert refused.structured_content["error"]["kind"] == "forbidden"

    anyio.run(check)
    with hypd.client(hypd.admin_token) as c:
        names = {t["name"] for t in c.get("/api/v1/tokens").json()["tokens"]}
    assert "sneaky" not in names


def test_no_or_wrong_token_is_refused(hypd):
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    headers = {"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2025-11-25"}
    for auth in [{}, {"Authorization": "Bearer hypd_wrong"}]:
        r = httpx.post(f"{hypd.url}/mcp", json=body, headers={**headers, **auth})
        assert r.status_code == 401, r.text
        assert r.json()["error"]["kind"] == "unauthorized"


def test_unknown_method_is_method_not_found(hypd):
    headers = mcp_session(hypd, hypd.admin_token)
    r = httpx.post(f"{hypd.url}/mcp", json={"jsonrpc": "2.0", "id": 2, "method": "no/such/method", "params": {}}, headers=headers)
    answer = rpc_answer(r)
    assert answer["error"]["code"] == -32601, answer


def test_a_session_is_its_tokens_alone(hypd):
    """A session id is not a credential: another token naming the session is refused,
    and the session's own token still works after."""
    headers = mcp_session(hypd, hypd.admin_token)
    other = hypd.create_token("mcp-session-thief", "admin")
    call = {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "whoami", "arguments": {}}}
    stolen = rpc_answer(httpx.post(f"{hypd.url}/mcp", json=call, headers={**headers, "Authorization": f"Bearer {other}"}))
    assert "belongs to admin" in stolen["error"]["message"], stolen
    mine = rpc_answer(httpx.post(f"{hypd.url}/mcp", json=call, headers=headers))
    assert mine["result"]["structuredContent"]["token_name"] == "admin", mine


async def import_and_follow(server, hypd, sim):
    """import_cluster through MCP: field errors as tool errors, an operation to follow
    with wait_operation, the same answer for the same request, retry/cancel refusals."""
    async with Client(server) as client:
        missing = await client.call_tool("import_cluster", {"name": "no-such-cluster"})
        assert missing.is_error
        err = missing.structured_content["error"]
        assert err["kind"] == "validation" and err["errors"][0]["field"] == "name", err

        # The plan first: hypd's access entry and its record, nothing else made.
        dry = structured(await client.call_tool("import_cluster", {"name": "mcp-eks", "dry_run": True}))
        planned = {(c["action"], c["kind"]) for s in dry["plan"]["stages"] for c in s["changes"]}
        assert ("create", "hypd:Cluster") in planned, dry
        assert {kind for action, kind in planned if action != "none"} <= {"eks:AccessEntry", "hypd:Cluster"}, dry
        started = structured(await client.call_tool("import_cluster", {"name": "mcp-eks"}))
        assert started["status_command"] == "get_operation" and started["created"] is True
        again = structured(await client.call_tool("import_cluster", {"name": "mcp-eks"}))
        assert again["operation_id"] == started["operation_id"]

        op_id = started["operation_id"]
        waited = await finished(client, op_id)
        op = waited["operation"]
        assert op["state"] == "succeeded", op
        # Another cluster imported under a key, which names that request alone.
        keyed_op = await keyed(client, hypd, "import_cluster", {"name": "mcp-eks-keyed"},
                               {"name": "mcp-eks-keyed", "region": "us-east-1"})
        assert keyed_op["state"] == "succeeded", keyed_op
        assert [s["name"] for s in op["stages"]] == ["eks", "access", "hyperpod", "register"]
        assert all(s["state"] == "succeeded" for s in op["stages"])

        cluster = structured(await client.call_tool("get_cluster", {"name": "mcp-eks"}))
        assert cluster["status"] == "imported"

        retry = await client.call_tool("retry_operation", {"operation_id": op_id})
        assert retry.is_error and retry.structured_content["error"]["errors"][0]["field"] == "operation_id"
        cancel = await client.call_tool("cancel_operation", {"operation_id": op_id})
        assert cancel.is_error and cancel.structured_content["error"]["kind"] == "conflict"


async def live_state_through_mcp(hypd):
    """Beyond tools, on a cluster just imported: the playbooks as prompts (the files,
    byte for byte), completion of their arguments from what hypd knows, state as
    resources a viewer reads exactly as REST answers it, log messages for what a
    session started, and a subscription that ends when its token is revoked."""
    files = sorted((REPO / "playbooks").glob("*.md"))
    files = [f for f in files if f.name != "README.md"]
    viewer = hypd.create_token("mcp-live-viewer", "viewer")
    async with Client(http_transport(hypd, viewer)) as client:
        prompts = {p.name: p for p in (await client.list_prompts()).prompts}
        assert sorted(prompts) == [f.stem for f in files], sorted(prompts)
        for f in files:
            got = await client.get_prompt(f.stem)
            assert got.messages[0].content.text == f.read_text(), f.name
        assert [a.name for a in prompts["create-cluster"].arguments] == ["region", "availability_zone"]
        chosen = await client.get_prompt("create-cluster", {"availability_zone": "us-east-1a"})
        assert "availability_zone = us-east-1a" in chosen.messages[1].content.text, chosen.messages
        completed = await client.complete(
            types.PromptReference(name="create-cluster"), {"name": "availability_zone", "value": "us-east-1"})
        assert "us-east-1a" in completed.completion.values, completed
        completed = await client.complete(types.PromptReference(name="delete-safely"), {"name": "name", "value": "mcp-eks"})
        assert set(completed.completion.values) == {"mcp-eks", "mcp-eks-keyed"}, completed

        templates = {t.uri_template for t in (await client.list_resource_templates()).resource_templates}
        assert {"hypd://clusters/{name}", "hypd://operations/{id}", "hypd://clusters/{name}/nodes"} <= templates
        listed = {r.uri for r in (await client.list_resources()).resources}
        assert {"hypd://clusters/mcp-eks", "hypd://clusters/mcp-eks/nodes"} <= listed, listed
        read = await client.read_resource("hypd://clusters/mcp-eks")
        assert read.contents[0].mime_type == "application/json"
        with hypd.client(viewer) as rest:
            assert json.loads(read.contents[0].text) == rest.get("/api/v1/clusters/mcp-eks").json()
        with pytest.raises(Exception) as missing:
            await client.read_resource("hypd://clusters/no-such")
        assert "no-such" in str(missing.value)

        # A subscription lasts as long as its token: revoked, the stream ends.
        async with client.listen(resource_subscriptions=["hypd://clusters/mcp-eks"]) as subscription:
            _, plan = rest_call(hypd, "revoke_token", {"name": "mcp-live-viewer"})
            status, _ = rest_call(hypd, "revoke_token", {"name": "mcp-live-viewer", "confirmation": plan["confirmation"]})
            assert status == 200
            ended = None
            with anyio.move_on_after(20) as waiting:
                try:
                    async for _ in subscription:
                        pass
                except Exception as e:  # noqa: BLE001 - which one is the point of the assert
                    ended = e
            assert not waiting.cancelled_caught, "the subscription outlived its token"
            assert isinstance(ended, SubscriptionLost), repr(ended)
        # Listening again is refused: the token is gone.
        with pytest.raises(Exception) as refused:
            async with client.listen(resource_subscriptions=["hypd://clusters/mcp-eks"]):
                pass
        assert not isinstance(refused.value, TimeoutError), repr(refused.value)

    # Log messages, at the level asked, for the operations this session started.
    messages = []

    async def on_log(params):
        messages.append(params)

    async with Client(http_transport(hypd, hypd.admin_token), mode="legacy", logging_callback=on_log) as client:
        await client.set_logging_level("info")
        started = structured(await client.call_tool("import_cluster", {"name": "mcp-live"}))
        op = (await finished(client, started["operation_id"]))["operation"]
        assert op["state"] == "succeeded", op
        with anyio.fail_after(20):
            while not any(m.level == "notice" for m in messages):
                await anyio.sleep(0.2)
    mine = [m.data for m in messages if m.data["operation_id"] == started["operation_id"]]
    stages = [s["name"] for s in op["stages"]]
    assert [d["stage"] for d in mine if d["state"] == "succeeded" and d["stage"]] == stages, mine
    assert mine[-1]["state"] == "succeeded" and mine[-1]["stage"] is None, mine


def test_import_cluster_through_mcp(hypd, sim):
    for name in ["mcp-eks", "mcp-eks-keyed", "mcp-live"]:
        created = httpx.post(
            f"{sim}/clusters",
            json={
                "name": name,
                "roleArn": "arn:aws:iam::123456789012:role/eks-cluster",
                "resourcesVpcConfig": {"subnetIds": ["subnet-0a", "subnet-0b"]},
                "accessConfig": {"authenticationMode": "API"},
            },
        )
        assert created.status_code == 200, created.text
    anyio.run(import_and_follow, http_transport(hypd, hypd.admin_token), hypd, sim)
    entries = httpx.get(f"{sim}/clusters/mcp-eks/access-entries").json()["accessEntries"]
    assert len(entries) == 1, entries
    anyio.run(live_state_through_mcp, hypd)


async def diagnose_refused_import(admin, viewer, hypd, sim, name):
    """An import whose access entry EKS refused once: diagnose_operation names the stage,
    the refused call and its code, and suggests only retry_operation, the same on REST
    and to a viewer; it changes nothing; the retry it suggests, run once the permission is back,
    succeeds."""
    async with Client(admin) as client:
        started = structured(await client.call_tool("import_cluster", {"name": name}))
        failed = (await finished(client, started["operation_id"]))["operation"]
        assert failed["state"] == "failed", failed
        op_id = failed["operation_id"]
        found = structured(await client.call_tool("diagnose_operation", {"operation_id": op_id}))
        status, rest = rest_call(hypd, "diagnose_operation", {"operation_id": op_id})
        assert status == 200 and rest == found, (rest, found)
        # A viewer is told the same (the plan left may differ: it is the caller's own).
        async with Client(viewer) as looking:
            seen = structured(await looking.call_tool("diagnose_operation", {"operation_id": op_id}))
        assert (seen["findings"], seen["suggestions"]) == (found["findings"], found["suggestions"]), seen
        assert found["subject"] == f"operation/{op_id}"
        first, why = found["findings"][:2]
        assert first["severity"] == "error" and "stage `access`" in first["summary"], first
        assert "AccessDeniedException" in first["summary"] and "not authorized" in first["evidence"], first
        assert "eks.CreateAccessEntry" in why["summary"], why
        assert [(s["command"], s["arguments"], s["effect"]) for s in found["suggestions"]] == [
            ("retry_operation", {"operation_id": op_id}, "mutating")], found["suggestions"]
        assert [c["kind"] for s in found["remaining"]["stages"] for c in s["changes"] if c["action"] == "create"] == [
            "eks:AccessEntry", "hypd:Cluster"], found["remaining"]
        # Nothing changed: the operation as it was, no access entry made.
        after = structured(await client.call_tool("get_operation", {"operation_id": op_id}))
        assert after == failed, (after, failed)
        assert httpx.get(f"{sim}/clusters/{name}/access-entries").json()["accessEntries"] == []
        suggested = found["suggestions"][0]
        retried = structured(await client.call_tool(suggested["command"], suggested["arguments"]))
        waited = await finished(client, retried["operation_id"])
        assert waited["operation"]["state"] == "succeeded", waited
        bad = await client.call_tool("diagnose_operation", {"operation_id": "no such id"})
        assert bad.is_error and bad.structured_content["error"]["errors"][0]["field"] == "operation_id", bad


def test_a_failed_import_is_diagnosed_without_changing_anything(hypd, sim):
    name = "mcp-denied"
    created = httpx.post(f"{sim}/clusters", json={
        "name": name, "roleArn": "arn:aws:iam::123456789012:role/eks-cluster",
        "resourcesVpcConfig": {"subnetIds": ["subnet-0a", "subnet-0b"]},
        "accessConfig": {"authenticationMode": "API"}})
    assert created.status_code == 200, created.text
    fault = httpx.post(f"{sim}/_sim/faults", json={
        "service": "eks", "operation": "CreateAccessEntry", "kind": "error", "code": "AccessDeniedException",
        "status": 403, "message": "User is not authorized to perform: eks:CreateAccessEntry", "times": 1})
    assert fault.status_code == 200, fault.text
    viewer = hypd.create_token("diagnosing-viewer", "viewer")
    anyio.run(diagnose_refused_import, http_transport(hypd, hypd.admin_token), http_transport(hypd, viewer),
              hypd, sim, name)


async def create_and_follow(server, hypd):
    """create_cluster through MCP: the same field errors as REST, then the whole pipeline."""
    async with Client(server) as client:
        bad = await client.call_tool(
            "create_cluster",
            {"name": "mcp-gpu", "availability_zone": "us-east-1a",
             "instance_groups": [{"name": "gpu", "instance_type": "ml.g5.8xlarge", "instance_count": 0, "efa_only": True}]},
        )
        assert bad.is_error
        fields = sorted(e["field"] for e in bad.structured_content["error"]["errors"])
        assert fields == ["instance_groups[0].efa_only", "instance_groups[0].instance_count"], bad.structured_content

        request = {"name": "mcp-gpu", "availability_zone": "us-east-1a",
                   "instance_groups": [{"name": "gpu", "instance_type": "ml.g5.8xlarge", "instance_count": 1}]}
        # The agent sees the plan first: every stage's changes, nothing made or stored.
        dry = structured(await client.call_tool("create_cluster", {**request, "dry_run": True}))
        stages = [s["stage"] for s in dry["plan"]["stages"]]
        assert stages[0] == "network" and stages[-1] == "storage", stages
        kinds = {c["kind"] for s in dry["plan"]["stages"] for c in s["changes"] if c["action"] == "create"}
        assert {"ec2:Vpc", "eks:Cluster", "sagemaker:Cluster", "hypd:Cluster"} <= kinds, kinds
        listed = structured(await client.call_tool("list_operations", {"target": "cluster/mcp-gpu"}))
        assert listed["operations"] == [], listed
        bigger = {**request, "instance_groups": [{**request["instance_groups"][0], "instance_count": 2}]}
        op = await keyed(client, hypd, "create_cluster", request, bigger, watch=lambda op_id: watch_operation(hypd, op_id))
        assert op["state"] == "succeeded", op
        assert op["stages"][-1]["name"] == "storage"
        cluster = structured(await client.call_tool("get_cluster", {"name": "mcp-gpu"}))
        assert cluster["status"] == "active" and cluster["hyperpod_cluster_arn"], cluster


TERMINAL = {"succeeded", "failed", "cancelled"}


async def watch_operation(hypd, op_id):
    """Follows operation `op_id` the three ways MCP offers, all at once, until it ends: a
    2025 session's resources/subscribe (an update per stage that moved, in plan order,
    the stage and its state in `_meta`, then one for the end), a 2026
    subscriptions/listen (each update read back: the operation only moves forward), and
    wait_operation's progress notifications (increasing, ending at the stage count)."""
    uri = f"hypd://operations/{op_id}"
    updates, ended = [], anyio.Event()

    async def on_message(message):
        if isinstance(message, types.ResourceUpdatedNotification) and message.params.uri == uri:
            meta = message.params.meta or {}
            updates.append((meta.get("hypd/stage"), meta.get("hypd/state")))
            if meta.get("hypd/stage") is None and meta.get("hypd/state") in TERMINAL:
                ended.set()

    progress, reads = [], []

    async def on_progress(done, total, message):
        progress.append((done, total, message))

    admin = hypd.admin_token
    async with Client(http_transport(hypd, admin), mode="legacy", message_handler=on_message) as legacy, \
            Client(http_transport(hypd, admin)) as modern:
        now = json.loads((await legacy.read_resource(uri)).contents[0].text)
        await legacy.subscribe_resource(uri)
        async with modern.listen(resource_subscriptions=[uri]) as subscription:

            async def read_on_each_update():
                async for _ in subscription:
                    op = json.loads((await modern.read_resource(uri)).contents[0].text)
                    reads.append([s["state"] for s in op["stages"]])
                    if op["state"] in TERMINAL:
                        return

            async with anyio.create_task_group() as group:
                group.start_soon(read_on_each_update)
                # A wait the client gives up on (notifications/cancelled) stops waiting;
                # the operation goes on (the wait below sees it succeed).
                with anyio.move_on_after(1) as gave_up:
                    await modern.call_tool("wait_operation", {"operation_id": op_id, "timeout_seconds": 300})
                assert gave_up.cancelled_caught, "the operation ended within a second"
                waited = structured(await modern.call_tool(
                    "wait_operation", {"operation_id": op_id, "timeout_seconds": 300}, progress_callback=on_progress))
                assert not waited["timed_out"], waited
        with anyio.fail_after(30):
            await ended.wait()
        await legacy.unsubscribe_resource(uri)
    final = waited["operation"]
    names = [s["name"] for s in final["stages"]]
    assert final["state"] == "succeeded", final
    # Every stage not done when the subscription began was told of, finished, in order.
    open_at_start = [s["name"] for s in now["stages"] if s["state"] != "succeeded"]
    told_done = [stage for stage, state in updates if stage and state == "succeeded"]
    assert told_done == open_at_start, (told_done, updates)
    assert [stage for stage, _ in updates if stage] == sorted(
        [stage for stage, _ in updates if stage], key=names.index), updates
    assert updates[-1] == (None, "succeeded"), updates
    # The listener's reads never go back, and end with the operation done.
    done_counts = [sum(st == "succeeded" for st in r) for r in reads]
    assert reads and done_counts == sorted(done_counts) and done_counts[-1] == len(names), reads
    # Progress: strictly increasing, out of the stage count, ending there.
    assert progress, "no progress notification"
    values = [p for p, _, _ in progress]
    assert values == sorted(set(values)) and values[-1] == len(names), progress
    assert all(total == len(names) for _, total, _ in progress), progress


def test_create_cluster_through_mcp(hypd, sim):
    anyio.run(create_and_follow, http_transport(hypd, hypd.admin_token), hypd)
    # What the user's kubectl sees on the new cluster: a Ready GPU node, the node
    # components on it, the shared bucket's claim Bound.
    nodes = json.loads(kubectl(sim, "mcp-gpu", "get", "nodes", "-l", "sagemaker.amazonaws.com/compute-type=hyperpod", "-o", "json"))
    assert len(nodes["items"]) == 1, nodes
    node = nodes["items"][0]
    assert any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"]["conditions"])
    assert int(node["status"]["allocatable"]["nvidia.com/gpu"]) >= 1
    agent = json.loads(kubectl(sim, "mcp-gpu", "-n", "aws-hyperpod", "get", "daemonset", "health-monitoring-agent", "-o", "json"))
    assert agent["status"]["numberReady"] == 1, agent["status"]
    claim = json.loads(kubectl(sim, "mcp-gpu", "get", "pvc", "shared-s3", "-o", "json"))
    assert claim["status"]["phase"] == "Bound", claim
    anyio.run(drift_and_reconcile, http_transport(hypd, hypd.admin_token), hypd, sim)
    anyio.run(drift_again_and_reconcile, http_transport(hypd, hypd.admin_token), hypd, sim)
    anyio.run(groups_through_mcp, http_transport(hypd, hypd.admin_token), hypd, sim)
    anyio.run(nodes_through_mcp, http_transport(hypd, hypd.admin_token), hypd, sim)
    anyio.run(features_through_mcp, http_transport(hypd, hypd.admin_token), hypd, sim)
    anyio.run(keys_through_mcp, http_transport(hypd, hypd.admin_token), hypd)
    anyio.run(storage_through_mcp, http_transport(hypd, hypd.admin_token), hypd, sim)
    anyio.run(fsx_through_mcp, http_transport(hypd, hypd.admin_token), hypd, sim)
    anyio.run(models_through_mcp, http_transport(hypd, hypd.admin_token), hypd, sim)
    anyio.run(training_through_mcp, http_transport(hypd, hypd.admin_token), hypd, sim)
    anyio.run(inference_through_mcp, http_transport(hypd, hypd.admin_token), hypd, sim)
    anyio.run(managed_inference_through_mcp, http_transport(hypd, hypd.admin_token), hypd, sim)
    anyio.run(jumpstart_through_mcp, http_transport(hypd, hypd.admin_token), hypd, sim)
    anyio.run(pool_through_mcp, http_transport(hypd, hypd.admin_token), hypd, sim)
    anyio.run(router_through_mcp, http_transport(hypd, hypd.admin_token), hypd, sim)
    anyio.run(delete_in_two_steps, http_transport(hypd, hypd.admin_token), hypd)
    # The training and inference operators and tiered checkpointing were on: their roles
    # and the inference operator's TLS bucket went with the cluster's.
    roles = [r["RoleName"] for r in aws("iam", hypd.env["AWS_ENDPOINT_URL"]).list_roles()["Roles"]]
    assert not [r for r in roles if r.startswith("hypd-mcp-gpu-")], roles
    buckets = [b["Name"] for b in aws("s3", hypd.env["AWS_ENDPOINT_URL"]).list_buckets()["Buckets"]]
    assert "hypd-mcp-gpu-123456789012-tls" not in buckets, buckets


def mlflow_call(url, call, **query):
    """MLflow's REST API at `url`, as its own client would call it."""
    import urllib.parse
    import urllib.request

    with urllib.request.urlopen(f"{url}/api/2.0/mlflow/{call}?{urllib.parse.urlencode(query)}", timeout=10) as r:
        return json.loads(r.read())


def aws(service, endpoint):
    import boto3

    return boto3.client(
        service, endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="testing", aws_secret_access_key="testing"
    )


def bought_training_plan(sim, name, offering):
    """Training plan `name` bought from `offering` in the sim, once Active (it is Pending
    while it is paid for; only then does it provide capacity): its ARN."""
    sm = aws("sagemaker", sim)
    arn = sm.create_training_plan(TrainingPlanName=name, TrainingPlanOfferingId=offering)["TrainingPlanArn"]
    for _ in range(100):
        if sm.describe_training_plan(TrainingPlanName=name)["Status"] == "Active":
            break
        time.sleep(0.1)
    return arn


def drift_outside_hypd(hypd, sim):
    """What a person does by hand to mcp-gpu, with the official clients."""
    moto = hypd.env["AWS_ENDPOINT_URL"]
    ec2 = aws("ec2", moto)
    [group] = ec2.describe_security_groups(Filters=[{"Name": "group-name", "Values": ["hypd-mcp-gpu-efa"]}])["SecurityGroups"]
    gid = group["GroupId"]
    ec2.revoke_security_group_ingress(GroupId=gid, IpPermissions=[{"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": gid}]}])
    aws("iam", moto).detach_role_policy(RoleName="hypd-mcp-gpu-eks", PolicyArn="arn:aws:iam::aws:policy/AmazonEKSClusterPolicy")
    aws("eks", sim).delete_addon(clusterName="mcp-gpu", addonName="metrics-server")
    kubectl(sim, "mcp-gpu", "-n", "aws-hyperpod", "label", "daemonset", "health-monitoring-agent",
            "app.kubernetes.io/managed-by=someone-else", "--overwrite")


async def drift_and_reconcile(server, hypd, sim):
    """get_drift on a clean cluster is empty; each change made outside hypd is named;
    reconcile_cluster shows the same as its plan, then puts back exactly that."""
    async with Client(server) as client:
        clean = structured(await client.call_tool("get_drift", {"name": "mcp-gpu"}))
        assert clean["made_by"] == "create_cluster" and clean["drifted"] == [], clean

        drift_outside_hypd(hypd, sim)
        report = structured(await client.call_tool("get_drift", {"name": "mcp-gpu"}))
        by_kind = {d["kind"]: d for d in report["drifted"]}
        assert set(by_kind) == {"ec2:SecurityGroup", "iam:Role", "eks:Addon", "k8s:apps/v1/DaemonSet"}, report
        assert by_kind["ec2:SecurityGroup"]["state"] == "missing" and by_kind["ec2:SecurityGroup"]["fields"][0]["field"] == "ingress"
        role = by_kind["iam:Role"]
        assert role["name"] == "hypd-mcp-gpu-eks" and role["fields"][0]["expected"].endswith("AmazonEKSClusterPolicy"), role
        assert by_kind["eks:Addon"]["name"] == "metrics-server" and by_kind["eks:Addon"]["state"] == "missing"
        daemonset = by_kind["k8s:apps/v1/DaemonSet"]
        assert daemonset["state"] == "differs" and "kubectl-label" in daemonset["changed_by"], daemonset
        label = [f for f in daemonset["fields"] if "managed-by" in f["field"]]
        assert label and label[0]["expected"] == "hypd" and label[0]["actual"] == "someone-else", daemonset

        dry = structured(await client.call_tool("reconcile_cluster", {"name": "mcp-gpu", "dry_run": True}))
        planned = {c["kind"] for s in dry["plan"]["stages"] for c in s["changes"]}
        assert planned == set(by_kind), dry
        started = structured(await client.call_tool("reconcile_cluster", {"name": "mcp-gpu"}))
        waited = await finished(client, started["operation_id"])
        assert waited["operation"]["state"] == "succeeded", waited
        after = structured(await client.call_tool("get_drift", {"name": "mcp-gpu"}))
        assert after["drifted"] == [], after
    agent = json.loads(kubectl(sim, "mcp-gpu", "-n", "aws-hyperpod", "get", "daemonset", "health-monitoring-agent", "-o", "json"))
    assert agent["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "hypd", agent["metadata"]["labels"]


def drift_outside_hypd_again(hypd, sim):
    """More of what a person does by hand: scale a group and turn node recovery off
    (boto3, SageMaker), downgrade an add-on (boto3, EKS), route a block through the
    private route table (boto3, EC2), let another service assume a role (boto3, IAM),
    `kubectl edit` a node component's image, `kubectl delete` another."""
    moto = hypd.env["AWS_ENDPOINT_URL"]
    sagemaker = aws("sagemaker", sim)
    [group] = sagemaker.describe_cluster(ClusterName="mcp-gpu")["InstanceGroups"]
    settable = ("InstanceGroupName", "InstanceType", "LifeCycleConfig", "ExecutionRole", "ThreadsPerCore",
                "InstanceStorageConfigs", "OnStartDeepHealthChecks")
    scaled = {k: v for k, v in group.items() if k in settable} | {"InstanceCount": 0}
    sagemaker.update_cluster(ClusterName="mcp-gpu", InstanceGroups=[scaled], NodeRecovery="None")
    eks = aws("eks", sim)
    eks.update_addon(clusterName="mcp-gpu", addonName="cert-manager", addonVersion="v1.17.2-eksbuild.1")
    # Seen once the updates are done: what is updating takes no change until it is done.
    deadline = time.monotonic() + 60
    while (sagemaker.describe_cluster(ClusterName="mcp-gpu")["ClusterStatus"] != "InService"
           or eks.describe_addon(clusterName="mcp-gpu", addonName="cert-manager")["addon"]["status"] != "ACTIVE"):
        assert time.monotonic() < deadline, "the updates did not finish"
        time.sleep(0.2)
    ec2 = aws("ec2", moto)
    [table] = ec2.describe_route_tables(Filters=[
        {"Name": "tag:hypd:cluster", "Values": ["mcp-gpu"]}, {"Name": "tag:hypd:role", "Values": ["private-rt"]}
    ])["RouteTables"]
    [igw] = ec2.describe_internet_gateways(Filters=[{"Name": "tag:hypd:cluster", "Values": ["mcp-gpu"]}])["InternetGateways"]
    ec2.create_route(RouteTableId=table["RouteTableId"], DestinationCidrBlock="10.99.0.0/16",
                     GatewayId=igw["InternetGatewayId"])
    trust = {"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"}, "Action": "sts:AssumeRole"}]}
    aws("iam", moto).update_assume_role_policy(RoleName="hypd-mcp-gpu-eks", PolicyDocument=json.dumps(trust))
    kubectl(sim, "mcp-gpu", "-n", "kube-system", "edit", "daemonset", "nvidia-device-plugin-daemonset",
            editor=r"sed -i -e 's|\(image: .*k8s-device-plugin\):.*|\1:v0.0.1-edited|'")
    kubectl(sim, "mcp-gpu", "-n", "kube-system", "delete", "daemonset", "aws-efa-k8s-device-plugin-daemonset")
    return table["RouteTableId"]


async def drift_again_and_reconcile(server, hypd, sim):
    """Each of those is named, with what hypd expects and what is there, and reconcile
    puts back exactly that."""
    table = drift_outside_hypd_again(hypd, sim)
    async with Client(server) as client:
        report = structured(await client.call_tool("get_drift", {"name": "mcp-gpu"}))
        named = {(d["kind"], d["name"]): d for d in report["drifted"]}
        assert set(named) == {
            ("sagemaker:Cluster", "mcp-gpu"),
            ("ec2:RouteTable", table),
            ("iam:Role", "hypd-mcp-gpu-eks"),
            ("eks:Addon", "cert-manager"),
            ("k8s:apps/v1/DaemonSet", "nvidia-device-plugin-daemonset"),
            ("k8s:apps/v1/DaemonSet", "aws-efa-k8s-device-plugin-daemonset"),
        }, report
        hyperpod = {f["field"]: f for f in named[("sagemaker:Cluster", "mcp-gpu")]["fields"]}
        assert hyperpod["instance_groups[gpu].instance_count"]["expected"] == 1, hyperpod
        assert hyperpod["instance_groups[gpu].instance_count"]["actual"] == 0, hyperpod
        assert hyperpod["node_recovery"]["expected"] == "Automatic", hyperpod
        assert hyperpod["node_recovery"]["actual"] == "None", hyperpod
        [route] = named[("ec2:RouteTable", table)]["fields"]
        assert route["field"] == "routes[10.99.0.0/16]" and route["actual"].startswith("igw-"), route
        assert route.get("expected") is None, route
        [trust] = named[("iam:Role", "hypd-mcp-gpu-eks")]["fields"]
        assert trust["field"] == "trust" and "ec2.amazonaws.com" in json.dumps(trust["actual"]), trust
        assert "eks.amazonaws.com" in json.dumps(trust["expected"]), trust
        [version] = named[("eks:Addon", "cert-manager")]["fields"]
        assert (version["expected"], version["actual"]) == ("v1.18.2-eksbuild.2", "v1.17.2-eksbuild.1"), version
        edited = named[("k8s:apps/v1/DaemonSet", "nvidia-device-plugin-daemonset")]
        assert edited["state"] == "differs" and "kubectl-edit" in edited["changed_by"], edited
        assert any("v0.0.1-edited" in json.dumps(f["actual"]) for f in edited["fields"]), edited
        deleted = named[("k8s:apps/v1/DaemonSet", "aws-efa-k8s-device-plugin-daemonset")]
        assert deleted["state"] == "missing", deleted

        started = structured(await client.call_tool("reconcile_cluster", {"name": "mcp-gpu"}))
        waited = await finished(client, started["operation_id"])
        assert waited["operation"]["state"] == "succeeded", waited
        after = structured(await client.call_tool("get_drift", {"name": "mcp-gpu"}))
        assert after["drifted"] == [], after
    # Put back as the official clients see it.
    moto = hypd.env["AWS_ENDPOINT_URL"]
    d = aws("sagemaker", sim).describe_cluster(ClusterName="mcp-gpu")
    assert d["NodeRecovery"] == "Automatic" and d["InstanceGroups"][0]["TargetCount"] == 1, d
    [rt] = aws("ec2", moto).describe_route_tables(RouteTableIds=[table])["RouteTables"]
    assert not [r for r in rt["Routes"] if r.get("DestinationCidrBlock") == "10.99.0.0/16"], rt["Routes"]
    addon = aws("eks", sim).describe_addon(clusterName="mcp-gpu", addonName="cert-manager")["addon"]
    assert addon["addonVersion"] == "v1.18.2-eksbuild.2", addon
    role = aws("iam", moto).get_role(RoleName="hypd-mcp-gpu-eks")["Role"]
    assert "eks.amazonaws.com" in json.dumps(role["AssumeRolePolicyDocument"]), role
    plugin = json.loads(kubectl(sim, "mcp-gpu", "-n", "kube-system", "get", "daemonset", "nvidia-device-plugin-daemonset", "-o", "json"))
    assert "edited" not in plugin["spec"]["template"]["spec"]["containers"][0]["image"], plugin["spec"]
    kubectl(sim, "mcp-gpu", "-n", "kube-system", "get", "daemonset", "aws-efa-k8s-device-plugin-daemonset")


async def groups_through_mcp(server, hypd, sim):
    """An agent's second day: a spot group added (the plan first), its fixed settings
    refused with the same error REST gives, then deleted in two steps."""
    spot = {"name": "spot", "instance_type": "ml.g5.8xlarge", "instance_count": 1, "capacity": {"type": "spot"}}
    async with Client(server) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        assert "confirmation" in tools["delete_instance_group"].description
        dry = structured(await client.call_tool("add_instance_group", {"name": "mcp-gpu", "group": spot, "dry_run": True}))
        [change] = [c for s in dry["plan"]["stages"] for c in s["changes"]]
        assert change["kind"] == "sagemaker:Cluster" and change["fields"][0]["field"] == "instance_groups[spot]", dry
        started = structured(await client.call_tool("add_instance_group", {"name": "mcp-gpu", "group": spot}))
        waited = await finished(client, started["operation_id"])
        assert waited["operation"]["state"] == "succeeded", waited
        nodes = json.loads(kubectl(sim, "mcp-gpu", "get", "nodes", "-l",
                                   "sagemaker.amazonaws.com/instance-group-name=spot", "-o", "json"))
        assert len(nodes["items"]) == 1, nodes
        listed = structured(await client.call_tool("list_instance_groups", {"name": "mcp-gpu"}))
        by_name = {g["name"]: g for g in listed["instance_groups"]}
        assert set(by_name) == {"gpu", "spot"}, listed
        assert by_name["spot"]["capacity"] == "spot" and by_name["gpu"]["capacity"] == "on_demand", listed
        assert by_name["spot"]["availability_zones"] == ["us-east-1a"], listed

        change_type = {"name": "mcp-gpu", "group": "spot", "instance_type": "ml.g5.12xlarge"}
        fixed = await client.call_tool("update_instance_group", change_type)
        assert fixed.is_error
        with hypd.client(hypd.admin_token) as rest:
            r = rest.post("/api/v1/clusters/mcp-gpu/instance-groups/spot", json={"instance_type": "ml.g5.12xlarge"})
        assert r.status_code == 409 and r.json() == fixed.structured_content, (r.text, fixed.structured_content)
        assert fixed.structured_content["error"]["kind"] == "immutable"
        assert fixed.structured_content["error"]["field"] == "instance_type"

        # A training-plan group beside it, on a plan the account bought.
        httpx.put(f"{sim}/_sim/sagemaker/quotas", json={"ml.g6e.48xlarge": 2}).raise_for_status()
        plan = bought_training_plan(sim, "mcp-run", "tpo-g6e-2-use1a")
        tp = {"name": "tp", "instance_type": "ml.g6e.48xlarge", "instance_count": 2,
              "capacity": {"type": "training_plan", "training_plan_arn": plan}}
        too_many = await client.call_tool("add_instance_group", {"name": "mcp-gpu", "group": {**tp, "instance_count": 3}})
        assert too_many.is_error and too_many.structured_content["error"]["errors"][0]["field"] == "group.capacity.training_plan_arn", too_many
        started = structured(await client.call_tool("add_instance_group", {"name": "mcp-gpu", "group": tp}))
        waited = await finished(client, started["operation_id"])
        assert waited["operation"]["state"] == "succeeded", waited
        listed = structured(await client.call_tool("list_instance_groups", {"name": "mcp-gpu"}))
        by_name = {g["name"]: g for g in listed["instance_groups"]}
        assert by_name["tp"]["capacity"] == "training_plan" and by_name["tp"]["nodes"]["healthy"] == 2, listed
        assert by_name["gpu"]["target_count"] == 1 and by_name["gpu"]["nodes"]["healthy"] == 1, listed
        first = structured(await client.call_tool("delete_instance_group", {"name": "mcp-gpu", "group": "tp"}))
        confirmed = {"name": "mcp-gpu", "group": "tp", "confirmation": first["confirmation"]}
        waited = await finished(client, structured(await client.call_tool("delete_instance_group", confirmed))["operation_id"])
        assert waited["operation"]["state"] == "succeeded", waited

        first = structured(await client.call_tool("delete_instance_group", {"name": "mcp-gpu", "group": "spot"}))
        assert "Nothing was done" in first["message"], first
        confirmed = {"name": "mcp-gpu", "group": "spot", "confirmation": first["confirmation"]}
        started = structured(await client.call_tool("delete_instance_group", confirmed))
        waited = await finished(client, started["operation_id"])
        assert waited["operation"]["state"] == "succeeded", waited
        described = structured(await client.call_tool("describe_cluster", {"name": "mcp-gpu"}))
        assert [g["name"] for g in described["instance_groups"]] == ["gpu"], described["instance_groups"]


async def nodes_through_mcp(server, hypd, sim):
    """A bad node: listed with what Kubernetes says of it, rebooted beside an id HyperPod
    does not know (its refusal reported on the operation), then replaced in two steps."""
    unknown = "i-00000000000000dea"
    async with Client(server) as client:
        listed = structured(await client.call_tool("list_nodes", {"name": "mcp-gpu"}))
        [node] = listed["nodes"]
        assert node["status"] == "Running" and node["ready"] is True, node
        labels = json.loads(kubectl(sim, "mcp-gpu", "get", "node", node["kubernetes_node"], "-o", "json"))["metadata"]["labels"]
        assert node["health_label"] == labels["sagemaker.amazonaws.com/node-health-status"] == "Schedulable", labels
        assert node["gpus"] >= 1, node
        # The list answers from a recent read of HyperPod; `refresh` asks for a new one.
        again = structured(await client.call_tool("list_nodes", {"name": "mcp-gpu", "refresh": True}))
        assert again["fetched_at"] > listed["fetched_at"] and again["nodes"] == listed["nodes"], (listed, again)

        await diagnose_sick_node(client, hypd, sim, node)

        bad = await client.call_tool("reboot_nodes", {"name": "mcp-gpu", "node_ids": ["i-XYZ"]})
        assert bad.is_error
        with hypd.client(hypd.admin_token) as rest:
            r = rest.post("/api/v1/clusters/mcp-gpu/nodes/reboot", json={"node_ids": ["i-XYZ"]})
        assert r.status_code == 422 and r.json() == bad.structured_content, (r.text, bad.structured_content)

        started = structured(await client.call_tool("reboot_nodes", {"name": "mcp-gpu", "node_ids": [node["node_id"], unknown]}))
        waited = await finished(client, started["operation_id"])
        op = waited["operation"]
        assert op["state"] == "failed", op
        assert op["error"]["code"] == "InstanceIdNotFound" and unknown in op["error"]["message"], op["error"]
        assert op["outputs"]["answer"]["accepted"] == [node["node_id"]], op["outputs"]

        first = structured(await client.call_tool("replace_nodes", {"name": "mcp-gpu", "node_ids": [node["node_id"]]}))
        assert "Nothing was done" in first["message"], first
        [change] = [c for s in first["plan"]["stages"] for c in s["changes"]]
        assert {"field": "instance_volumes", "old": "kept", "new": "wiped"} in change["fields"], change
        confirmed = {"name": "mcp-gpu", "node_ids": [node["node_id"]], "confirmation": first["confirmation"]}
        started = structured(await client.call_tool("replace_nodes", confirmed))
        waited = await finished(client, started["operation_id"])
        assert waited["operation"]["state"] == "succeeded", waited
        [replaced] = structured(await client.call_tool("list_nodes", {"name": "mcp-gpu"}))["nodes"]
        assert replaced["node_id"] != node["node_id"] and replaced["ready"] is True, replaced

        pinned = {"name": "mcp-gpu", "image_release": "2025.09.15", "batch_percent": 50}
        dry = structured(await client.call_tool("update_cluster_software", {**pinned, "dry_run": True}))
        [change] = [c for s in dry["plan"]["stages"] for c in s["changes"]]
        assert change["fields"][0]["field"] == "instance_groups[gpu].image_release", change
        started = structured(await client.call_tool("update_cluster_software", pinned))
        waited = await finished(client, started["operation_id"])
        assert waited["operation"]["state"] == "succeeded", waited
        [updated] = structured(await client.call_tool("list_nodes", {"name": "mcp-gpu"}))["nodes"]
        assert updated["image_release"] == "2025.09.15", updated


def sim_clock(sim, time_scale):
    r = httpx.put(f"{sim}/_sim/clock", json={"time_scale": time_scale})
    assert r.status_code == 200, r.text


async def diagnose_sick_node(client, hypd, sim, node):
    """HyperPod's health agent finds a GPU off the bus on the node (node recovery
    Automatic): diagnose_node names the agent's fault with its message, the pods a fix
    would stop and the event, and suggests following HyperPod's own reboot, then a
    replacement only if the fault comes back; the same on REST; nothing changes (nodes
    and operations as before). The clock runs at AWS's pace while the node is marked."""
    name, node_id = "mcp-gpu", node["node_id"]
    args = {"name": name, "node_id": node_id}
    sim_clock(sim, 1)
    try:
        fault = httpx.put(f"{sim}/_sim/sagemaker/clusters/{name}/nodes/{node_id}/fault", json={"recovery": "reboot"})
        assert fault.status_code == 200, fault.text
        operations = structured(await client.call_tool("list_operations", {}))["operations"]
        # The mark reaches the Node at the sim's next tick.
        for _ in range(50):
            found = structured(await client.call_tool("diagnose_node", args))
            if found["findings"][0]["severity"] == "error":
                break
            await anyio.sleep(0.1)
        status, rest = rest_call(hypd, "diagnose_node", args)
        assert status == 200 and rest == found, (rest, found)
        assert found["subject"] == f"node/{name}/{node_id}"
        first = found["findings"][0]
        assert "NvidiaErrorReboot (XidHardwareFailure)" in first["summary"], found
        assert "fallen off the bus" in first["evidence"], first
        said = [f["summary"] for f in found["findings"]]
        assert any(s.startswith("marked for reboot") for s in said), said
        assert any(s.startswith("event XidHardwareFailure") for s in said), said
        assert [(s["command"], s["effect"]) for s in found["suggestions"]] == [
            ("list_nodes", "read_only"), ("replace_nodes", "destructive")], found["suggestions"]
        assert found["suggestions"][1]["arguments"] == {"name": name, "node_ids": [node_id]}
        after = structured(await client.call_tool("list_operations", {}))["operations"]
        assert after == operations, "a diagnosis started an operation"
        unknown = await client.call_tool("diagnose_node", {"name": name, "node_id": "i-00000000000000dea"})
        assert unknown.is_error and unknown.structured_content["error"]["kind"] == "not_found", unknown
    finally:
        sim_clock(sim, 600)
    # HyperPod reboots it on its own; the fault's condition stays, cleared.
    for _ in range(200):
        [now] = structured(await client.call_tool("list_nodes", {"name": name, "refresh": True}))["nodes"]
        if now["status"] == "Running" and now["health_label"] == "Schedulable" and now["ready"]:
            break
        await anyio.sleep(0.1)
    assert (now["node_id"], now["health_label"]) == (node_id, "Schedulable"), now
    healed = structured(await client.call_tool("diagnose_node", args))
    assert healed["suggestions"] == [] and healed["findings"][0]["summary"].startswith("healthy"), healed
    assert any("is cleared" in f["summary"] for f in healed["findings"]), healed


async def models_through_mcp(server, hypd, sim):
    """A model downloaded through MCP with a token: the operation succeeds, the Job its
    outputs name exists (kubectl), the files are listed by list_models and the storage
    browser at the path pods see; the token is in no answer and nowhere in hypd's data
    directory (store, WAL, token files)."""
    name = "mcp-gpu"
    token = "hf_mcpSeCrEt0123456789abcdefghij"
    async with Client(server) as client:
        answers = []
        started = await client.call_tool("download_model", {"name": name, "model": "Qwen/Qwen2.5-0.5B", "hf_token": token})
        answers.append(started)
        waited = await finished(client, structured(started)["operation_id"])
        assert waited["operation"]["state"] == "succeeded", waited
        outputs = waited["operation"]["outputs"]
        job = outputs["job"].removeprefix("default/")
        found = json.loads(kubectl(sim, name, "get", "job", job, "-o", "json"))
        assert found["status"]["succeeded"] == 1, found["status"]
        models = await client.call_tool("list_models", {"name": name})
        answers.append(models)
        entry = structured(models)["models"][0]
        assert entry["model"] == "Qwen/Qwen2.5-0.5B" and entry["complete"] and entry["commit"] == outputs["commit"], entry
        inside = structured(await client.call_tool("list_storage_contents", {
            "name": name, "storage": "shared-s3", "prefix": "models/Qwen/Qwen2.5-0.5B/"}))
        paths = [f["path_in_pods"] for f in inside["files"]]
        assert "/s3/models/Qwen/Qwen2.5-0.5B/config.json" in paths, paths
        ops = await client.call_tool("list_operations", {})
        answers.append(ops)
    for answer in answers:
        assert token not in json.dumps([c.model_dump() for c in answer.content]), answer
    for path in hypd.data_dir.rglob("*"):
        if path.is_file():
            assert token.encode() not in path.read_bytes(), f"the token is in {path}"


async def training_through_mcp(server, hypd, sim):
    """A LLaMA-Factory job through MCP: refused by field on every face alike (a path
    outside /s3, a config not in the bucket), checked verdict by verdict, planned, then
    run: the HyperPodPyTorchJob kubectl sees was accepted by the CRD's schema and its
    pods mount the bucket at /s3 with the group's GPUs; get_training_job shows it running
    with its budget untouched; it reports to the cluster's MLflow tracking server (made
    through MCP) and its metrics are what the real MLflow server holds; deleting it takes
    two steps and its pods. Then ms-swift and pytorch planned, a VERL RayJob run on
    KubeRay (which may not be turned off under it) and deleted, a custom RayJob planned."""
    import base64
    import time

    name = "mcp-gpu"
    # The cluster has three GPU groups by now (gpu, spot, tp): the job names one.
    request = {"name": name, "job": "sft-mcp", "instance_group": "gpu",
               "recipe": {"kind": "llama_factory", "config": "/s3/configs/sft.yaml"}, "recovery": {"job_max_retry_count": 4}}
    async with Client(server) as client:
        bad = await client.call_tool("submit_training_job", {**request, "recipe": {"kind": "llama_factory", "config": "/data/sft.yaml"}})
        assert bad.is_error and bad.structured_content["error"]["errors"][0]["field"] == "recipe.config", bad
        status, body = rest_call(hypd, "submit_training_job", {**request, "recipe": {"kind": "llama_factory", "config": "/data/sft.yaml"}})
        assert status == 422 and body == bad.structured_content, body

        # The operator is on from the features' test; the config is not uploaded yet.
        checks = structured(await client.call_tool("check_training_job", request))
        assert not checks["ready"] and [c["check"] for c in checks["checks"] if not c["passed"]] == ["file"], checks
        status, same = rest_call(hypd, "check_training_job", request)
        assert status == 200 and same["checks"] == checks["checks"], same
        refused = await client.call_tool("submit_training_job", request)
        assert refused.is_error and refused.structured_content["error"]["errors"][0]["field"] == "recipe.config", refused

        # The cluster's MLflow tracking server, planned then made; the job reports to it.
        mlflow_request = {"name": name, "size": "Small"}
        dry = structured(await client.call_tool("create_mlflow_tracking_server", {**mlflow_request, "dry_run": True}))
        made = [(c["kind"], c["name"]) for s in dry["plan"]["stages"] for c in s["changes"] if c["action"] == "create"]
        assert made == [("iam:Role", f"hypd-{name}-mlflow"), ("sagemaker:MlflowTrackingServer", f"{name}-mlflow")], dry["plan"]
        waited = await finished(client, structured(await client.call_tool("create_mlflow_tracking_server", mlflow_request))["operation_id"])
        assert waited["operation"]["state"] == "succeeded", waited
        server = aws("sagemaker", sim).describe_mlflow_tracking_server(TrackingServerName=f"{name}-mlflow")
        assert server["TrackingServerStatus"] == "Created" and server["ArtifactStoreUri"].endswith("/mlflow"), server

        config = "model_name_or_path: /s3/models/Qwen/Qwen2.5-0.5B\nstage: sft\nfinetuning_type: lora\n"
        await client.call_tool("upload_storage_file", {"name": name, "storage": "shared-s3", "key": "configs/sft.yaml",
                                                       "content_base64": base64.b64encode(config.encode()).decode()})
        dry = structured(await client.call_tool("submit_training_job", {**request, "dry_run": True}))
        [change] = dry["plan"]["stages"][0]["changes"]
        assert change["kind"] == "k8s:sagemaker.amazonaws.com/v1/HyperPodPyTorchJob" and change["action"] == "create", dry
        planned = change["fields"][0]["new"]
        waited = await finished(client, structured(await client.call_tool("submit_training_job", request))["operation_id"])
        assert waited["operation"]["state"] == "succeeded", waited

        # What was applied is what was planned, and the API server's schema took it.
        applied = json.loads(kubectl(sim, name, "get", "hyperpodpytorchjob", "sft-mcp", "-o", "json"))
        assert applied["spec"] == planned, (applied["spec"], planned)
        pods = json.loads(kubectl(sim, name, "get", "pods", "-l", "hypd.dev/training-job=sft-mcp", "-o", "json"))["items"]
        assert len(pods) == 1 and pods[0]["status"]["phase"] == "Running", pods
        container = pods[0]["spec"]["containers"][0]
        assert {"name": "shared", "mountPath": "/s3"} in container["volumeMounts"], container
        assert int(container["resources"]["requests"]["nvidia.com/gpu"]) >= 1, container
        # The config, then LLaMA-Factory told to report to MLflow.
        assert container["command"][-2:] == ["/s3/configs/sft.yaml", "report_to=mlflow"], container["command"]
        env = {e["name"]: e["value"] for e in container["env"]}
        assert env["MLFLOW_TRACKING_URI"] == server["TrackingServerArn"] and env["MLFLOW_EXPERIMENT_NAME"] == name, env

        got = structured(await client.call_tool("get_training_job", {"name": name, "job": "sft-mcp"}))
        assert got["phase"] == "running" and got["recipe"] == "llama_factory" and got["attempt"] == 1, got
        assert got["recovery"]["restarts_left"] == 4 and got["recovery"]["entries"] == [], got["recovery"]
        listed = structured(await client.call_tool("list_training_jobs", {"name": name}))
        assert [j["job"] for j in listed["jobs"]] == ["sft-mcp"], listed
        # The pod's log: its last lines, and a pod that is not the job's refused by field.
        logs = structured(await client.call_tool("get_training_job_logs", {"name": name, "job": "sft-mcp", "tail_lines": 3}))
        assert logs["pod"] == pods[0]["metadata"]["name"] and 1 <= len(logs["lines"]) <= 3, logs
        assert "loss=" in logs["lines"][-1], logs
        wrong = await client.call_tool("get_training_job_logs", {"name": name, "job": "sft-mcp", "pod": "not-its-pod"})
        assert wrong.is_error and wrong.structured_content["error"]["errors"][0]["field"] == "pod", wrong
        # A job that runs quietly: its diagnosis says so and suggests nothing, as on REST.
        quiet = structured(await client.call_tool("diagnose_training_job", {"name": name, "job": "sft-mcp"}))
        assert quiet["subject"] == f"training_job/{name}/sft-mcp" and quiet["suggestions"] == [], quiet
        assert quiet["findings"][0]["summary"] == "the job is running, 1 pod", quiet
        status, rest = rest_call(hypd, "diagnose_training_job", {"name": name, "job": "sft-mcp"})
        assert status == 200 and rest["findings"] == quiet["findings"], rest

        # Its metrics: the points the pod posted to the real MLflow server behind the
        # tracking server, as MLflow itself has them, its run tagged with attempt 1.
        for _ in range(120):
            metrics = structured(await client.call_tool("get_training_job_metrics",
                                                        {"name": name, "job": "sft-mcp", "metrics": ["loss"]}))
            if metrics["series"] and len(metrics["series"][0]["points"]) >= 3:
                break
            time.sleep(0.5)
        [series] = metrics["series"]
        assert series["key"] == "loss" and series["attempt"] == 1, metrics
        run = mlflow_call(server["TrackingServerUrl"], "runs/get", run_id=series["run_id"])["run"]
        tags = {t["key"]: t["value"] for t in run["data"]["tags"]}
        assert tags["hypd.job"] == "sft-mcp" and tags["hypd.attempt"] == "1", tags
        history = mlflow_call(server["TrackingServerUrl"], "metrics/get-history", run_id=series["run_id"], metric_key="loss")
        by_step = {m["step"]: m["value"] for m in history["metrics"]}
        # The same numbers (to the last bits of a double: JSON decimal round trips).
        differ = [(step, value, by_step.get(step)) for step, value in series["points"]
                  if by_step.get(step) is None or not math.isclose(by_step[step], value, rel_tol=1e-12)]
        assert not differ, (differ, len(history["metrics"]))
        got = structured(await client.call_tool("get_training_job", {"name": name, "job": "sft-mcp"}))
        assert got["mlflow"]["runs"][0]["run_id"] == series["run_id"] and got["mlflow"]["experiment"] == name, got["mlflow"]

        first = structured(await client.call_tool("delete_training_job", {"name": name, "job": "sft-mcp"}))
        assert [(c["action"], c["kind"]) for s in first["plan"]["stages"] for c in s["changes"]] == [
            ("delete", "k8s:sagemaker.amazonaws.com/v1/HyperPodPyTorchJob")], first["plan"]
        confirmed = {"name": name, "job": "sft-mcp", "confirmation": first["confirmation"]}
        waited = await finished(client, structured(await client.call_tool("delete_training_job", confirmed))["operation_id"])
        assert waited["operation"]["state"] == "succeeded", waited
        for _ in range(40):
            left = json.loads(kubectl(sim, name, "get", "pods", "-l", "hypd.dev/training-job=sft-mcp", "-o", "json"))["items"]
            if not left:
                break
            time.sleep(0.25)
        assert not left, left

        # The other recipes: refused alike on both faces, planned as the objects they make.
        bad = {"name": name, "job": "swift-mcp", "instance_group": "gpu",
               "recipe": {"kind": "ms_swift", "command": "dpo", "config": "/s3/configs/sft.yaml"}}
        refused = await client.call_tool("submit_training_job", bad)
        status, body = rest_call(hypd, "submit_training_job", bad)
        assert refused.is_error and status == 422 and body == refused.structured_content, body
        for recipe, kind in [({"kind": "ms_swift", "command": "sft", "config": "/s3/configs/sft.yaml"}, "sagemaker.amazonaws.com/v1/HyperPodPyTorchJob"),
                             ({"kind": "pytorch", "script": "/s3/configs/sft.yaml", "args": ["--lr", "1e-4"]}, "sagemaker.amazonaws.com/v1/HyperPodPyTorchJob")]:
            dry = structured(await client.call_tool("submit_training_job", {"name": name, "job": "other", "instance_group": "gpu",
                                                                          "recipe": recipe, "dry_run": True}))
            assert dry["plan"]["stages"][0]["changes"][0]["kind"] == f"k8s:{kind}", dry

        # VERL: KubeRay on, then a RayJob whose head runs on the group with the bucket at /s3.
        waited = await finished(client, structured(await client.call_tool(
            "update_features", {"name": name, "kuberay_operator": True}))["operation_id"])
        assert waited["operation"]["state"] == "succeeded", waited
        verl = {"name": name, "job": "rl-mcp", "instance_group": "gpu",
                "recipe": {"kind": "verl", "args": ["data.train_files=/s3/data/train.parquet"]}}
        waited = await finished(client, structured(await client.call_tool("submit_training_job", verl))["operation_id"])
        assert waited["operation"]["state"] == "succeeded", waited
        rayjob = json.loads(kubectl(sim, name, "get", "rayjob", "rl-mcp", "-o", "json"))
        assert "verl.trainer.main_ppo" in rayjob["spec"]["entrypoint"] and "trainer.logger=" in rayjob["spec"]["entrypoint"], rayjob["spec"]
        pods = json.loads(kubectl(sim, name, "get", "pods", "-l", "hypd.dev/training-job=rl-mcp", "-o", "json"))["items"]
        assert len(pods) == 1, (waited, rayjob.get("status"), pods)
        [head] = pods
        assert head["status"]["phase"] == "Running" and head["metadata"]["labels"]["ray.io/node-type"] == "head", head
        assert {"name": "shared", "mountPath": "/s3"} in head["spec"]["containers"][0]["volumeMounts"], head["spec"]
        got = structured(await client.call_tool("get_training_job", {"name": name, "job": "rl-mcp"}))
        assert (got["kind"], got["recipe"], got["phase"]) == ("RayJob", "verl", "running"), got
        # KubeRay may not be turned off under a RayJob.
        refused = await client.call_tool("update_features", {"name": name, "kuberay_operator": False})
        assert refused.is_error and "1 RayJob" in json.dumps(refused.structured_content), refused

        # A custom RayJob: planned as given, under the job's name.
        custom = {"name": name, "job": "own-mcp", "dry_run": True, "recipe": {"kind": "custom", "object": {
            "apiVersion": "ray.io/v1", "kind": "RayJob", "spec": {"entrypoint": "python3 -c 'print(1)'",
            "rayClusterSpec": {"headGroupSpec": {"rayStartParams": {}, "template": {"spec": {"containers": [
                {"name": "ray-head", "image": "rayproject/ray:2.46.0"}]}}}}}}}}
        dry = structured(await client.call_tool("submit_training_job", custom))
        change = dry["plan"]["stages"][0]["changes"][0]
        assert change["kind"] == "k8s:ray.io/v1/RayJob" and change["name"] == "own-mcp", dry

        first = structured(await client.call_tool("delete_training_job", {"name": name, "job": "rl-mcp"}))
        assert [(c["action"], c["kind"]) for s in first["plan"]["stages"] for c in s["changes"]] == [
            ("delete", "k8s:ray.io/v1/RayJob")], first["plan"]
        waited = await finished(client, structured(await client.call_tool(
            "delete_training_job", {"name": name, "job": "rl-mcp", "confirmation": first["confirmation"]}))["operation_id"])
        assert waited["operation"]["state"] == "succeeded", waited


async def inference_through_mcp(server, hypd, sim):
    """A vLLM model server through MCP, on the model models_through_mcp downloaded:
    refused alike on REST and MCP (a serve command that does not split, more GPUs than
    the group's type has), planned, deployed and followed to ready, invoked through the
    cluster's API server, listed; kubectl sees its Deployment ready and its Service;
    deleting it takes two steps and leaves none of it."""
    name = "mcp-gpu"
    request = {"name": name, "endpoint": "chat", "engine": "vllm", "instance_group": "gpu",
               "command": "vllm serve /s3/models/Qwen/Qwen2.5-0.5B --served-model-name qwen"}
    async with Client(server) as client:
        for bad, field in (({**request, "command": 'vllm serve "/s3/models'}, "command"),
                           ({**request, "gpus_per_replica": 16}, "gpus_per_replica")):
            refused = await client.call_tool("deploy_model_server", bad)
            assert refused.is_error and refused.structured_content["error"]["errors"][0]["field"] == field, refused
            status, rest = rest_call(hypd, "deploy_model_server", bad)
            assert status == 422 and rest["error"] == refused.structured_content["error"], (rest, refused.structured_content)
        dry = structured(await client.call_tool("deploy_model_server", {**request, "dry_run": True}))
        # Made, reached, and its cold start recorded once the replica is ready.
        assert [(c["action"], c["kind"]) for s in dry["plan"]["stages"] for c in s["changes"]] == [
            ("create", "k8s:apps/v1/Deployment"), ("create", "k8s:v1/Service"),
            ("update", "k8s:apps/v1/Deployment")], dry["plan"]
        waited = await finished(client, structured(await client.call_tool("deploy_model_server", request))["operation_id"])
        assert waited["operation"]["state"] == "succeeded", waited
        assert waited["operation"]["outputs"]["cold_start_seconds"] > 0, waited
        answer = structured(await client.call_tool("invoke_endpoint", {
            "name": name, "endpoint": "chat", "messages": [{"role": "user", "content": "Say hello to HyperPod"}]}))
        assert answer["model"] == "qwen" and answer["answer"] and answer["completion_tokens"] > 0, answer
        listed = structured(await client.call_tool("list_endpoints", {"name": name}))
        assert [(e["endpoint"], e["engine"], e["phase"]) for e in listed["endpoints"]] == [("chat", "vllm", "in_service")], listed
        deployment = json.loads(kubectl(sim, name, "get", "deployment", "chat", "-o", "json"))
        assert deployment["status"]["readyReplicas"] == 1, deployment["status"]
        service = json.loads(kubectl(sim, name, "get", "service", "chat", "-o", "json"))
        assert service["spec"]["type"] == "ClusterIP" and service["spec"]["ports"][0]["port"] == 8000, service["spec"]

        first = structured(await client.call_tool("delete_endpoint", {"name": name, "endpoint": "chat"}))
        assert [(c["action"], c["kind"]) for s in first["plan"]["stages"] for c in s["changes"]] == [
            ("delete", "k8s:v1/Service"), ("delete", "k8s:apps/v1/Deployment")], first["plan"]
        waited = await finished(client, structured(await client.call_tool(
            "delete_endpoint", {"name": name, "endpoint": "chat", "confirmation": first["confirmation"]}))["operation_id"])
        assert waited["operation"]["state"] == "succeeded", waited
    left = json.loads(kubectl(sim, name, "get", "deployments,services", "-o", "json"))["items"]
    assert not [o for o in left if o["metadata"]["name"] == "chat"], left


IEC_KIND = "k8s:inference.sagemaker.aws.amazon.com/v1/InferenceEndpointConfig"


def crd_schema(file):
    """The openAPIV3Schema of the storage version of the official CRD `file` (the sim's
    byte-for-byte copy of the shared schema set)."""
    import pathlib

    import yaml

    crd = yaml.safe_load((pathlib.Path(__file__).parents[2] / "sim" / "crds" / file).read_text())
    [version] = [v for v in crd["spec"]["versions"] if v.get("storage")]
    return version["schema"]["openAPIV3Schema"]


async def managed_inference_through_mcp(server, hypd, sim):
    """The same model through the HyperPod inference operator, with a tiered KV cache
    and KV-aware routing: refused alike on REST and MCP (an unknown routing strategy,
    the operator's options with an SGLang worker), planned, deployed and followed until
    the operator reports it complete; the InferenceEndpointConfig hypd made validates
    against AWS's CRD; the worker carries the cache, the router the strategy; invoked
    through the router; listed with its options; deleted in two steps with all the
    operator made of it."""
    import jsonschema

    name = "mcp-gpu"
    request = {"name": name, "endpoint": "chat-kv", "engine": "vllm", "instance_group": "gpu",
               "command": "vllm serve /s3/models/Qwen/Qwen2.5-0.5B --served-model-name qwen",
               "kv_cache": {"l2": {"backend": "tiered_storage"}}, "routing": "kv_aware"}
    sglang = {**request, "engine": "sglang",
              "command": "python3 -m sglang.launch_server --model-path /s3/models/Qwen/Qwen2.5-0.5B"}
    async with Client(server) as client:
        for bad, field in (({**request, "routing": "fastest"}, "routing"), (sglang, "kv_cache")):
            refused = await client.call_tool("deploy_inference_endpoint", bad)
            assert refused.is_error and refused.structured_content["error"]["errors"][0]["field"] == field, refused
            status, rest = rest_call(hypd, "deploy_inference_endpoint", bad)
            assert status == 422 and rest["error"] == refused.structured_content["error"], (rest, refused.structured_content)
        dry = structured(await client.call_tool("deploy_inference_endpoint", {**request, "dry_run": True}))
        assert [(c["action"], c["kind"]) for s in dry["plan"]["stages"] for c in s["changes"]] == [
            ("create", IEC_KIND), ("update", IEC_KIND)], dry["plan"]
        waited = await finished(client, structured(await client.call_tool("deploy_inference_endpoint", request))["operation_id"])
        assert waited["operation"]["state"] == "succeeded", waited

        config = json.loads(kubectl(sim, name, "get", "inferenceendpointconfig", "chat-kv", "-o", "json"))
        jsonschema.validate(config, crd_schema("inference.sagemaker.aws.amazon.com_inferenceendpointconfigs.yaml"))
        spec = config["spec"]
        assert spec["kvCacheSpec"] == {"enableL1Cache": True, "enableL2Cache": True,
                                       "l2CacheSpec": {"l2CacheBackend": "tieredstorage"}}, spec
        assert spec["intelligentRoutingSpec"] == {"enabled": True, "routingStrategy": "kvaware"}, spec
        assert spec["modelSourceConfig"]["modelLocation"] == "models/Qwen/Qwen2.5-0.5B", spec
        assert config["status"]["state"] == "DeploymentComplete", config["status"]
        worker = json.loads(kubectl(sim, name, "get", "deployment", "chat-kv", "-o", "json"))
        env = {e["name"] for e in worker["spec"]["template"]["spec"]["containers"][0].get("env", [])}
        assert {"LMCACHE_LOCAL_CPU", "LMCACHE_REMOTE_URL"} <= env, env
        router = kubectl(sim, name, "-n", "hyperpod-inference-system", "get", "deployment", "chat-kv-default-router", "-o", "json")
        assert "kvaware" in router, router

        answer = structured(await client.call_tool("invoke_endpoint", {
            "name": name, "endpoint": "chat-kv", "messages": [{"role": "user", "content": "Say hello to HyperPod"}]}))
        assert answer["model"] == "qwen" and answer["answer"] and answer["completion_tokens"] > 0, answer
        listed = structured(await client.call_tool("list_endpoints", {"name": name}))
        assert [(e["endpoint"], e["kind"], e["phase"], e.get("routing"), e.get("kv_cache")) for e in listed["endpoints"]] == [
            ("chat-kv", "inference_endpoint", "in_service", "kv_aware", "l1_cpu+tiered_storage")], listed

        first = structured(await client.call_tool("delete_endpoint", {"name": name, "endpoint": "chat-kv"}))
        assert [(c["action"], c["kind"]) for s in first["plan"]["stages"] for c in s["changes"]] == [
            ("delete", IEC_KIND)], first["plan"]
        waited = await finished(client, structured(await client.call_tool(
            "delete_endpoint", {"name": name, "endpoint": "chat-kv", "confirmation": first["confirmation"]}))["operation_id"])
        assert waited["operation"]["state"] == "succeeded", waited
    left = json.loads(kubectl(sim, name, "get", "inferenceendpointconfigs,deployments,services", "-o", "json"))["items"]
    assert not [o for o in left if o["metadata"]["name"].startswith("chat-kv")], left


JSM_KIND = "k8s:inference.sagemaker.aws.amazon.com/v1/JumpStartModel"
LLAMA = "meta-textgeneration-llama-3-1-8b-instruct"


async def jumpstart_through_mcp(server, hypd, sim):
    """A JumpStart catalogue model: the catalogue lists it with its licence and the
    cluster's groups that can run it; what the hub lacks or forbids (an unknown model or
    version, a gated model whose licence is not accepted, a group of a type the model
    does not run on, a KV cache with no tier) is refused alike on REST and MCP before
    anything is made; the plan, then the JumpStartModel with the operator's KV cache and
    session routing, which validates against AWS's CRD with the version pinned; invoked
    through the operator's router on SageMaker's invocations path; listed with its
    options; deleted in two steps with what the operator made of it, router included."""
    import jsonschema

    name = "mcp-gpu"
    request = {"name": name, "endpoint": "llama", "model_id": LLAMA, "accept_eula": True, "instance_group": "gpu",
               "kv_cache": {"l2": {"backend": "redis", "url": "redis://kv.internal:6379"}}, "routing": "session"}
    async with Client(server) as client:
        catalogue = structured(await client.call_tool("list_jumpstart_models", {"name": name, "search": "llama"}))
        models = {m["model_id"]: m for m in catalogue["models"]}
        assert set(models) == {LLAMA, "meta-textgeneration-llama-3-3-70b-instruct"}, catalogue
        llama = models[LLAMA]
        assert (llama["version"], llama["gated"]) == ("2.8.0", True) and llama["eula"].endswith("llama3_1Eula.txt"), llama
        assert "gpu" in llama["groups"] and "ml.g5.8xlarge" in llama["instance_types"], llama
        assert models["meta-textgeneration-llama-3-3-70b-instruct"]["groups"] == [], catalogue
        for bad, field in (({**request, "model_id": "no-such-model"}, "model_id"),
                           ({**request, "model_version": "9.9.9"}, "model_version"),
                           ({**request, "accept_eula": False}, "accept_eula"),
                           ({**request, "model_id": "deepseek-llm-r1-distill-qwen-1-5b"}, "instance_group"),
                           ({**request, "kv_cache": {"cpu_offload": False}}, "kv_cache")):
            refused = await client.call_tool("deploy_jumpstart_model", bad)
            assert refused.is_error and refused.structured_content["error"]["errors"][0]["field"] == field, refused
            status, rest = rest_call(hypd, "deploy_jumpstart_model", bad)
            assert status == 422 and rest["error"] == refused.structured_content["error"], (rest, refused.structured_content)
        dry = structured(await client.call_tool("deploy_jumpstart_model", {**request, "dry_run": True}))
        assert [(c["action"], c["kind"]) for s in dry["plan"]["stages"] for c in s["changes"]] == [
            ("create", JSM_KIND), ("update", JSM_KIND)], dry["plan"]
        waited = await finished(client, structured(await client.call_tool("deploy_jumpstart_model", request))["operation_id"])
        assert waited["operation"]["state"] == "succeeded", waited

        model = json.loads(kubectl(sim, name, "get", "jumpstartmodel", "llama", "-o", "json"))
        jsonschema.validate(model, crd_schema("inference.sagemaker.aws.amazon.com_jumpstartmodels.yaml"))
        assert model["spec"]["model"] == {"modelHubName": "SageMakerPublicHub", "modelId": LLAMA,
                                          "modelVersion": "2.8.0", "acceptEula": True}, model["spec"]
        assert model["spec"]["server"] == {"instanceType": "ml.g5.8xlarge"}, model["spec"]
        assert model["spec"]["kvCacheSpec"] == {"enableL1Cache": True, "enableL2Cache": True, "l2CacheSpec": {
            "l2CacheBackend": "redis", "l2CacheLocalUrl": "redis://kv.internal:6379"}}, model["spec"]
        assert model["spec"]["intelligentRoutingSpec"] == {"enabled": True, "routingStrategy": "session"}, model["spec"]
        assert model["status"]["state"] == "DeploymentComplete", model["status"]
        worker = json.loads(kubectl(sim, name, "get", "deployment", "llama", "-o", "json"))
        env = {e["name"] for e in worker["spec"]["template"]["spec"]["containers"][0].get("env", [])}
        assert {"LMCACHE_LOCAL_CPU", "LMCACHE_REMOTE_URL"} <= env, env
        router = kubectl(sim, name, "-n", "hyperpod-inference-system", "get", "deployment", "llama-default-router", "-o", "json")
        assert "session" in router, router

        answer = structured(await client.call_tool("invoke_endpoint", {
            "name": name, "endpoint": "llama", "messages": [{"role": "user", "content": "Say hello to HyperPod"}]}))
        assert answer["model"] == LLAMA and answer["answer"] and answer["completion_tokens"] > 0, answer
        listed = structured(await client.call_tool("list_endpoints", {"name": name}))
        assert [(e["endpoint"], e["kind"], e["engine"], e["phase"], e.get("routing"), e.get("kv_cache"))
                for e in listed["endpoints"]] == [
            ("llama", "jumpstart_model", "vllm", "in_service", "session", "l1_cpu+redis")], listed
        got = structured(await client.call_tool("get_endpoint", {"name": name, "endpoint": "llama"}))
        assert "vllm" in got["image"] and got["instance_group"] == "gpu" and len(got["pods"]) == 1, got

        first = structured(await client.call_tool("delete_endpoint", {"name": name, "endpoint": "llama"}))
        assert [(c["action"], c["kind"]) for s in first["plan"]["stages"] for c in s["changes"]] == [
            ("delete", JSM_KIND)], first["plan"]
        waited = await finished(client, structured(await client.call_tool(
            "delete_endpoint", {"name": name, "endpoint": "llama", "confirmation": first["confirmation"]}))["operation_id"])
        assert waited["operation"]["state"] == "succeeded", waited
    left = json.loads(kubectl(sim, name, "get", "jumpstartmodels,deployments,services", "-A", "-o", "json"))["items"]
    assert not [o for o in left if o["metadata"]["name"].startswith("llama")], left


async def pool_through_mcp(server, hypd, sim):
    """A model pool of one warm worker serving a base model and a LoRA adapter: a model
    it does not serve and more workers than are free are refused alike on REST and MCP;
    the worker bound to the adapter answers as it, without a restart (same uid), and
    goes back to the pool when released; deleting the pool takes the model's Service."""
    name = "mcp-gpu"
    pool = {"name": name, "endpoint": "pool", "engine": "vllm", "service": "model_pool", "instance_group": "gpu",
            "command": "vllm serve /s3/models/Qwen/Qwen2.5-0.5B --served-model-name base "
                       "--enable-lora --lora-modules sql=/s3/models/Qwen/Qwen2.5-0.5B/sql"}
    async with Client(server) as client:
        waited = await finished(client, structured(await client.call_tool("deploy_model_server", pool))["operation_id"])
        assert waited["operation"]["state"] == "succeeded", waited
        [before] = structured(await client.call_tool("get_endpoint", {"name": name, "endpoint": "pool"}))["pods"]
        assign = {"name": name, "pool": "pool", "model": "sql", "count": 1}
        for bad, field in (({**assign, "count": 2}, "count"), ({**assign, "model": "poetry"}, "model")):
            refused = await client.call_tool("assign_pool_workers", bad)
            assert refused.is_error and refused.structured_content["error"]["errors"][0]["field"] == field, refused
            status, rest = rest_call(hypd, "assign_pool_workers", bad)
            assert status == 422 and rest["error"] == refused.structured_content["error"], (rest, refused.structured_content)
        dry = structured(await client.call_tool("assign_pool_workers", {**assign, "dry_run": True}))
        assert [(c["action"], c["kind"]) for s in dry["plan"]["stages"] for c in s["changes"]] == [
            ("create", "k8s:v1/Service"), ("update", "k8s:v1/Pod")], dry["plan"]
        waited = await finished(client, structured(await client.call_tool("assign_pool_workers", assign))["operation_id"])
        assert waited["operation"]["state"] == "succeeded", waited
        answer = structured(await client.call_tool("invoke_endpoint", {
            "name": name, "endpoint": "pool", "model": "sql", "messages": [{"role": "user", "content": "SELECT 1?"}]}))
        assert answer["model"] == "sql" and answer["answer"], answer
        [bound] = structured(await client.call_tool("get_endpoint", {"name": name, "endpoint": "pool"}))["pods"]
        assert (bound["uid"], bound["restarts"], bound["serves"]) == (before["uid"], 0, "sql"), (before, bound)
        waited = await finished(client, structured(await client.call_tool(
            "release_pool_workers", {"name": name, "pool": "pool", "model": "sql"}))["operation_id"])
        assert waited["operation"]["state"] == "succeeded", waited
        listed = structured(await client.call_tool("list_endpoints", {"name": name}))
        assert [e["pool"] for e in listed["endpoints"]] == [
            {"models": [{"model": "base", "workers": 0}, {"model": "sql", "workers": 0}], "unassigned": 1}], listed
        first = structured(await client.call_tool("delete_endpoint", {"name": name, "endpoint": "pool"}))
        waited = await finished(client, structured(await client.call_tool(
            "delete_endpoint", {"name": name, "endpoint": "pool", "confirmation": first["confirmation"]}))["operation_id"])
        assert waited["operation"]["state"] == "succeeded", waited
    left = json.loads(kubectl(sim, name, "get", "deployments,services", "-o", "json"))["items"]
    assert not [o for o in left if o["metadata"]["name"].startswith("pool")], left


async def router_through_mcp(server, hypd, sim):
    """SGLang behind the SGLang router, sized by KEDA (which the inference operator
    brings): a router before vLLM, a threshold of another policy and an endpoint that
    may scale to zero started with no replica to measure its cold start on, and a rate
    window too short for the scrape, refused alike on REST and MCP; the plan lists the
    router's objects, the Prometheus server the request rate is asked of, and the
    ScaledObject, which validates against KEDA's CRD with both triggers; the router finds
    the workers by label; invoked through it; listed with its policy and bounds; deleted
    with all it made."""
    import jsonschema

    name = "mcp-gpu"
    request = {"name": name, "endpoint": "sg", "engine": "sglang", "instance_group": "gpu",
               "command": "python3 -m sglang.launch_server --model-path /s3/models/Qwen/Qwen2.5-0.5B --served-model-name sg",
               "router": {"policy": "cache_aware", "cache_threshold": 0.5},
               "autoscaling": {"min_replicas": 1, "max_replicas": 1, "cooldown_seconds": 60,
                               "request_rate": {"target_per_replica": 2.5}}}
    vllm = {**request, "engine": "vllm", "command": "vllm serve /s3/models/Qwen/Qwen2.5-0.5B"}
    short = {**request["autoscaling"], "request_rate": {"target_per_replica": 2.5, "window_seconds": 30}}
    async with Client(server) as client:
        for bad, field in ((vllm, "router"),
                           ({**request, "router": {"policy": "round_robin", "cache_threshold": 0.5}}, "router.cache_threshold"),
                           ({**request, "replicas": 0, "autoscaling": {"min_replicas": 0, "max_replicas": 1}}, "replicas"),
                           ({**request, "autoscaling": short}, "autoscaling.request_rate.window_seconds")):
            refused = await client.call_tool("deploy_model_server", bad)
            assert refused.is_error and refused.structured_content["error"]["errors"][0]["field"] == field, refused
            status, rest = rest_call(hypd, "deploy_model_server", bad)
            assert status == 422 and rest["error"] == refused.structured_content["error"], (rest, refused.structured_content)
        dry = structured(await client.call_tool("deploy_model_server", {**request, "dry_run": True}))
        planned = {(s["stage"], c["action"], c["kind"]) for s in dry["plan"]["stages"] for c in s["changes"]}
        assert {("router", "create", "k8s:v1/ServiceAccount"), ("router", "create", "k8s:rbac.authorization.k8s.io/v1/Role"),
                ("router", "create", "k8s:apps/v1/Deployment"),
                ("autoscaling", "create", "k8s:v1/ConfigMap"), ("autoscaling", "create", "k8s:apps/v1/Deployment"),
                ("autoscaling", "create", "k8s:v1/Service"),
                ("autoscaling", "create", "k8s:keda.sh/v1alpha1/ScaledObject")} <= planned, dry["plan"]
        waited = await finished(client, structured(await client.call_tool("deploy_model_server", request))["operation_id"])
        assert waited["operation"]["state"] == "succeeded", waited

        scaled = json.loads(kubectl(sim, name, "get", "scaledobject", "sg", "-o", "json"))
        jsonschema.validate(scaled, crd_schema("keda.sh_scaledobjects.yaml"))
        assert scaled["spec"]["triggers"][0]["metadata"]["url"] == "http://sg-router.default.svc.cluster.local:29000/metrics", scaled
        rate = scaled["spec"]["triggers"][1]
        assert (rate["type"], rate["metadata"]["serverAddress"], rate["metadata"]["threshold"]) == (
            "prometheus", "http://sg-prometheus.default.svc.cluster.local:9090", "2.5"), scaled
        config = json.loads(kubectl(sim, name, "get", "configmap", "sg-prometheus", "-o", "json"))
        assert "sg-router.default.svc.cluster.local:29000" in config["data"]["prometheus.yml"], config
        router = json.loads(kubectl(sim, name, "get", "deployment", "sg-router", "-o", "json"))
        command = router["spec"]["template"]["spec"]["containers"][0]["command"]
        assert command[command.index("--selector") + 1] == "hypd.dev/endpoint=sg", command
        assert command[command.index("--cache-threshold") + 1] == "0.5", command
        answer = structured(await client.call_tool("invoke_endpoint", {
            "name": name, "endpoint": "sg", "messages": [{"role": "user", "content": "Say hello to the router"}]}))
        assert answer["model"] == "sg" and answer["answer"], answer
        listed = structured(await client.call_tool("list_endpoints", {"name": name}))
        assert [(e["endpoint"], e.get("routing"), e["autoscaling"]["max_replicas"],
                 e["autoscaling"].get("request_rate_per_replica")) for e in listed["endpoints"]] == [
            ("sg", "cache_aware", 1, 2.5)], listed

        first = structured(await client.call_tool("delete_endpoint", {"name": name, "endpoint": "sg"}))
        waited = await finished(client, structured(await client.call_tool(
            "delete_endpoint", {"name": name, "endpoint": "sg", "confirmation": first["confirmation"]}))["operation_id"])
        assert waited["operation"]["state"] == "succeeded", waited
    left = json.loads(kubectl(sim, name, "get", "deployments,services,configmaps,scaledobjects,roles,serviceaccounts",
                              "-o", "json"))["items"]
    assert not [o for o in left if o["metadata"]["name"].startswith("sg")], left


async def fsx_through_mcp(server, hypd, sim):
    """An FSx for Lustre file system made through MCP (refused by field first, then
    planned, then created and linked to the shared bucket), its volume and claim Bound
    (kubectl), a Job kubectl starts mounting it runs to completion, and deleting it in
    two steps removes the file system."""
    import tempfile
    import time

    name = "mcp-gpu"
    fsx = aws("fsx", sim)
    job = {"apiVersion": "batch/v1", "kind": "Job",
           "metadata": {"name": "reads-fsx"},
           "spec": {"backoffLimit": 0, "template": {
               "metadata": {"annotations": {"sim.hypd.dev/run-seconds": "60"}},
               "spec": {"restartPolicy": "Never",
                        "containers": [{"name": "c", "image": "python:3.12", "command": ["ls", "/mnt/fast/shared"],
                                        "volumeMounts": [{"name": "d", "mountPath": "/mnt/fast"}]}],
                        "volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "fast"}}]}}}}
    async with Client(server) as client:
        bad = await client.call_tool("create_fsx_storage", {"name": name, "storage": "fast", "capacity_gib": 1000})
        assert bad.is_error and bad.structured_content["error"]["errors"][0]["field"] == "capacity_gib", bad
        status, body = rest_call(hypd, "create_fsx_storage", {"name": name, "storage": "fast", "capacity_gib": 1000})
        assert status == 422 and body == bad.structured_content, body
        request = {"name": name, "storage": "fast", "data_repositories": [{"file_system_path": "/shared"}]}
        dry = structured(await client.call_tool("create_fsx_storage", {**request, "dry_run": True}))
        planned = [(c["action"], c["kind"]) for s in dry["plan"]["stages"] for c in s["changes"]]
        assert ("create", "fsx:FileSystem") in planned and ("create", "fsx:DataRepositoryAssociation") in planned, dry
        waited = await finished(client, structured(await client.call_tool("create_fsx_storage", request))["operation_id"])
        op = waited["operation"]
        assert op["state"] == "succeeded", waited
        fs_id = op["outputs"]["file_system"]

        pv = json.loads(kubectl(sim, name, "get", "pv", f"fsx-{fs_id}", "-o", "json"))
        csi = pv["spec"]["csi"]
        assert csi["driver"] == "fsx.csi.aws.com" and csi["volumeHandle"] == fs_id, pv
        assert csi["volumeAttributes"] == {"dnsname": op["outputs"]["dns_name"], "mountname": op["outputs"]["mount_name"]}, pv
        claim = json.loads(kubectl(sim, name, "get", "pvc", "fast", "-o", "json"))
        assert claim["status"]["phase"] == "Bound", claim
        described = fsx.describe_file_systems(FileSystemIds=[fs_id])["FileSystems"][0]
        assert described["Lifecycle"] == "AVAILABLE" and described["DNSName"] == op["outputs"]["dns_name"], described

        # A Job mounting the claim runs to completion: the driver found the file system.
        with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
            json.dump(job, f)
            f.flush()
            kubectl(sim, name, "apply", "-f", f.name)
        for _ in range(240):
            status = json.loads(kubectl(sim, name, "get", "job", "reads-fsx", "-o", "json")).get("status", {})
            if status.get("succeeded") == 1 or status.get("failed"):
                break
            time.sleep(0.25)
        assert status.get("succeeded") == 1, status
        kubectl(sim, name, "delete", "job", "reads-fsx", "--wait=false")
        for _ in range(240):
            listed = structured(await client.call_tool("list_storage", {"name": name}))
            if not [u for s in listed["storage"] if s["name"] == "fast" for u in s["used_by"]]:
                break
            time.sleep(0.25)

        first = structured(await client.call_tool("delete_storage", {"name": name, "storage": "fast"}))
        deleted = {c["kind"] for s in first["plan"]["stages"] for c in s["changes"] if c["action"] == "delete"}
        assert "fsx:FileSystem" in deleted, first["plan"]
        confirmed = {"name": name, "storage": "fast", "confirmation": first["confirmation"]}
        waited = await finished(client, structured(await client.call_tool("delete_storage", confirmed))["operation_id"])
        assert waited["operation"]["state"] == "succeeded", waited
    left = [f["FileSystemId"] for f in fsx.describe_file_systems()["FileSystems"]]
    assert fs_id not in left, left


async def storage_through_mcp(server, hypd, sim):
    """A bucket of the user's mounted through MCP (the plan first, then the operation),
    bound in the API server and mounted by a pod kubectl starts; a file put in and
    listed at the path the pod sees; deleting the storage refused while the pod runs,
    then done in two steps, the user's bucket and its data left as they were."""
    import tempfile

    name = "mcp-gpu"
    s3 = aws("s3", hypd.env["AWS_ENDPOINT_URL"])
    s3.create_bucket(Bucket="mcp-user-datasets")
    async with Client(server) as client:
        mount = {"name": name, "storage": "datasets", "bucket": "mcp-user-datasets", "mount_path": "/mnt/datasets"}
        # The same field error as REST, from the same type.
        bad = await client.call_tool("create_s3_storage", {**mount, "mount_path": "/etc/data"})
        assert bad.is_error and bad.structured_content["error"]["errors"][0]["field"] == "mount_path", bad
        status, body = rest_call(hypd, "create_s3_storage", {**mount, "mount_path": "/etc/data"})
        assert status == 422 and body == bad.structured_content, body
        dry = structured(await client.call_tool("create_s3_storage", {**mount, "dry_run": True}))
        planned = [(c["action"], c["kind"]) for s in dry["plan"]["stages"] for c in s["changes"]]
        # The bucket exists: nothing is made of it; the driver's role is allowed it.
        assert planned == [("update", "iam:Role"), ("create", "k8s:v1/PersistentVolume"),
                           ("create", "k8s:v1/PersistentVolumeClaim")], dry
        waited = await finished(client, structured(await client.call_tool("create_s3_storage", mount))["operation_id"])
        assert waited["operation"]["state"] == "succeeded", waited
        claim = json.loads(kubectl(sim, name, "get", "pvc", "datasets", "-o", "json"))
        assert claim["status"]["phase"] == "Bound", claim
        checked = structured(await client.call_tool("check_storage", {"name": name}))
        assert checked["findings"] == [], checked
        assert any(c.startswith("datasets:") for c in checked["checked"]), checked

        put = structured(await client.call_tool("upload_storage_file", {
            "name": name, "storage": "datasets", "key": "sft/train.jsonl",
            "content_base64": base64.b64encode(b'{"prompt": "hi", "completion": "hello"}\n').decode()}))
        assert put["path_in_pods"] == "/mnt/datasets/sft/train.jsonl" and put["size_bytes"] == 40, put
        inside = structured(await client.call_tool("list_storage_contents", {"name": name, "storage": "datasets", "prefix": "sft/"}))
        assert [(f["key"], f["path_in_pods"]) for f in inside["files"]] == [("sft/train.jsonl", "/mnt/datasets/sft/train.jsonl")], inside

        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": "trainer", "annotations": {"sim.hypd.dev/run-seconds": "100000000"}},
               "spec": {"containers": [{"name": "c", "image": "python:3.12",
                                        "volumeMounts": [{"name": "d", "mountPath": "/mnt/datasets"}]}],
                        "volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "datasets"}}]}}
        with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
            json.dump(pod, f)
            f.flush()
            kubectl(sim, name, "apply", "-f", f.name)
        listed = structured(await client.call_tool("list_storage", {"name": name}))
        by_name = {x["name"]: x for x in listed["storage"]}
        assert [u["pod"] for u in by_name["datasets"]["used_by"]] == ["trainer"], listed
        assert by_name["shared-s3"]["shared"] and by_name["shared-s3"]["mount_path"] == "/s3", listed

        refused = await client.call_tool("delete_storage", {"name": name, "storage": "datasets"})
        assert refused.is_error, refused
        error = refused.structured_content["error"]["errors"][0]
        assert error["field"] == "storage" and "default/trainer" in error["message"], error
        kubectl(sim, name, "delete", "pod", "trainer", "--wait=false")
        first = structured(await client.call_tool("delete_storage", {"name": name, "storage": "datasets"}))
        deleted = {c["kind"] for s in first["plan"]["stages"] for c in s["changes"] if c["action"] == "delete"}
        assert deleted == {"k8s:v1/PersistentVolume", "k8s:v1/PersistentVolumeClaim"}, first["plan"]
        confirmed = {"name": name, "storage": "datasets", "confirmation": first["confirmation"]}
        waited = await finished(client, structured(await client.call_tool("delete_storage", confirmed))["operation_id"])
        assert waited["operation"]["state"] == "succeeded", waited
        assert waited["operation"]["outputs"]["kept"] == "kept bucket mcp-user-datasets: hypd did not create it", waited
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket="mcp-user-datasets").get("Contents", [])]
    assert keys == ["sft/train.jsonl"], keys


async def features_through_mcp(server, hypd, sim):
    """The training operator turned on through MCP (the plan first), the same request
    again with nothing to do, turned off in two steps, then on again: the cluster's
    deletion removes it with the rest."""
    name = "mcp-gpu"
    async with Client(server) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        assert set(tools["update_features"].input_schema["properties"]) >= {"training_operator", "confirmation"}
        before = structured(await client.call_tool("get_features", {"name": name}))
        by_feature = {f["feature"]: f for f in before["features"]}
        assert set(by_feature) == {"training_operator", "inference_operator", "tiered_checkpointing", "autoscaling",
                                   "kuberay_operator", "keda"}, before
        assert by_feature["training_operator"]["enabled"] is False and by_feature["training_operator"]["changeable"] is True
        cert = next(c for c in before["components"] if c["name"] == "cert-manager")
        assert cert["status"] == "ACTIVE" and cert["with_cluster"] is True and "training_operator" in cert["needed_by"], cert

        # The same field error as REST, from the same type.
        empty = await client.call_tool("update_features", {"name": name})
        assert empty.is_error
        with hypd.client(hypd.admin_token) as rest:
            r = rest.post(f"/api/v1/clusters/{name}/features", json={})
        assert r.status_code == 422 and r.json() == empty.structured_content, (r.text, empty.structured_content)

        on = {"name": name, "training_operator": True}
        dry = structured(await client.call_tool("update_features", {**on, "dry_run": True}))
        kinds = {c["kind"] for s in dry["plan"]["stages"] for c in s["changes"]}
        assert kinds == {"eks:Addon", "eks:PodIdentityAssociation", "iam:Role"}, dry
        waited = await finished(client, structured(await client.call_tool("update_features", on))["operation_id"])
        assert waited["operation"]["state"] == "succeeded", waited
        controller = json.loads(kubectl(sim, name, "-n", "aws-hyperpod", "get", "deployment",
                                        "hp-training-operator-hp-training-controller-manager", "-o", "json"))
        assert controller["status"]["availableReplicas"] >= 1, controller["status"]
        crd = kubectl(sim, name, "get", "crd", "hyperpodpytorchjobs.sagemaker.amazonaws.com", "-o", "name")
        assert "hyperpodpytorchjobs" in crd, crd

        # Already on: the operation has nothing to do.
        waited = await finished(client, structured(await client.call_tool("update_features", on))["operation_id"])
        assert waited["operation"]["stages"] == [] and waited["operation"]["note"].startswith("nothing to do"), waited

        off = {"name": name, "training_operator": False}
        first = structured(await client.call_tool("update_features", off))
        assert "Nothing was done" in first["message"], first
        deleted = {c["kind"] for s in first["plan"]["stages"] for c in s["changes"] if c["action"] == "delete"}
        assert deleted == {"eks:Addon", "eks:PodIdentityAssociation", "iam:Role"}, first["plan"]
        confirmed = {**off, "confirmation": first["confirmation"]}
        waited = await finished(client, structured(await client.call_tool("update_features", confirmed))["operation_id"])
        assert waited["operation"]["state"] == "succeeded", waited
        # EKS removes what the add-on installed with it; the cluster's own add-ons stay.
        crds = kubectl(sim, name, "get", "crd", "-o", "name")
        assert "hyperpodpytorchjobs" not in crds, crds
        after = structured(await client.call_tool("get_features", {"name": name}))
        assert {f["feature"]: f["enabled"] for f in after["features"]}["training_operator"] is False, after
        cert = next(c for c in after["components"] if c["name"] == "cert-manager")
        assert cert["status"] == "ACTIVE", cert

        waited = await finished(client, structured(await client.call_tool("update_features", on))["operation_id"])
        assert waited["operation"]["state"] == "succeeded", waited

        # Tiered checkpointing beside it, with a rule broken first (the same field error).
        low = await client.call_tool("update_features", {"name": name, "tiered_checkpointing": True, "tiered_memory_percent": 5})
        assert low.is_error and low.structured_content["error"]["errors"][0]["field"] == "tiered_memory_percent", low
        tiered = {"name": name, "tiered_checkpointing": True, "tiered_memory_percent": 50}
        waited = await finished(client, structured(await client.call_tool("update_features", tiered))["operation_id"])
        assert [s["name"] for s in waited["operation"]["stages"]] == ["tiered_checkpointing"], waited
        assert waited["operation"]["state"] == "succeeded", waited
        account = json.loads(kubectl(sim, name, "get", "serviceaccount", "hypd-tiered-checkpointing", "-o", "json"))
        assert account["metadata"]["annotations"]["eks.amazonaws.com/role-arn"].endswith(f"role/hypd-{name}-tiered-ckpt"), account
        now = {f["feature"]: f for f in structured(await client.call_tool("get_features", {"name": name}))["features"]}
        assert now["tiered_checkpointing"]["enabled"] and now["training_operator"]["enabled"], now
        assert "50% of instance memory" in now["tiered_checkpointing"]["details"], now["tiered_checkpointing"]

        # Managed Karpenter: its scope said where it is offered; a group it cannot scale
        # refused by field; on with the plan first; off in two steps.
        assert "never other EC2 capacity" in tools["update_features"].description
        nope = await client.call_tool("update_features", {"name": name, "autoscaling": True, "autoscaling_groups": ["nope"]})
        assert nope.is_error and nope.structured_content["error"]["errors"][0]["field"] == "autoscaling_groups[0]", nope
        scale = {"name": name, "autoscaling": True}
        dry = structured(await client.call_tool("update_features", {**scale, "dry_run": True}))
        kinds = {c["kind"] for s in dry["plan"]["stages"] for c in s["changes"]}
        assert kinds == {"iam:Role", "sagemaker:Cluster", "k8s:karpenter.sh/v1/NodePool",
                         "k8s:karpenter.sagemaker.amazonaws.com/v1/HyperpodNodeClass"}, dry
        waited = await finished(client, structured(await client.call_tool("update_features", scale))["operation_id"])
        assert [s["name"] for s in waited["operation"]["stages"]] == ["autoscaling"], waited
        assert waited["operation"]["state"] == "succeeded", waited
        node_class = json.loads(kubectl(sim, name, "get", "hyperpodnodeclass", "hypd", "-o", "json"))
        assert node_class["spec"]["instanceGroups"] == ["gpu"], node_class
        ready = {c["type"]: c["status"] for c in node_class["status"]["conditions"]}
        assert ready["Ready"] == "True", node_class["status"]
        pool = json.loads(kubectl(sim, name, "get", "nodepool", "hypd", "-o", "json"))
        assert pool["spec"]["template"]["spec"]["nodeClassRef"]["name"] == "hypd", pool
        first = structured(await client.call_tool("update_features", {"name": name, "autoscaling": False}))
        deleted = {c["kind"] for s in first["plan"]["stages"] for c in s["changes"] if c["action"] == "delete"}
        assert deleted == {"iam:Role", "k8s:karpenter.sh/v1/NodePool",
                           "k8s:karpenter.sagemaker.amazonaws.com/v1/HyperpodNodeClass"}, first["plan"]
        confirmed = {"name": name, "autoscaling": False, "confirmation": first["confirmation"]}
        waited = await finished(client, structured(await client.call_tool("update_features", confirmed))["operation_id"])
        assert waited["operation"]["state"] == "succeeded", waited
        assert "hypd" not in kubectl(sim, name, "get", "nodepools", "-o", "name")
        now = {f["feature"]: f for f in structured(await client.call_tool("get_features", {"name": name}))["features"]}
        assert not now["autoscaling"]["enabled"] and now["tiered_checkpointing"]["enabled"], now

        # The inference operator: the FSx driver it needs and its own parts in the plan;
        # its controller and CRDs in Kubernetes; off in two steps, the FSx driver with it.
        serve = {"name": name, "inference_operator": True}
        dry = structured(await client.call_tool("update_features", {**serve, "dry_run": True}))
        assert [s["stage"] for s in dry["plan"]["stages"]] == ["components", "inference_operator"], dry
        made = {c["kind"] for s in dry["plan"]["stages"] for c in s["changes"] if c["action"] == "create"}
        assert made == {"s3:Bucket", "iam:Role", "eks:Addon", "eks:PodIdentityAssociation"}, dry
        waited = await finished(client, structured(await client.call_tool("update_features", serve))["operation_id"])
        assert waited["operation"]["state"] == "succeeded", waited
        controller = json.loads(kubectl(sim, name, "-n", "hyperpod-inference-system", "get", "deployment",
                                        "hyperpod-inference-controller-manager", "-o", "json"))
        assert controller["status"]["availableReplicas"] >= 1, controller["status"]
        assert "jumpstartmodels" in kubectl(sim, name, "get", "crd", "-o", "name")
        now = {f["feature"]: f for f in structured(await client.call_tool("get_features", {"name": name}))["features"]}
        assert now["inference_operator"]["enabled"] and now["training_operator"]["enabled"], now
        assert f"TLS certificates in bucket hypd-{name}-123456789012-tls" in now["inference_operator"]["details"], now
        first = structured(await client.call_tool("update_features", {"name": name, "inference_operator": False}))
        deleted = {c["kind"] for s in first["plan"]["stages"] for c in s["changes"] if c["action"] == "delete"}
        assert deleted == {"s3:Bucket", "iam:Role", "eks:Addon", "eks:PodIdentityAssociation"}, first["plan"]
        confirmed = {"name": name, "inference_operator": False, "confirmation": first["confirmation"]}
        waited = await finished(client, structured(await client.call_tool("update_features", confirmed))["operation_id"])
        assert waited["operation"]["state"] == "succeeded", waited
        after = structured(await client.call_tool("get_features", {"name": name}))
        fsx = next(c for c in after["components"] if c["name"] == "aws-fsx-csi-driver")
        assert fsx["status"] == "absent", fsx
        assert "jumpstartmodels" not in kubectl(sim, name, "get", "crd", "-o", "name")

        # KubeRay: its pinned upstream release, applied object by object with hypd's
        # label; off in two steps, CRDs included.
        ray = {"name": name, "kuberay_operator": True}
        waited = await finished(client, structured(await client.call_tool("update_features", ray))["operation_id"])
        assert waited["operation"]["state"] == "succeeded", waited
        operator = json.loads(kubectl(sim, name, "get", "deployment", "kuberay-operator", "-o", "json"))
        assert operator["spec"]["template"]["spec"]["containers"][0]["image"] == "quay.io/kuberay/operator:v1.7.0"
        assert operator["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "hypd", operator["metadata"]
        assert operator["status"]["availableReplicas"] >= 1, operator["status"]
        now = {f["feature"]: f for f in structured(await client.call_tool("get_features", {"name": name}))["features"]}
        assert now["kuberay_operator"]["enabled"] and now["kuberay_operator"]["version"] == "v1.7.0", now
        first = structured(await client.call_tool("update_features", {**ray, "kuberay_operator": False}))
        deleted = {(c["kind"], c["name"]) for s in first["plan"]["stages"] for c in s["changes"] if c["action"] == "delete"}
        assert ("k8s:apiextensions.k8s.io/v1/CustomResourceDefinition", "rayjobs.ray.io") in deleted, first["plan"]
        assert len(deleted) == 11, first["plan"]
        confirmed = {**ray, "kuberay_operator": False, "confirmation": first["confirmation"]}
        waited = await finished(client, structured(await client.call_tool("update_features", confirmed))["operation_id"])
        assert waited["operation"]["state"] == "succeeded", waited
        assert "ray.io" not in kubectl(sim, name, "get", "crd", "-o", "name")

        # KEDA on its own, while the inference operator (whose add-on brings its own) is
        # off: the release with its APIService; the inference operator is refused beside
        # it by the same field error as REST; off in two steps, CRDs included.
        keda = {"name": name, "keda": True}
        waited = await finished(client, structured(await client.call_tool("update_features", keda))["operation_id"])
        assert waited["operation"]["state"] == "succeeded", waited
        assert "v1beta1.external.metrics.k8s.io" in kubectl(sim, name, "get", "apiservices", "-o", "name")
        refused = await client.call_tool("update_features", serve)
        assert refused.is_error, refused.content
        error = refused.structured_content["error"]["errors"][0]
        assert error["field"] == "inference_operator" and "turn keda off first" in error["message"], error
        first = structured(await client.call_tool("update_features", {**keda, "keda": False}))
        confirmed = {**keda, "keda": False, "confirmation": first["confirmation"]}
        waited = await finished(client, structured(await client.call_tool("update_features", confirmed))["operation_id"])
        assert waited["operation"]["state"] == "succeeded", waited
        assert "keda.sh" not in kubectl(sim, name, "get", "crd", "-o", "name")

        # On again: the cluster's deletion removes its bucket and roles with the rest.
        waited = await finished(client, structured(await client.call_tool("update_features", serve))["operation_id"])
        assert waited["operation"]["state"] == "succeeded", waited


async def keys_through_mcp(server, hypd):
    """Every command that takes an idempotency key holds it to its request on both
    faces (create and import are held where they run, above)."""
    unknown = "i-00000000000000dea"
    extra = {"name": "extra", "instance_type": "ml.g5.8xlarge", "instance_count": 1}
    async with Client(server) as client:
        async def ok(tool, request, other):
            op = await keyed(client, hypd, tool, request, other)
            assert op["state"] == "succeeded", (tool, op)

        await ok("reconcile_cluster", {"name": "mcp-gpu"}, {"name": "mcp-no-such-cluster"})
        await ok("add_instance_group", {"name": "mcp-gpu", "group": extra},
                 {"name": "mcp-gpu", "group": {**extra, "instance_count": 2}})
        await ok("update_instance_group", {"name": "mcp-gpu", "group": "extra", "kubernetes_labels": {"team": "a"}},
                 {"name": "mcp-gpu", "group": "extra", "kubernetes_labels": {"team": "b"}})
        [node] = structured(await client.call_tool("list_nodes", {"name": "mcp-gpu", "group": "extra"}))["nodes"]
        for tool in ["reboot_nodes", "replace_nodes"]:
            await ok(tool, {"name": "mcp-gpu", "node_ids": [node["node_id"]]}, {"name": "mcp-gpu", "node_ids": [unknown]})
            [node] = structured(await client.call_tool("list_nodes", {"name": "mcp-gpu", "group": "extra"}))["nodes"]
        await ok("update_cluster_software", {"name": "mcp-gpu", "groups": ["extra"], "image_release": "2025.09.15"},
                 {"name": "mcp-gpu", "groups": ["gpu"], "image_release": "2025.09.15"})
        await ok("delete_nodes", {"name": "mcp-gpu", "node_ids": [node["node_id"]]}, {"name": "mcp-gpu", "node_ids": [unknown]})
        await ok("delete_instance_group", {"name": "mcp-gpu", "group": "extra"}, {"name": "mcp-gpu", "group": "gpu"})
        await ok("update_features", {"name": "mcp-gpu", "training_operator": True},
                 {"name": "mcp-gpu", "kuberay_operator": True})


async def delete_in_two_steps(server, hypd):
    """delete_cluster as an agent does it: the plan first, then the confirmed call."""
    async with Client(server) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        assert "confirmation" in tools["delete_cluster"].description
        assert {"confirmation", "dry_run"} <= set(tools["delete_cluster"].input_schema["properties"])

        dry = structured(await client.call_tool("delete_cluster", {"name": "mcp-gpu", "dry_run": True}))
        kinds = {c["kind"] for s in dry["plan"]["stages"] for c in s["changes"] if c["action"] == "delete"}
        assert {"sagemaker:Cluster", "eks:Cluster", "ec2:Vpc", "iam:Role", "hypd:Cluster"} <= kinds, dry
        assert "confirmation" not in dry

        first = structured(await client.call_tool("delete_cluster", {"name": "mcp-gpu"}))
        assert first["plan"] == dry["plan"]
        assert "Nothing was done" in first["message"]
        still = structured(await client.call_tool("get_cluster", {"name": "mcp-gpu"}))
        assert still["status"] == "active"

        wrong = await client.call_tool(
            "delete_cluster", {"name": "mcp-gpu", "confirmation": "hypd_confirm_" + "0" * 64}
        )
        assert wrong.is_error
        assert wrong.structured_content["error"]["errors"][0]["field"] == "confirmation"

        request = {"name": "mcp-gpu", "idempotency_key": "delete-mcp-gpu-1"}
        first = structured(await client.call_tool("delete_cluster", request))
        confirmed = {**request, "confirmation": first["confirmation"]}
        started = structured(await client.call_tool("delete_cluster", confirmed))
        assert started["created"] is True
        again = structured(await client.call_tool("delete_cluster", confirmed))
        assert again["operation_id"] == started["operation_id"] and again["created"] is False
        await key_held(client, hypd, "delete_cluster", request, {"name": "mcp-other"}, started["operation_id"])
        waited = await finished(client, started["operation_id"])
        assert waited["operation"]["state"] == "succeeded", waited
        gone = await client.call_tool("get_cluster", {"name": "mcp-gpu"})
        assert gone.is_error and gone.structured_content["error"]["kind"] == "not_found"


GROUP = {"name": "gpu", "instance_type": "ml.g5.8xlarge", "instance_count": 1}
BASE_CLUSTER = {"name": "schema-1", "availability_zone": "us-east-1a", "instance_groups": [GROUP]}


def with_group(**fields):
    return {**BASE_CLUSTER, "instance_groups": [{**GROUP, **fields}]}


# (tool, arguments): each is refused by decode, so the tool's input schema must refuse it
# too (an agent that validates before calling learns the same rule).
REFUSED = [
    ("create_cluster", {**BASE_CLUSTER, "network": []}),
    ("create_cluster", {**BASE_CLUSTER, "network": ["10.0.0.0/16"]}),
    ("create_cluster", {**BASE_CLUSTER, "storage": []}),
    ("create_cluster", with_group(capacity=["spot"])),
    ("create_cluster", with_group(capacity={"type": "reserved"})),
    ("create_cluster", {**BASE_CLUSTER, "name": "bad_name"}),
    ("create_cluster", {**BASE_CLUSTER, "name": "a" * 64}),
    ("create_cluster", with_group(instance_count=2001)),
    ("create_cluster", with_group(instance_count=1.5)),
    ("create_cluster", {**BASE_CLUSTER, "colour": "blue"}),
    ("create_cluster", {**BASE_CLUSTER, "instance_groups": {"gpu": GROUP}}),
    ("create_cluster", {**BASE_CLUSTER, "storage": {"s3_bucket": "Bad_Bucket"}}),
    ("create_cluster", {**BASE_CLUSTER, "network": {"vpc_cidr": "10.0.0.0/8"}}),
    ("create_cluster", {**BASE_CLUSTER, "region": "r" * 40}),
    ("delete_cluster", {"name": "ml-1", "confirmation": "yes"}),
    ("delete_cluster", {"name": "ml-1", "dry_run": "yes"}),
    ("wait_operation", {"operation_id": "x", "timeout_seconds": 301}),
    ("wait_operation", {"operation_id": "x", "timeout_seconds": -1}),
    ("wait_operation", {"operation_id": "x", "timeout_seconds": 2.5}),
    ("wait_operation", {"operation_id": "x", "timeout_seconds": "ten"}),
    ("get_operation", {"operation_id": "o" * 129}),
    ("get_operation", {}),
    ("list_operations", {"target": "c" * 201}),
    ("list_operations", {"state": "exploded"}),
    ("list_instance_types", {"availability_zone": "mars-1"}),
    ("list_instance_types", {"instance_types": ["P5"]}),
    ("list_instance_types", {"instance_types": ["p5.48xlarge"] * 101}),
    ("create_token", {"name": "ci bot", "role": "viewer"}),
    ("create_token", {"name": "ci", "role": "root"}),
]

ACCEPTED = [
    ("create_cluster", BASE_CLUSTER),
    (
        "create_cluster",
        {
            **with_group(
                capacity={"type": "training_plan", "training_plan_arn": "arn:aws:sagemaker:us-east-1:123456789012:training-plan/p"},
                efa_only=False,
                deep_health_checks=True,
                volume_size_gb=1000,
            ),
            "region": "us-east-1",
            "network": {"vpc_cidr": "10.1.0.0/16"},
            "storage": {"s3_bucket": "my-bucket"},
            "kubernetes_version": "1.33",
            "idempotency_key": "key-12345678",
        },
    ),
    ("create_cluster", {**BASE_CLUSTER, "region": None, "kubernetes_version": None}),
    ("delete_cluster", {"name": "ml-1", "dry_run": True}),
    ("delete_cluster", {"name": "ml-1", "confirmation": "hypd_confirm_" + "a" * 64}),
    ("wait_operation", {"operation_id": "op-1", "timeout_seconds": 0}),
    ("list_instance_types", {"availability_zone": "us-east-1a", "instance_types": ["p5.48xlarge"], "refresh": True}),
    ("list_operations", {"state": "running", "target": "cluster/ml-1"}),
    ("list_clusters", {}),
]


async def playbooks_as_written(server, over_http):
    """The workflow playbooks run as their `flow` declares, by a scripted agent over
    `hypd mcp` (stdio): create-cluster makes a cluster the sandbox shows active,
    add-instance-group, enable-features, download-model, submit-training-job and the
    three deploy playbooks grow it and put it to work, delete-safely takes it away again; each run keeps the order every workflow keeps
    (inspect, plan, apply, follow to the end), and the same run with a step left out, or
    a confirmation it was not given, breaks it."""
    name = "pb-flow"
    group = {"name": "gpu", "instance_type": "ml.g5.8xlarge", "instance_count": 1}
    where = {"region": "us-east-1", "availability_zone": "us-east-1a"}
    async with Client(over_http) as direct:
        served = (await direct.list_tools()).tools
    async with Client(server) as client:
        listed = (await client.list_tools()).tools
        # The bridge lists exactly what /mcp serves.
        assert [t.model_dump() for t in listed] == [t.model_dump() for t in served]

        def effect(t):
            a = t.annotations
            return "read_only" if a.read_only_hint else "mutating" if a.destructive_hint is False else "destructive"
        effects = {t.name: effect(t) for t in listed}

        made = await playbook_flow.run(client, "create-cluster", {
            "list_availability_zones": {"region": where["region"]},
            "list_instance_types": {**where, "accelerated_only": True},
            "create_cluster": {"name": name, **where, "instance_groups": [group]},
            "get_cluster": {"name": name},
        })
        assert playbook_flow.check(made, effects, {}) is None, [c.tool for c in made]
        assert [c.tool for c in made][:5] == ["whoami", "list_clusters", "list_regions",
                                               "list_availability_zones", "list_instance_types"]
        assert made[-2].answer["operation"]["state"] == "succeeded", made[-2].answer
        assert made[-1].answer["status"] == "active", made[-1].answer

        # Then the cluster's other workflows, each as its playbook declares it.
        grown = await playbook_flow.run(client, "add-instance-group", {
            "list_instance_groups": {"name": name},
            "list_instance_types": {"availability_zone": where["availability_zone"], "accelerated_only": True},
            "add_instance_group": {"name": name, "group": {**group, "name": "spot", "instance_count": 3,
                                                           "capacity": {"type": "spot"}}},
        })
        enabled = await playbook_flow.run(client, "enable-features", {
            "get_features": {"name": name},
            "update_features": {"name": name, "training_operator": True, "inference_operator": True}})
        fetched = await playbook_flow.run(client, "download-model", {
            "list_storage": {"name": name}, "list_models": {"name": name},
            "download_model": {"name": name, "model": "Qwen/Qwen2.5-0.5B"}})
        # A PyTorch job on the gpu group (its script uploaded first), a vLLM server of the
        # downloaded model on the spot group.
        script = base64.b64encode(b"import torch\nprint('training')\n").decode()
        await client.call_tool("upload_storage_file", {"name": name, "storage": "shared-s3",
                                                       "key": "scripts/train.py", "content_base64": script})
        job = {"name": name, "job": "pb-train", "instance_group": "gpu",
               "recipe": {"kind": "pytorch", "script": "/s3/scripts/train.py"}}
        trained = await playbook_flow.run(client, "submit-training-job", {
            "list_training_jobs": {"name": name}, "check_training_job": job, "submit_training_job": job,
            "get_training_job": {"name": name, "job": "pb-train"}})
        served = await playbook_flow.run(client, "deploy-model-server", {
            "list_models": {"name": name}, "list_endpoints": {"name": name},
            "deploy_model_server": {"name": name, "endpoint": "pb-chat", "engine": "vllm", "instance_group": "spot",
                                    "command": "vllm serve /s3/models/Qwen/Qwen2.5-0.5B --served-model-name qwen"},
            "invoke_endpoint": {"name": name, "endpoint": "pb-chat", "messages": [{"role": "user", "content": "Hi"}]}})
        # The same model through the inference operator, then a catalogue model; each on
        # a spot node of its own.
        hello = [{"role": "user", "content": "Hi"}]
        managed = await playbook_flow.run(client, "deploy-inference-endpoint", {
            "get_features": {"name": name}, "list_models": {"name": name}, "list_endpoints": {"name": name},
            "deploy_inference_endpoint": {
                "name": name, "endpoint": "pb-kv", "engine": "vllm", "instance_group": "spot", "routing": "kv_aware",
                "command": "vllm serve /s3/models/Qwen/Qwen2.5-0.5B --served-model-name qwen"},
            "invoke_endpoint": {"name": name, "endpoint": "pb-kv", "messages": hello}})
        catalogue = await playbook_flow.run(client, "deploy-jumpstart-model", {
            "list_jumpstart_models": {"name": name, "search": "qwen"}, "list_endpoints": {"name": name},
            "deploy_jumpstart_model": {"name": name, "endpoint": "pb-js", "instance_group": "spot",
                                       "model_id": "huggingface-llm-qwen2-5-7b-instruct"},
            "invoke_endpoint": {"name": name, "endpoint": "pb-js", "messages": hello}})
        assert managed[-1].answer["answer"] and catalogue[-1].answer["answer"], (managed[-1].answer, catalogue[-1].answer)
        assert trained[-1].answer["phase"] == "running", trained[-1].answer
        assert served[-1].answer["model"] == "qwen" and served[-1].answer["answer"], served[-1].answer
        for trace in (grown, enabled, fetched, trained, served, managed, catalogue):
            assert playbook_flow.check(trace, effects, {}) is None, [c.tool for c in trace]
            assert trace[-2].answer["operation"]["state"] == "succeeded", trace[-2].answer
        assert "spot" in [g["name"] for g in grown[-1].answer["instance_groups"]], grown[-1].answer
        assert [f["enabled"] for f in enabled[-1].answer["features"] if f["feature"] == "training_operator"] == [True]
        assert "Qwen/Qwen2.5-0.5B" in [m["model"] for m in fetched[-1].answer["models"]], fetched[-1].answer

        gone = await playbook_flow.run(client, "delete-safely", {
            tool: {"name": name} for tool in ("get_cluster", "list_endpoints", "list_training_jobs", "delete_cluster")})
        assert playbook_flow.check(gone, effects, {}) is None, [c.tool for c in gone]
        assert gone[-2].answer["operation"]["state"] == "succeeded", gone[-2].answer
        assert name not in [c["name"] for c in gone[-1].answer["clusters"]], gone[-1].answer

    # A run that skips a step, or applies what it was not given, is refused.
    def without(trace, drop):
        return [c for c in trace if not drop(c)]
    broken = {
        "applied without its plan first": without(made, lambda c: c.args.get("dry_run") is True),
        "was followed to its end": without(made, lambda c: c.tool == "wait_operation") + gone,
        "never followed to its end": without(gone, lambda c: c.tool == "wait_operation"),
        "before anything was inspected": without(made, lambda c: effects[c.tool] == "read_only"),
        "without the confirmation its plan answered": [
            playbook_flow.Call(c.tool, {**c.args, "confirmation": "forged"} if "confirmation" in c.args else c.args, c.answer)
            for c in gone],
    }
    for why, trace in broken.items():
        said = playbook_flow.check(trace, effects, {})
        assert said and why in said, (why, said)


def test_workflow_playbooks_run_as_written_and_in_order(hypd):
    anyio.run(playbooks_as_written, stdio_transport(hypd, hypd.admin_token), http_transport(hypd, hypd.admin_token))


async def capacity_through_mcp(server, hypd, plan_arn):
    """list_capacity: the account's HyperPod quota of a type with its use and what is
    free, and the training plan that reserves it, the same on REST; a type that is not a
    HyperPod one is refused by field."""
    asked = {"instance_types": ["ml.p5.48xlarge"]}
    async with Client(server) as client:
        found = structured(await client.call_tool("list_capacity", asked))
        [quota] = found["quotas"]
        assert quota["instance_type"] == "ml.p5.48xlarge" and quota["quota"] == 4, quota
        assert quota["free"] == quota["quota"] - quota["in_use"], quota
        [plan] = [p for p in found["training_plans"] if p["arn"] == plan_arn]
        assert plan["name"] == "cap-run" and plan["status"] == "Active", plan
        assert [(r["instance_type"], r["availability_zone"]) for r in plan["reserved"]] == [
            ("ml.p5.48xlarge", "us-east-1a")], plan
        with hypd.client(hypd.admin_token) as rest:
            r = rest.get("/api/v1/capacity", params={"instance_types": "ml.p5.48xlarge"})
        assert r.status_code == 200, r.text
        assert {**r.json(), "fetched_at": None} == {**found, "fetched_at": None}, (r.json(), found)
        bad = await client.call_tool("list_capacity", {"instance_types": ["p5.48xlarge"]})
        assert bad.is_error and bad.structured_content["error"]["errors"][0]["field"] == "instance_types[0]", bad


def test_capacity_shows_quotas_their_use_and_training_plans(hypd, sim):
    # The p5 offering: the g6e one is the instance groups' test's to buy.
    httpx.put(f"{sim}/_sim/sagemaker/quotas", json={"ml.p5.48xlarge": 4}).raise_for_status()
    plan = bought_training_plan(sim, "cap-run", "tpo-p5-2-use1a")
    anyio.run(capacity_through_mcp, http_transport(hypd, hypd.admin_token), hypd, plan)


def test_tools_are_compact_and_check_what_decode_checks(hypd):
    """tools/list was 68 kB for 18 tools, then 76 kB for 59; schemas share what repeats
    within a tool and drop what only decorates, the fields every mutation shares are
    described once in the server's instructions, descriptions say when to call and what
    to ask: at most 1,000 bytes a tool, and the schemas still refuse what decode
    refuses."""
    from jsonschema import Draft202012Validator

    headers = mcp_session(hypd, hypd.admin_token)
    r = httpx.post(f"{hypd.url}/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}, headers=headers)
    assert r.status_code == 200, r.text
    tools = {t["name"]: t for t in rpc_answer(r)["result"]["tools"]}
    # One tool per command of the registry, as REST has one operation per command.
    spec = httpx.get(f"{hypd.url}/api/v1/openapi.json", headers={"Authorization": f"Bearer {hypd.admin_token}"}).json()
    operations = {o["operationId"] for path in spec["paths"].values() for o in path.values() if isinstance(o, dict) and "operationId" in o}
    assert set(tools) == operations, set(tools) ^ operations
    per_tool = len(r.content) / len(tools)
    print(f"tools/list: {len(r.content)} bytes, {per_tool:.0f} per tool")
    largest = sorted(((len(json.dumps(t)), n) for n, t in tools.items()), reverse=True)[:6]
    assert per_tool <= 1000, f"{len(r.content)} bytes for {len(tools)} tools; the largest: {largest}"
    # The shared fields go undescribed in every tool because the instructions say them.
    init = httpx.post(f"{hypd.url}/mcp", headers={k: v for k, v in headers.items() if k != "Mcp-Session-Id"},
                      json={"jsonrpc": "2.0", "id": 2, "method": "initialize", "params": {
                          "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}})
    instructions = rpc_answer(init)["result"]["instructions"]
    assert all(f"`{field}" in instructions for field in ("dry_run", "confirmation", "idempotency_key")), instructions
    assert "description" not in tools["delete_cluster"]["inputSchema"]["properties"]["confirmation"]

    for tool in tools.values():
        Draft202012Validator.check_schema(tool["inputSchema"])
        if "outputSchema" in tool:
            Draft202012Validator.check_schema(tool["outputSchema"])
    for name, args in ACCEPTED:
        errors = list(Draft202012Validator(tools[name]["inputSchema"]).iter_errors(args))
        assert not errors, (name, args, [e.message for e in errors])

    async def refused_by_decode():
        async with Client(http_transport(hypd, hypd.admin_token)) as client:
            for name, args in REFUSED:
                result = await client.call_tool(name, args)
                assert result.is_error, (name, args)
                assert result.structured_content["error"]["kind"] == "validation", (name, result.structured_content)

    anyio.run(refused_by_decode)
    for name, args in REFUSED:
        assert not Draft202012Validator(tools[name]["inputSchema"]).is_valid(args), (name, args)


def test_results_carry_the_data_once(hypd):
    """structuredContent holds the answer; the text block (for clients that read only
    text) is the same JSON, compact, not a pretty-printed second copy."""

    async def check():
        async with Client(http_transport(hypd, hypd.admin_token)) as client:
            result = await client.call_tool("list_regions", {})
            text = result.content[0].text
            assert json.loads(text) == result.structured_content
            assert text == json.dumps(result.structured_content, separators=(",", ":"), ensure_ascii=False)
            bad = await client.call_tool("get_cluster", {"name": "bad_name"})
            assert json.loads(bad.content[0].text) == bad.structured_content

    anyio.run(check)
