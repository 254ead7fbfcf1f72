"""Round trips through the daemon against a bare msgspec loop, and startup time.

Run: python bench/bench_roundtrip.py [--requests N] [--window W] [--startups K] [--runs R] [--via serve|standalone]

``--via serve`` (the default) drives the daemon the way every client does: through a
``dagctx serve`` forwarder to the shared per-user daemon (a private one for this run);
``--via standalone`` drives ``dagctx serve --standalone`` on stdio.

1. sequential small requests (one in flight): requests/s, daemon vs bare loop, each
   server's 1,500 in a row, and again interleaved: 50 of each server in turn
   (``sequential_interleaved``), so a change of the machine's speed hits all alike;
2. pipelined small requests (``--window`` in flight): requests/s, daemon vs bare loop;
3. startup: spawn → initialize reply, median of K, for the daemon, the bare loop and
   a bare pygls server.

Both servers are driven by the same minimal framing client (``RawPeer``), so the
ratio is the daemon's own overhead (dispatch, msgspec params/result Structs, the
SQL behind ``session/list``). Daemon and bare loop alternate within each of three
runs (``--runs``), so load from other processes hits both alike; every row prints the
median of the runs and the median of the runs' ratios. Through ``dagctx serve`` a
second forwarder with ``DAGCTX_HANDOFF=0`` (relaying bytes itself instead of handing
the client's stdio to the daemon, SPEC §1.3) is measured beside it.
Goals (issue #25): ≥ 0.8× the bare loop sequential, ≥ 0.5× pipelined, through ``dagctx serve``.
Beside them, for what they are worth: the same bare loop on an asyncio event loop
(``bare_asyncio_loop.py``), the floor of any server that waits for its clients in one
loop, and the daemon's ratio to it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec

HERE = Path(__file__).resolve().parent
DAEMON = [sys.executable, "-P", "-m", "dagctx.cli", "serve", "--standalone"]
SERVE = [sys.executable, "-P", "-m", "dagctx.cli", "serve"]
BARE = [sys.executable, str(HERE / "bare_loop.py")]
AIO = [sys.executable, str(HERE / "bare_asyncio_loop.py")]
PYGLS = [sys.executable, str(HERE / "bare_pygls.py")]


class _Env(msgspec.Struct):
    id: Any = None
    method: Any = None
    result: msgspec.Raw = msgspec.Raw(b"null")
    error: Any = None


class RawPeer:
    """The thinnest client that can drive an LSP-framed JSON-RPC server."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.reader = proc.stdout
        self.writer = proc.stdin
        self.pending: dict[int, asyncio.Future[Any]] = {}
        self.next_id = 0
        self.enc = msgspec.json.Encoder()
        self.dec = msgspec.json.Decoder(_Env)
        self.task = asyncio.ensure_future(self._read())

    @classmethod
    async def start(cls, argv: list[str]) -> RawPeer:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL, limit=1 << 24,
        )
        return cls(proc)

    async def _read(self) -> None:
        r = self.reader
        try:
            while True:
                header = await r.readuntil(b"\r\n\r\n")
                n = 0
                for line in header.split(b"\r\n"):
                    k, _, v = line.partition(b":")
                    if k.strip().lower() == b"content-length":
                        n = int(v)
                msg = self.dec.decode(await r.readexactly(n))
                if msg.method is not None:
                    continue  # a notification (or a server request): not benchmarked
                fut = self.pending.pop(msg.id, None)
                if fut is not None and not fut.done():
                    if msg.error is not None:
                        fut.set_exception(RuntimeError(str(msg.error)))
                    else:
                        fut.set_result(msg.result)
        except (asyncio.IncompleteReadError, ConnectionError):
            for fut in self.pending.values():
                if not fut.done():
                    fut.set_exception(ConnectionError("server closed"))

    def send(self, method: str, params: Any = None) -> asyncio.Future[Any]:
        self.next_id += 1
        fut = asyncio.get_running_loop().create_future()
        self.pending[self.next_id] = fut
        body = self.enc.encode({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params})
        self.writer.write(b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        return fut

    def notify(self, method: str, params: Any = None) -> None:
        body = self.enc.encode({"jsonrpc": "2.0", "method": method, "params": params})
        self.writer.write(b"Content-Length: %d\r\n\r\n%s" % (len(body), body))

    async def call(self, method: str, params: Any = None) -> Any:
        return await self.send(method, params)

    async def close(self) -> None:
        try:
            await asyncio.wait_for(self.call("shutdown"), 5)
            self.notify("exit")
            await self.writer.drain()
            self.writer.close()
        except Exception:
            pass
        try:
            await asyncio.wait_for(self.proc.wait(), 5)
        except asyncio.TimeoutError:
            self.proc.kill()
            await self.proc.wait()
        self.task.cancel()


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (Linux /proc); 0.0 where unavailable."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def init_params(db: str | None) -> dict[str, Any]:
    return {
        "processId": os.getpid(),
        "capabilities": {},
        "initializationOptions": {"database": db} if db else {},
    }


async def sequential(peer: RawPeer, method: str, params: Any, n: int) -> float:
    for _ in range(min(200, n)):  # warm-up
        await peer.call(method, params)
    t = time.perf_counter()
    for _ in range(n):
        await peer.call(method, params)
    return n / (time.perf_counter() - t)


async def sequential_interleaved(peers: dict[str, RawPeer], method: str, params: Any, n: int,
                                 chunk: int = 50) -> dict[str, float]:
    """``sequential`` for every server at once: ``chunk`` round trips of each in turn until
    each made ``n``, each server's time summed. This machine's speed swings between two
    modes within seconds (a wake-up twice as fast in one); servers measured one after the
    other caught different modes, a ratio of one run then said more of the machine than
    of the servers. Interleaved in chunks of tens of milliseconds, they share the mode."""
    for peer in peers.values():  # warm-up
        for _ in range(min(200, n)):
            await peer.call(method, params)
    spent = dict.fromkeys(peers, 0.0)
    for _ in range(max(1, n // chunk)):
        for server, peer in peers.items():
            t = time.perf_counter()
            for _ in range(chunk):
                await peer.call(method, params)
            spent[server] += time.perf_counter() - t
    made = max(1, n // chunk) * chunk
    return {server: made / t for server, t in spent.items()}


async def pipelined(peer: RawPeer, method: str, params: Any, n: int, window: int) -> float:
    await asyncio.gather(*(peer.send(method, params) for _ in range(window)))  # warm-up
    sem = asyncio.Semaphore(window)
    done = 0

    def release(_: asyncio.Future[Any]) -> None:
        nonlocal done
        done += 1
        sem.release()

    futs = []
    t = time.perf_counter()
    for _ in range(n):
        await sem.acquire()
        fut = peer.send(method, params)
        fut.add_done_callback(release)
        futs.append(fut)
        if len(futs) % window == 0:
            await peer.writer.drain()
    await asyncio.gather(*futs)
    return n / (time.perf_counter() - t)


async def startup(argv: list[str], db: str | None) -> float:
    t = time.perf_counter()
    peer = await RawPeer.start(argv)
    await peer.call("initialize", init_params(db))
    elapsed = time.perf_counter() - t
    await peer.close()
    return elapsed


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=1500, help="sequential requests per run (pipelined: 3×)")
    ap.add_argument("--window", type=int, default=200)
    ap.add_argument("--startups", type=int, default=5)
    ap.add_argument("--runs", type=int, default=3, help="runs; each row prints the median of them")
    ap.add_argument("--via", choices=("serve", "standalone"), default="serve")
    args = ap.parse_args()

    tmp = tempfile.mkdtemp(prefix="dagctx-bench-")
    db = os.path.join(tmp, "bench.db")
    if args.via == "serve":  # a private shared daemon for this run, stopped at the end
        os.environ["XDG_RUNTIME_DIR"] = os.path.join(tmp, "run")
        os.environ["DAGCTX_STATE_DIR"] = os.path.join(tmp, "state")
        os.environ.pop("DAGCTX_STANDALONE", None)
        os.makedirs(os.environ["XDG_RUNTIME_DIR"], mode=0o700)
    via = SERVE if args.via == "serve" else DAEMON

    daemon = await RawPeer.start([*via, "--db", db])
    await daemon.call("initialize", init_params(db))
    for i in range(20):
        await daemon.call("session/create", {"title": f"s{i}"})
    peers = {"daemon": daemon}
    if args.via == "serve":  # the same forwarder relaying bytes itself (no stdio hand-off)
        os.environ["DAGCTX_HANDOFF"] = "0"
        relay = await RawPeer.start([*via, "--db", db])
        del os.environ["DAGCTX_HANDOFF"]
        await relay.call("initialize", init_params(db))
        peers["relayed"] = relay
    bare = await RawPeer.start(BARE)
    await bare.call("initialize", init_params(None))
    peers["bare"] = bare
    aio = await RawPeer.start(AIO)  # the same loop on an asyncio event loop: where any daemon starts
    await aio.call("initialize", init_params(None))
    peers["asyncio"] = aio

    listed = msgspec.json.decode(await daemon.call("session/list", {"limit": 1}))
    sid = listed["sessions"][0]["sessionId"]
    n_seq, n_pip = args.requests, args.requests * 3
    #: (row, server) → rate of each run; the servers alternate inside a run, so load
    #: from other processes hits them alike
    rates: dict[tuple[str, str], list[float]] = {}
    rows: list[str] = []
    for method, params in (("session/list", {"limit": 1}), ("session/get", {"sessionId": sid})):
        sname, pname = f"sequential {method}", f"pipelined x{args.window} {method}"
        iname = f"sequential {method}, interleaved"
        rows += [sname, iname, pname]
        for _ in range(args.runs):
            for server, peer in peers.items():
                rates.setdefault((sname, server), []).append(await sequential(peer, method, params, n_seq))
            for server, rate in (await sequential_interleaved(peers, method, params, n_seq)).items():
                rates.setdefault((iname, server), []).append(rate)
            for server, peer in peers.items():
                rates.setdefault((pname, server), []).append(
                    await pipelined(peer, method, params, n_pip, args.window))
    if args.via == "serve":
        await daemon.call("daemon/stop")
    for peer in peers.values():
        await peer.close()

    med = statistics.median
    print(f"through {'dagctx serve (forwarder → shared daemon)' if args.via == 'serve' else 'serve --standalone'}")
    print(f"round trips, requests/s: median of {args.runs} runs ({n_seq} sequential / {n_pip} pipelined "
          "requests each; the servers alternate within a run); ratio = median of the runs' ratios")
    head = f"  {'':38} {'daemon':>9} {'bare loop':>10} {'ratio':>6}  goal"
    head += "          asyncio floor ratio"
    if "relayed" in peers:
        head += "   relayed (no hand-off) ratio"
    print(head)
    for name in rows:
        goal = 0.8 if name.startswith("sequential") else 0.5
        d, b = rates[(name, "daemon")], rates[(name, "bare")]
        ratio = med([x / y for x, y in zip(d, b)])
        line = (f"  {name:38} {med(d):9,.0f} {med(b):10,.0f} {ratio:6.2f}  >={goal} "
                f"{'ok   ' if ratio >= goal else 'BELOW'}")
        a = rates[(name, "asyncio")]
        line += f"  {med(a):9,.0f} {med([x / y for x, y in zip(d, a)]):5.2f}"
        if "relayed" in peers:
            r = rates[(name, "relayed")]
            line += f"  {med(r):9,.0f} {med([x / y for x, y in zip(r, b)]):6.2f}"
        print(line)
        print(f"  {'':38} runs: daemon {', '.join(f'{x:,.0f}' for x in d)}; "
              f"bare {', '.join(f'{x:,.0f}' for x in b)}; asyncio {', '.join(f'{x:,.0f}' for x in a)}")

    times: dict[str, list[float]] = {"daemon": [], "bare loop": [], "bare pygls": []}
    for i in range(args.startups):
        times["daemon"].append(await startup([*DAEMON, "--db", os.path.join(tmp, f"s{i}.db")],
                                             os.path.join(tmp, f"s{i}.db")))
        times["bare loop"].append(await startup(BARE, None))
        times["bare pygls"].append(await startup(PYGLS, None))
    print(f"startup: spawn → initialize reply, median of {args.startups} (ms)")
    base = statistics.median(times["bare loop"])
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"  {name:12} {med * 1000:8.1f}   (min {min(ts) * 1000:.1f}, max {max(ts) * 1000:.1f}; "
              f"{med / base:.1f}x the bare loop)")


if __name__ == "__main__":
    asyncio.run(main())
