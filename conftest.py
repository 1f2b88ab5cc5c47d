"""Guards for the whole suite (tests/ and integration/)."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from connectors.services import _proc, spark_bytecode, spark_cds
from eos_core import faults

# Every JVM the suite starts (Spark drivers in-process and in the harness's subprocesses, local-cluster
# executors, standalone workers) is short-lived and small: C1 only and the serial GC cut its start-up
# and its first queries by a third to a half on 2 cores (measured: a local session's start 18 -> 10 s,
# two small queries 15 -> 9 s, under load). Set before any JVM starts; a user's own value is kept.
os.environ.setdefault("JDK_JAVA_OPTIONS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
# ... and their scratch files (Spark's spark-*, blockmgr-* and artifacts-* dirs, the native libraries lz4-java,
# snappy and RocksDB unpack) go in one directory of the run's, removed at its end (a crashed run's by the next):
# a SIGKILLed JVM removes none of its own, and the suite kills hundreds (a pipeline run by the harness has a
# directory of its own, connectors.toolkit.harness.PipelineProcess). Unset, ~10 GB piled up in /tmp over a day
# of runs and filled this machine's disk mid-suite. xdist's workers inherit the controller's.
if "-Djava.io.tmpdir=" not in os.environ["JDK_JAVA_OPTIONS"]:
    _scratch = Path(tempfile.mkdtemp(prefix="eos-suite-jvm-"))
    _proc.sweep_stale("eos-suite-jvm-")
    _proc.claim_dir(_scratch)
    atexit.register(shutil.rmtree, _scratch, True)
    os.environ["JDK_JAVA_OPTIONS"] += f" -Djava.io.tmpdir={_scratch}"
# ... and each spark-submit (every session the suite starts) finds Spark without asking Python: unset,
# PySpark's bin/find-spark-home runs find_spark_home.py through `python3` (on a pyenv machine three bash
# scripts first) for every JVM start. The suite's Spark is the venv's PySpark; a test that runs another
# installation (test_toolkit_wheel.py's venv) drops it from its children's environment.
os.environ.setdefault("SPARK_HOME", str(spark_cds.spark_home()))
# The suite runs as users deploy: the session's embedded Apache Kafka has a SASL_SSL listener with ACLs
# enforced (issue 44), as `spark-eos services up` and `make demo` start it; the connectors log in as app
# principals. EOS_KAFKA_SECURITY=plaintext is the explicit lab choice. Modules that crash a broker of their
# own secure it alike (integration/fixtures/kafka.py: module_broker, own_broker); the peer suite (Spark's own
# source beside ours) and test_kafka_marker_reads.py (its reader runs before its broker exists) run plaintext.
os.environ.setdefault("EOS_KAFKA_SECURITY", "sasl_ssl")
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


@pytest.fixture(autouse=True)
def _unit_tests_see_no_kafka_config(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A unit test under tests/ runs as on a machine without EOS_KAFKA_CONFIG: on a worker that ran an
    integration test first, the secured session's broker names its admin's properties there."""
    if request.node.nodeid.startswith("tests/"):
        monkeypatch.delenv("EOS_KAFKA_CONFIG", raising=False)


# `make test` runs the suite on two pytest workers (pytest-xdist, --dist loadgroup). Tests that share
# one machine-wide thing run on one worker, one after another (pytest_xdist_make_scheduler below): the
# private Docker engine and its images (one engine per worker would double its start and image builds),
# and the standalone Spark cluster tests (two clusters at once on 2 cores would starve each other's
# timed faults).
_GROUPS = {
    "integration/test_docker_faults.py": "docker",
    "integration/test_docker_hygiene.py": "docker",
    "integration/test_cluster.py": "cluster",
    "integration/test_speculation_cluster.py": "cluster",
    "integration/test_chaos_cluster.py": "cluster",  # the chaos toolkit's own standalone cluster (slow-task)
    "integration/test_kafka_broker_faults.py": "kafka-broker",  # one module broker of their own, not one per worker
    # ... and modules whose module-scoped service or environment would otherwise be built on both workers
    "integration/test_kafka_cluster.py": "kafka-cluster",  # one three-node cluster at a time (each ~1 GB, 3 JVMs)
    "integration/test_chaos_replicated.py": "kafka-cluster",
    "integration/test_toolkit_wheel.py": "wheel",  # one venv with the wheel and its Spark's class archive (~85 s)
    "integration/test_kafka_sink_crash.py": "kafka-sink-crash",  # its broker with a 1 s transaction cleanup
    "integration/test_services_apache_kafka.py": "apache-kafka-broker",
    "integration/test_services_postgres.py": "own-postgres",
    "integration/test_schema_registry.py": "schema-registry",  # one registry (~20-40 s to start), not one per worker
    "integration/test_source_avro.py": "schema-registry",
    "integration/test_sink_avro.py": "schema-registry",
    "integration/test_sink_json_schema.py": "schema-registry",
    "integration/test_source_json_schema.py": "schema-registry",
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


def xdist_group_of(nodeid: str) -> str | None:
    """The group of a test by its node id ("integration/test_cluster.py::test_x[a]" -> "cluster"), if any."""
    return _GROUPS.get(nodeid.split("::", 1)[0])


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """``--dist loadgroup`` by the groups above, read from the node ids.

    pytest-xdist 3.8 tells a test's group to its scheduler by appending "@group" to the node id its
    worker reports, through ``item._nodeid``; pytest 9 keeps the id elsewhere (``item._id``), so the
    suffix never arrives and every grouped test was scheduled on its own: both workers built the shipped
    environment and ran a standalone cluster at once, and both set up the container fault tests.
    The scheduler here asks ``xdist_group_of`` instead (tests/test_suite_groups.py proves the placement)."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class ByFile(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            group = xdist_group_of(nodeid)
            return f"group:{group}" if group else super()._split_scope(nodeid)

    return ByFile(config, log)


@pytest.hookimpl(tryfirst=True)  # the markers before xdist's own hook reads them (for an xdist that can)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Group as above, and order the run: the slow integration tests first, the quick unit tests
    last, so two workers finish together instead of one waiting on a long test started last."""
    for item in items:
        group = xdist_group_of(item.nodeid)
        if group:
            item.add_marker(pytest.mark.xdist_group(group))

    def rank(item: pytest.Item) -> int:
        if item.path.parent.name != "integration":
            return 2
        return 0 if item.get_closest_marker("slow") or item.get_closest_marker("crash") else 1

    items.sort(key=rank)  # stable: within a rank, the files' own order


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """With EOS_TEST_TIMELINE=<file>, each test's start and end (setup to teardown, module fixtures
    included) on its worker, appended as "start end worker nodeid": where the CI's two cores wait."""
    path = os.environ.get("EOS_TEST_TIMELINE")
    start = time.time()
    yield
    if path:
        with open(path, "a") as out:
            out.write(f"{start:.1f} {time.time():.1f} {os.environ.get('PYTEST_XDIST_WORKER', 'main')} {item.nodeid}\n")
