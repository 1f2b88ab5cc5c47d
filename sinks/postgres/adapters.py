"""The Postgres sinks' foreachBatch adapters: ``twopc_batch`` and ``upsert_batch`` write each micro-batch of a
query through ``postgres-2pc`` or ``postgres-upsert`` (for output modes and operators a sink of its own cannot
follow, such as update mode)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from eos_core.errors import ConfigError
from eos_core.spark_connect import over_connect
from sinks.postgres.connection import close_quietly, setup_connect
from sinks.postgres.datasources import Postgres2pcDataSource, PostgresUpsertDataSource
from sinks.postgres.formats import TWOPC, UPSERT
from sinks.postgres.options import UPSERT_OPTIONS, option_text
from sinks.postgres.twophase.decisions import check_max_prepared
from sinks.postgres.twophase.options import TWOPC_OPTIONS, TwoPhaseOptions

__all__ = ["twopc_batch", "upsert_batch"]


def twopc_batch(**options: Any) -> Callable[[Any, int], None]:
    """A ``foreachBatch(df, batch_id)`` function writing each micro-batch through the two-phase sink.

    ``sink.id`` is required; every option is a keyword (its name in snake case: ``sink_id=``,
    ``lock_timeout=``, ``checkpoint_location=``) or a dotted name (``**{"sink.id": "orders"}``); the
    micro-batch id becomes ``batch.id``, so a batch replayed after a crash is written exactly once.
    """
    raw = {k: option_text(v) for k, v in TWOPC_OPTIONS.from_keywords(options).items()}
    if "batch.id" in {k.lower() for k in raw}:
        raise ConfigError(
            f"{TWOPC}: twopc_batch sets 'batch.id' from the micro-batch id; do not pass it", option="batch.id"
        )
    opts = TwoPhaseOptions.from_options(raw)
    if opts.sink_id is None:
        raise ConfigError(f"{TWOPC}: twopc_batch needs option 'sink.id' (unique per query)", option="sink.id")
    if opts.checkpoint is None:
        raise ConfigError(
            f"{TWOPC}: twopc_batch needs option 'checkpointLocation', the streaming query's own checkpoint "
            "location (the one given to writeStream), so that each micro-batch's decision is bound to the offsets "
            "Spark planned for it and a restored older checkpoint is refused instead of skipped",
            option="checkpointLocation",
        )

    def write_batch(df: Any, batch_id: int) -> None:
        df.sparkSession.dataSource.register(Postgres2pcDataSource)
        partitions = _partitions(df)
        if partitions is not None:
            conn = setup_connect(opts.connection, f"spark-eos {TWOPC} check")
            try:
                check_max_prepared(conn, partitions, where=f" (sink {opts.sink_id!r})")
            finally:
                close_quietly(conn)
        df.write.format(TWOPC).options(**raw).option("batch.id", str(batch_id)).mode("append").save()

    write_batch.__name__ = f"twopc_batch[{opts.sink_id}]"
    return write_batch


def _partitions(df: Any) -> int | None:
    """The micro-batch's partitions (its concurrent PREPAREs), checked against ``max_prepared_transactions``
    before any task runs; None over Spark Connect, which has no RDD API (counting them would run the batch's
    plan twice): there the sink's own set-up refuses a server with prepared transactions off, and a task over
    the limit fails its PREPARE, naming the setting."""
    if over_connect(df):
        return None
    return int(df.rdd.getNumPartitions())


def upsert_batch(**options: Any) -> Callable[[Any, int], None]:
    """A ``foreachBatch`` function upserting each micro-batch (use it for update mode).

    Options are those of ``postgres-upsert``, each a keyword (its name in snake case: ``delete_column="op"``)
    or a dotted name (``**{"delete.column": "op"}``). They are checked here, at once; the table is checked
    when the first batch is written.
    """
    raw = {k: option_text(v) for k, v in UPSERT_OPTIONS.from_keywords(options).items()}
    UPSERT_OPTIONS.parse(raw)  # unknown or malformed options fail when the query is built

    def write_batch(df: Any, batch_id: int) -> None:
        df.sparkSession.dataSource.register(PostgresUpsertDataSource)
        df.write.format(UPSERT).options(**raw).mode("append").save()

    write_batch.__name__ = f"upsert_batch[{raw.get('table')}]"
    return write_batch
