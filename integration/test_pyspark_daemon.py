"""The suite's Spark (connectors.services.spark.local_session) forks its Python workers from our daemon."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.integration]


def _probe(_: object) -> list[tuple[str, bool, int]]:
    import gc
    import os
    import sys

    parent = open(f"/proc/{os.getppid()}/cmdline", "rb").read().replace(b"\0", b" ").decode()
    return [(parent, "sinks.postgres" in sys.modules, gc.get_freeze_count())]


def test_python_workers_are_forked_from_the_preloading_daemon(spark) -> None:
    assert spark.conf.get("spark.python.daemon.module") == "connectors.launch.pyspark_daemon"
    seen = spark.sparkContext.parallelize(range(2), 2).mapPartitions(_probe).collect()
    assert len(seen) == 2
    for parent, preloaded, frozen in seen:
        assert "-m connectors.launch.pyspark_daemon pyspark.worker" in parent, parent  # not PySpark's own daemon
        assert preloaded  # imported by the daemon before the fork (this task imports nothing of ours)
        # the daemon's heap frozen before the fork: PySpark's collection after each task leaves it out
        assert frozen > 50_000, frozen
