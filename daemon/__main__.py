import sys

from dagctx.cli import main

sys.exit(main())
