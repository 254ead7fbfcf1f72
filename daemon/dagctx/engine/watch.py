"""What changed in a session since a subscriber was last told (SPEC §1.5).

``SessionWatch`` keeps a cursor over one session of one database (the newest seq, the
graph updates and the head and title seen) and turns what the ledger holds now into the
notifications the subscribers have not heard yet. The server's hub only decides when to
ask (after a write, every poll) and sends the answer: it reaches the record through the
engine, never through the store. A cursor is not thread-safe: its caller asks one at a
time (the hub holds a lock per watch).

A poll (``changes(..., poll=True)``) is for other processes' writes: it leaves a session
alone while a write of this daemon to it is committed but not yet announced, and throws
its reading away when one began while it read (the store's ``WriteMarks``), so this
daemon's nodes always carry their origin.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Any

from dagctx.ledger import Store
from dagctx.ledger.graph import is_summary
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

    @classmethod
    def open(cls, store: Store, session_id: str) -> SessionWatch:
        """A cursor at the session's present state (``SessionNotFound`` for a bad id)."""
        info = store.get_session(session_id)
        told = store.marks.finished(session_id)
        g = store.graph(session_id)
        store.marks.announced(session_id, told)  # what the graph holds is known
        return cls(store, session_id, seq_seen=g.by_seq[-1].seq if g.by_seq else 0, updates_seen=len(g.updates),
                   head=info.head, title=info.title)

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
        start = bisect.bisect_right(g.by_seq, self.seq_seen, key=lambda n: n.seq)
        for node in g.by_seq[start:]:
            out.append(("node/didAppend", m.NodeNotification(session_id=sid, node=node, head=info.head,
                                                             origin=who(node.id))))
            if is_summary(node):
                out.append(("session/didChange", m.SessionChange(session_id=sid, change="summary", head=info.head,
                                                                 node_id=node.id, origin=who(node.id))))
            self.seq_seen = node.seq
        for nid in g.updates[self.updates_seen:]:
            out.append(("node/didUpdate", m.NodeNotification(session_id=sid, node=g.nodes[nid], head=info.head,
                                                             origin=who(nid))))
        self.updates_seen = len(g.updates)
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


def told_nobody(store: Store, session_id: str) -> None:
    """A write of this daemon to an unwatched session: its announcement is done (nobody
    to tell), so no later poll waits for it."""
    store.marks.announced(session_id, store.marks.finished(session_id))
