"""The Python client's writes wait for their answer (``append``, ``append_batch``: no
client timeout unless given), other requests give up after 60 s: a client that gave up on
a write could not tell whether it was committed, and a 50 MB output can take a minute on
a loaded machine (the daemon bounds its own waits for the database)."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import pytest

from dagctx.client import DagctxClient


async def test_writes_wait_for_their_answer_other_requests_time_out(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[tuple[str, Any]] = []
    real = DagctxClient.request

    async def request(self: DagctxClient, method: str, params: Any = None, **kw: Any) -> Any:
        asked.append((method, kw.get("timeout", "default")))
        return await real(self, method, params, **kw)

    monkeypatch.setattr(DagctxClient, "request", request)
    c = await DagctxClient.spawn(tmp_path / "t.db")
    try:
        s = await c.session_create("t")
        u = await c.append(s.session_id, "user", output="hi", predecessor=s.head)
        b = await c.append_batch(s.session_id, [{"role": "llm", "name": "m", "output": "a", "predecessor": u.node.id}])
        await c.append(s.session_id, "user", output="again", predecessor=b.nodes[-1].id, timeout=5.0)
        await c.session_list()
    finally:
        await c.close()
    writes = [(m, t) for m, t in asked if m.startswith("node/append")]
    assert writes == [("node/append", None), ("node/appendBatch", None), ("node/append", 5.0)]
    assert ("session/list", "default") in asked  # the 60 s default of every other request
    assert inspect.signature(real).parameters["timeout"].default == 60.0
