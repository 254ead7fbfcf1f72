"""The build's version: one value for the daemon, every client and the package metadata.

``pyproject.toml`` repeats it (a test keeps the two equal).
"""

__version__ = "0.1.0"
