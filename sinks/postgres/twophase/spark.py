"""The Spark classes of ``postgres-2pc`` (data source, batch and stream writers) and the foreachBatch
adapter ``twopc_batch``."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from eos_core.errors import ConfigError
from eos_core.spark_connect import over_connect
from sinks.postgres.connection import close_quietly, setup_connect
from sinks.postgres.options import option_text
from sinks.postgres.twophase.committer import Committer
from sinks.postgres.twophase.decisions import (
    check_max_prepared,
)
from sinks.postgres.twophase.options import FORMAT, TWOPC_OPTIONS, TwoPhaseOptions
from sinks.postgres.twophase.plan import (
    TwoPhaseMessage,
)
from sinks.postgres.twophase.writer import TwoPhaseWriter

if TYPE_CHECKING:
    import pyarrow as pa


class _Roles(TwoPhaseWriter):
    """The sink builds both roles, as Flink's does; neither knows the other: the task side is the
    ``TwoPhaseWriter``, the driver side a ``Committer`` built from what the writer planned."""

    def _committer(self) -> Committer:
        return Committer(self.opts, self.plan, self.nonce, self.planned)


class TwoPhaseBatchWriter(_Roles, DataSourceArrowWriter):
    """``df.write.format("postgres-2pc")`` with ``sink.id`` and ``batch.id``."""

    def __init__(self, options: Mapping[str, str], schema: StructType, overwrite: bool = False) -> None:
        self._setup(options, schema, streaming=False, overwrite=overwrite)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> TwoPhaseMessage:
        return self._write(iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        assert self.opts.batch_id is not None
        self._committer().commit(messages, self.opts.batch_id)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        assert self.opts.batch_id is not None
        self._committer().abort(messages, self.opts.batch_id)


class TwoPhaseStreamWriter(_Roles, DataSourceStreamArrowWriter):
    """``df.writeStream.format("postgres-2pc")`` (append and complete output modes)."""

    def __init__(self, options: Mapping[str, str], schema: StructType, overwrite: bool = False) -> None:
        self._setup(options, schema, streaming=True, overwrite=overwrite)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> TwoPhaseMessage:
        return self._write(iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        self._committer().commit(messages, batchId)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        self._committer().abort(messages, batchId)


class Postgres2pcDataSource(DataSource):
    """Format ``postgres-2pc``: rows become visible exactly once, when their batch commits."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def writer(self, schema: StructType, overwrite: bool) -> TwoPhaseBatchWriter:
        if overwrite:
            raise ConfigError(
                f"{FORMAT}: save mode 'overwrite' is not supported for batch writes; use mode('append')", option="mode"
            )
        return TwoPhaseBatchWriter(self.options, schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> TwoPhaseStreamWriter:
        # Complete output mode arrives as overwrite=True: each batch replaces the table atomically.
        return TwoPhaseStreamWriter(self.options, schema, overwrite)


def twopc_batch(**options: Any) -> Callable[[Any, int], None]:
    """A ``foreachBatch(df, batch_id)`` function writing each micro-batch through the two-phase sink.

    ``sink.id`` is required; every option is a keyword (its name in snake case: ``sink_id=``,
    ``lock_timeout=``, ``checkpoint_location=``) or a dotted name (``**{"sink.id": "orders"}``); the
    micro-batch id becomes ``batch.id``, so a batch replayed after a crash is written exactly once.
    """
    raw = {k: option_text(v) for k, v in TWOPC_OPTIONS.from_keywords(options).items()}
    if "batch.id" in {k.lower() for k in raw}:
        raise ConfigError(
            f"{FORMAT}: twopc_batch sets 'batch.id' from the micro-batch id; do not pass it", option="batch.id"
        )
    opts = TwoPhaseOptions.from_options(raw)
    if opts.sink_id is None:
        raise ConfigError(f"{FORMAT}: twopc_batch needs option 'sink.id' (unique per query)", option="sink.id")
    if opts.checkpoint is None:
        raise ConfigError(
            f"{FORMAT}: twopc_batch needs option 'checkpointLocation', the streaming query's own checkpoint "
            "location (the one given to writeStream), so that each micro-batch's decision is bound to the offsets "
            "Spark planned for it and a restored older checkpoint is refused instead of skipped",
            option="checkpointLocation",
        )

    def write_batch(df: Any, batch_id: int) -> None:
        df.sparkSession.dataSource.register(Postgres2pcDataSource)
        partitions = _partitions(df)
        if partitions is not None:
            conn = setup_connect(opts.connection, f"spark-eos {FORMAT} check")
            try:
                check_max_prepared(conn, partitions, where=f" (sink {opts.sink_id!r})")
            finally:
                close_quietly(conn)
        df.write.format(FORMAT).options(**raw).option("batch.id", str(batch_id)).mode("append").save()

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
