"""The quality of dagctx's context decisions on the shared corpus (issue #23), not a timing
benchmark: ``dagctx eval`` over every transcript, and its ratios against the two
baselines replayed in the same run (no management until overflow; naive "compact at
80 % into one summary" with the same summarizer stand-in).

Run: python bench/bench_quality.py [--corpus DIR] [--window 16k --window 32k …] [--json FILE]
                                   [--baseline-src DIR] [FILE_OR_DIR …]

``--baseline-src DIR`` (a checkout of another commit, e.g. ``git archive main | tar -x -C DIR``)
replays the same sessions at the same time through that checkout's daemon, measured by this
eval's code, and prints its M5 beside this one's: a before/after of the daemon's decisions in
one run. Paths after the options replace the corpus (e.g. its four longest sessions).

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
    ap.add_argument("--baseline-src", help="a checkout whose daemon is the 'before', replayed in the same run")
    ap.add_argument("paths", nargs="*", help="transcripts or folders instead of the whole corpus")
    args = ap.parse_args()
    corpus = Path(args.corpus)
    if not args.paths and not corpus.is_dir():
        print(f"no corpus at {corpus}: pass --corpus DIR or set DAGCTX_CORPUS", file=sys.stderr)
        return 2
    paths = [str(Path(p).resolve()) for p in args.paths] or [str(corpus)]
    windows = [rp.parse_window(w) for arg in (args.window or ["16k,32k,128k"]) for w in arg.split(",")]
    cfg = ev.Config(paths=paths, windows=windows, jobs=args.jobs)
    before_doc = None
    if args.baseline_src:
        roots = [str(Path(args.baseline_src, r).resolve()) for r in ("protocol", "daemon", "cli", "clients/python")]
        if not all(Path(r).is_dir() for r in roots):
            print(f"--baseline-src {args.baseline_src}: not a dagctx checkout (needs {', '.join(roots)})",
                  file=sys.stderr)
            return 2
        base_cfg = ev.Config(paths=paths, windows=windows, jobs=args.jobs,
                             daemon_env={**os.environ, "PYTHONPATH": os.pathsep.join(roots)})

        async def both() -> tuple[dict, dict]:
            got = await asyncio.gather(ev.evaluate(cfg), ev.evaluate(base_cfg))
            return got[0], got[1]

        doc, before_doc = asyncio.run(both())
    else:
        doc = asyncio.run(ev.evaluate(cfg, progress=lambda s: None))
    if args.json:
        Path(args.json).write_text(json.dumps(doc if before_doc is None else {"after": doc, "before": before_doc}),
                                   encoding="utf-8")
    corpus = ", ".join(paths)
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
        if before_doc is not None and label in before_doc["totals"]["byWindow"]:
            b = before_doc["totals"]["byWindow"][label]
            bm5 = b["M5"]
            print(f"  before ({args.baseline_src}, same run): M5 cost ÷ naive {bm5['costVsNaive']}× "
                  f"({bm5.get('withSummarizerVsNaive')}× with the summary calls) → now {m5['costVsNaive']}× "
                  f"({m5.get('withSummarizerVsNaive')}×); dagctx cost now ÷ before "
                  f"{m5['dagctx'] / bm5['dagctx']:.3f}; breaks {bm5['dagctxBreaks']} → {m5['dagctxBreaks']}; "
                  f"M1 {_pct(b['M1'])} · M4 overshoot {b['M4maxOvershoot']} · M7 {_pct(b['M7'])} · "
                  f"M3 {_pct(b['M3'])}; by cause: "
                  + ", ".join(f"{c} {v['breaks']} ({v['invalidated']:,})" for c, v in sorted(bm5["byCause"].items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
