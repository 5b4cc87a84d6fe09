"""python -m dflash.data (dflash/data/cli.py)."""

import sys

from dflash.data.cli import main

sys.exit(main())
