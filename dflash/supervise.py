"""python -m dflash.supervise [policy] -- COMMAND: run.sh's trainer under a restart policy
(the supervisor is dflash/supervision/supervisor.py; its policy's flags are dflash/flags.py's)."""

import sys

from dflash.supervision.supervisor import main

if __name__ == "__main__":
    sys.exit(main())
