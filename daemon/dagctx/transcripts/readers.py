"""The registry of transcript readers: every module of this package that defines
``READER`` (a ``base.Reader``), found on first use. A new format is one module plus its
name in the wire ``ImportFormat``; a test keeps the two equal.
"""

from __future__ import annotations

import importlib
import pkgutil
from functools import cache

from .base import Reader


@cache
def readers() -> dict[str, Reader]:
    """Every reader by wire name (the parser modules are imported on first use)."""
    package = __name__.rpartition(".")[0]
    found: dict[str, Reader] = {}
    for mod in sorted(pkgutil.iter_modules(importlib.import_module(package).__path__), key=lambda m: m.name):
        reader = getattr(importlib.import_module(f"{package}.{mod.name}"), "READER", None)
        if isinstance(reader, Reader):
            found[reader.name] = reader
    return found


def reader(name: str) -> Reader:
    found = readers().get(name)
    if found is None:
        raise ValueError(f"unknown transcript format {name!r}; expected one of {', '.join(readers())}")
    return found
