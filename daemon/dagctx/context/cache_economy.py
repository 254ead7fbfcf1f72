"""When a compaction pays for the prompt-cache rewrite it causes (SPEC §7, compaction
signals). Pure.

A compaction breaks the provider's prompt cache: the request after it writes its whole
prefix again (1.25× a base input token), and the summarizer reads the history once (1×).
What it saves is on every later request: each one reads from the cache (0.1×) only what
is left after the compaction instead of everything the history has grown to. Compacting
at a fixed fill (e.g. 80 % of the window) ignores both sides: in a large window the
requests read tens of thousands of tokens that a compaction would have removed long
before, again and again; in a small one a compaction that keeps a large tail comes back
a few requests later and pays the rewrite again.

The rule here is the classic economic order quantity, run online. Let ``after`` be what
a request holds right after a compaction (fixed part + the kept tail + the summary).
Since the branch's last compaction (or its start), every request read ``tokens − after``
tokens more than it would have right after a compaction; the sum of those reads at the
cache-read price is what *not* compacting has cost so far (``carried``). A compaction
costs ``(write − read) × after`` for the rewrite plus ``tokens`` at the base price for
the summarizer reading the history (``cost``). Compaction pays once ``carried ≥ cost``:
the cycle length that minimizes the cost per request, whatever the growth per request
is, without knowing the future (the excess reads of a cycle equal its fixed cost at the
optimum). Two floors keep it useful: the request must hold at least ``MIN_GAIN`` times
``after`` (a compaction at least halves it), and no earlier request is counted when
there is none to learn from.

When the time since the branch's previous request is beyond the provider's cache
lifetime (known to the daemon: ``initializationOptions.promptCacheTtlSeconds``, default
5 minutes), the cache is cold: the request writes everything anyway, so the rewrite costs
nothing and the removable part would be written at 1.25× — compaction is preferred then.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .cache_breaks import READ_PRICE, WRITE_PRICE

#: price of the summarizer reading the history, in base input tokens per token
SUMMARIZER_PRICE = 1.0
#: a compaction is worth its break only when the request is at least this many times
#: what is left after it
MIN_GAIN = 2.0


@dataclass(frozen=True, slots=True)
class CompactionEconomy:
    """The numbers of the rule, for the decision path."""

    pays: bool
    #: what the requests since the last compaction read beyond ``after`` (cache-read price)
    carried: float
    #: what a compaction now costs: the rewrite of ``after`` and the summarizer's read
    cost: float
    #: estimated tokens of a request right after a compaction
    after: int
    #: requests counted (since the branch's last compaction)
    requests: int
    #: the provider's cache had expired (no rewrite to pay)
    cold: bool = False


def compaction_economy(previous: Iterable[int], tokens: int, after: int, *, cold: bool = False) -> CompactionEconomy:
    """Whether compacting before a request of ``tokens`` pays, given the prompt sizes
    of the branch's ``previous`` requests since its last compaction (oldest first) and
    ``after``, the estimated size of a request right after a compaction.

    ``cold``: the provider's cache has expired since the previous request (its lifetime
    passed). This request writes its whole prompt anyway, so a compaction now costs no
    rewrite, and the part it removes would be *written* (1.25×), not read (0.1×): the
    best moment for the break."""
    after = max(1, after)
    sizes = [t for t in previous if t > 0]
    excess = [max(0, t - after) for t in sizes]
    now = max(0, tokens - after)
    carried = READ_PRICE * sum(excess) + (WRITE_PRICE if cold else READ_PRICE) * now
    cost = (0.0 if cold else (WRITE_PRICE - READ_PRICE) * after) + SUMMARIZER_PRICE * tokens
    pays = bool(sizes) and tokens >= MIN_GAIN * after and carried >= cost
    return CompactionEconomy(pays, round(carried, 1), round(cost, 1), after, len(sizes), cold)


@dataclass(frozen=True, slots=True)
class AgingEconomy:
    """The numbers of the aging rule, for the decision path and the manifest."""

    pays: bool
    #: what the requests since the last cache break read of what the change removes (cache-read price)
    carried: float
    #: the rewrite of everything after the first changed result
    cost: float
    #: tokens the change removes
    freed: int
    #: tokens written again after the first changed result
    rewrite: int
    #: requests counted (since the branch's last cache break)
    requests: int
    cold: bool = False

    def as_dict(self) -> dict[str, object]:
        return {"carried": self.carried, "cost": self.cost, "freed": self.freed, "rewrite": self.rewrite,
                "requests": self.requests, "cold": self.cold}


def aging_economy(freed: int, rewrite: int, requests: int, *, cold: bool = False) -> AgingEconomy:
    """Whether changing which old tool results are aged pays for the cache break it causes
    (SPEC §8, aging and the prompt cache) — compaction's rule (``compaction_economy``) for
    aging: the ``requests`` since the branch's last cache break each read the ``freed``
    tokens the change removes (``carried``, at the cache-read price); the change rewrites
    ``rewrite`` tokens, everything after the first changed result (``cost``, the write
    price less the read it replaces). It pays once ``carried ≥ cost``; while the cache is
    ``cold`` it always does (nothing cached to rewrite). A change that frees nothing
    never pays."""
    carried = READ_PRICE * max(0, freed) * max(0, requests)
    cost = 0.0 if cold else (WRITE_PRICE - READ_PRICE) * max(0, rewrite)
    pays = cold or (freed > 0 and carried >= cost)
    return AgingEconomy(pays, round(carried, 1), round(cost, 1), freed, rewrite, requests, cold)


__all__ = ["MIN_GAIN", "SUMMARIZER_PRICE", "AgingEconomy", "CompactionEconomy", "aging_economy",
           "compaction_economy"]


def request_manifest(node: Any) -> dict[str, Any] | None:
    """The ``renderManifest`` of a request the branch handed out (SPEC §8): a top-level llm
    node's, not a frame's; None for any other node. The prompt-cache decisions (aging's
    pay-off, compaction's) count these."""
    if node.role != "llm" or node.caller is not None:
        return None
    man = node.metadata.get("renderManifest")
    return man if isinstance(man, dict) and man.get("frame") is None else None
