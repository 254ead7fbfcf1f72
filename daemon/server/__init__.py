"""The stdio JSON-RPC server (pygls + msgspec). Only this package knows JSON-RPC."""
