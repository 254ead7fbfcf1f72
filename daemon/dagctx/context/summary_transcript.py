"""The transcript entries of a compaction's items (SPEC §8): each item as the summarizer
sees it — a bracketed header line, then its content — and ``Transcript``, which builds
and measures every entry once for the whole compaction. Pure; the prompt around the
entries, the stages and the coverage check are ``summarizer_input.py``.
"""

from __future__ import annotations

from collections.abc import Sequence

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
    prefix of megabytes, every copy of it costs fresh memory pages as much as copying."""

    __slots__ = ("_items", "_bodies", "_heads", "_opens", "_open_of", "_classes", "_head_classes")

    def __init__(self) -> None:
        # parallel maps by ``id(item)`` (no container per item: a compaction of 15k items
        # would otherwise hand the cyclic GC 15k more objects to scan)
        self._items: dict[int, Item] = {}
        self._bodies: dict[int, str] = {}
        self._heads: dict[int, str] = {}
        #: what comes before an entry's body in a request: the "\n\n" joining it to the
        #: entry before, its header line and, when it has a body, the newline after it
        #: (one string of a few per header, ``_open_of``), so a request is two pieces an entry
        self._opens: dict[int, str] = {}
        #: header → its opening before a body, and alone (an entry without a body)
        self._open_of: dict[str, tuple[str, str]] = {}
        self._classes: dict[int, CharClasses] = {}
        #: header line → its counts alone, and plus the newline after it (a few distinct headers)
        self._head_classes: dict[str, tuple[CharClasses, CharClasses]] = {}

    def _key(self, item: Item) -> int:
        if self._items.get(id(item)) is not item:
            self._add(item)
        return id(item)

    def body(self, item: Item) -> str:
        """``item_body(item)``."""
        return self._bodies[self._key(item)]

    def entry(self, item: Item) -> str:
        """``transcript_entry(item)``."""
        k = self._key(item)
        body = self._bodies[k]
        return f"{self._heads[k]}\n{body}" if body else self._heads[k]

    def classes(self, item: Item) -> CharClasses:
        """``char_classes(transcript_entry(item))``."""
        return self.classes_of((item,))[0]

    def estimate(self, item: Item) -> int:
        """``estimate_tokens(transcript_entry(item))``."""
        return estimate_of_classes(self.classes(item))

    # The same, for many items in one loop (a compaction reads thousands of entries at
    # each step): what the per-item methods give, without a call chain per item.

    def _fill(self, items: Sequence[Item]) -> None:
        """Build the body and header of every item not held yet."""
        known = self._items
        for it in items:
            if known.get(id(it)) is not it:
                self._add(it)

    def _add(self, it: Item) -> None:
        k = id(it)
        self._items[k] = it
        self._bodies[k] = body = item_body(it)
        self._heads[k] = head = _item_header(it)
        self._opens[k] = self._open(head, body)
        self._classes.pop(k, None)

    def _open(self, head: str, body: str) -> str:
        got = self._open_of.get(head)
        if got is None:
            got = self._open_of[head] = (f"\n\n{head}\n", f"\n\n{head}")
        return got[0] if body else got[1]

    # Each method below is one loop over its items that builds a missing item where it
    # meets it (a compaction asks about thousands of items a dozen times).

    def bodies(self, items: Sequence[Item]) -> list[str]:
        """``[self.body(it) for it in items]``."""
        if not self._items:
            # the first question of a compaction (all its items): built column by column
            keys = [id(it) for it in items]
            out = [item_body(it) for it in items]
            self._items.update(zip(keys, items))
            self._bodies.update(zip(keys, out))
            heads = list(map(_item_header, items))
            self._heads.update(zip(keys, heads))
            open_of = self._open_of
            for head in set(heads).difference(open_of):
                self._open(head, "")
            self._opens.update(zip(keys, [open_of[h][0] if b else open_of[h][1] for h, b in zip(heads, out)]))
            if len(self._items) == len(out):  # no item asked twice: every body is its own
                return out
        return list(map(self._bodies.__getitem__, self._keys(items)))

    def entries(self, items: Sequence[Item]) -> list[str]:
        """``[self.entry(it) for it in items]``."""
        self._fill(items)
        bodies, heads = self._bodies, self._heads
        return [f"{heads[id(it)]}\n{bodies[id(it)]}" if bodies[id(it)] else heads[id(it)] for it in items]

    def bodies_at(self, items: Sequence[Item]) -> tuple[list[str], list[int]]:
        """``self.bodies(items)``, and where each body starts in its entry (after its
        header line and the newline; where a non-empty body would start)."""
        keys = self._keys(items)
        heads = self._heads
        return list(map(self._bodies.__getitem__, keys)), [len(heads[k]) + 1 for k in keys]

    def pieces(self, items: Sequence[Item], lead: Sequence[str] = ()) -> list[str]:
        """Strings whose concatenation is ``"\n\n".join([*lead, *self.entries(items)])``:
        each entry as its opening (``_opens``) and its body, in one comprehension."""
        keys = self._keys(items)
        opens, bodies = self._opens, self._bodies
        out = [piece for k in keys for piece in (opens[k], bodies[k])]
        head = "\n\n".join(lead)
        if out:
            # the first entry's opening has the separator only after a lead
            out[0] = (head + out[0]) if lead else out[0][2:]
        elif lead:
            out.append(head)
        return out

    def _keys(self, items: Sequence[Item]) -> list[int]:
        """``id`` of each item, every one held (built now when it was not). An id held is
        its item's own: the items held are kept alive, so no other object has their ids."""
        keys = list(map(id, items))
        held = self._items
        if not all(map(held.__contains__, keys)):
            self._fill(items)
        return keys

    def classes_of(self, items: Sequence[Item]) -> list[CharClasses]:
        """``[self.classes(it) for it in items]`` (cancellable between items): an entry's
        counts are its header's, the newline's and its body's, summed. The bodies not
        measured yet are measured together (``char_classes_many``), a chunk at a time."""
        classes = self._classes
        keys = list(map(id, items))
        if all(map(classes.__contains__, keys)):
            # every one measured already (each stage's request asks again): measured ids
            # are held, and a held id is its item's own (``_keys``)
            stop_if_cancelled()
            return list(map(classes.__getitem__, keys))
        stop_if_cancelled()
        self._keys(items)
        bodies, heads, head_classes = self._bodies, self._heads, self._head_classes
        # an item asked twice is measured once
        missing = [k for k in dict.fromkeys(keys) if k not in classes]
        for head in {heads[k] for k in missing}.difference(head_classes):
            hc = char_classes(head)
            # the header alone (an empty body), and the header with the newline after it
            head_classes[head] = (hc, (hc[0] + 1, hc[1], hc[2], hc[3]))
        for lo in range(0, len(missing), _MEASURED_TOGETHER):
            stop_if_cancelled()
            chunk = missing[lo:lo + _MEASURED_TOGETHER]
            for k, b in zip(chunk, char_classes_many([bodies[k] for k in chunk])):
                alone, hc = head_classes[heads[k]]
                classes[k] = (hc[0] + b[0], hc[1] + b[1], hc[2] + b[2], hc[3] + b[3]) if b[0] else alone
        return list(map(classes.__getitem__, keys))

    def estimates(self, items: Sequence[Item]) -> list[int]:
        """``[self.estimate(it) for it in items]``."""
        return list(map(estimate_of_classes, self.classes_of(items)))
