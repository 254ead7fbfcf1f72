"""Transcript importers: pure parsers that turn other agents' session logs into nodes.

Public API::

    detect_format(path) -> str
    parse_file(path, format="auto") -> list[Transcript]
    parse_path(path, format="auto", errors=None) -> list[Transcript]
    check_transcript(transcript) -> list[str]      # rule violations, [] when clean

``Transcript.nodes`` are ``NodeInput`` values with ids set, in an order the ledger can
append one by one; nothing here writes to the ledger.
"""

from dagctx.protocol.context_messages import Skipped

from .base import check_transcript, FORMATS, Transcript, UNKNOWN_MODEL
from .detect import detect_format
from .files import iter_file, iter_path, parse_file, parse_path, transcript_files

__all__ = [
    "FORMATS",
    "UNKNOWN_MODEL",
    "Skipped",
    "Transcript",
    "check_transcript",
    "detect_format",
    "iter_file",
    "iter_path",
    "transcript_files",
    "parse_file",
    "parse_path",
]
