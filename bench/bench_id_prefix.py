"""``dagctx show PREFIX`` on a database of many sessions (SPEC §4.3), both backends.

A database of SESSIONS sessions (default 10,000), three nodes each (a user turn, the reply,
a tool call), is filled through the ledger API; then, against the shared daemon a user
would have running (started by the warm-up, in a private runtime folder):

* the command line a person types, end to end: ``dagctx show NODEPREFIX`` (8 hex
  characters of a node id, no ``--session``) and ``dagctx history SESSIONPREFIX``, against
  the floor of the full command line in the same run: ``dagctx sessions --limit 1`` with
  ``DAGCTX_CLI_QUICK=0`` (the same imports, process start, connection and one request;
  ``sessions`` otherwise answers on a stdlib-only quick path, cli/quick.py, shown too).
  Goal: show ≤ 0.3 s; the ratio says what the lookup adds to that floor;
* inside the daemon: ``id/resolve`` for a node prefix and a session prefix against
  ``session/get`` of a full id (one primary-key row) — the ratio says whether the prefix
  costs more than an exact lookup;
* the old way of resolving a session prefix (``session/list`` paged over every session),
  for reference; the old ``show`` also walked every session's branches (7.9 s on 1.3k).

Medians of several runs, alternated. The machine is shared and loaded: quote the ratios.

    .venv/bin/python bench/bench_id_prefix.py [--sessions 10000] [--runs 7] [--pg URL | --no-pg]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from dagctx.client import DagctxClient  # noqa: E402
from dagctx.ledger import Store  # noqa: E402
from dagctx.protocol.nodes import NodeInput  # noqa: E402


def fill(db: str, sessions: int) -> tuple[list[str], list[str]]:
    """``sessions`` sessions of three nodes; their ids and their user nodes' ids."""
    s = Store(db)
    sids, nids = [], []
    try:
        for i in range(sessions):
            sid = s.create_session(f"session {i}").session_id
            u, a = uuid.uuid4().hex, uuid.uuid4().hex
            s.append_many(sid, [
                NodeInput(id=u, role="user", output=f"question {i}: refactor parse_config", predecessor="ROOT"),
                NodeInput(id=a, role="llm", output=f"answer {i}: done", predecessor=u),
                NodeInput(id=uuid.uuid4().hex, role="code", name="bash", input={"cmd": "ls"}, output="a.py",
                          caller=a, metadata={"toolCallId": f"c{i}"}),
            ], head=a)
            sids.append(sid)
            nids.append(u)
    finally:
        s.close()
    return sids, nids


def cli(env: dict[str, str], db: str, *args: str) -> float:
    t = time.perf_counter()
    p = subprocess.run([sys.executable, "-P", "-m", "dagctx.cli", "--db", db, *args], env=env, capture_output=True,
                       text=True, timeout=120)
    took = time.perf_counter() - t
    if p.returncode != 0:
        raise SystemExit(f"dagctx {' '.join(args)} failed: {p.stdout[-2000:]}{p.stderr[-2000:]}")
    return took


def unique_prefix(ids: list[str], target: str, n: int = 8) -> str:
    while sum(1 for x in ids if x.startswith(target[:n])) > 1:
        n += 1
    return target[:n]


async def daemon_side(db: str, env: dict[str, str], sids: list[str], nids: list[str], runs: int) -> dict[str, float]:
    c = await DagctxClient.spawn(db, env=env)
    out: dict[str, list[float]] = {"resolve node": [], "resolve session": [], "session/get": [], "old session scan": []}
    try:
        for r in range(runs):
            k = (r * 7919) % len(sids)
            np, sp = nids[k][:8], sids[k][:8]
            t = time.perf_counter()
            await c.id_resolve(np, kinds="node")
            out["resolve node"].append(time.perf_counter() - t)
            t = time.perf_counter()
            await c.id_resolve(sp, kinds="session")
            out["resolve session"].append(time.perf_counter() - t)
            t = time.perf_counter()
            await c.session_get(sids[k])
            out["session/get"].append(time.perf_counter() - t)
            t = time.perf_counter()
            offset, found = 0, []
            while True:
                page = await c.session_list(limit=500, offset=offset)
                found += [s for s in page.sessions if s.session_id.startswith(sp)]
                offset += len(page.sessions)
                if not page.sessions or offset >= page.total:
                    break
            out["old session scan"].append(time.perf_counter() - t)
    finally:
        await c.close()
    return {k: statistics.median(v) for k, v in out.items()}


def bench(name: str, db: str, args: argparse.Namespace, tmp: str) -> None:
    t = time.perf_counter()
    sids, nids = fill(db, args.sessions)
    print(f"{name}: filled {len(sids):,} sessions ({3 * len(sids):,} nodes) in {time.perf_counter() - t:.0f} s")
    run = Path(tmp) / f"run-{name}"
    run.mkdir()
    env = {**os.environ, "XDG_RUNTIME_DIR": str(run), "DAGCTX_STATE_DIR": str(run / "state"), "COLUMNS": "200"}
    env.pop("DAGCTX_STANDALONE", None)
    env.pop("DAGCTX_DB", None)
    try:
        cli(env, db, "sessions", "--limit", "1")  # warm-up: starts the shared daemon, opens the database
        times: dict[str, list[float]] = {"floor: sessions --limit 1": [], "show NODEPREFIX": [], "history SESSIONPREFIX": [],
                                         "(quick path: sessions)": []}
        full = {**env, "DAGCTX_CLI_QUICK": "0"}
        for r in range(args.runs):
            k = (r * 104729) % len(sids)
            times["floor: sessions --limit 1"].append(cli(full, db, "sessions", "--limit", "1", "--json"))
            times["(quick path: sessions)"].append(cli(env, db, "sessions", "--limit", "1", "--json"))
            times["show NODEPREFIX"].append(cli(env, db, "show", unique_prefix(nids, nids[k]), "--json"))
            times["history SESSIONPREFIX"].append(cli(env, db, "history", unique_prefix(sids, sids[k]), "--json"))
        med = {k: statistics.median(v) for k, v in times.items()}
        floor = med["floor: sessions --limit 1"]
        for k, v in med.items():
            extra = "" if k.startswith("floor") else f"   ({v / floor:.2f}x the floor)"
            goal = f"   goal <= 0.3 s: {'ok' if v <= 0.3 else 'OVER'}" if k.startswith("show") else ""
            print(f"  {k:<28} {v * 1000:8.1f} ms{extra}{goal}")
        d = asyncio.run(daemon_side(db, env, sids, nids, max(args.runs, 15)))
        base = d["session/get"]
        print(f"  in the daemon (median of {max(args.runs, 15)}): session/get of a full id {base * 1000:.2f} ms")
        for k in ("resolve node", "resolve session", "old session scan"):
            print(f"    {k:<20} {d[k] * 1000:9.2f} ms   ({d[k] / base:.2f}x session/get)")
    finally:
        subprocess.run([sys.executable, "-P", "-m", "dagctx.cli", "daemon", "stop"], env=env, capture_output=True,
                       timeout=60)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sessions", type=int, default=10_000)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--pg", help="a PostgreSQL URL to use (else a throwaway server is started)")
    ap.add_argument("--no-pg", action="store_true", help="SQLite only")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="dagctx-bench-prefix-")
    bench("sqlite", os.path.join(tmp, "prefix.db"), args, tmp)
    if args.no_pg:
        return
    server = None
    url = args.pg
    if url is None:
        import pgserver

        reason = pgserver.missing_reason()
        if reason:
            print(f"postgresql: skipped ({reason})")
            return
        server = pgserver.start_server()
        url = server.new_database()
    try:
        bench("postgresql", url, args, tmp)
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    main()
