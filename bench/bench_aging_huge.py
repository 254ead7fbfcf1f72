"""Aging on a session of huge tool results: a render with aging vs one without.

Run: python bench/bench_aging_huge.py [--results N] [--size BYTES] [--repeat R] [--db PATH]

1. Through a real daemon (Python client, ``node/append``), write N user turns, each
   with one model call and one tool result of about BYTES characters of identifier-dense
   text (paths, snake_case and CamelCase names, hex ids). Every other result is one long
   line, the others have many lines; results over 32,000 characters are spilled either
   way (SPEC §4: by size; the node keeps head and tail). Every third user message names a path from an earlier result, so the citation
   gate has work to do.
2. ``stored``: the database as written — each result's ranked references were mined
   once at ``node/append`` and kept in its row (SPEC §8).
   ``mined``: a copy with those references removed (as in a database written before
   schema version 2), so the daemon mines every result while it plans aging (and then
   stores what it mined: the first cold plan is the one that pays).
3. For each: start a fresh daemon (its tokenizer loaded by a one-node scratch session)
   and time the session's first ``context/render`` (cold) with ``aging: false`` and, in
   another fresh daemon, with ``aging: true``; then, in the
   warm daemon, R times: append a new user turn and render (a new turn makes aging plan
   again from scratch) with and without aging. p50 of each; the ratios are against the
   render without aging measured in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time

from dagctx.client import DagctxClient

OPTIONS = {"aging": {"minAgeSeconds": 0}}
WORDS = ["parse_config", "load_settings", "UserRepository", "fetch_rows", "HTTPError", "retry_backoff",
         "SessionGraph", "render_view", "max_tokens", "commit", "value", "error", "line", "the", "and"]


def blob(rng: random.Random, i: int, size: int, lines: bool) -> str:
    parts: list[str] = []
    n = 0
    while n < size:
        r = rng.random()
        if r < 0.2:
            w = f"src/mod{rng.randint(0, 400)}/file{rng.randint(0, 50)}.py"
        elif r < 0.3:
            w = f"{rng.getrandbits(40):010x}"
        else:
            w = rng.choice(WORDS) + str(rng.randint(0, 99))
        parts.append(w)
        n += len(w) + 1
    sep = "\n" if lines else " "
    if lines:
        return "\n".join(" ".join(parts[k:k + 12]) for k in range(0, len(parts), 12))
    return sep.join(parts)


async def build(path: str, results: int, size: int) -> str:
    rng = random.Random(7)
    c = await DagctxClient.spawn(path, standalone=True, initialization_options=OPTIONS)
    try:
        sid = (await c.session_create("aging-huge")).session_id
        prev = "ROOT"
        for i in range(results):
            ask = f"step {i}: look at src/mod{rng.randint(0, 400)}/file{rng.randint(0, 50)}.py" if i % 3 == 0 \
                else f"step {i}: go on"
            u = (await c.append(sid, "user", output=ask, predecessor=prev)).node.id
            llm = (await c.append(sid, "llm", name="gpt-4o", output="reading", predecessor=u)).node.id
            await c.append(sid, "code", name="bash", input={"cmd": f"cat part{i}"},
                           output=blob(rng, i, size, lines=bool(i % 2)), caller=llm,
                           metadata={"toolCallId": f"call{i}"})
            prev = llm
    finally:
        await c.close()
    return sid


async def cold(path: str, sid: str, aging: bool) -> tuple[float, int]:
    c = await DagctxClient.spawn(path, standalone=True, initialization_options=OPTIONS)
    try:
        # load the tokenizer first (a one-time cost of any daemon's first count, ~90 ms):
        # what is timed is the session's first render, not the process's first count
        scratch = (await c.session_create("warm-up")).session_id
        await c.append(scratch, "user", output="hello", predecessor="ROOT")
        t = time.perf_counter()
        r = await c.render(sid, model="gpt-4o", aging=aging)
        return time.perf_counter() - t, len(r.manifest.get("agingKinds") or {})
    finally:
        await c.close()


async def warm(path: str, sid: str, repeat: int) -> tuple[list[float], list[float]]:
    """Per new user turn: (render without aging, render with aging), in one warm daemon."""
    c = await DagctxClient.spawn(path, standalone=True, initialization_options=OPTIONS)
    plain: list[float] = []
    aged: list[float] = []
    try:
        await c.render(sid, model="gpt-4o", aging=True)
        for i in range(repeat):
            for aging, out in ((False, plain), (True, aged)):
                head = (await c.session_get(sid)).head
                u = (await c.append(sid, "user", output=f"more {i} {aging}", predecessor=head)).node.id
                await c.append(sid, "llm", name="gpt-4o", output="ok", predecessor=u)
                t = time.perf_counter()
                await c.render(sid, model="gpt-4o", aging=aging)
                out.append(time.perf_counter() - t)
    finally:
        await c.close()
    return plain, aged


def drop_references(src: str, dst: str) -> None:
    shutil.copyfile(src, dst)
    db = sqlite3.connect(dst)
    db.execute("UPDATE nodes SET refs=NULL")
    db.commit()
    db.close()


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--results", type=int, default=200)
    ap.add_argument("--size", type=int, default=200_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--db", help="reuse (or create) this database instead of a temporary one")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="dagctx-aging-huge-")
    path = args.db or os.path.join(tmp, "stored.db")
    try:
        t = time.perf_counter()
        sid_file = path + ".sid"
        if os.path.exists(path) and os.path.exists(sid_file):
            sid = open(sid_file).read()
        else:
            sid = await build(path, args.results, args.size)
            open(sid_file, "w").write(sid)
            print(f"built {args.results} results of ~{args.size:,} chars in {time.perf_counter() - t:.1f} s "
                  f"({os.path.getsize(path) / 1e6:.0f} MB)")
        mined = os.path.join(tmp, "mined.db")
        drop_references(path, mined)
        print(f"{'database':10} {'cold plain':>11} {'cold aging':>11} {'ratio':>6} {'aged':>5}"
              f" {'turn plain':>11} {'turn aging':>11} {'ratio':>6}")
        for name, db in (("stored", path), ("mined", mined)):
            cp, _ = await cold(db, sid, False)
            ca, n = await cold(db, sid, True)
            plain, aged = await warm(db, sid, args.repeat)
            wp, wa = statistics.median(plain), statistics.median(aged)
            print(f"{name:10} {cp * 1e3:9.0f}ms {ca * 1e3:9.0f}ms {ca / cp:5.2f}x {n:5d}"
                  f" {wp * 1e3:9.1f}ms {wa * 1e3:9.1f}ms {wa / wp:5.2f}x")
            if name == "stored":
                drop_references(path, mined)  # the warm run appended turns: same session both ways
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
