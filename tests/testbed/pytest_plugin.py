"""pytest fixture for the loopback Proxmox node. Load it from a conftest.py:

    pytest_plugins = ["tests.testbed.pytest_plugin"]

`proxmox_testbed` (session scope) yields a started `Testbed` (see bed.py). Without root, LXC or
sshd it skips with the reason; with the environment variable CI set it fails instead, so CI can
not pass by skipping. `DFLASH_TESTBED_CONTAINERS` sets how many containers (default 2).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from types import FrameType

import pytest

from .bed import Testbed, missing_prerequisites


def _skip_or_fail(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"loopback Proxmox test bed unavailable (CI is set, so not skipping): {reason}")
    pytest.skip(f"loopback Proxmox test bed unavailable: {reason}")


def _interrupt_on_sigterm() -> object:
    """A SIGTERM (a CI timeout, `kill`) becomes KeyboardInterrupt, so finalizers still run."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    return signal.signal(signal.SIGTERM, handler)


@pytest.fixture(scope="session")
def proxmox_testbed(request: pytest.FixtureRequest) -> Iterator[Testbed]:
    problems = missing_prerequisites()
    if problems:
        _skip_or_fail("; ".join(problems))
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")

    def log(message: str) -> None:
        if reporter is not None:
            reporter.write_line(message)

    containers = int(os.environ.get("DFLASH_TESTBED_CONTAINERS", "2"))
    # Installed before bring-up: a SIGTERM while containers start must still tear them down
    # (up() cleans up after any exception, KeyboardInterrupt included).
    previous = _interrupt_on_sigterm()
    request.addfinalizer(lambda: signal.signal(signal.SIGTERM, previous))  # type: ignore[arg-type]
    bed = Testbed.up(containers=containers, log=log)
    request.addfinalizer(lambda: bed.down(log=log))
    yield bed
