"""Fixtures of the Proxmox tests: the session's test bed, reset before each test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.testbed.bed import Testbed

# Importing the fixture registers it here (pytest_plugins is allowed only in the top conftest).
from tests.testbed.pytest_plugin import proxmox_testbed  # noqa: F401


@pytest.fixture
def bed(proxmox_testbed: Testbed) -> Iterator[Testbed]:  # noqa: F811 - the fixture, by name
    """The session's bed with every container at its default config and running."""
    proxmox_testbed.reset()
    yield proxmox_testbed
