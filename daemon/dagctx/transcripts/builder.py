"""``Builder``: how an importer turns records into nodes that satisfy the ledger's rules,
plus the stable topological order and the default title.
"""

from __future__ import annotations

import heapq
import re
import tempfile
from contextvars import ContextVar
from collections.abc import Callable, Hashable, Iterable
from typing import Any

import msgspec

from dagctx.protocol.context_messages import Skipped, Usage
from dagctx.protocol.nodes import SUMMARY_NAME, SYSTEM_PROMPT_NAME, NodeInput

from .base import (_COUNT_KEYS, BESIDE_CHAIN_NAMES, ROOT, UNKNOWN_MODEL, SpilledOutput, Transcript, is_beside_chain,
                   is_spawn_root, unspilled)
from .values import one_line, text_of_blocks


# --------------------------------------------------------------------------- ordering


def stable_topo(items: list[Any], deps: Callable[[Any], Iterable[Hashable]], ident: Callable[[Any], Hashable]) -> list[Any]:
    """Order ``items`` so each comes after the items it depends on, otherwise keeping
    the given order. Unknown dependencies are ignored; a cycle is broken in input order."""
    index = {ident(it): i for i, it in enumerate(items)}
    waiting: dict[int, int] = {}
    dependents: dict[int, list[int]] = {}
    for i, it in enumerate(items):
        n = 0
        for d in deps(it):
            j = index.get(d)
            if j is None or j == i:
                continue
            dependents.setdefault(j, []).append(i)
            n += 1
        waiting[i] = n
    heap = [i for i, n in waiting.items() if n == 0]
    heapq.heapify(heap)
    out: list[int] = []
    done = [False] * len(items)
    while len(out) < len(items):
        if not heap:  # cycle: release the earliest item still waiting
            i = min(k for k in range(len(items)) if not done[k])
            waiting[i] = 0
            heapq.heappush(heap, i)
        i = heapq.heappop(heap)
        if done[i]:
            continue
        done[i] = True
        out.append(i)
        for k in dependents.get(i, ()):
            waiting[k] -= 1
            if waiting[k] == 0 and not done[k]:
                heapq.heappush(heap, k)
    return [items[i] for i in out]


#: Node bodies (tool results, user and model texts, summaries, system prompts) and the
#: message contents of the lines a parser holds whose JSON is longer than this many bytes
#: are kept aside in a private temporary file while a transcript is read
#: (``SpilledOutput``); None (the default, for tools and tests that read
#: ``Transcript.nodes`` directly): every output stays in memory.
#: ``session/import`` sets it so its memory is bounded by the largest node (SPEC §9).
SPILL_OVER: ContextVar[int | None] = ContextVar("dagctx_transcript_spill_over", default=None)


class Builder:
    """Collects nodes for one transcript and finishes them into a ``Transcript``.

    Parsers add nodes with a sort key (their position in the source); ``finish`` sorts by
    key, then fixes the order so every node follows its caller, predecessor and covered
    nodes, picks the head and fills ``counts``.
    """

    def __init__(self, fmt: str) -> None:
        self.format = fmt
        self.nodes: list[NodeInput] = []
        self.by_id: dict[str, NodeInput] = {}
        self._keys: dict[str, tuple] = {}
        self._last_ts: dict[str, float] = {}
        self._tool_calls: set[str] = set()
        self._paired: set[str] = set()
        self.usage: dict[str, Usage] = {}
        self.skipped: list[Skipped] = []
        self.counts: dict[str, int] = {}
        self._spill_over = SPILL_OVER.get()
        self._spill: Any = None  # the temporary file, opened on the first spilled result

    # -- ids and nodes

    def unique(self, base: str) -> str:
        if base not in self.by_id:
            return base
        n = 2
        while f"{base}#{n}" in self.by_id:
            n += 1
        return f"{base}#{n}"

    def add(self, node: NodeInput, key: tuple | None = None) -> NodeInput:
        assert node.id is not None and node.id not in self.by_id, node.id
        if self._spill_over is not None:
            # a large body, tool call input or thinking text waits on disk, not in memory
            node.output = self.keep(node.output)
            node.input = self.keep(node.input)
            if "thinking" in node.metadata:
                node.metadata["thinking"] = self.keep(node.metadata["thinking"])
        self.nodes.append(node)
        self.by_id[node.id] = node
        self._keys[node.id] = key if key is not None else (len(self.nodes),)
        ts = node.metadata.get("timestamp")
        if isinstance(ts, (int, float)):
            self.touch(node.id, ts)
        return node

    def touch(self, node_id: str, ts: float | None) -> None:
        """Record activity on a node (the newest activity decides which tip is HEAD)."""
        if ts is None:
            return
        old = self._last_ts.get(node_id)
        if old is None or ts > old:
            self._last_ts[node_id] = ts

    def user(self, node_id: str, output: Any, predecessor: str | None, key: tuple | None = None, **metadata: Any) -> NodeInput:
        md = {k: v for k, v in metadata.items() if v is not None}
        return self.add(NodeInput(role="user", id=node_id, output=output, predecessor=predecessor, metadata=md), key)

    def llm(self, node_id: str, model: str | None, predecessor: str | None, output: Any = "", key: tuple | None = None, **metadata: Any) -> NodeInput:
        md = {k: v for k, v in metadata.items() if v is not None}
        return self.add(
            NodeInput(role="llm", id=node_id, name=model or UNKNOWN_MODEL, output=output, predecessor=predecessor, metadata=md),
            key,
        )

    def system_prompt(self, node_id: str, text: Any, key: tuple | None = None, **metadata: Any) -> NodeInput:
        md = {"imported": True, **{k: v for k, v in metadata.items() if v is not None}}
        return self.add(
            NodeInput(role="llm", id=node_id, name=SYSTEM_PROMPT_NAME, output=text, predecessor=ROOT, metadata=md), key
        )

    def tool_call(
        self,
        node_id: str,
        name: str,
        args: dict,
        caller: str,
        call_id: str | None,
        key: tuple | None = None,
        **metadata: Any,
    ) -> NodeInput:
        """A tool call waiting for its result: cancelled + noResult until one is attached."""
        md: dict[str, Any] = {}
        if call_id is not None:
            md["toolCallId"] = call_id
        md["noResult"] = True
        md.update({k: v for k, v in metadata.items() if v is not None})
        node = NodeInput(role="code", id=node_id, name=name or "", input=args, output=None, status="cancelled", caller=caller, metadata=md)
        self._tool_calls.add(node_id)
        return self.add(node, key)

    def hosted_call(self, node_id: str, name: str, args: dict, caller: str, status: str, key: tuple | None = None, **metadata: Any) -> NodeInput:
        """A provider-side tool (web search) that has no separate result record."""
        md = {"hostedTool": True, **{k: v for k, v in metadata.items() if v is not None}}
        st = status if status in ("completed", "error", "cancelled") else "completed"
        node = NodeInput(role="code", id=node_id, name=name, input=args, output=None, status=st, caller=caller, metadata=md)  # type: ignore[arg-type]
        self._tool_calls.add(node_id)
        return self.add(node, key)

    def has_result(self, node_id: str) -> bool:
        return node_id in self._paired

    def attach_result(self, node_id: str, output: Any, *, error: bool = False, ts: float | None = None, **metadata: Any) -> None:
        node = self.by_id[node_id]
        node.output = self.keep(output)
        node.status = "error" if error else "completed"
        node.metadata.pop("noResult", None)
        if ts is not None:
            node.metadata["endTimestamp"] = ts
        node.metadata.update({k: v for k, v in metadata.items() if v is not None})
        self._paired.add(node_id)
        if node.caller is not None and ts is not None:
            self.touch(node.caller, ts)

    @property
    def spills(self) -> bool:
        """True when large tool results are kept aside (``SPILL_OVER`` is set)."""
        return self._spill_over is not None

    def keep(self, output: Any) -> Any:
        """``output``, or a ``SpilledOutput`` when it is over ``SPILL_OVER`` bytes (a parser
        may call it as it reads, so a large result never waits in memory for its call, nor a
        large text for the rest of its turn)."""
        limit = self._spill_over
        if limit is None or output is None or isinstance(output, SpilledOutput) or (isinstance(output, str) and len(output) * 6 + 2 <= limit):  # JSON escapes a char to ≤ 6 bytes
            return output
        data = msgspec.json.encode(output)
        if len(data) <= limit:
            return output
        if self._spill is None:
            # 0600 and unlinked at once (SPEC §1: private files); closed when the last
            # SpilledOutput of this transcript is gone
            self._spill = tempfile.TemporaryFile(prefix="dagctx-import-")
        f = self._spill
        f.seek(0, 2)
        offset = f.tell()
        f.write(data)
        return SpilledOutput(f, offset, len(data))

    def set_usage(self, llm_id: str, input: int = 0, output: int = 0, cache_read: int = 0, cache_write: int = 0) -> None:
        self.usage[llm_id] = Usage(input=int(input or 0), output=int(output or 0),
                                   cache_read=int(cache_read or 0), cache_write=int(cache_write or 0))

    # -- chains and summaries

    def chain_ids(self, tip: str | None) -> list[str]:
        """Chain nodes from the chain's start to ``tip`` (oldest first, ROOT excluded)."""
        out: list[str] = []
        seen: set[str] = set()
        cur = tip
        while cur is not None and cur != ROOT and cur not in seen:
            seen.add(cur)
            node = self.by_id.get(cur)
            if node is None:
                break
            if not is_beside_chain(node):
                out.append(cur)
            if is_spawn_root(node):
                break
            cur = node.predecessor
        out.reverse()
        return out

    def summary(
        self,
        node_id: str,
        text: Any,
        covers: list[str],
        line: int,
        key: tuple | None = None,
        **metadata: Any,
    ) -> NodeInput | None:
        """A compaction summary: ``predecessor`` is that of the first covered node.

        A compaction that covers no conversation node replaces nothing (and the ledger
        refuses a summary without ``covers_ids``): it is reported as skipped instead.
        """
        if not covers:
            self.skipped.append(Skipped(line, "compaction that covers no conversation node"))
            self.counts["emptyCompactions"] = self.counts.get("emptyCompactions", 0) + 1
            return None
        pred = self.by_id[covers[0]].predecessor
        md: dict[str, Any] = {"compaction": True, "covers_ids": list(covers)}
        md.update({k: v for k, v in metadata.items() if v is not None})
        node = NodeInput(role="llm", id=node_id, name=SUMMARY_NAME, output=text, predecessor=pred, metadata=md)
        if pred is None:
            # The covered segment starts at a spawn root: the summary hangs off the same caller.
            node.caller = self.by_id[covers[0]].caller
        return self.add(node, key)

    # -- finishing

    def _ordered(self) -> list[NodeInput]:
        nodes = sorted(self.nodes, key=lambda n: self._keys[n.id])

        def deps(n: NodeInput) -> list[str]:
            d = [x for x in (n.caller, n.predecessor) if x and x != ROOT]
            d.extend(n.metadata.get("covers_ids") or ())
            return d

        return stable_topo(nodes, deps, lambda n: n.id)

    def pick_head(self, ordered: list[NodeInput]) -> str | None:
        position = {n.id: i for i, n in enumerate(ordered)}
        conv = [n for n in ordered if not is_beside_chain(n) and (n.predecessor is not None or is_spawn_root(n))]
        conv_ids = {n.id for n in conv}
        has_child: set[str] = set()
        for n in conv:
            if n.predecessor in conv_ids:
                has_child.add(n.predecessor)  # type: ignore[arg-type]
        # Tips that are on the main tree (their chain reaches ROOT, not a spawn root).
        start: dict[str, bool] = {}

        def reaches_root(nid: str) -> bool:
            path: list[str] = []
            cur: str | None = nid
            result = False
            while cur is not None:
                if cur in start:
                    result = start[cur]
                    break
                if cur == ROOT:
                    result = True
                    break
                node = self.by_id.get(cur)
                if node is None or is_spawn_root(node):
                    result = False
                    break
                path.append(cur)
                cur = node.predecessor
            for p in path:
                start[p] = result
            return result

        tips = [n for n in conv if n.id not in has_child and reaches_root(n.id)]
        if not tips:
            return None
        best = max(tips, key=lambda n: (self._last_ts.get(n.id, float("-inf")), position[n.id]))
        return best.id

    def finish(self, source_key: str, title: str | None, head: str | None = None, *, auto_head: bool = True) -> Transcript:
        ordered = self._ordered()
        position = {n.id: i for i, n in enumerate(ordered)}
        if head is None and auto_head:
            head = self.pick_head(ordered)
        counts = {k: 0 for k in _COUNT_KEYS}
        counts.update(self.counts)
        counts["nodes"] = len(ordered)
        counts["toolCalls"] = len(self._tool_calls)
        counts["toolPairs"] = len(self._paired)
        counts["compactions"] = sum(1 for n in ordered if n.role == "llm" and n.name == SUMMARY_NAME)
        counts["systemPrompts"] = sum(1 for n in ordered if n.role == "llm" and n.name == SYSTEM_PROMPT_NAME)
        counts["spawnBranches"] = sum(1 for n in ordered if is_spawn_root(n))
        counts["userTurns"] = sum(1 for n in ordered if n.role == "user")
        counts["llmCalls"] = sum(1 for n in ordered if n.role == "llm" and n.name not in BESIDE_CHAIN_NAMES)
        counts["skipped"] = len(self.skipped)
        if not title:
            title = default_title(ordered)
        return Transcript(
            format=self.format,
            source_key=source_key,
            title=title,
            nodes=ordered,
            head=head,
            usage={k: self.usage[k] for k in sorted(self.usage, key=lambda i: position.get(i, len(ordered)))},
            skipped=list(self.skipped),
            counts=counts,
        )


_LEADING_TAGS = re.compile(r"^(?:\s*<([A-Za-z][\w:-]*)[^>]*>.*?</\1>)+", re.S)


def default_title(nodes: Iterable[NodeInput]) -> str:
    """The first real (not injected, not meta) user text, minus leading ``<tag>…</tag>``
    blocks that agents wrap around it (IDE context, slash-command echoes)."""
    for n in nodes:
        if n.role != "user" or n.metadata.get("injected") or n.metadata.get("isMeta"):
            continue
        out = unspilled(n.output)
        text = out if isinstance(out, str) else text_of_blocks(out, " ") if isinstance(out, list) else ""
        text = _LEADING_TAGS.sub("", text).strip()
        if text:
            return one_line(text)
    return "Imported session"
