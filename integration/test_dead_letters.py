"""postgres-upsert with errors.tolerance=all: refused rows go to a dead-letter table, exactly once.

Every kind of refusal in one batch (length, range, NOT NULL, CHECK, unique, foreign key); the same
batch written again; a replay of a micro-batch after a crash between the sink's commit and Spark's
commit log; errors.max; and the operator's replay of the dead letters into the fixed table.
"""

from __future__ import annotations

import io
import json
import uuid
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import psycopg
import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.utils import StreamingQueryException

from connectors.cli import main as cli

pytestmark = pytest.mark.integration

SCHEMA = "id long, code string, qty int, email string, parent int, small int, ver long"
GOOD = 300


def _tables(conn: psycopg.Connection, table: str) -> None:
    conn.execute(f"CREATE TABLE {table}_p (id int PRIMARY KEY)")  # type: ignore[arg-type]
    conn.execute(f"INSERT INTO {table}_p VALUES (1), (2), (3)")  # type: ignore[arg-type]
    conn.execute(
        f"CREATE TABLE {table} (id bigint PRIMARY KEY, code varchar(4) NOT NULL, "  # type: ignore[arg-type]
        f"qty int CONSTRAINT {table}_qty CHECK (qty >= 0), email text CONSTRAINT {table}_email UNIQUE, "
        f"parent int CONSTRAINT {table}_parent REFERENCES {table}_p (id), small int, ver bigint)"
    )
    conn.execute(f"INSERT INTO {table} VALUES (99999, 'old', 0, 'taken@x', 1, 0, 0)")  # type: ignore[arg-type]


# id -> (the bad row's values, the SQLSTATE it is refused with, the constraint or column Postgres names)
BAD: dict[int, tuple[dict[str, Any], str, str | None]] = {
    1001: ({"code": "toolong"}, "22001", None),  # varchar(4)
    1003: ({"code": None}, "23502", "code"),  # NOT NULL
    1004: ({"qty": -5}, "23514", "_qty"),  # CHECK
    1005: ({"email": "taken@x"}, "23505", "_email"),  # unique, against a row already in the table
    1006: ({"parent": 42}, "23503", "_parent"),  # foreign key
}


def _input(spark: SparkSession) -> DataFrame:
    rows = []
    for i in range(GOOD):
        rows.append(
            {"id": i, "code": f"c{i % 100}", "qty": i, "email": f"u{i}@x", "parent": 1 + i % 3, "small": i, "ver": 1}
        )
    for bad_id, (values, _, _) in BAD.items():
        row = {"id": bad_id, "code": "ok", "qty": 1, "email": f"b{bad_id}@x", "parent": 2, "small": 1, "ver": 1}
        row.update(values)
        rows.append(row)
    return spark.createDataFrame(
        [tuple(r[c] for c in ("id", "code", "qty", "email", "parent", "small", "ver")) for r in rows], SCHEMA
    )


def _write(df: DataFrame, dsn: str, table: str, **options: str) -> None:
    w = df.write.format("postgres-upsert").option("dsn", dsn).option("table", table).option("key", "id")
    w.option("version", "ver").option("errors.tolerance", "all").option("errors.table", f"{table}_refused")
    w.options(**options).mode("append").save()


def _stream(spark: SparkSession, work: Path, fmt: str, dsn: str, table: str, **options: str) -> None:
    """One availableNow run of a query from ``work/in`` (written with ``_input``'s rows on the first
    call) into ``table`` through ``fmt``, checkpoint ``work/checkpoint``; its failure is raised."""
    source = work / "in"
    if not source.exists():
        source.mkdir()
        rows = _input(spark).collect()
        (source / "0.json").write_text("".join(json.dumps(r.asDict()) + "\n" for r in rows))
    q = (
        spark.readStream.schema(SCHEMA)
        .json(str(source))
        .repartition(2)
        .writeStream.format(fmt)
        .option("dsn", dsn)
        .option("table", table)
        .options(**options)
        .option("checkpointLocation", str(work / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination()


def _ids(conn: psycopg.Connection, table: str) -> list[int]:
    return [r[0] for r in conn.execute(f"SELECT id FROM {table} ORDER BY id").fetchall()]  # type: ignore[arg-type]


def _letters(conn: psycopg.Connection, table: str) -> dict[int, tuple[Any, ...]]:
    rows = conn.execute(
        f"SELECT (row->>'id')::bigint, sqlstate, error_class, constraint_name, column_name, row, batch_id, op "  # type: ignore[arg-type]
        f"FROM {table}_refused WHERE target = %s",
        (table,),
    ).fetchall()
    out: dict[int, tuple[Any, ...]] = {}
    for r in rows:
        assert r[0] not in out, f"row {r[0]} is in the dead-letter table twice"
        out[r[0]] = r[1:]
    return out


def _check_letters(letters: dict[int, tuple[Any, ...]], batch: int, op_name: str = "upsert") -> None:
    assert sorted(letters) == sorted(BAD), letters
    for bad_id, (values, state, where) in BAD.items():
        sqlstate, cls, constraint, column, row, batch_id, op = letters[bad_id]
        assert sqlstate == state, (bad_id, sqlstate)
        assert cls == ("data" if state.startswith("22") else "integrity")
        if where == "code":
            assert column == "code", (bad_id, column)
        elif where is not None:
            assert constraint is not None and constraint.endswith(where), (bad_id, constraint)
        for name, value in values.items():
            assert row[name] == value, (bad_id, row)  # the row as it was sent, under the table's names
        assert set(row) == {"id", "code", "qty", "email", "parent", "small", "ver"}
        assert batch_id == batch and op == op_name


def test_every_refused_kind_goes_to_the_dead_letter_table_once(
    spark: SparkSession, postgres_service: Any, pg_conn: psycopg.Connection, new_table: Any
) -> None:
    from sinks.postgres.deadletter import table_sql
    from sinks.postgres.options import parse_table_name

    table = new_table("dl")
    _tables(pg_conn, table)
    # a dead-letter table of 0.1, without sink_id: the sink adds the column at start
    pg_conn.execute(table_sql(parse_table_name(f"{table}_refused")))  # type: ignore[arg-type]
    pg_conn.execute(f"ALTER TABLE {table}_refused DROP COLUMN sink_id")  # type: ignore[arg-type]
    df = _input(spark).repartition(2)
    _write(df, postgres_service.dsn, table)
    assert _ids(pg_conn, table) == [*range(GOOD), 99999]
    _check_letters(_letters(pg_conn, table), -1)
    sinks = pg_conn.execute(f"SELECT DISTINCT sink_id FROM {table}_refused").fetchall()  # type: ignore[arg-type]
    assert sinks == [(None,)]  # postgres-upsert has no sink id: the target names it
    xmins = pg_conn.execute(f"SELECT xmin::text FROM {table} ORDER BY id").fetchall()  # type: ignore[arg-type]

    _write(df, postgres_service.dsn, table)  # the same rows again (a re-run job): no new row anywhere
    assert _ids(pg_conn, table) == [*range(GOOD), 99999]
    assert pg_conn.execute(f"SELECT xmin::text FROM {table} ORDER BY id").fetchall() == xmins  # type: ignore[arg-type]
    _check_letters(_letters(pg_conn, table), -1)

    # the operator's view, then the fix: a wider code, no CHECK, parent 42 exists; the email stays taken
    out = io.StringIO()
    with redirect_stdout(out):
        assert cli(["sinks", "errors", "--dsn", postgres_service.dsn, "--errors-table", f"{table}_refused"]) == 0
    for _, state, _ in BAD.values():
        assert state in out.getvalue(), out.getvalue()
    pg_conn.execute(f"ALTER TABLE {table} ALTER code TYPE varchar(20), ALTER code DROP NOT NULL")  # type: ignore[arg-type]
    pg_conn.execute(f"ALTER TABLE {table} DROP CONSTRAINT {table}_qty")  # type: ignore[arg-type]
    pg_conn.execute(f"INSERT INTO {table}_p VALUES (42)")  # type: ignore[arg-type]
    out = io.StringIO()
    with redirect_stdout(out):
        rc = cli(
            [
                "sinks",
                "replay-errors",
                "--dsn",
                postgres_service.dsn,
                "--errors-table",
                f"{table}_refused",
                "--target",
                table,
            ]
        )
    assert rc == 1 and "4 row(s) moved" in out.getvalue() and "1 refused again" in out.getvalue(), out.getvalue()
    assert _ids(pg_conn, table) == sorted([*range(GOOD), 99999, *(i for i in BAD if i != 1005)])
    left = pg_conn.execute(f"SELECT (row->>'id')::int, replay_error FROM {table}_refused").fetchall()  # type: ignore[arg-type]
    assert [r[0] for r in left] == [1005] and "unique" in left[0][1], left
    assert pg_conn.execute(f"SELECT code, qty FROM {table} WHERE id IN (1001, 1004) ORDER BY id").fetchall() == [  # type: ignore[arg-type]
        ("toolong", 1),
        ("ok", -5),
    ]


def test_errors_max_fails_the_task_before_anything_is_written(
    spark: SparkSession, postgres_service: Any, pg_conn: psycopg.Connection, new_table: Any
) -> None:
    table = new_table("dlmax")
    _tables(pg_conn, table)
    with pytest.raises(
        Exception, match=r"refused at least 5 of 305 rows, more than errors.max=4 rows.*nothing of this task"
    ):
        _write(_input(spark).coalesce(1), postgres_service.dsn, table, **{"errors.max": "4", "retry.attempts": "1"})
    assert _ids(pg_conn, table) == [99999]
    assert _letters(pg_conn, table) == {}
    _write(_input(spark).coalesce(1), postgres_service.dsn, table, **{"errors.max": "2%"})  # 5 of 305 < 2 %
    assert len(_ids(pg_conn, table)) == GOOD + 1 and len(_letters(pg_conn, table)) == len(BAD)


def test_errors_max_stops_the_search_for_refused_rows_at_the_limit(
    spark: SparkSession, postgres_service: Any, pg_conn: psycopg.Connection, new_table: Any
) -> None:
    """A mass refusal of a kind only the range search finds (unique against existing rows): the task
    fails as soon as its count passes errors.max, not after searching every row (the count says so)."""
    table = new_table("dlstop")
    _tables(pg_conn, table)
    pg_conn.execute(f"INSERT INTO {table} SELECT 50000 + i, 'old', 0, 'e' || i, 1, 0, 0 FROM generate_series(0, 59) i")  # type: ignore[arg-type]
    rows = [(i, "ok", 1, f"e{i}" if i % 5 == 0 else f"n{i}", 2, 1, 1) for i in range(300)]  # 60 emails taken
    with pytest.raises(Exception, match=r"refused at least 3 of 300 rows, more than errors.max=2 rows"):
        _write(
            spark.createDataFrame(rows, SCHEMA).coalesce(1),
            postgres_service.dsn,
            table,
            **{"errors.max": "2", "retry.attempts": "1"},
        )
    assert len(_ids(pg_conn, table)) == 61 and _letters(pg_conn, table) == {}  # nothing of the task written


def test_a_replayed_micro_batch_diverts_its_refused_rows_once(
    spark: SparkSession, postgres_service: Any, pg_conn: psycopg.Connection, new_table: Any, tmp_path: Path
) -> None:
    """The crash window of the sink's idempotence: every task committed (good rows and dead letters),
    Spark's commits/0 not written. The restarted query runs batch 0 again."""
    table = new_table("dlstream")
    _tables(pg_conn, table)
    checkpoint = tmp_path / "checkpoint"
    faults = f"sink.after_commit:batch=0:action=raise:code={uuid.uuid4().int % 10**8}:once"
    options = {"key": "id", "version": "ver", "errors.tolerance": "all", "errors.table": f"{table}_refused"}

    def run() -> None:
        _stream(spark, tmp_path, "postgres-upsert", postgres_service.dsn, table, faults=faults, **options)

    with pytest.raises(StreamingQueryException, match=r"fault injected at sink\.after_commit"):
        run()
    assert (checkpoint / "offsets" / "0").exists() and not (checkpoint / "commits" / "0").exists()
    assert _ids(pg_conn, table) == [*range(GOOD), 99999]
    _check_letters(_letters(pg_conn, table), 0)

    err = io.StringIO()
    with redirect_stderr(err):
        run()  # batch 0 again (the fault is spent): nothing new in either table
    assert (checkpoint / "commits" / "0").exists() and not (checkpoint / "offsets" / "1").exists()
    assert _ids(pg_conn, table) == [*range(GOOD), 99999]
    _check_letters(_letters(pg_conn, table), 0)


def test_length_not_null_and_check_refusals_are_found_by_one_query_each(
    spark: SparkSession, postgres_service: Any, pg_conn: psycopg.Connection, new_table: Any
) -> None:
    """Refusals whose rows one query can find (a NULL in a NOT NULL column, a string too long, a
    failing CHECK) are taken out together, not row by row: the length refusal names its column,
    which only that screen knows (Postgres' own error names none)."""
    table = new_table("dlscreen")
    pg_conn.execute(
        f"CREATE TABLE {table} (id bigint PRIMARY KEY, code varchar(4) NOT NULL, "  # type: ignore[arg-type]
        f"qty int CONSTRAINT {table}_qty CHECK (qty >= 0), email text, parent int, small int, ver bigint)"
    )
    rows = [(i, "ok", 1, None, None, None, 1) for i in range(2000)]
    bad = {7: ("toolong", 1), 70: (None, 1), 700: ("ok", -1), 1700: ("waytoolong", -3)}
    for i, (code, qty) in bad.items():
        rows[i] = (i, code, qty, None, None, None, 1)
    df = spark.createDataFrame(rows, SCHEMA).coalesce(1)
    _write(df, postgres_service.dsn, table)
    assert _ids(pg_conn, table) == [i for i in range(2000) if i not in bad]
    got = {
        r[0]: r[1:]
        for r in pg_conn.execute(
            f"SELECT (row->>'id')::int, sqlstate, column_name, constraint_name FROM {table}_refused"  # type: ignore[arg-type]
        ).fetchall()
    }
    assert got[7] == ("22001", "code", None) and got[1700][:2] == ("22001", "code"), got
    assert got[70] == ("23502", "code", None) and got[700] == ("23514", None, f"{table}_qty"), got
    assert sorted(got) == sorted(bad)


# ---------------------------------------------------------------------------------------------
# postgres-2pc: the dead letters commit with the batch (visibility=batch: in the driver's publish;
# visibility=partition: in each task's prepared transaction)

TWOPC = [
    pytest.param("batch", "upsert", id="batch-upsert"),
    pytest.param("batch", "append", id="batch-append"),
    pytest.param("partition", "upsert", id="partition-upsert"),
    pytest.param("partition", "append", id="partition-append"),
]


def _write_2pc(df: DataFrame, dsn: str, table: str, visibility: str, mode: str, batch: int, **options: str) -> None:
    w = df.write.format("postgres-2pc").option("dsn", dsn).option("table", table).option("sink.id", table)
    w = w.option("batch.id", str(batch)).option("visibility", visibility).option("mode", mode)
    if mode == "upsert":
        w = w.option("key", "id").option("version", "ver")
    w.option("errors.tolerance", "all").option("errors.table", f"{table}_refused").options(**options).mode(
        "append"
    ).save()


def _letter_rows(conn: psycopg.Connection, table: str) -> list[tuple[Any, ...]]:
    return conn.execute(
        f"SELECT (row->>'id')::bigint, sqlstate, error_class, constraint_name, column_name, row, batch_id, op, "  # type: ignore[arg-type]
        f"partition, ordinal FROM {table}_refused WHERE target = %s ORDER BY 1",
        (table,),
    ).fetchall()


@pytest.mark.parametrize(("visibility", "mode"), TWOPC)
def test_twophase_diverts_every_refused_kind_with_the_batch(
    spark: SparkSession,
    postgres_service: Any,
    pg_conn: psycopg.Connection,
    new_table: Any,
    visibility: str,
    mode: str,
) -> None:
    """Every refused kind, over two tasks, into postgres-2pc: good rows in the target, each refused
    row once in the dead-letter table (an append's two equal rows twice: they are two input rows),
    in the batch's one commit; the same batch id again changes nothing."""
    table = new_table("dl2pc")
    _tables(pg_conn, table)
    df = _input(spark)
    if mode == "append":  # a second, equal copy of a refused row: an append refuses both
        df = df.union(df.where("id = 1001"))
    df = df.repartition(2, "id")
    _write_2pc(df, postgres_service.dsn, table, visibility, mode, 7)
    assert _ids(pg_conn, table) == [*range(GOOD), 99999]
    letters = _letter_rows(pg_conn, table)
    by_id: dict[int, list[tuple[Any, ...]]] = {}
    for r in letters:
        by_id.setdefault(r[0], []).append(r[1:])
    assert sorted(by_id) == sorted(BAD), by_id
    assert len(by_id[1001]) == (2 if mode == "append" else 1), by_id[1001]
    _check_letters({i: rows[0][:7] for i, rows in by_id.items()}, 7, "insert" if mode == "append" else "upsert")
    assert {r[8] for r in letters} <= {0, 1} and len({(r[8], r[9]) for r in letters}) == len(letters), letters
    sinks = pg_conn.execute(f"SELECT DISTINCT sink_id FROM {table}_refused").fetchall()  # type: ignore[arg-type]
    assert sinks == [(table,)]  # the sink.id (_write_2pc names the sink after its table)
    stages = pg_conn.execute("SELECT stage FROM eos.sink_batches WHERE sink_id = %s", (table,)).fetchall()
    assert (stages[0][0] == "direct") == (visibility == "partition"), stages  # the mode really was the one named
    xmins = pg_conn.execute(f"SELECT xmin::text FROM {table} ORDER BY id").fetchall()  # type: ignore[arg-type]
    out = io.StringIO()
    with redirect_stdout(out):  # the operator's view of the sink: the batch with its dead letters
        status = ["sinks", "status", "--dsn", postgres_service.dsn, "--sink-id", table, "--json"]
        assert cli([*status, "--errors-table", f"{table}_refused"]) == 0
    decided = json.loads(out.getvalue())["decisions"]
    # rows: the batch's input rows in both modes (written and refused), the refused ones beside them
    assert [(d["batch"], d["rows"], d["dead_letters"]) for d in decided] == [(7, df.count(), len(letters))], decided

    _write_2pc(df, postgres_service.dsn, table, visibility, mode, 7)  # the batch again: decided, a no-op
    assert pg_conn.execute(f"SELECT xmin::text FROM {table} ORDER BY id").fetchall() == xmins  # type: ignore[arg-type]
    assert _letter_rows(pg_conn, table) == letters

    # the operator fixes four causes and replays: four rows move; 1005's email stays taken, and so is
    # the email of an append's second copy of 1001 once the first copy moved
    pg_conn.execute(f"ALTER TABLE {table} ALTER code TYPE varchar(20), ALTER code DROP NOT NULL")  # type: ignore[arg-type]
    pg_conn.execute(f"ALTER TABLE {table} DROP CONSTRAINT {table}_qty")  # type: ignore[arg-type]
    pg_conn.execute(f"INSERT INTO {table}_p VALUES (42)")  # type: ignore[arg-type]
    out = io.StringIO()
    with redirect_stdout(out):
        args = ["sinks", "replay-errors", "--dsn", postgres_service.dsn, "--errors-table", f"{table}_refused"]
        rc = cli([*args, "--target", table])
    again = 2 if mode == "append" else 1
    assert rc == 1 and "4 row(s) moved" in out.getvalue() and f"{again} refused again" in out.getvalue(), out.getvalue()
    assert _ids(pg_conn, table) == sorted([*range(GOOD), 99999, *(i for i in BAD if i != 1005)])
    left = sorted(r[0] for r in pg_conn.execute(f"SELECT (row->>'id')::int FROM {table}_refused").fetchall())  # type: ignore[arg-type]
    assert left == ([1001, 1005] if mode == "append" else [1005]), left


@pytest.mark.parametrize("visibility", ["batch", "partition"])
def test_twophase_errors_max_refuses_the_batch_with_nothing_written(
    spark: SparkSession, postgres_service: Any, pg_conn: psycopg.Connection, new_table: Any, visibility: str
) -> None:
    """Too many refused rows: the batch fails with nothing of it in either table (visibility=batch: the
    publish takes the decided batch back); the same batch id with a higher errors.max then goes in."""
    table = new_table("dl2pcmax")
    _tables(pg_conn, table)
    df = _input(spark).coalesce(1)
    what = "batch" if visibility == "batch" else "task"
    with pytest.raises(
        Exception, match=rf"refused at least 5 of 305 rows, more than errors.max=4 rows.*nothing of this {what}"
    ):
        _write_2pc(
            df, postgres_service.dsn, table, visibility, "upsert", 3, **{"errors.max": "4", "retry.attempts": "1"}
        )
    assert _ids(pg_conn, table) == [99999]
    assert _letter_rows(pg_conn, table) == []
    assert checker_prepared(pg_conn, table) == []
    _write_2pc(df, postgres_service.dsn, table, visibility, "upsert", 3, **{"errors.max": "2%"})
    assert len(_ids(pg_conn, table)) == GOOD + 1 and len(_letter_rows(pg_conn, table)) == len(BAD)


def checker_prepared(conn: psycopg.Connection, sink_id: str) -> list[str]:
    from connectors.toolkit import checker

    return checker.prepared_gids(conn, sink_id)


def test_twophase_batch_decided_without_the_option_is_rewritten_with_it(
    spark: SparkSession, postgres_service: Any, pg_conn: psycopg.Connection, new_table: Any, tmp_path: Path
) -> None:
    """An operator action on a failed query: batch 0 was decided (its rows staged, visibility=batch)
    when the driver failed before publishing it; the operator restarts the query with
    errors.tolerance=all added. The staged rows carry no row numbers, so the decision is taken back
    (nothing of it was visible) and the batch written anew, refused rows diverted: each row once."""
    table = new_table("dl2pclife")
    _tables(pg_conn, table)

    def run(**options: str) -> None:
        _stream(spark, tmp_path, "postgres-2pc", postgres_service.dsn, table, **{"sink.id": table, **options})

    fault = f"sink.commit.after_decision:batch=0:action=raise:code={uuid.uuid4().int % 10**8}:once"
    with pytest.raises(StreamingQueryException, match=r"fault injected at sink\.commit\.after_decision"):
        run(faults=fault)
    decided = pg_conn.execute(
        "SELECT stage, published_at FROM eos.sink_batches WHERE sink_id = %s AND batch_id = 0", (table,)
    ).fetchone()
    assert decided is not None and decided[1] is None, decided  # decided, not published
    assert _ids(pg_conn, table) == [99999]

    run(**{"errors.tolerance": "all", "errors.table": f"{table}_refused"})
    assert _ids(pg_conn, table) == [*range(GOOD), 99999]
    _check_letters({i: r[:7] for i, *r in _letter_rows(pg_conn, table)}, 0, "insert")
    now = pg_conn.execute(
        "SELECT stage, published_at FROM eos.sink_batches WHERE sink_id = %s AND batch_id = 0", (table,)
    ).fetchone()
    # taken back and written anew: the decision now names the staging of the new columns
    assert now is not None and now[1] is not None and now[0] != decided[0], (decided, now)


@pytest.mark.parametrize("sink", ["upsert", "2pc-batch", "2pc-partition"])
def test_a_dead_letter_table_that_refuses_rows_is_named_and_keeps_the_batch(
    spark: SparkSession, postgres_service: Any, pg_conn: psycopg.Connection, new_table: Any, sink: str
) -> None:
    """A dead-letter table with a constraint of its own refusing the letters: the error names
    errors.table, not the target, and nothing of the failed task is written (postgres-2pc: nothing of
    the batch, whose unpublished decision Spark's abort of the failed write withdraws); once the table
    is fixed the same write ends with every row in one of the two tables."""
    from sinks.postgres.deadletter import table_sql
    from sinks.postgres.options import parse_table_name

    table = new_table("dlown")
    _tables(pg_conn, table)
    pg_conn.execute(table_sql(parse_table_name(f"{table}_refused")))  # type: ignore[arg-type]
    pg_conn.execute(f"ALTER TABLE {table}_refused ADD CONSTRAINT {table}_nocheck CHECK (sqlstate <> '23514')")  # type: ignore[arg-type]
    df = _input(spark).repartition(2, "id")

    def write() -> None:
        if sink == "upsert":
            _write(df, postgres_service.dsn, table, **{"retry.attempts": "1"})
        else:
            _write_2pc(df, postgres_service.dsn, table, sink.split("-")[1], "upsert", 3)

    with pytest.raises(Exception, match=rf"dead-letter table {table}_refused \(errors.table\) refused the rows") as err:
        write()
    assert f"{table}_nocheck" in str(err.value) or "sqlstate 23514" in str(err.value)
    if sink == "upsert":  # the other task committed its rows and letters; the failed one wrote none
        assert 1 < len(_ids(pg_conn, table)) < GOOD + 1
        assert 1004 not in {r[0] for r in _letter_rows(pg_conn, table)}  # the CHECK's row: the failed task's
    else:
        assert _ids(pg_conn, table) == [99999] and _letter_rows(pg_conn, table) == []
        assert pg_conn.execute("SELECT count(*) FROM eos.sink_batches WHERE sink_id = %s", (table,)).fetchone() == (0,)
    pg_conn.execute(f"ALTER TABLE {table}_refused DROP CONSTRAINT {table}_nocheck")  # type: ignore[arg-type]
    write()
    assert _ids(pg_conn, table) == [*range(GOOD), 99999] and len(_letter_rows(pg_conn, table)) == len(BAD)
