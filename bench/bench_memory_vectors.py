"""The vector index of memory search, chosen by measurement (SPEC §5.1; ARCHITECTURE.md).

Run: python bench/bench_memory_vectors.py [--n 100000] [--dim 256] [--queries 200]

Compares, on the same ``--n`` unit vectors (the local model's 256 dimensions; vectors drawn
around 500 random topics so neighbours exist) and the same queries, in one run:

* exact: one contiguous float32 matrix, ``matrix @ query`` then ``argpartition`` — what the
  daemon does;
* an ANN library when installed (``faiss``: HNSW, M=32, efSearch=64), its build time and its
  recall@10 against the exact answer.

Also the local model's embedding rate over chunk-sized texts and the matrix's memory. Numbers
vary with the machine's load: read the ratios (ANN / exact) of the same run.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--k", type=int, default=24, help="candidates asked (maxResults 6 × candidateMultiplier 4)")
    args = ap.parse_args()
    rng = np.random.default_rng(7)
    topics = rng.standard_normal((500, args.dim)).astype(np.float32)
    m = topics[rng.integers(0, 500, args.n)] + 0.8 * rng.standard_normal((args.n, args.dim)).astype(np.float32)
    m /= np.linalg.norm(m, axis=1, keepdims=True)
    m = np.ascontiguousarray(m, dtype=np.float32)
    q = topics[rng.integers(0, 500, args.queries)] + 0.8 * rng.standard_normal((args.queries, args.dim)).astype(np.float32)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    print(f"{args.n:,} vectors × {args.dim}: matrix {m.nbytes / 2**20:.1f} MiB (float32)")

    exact_t: list[float] = []
    truth = []
    for v in q:
        t0 = time.perf_counter()
        s = m @ v
        top = np.argpartition(-s, args.k - 1)[: args.k]
        exact_t.append(time.perf_counter() - t0)
        truth.append(set(top[np.argsort(-s[top])][:10].tolist()))
    e50 = statistics.median(exact_t)
    print(f"exact  p50 {e50 * 1000:7.2f} ms  p95 {pct(exact_t, 0.95) * 1000:7.2f} ms")
    # the daemon's index (dagctx.engine.memory_vectors): exact up to EXACT_MAX rows, above it
    # sign-bit Hamming pre-selection rescored exactly; "before" is the exact product above
    from dagctx.engine.memory_vectors import EXACT_MAX, VectorIndex

    vi = VectorIndex.build(None, [(str(i), m[i].tobytes()) for i in range(args.n)])
    d_t: list[float] = []
    hit = 0
    for i, v in enumerate(q):
        t0 = time.perf_counter()
        got = vi.top(v, args.k, 0.0)
        d_t.append(time.perf_counter() - t0)
        hit += len(truth[i] & {r for r, _ in got[:10]})
    d50 = statistics.median(d_t)
    print(f"daemon p50 {d50 * 1000:7.2f} ms  p95 {pct(d_t, 0.95) * 1000:7.2f} ms  recall@10 {hit / (10 * len(q)):.3f}  "
          f"p50 ratio daemon/exact {d50 / e50:.3f}  ({'sign bits + exact rescoring' if vi.bits is not None else 'exact'}; "
          f"exact up to {EXACT_MAX:,} rows)")
    try:
        import faiss
    except ImportError:
        print("faiss not installed: no ANN measured (pip install faiss-cpu)")
        faiss = None
    if faiss is not None:
        faiss.omp_set_num_threads(1)
        t0 = time.perf_counter()
        index = faiss.IndexHNSWFlat(args.dim, 32, faiss.METRIC_INNER_PRODUCT)
        index.add(m)
        build = time.perf_counter() - t0
        index.hnsw.efSearch = 64
        ann_t: list[float] = []
        hit = 0
        for i, v in enumerate(q):
            t0 = time.perf_counter()
            _, ids = index.search(v[None, :], args.k)
            ann_t.append(time.perf_counter() - t0)
            hit += len(truth[i] & set(ids[0][:10].tolist()))
        a50 = statistics.median(ann_t)
        print(f"hnsw   p50 {a50 * 1000:7.2f} ms  p95 {pct(ann_t, 0.95) * 1000:7.2f} ms  "
              f"build {build:.1f} s  recall@10 {hit / (10 * len(q)):.3f}  p50 ratio hnsw/exact {a50 / e50:.2f}")
    try:
        from dagctx.engine.embeddings import local_embedder

        e = local_embedder()
    except ImportError:
        e = None
    if e is not None:
        texts = [" ".join(f"word{(i * 7 + j) % 997} cache eviction deploy" for j in range(60)) for i in range(2000)]
        t0 = time.perf_counter()
        e.embed(texts)
        rate = len(texts) / (time.perf_counter() - t0)
        print(f"local model: {rate:,.0f} chunk-sized texts/s; 100k chunks ≈ {100_000 / rate:.0f} s to embed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
