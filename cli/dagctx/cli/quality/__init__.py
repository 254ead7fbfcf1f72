"""``dagctx eval``: the quality of dagctx's context decisions, measured without a model.

A client of the real daemon like any editor (``dagctx.client``): transcripts are imported
into a scratch database, each session is replayed step by step through ``context/prepare``
(compacting when the daemon recommends it) at one or more context windows, and what the
daemon handed out is measured:

* ``identifiers``  — the identifier classes (paths, URLs, hashes, ids, symbols, numbers),
  an extractor of our own, independent of the daemon's reference miner;
* ``summarizer``   — the deterministic summarizer stand-in (clearly labelled, no model);
* ``replay``       — importing, replaying, recording every request as handed out;
* ``cache``        — M5: byte-stable prefixes of consecutive requests, cache writes/reads
  and their cost, breaks by cause, and the two baselines;
* ``metrics``      — M1–M7 per session and in total (M1 recovers through the same tools
  ``dagctx mcp`` gives a model: ``search_history``, ``read_node``, ``expand_summary``);
* ``report``       — the terminal table, the JSON document and the SVG plots.
"""
