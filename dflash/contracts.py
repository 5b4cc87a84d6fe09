"""Every contract between the trainer and whoever deploys and watches it, as data: the states of
status.json and supervisor.json and what each means, the token store's format, the
supervisor's hang limit, and the flags of each command (dflash.flags). Stdlib only:

    python -m dflash.contracts

prints them as JSON. The toolkit reads the records themselves, which say what they mean
(`state_is`, supervisor.json's `hang_after_s`, a store manifest's `summary_keys` and `bytes`),
and checks a store against the format of the release it deploys with this command; a person
or another tool reads the same here instead of in the code.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from dflash.data.store_format import ARRAY_FILES, FORMAT, MANIFEST, SUMMARY_KEYS, VERSION
from dflash.flags import PARSERS, describe
from dflash.supervision.record import HANG_FLOOR_S, HANG_STEPS, SUPERVISOR_FILE
from dflash.supervision.states import MEANINGS, STATES, SUPERVISOR_MEANINGS, SUPERVISOR_STATES


def contracts() -> dict[str, Any]:
    return {
        "status": {"file": "status.json", "states": STATES, "meanings": MEANINGS},
        "supervisor": {
            "file": SUPERVISOR_FILE,
            "states": SUPERVISOR_STATES,
            "meanings": SUPERVISOR_MEANINGS,
            # hang_after auto: max(steps x the median step, floor_s); the record says the limit.
            "hang_limit_auto": {"steps": HANG_STEPS, "floor_s": HANG_FLOOR_S},
        },
        "store": {
            "format": FORMAT,
            "version": VERSION,
            "manifest": MANIFEST,
            "arrays": {name: {"file": f, "dtype": d} for name, (f, d) in ARRAY_FILES.items()},
            "summary_keys": list(SUMMARY_KEYS),
        },
        "flags": {command: describe(parser()) for command, parser in PARSERS.items()},
    }


def main() -> int:
    print(json.dumps(contracts(), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
