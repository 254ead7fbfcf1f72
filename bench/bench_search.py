"""search/query latency on 100k nodes: through the daemon vs the same FTS5 query in sqlite3.

Run: python bench/bench_search.py [--nodes N] [--sessions S] [--repeat R] [--db PATH]

1. Fill a database in-process with the Store API (``append_many`` in batches of
   1,000 per transaction): S sessions of user/llm/tool-call chains, mixed English,
   code identifiers and Chinese text from a fixed vocabulary (seeded, repeatable).
2. Start a daemon on it and time ``search/query`` round trips (Python client) for a
   set of queries, each repeated R times: p50/p95.
3. Run the same translated FTS5 expression and the same SQL (bm25 order, join for
   name/seq, limit) directly with sqlite3 in this process: p50/p95.

The ratio is what the protocol, the client, snippets and query translation add to
the query itself.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sqlite3
import statistics
import sys
import tempfile
import time

from dagctx.client import DagctxClient
from dagctx.ledger import Store
from dagctx.ledger.search import fts_query
from dagctx.protocol.nodes import NodeInput

EN = (
    "the a config file parser error test build cache request user session branch retry model token "
    "budget summary window render deploy server client timeout latency migration schema index query "
    "python rust sqlite thread lock commit rollback merge review patch release version docs"
).split()
IDENT = ["parse_config", "src/app.py", "load_settings", "tests/test_io.py", "UserRepository", "fetch_rows",
         "max_tokens", "HTTPError", "utils.retry_backoff", "db/migrate_0042.sql"]
ZH = ["数据库", "迁移", "脚本", "配置", "文件", "测试", "失败", "用户", "会话", "分支", "模型", "缓存",
      "请求", "超时", "索引", "查询", "我们需要", "一个", "写", "修复", "错误", "部署", "服务器", "版本"]
RARE = ["xylophone", "quokka", "zanzibar", "柠檬茶"]


def sentence(rng: random.Random) -> str:
    parts: list[str] = []
    zh_run = ""
    for _ in range(rng.randint(12, 40)):
        r = rng.random()
        if r < 0.35:
            zh_run += rng.choice(ZH)  # unspaced Chinese, like real text
            continue
        if zh_run:
            parts.append(zh_run + "，")
            zh_run = ""
        parts.append(rng.choice(IDENT) if r < 0.42 else rng.choice(EN))
    if zh_run:
        parts.append(zh_run + "。")
    if rng.random() < 0.001:
        parts.insert(rng.randrange(len(parts) + 1), rng.choice(RARE))
    return " ".join(parts)


def build(path: str, n_nodes: int, n_sessions: int) -> list[str]:
    rng = random.Random(42)
    store = Store(path)
    sids = []
    per_session = n_nodes // n_sessions
    try:
        for s in range(n_sessions):
            info = store.create_session(f"bench {s}")
            sids.append(info.session_id)
            prev = "ROOT"
            made = 0
            while made < per_session:
                batch: list[NodeInput] = []
                while len(batch) < 1000 and made + len(batch) < per_session:
                    k = made + len(batch)
                    nid = f"s{s}n{k}"
                    if k % 3 == 0:
                        batch.append(NodeInput(role="user", id=nid, input=sentence(rng), predecessor=prev))
                        prev = nid
                    elif k % 3 == 1:
                        batch.append(NodeInput(role="llm", id=nid, output=sentence(rng), predecessor=prev))
                        prev = nid
                    else:
                        batch.append(NodeInput(role="code", id=nid, name="grep", input={"pattern": rng.choice(IDENT)},
                                               output=sentence(rng), caller=prev,
                                               metadata={"toolCallId": f"c{k}"}))
                store.append_many(info.session_id, batch, head=prev)
                made += len(batch)
    finally:
        store.close()
    return sids


QUERIES = [
    ("common word", "config", False),
    ("two words", "migration schema", False),
    ("identifier", "parse_config", False),
    ("path", "src/app.py", False),
    ("rare word", "xylophone", False),
    ("CJK 2 chars", "迁移", False),
    ("CJK 1 char", "库", False),
    ("CJK 4 chars", "迁移脚本", False),
    ("mixed", "数据库 migration", False),
    ("OR", "timeout OR 超时", False),
    ("scoped common", "config", True),
    ("scoped CJK", "迁移", True),
]

SQL = (
    "SELECT s.session_id, s.node_id, s.role, bm25(search, 1.0, 1.0) AS score, s.text, n.name, n.seq "
    "FROM search s JOIN nodes n ON n.rowid = s.rowid WHERE search MATCH ?"
)


def direct(db: sqlite3.Connection, query: str, sid: str | None, limit: int) -> int:
    sql = SQL + (" AND s.session_id = ?" if sid else "") + " ORDER BY score LIMIT ?"
    args: list = [fts_query(query)] + ([sid] if sid else []) + [limit]
    return len(db.execute(sql, args).fetchall())


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p * (len(xs) - 1))))]


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=100_000)
    ap.add_argument("--sessions", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=25)
    ap.add_argument("--limit", type=int, default=20)
    ap.add_argument("--db", help="reuse (or create) this database instead of a temporary one")
    args = ap.parse_args()

    path = args.db or os.path.join(tempfile.mkdtemp(prefix="dagctx-bench-"), "search.db")
    t = time.perf_counter()
    if not os.path.exists(path):
        build(path, args.nodes, args.sessions)
        print(f"built {args.nodes:,} nodes in {args.sessions} sessions in {time.perf_counter() - t:.1f}s "
              f"({os.path.getsize(path) / 1e6:.0f} MB + WAL)")
    db = sqlite3.connect(path)
    (count,) = db.execute("SELECT count(*) FROM search").fetchone()
    scoped_sid = db.execute("SELECT id FROM sessions ORDER BY id LIMIT 1").fetchone()[0]

    c = await DagctxClient.spawn(path, standalone=True)
    rows = []
    all_d: list[float] = []
    all_r: list[float] = []
    try:
        for label, q, scoped in QUERIES:
            sid = scoped_sid if scoped else None
            res = await c.search(q, session_id=sid, limit=args.limit)  # warm-up, and the hit count
            n_direct = direct(db, q, sid, args.limit)
            assert len(res.hits) == n_direct, (q, len(res.hits), n_direct)
            (matches,) = db.execute(
                "SELECT count(*) FROM search WHERE search MATCH ?" + (" AND session_id = ?" if sid else ""),
                [fts_query(q)] + ([sid] if sid else []),
            ).fetchone()
            d_times, r_times = [], []
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                await c.search(q, session_id=sid, limit=args.limit)
                d_times.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                direct(db, q, sid, args.limit)
                r_times.append(time.perf_counter() - t0)
            all_d += d_times
            all_r += r_times
            rows.append((label, q, matches, d_times, r_times))
    finally:
        await c.close()
        db.close()

    ms = 1000.0
    print(f"search/query on {count:,} indexed nodes, limit {args.limit}, {args.repeat} runs each (ms)")
    print(f"  {'query':28} {'matches':>8} {'daemon p50':>10} {'p95':>7} {'sqlite p50':>10} {'p95':>7} {'ratio p50':>9}")
    for label, q, matches, d, r in rows:
        name = f"{label} [{q}]"
        print(f"  {name:28} {matches:8,} {statistics.median(d) * ms:10.2f} {pct(d, .95) * ms:7.2f} "
              f"{statistics.median(r) * ms:10.2f} {pct(r, .95) * ms:7.2f} "
              f"{statistics.median(d) / statistics.median(r):9.2f}")
    print(f"  {'all queries':28} {'':8} {statistics.median(all_d) * ms:10.2f} {pct(all_d, .95) * ms:7.2f} "
          f"{statistics.median(all_r) * ms:10.2f} {pct(all_r, .95) * ms:7.2f} "
          f"{statistics.median(all_d) / statistics.median(all_r):9.2f}")


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
