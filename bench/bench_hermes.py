"""Per-turn latency the dagctx engine adds to Hermes's own CLI, against Hermes's default
engine (the built-in compressor), in the same run.

Hermes's CLI runs a process per turn (``hermes chat -q``, ``--continue``), so a turn's wall
time is Hermes's start-up plus the engine's work. The ways run side by side, turn by turn,
against the same deterministic loopback model (tests/integration/hermes_cli_turns.py): the
compressor, dagctx, and dagctx unreachable (its daemon command dies at once: the fallback's
cost). Reports median per way, the ratio to the compressor and the difference of medians.
The machine is shared and noisy: quote the ratios of one run, and medians of several runs.

    .venv/bin/python bench/bench_hermes.py [--runs 1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "integration"))

from hermes_cli_turns import run_turns  # noqa: E402
from hermes_venv import hermes_python  # noqa: E402

from dagctx.client import DagctxClient  # noqa: E402


def one_run(py: Path) -> dict[str, list[float]]:
    with tempfile.TemporaryDirectory(prefix="bench-hermes-") as tmp:
        root = Path(tmp)
        mcp_db = root / "mcp.db"

        async def seed() -> None:
            c = await DagctxClient.spawn(mcp_db)
            try:
                s = await c.session_create("earlier work")
                await c.append(s.session_id, "user", output="We named the release quasar-7 last week.",
                               predecessor=s.head)
            finally:
                await c.close()

        asyncio.run(seed())
        ways = {
            "compressor": {},
            "dagctx": {"DAGCTX_DB": str(root / "hermes.db")},
            "unreachable": {"DAGCTX_DB": str(root / "never.db"),
                            "DAGCTX_COMMAND": json.dumps([sys.executable, "-c", "import sys; sys.exit('down')"])},
        }
        engines = {"compressor": "compressor", "dagctx": "dagctx", "unreachable": "dagctx"}
        seconds, _outputs, _stubs, _homes = run_turns(root, py, mcp_db, ways, engines)
        return seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=1, help="runs of the CLI turns (default 1)")
    args = ap.parse_args()
    py = hermes_python()
    turns: dict[str, list[float]] = {}
    for _ in range(args.runs):
        for way, xs in one_run(py).items():
            turns.setdefault(way, []).extend(xs)
    base = statistics.median(turns["compressor"])
    print(f"{'way':<12} {'turns':>5} {'median s':>9} {'vs compressor':>14} {'added s':>8}")
    for way, xs in turns.items():
        med = statistics.median(xs)
        print(f"{way:<12} {len(xs):>5} {med:>9.2f} {med / base:>13.3f}× {med - base:>+8.2f}")


if __name__ == "__main__":
    main()
