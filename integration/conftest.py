"""Integration test harness: the shared fixtures live in plugin modules under integration/fixtures."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from connectors import faults

pytest_plugins = [
    "integration.fixtures.services",
    "integration.fixtures.kafka",
    "integration.fixtures.postgres",
    "integration.fixtures.spark",
]
# The docker engineer's fixtures join when their module exists.
if (Path(__file__).parent / "fixtures" / "docker.py").exists():
    pytest_plugins.append("integration.fixtures.docker")


@pytest.fixture(autouse=True)
def _no_fault_group_aimed_at_pytest() -> Iterator[None]:
    """A kill-group fault in a child that inherits EOS_FAULTS_PGID naming pytest's own group would
    SIGKILL the whole test run (CI exit 137). Nothing may leave that behind."""
    yield
    leaked = os.environ.get(faults.ENV_PGID)
    assert leaked is None or int(leaked) != os.getpgrp(), f"{faults.ENV_PGID}={leaked} names pytest's own process group"
