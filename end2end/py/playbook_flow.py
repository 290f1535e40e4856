"""Workflow playbooks as checked state machines: a playbook's declared `flow` run as
written by a scripted agent (no language model) over MCP, and the order every run must
keep checked on the calls it made. The grammar is the one server/src/agent.rs checks
statically: phases separated by `>`, the calls of a phase by `,`; `tool(dry_run)` plans a
change, a destructive tool's bare call plans it (or, after a dry run, applies it when it
destroys nothing), `tool(confirmation)` applies it."""

import json
import pathlib
from dataclasses import dataclass, field

PLAYBOOKS = pathlib.Path(__file__).resolve().parents[2] / "playbooks"


@dataclass
class Call:
    tool: str
    args: dict
    answer: dict = field(default_factory=dict)


def front_matter(name):
    text = (PLAYBOOKS / f"{name}.md").read_text()
    front = text.split("---\n")[1]
    return dict(line.split(": ", 1) for line in front.splitlines() if ": " in line)


def flow(name):
    """The playbook's phases: lists of (tool, marker or None)."""
    phases = []
    for phase in front_matter(name)["flow"].split(">"):
        calls = []
        for call in filter(None, (c.strip() for c in phase.split(","))):
            tool, _, marker = call.partition("(")
            calls.append((tool.strip(), marker.rstrip(")").strip() or None))
        phases.append(calls)
    return phases


def structured(result):
    assert not result.is_error, result.content
    return result.structured_content or json.loads(result.content[0].text)


async def run(client, name, scenario):
    """Runs playbook `name`'s flow with each tool's arguments from `scenario`; the
    calls made, in order. A plan's answer hands its confirmation to the apply, an
    apply's operation is followed with wait_operation until it is final."""
    trace = []
    confirmation = operation = None

    async def call(tool, args):
        answer = structured(await client.call_tool(tool, args))
        trace.append(Call(tool, args, answer))
        return answer

    for phase in flow(name):
        for tool, marker in phase:
            args = dict(scenario.get(tool, {}))
            if tool == "wait_operation":
                assert operation, f"{name}: wait_operation with no operation to follow"
                while (await call(tool, {"operation_id": operation, "timeout_seconds": 60}))["timed_out"]:
                    pass
                continue
            if marker == "dry_run":
                args["dry_run"] = True
            elif marker == "confirmation":
                args["confirmation"] = confirmation
            answer = await call(tool, args)
            confirmation = answer.get("confirmation", confirmation)
            operation = answer.get("operation_id", operation)
    return trace


def check(trace, effects, status_tools):
    """The order every workflow keeps, on the calls a run made; the first it breaks, or
    None. `effects`: tool -> read_only | mutating | destructive (from tools/list's
    annotations); `status_tools`: tool -> the tool that decides its completion."""
    inspected = False
    planned = []  # (tool, args without the gate fields, confirmation answered)
    following = None  # (operation id, status tool) of an applied change not yet final
    for c in trace:
        effect = effects[c.tool]
        if following and c.tool in ("wait_operation", following[1]):
            op = c.answer.get("operation", c.answer)
            if op.get("operation_id") == following[0] and op.get("state") in ("succeeded", "failed", "cancelled"):
                following = None
            continue
        if effect == "read_only":
            inspected = True
            continue
        if not inspected:
            return f"{c.tool} before anything was inspected"
        if following:
            return f"{c.tool} before operation {following[0]} was followed to its end"
        bare = {k: v for k, v in c.args.items() if k not in ("dry_run", "confirmation")}
        # A destructive tool's first call is its plan unless its gate let it through (it
        # destroys nothing): then it answers with the operation.
        is_plan = c.args.get("dry_run") is True or (
            effect == "destructive" and "confirmation" not in c.args and "operation_id" not in c.answer)
        if is_plan:
            planned.append((c.tool, bare, c.answer.get("confirmation")))
            continue
        plan = next((p for p in reversed(planned) if p[0] == c.tool and p[1] == bare), None)
        if plan is None:
            return f"{c.tool} applied without its plan first"
        if effect == "destructive" and "confirmation" in c.args and c.args["confirmation"] != plan[2]:
            return f"{c.tool} applied without the confirmation its plan answered"
        if "operation_id" in c.answer:
            following = (c.answer["operation_id"], status_tools.get(c.tool) or "wait_operation")
    if following:
        return f"operation {following[0]} was never followed to its end"
    return None
