"""Result summaries (SPEC §8, step 1 of reduction within a turn): which tool results a
request may summarize, in which chunks, under which cap, asked how, and what the model
sees in their place.

One room because these decisions change together: a candidate's expected saving is its
size minus the cap its summary is asked for, and the chunks are cut by that saving.
A chosen result renders as ``reduced_result_text`` through the ``aged`` map of
``render_view``: its call id, its error status and everything else of the message stay.

Architecture Invariant: no I/O, no clock, no store (ARCHITECTURE.md context layer).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dagctx.ledger.graph import SessionGraph

from .content import json_text, value_blocks
from .turn_shape import TurnShape
from .view import View

#: Results smaller than this are not worth a summary call.
MIN_RESULT_TOKENS = 300
#: Results are summarized in chunks oldest first, each expected to free about this
#: share of the request's limit: a reduced request keeps that much room for the next
#: steps of the turn, so its reduced prefix stays the same for several requests.
CHUNK_SHARE = 0.15

RESULT_MARKER = "[tool result summarized for this request: {tool}, {tokens} tokens; the full output is node {node}]"


@dataclass(frozen=True, slots=True)
class ResultCandidate:
    node_id: str
    tool: str
    tool_call_id: str | None
    tokens: int
    #: the exact stored text the summary condenses
    text: str
    arguments: str
    status: str


def plain_text(value: Any) -> str | None:
    """The text of a stored result when every block is text, else None (multimodal)."""
    blocks = value_blocks(value)
    if not blocks or any(b.get("type") != "text" for b in blocks):
        return None
    return "\n\n".join(b.get("text", "") for b in blocks)



def result_candidates(
    view: View,
    graph: SessionGraph,
    shape: TurnShape,
    token_of: Callable[[str], int],
    *,
    aged: Mapping[str, str],
    min_tokens: int = MIN_RESULT_TOKENS,
    newest_step: bool = False,
) -> list[ResultCandidate]:
    """Tool results that may be summarized for this request, oldest first.

    The group has fully returned (no call of the owning step is still running, the
    result is not synthetic), the content is plain text, the result is not in the
    newest step and not already aged, and it is large enough to be worth a call.
    ``newest_step``: the newest step's own finished results instead (the last resort,
    SPEC §8: only its completed results, never its calls).
    """
    earlier, newest = result_candidate_sets(view, graph, shape, token_of, aged=aged, min_tokens=min_tokens)
    return newest if newest_step else earlier


def result_candidate_sets(
    view: View,
    graph: SessionGraph,
    shape: TurnShape,
    token_of: Callable[[str], int],
    *,
    aged: Mapping[str, str],
    min_tokens: int = MIN_RESULT_TOKENS,
) -> tuple[list[ResultCandidate], list[ResultCandidate]]:
    """``result_candidates`` of the earlier steps and of the newest step, in one pass over
    the view (a reduction plans both, SPEC §8)."""
    newest = shape.steps[-1] if shape.steps else None
    unfinished: set[str] = set()
    for it, owner in zip(view.items, shape.owners):
        if it.kind in ("tool_result", "text_pair") and (it.synthetic or it.status == "running"):
            unfinished.add(owner)
    out: tuple[list[ResultCandidate], list[ResultCandidate]] = ([], [])
    seen: set[str] = set()
    for it, owner in zip(view.items, shape.owners):
        if not (it.kind == "tool_result" or (it.kind == "text_pair" and it.part == "result")):
            continue
        node = graph.nodes.get(it.node_id)
        if node is None or node.role != "code" or node.id in seen:
            continue
        last = owner == newest
        if node.id in aged and not last:
            # an aged result of an earlier step: neither list takes it (the newest step's
            # list only takes the newest step's results)
            continue
        seen.add(node.id)
        if node.status not in ("completed", "error", "cancelled"):
            continue
        if owner in unfinished and not last:
            continue
        if node.output is None:
            continue
        tokens = token_of(node.id)
        if tokens < min_tokens:
            continue
        text = plain_text(node.output)
        if text is None:
            continue
        args = "" if node.input is None else (node.input if isinstance(node.input, str) else json_text(node.input))
        out[last].append(ResultCandidate(node.id, node.name, it.tool_call_id, tokens, text, args, node.status))
    for cands in out:
        cands.sort(key=lambda c: graph.nodes[c.node_id].seq)
    return out


def result_chunks(cands: Sequence[ResultCandidate], chunk_tokens: int) -> list[list[ResultCandidate]]:
    """``cands`` (oldest first) in consecutive chunks whose expected saving reaches
    ``chunk_tokens`` (the last may be smaller). A function of the results alone, so the
    chunk boundaries stay where they are while the turn grows."""
    out: list[list[ResultCandidate]] = []
    cur: list[ResultCandidate] = []
    saved = 0
    for x in cands:
        cur.append(x)
        saved += max(0, expected_saving(x))
        if saved >= chunk_tokens:
            out.append(cur)
            cur, saved = [], 0
    if cur:
        out.append(cur)
    return out


def results_needed(cands: Sequence[ResultCandidate], need: int) -> int:
    """How many results (oldest first) are expected to free ``need`` tokens."""
    saved = 0
    for n, x in enumerate(cands, start=1):
        saved += max(0, expected_saving(x))
        if saved >= need:
            return n
    return len(cands)


def result_summary_cap(tokens: int) -> int:
    """The summary's token cap for a result of ``tokens`` tokens."""
    return max(64, min(600, tokens // 5))


def expected_saving(c: ResultCandidate) -> int:
    return c.tokens - result_summary_cap(c.tokens) - 40


def reduced_result_text(c: ResultCandidate, summary: str) -> str:
    """What the model sees in place of the result (the call id and status stay)."""
    return RESULT_MARKER.format(tool=c.tool or "function", tokens=c.tokens, node=c.node_id) + "\n" + summary.strip()


def result_messages(c: ResultCandidate, text: str, *, previous: str | None = None) -> tuple[str, str]:
    """(system, user) of the summary request for one result (or one segment of it)."""
    words = max(40, int(result_summary_cap(c.tokens) * 0.7))
    system = (
        "You condense one tool result for a coding agent that is in the middle of a task and will "
        "keep working from your condensed version. Keep exactly: file paths, identifiers, names, "
        "numbers, versions, error messages and test names, and anything the agent must act on. "
        "Drop repetition and boilerplate. Answer with the condensed result only."
    )
    parts = [f"Tool: {c.tool or 'function'}", f"Arguments: {c.arguments}", f"Status: {c.status}"]
    if previous:
        parts.append(f"<condensed-so-far>\n{previous}\n</condensed-so-far>\nThe result continues:")
    parts += ["<result>", text, "</result>"]  # one copy of a long result, not two
    parts.append(f"Condense this result to at most {words} words.")
    return system, "\n".join(parts)


__all__ = ["CHUNK_SHARE", "MIN_RESULT_TOKENS", "RESULT_MARKER", "ResultCandidate", "expected_saving", "plain_text",
           "reduced_result_text", "result_candidate_sets", "result_candidates", "result_chunks", "result_messages",
           "result_summary_cap", "results_needed"]
