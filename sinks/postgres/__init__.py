"""Postgres sinks: the idempotent ``postgres-upsert`` and the two-phase ``postgres-2pc``.

``datasources`` holds both formats' data sources (light: what Spark's planner processes import), ``adapters``
their foreachBatch functions. Shared internals: ``options`` (connection/table options), ``connection`` (connect, classify,
retrying), ``types`` (Spark -> Postgres types, table checks), ``copy`` (binary COPY from Arrow),
``merge`` (dedup + version-guarded upsert/delete from a staging table); ``twophase`` is a package
of its own, by role.

numpy and pyarrow are imported inside the functions that use them, never at a module's top: Spark's
planner processes (a few per query start) import these modules to unpickle a DataSource class and
never touch an Arrow batch, and the two cost ~0.35 CPU-s per process (``tests/test_pyspark_daemon.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from eos_core import lazy

if TYPE_CHECKING:
    from sinks.postgres.adapters import twopc_batch, upsert_batch
    from sinks.postgres.datasources import Postgres2pcDataSource, PostgresUpsertDataSource

# each name imported when first asked for (eos_core.lazy): Spark's planner processes import this package on
# the way to the data sources' classes (sinks.postgres.datasources), which import the writers only to write
__getattr__ = lazy.exports(
    __name__,
    {
        "Postgres2pcDataSource": "sinks.postgres.datasources",
        "PostgresUpsertDataSource": "sinks.postgres.datasources",
        "twopc_batch": "sinks.postgres.adapters",
        "upsert_batch": "sinks.postgres.adapters",
    },
)

__all__ = ["Postgres2pcDataSource", "PostgresUpsertDataSource", "twopc_batch", "upsert_batch"]
