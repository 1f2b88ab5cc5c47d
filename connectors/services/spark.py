"""The SparkSession spark-eos uses in tests, the CLI and the crash harness (local, or a cluster for the CLI)."""

from __future__ import annotations

import os
import sys
from typing import Any

from connectors.launch import pyspark_daemon

__all__ = ["local_session"]

DEFAULT_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "2",
    **pyspark_daemon.CONF,  # Python workers forked with our modules loaded
}


def local_session(
    app: str = "spark-eos",
    master: str | None = "local[2,2]",
    *,
    log_level: str = "ERROR",
    register: bool = True,
    same_python: bool = True,
    **conf: str,
) -> Any:
    """A SparkSession on ``master`` with the UI off, 2 shuffle partitions, quiet logs, our formats registered
    and our Python worker daemon (``connectors.launch.pyspark_daemon``).

    ``local[2,2]`` gives task retries (a failed task is tried twice), which exactly-once code must
    survive. With ``same_python`` (this machine's masters) Python workers run this interpreter, so
    they see the same packages as the driver; without it (a cluster) they run what the user set
    (``PYSPARK_PYTHON``, ``spark.pyspark.python``: a shipped environment). ``master=None`` keeps the
    master spark-submit was given. Extra ``conf`` keys use underscores for dots
    (``spark_sql_shuffle_partitions="4"``) or pass a mapping through ``**{"spark.x.y": "v"}``.
    """
    if same_python:
        os.environ["PYSPARK_PYTHON"] = sys.executable
        os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app)
    if master is not None:
        builder = builder.master(master)
    settings = dict(DEFAULT_CONF)
    settings.update({(k.replace("_", ".") if "." not in k else k): str(v) for k, v in conf.items()})
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(log_level)
    if register:
        import connectors

        # Every connector module exists now, so an ImportError here is a real bug: let it surface.
        connectors.register(spark)
    return spark
