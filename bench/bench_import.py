"""Import throughput: ``session/import`` through the daemon vs decoding the file alone.

Run: python bench/bench_import.py [--file PATH] [--rounds N]

The file defaults to the largest transcript of the shared corpus
(``claude-code/ae4a77f8-….jsonl``: 2,385 lines, 657 user+assistant messages, 242 tool
pairs, one compaction). Two measurements, each the best of ``--rounds``:

* **daemon**: one ``session/import`` request to a real daemon subprocess (spawned once,
  over stdio): detect the format, parse, count tokens for every node (cl100k and the
  estimate), spill large outputs, write the ledger and the search index in one SQLite
  transaction. Between rounds the session is deleted so the next round imports anew.
* **floor**: in this process, read the same file and JSON-decode every line with
  msgspec — the least any importer has to do.

Throughput is in messages per second (user + assistant lines, the importer's
``counts["messages"]``); the ratio says how many times slower than the floor the full
import is.
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

import msgspec

from dagctx.client import DagctxClient

DEFAULT_CORPUS = Path(os.environ.get("DAGCTX_CORPUS", Path(__file__).resolve().parents[2] / "shared" / "corpus"))
DEFAULT_FILE = DEFAULT_CORPUS / "claude-code" / "ae4a77f8-aedd-4bc1-888f-c94edc91af04.jsonl"


def floor_decode(path: Path) -> tuple[int, int]:
    """Read + decode every line; returns (lines, user+assistant messages)."""
    dec = msgspec.json.Decoder()
    lines = messages = 0
    with open(path, "rb") as fh:
        data = fh.read()
    for raw in data.split(b"\n"):
        raw = raw.strip()
        if not raw:
            continue
        try:
            obj = dec.decode(raw)
        except msgspec.DecodeError:
            continue
        lines += 1
        if isinstance(obj, dict) and obj.get("type") in ("user", "assistant"):
            messages += 1
    return lines, messages


async def daemon_rounds(path: Path, rounds: int) -> tuple[list[float], int, int]:
    with tempfile.TemporaryDirectory(prefix="dagctx-bench-import-") as tmp:
        client = await DagctxClient.spawn(Path(tmp) / "bench.db", standalone=True)
        try:
            times: list[float] = []
            nodes = pairs = 0
            for _ in range(rounds):
                t0 = time.perf_counter()
                res = await client.import_path(str(path))
                times.append(time.perf_counter() - t0)
                s = res.sessions[0]
                assert s.created, "each round must import anew"
                nodes, pairs = s.nodes, s.tool_pairs
                await client.session_delete(s.session_id)
            return times, nodes, pairs
        finally:
            await client.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--file", type=Path, default=DEFAULT_FILE)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    if not args.file.is_file():
        print(f"no transcript at {args.file} (set DAGCTX_CORPUS or pass --file)", file=sys.stderr)
        return 2
    size = args.file.stat().st_size

    floor_times = []
    for _ in range(max(args.rounds, 5)):
        t0 = time.perf_counter()
        lines, messages = floor_decode(args.file)
        floor_times.append(time.perf_counter() - t0)

    times, nodes, pairs = asyncio.run(daemon_rounds(args.file, args.rounds))

    best_floor, best_daemon = min(floor_times), min(times)
    print(f"file: {args.file.name}: {size / 1e6:.2f} MB, {lines:,} lines, {messages:,} user+assistant messages "
          f"-> {nodes:,} nodes, {pairs:,} tool pairs")
    print(f"floor  (read + msgspec decode, in process): best {best_floor * 1e3:8.1f} ms  "
          f"{messages / best_floor:12,.0f} messages/s  ({size / best_floor / 1e6:,.0f} MB/s)")
    print(f"daemon (session/import over stdio)        : best {best_daemon * 1e3:8.1f} ms  "
          f"{messages / best_daemon:12,.0f} messages/s  (median {statistics.median(times) * 1e3:.1f} ms, "
          f"{nodes / best_daemon:,.0f} nodes/s)")
    print(f"ratio daemon / floor: {best_daemon / best_floor:.1f}x the time of decoding alone")
    return 0


if __name__ == "__main__":
    sys.exit(main())
