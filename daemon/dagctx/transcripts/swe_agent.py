"""SWE-agent trajectory (``*.traj``) → Transcript.

A ``.traj`` file is one JSON object with ``history`` (the OpenAI-style message list the
model saw, with ``tool_calls`` on assistant messages and ``tool`` messages carrying
``tool_call_ids``), ``trajectory`` (per-step records), ``info`` and ``replay_config``.
``history`` is used; when it is missing the last trajectory step's ``messages`` is.

* ``system`` → a ``context/system_prompt`` node; ``user`` → user node (observations in
  non-function-calling runs are user messages, kept as such with their
  ``metadata["messageType"]``); ``assistant`` → llm node named after
  ``replay_config.agent.model.name``; each tool call → code node; a ``tool`` message is
  the result of the latest call with that id still waiting (demonstration trajectories
  reuse call ids, so ids alone do not identify a call).
* Ids: ``swe-<i>`` for message *i*, ``swe-<i>.<k>`` for its *k*-th tool call.
* ``source_key`` is the file's SHA-256; the title is the file name (the instance id).

``counts["messages"]`` = messages in ``history``.
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
from .reading import file_digest, max_line_bytes
from .values import content_output, parse_arguments, text_of_blocks


def _model_name(data: dict) -> str | None:
    rc = data.get("replay_config")
    if isinstance(rc, jsonstream.Span):
        try:
            rc = jsonstream.value(rc)
        except (msgspec.DecodeError, ValueError):
            return None
    if isinstance(rc, str):
        try:
            rc = msgspec.json.decode(rc)
        except msgspec.DecodeError:
            return None
    if not isinstance(rc, dict):
        return None
    agent = rc.get("agent")
    model = agent.get("model") if isinstance(agent, dict) else None
    name = model.get("name") if isinstance(model, dict) else None
    return name if isinstance(name, str) and name else None


def _text(content: Any) -> Any:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return content_output(content, "\n\n")
    return content


def parse(path: Path) -> Transcript:
    with path.open("rb") as fh:
        return _parse(path, fh)


def _parse(path: Path, fh: Any) -> Transcript:
    """The trajectory of ``fh``: a large file is streamed (``jsonstream``), its messages
    decoded one at a time."""
    b = Builder("swe-agent")
    try:
        data = jsonstream.fields(jsonstream.open_document(fh, path.stat().st_size))
    except msgspec.DecodeError as exc:
        b.skipped.append(Skipped(1, f"not JSON: {exc}"))
        return b.finish(file_digest(path), path.stem)
    if data is None:
        b.skipped.append(Skipped(1, "not a trajectory object"))
        return b.finish(file_digest(path), path.stem)
    history = data.get("history")
    if not jsonstream.is_array(history):
        traj = data.get("trajectory")
        last = jsonstream.fields(jsonstream.last(traj)) if jsonstream.is_array(traj) else None
        last = last or {}
        history = last.get("messages") if jsonstream.is_array(last.get("messages")) else []
    model = _model_name(data)
    tip = ROOT
    calls: dict[str, list[str]] = {}
    i = -1
    for i, m in enumerate(jsonstream.elements(history)):
        if isinstance(m, jsonstream.Unreadable):
            why = (f"of {m.size:,} bytes is over the {max_line_bytes():,}-byte limit (DAGCTX_IMPORT_MAX_LINE_BYTES); "
                   "not read" if m.size is not None else f"is not JSON: {m.reason}")
            b.skipped.append(Skipped(i + 1, f"history[{i}] {why}"))
            continue
        if not isinstance(m, dict):
            b.skipped.append(Skipped(i + 1, f"history[{i}] is not an object"))
            continue
        role = m.get("role")
        key = (i,)
        mtype = m.get("message_type") if isinstance(m.get("message_type"), str) else None
        demo = True if m.get("is_demo") else None
        if role == "system":
            b.system_prompt(b.unique(f"swe-{i}"), _text(m.get("content")), key=key, messageType=mtype)
        elif role == "user":
            node = b.user(b.unique(f"swe-{i}"), _text(m.get("content")), tip, key=key, messageType=mtype, demo=demo)
            tip = node.id
        elif role == "assistant":
            content = m.get("content")
            output = content if isinstance(content, str) else text_of_blocks(content or [], "\n\n") if isinstance(content, list) else ""
            thought = m.get("thought")
            node = b.llm(
                b.unique(f"swe-{i}"), model, tip, output=output, key=key, messageType=mtype, demo=demo,
                thinking=thought if isinstance(thought, str) and thought.strip() and thought.strip() != output.strip() else None,
            )
            tip = node.id
            for k, tc in enumerate(m.get("tool_calls") or []):
                if not isinstance(tc, dict):
                    continue
                fn = tc.get("function") if isinstance(tc.get("function"), dict) else {}
                args, ok = parse_arguments(fn.get("arguments"))
                tid = tc.get("id") if isinstance(tc.get("id"), str) else None
                cid = b.unique(f"swe-{i}.{k}")
                b.tool_call(cid, str(fn.get("name") or ""), args, node.id, tid, key=(i, k), argumentsNotJson=None if ok else True)
                if tid:
                    calls.setdefault(tid, []).append(cid)
        elif role == "tool":
            ids = m.get("tool_call_ids")
            if not isinstance(ids, list):
                ids = [m.get("tool_call_id")]
            output = _text(m.get("content"))
            for tid in ids:
                cands = calls.get(tid, []) if isinstance(tid, str) else []
                target = next((c for c in reversed(cands) if not b.has_result(c)), None)
                if target is None:
                    b.skipped.append(Skipped(i + 1, f"history[{i}]: tool result for unknown call {quote(tid)}"))
                    b.counts["orphanResults"] = b.counts.get("orphanResults", 0) + 1
                    continue
                b.attach_result(target, output)
        else:
            b.skipped.append(Skipped(i + 1, f"history[{i}]: unknown role {quote(role)}"))
    b.counts["messages"] = i + 1
    return b.finish(file_digest(path), path.stem)


# --------------------------------------------------------------------------- the reader


def _detect_json(value: Any) -> Rank | None:
    if isinstance(value, dict) and ("history" in value or "trajectory" in value):
        return (0, 20)
    return None


def _read(path: Path) -> Iterator[Transcript]:
    yield parse(path)


READER = Reader("swe-agent", "SWE-agent", _read, detect_json=_detect_json, suffix=".traj")
