"""An in-memory index of one session's DAG: nodes by id and both edge maps.

The store keeps one ``SessionGraph`` per session and feeds it the rows that changed
(by revision), so walks never touch SQL and a render costs what changed, not the
whole session. Walks follow edges only (SPEC §4): no seq splicing, no caller
fallback, no guessing. A chain that ends illegally raises ``BrokenPredecessorChain``.

Architecture Invariant: this module does no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable

from dagctx.protocol.errors import DagctxError
from dagctx.protocol.nodes import SUMMARY_NAME, SYSTEM_PROMPT_NAME, Call

#: Names of pipeline nodes that sit beside the chain and are never branch tips.
_BESIDE_CHAIN = frozenset({SUMMARY_NAME, SYSTEM_PROMPT_NAME})


def is_spawn_root(node: Call) -> bool:
    return bool(node.metadata.get("spawn_branch_root"))


def is_summary(node: Call) -> bool:
    return node.role == "llm" and node.name == SUMMARY_NAME


class SessionGraph:
    """Nodes of one session plus ``predecessor`` and ``caller`` child lists in seq order."""

    __slots__ = (
        "session_id", "root_id", "nodes", "conv_children", "callees", "rev", "by_seq", "updates",
        "summaries", "system_prompts", "_chain_head", "_chain_ids", "_chain_pos", "_chain_nodes", "_chain_seen",
        "nbytes", "used_at", "lineage",
        "_shape", "_main", "__weakref__",
    )

    def __init__(self, session_id: str, root_id: str) -> None:
        self.session_id = session_id
        self.root_id = root_id
        self.nodes: dict[str, Call] = {}
        #: predecessor id → ids of conversation nodes that follow it (seq order)
        self.conv_children: dict[str, list[str]] = {}
        #: caller id → ids of nodes it called (seq order)
        self.callees: dict[str, list[str]] = {}
        self.rev = 0
        #: stored bytes of the node bodies it holds (the cache's weight), and when it was last
        #: brought up to date for a reader (``time.monotonic()``); see ``Store.cached_graphs``
        self.nbytes = 0
        self.used_at = 0.0
        self.by_seq: list[Call] = []
        #: ids of nodes replaced by the one mutation, in order (render caches check it)
        self.updates: list[str] = []
        #: the read of the database this graph's nodes come from: a new object for every graph
        #: loaded anew, shared by a copy made of this one (``compaction_plan.with_candidate``).
        #: ``updates`` only speaks of changes seen by this lineage: a cache derived from
        #: another one — the session's graph before the file was replaced underneath the
        #: daemon (SPEC §2.1), or before the session was deleted and made again — is stale
        #: whatever its count says
        self.lineage: object = object()
        #: ids of summary and system-prompt nodes in seq order (renders look them up often)
        self.summaries: list[str] = []
        self.system_prompts: list[str] = []
        # the last chain walked: predecessor edges never change, so a later walk that
        # reaches any node of it (its head, or a fork point on it) reuses its prefix
        # instead of walking to the root again
        self._chain_head: str | None = None
        self._chain_ids: list[str] = []
        self._chain_pos: dict[str, int] | None = None
        # that chain's nodes, while no node was replaced since (``len(updates)`` then): the
        # same head asked again (a compaction asks a dozen times) is a copy of the list, not
        # a lookup of every node of a 10k-node branch
        self._chain_nodes: list[Call] | None = None
        self._chain_seen = -1
        # tips and chain spans of the graph as it was at a (node count, replacements) count
        self._shape: tuple[tuple[int, int], int, dict[str, None], dict[str, tuple[int, str]]] | None = None
        self._main: tuple[tuple[int, int], int, str] | None = None

    # ------------------------------------------------------------ loading

    def add(self, node: Call) -> None:
        """Insert a new node or replace a finished running node (same id, same seq)."""
        old = self.nodes.get(node.id)
        self.nodes[node.id] = node
        if old is not None:
            # The only mutation: output/status/metadata of a running node. Edges are fixed.
            idx = self._seq_index(old.seq)
            if idx is not None:
                self.by_seq[idx] = node
            self.updates.append(node.id)
            if old.predecessor != node.predecessor or old.caller != node.caller:
                # Edges never change through the ledger; if the stored row says otherwise
                # the data was altered underneath: walk afresh so the break surfaces.
                self._chain_head = None
                self._chain_ids = []
                self._chain_pos = None
                self._chain_nodes = None
                self._shape = None
                self._main = None
            return
        if self.by_seq and node.seq < self.by_seq[-1].seq:
            # Rows arrive in seq order; keep the invariant even if they do not.
            self.by_seq.append(node)
            self.by_seq.sort(key=lambda n: n.seq)
        else:
            self.by_seq.append(node)
        if node.predecessor is not None and not self._beside_chain(node):
            _insert_sorted(self.conv_children.setdefault(node.predecessor, []), node, self.nodes)
        if node.caller is not None:
            _insert_sorted(self.callees.setdefault(node.caller, []), node, self.nodes)
        if is_summary(node):
            _insert_sorted(self.summaries, node, self.nodes)
        elif node.name == SYSTEM_PROMPT_NAME:
            _insert_sorted(self.system_prompts, node, self.nodes)

    def add_all(self, nodes: Iterable[Call]) -> None:
        for node in nodes:
            self.add(node)

    def _seq_index(self, seq: int) -> int | None:
        lo, hi = 0, len(self.by_seq)
        while lo < hi:
            mid = (lo + hi) // 2
            if self.by_seq[mid].seq < seq:
                lo = mid + 1
            else:
                hi = mid
        if lo < len(self.by_seq) and self.by_seq[lo].seq == seq:
            return lo
        return None

    @staticmethod
    def _beside_chain(node: Call) -> bool:
        return node.name in _BESIDE_CHAIN and node.role in ("llm", "code")

    # ------------------------------------------------------------ queries

    def get(self, node_id: str) -> Call:
        node = self.nodes.get(node_id)
        if node is None:
            raise DagctxError(
                "NodeNotFound",
                f"node {node_id!r} does not exist in session {self.session_id!r}; "
                "list the session's nodes with session/history or node/get",
                node_id=node_id,
                session_id=self.session_id,
            )
        return node

    def is_nested(self, node: Call) -> bool:
        """True when a function or an LLM call invoked this node (it lives in a caller subtree)."""
        if node.caller is None or node.caller == self.root_id:
            return False
        parent = self.nodes.get(node.caller)
        return parent is not None and parent.role in ("code", "llm")

    def is_conversation(self, node: Call) -> bool:
        """A node that can be on a predecessor chain (and so be a HEAD)."""
        if node.id == self.root_id:
            return True
        if self._beside_chain(node):
            return False
        return node.predecessor is not None or is_spawn_root(node)

    def chain(self, head: str) -> list[Call]:
        """The linear branch ending at ``head``, oldest first, ROOT excluded.

        Legal ends: the session root, or a spawn-branch root. Anything else is bad data
        and raises ``BrokenPredecessorChain`` naming the node where the walk stopped.
        """
        if head == self.root_id:
            return []
        if head == self._chain_head and self._chain_nodes is not None and self._chain_seen == len(self.updates):
            # edges never change and no node was replaced since: the same nodes
            return list(self._chain_nodes)
        out: list[Call] = []
        node = self.get(head)
        seen: set[str] = set()
        prefix: list[str] = []
        last = self._chain_ids
        pos_of = self._chain_pos
        while True:
            if node.id == self._chain_head:
                prefix = last
                break
            pos = pos_of.get(node.id) if pos_of is not None else None
            if pos is not None:  # a fork point on the last chain: share its prefix
                prefix = last[: pos + 1]
                break
            if node.id in seen:
                raise self._broken(node.id, "the predecessor chain loops")
            seen.add(node.id)
            out.append(node)
            if pos_of is None and len(out) == 64 and len(last) > 64:
                # a long walk: index the last chain once so a fork point on it ends the walk
                pos_of = self._chain_pos = {nid: i for i, nid in enumerate(last)}
            pred = node.predecessor
            if pred == self.root_id:
                break
            if pred is None:
                if is_spawn_root(node):
                    break
                raise self._broken(node.id, "it has no predecessor and is not a branch root")
            nxt = self.nodes.get(pred)
            if nxt is None:
                raise self._broken(node.id, f"its predecessor {pred!r} does not exist")
            if not self.is_conversation(nxt):
                raise self._broken(node.id, f"its predecessor {pred!r} is not a conversation node")
            node = nxt
        out.reverse()
        nodes = self.nodes
        full = [nodes[i] for i in prefix] + out if prefix else out
        if head != self._chain_head:
            self._chain_head = head
            self._chain_ids = [n.id for n in full]
            self._chain_pos = None
        self._chain_nodes = list(full)
        self._chain_seen = len(self.updates)
        return full

    def _broken(self, node_id: str, why: str) -> DagctxError:
        return DagctxError(
            "BrokenPredecessorChain",
            f"the branch walk stopped at node {node_id!r}: {why}. The stored data is "
            "inconsistent; inspect the node with node/get",
            node_id=node_id,
            session_id=self.session_id,
        )

    def tips(self) -> list[str]:
        """Conversation nodes with no conversation child (branch tips), seq order."""
        return list(self._tips_and_spans()[0]) or [self.root_id]

    def chain_spans(self) -> dict[str, tuple[int, str]]:
        """Every conversation node → (length of its chain, the chain's first node), in one
        pass in seq order (a predecessor is always older). A node whose walk would break
        (a missing or non-conversation predecessor) is left out: ``chain`` of it raises.
        The answer is shared until the graph changes: read it, never change it."""
        return self._tips_and_spans()[1]

    def _tips_and_spans(self) -> tuple[dict[str, None], dict[str, tuple[int, str]]]:
        # Kept until a node is added or replaced (a replacement keeps the edges, but the
        # metadata that makes a spawn root could in principle change); nodes appended in
        # seq order since then extend a copy, anything else is one pass over every node.
        by_seq = self.by_seq
        count, updates = len(by_seq), len(self.updates)
        shape = self._shape
        if shape is not None and shape[0] == (count, updates):
            return shape[2], shape[3]
        if (shape is not None and shape[0][1] == updates and 0 < shape[0][0] <= count
                and by_seq[shape[0][0] - 1].seq == shape[1]):
            tips, spans = dict(shape[2]), dict(shape[3])
            new = by_seq[shape[0][0]:]
        else:
            tips, spans = {}, {}
            new = by_seq
        root, kids = self.root_id, self.conv_children
        for n in new:
            if n.id == root or not self.is_conversation(n):
                continue
            pred = n.predecessor
            tips.pop(pred, None)  # type: ignore[arg-type]
            if not kids.get(n.id):
                tips[n.id] = None
            if pred == root or (pred is None and is_spawn_root(n)):
                spans[n.id] = (1, n.id)
            elif pred is not None and pred in spans:
                length, first = spans[pred]
                spans[n.id] = (length + 1, first)
        self._shape = ((count, updates), by_seq[-1].seq if by_seq else -1, tips, spans)
        return tips, spans

    def main_tip(self) -> str:
        """The tip of the main lane: from ROOT follow the first (lowest-seq) child."""
        # Nodes appended in seq order since the last answer never become a first child of
        # a node that had children then: the walk goes on from the last main tip.
        by_seq = self.by_seq
        count, updates = len(by_seq), len(self.updates)
        known = self._main
        node = self.root_id
        if known is not None and known[0][1] == updates and 0 < known[0][0] <= count \
                and by_seq[known[0][0] - 1].seq == known[1]:
            node = known[2]
        while kids := self.conv_children.get(node):
            node = kids[0]
        self._main = ((count, updates), by_seq[-1].seq if by_seq else -1, node)
        return node

    def owner(self, node_id: str) -> str:
        """The conversation node whose turn ``node_id`` belongs to (itself if top level)."""
        node = self.nodes[node_id]
        seen = 0
        while not self.is_conversation(node) and node.caller is not None and node.caller in self.nodes:
            node = self.nodes[node.caller]
            seen += 1
            if seen > 10_000:
                break
        return node.id

    def below(self, node_ids: Iterable[str]) -> set[str]:
        """The ids of every node below any of ``node_ids`` by the caller edge (one walk for
        all of them: no node list or sort per id, as ``subtree`` makes)."""
        callees = self.callees
        out: set[str] = set()
        stack = [c for nid in node_ids for c in callees.get(nid, ())]
        while stack:
            nid = stack.pop()
            if nid not in out:
                out.add(nid)
                stack.extend(callees.get(nid, ()))
        return out

    def subtree(self, node_id: str) -> list[Call]:
        """Every node below ``node_id`` by the caller edge, seq order (node excluded)."""
        out: list[Call] = []
        stack = list(reversed(self.callees.get(node_id, ())))
        while stack:
            nid = stack.pop()
            node = self.nodes[nid]
            out.append(node)
            stack.extend(reversed(self.callees.get(nid, ())))
        out.sort(key=lambda n: n.seq)
        return out


def _insert_sorted(ids: list[str], node: Call, nodes: dict[str, Call]) -> None:
    if not ids or nodes[ids[-1]].seq < node.seq:
        ids.append(node.id)
        return
    ids.append(node.id)
    ids.sort(key=lambda i: nodes[i].seq)
