"""``session/export``: one branch as a Claude Code transcript, or its OpenAI rendering.

``claude-code`` writes the branch ending at ``head`` as Claude Code session JSONL, built so
that ``dagctx.transcripts.claude_code`` reading it recreates the same ledger: the same node
ids, roles, names, inputs, outputs, statuses, callers, predecessors and metadata.

* What is exported: the predecessor chain ending at ``head`` (``session/history``), every
  tool call (``code`` node whose caller is a chain llm node), the subagent branches those
  calls spawned (spawn roots and everything below them, written as ``isSidechain`` lines
  that carry ``agentId``), and every completed summary whose ``covers_ids`` are all
  exported. ``branches: "all"`` writes every branch of the session instead (every
  conversation node in seq order, the file's tree is the session's tree) and HEAD rides
  in ``dagctxSource.head``, so the re-import has the same HEAD.
* Lines: a user node is one ``user`` line whose ``uuid`` is the node id. An llm node is
  one ``assistant`` line (``uuid`` = node id; thinking, text, usage) plus one line per
  tool call sharing ``message.id`` (each with that call's timestamp), then one ``user``
  line per tool result (``tool_result`` block, ``sourceToolAssistantUUID``), then
  ``progress`` lines as many as the call recorded. ``parentUuid`` always names a line
  of the predecessor, so the importer's ``node_of`` maps it back to the same edge.
* A summary becomes a ``compact_boundary`` system line (``uuid`` =
  ``metadata.boundaryUuid``, ``logicalParentUuid`` = the last covered node) followed by
  an ``isCompactSummary`` user line (``uuid`` = the summary id); the next turn hangs off
  the summary line, as Claude Code writes it.
* The first line is ``{"type": "summary", "summary": <title>, "leafUuid": <head>,
  "dagctxSource": {"sessionId", "head", "branches"}}`` so the title survives and the file
  names the session it came from: importing it into the database that holds that session
  answers "already present" (``created: false``) instead of making a copy (SPEC §9).
  ``sessionId`` is a UUID derived from (session id, head): the same branch always exports
  under the same id, so importing the file twice elsewhere is a no-op too.
* Helper lines (tool results, continuation lines, progress) get UUIDv5 ids derived from
  the node they belong to: deterministic, and never equal to a node id.

Sessions imported from Claude Code are written faithfully (no timestamp or message id
is invented). Other sessions get ``timestamp`` from ``createdAt``, a ``message.id`` per
llm node and, for a tool call without ``metadata.toolCallId``, the node id as the
``tool_use`` id, so the file is a well-formed Claude Code transcript.

Known limits of the round trip (the importer's id scheme, not lost data):
* a tool call's node id *is* its ``tool_use`` id, suffixed ``#2``… when the id repeats in
  the source file. When the earlier node with that id is on another (unexported) branch
  — a session resumed under a second root replays the same ``tool_use`` ids — the
  re-import has no collision and gives the plain id;
* image blocks were replaced by a reference at import (data omitted): exporting the
  reference and importing it again recomputes the byte count and hash from the
  placeholder, so those two fields change;
* native (non-imported) sessions: ``reads``, ``input`` of user/llm nodes, nested calls
  deeper than one level, and top-level code nodes have no Claude Code form and are
  left out; code node ids become their ``toolCallId``.

``openai`` writes ``{"model", "messages"}``: ``context/render`` of the head in the OpenAI
format (model = the newest llm node's model on the branch, else the daemon default),
streamed a segment of turns at a time (``export_openai.py``).

``path``: written atomically (a temp file in the same folder, then a rename — or a hard
link when the name must not exist yet, so no race can clobber a file). An existing file
is refused unless ``overwrite: true`` (SPEC §9). A relative path is relative to the
client's working directory. Without ``path`` the
text is returned in ``content``, refused (``ResponseTooLarge``) as soon as it grows past
what the connection's answer may carry (``export_sinks.py``). ``lines`` counts JSONL lines (claude-code) or messages
(openai).
"""

from __future__ import annotations

import os
import re
import uuid
from datetime import datetime, timezone
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgspec

from dagctx.transcripts.base import UNKNOWN_MODEL
from dagctx.ledger import SessionGraph
from dagctx.context.cancel import stop_if_cancelled
from dagctx.context.summary_choice import summary_applies
from dagctx.ledger.graph import is_spawn_root, is_summary
from dagctx.ledger.store import NodePages
from dagctx.protocol import context_messages as c
from dagctx.protocol.errors import DagctxError
from dagctx.protocol.messages import SessionInfo
from dagctx.protocol.nodes import ROOT_SENTINEL, Call

from .export_openai import OpenAIExport
from .export_sinks import AnswerText, write_atomic

if TYPE_CHECKING:
    from .ports import Host

#: Namespace of the UUIDv5 ids of exported sessions and helper lines.
EXPORT_NAMESPACE = uuid.UUID("6d0c6a35-55a4-4d59-9b53-0a6f9e0b8c11")

_enc = msgspec.json.Encoder()
_ID_LESS_CALL = re.compile(r"^(.+):(\d+)$")
_TOOL_ID_OK = re.compile(r"^[A-Za-z0-9_-]{1,128}$")


def session_export(engine: Host, p: c.ExportParams) -> c.ExportResult:
    """In a worker of the pool, never on the event loop (SPEC §1.4). Both formats stream
    from the session's skeleton: each line (claude-code) or message (openai,
    ``export_openai``) is encoded and written as it is made, and nodes are read whole a page
    at a time, so memory is bounded by the largest node (openai: turn), not by the session
    (SPEC §9 ``session/export``)."""
    store = engine.store
    info = store.get_session(p.session_id)
    # the session's skeleton, never cached; each node is read whole, a page at a time
    graph, sizes = store.skeleton(p.session_id, tick=stop_if_cancelled)
    head = p.head or info.head
    if head == ROOT_SENTINEL:
        head = graph.root_id
    node = graph.get(head)
    if not graph.is_conversation(node) or is_summary(node):
        raise DagctxError(
            "InvalidParams",
            f"head {head!r} is not a conversation turn (it is a {node.role} node {node.name!r}); export from a "
            "user/llm turn, e.g. a branch tip listed by session/branches",
            node_id=head,
            session_id=p.session_id,
            path="head",
        )
    path = None if p.path is None else os.path.abspath(engine.client_path(p.path))
    produce: Callable[[Callable[[bytes], Any]], int]
    if p.format == "claude-code":
        def produce(write: Callable[[bytes], Any]) -> int:
            def emit(line: dict[str, Any]) -> None:
                write(_enc.encode(line))
                write(b"\n")
                stop_if_cancelled()  # between lines: a cancelled export stops within one node

            return ClaudeCodeExport(engine, info, graph, head, emit, all_branches=p.branches == "all",
                                    sizes=sizes).build()
    else:
        chain = graph.chain(head)
        model = next(
            (n.name for n in reversed(chain) if n.role == "llm" and n.name and n.name != UNKNOWN_MODEL),
            None,
        ) or engine.models.get(engine.options.default_model).name
        del chain

        def produce(write: Callable[[bytes], Any]) -> int:
            return OpenAIExport(store, info.session_id, graph, sizes, head, model).write(write)

    if path is None:
        answer = AnswerText(engine.answer_limit(), p.format)
        count = produce(answer.write)
        return c.ExportResult(format=p.format, lines=count, content=answer.text())
    count = write_atomic(path, produce, p.overwrite)
    return c.ExportResult(format=p.format, lines=count, path=path)


def iso_timestamp(ts: float) -> str:
    """``2026-01-21T15:30:16.888Z``; microseconds only when the value has them, so the
    importer's ``to_epoch`` gives back the same float."""
    dt = datetime.fromtimestamp(ts, tz=timezone.utc)
    spec = "milliseconds" if dt.microsecond % 1000 == 0 else "microseconds"
    return dt.replace(tzinfo=None).isoformat(timespec=spec) + "Z"


class ClaudeCodeExport:
    """Builds the JSONL objects of one branch (see the module docstring)."""

    def __init__(self, engine: Host, info: SessionInfo, graph: SessionGraph, head: str,
                 emit: Callable[[dict[str, Any]], None], all_branches: bool = False,
                 sizes: dict[str, int] | None = None) -> None:
        self.all_branches = all_branches
        #: each node's stored size (``Store.skeleton``): ``graph`` is a skeleton and each
        #: node is read whole, a page at a time, only for its own lines; None: ``graph``
        #: holds the texts
        self.sizes = sizes
        self.store = engine.store
        self.info = info
        self.g = graph
        self.head = head
        self.session_uuid = str(uuid.uuid5(EXPORT_NAMESPACE, f"{info.session_id}:{head}"))
        self.faithful = info.metadata.get("importedFrom") == "claude-code"
        self.usage = {u.node_id: u for u in self.store.usage(info.session_id)}
        #: where each line goes as soon as it is made (nothing keeps the lines)
        self.emit = emit
        self.count = 0
        #: conversation node id → uuid of the line its followers hang from
        self.tail: dict[str, str | None] = {}
        self.exported: set[str] = set()
        self.spawn_queue: list[tuple[Call, str | None]] = []
        self.summaries_at: dict[str, list[Call]] = {}

    # ------------------------------------------------------------ driver

    def build(self) -> int:
        """Emit every line in order; the number of lines."""
        g = self.g
        chain = self._main_nodes() if self.all_branches else g.chain(self.head)
        plan = self._plan(chain)
        self.exported = {n.id for n, _ in plan}
        for s in (n for n in g.by_seq if is_summary(n) and n.status == "completed"):
            covers = s.metadata.get("covers_ids")
            if not self.all_branches and not summary_applies(g, s, chain):
                continue  # made for another branch (SPEC §8): not part of this one
            if isinstance(covers, list) and covers and all(cid in self.exported for cid in covers):
                self.summaries_at.setdefault(covers[-1], []).append(s)
        # The title, and the session this file came from (an import into the same
        # database then answers "already present", SPEC §9).
        self._emit({
            "type": "summary", "summary": self.info.title or "", "leafUuid": self.head,
            "dagctxSource": {"sessionId": self.info.session_id, "head": self.head,
                             "branches": "all" if self.all_branches else "head"},
        })
        whole = NodePages(self.store, self.info.session_id, [i for n, _ in plan for i in self._ids_of(n)],
                          self.sizes) if self.sizes is not None else None
        for node, agent in plan:
            group = whole.take(self._ids_of(node)) if whole is not None else None
            self._conversation_node(node, agent, group)
        return self.count

    def _calls(self, node: Call) -> list[Call]:
        """The tool calls an llm node made (its spawned subagents are branches, not calls)."""
        g = self.g
        return [g.nodes[k] for k in g.callees.get(node.id, ()) if g.nodes[k].role == "code"
                and not is_spawn_root(g.nodes[k])]

    def _ids_of(self, node: Call) -> list[str]:
        """The nodes whose texts ``node``'s lines hold: itself, its calls, its summaries."""
        ids = [node.id]
        if node.role == "llm":
            ids.extend(c.id for c in self._calls(node))
        ids.extend(s.id for s in self.summaries_at.get(node.id, ()))
        return ids

    def _emit(self, line: dict[str, Any]) -> None:
        self.emit(line)
        self.count += 1

    def _main_nodes(self) -> list[Call]:
        """Every conversation node that is not on a spawn branch, in seq order (a
        predecessor always has a lower seq, so each line's parent is written first)."""
        g = self.g
        on_spawn: dict[str, bool] = {}

        def spawned(n: Call) -> bool:
            path: list[str] = []
            cur: Call | None = n
            result = False
            while cur is not None:
                if cur.id in on_spawn:
                    result = on_spawn[cur.id]
                    break
                if is_spawn_root(cur):
                    result = True
                    break
                path.append(cur.id)
                pred = cur.predecessor
                if pred is None or pred == g.root_id:
                    break
                cur = g.nodes.get(pred)
            for nid in path:
                on_spawn[nid] = result
            return result

        return [n for n in g.by_seq if n.id != g.root_id and g.is_conversation(n) and not is_summary(n)
                and n.predecessor is not None and not spawned(n)]

    def _plan(self, chain: list[Call]) -> list[tuple[Call, str | None]]:
        """Every conversation node to write, in writing order, with the subagent id of
        the spawn branch it is on (None on the main branch)."""
        g = self.g
        plan: list[tuple[Call, str | None]] = []
        seen: set[str] = set()
        queue: list[Call] = []

        def visit(n: Call, agent: str | None) -> None:
            plan.append((n, agent))
            seen.add(n.id)
            if n.role != "llm":
                return
            for cid in g.callees.get(n.id, ()):
                callee = g.nodes[cid]
                if is_spawn_root(callee):
                    queue.append(callee)
                elif callee.role == "code":
                    for sid in g.callees.get(cid, ()):
                        if is_spawn_root(g.nodes[sid]):
                            queue.append(g.nodes[sid])

        for n in chain:
            visit(n, _agent_of(n) if n.metadata.get("source") == "subagent" else None)
        while queue:
            root = queue.pop(0)
            if root.id in seen:
                continue
            agent = _agent_of(root)
            stack = [root]
            while stack:
                n = stack.pop()
                if n.id in seen:
                    continue
                visit(n, agent)
                stack.extend(g.nodes[k] for k in reversed(g.conv_children.get(n.id, ())))
        return plan

    # ------------------------------------------------------------ lines

    def _aux(self, node_id: str, kind: str, k: int = 0) -> str:
        return str(uuid.uuid5(EXPORT_NAMESPACE, f"{self.session_uuid}/{node_id}/{kind}/{k}"))

    def _ts(self, node: Call, key: str = "timestamp") -> float | None:
        ts = node.metadata.get(key)
        if isinstance(ts, (int, float)) and not isinstance(ts, bool):
            return float(ts)
        return None if self.faithful else node.created_at

    def _line(self, kind: str, uuid_: str, parent: str | None, ts: float | None, agent: str | None,
              sidechain: bool, **fields: Any) -> dict[str, Any]:
        line: dict[str, Any] = {
            "parentUuid": parent,
            "isSidechain": sidechain,
            "userType": "external",
            "sessionId": self.session_uuid,
        }
        if agent is not None:
            line["agentId"] = agent
        line["type"] = kind
        line.update(fields)
        line["uuid"] = uuid_
        if ts is not None:
            line["timestamp"] = iso_timestamp(ts)
        self._emit(line)
        return line

    def _parent_line(self, node: Call) -> str | None:
        pred = node.predecessor
        if pred is None or pred == self.g.root_id:
            return None
        return self.tail.get(pred)

    def _conversation_node(self, node: Call, agent: str | None, group: dict[str, Call] | None) -> None:
        """``group``: ``node``, its calls and summaries read whole (None: the graph's own)."""
        whole = (lambda n: group.get(n.id, n)) if group is not None else (lambda n: n)
        node = whole(node)
        parent = self._parent_line(node)
        sidechain = agent is not None or node.metadata.get("source") == "subagent"
        if node.role == "user":
            fields: dict[str, Any] = {"message": {"role": "user", "content": _user_content(node)}}
            if node.metadata.get("isMeta"):
                fields["isMeta"] = True
            self._line("user", node.id, parent, self._ts(node), agent, sidechain, **fields)
            self.tail[node.id] = node.id
        elif node.role == "llm":
            self.tail[node.id] = self._llm(node, [whole(c) for c in self._calls(node)], parent, agent, sidechain)
        else:
            # A top-level function call has no Claude Code form: followers hang where it hung.
            self.tail[node.id] = parent
        for s in self.summaries_at.get(node.id, ()):
            self.tail[node.id] = self._summary(whole(s), node, agent, sidechain)

    def _llm(self, node: Call, calls: list[Call], parent: str | None, agent: str | None, sidechain: bool) -> str:
        md = node.metadata
        first: list[Any] = []
        kept = [b for b in md.get("reasoning") or () if isinstance(b, dict) and b.get("type") in (
            "thinking", "redacted_thinking")]
        if kept:
            # the blocks as Claude returned them, signatures included (SPEC §4 metadata.reasoning)
            for b in kept:
                if b["type"] == "thinking":
                    first.append({"type": "thinking", "thinking": b.get("text") or "", "signature": b.get("signature") or ""})
                else:
                    first.append({"type": "redacted_thinking", "data": b.get("data") or ""})
        else:
            if isinstance(md.get("thinking"), str) and md["thinking"]:
                first.append({"type": "thinking", "thinking": md["thinking"], "signature": ""})
            for _ in range(int(md.get("redactedThinking") or 0)):
                first.append({"type": "redacted_thinking", "data": ""})
        for bt in md.get("otherBlocks") or ():
            first.append({"type": bt})
        text = node.output if isinstance(node.output, str) else (
            None if node.output is None else _enc.encode(node.output).decode("utf-8")
        )
        if text:
            first.append({"type": "text", "text": text})

        mid = md.get("messageId") if isinstance(md.get("messageId"), str) else None
        if mid is None and not self.faithful:
            mid = "msg_" + uuid.uuid5(EXPORT_NAMESPACE, node.id).hex
        ts = self._ts(node)

        # line uuid → (blocks, timestamp, calls on the line), in writing order
        lines: dict[str, tuple[list[Any], float | None, list[Call]]] = {node.id: (first, ts, [])}
        for call in calls:
            block = self._tool_use(call)
            m = _ID_LESS_CALL.match(call.id) if call.metadata.get("toolCallId") is None else None
            cts = self._ts(call)
            if m is not None and (m.group(1) in lines or mid is not None):
                # An id-less call: the importer names it after its line and block index.
                lid = m.group(1)
                blocks, _, on_line = lines.setdefault(lid, ([], cts, []))
                _place(blocks, block, int(m.group(2)))
                on_line.append(call)
            elif mid is None or (len(lines) == 1 and not first and cts == ts and m is None):
                # Without a message id the importer cannot merge lines: one line holds all.
                first.append(block)
                lines[node.id][2].append(call)
            else:
                lines[self._aux(call.id, "tool_use")] = ([block], cts, [call])

        row = self.usage.get(node.id)
        usage = row.usage if row is not None else None
        prev = parent
        line_of_call: dict[str, str] = {}
        for i, (lid, (blocks, lts, on_line)) in enumerate(lines.items()):
            message: dict[str, Any] = {"model": node.name or UNKNOWN_MODEL}
            if mid is not None:
                message["id"] = mid
            message.update({"type": "message", "role": "assistant", "content": blocks})
            message["stop_reason"] = md.get("stopReason") if i == len(lines) - 1 else None
            message["stop_sequence"] = None
            if i == 0 and usage is not None:
                message["usage"] = {
                    "input_tokens": usage.input,
                    "cache_creation_input_tokens": usage.cache_write,
                    "cache_read_input_tokens": usage.cache_read,
                    "output_tokens": usage.output,
                }
            fields: dict[str, Any] = {"message": message}
            if i == 0 and node.status == "error" and md.get("apiError"):
                fields["isApiErrorMessage"] = True
            # A node id that is not its tool_use id (the importer's ``#2`` for an id a
            # session repeats) rides beside the message, so re-importing restores it.
            renamed = {
                tid: c.id for c in on_line
                if (tid := self._tool_id(c)) is not None and c.id != tid
            }
            if renamed:
                fields["dagctxToolNodeIds"] = renamed
            self._line("assistant", lid, prev, lts, agent, sidechain, **fields)
            prev = lid
            for call in on_line:
                line_of_call[call.id] = lid
                tid = call.metadata.get("toolCallId")
                for k in range(int(call.metadata.get("progress") or 0)):
                    if not isinstance(tid, str):
                        break
                    self._line(
                        "progress", self._aux(call.id, "progress", k), lid, self._ts(call), agent, sidechain,
                        data={"type": "dagctx_export_progress"}, toolUseID=tid, parentToolUseID=tid,
                    )
        for call in calls:
            if call.status not in ("completed", "error") or call.metadata.get("noResult"):
                continue
            tid = self._tool_id(call)
            output = self.store.full_output(self.info.session_id, call)
            block = {"tool_use_id": tid, "type": "tool_result", "content": _result_content(output),
                     "is_error": call.status == "error"}
            fields = {"message": {"role": "user", "content": [block]}}
            agents = [
                self.g.nodes[k].metadata.get("agentId")
                for k in self.g.callees.get(call.id, ())
                if is_spawn_root(self.g.nodes[k]) and self.g.nodes[k].metadata.get("spawnMatch") == "agentId"
            ]
            if agents and isinstance(agents[0], str):
                fields["toolUseResult"] = {"agentId": agents[0]}
            fields["sourceToolAssistantUUID"] = line_of_call.get(call.id, node.id)
            rid = self._aux(call.id, "tool_result")
            self._line("user", rid, prev, self._ts(call, "endTimestamp"), agent, sidechain, **fields)
            prev = rid
        return prev  # type: ignore[return-value]

    def _tool_id(self, call: Call) -> str | None:
        tid = call.metadata.get("toolCallId")
        if isinstance(tid, str):
            return tid
        if not self.faithful and _TOOL_ID_OK.match(call.id):
            return call.id
        if not self.faithful:
            return "toolu_" + uuid.uuid5(EXPORT_NAMESPACE, call.id).hex
        return None

    def _tool_use(self, call: Call) -> dict[str, Any]:
        block: dict[str, Any] = {"type": "tool_use"}
        tid = self._tool_id(call)
        if tid is not None:
            block["id"] = tid
        block["name"] = call.name
        args = call.input
        if call.metadata.get("argumentsNotJson") and isinstance(args, dict) and "raw" in args:
            args = args["raw"]
        elif args is None:
            args = {}
        elif not isinstance(args, dict) and not self.faithful:
            args = {"input": args}
        block["input"] = args
        return block

    def _summary(self, s: Call, tip: Call, agent: str | None, sidechain: bool) -> str:
        md = s.metadata
        cm = {k: md[k] for k in ("trigger", "preTokens") if md.get(k) is not None}
        ts = self._ts(s)
        text = s.output if isinstance(s.output, str) else "" if s.output is None else _enc.encode(s.output).decode()
        boundary = {
            "logicalParentUuid": tip.id if tip.role in ("user", "llm") else self.tail.get(tip.id),
            "subtype": "compact_boundary",
            "content": text if md.get("summaryMissing") else "Conversation compacted",
            "isMeta": False,
            "level": "info",
        }
        if cm:
            boundary["compactMetadata"] = cm
        if md.get("summaryMissing"):
            self._line("system", s.id, None, ts, agent, sidechain, **boundary)
            return self.tail[tip.id]  # type: ignore[return-value]
        bid = md.get("boundaryUuid") if isinstance(md.get("boundaryUuid"), str) else self._aux(s.id, "boundary")
        self._line("system", bid, None, ts, agent, sidechain, **boundary)
        self._line(
            "user", s.id, bid, ts, agent, sidechain,
            message={"role": "user", "content": text}, isCompactSummary=True, isVisibleInTranscriptOnly=True,
        )
        return s.id


def _agent_of(node: Call) -> str | None:
    a = node.metadata.get("agentId")
    return a if isinstance(a, str) else None


def _place(blocks: list[Any], block: dict[str, Any], index: int) -> None:
    """Put ``block`` at ``index`` (the importer names an id-less call ``<line uuid>:<index>``),
    padding with empty text blocks, which the importer ignores."""
    while len(blocks) < index:
        blocks.append({"type": "text", "text": ""})
    blocks.append(block)


def _user_content(node: Call) -> Any:
    value = node.output if node.output is not None else node.input
    if value is None:
        return ""
    if isinstance(value, (str, list)):
        return value
    return _enc.encode(value).decode("utf-8")


def _result_content(output: Any) -> Any:
    if output is None:
        return ""
    if isinstance(output, (str, list)):
        return output
    return _enc.encode(output).decode("utf-8")
