"""What a task stages, shared by ``postgres-upsert`` and ``postgres-2pc``'s upsert mode.

- ``UpsertPlanner``: the driver side: parses options, checks (or creates) the table and the tombstone
  table, builds the ``MergePlan``.
- ``prepared_rows(batches, plan, opts)``: the Arrow batches a task stages, one by one (columns
  picked, ordinal and delete flag added; a null key or version is a FatalError naming the column).
- ``BatchBuffer`` / ``Replayable``: a task's batches streamed into COPY as Spark yields them,
  re-iterable for a retry (memory up to 64 MiB, then an unlinked local file).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from pyspark.sql.types import ArrayType, BinaryType, BooleanType, MapType, StructType

from eos_core.errors import ConfigError, FatalError
from sinks.postgres import deadletter
from sinks.postgres.connection import close_quietly, setup_connect
from sinks.postgres.formats import UPSERT
from sinks.postgres.merge import DELETE_FLAG, ORDINAL, KeyTracker, MergePlan, ensure_tombstones
from sinks.postgres.options import UpsertOptions
from sinks.postgres.privileges import refuse_missing, upsert_grants
from sinks.postgres.types import check_table

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["SPILL_BYTES", "BatchBuffer", "Replayable", "UpsertPlanner", "prepared_rows"]

FORMAT = UPSERT


class UpsertPlanner:
    """Driver side: options -> checked table -> MergePlan (also used by the two-phase upsert mode)."""

    def __init__(self, opts: UpsertOptions, schema: StructType, *, temporary_staging: bool = True) -> None:
        self.opts = opts
        self.schema = schema
        self.temporary_staging = temporary_staging

    def validate_schema(self) -> None:
        """Checks that need only the DataFrame schema (no database)."""
        names = [f.name for f in self.schema.fields]
        opts = self.opts
        for role, col in [("key", k) for k in opts.key] + [
            ("version", opts.version),
            ("delete.column", opts.delete_column),
        ]:
            if col is not None and col not in names:
                raise ConfigError(
                    f"{FORMAT}: option '{role}' names column {col!r}, which the DataFrame does not have; "
                    f"DataFrame columns: {', '.join(names)}",
                    option=role,
                    column=col,
                )
        reserved = [n for n in names if n in (ORDINAL, DELETE_FLAG)]
        if reserved:
            raise ConfigError(
                f"{FORMAT}: DataFrame column {reserved[0]!r} clashes with a staging column the sink adds; rename it",
                column=reserved[0],
            )
        if opts.version is not None:
            vtype = self.schema[opts.version].dataType
            if isinstance(vtype, (ArrayType, MapType, StructType, BinaryType)):
                raise ConfigError(
                    f"{FORMAT}: option 'version' names {opts.version!r} of type {vtype.simpleString()}, which has no "
                    "useful order; use a number, decimal, timestamp or date column",
                    option="version",
                    column=opts.version,
                )
        if opts.delete_column is not None:
            dtype = self.schema[opts.delete_column].dataType
            if not isinstance(dtype, BooleanType):
                raise ConfigError(
                    f"{FORMAT}: option 'delete.column' names {opts.delete_column!r} of type {dtype.simpleString()}; "
                    "it must be boolean (true deletes the key); e.g. F.col('op') == 'd'",
                    option="delete.column",
                    column=opts.delete_column,
                )
        if opts.delete_tombstones and not self._payload_columns():
            raise ConfigError(
                f"{FORMAT}: option 'delete.tombstones' needs at least one column besides the key and version "
                "(a tombstone is a row whose other columns are all null)",
                option="delete.tombstones",
            )

    def _payload_columns(self) -> list[str]:
        skip = {*self.opts.key, self.opts.version, self.opts.delete_column}
        return [f.name for f in self.schema.fields if f.name not in skip]

    def plan(self) -> MergePlan:
        """Connect, check (or create) the table and tombstones, and return the merge plan."""
        self.validate_schema()
        opts = self.opts
        conn = setup_connect(opts.connection, "spark-eos check")
        try:
            if self.temporary_staging:  # postgres-upsert itself (postgres-2pc checks its own, a superset)
                refuse_missing(conn, upsert_grants(opts), context=f"{FORMAT} into {opts.table}")
            columns = check_table(
                conn,
                opts.table,
                self.schema,
                opts.key,
                opts.rename,
                create=opts.table_create,
                version=opts.version,
                skip=[opts.delete_column] if opts.delete_column else [],
                evolution=opts.schema_evolution,
            )
            plan = MergePlan(opts.table, tuple(columns), opts.key, opts.version, opts.deletes)
            ensure_tombstones(conn, plan)
            if opts.errors.table is not None:
                deadletter.ensure_table(conn, opts.errors.table)
            return plan
        finally:
            close_quietly(conn)


def prepared_rows(
    batches: Iterable[pa.RecordBatch], plan: MergePlan, opts: UpsertOptions, keys: KeyTracker | None = None
) -> Iterator[pa.RecordBatch]:
    """Stage-ready batches (written columns + ordinal + delete flag), one by one; a null key or
    version fails at the batch that holds it. ``keys`` sees every batch (is each key distinct?)."""
    import numpy as np
    import pyarrow as pa

    names = [c.name for c in plan.columns]
    payload = [c.name for c in plan.columns if c.name not in plan.key and c.name != plan.version]
    ordinal = 0
    for batch in batches:
        if batch.num_rows == 0:
            continue
        for col in (*plan.key, *([plan.version] if plan.version else [])):
            nulls = batch.column(batch.schema.get_field_index(col)).null_count
            if nulls:
                role = "key" if col in plan.key else "version"
                raise FatalError(
                    f"{FORMAT}: {nulls} row(s) have a null {role} column {col!r} (table {plan.target}); "
                    f"filter them (df.where(F.col('{col}').isNotNull())) or fill them before writing; nothing of "
                    "this task was written",
                    column=col,
                )
        arrays = [batch.column(batch.schema.get_field_index(n)) for n in names]
        arrays.append(pa.array(np.arange(ordinal, ordinal + batch.num_rows, dtype=np.int64)))
        fields = [*names, ORDINAL]
        if plan.deletes:
            arrays.append(_delete_flags(batch, opts, payload))
            fields.append(DELETE_FLAG)
        ordinal += batch.num_rows
        out = pa.RecordBatch.from_arrays(arrays, names=fields)
        if keys is not None:
            keys.see(out)
        yield out


SPILL_BYTES = 64 * 1024 * 1024
"""A task keeps this much of its prepared Arrow data in memory; the rest goes to a local file."""


class BatchBuffer:
    """A task's prepared batches, re-iterable for retries, spilled past ``limit`` bytes.

    Spilled batches go to an Arrow IPC file in the local temp dir (Spark's executor temp dir when
    set) that is memory-mapped and unlinked at once: the OS pages it, and nothing is left behind
    even when the worker is killed.
    """

    def __init__(self, limit: int = SPILL_BYTES) -> None:
        self.limit = limit
        self.rows = 0
        self.spilled = False
        self._memory: list[pa.RecordBatch] = []
        self._bytes = 0
        self._file: Any = None
        self._writer: pa.ipc.RecordBatchFileWriter | None = None
        self._mapped: pa.MemoryMappedFile | None = None

    @classmethod
    def collect(cls, batches: Iterable[pa.RecordBatch], limit: int = SPILL_BYTES) -> BatchBuffer:
        buffer = cls(limit)
        for batch in batches:
            buffer.append(batch)
        buffer.seal()
        return buffer

    def append(self, batch: pa.RecordBatch) -> None:
        import pyarrow as pa

        self.rows += batch.num_rows
        if self._writer is None and self._bytes + batch.nbytes <= self.limit:
            self._memory.append(batch)
            self._bytes += batch.nbytes
            return
        if self._writer is None:
            import os
            import tempfile

            # Python workers get the executor's local dirs in SPARK_LOCAL_DIRS (large, cleaned by Spark).
            local = (os.environ.get("SPARK_LOCAL_DIRS") or "").split(",")[0] or None
            self._file = tempfile.NamedTemporaryFile(prefix="eos-upsert-", suffix=".arrow", dir=local, delete=False)
            self._writer = pa.ipc.new_file(self._file, batch.schema)
            for kept in self._memory:
                self._writer.write_batch(kept)
            self._memory = []
            self.spilled = True
        self._writer.write_batch(batch)

    def seal(self) -> None:
        import pyarrow as pa

        if self._writer is None:
            return
        import os

        self._writer.close()
        self._file.close()
        try:
            self._mapped = pa.memory_map(self._file.name)
        finally:
            os.unlink(self._file.name)  # the mapping keeps the data; no file outlives the worker
        self._writer = None

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa

        if self._mapped is None:
            yield from self._memory
            return
        reader = pa.ipc.open_file(self._mapped)
        for i in range(reader.num_record_batches):
            yield reader.get_batch(i)


class Replayable:
    """A task's batches, streamed once and re-iterable for a retry.

    The first pass hands each batch on as Spark yields it (the first bytes reach COPY before the
    partition is read to its end) and keeps a copy in a :class:`BatchBuffer` (memory up to 64 MiB,
    then an unlinked local file). A later pass (a retried COPY) first drains what the first pass did
    not reach, then reads the copy: every pass sees exactly the partition's rows.
    """

    def __init__(self, source: Iterable[pa.RecordBatch], limit: int = SPILL_BYTES) -> None:
        self._source = iter(source)
        self._buffer = BatchBuffer(limit)
        self._passes = 0

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        self._passes += 1
        if self._passes == 1:
            for batch in self._source:
                self._buffer.append(batch)
                yield batch
            return
        for batch in self._source:
            self._buffer.append(batch)
        self._buffer.seal()
        yield from self._buffer

    @property
    def spilled(self) -> bool:
        return self._buffer.spilled


def _delete_flags(batch: pa.RecordBatch, opts: UpsertOptions, payload: list[str]) -> pa.Array:
    import pyarrow as pa
    import pyarrow.compute as pc

    flags = pa.array([False] * batch.num_rows, pa.bool_())
    if opts.delete_column is not None:
        col = batch.column(batch.schema.get_field_index(opts.delete_column))
        flags = pc.or_(flags, pc.fill_null(col, False))
    if opts.delete_tombstones:
        all_null = None
        for name in payload:
            nulls = pc.is_null(batch.column(batch.schema.get_field_index(name)))
            all_null = nulls if all_null is None else pc.and_(all_null, nulls)
        if all_null is not None:
            flags = pc.or_(flags, all_null)
    return flags
