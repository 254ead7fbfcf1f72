"""The daemon's cyclic-GC policy: its youngest generation is collected rarely (see
``dagctx.server.rarer_young_collections``), set by both of its entry points."""

from __future__ import annotations

import gc
import inspect

from dagctx import server


def test_young_collections_are_made_rarer_and_the_older_generations_kept() -> None:
    saved = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 10)
        server.rarer_young_collections()
        assert gc.get_threshold() == (server.YOUNG_COLLECTION_EVERY, 10, 10)
        assert server.YOUNG_COLLECTION_EVERY >= 10_000
    finally:
        gc.set_threshold(*saved)


def test_both_daemon_entry_points_set_the_policy_first() -> None:
    for entry in (server.run_daemon, server.run_stdio):
        lines = [line.strip() for line in inspect.getsource(entry).splitlines()]
        body = lines[lines.index(next(x for x in lines if x.startswith('"""'))) + 1:]
        assert "rarer_young_collections()" in body[:3], entry.__name__
