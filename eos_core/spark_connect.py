"""Whether a PySpark object belongs to a Spark Connect client session, where the query runs in a server and the
classic session's JVM gateway and RDD API do not exist (docs/deployment.md, "Spark Connect")."""

from __future__ import annotations

from typing import Any

__all__ = ["over_connect"]


def over_connect(obj: Any) -> bool:
    """True for a Spark Connect SparkSession, DataFrame, reader or writer (PySpark's ``pyspark.sql.connect``
    classes); False for a classic one."""
    return type(obj).__module__.startswith("pyspark.sql.connect")
