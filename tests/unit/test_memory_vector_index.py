"""The daemon's vector index of memory search (SPEC §5.1, ``engine/memory_vectors.py``):
exact up to ``EXACT_MAX`` rows, sign-bit pre-selection rescored exactly above it."""

from __future__ import annotations

import pytest

np = pytest.importorskip("numpy")

from dagctx.engine import memory_vectors as mv  # noqa: E402


def unit_rows(n: int, dim: int, seed: int = 5) -> np.ndarray:
    rng = np.random.default_rng(seed)
    topics = rng.standard_normal((40, dim)).astype(np.float32)
    m = topics[rng.integers(0, 40, n)] + 0.7 * rng.standard_normal((n, dim)).astype(np.float32)
    return (m / np.linalg.norm(m, axis=1, keepdims=True)).astype(np.float32)


def build(m: np.ndarray, exact_max: int) -> mv.VectorIndex:
    return mv.VectorIndex.build("stamp", [(f"c{i}", m[i].tobytes()) for i in range(len(m))], exact_max=exact_max)


def test_exact_search_is_every_row_best_first_above_the_floor() -> None:
    m = unit_rows(500, 64)
    vi = build(m, exact_max=10_000)
    assert vi.bits is None and len(vi) == 500 and vi.matrix.flags["C_CONTIGUOUS"]
    q = m[7]
    got = vi.top(q, 10, -1.0)
    sims = m @ q
    assert [r for r, _ in got] == list(np.argsort(-sims, kind="stable")[:10])
    assert got[0] == (7, pytest.approx(1.0, abs=1e-5))
    assert all(s >= 0.5 for _, s in vi.top(q, 500, 0.5))
    assert vi.similarity("c7", q) == pytest.approx(1.0, abs=1e-5) and vi.similarity("nope", q) is None


def test_sign_bits_preselect_then_rescore_exactly() -> None:
    # 300 dimensions: five 64-bit words, the last one padded; distances above 255 need 16 bits
    m = unit_rows(4_000, 300)
    exact = build(m, exact_max=100_000)
    approx = build(m, exact_max=0)
    assert approx.bits is not None and len(approx.bits) == 5
    found = 0
    for qi in range(0, 4_000, 100):
        q = m[qi]
        want = {r for r, _ in exact.top(q, 10, -1.0)}
        got = approx.top(q, 10, -1.0, pool=400)
        assert got[0][0] == qi  # the query's own row: distance 0
        found += len(want & {r for r, _ in got})
        # scores are the exact cosine of the rows returned
        assert all(s == pytest.approx(float(m[r] @ q), abs=1e-5) for r, s in got)
    assert found / (10 * 40) >= 0.9
    # the opposite of row 0 differs from it in every bit (distance 300: wrapped to 8 bits it
    # would read 44 and row 0 would be pre-selected)
    assert 0 not in {r for r, _ in approx.top(-m[0], 50, -1.0, pool=50)}


def test_the_cache_keeps_an_index_per_stamp_and_forgets_a_database() -> None:
    m = unit_rows(10, 8)
    a = build(m, exact_max=100)
    mv.keep(("db1", "/ws", "local:x"), a)
    assert mv.cached(("db1", "/ws", "local:x"), "stamp") is a
    assert mv.cached(("db1", "/ws", "local:x"), "newer") is None
    mv.forget("db1")
    assert mv.cached(("db1", "/ws", "local:x"), "stamp") is None


def test_vectors_are_read_by_pages_counted_as_kept_and_loaded_once(tmp_path, monkeypatch) -> None:
    """A real SQLite store (SPEC §5.1): the vectors come back whole, in chunk id order, when read
    a page per hold of the store's lock; the kept counts follow the writes (schema version 5);
    a generation being read is registered, so a second reader waits for it instead of reading."""
    import threading

    from dagctx.ledger import Store
    from dagctx.ledger import memory as lm

    store = Store(tmp_path / "m.db")
    index = lm.MemoryIndex(store)
    chunks = [lm.MemoryChunkRow(f"id{i:02d}", "MEMORY.md", "memory", i + 1, i + 1, f"h{i}", 1.0, f"line {i}")
              for i in range(10)]
    row = lm.MemoryFileRow("MEMORY.md", "memory", "x", 1.0, 100, 10, 10)
    index.apply("/ws", drop=[], put=[lm.FileUpdate(row, chunks)], indexed_at=1.0, skipped=b"")
    m = unit_rows(10, 8)
    index.put_vectors("/ws", "local:m", 8, [(c.id, m[i].tobytes()) for i, c in reversed(list(enumerate(chunks)))])
    assert (index.chunk_count("/ws"), index.vector_count("/ws", "local:m"), index.file_count("/ws")) == (10, 10, 1)
    monkeypatch.setattr(lm, "VECTOR_PAGE", 3)
    got = index.vectors("/ws", "local:m")
    assert [cid for cid, _ in got] == [c.id for c in chunks] and got[4][1] == m[4].tobytes()
    stamp = index.run("/ws")[0]
    assert [(ws, model) for ws, model, _ in index.vector_sets()] == [("/ws", "local:m")]

    key = ("db-test", "/ws", "local:m")
    assert mv.first_open("db-test") and not mv.first_open("db-test")  # an open database's reads are kept
    job = mv.start_load(key, stamp, lambda: index.vectors("/ws", "local:m"))
    assert job is not None and mv.start_load(key, stamp, lambda: []) is None  # registered: not read twice
    seen: list[object] = []
    waiter = threading.Thread(target=lambda: seen.append(mv.wait_loading(key, stamp)))
    waiter.start()
    job()
    waiter.join(5)
    assert len(seen) == 1 and len(seen[0]) == 10 and mv.cached(key, stamp) is seen[0]
    assert mv.wait_loading(key, stamp) is None  # nothing in flight any more
    mv.forget("db-test")

    index.apply("/ws", drop=["MEMORY.md"], put=[], indexed_at=2.0, skipped=b"")
    assert (index.chunk_count("/ws"), index.vector_count("/ws", "local:m"), index.file_count("/ws")) == (0, 0, 0)
    assert index.vector_sets() == []
    store.close()
