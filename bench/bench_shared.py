"""The shared per-user daemon against its baselines, all measured in this run (SPEC §1).

Run: python bench/bench_shared.py [--quick]

Runs in a private runtime folder (its own daemon, stopped at the end), never the user's.

1. ``dagctx sessions`` wall time through a warm shared daemon (its stdlib quick path) vs
   the full command, ``--standalone`` and a bare Python start (goal: ≥ 8× faster than
   standalone, p50 ≤ 100 ms).
2. Forwarder start → ``initialize`` answered, vs ``python3 -c`` connecting a Unix socket
   (goal ≤ 2×).
3. Sequential round trips (``session/get``) through a forwarder vs a standalone daemon
   (goal ≥ 0.7×).
4. Fan-out: 8 subscribed clients, one appender: p50/p99 of append → ``node/didAppend``.
5. Acknowledged appends/s through the shared daemon vs a raw SQLite insert with the same
   durability (goal ≥ 0.3×).
6. p99 of ``session/list`` from another client while a heavy render with aging runs
   (goal ≤ 50 ms), and that render's cost with aging vs without.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_append import Raw, daemon_round  # noqa: E402
from bench_roundtrip import RawPeer, init_params  # noqa: E402

from dagctx.client import DagctxClient  # noqa: E402
from dagctx.protocol import transport  # noqa: E402

PY = [sys.executable, "-P"]
CLI = PY + ["-m", "dagctx.cli"]


def pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(p / 100 * (len(s) - 1))))]


def ms(x: float) -> str:
    return f"{x * 1000:7.1f} ms"


def wall(argv: list[str], n: int, env: dict[str, str]) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        subprocess.run(argv, check=True, capture_output=True, env=env)
        out.append(time.perf_counter() - t)
    return out


def bench_cli(db: str, n: int, env: dict[str, str]) -> None:
    """``dagctx sessions`` (its quick path), the full command (``DAGCTX_CLI_QUICK=0``), a
    standalone run and a bare ``python3 -c pass``, taken in turn so drift hits all four."""
    subprocess.run(CLI + ["sessions", "--db", db], check=True, capture_output=True, env=env)  # warm the daemon
    runs: dict[str, list[float]] = {"quick": [], "full": [], "standalone": [], "python": []}
    argv = {"quick": (CLI + ["sessions", "--db", db], env),
            "full": (CLI + ["sessions", "--db", db], {**env, "DAGCTX_CLI_QUICK": "0"}),
            "standalone": (CLI + ["sessions", "--db", db, "--standalone"], env),
            "python": ([sys.executable, "-c", "pass"], env)}
    for _ in range(n):
        for name, (cmd, e) in argv.items():
            runs[name] += wall(cmd, 1, e)
    p50 = {k: statistics.median(v) for k, v in runs.items()}
    print(f"1. dagctx sessions        shared p50 {ms(p50['quick'])} (full command {ms(p50['full'])}, "
          f"bare python {ms(p50['python'])}: {p50['quick'] / p50['python']:.1f}x)   standalone p50 "
          f"{ms(p50['standalone'])}   {p50['standalone'] / p50['quick']:.1f}x faster (goal >= 8x, p50 <= 100 ms: "
          f"{'ok' if p50['standalone'] / p50['quick'] >= 8 and p50['quick'] <= 0.1 else 'BELOW'})")


async def bench_spawn(db: str, n: int, sock: str) -> None:
    init = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": init_params(db)}).encode()
    frame = b"Content-Length: %d\r\n\r\n%s" % (len(init), init)
    fwd, bare = [], []
    for _ in range(n):
        t = time.perf_counter()
        proc = await asyncio.create_subprocess_exec(*CLI, "serve", "--db", db, stdin=asyncio.subprocess.PIPE,
                                                    stdout=asyncio.subprocess.PIPE)
        proc.stdin.write(frame)
        await proc.stdout.readuntil(b"\r\n\r\n")
        fwd.append(time.perf_counter() - t)
        proc.stdin.close()
        await proc.wait()
        t = time.perf_counter()
        code = f"import socket; s = socket.socket(socket.AF_UNIX); s.connect({sock!r}); s.close()"
        p2 = await asyncio.create_subprocess_exec(*PY, "-c", code)
        await p2.wait()
        bare.append(time.perf_counter() - t)
    r = statistics.median(fwd) / statistics.median(bare)
    print(f"2. forwarder → initialize p50 {ms(statistics.median(fwd))}   bare python + connect p50 "
          f"{ms(statistics.median(bare))}   {r:.2f}x (goal <= 2x: {'ok' if r <= 2 else 'ABOVE'})")


async def bench_roundtrips(db: str, n: int) -> None:
    rates = {}
    for name, extra in (("forwarder", []), ("standalone", ["--standalone"])):
        peer = await RawPeer.start(CLI + ["serve", "--db", db, *extra])
        await peer.call("initialize", init_params(db))
        s = await peer.call("session/create", {"title": "rt"})
        sid = json.loads(bytes(s))["sessionId"]
        for _ in range(50):
            await peer.call("session/get", {"sessionId": sid})
        t = time.perf_counter()
        for _ in range(n):
            await peer.call("session/get", {"sessionId": sid})
        rates[name] = n / (time.perf_counter() - t)
        await peer.close()
    r = rates["forwarder"] / rates["standalone"]
    print(f"3. round trips/s          forwarder {rates['forwarder']:8,.0f}   standalone {rates['standalone']:8,.0f}   "
          f"{r:.2f}x (goal >= 0.7x: {'ok' if r >= 0.7 else 'BELOW'})")


async def bench_fanout(db: str, n: int) -> None:
    writer = await DagctxClient.connect(db)
    s = await writer.session_create("fan-out")
    subs = [await DagctxClient.connect(db) for _ in range(8)]
    got: dict[str, list[float]] = {}
    for c in subs:
        c.keep_notifications = False
        c.on_notification("node/didAppend", lambda p: got.setdefault(p.node.id, []).append(time.perf_counter()))
        await c.subscribe(s.session_id)
    head, lat = s.head, []
    for i in range(n):
        t = time.perf_counter()
        r = await writer.append(s.session_id, "user", output=f"fan-out {i}", predecessor=head)
        head = r.head
        while len(got.get(r.node.id, ())) < len(subs):
            await asyncio.sleep(0.0005)
        lat.extend(x - t for x in got[r.node.id])
    print(f"4. fan-out to 8 clients   p50 {ms(pct(lat, 50))}   p99 {ms(pct(lat, 99))}   "
          f"(append sent → each subscriber has node/didAppend; {n} appends)")
    for c in subs + [writer]:
        await c.close()


async def bench_appends(db: str, tmp: str, n: int) -> None:
    c = await DagctxClient.connect(db)
    c.keep_notifications = False
    s = await c.session_create("appends")
    head = s.head
    _, head = await daemon_round(c, s.session_id, head, 50, 0)
    raw = Raw(os.path.join(tmp, "raw.db"))
    d_rates, r_rates = [], []
    for k in range(3):
        rate, head = await daemon_round(c, s.session_id, head, n, 50 + k * n)
        d_rates.append(rate)
        r_rates.append(raw.round(n, 50 + k * n, full=False))
    await c.close()
    d, r = max(d_rates), max(r_rates)
    print(f"5. appends/s              shared daemon {d:8,.0f}   raw sqlite row {r:8,.0f}   {d / r:.2f}x "
          f"(goal >= 0.3x: {'ok' if d / r >= 0.3 else 'BELOW'})")


async def bench_heavy(db: str, results: int) -> None:
    a = await DagctxClient.connect(db)
    b = await DagctxClient.connect(db)
    s = await a.session_create("heavy")
    head = s.head
    body = " ".join(f"w{k} src/mod_{k % 50}.py total {k * 7}" for k in range(200_000 // 30))
    for i in range(results):
        u = await a.append(s.session_id, "user", output=f"turn {i}: check src/mod_{i % 50}.py", predecessor=head)
        l1 = await a.append(s.session_id, "llm", name="gpt-4o", output="reading", predecessor=u.node.id)
        await a.append(s.session_id, "code", name="bash", input={"cmd": "cat"}, output=f"{body} {i}",
                       caller=l1.node.id, metadata={"toolCallId": f"c{i}"})
        l2 = await a.append(s.session_id, "llm", name="gpt-4o", output="done", predecessor=l1.node.id)
        head = l2.node.id
    t = time.perf_counter()
    await a.render(s.session_id, model="gpt-4o", aging=False)
    plain = time.perf_counter() - t
    t = time.perf_counter()
    _, fut = a.send_request("context/render", {"sessionId": s.session_id, "model": "gpt-4o", "aging": True})
    lat = []
    while not fut.done():
        t1 = time.perf_counter()
        await b.session_list(limit=5)
        lat.append(time.perf_counter() - t1)
    await fut
    aged = time.perf_counter() - t
    print(f"6. session/list during a heavy render   p50 {ms(pct(lat, 50))}   p99 {ms(pct(lat, 99))}   "
          f"({len(lat)} requests; goal p99 <= 50 ms: {'ok' if pct(lat, 99) <= 0.05 else 'ABOVE'})")
    print(f"   render of {results} x 200 KB one-line results (cold): with aging {ms(aged)}, without {ms(plain)}"
          f"   {aged / plain:.1f}x")
    await a.close()
    await b.close()


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer repetitions")
    args = ap.parse_args()
    q = args.quick
    tmp = tempfile.mkdtemp(prefix="dagctx-bench-shared-")
    os.environ["XDG_RUNTIME_DIR"] = os.path.join(tmp, "run")
    os.makedirs(os.environ["XDG_RUNTIME_DIR"])
    os.environ["DAGCTX_STATE_DIR"] = os.path.join(tmp, "state")
    os.environ.pop("DAGCTX_STANDALONE", None)
    env = dict(os.environ)
    db = os.path.join(tmp, "bench.db")
    sock = transport.socket_path()
    try:
        bench_cli(db, 3 if q else 7, env)
        await bench_spawn(db, 3 if q else 7, sock)
        await bench_roundtrips(db, 300 if q else 2000)
        await bench_fanout(db, 30 if q else 200)
        await bench_appends(db, tmp, 150 if q else 600)
        await bench_heavy(db, 20 if q else 40)
    finally:
        subprocess.run(CLI + ["daemon", "stop"], capture_output=True, env=env)


if __name__ == "__main__":
    asyncio.run(main())
