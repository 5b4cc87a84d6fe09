"""What the doubles share with Proxmox's CLIHandler: option parsing and error exits."""

from __future__ import annotations

import sys

# `typing` costs ~13 ms to import, on every `pct exec`; annotations only need it for checkers.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import NoReturn

# Perl's `die` exits with errno when set, else 255; a missing config leaves ENOENT (2).
EXIT_DIE = 255
EXIT_ENOENT = 2


def die(message: str, code: int = EXIT_DIE) -> NoReturn:
    sys.stderr.write(message.rstrip("\n") + "\n")
    sys.stdout.flush()
    raise SystemExit(code)


def param_error(errors: dict[str, str], usage: str = "") -> NoReturn:
    """Proxmox's parameter check failure: `400 Parameter verification failed.` + one per key."""
    lines = ["400 Parameter verification failed."]
    lines += [f"{key}: {value}" for key, value in errors.items()]
    if usage:
        lines.append(usage)
    die("\n".join(lines))


def split_options(args: list[str]) -> tuple[list[str], dict[str, list[str]]]:
    """Positional arguments and `-key value` / `--key value` options (repeatable keys)."""
    positional: list[str] = []
    options: dict[str, list[str]] = {}
    index = 0
    while index < len(args):
        arg = args[index]
        if arg.startswith("-") and len(arg) > 1 and not arg.lstrip("-").isdigit():
            key, sep, value = arg.lstrip("-").partition("=")
            if not sep:
                if index + 1 >= len(args):
                    param_error({key: "missing value for option"})
                index += 1
                value = args[index]
            options.setdefault(key, []).append(value)
        else:
            positional.append(arg)
        index += 1
    return positional, options


def check_vmid(value: str | None, usage: str) -> int:
    if value is None:
        param_error({"vmid": "property is missing and it is not optional"}, usage)
    if not value.isdigit():
        param_error({"vmid": f"type check ('integer') failed - got '{value}'"}, usage)
    vmid = int(value)
    if not 100 <= vmid <= 999999999:
        param_error({"vmid": "value must have a minimum value of 100"}, usage)
    return vmid
