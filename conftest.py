"""Guards for the whole suite (tests/ and integration/)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from connectors.services import spark_bytecode, spark_cds
from eos_core import faults

# Every JVM the suite starts (Spark drivers in-process and in the harness's subprocesses, local-cluster
# executors, standalone workers) is short-lived and small: C1 only and the serial GC cut its start-up
# and its first queries by a third to a half on 2 cores (measured: a local session's start 18 -> 10 s,
# two small queries 15 -> 9 s, under load). Set before any JVM starts; a user's own value is kept.
os.environ.setdefault("JDK_JAVA_OPTIONS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
# ... and Spark's JVMs map Spark's classes from a class-data-sharing archive (built once per machine, about
# 40 s): a local session's start and first query 8.9 -> 4.8 s. EOS_SPARK_CDS=0 leaves it out.
spark_cds.enable()
# ... and Spark's Python workers import PySpark from its zip with bytecode instead of compiling it at each
# start (connectors/services/spark_bytecode.py: 0.9 -> 0.25 s of CPU per worker; EOS_SPARK_BYTECODE=0: not)
spark_bytecode.precompile()


@pytest.fixture(autouse=True)
def _no_fault_group_aimed_at_pytest() -> Iterator[None]:
    """A kill-group fault in a child that inherits EOS_FAULTS_PGID naming pytest's own group would
    SIGKILL the whole test run (CI exit 137). No test may leave that behind; checked after each
    test, so the one that leaks it fails, not a later one."""
    yield
    leaked = os.environ.get(faults.ENV_PGID)
    assert leaked is None or int(leaked) != os.getpgrp(), f"{faults.ENV_PGID}={leaked} names pytest's own process group"


# `make test` runs the suite on two pytest workers (pytest-xdist, --dist loadgroup). Tests that share
# one machine-wide thing run on one worker, one after another: the private Docker engine and its
# images (one engine per worker would double its start and image builds), and the standalone Spark
# cluster tests (two clusters at once on 2 cores would starve each other's timed faults).
_GROUPS = {
    "test_docker_faults.py": "docker",
    "test_docker_hygiene.py": "docker",
    "test_cluster.py": "cluster",
    "test_speculation_cluster.py": "cluster",
    "test_chaos_cluster.py": "cluster",  # the chaos toolkit's own standalone cluster (slow-task)
    "test_kafka_broker_faults.py": "kafka-broker",  # one module broker of their own, not one per worker
}


def pytest_configure(config: pytest.Config) -> None:
    """On two or more workers with no Docker engine of the user's, the general services run embedded.

    A private dockerd (EOS_START_DOCKERD=1) exists for the container fault tests; its local images
    hold the same tansu and Postgres 15 binaries as the embedded services. Started per worker for the
    general services, it would run twice, and the second would rebuild its images on a throwaway data
    root. So only the worker that runs the docker group starts it; a user's engine is still used by
    every worker (their containers are told apart by a per-session label)."""
    workers = getattr(config.option, "numprocesses", None)
    if not workers or os.environ.get("PYTEST_XDIST_WORKER") or os.environ.get("EOS_SERVICES"):
        return
    from connectors.services import docker as engines

    if engines.want_private_engine() and not engines.ping(os.environ.get("DOCKER_HOST") or engines.DEFAULT_SOCKET):
        os.environ["EOS_SERVICES"] = "embedded"


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Group as above, and order the run: the slow integration tests first, the quick unit tests
    last, so two workers finish together instead of one waiting on a long test started last."""
    for item in items:
        group = _GROUPS.get(item.path.name)
        if group:
            item.add_marker(pytest.mark.xdist_group(group))

    def rank(item: pytest.Item) -> int:
        if item.path.parent.name != "integration":
            return 2
        return 0 if item.get_closest_marker("slow") or item.get_closest_marker("crash") else 1

    items.sort(key=rank)  # stable: within a rank, the files' own order
