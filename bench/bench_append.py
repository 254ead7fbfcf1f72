"""Acknowledged ``node/append`` per second against raw one-row-per-transaction loops.

Run: python bench/bench_append.py [--appends N] [--rounds R] [--sync NORMAL|FULL] [--no-pg]

Part 1, one sequential client:

The daemon side is the Python client awaiting each append in turn (one in flight),
a chain of user/llm turns with a tool call every few turns, ~200-character texts.
The baselines, in this process, use the same durability settings as the ledger
(WAL, synchronous=NORMAL, one transaction per insert):

* ``raw row``: one INSERT of a node-like row (msgpack body, indexed columns);
* ``raw row+fts+session``: what an append writes at minimum: the row, its FTS row
  and the session counter update, in one transaction.

* ``bare round trip + one raw commit``: a request answered by ``bare_loop.py`` (the
  msgspec stdio floor) plus one ``raw row`` transaction — the floor of an acknowledged
  append. Goal (issue 25): daemon ≥ 0.8× this.

Part 2, group commit: 8 connections to one shared daemon (its own socket), each
pipelining appends (a window of 16) to a chain of its own, against the raw row loop of the
same durability — SQLite, and PostgreSQL (a throwaway server, tests/pgserver.py) against a
raw psycopg loop of one row per transaction. Goal (issue 25): ≥ 1× each raw baseline.
``--sync FULL`` runs the daemon and the SQLite baselines with ``synchronous=FULL`` (a sync
per commit: where group commit pays most).

Daemon and baselines alternate in rounds (three by default); every figure is the median
of the rounds, every ratio the median of the rounds' ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from typing import Any

import msgspec

from bench_roundtrip import BARE, RawPeer, cpu_seconds

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
    def __init__(self, path: str, sync: str = "NORMAL") -> None:
        self.db = sqlite3.connect(path, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute(f"PRAGMA synchronous={sync}")
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


async def bare_round_trip(n: int) -> float:
    """Sequential round trips/s of the bare msgspec loop (median of 3)."""
    peer = await RawPeer.start(BARE)
    await peer.call("initialize", {})
    rates = []
    for _ in range(3):
        t = time.perf_counter()
        for _ in range(n):
            await peer.call("session/get", {"sessionId": "s"})
        rates.append(n / (time.perf_counter() - t))
    await peer.close()
    return statistics.median(rates)


async def sequential_part(args: argparse.Namespace, tmp: str) -> None:
    per = args.appends // args.rounds
    c = await DagctxClient.spawn(os.path.join(tmp, "daemon.db"), standalone=True,
                                 env={**os.environ, "DAGCTX_SYNC": args.sync})
    c.keep_notifications = False
    s = await c.session_create("bench")
    sid, head = s.session_id, s.head
    raw_row = Raw(os.path.join(tmp, "raw_row.db"), args.sync)
    raw_full = Raw(os.path.join(tmp, "raw_full.db"), args.sync)
    await daemon_round(c, sid, head, 50, 0)  # warm-up (tokenizers, caches)
    head = (await c.session_get(sid)).head
    d_rates, r_rates, f_rates, b_rates = [], [], [], []
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
        b_rates.append(await bare_round_trip(min(per, 500)))
        start += per
    info = await c.session_get(sid)
    n_daemon = info.node_count - before
    await c.close()

    med = statistics.median
    d, r, f, b = med(d_rates), med(r_rates), med(f_rates), med(b_rates)
    floor = 1 / (1 / b + 1 / r)
    to_floor = med([dd / (1 / (1 / bb + 1 / rr)) for dd, bb, rr in zip(d_rates, b_rates, r_rates)])
    print(f"1. one sequential client: acknowledged appends/s (medians of {args.rounds} rounds of {per}, "
          f"each ratio the median of the rounds' ratios; WAL, synchronous={args.sync})")
    print(f"  daemon node/append via client  {d:10,.0f}   ({info.node_count - 1:,} nodes in the session)")
    print(f"  bare round trip + raw commit   {floor:10,.0f}   daemon/floor = {to_floor:.2f}  (goal >= 0.8: "
          f"{'ok' if to_floor >= 0.8 else 'BELOW'}; bare round trips {b:,.0f}/s)")
    print(f"  raw sqlite3 row                {r:10,.0f}   daemon/raw = "
          f"{med([x / y for x, y in zip(d_rates, r_rates)]):.2f}")
    print(f"  raw sqlite3 row+fts+session    {f:10,.0f}   daemon/raw = "
          f"{med([x / y for x, y in zip(d_rates, f_rates)]):.2f}")
    # What an acknowledged append writes at least (SPEC §5: its search row before the answer):
    # the floor with that transaction instead of the bare row's, and the goal's rate beside it.
    floor_fts = 1 / (1 / b + 1 / f)
    to_fts = med([dd / (1 / (1 / bb + 1 / ff)) for dd, bb, ff in zip(d_rates, b_rates, f_rates)])
    print(f"  bare round trip + row+fts+session {floor_fts:7,.0f}   daemon/that = {to_fts:.2f}  (0.8x the floor "
          f"above is {0.8 * floor:,.0f}/s: {'within' if floor_fts >= 0.8 * floor else 'beyond'} reach of an "
          f"append that writes its search row)")
    print(f"  per append: daemon {1e6 / d:.0f} us, floor {1e6 / floor:.0f} us, raw row {1e6 / r:.0f} us, "
          f"raw row+fts+session {1e6 / f:.0f} us")
    print(f"  CPU per append: daemon process {cpu_d / n_daemon * 1e6:.0f} us, "
          f"raw row {cpu_r / (per * args.rounds) * 1e6:.0f} us")


async def group_round(clients: list[DagctxClient], sids: list[str], heads: list[str], n: int,
                      window: int, tag: str) -> float:
    """Every client pipelines ``n`` appends to its own chain; acknowledged appends/s of all."""
    from dagctx.protocol import messages as m
    from dagctx.protocol.nodes import NodeInput

    async def one(k: int, c: DagctxClient) -> None:
        prev = heads[k]
        inflight: set[asyncio.Future] = set()
        for i in range(n):
            nid = f"{tag}.{k}.{i}"
            node = NodeInput(role="user" if i % 2 == 0 else "llm", id=nid, predecessor=prev,
                             **({"input": text(i)} if i % 2 == 0 else {"output": text(i)}))
            inflight.add(c.send_request("node/append", m.NodeAppendParams(session_id=sids[k], node=node))[1])
            prev = nid
            if len(inflight) >= window:
                done, inflight = await asyncio.wait(inflight, return_when=asyncio.FIRST_COMPLETED)
                for f in done:
                    f.result()
        for f in await asyncio.gather(*inflight):
            pass
        heads[k] = prev

    t = time.perf_counter()
    await asyncio.gather(*(one(k, c) for k, c in enumerate(clients)))
    return n * len(clients) / (time.perf_counter() - t)


class RawPg:
    """One row per transaction over psycopg: the PostgreSQL floor of an acknowledged append."""

    def __init__(self, url: str) -> None:
        import psycopg

        self.db = psycopg.connect(url, autocommit=True)
        self.db.execute("CREATE TABLE IF NOT EXISTS raw_nodes(session_id TEXT, id TEXT, seq BIGINT, rev BIGINT, "
                        "role TEXT, name BYTEA, status TEXT, caller TEXT, predecessor TEXT, "
                        "created_at DOUBLE PRECISION, body BYTEA, PRIMARY KEY(session_id, id), "
                        "UNIQUE(session_id, seq))")
        self.enc = msgspec.msgpack.Encoder()
        self.seq = 0

    def round(self, n: int, start: int) -> float:
        t = time.perf_counter()
        for i in range(start, start + n):
            self.seq += 1
            nid = uuid.uuid4().hex
            call = Call(id=nid, seq=self.seq, created_at=time.time(), role="user", input=text(i))
            with self.db.transaction():
                self.db.execute("INSERT INTO raw_nodes VALUES(%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s)",
                                ("s", nid, self.seq, self.seq, "user", b"", "completed", None, None,
                                 call.created_at, self.enc.encode(call)))
        return n / (time.perf_counter() - t)


async def group_part(args: argparse.Namespace, tmp: str, database: str, raw_round: Any, label: str) -> None:
    """8 connections of one shared daemon pipelining appends, against ``raw_round(n, start)``."""
    run = tempfile.mkdtemp(prefix="ba-", dir="/tmp")
    saved = {k: os.environ.get(k) for k in ("DAGCTX_STANDALONE", "XDG_RUNTIME_DIR", "DAGCTX_STATE_DIR",
                                            "DAGCTX_SYNC")}
    os.environ.pop("DAGCTX_STANDALONE", None)
    os.environ.update(XDG_RUNTIME_DIR=run, DAGCTX_STATE_DIR=os.path.join(run, "state"), DAGCTX_SYNC=args.sync)
    sock = os.path.join(run, "d.sock")
    clients: list[DagctxClient] = []
    try:
        for _ in range(args.clients):
            c = await DagctxClient.connect(database, socket_path=sock)
            c.keep_notifications = False
            clients.append(c)
        pid = (await clients[0].daemon_status()).pid
        sessions = [await c.session_create(f"group {k}") for k, c in enumerate(clients)]
        sids = [x.session_id for x in sessions]
        heads = [x.head for x in sessions]
        per = max(1, args.appends // args.rounds // args.clients)
        await group_round(clients, sids, heads, 20, args.window, "warm")
        d_rates, r_rates = [], []
        start = 0
        cpu = cpu_clients = 0.0
        for r in range(args.rounds):
            c0, k0 = cpu_seconds(pid), time.process_time()
            d_rates.append(await group_round(clients, sids, heads, per, args.window, f"r{r}"))
            cpu += cpu_seconds(pid) - c0
            cpu_clients += time.process_time() - k0
            r_rates.append(raw_round(per * args.clients, start))
            start += per * args.clients
        d, raw = statistics.median(d_rates), statistics.median(r_rates)
        ratio = statistics.median([x / y for x, y in zip(d_rates, r_rates)])
        print(f"{label}: {args.clients} connections pipelining (window {args.window}) into one shared daemon, "
              f"acknowledged appends/s (medians of {args.rounds} rounds of {per * args.clients}; ratio: the "
              "median of the rounds' ratios)")
        print(f"  daemon, group commit           {d:10,.0f}")
        print(f"  raw one row per transaction    {raw:10,.0f}   daemon/raw = {ratio:.2f}  (goal >= 1: "
              f"{'ok' if ratio >= 1 else 'BELOW'})")
        acked = per * args.clients * args.rounds
        print(f"  CPU per append: daemon process {cpu / acked * 1e6:.0f} us "
              "(what a loaded machine slows least)")
        # The clients share the machine's cores with the daemon: at the raw rate, those cores
        # give each append this much CPU, the clients' and the daemon's together.
        cores = len(os.sched_getaffinity(0))
        print(f"  CPU per append: the {args.clients} clients (this process) {cpu_clients / acked * 1e6:.0f} us; "
              f"daemon and clients {(cpu + cpu_clients) / acked * 1e6:.0f} us, against {cores * 1e6 / raw:.0f} us "
              f"that {cores} cores give an append at the raw rate")
        for c in clients:
            await c.close()
        os.kill(pid, 15)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--appends", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--window", type=int, default=16)
    ap.add_argument("--sync", default="NORMAL", choices=["NORMAL", "FULL"])
    ap.add_argument("--no-pg", action="store_true", help="skip the PostgreSQL part")
    ap.add_argument("--only", choices=["sequential", "group"], default=None)
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="dagctx-bench-")
    if args.only != "group":
        await sequential_part(args, tmp)
    if args.only == "sequential":
        return
    raw = Raw(os.path.join(tmp, "raw_group.db"), args.sync)
    await group_part(args, tmp, os.path.join(tmp, "group.db"), lambda n, start: raw.round(n, start, full=False),
                     f"2. group commit, SQLite (synchronous={args.sync})")
    if args.no_pg:
        return
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
    import pgserver

    reason = pgserver.missing_reason()
    if reason:
        print(f"3. PostgreSQL: skipped ({reason})")
        return
    server = pgserver.start_server()
    try:
        raw_pg = RawPg(server.new_database())
        await group_part(args, tmp, server.new_database(), raw_pg.round, "3. group commit, PostgreSQL (fsync=on)")
        raw_pg.db.close()
    finally:
        server.stop()


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
