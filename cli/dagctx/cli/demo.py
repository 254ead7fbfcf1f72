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
accept it. It is labelled as such wherever it appears.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import tempfile
import time
from collections import Counter
from typing import Any

from rich.markup import escape
from rich.panel import Panel
from rich.rule import Rule
from rich.table import Table

from dagctx.client import DagctxClient, RpcError
from dagctx.cli.cmd_context import gather_stats, print_budget, print_render, run_compaction
from dagctx.cli.cmd_sessions import print_hits
from dagctx.cli.ui import console, preview, short
from dagctx.protocol import context_messages as c

MODEL = "gpt-4o"
STAND_IN_LABEL = "stand-in summarizer (no LLM configured)"


# ---------------------------------------------------------------- the stand-in summarizer

_IDENT_PATTERNS = [
    re.compile(r"\b(?:https?|wss?|ftp|file)://[^\s\"'<>)\]]+[^\s\"'<>)\].,;:!?]", re.ASCII),
    re.compile(r"(?<![\w/.])(?:~|\.{1,2})?/?(?:[\w.-]+/)+[\w.-]+(?:::\w+)?", re.ASCII),  # paths
    re.compile(r"\b[\w-]+\.(?:py|sql|toml|yaml|yml|json|md|txt|log|ts|js|sh|cfg|ini|lock)\b", re.ASCII),
    re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b", re.ASCII),
    re.compile(r"\b(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b", re.ASCII),
    re.compile(r"`([^`\n]{3,80})`"),
    re.compile(r"\b[A-Za-z][a-z0-9]+(?:[A-Z][a-z0-9]*)+\b", re.ASCII),  # camelCase / CamelCase
    re.compile(r"\b[A-Za-z][A-Za-z0-9]*(?:_[A-Za-z0-9]+)+\b", re.ASCII),  # snake_case
    re.compile(r"(?<![\w.])(?:localhost|\d{1,3}(?:\.\d{1,3}){3}):\d{2,5}\b", re.ASCII),
    re.compile(r"(?<![\w.])\d{5,}(?![\w.])", re.ASCII),
]

_ENTRY = re.compile(r"^\[(user|assistant|tool call: [^\]]*|tool result: [^\]]*|function call|function result|"
                    r"summary of the conversation before this point)\]$")


def identifiers(text: str) -> list[str]:
    """Identifier-like tokens, most frequent first (ties: first seen)."""
    counts: Counter[str] = Counter()
    first: dict[str, int] = {}
    for pat in _IDENT_PATTERNS:
        for m in pat.finditer(text):
            tok = (m.group(1) if m.groups() else m.group(0)).strip()
            if len(tok) < 3:
                continue
            counts[tok] += 1
            first.setdefault(tok, m.start())
    return sorted(counts, key=lambda t: (-counts[t], first[t]))


def _entries(text: str) -> list[tuple[str, str]]:
    """``(header, body)`` of the transcript entries the daemon sent (``[user]`` …)."""
    out: list[tuple[str, str]] = []
    header: str | None = None
    body: list[str] = []
    for line in text.split("\n"):
        m = _ENTRY.match(line.strip())
        if m:
            if header is not None:
                out.append((header, "\n".join(body).strip()))
            header, body = m.group(1), []
        elif header is not None:
            if line.startswith("</conversation>") or line.startswith("</new-messages>"):
                out.append((header, "\n".join(body).strip()))
                header, body = None, []
                continue
            body.append(line)
    if header is not None:
        out.append((header, "\n".join(body).strip()))
    return out


def _line(text: str, limit: int = 160) -> str:
    t = " ".join(text.split())
    return t if len(t) <= limit else t[: limit - 1] + "…"


def extractive_summary(text: str, max_chars: int) -> str:
    """A deterministic summary in the daemon's five sections, built only from ``text``."""
    headings = re.findall(r"^## (.+)$", text, flags=re.M)[:5]
    if len(headings) < 5:
        headings = ["1. User intent", "2. Decisions and constraints", "3. Work completed", "4. Outstanding",
                    "5. Active context"]
    prev = re.search(r"<previous-summary>\n(.*?)\n</previous-summary>", text, flags=re.S)
    entries = _entries(text)
    users = [b for h, b in entries if h == "user" and b]
    replies = [b for h, b in entries if h == "assistant" and b]
    calls = [(h.split(":", 1)[1].strip(), b) for h, b in entries if h.startswith("tool call")]
    results = [b for h, b in entries if h.startswith("tool result")]
    missing = re.search(r"copy each of these exactly where it belongs:\n((?:- .*\n?)+)", text)
    ids = identifiers(text.split("</conversation>")[0].split("</new-messages>")[0])
    if missing:
        wanted = [ln[2:].strip() for ln in missing.group(1).splitlines() if ln.startswith("- ")]
        ids = wanted + [i for i in ids if i not in wanted]

    intent = [f"- {_line(users[0], 240)}"] if users else ["none"]
    decisions = [f"- {_line(u)}" for u in users[1:]] or ["none"]
    work = []
    if prev:
        work += [f"- earlier: {_line(ln, 200)}" for ln in prev.group(1).splitlines() if ln.startswith("- ")][:12]
    for (name, args), res in zip(calls, results + [""] * len(calls)):
        work.append(f"- {name} {_line(args, 100)} → {_line(res.split(chr(10))[0] if res else '', 80)}")
    work += [f"- replied: {_line(r, 140)}" for r in replies[-3:]]
    outstanding = [f"- {_line(users[-1])}"] if users else ["none"]

    def build(n_ids: int, n_work: int) -> str:
        active = ", ".join(ids[:n_ids]) if ids else "none"
        sections = [intent, decisions, work[:n_work] or ["none"], outstanding, [active]]
        body = [f"[{STAND_IN_LABEL}: extractive, deterministic]"]
        for head, lines in zip(headings, sections):
            body += [f"## {head}", *lines]
        return "\n".join(body)

    n_ids, n_work = len(ids), len(work)
    out = build(n_ids, n_work)
    while len(out) > max_chars and (n_work > 3 or n_ids > 20):
        if n_work > 3:
            n_work = max(3, n_work - 4)
        else:
            n_ids = max(20, n_ids - 10)
        out = build(n_ids, n_work)
    return out[:max_chars]


class StandInSummarizer:
    """Answers ``sampling/createMessage`` without a model (see the module docstring)."""

    def __init__(self) -> None:
        self.requests = 0

    async def __call__(self, params: c.CreateMessageParams) -> c.CreateMessageResult:
        self.requests += 1
        text = "\n".join(m.content.text for m in params.messages)
        limit = re.search(r"Keep the whole summary under (\d+) characters", text)
        max_chars = int(limit.group(1)) if limit else params.max_tokens * 2
        summary = extractive_summary(text, max(400, min(max_chars, params.max_tokens * 2)))
        return c.CreateMessageResult(
            role="assistant",
            content=c.SamplingContent(type="text", text=summary),
            model="dagctx-demo-stand-in",
            stop_reason="endTurn",
        )


# ---------------------------------------------------------------- synthetic but realistic content


def ci_log() -> str:
    """A 40,000+ character pytest CI log with one failure near the end."""
    modules = ["test_ledger", "test_invoices", "test_refunds", "test_webhooks", "test_currency", "test_accounts"]
    tests = ["test_create", "test_update", "test_balance", "test_rounding", "test_idempotency", "test_retry",
             "test_partial_refund_rounding", "test_audit_trail"]
    lines = [
        "Run pytest -q --maxfail=1 services/payments",
        "platform linux -- Python 3.11.9, pytest-8.2.1, pluggy-1.5.0",
        "rootdir: /builds/acme/payments-service, configfile: pyproject.toml",
        "collected 612 items",
    ]
    k = 0
    while sum(len(x) + 1 for x in lines) < 40_500:
        mod = modules[k % len(modules)]
        t = tests[(k // len(modules)) % len(tests)]
        sec = 0.01 + (k * 7 % 23) / 100
        if not (mod == "test_refunds" and t == "test_partial_refund_rounding"):
            lines.append(f"[build 48213] tests/{mod}.py::{t}[case{k % 40}] PASSED ({sec:.2f}s)")
        k += 1
    lines += [
        "=================================== FAILURES ===================================",
        "_______________________ test_partial_refund_rounding[case7] ____________________",
        "    def test_partial_refund_rounding(order_factory):",
        "        order = order_factory(amount=10.01)",
        "        refund = issue_refund(order, ratio=0.5)",
        ">       assert refund.amount + refund.remaining == Decimal('10.01')",
        "E       AssertionError: assert 10.009999999999998 == Decimal('10.01')",
        "services/payments/refunds.py:88: AssertionError",
        "FAILED tests/test_refunds.py::test_partial_refund_rounding[case7] - AssertionError",
        "1 failed, 611 passed in 48.21s (commit 3f9c2ab, job 48213)",
    ]
    return "\n".join(lines)


REFUNDS_PY = '''"""Refunds for the payments service."""
from decimal import Decimal

from .models import Order, Refund


def issue_refund(order: Order, ratio: float) -> Refund:
    # amount comes from orders.amount, a FLOAT column: 10.01 is stored as 10.009999999999998
    amount = order.amount * ratio
    remaining = order.amount - amount
    return Refund(order_id=order.id, amount=amount, remaining=remaining)


def refund_total(refunds: list[Refund]) -> Decimal:
    return sum((Decimal(str(r.amount)) for r in refunds), Decimal("0"))
'''

MIGRATION_PY = '''"""orders.amount: FLOAT -> DECIMAL(12,2), keeping the data.

Revision ID: 0042_orders_amount_decimal
Revises: 0041_add_refund_reason
"""
from alembic import op
import sqlalchemy as sa

revision = "0042_orders_amount_decimal"
down_revision = "0041_add_refund_reason"


def upgrade() -> None:
    op.add_column("orders", sa.Column("amount_decimal", sa.Numeric(12, 2), nullable=True))
    op.execute("UPDATE orders SET amount_decimal = ROUND(amount::numeric, 2)")
    op.alter_column("orders", "amount_decimal", nullable=False)
    op.drop_column("orders", "amount")
    op.alter_column("orders", "amount_decimal", new_column_name="amount")


def downgrade() -> None:
    op.add_column("orders", sa.Column("amount_float", sa.Float(), nullable=True))
    op.execute("UPDATE orders SET amount_float = amount::double precision")
    op.drop_column("orders", "amount")
    op.alter_column("orders", "amount_float", new_column_name="amount")
'''

def _pytest_run() -> str:
    modules = ["ledger", "invoices", "refunds", "webhooks", "currency", "accounts", "reporting", "dunning"]
    names = ["test_create", "test_update", "test_balance", "test_rounding", "test_idempotency", "test_retry",
             "test_audit_trail", "test_partial_refund_rounding", "test_export_csv", "test_currency_jpy"]
    lines = ["pytest -v services/payments", "collected 612 items", ""]
    for i in range(230):
        m, n = modules[i % len(modules)], names[(i // len(modules)) % len(names)]
        lines.append(f"tests/test_{m}.py::{n}[case{i % 29}] PASSED{' ' * (8 - len(m))} [{(i + 1) * 100 // 230:3d}%]")
    lines.append("612 passed, 3 warnings in 47.90s")
    lines.append("services/payments/models.py:41: SAWarning: Numeric column orders.amount returns Decimal")
    return "\n".join(lines)


def _grep_amount() -> str:
    sites = [("payments", "refunds.py", 8), ("payments", "invoices.py", 41), ("reporting", "daily.py", 117),
             ("reporting", "export_csv.py", 52), ("billing", "dunning.py", 230), ("fraud", "scoring.py", 77)]
    out = []
    for s, f, n in sites:
        out.append(f"services/{s}/{f}-{n - 2}-    for order in orders:")
        out.append(f"services/{s}/{f}-{n - 1}-        # amount is the order total in the account currency")
        out.append(f"services/{s}/{f}:{n}:        total += order.amount")
        out.append(f"services/{s}/{f}-{n + 1}-        count += 1")
        out.append("--")
    return "\n".join(out * 3)


def _models_py() -> str:
    cols = [("id", "BigInteger, primary_key=True"), ("customer_id", "BigInteger, ForeignKey('customers.id')"),
            ("amount", "Float, nullable=False"), ("currency", "String(3), nullable=False"),
            ("status", "String(16), default='open'"), ("created_at", "DateTime(timezone=True)")]
    out = ['"""SQLAlchemy models of the payments service."""', "import sqlalchemy as sa", "from .db import Base", ""]
    for table in ("Order", "Refund", "Invoice", "Payout", "Chargeback", "LedgerEntry"):
        out += ["", f"class {table}(Base):", f"    __tablename__ = '{table.lower()}s'"]
        out += [f"    {c} = sa.Column(sa.{t})" for c, t in cols]
        out += [f"    def __repr__(self) -> str:", f"        return f'<{table} {{self.id}} {{self.amount}} {{self.currency}}>'"]
    return "\n".join(out * 2)


def _git_diff() -> str:
    hunk = []
    for i in range(12):
        hunk += [f"diff --git a/services/reporting/export_csv.py b/services/reporting/export_csv.py",
                 f"@@ -{40 + i * 9},7 +{40 + i * 9},7 @@ def write_orders(rows, out):",
                 "     w = csv.writer(out)", "     for r in rows:",
                 "-        w.writerow([r.id, r.created_at.isoformat(), r.amount])",
                 '+        w.writerow([r.id, r.created_at.isoformat(), f"{r.amount:.2f}"])', "     return out"]
    return "\n".join(hunk)


def _changelog() -> str:
    out = ["# Changelog", ""]
    for minor in range(13, 0, -1):
        out += [f"## 2.{minor}.0", f"- Fix webhook retries for provider timeouts (#{1100 + minor * 7})",
                f"- Bump sqlalchemy to 2.0.{minor + 17}", f"- Faster ledger balance query (#{1100 + minor * 7 + 3})", ""]
    return "\n".join(out)


def _db_logs() -> str:
    out = []
    for i in range(140):
        out.append(f"db-1  | 2026-05-11 13:{i // 60 + 10:02d}:{i % 60:02d}.{i * 37 % 1000:03d} UTC [4{i % 10}1] LOG:  "
                   f"duration: {(i * 13) % 900 + 3}.{i % 10}12 ms  statement: SELECT amount FROM orders WHERE id = $1")
    return "\n".join(out)


FOLLOW_UPS: list[dict[str, Any]] = [
    {
        "user": "Add an index on orders(created_at); the nightly report query is slow.",
        "think": "Let me check the query plan first.",
        "tools": [("bash", {"command": "psql staging -c 'EXPLAIN ANALYZE SELECT * FROM orders WHERE created_at > now() - interval 1 day'"},
                   "Seq Scan on orders  (cost=0.00..48213.11 rows=1204311 width=64) (actual time=0.02..812.4 rows=9120)\n"
                   "  Filter: (created_at > (now() - '1 day'::interval))\nPlanning Time: 0.1 ms\nExecution Time: 815.7 ms"),
                  ("bash", {"command": "docker compose logs db --tail 140"}, _db_logs())],
        "reply": "A sequential scan over 1,204,311 rows: migrations/versions/0043_orders_created_at_idx.py adds "
                 "`ix_orders_created_at` with CREATE INDEX CONCURRENTLY.",
    },
    {
        "user": "refunds 表的 amount 字段也是 FLOAT 吗？如果是，也写一个同样的迁移。",
        "think": "我查一下 refunds 表的结构和模型定义。",
        "tools": [("bash", {"command": "psql staging -c '\\d refunds'"},
                   "Table \"public.refunds\"\n Column    | Type             \n-----------+------------------\n id        | bigint\n"
                   " order_id  | bigint\n amount    | double precision\n reason    | text\n created_at| timestamptz"),
                  ("read_file", {"path": "services/payments/models.py"}, _models_py())],
        "reply": "是的，refunds.amount 也是 double precision。我写了 migrations/versions/0044_refunds_amount_decimal.py，"
                 "结构和 0042 一样：先加 amount_decimal，用 ROUND(amount::numeric, 2) 回填，再替换旧列，可以回滚。",
    },
    {
        "user": "Run the whole test suite again and tell me what is still failing.",
        "think": "Running pytest on services/payments.",
        "tools": [("bash", {"command": "pytest -v services/payments"}, _pytest_run())],
        "reply": "All 612 tests pass, including tests/test_refunds.py::test_partial_refund_rounding. One new warning: "
                 "services/payments/models.py:41 still declares orders.amount as Float.",
    },
    {
        "user": "给迁移 0042 写一个回滚测试，确认 downgrade 之后数据不丢。",
        "think": "我新建 tests/migrations/test_0042_roundtrip.py。",
        "tools": [("write_file", {"path": "tests/migrations/test_0042_roundtrip.py",
                                  "content": "def test_upgrade_downgrade_keeps_amounts(alembic_runner, db):\n"
                                             "    db.insert_orders([10.01, 0.1, 99999.99])\n"
                                             "    alembic_runner.migrate_up_to('0042_orders_amount_decimal')\n"
                                             "    alembic_runner.migrate_down_one()\n"
                                             "    assert db.amounts() == [10.01, 0.1, 99999.99]\n"},
                   "wrote 312 bytes to tests/migrations/test_0042_roundtrip.py"),
                  ("bash", {"command": "pytest -q tests/migrations/test_0042_roundtrip.py"}, "1 passed in 2.31s")],
        "reply": "回滚测试 tests/migrations/test_0042_roundtrip.py 通过：upgrade 再 downgrade 之后金额不变。",
    },
    {
        "user": "Which services read orders.amount directly? I want to know who is affected by the type change.",
        "think": "Searching the monorepo.",
        "tools": [("grep", {"pattern": "orders.amount|order.amount", "path": "services/", "context": 2}, _grep_amount())],
        "reply": "Six call sites in four services: services/reporting/daily.py and services/reporting/export_csv.py format "
                 "the value and need `Decimal`-aware formatting; services/billing/dunning.py and "
                 "services/fraud/scoring.py only compare and are fine.",
    },
    {
        "user": "更新 services/reporting/export_csv.py，让金额总是保留两位小数。",
        "think": "先读一下这个文件，再改。",
        "tools": [("read_file", {"path": "services/reporting/export_csv.py"},
                   "import csv\n\n\ndef write_orders(rows, out):\n    w = csv.writer(out)\n    for r in rows:\n"
                   "        w.writerow([r.id, r.created_at.isoformat(), r.amount])\n" * 12),
                  ("edit_file", {"path": "services/reporting/export_csv.py", "old": "r.amount]", "new": "f\"{r.amount:.2f}\"]"},
                   "edited services/reporting/export_csv.py (12 replacements)"),
                  ("bash", {"command": "git diff services/reporting/export_csv.py"}, _git_diff())],
        "reply": "已修改 services/reporting/export_csv.py：金额用 f\"{r.amount:.2f}\" 输出，总是两位小数（12 处）。",
    },
    {
        "user": "Write the changelog entry for release 2.14.0.",
        "think": "Reading CHANGELOG.md.",
        "tools": [("read_file", {"path": "CHANGELOG.md"}, _changelog())],
        "reply": "Added to CHANGELOG.md under 2.14.0: orders.amount and refunds.amount are DECIMAL(12,2) "
                 "(migrations 0042 and 0044), index ix_orders_created_at (0043), CSV export keeps two decimals.",
    },
    {
        "user": "部署到 staging 之前，检查一下 0042 和 0044 在 1,204,311 行数据上大概要跑多久。",
        "think": "在 staging 的副本上计时。",
        "tools": [("bash", {"command": "time alembic -x db=staging-copy upgrade 0044_refunds_amount_decimal"},
                   "INFO  [alembic.runtime.migration] Running upgrade 0041_add_refund_reason -> 0042_orders_amount_decimal\n"
                   "INFO  [alembic.runtime.migration] Running upgrade 0042_orders_amount_decimal -> 0043_orders_created_at_idx\n"
                   "INFO  [alembic.runtime.migration] Running upgrade 0043_orders_created_at_idx -> 0044_refunds_amount_decimal\n"
                   "real 3m12.4s")],
        "reply": "在副本上 0042 到 0044 一共 3 分 12 秒；0042 的 UPDATE 占了大部分时间，建议在低峰期执行。",
    },
]


def _tool_call_id(n: int) -> str:
    return f"call_{n:03d}_{(n * 2654435761) % 16**8:08x}"


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
                                     caller=llm_id, metadata={"toolCallId": _tool_call_id(self.calls)})
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
        status="running", caller=retry, metadata={"toolCallId": _tool_call_id(a.calls)},
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

    from dagctx.cli import standalone_requested

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
            console.print(f"  [dim]· {escape(line)}[/dim]")

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


__all__ = ["STAND_IN_LABEL", "StandInSummarizer", "extractive_summary", "run_demo"]
