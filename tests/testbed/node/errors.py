"""The two types every double shares: Proxmox's error (CLI exit code, HTTP code, per-key
errors) and a task the API or the CLI runs (its worker is a Node method)."""

from __future__ import annotations

from dataclasses import dataclass


class PveError(RuntimeError):
    """An error the way Proxmox reports it: the message (the CLI prints it; the API sends its
    first line as the HTTP reason), the CLI's exit code, the HTTP code and per-key errors."""

    def __init__(self, message: str, exit_code: int = 255, code: int = 500,
                 errors: dict[str, str] | None = None) -> None:  # fmt: skip
        super().__init__(message)
        self.exit_code = exit_code
        self.code = code
        self.errors = errors or {}

    @classmethod
    def param(cls, key: str, problem: str) -> PveError:
        """pve-common src/PVE/Exception.pm `raise_param_exc`: HTTP 400 with per-key errors."""
        return cls(f"400 Parameter verification failed.\n{key}: {problem}", code=400,
                   errors={key: problem})  # fmt: skip


@dataclass(frozen=True)
class Task:
    kind: str  # the UPID's type: vzstart, vzsnapshot, ...
    ident: str  # the UPID's id: the VMID
    op: str  # the Node method that does the work
    args: tuple[object, ...]
