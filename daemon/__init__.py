"""dagctx: a context engine daemon for LLM agents."""

__version__ = "0.1.0"
