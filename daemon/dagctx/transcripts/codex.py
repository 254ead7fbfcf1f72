"""OpenAI Codex rollout JSONL (``~/.codex/sessions/…/rollout-*.jsonl``) → Transcript.

Each line is ``{"timestamp", "type", "payload"}``. The rollout is linear, so the chain is
simply the order of the items:

* user turns: ``response_item`` messages with role ``user``/``developer``. Blocks that
  Codex injects (``<environment_context>``, ``<user_instructions>``, AGENTS.md, permission
  instructions, developer messages) are kept as user nodes marked
  ``metadata["injected"]=True``. Rollouts that carry no real user ``response_item`` (some
  trimmed fixtures) fall back to ``event_msg`` ``user_message`` events — never both, since
  Codex writes each user message twice.
* one llm node per model response: consecutive output items (``reasoning``, assistant
  ``message``, ``function_call``, ``custom_tool_call``, ``local_shell_call``,
  ``web_search_call``). A response ends at the next input item (a tool output or a user
  message), at a ``token_count`` event, or when a ``reasoning`` item follows output.
  Reasoning text goes to ``metadata["thinking"]``; encrypted reasoning is only counted.
* calls pair with ``function_call_output`` / ``custom_tool_call_output`` by ``call_id``;
  ``web_search_call`` is a hosted tool with no result record (``metadata["hostedTool"]``).
* ``compacted`` lines (and ``compaction`` items) become ``context/summary`` nodes covering
  the chain so far; the conversation continues from the last covered node.
* ``token_count`` events give the usage of the llm node before them (``last_token_usage``;
  ``input`` is reported net of ``cached_input_tokens``, which becomes ``cacheRead``).
* ``session_meta.base_instructions`` becomes a ``context/system_prompt`` node.

Ids: ``codex-<line>`` for messages and llm nodes, the ``call_id`` for tool calls.
``counts["messages"]`` = message items (plus user_message events when used as turns).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dagctx.protocol.context_messages import Skipped

from .base import quote, Rank, Reader, ROOT, Transcript, UNKNOWN_MODEL, unspilled
from .builder import Builder
from .reading import iter_jsonl
from .values import (
    content_output,
    has_images,
    one_line,
    parse_arguments,
    scrub_block,
    text_of_blocks,
    to_epoch,
)

_INJECTED_PREFIXES = (
    "<environment_context>",
    "<user_instructions>",
    "<permissions instructions>",
    "<INSTRUCTIONS>",
    "<turn_aborted>",
    "<user_shell_command>",
    "# AGENTS.md instructions",
    "<collaboration_mode>",
    "<personality",
)
_OUTPUT_ITEMS = frozenset({"reasoning", "function_call", "custom_tool_call", "local_shell_call", "web_search_call"})
_RESULT_ITEMS = frozenset({"function_call_output", "custom_tool_call_output"})


def is_injected(text: str) -> bool:
    s = text.lstrip()
    return any(s.startswith(p) for p in _INJECTED_PREFIXES)


def _message_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return text_of_blocks(content, "\n\n")
    return ""


def parse(path: Path) -> Transcript:
    b = Builder("codex")
    rows: list[tuple[int, dict]] = []
    for item in iter_jsonl(path):
        if isinstance(item, Skipped):
            b.skipped.append(item)
            continue
        if b.spills:
            _slim(b, item[1])
        rows.append(item)
    return _Parser(rows, b, path).run()


#: where ``_slim`` leaves a result it converted and kept aside: ``(output, error)`` under
#: a key no JSON text can hold
_KEPT = object()


def _slim(b: Builder, obj: dict) -> None:
    """Keep a line's tool output aside as it is read (``Builder.keep``), and drop the
    bodies of events the parser never reads (``exec_command_end`` repeats the output):
    the rows wait for the whole file (``use_events`` looks at all of them first), their
    payloads need not."""
    p = obj.get("payload")
    if not isinstance(p, dict):
        return
    if obj.get("type") == "event_msg" and p.get("type") not in ("user_message", "token_count"):
        obj["payload"] = {"type": p.get("type")}
    elif obj.get("type") == "response_item" and p.get("type") in _RESULT_ITEMS:
        output, error = _output(p.pop("output", None))
        p[_KEPT] = (b.keep(output), error)
    elif obj.get("type") == "response_item" and p.get("type") == "message" and p.get("content") is not None:
        p["content"] = b.keep(p["content"])  # a large message waits on disk (read back: ``unspilled``)


class _Parser:
    def __init__(self, rows: list[tuple[int, dict]], b: Builder, path: Path) -> None:
        self.rows = rows
        self.path = path
        self.b = b
        self.tip: str = ROOT
        self.model: str = UNKNOWN_MODEL
        self.cur: str | None = None  # open llm node
        self.cur_has_output = False
        self.last_llm: str | None = None
        self.texts: dict[str, list[str]] = {}
        self.thinking: dict[str, list[str]] = {}
        self.calls: dict[str, list[str]] = {}
        self.session_id: str | None = None
        self.messages = 0

    def run(self) -> Transcript:
        use_events = not any(
            obj.get("type") == "response_item"
            and isinstance(obj.get("payload"), dict)
            and obj["payload"].get("type") == "message"
            and obj["payload"].get("role") == "user"
            and not is_injected(_message_text(unspilled(obj["payload"].get("content"))))
            for _, obj in self.rows
        )
        for no, obj in self.rows:
            payload = obj.get("payload")
            if not isinstance(payload, dict):
                self.b.skipped.append(Skipped(no, f"line of type {obj.get('type')!r} without a payload object"))
                continue
            self._line(no, obj.get("type"), payload, to_epoch(obj.get("timestamp")), use_events)
        self._close()
        for nid, parts in self.texts.items():
            self.b.by_id[nid].output = self.b.keep("\n\n".join(p for p in map(unspilled, parts) if p.strip()))
        for nid, parts in self.thinking.items():
            if parts:
                self.b.by_id[nid].metadata["thinking"] = self.b.keep("\n\n".join(parts))
        self.b.counts["messages"] = self.messages
        return self.b.finish(self.session_id or self.path.stem, self._title())

    def _title(self) -> str | None:
        """Codex Desktop wraps the request after a file list; title the request itself."""
        for n in self.b.nodes:
            if n.role == "user" and not n.metadata.get("injected") and isinstance(text := unspilled(n.output), str):
                marker = "## My request for Codex:"
                if marker in text:
                    text = text.split(marker, 1)[1]
                text = text.strip()
                if text:
                    return one_line(text)
        return None

    # ---------------------------------------------------------------- items

    def _line(self, no: int, typ: Any, p: dict, ts: float | None, use_events: bool) -> None:
        b = self.b
        if typ == "session_meta":
            if self.session_id is None and isinstance(p.get("id"), str):
                self.session_id = p["id"]
                instr = p.get("base_instructions")
                text = instr.get("text") if isinstance(instr, dict) else instr
                if isinstance(text, str) and text:
                    b.system_prompt(b.unique(f"codex-{no}"), text, key=(no,), timestamp=ts, source="base_instructions")
            if isinstance(p.get("model"), str):
                self.model = p["model"]
            return
        if typ == "turn_context":
            if isinstance(p.get("model"), str) and p["model"]:
                self.model = p["model"]
            return
        if typ == "compacted":
            self._compaction(no, p.get("message") if isinstance(p.get("message"), str) else "", ts)
            return
        if typ == "event_msg":
            et = p.get("type")
            if et == "user_message" and use_events:
                self.messages += 1
                text = p.get("message") if isinstance(p.get("message"), str) else ""
                images = p.get("images") if isinstance(p.get("images"), list) else []
                output: Any = text
                if images:
                    output = [{"type": "text", "text": text}] + [scrub_block(_image_block(i)) for i in images]
                self._user(no, output, ts, injected=is_injected(text))
            elif et == "token_count":
                self._usage(p.get("info"))
                self._close()
            return
        if typ != "response_item":
            return
        it = p.get("type")
        if it == "message":
            self.messages += 1
            role = p.get("role")
            content = unspilled(p.get("content"))
            if role == "assistant":
                nid = self._open(no, ts)
                self.cur_has_output = True
                self.texts[nid].append(b.keep(_message_text(content)))
                if isinstance(p.get("phase"), str):
                    b.by_id[nid].metadata.setdefault("phases", []).append(p["phase"])
                return
            text = _message_text(content)
            output = content_output(content, "\n\n") if has_images(content) else text
            injected = role in ("developer", "system") or is_injected(text)
            self._user(no, output, ts, injected=injected, role=role if role != "user" else None)
            return
        if it == "reasoning":
            if self.cur is not None and self.cur_has_output:
                self._close()
            nid = self._open(no, ts)
            md = b.by_id[nid].metadata
            parts = [s.get("text") for s in (p.get("summary") or []) if isinstance(s, dict) and isinstance(s.get("text"), str)]
            parts += [c.get("text") for c in (p.get("content") or []) if isinstance(c, dict) and isinstance(c.get("text"), str)]
            self.thinking[nid].extend(x for x in parts if x)
            md["reasoningItems"] = md.get("reasoningItems", 0) + 1
            if p.get("encrypted_content"):
                md["reasoningEncrypted"] = md.get("reasoningEncrypted", 0) + 1
            # the item itself, encrypted content included (SPEC §4: metadata.reasoning)
            kept: dict[str, Any] = {"type": "reasoning"}
            if isinstance(p.get("id"), str) and p["id"]:
                kept["id"] = p["id"]
            summary = [s.get("text") for s in (p.get("summary") or []) if isinstance(s, dict) and isinstance(s.get("text"), str)]
            if summary:
                kept["summary"] = summary
            content_text = [c.get("text") for c in (p.get("content") or []) if isinstance(c, dict) and isinstance(c.get("text"), str)]
            if content_text:
                kept["text"] = "\n\n".join(content_text)
            if isinstance(p.get("encrypted_content"), str) and p["encrypted_content"]:
                kept["encryptedContent"] = p["encrypted_content"]
            md.setdefault("reasoning", []).append(kept)
            return
        if it in ("function_call", "custom_tool_call", "local_shell_call"):
            nid = self._open(no, ts)
            self.cur_has_output = True
            call_id = p.get("call_id") or p.get("id")
            if it == "function_call":
                args, ok = parse_arguments(p.get("arguments"))
                name = str(p.get("name") or "")
                extra: dict[str, Any] = {"argumentsNotJson": None if ok else True}
            elif it == "custom_tool_call":
                args, name, extra = {"input": p.get("input")}, str(p.get("name") or ""), {"customTool": True}
            else:
                action = p.get("action")
                args, name, extra = (action if isinstance(action, dict) else {"action": action}), "local_shell", {}
            if isinstance(p.get("namespace"), str):
                extra["namespace"] = p["namespace"]
            cid = b.unique(call_id if isinstance(call_id, str) and call_id else f"codex-{no}")
            b.tool_call(cid, name, args, nid, call_id if isinstance(call_id, str) else None, key=(no,), timestamp=ts, **extra)
            if isinstance(call_id, str):
                self.calls.setdefault(call_id, []).append(cid)
            return
        if it == "web_search_call":
            nid = self._open(no, ts)
            self.cur_has_output = True
            action = p.get("action")
            args = action if isinstance(action, dict) else {}
            status = p.get("status") if isinstance(p.get("status"), str) else "completed"
            b.hosted_call(b.unique(f"codex-{no}"), "web_search", args, nid, status, key=(no,), timestamp=ts)
            return
        if it in _RESULT_ITEMS:
            self._close()
            call_id = p.get("call_id")
            cands = self.calls.get(call_id, []) if isinstance(call_id, str) else []
            target = next((c for c in cands if not b.has_result(c)), None)
            if target is None:
                b.skipped.append(Skipped(no, f"{it} for unknown call_id {quote(call_id)}"))
                b.counts["orphanResults"] = b.counts.get("orphanResults", 0) + 1
                return
            output, error = p[_KEPT] if _KEPT in p else _output(p.get("output"))
            b.attach_result(target, output, error=error, ts=ts)
            return
        if it in ("compaction", "compaction_summary"):
            text = p.get("summary") if isinstance(p.get("summary"), str) else ""
            self._compaction(no, text, ts, encrypted=True if p.get("encrypted_content") else None)
            return
        b.counts["unknownItems"] = b.counts.get("unknownItems", 0) + 1

    # ---------------------------------------------------------------- helpers

    def _user(self, no: int, output: Any, ts: float | None, *, injected: bool, role: str | None = None) -> None:
        self._close()
        node = self.b.user(
            self.b.unique(f"codex-{no}"), output, self.tip, key=(no,), timestamp=ts,
            injected=True if injected else None, sourceRole=role,
        )
        self.tip = node.id

    def _open(self, no: int, ts: float | None) -> str:
        if self.cur is not None:
            self.b.touch(self.cur, ts)
            return self.cur
        node = self.b.llm(self.b.unique(f"codex-{no}"), self.model, self.tip, key=(no,), timestamp=ts)
        self.cur = node.id
        self.cur_has_output = False
        self.texts[node.id] = []
        self.thinking[node.id] = []
        self.tip = node.id
        self.last_llm = node.id
        return node.id

    def _close(self) -> None:
        self.cur = None
        self.cur_has_output = False

    def _usage(self, info: Any) -> None:
        if not isinstance(info, dict) or self.last_llm is None or self.last_llm in self.b.usage:
            return
        last = info.get("last_token_usage")
        if not isinstance(last, dict):
            return
        inp = int(last.get("input_tokens") or 0)
        cached = int(last.get("cached_input_tokens") or 0)
        self.b.set_usage(self.last_llm, input=max(inp - cached, 0), output=int(last.get("output_tokens") or 0), cache_read=cached)
        if last.get("reasoning_output_tokens"):
            self.b.by_id[self.last_llm].metadata["reasoningTokens"] = int(last["reasoning_output_tokens"])

    def _compaction(self, no: int, text: str, ts: float | None, **extra: Any) -> None:
        self._close()
        covers = self.b.chain_ids(self.tip)
        self.b.summary(self.b.unique(f"codex-{no}"), text, covers, no, key=(no,), timestamp=ts, **extra)


def _image_block(item: Any) -> dict:
    if isinstance(item, str):
        return {"type": "input_image", "image_url": item}
    return item if isinstance(item, dict) else {"type": "image"}


def _output(raw: Any) -> tuple[Any, bool]:
    """A function_call_output body and whether it reports failure."""
    if isinstance(raw, str):
        return raw, False
    if isinstance(raw, dict):
        error = raw.get("success") is False
        body = raw.get("content", raw.get("output", raw))
        return content_output(body), error
    if isinstance(raw, list):
        return content_output(raw), False
    return ("" if raw is None else raw), False


# --------------------------------------------------------------------------- the reader


_TYPES = frozenset({"session_meta", "response_item", "event_msg", "turn_context", "compacted"})


def _detect_line(obj: dict) -> Rank | None:
    return (0, 20) if obj.get("type") in _TYPES and "payload" in obj else None


def _read(path: Path) -> Iterator[Transcript]:
    yield parse(path)


READER = Reader("codex", "Codex", _read, detect_line=_detect_line)
