"""Peak RSS of the daemon while it imports hostile or large files, against the same daemon idle.

Run: python bench/bench_import_memory.py [--mib N] [--texts-mib M] [--baseline-src DIR]

Writes, in a temporary folder, (1) N MiB without a single newline and (2) one valid
Claude Code line of N/4 MiB followed by a short session, imports each through a fresh
daemon (``session/import``) and prints the daemon's peak RSS (``VmHWM``) before and after,
and the ratio. Records over the size cap (``DAGCTX_IMPORT_MAX_LINE_BYTES``, default
16 MiB) are skipped by size, so the peak should stay near the idle baseline whatever N
is (SPEC §9 ``session/import``; goal ≤ 300 MB). Linux only (reads /proc).

Then (3) sessions of M MiB of 100 KB user and model texts (Claude Code, OpenClaw, Codex, a
ShareGPT array, an OpenHands event list, a SWE-agent trajectory) and of
3 MB tool results (Claude Code): the daemon's peak RSS growth during the import (its
high-water mark reset just before, ``/proc/PID/clear_refs``) divided by the largest node,
the bound SPEC §9 sets for an import. With ``--baseline-src DIR`` (a checkout of another
commit) each of these also runs on a daemon importing that tree's code (``PYTHONPATH``),
in the same run, for a before/after ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from dagctx.client import DagctxClient, RpcError

sys.path[:0] = [str(Path(__file__).resolve().parent.parent / "tests" / d) for d in ("integration", ".")]
from test_isolation import _SUFFIX, _texts_transcript  # noqa: E402


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


def write_texts_claude_code(path: Path, mib: int, chars: int, sid: str = "bench") -> int:
    """Alternating user and model texts of ``chars`` characters, ``mib`` MiB in all."""
    word = " ".join(f"w{k} src/mod_{k % 50}.py" for k in range(chars // 18))[:chars]
    with path.open("w", encoding="utf-8") as fh:
        parent = None
        for i in range(max(2, (mib << 20) // chars)):
            uid = f"00000000-0000-4000-8000-{i + 1:012d}"
            if i % 2 == 0:
                message: dict = {"role": "user", "content": f"{i} {word}"}
            else:
                message = {"role": "assistant", "id": f"msg_{i}", "content": [{"type": "text", "text": f"{i} {word}"}]}
            fh.write(json.dumps({"type": message["role"], "uuid": uid, "parentUuid": parent,
                                 "sessionId": f"{sid}-texts", "isSidechain": False,
                                 "timestamp": "2026-01-01T00:00:00.000Z", "message": message}) + "\n")
            parent = uid
    return chars


def write_texts_openclaw(path: Path, mib: int, chars: int, sid: str = "bench") -> int:
    word = " ".join(f"w{k} src/mod_{k % 50}.py" for k in range(chars // 18))[:chars]
    with path.open("w", encoding="utf-8") as fh:
        fh.write(json.dumps({"type": "session", "version": 3, "id": f"{sid}-openclaw",
                             "timestamp": "2026-04-03T07:00:00.000Z", "cwd": "/tmp"}) + "\n")
        parent = None
        for i in range(max(2, (mib << 20) // chars)):
            if i % 2 == 0:
                message: dict = {"role": "user", "content": f"{i} {word}"}
            else:
                message = {"role": "assistant", "content": [{"type": "text", "text": f"{i} {word}"}],
                           "model": "m", "stopReason": "stop"}
            fh.write(json.dumps({"type": "message", "id": f"e{i}", "parentId": parent,
                                 "timestamp": "2026-04-03T07:00:01.000Z", "message": message}) + "\n")
            parent = f"e{i}"
    return chars


def write_results_claude_code(path: Path, mib: int, chars: int, sid: str = "bench") -> int:
    body = " ".join(f"w{k} src/mod_{k % 50}.py total {k * 7}" for k in range(chars // 30))
    with path.open("w", encoding="utf-8") as fh:
        parent = None
        n = 0

        def line(kind: str, message: dict) -> str:
            nonlocal parent, n
            n += 1
            uid = f"00000000-0000-4000-8000-{n:012d}"
            rec = {"type": kind, "uuid": uid, "parentUuid": parent, "sessionId": f"{sid}-results",
                   "isSidechain": False, "timestamp": "2026-01-01T00:00:00.000Z", "message": message}
            parent = uid
            return json.dumps(rec) + "\n"

        for i in range(max(1, (mib << 20) // chars)):
            fh.write(line("user", {"role": "user", "content": f"turn {i}"}))
            fh.write(line("assistant", {"role": "assistant", "id": f"m{i}", "content": [
                {"type": "tool_use", "id": f"toolu_{i}", "name": "Bash", "input": {"command": "cat"}}]}))
            fh.write(line("user", {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": f"toolu_{i}", "content": f"{body} {i}"}]}))
            fh.write(line("assistant", {"role": "assistant", "id": f"m{i}b",
                                        "content": [{"type": "text", "text": f"done {i}"}]}))
    return len(body) + 8


def texts_in(fmt: str) -> Any:
    """A writer of ``fmt`` sessions of 100 KB user and model texts (the tests' own)."""
    def make(path: Path, mib: int, chars: int, sid: str = "bench") -> int:
        _texts_transcript(path, fmt, max(2, (mib << 20) // chars), chars, f"{sid}-{fmt}")
        return chars
    return make


def _kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc status")


async def growth(db: Path, warm: Path, path: Path, fmt: str, src: str | None) -> tuple[int, float]:
    """Peak RSS growth (bytes) of a fresh daemon importing ``path`` after ``warm``."""
    # the code before streaming whole JSON documents refused one over the record cap
    env = {**os.environ, "DAGCTX_IMPORT_MAX_LINE_BYTES": str(1 << 30)}
    if src is not None:
        roots = [os.path.join(src, r) for r in ("protocol", "daemon", "cli", "clients/python")]
        env["PYTHONPATH"] = os.pathsep.join(roots)
    client = await DagctxClient.spawn(db, standalone=True, env=env)
    try:
        assert client.process is not None
        pid = client.process.pid
        await client.import_path(str(warm), format=fmt)
        before = _kib(pid, "VmRSS")
        Path(f"/proc/{pid}/clear_refs").write_text("5")
        t0 = time.perf_counter()
        res = await client.import_path(str(path), format=fmt)
        dt = time.perf_counter() - t0
        assert res.sessions and res.sessions[0].created, res
        return (_kib(pid, "VmHWM") - before) * 1024, dt
    finally:
        await client.close()


async def bounds(folder: Path, mib: int, baseline: str | None, only: list[str] | None = None) -> None:
    cases = [
        ("claude-code, 100 KB texts", write_texts_claude_code, "claude-code", mib, 100_000),
        ("openclaw, 100 KB texts", write_texts_openclaw, "openclaw", mib, 100_000),
        ("claude-code, 3 MB tool results", write_results_claude_code, "claude-code", mib, 3_000_000),
        ("codex, 100 KB texts", texts_in("codex"), "codex", mib, 100_000),
        ("sharegpt array, 100 KB texts", texts_in("sharegpt"), "sharegpt", mib, 100_000),
        ("openhands .json, 100 KB texts", texts_in("openhands"), "openhands", mib, 100_000),
        ("swe-agent .traj, 100 KB texts", texts_in("swe-agent"), "swe-agent", mib, 100_000),
    ]
    for label, make, fmt, size, chars in cases:
        if only and fmt not in only:
            continue
        suffix = _SUFFIX.get(fmt, ".jsonl")
        path = folder / f"{fmt}-{chars}{suffix}"
        largest = make(path, size, chars)
        warm = folder / f"warm-{fmt}-{chars}{suffix}"
        make(warm, 1, chars, "warm")
        total = path.stat().st_size
        row = f"{label:32s} {total / 2**20:6.1f} MiB file, largest node {largest / 2**20:5.2f} MiB:"
        for name, src in (("before", baseline), ("after", None)) if baseline else (("now", None),):
            for f in folder.glob("bounds-*.db*"):
                f.unlink()
            grown, dt = await growth(folder / "bounds-x.db", warm, path, fmt, src)
            row += f"  {name} +{grown / 2**20:6.1f} MiB = {grown / largest:5.1f}x largest ({dt:4.1f} s)"
        print(row, flush=True)


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=256, help="size of the no-newline file in MiB (default 256)")
    ap.add_argument("--texts-mib", type=int, default=48, help="size of the large sessions in MiB (default 48)")
    ap.add_argument("--baseline-src", default=None, help="a checkout whose daemon is the 'before' of the bounds")
    ap.add_argument("--bounds-only", action="store_true", help="only the large sessions' bounds")
    ap.add_argument("--formats", default=None, help="comma-separated formats of the bounds (default: all)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        await bounds(folder, args.texts_mib, args.baseline_src, args.formats.split(",") if args.formats else None)
        if args.bounds_only:
            return
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
