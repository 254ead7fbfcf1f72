"""The vectors of a workspace's memory index as the daemon searches them (SPEC §5.1).

One ``VectorIndex`` per (database, workspace, embedding model) and index generation: the
vectors as one contiguous float32 matrix (a row per chunk, in the index's order), the
chunk ids and their rows, read from the ledger once and kept while the generation stamp
(``memory_runs.indexed_at``, which every index write moves) is unchanged. A query is one
matrix product: every row when the index holds at most ``EXACT_MAX`` vectors; above that,
the rows nearest by the Hamming distance of their sign bits (``pool`` of them, one pass
over 32 bytes per 256-dimension row) are rescored exactly. Measured in
``bench/bench_memory_vectors.py`` (ARCHITECTURE.md quotes it).

numpy is imported here only: keyword search works without ``dagctx[embed]``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

#: up to this many vectors a query scores every row (exact); above, sign bits pick the rows
EXACT_MAX = 20_000
#: rows rescored exactly above ``EXACT_MAX``: this many at least, or ``POOL_PER_RESULT`` per
#: candidate asked
POOL_MIN = 1_024
POOL_PER_RESULT = 32
#: (database key, workspace, model) → index; at most ``MAX_INDEXES`` (least recently built dropped)
MAX_INDEXES = 8
_INDEXES: dict[tuple[str, str, str], VectorIndex] = {}
_LOCK = threading.Lock()
log = logging.getLogger("dagctx.memory")


def _sign_bits(np: Any, m: Any) -> list[Any]:
    """One contiguous uint64 column per 64 dimensions: bit set where the value is positive."""
    packed = np.packbits(m > 0, axis=1)
    width = -(-packed.shape[1] // 8) * 8
    if width != packed.shape[1]:
        packed = np.pad(packed, ((0, 0), (0, width - packed.shape[1])))
    words = np.ascontiguousarray(packed).view(np.uint64)
    return [np.ascontiguousarray(words[:, j]) for j in range(words.shape[1])]


@dataclass
class VectorIndex:
    stamp: Any
    ids: list[str]
    pos: dict[str, int]
    matrix: Any  # float32 (n, dim), C-contiguous
    bits: list[Any] | None  # sign bits (n > EXACT_MAX), else None
    _under: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def build(cls, stamp: Any, rows: Sequence[tuple[str, bytes]], exact_max: int = EXACT_MAX) -> VectorIndex:
        import numpy as np

        ids = [cid for cid, _ in rows]
        if rows:
            m = np.frombuffer(b"".join(v for _, v in rows), dtype=np.float32).reshape(len(rows), -1)
        else:
            m = np.zeros((0, 1), dtype=np.float32)
        bits = _sign_bits(np, m) if len(ids) > exact_max else None
        return cls(stamp, ids, {cid: i for i, cid in enumerate(ids)}, m, bits)

    def __len__(self) -> int:
        return len(self.ids)

    def rows_under(self, prefix: str) -> Any:
        """The rows whose chunk id starts with ``prefix/`` (a session's chunks), kept per prefix."""
        import numpy as np

        got = self._under.get(prefix)
        if got is None:
            head = prefix + "/"
            got = np.asarray([i for i, cid in enumerate(self.ids) if cid.startswith(head)], dtype=np.intp)
            if len(self._under) >= 64:
                self._under.clear()
            self._under[prefix] = got
        return got

    def top(self, qv: Any, k: int, floor: float, subset: Any = None, pool: int | None = None) -> list[tuple[int, float]]:
        """The ``k`` rows of highest cosine similarity to ``qv`` reaching ``floor``, best
        first, as (row, similarity). ``pool``: rows rescored above ``EXACT_MAX`` (default
        ``max(POOL_MIN, POOL_PER_RESULT·k)``)."""
        import numpy as np

        n = len(self.ids)
        k = min(k, n)
        if k <= 0:
            return []
        qv = np.asarray(qv, dtype=np.float32)
        if subset is not None:  # a few rows: exact
            rows = subset
            sims = self.matrix[rows] @ qv if len(rows) else np.zeros(0, dtype=np.float32)
            k = min(k, len(rows))
            if k <= 0:
                return []
        elif self.bits is None:
            rows = None
            sims = self.matrix @ qv
        else:
            qbits = _sign_bits(np, qv[None, :])
            ham = np.bitwise_count(self.bits[0] ^ qbits[0][0]).astype(np.uint16)  # up to 64 per word
            for col, qw in zip(self.bits[1:], qbits[1:]):
                ham += np.bitwise_count(col ^ qw[0])
            pool = min(n, pool or max(POOL_MIN, POOL_PER_RESULT * k))
            if pool < n:
                # the smallest distance whose count reaches ``pool``: every row within it (ties
                # included, so a few more than ``pool``)
                upto = int(np.searchsorted(np.cumsum(np.bincount(ham, minlength=len(self.bits) * 64 + 1)), pool))
                rows = np.flatnonzero(ham <= upto)
            else:
                rows = np.arange(n)
            sims = self.matrix[rows] @ qv
            k = min(k, len(sims))
        best = np.argpartition(-sims, k - 1)[:k]
        best = best[np.argsort(-sims[best], kind="stable")]
        out = []
        for b in best:
            s = float(sims[int(b)])
            if s < floor:
                break
            out.append((int(rows[int(b)]) if rows is not None else int(b), s))
        return out

    def similarity(self, chunk_id: str, qv: Any) -> float | None:
        """Cosine similarity of one chunk's vector and ``qv`` (None: the chunk has none)."""
        i = self.pos.get(chunk_id)
        return None if i is None else float(self.matrix[i] @ qv)


def cached(key: tuple[str, str, str], stamp: Any) -> VectorIndex | None:
    with _LOCK:
        got = _INDEXES.get(key)
        return got if got is not None and got.stamp == stamp else None


def _newer(a: Any, b: Any) -> bool:
    """Generation ``a`` is not older than ``b`` (stamps are run times; None: no run)."""
    return b is None or (a is not None and a >= b)


def keep(key: tuple[str, str, str], index: VectorIndex) -> None:
    with _LOCK:
        old = _INDEXES.get(key)
        if old is not None and not _newer(index.stamp, old.stamp):
            return  # a slow read of an older generation finished after a newer one
        _INDEXES.pop(key, None)
        _INDEXES[key] = index
        while len(_INDEXES) > MAX_INDEXES:
            _INDEXES.pop(next(iter(_INDEXES)))


#: (database key, workspace, model) → (generation, set when its read ended) while one is read
_LOADING: dict[tuple[str, str, str], tuple[Any, threading.Event]] = {}
#: databases whose vectors were preloaded (``first_open``); an index read for a database
#: forgotten meanwhile is not kept
_OPENED: set[str] = set()


def first_open(database_key: str) -> bool:
    """True once per database and process (until ``forget``): its vectors are to be preloaded."""
    with _LOCK:
        if database_key in _OPENED:
            return False
        _OPENED.add(database_key)
        return True


def start_load(key: tuple[str, str, str], stamp: Any,
               read: Callable[[], Sequence[tuple[str, bytes]]]) -> Callable[[], None] | None:
    """The job that reads generation ``stamp`` of ``key`` and keeps it — None when it is kept
    already or being read (``wait_loading`` waits for that read). Registered at once, so a
    search arriving before the job runs waits for it instead of reading the rows again."""
    with _LOCK:
        got = _INDEXES.get(key)
        if got is not None and got.stamp == stamp:
            return None
        busy = _LOADING.get(key)
        if busy is not None and busy[0] == stamp:
            return None
        done = threading.Event()
        _LOADING[key] = (stamp, done)

    def job() -> None:
        try:
            index = VectorIndex.build(stamp, read())
            with _LOCK:
                opened = key[0] in _OPENED or not key[0]
            if opened:
                keep(key, index)
        except Exception:  # a database closed or failing meanwhile: the next search reads again
            log.warning("reading the memory vectors of %s failed", key[1], exc_info=True)
        finally:
            with _LOCK:
                if _LOADING.get(key, (None, None))[1] is done:
                    del _LOADING[key]
            done.set()

    return job


def wait_loading(key: tuple[str, str, str], stamp: Any,
                 check: Callable[[], None] | None = None) -> VectorIndex | None:
    """The index of generation ``stamp`` once a read of it in flight ended (``check`` is called
    every 50 ms while waiting: a cancelled request stops waiting); None when none is in flight."""
    with _LOCK:
        busy = _LOADING.get(key)
    if busy is None or busy[0] != stamp:
        return None
    while not busy[1].wait(0.05):
        if check is not None:
            check()
    return cached(key, stamp)


def forget(database_key: str) -> None:
    """Drop every index of one database (the daemon closed it)."""
    with _LOCK:
        _OPENED.discard(database_key)
        for k in [k for k in _INDEXES if k[0] == database_key]:
            del _INDEXES[k]


def preload(submit: Callable[[Callable[[], None]], Any], database_key: str, index: Any,
            only: tuple[str, str] | None = None) -> None:
    """Read vectors into matrices in the background (``submit``: the daemon's work pool, never
    the loop; SPEC §5.1), so a search does not pay for it: when a database is first opened,
    the ``MAX_INDEXES`` most recently indexed (workspace, model) sets that have vectors (and
    the local model's weights); after an index run, ``only`` that workspace's new generation.
    Then what the keyword side keeps of those workspaces (``MemoryIndex.warm``).
    ``index``: the database's ``MemoryIndex``."""
    from dagctx.protocol.errors import DagctxError

    if only is None and not first_open(database_key):
        return

    def job() -> None:
        try:
            if only is not None:
                run = index.run(only[0])
                sets = [(only[0], only[1], run[0] if run else None)]
            else:
                sets = index.vector_sets()[:MAX_INDEXES]
            jobs = [start_load((database_key, ws, model), stamp, lambda ws=ws, model=model: index.vectors(ws, model))
                    for ws, model, stamp in sets]
        except DagctxError:  # the database cannot be read now: searches read when they need them
            return
        if any(model.startswith("local:") for _, model, _ in sets):
            from . import embeddings

            embeddings.local_embedder()  # the local model's weights too: a query's embedding needs them
        for load in jobs:
            if load is not None:
                load()
        for ws in dict.fromkeys(ws for ws, _, _ in sets):  # the keyword side's kept reads too
            try:
                index.warm(ws)
            except DagctxError:
                return

    submit(job)
