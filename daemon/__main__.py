"""``python -m dagctx``: the entry shim for the command line (``dagctx.cli``).

The one place under ``daemon/`` that reaches above the daemon: it only dispatches.
"""

import sys

from dagctx.cli import main

sys.exit(main())
