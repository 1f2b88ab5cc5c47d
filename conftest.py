"""Guards for the whole suite (tests/ and integration/)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from connectors import faults

# Every JVM the suite starts (Spark drivers in-process and in the harness's subprocesses, local-cluster
# executors, standalone workers) is short-lived and small: C1 only and the serial GC cut its start-up
# and its first queries by a third to a half on 2 cores (measured: a local session's start 18 -> 10 s,
# two small queries 15 -> 9 s, under load). Set before any JVM starts; a user's own value is kept.
os.environ.setdefault("JDK_JAVA_OPTIONS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")


@pytest.fixture(autouse=True)
def _no_fault_group_aimed_at_pytest() -> Iterator[None]:
    """A kill-group fault in a child that inherits EOS_FAULTS_PGID naming pytest's own group would
    SIGKILL the whole test run (CI exit 137). No test may leave that behind; checked after each
    test, so the one that leaks it fails, not a later one."""
    yield
    leaked = os.environ.get(faults.ENV_PGID)
    assert leaked is None or int(leaked) != os.getpgrp(), f"{faults.ENV_PGID}={leaked} names pytest's own process group"
