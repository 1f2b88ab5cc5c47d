"""Unit tests for the merge SQL: dedup order, version guard, deletes and tombstones."""

from __future__ import annotations

import pickle

import pytest

from sinks.postgres.merge import DELETE_FLAG, ORDINAL, MergeCounts, MergePlan, merge_statements, tombstone_sql
from sinks.postgres.options import TableName
from sinks.postgres.types import Column

T = TableName("app", "t")
COLS = (
    Column("id", "id", "bigint", "bigint", target_type="bigint"),
    Column("name", "full_name", "text", "string", target_type="character varying(40)"),
    Column("ver", "ver", "bigint", "bigint", target_type="bigint"),
)


def test_plain_upsert_is_one_statement_with_dedup_by_input_order() -> None:
    plan = MergePlan(T, COLS, ("id",))
    [(label, sql)] = merge_statements(plan, "stage")
    assert label == "upserted"
    assert 'SELECT DISTINCT ON ("id") * FROM stage ORDER BY "id", "__eos_ord" DESC' in sql
    assert 'INSERT INTO "app"."t" AS t ("id", "full_name", "ver")' in sql
    assert 'ON CONFLICT ("id") DO UPDATE SET "full_name" = EXCLUDED."full_name", "ver" = EXCLUDED."ver"' in sql
    assert "WHERE t." not in sql  # no version guard without a version column
    assert 'SELECT d."id", d."name", d."ver" FROM' in sql  # varchar(40): assignment conversion, no truncating CAST


def test_version_guard_is_strict_so_equal_versions_are_no_ops() -> None:
    plan = MergePlan(T, COLS, ("id",), version="ver")
    [(_, sql)] = merge_statements(plan, "stage")
    assert 'ORDER BY "id", "ver" DESC NULLS LAST, "__eos_ord" DESC' in sql
    assert sql.endswith('WHERE t."ver" IS NULL OR t."ver" < EXCLUDED."ver"')


def test_key_only_table_does_nothing_on_conflict() -> None:
    plan = MergePlan(T, COLS[:1], ("id",))
    [(_, sql)] = merge_statements(plan, "stage")
    assert sql.endswith("DO NOTHING")


def test_deletes_without_version() -> None:
    plan = MergePlan(T, COLS, ("id",), deletes=True)
    labels = [label for label, _ in merge_statements(plan, "stage")]
    assert labels == ["deleted", "upserted"]
    delete, upsert = (sql for _, sql in merge_statements(plan, "stage"))
    assert delete.startswith('DELETE FROM "app"."t" t USING') and f'd."{DELETE_FLAG}"' in delete
    assert f'WHERE NOT d."{DELETE_FLAG}"' in upsert
    assert plan.tombstones is None and tombstone_sql(plan) is None


def test_deletes_with_version_lock_keys_and_keep_tombstones() -> None:
    plan = MergePlan(T, COLS, ("id",), version="ver", deletes=True)
    assert plan.tombstones == TableName("app", "t__eos_tombstones")
    steps = merge_statements(plan, "stage")
    assert [label for label, _ in steps] == ["", "tombstoned", "deleted", "upserted", ""]
    lock, tomb, delete, upsert, cleanup = (sql for _, sql in steps)
    assert lock.startswith('INSERT INTO "app"."t__eos_tombstones" AS tb') and 'ORDER BY "id"' in lock
    assert "NOT EXISTS" in tomb and 't."ver" >= d."ver"' in tomb
    assert 't."ver" < d."ver"' in delete
    assert 'JOIN "app"."t__eos_tombstones" tb' in upsert and 'tb."ver" < d."ver"' in upsert
    assert 'tb."ver" IS NULL' in cleanup
    assert tombstone_sql(plan) == (
        'CREATE TABLE IF NOT EXISTS "app"."t__eos_tombstones" ("id" bigint NOT NULL, "ver" bigint, PRIMARY KEY ("id"))'
    )


def test_staging_columns() -> None:
    plan = MergePlan(T, COLS, ("id",), version="ver", deletes=True)
    assert plan.staging_columns() == [
        ("id", "bigint"),
        ("name", "text"),
        ("ver", "bigint"),
        (ORDINAL, "bigint"),
        (DELETE_FLAG, "boolean"),
    ]
    assert MergePlan(T, COLS, ("id",)).staging_columns()[-1] == (ORDINAL, "bigint")


def test_plan_checks_its_columns() -> None:
    with pytest.raises(ValueError, match="not among the written columns"):
        MergePlan(T, COLS, ("nope",))


def test_plan_and_counts_pickle() -> None:
    plan = MergePlan(T, COLS, ("id",), version="ver", deletes=True)
    assert pickle.loads(pickle.dumps(plan)) == plan
    assert MergeCounts(1, 2, 3, 4) + MergeCounts(1, 1, 1, 1) == MergeCounts(2, 3, 4, 5)


def test_key_tracker_proves_distinct_keys_across_batches_or_says_no() -> None:
    import pyarrow as pa

    from sinks.postgres import merge

    def batch(ids: list[int], names: list[str]) -> pa.RecordBatch:
        return pa.record_batch({"id": pa.array(ids, pa.int64()), "name": pa.array(names)})

    ints = merge.KeyTracker(("id",))
    ints.see(batch([1, 2, 3], ["a", "b", "c"]))
    ints.see(batch([4], ["a"]))
    assert ints.unique and ints.rows == 4
    ints.see(batch([2], ["z"]))  # id 2 again, in a later batch
    assert not ints.unique

    pairs = merge.KeyTracker(("id", "name"))  # composite key: hashed
    pairs.see(batch([1, 1], ["a", "b"]))
    pairs.see(batch([2], ["a"]))
    assert pairs.unique
    pairs.see(batch([1], ["b"]))
    assert not pairs.unique

    texts = merge.KeyTracker(("name",))
    texts.see(batch([1, 2], ["x", "y"]))
    assert texts.unique
    texts.see(batch([3], ["x"]))
    assert not texts.unique
    assert merge.KeyTracker(("id",)).unique  # nothing seen: nothing repeats


def test_key_tracker_beyond_its_bound_leaves_the_dedup_on(monkeypatch: pytest.MonkeyPatch) -> None:
    import pyarrow as pa

    from sinks.postgres import merge

    monkeypatch.setattr(merge, "MAX_TRACKED", 3)
    keys = merge.KeyTracker(("id",))
    keys.see(pa.record_batch({"id": pa.array([1, 2], pa.int64())}))
    assert keys.unique
    keys.see(pa.record_batch({"id": pa.array([3, 4], pa.int64())}))
    assert not keys.unique and keys.rows == 4 and keys._parts == []  # memory given back


def test_unique_keys_skip_the_dedup_sort_in_every_statement() -> None:
    for plan in (MergePlan(T, COLS, ("id",)), MergePlan(T, COLS, ("id",), "ver", deletes=True)):
        sorted_ = " ".join(sql for _, sql in merge_statements(plan, "stage"))
        plain = " ".join(sql for _, sql in merge_statements(plan, "stage", unique=True))
        assert "DISTINCT ON" in sorted_ and "DISTINCT ON" not in plain
        assert plain.count("SELECT * FROM stage") == sorted_.count("SELECT DISTINCT ON")
