"""The build's version: one value for the daemon, every client and the package metadata.

``pyproject.toml`` repeats ``__version__`` (a test keeps the two equal). This module
imports nothing, so the forwarder (``dagctx serve``) can name the per-user daemon's
socket from these three values without paying for msgspec (SPEC §1.2).
"""

__version__ = "0.1.0"

#: The wire protocol's version (``initialize`` → ``protocolVersion``).
PROTOCOL_VERSION = "1.0"

#: The ledger's schema version; a test keeps it equal to ``dagctx.ledger.schema``'s.
LEDGER_SCHEMA_VERSION = 5
