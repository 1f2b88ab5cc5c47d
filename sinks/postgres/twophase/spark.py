"""The Spark writers of ``postgres-2pc`` (batch and stream); its data source is in ``sinks.postgres.datasources``,
its foreachBatch adapter ``twopc_batch`` in ``sinks.postgres.adapters``."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from sinks.postgres.twophase.committer import Committer
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
