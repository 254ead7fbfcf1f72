"""The ledger: the session DAG in SQLite (store), its in-memory walks (graph) and search.

API Boundary: ``Store`` is the only way anything above reads or writes the record.
"""

from .graph import SessionGraph
from .store import AppendOutcome, SpillPolicy, Store, UsageRow, spill_output

__all__ = ["AppendOutcome", "SessionGraph", "SpillPolicy", "Store", "UsageRow", "spill_output"]
