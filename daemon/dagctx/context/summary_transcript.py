"""The transcript entries of a compaction's items (SPEC §8): each item as the summarizer
sees it — a bracketed header line, then its content — and ``Transcript``, which builds
and measures every entry once for the whole compaction. Pure; the prompt around the
entries, the stages and the coverage check are ``summarizer_input.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from operator import is_
from typing import Any

from .cancel import stop_if_cancelled
from .char_classes import CharClasses, char_classes, char_classes_many, estimate_of_classes
from .compaction_plan import strip_marker
from .content import json_text
from .view import Item

__all__ = ["Transcript", "item_body", "transcript_entry"]

_EARLIER = "[summary of the conversation before this point]"
#: bodies measured in one ``char_classes_many`` (a cancel is seen between two chunks)
_MEASURED_TOGETHER = 512


def item_body(item: Item) -> str:
    """The content of an item as the summarizer sees it (also what the coverage check seeks)."""
    if item.kind == "summary":
        return strip_marker(item.text)
    if item.kind == "tool_call":
        if item.input is None:
            return ""
        return item.input if isinstance(item.input, str) else json_text(item.input)
    return item.text


def _item_header(item: Item) -> str:
    kind = item.kind
    if kind == "summary":
        return _EARLIER
    if kind == "user":
        return "[user]" if item.depth == 0 else "[prompt of an inner model call]"
    if kind == "assistant":
        return "[assistant]" if item.depth == 0 else "[reply of an inner model call]"
    if kind == "tool_call":
        return f"[tool call: {item.name or 'tool'}]"
    if kind == "tool_result":
        return f"[tool result: {item.name or 'tool'}]"
    if item.name == "ask_user":
        return "[assistant]" if item.part == "call" else "[user]"
    return "[function call]" if item.part == "call" else "[function result]"


def _bodies_and_heads(items: Sequence[Item]) -> tuple[list[str], list[str]]:
    """``[item_body(it) …]`` and ``[_item_header(it) …]`` in one loop: most items' body is
    their text, and a tool's header is made once per tool name (the same string object for
    every call of it, so its later lookups hash it once)."""
    bodies: list[str] = []
    heads: list[str] = []
    put_body, put_head = bodies.append, heads.append
    calls: dict[str, str] = {}
    results: dict[str, str] = {}
    for it in items:
        kind = it.kind
        if kind == "tool_result":
            put_body(it.text)
            head = results.get(it.name)
            if head is None:
                head = results[it.name] = _item_header(it)
            put_head(head)
        elif kind == "tool_call":
            put_body(item_body(it))
            head = calls.get(it.name)
            if head is None:
                head = calls[it.name] = _item_header(it)
            put_head(head)
        elif kind == "user" or kind == "assistant":
            put_body(it.text)
            put_head(_item_header(it))
        else:
            put_body(item_body(it))
            put_head(_item_header(it))
    return bodies, heads


def transcript_entry(item: Item) -> str:
    """One item as a transcript entry: a bracketed header line, then its content."""
    return _entry(item, item_body(item))


def _entry(item: Item, body: str) -> str:
    return f"{_item_header(item)}\n{body}" if body else _item_header(item)


class Transcript:
    """The bodies and transcript entries of one compaction's items, each built once and
    measured once with the estimate (``char_classes``): staging, every stage's request,
    its size check, the fidelity terms and the coverage check read the same entries.
    Holds the items it was asked about, so an id is never reused while it is kept.

    An entry is its header line and its body; the two are kept apart and never joined
    into one more string per item: a request is joined once from the pieces
    (``pieces``), an entry's counts are its parts' counts summed (``char_classes`` is
    additive), and the coverage check needs only where a body starts in its entry. On a
    prefix of megabytes, every copy of it costs fresh memory pages as much as copying.

    Each item held has a place: its body, header, opening and counts are columns (lists)
    read at that place, and one map gives an item's place by its ``id``. Every question
    of a compaction is about the prefix's items, or a stage of them (a run of them in
    order): such a run is read from each column as one slice.

    ``known``: for some items and their bodies, the bodies' counts already measured
    (None for each one to measure here): most bodies are whole texts of their nodes,
    whose counts were kept when the node was written (``TokenAccounting.body_classes``).
    Counts are counts: an entry's are the same, taken or measured."""

    __slots__ = ("_at", "_items", "_bodies", "_heads", "_opens", "_classes", "_unmeasured", "_open_of",
                 "_head_classes", "_known")

    def __init__(self, known: Callable[[Sequence[Item], Sequence[str]], list[CharClasses | None]] | None = None,
                 ) -> None:
        self._known = known
        #: ``id(item)`` → its place in the columns below
        self._at: dict[int, int] = {}
        self._items: list[Item] = []
        self._bodies: list[str] = []
        self._heads: list[str] = []
        #: what comes before an entry's body in a request: the "\n\n" joining it to the
        #: entry before, its header line and, when it has a body, the newline after it
        #: (one string of a few per header, ``_open_of``), so a request is two pieces an entry
        self._opens: list[str] = []
        #: an entry's counts, None until measured
        self._classes: list[CharClasses | None] = []
        #: how many places of ``_classes`` are None
        self._unmeasured = 0
        #: header → its opening before a body, and alone (an entry without a body)
        self._open_of: dict[str, tuple[str, str]] = {}
        #: header line → its counts alone, and plus the newline after it (a few distinct headers)
        self._head_classes: dict[str, tuple[CharClasses, CharClasses]] = {}

    def _place(self, item: Item) -> int:
        got = self._at.get(id(item))
        return self._add([item]) if got is None else got

    def body(self, item: Item) -> str:
        """``item_body(item)``."""
        return self._bodies[self._place(item)]

    def entry(self, item: Item) -> str:
        """``transcript_entry(item)``."""
        k = self._place(item)
        body = self._bodies[k]
        return f"{self._heads[k]}\n{body}" if body else self._heads[k]

    def classes(self, item: Item) -> CharClasses:
        """``char_classes(transcript_entry(item))``."""
        return self.classes_of((item,))[0]

    def estimate(self, item: Item) -> int:
        """``estimate_tokens(transcript_entry(item))``."""
        return estimate_of_classes(self.classes(item))

    # The same, for many items in one go (a compaction reads thousands of entries at
    # each step): what the per-item methods give, a column at a time.

    def _add(self, items: Sequence[Item]) -> int:
        """Give each item a place at the end of the columns, its body and header built
        (``items`` not held yet, each once); the first one's place."""
        first = len(self._items)
        bodies, heads = _bodies_and_heads(items)
        open_of = self._open_of
        for head in set(heads).difference(open_of):
            open_of[head] = (f"\n\n{head}\n", f"\n\n{head}")
        self._at.update(zip(map(id, items), range(first, first + len(items))))
        self._items += items
        self._bodies += bodies
        self._heads += heads
        self._opens += [open_of[h][0] if b else open_of[h][1] for h, b in zip(heads, bodies)]
        self._classes += [None] * len(items)
        self._unmeasured += len(items)
        return first

    def _where(self, items: Sequence[Item]) -> slice | list[int]:
        """Where ``items`` are held (those not held yet are added): one slice when they are
        a run of the held items, in order (a stage, or the whole prefix), else each one's
        place. A held id is its item's own: the items held are kept alive, so no other
        object has their ids."""
        n = len(items)
        at = self._at
        if not n:
            return slice(0, 0)
        start = at.get(id(items[0]))
        if start is None and not at:
            # nothing held yet: the items in the order asked (an item asked twice keeps
            # its last place; both places hold the same body)
            self._add(items)
            return slice(0, n) if len(at) == n else list(map(at.__getitem__, map(id, items)))
        held = self._items
        if start is not None and start + n <= len(held) and all(map(is_, items, held[start:start + n])):
            return slice(start, start + n)
        keys = list(map(id, items))
        if not all(map(at.__contains__, keys)):
            new = [it for it in dict(zip(keys, items)).values() if id(it) not in at]
            self._add(new)
        return list(map(at.__getitem__, keys))

    def bodies(self, items: Sequence[Item]) -> list[str]:
        """``[self.body(it) for it in items]``."""
        return _column(self._bodies, self._where(items))

    def entries(self, items: Sequence[Item]) -> list[str]:
        """``[self.entry(it) for it in items]``."""
        where = self._where(items)
        return [f"{h}\n{b}" if b else h for h, b in zip(_column(self._heads, where), _column(self._bodies, where))]

    def bodies_at(self, items: Sequence[Item]) -> tuple[list[str], list[int]]:
        """``self.bodies(items)``, and where each body starts in its entry (after its
        header line and the newline; where a non-empty body would start)."""
        where = self._where(items)
        return _column(self._bodies, where), [len(h) + 1 for h in _column(self._heads, where)]

    def pieces(self, items: Sequence[Item], lead: Sequence[str] = ()) -> list[str]:
        """Strings whose concatenation is ``"\n\n".join([*lead, *self.entries(items)])``:
        each entry as its opening (``_opens``) and its body, interleaved."""
        where = self._where(items)
        out: list[str] = [""] * (2 * len(items))
        out[0::2] = _column(self._opens, where)
        out[1::2] = _column(self._bodies, where)
        head = "\n\n".join(lead)
        if out:
            # the first entry's opening has the separator only after a lead
            out[0] = (head + out[0]) if lead else out[0][2:]
        elif lead:
            out.append(head)
        return out

    def classes_of(self, items: Sequence[Item]) -> list[CharClasses]:
        """``[self.classes(it) for it in items]`` (cancellable between items): an entry's
        counts are its header's, the newline's and its body's, summed. The bodies not
        measured yet are measured together (``char_classes_many``), a chunk at a time."""
        where = self._where(items)
        stop_if_cancelled()
        got = _column(self._classes, where)
        if self._unmeasured and None in got:
            places = range(where.start, where.stop) if isinstance(where, slice) else where
            # an item asked twice is measured once
            self._measure([k for k in dict.fromkeys(places) if self._classes[k] is None])
            got = _column(self._classes, where)
        return got  # type: ignore[return-value]

    def _measure(self, places: list[int]) -> None:
        """Measure the entries at ``places`` (each once), ``_MEASURED_TOGETHER`` at a time;
        a body whose counts ``known`` gives is not read."""
        bodies, heads, classes, head_classes = self._bodies, self._heads, self._classes, self._head_classes
        items, known = self._items, self._known
        for head in {heads[k] for k in places}.difference(head_classes):
            hc = char_classes(head)
            # the header alone (an empty body), and the header with the newline after it
            head_classes[head] = (hc, (hc[0] + 1, hc[1], hc[2], hc[3]))
        run = places and places[-1] - places[0] + 1 == len(places) and places == list(
            range(places[0], places[-1] + 1))
        for lo in range(0, len(places), _MEASURED_TOGETHER):
            stop_if_cancelled()
            if run:
                a = places[0] + lo
                b = min(places[0] + len(places), a + _MEASURED_TOGETHER)
                chunk_bodies, chunk_heads = bodies[a:b], heads[a:b]
                chunk_items = items[a:b] if known is not None else ()
            else:
                chunk = places[lo:lo + _MEASURED_TOGETHER]
                chunk_bodies = [bodies[k] for k in chunk]
                chunk_heads = [heads[k] for k in chunk]
                chunk_items = [items[k] for k in chunk] if known is not None else ()
            if known is None:
                body_classes = char_classes_many(chunk_bodies)
            else:
                # an ASCII text's counts are its length (``isascii`` reads a flag): only the
                # others are looked up, and those not known measured
                body_classes = [None if not b.isascii() else (len(b), 0, 0, 0) for b in chunk_bodies]
                rest = [j for j, c in enumerate(body_classes) if c is None]
                if rest:
                    left = []
                    for j, c in zip(rest, known([chunk_items[j] for j in rest], [chunk_bodies[j] for j in rest])):
                        if c is None:
                            left.append(j)
                        else:
                            body_classes[j] = c
                    for j, c in zip(left, char_classes_many([chunk_bodies[j] for j in left])):
                        body_classes[j] = c
            measured = [(hc[0] + c[0], hc[1] + c[1], hc[2] + c[2], hc[3] + c[3]) if c[0] else alone
                        for (alone, hc), c in zip(map(head_classes.__getitem__, chunk_heads),
                                                  body_classes)]  # type: ignore[index]
            if run:
                classes[a:b] = measured
            else:
                for k, c in zip(chunk, measured):
                    classes[k] = c
        self._unmeasured -= len(places)

    def estimates(self, items: Sequence[Item]) -> list[int]:
        """``[self.estimate(it) for it in items]``."""
        return list(map(estimate_of_classes, self.classes_of(items)))


def _column(column: list[Any], where: slice | list[int]) -> list[Any]:
    """``column`` read at ``where`` (a slice, or places)."""
    return column[where] if isinstance(where, slice) else list(map(column.__getitem__, where))
