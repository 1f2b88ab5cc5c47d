"""Postgres sinks: the idempotent ``postgres-upsert`` and the two-phase ``postgres-2pc``.

Shared internals: ``options`` (connection/table options), ``connection`` (connect, classify,
retrying), ``types`` (Spark -> Postgres types, table checks), ``copy`` (binary COPY from Arrow),
``merge`` (dedup + version-guarded upsert/delete from a staging table).
"""

from __future__ import annotations

from typing import Any

from sinks.postgres.upsert import PostgresUpsertDataSource, upsert_batch

__all__ = ["Postgres2pcDataSource", "PostgresUpsertDataSource", "twopc_batch", "upsert_batch"]


def __getattr__(name: str) -> Any:
    # The two-phase sink lives in its own module, built in parallel; import it on first use so
    # this package (and connectors.register) works before and after it lands.
    if name in ("Postgres2pcDataSource", "twopc_batch"):
        from sinks.postgres import twophase

        return getattr(twophase, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
