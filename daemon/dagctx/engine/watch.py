"""What changed in a session since a subscriber was last told (SPEC §1.5).

``SessionWatch`` keeps a cursor over one session of one database (the newest seq, the
graph updates and the head and title seen) and turns what the ledger holds now into the
notifications the subscribers have not heard yet. The server's hub only decides when to
ask (after a write, every poll) and sends the answer: it reaches the record through the
engine, never through the store. A cursor is not thread-safe: its caller asks one at a
time (the hub holds a lock per watch).

The cursor counts the graph's replacements (``SessionGraph.updates``) only while the graph
is the one it read before (``SessionGraph.lineage``). A graph read anew from the same file
(dropped after a failed write, evicted and read again) says nothing of what changed
before: the cursor then tells of the running nodes it announced that have finished
since, from the nodes themselves (a running node's one mutation, SPEC §4). A graph of
another file (the database replaced underneath the daemon, SPEC §2.1; or its content put
back in place, or the session made again under its id) may differ in any node: its
subscribers are told ``replaced`` and read the session again.

A poll (``changes(..., poll=True)``) is for other processes' writes: it leaves a session
alone while a write of this daemon to it is committed but not yet announced, and throws
its reading away when one began while it read (the store's ``WriteMarks``), so this
daemon's nodes always carry their origin.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any

from dagctx.ledger import Store
from dagctx.ledger.graph import SessionGraph, is_summary
from dagctx.protocol import messages as m
from dagctx.protocol.errors import DagctxError


@dataclass
class SessionWatch:
    """A cursor over one session: what its subscribers were told so far."""

    store: Store
    session_id: str
    seq_seen: int = 0
    updates_seen: int = 0
    head: str | None = None
    title: str | None = None
    deleted: bool = False
    #: the graph the counts above are of (``SessionGraph.lineage``) and the file it was read
    #: from (``Store.generation``: one more each time the file is opened anew)
    lineage: object = None
    generation: int = 0
    #: the graph's revision and the session's birth when last looked at: a graph read anew
    #: whose revisions went back, or a session born again, is not the one told of
    rev: int = 0
    born: float = 0.0
    #: ids of the nodes the subscribers were told of while they ran: what a graph read anew
    #: is asked about (a running node is mutated once, when it finishes)
    running: set[str] = field(default_factory=set)

    @classmethod
    def open(cls, store: Store, session_id: str) -> SessionWatch:
        """A cursor at the session's present state (``SessionNotFound`` for a bad id)."""
        info = store.get_session(session_id)
        told = store.marks.finished(session_id)
        g = store.graph(session_id)
        store.marks.announced(session_id, told)  # what the graph holds is known
        return cls(store, session_id, seq_seen=g.by_seq[-1].seq if g.by_seq else 0, updates_seen=len(g.updates),
                   head=info.head, title=info.title, lineage=g.lineage, generation=store.generation,
                   rev=g.rev, born=info.created_at, running=_running(g))

    def changes(self, origin: str | None, written: frozenset[str] = frozenset(), *,
                poll: bool = False) -> list[tuple[str, Any]]:
        """The notifications ``(method, params)`` of what is new, in order, and the cursor
        moved past them. Nodes named in ``written`` carry ``origin``; any other new node
        came from another process (``origin: null``). A poll returns nothing while a write
        of this daemon to the session waits for its announcement (which names its origin)."""
        sid = self.session_id
        if self.deleted:
            return []
        marks = self.store.marks
        begun = told = 0
        if poll:
            quiet, begun = marks.settled(sid)
            if not quiet:
                return []
        else:
            told = marks.finished(sid)  # before reading: what this announcement covers
        try:
            info = self.store.get_session(sid)
            g = self.store.graph(sid)
            generation = self.store.generation
        except DagctxError as err:
            if err.kind != "SessionNotFound":
                raise
            if poll and marks.begun(sid) != begun:
                return []
            self.deleted = True
            if not poll:
                marks.announced(sid, told)
            return [("session/didChange", m.SessionChange(session_id=sid, change="deleted", origin=origin))]
        if poll and marks.begun(sid) != begun:
            return []  # a write of this daemon began while this poll read: its announcement follows

        def who(node_id: str) -> str | None:
            return origin if not written or node_id in written else None

        out: list[tuple[str, Any]] = []
        if g.lineage is not self.lineage and (generation != self.generation or g.rev < self.rev
                                              or info.created_at != self.born):
            # another file's session of the same id (SPEC §2.1), the file's content put back
            # in place (its revisions went back) or the session made anew: any node may differ
            self._reset(g, info, generation)
            out.append(("session/didChange", m.SessionChange(session_id=sid, change="replaced", head=info.head,
                                                             title=info.title, origin=None)))
            if not poll:
                marks.announced(sid, told)
            return out
        running = self.running
        start = bisect.bisect_right(g.by_seq, self.seq_seen, key=lambda n: n.seq)
        for node in g.by_seq[start:]:
            out.append(("node/didAppend", m.NodeNotification(session_id=sid, node=node, head=info.head,
                                                             origin=who(node.id))))
            if is_summary(node):
                out.append(("session/didChange", m.SessionChange(session_id=sid, change="summary", head=info.head,
                                                                 node_id=node.id, origin=who(node.id))))
            elif node.status == "running":
                running.add(node.id)
            self.seq_seen = node.seq
        if g.lineage is self.lineage:
            updated = g.updates[self.updates_seen:]
        else:
            # the same file read anew: its ``updates`` began empty, so ask the nodes
            self.lineage = g.lineage
            updated = sorted((nid for nid in running if nid in g.nodes and g.nodes[nid].status != "running"),
                             key=lambda nid: g.nodes[nid].seq)
        for nid in updated:
            running.discard(nid)
            out.append(("node/didUpdate", m.NodeNotification(session_id=sid, node=g.nodes[nid], head=info.head,
                                                             origin=who(nid))))
        self.updates_seen = len(g.updates)
        self.rev = g.rev
        if info.head != self.head:
            self.head = info.head
            out.append(("session/didChange", m.SessionChange(session_id=sid, change="head", head=info.head,
                                                             origin=origin)))
        if info.title != self.title:
            self.title = info.title
            out.append(("session/didChange", m.SessionChange(session_id=sid, change="renamed", head=info.head,
                                                             title=info.title, origin=origin)))
        if not poll:
            marks.announced(sid, told)
        return out

    def _reset(self, g: SessionGraph, info: Any, generation: int) -> None:
        """The cursor at the graph's present state: what a new subscriber would start from."""
        self.seq_seen = g.by_seq[-1].seq if g.by_seq else 0
        self.updates_seen = len(g.updates)
        self.head, self.title = info.head, info.title
        self.lineage, self.generation = g.lineage, generation
        self.rev, self.born = g.rev, info.created_at
        self.running = _running(g)


def _running(g: SessionGraph) -> set[str]:
    return {n.id for n in g.by_seq if n.status == "running"}


def told_nobody(store: Store, session_id: str) -> None:
    """A write of this daemon to an unwatched session: its announcement is done (nobody
    to tell), so no later poll waits for it."""
    store.marks.announced(session_id, store.marks.finished(session_id))
