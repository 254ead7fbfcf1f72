"""OpenClaw / pi session JSONL (format version 3) → Transcript.

Written from the documented format (no public sample exists): a header line
``{"type":"session","version":3,"id","timestamp","cwd",…}`` then entries that form a tree
through ``id``/``parentId``:

* ``message`` entries whose ``message.role`` is ``user`` (string or text/image blocks),
  ``assistant`` (blocks ``text``/``thinking``/``toolCall{id,name,arguments}``, plus
  ``model``, ``usage{input,output,cacheRead,cacheWrite}``, ``stopReason``), ``toolResult``
  (``toolCallId``, ``toolName``, ``content``, ``isError``), ``bashExecution`` (a command
  the user ran: a top-level code node on the chain, SPEC §4) and ``custom``
  (extension text sent to the model: a user node marked injected);
* ``compaction`` (``summary``, ``firstKeptEntryId``, ``tokensBefore``): a
  ``context/summary`` node covering the chain before the first kept entry; the entry
  itself maps to its parent, so later entries continue the chain and the kept tail keeps
  its ids (SPEC §4);
* ``branch_summary`` (``fromId``, ``summary``): the summary of an abandoned branch that pi
  feeds into the branch it moves to, so a user node on that branch
  (``metadata["branchSummary"]``, ``metadata["fromId"]``);
* ``custom_message`` → injected user node; ``model_change`` sets the model of later
  replies; ``session_info.name`` is the title; other entries (labels, thinking level,
  extension state) map to their parent.

Entries without ``id`` (version 1 files) get ``line<N>`` and chain to the entry before.
Node ids are the entry ids; tool calls use the toolCall id.
``counts["messages"]`` = message entries.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dagctx.protocol.context_messages import Skipped
from dagctx.protocol.nodes import NodeInput

from .base import quote, Rank, Reader, ROOT, Transcript, unspilled
from .builder import Builder, stable_topo
from .reading import iter_jsonl
from .values import content_blocks, content_output, parse_arguments, to_epoch


#: the fields of an entry, and of its ``message``, that hold a body (kept aside by ``_slim``)
_BODIES = ("content", "output", "summary")


def _slim(b: Builder, obj: dict) -> None:
    """Keep an entry's bodies aside as it is read (``Builder.keep``; SPEC §9 import): the
    entries wait for the whole file (its tree is ordered first), their bodies need not."""
    for d in (obj, obj.get("message")):
        if isinstance(d, dict):
            for k in _BODIES:
                if d.get(k) is not None:
                    d[k] = b.keep(d[k])


def _unslim(obj: dict) -> dict:
    """The entry as it was read: its bodies read back (a copy; one entry at a time)."""
    out = {k: unspilled(v) for k, v in obj.items()}
    if isinstance(out.get("message"), dict):
        out["message"] = {k: unspilled(v) for k, v in out["message"].items()}
    return out


def parse(path: Path) -> Transcript:
    b = Builder("openclaw")
    read_skips: list[Skipped] = []
    dups: list[Skipped] = []
    session_id: str | None = None
    model: str | None = None
    entries: list[tuple[int, dict, str, str | None]] = []
    seen: set[str] = set()
    prev: str | None = None
    # streamed: each line's bodies are kept aside as it is read when the import asks
    # (``SPILL_OVER``), so the file's entries wait for the tree walk without their texts
    for item in iter_jsonl(path):
        if isinstance(item, Skipped):
            read_skips.append(item)
            continue
        no, obj = item
        if b.spills:
            _slim(b, obj)
        if obj.get("type") == "session" and session_id is None:
            session_id = obj.get("id") if isinstance(obj.get("id"), str) else None
            if isinstance(obj.get("modelId"), str):
                model = obj["modelId"]
            continue
        eid = obj.get("id") if isinstance(obj.get("id"), str) and obj.get("id") else f"line{no}"
        if eid in seen:
            dups.append(Skipped(no, f"duplicate entry id {quote(eid)}"))
            continue
        seen.add(eid)
        parent = obj.get("parentId") if "parentId" in obj else prev
        entries.append((no, obj, eid, parent if isinstance(parent, str) else None))
        prev = eid
    b.skipped.extend(read_skips)  # the order a whole read gave: unreadable lines, then duplicates
    b.skipped.extend(dups)
    ordered = stable_topo(entries, lambda e: [e[3]] if e[3] else [], lambda e: e[2])
    return _Parser(b, session_id or path.stem, model).run(ordered)


class _Parser:
    def __init__(self, b: Builder, session_id: str, model: str | None) -> None:
        self.b = b
        self.session_id = session_id
        self.model = model
        self.node_of: dict[str, str] = {}
        self.calls: dict[str, list[str]] = {}
        self.title: str | None = None
        self.messages = 0

    def run(self, entries: list[tuple[int, dict, str, str | None]]) -> Transcript:
        for no, obj, eid, parent in entries:
            pn = self.node_of.get(parent, ROOT) if parent else ROOT
            if parent and parent not in self.node_of:
                self.b.counts["danglingParents"] = self.b.counts.get("danglingParents", 0) + 1
            if self.b.spills:
                obj = _unslim(obj)
            ts = to_epoch(obj.get("timestamp"))
            self.node_of[eid] = pn  # default: stands for its parent
            self._entry(no, obj, eid, pn, ts)
        self.b.counts["messages"] = self.messages
        return self.b.finish(self.session_id, self.title)

    def _entry(self, no: int, e: dict, eid: str, pn: str, ts: float | None) -> None:
        b = self.b
        t = e.get("type")
        key = (no,)
        if t == "message":
            msg = e.get("message")
            if not isinstance(msg, dict):
                b.skipped.append(Skipped(no, "message entry without a message object"))
                return
            self.messages += 1
            if ts is None:
                ts = to_epoch(msg.get("timestamp"))
            self._message(no, msg, eid, pn, ts)
        elif t == "compaction":
            chain = b.chain_ids(pn)
            kept = self.node_of.get(e.get("firstKeptEntryId")) if isinstance(e.get("firstKeptEntryId"), str) else None
            covers = chain[: chain.index(kept)] if kept in chain else chain
            b.summary(
                b.unique(eid),
                e.get("summary") if isinstance(e.get("summary"), str) else "",
                covers,
                no,
                key=key,
                timestamp=ts,
                tokensBefore=e.get("tokensBefore"),
                firstKeptEntryId=e.get("firstKeptEntryId"),
                fromHook=True if e.get("fromHook") or e.get("fromExtension") else None,
            )
        elif t == "branch_summary":
            from_id = e.get("fromId") if isinstance(e.get("fromId"), str) else None
            node = b.user(
                b.unique(eid),
                e.get("summary") if isinstance(e.get("summary"), str) else "",
                pn,
                key=key,
                timestamp=ts,
                injected=True,
                branchSummary=True,
                fromId=self.node_of.get(from_id, from_id) if from_id else None,
            )
            self.node_of[eid] = node.id
        elif t == "custom_message":
            node = b.user(
                b.unique(eid), content_output(e.get("content"), "\n\n"), pn, key=key, timestamp=ts,
                injected=True, customType=e.get("customType"), display=e.get("display"),
            )
            self.node_of[eid] = node.id
        elif t == "model_change":
            m = e.get("modelId") or e.get("model")
            if isinstance(m, str) and m:
                self.model = m
        elif t == "session_info":
            if isinstance(e.get("name"), str) and e["name"].strip():
                self.title = e["name"].strip()

    def _message(self, no: int, msg: dict, eid: str, pn: str, ts: float | None) -> None:
        b = self.b
        role = msg.get("role")
        key = (no,)
        if role == "user":
            node = b.user(b.unique(eid), content_output(msg.get("content"), "\n\n"), pn, key=key, timestamp=ts)
            self.node_of[eid] = node.id
        elif role in ("custom", "hookMessage", "branchSummary", "compactionSummary"):
            body = msg.get("content") if "content" in msg else msg.get("summary")
            node = b.user(
                b.unique(eid), content_output(body, "\n\n"), pn, key=key, timestamp=ts,
                injected=True, customType=msg.get("customType"), sourceRole=role,
            )
            self.node_of[eid] = node.id
        elif role == "assistant":
            self._assistant(no, msg, eid, pn, ts)
        elif role == "toolResult":
            self._tool_result(no, msg, pn, ts)
        elif role == "bashExecution":
            cancelled = bool(msg.get("cancelled"))
            node = b.add(_bash_node(b.unique(eid), msg, pn, ts, cancelled), key)
            self.node_of[eid] = node.id
        else:
            b.skipped.append(Skipped(no, f"message with unknown role {quote(role)}"))

    def _assistant(self, no: int, msg: dict, eid: str, pn: str, ts: float | None) -> None:
        b = self.b
        model = msg.get("model") if isinstance(msg.get("model"), str) else self.model
        node = b.llm(b.unique(eid), model, pn, key=(no,), timestamp=ts, provider=msg.get("provider"), stopReason=msg.get("stopReason"))
        self.node_of[eid] = node.id
        texts: list[str] = []
        thinking: list[str] = []
        content = msg.get("content")
        blocks = content_blocks(content)
        for k, blk in enumerate(blocks):
            if not isinstance(blk, dict):
                continue
            bt = blk.get("type")
            if bt == "text" and isinstance(blk.get("text"), str):
                texts.append(blk["text"])
            elif bt == "thinking" and isinstance(blk.get("thinking"), str):
                if blk["thinking"]:
                    thinking.append(blk["thinking"])
            elif bt == "toolCall":
                tid = blk.get("id") if isinstance(blk.get("id"), str) else None
                args, ok = parse_arguments(blk.get("arguments"))
                cid = b.unique(tid or f"{eid}:{k}")
                b.tool_call(cid, str(blk.get("name") or ""), args, node.id, tid, key=(no, k), timestamp=ts, argumentsNotJson=None if ok else True)
                if tid:
                    self.calls.setdefault(tid, []).append(cid)
            else:
                node.metadata.setdefault("otherBlocks", []).append(bt)
        node.output = b.keep("\n\n".join(t for t in texts if t.strip()))
        if thinking:
            node.metadata["thinking"] = b.keep("\n\n".join(thinking))
        stop = msg.get("stopReason")
        if stop == "error":
            node.status = "error"
        elif stop == "aborted":
            node.status = "cancelled"
        if isinstance(msg.get("errorMessage"), str):
            node.metadata["errorMessage"] = msg["errorMessage"]
        usage = msg.get("usage")
        if isinstance(usage, dict):
            b.set_usage(
                node.id,
                input=usage.get("input") or 0,
                output=usage.get("output") or 0,
                cache_read=usage.get("cacheRead") or 0,
                cache_write=usage.get("cacheWrite") or 0,
            )

    def _tool_result(self, no: int, msg: dict, pn: str, ts: float | None) -> None:
        b = self.b
        tid = msg.get("toolCallId")
        cands = self.calls.get(tid, []) if isinstance(tid, str) else []
        target = next((c for c in reversed(cands) if b.by_id[c].caller == pn and not b.has_result(c)), None)
        if target is None:
            target = next((c for c in reversed(cands) if not b.has_result(c)), None)
        if target is None:
            b.skipped.append(Skipped(no, f"toolResult for unknown toolCallId {quote(tid)}"))
            b.counts["orphanResults"] = b.counts.get("orphanResults", 0) + 1
            return
        b.attach_result(target, content_output(msg.get("content")), error=bool(msg.get("isError")), ts=ts)


def _bash_node(node_id: str, msg: dict, pn: str, ts: float | None, cancelled: bool) -> NodeInput:
    md: dict[str, Any] = {"source": "user_bash"}
    if ts is not None:
        md["timestamp"] = ts
    for k in ("exitCode", "truncated", "excludeFromContext"):
        if msg.get(k) is not None:
            md[k] = msg[k]
    return NodeInput(
        role="code",
        id=node_id,
        name="bash",
        input={"command": msg.get("command")},
        output=msg.get("output") if msg.get("output") is not None else "",
        status="cancelled" if cancelled else "completed",
        predecessor=pn,
        metadata=md,
    )


# --------------------------------------------------------------------------- the reader


_ENTRY_TYPES = ("message", "compaction", "branch_summary", "model_change", "thinking_level_change")


def _detect_line(obj: dict) -> Rank | None:
    t = obj.get("type")
    if t == "session" and ("version" in obj or "cwd" in obj) and "id" in obj:
        return (0, 30)
    if t in _ENTRY_TYPES and "parentId" in obj:
        return (0, 30)
    return None


def _read(path: Path) -> Iterator[Transcript]:
    yield parse(path)


READER = Reader("openclaw", "OpenClaw", _read, detect_line=_detect_line)
