"""Acknowledged ``node/append`` per second against raw sqlite3 inserts.

Run: python bench/bench_append.py [--appends N] [--rounds R]

The daemon side is the Python client awaiting each append in turn (one in flight),
a chain of user/llm turns with a tool call every few turns, ~200-character texts.
The baselines, in this process, use the same durability settings as the ledger
(WAL, synchronous=NORMAL, one transaction per insert):

* ``raw row``: one INSERT of a node-like row (msgpack body, indexed columns);
* ``raw row+fts+session``: what an append writes at minimum: the row, its FTS row
  and the session counter update, in one transaction.

Goal: daemon ≥ 0.3× the raw row baseline. Daemon and baselines alternate in rounds;
each keeps its best round.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sqlite3
import sys
import tempfile
import time
import uuid

import msgspec

from bench_roundtrip import cpu_seconds

from dagctx.client import DagctxClient
from dagctx.protocol.nodes import Call

TEXTS = [
    "Please refactor parse_config in src/app.py so that it reads settings.toml lazily and caches the result.",
    "我们需要写一个数据库迁移脚本，把旧的 users 表拆成 accounts 和 profiles 两张表，并保留外键。",
    "The build failed: tests/test_io.py::test_roundtrip raised UnicodeDecodeError on the fixture file.",
    "好的，我先读取 migrations 目录，然后生成迁移脚本的第一版，稍后运行测试确认没有回归。",
]


def text(i: int) -> str:
    return (TEXTS[i % len(TEXTS)] + " ") * 2


async def daemon_round(c: DagctxClient, sid: str, head: str, n: int, start: int) -> tuple[float, str]:
    t = time.perf_counter()
    for i in range(start, start + n):
        if i % 2 == 0:
            r = await c.append(sid, "user", input=text(i), predecessor=head)
        else:
            r = await c.append(sid, "llm", output=text(i), predecessor=head)
            if i % 6 == 1:
                await c.append(sid, "code", name="read_file", input={"path": f"src/m{i}.py"},
                               output=text(i + 1), caller=r.node.id, metadata={"toolCallId": f"c{i}"})
        head = r.node.id
    elapsed = time.perf_counter() - t
    acked = n + len([i for i in range(start, start + n) if i % 2 == 1 and i % 6 == 1])
    return acked / elapsed, head


SCHEMA = """
CREATE TABLE sessions(id TEXT PRIMARY KEY, head TEXT, next_seq INTEGER, rev INTEGER, node_count INTEGER,
                      updated_at REAL);
CREATE TABLE nodes(rowid INTEGER PRIMARY KEY, session_id TEXT NOT NULL, id TEXT NOT NULL, seq INTEGER NOT NULL,
                   rev INTEGER NOT NULL, role TEXT NOT NULL, name TEXT NOT NULL, status TEXT NOT NULL,
                   caller TEXT, predecessor TEXT, created_at REAL NOT NULL, body BLOB NOT NULL);
CREATE UNIQUE INDEX nodes_id ON nodes(session_id, id);
CREATE UNIQUE INDEX nodes_seq ON nodes(session_id, seq);
CREATE INDEX nodes_rev ON nodes(session_id, rev);
CREATE INDEX nodes_predecessor ON nodes(session_id, predecessor);
CREATE INDEX nodes_caller ON nodes(session_id, caller);
CREATE VIRTUAL TABLE search USING fts5(text, grams, session_id UNINDEXED, node_id UNINDEXED, role UNINDEXED,
                                       tokenize = 'unicode61 remove_diacritics 2');
"""


class Raw:
    def __init__(self, path: str) -> None:
        self.db = sqlite3.connect(path, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.executescript(SCHEMA)
        self.db.execute("INSERT INTO sessions VALUES('s', 'root', 1, 1, 1, 0)")
        self.enc = msgspec.msgpack.Encoder()
        self.seq = 0
        self.prev = "root"

    def _row(self, i: int) -> tuple:
        self.seq += 1
        nid = uuid.uuid4().hex
        role = "user" if i % 2 == 0 else "llm"
        call = Call(id=nid, seq=self.seq, created_at=time.time(), role=role, input=text(i), predecessor=self.prev)
        self.prev = nid
        return ("s", nid, self.seq, self.seq, role, "", "completed", None, call.predecessor, call.created_at,
                self.enc.encode(call))

    def round(self, n: int, start: int, full: bool) -> float:
        db = self.db
        t = time.perf_counter()
        for i in range(start, start + n):
            row = self._row(i)
            db.execute("BEGIN IMMEDIATE")
            cur = db.execute(
                "INSERT INTO nodes(session_id, id, seq, rev, role, name, status, caller, predecessor, created_at, body)"
                " VALUES(?,?,?,?,?,?,?,?,?,?,?)", row)
            if full:
                db.execute("INSERT INTO search(rowid, text, grams, session_id, node_id, role) VALUES(?,?,?,?,?,?)",
                           (cur.lastrowid, text(i), "", "s", row[1], row[4]))
                db.execute("UPDATE sessions SET head=?, next_seq=?, rev=?, node_count=?, updated_at=? WHERE id='s'",
                           (row[1], self.seq + 1, self.seq, self.seq + 1, time.time()))
            db.execute("COMMIT")
        return n / (time.perf_counter() - t)


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--appends", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="dagctx-bench-")
    per = args.appends // args.rounds

    c = await DagctxClient.spawn(os.path.join(tmp, "daemon.db"), standalone=True)
    c.keep_notifications = False
    s = await c.session_create("bench")
    sid, head = s.session_id, s.head
    raw_row = Raw(os.path.join(tmp, "raw_row.db"))
    raw_full = Raw(os.path.join(tmp, "raw_full.db"))
    await daemon_round(c, sid, head, 50, 0)  # warm-up (tokenizers, caches)
    head = (await c.session_get(sid)).head
    d_rates, r_rates, f_rates = [], [], []
    pid = c.process.pid if c.process is not None else 0
    cpu_d = cpu_r = 0.0
    start = 50
    before = (await c.session_get(sid)).node_count
    for _ in range(args.rounds):
        c0 = cpu_seconds(pid)
        rate, head = await daemon_round(c, sid, head, per, start)
        cpu_d += cpu_seconds(pid) - c0
        d_rates.append(rate)
        c0 = time.process_time()
        r_rates.append(raw_row.round(per, start, full=False))
        cpu_r += time.process_time() - c0
        f_rates.append(raw_full.round(per, start, full=True))
        start += per
    info = await c.session_get(sid)
    n_daemon = info.node_count - before
    await c.close()

    d, r, f = max(d_rates), max(r_rates), max(f_rates)
    print(f"acknowledged appends/s (best of {args.rounds} rounds of {per}; WAL, synchronous=NORMAL,"
          f" one transaction each)")
    print(f"  daemon node/append via client  {d:10,.0f}   ({info.node_count - 1:,} nodes in the session)")
    print(f"  raw sqlite3 row                {r:10,.0f}   daemon/raw = {d / r:.2f}  (goal >= 0.3: "
          f"{'ok' if d / r >= 0.3 else 'BELOW'})")
    print(f"  raw sqlite3 row+fts+session    {f:10,.0f}   daemon/raw = {d / f:.2f}")
    print(f"  per append: daemon {1e6 / d:.0f} us, raw row {1e6 / r:.0f} us, raw row+fts+session {1e6 / f:.0f} us")
    print(f"  CPU per append: daemon process {cpu_d / n_daemon * 1e6:.0f} us, "
          f"raw row {cpu_r / (per * args.rounds) * 1e6:.0f} us")


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
