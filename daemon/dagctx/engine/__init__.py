"""The turn lifecycle over the ledger and the context functions."""
