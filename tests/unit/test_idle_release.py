"""The idle memory release (server/hub.py) keeps the tokenizers' encoders: rebuilding one
holds the interpreter lock for about a second, stalling every client of the daemon."""

from __future__ import annotations

import functools
import sys
import types

from dagctx.context import tokens
from dagctx.server import hub


def test_the_release_keeps_the_encoders_and_empties_other_memo_caches() -> None:
    encoder = tokens._cl100k()
    memo = types.ModuleType("dagctx.context._release_probe")
    memo.square = functools.lru_cache(maxsize=4)(lambda x: x * x)  # type: ignore[attr-defined]
    memo.square(3)  # type: ignore[attr-defined]
    sys.modules[memo.__name__] = memo
    try:
        hub._give_back_memory()
    finally:
        del sys.modules[memo.__name__]
    assert tokens._cl100k() is encoder
    assert memo.square.cache_info().currsize == 0  # type: ignore[attr-defined]
