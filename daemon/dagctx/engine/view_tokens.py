"""Token counts and reference lists of the nodes a view shows, read once and cached.

The part of ``ContextService`` (``engine/views.py``) that turns stored per-node counts
into per-message counts (no re-tokenizing) and keeps each session's ranked reference
lists (SPEC §8) for aging. Caches only what the ledger can rebuild.
"""

from __future__ import annotations

import logging
import sys
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from dagctx.context import aging, formats
from dagctx.context.cancel import stop_if_cancelled
from dagctx.context.char_classes import CharClasses, classes_from_stored_many
from dagctx.context.tokens import ESTIMATE
from dagctx.context.view import Item
from dagctx.context.render_items import added_text
from dagctx.ledger import SessionGraph
from dagctx.ledger.graph import is_summary
from dagctx.protocol.errors import DagctxError

log = logging.getLogger("dagctx.engine")

if TYPE_CHECKING:
    from .ports import ViewHost


class StoredChars:
    """One session's stored character counts (``node_chars``): the lineage of the graph
    they were read for (``SessionGraph.lineage``), how many of its replacements
    (``SessionGraph.updates``) were seen, and node id → kept counts."""

    __slots__ = ("lineage", "seen", "chars")

    def __init__(self, graph: SessionGraph, chars: dict[str, bytes]) -> None:
        self.lineage = graph.lineage
        self.seen = len(graph.updates)
        self.chars = chars


#: texts at least this long have their token counts remembered (``count_text``)
LONG_TEXT = 2_000
TEXTS_REMEMBERED = 2_048


class TokenAccounting:
    """Per-node and per-message token counts, and reference lists, for the views."""

    e: ViewHost
    _tokens: dict[tuple[str, str], dict[str, tuple[int, int]]]
    _updates_seen: dict[tuple[str, str], tuple[object, int]]
    _refs: dict[str, dict[str, list[str]]]
    _refs_seen: dict[str, tuple[int, int, object]]
    _text_tokens: OrderedDict[tuple[str, str], int]
    _chars: dict[str, StoredChars]

    def count_text(self, text: str, tokenizer: str) -> int:
        """Tokens of a derived text (an aged replacement), counted once: aging counts a
        capped result while cutting it, again as its replacement and the render counts
        it a third time — each a full tokenization of up to a quarter of the window."""
        if len(text) < LONG_TEXT:
            return self.e.counter.count(text, tokenizer)
        key = (tokenizer, text)
        n = self._text_tokens.get(key)
        if n is None:
            n = self.e.counter.count(text, tokenizer)
            self._text_tokens[key] = n
            while len(self._text_tokens) > TEXTS_REMEMBERED:
                self._text_tokens.popitem(last=False)
        return n


    def node_tokens(self, graph: SessionGraph, tokenizer: str) -> dict[str, tuple[int, int]]:
        """Stored (input, output) counts of every node, loaded once per session/tokenizer
        (with the stored character counts, ``node_chars``, from the same rows)."""
        key = (graph.session_id, tokenizer)
        cache = self._tokens.get(key)
        lineage, seen = self._updates_seen.get(key, (None, 0))
        # read again when the counts are of another lineage of the graph (``SessionGraph.lineage``:
        # its nodes were read anew, any of them may have changed), or when the graph had fewer
        # replacements than seen (the compaction's candidate copy starts with none)
        if cache is None or lineage is not graph.lineage or len(graph.updates) < seen:
            chars: dict[str, bytes] = {}
            cache = self.e.store.token_counts(graph.session_id, tokenizer, tick=stop_if_cancelled, chars=chars)
            self._tokens[key] = cache
            self._chars[graph.session_id] = StoredChars(graph, chars)
            seen = 0
        if len(graph.updates) > seen:
            # A running node finished (here or in another process): its output changed,
            # so its cached count is stale; it is recounted from the stored node.
            for nid in graph.updates[seen:]:
                cache.pop(nid, None)
        self._updates_seen[key] = (graph.lineage, len(graph.updates))
        return cache

    def node_chars(self, graph: SessionGraph) -> dict[str, bytes]:
        """The stored character counts of the session's nodes (``NodeDerived.chars``; rows
        written without them are absent), read with the token counts (``node_tokens``)
        and, like them, forgotten for a node the one mutation replaced since; read again
        for another lineage of the graph (``SessionGraph.lineage``)."""
        sid = graph.session_id
        got = self._chars.get(sid)
        if got is None or got.lineage is not graph.lineage or len(graph.updates) < got.seen:
            chars: dict[str, bytes] = {}
            self.e.store.token_counts(sid, ESTIMATE, tick=stop_if_cancelled, chars=chars)
            got = self._chars[sid] = StoredChars(graph, chars)
        if len(graph.updates) > got.seen:
            for nid in graph.updates[got.seen:]:
                got.chars.pop(nid, None)
            got.seen = len(graph.updates)
        return got.chars

    def body_classes(self, graph: SessionGraph,
                     ) -> Callable[[Sequence[Item], Sequence[str]], list[CharClasses | None]] | None:
        """What a compaction's transcript (``summary_transcript.Transcript``) may take as
        measured: for each item and its body, the body's character counts when the body
        is its node's input or output text itself (the render hands the node's string on)
        and that text's counts were stored when the node was written
        (``EngineCore.derive_node``), else None (measured then). Only a finished node's:
        a running node's output is the one thing that changes (SPEC §4), so the counts
        stored for a finished one are of the text the graph holds (and counts of another
        length are never taken). A transcript asks about thousands of items: the loop only
        matches them, and the kept counts are unpacked all at once. None when the session
        has no counts kept (written before they were): nothing to look up."""
        chars = self.node_chars(graph)
        if not chars:
            return None
        nodes_get = graph.nodes.get
        chars_get = chars.get

        def known(items: Sequence[Item], bodies: Sequence[str]) -> list[CharClasses | None]:
            out: list[CharClasses | None] = [None] * len(bodies)
            at: list[int] = []
            halves: list[bytes] = []
            for k, (item, body) in enumerate(zip(items, bodies)):
                nid = item.node_id
                kept = chars_get(nid)
                if kept is None or len(kept) != 32:
                    continue
                node = nodes_get(nid)
                if node is None or node.status == "running":
                    continue
                if body is node.output:
                    half = slice(16, 32)
                elif body is node.input:
                    half = slice(0, 16)
                else:
                    continue
                at.append(k)
                halves.append(kept[half])
            for k, got in zip(at, classes_from_stored_many(b"".join(halves))):
                if got[0] == len(bodies[k]):
                    out[k] = got
            return out

        return known

    def refs_of(self, graph: SessionGraph, mined: dict[str, list[str]] | None = None) -> Callable[[str], list[str]]:
        """A code node's ranked references (SPEC §8): stored at write time, read once per
        session and then only for nodes appended or finished since (by any process); a node
        without them (written before schema version 2) is mined once, kept in memory and
        added to ``mined`` for ``keep_mined`` to store. Read on the first question: a plan
        whose results all stay (too young, too recent) never asks one."""
        box: list[dict[str, list[str]]] = []

        def refs_of(node_id: str) -> list[str]:
            if not box:
                box.append(self._stored_refs(graph))
            cache = box[0]
            got = cache.get(node_id)
            if got is None:
                got = cache[node_id] = [sys.intern(r) for r in aging.stored_references(graph.nodes[node_id].output)]
                if mined is not None:
                    mined[node_id] = got
            return got

        return refs_of

    def _stored_refs(self, graph: SessionGraph) -> dict[str, list[str]]:
        """The session's cached reference lists, brought up to date with ``graph``."""
        sid = graph.session_id
        store = self.e.store
        cache = self._refs.get(sid)
        upto, seen, lineage = self._refs_seen.get(sid, (-1, 0, None))
        newest = graph.by_seq[-1].seq if graph.by_seq else -1  # before reading: re-read, never skip
        # first use, or the graph was read anew (``SessionGraph.lineage``)
        if cache is None or lineage is not graph.lineage or len(graph.updates) < seen:
            cache = self._refs[sid] = _interned(store.reference_lists(sid, tick=stop_if_cancelled))
        else:
            if newest > upto:
                cache.update(_interned(store.reference_lists(sid, after_seq=upto)))
            finished = graph.updates[seen:]
            if finished:  # a running node got its output: what is stored now is its list
                for nid in finished:
                    cache.pop(nid, None)
                cache.update(_interned(store.reference_lists(sid, ids=list(dict.fromkeys(finished)))))
        self._refs_seen[sid] = (newest, len(graph.updates), graph.lineage)
        return cache

    def keep_mined(self, session_id: str, mined: dict[str, list[str]]) -> None:
        """Store references mined during a plan, so the next daemon does not mine them again.
        A derived write: a read-only or failing database only costs that next daemon the
        mining, never this render."""
        try:
            self.e.store.fill_references(session_id, mined)
        except DagctxError as err:
            log.info("references mined for %d nodes not stored (%s)", len(mined), err.kind)

    def counts_of(self, graph: SessionGraph, node_id: str, tokenizer: str,
                  cache: dict[str, tuple[int, int]] | None = None) -> tuple[int, int]:
        """(input, output) tokens of one node: stored at append, else counted once and kept
        (an import, a tokenizer added later, or a node another process finished)."""
        cache = self.node_tokens(graph, tokenizer) if cache is None else cache
        counts = cache.get(node_id)
        if counts is None:
            node = graph.nodes[node_id]
            cv = self.e.counter.count_value
            counts = (cv(node.input, tokenizer), cv(node.output, tokenizer))
            cache[node_id] = counts
        return counts

    def _part_tokens(self, graph: SessionGraph, node_id: str, assistant: bool, tokenizer: str,
                     cache: dict[str, tuple[int, int]], aged: dict[str, str],
                     synthetic: dict[str, str] | None = None) -> int:
        node = graph.nodes.get(node_id)
        if node is None:
            # a request checkpoint (SPEC §8) stands in a message under its own id
            return self.e.counter.count(synthetic[node_id], tokenizer) if synthetic and node_id in synthetic else 0
        tin, tout = self.counts_of(graph, node_id, tokenizer, cache)
        count = self.e.counter.count
        if node.role == "code":
            if assistant:
                return tin
            # Status markers and placeholders are text the model reads (SPEC §6).
            extra = count(added_text(node, "result", node_id in aged), tokenizer)
            if node_id in aged:
                return self.count_text(aged[node_id], tokenizer) + extra
            return tout + extra
        if node.role == "llm" and not assistant and graph.is_nested(node):
            return tin  # an inner llm call's prompt, shown as a user message
        own = tout if node.output is not None else tin
        if node.role == "llm" and is_summary(node):
            return own + count(added_text(node, "summary"), tokenizer)
        if node.role == "llm" and node.status in ("error", "cancelled"):
            return own + count(added_text(node, "reply"), tokenizer)
        return own

    def count_messages(self, graph: SessionGraph, messages: list[Any], node_ids: list[list[str]],
                       tokenizer: str, aged: dict[str, str], synthetic: dict[str, str] | None = None,
                       *, fmt: str = "neutral") -> list[int]:
        """Per-message tokens from stored per-node counts (no re-tokenizing) + framing."""
        cache = self.node_tokens(graph, tokenizer)
        overhead = self.e.counter.message_overhead(tokenizer)
        text_of = formats.get(fmt).message_text  # a message of no node: its own text
        out = []
        for msg, ids in zip(messages, node_ids):
            stop_if_cancelled()  # SPEC §1.4: within one message of a cancel
            assistant = isinstance(msg, dict) and msg.get("role") == "assistant"
            n = overhead
            for nid in ids:
                n += self._part_tokens(graph, nid, assistant, tokenizer, cache, aged, synthetic)
            if not ids and isinstance(msg, dict):
                n += self.e.counter.count(text_of(msg), tokenizer)
            out.append(n)
        return out


def _interned(lists: dict[str, list[str]]) -> dict[str, list[str]]:
    """Reference lists with each string interned: the same paths and names recur across a
    session's results, so a session of 10,000 results keeps one copy of its vocabulary
    (about a third of the memory of separate strings, measured on bench_aging_huge)."""
    intern = sys.intern
    out: dict[str, list[str]] = {}
    for k, (nid, refs) in enumerate(lists.items()):
        if not k & 511:
            stop_if_cancelled()
        out[nid] = list(map(intern, refs))
    return out


