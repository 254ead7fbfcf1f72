"""Writing nodes: appends (one, a batch, a group commit), the one mutation, spawn roots.

``Appends`` adds to ``StoreBase`` every write that creates or fills a node, each inside
one write transaction: the rules (``rules.py``) are checked against the up-to-date graph
before a row is written, a long result is spilled once (``spill.py``), the node row
carries what the layers above derived (tokens, references) and its search text, and HEAD
moves only as the rules say. ``append_group`` is the writer thread's group commit
(SPEC §4.2): many units in one transaction, each all or nothing, failures isolated per unit;
its node rows go to the database at the group's end, one statement a table
(``Backend.insert_nodes``), instead of one statement (or two) an append.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from dagctx.protocol.errors import DagctxError
from dagctx.protocol.nodes import Call, NodeInput

from . import rules
from .backend import NodeDerived, NodeRow, SessionRow, WouldWait
from .graph import SessionGraph
from .spill import spill_output
from .store_base import StoreBase
from .text import node_text


@dataclass
class AppendOutcome:
    node: Call
    head: str
    moved: bool


@dataclass
class AppendRequest:
    """One unit of a group commit: nodes appended to one session, all or none of them
    (``node/append`` is a unit of one, ``node/appendBatch`` a unit of many)."""

    session_id: str
    nodes: Sequence[NodeInput]
    move_head: bool | None = None
    #: per node, what the layers above derived (or None)
    derived: Sequence[NodeDerived | None] | None = None
    #: ``node/appendBatch``: errors name the node's index (``nodes[2].predecessor``)
    batch: bool = False
    #: what computes ``derived`` when the layers above left it to whoever runs the unit:
    #: the writer thread, before the group's transaction (``Writer._derive``), so a
    #: pipelining client's token counts are taken beside the event loop, not on it
    derive: Callable[[], Sequence[NodeDerived | None]] | None = None

    def derive_now(self) -> None:
        """``derived`` computed, when it was left to be (``derive``); an error is the unit's."""
        if self.derive is not None:
            derive, self.derive = self.derive, None
            self.derived = derive()


class _Redo(Exception):
    """A unit failed after it wrote: the group is rolled back and run again without it."""

    def __init__(self, index: int, error: BaseException) -> None:
        self.index = index
        self.error = error


class _Unplaced(Exception):
    """The database refused something while a unit ran. In a group the answer may belong to
    an earlier unit's write: PostgreSQL's pipeline mode delivers a refused row's error at a
    later sync point, inside whichever unit happens to be running, and the group's node rows
    are written by one statement for all its units. The group is rolled back and each unit
    runs alone, so only the culprit fails."""

    def __init__(self, index: int, error: BaseException) -> None:
        self.index = index
        self.error = error


class Appends(StoreBase):
    """The writes that create or fill a node (mixed into ``store.Store``)."""

    def append(
        self,
        session_id: str,
        node: NodeInput,
        *,
        move_head: bool | None = None,
        derived: NodeDerived | None = None,
    ) -> AppendOutcome:
        with self._write(session_id):
            row, g = self._locked(session_id)
            outcome = self._append_locked(row, g, node, move_head, derived)
            self._finish(row, g)
        return outcome

    def append_many(
        self,
        session_id: str,
        nodes: Iterable[NodeInput],
        *,
        head: str | None = None,
        derived: dict[str, NodeDerived] | None = None,
    ) -> list[Call]:
        """Append a batch in one transaction (imports); HEAD moves to ``head`` if given.

        All or nothing: one invalid node rolls the whole batch back.
        """
        out: list[Call] = []
        with self._write(session_id):
            row, g = self._locked(session_id)
            for inp in nodes:
                d = derived.get(inp.id) if derived and inp.id is not None else None
                out.append(self._append_locked(row, g, inp, False, d).node)
            if head is not None:
                target = g.get(rules.resolve(row.root_id, head) or head)
                rules.check_head_target(g, target)
                row.head = target.id
            self._finish(row, g)
        return out

    def alone_likely(self) -> bool:
        """Whether ``append_alone`` would run a unit now, at a glance (the backend's
        ``nowait_likely``: on SQLite one read of the WAL index header, on PostgreSQL never):
        when not, its caller hands the unit to the writer thread before deriving it, and the
        writer counts it beside the event loop (SPEC §4.2) instead of the loop counting it for
        a try that is refused."""
        return self.backend.nowait_likely()

    def append_alone(self, unit: AppendRequest) -> list[AppendOutcome] | BaseException | None:
        """``append_group([unit])`` on the caller's thread, when nothing makes it wait: the
        store's locks are free (no write, no graph refresh of another thread under way), the
        file is still the one opened (no reopen), and the backend starts the transaction
        without waiting (``transaction(nowait=True)``: no other process's lock, no sync at
        ``COMMIT``, SQLite only). The commit, the rules, seq, HEAD, the search row and a
        failure's isolation are ``append_group``'s own (SPEC §4.2, §5). None: nothing was
        tried or written — hand the unit to the writer thread."""
        if not self._wlock.acquire(blocking=False):
            return None
        try:
            if not self.lock.acquire(blocking=False):
                return None
            try:  # (a file to reopen is refused too: reopening may wait, the writer thread's)
                result = self.append_group([unit], nowait=True)[0]
            finally:
                self.lock.release()
        finally:
            self._wlock.release()
        return None if isinstance(result, WouldWait) else result

    def append_group(self, units: Sequence[AppendRequest], *,
                     nowait: bool = False) -> list[list[AppendOutcome] | BaseException]:
        """Group commit (SPEC §4.2): every unit in ONE transaction (one sync), each unit
        all or nothing, failures isolated per unit, in the order given.

        Each unit meets the rules exactly as a lone ``append`` would, after the units before
        it: seq and HEAD are per session, as if the units had been appended one by one. A
        unit the rules refuse before it wrote anything just answers its error; a unit that
        fails after writing (a later node of a batch) rolls the group back, and the group
        runs again without it; a row the database refuses (whose error may surface while a
        later unit runs) rolls the group back and runs each unit alone. A fault of the database itself
        (full, read-only, gone, a failing COMMIT) fails every unit of the group: none was
        written. Returns, per unit, its outcomes or the exception it answers.
        ``nowait``: the backend's (``transaction``); a unit it refuses answers ``WouldWait``.
        """
        results: list[list[AppendOutcome] | BaseException] = [RuntimeError("not run")] * len(units)
        todo = list(range(len(units)))
        while todo:
            sids = sorted({units[i].session_id for i in todo})
            done: dict[int, list[AppendOutcome] | BaseException] = {}
            try:
                with self._write_many(sids, group=True, nowait=nowait):
                    state: dict[str, tuple[SessionRow, SessionGraph, int] | BaseException] = {}
                    # every session of the group locked in one round trip, in id order
                    locked = self.backend.lock_sessions(sids)
                    for sid in sids:
                        row = locked.get(sid)
                        if row is None:
                            self._graphs.pop(sid, None)
                            state[sid] = DagctxError(
                                "SessionNotFound",
                                f"session {sid!r} does not exist; list sessions with session/list "
                                "or create one with session/create",
                                session_id=sid,
                            )
                        else:
                            state[sid] = (row, self._refresh(row), row.rev)
                    pending: list[NodeRow] = []
                    for i in todo:
                        done[i] = self._apply_unit(i, units[i], state[units[i].session_id], pending)
                    if pending:
                        self._insert_pending(todo, pending)
                    for st in state.values():
                        if isinstance(st, tuple) and st[0].rev != st[2]:
                            self._finish(st[0], st[1])
            except _Redo as redo:
                results[redo.index] = redo.error
                todo.remove(redo.index)
                continue
            except _Unplaced as un:
                if len(todo) == 1:
                    results[un.index] = un.error
                    return results
                for i in todo:
                    results[i] = self.append_group([units[i]])[0]
                return results
            except BaseException as exc:
                if len(todo) > 1 and isinstance(exc, Exception) and not isinstance(exc, DagctxError) \
                        and self.backend.fault_kind(exc) is None:
                    # Not a fault of the database but of some row, found only at COMMIT (a
                    # deferred constraint): each unit alone, so only the culprit fails.
                    for i in todo:
                        results[i] = self.append_group([units[i]])[0]
                    return results
                for i in todo:
                    results[i] = exc
                return results
            for i in todo:
                results[i] = done[i]
            return results
        return results

    def _insert_pending(self, todo: list[int], pending: list[NodeRow]) -> None:
        """The group's node rows, one statement a table. A row the database refuses fails
        the statement, and so every row of it: the group is rolled back and each unit runs
        alone (``_Unplaced``), as when a lone statement's refusal surfaces late."""
        try:
            if len(pending) == 1:  # a lone append (one sequential client): its one statement
                self.backend.insert_node(pending[0])
            else:
                self.backend.insert_nodes(pending)
        except Exception as exc:
            if isinstance(exc, DagctxError) or self.backend.fault_kind(exc) is not None:
                raise  # the database's fault: every unit of the group fails
            raise _Unplaced(todo[0], exc) from exc

    def _apply_unit(self, index: int, unit: AppendRequest,
                    st: tuple[SessionRow, SessionGraph, int] | BaseException,
                    pending: list[NodeRow]) -> list[AppendOutcome] | BaseException:
        if isinstance(st, BaseException):
            return st
        row, g, _ = st
        rev0 = row.rev
        derived = unit.derived or [None] * len(unit.nodes)
        out: list[AppendOutcome] = []
        try:
            for k, (inp, d) in enumerate(zip(unit.nodes, derived)):
                # In a batch, moveHead is about its conversation nodes; a nested call never moves HEAD.
                mh = None if unit.batch and unit.move_head and inp.predecessor is None else unit.move_head
                try:
                    out.append(self._append_locked(row, g, inp, mh, d, pending=pending))
                except DagctxError as err:
                    if unit.batch:
                        rest = err.path[len("node"):] if err.path and err.path.startswith("node") else (
                            f".{err.path}" if err.path else "")
                        err.path = f"nodes[{k}]{rest}"
                        err.message = f"nodes[{k}]: {err.message}; nothing of the batch was written"
                    raise
        except DagctxError as err:
            if row.rev == rev0:
                return err  # refused before it wrote: its group-mates go on
            raise _Redo(index, err) from err
        except Exception as exc:
            if self.backend.fault_kind(exc) is not None:
                raise  # the database's fault: every unit of the group fails
            raise _Unplaced(index, exc) from exc
        return out

    def _append_locked(
        self,
        row: SessionRow,
        g: SessionGraph,
        inp: NodeInput,
        move_head: bool | None,
        derived: NodeDerived | None,
        *,
        spawn_ok: bool = False,
        created_at: float | None = None,
        skeleton: bool = False,
        pending: list[NodeRow] | None = None,
    ) -> AppendOutcome:
        """One node appended inside the caller's write; ``pending``: its row is added there,
        for the caller to write with others (a group), instead of written now."""
        node_id = inp.id if inp.id is not None else uuid.uuid4().hex
        rules.check_new_id(g, node_id)
        predecessor = rules.resolve(row.root_id, inp.predecessor)
        caller = rules.resolve(row.root_id, inp.caller)
        # Errors name the client's id, never one made up for a node that was not written.
        rules.check_edges(g, row.head, inp.id, inp, predecessor, caller, spawn_ok=spawn_ok)
        rules.check_reasoning(inp.role, inp.metadata)

        output, spilled = spill_output(inp.output, self.spill, role=inp.role, name=inp.name)
        metadata = dict(inp.metadata)
        if spilled is not None:
            metadata["spill"] = {k: v for k, v in spilled.items() if k != "data"}
        call = Call(
            id=node_id,
            seq=row.next_seq,
            created_at=time.time() if created_at is None else created_at,
            role=inp.role,
            name=inp.name,
            input=inp.input,
            output=output,
            status=inp.status,
            caller=caller,
            predecessor=predecessor,
            reads=list(inp.reads),
            metadata=metadata,
        )
        # Decide HEAD before anything is written: a refused moveHead writes nothing.
        new_head, moved = rules.head_after_append(g, row.head, call, move_head)
        row.rev += 1
        row.next_seq += 1
        row.node_count += 1
        full = node_text(call) if spilled is None else node_text(msgspec.structs.replace(call, output=spilled["data"]))
        node_row = self._node_row(row.id, call, rev=row.rev, derived=derived, search_text=full)
        if pending is None:
            self.backend.insert_node(node_row)
        else:
            pending.append(node_row)
        if spilled is not None:
            self.backend.put_blob(self._blob(row.id, node_id, spilled))
        # ``skeleton``: a graph only the rules read (an import's, never cached) keeps no texts
        g.add(msgspec.structs.replace(call, input=None, output=None) if skeleton else call)
        g.nbytes += len(node_row.body)  # what a refresh would have decoded (the cache bound's weight)
        if moved:
            if call.predecessor == row.head:
                rules.move_branch_name(row.metadata.get("_branches"), row.head, call.id)
            row.head = new_head
        return AppendOutcome(call, row.head, moved)

    # ------------------------------------------------------------ the one mutation

    def update(
        self,
        session_id: str,
        node_id: str,
        *,
        status: str,
        output: Any = None,
        metadata: dict[str, Any] | None = None,
        derived: NodeDerived | None = None,
    ) -> AppendOutcome:
        """Fill a running node (SPEC §4). ``derived`` replaces the parts of the stored
        derived data it holds; a part it lacks is kept (an update without a new output)."""
        with self._write(session_id):
            row, g = self._locked(session_id)
            old = g.get(node_id)
            rules.check_update(session_id, old, status)
            rules.check_reasoning(old.role, metadata or {}, "metadata.reasoning")
            new_output, spilled = spill_output(output if output is not None else old.output, self.spill,
                                               role=old.role, name=old.name)
            meta = {**old.metadata, **(metadata or {})}
            if spilled is not None:
                meta["spill"] = {k: v for k, v in spilled.items() if k != "data"}
            row.rev += 1
            call = msgspec.structs.replace(old, output=new_output, status=status, metadata=meta)
            full = node_text(call) if spilled is None else node_text(
                msgspec.structs.replace(call, output=spilled["data"])
            )
            node_row = self._node_row(session_id, call, rev=row.rev, derived=derived, search_text=full)
            self.backend.fill_node(node_row)
            if spilled is not None:
                self.backend.put_blob(self._blob(session_id, node_id, spilled))
            g.add(call)
            g.nbytes += len(node_row.body)
            self._finish(row, g)
        return AppendOutcome(call, row.head, False)

    # ------------------------------------------------------------ spawn-branch roots

    def spawn(
        self,
        session_id: str,
        caller_id: str,
        *,
        source: str = "spawn",
        name: str | None = None,
        output: Any = None,
        metadata: dict[str, Any] | None = None,
    ) -> AppendOutcome:
        """Create a spawn-branch root (SPEC §4): the only way to make one."""
        with self._write(session_id):
            row, g = self._locked(session_id)
            caller = g.get(rules.resolve(row.root_id, caller_id) or caller_id)
            row.rev += 1
            meta = dict(metadata or {})
            meta.update({"spawn_branch_root": True, "source": source})
            call = Call(
                id=uuid.uuid4().hex,
                seq=row.next_seq,
                created_at=time.time(),
                role="user",
                name=name or source,
                output=output,
                caller=caller.id,
                predecessor=None,
                metadata=meta,
            )
            row.next_seq += 1
            row.node_count += 1
            self.backend.insert_node(self._node_row(row.id, call, rev=row.rev, search_text=node_text(call)))
            g.add(call)
            if name:
                row.metadata.setdefault("_branches", {})[call.id] = name
            self._finish(row, g)
        return AppendOutcome(call, row.head, False)
