"""Neutral ``View`` → provider messages, always pair-valid: the registry of render formats.

Each format is one module of this package defining ``FORMAT``, a ``RenderFormat``
(``_assembly.py``) that owns everything format-specific: building the messages, the
pairing check, whether a cached render can be extended, where turn hooks go, the text
a message bills and which stored reasoning it sends signed. Each module's docstring says
what its messages look like. The registry finds the modules itself (a name starting with
``_`` is shared code, not a format); a test keeps it equal to the wire ``Format``
literal. Nothing outside this package branches on a format's name.

``to_messages(view, format)`` returns ``(system, messages, node_ids)`` -- a tuple
subclass (``Rendered``) that also carries ``.repairs``: every change made to keep the
list valid, for the render manifest.

Pair validity (SPEC §6; OpenClaw #3243/#4839/#7865 crashed on each of these), made by
the shared assembly before any format builds:

- a tool result whose call is not in the open call group right before it is an
  *orphan* and is dropped (``repairs``: ``dropped orphan tool result …``);
- a call without a result gets the synthetic result ``[no result recorded]``
  (render already does this for unfinished calls; this catches any other view);
- results are emitted in call order, right after their assistant message;
- a tool call id already used earlier in the conversation is renamed
  ``<id>_2`` (``_3``, …) together with its result.

Reasoning (``Item.reasoning``, SPEC §6): ``to_messages(..., reasoning=)`` picks the llm
nodes whose blocks are sent (``reasoning_owners``); they open their assistant message,
and each format says what it makes of them.

Deterministic: the same view gives equal lists (and the same bytes once encoded).
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Collection, Sequence
from typing import Any

from dagctx.context.view import View

from ._assembly import reasoning_owners as _owners
from ._assembly import (
    REASONING_TYPES,
    Assembler,
    Rendered,
    RenderFormat,
    reasoning_payload,
    reasoning_text,
)


def _discover() -> dict[str, RenderFormat]:
    found: dict[str, RenderFormat] = {}
    for mod in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if mod.name.startswith("_"):
            continue
        fmt = importlib.import_module(f"{__name__}.{mod.name}").FORMAT
        found[fmt.name] = fmt
    return found


#: every render format by wire name
FORMATS: dict[str, RenderFormat] = _discover()


def get(name: str) -> RenderFormat:
    fmt = FORMATS.get(name)
    if fmt is None:
        raise ValueError(f"unknown format {name!r}: use {', '.join(repr(n) for n in FORMATS)}")
    return fmt


def to_messages(view: View, format: str = "neutral", *, include_system: bool = True,  # noqa: A002
                reasoning: str = "provider", used_call_ids: Collection[str] = ()) -> Rendered:
    """Provider messages for a view; see the module docstring. Never raises on data.

    ``reasoning`` (``provider`` | ``all`` | ``none``) picks the llm nodes whose reasoning
    blocks are sent (``reasoning_owners``), first in their message. ``used_call_ids``: the
    tool call ids of the messages these follow (a cached render being extended), renamed
    away from like any repeated id, so the whole list's ids stay unique."""
    fmt = get(format)
    a = Assembler(_owners(view, fmt, reasoning), list(view.repairs))
    a.used_ids.update(used_call_ids)
    a.feed(view.items)
    msgs = a.finish()
    built_at = len(a.repairs)
    messages, ids = fmt.build(view, msgs, a.repairs, include_system=include_system)
    return Rendered(view.system, messages, ids, a.repairs, frozenset(a.used_ids), built_at)


def reasoning_owners(view: View, format: str | RenderFormat, mode: str) -> frozenset[str]:  # noqa: A002
    """The llm nodes whose reasoning blocks a render in ``format`` sends (SPEC §6; see
    ``_assembly.reasoning_owners``)."""
    return _owners(view, get(format) if isinstance(format, str) else format, mode)


def check_pairs(messages: Sequence[dict[str, Any]], format: str) -> list[str]:  # noqa: A002
    """Problems that a provider would reject (or that break pairing); empty = valid."""
    return get(format).check_pairs(messages)


def apply_turn_hooks(messages: list[Any], hooks: dict[str, Any], format: str) -> list[Any]:  # noqa: A002
    """Put ``memoryPrefetch`` then ``prependContext`` before the newest user-written text.

    Recorded in the manifest (``turnHooks``) so replay re-applies exactly what was sent.
    """
    prefix = "\n\n".join(p for p in (hooks.get("memoryPrefetch"), hooks.get("prependContext")) if p)
    if not prefix:
        return messages
    return get(format).prepend_to_newest_user(messages, prefix)


def message_text(message: dict[str, Any], format: str = "neutral") -> str:  # noqa: A002
    """Every string a provider bills for in one message, newline-joined."""
    return get(format).message_text(message)


def message_tokens(
    messages: Sequence[dict[str, Any]], count: Callable[[str], int], *, overhead: int = 0, format: str = "neutral",  # noqa: A002
) -> list[int]:
    """Per-message token counts with a caller-supplied counter (e.g. a bound
    ``TokenCounter.count``) plus a fixed per-message framing overhead."""
    fmt = get(format)
    return [count(fmt.message_text(m)) + overhead for m in messages]


__all__ = ["FORMATS", "REASONING_TYPES", "RenderFormat", "Rendered", "apply_turn_hooks",
           "check_pairs", "get", "message_text", "message_tokens", "reasoning_owners", "reasoning_payload",
           "reasoning_text", "to_messages"]
