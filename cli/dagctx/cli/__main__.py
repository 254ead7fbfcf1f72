"""``python -m dagctx.cli``: the command line without the ``dagctx`` console script."""

import sys

from dagctx.cli import main

sys.exit(main())
