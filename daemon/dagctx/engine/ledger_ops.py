"""Session and node operations: the ledger methods of the protocol, as plain functions.

Each takes the engine's store and a params Struct and returns a result Struct, so
they are tested without a server (jedi-language-server style: handlers stay thin).
Notifications are returned to the caller, never sent from here.
"""

from __future__ import annotations

import weakref
from typing import Any

from dagctx.ledger import Store
from dagctx.protocol import messages as m

from dagctx.context import graph_view

from .heads import check_head


def session_create(store: Store, p: m.SessionCreateParams) -> m.SessionCreateResult:
    info = store.create_session(p.title, p.metadata)
    return m.SessionCreateResult(session_id=info.session_id, root_id=info.root_id, head=info.head)


def session_list(store: Store, p: m.SessionListParams) -> m.SessionListResult:
    sessions, total = store.list_sessions(p.limit, p.offset)
    return m.SessionListResult(sessions=sessions, total=total)


def session_get(store: Store, p: m.SessionRef) -> m.SessionInfo:
    return store.get_session(p.session_id)


def _list_result(sessions: list[m.SessionInfo], total: int) -> m.SessionListResult:
    return m.SessionListResult(sessions=sessions, total=total)


def session_list_nowait(store: Store, p: m.SessionListParams, same_batch: bool = False) -> m.SessionListResult | None:
    """``session_list``'s answer when it is at hand without a wait, else None (SPEC §1.4):
    the same object while nothing is committed (the store keeps it)."""
    return store.list_sessions_nowait(p.limit, p.offset, same_batch=same_batch, shape=_list_result)


def session_get_nowait(store: Store, p: m.SessionRef, same_batch: bool = False) -> m.SessionInfo | None:
    """``session_get``'s answer when it is at hand without a wait, else None (SPEC §1.4)."""
    return store.get_session_nowait(p.session_id, same_batch=same_batch)


def id_resolve(store: Store, p: m.IdResolveParams) -> m.IdResolveResult:
    matches, truncated = store.resolve_ids(p.prefix, p.kinds, p.session_id, p.limit)
    return m.IdResolveResult(matches=matches, truncated=truncated)


def session_rename(store: Store, p: m.SessionRenameParams) -> m.SessionInfo:
    return store.rename_session(p.session_id, p.title)


def session_delete(store: Store, p: m.SessionRef) -> m.SessionDeleteResult:
    n = store.delete_session(p.session_id)
    return m.SessionDeleteResult(deleted=True, nodes_removed=n)


def session_history(store: Store, p: m.SessionHistoryParams) -> m.SessionHistoryResult:
    check_head(store.graph(p.session_id), p.head)
    nodes, head = store.history(p.session_id, p.head)
    total = len(nodes)
    if p.offset or p.limit is not None:
        nodes = nodes[p.offset : None if p.limit is None else p.offset + p.limit]
    return m.SessionHistoryResult(nodes=nodes, head=head, total=total)


def session_branches(store: Store, p: m.SessionRef) -> m.SessionBranchesResult:
    branches, head = store.branches(p.session_id)
    return m.SessionBranchesResult(branches=branches, head=head)


#: (session, revision, heads) → (graph, coverage, aged marks): the pages of one state share them
_GRAPH_STATE: dict[tuple[Any, ...], tuple[Any, Any, Any]] = {}
#: session → each head's summary choice at the last state asked, carried to the next state
#: of the same graph where it cannot have changed (graph_view.ChoiceMemo says when)
_CHOICES: dict[str, graph_view.ChoiceMemo] = {}


def session_graph(store: Store, p: m.SessionGraphParams) -> m.SessionGraphResult:
    # SPEC §4.1: rows paged by seq; coverage restates the render's own choice per head.
    info = store.get_session(p.session_id)
    branches, head = store.branches(p.session_id)
    g = store.graph(p.session_id)
    if p.heads is not None:
        heads = []
        for i, h in enumerate(p.heads):
            check_head(g, h, path=f"heads[{i}]")
            heads.append(g.root_id if h == "ROOT" else g.get(h).id)
    else:
        heads = [b.head for b in branches]
        if head not in heads:
            heads.append(head)
    # what the pages of one graph state share (coverage, aging marks) is computed once
    key = (p.session_id, g.rev, tuple(heads))
    hit = _GRAPH_STATE.get(key)
    if hit is None or hit[0]() is not g:
        memo = _CHOICES.get(p.session_id)
        if memo is None:
            memo = _CHOICES[p.session_id] = graph_view.ChoiceMemo()
            while len(_CHOICES) > 32:
                _CHOICES.pop(next(iter(_CHOICES)))
        # the graph is held weakly: the store's cache decides how long a graph lives
        hit = (weakref.ref(g), graph_view.coverage(g, heads, memo), graph_view.aged_by(g))
        _GRAPH_STATE[key] = hit
        while len(_GRAPH_STATE) > 8:
            _GRAPH_STATE.pop(next(iter(_GRAPH_STATE)))
    rows, nxt, cov = graph_view.graph_page(g, heads, after_seq=p.after_seq, limit=p.limit,
                                           conversation_only=p.conversation_only, cov=hit[1], aged=hit[2])
    return m.SessionGraphResult(
        session_id=p.session_id, root_id=g.root_id, head=head, nodes=rows, total=info.node_count,
        next_after_seq=nxt, branches=branches,
        heads=[m.GraphHead(head=h, summary_id=cov.by_head.get(h)) for h in heads],
    )


def session_checkout(store: Store, p: m.SessionCheckoutParams) -> m.HeadResult:
    head, previous = store.checkout(p.session_id, p.node_id)
    return m.HeadResult(head=head, previous=previous)


def session_rewind(store: Store, p: m.SessionRewindParams) -> m.HeadResult:
    head, previous = store.rewind(p.session_id, p.node_id, p.steps)
    return m.HeadResult(head=head, previous=previous)


def session_spawn(store: Store, p: m.SessionSpawnParams) -> m.SessionSpawnResult:
    out = store.spawn(
        p.session_id, p.caller_id, source=p.source, name=p.name, output=p.output, metadata=p.metadata
    )
    return m.SessionSpawnResult(node=out.node, head=out.head)


def session_name_branch(store: Store, p: m.BranchNameParams) -> m.SessionBranchesResult:
    store.name_branch(p.session_id, p.head, p.name)
    return session_branches(store, m.SessionRef(session_id=p.session_id))


def node_get(store: Store, p: m.NodeGetParams) -> m.NodeGetResult:
    if not p.ids:
        from dagctx.protocol.errors import DagctxError

        raise DagctxError("InvalidParams", "ids is empty: name at least one node id", path="ids")
    r = p.range
    nodes = store.get_nodes(
        p.session_id,
        p.ids,
        offset=r.offset if r else 0,
        length=r.length if r else None,
        ranged=r is not None,
    )
    if not p.include_callees:
        return m.NodeGetResult(nodes=nodes)
    # SPEC §4: the caller edge nests; a range applies to the named nodes only.
    g = store.graph(p.session_id)
    seen = {n.id for n in nodes}
    callees = []
    for n in nodes:
        for c in g.subtree(n.id):
            if c.id not in seen:
                seen.add(c.id)
                callees.append(c)
    callees.sort(key=lambda n: n.seq)
    return m.NodeGetResult(nodes=nodes, callees=callees)


def search_query(store: Store, p: m.SearchParams) -> m.SearchResult:
    hits = store.search(p.query, session_id=p.session_id, limit=p.limit, roles=p.roles)
    return m.SearchResult(hits=hits)
