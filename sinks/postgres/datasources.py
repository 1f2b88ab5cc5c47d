"""The Postgres sinks' data sources, ``postgres-2pc`` and ``postgres-upsert``: their names, and writers made on demand.

Spark unpickles a Python data source's class in several planner processes per query start (to create it,
to plan a write, to commit a batch), each a Python of its own that imports the class's module first.
Here that import costs nothing of the sinks: the writers (psycopg, the protocol, the refusals) are imported
by ``writer()``/``streamWriter()``, in the processes that write (``tests/test_pyspark_daemon.py`` keeps it
so). The protocols are in ``sinks.postgres.twophase`` and ``sinks.postgres.upsert``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyspark.sql.datasource import DataSource

from eos_core.errors import ConfigError
from sinks.postgres.formats import TWOPC, UPSERT

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

    from sinks.postgres.twophase.spark import TwoPhaseBatchWriter, TwoPhaseStreamWriter
    from sinks.postgres.upsert import UpsertBatchWriter, UpsertStreamWriter

__all__ = ["Postgres2pcDataSource", "PostgresUpsertDataSource"]


class Postgres2pcDataSource(DataSource):
    """Format ``postgres-2pc``: rows become visible exactly once, when their batch commits."""

    @classmethod
    def name(cls) -> str:
        return TWOPC

    def writer(self, schema: StructType, overwrite: bool) -> TwoPhaseBatchWriter:
        from sinks.postgres.twophase.spark import TwoPhaseBatchWriter

        if overwrite:
            raise ConfigError(
                f"{TWOPC}: save mode 'overwrite' is not supported for batch writes; use mode('append')", option="mode"
            )
        return TwoPhaseBatchWriter(self.options, schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> TwoPhaseStreamWriter:
        from sinks.postgres.twophase.spark import TwoPhaseStreamWriter

        # Complete output mode arrives as overwrite=True: each batch replaces the table atomically.
        return TwoPhaseStreamWriter(self.options, schema, overwrite)


class PostgresUpsertDataSource(DataSource):
    """Format ``postgres-upsert``: see ``sinks.postgres.upsert`` and docs/postgres-upsert.md for options."""

    @classmethod
    def name(cls) -> str:
        return UPSERT

    def writer(self, schema: StructType, overwrite: bool) -> UpsertBatchWriter:
        from sinks.postgres.upsert import UpsertBatchWriter

        if overwrite:
            raise ConfigError(
                f"{UPSERT}: save mode 'overwrite' is not supported (the sink never truncates); "
                "use mode('append'): rows are upserted by key",
                option="mode",
            )
        return UpsertBatchWriter(self.options, schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> UpsertStreamWriter:
        from sinks.postgres.upsert import UpsertStreamWriter

        # Complete mode arrives as overwrite=True: upserting the full result is what it needs.
        return UpsertStreamWriter(self.options, schema)
