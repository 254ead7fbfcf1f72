"""dagctx."""
