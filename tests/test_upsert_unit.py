"""Unit tests for the upsert sink's task side: batch preparation, pickling, the foreachBatch adapter."""

from __future__ import annotations

import pickle
from typing import Any

import pyarrow as pa
import pytest

from eos_core.errors import ConfigError, FatalError
from sinks.postgres.adapters import upsert_batch
from sinks.postgres.datasources import PostgresUpsertDataSource
from sinks.postgres.merge import DELETE_FLAG, ORDINAL, MergePlan
from sinks.postgres.options import TableName, UpsertOptions
from sinks.postgres.staging import prepared_rows
from sinks.postgres.types import Column
from sinks.postgres.upsert import UpsertBatchWriter, UpsertCommitMessage, UpsertStreamWriter

RAW = {"dsn": "postgresql://app:pw@127.0.0.1:1/db", "table": "t", "key": "id", "version": "ver"}
COLS = (
    Column("id", "id", "bigint", "bigint", target_type="bigint"),
    Column("name", "name", "text", "string", target_type="text"),
    Column("ver", "ver", "bigint", "bigint", target_type="bigint"),
)


def _batch(
    ids: list[int | None], names: list[str | None], vers: list[int | None], gone: list[bool | None] | None = None
) -> pa.RecordBatch:
    data = {"id": pa.array(ids, pa.int64()), "name": pa.array(names), "ver": pa.array(vers, pa.int64())}
    if gone is not None:
        data["gone"] = pa.array(gone, pa.bool_())
    return pa.record_batch(data)


def test_prepare_adds_a_running_ordinal_across_batches() -> None:
    opts = UpsertOptions.from_options(RAW)
    plan = MergePlan(TableName(None, "t"), COLS, ("id",), "ver")
    out = list(
        prepared_rows([_batch([1, 2], ["a", "b"], [1, 1]), _batch([], [], []), _batch([1], ["c"], [1])], plan, opts)
    )
    assert sum(b.num_rows for b in out) == 3 and len(out) == 2
    assert [b.column(b.schema.get_field_index(ORDINAL)).to_pylist() for b in out] == [[0, 1], [2]]
    assert out[0].schema.names == ["id", "name", "ver", ORDINAL]


def test_prepare_delete_flags_from_column_and_tombstones() -> None:
    opts = UpsertOptions.from_options({**RAW, "delete.column": "gone"})
    plan = MergePlan(TableName(None, "t"), COLS, ("id",), "ver", deletes=True)
    [b] = prepared_rows([_batch([1, 2, 3], ["a", None, "c"], [1, 1, 1], [True, None, False])], plan, opts)
    assert b.column(b.schema.get_field_index(DELETE_FLAG)).to_pylist() == [True, False, False]
    assert "gone" not in b.schema.names
    opts = UpsertOptions.from_options({**RAW, "delete.tombstones": "true"})
    [b] = prepared_rows([_batch([1, 2], ["a", None], [1, 1])], plan, opts)
    assert b.column(b.schema.get_field_index(DELETE_FLAG)).to_pylist() == [False, True]


@pytest.mark.parametrize(("ids", "vers", "column"), [([1, None], [1, 1], "id"), ([1, 2], [1, None], "ver")])
def test_null_key_or_version_fails_before_writing(ids: list[int | None], vers: list[int | None], column: str) -> None:
    opts = UpsertOptions.from_options(RAW)
    plan = MergePlan(TableName(None, "t"), COLS, ("id",), "ver")
    with pytest.raises(FatalError) as err:
        list(prepared_rows([_batch(ids, ["a", "b"], vers)], plan, opts))
    assert f"null {'key' if column == 'id' else 'version'} column '{column}'" in str(err.value)
    assert "nothing of this task was written" in str(err.value)


def _writer(cls: type) -> object:
    # The constructor checks the table on the driver; here we only need the pickled state.
    writer = cls.__new__(cls)
    writer.opts = UpsertOptions.from_options(RAW)
    writer.plan = MergePlan(TableName(None, "t"), COLS, ("id",), "ver")
    return writer


@pytest.mark.parametrize("cls", [UpsertBatchWriter, UpsertStreamWriter])
def test_writers_pickle_without_the_password_in_repr(cls: type) -> None:
    writer = _writer(cls)
    back = pickle.loads(pickle.dumps(writer))
    assert back.opts == writer.opts and back.plan == writer.plan
    assert "pw" not in repr(back.opts)


def test_commit_message_pickles() -> None:
    msg = UpsertCommitMessage(
        partition=1, attempt=0, batch_id=7, staged=10, upserted=8, deleted=1, tombstoned=1, tries=2
    )
    assert pickle.loads(pickle.dumps(msg)) == msg


def test_data_source_name_and_overwrite_refused() -> None:
    assert PostgresUpsertDataSource.name() == "postgres-upsert"
    with pytest.raises(ConfigError, match="save mode 'overwrite' is not supported"):
        PostgresUpsertDataSource(dict(RAW)).writer(None, True)  # type: ignore[arg-type]


def test_upsert_batch_checks_options_at_once() -> None:
    with pytest.raises(ConfigError, match="unknown option 'tabel'"):
        upsert_batch(dsn="x", tabel="t", key="id")
    with pytest.raises(ConfigError, match="'key' is required"):
        upsert_batch(dsn="x", table="t")
    fn = upsert_batch(dsn="postgresql://u@h/db", table="t", key=["a", "b"], **{"table.create": True})
    assert callable(fn) and "t" in fn.__name__
    cells = dict(zip(fn.__code__.co_freevars, (c.cell_contents for c in fn.__closure__ or ()), strict=True))
    assert cells["raw"] == {"dsn": "postgresql://u@h/db", "table": "t", "key": "a,b", "table.create": "true"}


def test_schema_checks_without_a_database() -> None:
    from pyspark.sql.types import ArrayType, LongType, StringType, StructField, StructType

    from sinks.postgres.staging import UpsertPlanner

    def planner(fields: list[StructField], **raw: str) -> UpsertPlanner:
        return UpsertPlanner(UpsertOptions.from_options({**RAW, **raw}), StructType(fields))

    base = [StructField("id", LongType()), StructField("name", StringType())]
    with pytest.raises(ConfigError, match="option 'version' names column 'ver', which the DataFrame does not have"):
        planner(base).validate_schema()
    with pytest.raises(ConfigError, match="has no useful order"):
        planner([*base, StructField("ver", ArrayType(LongType()))]).validate_schema()
    with pytest.raises(ConfigError, match="clashes with a staging column"):
        planner([*base, StructField("ver", LongType()), StructField(ORDINAL, LongType())]).validate_schema()
    with pytest.raises(ConfigError, match="must be boolean"):
        planner([*base, StructField("ver", LongType())], **{"delete.column": "name"}).validate_schema()
    with pytest.raises(ConfigError, match="needs at least one column besides the key and version"):
        planner(
            [StructField("id", LongType()), StructField("ver", LongType())], **{"delete.tombstones": "true"}
        ).validate_schema()
    planner([*base, StructField("ver", LongType())]).validate_schema()  # fine


def test_batch_buffer_keeps_small_tasks_in_memory_and_spills_large_ones(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    from sinks.postgres.staging import BatchBuffer

    monkeypatch.setenv("SPARK_LOCAL_DIRS", str(tmp_path))
    batches = [_batch([i, i + 1], [f"n{i}", None], [1, 2]) for i in range(0, 20, 2)]
    small = BatchBuffer.collect(batches, limit=10**9)
    assert not small.spilled and small.rows == 20 and list(small) == batches
    big = BatchBuffer.collect(batches, limit=batches[0].nbytes * 3)
    assert big.spilled and big.rows == 20
    assert os.listdir(tmp_path) == []  # unlinked at once, the mapping keeps the data
    for _ in range(2):  # a retry reads it all again
        assert [b.to_pydict() for b in big] == [b.to_pydict() for b in batches]
