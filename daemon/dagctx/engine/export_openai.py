"""``session/export`` in the ``openai`` format, streamed (SPEC §9): memory bounded by the
largest turn, not by the session.

The file is ``{"model", "messages"}`` laid out by ``msgspec.json.format(indent=2)`` with a
trailing newline: ``context/render`` of the head in the OpenAI format (no aging, the
branch's active summary, its system prompt). It is byte for byte the whole render's
document, but never built whole:

* the branch is walked on the session's skeleton (``Store.skeleton``: edges and metadata,
  no texts, never cached), which decides the branch, its active summary (SPEC §8) and its
  system prompt the way ``render.render_view`` does;
* the walk goes a *segment* at a time: a run of chain nodes (each with the part of its
  caller subtree a render shows) whose stored bodies fit ``budget`` bytes, or one such
  node when it alone is larger. A segment's nodes are read whole (``Store.nodes_of``, in
  pages of ``budget``), turned into view items by the render's own ``ItemWriter``, and fed
  to the formats' ``Assembler``, whose tool call ids are unique across the whole branch;
* the messages the assembler says are final (all but an assistant message whose tool
  call group may still grow into the next segment) are built by the OpenAI format a
  chunk at a time and written, each encoded and indented as it is made, then dropped.

What is held at once: the skeleton, one segment's nodes and items, and the message of a
tool call group still open at a segment's end.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, cast

import msgspec

from dagctx.context import formats
from dagctx.context.cancel import stop_if_cancelled
from dagctx.context.formats._assembly import Assembler
from dagctx.context.render import system_text_of
from dagctx.context.render_items import ItemWriter
from dagctx.context.summary_choice import active_summary, beside_chain, is_chain_member, select_system_node, \
    summary_candidates
from dagctx.context.view import View
from dagctx.ledger import SessionGraph
from dagctx.ledger.store import Store, pages_of
from dagctx.protocol.nodes import Call

__all__ = ["OpenAIExport"]

_enc = msgspec.json.Encoder()
_INF = float("inf")
FORMAT = formats.get("openai")
# every piece is built without the rest of the branch only because Chat Completions takes no
# reasoning back: no message depends on where the branch's newest user turn is (SPEC §6)
assert not FORMAT.takes_reasoning_back


class _WholeNodes(Mapping[str, Call]):
    """``graph.nodes`` as the item writer reads it: the current segment's nodes whole, and
    a node the segment's reading missed read whole alone (counted in ``read_alone``). Chain
    members and summary/system-prompt nodes are only ever filtered out by the writer, so
    their skeleton is enough."""

    def __init__(self, skeleton: SessionGraph, load: Callable[[str], Call]) -> None:
        self.skeleton = skeleton
        self.load = load
        self.whole: dict[str, Call] = {}
        self.read_alone = 0

    def __getitem__(self, node_id: str) -> Call:
        node = self.whole.get(node_id)
        if node is not None:
            return node
        node = self.skeleton.nodes[node_id]
        if beside_chain(node) or is_chain_member(self.skeleton, node):
            return node
        node = self.whole[node_id] = self.load(node_id)
        self.read_alone += 1
        return node

    def __iter__(self) -> Iterator[str]:
        return iter(self.skeleton.nodes)

    def __len__(self) -> int:
        return len(self.skeleton.nodes)


class _SegmentGraph:
    """What ``ItemWriter`` reads of a ``SessionGraph``: the skeleton's edges, whole nodes."""

    def __init__(self, skeleton: SessionGraph, nodes: _WholeNodes) -> None:
        self.nodes = nodes
        self.callees = skeleton.callees
        self.root_id = skeleton.root_id
        self.is_conversation = skeleton.is_conversation
        self.is_nested = skeleton.is_nested


class OpenAIExport:
    """One branch written as the OpenAI rendering's document (see the module docstring)."""

    def __init__(self, store: Store, session_id: str, skeleton: SessionGraph, sizes: dict[str, int], head: str,
                 model: str, budget: int = 256 << 10) -> None:
        self.store, self.session_id, self.g, self.sizes = store, session_id, skeleton, sizes
        self.head, self.model, self.budget = head, model, budget
        self.nodes = _WholeNodes(skeleton, self._read_one)
        #: how many segments were written, and how many nodes the walk had to read alone
        #: (zero: every node a segment shows was read with it)
        self.segments = 0

    @property
    def read_alone(self) -> int:
        return self.nodes.read_alone

    def _read_one(self, node_id: str) -> Call:
        return self.store.nodes_of(self.session_id, [node_id])[node_id]

    def _read(self, ids: list[str]) -> dict[str, Call]:
        out: dict[str, Call] = {}
        for page in pages_of([(i, self.sizes.get(i, 0)) for i in ids], self.budget):
            out.update(self.store.nodes_of(self.session_id, page))
        return out

    def write(self, write: Callable[[bytes], Any]) -> int:
        """Write the document through ``write``; the number of messages."""
        g = self.g
        chain = g.chain(self.head)
        stop_if_cancelled()
        writer = ItemWriter(cast(SessionGraph, _SegmentGraph(g, self.nodes)), expose_default="io", aged={},
                            before_seq=_INF, frame=None, frame_set=frozenset(), open_ids=frozenset())
        shape = ItemWriter(g, expose_default="io", aged={}, before_seq=_INF, frame=None, frame_set=frozenset(),
                           open_ids=frozenset())
        # the render's rule: the summary the branch uses (SPEC §8), the newest system prompt
        active: Call | None = None
        seg = (0, -1)
        if chain:
            picked = active_summary(g, chain, summary_candidates(g))
            if picked is not None:
                active, seg, _ = picked
        sys_node = select_system_node(g, g.get(self.head).seq)
        system = system_id = None
        if sys_node is not None:
            system_id = sys_node.id
            system = system_text_of(self._read([sys_node.id])[sys_node.id])
        stub = View(head=self.head, items=[], reads=[], turns=[], system=system, system_node=system_id)

        count = 0

        def out(msgs: list[Any], include_system: bool = False) -> None:
            nonlocal count
            messages, _ = FORMAT.build(stub, msgs, [], include_system=include_system)
            for m in messages:
                body = msgspec.json.format(_enc.encode(m), indent=2).replace(b"\n", b"\n    ")
                write((b",\n    " if count else b"\n    ") + body)
                count += 1
                stop_if_cancelled()  # between messages: a cancelled export stops within one message

        write(b'{\n  "model": ' + msgspec.json.format(_enc.encode(self.model)) + b',\n  "messages": [')
        out([], include_system=True)
        asm = Assembler()
        for units in self._segments(chain, active, seg, shape):
            stop_if_cancelled()
            self.nodes.whole = self._read([i for _, _, ids in units for i in ids])
            for node, covered_users, _ in units:
                whole = self.nodes.whole.get(node.id) or self._read_one(node.id)
                if covered_users is None:
                    writer.chain_node(whole)
                else:
                    writer.summary(whole, covered_users)
            items, writer.items = writer.items, []
            writer.repairs.clear()
            asm.feed(items)
            del items
            self.nodes.whole = {}
            out(asm.ready())
            asm.repairs.clear()
            self.segments += 1
        out(asm.finish())
        write(b"\n  ]\n}\n" if count else b"]\n}\n")
        return count

    def _segments(self, chain: list[Call], active: Call | None, seg: tuple[int, int],
                  shape: ItemWriter) -> Iterator[list[tuple[Call, int | None, list[str]]]]:
        """Runs of ``(chain node or active summary, covered user turns or None, ids it
        shows)`` whose stored sizes fit the budget (or one that alone does not)."""
        run: list[tuple[Call, int | None, list[str]]] = []
        used = 0
        i = 0
        while i < len(chain):
            if active is not None and i == seg[0]:
                covered = sum(1 for n in chain[seg[0]: seg[1] + 1] if n.role == "user")
                unit: tuple[Call, int | None, list[str]] = (active, covered, [active.id])
                i = seg[1] + 1
            else:
                unit = (chain[i], None, _shown_ids(shape, chain[i]))
                i += 1
            size = sum(self.sizes.get(k, 0) for k in unit[2])
            if run and used + size > self.budget:
                yield run
                run, used = [], 0
            run.append(unit)
            used += size
        if run:
            yield run


def _shown_ids(w: ItemWriter, node: Call) -> list[str]:
    """``node`` and the nodes of its caller subtree a render walks (``ItemWriter``): an llm
    node's callees, a code node's only when it shows its insides, a user chain node's."""
    out: list[str] = []
    stack = [(node, True)]
    while stack:
        n, top = stack.pop()
        out.append(n.id)
        if n.role == "llm" or (top and n.role == "user") or (n.role == "code" and w.shows_insides(n)):
            stack.extend((c, False) for c in reversed(w.callees(n.id)))
    return out
