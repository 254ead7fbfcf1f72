"""ShareGPT-style conversations (JSONL, one conversation a line, or a JSON array) → Transcripts.

Each conversation is ``{"conversations": [{"from", "value"}, …]}`` (``{"role",
"content"}`` turns and a ``messages`` key are read too), optionally with ``system`` and
``tools`` (a JSON string or list, kept as ``metadata["tools"]`` of the first node).

* ``human``/``user`` → user node; ``gpt``/``assistant`` → llm node (no model is named in
  the data: ``name="unknown"``); ``system`` → ``context/system_prompt``.
* ``function_call`` (value ``{"name", "arguments"}``) → an llm node with empty text and a
  code node it calls; ``observation`` → the result of the oldest call still waiting.
  There is no provider call id, so ``toolCallId`` is synthesised from the code node id
  (``metadata["syntheticToolCallId"]=True``) to keep call/result pairing renderable.
* An ``observation`` with no call waiting is not imported: ``Skipped(line, …)``.

One transcript per conversation; ``source_key`` is the SHA-256 of the conversation's
source text (``#2``… appended for repeats within a file). Ids: ``sg<line>-<turn>``
(``sg<line>-<turn>-call`` for the code node). File-level problems (non-JSON lines) are
reported on the transcript read before them (the file is streamed). ``counts["messages"]`` = turns of the conversation.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec

from dagctx.protocol.context_messages import Skipped

from .base import quote, Rank, Reader, ROOT, Transcript
from .builder import Builder
from . import jsonstream
from .reading import _TOO_DEEP, decode_json, file_digest, iter_lines, max_line_bytes, text_digest, too_large
from .values import parse_arguments

_USER = frozenset({"human", "user"})
_ASSISTANT = frozenset({"gpt", "assistant", "chatgpt", "bing", "bard", "model"})
_CALL = frozenset({"function_call", "tool_call"})
_RESULT = frozenset({"observation", "tool", "function", "tool_response"})


def parse(path: Path) -> list[Transcript]:
    return list(iter_parse(path))


def _items(path: Path) -> Iterator[tuple[int, Any, bytes | None] | Skipped]:
    """``(line, conversation, source bytes)`` per conversation, or a ``Skipped``, streaming
    JSONL line by line. A JSON array is streamed a conversation at a time
    (``jsonstream``): its source bytes are None (the key is the digest of the
    conversation as re-encoded), and a large conversation is a ``Span`` whose turns are
    decoded one at a time."""
    with path.open("rb") as fh:
        first = fh.read(64).removeprefix(b"\xef\xbb\xbf").lstrip()
    if first[:1] == b"[":
        with path.open("rb") as fh:
            try:
                data = jsonstream.open_document(fh, path.stat().st_size)
            except msgspec.DecodeError as exc:
                yield Skipped(1, f"not JSON: {exc}")
                return
            for i, conv in enumerate(jsonstream.spans(data)):
                yield i + 1, conv, None
        return
    for no, raw in iter_lines(path):
        if isinstance(raw, int):
            yield Skipped(no, too_large(raw))
            continue
        text = raw.strip()
        if not text:
            continue
        try:
            obj = decode_json(text)
        except msgspec.DecodeError as exc:
            yield Skipped(no, _TOO_DEEP if str(exc) == _TOO_DEEP else f"not JSON: {quote(text, 20)}")
            continue
        except RecursionError:
            yield Skipped(no, "JSON nested too deeply")
            continue
        if not isinstance(obj, dict):
            yield Skipped(no, f"not a JSON object ({type(obj).__name__})")
            continue
        yield no, obj, text


def iter_parse(path: Path) -> Iterator[Transcript]:
    """One transcript per conversation, as they are read. A file-level problem (a bad
    line) rides on a neighbouring transcript; with no conversation at all, on an empty one."""
    keys: dict[str, int] = {}
    pending: list[Skipped] = []
    # One transcript is held back, so bad lines after the last conversation ride on it.
    last: Transcript | None = None
    for item in _items(path):
        if isinstance(item, Skipped):
            pending.append(item)
            continue
        no, conv, raw = item
        if isinstance(conv, jsonstream.Unreadable):
            pending.append(Skipped(no, f"conversation {_unreadable(conv)}"))
            continue
        if not jsonstream.is_object(conv):
            pending.append(Skipped(no, "conversation is not an object"))
            continue
        key = text_digest(raw) if raw is not None else jsonstream.digest(conv)
        keys[key] = keys.get(key, 0) + 1
        if keys[key] > 1:
            key = f"{key}#{keys[key]}"
        t = _conversation(no, conv, key)
        if last is not None:
            yield _with_skipped(last, pending)
            pending = []
        last = t
    if last is not None:
        yield _with_skipped(last, pending)
    elif pending:
        empty = Builder("sharegpt")
        empty.skipped.extend(pending)
        yield empty.finish(file_digest(path), path.stem)


def _with_skipped(t: Transcript, skipped: list[Skipped]) -> Transcript:
    if skipped:
        t.skipped = sorted(skipped + t.skipped, key=lambda s: s.line)
        t.counts["skipped"] = len(t.skipped)
    return t


def _unreadable(u: jsonstream.Unreadable) -> str:
    return f"of {u.size:,} bytes is over the {max_line_bytes():,}-byte limit (DAGCTX_IMPORT_MAX_LINE_BYTES); not read" \
        if u.size is not None else f"is not JSON: {u.reason}"


def _turns(conv: dict) -> Any:
    """The turn list (a list, or a ``jsonstream.Span`` of a streamed conversation)."""
    for k in ("conversations", "messages", "conversation"):
        if jsonstream.is_array(conv.get(k)):
            return conv[k]
    return []


def _tools(conv: dict) -> Any:
    tools = conv.get("tools")
    if isinstance(tools, jsonstream.Span):
        tools = jsonstream.value(tools)
    if isinstance(tools, str):
        try:
            tools = msgspec.json.decode(tools)
        except msgspec.DecodeError:
            return tools or None
    return tools or None


def _conversation(no: int, conv: Any, source_key: str) -> Transcript:
    conv = jsonstream.fields(conv)  # a streamed conversation: its members, the turns a Span
    assert conv is not None
    b = Builder("sharegpt")
    tip = ROOT
    pending: list[str] = []
    tools = _tools(conv)
    first = True
    turns = _turns(conv)
    if isinstance(conv.get("system"), str) and conv["system"]:
        b.system_prompt(f"sg{no}-system", conv["system"], key=(-1,))
    j = -1
    for j, turn in enumerate(jsonstream.elements(turns)):
        if isinstance(turn, jsonstream.Unreadable):
            b.skipped.append(Skipped(no, f"turn {j} {_unreadable(turn)}"))
            continue
        if not isinstance(turn, dict):
            b.skipped.append(Skipped(no, f"turn {j} is not an object"))
            continue
        who = turn.get("from", turn.get("role"))
        value = turn.get("value", turn.get("content"))
        text = value if isinstance(value, str) else "" if value is None else msgspec.json.encode(value).decode()
        nid = f"sg{no}-{j}"
        extra = {"tools": tools} if first and tools else {}
        if who == "system":
            b.system_prompt(nid, text, key=(j,))
        elif who in _USER:
            tip = b.user(nid, text, tip, key=(j,), **extra).id
            first = False
        elif who in _ASSISTANT:
            tip = b.llm(nid, None, tip, output=text, key=(j,), **extra).id
            first = False
        elif who in _CALL:
            call = value if isinstance(value, dict) else None
            if call is None:
                try:
                    call = msgspec.json.decode(text)
                except msgspec.DecodeError:
                    call = None
            calls = call if isinstance(call, list) else [call]
            llm = b.llm(nid, None, tip, output="", key=(j,), **extra)
            tip = llm.id
            first = False
            for k, c in enumerate(calls):
                if not isinstance(c, dict):
                    name, args, ok = "", {"raw": text}, False
                else:
                    name = str(c.get("name") or "")
                    args, ok = parse_arguments(c.get("arguments", c.get("parameters")))
                cid = f"{nid}-call" if len(calls) == 1 else f"{nid}-call{k}"
                b.tool_call(cid, name, args, llm.id, cid, key=(j, k), syntheticToolCallId=True, argumentsNotJson=None if ok else True)
                pending.append(cid)
        elif who in _RESULT:
            if not pending:
                b.skipped.append(Skipped(no, f"turn {j}: {who} without a preceding function_call"))
                b.counts["orphanResults"] = b.counts.get("orphanResults", 0) + 1
                continue
            b.attach_result(pending.pop(0), text)
        else:
            b.skipped.append(Skipped(no, f"turn {j}: unknown speaker {quote(who)}"))
    b.counts["messages"] = j + 1
    return b.finish(source_key, None)


# --------------------------------------------------------------------------- the reader


def _chat(obj: dict) -> bool:
    return isinstance(obj.get("conversations"), list) or isinstance(obj.get("messages"), list)


def _detect_line(obj: dict) -> Rank | None:
    if isinstance(obj.get("conversations"), list):
        return (0, 40)
    if isinstance(obj.get("messages"), list) and "type" not in obj:
        return (0, 60)  # weaker than Claude Code's markers
    return None


def _detect_json(value: Any) -> Rank | None:
    if isinstance(value, dict):
        return (0, 40) if _chat(value) else None
    if isinstance(value, list):
        for i, item in enumerate(value[:20]):
            if isinstance(item, dict) and _chat(item):
                return (i, 40)
    return None


READER = Reader("sharegpt", "ShareGPT", iter_parse, detect_line=_detect_line, detect_json=_detect_json)
