"""Peak RSS of the daemon while it imports hostile files, against the same daemon idle.

Run: python bench/bench_import_memory.py [--mib N]

Writes, in a temporary folder, (1) N MiB without a single newline and (2) one valid
Claude Code line of N/4 MiB followed by a short session, imports each through a fresh
daemon (``session/import``) and prints the daemon's peak RSS (``VmHWM``) before and after,
and the ratio. Records over the size cap (``DAGCTX_IMPORT_MAX_LINE_BYTES``, default
16 MiB) are skipped by size, so the peak should stay near the idle baseline whatever N
is (SPEC §9 ``session/import``; goal ≤ 300 MB). Linux only (reads /proc).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

from dagctx.client import DagctxClient, RpcError


def peak_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise RuntimeError("no VmHWM in /proc status")


def write_no_newline(path: Path, mib: int) -> None:
    block = b"{" * (1 << 20)
    with path.open("wb") as fh:
        for _ in range(mib):
            fh.write(block)


def write_one_huge_line(path: Path, mib: int) -> None:
    head = {"parentUuid": None, "sessionId": "bench", "type": "user", "uuid": "u0",
            "timestamp": "2026-03-01T10:00:00.000Z", "message": {"role": "user", "content": ""}}
    text = json.dumps(head)
    pre, post = text.split('"content": ""')
    with path.open("w", encoding="utf-8") as fh:
        fh.write(pre + '"content": "')
        chunk = "x" * (1 << 20)
        for _ in range(mib):
            fh.write(chunk)
        fh.write('"' + post + "\n")
        for i in range(1, 4):
            fh.write(json.dumps({**head, "uuid": f"u{i}", "parentUuid": f"u{i - 1}",
                                 "message": {"role": "user", "content": f"turn {i}"}}) + "\n")


async def measure(db: Path, path: Path, fmt: str) -> tuple[int, int, float, str]:
    client = await DagctxClient.spawn(db, standalone=True)  # its own process: its own RSS
    try:
        assert client.process is not None
        base = peak_kib(client.process.pid)
        t0 = time.perf_counter()
        try:
            res = await client.import_path(str(path), format=fmt)
            note = f"{len(res.sessions)} sessions; " + "; ".join(s.reason for s in res.skipped[:1])
        except RpcError as exc:
            note = f"{exc.kind}: {exc.message}"
        dt = time.perf_counter() - t0
        after = peak_kib(client.process.pid)
        return base, after, dt, note
    finally:
        await client.close()


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=256, help="size of the no-newline file in MiB (default 256)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        cases = []
        blob = folder / "no-newline.jsonl"
        write_no_newline(blob, args.mib)
        cases.append((f"{args.mib} MiB, no newline (claude-code)", blob, "claude-code"))
        cases.append((f"{args.mib} MiB, no newline (auto)", blob, "auto"))
        huge = folder / "huge-line.jsonl"
        write_one_huge_line(huge, max(1, args.mib // 4))
        cases.append((f"one {max(1, args.mib // 4)} MiB line + 3 turns", huge, "auto"))
        for label, path, fmt in cases:
            base, after, dt, note = await measure(folder / "bench.db", path, fmt)
            print(f"{label:42s} idle {base / 1024:6.1f} MiB  peak {after / 1024:6.1f} MiB  "
                  f"ratio {after / base:4.2f}  {dt:5.2f} s  ({note[:90]})")


if __name__ == "__main__":
    asyncio.run(main())
