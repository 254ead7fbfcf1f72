"""Regenerate the method reference of SPEC.md from the schema and a live daemon.

Field tables come from ``protocol/dagctx/protocol/schema.json``'s source (the Structs); every example
request/response pair is captured from a real daemon run on a temporary database,
so the examples cannot drift from what the daemon does. Run:

    python scripts/gen_spec.py          # rewrites the generated part of SPEC.md
    python scripts/gen_spec.py --check  # exit 1 when SPEC.md is stale (tests use this)
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

import msgspec

from dagctx.client import DagctxClient, RpcError
from dagctx.protocol import context_messages as c
from dagctx.protocol import memory_messages as mem
from dagctx.protocol import messages as m
from dagctx.protocol.methods import METHODS
from dagctx.protocol.schema import build_schema

REPO = Path(__file__).resolve().parents[1]
SPEC = REPO / "SPEC.md"
BEGIN = "<!-- BEGIN GENERATED METHOD REFERENCE -->"
END = "<!-- END GENERATED METHOD REFERENCE -->"



def _type(schema: dict[str, Any]) -> str:
    if "$ref" in schema:
        return schema["$ref"].rsplit("/", 1)[-1]
    if "anyOf" in schema:
        return " \\| ".join(_type(s) for s in schema["anyOf"])
    if "enum" in schema:
        return " \\| ".join(json.dumps(v) for v in schema["enum"])
    t = schema.get("type")
    if t == "array":
        return f"{_type(schema.get('items', {}))}[]"
    if t == "object" and "additionalProperties" in schema:
        ap = schema["additionalProperties"]
        return f"map<string, {_type(ap) if isinstance(ap, dict) else 'any'}>"
    if t is None:
        return "any"
    return str(t)


def _table(defs: dict[str, Any], name: str) -> list[str]:
    d = defs[name]
    props = d.get("properties", {})
    if not props:
        return ["(no fields)"]
    required = set(d.get("required", []))
    out = ["| field | type | required | default |", "|---|---|---|---|"]
    for field, s in props.items():
        default = json.dumps(s["default"], ensure_ascii=False) if "default" in s else ""
        out.append(f"| `{field}` | {_type(s)} | {'yes' if field in required else ''} | {default} |")
    return out


async def _examples() -> dict[str, tuple[Any, Any]]:
    """Run a scripted session and capture one request/response per method."""
    ex: dict[str, tuple[Any, Any]] = {}
    tmp = tempfile.mkdtemp()
    client = await DagctxClient.spawn(Path(tmp) / "spec.db", initialize=False, standalone=True)

    async def call(method: str, params: Any) -> Any:
        try:
            result = await client.request(method, params)
            ex.setdefault(method, (msgspec.to_builtins(params), msgspec.to_builtins(result)))
            return result
        except RpcError as err:
            ex.setdefault(method, (msgspec.to_builtins(params), _RpcFailure({"code": err.code, "message": err.message, "data": err.data})))
            return None

    init = await call("initialize", {"processId": None, "capabilities": {}, "initializationOptions": {"database": str(Path(tmp) / "spec.db")}})
    init_short = dict(ex["initialize"][1])
    init_short["methods"] = init_short["methods"][:4] + ["…"]
    init_short["database"] = "/tmp/…/spec.db"
    status = await call("daemon/status", {})
    if status is not None:
        st = dict(ex["daemon/status"][1])
        st["databases"] = ["/tmp/…/spec.db"]
        st["clients"] = [dict(cl, database="/tmp/…/spec.db") for cl in st["clients"]]
        ex["daemon/status"] = (ex["daemon/status"][0], st)
    ex["initialize"] = (ex["initialize"][0] | {"initializationOptions": {"database": "/tmp/…/spec.db"}}, init_short)
    client.notify("initialized", {})
    s = await call("session/create", m.SessionCreateParams(title="spec example"))
    sid = s.session_id
    await call("session/subscribe", m.SessionRef(session_id=sid))
    u = await call("node/append", m.NodeAppendParams(session_id=sid, node=m.NodeInput(
        role="user", output="Rename parse_config in src/app.py", predecessor=s.head)))
    prep = await call("context/prepare", c.PrepareParams(session_id=sid, model="gpt-4o", format="openai", prompt_mode="minimal"))
    llm = (await client.request("node/append", m.NodeAppendParams(session_id=sid, render_id=prep.render_id, node=m.NodeInput(
        role="llm", name="gpt-4o", output="Looking.", predecessor=u.head))))
    tool = await client.request("node/append", m.NodeAppendParams(session_id=sid, node=m.NodeInput(
        role="code", name="bash", input={"cmd": "rg parse_config"}, status="running", caller=llm.node.id,
        metadata={"toolCallId": "call_1"})))
    await call("node/update", m.NodeUpdateParams(session_id=sid, node_id=tool.node.id, status="completed", output="src/app.py:3: def parse_config():"))
    await call("node/get", m.NodeGetParams(session_id=sid, ids=[u.node.id]))
    await call("session/get", m.SessionRef(session_id=sid))
    await call("session/unsubscribe", m.SessionRef(session_id=sid))
    await call("session/list", m.SessionListParams(limit=1))
    await call("session/rename", m.SessionRenameParams(session_id=sid, title="renamed"))
    await call("session/history", m.SessionHistoryParams(session_id=sid))
    await call("context/render", c.RenderParams(session_id=sid, format="anthropic", model="claude-sonnet-4-5"))
    await call("context/replay", c.ReplayParams(session_id=sid, node_id=llm.node.id))
    await call("usage/report", c.UsageReportParams(session_id=sid, node_id=llm.node.id, model="gpt-4o",
                                                    usage=c.Usage(input=900, output=40, cache_read=0, cache_write=0)))
    retry = await client.request("node/append", m.NodeAppendParams(session_id=sid, move_head=True, node=m.NodeInput(
        role="llm", name="gpt-4o", output="Renamed it.", predecessor=u.node.id)))
    await call("node/appendBatch", m.NodeAppendBatchParams(session_id=sid, nodes=[
        m.NodeInput(role="user", id="u2", output="Now run the tests", predecessor=retry.node.id),
        m.NodeInput(role="llm", id="a2", name="gpt-4o", output="Running them.", predecessor="u2"),
        m.NodeInput(role="code", id="t2", name="bash", input={"cmd": "pytest -q"}, output="12 passed",
                    caller="a2", metadata={"toolCallId": "call_2"}),
    ]))
    await call("id/resolve", m.IdResolveParams(prefix="u", kinds="node"))  # "u2": no generated id has a "u"
    await call("session/branches", m.SessionRef(session_id=sid))
    await call("session/graph", m.SessionGraphParams(session_id=sid, limit=3))
    await call("session/checkout", m.SessionCheckoutParams(session_id=sid, node_id=llm.node.id))
    await call("session/rewind", m.SessionRewindParams(session_id=sid, steps=1))
    await call("session/nameBranch", m.BranchNameParams(session_id=sid, head=retry.node.id, name="retry"))
    await call("session/spawn", m.SessionSpawnParams(session_id=sid, caller_id=tool.node.id, source="subagent", output="Find callers of parse_config"))
    await call("search/query", m.SearchParams(query="parse_config", limit=2))
    ws = Path(tmp) / "workspace"
    (ws / "memory").mkdir(parents=True)
    (ws / "MEMORY.md").write_text("# Decisions\n\nThe cache eviction policy is LRU with a five minute TTL.\n")
    (ws / "memory" / "deploys.md").write_text("Deploys go through the blue green pipeline.\n")
    await call("memory/index", mem.MemoryIndexParams(workspace=str(ws)))
    for _ in range(600):  # the daemon reads the new vectors in the background (SPEC §5.1): the example waits
        st = await client.request("memory/status", mem.MemoryStatusParams(workspace=str(ws)))
        if st.vectors_loaded or not st.vectors:
            break
        await asyncio.sleep(0.05)
    await call("memory/status", mem.MemoryStatusParams(workspace=str(ws)))
    found = await call("memory/search", mem.MemorySearchParams(
        query="what did we decide about cache eviction?", workspace=str(ws), max_results=2,
        temporal_decay=mem.MemoryDecay(half_life_days=30)))
    await call("memory/get", mem.MemoryGetParams(workspace=str(ws), chunk_id=found.hits[0].chunk_id))
    for name in ("memory/index", "memory/status", "memory/search", "memory/get"):
        if name in ex:
            ex[name] = _tmp_paths(ex[name], str(ws))
    other = await DagctxClient.spawn(Path(tmp) / "other.db")  # a second database to copy from
    await other.session_create("from another database")
    await other.close()
    await call("database/migrate", m.DatabaseMigrateParams(source=str(Path(tmp) / "other.db")))
    if "database/migrate" in ex and isinstance(ex["database/migrate"][1], dict):
        req, res = ex["database/migrate"]
        ex["database/migrate"] = (req | {"source": "/tmp/…/other.db"},
                                  res | {"source": "/tmp/…/other.db", "target": "/tmp/…/spec.db"})
    await call("context/compact", c.CompactParams(session_id=sid, model="gpt-4o"))
    await call("session/export", c.ExportParams(session_id=sid, format="openai"))
    await call("session/delete", m.SessionRef(session_id=sid))
    await call("shutdown", None)
    client.notify("exit")
    await client.wait()
    return ex


def _tmp_paths(pair: tuple[Any, Any], ws: str) -> tuple[Any, Any]:
    """The example's temporary workspace as ``/tmp/…/workspace``; file times and hashes as placeholders."""
    real = str(Path(ws).resolve())
    text = json.dumps(pair, ensure_ascii=False).replace(real, "/tmp/…/workspace").replace(ws, "/tmp/…/workspace")
    text = re.sub(r'("(?:mtime|time|indexedAt)": )[0-9.]+', r"\g<1>0", text)
    text = re.sub(r'("(?:textScore)": )[0-9.e-]+', r"\g<1>1.0", text)
    req, res = json.loads(text)
    return req, res


class _RpcFailure(dict):
    """An error answer captured as an example (a result may itself have an ``error`` field)."""


#: Values that differ on every run, as stable placeholders (``_scrub``): random ids (uuid4
#: hex, uuids, content-derived chunk ids) become ``id1``, ``id2``… in order of appearance;
#: clocks, durations, process ids, memory sizes and the pool's momentary counts become 0; scores 1.0; a temporary folder
#: ``/tmp/…``. Regenerating SPEC.md twice gives the same bytes (``--check`` compares them).
_RANDOM_ID = re.compile(r"\b(?:[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|[0-9a-f]{32}|[0-9a-f]{24})\b")
_RUN_NUMBERS = ("createdAt", "updatedAt", "durationMs", "startedAt", "connectedAt", "uptimeSeconds", "pid",
                "rssBytes", "peakRssBytes", "baselineRssBytes", "idleSeconds",
                # the work pool at that moment: a worker that wrote the answer before (SPEC §1.4)
                # may still be finishing its bookkeeping when the next request reads it
                "queued", "running", "threads")
_RUN_NUMBER = re.compile(r'("(?:%s)": )-?[0-9.e+-]+' % "|".join(_RUN_NUMBERS))
_TEMP_DIR = re.compile(re.escape(tempfile.gettempdir().rstrip("/")) + r"/tmp[A-Za-z0-9_]+/")


def _scrub(value: Any) -> Any:
    """Replace random ids, clocks and run-specific numbers so the generated text is the
    same bytes run to run (``_RUN_NUMBERS``)."""
    text = json.dumps(value, ensure_ascii=False, indent=1)
    ids: dict[str, str] = {}

    def sub(mo: re.Match[str]) -> str:
        return ids.setdefault(mo.group(0), f"id{len(ids) + 1}")

    text = _RANDOM_ID.sub(sub, text)
    text = _RUN_NUMBER.sub(r"\g<1>0", text)
    text = re.sub(r'("score": )-?[0-9.e-]+', r"\g<1>1.0", text)
    text = _TEMP_DIR.sub("/tmp/…/", text)
    return json.loads(text)


def generate() -> str:
    schema = build_schema()
    defs = schema["$defs"]
    examples = asyncio.run(_examples())
    lines = [BEGIN, "", "## Method reference", "",
             "Generated by `python scripts/gen_spec.py` from the Structs in `protocol/` and a live daemon run; "
             "do not edit by hand.", ""]
    for name, spec in METHODS.items():
        entry = schema["methods"][name]
        lines += [f"### `{name}`", "", f"{entry['description']} — *{entry['kind']}, {entry['direction']}*", ""]
        pname = spec.params.__name__
        lines += [f"**Params** `{pname}`", ""] + _table(defs, pname) + [""]
        if spec.result is not None:
            rname = spec.result.__name__
            lines += [f"**Result** `{rname}`", ""] + _table(defs, rname) + [""]
        elif not spec.notification:
            lines += ["**Result** `null`", ""]
        if spec.errors or spec.keeps:
            # declared once, in the method table (protocol/dagctx/protocol/methods.py)
            how = []
            if spec.offload:
                how.append("runs off the event loop (cancellable)")
            elif spec.background:
                how.append("runs in the background")
            if spec.writes:
                how.append("writes: subscribers hear of it")
            lines += [f"**Errors:** {spec.errors or '—'}", "", f"**Keeps:** {spec.keeps or '—'}", ""]
            if how:
                lines += [f"**Runs:** {'; '.join(how)}.", ""]
        if name in examples:
            raw_req, raw_res = examples[name]
            failed = isinstance(raw_res, _RpcFailure)
            req, res = _scrub((raw_req, dict(raw_res) if failed else raw_res))
            answer = {"error": res} if failed else {"result": res}
            lines += ["Example:", "", "```json",
                      "→ " + json.dumps({"jsonrpc": "2.0", "id": 1, "method": name, "params": req}, ensure_ascii=False),
                      "← " + json.dumps({"jsonrpc": "2.0", "id": 1, **answer}, ensure_ascii=False),
                      "```", ""]
    lines.append(END)
    return "\n".join(lines) + "\n"


def main() -> int:
    spec = SPEC.read_text(encoding="utf-8")
    head, _, rest = spec.partition(BEGIN)
    _, _, tail = rest.partition(END)
    new = head + generate() + tail.lstrip("\n")
    if "--check" in sys.argv:
        # Examples are scrubbed of whatever varies run to run (``_scrub``): compare every byte.
        if new != spec:
            print("SPEC.md's method reference is stale: run python scripts/gen_spec.py", file=sys.stderr)
            return 1
        return 0
    SPEC.write_text(new, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
