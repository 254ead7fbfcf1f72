"""SQLite vs PostgreSQL backends, each against a raw baseline on the same backend.

Run: python bench/bench_backends.py [--appends N] [--pg URL] [--corpus DIR]

Without ``--pg`` a throwaway PostgreSQL is started (initdb into a temp folder, Unix
socket only; tests/pgserver.py) and stopped at the end. For each backend:

* acknowledged ``node/append`` per second through a daemon (one in flight) vs raw
  inserts with the same durability, one transaction each, in this process (SQLite:
  WAL + synchronous=NORMAL; PostgreSQL: a committed transaction over the same socket):
  a node-like row alone, and the row + its search index entry + the session update
  (what an append writes at minimum). Goal: daemon/raw ≥ 0.3 on both;
* 4 daemons writing at once (4 sessions, and 4 writers on one session): appends/s;
* ``context/render`` of a 10,000-node session: cold (first render) and warm p50;
* ``search/query`` p50/p95 over the Chinese corpus (sharegpt-zh), and the recall of
  Chinese words against a brute-force substring scan of the same texts.

Rounds alternate daemon and baseline; each keeps its best.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import msgspec

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from dagctx.client import DagctxClient  # noqa: E402
from dagctx.ledger import Store  # noqa: E402
from dagctx.ledger import search as fts  # noqa: E402
from dagctx.protocol.nodes import Call, NodeInput  # noqa: E402

TEXT = "Please refactor parse_config in src/app.py; 我们需要写一个数据库迁移脚本，保留外键。 " * 2


# ---------------------------------------------------------------- raw baselines


class RawSqlite:
    """One transaction per insert. ``full``: the row, its FTS row and the session update
    (what an append writes at minimum); else the row alone."""

    def __init__(self, path: str) -> None:
        self.db = sqlite3.connect(path, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.execute("CREATE TABLE nodes(rowid INTEGER PRIMARY KEY, session_id TEXT, id TEXT, seq INTEGER, "
                        "body BLOB)")
        self.db.execute("CREATE UNIQUE INDEX nodes_seq ON nodes(session_id, seq)")
        self.db.execute("CREATE VIRTUAL TABLE search USING fts5(text, grams, tokenize='unicode61 remove_diacritics 2')")
        self.db.execute("CREATE TABLE sessions(id TEXT PRIMARY KEY, head TEXT, next_seq INTEGER)")
        self.db.execute("INSERT INTO sessions VALUES('s', '', 0)")
        self.seq = 0

    def round(self, n: int, full: bool = False) -> float:
        enc = msgspec.msgpack.Encoder()
        t = time.perf_counter()
        for _ in range(n):
            self.seq += 1
            nid = uuid.uuid4().hex
            body = enc.encode(Call(id=nid, seq=self.seq, created_at=time.time(), role="user", input=TEXT))
            self.db.execute("BEGIN IMMEDIATE")
            cur = self.db.execute("INSERT INTO nodes(session_id, id, seq, body) VALUES('s', ?, ?, ?)",
                                  (nid, self.seq, body))
            if full:
                self.db.execute("INSERT INTO search(rowid, text, grams) VALUES(?, ?, ?)",
                                (cur.lastrowid, TEXT, fts.cjk_grams(TEXT)))
                self.db.execute("UPDATE sessions SET head=?, next_seq=? WHERE id='s'", (nid, self.seq + 1))
            self.db.execute("COMMIT")
        return n / (time.perf_counter() - t)


class RawPostgres:
    """The same two baselines on PostgreSQL (``full``: row with its tsvector + session update)."""

    def __init__(self, url: str) -> None:
        import psycopg

        self.db = psycopg.connect(url, autocommit=True)
        self.db.execute("CREATE TABLE IF NOT EXISTS raw_nodes(session_id TEXT, id TEXT, seq BIGINT, body BYTEA, "
                        "vec TSVECTOR, PRIMARY KEY(session_id, id), UNIQUE(session_id, seq))")
        self.db.execute("CREATE INDEX IF NOT EXISTS raw_vec ON raw_nodes USING gin(vec)")
        self.db.execute("CREATE TABLE IF NOT EXISTS raw_sessions(id TEXT PRIMARY KEY, head TEXT, next_seq BIGINT)")
        self.db.execute("INSERT INTO raw_sessions VALUES('s', '', 0) ON CONFLICT DO NOTHING")
        self.seq = 0

    def round(self, n: int, full: bool = False) -> float:
        from dagctx.ledger import pg_search

        enc = msgspec.msgpack.Encoder()
        t = time.perf_counter()
        for _ in range(n):
            self.seq += 1
            nid = uuid.uuid4().hex
            body = enc.encode(Call(id=nid, seq=self.seq, created_at=time.time(), role="user", input=TEXT))
            if not full:
                self.db.execute("INSERT INTO raw_nodes(session_id, id, seq, body) VALUES('s', %s, %s, %s)",
                                (nid, self.seq, body))
                continue
            with self.db.transaction():
                self.db.execute("SELECT next_seq FROM raw_sessions WHERE id='s' FOR UPDATE")
                self.db.execute("INSERT INTO raw_nodes VALUES('s', %s, %s, %s, CAST(%s AS tsvector))",
                                (nid, self.seq, body, pg_search.document_vector(TEXT, fts.cjk_grams(TEXT))[0]))
                self.db.execute("UPDATE raw_sessions SET head=%s, next_seq=%s WHERE id='s'", (nid, self.seq + 1))
        return n / (time.perf_counter() - t)


# ---------------------------------------------------------------- through the daemon


async def append_round(c: DagctxClient, sid: str, n: int) -> float:
    head = (await c.session_get(sid)).head
    t = time.perf_counter()
    for i in range(n):
        r = await (c.append(sid, "user", input=TEXT, predecessor=head) if i % 2 == 0
                   else c.append(sid, "llm", output=TEXT, predecessor=head))
        head = r.node.id
    return n / (time.perf_counter() - t)


async def writers(db: str, n: int, shared: bool) -> float:
    clients = [await DagctxClient.spawn(db) for _ in range(4)]
    try:
        one = (await clients[0].session_create("shared")).session_id
        sids = [one] * 4 if shared else [(await c.session_create("w")).session_id for c in clients]

        async def write(c: DagctxClient, sid: str) -> None:
            for i in range(n):
                head = (await c.session_get(sid)).head
                await c.append(sid, "user", input=f"{TEXT} {i}", predecessor=head)

        t = time.perf_counter()
        await asyncio.gather(*[write(c, s) for c, s in zip(clients, sids)])
        return 4 * n / (time.perf_counter() - t)
    finally:
        for c in clients:
            await c.close()


def big_session(db: str, turns: int) -> str:
    """A session of ``turns`` user/llm turns with a tool call on every llm turn (4 nodes a turn... 3)."""
    s = Store(db)
    try:
        sid = s.create_session("10k").session_id
        batch, pred = [], "ROOT"
        for i in range(turns):
            u, a = f"u{i}", f"a{i}"
            batch += [NodeInput(id=u, role="user", input=f"question {i}: {TEXT}", predecessor=pred),
                      NodeInput(id=a, role="llm", output=f"answer {i}: {TEXT}", predecessor=u),
                      NodeInput(id=f"t{i}", role="code", name="read_file", input={"path": f"src/m{i}.py"},
                                output=TEXT * 3, caller=a, metadata={"toolCallId": f"c{i}"})]
            pred = a
        s.append_many(sid, batch, head=pred)
        return sid
    finally:
        s.close()


async def render_times(db: str, sid: str) -> tuple[float, float, int]:
    c = await DagctxClient.spawn(db)
    try:
        t = time.perf_counter()
        r = await c.request("context/render", {"sessionId": sid, "model": "gpt-4o"}, timeout=None)
        cold = time.perf_counter() - t
        warm = []
        for _ in range(5):
            t = time.perf_counter()
            await c.request("context/render", {"sessionId": sid, "model": "gpt-4o"}, timeout=None)
            warm.append(time.perf_counter() - t)
        return cold, statistics.median(warm), len(r.messages)
    finally:
        await c.close()


def corpus_texts(corpus: Path) -> list[str]:
    out = []
    for f in sorted((corpus / "sharegpt-zh").glob("*.jsonl")):
        for line in f.read_text(encoding="utf-8").splitlines():
            out += [t["value"] for t in json.loads(line).get("conversations", []) if str(t.get("value", "")).strip()]
    return out


def fill_corpus(db: str, texts: list[str]) -> dict[str, str]:
    s = Store(db)
    ids: dict[str, str] = {}
    try:
        for start in range(0, len(texts), 200):
            sid = s.create_session(f"corpus {start}").session_id
            batch, pred = [], "ROOT"
            for i, t in enumerate(texts[start:start + 200]):
                nid = f"n{start + i}"
                batch.append(NodeInput(id=nid, role="user", input=t, predecessor=pred) if i % 2 == 0
                             else NodeInput(id=nid, role="llm", output=t, predecessor=pred))
                ids[nid] = t
                pred = nid
            s.append_many(sid, batch)
    finally:
        s.close()
    return ids


def words(texts: list[str], n: int) -> list[str]:
    rng = random.Random(11)
    runs = [r for t in texts for r in fts.CJK_RUN.findall(t) if len(r) >= 2]
    out: set[str] = set()
    while len(out) < n:
        run = rng.choice(runs)
        k = rng.choice([2, 2, 2, 3, 4])
        if len(run) >= k:
            i = rng.randrange(len(run) - k + 1)
            out.add(run[i:i + k])
    return sorted(out)


async def search_stats(db: str, ids: dict[str, str], cjk: list[str], other: list[str]) -> tuple[float, float, float, float]:
    """Latency over every query; recall over the Chinese words only (a substring scan is
    their ground truth; for English words FTS matches whole words, not substrings)."""
    c = await DagctxClient.spawn(db)
    try:
        times, found, truth_n, hit_n = [], 0, 0, 0
        for q in cjk + other:
            t = time.perf_counter()
            res = await c.search(q, limit=1000)
            times.append(time.perf_counter() - t)
            if q not in cjk:
                continue
            got = {h.node_id for h in res.hits}
            truth = {nid for nid, text in ids.items() if q in text}
            truth_n += len(truth)
            hit_n += len(truth & got)
            found += truth <= got
        times.sort()
        p50 = times[len(times) // 2]
        p95 = times[min(len(times) - 1, int(len(times) * 0.95))]
        return p50, p95, hit_n / max(1, truth_n), found / len(cjk)
    finally:
        await c.close()


async def bench_backend(name: str, db_for, raw, args: argparse.Namespace, texts: list[str]) -> dict[str, object]:
    out: dict[str, object] = {}
    db = db_for("appends")
    c = await DagctxClient.spawn(db)
    c.keep_notifications = False
    sid = (await c.session_create("bench")).session_id
    await append_round(c, sid, 30)  # warm-up
    rounds, per = 3, args.appends // 3
    d, r, f = [], [], []
    for _ in range(rounds):
        d.append(await append_round(c, sid, per))
        r.append(raw.round(per))
        f.append(raw.round(per, full=True))
    await c.close()
    out["daemon"], out["raw"], out["raw_full"] = max(d), max(r), max(f)
    out["w4_separate"] = await writers(db_for("w4"), args.appends // 8, shared=False)
    out["w4_shared"] = await writers(db_for("w4s"), args.appends // 8, shared=True)
    rdb = db_for("render")
    rsid = big_session(rdb, 3334)
    out["render"] = await render_times(rdb, rsid)
    if texts:
        sdb = db_for("search")
        ids = fill_corpus(sdb, texts)
        cjk = words(texts, 60)
        out["search"] = await search_stats(sdb, ids, cjk, ["name", "price OR total", "invoice*", "游戏 NOT 宝可梦",
                                                           "generate_invoice", '"customer_name"'])
        out["search_words"] = len(cjk)
    return out


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--appends", type=int, default=1500)
    ap.add_argument("--pg", help="a PostgreSQL URL whose server may be used (a database is created per part)")
    ap.add_argument("--corpus", default=os.environ.get("DAGCTX_CORPUS") or str(REPO.parent / "shared" / "corpus"))
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="dagctx-bench-")
    texts = corpus_texts(Path(args.corpus)) if (Path(args.corpus) / "sharegpt-zh").is_dir() else []
    server = None
    if args.pg is None:
        import pgserver

        reason = pgserver.missing_reason()
        if reason:
            sys.exit(f"cannot start PostgreSQL: {reason}")
        server = pgserver.start_server()
    try:
        results = {}
        results["sqlite"] = await bench_backend("sqlite", lambda part: os.path.join(tmp, f"{part}.db"),
                                                RawSqlite(os.path.join(tmp, "raw.db")), args, texts)
        if server is not None:
            pg_db = lambda part: server.new_database()  # noqa: E731
            raw_url = server.new_database()
        else:
            pg_db = lambda part: args.pg  # noqa: E731
            raw_url = args.pg
        results["postgresql"] = await bench_backend("postgresql", pg_db, RawPostgres(raw_url), args, texts)
    finally:
        if server is not None:
            server.stop()
    print(f"backends (best of 3 rounds of {args.appends // 3} appends, one in flight, one transaction each)")
    for name, r in results.items():
        d, raw, full = r["daemon"], r["raw"], r["raw_full"]
        print(f"  {name:<10} daemon {d:8,.0f}/s   raw row {raw:8,.0f}/s (daemon/raw = {d / raw:.2f}, goal >= 0.3: "
              f"{'ok' if d / raw >= 0.3 else 'BELOW'})   raw row+index+session {full:8,.0f}/s "
              f"(daemon/raw = {d / full:.2f})")
        print(f"  {'':<10} 4 daemons: {r['w4_separate']:8,.0f}/s on 4 sessions, {r['w4_shared']:8,.0f}/s on one session")
        cold, warm, msgs = r["render"]
        print(f"  {'':<10} render of 10,002 nodes ({msgs:,} messages): cold {cold * 1e3:.0f} ms, warm p50 {warm * 1e3:.0f} ms")
        if "search" in r:
            p50, p95, recall, full = r["search"]
            print(f"  {'':<10} search over {len(texts):,} Chinese corpus texts: p50 {p50 * 1e3:.1f} ms, "
                  f"p95 {p95 * 1e3:.1f} ms; recall of {r['search_words']} Chinese words vs a substring scan "
                  f"{recall:.3f} (words with every occurrence found: {full:.0%})")
    s, p = results["sqlite"], results["postgresql"]
    print(f"  postgresql/sqlite: appends {p['daemon'] / s['daemon']:.2f}, 4 writers {p['w4_separate'] / s['w4_separate']:.2f}, "
          f"warm render {s['render'][1] / p['render'][1]:.2f} (speed)")


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
