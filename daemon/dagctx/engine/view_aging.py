"""Which old tool results a branch shows shrunk (SPEC §8), planned once per user turn.

The aging part of ``ContextService`` (``engine/views.py``): the plan over a branch, its
reuse within one user turn, and aging within a long turn in step units.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from dagctx.context import aging, cache_economy
from dagctx.context.cancel import stop_if_cancelled
from dagctx.context.content import covers_of
from dagctx.context.models import ModelInfo
from dagctx.context.render import age_view, render_view, with_system_prompt
from dagctx.context.summary_choice import summary_head
from dagctx.context.view import View
from dagctx.ledger import SessionGraph
from dagctx.ledger.graph import is_summary

from .render_cache import CachedAging, Snapshot, still_valid_prefix
from .view_tokens import TokenAccounting


class AgingPlans(TokenAccounting):
    """``aging_for`` and the plan cache it reuses."""

    _aging_cache: dict[tuple[Any, ...], CachedAging]
    #: the last unaged walk of a branch: (graph, head, nodes, updates, view)
    _unaged: tuple[SessionGraph, str, int, int, View] | None = None

    def keep_unaged(self, graph: SessionGraph, head: str, view: View) -> None:
        self._unaged = (graph, head, len(graph.by_seq), len(graph.updates), view)

    def _unaged_walk(self, graph: SessionGraph, head: str) -> View | None:
        """The last unaged walk of ``head``'s branch while the graph has the same nodes and
        updates (a plan of another key — ``defer`` — or a render walked it), else None."""
        got = self._unaged
        if got is None:
            return None
        g, h, nodes, updates, view = got
        if g is not graph or h != head or nodes != len(graph.by_seq) or updates != len(graph.updates):
            return None
        return view

    def planned_view(self, graph: SessionGraph, head: str, aged: dict[str, str], system_node_id: str | None = None,
                     pending_system: tuple[str, str] | None = None) -> View | None:
        """The view of ``head`` with ``aged`` and the system prompt applied, from the last
        unaged walk of this branch (an aging plan's, or a render's) while the graph has the
        same nodes and updates (``render.age_view``); None when there is none. The walk is
        kept: the builds of one request (reduction within a turn) differ only in aging
        overlays, checkpoints and the system prompt."""
        view = self._unaged_walk(graph, head)
        if view is None:
            return None
        out = age_view(view, graph, aged)
        if out is not None and (system_node_id is not None or pending_system is not None):
            out = with_system_prompt(out, graph, system_node_id, pending_system)
        return out

    def aging_for(self, session_id: str, head: str, model: ModelInfo, *, enabled: bool = True,
                  ager: Any = None, frame: str | None = None, defer: bool = False,
                  cold: bool = False, graph: SessionGraph | None = None) -> tuple[dict[str, str], dict[str, Any]]:
        """Which old tool results render shrunk on this branch, and why.

        Deterministic: "now" is the start of the head's turn (its newest user node), and
        the boundary is a function of the branch's committed turns, so within one turn
        every render shows the same aged prefix (prompt-cache stable) and replay can
        rebuild the same decisions from the data.

        ``defer`` (``context/prepare``, SPEC §8 aging and the prompt cache): a change to
        what the branch's previous request showed aged, which breaks the prompt cache, is
        made only when it pays for the rewrite (``cache_economy.aging_economy``) or the
        cache is ``cold``; else the previous request's aged texts stay, and the stats say
        ``deferred``. The caller forces the plan (``defer=False``) when the budget needs it.
        ``graph``: the session's graph as the caller just brought it up to date.
        """
        if not enabled or frame is not None:
            return {}, {}
        policy = self.e.aging_policy
        graph = self.e.store.graph(session_id) if graph is None else graph
        tokenizer = model.tokenizer or self.e.counter.tokenizer_for(model.name)
        cache = self.node_tokens(graph, tokenizer)
        defer = defer and ager is None
        key = (session_id, tokenizer, model.context_window, policy, defer, cold and defer)
        reuse = self._reuse_aging(graph, head, key, policy, model, cache)
        if reuse is not None:
            return reuse
        stop_if_cancelled()
        view = self._unaged_walk(graph, head)
        if view is None:
            view = render_view(graph, head)
            # the render that follows the plan ages this view instead of walking the branch again
            self.keep_unaged(graph, head, view)
        stop_if_cancelled()
        if not view.items:
            return {}, {}

        stored = cache.get

        def token_of(node_id: str) -> int:
            got = stored(node_id)  # the stored counts, else counted once (``counts_of``)
            return (got if got is not None else self.counts_of(graph, node_id, tokenizer, cache))[1]

        stop_if_cancelled()
        boundary = aging.boundary_after_commit(view, graph, policy)
        stop_if_cancelled()
        now = _turn_start(graph, view, policy.turn_unit)
        stop_if_cancelled()
        def count(text: str) -> int:
            return self.count_text(text, tokenizer)

        mined: dict[str, list[str]] = {}
        refs_of = self.refs_of(graph, mined)
        if ager is None:
            plan = aging.plan_aging(view, graph, now=now, boundary_seq=boundary or None, policy=policy,
                                    token_of=token_of, window=model.context_window, count=count,
                                    refs_of=refs_of)
        else:  # a context engine's own ager keeps the documented arguments
            plan = ager(view, graph, now=now, boundary_seq=boundary or None, policy=policy, token_of=token_of,
                        window=model.context_window, count=count)
        long = aging.long_turn_cap(graph, head, policy) if ager is None else None
        long_manifest = None
        if long is not None:
            long_manifest = self._age_long_turn(graph, view, plan, policy, long, model, token_of, count,
                                                refs_of)
        if mined:
            self.keep_mined(session_id, mined)
        stats: dict[str, Any] = dict(plan.stats.as_dict())
        stats["manifest"] = plan.manifest()
        stats["longTurnCap"] = long[1] if long is not None else None
        if long_manifest is not None:
            stats["manifest"]["agingLongTurn"] = long_manifest
        kept = paid = None
        if defer:
            kept, paid = self._deferred(graph, head, view, plan, token_of, count, cold, tokenizer)
            if kept is not None:
                aged_now, kinds, prev, economy = kept
                freed = sum(max(0, token_of(n) - count(t)) for n, t in aged_now.items())
                stats.update(toolResultsAged=len(aged_now), tokensFreedByAging=freed, deferred=economy)
                stats["manifest"] = {**plan.manifest(), "agingBoundary": prev.get("agingBoundary"),
                                     "agingKinds": kinds, "agingDeferred": economy}
                if isinstance(prev.get("agingLongTurn"), dict):
                    stats["manifest"]["agingLongTurn"] = prev["agingLongTurn"]
                else:
                    stats["manifest"].pop("agingLongTurn", None)
                plan.aged.clear()
                plan.aged.update(aged_now)
        newest = newest_request(graph, view.chain)
        entry = CachedAging(key, Snapshot.of(graph, view.chain), _turn_node(graph, view.chain), dict(plan.aged), stats,
                            None if newest is None else newest[0], paid)
        self._aging_cache[key] = entry
        if defer and kept is None:
            # nothing held back: this is also the plan of a build that may not defer (the
            # reduction within the turn that follows, SPEC §8), not made a second time
            plain = (session_id, tokenizer, model.context_window, policy, False, False)
            self._aging_cache[plain] = replace(entry, key=plain, paid=None)
        return dict(plan.aged), stats

    def _deferred(self, graph: SessionGraph, head: str, view: View, plan: Any, token_of: Any, count: Any,
                  cold: bool, tokenizer: str) -> tuple[tuple[dict[str, str], dict[str, str], dict[str, Any],
                                                              dict[str, Any]] | None, dict[str, Any] | None]:
        """``(kept, paid)``. ``kept``: the previous request's aging, kept because the plan's
        change to it does not pay for its cache break (SPEC §8): ``(aged, kinds, previous
        manifest, the rule's numbers)``; None when the plan applies (nothing it changes was
        sent before, a new summary rewrites everything after it anyway, a result is shown
        whole again — a later message cites it —, the change pays, or the cache is cold).
        ``paid``: the rule's numbers when the change is made because it pays at this head
        (a later head of the turn rewrites more: ``_reuse_aging`` weighs it again)."""
        got = previous_requests(graph, head)
        if got is None:
            return None, None
        prev_id, prev, since = got
        if prev.get("summaryId") != view.summary_id or prev.get("agingPolicyVersion") is None:
            return None, None
        reduced = set(((prev.get("turnReduction") or {}).get("results") or {}))
        prev_aged = {k: v for k, v in (prev.get("agedText") or {}).items()
                     if k not in reduced and isinstance(v, str)}
        prev_kinds = {k: v for k, v in (prev.get("agingKinds") or {}).items() if k in prev_aged}
        prev_seq = graph.nodes[prev_id].seq
        first: int | None = None
        changed: list[str] = []
        seen: set[str] = set()
        for idx, it in enumerate(view.items):
            nid = it.node_id
            node = graph.nodes.get(nid)
            if nid in seen or node is None or node.role != "code" or node.seq >= prev_seq:
                continue
            seen.add(nid)
            if plan.aged.get(nid) != prev_aged.get(nid):
                if nid not in plan.aged:
                    return None, None  # shown whole again: what the model cites is not held back
                changed.append(nid)
                if first is None:
                    first = idx
        if first is None:
            return None, None
        freed = 0
        for nid in changed:
            before = count(prev_aged[nid]) if nid in prev_aged else token_of(nid)
            freed += before - count(plan.aged[nid])
        rewrite = 0
        tail: set[str] = set()
        for it in view.items[first:]:
            if it.node_id in tail or it.node_id not in graph.nodes:
                continue
            tail.add(it.node_id)
            tin, tout = self.counts_of(graph, it.node_id, tokenizer)
            rewrite += tin + tout
            if it.node_id in plan.aged:
                rewrite -= max(0, token_of(it.node_id) - count(plan.aged[it.node_id]))
        economy = cache_economy.aging_economy(freed, rewrite, since, cold=cold)
        if economy.pays:
            return None, None if cold else {**economy.as_dict(), "results": len(changed)}
        aged = {nid: prev_aged[nid] for nid in seen if nid in prev_aged}
        kinds = {nid: prev_kinds[nid] for nid in aged if nid in prev_kinds}
        for nid, text in plan.aged.items():
            node = graph.nodes.get(nid)
            if nid not in seen and node is not None and node.seq >= prev_seq:
                aged[nid] = text  # a result newer than the previous request (its cap): no break
                if nid in plan.kinds:
                    kinds[nid] = plan.kinds[nid]
        return (aged, kinds, prev, {**economy.as_dict(), "results": len(changed)}), None

    @staticmethod
    def _age_long_turn(graph: SessionGraph, view: View, plan: Any, policy: Any, long: tuple[int, int, str],
                       model: ModelInfo, token_of: Any, count: Any, refs_of: Any) -> dict[str, Any]:
        """Aging within a long user turn (SPEC §8): the turn's own older steps age in step
        units, the step boundary held at the start of the current quantum of
        ``stepQuantum`` steps, so the aged prefix changes only every ``stepQuantum`` steps."""
        steps, cap, step_id = long
        step_policy = replace(policy, turn_unit="step")
        boundary = aging.boundary_after_commit(view, graph, step_policy, current_cap=cap)
        now = graph.nodes[step_id].created_at
        splan = aging.plan_aging(view, graph, now=now, boundary_seq=boundary or None, policy=step_policy,
                                 token_of=token_of, window=model.context_window, count=count, current_cap=cap,
                                 refs_of=refs_of)
        current = {it.node_id for it in view.items if it.turn == view.turn_count}
        added = 0
        for nid, text in splan.aged.items():
            if nid not in current or nid in plan.aged:
                continue
            kind = splan.kinds[nid]
            plan.aged[nid] = text
            plan.kinds[nid] = kind
            plan.decisions[nid] = kind
            added += 1
            st = plan.stats
            st.tool_results_aged += 1
            st.tokens_freed_by_aging += max(0, token_of(nid) - count(text))
            if kind == aging.SOFT_TRIM:
                st.soft_trimmed += 1
            elif kind == aging.HARD_CLEAR:
                st.hard_cleared += 1
            else:
                st.capped += 1
        return {"steps": steps, "stepCap": cap, "stepQuantum": policy.step_quantum, "stepBoundary": boundary,
                "aged": added}

    def _reuse_aging(self, graph: SessionGraph, head: str, key: tuple[Any, ...], policy: Any, model: ModelInfo,
                     cache: dict[str, tuple[int, int]]) -> tuple[dict[str, str], dict[str, Any]] | None:
        """The same decisions as the last plan of this branch when still in the same user turn.

        With user turns as the unit, nothing added within the current turn can pass the
        turn-distance gate, so the plan only changes at a new user turn — unless a new
        result is so large that the single-result cap applies to it.
        """
        cached = self._aging_cache.get(key)
        if cached is None or policy.turn_unit != "user":
            return None
        chain = [n.id for n in graph.chain(head)]
        if _turn_node(graph, chain) != cached.turn_start or not still_valid_prefix(graph, cached.snap, chain):
            return None
        if graph.summaries and len(chain) > len(cached.snap.chain) and _summary_reaches(graph, cached.snap, chain):
            return None  # a summary the plan's head did not reach may apply here (SPEC §8): another view
        long = aging.long_turn_cap(graph, head, policy)
        if (long[1] if long is not None else None) != cached.stats.get("longTurnCap"):
            return None  # a long turn crossed into its next quantum of steps
        cap = model.context_window * policy.max_single_result_share
        seqs_start = cached.snap.max_seq
        for node in reversed(graph.by_seq):
            if node.seq <= seqs_start:
                break
            if node.role == "code" and (cache.get(node.id) or (0, 0))[1] > cap:
                return None
        previous, paid = cached.previous, cached.paid
        held_by: dict[str, Any] | None = None  # a new previous request that holds the same change back
        if key[4]:  # a plan that may hold a change back: made against the branch's previous request
            # (one sent since is past the plan's head: the nodes before it are as they were)
            newest = newest_request(graph, chain[len(cached.snap.chain):])
            now = previous if newest is None else newest[0]
            if newest is not None and now != previous:
                if not _carries(graph, newest[0], newest[1], cached.aged):
                    return None  # another previous request: plan afresh, as a cold daemon does
                previous, paid = now, None  # the change made is that request's now
                if isinstance(cached.stats.get("deferred"), dict):
                    held_by = newest[1]
            elif paid is not None and chain[-1] != cached.snap.chain[-1]:
                # a change made because it paid at the plan's head, and no request sent it
                # since: at this head it rewrites more, and may not pay any more (SPEC §8)
                rewrite = paid["rewrite"] + self._rendered_tokens(graph, head, cached.snap.chain[-1], key[1])
                economy = cache_economy.aging_economy(paid["freed"], rewrite, paid["requests"], cold=paid["cold"])
                if not economy.pays:
                    return None
                paid = {**economy.as_dict(), "results": paid["results"]}
                self._aging_cache[key] = cached = replace(cached, snap=Snapshot.of(graph, chain), paid=paid)
        stats = cached.stats
        manifest = stats.get("manifest")
        if (long is not None and isinstance(manifest, dict) and isinstance(manifest.get("agingLongTurn"), dict)
                and not isinstance(stats.get("deferred"), dict)):  # (held back: the previous request's record)
            # the same decisions, but the manifest names this head's step count: a render
            # is the same bytes whichever head was planned first (SPEC §8)
            manifest = {**manifest, "agingLongTurn": {**manifest["agingLongTurn"], "steps": long[0]}}
            stats = {**stats, "manifest": manifest}
        if held_by is not None and isinstance(manifest, dict) and previous is not None:
            # held back against the new previous request: what the manifest copies from the
            # previous request (``aging_for``) is that request's now
            manifest = _held_manifest(graph, manifest, held_by, graph.nodes[previous].seq, cached.aged)
            stats = {**stats, "manifest": manifest}
        deferred = stats.get("deferred")
        if isinstance(deferred, dict) and isinstance(manifest, dict) and chain[-1] != cached.snap.chain[-1]:
            # a change held back (SPEC §8): the same decision all turn long, but its numbers
            # are this request's — the rewrite grew by what the turn added since the plan —
            # so the manifest is the same from a daemon that plans this head afresh
            rewrite = deferred["rewrite"] + self._rendered_tokens(graph, head, cached.snap.chain[-1], key[1])
            economy = cache_economy.aging_economy(deferred["freed"], rewrite, deferred["requests"],
                                                  cold=deferred["cold"])
            if economy.pays:
                return None  # (the rewrite only grows; a change that did not pay still does not)
            numbers = {**economy.as_dict(), "results": deferred["results"]}
            stats = {**stats, "deferred": numbers, "manifest": {**manifest, "agingDeferred": numbers}}
            self._aging_cache[key] = replace(cached, snap=Snapshot.of(graph, chain), stats=stats, previous=previous,
                                             paid=paid)
        elif previous != cached.previous:
            self._aging_cache[key] = replace(cached, stats=stats, previous=previous, paid=paid)
        return dict(cached.aged), stats

    def _rendered_tokens(self, graph: SessionGraph, head: str, since: str, tokenizer: str) -> int:
        """The input and output tokens of the nodes a walk of ``head`` renders after the
        chain node ``since`` (each node once): what a request's rewrite after a held-back
        aging change adds over one made at ``since`` (``_deferred``)."""
        seen: set[str] = set()
        total = 0
        for it in render_view(graph, head, start_after=since).items:
            if it.node_id in seen or it.node_id not in graph.nodes:
                continue
            seen.add(it.node_id)
            tin, tout = self.counts_of(graph, it.node_id, tokenizer)
            total += tin + tout
        return total


def _same_cache(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two consecutive requests' manifests record the same decisions that decide
    a prompt-cache prefix (summary, aged texts, checkpoint, summarized results)."""
    ta, tb = a.get("turnReduction") or {}, b.get("turnReduction") or {}
    return (a.get("summaryId") == b.get("summaryId") and a.get("agedText") == b.get("agedText")
            and (ta.get("checkpoint") or {}).get("id") == (tb.get("checkpoint") or {}).get("id")
            and a.get("systemNode") == b.get("systemNode"))


def _summary_reaches(graph: SessionGraph, planned: Snapshot, chain: list[str]) -> bool:
    """Whether a summary may apply to the branch ``chain`` and not to the plan's head (the
    end of ``planned.chain``, which ``chain`` extends): it covers a node past that head, or
    it covers nodes of the branch and was made for a head off the planned chain — past it,
    or on a fork that the branch leaves after its covered run (``summary_choice.summary_reach``
    applies such a summary once the branch holds newer nodes past the fork)."""
    added = set(chain[len(planned.chain):])
    for sid in graph.summaries:
        node = graph.nodes.get(sid)
        if node is None:
            continue
        covers = covers_of(node)
        if not added.isdisjoint(covers):
            return True
        made_for = summary_head(node)
        if made_for is not None and made_for not in planned.chain_set and not planned.chain_set.isdisjoint(covers):
            return True
    return False


def _held_manifest(graph: SessionGraph, manifest: dict[str, Any], prev: dict[str, Any], prev_seq: int,
                   aged: dict[str, str]) -> dict[str, Any]:
    """A held-back plan's manifest made against the previous request ``prev`` (its
    manifest; its node's ``prev_seq``) as ``aging_for`` makes it: that request's boundary,
    long-turn record and kinds of the results before it, the plan's kinds after."""
    nodes = graph.nodes
    theirs = prev.get("agingKinds") or {}
    kinds = {k: v for k, v in (manifest.get("agingKinds") or {}).items() if k in nodes and nodes[k].seq >= prev_seq}
    kinds.update({k: theirs[k] for k in aged if k in theirs and k in nodes and nodes[k].seq < prev_seq})
    out = {**manifest, "agingBoundary": prev.get("agingBoundary"), "agingKinds": kinds}
    if isinstance(prev.get("agingLongTurn"), dict):
        out["agingLongTurn"] = prev["agingLongTurn"]
    else:
        out.pop("agingLongTurn", None)
    return out


def newest_request(graph: SessionGraph, chain: list[str]) -> tuple[str, dict[str, Any]] | None:
    """The newest top-level request on ``chain`` (ids, root first): its llm node id and
    ``renderManifest`` (``previous_requests``'s first answer, without its count)."""
    nodes = graph.nodes
    for nid in reversed(chain):
        man = cache_economy.request_manifest(nodes[nid])
        if man is not None:
            return nid, man
    return None


def _carries(graph: SessionGraph, request: str, manifest: dict[str, Any], aged: dict[str, str]) -> bool:
    """Whether the request ``request`` (its ``manifest``) showed the older results as the
    plan ``aged`` does: then a plan made against the request before it decides the same
    against this one (``AgingPlans._deferred``: nothing changed, or the same change held
    back or made), and a request made since with other decisions (another model's plan,
    the budget's) is a reason to plan afresh."""
    if manifest.get("agingPolicyVersion") is None:
        return False
    seq = graph.nodes[request].seq
    reduced = set(((manifest.get("turnReduction") or {}).get("results") or {}))
    shown = {k: v for k, v in (manifest.get("agedText") or {}).items()
             if k not in reduced and isinstance(v, str) and k in graph.nodes and graph.nodes[k].seq < seq}
    return shown == {k: v for k, v in aged.items() if k in graph.nodes and graph.nodes[k].seq < seq}


def previous_requests(graph: SessionGraph, head: str) -> tuple[str, dict[str, Any], int] | None:
    """The branch's previous top-level request (its llm node id and ``renderManifest``)
    and how many requests *before the current user turn* were handed out since the
    branch's last cache break by a decision (``_same_cache``); None when the branch has
    none. Counting only earlier turns keeps the answer the same for every request of a
    turn: aging changes at user-turn boundaries, whichever request asks (SPEC §8)."""
    prev: tuple[str, dict[str, Any]] | None = None
    since = 0
    last: dict[str, Any] | None = None
    in_turn = True
    for node in reversed(graph.chain(head)):
        if node.role == "user" and node.caller is None and not node.metadata.get("spawn_branch_root"):
            in_turn = False
            continue
        man = cache_economy.request_manifest(node)
        if man is None:
            continue
        if prev is None:
            prev = (node.id, man)
        if in_turn:
            continue
        if last is not None and not _same_cache(man, last):
            break
        since += 1
        last = man
    return None if prev is None else (prev[0], prev[1], since)


def _turn_node(graph: SessionGraph, chain: list[str]) -> str | None:
    """The newest real user node on a chain: the start of the current turn."""
    for nid in reversed(chain):
        node = graph.nodes[nid]
        if node.role == "user" and not node.metadata.get("spawn_branch_root"):
            return nid
    return None


def _turn_start(graph: SessionGraph, view: View, unit: str = "user") -> float:
    """Creation time of the current turn's start: the newest real user node rendered.

    With ``turn_unit="step"`` a turn is one top-level model call, so the current step
    starts at the newest top-level user or llm node rendered (a summary is never a
    step, a summary is not a turn, SPEC §8). Otherwise the results of earlier steps of one long user
    turn would be younger than "now" and could never age in step mode.
    """
    for nid in reversed(view.reads):
        node = graph.nodes.get(nid)
        if node is None or graph.is_nested(node):
            continue
        if node.role == "user" or (unit == "step" and node.role == "llm" and not is_summary(node)):
            return node.created_at
    return graph.nodes[view.head].created_at if view.head in graph.nodes else 0.0

