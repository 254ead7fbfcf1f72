"""The ledger: the session DAG (store), its rules, its in-memory walks (graph) and search,
over a storage backend (a SQLite file or a PostgreSQL server).

API Boundary: ``Store`` is the only way anything above reads or writes the record.
"""

from .backend import NodeDerived, UsageRow
from .backends import BACKENDS, backend_for, names_a_file
from .graph import SessionGraph
from .appends import AppendOutcome, AppendRequest
from .spill import SpillPolicy, spill_output
from .store import Store

__all__ = ["BACKENDS", "AppendOutcome", "AppendRequest", "NodeDerived", "SessionGraph", "SpillPolicy", "Store", "UsageRow",
           "backend_for", "names_a_file", "spill_output"]
