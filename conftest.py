"""Guards for the whole suite (tests/ and integration/)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from connectors import faults


@pytest.fixture(autouse=True)
def _no_fault_group_aimed_at_pytest() -> Iterator[None]:
    """A kill-group fault in a child that inherits EOS_FAULTS_PGID naming pytest's own group would
    SIGKILL the whole test run (CI exit 137). No test may leave that behind; checked after each
    test, so the one that leaks it fails, not a later one."""
    yield
    leaked = os.environ.get(faults.ENV_PGID)
    assert leaked is None or int(leaked) != os.getpgrp(), f"{faults.ENV_PGID}={leaked} names pytest's own process group"
