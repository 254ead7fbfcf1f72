"""What the summarizer sees (SPEC §8): the transcript of a cut's input items, the prompt
around it (``summarizer_messages``, the five sections; ``retry_messages`` after a
summary that lost identifiers), stages for a prefix too large for one request
(``split_stages``, ``stage_plan``), and afterwards the check that every covered node was
in what was sent (``summarized_ids``, ``covered_in_input``). Pure; the plan itself is
``compaction_plan.py``.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import replace
from operator import is_
from typing import Any

from dagctx.protocol.errors import DagctxError

from .cancel import stop_if_cancelled
from .char_classes import add_classes, char_classes, estimate_of_classes
from .compaction_plan import CutPlan
from .summary_transcript import _EARLIER, Transcript, _item_header, item_body, transcript_entry
from .tokens import estimate_tokens
from .view import Item

__all__ = [
    "SECTIONS",
    "SUMMARIZER_SYSTEM_PROMPT",
    "Transcript",
    "covered_in_input",
    "item_body",
    "request_estimate",
    "retry_messages",
    "split_stages",
    "stage_groups",
    "stage_owners",
    "stage_plan",
    "summarized_ids",
    "summarizer_messages",
    "transcript_entry",
]


# ---------------------------------------------------------------- summarizer prompt

#: The five sections of SPEC §8, in order: (heading, what goes in it).
SECTIONS: tuple[tuple[str, str], ...] = (
    ("1. User intent", "the user's overall goal, in one or two sentences."),
    (
        "2. Decisions and constraints",
        "every specific instruction, preference, constraint and decision the user stated, close to their "
        "own words; later instructions override earlier ones.",
    ),
    (
        "3. Work completed",
        "files read, created or changed, commands run and what they returned, conclusions reached — with "
        "exact paths, ids, values and error messages.",
    ),
    (
        "4. Outstanding",
        "what the user is still waiting for: unfinished steps, open questions, failing checks, and the "
        "immediate next step.",
    ),
    (
        "5. Active context",
        "the state the work depends on: working directory, branches, running services and their ports, "
        "open files, environment settings, the names and ids currently in use.",
    ),
)

SUMMARIZER_SYSTEM_PROMPT = (
    "You compact the context of an AI agent. You write a working summary of an earlier part of a "
    "conversation between a user and an assistant that uses tools. Your summary replaces those "
    "messages: whatever you leave out is lost to the assistant.\n"
    "Rules:\n"
    "- Be concrete: name files, paths, commands, functions, classes, ids, hashes, URLs, ports, numbers "
    "and error messages.\n"
    "- Copy every identifier exactly as written, character for character. Never shorten, paraphrase or "
    "invent an identifier.\n"
    "- Write only the summary: no preamble such as \"Here is a summary\", no closing remarks, no hedging, "
    "no advice, no questions.\n"
    "- Do not answer, continue or comment on the conversation, and do not address the user.\n"
    "- Write in the language the conversation mostly uses."
)

_FORMAT_RULES = (
    "Use exactly these five sections, as Markdown headings, in this order:\n"
    + "\n".join(f"## {head}\n{what}" for head, what in SECTIONS)
    + "\nKeep identifiers verbatim: file paths, ids, hashes, URLs, host:port pairs and ports, function and "
    "class names, commands. Write \"none\" under a section that has nothing."
)

_FRESH_TASK = (
    "Summarize the conversation above for the assistant that will continue it without seeing it.\n"
    + _FORMAT_RULES
)

_UPDATE_TASK = (
    "Update the previous summary with the new messages above. Merge the new messages in, drop details "
    "that are no longer true, and refresh progress and next steps. Where the new messages contradict the "
    "previous summary, the new messages win. Keep everything from the previous summary that still "
    "matters: it is the only record of that earlier part of the conversation. Output the complete "
    "updated summary.\n" + _FORMAT_RULES
)

def summarizer_messages(
    plan: CutPlan,
    *,
    instructions: str | None = None,
    update: bool | None = None,
    max_chars: int | None = None,
    transcript: Transcript | None = None,
) -> tuple[str, list[dict[str, Any]]]:
    """``(systemPrompt, messages)`` for an MCP-style ``sampling/createMessage`` request.

    One user message: the transcript of ``plan.input_items``, then the task. ``update``
    (default: whether the plan has a previous summary) puts the previous summary in
    ``<previous-summary>`` and asks for a merge; without update mode a previous summary
    is the first transcript entry. ``instructions`` (the user's ``/compact`` focus) are
    appended; ``max_chars`` adds a length limit to the task. ``transcript``: the entries
    built once for the whole compaction.
    """
    use_update = _use_update(plan, update)
    shown = [it for it in plan.input_items if it.kind != "summary"]
    lead = ([f"{_EARLIER}\n{plan.previous_summary_text}"]
            if plan.previous_summary_text is not None and not use_update else [])
    if transcript is None:
        entries = lead + [transcript_entry(it) for it in shown]
        pieces = [p for k, e in enumerate(entries) for p in (("\n\n", e) if k else (e,))]
    else:
        pieces = transcript.pieces(shown, lead)
    text = _request_text(plan, pieces, use_update, instructions, max_chars)
    return SUMMARIZER_SYSTEM_PROMPT, [{"role": "user", "content": {"type": "text", "text": text}}]


def request_estimate(
    plan: CutPlan,
    transcript: Transcript,
    *,
    instructions: str | None = None,
    update: bool | None = None,
    max_chars: int | None = None,
) -> int:
    """``estimate_tokens`` of the text of ``summarizer_messages(plan, …)``'s message, from
    the entries ``transcript`` measured and the words around them (``char_classes``)."""
    use_update = _use_update(plan, update)
    parts = transcript.classes_of([it for it in plan.input_items if it.kind != "summary"])
    if plan.previous_summary_text is not None and not use_update:
        parts.insert(0, char_classes(f"{_EARLIER}\n{plan.previous_summary_text}"))
    if use_update:
        # the previous summary measured on its own (the counts of a concatenation are its
        # parts' sums): the words around it are few but not ASCII (the task's dash), and
        # measured with it they sent the whole summary, at every stage, down the slow path
        around = add_classes(char_classes(_request_text(plan, [], use_update, instructions, max_chars, "")),
                             char_classes(plan.previous_summary_text or ""))
    else:
        around = char_classes(_request_text(plan, [], use_update, instructions, max_chars))
    joins = (2 * max(0, len(parts) - 1), 0, 0, 0)  # the "\n\n" between entries
    # add_classes over hundreds of entries, each count summed column by column in C
    return estimate_of_classes(add_classes(around, joins, *(
        (tuple(map(sum, zip(*parts))),) if parts else ())))


def _use_update(plan: CutPlan, update: bool | None) -> bool:
    prev = plan.previous_summary_text
    return bool(prev is not None if update is None else update) and prev is not None


def _request_text(plan: CutPlan, transcript: list[str], use_update: bool, instructions: str | None,
                  max_chars: int | None, previous: str | None = None) -> str:
    """The one message of a summary request around the transcript, given as the pieces
    of its joined entries (``Transcript.pieces``): the whole text is joined once, not
    the transcript first and then the message around it (a stage is megabytes).
    ``previous``: the previous summary's text in its place instead of the plan's (``""``:
    the request without it, for ``request_estimate``)."""
    prev = plan.previous_summary_text if previous is None else previous
    parts: list[str] = []
    if plan.stage is not None and plan.stage[1] > 1:
        i, total = plan.stage
        parts.append(
            f"The conversation is too long for one request; this is part {i} of {total}, in order."
            + (" The previous summary covers the parts before it." if use_update and i > 1 else "")
        )
    tag = "new-messages" if use_update else "conversation"
    if use_update:
        parts.append(f"<previous-summary>\n{prev}\n</previous-summary>")
    after = [_UPDATE_TASK if use_update else _FRESH_TASK]
    if instructions and instructions.strip():
        after.append("Additional instructions from the user for this summary:\n" + instructions.strip())
    if max_chars is not None:
        after.append(f"Keep the whole summary under {max_chars} characters.")
    # "\n\n".join([*parts, f"<{tag}>\n" + "".join(transcript) + f"\n</{tag}>", *after]), in one join
    chunks: list[str] = []
    for part in parts:
        chunks += (part, "\n\n")
    chunks.append(f"<{tag}>\n")
    chunks += transcript
    chunks.append(f"\n</{tag}>")
    for part in after:
        chunks += ("\n\n", part)
    return "".join(chunks)


def retry_messages(messages: Sequence[dict[str, Any]], missing: Sequence[str]) -> list[dict[str, Any]]:
    """A copy of ``messages`` whose last user message also lists the ``missing`` identifiers."""
    note = (
        "\n\nYour previous answer was not a usable summary: it left out identifiers the conversation "
        "depends on. Write the complete summary again, in the five sections, and copy each of these "
        "exactly where it belongs:\n" + "\n".join(f"- {m}" for m in missing)
    )
    out = [dict(m) for m in messages]
    for i in range(len(out) - 1, -1, -1):
        if out[i].get("role") == "user":
            content = out[i].get("content")
            if isinstance(content, dict) and content.get("type") == "text":
                out[i]["content"] = {**content, "text": str(content.get("text", "")) + note}
            elif isinstance(content, str):
                out[i]["content"] = content + note
            elif isinstance(content, list):
                out[i]["content"] = [*content, {"type": "text", "text": note.lstrip()}]
            else:
                continue
            return out
    out.append({"role": "user", "content": {"type": "text", "text": note.lstrip()}})
    return out


# ---------------------------------------------------------------- stages

#: Long lines are cut into segments of this many characters for staging and coverage.
_SEGMENT_CHARS = 1000


def _segments(text: str) -> list[str]:
    out: list[str] = []
    for line in text.split("\n"):
        if len(line) <= _SEGMENT_CHARS:
            out.append(line)
        else:
            out.extend(line[i : i + _SEGMENT_CHARS] for i in range(0, len(line), _SEGMENT_CHARS))
    return out


def _with_body(item: Item, body: str) -> Item:
    if item.kind == "tool_call":
        return replace(item, input=body)
    return replace(item, text=body, content=[{"type": "text", "text": body}])


def split_stages(plan: CutPlan, max_input_tokens: int, count: Callable[[str], int],
                 transcript: Transcript | None = None) -> list[list[Item]]:
    """``plan.input_items`` in consecutive stages of at most ``max_input_tokens`` each.

    Counted on transcript entries (``transcript_entry``); the instructions around them
    are not included, so pass the summarizer's input budget minus the prompt overhead.
    Items stay whole and in order; an item larger than a whole stage is cut at line
    boundaries (long lines at ``1000``-character segments) into pieces marked
    ``(part k of n)``, one stage after another. The previous summary stays in the first
    stage whatever its size. Summarize stage 1 (update mode when there is a previous
    summary), then each next stage in update mode with the summary so far
    (``stage_plan``); the last answer is the summary of the whole prefix. With ``count``
    the estimate (``tokens.estimate_tokens``), a ``transcript`` measures each entry once
    for staging and for the requests (``request_estimate``).
    """
    if max_input_tokens <= 0:
        raise DagctxError("InvalidParams", f"max_input_tokens must be positive, got {max_input_tokens}")
    stages: list[list[Item]] = []
    cur: list[Item] = []
    cur_tokens = 0

    def flush() -> None:
        nonlocal cur, cur_tokens
        if cur:
            stages.append(cur)
        cur, cur_tokens = [], 0

    measured = (transcript.estimates(plan.input_items) if transcript is not None and count is estimate_tokens
                else None)
    for n, it in enumerate(plan.input_items):
        if measured is None or not n & 255:
            stop_if_cancelled()  # each item is a tokenization (measured: a sum)
        t = (count(transcript_entry(it)) if measured is None else measured[n]) + 2
        if it.kind == "summary":
            cur.append(it)
            cur_tokens += t
            continue
        if t <= max_input_tokens:
            if cur and cur_tokens + t > max_input_tokens:
                flush()
            cur.append(it)
            cur_tokens += t
            continue
        flush()
        header_tokens = count(_item_header(it)) + 8
        pieces: list[list[str]] = []
        group: list[str] = []
        group_tokens = header_tokens
        for seg in _segments(item_body(it) if transcript is None else transcript.body(it)):
            st = count(seg) + 1
            if group and group_tokens + st > max_input_tokens:
                pieces.append(group)
                group, group_tokens = [], header_tokens
            group.append(seg)
            group_tokens += st
        if group:
            pieces.append(group)
        total = len(pieces)
        for k, segs in enumerate(pieces, 1):
            piece = _with_body(it, f"(part {k} of {total})\n" + "\n".join(segs))
            if k < total:
                stages.append([piece])
            else:
                cur, cur_tokens = [piece], header_tokens + sum(count(s) + 1 for s in segs)
    flush()
    return stages


def stage_owners(plan: CutPlan) -> dict[str, str]:
    """Item node id → the chain node (or summary) it belongs to, for ``stage_plan``."""
    return dict(zip((it.node_id for it in plan.input_items), plan.input_groups))


def stage_groups(plan: CutPlan, stages: list[list[Item]]) -> list[list[str]]:
    """Each stage's ``input_groups`` (what ``stage_plan`` finds with ``stage_owners``).
    A stage is a run of the plan's items, in order: its groups are the plan's at the same
    places, one slice (a lookup per item of thousands, stage after stage, was a step of
    its own), found where the stage before it ended (a map of every item's place is made
    only for a stage that does not begin there); a stage holding pieces of a cut item is
    looked up item by item. An item's group is a function of its node
    (``compaction_plan.cut_decision``), so both agree."""
    items, groups = plan.input_items, plan.input_groups
    place: dict[int, int] | None = None
    owner: dict[str, str] | None = None
    out: list[list[str]] = []
    at = 0  # where the next stage usually begins: after the one before (stages run in order)
    for stage in stages:
        n = len(stage)
        k: int | None = at
        if not (n and at < len(items) and stage[0] is items[at]):
            # not where the last one ended (the stage after pieces of a cut item): its place
            if place is None:
                place = dict(zip(map(id, items), range(len(items))))
            k = place.get(id(stage[0])) if stage else 0
        if k is not None and k + n <= len(items) and all(map(is_, stage, items[k:k + n])):
            out.append(groups[k:k + n])
            at = k + n
            continue
        if owner is None:
            owner = stage_owners(plan)
        out.append([owner.get(it.node_id, it.node_id) for it in stage])
    return out


def stage_plan(
    plan: CutPlan,
    items: list[Item],
    *,
    index: int,
    total: int,
    previous_text: str | None = None,
    owner: dict[str, str] | None = None,
    groups: list[str] | None = None,
) -> CutPlan:
    """The plan for one stage (1-based ``index`` of ``total``): its items, and as previous
    summary ``previous_text`` (the summary of the stages before; for stage 1 the plan's
    own previous summary when ``previous_text`` is None). ``groups``: the stage's groups
    when known (``stage_groups``)."""
    prev = previous_text if previous_text is not None else (plan.previous_summary_text if index == 1 else None)
    if groups is None:
        if owner is None:  # pass stage_owners(plan) when building many stages of one plan
            owner = stage_owners(plan)
        groups = [owner.get(it.node_id, it.node_id) for it in items]
    return replace(
        plan,
        input_items=list(items),
        input_groups=groups,
        previous_summary_text=prev,
        stage=(index, total),
    )


# ---------------------------------------------------------------- coverage (defect 1)


def _message_texts(messages: Any) -> list[str]:
    out: list[str] = []

    def walk(v: Any) -> None:
        if isinstance(v, str):
            out.append(v)
        elif isinstance(v, dict):
            if "content" in v:
                walk(v["content"])
            elif isinstance(v.get("text"), str):
                out.append(v["text"])
            if isinstance(v.get("systemPrompt"), str):
                out.append(v["systemPrompt"])
            if "messages" in v:
                walk(v["messages"])
        elif isinstance(v, (list, tuple)):
            for x in v:
                walk(x)

    walk(messages)
    return out


def _find_from(text: str, body: str, pos: int) -> int:
    """``text.find(body, pos)``, cheaper for a long ``body`` found soon after ``pos`` (the
    usual case: items are sent in order): a few places where its start occurs are
    compared whole before the full search, which prepares the whole body first."""
    if len(body) <= 64:
        return text.find(body, pos)
    head = body[:32]
    i = text.find(head, pos)
    for _ in range(4):
        if i < 0:
            return -1  # not even its start occurs after ``pos``
        if text.startswith(body, i):
            return i
        i = text.find(head, i + 1)
    return text.find(body, pos)


def _find_anywhere(text: str, body: str, pos: int) -> int:
    """Where ``body`` occurs in ``text``: its first place at or after ``pos`` (where the
    next item usually is), else its first place before (only that part is searched
    again: a body that was not sent whole costs one pass over ``text``, not two); -1."""
    i = _find_from(text, body, pos)
    if i < 0 < pos:
        i = text.find(body, 0, pos + len(body) - 1)
    return i


def _segments_sent(text: str, body: str, pos: int) -> bool:
    """Whether every non-blank line segment of ``body`` occurs in ``text`` (an item split
    across stages): each looked for after the previous one first (pieces are sent in
    order), then before it."""
    at = pos
    for seg in _segments(body):
        if not seg.strip():
            continue
        j = _find_anywhere(text, seg, at)
        if j < 0:
            return False
        at = j + len(seg)
    return True


def summarized_ids(plan: CutPlan, messages_sent: Any, transcript: Transcript | None = None) -> set[str]:
    """Node ids whose content was in ``messages_sent`` (one request's messages, or a list
    of several requests' messages for a staged summary).

    An item was sent when its content is a substring of the sent text, or — for items
    split across stages — when every line segment of it is. A node counts when all its
    items were sent; a chain node when all items of its turn part (itself, its tool
    calls and results, inner calls) were; the previous summary's ``covers_ids`` when its
    text was; covered nodes that render nothing always count.
    """
    # The sent text is ``"\n".join(texts)``; it is searched text by text and joined only
    # when a body is not found whole in one of them (megabytes copied into fresh memory
    # cost more than the searches). Found in one text is found in the joined text.
    texts = _message_texts(messages_sent)
    starts: list[int] = []  # where each text starts in the joined text
    at = 0
    for t in texts:
        starts.append(at)
        at += len(t) + 1
    joined: str | None = None
    items = plan.input_items
    if transcript is None:
        bodies = [item_body(it) for it in items]
        # no entries at hand: no guess (the search below finds every body the same)
        skips = [-1] * len(bodies)
    else:
        # where the next body usually is: after the "\n\n" joining two entries and its own
        # entry's header line (the request text is the entries joined, in order)
        bodies, at = transcript.bodies_at(items)
        skips = [2 + k for k in at]
    pos = 0  # in the joined text: where the last body found ends
    ti = 0  # the text ``pos`` is in
    found: list[bool] = []
    for body, skip in zip(bodies, skips):
        if not body:
            found.append(True)
            if skip > 0:
                pos += skip - 1  # its entry is its header line alone: the next one follows it
            continue
        # whether a body was sent does not depend on where the search starts (it is found
        # anywhere in the joined text, or segment by segment): the places tried first — the
        # guess, then the rest of this text, then the next text — only save the search
        hit = -1
        if skip > 0 and ti < len(texts) and texts[ti].startswith(body, pos + skip - starts[ti]):
            hit = pos + skip
        else:
            for tj in (ti, ti + 1):
                if tj < len(texts):
                    i = _find_from(texts[tj], body, max(0, pos - starts[tj]))
                    if i >= 0:
                        hit, ti = starts[tj] + i, tj
                        break
        if hit >= 0:
            pos = hit + len(body)
            found.append(True)
            continue
        if joined is None:
            joined = "\n".join(texts)
        i = _find_anywhere(joined, body, pos)
        if i >= 0:
            pos = i + len(body)
            ti = max(0, bisect_right(starts, i) - 1)
            found.append(True)
            continue
        found.append(_segments_sent(joined, body, pos))
    node_ok: dict[str, bool] = {}
    group_ok: dict[str, bool] = {}
    if all(found):  # the usual case: every node and group is ok (the fold below, at once)
        k = min(len(plan.input_items), len(plan.input_groups))
        # a chain node counts by its whole turn part, any other node by its own items:
        # with every one ok, that is every node of an item and every group
        out = {it.node_id for it in plan.input_items[:k]}
        groups = set(plan.input_groups[:k])
        out |= groups
        summary_ok = plan.previous_summary_id in groups
    else:
        for it, group, ok in zip(plan.input_items, plan.input_groups, found):
            node_ok[it.node_id] = node_ok.get(it.node_id, True) and ok
            group_ok[group] = group_ok.get(group, True) and ok
        # a chain node counts by its whole turn part, any other node by its own items
        out = {nid for nid, ok in node_ok.items() if ok and nid not in group_ok}
        out |= {g for g, ok in group_ok.items() if ok}
        summary_ok = bool(group_ok.get(plan.previous_summary_id))  # type: ignore[arg-type]
    out.update(plan.empty_ids)
    if plan.previous_summary_id is not None and summary_ok:
        covered_by_old = set(plan.covered_ids) - set(plan.new_covered_ids)
        out.update(covered_by_old)
    return out


def covered_in_input(plan: CutPlan, messages_sent: Any, transcript: Transcript | None = None) -> bool:
    """True when every covered chain node's content was in the summarizer input."""
    return set(plan.covered_ids) <= summarized_ids(plan, messages_sent, transcript)
