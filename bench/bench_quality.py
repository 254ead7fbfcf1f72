"""The quality of dagctx's context decisions on the shared corpus (issue #23), not a timing
benchmark: ``dagctx eval`` over every transcript, and its ratios against the two
baselines replayed in the same run (no management until overflow; naive "compact at
80 % into one summary" with the same summarizer stand-in).

Run: python bench/bench_quality.py [--corpus DIR] [--window 16k --window 32k …] [--json FILE]

Prints, per window: M1 recall, M2 identifier retention (dagctx vs the summaries recorded
in the transcripts), M3, M4 (max share, overshoot), M5 cost and breaks as ratios to the
baselines, M6, M7, and the wall time of the whole run (2 jobs).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path

from dagctx.cli.quality import evaluate as ev
from dagctx.cli.quality import replay as rp


def _pct(pair: list[int]) -> str:
    k, n = pair
    return f"{k}/{n} ({k / n:.1%})" if n else "–"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", default=os.environ.get("DAGCTX_CORPUS", "../shared/corpus"))
    ap.add_argument("--window", action="append", default=[])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--json", help="write the whole eval document here")
    args = ap.parse_args()
    corpus = Path(args.corpus)
    if not corpus.is_dir():
        print(f"no corpus at {corpus}: pass --corpus DIR or set DAGCTX_CORPUS", file=sys.stderr)
        return 2
    windows = [rp.parse_window(w) for arg in (args.window or ["16k,32k,128k"]) for w in arg.split(",")]
    cfg = ev.Config(paths=[str(corpus)], windows=windows, jobs=args.jobs)
    doc = asyncio.run(ev.evaluate(cfg, progress=lambda s: None))
    if args.json:
        Path(args.json).write_text(json.dumps(doc), encoding="utf-8")
    tot = doc["totals"]
    print(f"dagctx eval on {corpus}: {len(doc['sessions'])} sessions, summarizer {doc['summarizer']}, "
          f"{doc['seconds']} s wall ({args.jobs} jobs)")
    rec = tot["recorded"]
    print(f"recorded summaries in the transcripts: {rec['summaries']}, identifiers kept "
          f"{_pct([sum(v[0] for v in rec['byClass'].values()), sum(v[1] for v in rec['byClass'].values())])}, "
          f"edited files named {_pct([rec['filesNamed'], rec['filesEdited']])}")
    for label, w in tot["byWindow"].items():
        m5 = w["M5"]
        kept = [sum(v[0] for v in w["M2"].values()), sum(v[1] for v in w["M2"].values())]
        print(f"\n{label}: {w['requests']} requests ({w['refused']} refused), {w['compactions']} compactions")
        print(f"  M1 recall {_pct(w['M1'])} · M2 kept {_pct(kept)} · M3 files {_pct(w['M3'])} · "
              f"M4 max share {w['M4maxShare']:.1%}, overshoot {w['M4maxOvershoot']} · M6 regret {_pct(w['M6'])} · "
              f"M7 identical {_pct(w['M7'])}")
        print(f"  M5 cost (base-input units): dagctx {m5['dagctx']:,.0f} ({m5['dagctxServed']} served) · naive "
              f"{m5['naive']:,.0f} ({m5['naiveServed']} served) → {m5['costVsNaive']}× "
              f"({m5.get('withSummarizerVsNaive')}× with the summary calls' tokens) · unmanaged "
              f"{m5['unmanaged']:,.0f} ({m5['unmanagedServed']} served before overflow)")
        print(f"  breaks dagctx {m5['dagctxBreaks']} vs naive {m5['naiveBreaks']}; by cause: "
              + ", ".join(f"{c} {v['breaks']} ({v['invalidated']:,} tokens invalidated)"
                          for c, v in sorted(m5["byCause"].items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
