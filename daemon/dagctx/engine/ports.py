"""Ports: what a part of the engine may use of one connection's engine, as small Protocols.

``EngineCore`` (``core.py``) composes every operation and implements all of these; the
operations and views type against the port they need instead of ``EngineCore``, so
``core.py`` stands on top of the engine and nothing below imports it back (a test in
tests/unit/test_layering.py keeps the import graph free of circles). A plugin context
engine, a test or a bench can hand an operation anything that has the port's attributes.

* ``Record``: the ledger as the engine writes it (the store, the write paths,
  announcements, client paths and environment, heavy work off the event loop, how large
  an answer may be);
* ``Sampling``: what a summary source may ask (the peer, its declared capabilities, the
  connection's options and environment, the model table);
* ``ViewHost``: what the views read (the record, models, token counter, aging policy);
* ``Views``: what operations ask of the views (render, aging, token counts, calibration,
  the pending system prompt);
* ``Host``: everything an operation above the views uses (compaction, reduction within a
  turn, the context engines, import and export).

Types only: nothing here runs, and the module imports nothing it describes at run time.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    from dagctx.context.aging import AgingPolicy
    from dagctx.context.models import ModelInfo, ModelTable
    from dagctx.context.system_prompt import PromptOptions
    from dagctx.context.tokens import TokenCounter
    from dagctx.ledger import AppendOutcome, NodeDerived, SessionGraph, Store
    from dagctx.protocol import context_messages as c
    from dagctx.protocol import messages as m

    from .peer import Peer
    from .records import RenderRecord, Rendering
    from .shared import CompactionState

T = TypeVar("T")


class Record(Protocol):
    @property
    def store(self) -> Store: ...

    @property
    def peer(self) -> Peer: ...

    @property
    def environ(self) -> Mapping[str, str]: ...

    def write_node(self, session_id: str, node: Any, *, move_head: bool | None = None,
                   derived: NodeDerived | None = None) -> AppendOutcome: ...

    def write(self, fn: Callable[..., T], *args: Any) -> Awaitable[T]: ...

    def announce(self, session_id: str, nodes: list[Any], head: str) -> None: ...

    def derive_node(self, role: str, input: Any, output: Any, name: str = "", *,  # noqa: A002
                    known: dict[str, tuple[int, int]] | None = None) -> NodeDerived: ...

    def lifecycle(self, step: str, *args: Any) -> None: ...

    def client_path(self, path: str, field: str = "path") -> str: ...

    def answer_limit(self) -> int | None: ...

    def offload(self, fn: Callable[[], T]) -> Awaitable[T]: ...


class Sampling(Protocol):
    @property
    def peer(self) -> Peer: ...

    @property
    def client_capabilities(self) -> dict[str, Any]: ...

    @property
    def options(self) -> m.InitializationOptions: ...

    @property
    def environ(self) -> Mapping[str, str]: ...

    @property
    def models(self) -> ModelTable: ...


class ViewHost(Protocol):
    @property
    def store(self) -> Store: ...

    @property
    def options(self) -> m.InitializationOptions: ...

    @property
    def models(self) -> ModelTable: ...

    @property
    def counter(self) -> TokenCounter: ...

    @property
    def aging_policy(self) -> AgingPolicy: ...

    def write_node(self, session_id: str, node: Any, *, move_head: bool | None = None,
                   derived: NodeDerived | None = None) -> AppendOutcome: ...


class Views(Protocol):
    def render(self, session_id: str, **options: Any) -> Rendering: ...

    def render_result(self, r: Rendering) -> c.RenderResult: ...

    def forget(self, render_id: str) -> None: ...

    def lookup_render(self, render_id: str) -> RenderRecord: ...

    def aging_for(self, session_id: str, head: str, model: ModelInfo, *, enabled: bool = True,
                  **options: Any) -> tuple[dict[str, str], dict[str, Any]]: ...

    def calibrated(self, session_id: str, model: str, estimate: int,
                   rec: RenderRecord | None) -> tuple[str, int]: ...

    def node_tokens(self, graph: SessionGraph, tokenizer: str) -> dict[str, tuple[int, int]]: ...

    def counts_of(self, graph: SessionGraph, node_id: str, tokenizer: str,
                  cache: dict[str, tuple[int, int]] | None = None) -> tuple[int, int]: ...

    def count_messages(self, graph: SessionGraph, messages: list[Any], node_ids: list[list[str]],
                       tokenizer: str, aged: dict[str, str], synthetic: dict[str, str] | None = None,
                       *, fmt: str = "neutral") -> list[int]: ...

    def ensure_system_prompt(self, session_id: str, graph: SessionGraph, options: PromptOptions,
                             workspace: str | None, **options_: Any) -> Any: ...

    def commit_system_prompt(self, session_id: str, render_id: str) -> None: ...


class Host(Record, Sampling, ViewHost, Protocol):
    @property
    def views(self) -> Views: ...

    @property
    def compaction_state(self) -> CompactionState: ...

    #: per-connection hand-over of the first build of a request to its reduction
    #: (``turn_reduction.TurnReducer``)
    turn_reducer: Any

    #: the context engines by name (``lifecycle.EngineRegistry``)
    context_engines: Any


__all__ = ["Host", "Record", "Sampling", "ViewHost", "Views"]
