"""``dagctx demo``: a realistic agent session driven through the daemon, then what dagctx
does with it — render, budget, aging, compaction, search, export.

The demo is a client like any other: it spawns ``dagctx serve`` on an empty temporary
database (or ``--db``) and uses only the protocol. It plays both the user and the agent:
English and Chinese turns, model replies with tool calls (code nodes whose caller is the
llm node, with ``metadata.toolCallId``), a 40,000-character CI log that the ledger spills,
a failed reply retried as a fork, and a function call appended ``running`` and finished
later (watched live through ``node/didAppend`` / ``node/didUpdate``).

Compaction needs a summary from a model. No model is configured here, so the demo's
client answers the daemon's ``sampling/createMessage`` itself with a **stand-in
summarizer**: a deterministic extractive summary built from the transcript it was sent,
keeping identifiers (paths, ids, hashes) verbatim so the daemon's fidelity gate can
accept it (``demo_summarizer.py``). It is labelled as such wherever it appears. The
session's content — a CI log, source files, diffs, logs — is ``demo_content.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import tempfile
import time
from collections import Counter
from typing import Any

from dagctx.cli.ui import escape
from rich.panel import Panel
from rich.rule import Rule
from rich.table import Table

from dagctx.client import DagctxClient, RpcError
from dagctx.cli.cmd_context import gather_stats, print_budget, print_render, run_compaction
from dagctx.cli.cmd_sessions import print_hits
from dagctx.cli.demo_content import FOLLOW_UPS, MIGRATION_PY, REFUNDS_PY, ci_log, tool_call_id
from dagctx.cli.demo_summarizer import STAND_IN_LABEL, StandInSummarizer
from dagctx.cli.ui import console, preview, short
from dagctx.protocol import context_messages as c

MODEL = "gpt-4o"


# ---------------------------------------------------------------- the session


class Agent:
    """Plays the agent loop against the daemon: user turns, replies, tool calls."""

    def __init__(self, client: DagctxClient, session_id: str, head: str) -> None:
        self.client = client
        self.sid = session_id
        self.head = head
        self.calls = 0
        self.nodes = 0

    async def user(self, text: str) -> str:
        r = await self.client.append(self.sid, "user", output=text, predecessor=self.head)
        self.head = r.head
        self.nodes += 1
        return r.node.id

    async def reply(self, text: str, *, predecessor: str | None = None, status: str = "completed",
                    move_head: bool | None = None, metadata: dict[str, Any] | None = None) -> str:
        r = await self.client.append(self.sid, "llm", name=MODEL, output=text, status=status,
                                     predecessor=predecessor or self.head, move_head=move_head,
                                     metadata=metadata or {})
        self.head = r.head
        self.nodes += 1
        return r.node.id

    async def tool(self, llm_id: str, name: str, args: dict[str, Any], output: Any, *, status: str = "completed") -> str:
        self.calls += 1
        r = await self.client.append(self.sid, "code", name=name, input=args, output=output, status=status,
                                     caller=llm_id, metadata={"toolCallId": tool_call_id(self.calls)})
        self.nodes += 1
        return r.node.id


async def build_session(client: DagctxClient, turns: int) -> tuple[Agent, dict[str, str]]:
    s = await client.session_create("payments-service: float amounts → DECIMAL migration")
    a = Agent(client, s.session_id, s.head)
    marks: dict[str, str] = {}

    await a.user("The nightly build of payments-service has been red since commit 3f9c2ab. Can you find out why?")
    llm = await a.reply("I'll pull the CI log of job 48213 and read the refund code.")
    marks["log"] = await a.tool(llm, "bash", {"command": "gh run view 48213 --log"}, ci_log())
    await a.tool(llm, "read_file", {"path": "services/payments/refunds.py"}, REFUNDS_PY)
    await a.reply(
        "The failure is tests/test_refunds.py::test_partial_refund_rounding: `orders.amount` is a FLOAT column, "
        "so 10.01 comes back as 10.009999999999998 and services/payments/refunds.py:88 compares it with "
        "Decimal('10.01'). The fix is a DECIMAL(12,2) column plus a data-preserving migration."
    )

    await a.user("好的。请帮我写一个数据库迁移脚本，把 orders 表的 amount 字段从 FLOAT 改成 DECIMAL(12,2)，"
                 "要保留旧数据，并且可以回滚。")
    llm = await a.reply("我先看一下现有的迁移目录和 orders 表的结构。")
    await a.tool(llm, "bash", {"command": "ls migrations/versions"},
                 "\n".join(f"{i:04d}_{n}.py" for i, n in enumerate(
                     ["initial", "orders", "customers", "invoices", "refunds", "webhooks"] * 7, start=1)
                           if i <= 41).replace("0041_refunds.py", "0041_add_refund_reason.py"))
    await a.tool(llm, "bash", {"command": "psql staging -c '\\d orders'"},
                 'Table "public.orders"\n Column     | Type             \n------------+------------------\n'
                 " id         | bigint\n customer_id| bigint\n amount     | double precision\n created_at | timestamptz")
    llm = await a.reply("迁移脚本已写好：migrations/versions/0042_orders_amount_decimal.py。升级时先新增 amount_decimal 列，"
                        "用 ROUND(amount::numeric, 2) 回填，再替换旧列；降级时反向操作，数据不会丢。")
    await a.tool(llm, "write_file", {"path": "migrations/versions/0042_orders_amount_decimal.py", "content": MIGRATION_PY},
                 f"wrote {len(MIGRATION_PY.encode())} bytes to migrations/versions/0042_orders_amount_decimal.py")

    # A reply that fails, then the retry: a fork with the same predecessor (moveHead).
    asked = await a.user("Apply the migration on the staging database.")
    failed = await a.reply("", status="error", metadata={"error": "overloaded_error (HTTP 529)"})
    marks["failed"] = failed
    retry = await a.reply("Applying 0042_orders_amount_decimal on staging now.", predecessor=asked, move_head=True)
    marks["retry"] = retry
    marks["asked"] = asked

    # A function that runs for a while: appended running, finished by node/update.
    a.calls += 1
    running = await client.append(
        a.sid, "code", name="run_migration", input={"target": "staging", "revision": "0042_orders_amount_decimal"},
        status="running", caller=retry, metadata={"toolCallId": tool_call_id(a.calls)},
    )
    a.nodes += 1
    await asyncio.sleep(0.25)
    await client.update(a.sid, running.node.id, "completed",
                        "INFO  [alembic.runtime.migration] Running upgrade 0041_add_refund_reason -> "
                        "0042_orders_amount_decimal\n1204311 rows converted in 3.2s")
    marks["running"] = running.node.id
    await a.reply("Migration 0042 is applied on staging: 1,204,311 rows converted, and "
                  "tests/test_refunds.py::test_partial_refund_rounding passes now.")

    for i in range(turns):
        f = FOLLOW_UPS[i % len(FOLLOW_UPS)]
        user = f["user"] if i < len(FOLLOW_UPS) else f"(round {i // len(FOLLOW_UPS) + 1}) " + f["user"]
        await a.user(user)
        llm = await a.reply(f["think"])
        for name, args, out in f["tools"]:
            await a.tool(llm, name, args, out)
        await a.reply(f["reply"])
    return a, marks


# ---------------------------------------------------------------- the show


def _section(title: str) -> None:
    console.print()
    console.print(Rule(f"[bold]{title}"))


async def run_demo(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    tmp: str | None = None
    db = getattr(args, "db", None)
    if db is None:
        tmp = tempfile.mkdtemp(prefix="dagctx-demo-")
        db = os.path.join(tmp, "demo.db")
    elif os.path.exists(db):
        console.print(f"[yellow]note[/yellow]: {db} exists; the demo adds one more session to it")
    summarizer = StandInSummarizer()
    counts: Counter[str] = Counter()

    from dagctx.cli.options import standalone_requested

    client = await DagctxClient.spawn(db, initialization_options={"observeNodes": True}, capabilities={"sampling": {}},
                                      standalone=bool(getattr(args, "standalone", False)) or standalone_requested())
    client.keep_notifications = False
    client.on_request("sampling/createMessage", summarizer)

    def watch(method: str):
        def handler(params: Any) -> None:
            counts[method] += 1
            node = getattr(params, "node", None)
            if node is None:
                return
            if node.status == "running" or method == "node/didUpdate":
                line = (f"{method:<15} {node.role} {node.name:<14} {node.status:<9} "
                        f"{preview(node.output if node.output is not None else node.input, 70)}")
                console.print(f"  [cyan]●[/cyan] {escape(line)}")
        return handler

    client.on_notification("node/didAppend", watch("node/didAppend"))
    client.on_notification("node/didUpdate", watch("node/didUpdate"))
    try:
        console.print(Panel.fit(
            "dagctx demo — an agent session driven through the daemon over JSON-RPC (stdio, LSP framing)\n"
            f"database: {db}" + ("  (temporary)" if tmp else ""),
            border_style="bold",
        ))

        _section("1. A session: English and Chinese turns, tool calls, a retry fork, a running function")
        agent, marks = await build_session(client, args.turns)
        sid = agent.sid
        console.print(
            f"appended {agent.nodes} nodes ({agent.calls} tool calls); notifications seen: "
            f"node/didAppend {counts['node/didAppend']}, node/didUpdate {counts['node/didUpdate']}"
        )
        log_node = (await client.get_nodes(sid, [marks["log"]])).nodes[0]
        spill = log_node.metadata.get("spill") or {}
        console.print(
            f"the CI log ({spill.get('chars', 0):,} chars, {spill.get('lines', 0):,} lines) was spilled at write time: "
            f"the node keeps {len(log_node.output):,} chars (head + tail + a marker), the whole text stays "
            f"readable with node/get and a range"
        )
        br = await client.branches(sid)
        table = Table(title="session/branches")
        for col in ("head", "length", "main", "current", "last turn"):
            table.add_column(col)
        heads = (await client.get_nodes(sid, [b.head for b in br.branches])).nodes
        for b, n in zip(br.branches, heads):
            table.add_row(short(b.head), str(b.length), "✓" if b.main else "", "✓" if b.current else "",
                          escape(f"{n.role} {n.status}: {preview(n.output or n.metadata.get('error'), 60)}"))
        console.print(table)
        console.print(f"the failed reply {short(marks['failed'])} stays recorded as error; the retry "
                      f"{short(marks['retry'])} forks from the same user turn and is HEAD, so it never sees the error")

        _section("2. Render (context/render, OpenAI format)")
        r1 = await client.render(sid, format="openai", model=MODEL)
        print_render(r1, title=f"render 1 — {MODEL}", limit=10)
        await agent.user("Thanks — 最后把今天的改动总结一下，我要发给团队。")
        r2 = await client.render(sid, format="openai", model=MODEL)
        console.print(
            f"render 2 after one more user turn: {len(r2.messages)} messages, {r2.tokens.total:,} tokens; "
            f"stable prefix {r2.stable_prefix.messages} messages / {r2.stable_prefix.tokens:,} tokens "
            f"byte-identical to render 1 (prompt-cache friendly)"
        )

        _section("3. Budget (context/prepare)")
        stats = await gather_stats(client, sid, MODEL)
        print_budget(stats, title=f"budget of the next turn — {MODEL}")
        prep: c.PrepareResult = stats["prepare"]
        console.print(
            f"aging stats from context/prepare: toolResultsAged={prep.tool_results_aged}, "
            f"tokensFreedByAging={prep.tokens_freed_by_aging}, referencesProtected={prep.references_protected}"
        )
        for line in prep.decision_path:
            console.print(f"  · {escape(line)}", style="dim")

        _section(f"4. Compaction (context/compact) — summaries by the {STAND_IN_LABEL}")
        before = r2
        res = await run_compaction(client, sid, model=MODEL, keep_recent_tokens=3000)
        if res is None:
            console.print("[yellow]compaction skipped: this daemon has no context/compact yet[/yellow]")
        else:
            console.print(f"{STAND_IN_LABEL}: answered {summarizer.requests} sampling/createMessage request(s)")
            if res.ok and res.summary_id:
                after = await client.render(sid, format="openai", model=MODEL)
                console.print(
                    f"render before: {len(before.messages)} messages, {before.tokens.total:,} tokens → after: "
                    f"{len(after.messages)} messages, {after.tokens.total:,} tokens (summary {short(res.summary_id)})"
                )
                node = (await client.get_nodes(sid, [res.summary_id])).nodes[0]
                text = node.output if isinstance(node.output, str) else str(node.output)
                console.print(Panel(escape(text[:900] + ("\n…" if len(text) > 900 else "")),
                                    title=f"summary node {short(res.summary_id)} ({STAND_IN_LABEL})", expand=False))
                h = await client.history(sid)
                console.print(f"HEAD is unchanged ({short(h.head)}); the summary is one appended node "
                              f"covering {len(res.covers_ids)} conversation nodes, nothing was deleted")
                print_budget(await gather_stats(client, sid, MODEL), title="budget after compaction")

        _section("5. Search (search/query)")
        print_hits("refund rounding", await client.search("refund rounding", session_id=sid, limit=5))
        print_hits("迁移", await client.search("迁移", session_id=sid, limit=5))

        _section("6. Export (session/export)")
        ex = await client.export(sid, format="claude-code")
        console.print(f"claude-code: {ex.lines} JSONL lines (re-importable with `dagctx import`)")
        ex2 = await client.export(sid, format="openai")
        console.print(f"openai: {ex2.lines} messages as one JSON document")
    except RpcError as exc:
        console.print(f"[red]error[/red] ({exc.kind or exc.code}): {escape(exc.message)}")
        return 1
    finally:
        await client.close()
        if tmp and not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)

    elapsed = time.perf_counter() - t0
    console.print()
    if tmp and not args.keep:
        console.print(f"done in {elapsed:.1f} s; the temporary database was removed (--keep keeps it)")
    else:
        console.print(f"done in {elapsed:.1f} s; database kept at {db}")
        console.print(f"try: dagctx sessions --db {db}   ·   dagctx stats {short(sid)} --db {db}")
    return 0


__all__ = ["run_demo"]
