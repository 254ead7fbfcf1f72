"""``dagctx ui``: a local web view of sessions, requests and summaries (see ``server``)."""
