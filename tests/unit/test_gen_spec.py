"""SPEC.md's generated method reference is the same bytes every time it is regenerated:
``scripts/gen_spec.py`` replaces what differs run to run (random ids, clocks, process ids,
memory sizes, temporary folders) with stable placeholders, so two engineers regenerating
it never conflict (the slow ``test_spec_method_reference_is_current`` compares every byte)."""

from __future__ import annotations

import importlib.util
import tempfile
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def _gen_spec() -> Any:
    spec = importlib.util.spec_from_file_location("gen_spec", REPO / "scripts" / "gen_spec.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _status_example(pid: int, clock: float, rss: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """A ``daemon/status`` and ``memory/search`` shaped example as one run captures it."""
    tmp = tempfile.mkdtemp(prefix="tmp", dir=tempfile.gettempdir())
    sid, node, chunk = str(uuid.uuid4()), uuid.uuid4().hex, uuid.uuid4().hex[:24]
    request = {"sessionId": sid, "chunkId": chunk}
    result = {"pid": pid, "startedAt": clock, "uptimeSeconds": clock % 7, "connectedAt": clock + 0.01,
              "memory": {"rssBytes": rss, "peakRssBytes": rss + 4096, "baselineRssBytes": rss - 4096},
              "caches": [{"database": f"{tmp}/spec.db", "idleSeconds": clock % 3}],
              "head": node, "root": f"root-{sid}", "createdAt": clock, "durationMs": clock % 11,
              "chunkId": chunk, "score": -clock,
              # a content hash is the same every run: it stays as it is
              "hash": "fa493a944640a6c320e3be69e1dfd473dfecc3bd645f9cd9cf8d734b423ebe88"}
    Path(tmp).rmdir()
    return request, result


def test_examples_scrub_to_the_same_bytes_whatever_the_run() -> None:
    gen = _gen_spec()
    first = gen._scrub(_status_example(31217, 1796159810.347, 57360384))
    second = gen._scrub(_status_example(17547, 1796156391.981, 57307136))
    assert first == second
    req, res = first
    assert req == {"sessionId": "id1", "chunkId": "id2"}
    assert res["pid"] == 0 and res["startedAt"] == 0 and res["memory"]["rssBytes"] == 0
    assert res["caches"][0]["database"] == "/tmp/…/spec.db"
    assert res["root"] == "root-id1" and res["head"] == "id3" and res["chunkId"] == "id2"
    assert res["hash"] == "fa493a944640a6c320e3be69e1dfd473dfecc3bd645f9cd9cf8d734b423ebe88"
