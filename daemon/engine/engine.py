"""The engine: one object per connection that owns the store and the turn lifecycle.

Handlers call ``Engine`` methods named after protocol methods; the engine composes
the ledger (records) and ``context`` (pure functions over records). It knows the
client only as a ``Peer``.

Architecture Invariant: no JSON-RPC and no SQL here.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import msgspec

from dagctx import __version__
from dagctx.context.models import ModelTable
from dagctx.context.tokens import CL100K, ESTIMATE, O200K, TokenCounter, default_counter
from dagctx.ledger import Store, spill_output
from dagctx.protocol import messages as m
from dagctx.protocol.errors import DagctxError
from dagctx.protocol.methods import CLIENT_REQUESTS, PROTOCOL_VERSION, SERVER_NOTIFICATIONS

from dagctx.context import budget as budget_mod
from dagctx.context.system_prompt import PromptOptions
from dagctx.protocol import context as c

from . import imports, ledger_ops
from .views import ContextService, apply_turn_hooks
from .config import DaemonConfig, default_database
from .peer import NullPeer, Peer

log = logging.getLogger("dagctx.engine")

#: Payloads larger than this are tokenized in a worker thread, off the event loop.
BIG_PAYLOAD_CHARS = 200_000


class Engine:
    def __init__(self, config: DaemonConfig | None = None, peer: Peer | None = None) -> None:
        self.config = config or DaemonConfig()
        self.peer: Peer = peer or NullPeer()
        self._store: Store | None = None
        self.options = m.InitializationOptions()
        self.client_capabilities: dict[str, Any] = {}
        self.counter: TokenCounter = default_counter()
        self.models = ModelTable(counter=self.counter)
        self.views = ContextService(self)

    # ------------------------------------------------------------ lifecycle

    @property
    def store(self) -> Store:
        if self._store is None:
            raise DagctxError("ServerNotInitialized", "send initialize first")
        return self._store

    def initialize(self, p: m.InitializeParams) -> m.InitializeResult:
        self.options = p.initialization_options or m.InitializationOptions()
        self.client_capabilities = p.capabilities
        if self.options.config_file:
            self.models = self.models.load_config_file(self.options.config_file)
        if self.options.models:
            self.models = self.models.with_overrides(
                {name: msgspec.to_builtins(spec) for name, spec in self.options.models.items()}
            )
        path = self.options.database or self.config.database or default_database()
        try:
            self._store = Store(path)
        except Exception as exc:  # a bad path must be a clear error, not a dead daemon
            raise DagctxError(
                "InvalidParams",
                f"cannot open the database {path!r}: {exc}; pass a writable path in "
                "initializationOptions.database or DAGCTX_DB",
                path="initializationOptions.database",
            ) from exc
        return m.InitializeResult(
            server_info=m.ServerInfo(name="dagctx", version=__version__),
            protocol_version=PROTOCOL_VERSION,
            methods=list(CLIENT_REQUESTS),
            notifications=list(SERVER_NOTIFICATIONS),
            database=self._store.path,
            capabilities={"observeNodes": True, "sampling": "client-or-endpoint", "search": "fts5-cjk"},
        )

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None

    # ------------------------------------------------------------ ledger writes

    def _observe(self, method: str, session_id: str, node: Any, head: str) -> None:
        if self.options.observe_nodes:
            self.peer.notify(method, m.NodeNotification(session_id=session_id, node=node, head=head))

    # Token counts are computed once per node, on what the store keeps (after spill),
    # for every tokenizer a render may use; rendering never re-tokenizes.
    def tokenizers(self) -> list[str]:
        toks = [CL100K, ESTIMATE]
        if self.counter.o200k_available:
            toks.append(O200K)
        return toks

    def count_node(self, input: Any, output: Any) -> dict[str, tuple[int, int]]:
        stored, _ = spill_output(output, self.store.spill)
        cv = self.counter.count_value
        return {tok: (cv(input, tok), cv(stored, tok)) for tok in self.tokenizers()}

    def _payload_size(self, *values: Any) -> int:
        size = 0
        for v in values:
            if isinstance(v, str):
                size += len(v)
            elif v is not None:
                size += len(msgspec.json.encode(v))
        return size

    def node_append(self, p: m.NodeAppendParams) -> Any:
        if self._payload_size(p.node.input, p.node.output) > BIG_PAYLOAD_CHARS:
            return self._node_append_off_loop(p)
        return self._node_append(p, self.count_node(p.node.input, p.node.output))

    async def _node_append_off_loop(self, p: m.NodeAppendParams) -> m.NodeResult:
        counts = await asyncio.to_thread(self.count_node, p.node.input, p.node.output)
        return self._node_append(p, counts)

    def _node_append(self, p: m.NodeAppendParams, counts: dict[str, tuple[int, int]]) -> m.NodeResult:
        node = p.node
        if p.render_id is not None:
            # An llm call records what it was sent: the render's reads and manifest.
            rec = self.views.lookup_render(p.render_id)
            if rec.session_id != p.session_id:
                raise DagctxError("InvalidParams", "renderId belongs to another session", path="renderId")
            meta = dict(node.metadata)
            meta.setdefault("renderManifest", rec.manifest)
            node = msgspec.structs.replace(node, reads=node.reads or list(rec.reads), metadata=meta)
        out = self.store.append(p.session_id, node, move_head=p.move_head, token_counts=counts)
        self._observe("node/didAppend", p.session_id, out.node, out.head)
        return m.NodeResult(node=out.node, head=out.head)

    def node_update(self, p: m.NodeUpdateParams) -> m.NodeResult:
        counts = None
        if p.output is not None:
            old = self.store.graph(p.session_id).get(p.node_id)
            counts = self.count_node(old.input, p.output)
        out = self.store.update(
            p.session_id, p.node_id, status=p.status, output=p.output, metadata=p.metadata, token_counts=counts
        )
        self._observe("node/didUpdate", p.session_id, out.node, out.head)
        return m.NodeResult(node=out.node, head=out.head)

    def session_spawn(self, p: m.SessionSpawnParams) -> m.SessionSpawnResult:
        res = ledger_ops.session_spawn(self.store, p)
        self._observe("node/didAppend", p.session_id, res.node, res.head)
        return res

    # ------------------------------------------------------------ context methods

    def context_render(self, p: c.RenderParams) -> c.RenderResult:
        r = self.views.render(
            p.session_id, head=p.head, fmt=p.format, model=p.model, frame=p.frame, expose=p.expose,
            include_system=p.include_system,
        )
        return self.views.render_result(r)

    def context_replay(self, p: c.ReplayParams) -> c.ReplayResult:
        return self.views.replay(p)

    def usage_report(self, p: c.UsageReportParams) -> c.UsageReportResult:
        result, note = self.views.usage_report(p)
        if note is not None:
            self.peer.notify("context/compactionRecommended", note)
        return result

    def context_prepare(self, p: c.PrepareParams) -> c.PrepareResult:
        store = self.store
        path: list[str] = []
        graph = store.graph(p.session_id)
        head = p.head or store.head(p.session_id)
        graph.get(head)
        info = self.models.get(p.model or self.options.default_model)
        path.append(f"model {info.name}: window {info.context_window:,}, max output {info.max_output:,}"
                    + ("" if info.known else " (unknown model: default limits)"))
        workspace = p.workspace or self.options.workspace
        options = PromptOptions(
            mode=p.prompt_mode,
            identity=p.identity,
            agent_prompt=p.agent_prompt,
            prepend=p.prepend_system_context,
            append=p.append_system_context,
        )
        system_text, system_node, notes = self.views.ensure_system_prompt(p.session_id, graph, options, workspace)
        path.append(f"system prompt ({p.prompt_mode}): {len(system_text):,} chars, node {system_node}")
        hooks = {k: v for k, v in (("prependContext", p.prepend_context), ("memoryPrefetch", p.memory_prefetch)) if v}
        r = self.views.render(
            p.session_id, head=head, fmt=p.format, model=p.model, system_node_id=system_node,
            extra_manifest={"turnHooks": hooks} if hooks else None,
        )
        messages = apply_turn_hooks(r.messages, hooks, p.format)
        hook_tokens = sum(self.counter.count(v, r.tokenizer) for v in hooks.values())
        if r.view.summary_id:
            path.append(f"summary {r.view.summary_id} replaces {len(r.view.covered)} turns")
        tools_tokens = budget_mod.tools_schema_tokens(p.tools, self.counter, r.tokenizer)
        source, total = self.views.calibrated(p.session_id, info.name, r.total + hook_tokens, r.record)
        scale = total / max(1, r.total + hook_tokens)
        system_tokens = round(r.system_tokens * scale)
        history_tokens = max(0, total - system_tokens)
        b = budget_mod.compute_budget(info, system_tokens, history_tokens, tools_tokens,
                                      requested_output=p.max_output_tokens, source=source)
        path.append(f"budget: {b.input_used:,} of {b.input_budget:,} input tokens ({b.percent_used}%), "
                    f"reserve {b.output_reserve:,}, source {source}")
        newest_user = 0
        for msg, n in zip(reversed(r.messages), reversed(r.per_message)):
            if isinstance(msg, dict) and msg.get("role") == "user":
                newest_user = n
                break
        budget_mod.check_fits(b, system_tokens + tools_tokens + newest_user + hook_tokens, model=info)
        recommend, needs = budget_mod.thresholds(b)
        if needs:
            path.append("≥ 80 %: compaction needed" + ("" if p.allow_compaction else " (not allowed by the client)"))
        elif recommend:
            path.append("≥ 70 %: compaction recommended")
        return c.PrepareResult(
            system=system_text,
            messages=messages,
            reads=list(r.view.reads),
            budget=b,
            manifest=r.manifest,
            render_id=r.record.render_id,
            decision_path=path,
            recommend_compaction=recommend,
            needs_compaction=needs,
            stable_prefix=r.stable,
            summary_id=r.view.summary_id,
            notes=notes,
        )

    # ------------------------------------------------------------ the method table

    def handlers(self) -> dict[str, Callable[[Any], Any]]:
        """Protocol method → callable(params) returning a result (or an awaitable)."""
        s = lambda fn: (lambda p: fn(self.store, p))  # noqa: E731 - bind the store late
        return {
            "session/create": s(ledger_ops.session_create),
            "session/list": s(ledger_ops.session_list),
            "session/get": s(ledger_ops.session_get),
            "session/rename": s(ledger_ops.session_rename),
            "session/delete": s(ledger_ops.session_delete),
            "session/history": s(ledger_ops.session_history),
            "session/branches": s(ledger_ops.session_branches),
            "session/checkout": s(ledger_ops.session_checkout),
            "session/rewind": s(ledger_ops.session_rewind),
            "session/spawn": self.session_spawn,
            "session/nameBranch": s(ledger_ops.session_name_branch),
            "node/append": self.node_append,
            "node/update": self.node_update,
            "node/get": s(ledger_ops.node_get),
            "search/query": s(ledger_ops.search_query),
            "context/render": self.context_render,
            "context/prepare": self.context_prepare,
            "context/replay": self.context_replay,
            "usage/report": self.usage_report,
            "session/import": lambda p: imports.session_import(self, p),
        }
