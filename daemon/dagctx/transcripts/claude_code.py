"""Claude Code session JSONL (``~/.claude/projects/<project>/<session>.jsonl``) → Transcript.

Lines form a tree through ``uuid``/``parentUuid``; many lines are not messages
(``progress``, ``system``, tool-result carrier lines) yet sit inside that tree. Every line
is therefore mapped to the conversation node it stands for (``node_of``): a message line
to its node, anything else to whatever its parent maps to. A node's predecessor is
``node_of[parentUuid]``, so the chain skips the bookkeeping lines by construction.

* Assistant lines sharing ``message.id`` are one llm node — merged only when the line's
  parent resolves to that node, so a session replayed under a second root (same message
  ids, new uuids) stays a separate branch.
* ``tool_use`` blocks become code nodes (id = the tool_use id, suffixed ``#2``… if the id
  repeats); a ``tool_result`` is matched to the call with that id under the llm node its
  line hangs from, else to the latest call with that id still waiting.
* ``compact_boundary`` + the following ``isCompactSummary`` user line → one
  ``context/summary`` node covering the chain up to ``logicalParentUuid``; the boundary
  maps to that last covered node, so the conversation after it continues the chain.
  Claude Code prunes old lines, so ``logicalParentUuid`` may name a line that is no longer
  in the file: the boundary is then anchored at the last conversation node the file
  still has before it (in file order), the summary covers that node's chain, and
  ``Transcript.notes`` says what was missing. With nothing before the boundary, the
  summary is kept as the user message Claude Code sent (``metadata["compactSummary"]``).
* The compaction summarizer's own transcript (``subagents/agent-acompact-*.jsonl``) is no
  subagent and never becomes turns: it is recorded as ``metadata["summarizer"]`` (file,
  model, lines, how it was matched) of the compaction it produced — the one whose summary
  contains its reply, else the first boundary at or after its last line — or skipped, with
  a note, when it matches none.
* Subagent files (``<session>/subagents/agent-*.jsonl``, legacy ``agent-*.jsonl`` next to
  the session with the same ``sessionId``) and ``isSidechain`` roots become spawn
  branches. Their root's caller is the Task/Agent code node, matched by
  ``toolUseResult.agentId`` (or ``agentId: …`` in the result text), else by the prompt
  text, else by time; ``metadata["spawnMatch"]`` says which.

A dagctx export's first line carries ``dagctxSource`` (``sessionId``, ``head``): it becomes
``Transcript.origin``, and ``head`` is the transcript's HEAD.

``counts["messages"]`` = user + assistant lines over all files read. Which file of a
session is which (subagents, summarizers) is ``claude_code_files.py``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dagctx.protocol.context_messages import Skipped
from dagctx.protocol.nodes import SUMMARY_NAME

from .base import is_spawn_root, quote, Rank, Reader, ROOT, SpilledOutput, Transcript, unspilled
from .builder import Builder, stable_topo
from .claude_code_files import (
    agent_from_name,
    compaction_files,
    is_agent_file,
    read_summarizer,
    subagent_files,
)
from .claude_code_rows import lines
from .values import content_blocks, content_output, parse_arguments, text_of_blocks, to_epoch

_AGENT_ID_TEXT = re.compile(r"agentId:\s*([A-Za-z0-9_-]+)")
_SPAWN_TOOLS = frozenset({"Task", "Agent"})


@dataclass
class _Row:
    key: tuple
    no: int
    obj: dict
    uuid: str | None
    parent: str | None
    logical: str | None
    side: bool
    agent: str | None


def parse(path: Path) -> Transcript:
    b = Builder("claude-code")
    files = [path, *subagent_files(path)]
    rows: list[_Row] = []
    session_id: str | None = None
    for fno, f in enumerate(files):
        label = "" if fno == 0 else f"{f.parent.name}/{f.name}"
        file_agent = agent_from_name(f) if fno else None
        for no, obj in lines(b, f, label):
            if fno == 0 and session_id is None and isinstance(obj.get("sessionId"), str):
                session_id = obj["sessionId"]
            uuid = obj.get("uuid") if isinstance(obj.get("uuid"), str) else None
            parent = obj.get("parentUuid") if isinstance(obj.get("parentUuid"), str) else None
            logical = obj.get("logicalParentUuid") if isinstance(obj.get("logicalParentUuid"), str) else None
            agent = obj.get("agentId") if isinstance(obj.get("agentId"), str) else file_agent
            side = fno > 0 or bool(obj.get("isSidechain"))
            rows.append(_Row((fno, no), no, obj, uuid, parent, logical, side, agent))
    key = session_id or path.stem
    if is_agent_file(path):
        # A subagent file read on its own: keep it apart from its parent session's key.
        key = f"{key}:{path.stem}"
    parser = _Parser(b, rows, key)
    t = parser.run()
    parser.attach_summarizers(t, compaction_files(path), path)
    return t


class _Parser:
    def __init__(self, b: Builder, rows: list[_Row], session_id: str) -> None:
        self.b = b
        self.rows = rows
        self.session_id = session_id
        self.by_uuid: dict[str, _Row] = {}
        self.node_of: dict[str, str] = {}
        self.msg_id: dict[str, str] = {}
        self.texts: dict[str, list[str]] = {}
        self.thinking: dict[str, list[str]] = {}
        self.raw_usage: dict[str, dict[str, int]] = {}
        self.calls: dict[str, list[str]] = {}
        self.agent_to_call: dict[str, str] = {}
        self.spawn_roots: list[tuple[str, _Row]] = []
        self.boundaries: list[_Row] = []
        self.summarized: set[str] = set()
        self.titles: list[tuple[str | None, str]] = []
        self.messages = 0
        self.dangling = 0
        #: tree rows of each file in file order, and each row's place there
        self.file_rows: dict[int, list[_Row]] = {}
        self.file_pos: dict[str, int] = {}
        #: boundary uuid → its logicalParentUuid, when that line is not in the file
        self.missing_logical: dict[str, str] = {}
        self.notes: list[str] = []
        #: ``dagctxSource`` of a dagctx export: the session (and HEAD) it was written from
        self.origin: dict[str, str] | None = None

    # ---------------------------------------------------------------- driver

    def run(self) -> Transcript:
        tree_rows: list[_Row] = []
        for row in self.rows:
            t = row.obj.get("type")
            if t in ("user", "assistant"):
                self.messages += 1
            if t == "summary" and isinstance(row.obj.get("summary"), str):
                leaf = row.obj.get("leafUuid") if isinstance(row.obj.get("leafUuid"), str) else None
                if row.obj["summary"]:
                    self.titles.append((leaf, row.obj["summary"]))
                src = row.obj.get("dagctxSource")
                if isinstance(src, dict) and self.origin is None and row.key[0] == 0:
                    self.origin = {k: v for k, v in src.items() if isinstance(v, str)}
                continue
            if row.uuid is None:
                if t in ("user", "assistant"):
                    self.b.skipped.append(Skipped(row.no, f"{t} line without uuid"))
                continue
            if row.uuid in self.by_uuid:
                self.b.skipped.append(Skipped(row.no, f"duplicate uuid {quote(row.uuid)}"))
                continue
            self.by_uuid[row.uuid] = row
            tree_rows.append(row)
            rows_of_file = self.file_rows.setdefault(row.key[0], [])
            self.file_pos[row.uuid] = len(rows_of_file)
            rows_of_file.append(row)

        ordered = stable_topo(tree_rows, lambda r: [x for x in (r.parent, r.logical) if x], lambda r: r.uuid)
        for row in ordered:
            self._line(row)
        self._finish_llm_nodes()
        self._orphan_boundaries()
        self._match_spawns()
        self.b.counts["messages"] = self.messages
        if self.dangling:
            self.b.counts["danglingParents"] = self.dangling
        head = self.origin.get("head") if self.origin else None
        t = self.b.finish(self.session_id, None, head if head in self.b.by_id else None)
        t.title = self._title(t.head) or t.title
        t.notes.extend(self.notes)
        t.origin = self.origin
        return t

    def resolve(self, uuid: str | None) -> str:
        if uuid is None:
            return ROOT
        nid = self.node_of.get(uuid)
        if nid is None:
            self.dangling += 1
            return ROOT
        return nid

    def _line(self, row: _Row) -> None:
        t = row.obj.get("type")
        if t == "assistant":
            self._assistant(row)
        elif t == "user":
            self._user(row)
        elif t == "system" and row.obj.get("subtype") == "compact_boundary":
            if row.logical and row.logical not in self.by_uuid:
                # The pre-compaction lines were pruned: anchor at what the file still has.
                self.missing_logical[row.uuid] = row.logical  # type: ignore[index]
                self.node_of[row.uuid] = self._anchor_before(row)  # type: ignore[index]
            else:
                self.node_of[row.uuid] = self.resolve(row.logical) if row.logical else self.resolve(row.parent)  # type: ignore[index]
            self.boundaries.append(row)
        elif t == "progress":
            self.node_of[row.uuid] = self.resolve(row.parent)  # type: ignore[index]
            self._progress(row)
        else:
            self.node_of[row.uuid] = self.resolve(row.parent)  # type: ignore[index]

    def _anchor_before(self, row: _Row) -> str:
        """The conversation node of the nearest earlier line of the same file (ROOT if none)."""
        rows = self.file_rows.get(row.key[0], [])
        for prev in reversed(rows[: self.file_pos.get(row.uuid, 0)]):  # type: ignore[arg-type]
            nid = self.node_of.get(prev.uuid)  # type: ignore[arg-type]
            if nid is not None and nid != ROOT:
                return nid
        return ROOT

    # ---------------------------------------------------------------- lines

    def _assistant(self, row: _Row) -> None:
        b = self.b
        obj = row.obj
        msg = obj.get("message") if isinstance(obj.get("message"), dict) else {}
        mid = msg.get("id") if isinstance(msg.get("id"), str) else None
        pn = self.resolve(row.parent)
        ts = to_epoch(obj.get("timestamp"))
        if pn != ROOT and mid and self.msg_id.get(pn) == mid:
            nid = pn
        else:
            nid = b.unique(row.uuid)  # type: ignore[arg-type]
            spawn = pn == ROOT and row.side
            node = b.llm(
                nid,
                msg.get("model") if isinstance(msg.get("model"), str) else None,
                None if spawn else pn,
                key=row.key,
                timestamp=ts,
                messageId=mid,
            )
            if spawn:
                self._make_spawn_root(node, row)
            if mid:
                self.msg_id[nid] = mid
            self.texts[nid] = []
            self.thinking[nid] = []
        self.node_of[row.uuid] = nid  # type: ignore[index]
        node = b.by_id[nid]
        b.touch(nid, ts)
        content = unspilled(msg.get("content"))
        blocks = content_blocks(content)
        for k, blk in enumerate(blocks):
            if not isinstance(blk, dict):
                continue
            bt = blk.get("type")
            if bt == "text" and isinstance(blk.get("text"), str):
                self.texts[nid].append(b.keep(blk["text"]))  # a large part waits on disk
            elif bt == "thinking":
                if isinstance(blk.get("thinking"), str) and blk["thinking"]:
                    self.thinking[nid].append(blk["thinking"])
                # kept whole, signature included, in order (SPEC §4: metadata.reasoning)
                kept: dict[str, Any] = {"type": "thinking", "text": blk.get("thinking") if isinstance(
                    blk.get("thinking"), str) else ""}
                if isinstance(blk.get("signature"), str) and blk["signature"]:
                    kept["signature"] = blk["signature"]
                node.metadata.setdefault("reasoning", []).append(kept)
            elif bt == "redacted_thinking":
                node.metadata["redactedThinking"] = node.metadata.get("redactedThinking", 0) + 1
                if isinstance(blk.get("data"), str):
                    node.metadata.setdefault("reasoning", []).append({"type": "redacted_thinking", "data": blk["data"]})
            elif bt == "tool_use":
                tid = blk.get("id") if isinstance(blk.get("id"), str) else None
                # dagctx's own export names a node id that differs from its tool_use id
                renamed = row.obj.get("dagctxToolNodeIds")
                wanted = renamed.get(tid) if isinstance(renamed, dict) and tid else None
                if isinstance(wanted, str) and wanted and wanted not in b.by_id:
                    cid = wanted
                else:
                    cid = b.unique(tid or f"{row.uuid}:{k}")
                args, ok = parse_arguments(blk.get("input"))
                b.tool_call(cid, str(blk.get("name") or ""), args, nid, tid, key=(*row.key, k), timestamp=ts, argumentsNotJson=None if ok else True)
                if tid:
                    self.calls.setdefault(tid, []).append(cid)
            else:
                other = node.metadata.setdefault("otherBlocks", [])
                other.append(bt)
        usage = msg.get("usage")
        if isinstance(usage, dict):
            acc = self.raw_usage.setdefault(nid, {})
            for f in ("input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"):
                v = usage.get(f)
                if isinstance(v, int) and v > acc.get(f, -1):
                    acc[f] = v
        if msg.get("stop_reason"):
            node.metadata["stopReason"] = msg["stop_reason"]
        if obj.get("isApiErrorMessage"):
            node.status = "error"
            node.metadata["apiError"] = True

    def _user(self, row: _Row) -> None:
        b = self.b
        obj = row.obj
        msg = obj.get("message") if isinstance(obj.get("message"), dict) else {}
        content = unspilled(msg.get("content"))
        pn = self.resolve(row.parent)
        ts = to_epoch(obj.get("timestamp"))
        if obj.get("isCompactSummary"):
            self.node_of[row.uuid] = pn  # type: ignore[index]
            self._summary(row, content, pn, ts)
            return
        rest: list[Any] = []
        if isinstance(content, list):
            for blk in content:
                if isinstance(blk, dict) and blk.get("type") == "tool_result":
                    self._result(row, blk, ts)
                else:
                    rest.append(blk)
        if isinstance(content, str) or rest:
            output = content if isinstance(content, str) else content_output(rest, "\n\n")
            spawn = pn == ROOT and row.side
            node = b.user(
                b.unique(row.uuid),  # type: ignore[arg-type]
                output,
                None if spawn else pn,
                key=row.key,
                timestamp=ts,
                isMeta=True if obj.get("isMeta") else None,
            )
            if spawn:
                self._make_spawn_root(node, row)
            self.node_of[row.uuid] = node.id  # type: ignore[index]
        else:
            self.node_of[row.uuid] = pn  # type: ignore[index]

    def _result(self, row: _Row, blk: dict, ts: float | None) -> None:
        b = self.b
        tid = blk.get("tool_use_id")
        src = row.obj.get("sourceToolAssistantUUID")
        owner = self.node_of.get(src) if isinstance(src, str) else None
        owner = owner or self.resolve(row.parent)
        cands = self.calls.get(tid, []) if isinstance(tid, str) else []
        target = next((c for c in reversed(cands) if b.by_id[c].caller == owner and not b.has_result(c)), None)
        if target is None:
            target = next((c for c in reversed(cands) if not b.has_result(c)), None)
        if target is None:
            if cands:
                b.skipped.append(Skipped(row.no, f"second tool_result for tool_use {quote(tid)}"))
                b.counts["duplicateResults"] = b.counts.get("duplicateResults", 0) + 1
            else:
                b.skipped.append(Skipped(row.no, f"tool_result for unknown tool_use {quote(tid)}"))
                b.counts["orphanResults"] = b.counts.get("orphanResults", 0) + 1
            return
        raw = blk.get("content")
        output = raw if isinstance(raw, SpilledOutput) else content_output(raw)  # already converted by slim
        b.attach_result(target, output, error=bool(blk.get("is_error")), ts=ts)
        tur = row.obj.get("toolUseResult")
        agent = tur.get("agentId") if isinstance(tur, dict) else None
        if not isinstance(agent, str) and b.by_id[target].name in _SPAWN_TOOLS:
            text = output.load() if isinstance(output, SpilledOutput) else output
            m = _AGENT_ID_TEXT.search(text if isinstance(text, str) else "")
            agent = m.group(1) if m else None
        if agent:
            self.agent_to_call.setdefault(agent, target)

    def _progress(self, row: _Row) -> None:
        tid = row.obj.get("parentToolUseID") or row.obj.get("toolUseID")
        cands = self.calls.get(tid, []) if isinstance(tid, str) else []
        if not cands:
            return
        owner = self.node_of.get(row.uuid)  # type: ignore[arg-type]
        target = next((c for c in reversed(cands) if self.b.by_id[c].caller == owner), cands[-1])
        md = self.b.by_id[target].metadata
        md["progress"] = md.get("progress", 0) + 1

    def _summary(self, row: _Row, content: Any, tip: str, ts: float | None) -> None:
        boundary = self.by_uuid.get(row.parent) if row.parent else None
        extra: dict[str, Any] = {}
        missing = None
        if boundary is not None and boundary.obj.get("subtype") == "compact_boundary":
            self.summarized.add(boundary.uuid)  # type: ignore[arg-type]
            cm = boundary.obj.get("compactMetadata") if isinstance(boundary.obj.get("compactMetadata"), dict) else {}
            extra = {"trigger": cm.get("trigger"), "preTokens": cm.get("preTokens"), "boundaryUuid": boundary.uuid}
            missing = self.missing_logical.get(boundary.uuid)  # type: ignore[arg-type]
            if missing:
                extra["missingLogicalParent"] = missing
        text = content if isinstance(content, str) else text_of_blocks(content or [])
        covers = self.b.chain_ids(tip)
        nid = self.b.unique(row.uuid)  # type: ignore[arg-type]
        if not covers and missing:
            # Nothing of the covered conversation is left: the summary is the first thing
            # the model saw, as Claude Code sent it — a user message.
            node = self.b.user(nid, text, ROOT, key=row.key, timestamp=ts, compactSummary=True, **extra)
            self.node_of[row.uuid] = node.id  # type: ignore[index]
            self.notes.append(
                f"line {row.no}: the compaction's logicalParentUuid {missing} is not in the file and no "
                f"conversation is left before it; its summary ({len(text):,} characters) is kept as the first user message"
            )
            return
        self.b.summary(nid, text, covers, row.no, key=row.key, timestamp=ts, **extra)
        if missing:
            self.notes.append(
                f"line {row.no}: the compaction's logicalParentUuid {missing} is not in the file (its lines were "
                f"pruned); the summary ({len(text):,} characters) covers the {len(covers)} conversation nodes the "
                "file still has before the boundary"
            )

    def _orphan_boundaries(self) -> None:
        """A boundary whose summary line is missing still marks a compaction."""
        for row in self.boundaries:
            if row.uuid in self.summarized:
                continue
            cm = row.obj.get("compactMetadata") if isinstance(row.obj.get("compactMetadata"), dict) else {}
            tip = self.node_of.get(row.uuid, ROOT)  # type: ignore[arg-type]
            self.b.summary(
                self.b.unique(row.uuid),  # type: ignore[arg-type]
                row.obj.get("content") if isinstance(row.obj.get("content"), str) else "",
                self.b.chain_ids(tip),
                row.no,
                key=row.key,
                timestamp=to_epoch(row.obj.get("timestamp")),
                trigger=cm.get("trigger"),
                preTokens=cm.get("preTokens"),
                summaryMissing=True,
            )

    # ---------------------------------------------------------------- summarizers

    def attach_summarizers(self, t: Transcript, files: list[Path], main: Path) -> None:
        """Record each summarizer transcript as the provenance of its compaction."""
        summaries = [n for n in t.nodes if n.role == "llm" and n.name == SUMMARY_NAME]
        used: set[str] = set()
        for f in files:
            try:
                info = read_summarizer(f, main)
            except OSError as exc:
                self.notes.append(f"{f.name}: compaction summarizer transcript not read ({exc.strerror})")
                continue
            target, how = None, ""
            reply = info.reply.strip()
            if reply:
                probe = reply[:200]
                target = next((n for n in summaries if n.id not in used and isinstance(o := unspilled(n.output), str)
                               and probe in o), None)
                how = "text"
            if target is None and info.last_ts is not None:
                later = [n for n in summaries if n.id not in used
                         and isinstance(n.metadata.get("timestamp"), (int, float))
                         and n.metadata["timestamp"] >= info.last_ts]
                if later:
                    target, how = min(later, key=lambda n: n.metadata["timestamp"]), "timestamp"
            if target is None:
                self.notes.append(f"{info.file}: a compaction summarizer's transcript that matches no compaction in "
                                  "this session; not imported (it is not a turn)")
                continue
            used.add(target.id)  # type: ignore[arg-type]
            target.metadata["summarizer"] = {
                k: v for k, v in (("file", info.file), ("model", info.model), ("lines", info.lines), ("match", how))
                if v is not None
            }
        t.notes[:] = list(dict.fromkeys([*t.notes, *self.notes]))

    # ---------------------------------------------------------------- spawn

    def _make_spawn_root(self, node: Any, row: _Row) -> None:
        node.metadata["spawn_branch_root"] = True
        node.metadata["source"] = "subagent"
        if row.agent:
            node.metadata["agentId"] = row.agent
        self.spawn_roots.append((node.id, row))

    def _match_spawns(self) -> None:
        b = self.b
        if not self.spawn_roots:
            return
        task_calls = [n for n in b.nodes if n.role == "code" and n.name in _SPAWN_TOOLS]
        used: set[str] = set()
        main_llms = [n for n in b.nodes if n.role == "llm" and not _on_spawn_branch(b, n.id)]
        for root_id, row in self.spawn_roots:
            node = b.by_id[root_id]
            ts = node.metadata.get("timestamp")
            caller: str | None = None
            how = ""
            if row.agent and row.agent in self.agent_to_call:
                caller, how = self.agent_to_call[row.agent], "agentId"
            if caller is None:
                prompt = _plain_text(unspilled(node.output)).strip()
                for c in task_calls:
                    args = unspilled(c.input)
                    p = args.get("prompt") if isinstance(args, dict) else None
                    if c.id not in used and isinstance(p, str) and p.strip() == prompt and prompt:
                        caller, how = c.id, "prompt"
                        break
            if caller is None:
                earlier = [c for c in task_calls if c.id not in used and _not_after(c.metadata.get("timestamp"), ts)]
                if earlier:
                    caller, how = earlier[-1].id, "timestamp"
            if caller is None:
                earlier_llm = [n for n in main_llms if _not_after(n.metadata.get("timestamp"), ts)]
                if earlier_llm:
                    caller, how = earlier_llm[-1].id, "timestamp-llm"
            if caller is None:
                # Nothing in the parent session to hang it on: it is an ordinary root.
                node.metadata.pop("spawn_branch_root", None)
                node.metadata["spawnUnmatched"] = True
                node.predecessor = ROOT
                continue
            used.add(caller)
            node.caller = caller
            node.metadata["spawnMatch"] = how
            caller_node = b.by_id[caller]
            if caller_node.role == "code":
                caller_node.metadata.setdefault("spawnBranchRoots", []).append(root_id)

    # ---------------------------------------------------------------- finishing

    def _finish_llm_nodes(self) -> None:
        b = self.b
        for nid, parts in self.texts.items():
            node = b.by_id[nid]
            node.output = b.keep("\n\n".join(p for p in map(unspilled, parts) if p.strip()))
            think = self.thinking.get(nid)
            if think:
                node.metadata["thinking"] = b.keep("\n\n".join(think))
        for nid, u in self.raw_usage.items():
            b.set_usage(
                nid,
                input=u.get("input_tokens", 0),
                output=u.get("output_tokens", 0),
                cache_read=u.get("cache_read_input_tokens", 0),
                cache_write=u.get("cache_creation_input_tokens", 0),
            )

    def _title(self, head: str | None) -> str | None:
        if not self.titles:
            return None
        by_node: dict[str, str] = {}
        for leaf, text in self.titles:
            if leaf and leaf in self.node_of:
                by_node[self.node_of[leaf]] = text
        for nid in reversed(self.b.chain_ids(head)):
            if nid in by_node:
                return by_node[nid]
        return self.titles[-1][1]


def _plain_text(output: Any) -> str:
    if isinstance(output, str):
        return output
    if isinstance(output, list):
        return text_of_blocks(output)
    return ""


def _not_after(a: Any, b: Any) -> bool:
    if not isinstance(a, (int, float)) or not isinstance(b, (int, float)):
        return True
    return a <= b


def _on_spawn_branch(b: Builder, node_id: str) -> bool:
    cur: str | None = node_id
    seen: set[str] = set()
    while cur and cur != ROOT and cur not in seen:
        seen.add(cur)
        n = b.by_id.get(cur)
        if n is None:
            return False
        if is_spawn_root(n):
            return True
        cur = n.predecessor
    return False


# --------------------------------------------------------------------------- the reader


_LINE_TYPES = frozenset(
    {"user", "assistant", "system", "summary", "progress", "file-history-snapshot", "queue-operation", "attachment"}
)


def _detect_line(obj: dict) -> Rank | None:
    if "sessionId" in obj or "parentUuid" in obj:
        return (0, 50)
    if obj.get("type") in _LINE_TYPES and ("uuid" in obj or "leafUuid" in obj or "messageId" in obj):
        return (0, 50)
    return None


def _companions(path: Path) -> list[Path]:
    """A session's subagent and compaction-summarizer files: read with it, never alone."""
    if path.suffix != ".jsonl" or is_agent_file(path):
        return []
    return [*subagent_files(path), *compaction_files(path)]


def _read(path: Path) -> Iterator[Transcript]:
    yield parse(path)


READER = Reader("claude-code", "Claude Code", _read, detect_line=_detect_line, companions=_companions)
