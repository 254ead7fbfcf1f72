"""The demo's synthetic but realistic content (``dagctx demo``): a CI log long enough to
spill, source files, a migration, test runs, diffs and logs the demo's agent reads and writes."""

from __future__ import annotations

from typing import Any


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


def tool_call_id(n: int) -> str:
    return f"call_{n:03d}_{(n * 2654435761) % 16**8:08x}"
