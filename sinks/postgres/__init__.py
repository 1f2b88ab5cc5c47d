"""Postgres sinks: the idempotent ``postgres-upsert`` and the two-phase ``postgres-2pc``.

Shared internals: ``options`` (connection/table options), ``connection`` (connect, classify,
retrying), ``types`` (Spark -> Postgres types, table checks), ``copy`` (binary COPY from Arrow),
``merge`` (dedup + version-guarded upsert/delete from a staging table); ``twophase`` is a package
of its own, by role.

numpy and pyarrow are imported inside the functions that use them, never at a module's top: Spark's
planner processes (a few per query start) import these modules to unpickle a DataSource class and
never touch an Arrow batch, and the two cost ~0.35 CPU-s per process (``tests/test_pyspark_daemon.py``).
"""

from __future__ import annotations

from sinks.postgres.twophase import Postgres2pcDataSource, twopc_batch
from sinks.postgres.upsert import PostgresUpsertDataSource, upsert_batch

__all__ = ["Postgres2pcDataSource", "PostgresUpsertDataSource", "twopc_batch", "upsert_batch"]
