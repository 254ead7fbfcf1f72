"""What the door checks cost (SPEC §1): ``guards.check_body`` against decoding the same
body with msgspec, which every request pays anyway.

Run: python bench/bench_guards.py [--rounds R]

Bodies: a small request, a 1 MB text output, a 2 MB output of 20,000 small objects
(bracket-heavy, so the nesting scan runs), and one with a 20-digit number in a string
(the integer walk runs). Each is timed best-of-R against two baselines measured in the
same run: decoding the body (msgspec; every request pays it) and what an append does
anyway with the same payload (counting its tokens with cl100k, once per tokenizer).
Goal: check ≤ 0.1× the append's token count for large bodies (a few µs for small ones).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import msgspec

sys.path[:0] = [str(Path(__file__).resolve().parents[1] / d) for d in ("protocol", "daemon")]

from dagctx.context.tokens import CL100K, default_counter  # noqa: E402
from dagctx.server import guards  # noqa: E402


def body(params: object) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": 1, "method": "node/append", "params": params}).encode()


CASES = {
    "small request": body({"sessionId": "s", "node": {"role": "user", "output": "hi", "predecessor": "ROOT"}}),
    "1 MB text output": body({"sessionId": "s", "node": {"role": "code", "output": "x" * 1_000_000}}),
    "20k objects": body({"sessionId": "s", "node": {"role": "code", "output": [{"a": i, "b": [i]} for i in range(20_000)]}}),
    "long digits": body({"sessionId": "s", "node": {"role": "code", "output": ["id 12345678901234567890"] * 5_000}}),
}


def best(fn, data: bytes, rounds: int) -> float:
    n = max(1, 200_000 // max(1, len(data) // 50))
    out = float("inf")
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(n):
            fn(data)
        out = min(out, (time.perf_counter() - t) / n)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    counter = default_counter()
    print(f"{'body':<18} {'bytes':>10} {'decode µs':>10} {'tokens µs':>10} {'check µs':>10} "
          f"{'÷decode':>8} {'÷tokens':>8}")
    for name, data in CASES.items():
        output = msgspec.json.decode(data)["params"]["node"]["output"]
        dec = best(msgspec.json.decode, data, args.rounds)
        tok = best(lambda _d, o=output: counter.count_value(o, CL100K), data, max(1, args.rounds // 2))
        chk = best(guards.check_body, data, args.rounds)
        print(f"{name:<18} {len(data):>10,} {dec * 1e6:>10.1f} {tok * 1e6:>10.1f} {chk * 1e6:>10.1f} "
              f"{chk / dec:>7.2f}× {chk / tok:>7.3f}×")


if __name__ == "__main__":
    main()
