"""The engine: one object per connection, over the database it shares with others.

Handlers call ``EngineCore`` methods named after protocol methods; the engine composes
the ledger (records) and ``context`` (pure functions over records). It knows the
client only as a ``Peer``. What is per connection lives here (options, capabilities,
models, aging policy, context engines, the peer); what every connection on the same
database shares — the store, its caches, compaction cooldowns — lives in
``EngineShared`` (``shared.py``).

Every node-creating write goes through ``write_node`` (SPEC §1.5): it counts the
node's tokens (serializing the payload once), appends, tells the connection and the
subscribers, and runs the context engine's ``ingest`` hook.

Architecture Invariant: no JSON-RPC and no SQL here.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

import msgspec

from dagctx.protocol.version import __version__
from dagctx.context import aging
from dagctx.context.aging import AgingPolicy
from dagctx.context.char_classes import counts_and_classes, stored_classes
from dagctx.context.models import ModelTable
from dagctx.context.tokens import CL100K, ESTIMATE, O200K, TokenCounter, default_counter
from dagctx.ledger import AppendOutcome, NodeDerived, Store, names_a_file, spill_output
from dagctx.protocol import context_messages as c
from dagctx.protocol import messages as m
from dagctx.protocol.errors import DagctxError
from dagctx.protocol.methods import CLIENT_REQUESTS, PROTOCOL_VERSION, SERVER_NOTIFICATIONS

from dagctx.context.turn_reduction import Reductions

from . import (compaction_pipeline, exports, imports, ledger_ops, memory, memory_search, migration, node_appends,
               summary_sources, turn_reduction)
from .config import (
    SEARCH_CAPABILITY,
    DaemonConfig,
    contain_caches,
    default_database,
    env_database,
    read_config_file,
    redact_database,
)
from .heads import check_head
from .lifecycle import EngineRegistry
from .peer import NullPeer, Peer
from .shared import ALONE_APPEND_CHARS, BIG_PAYLOAD_CHARS, CompactionState, EngineShared, OpenDatabase
from .views import ContextService
from .watch import SessionWatch

log = logging.getLogger("dagctx.engine")

T = TypeVar("T")


#: The longest path and file name a path the client names may have (Linux ``PATH_MAX``,
#: ``NAME_MAX``): longer ones are refused as InvalidParams before any system call.
PATH_MAX = 4096
NAME_MAX = 255



def _no_change(session_id: str, written: frozenset[str]) -> None:
    return None


class EngineCore:
    def __init__(self, config: DaemonConfig | None = None, peer: Peer | None = None,
                 shared: EngineShared | None = None) -> None:
        self.config = config or DaemonConfig()
        self.peer: Peer = peer or NullPeer()
        self._owns_shared = shared is None
        self.shared = shared or EngineShared()
        self.db: OpenDatabase | None = None
        self._store: Store | None = None
        #: what the client's process would have used (the forwarder's ``$/dagctx/attach``)
        self.client_database: str | None = None
        #: the client's working directory, when it differs from the daemon's (forwarded)
        self.client_cwd: str | None = None
        #: the client's environment (SPEC §1.3): this process's own when standalone; in the
        #: shared daemon only what the forwarder attached (the daemon's own is never read)
        self.environ: Mapping[str, str] = {} if self.config.shared else os.environ
        #: called after every write with the session and the ids of nodes written
        #: (the server tells subscribers); a no-op in-process
        self.on_change: Callable[[str, frozenset[str]], None] = _no_change
        #: runs heavy local work of async operations (compaction's planning, an import's
        #: write) where the server runs heavy views — off its event loop; None: inline
        self.heavy_runner: Callable[[Callable[[], Any]], Awaitable[Any]] | None = None
        #: queues work that outlives its request in the daemon's work pool (set by the server;
        #: None in process: nothing is preloaded) — the memory vectors' background reads (SPEC §5.1)
        self.background_runner: Callable[[Callable[[], None]], Any] | None = None
        #: True when the server runs every handler in a worker thread (SPEC §1.4): a big
        #: payload is then derived right there instead of hopping to another thread
        self.in_worker = False
        #: the largest answer the connection takes, in framed bytes (set by the server: the
        #: connection's frame limit, SPEC §1.4); None in process: no limit
        self.frame_limit: Callable[[], int] | None = None
        self.options = m.InitializationOptions()
        #: this connection's id, named as ``origin`` in notifications
        self.connection_id: str | None = None
        self.client_capabilities: dict[str, Any] = {}
        contain_caches()  # before tiktoken loads an encoding (SPEC §6)
        self.counter: TokenCounter = default_counter()
        self.models = ModelTable(counter=self.counter)
        self.views = ContextService(self)
        self.context_engines = EngineRegistry()
        self.aging_policy = AgingPolicy()
        self.compaction_state = CompactionState()
        self.turn_reducer = turn_reduction.TurnReducer(self)

    # ------------------------------------------------------------ lifecycle

    @property
    def store(self) -> Store:
        if self._store is None:
            raise DagctxError("ServerNotInitialized", "send initialize first")
        return self._store

    def initialize(self, p: m.InitializeParams) -> m.InitializeResult:
        self.options = p.initialization_options or m.InitializationOptions()
        self.client_capabilities = p.capabilities
        summary_sources.check_options(self)
        if self.options.config_file:
            cfg = self.client_path(self.options.config_file, "initializationOptions.configFile")
            try:
                raw = read_config_file(cfg)
            except FileNotFoundError:
                raw = None  # the table words the error
            self.models = self.models.load_config_file(cfg, raw=raw)
        if self.options.models:
            self.models = self.models.with_overrides(self.options.models)
        if self.options.aging is not None:
            try:  # the Struct checked names, types and ranges at the door (SPEC §2)
                self.aging_policy = AgingPolicy.from_options(self.options.aging)
            except (TypeError, ValueError) as exc:
                raise DagctxError("InvalidParams", f"initializationOptions.aging is invalid: {exc}",
                                  path="initializationOptions.aging") from exc
        # The shared daemon's environment is not the client's: there the forwarder says
        # which database the client named (SPEC §1.3), and the daemon's own DAGCTX_DB
        # is never consulted.
        env = None if self.config.shared else env_database()
        explicit = self.options.database or self.client_database or self.config.database or env
        if explicit and names_a_file(explicit):
            name = self.client_path(explicit, "initializationOptions.database")
        else:
            name = explicit or default_database()
        try:
            # SPEC §2.1: a postgresql:// URL is a server, anything else a SQLite file. Only the
            # default location is created; a path the user named must be in a folder that
            # exists (a typo must not create directories anywhere).
            self.db = self.shared.acquire(name, create_parent=not explicit,
                                          timeout=self.options.storage_timeout_seconds)
            self._store = self.db.store
            self.views.use_caches(self.db.caches)
            self.compaction_state = self.db.compaction
        except DagctxError:
            raise  # the backend's own words: a bad URL, a server down, a missing file
        except Exception as exc:  # a bad path must be a clear error, not a dead daemon
            raise DagctxError(
                "InvalidParams",
                f"cannot open the database {redact_database(name)!r}: {exc}; pass a writable path or a "
                "postgresql:// URL in initializationOptions.database or DAGCTX_DB",
                path="initializationOptions.database",
            ) from exc
        memory.preload(self)  # the memory vectors read in the background (SPEC §5.1)
        return m.InitializeResult(
            server_info=m.ServerInfo(name="dagctx", version=__version__),
            protocol_version=PROTOCOL_VERSION,
            methods=list(CLIENT_REQUESTS),
            notifications=list(SERVER_NOTIFICATIONS),
            database=self._store.path,
            capabilities={"observeNodes": True, "sampling": "client-or-endpoint", "search": SEARCH_CAPABILITY,
                          "storage": self._store.kind},
        )

    def database_warnings(self) -> list[str]:
        """What the user should know about the open database (its backend says: a SQLite
        file other users may read, SPEC §2.1); shown once when a connection initializes."""
        return self.db.store.warnings() if self.db is not None else []

    @property
    def database_key(self) -> str:
        """The open database's key (its real path or URL): what connections on it share."""
        if self.db is None:
            raise DagctxError("ServerNotInitialized", "send initialize first")
        return self.db.key

    def watch(self, session_id: str) -> SessionWatch:
        """A cursor over what changes in a session, for subscribers (SPEC §1.5)."""
        return SessionWatch.open(self.store, session_id)

    async def offload(self, fn: Callable[[], T]) -> T:
        """``fn()``, run by ``heavy_runner`` when the server set one (SPEC §1.4)."""
        if self.heavy_runner is None:
            return fn()
        return await self.heavy_runner(fn)

    def answer_limit(self) -> int | None:
        """The most bytes one framed answer may hold (SPEC §1.4), None when unlimited: what
        an answer built a piece at a time stops at (``ResponseTooLarge``)."""
        return None if self.frame_limit is None else self.frame_limit()

    def client_path(self, path: str, field: str = "path") -> str:
        """A path the client named, as the client meant it: ``~`` expanded, and relative to
        the client's working directory (the shared daemon's own is ``/``). A path no file
        system can hold (longer than ``PATH_MAX``, or a name longer than ``NAME_MAX``) is
        ``InvalidParams`` naming ``field``."""
        path = os.path.expanduser(path)
        if self.client_cwd and not os.path.isabs(path):
            path = os.path.join(self.client_cwd, path)
        raw = os.fsencode(path)
        longest = max((len(part) for part in raw.split(b"/")), default=0)
        if len(raw) >= PATH_MAX or longest > NAME_MAX:
            what = (f"is {len(raw):,} bytes long (at most {PATH_MAX - 1:,})" if len(raw) >= PATH_MAX
                    else f"has a name of {longest:,} bytes (at most {NAME_MAX})")
            raise DagctxError("InvalidParams", f"the path in {field} {what}; name an existing, shorter path",
                              path=field)
        return path

    def storage_error_of(self, exc: BaseException) -> DagctxError | None:
        """What the server answers for an exception no handler mapped: the documented kind
        of a storage fault of this connection's database, or None (an internal error)."""
        db = self.db
        return None if db is None else db.store.storage_error_of(exc)

    def close(self) -> None:
        if self.db is not None:
            self.shared.release(self.db)
            self.db = None
            self._store = None
        if self._owns_shared:
            self.shared.close_all()

    # ------------------------------------------------------------ ledger writes

    #: sessions this connection subscribed to (the server hears of them there instead)
    subscribed: frozenset[str] | set[str] = frozenset()

    def _observe(self, method: str, session_id: str, node: Any, head: str) -> None:
        if self.options.observe_nodes and session_id not in self.subscribed:
            self.peer.notify(method, m.NodeNotification(session_id=session_id, node=node, head=head,
                                                        origin=self.connection_id))
        if method == "node/didAppend":
            self.lifecycle("ingest", session_id, node)

    def lifecycle(self, step: str, *args: Any) -> None:
        """Tell the daemon's context engine about a lifecycle step (session_start, ingest,
        after_turn, session_end). A failing plugin hook is logged, never fatal."""
        engine, _ = self.context_engines.get(self.options.context_engine or "default", self)
        try:
            getattr(engine, step)(*args)
        except Exception as exc:
            log.error("context engine %r failed in %s", engine.name, step, exc_info=exc)

    # Token counts are computed once per node, on what the store keeps (after spill),
    # for every tokenizer a render may use; rendering never re-tokenizes.
    def tokenizers(self) -> list[str]:
        toks = [CL100K, ESTIMATE]
        if self.counter.o200k_available:
            toks.append(O200K)
        return toks

    def _count_stored(self, input: Any, stored: Any, known: dict[str, tuple[int, int]] | None = None,
                      ) -> tuple[dict[str, tuple[int, int]], bytes | None]:
        """Tokens for every tokenizer (those in ``known`` taken from it), each value
        serialized once for all of them; and the character counts of the values that are
        texts, their estimate read off them (``counts_and_classes``, SPEC §6)."""
        toks = self.tokenizers()
        rest = [tok for tok in toks if not known or tok not in known]
        (ins, cin), (outs, cout) = (counts_and_classes(self.counter, v, rest) for v in (input, stored))
        tokens = {tok: (ins[tok], outs[tok]) if tok in ins else known[tok] for tok in toks}  # type: ignore[index]
        return tokens, stored_classes(cin, cout)

    def derive_node(self, role: str, input: Any, output: Any, name: str = "", *,
                    known: dict[str, tuple[int, int]] | None = None) -> NodeDerived:
        """What the ledger keeps beside a node, computed once on what the store will keep
        (after spilling): token counts for every tokenizer, and for a tool result its
        ranked references (SPEC §8), so no render re-tokenizes or re-mines old output.
        ``known``: (input, output) counts the caller already took of these very values
        for some tokenizers (a compaction's validation counted its summary), used when
        nothing is spilled."""
        stored, _ = spill_output(output, self.store.spill, role=role, name=name)
        refs = aging.stored_references(stored) if role == "code" and stored is not None else None
        tokens, chars = self._count_stored(input, stored, known if stored is output else None)
        return NodeDerived(tokens=tokens, refs=refs, chars=chars)

    @staticmethod
    def _payload_chars(*values: Any, limit: int = BIG_PAYLOAD_CHARS) -> int:
        """About how many characters ``values`` hold: string lengths, and for JSON values a
        walk (a container counts its length, a scalar 8) that stops as soon as the sum passes
        ``limit`` (no encoding): exact up to it, some number above it past it. One walk answers
        every question of a smaller limit: whether counting should leave the event loop
        (``BIG_PAYLOAD_CHARS``) and whether an append may commit there (``ALONE_APPEND_CHARS``)."""
        size = 0
        stack = list(values)
        while stack:
            v = stack.pop()
            if isinstance(v, str):
                size += len(v)
            elif isinstance(v, dict):
                size += len(v)
                stack.extend(v.keys())
                stack.extend(v.values())
            elif isinstance(v, list):
                size += len(v)
                stack.extend(v)
            elif v is not None:
                size += 8
            if size > limit:
                return size
        return size

    @classmethod
    def _payload_is_big(cls, *values: Any, limit: int = BIG_PAYLOAD_CHARS) -> bool:
        """Whether counting should leave the event loop (``_payload_chars`` past ``limit``)."""
        return cls._payload_chars(*values, limit=limit) > limit

    def write_node(self, session_id: str, node: Any, *, move_head: bool | None = None,
                   derived: NodeDerived | None = None) -> AppendOutcome:
        """The one write path for a new node, for callers already off the event loop (a
        view in a worker thread): derive, append, announce, ingest."""
        if derived is None:
            derived = self.derive_node(node.role, node.input, node.output, node.name)
        out = self.store.append(session_id, node, move_head=move_head, derived=derived)
        self.announce(session_id, [out.node], out.head)
        return out

    async def write_node_async(self, session_id: str, node: Any, *, move_head: bool | None = None,
                               derived: NodeDerived | None = None) -> AppendOutcome:
        """``write_node`` from the event loop: the append goes to the database's writer
        thread and is committed with the other appends waiting there (group commit)."""
        derive = None
        size = self._payload_chars(node.input, node.output)  # one walk for every limit below
        if derived is None:
            if size > BIG_PAYLOAD_CHARS:
                derived = await asyncio.to_thread(self.derive_node, node.role, node.input, node.output, node.name)
            else:  # counted where the unit runs: by the writer thread beside the loop, or here when alone
                derive = functools.partial(self.derive_node, node.role, node.input, node.output, node.name)
        out = await self._db().calls.append(session_id, node, move_head=move_head, derived=derived,
                                            alone=size <= ALONE_APPEND_CHARS, derive=derive)
        self.announce(session_id, [out.node], out.head)
        return out

    def _db(self) -> OpenDatabase:
        if self.db is None:
            raise DagctxError("ServerNotInitialized", "send initialize first")
        return self.db

    async def _derive(self, role: str, input: Any, output: Any, name: str = "") -> NodeDerived:
        if self._payload_is_big(input, output):
            return await asyncio.to_thread(self.derive_node, role, input, output, name)
        return self.derive_node(role, input, output, name)

    def write(self, fn: Callable[..., T], *args: Any) -> Awaitable[T]:
        """A store write from the event loop, run by the database's writer thread."""
        return self._db().calls.write(fn, *args)

    def announce(self, session_id: str, nodes: list[Any], head: str) -> None:
        """Nodes were written (by ``write_node`` or in bulk by an import): tell this
        connection (``observeNodes``), the subscribers, and the context engine."""
        for node in nodes:
            self._observe("node/didAppend", session_id, node, head)
        self.on_change(session_id, frozenset(n.id for n in nodes))

    def node_append(self, p: m.NodeAppendParams) -> Awaitable[m.NodeResult]:
        return node_appends.node_append(self, p)

    def _with_render(self, session_id: str, render_id: str, node: Any, path: str) -> Any:
        """An llm call records what it was sent: the render's reads and manifest."""
        rec = self.views.lookup_render(render_id)
        if rec.session_id != session_id:
            raise DagctxError("InvalidParams", "renderId belongs to another session", path=path)
        meta = dict(node.metadata)
        meta.setdefault("renderManifest", rec.manifest)
        if rec.decision_path is not None:
            meta.setdefault("decisionPath", rec.decision_path)
        return msgspec.structs.replace(node, reads=node.reads or list(rec.reads), metadata=meta)

    def node_append_batch(self, p: m.NodeAppendBatchParams) -> Awaitable[m.NodeBatchResult]:
        return node_appends.node_append_batch(self, p)

    def node_update(self, p: m.NodeUpdateParams) -> Awaitable[m.NodeResult]:
        return self._node_update(p)

    async def _node_update(self, p: m.NodeUpdateParams) -> m.NodeResult:
        derived = None
        if p.output is not None:
            old = await asyncio.get_running_loop().run_in_executor(
                self._db().executor, lambda: self.store.graph(p.session_id).get(p.node_id))
            derived = await self._derive(old.role, old.input, p.output, old.name)
        out = await self.write(lambda: self.store.update(
            p.session_id, p.node_id, status=p.status, output=p.output, metadata=p.metadata, derived=derived
        ))
        self._observe("node/didUpdate", p.session_id, out.node, out.head)
        self.on_change(p.session_id, frozenset((out.node.id,)))
        return m.NodeResult(node=out.node, head=out.head)

    async def session_spawn(self, p: m.SessionSpawnParams) -> m.SessionSpawnResult:
        res = await self.write(ledger_ops.session_spawn, self.store, p)
        self.announce(p.session_id, [res.node], res.head)
        return res

    # ------------------------------------------------------------ context methods

    def context_render(self, p: c.RenderParams) -> Any:
        check_head(self.store.graph(p.session_id), p.head)
        if p.budget:
            return self._render_with_budget(p)
        return _page(self._render_whole(p), p.range)

    def _render_whole(self, p: c.RenderParams) -> c.RenderResult:
        head = p.head or self.store.head(p.session_id)
        info = self.models.get(p.model or self.options.default_model)
        aged, stats = self.views.aging_for(p.session_id, head, info, enabled=p.aging, frame=p.frame)
        r = self.views.render(
            p.session_id, head=head, fmt=p.format, model=p.model, frame=p.frame, expose=p.expose,
            include_system=p.include_system, aged=aged, extra_manifest=stats.get("manifest"),
            reasoning=p.reasoning,
        )
        return self.views.render_result(r)

    def _render_with_budget(self, p: c.RenderParams) -> Any:
        """``context/render`` checked against the budget; reduced within the turn when over (SPEC §8)."""
        turn_reduction.time_limit(p.reduction_timeout_seconds, "params.reductionTimeoutSeconds")
        head = p.head or self.store.head(p.session_id)
        info = self.models.get(p.model or self.options.default_model)
        built = turn_reduction.build_render(self, p, Reductions())
        if built.fits:
            return _page(built.result, p.range)
        return self._reduce_render(p, head, info, built)

    async def _reduce_render(self, p: c.RenderParams, head: str, info: Any,
                             first: turn_reduction.Built) -> c.RenderResult:
        built, rep = await turn_reduction.reduce(
            self, lambda red: turn_reduction.build_render(self, p, red), session_id=p.session_id, head=head,
            info=info, token=p.work_done_token, first=first,
            seconds=turn_reduction.time_limit(p.reduction_timeout_seconds, "params.reductionTimeoutSeconds"),
        )
        result = built.result
        result.reduction = rep
        return _page(result, p.range)

    def context_replay(self, p: c.ReplayParams) -> c.ReplayResult:
        return self.views.replay(p)

    async def usage_report(self, p: c.UsageReportParams) -> c.UsageReportResult:
        result, note = await self.write(self.views.usage_report, p)
        if note is not None:
            self.peer.notify("context/compactionRecommended", note)
        self.lifecycle("after_turn", p.session_id, p.node_id, p)
        return result

    async def session_create(self, p: m.SessionCreateParams) -> m.SessionCreateResult:
        res = await self.write(ledger_ops.session_create, self.store, p)
        self.lifecycle("session_start", res.session_id)
        return res

    async def session_delete(self, p: m.SessionRef) -> m.SessionDeleteResult:
        res = await self.write(ledger_ops.session_delete, self.store, p)
        self.lifecycle("session_end", p.session_id)
        return res

    def context_prepare(self, p: c.PrepareParams) -> Any:
        """One turn's preparation: the chosen context engine's turn template
        (``ContextEngine.turn``: prepare, then compact and reduce only when needed, SPEC §7,
        §8); a plugin engine that fails is replaced by the default, said in the decision path."""
        turn_reduction.time_limit(p.reduction_timeout_seconds, "params.reductionTimeoutSeconds")
        check_head(self.store.graph(p.session_id), p.head)  # before any engine walks from it
        name = p.context_engine or self.options.context_engine or "default"
        engine, note = self.context_engines.get(name, self)
        notes = [note] if note else []
        if engine.name != "default":
            try:
                return engine.turn(p)
            except DagctxError as err:
                if err.kind in ("BudgetExceeded", "SessionNotFound", "NodeNotFound"):
                    raise
                notes.append(f"engine {engine.name!r} failed ({err.kind}: {err.message}); used the default engine")
            except Exception as exc:  # a plugin never takes the daemon down
                log.error("context engine %r failed", engine.name, exc_info=exc)
                notes.append(f"engine {engine.name!r} failed ({type(exc).__name__}: {exc}); used the default engine")
        default, _ = self.context_engines.get("default", self)
        result = default.turn(p)
        return _with_notes(result, notes) if notes else result

    # ------------------------------------------------------------ the method table

    def handlers(self) -> dict[str, Callable[[Any], Any]]:
        """Protocol method → callable(params) returning a result (or an awaitable)."""
        s = lambda fn: (lambda p: fn(self.store, p))  # noqa: E731 - bind the store late
        w = lambda fn: (lambda p: self.write(fn, self.store, p))  # noqa: E731 - in the writer thread
        return {
            "session/create": self.session_create,
            "session/list": s(ledger_ops.session_list),
            "session/get": s(ledger_ops.session_get),
            "id/resolve": s(ledger_ops.id_resolve),
            "session/rename": w(ledger_ops.session_rename),
            "session/delete": self.session_delete,
            "session/history": s(ledger_ops.session_history),
            "session/branches": s(ledger_ops.session_branches),
            "session/graph": s(ledger_ops.session_graph),
            "session/checkout": w(ledger_ops.session_checkout),
            "session/rewind": w(ledger_ops.session_rewind),
            "session/spawn": self.session_spawn,
            "session/nameBranch": w(ledger_ops.session_name_branch),
            "node/append": self.node_append,
            "node/update": self.node_update,
            "node/appendBatch": self.node_append_batch,
            "node/get": s(ledger_ops.node_get),
            "search/query": s(ledger_ops.search_query),
            "context/render": self.context_render,
            "context/prepare": self.context_prepare,
            "context/replay": self.context_replay,
            "usage/report": self.usage_report,
            "session/import": lambda p: imports.session_import(self, p),
            "context/compact": lambda p: compaction_pipeline.compact(self, p),
            "session/export": lambda p: exports.session_export(self, p),
            "database/migrate": lambda p: migration.database_migrate(self, p),
            "memory/index": lambda p: memory.memory_index(self, p),
            "memory/status": lambda p: memory.memory_status(self, p),
            "memory/search": lambda p: memory_search.memory_search(self, p),
            "memory/get": lambda p: memory.memory_get(self, p),
        }


    def quick_handlers(self) -> dict[str, Callable[[Any, bool], Any]]:
        """The reads the server may answer on its event loop (SPEC §1.4): protocol method →
        callable(params, same_batch) returning the method's own answer when it is at hand
        without any wait, else None — the server then runs the method's handler as usual.
        The same Structs come back either way, so the two paths cannot answer differently.
        ``same_batch``: a quick read of the same client read has just looked for changes
        to the file; the reads that arrived together may share that look (SPEC §1.4)."""
        def quick(fn: Callable[[Store, Any, bool], Any]) -> Callable[[Any, bool], Any]:
            return lambda p, same_batch: None if self._store is None else fn(self._store, p, same_batch)

        return {
            "session/list": quick(ledger_ops.session_list_nowait),
            "session/get": quick(ledger_ops.session_get_nowait),
        }

    def quick_marker(self) -> Callable[[], Any] | None:
        """What reads the database's mark for the quick reads' kept answers
        (``Store.nowait_marker``, SPEC §1.4): an answer given after a mark was read is still
        the answer while the mark is equal; None where there is none."""
        return None if self._store is None else self._store.nowait_marker()

    def quick_watch(self) -> Any:
        """What a reader thread polls beside its client's input for the marks of
        ``quick_marker`` (``Store.nowait_watch``); None where there is none."""
        return None if self._store is None else self._store.nowait_watch()


def _with_notes(result: Any, notes: list[str]) -> Any:
    """``result`` (a result or an awaitable of one) with ``notes`` opening its decision path."""
    if isinstance(result, c.PrepareResult):
        result.decision_path = notes + result.decision_path
        return result

    async def later() -> c.PrepareResult:
        done = await result
        done.decision_path = notes + done.decision_path
        return done

    return later()


def _page(result: c.RenderResult, range: c.MessageRange | None) -> c.RenderResult:
    """The asked slice of a render's messages (SPEC §6): ``messageCount`` counts them all,
    ``tokens.perMessage`` follows the slice, ``tokens.total`` stays the whole render's."""
    result.message_count = len(result.messages)
    if range is None:
        return result
    end = None if range.limit is None else range.offset + range.limit
    result.messages = result.messages[range.offset:end]
    result.tokens = msgspec.structs.replace(result.tokens, per_message=result.tokens.per_message[range.offset:end])
    return result
