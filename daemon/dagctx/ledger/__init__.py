"""The ledger: the session DAG (store), its rules, its in-memory walks (graph) and search,
over a storage backend (a SQLite file or a PostgreSQL server).

API Boundary: ``Store`` is the only way anything above reads or writes the record.
"""

from .backend import NodeDerived, UsageRow, is_postgres_url
from .graph import SessionGraph
from .store import AppendOutcome, AppendRequest, SpillPolicy, Store, spill_output

__all__ = ["AppendOutcome", "AppendRequest", "NodeDerived", "SessionGraph", "SpillPolicy", "Store", "UsageRow", "is_postgres_url", "spill_output"]
