"""Unit tests for the Postgres sink options: parsing, errors, password redaction, table names."""

from __future__ import annotations

import pickle

import pytest

from eos_core.errors import ConfigError
from sinks.postgres.options import (
    ConnectionOptions,
    TableName,
    UpsertOptions,
    parse_table_name,
    redact_conninfo,
)
from sinks.postgres.twophase.options import TwoPhaseOptions

BASE = {"dsn": "postgresql://app:s3cret@127.0.0.1:5433/shop", "table": "orders", "key": "id"}


def test_parses_typed_options() -> None:
    opts = UpsertOptions.from_options(
        {
            "dsn": BASE["dsn"],
            "table": "orders",
            "Key": "a, b",
            "version": "v",
            "delete.column": "gone",
            "table.create": "TRUE",
            "columns": '{"userId": "user_id"}',
            "connect_timeout": "3s",
            "statement_timeout": "500ms",
        }
    )
    assert opts.key == ("a", "b")
    assert opts.version == "v" and opts.delete_column == "gone" and opts.deletes
    assert opts.table_create is True
    assert opts.rename == {"userId": "user_id"}
    assert opts.connection.connect_timeout == 3.0
    assert opts.connection.statement_timeout == 0.5
    assert opts.table == TableName(None, "orders")


def test_conninfo_merges_dsn_and_fields_and_sets_timeouts() -> None:
    conn = ConnectionOptions(dsn="postgresql://app@h1:5432/db", port=6000, connect_timeout=3, statement_timeout=1.5)
    info = conn.conninfo()
    assert "port=6000" in info and "connect_timeout=3" in info
    assert "statement_timeout=1500" in info
    fields = ConnectionOptions(host="db.local", dbname="x", user="u", password="pw")
    assert "host=db.local" in fields.conninfo() and "password=pw" in fields.conninfo()
    assert "host=localhost" in ConnectionOptions(dbname="x").conninfo()


@pytest.mark.parametrize(
    "raw",
    [
        {"dsn": "postgresql://app:s3cret@127.0.0.1/shop"},
        {"dsn": "host=127.0.0.1 password=s3cret dbname=shop"},
        {"host": "127.0.0.1", "password": "s3cret"},
    ],
)
def test_password_never_in_repr_or_str(raw: dict[str, str]) -> None:
    conn = ConnectionOptions.from_options(raw)
    for text in (
        repr(conn),
        str(conn),
        conn.describe(),
        repr(UpsertOptions.from_options({**raw, "table": "t", "key": "k"})),
    ):
        assert "s3cret" not in text
    assert "***" in repr(conn)


def test_password_not_in_option_errors() -> None:
    with pytest.raises(ConfigError) as err:
        UpsertOptions.from_options({**BASE, "password": "s3cret", "port": "notaport"})
    assert "s3cret" not in str(err.value) and "port" in str(err.value)
    with pytest.raises(ConfigError) as err:
        ConnectionOptions.from_options({"dsn": "host=h password=s3cret bogus"})
    assert "s3cret" not in str(err.value) and "'dsn'" in str(err.value)


def test_redact_conninfo() -> None:
    assert redact_conninfo("postgresql://u:pw@h/db") == "postgresql://u:***@h/db"
    assert redact_conninfo("host=h password='a b' user=u") == "host=h password=*** user=u"
    assert redact_conninfo("postgresql://h/db?password=pw&x=1") == "postgresql://h/db?password=***&x=1"


def test_unknown_option_suggests_the_closest() -> None:
    with pytest.raises(ConfigError) as err:
        UpsertOptions.from_options({**BASE, "versoin": "v"})
    assert "versoin" in str(err.value) and "did you mean 'version'" in str(err.value)


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ({"table": None}, "'table' is required"),
        ({"key": " , "}, "'key' is empty"),
        ({"key": "a,a"}, "names a column twice"),
        ({"version": "id"}, "names the key column"),
        ({"columns": "[1]"}, "must be a JSON object"),
        ({"columns": "{bad json"}, "'columns' has an invalid value"),
        ({"columns": '{"a": "x", "b": "x"}'}, "maps two columns"),
        ({"table.create": "maybe"}, "expected true or false"),
        ({"retry.attempts": "0"}, "out of range"),
        ({"table": "a.b.c"}, "expected table or schema.table"),
    ],
)
def test_option_errors_name_the_option(extra: dict[str, str | None], needle: str) -> None:
    raw = {**BASE, **extra}
    raw = {k: v for k, v in raw.items() if v is not None}
    with pytest.raises(ConfigError) as err:
        UpsertOptions.from_options(raw)
    assert needle in str(err.value)


@pytest.mark.parametrize(
    ("text", "expected", "sql"),
    [
        ("orders", TableName(None, "orders"), '"orders"'),
        ("Sales.Orders", TableName("sales", "orders"), '"sales"."orders"'),
        ('"Sales"."My.Orders"', TableName("Sales", "My.Orders"), '"Sales"."My.Orders"'),
        ('public."Quote""d"', TableName("public", 'Quote"d'), '"public"."Quote""d"'),
    ],
)
def test_table_names(text: str, expected: TableName, sql: str) -> None:
    name = parse_table_name(text)
    assert name == expected and name.sql == sql


def test_derived_names_stay_within_63_bytes() -> None:
    long = TableName("s", "x" * 60)
    derived = long.derived("__eos_tombstones")
    assert len(derived.name.encode()) <= 63 and derived.name.endswith("__eos_tombstones")
    assert derived != TableName("s", "x" * 59).derived("__eos_tombstones")
    assert TableName(None, "t").derived("__eos_tombstones").name == "t__eos_tombstones"


def test_options_pickle() -> None:
    opts = UpsertOptions.from_options({**BASE, "version": "v"})
    assert pickle.loads(pickle.dumps(opts)) == opts


@pytest.mark.parametrize(
    ("extra", "count", "fraction"),
    [
        ({"errors.tolerance": "all", "errors.table": "bad"}, None, None),
        ({"errors.tolerance": "ALL", "errors.table": "s.bad", "errors.max": "100"}, 100, None),
        ({"errors.tolerance": "all", "errors.table": "bad", "errors.max": "0.01"}, None, 0.01),
        ({"errors.tolerance": "all", "errors.table": "bad", "errors.max": " 1.5% "}, None, 0.015),
    ],
)
@pytest.mark.parametrize("sink", ["postgres-upsert", "postgres-2pc"])
def test_errors_options(sink: str, extra: dict[str, str], count: int | None, fraction: float | None) -> None:
    opts = _parse(sink, extra)
    assert opts.errors.divert and opts.errors.table is not None
    assert (opts.errors.max_count, opts.errors.max_fraction) == (count, fraction)
    assert not _parse(sink, {}).errors.divert  # none by default


def _parse(sink: str, extra: dict[str, str]) -> UpsertOptions | TwoPhaseOptions:
    if sink == "postgres-upsert":
        return UpsertOptions.from_options({**BASE, **extra})
    return TwoPhaseOptions.from_options({"dsn": "postgresql://x@h/db", "table": "t", "sink.id": "s", **extra})


@pytest.mark.parametrize(
    ("extra", "option", "needle"),
    [
        ({"errors.tolerance": "all"}, "errors.table", "needs option 'errors.table'"),
        ({"errors.table": "bad"}, "errors.tolerance", "errors.table' is set but errors.tolerance is none"),
        (
            {"errors.tolerance": "all", "errors.table": "bad", "errors.max": "lots"},
            "errors.max",
            "invalid value 'lots'",
        ),
        ({"errors.tolerance": "all", "errors.table": "bad", "errors.max": "1.5"}, "errors.max", "fraction above 1"),
        ({"errors.max": "3"}, "errors.max", "only applies with errors.tolerance=all"),
        ({"errors.tolerance": "some"}, "errors.tolerance", "one of none, all"),
    ],
)
@pytest.mark.parametrize("sink", ["postgres-upsert", "postgres-2pc"])
def test_errors_options_refused(sink: str, extra: dict[str, str], option: str, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle) as err:
        _parse(sink, extra)
    assert err.value.fields.get("option") == option


def test_errors_max_is_checked_per_task() -> None:
    from eos_core.errors import FatalError

    by_count = UpsertOptions.from_options({**BASE, "errors.tolerance": "all", "errors.table": "b", "errors.max": "2"})
    by_count.errors.check(2, 10, "t")  # at the limit: fine
    with pytest.raises(FatalError, match=r"refused 3 of 10 rows, more than errors.max=2 rows") as err:
        by_count.errors.check(3, 10, "t")
    assert err.value.fields.get("option") == "errors.max"
    with pytest.raises(FatalError, match=r"refused at least 3 of 10 rows"):  # the search stopped there
        by_count.errors.check(3, 10, "t", partial=True)
    by_share = UpsertOptions.from_options({**BASE, "errors.tolerance": "all", "errors.table": "b", "errors.max": "10%"})
    by_share.errors.check(1, 10, "t")
    with pytest.raises(FatalError, match=r"refused 2 of 10 rows, more than errors.max=10.0000% of the task's rows"):
        by_share.errors.check(2, 10, "t")


# ---- issue 27 item 10: values accepted at start that failed later -----------------------------------


def test_errors_max_share_above_100_percent_is_refused_naming_the_option() -> None:
    from eos_core.errors import ConfigError
    from sinks.postgres.options import UpsertOptions

    base = {"dsn": "host=h", "table": "t", "key": "id", "errors.tolerance": "all", "errors.table": "t_dead"}
    with pytest.raises(ConfigError, match=r"errors\.max.*150%.*above 100%"):
        UpsertOptions.from_options({**base, "errors.max": "150%"})
    assert UpsertOptions.from_options({**base, "errors.max": "100%"}).errors.max_fraction == 1.0


def test_batch_id_beyond_bigint_is_refused_at_start() -> None:
    from eos_core.errors import ConfigError
    from sinks.postgres.twophase.options import TwoPhaseOptions

    base = {"dsn": "host=h", "table": "t", "sink.id": "s"}
    with pytest.raises(ConfigError, match=r"batch\.id"):
        TwoPhaseOptions.from_options({**base, "batch.id": str(2**63)})
    assert TwoPhaseOptions.from_options({**base, "batch.id": str(2**63 - 1)}).batch_id == 2**63 - 1


@pytest.mark.parametrize("option", ["table", "errors.table"])
def test_a_nul_in_a_table_name_is_refused_naming_the_option(option: str) -> None:
    from eos_core.errors import ConfigError
    from sinks.postgres.options import UpsertOptions

    raw = {"dsn": "host=h", "table": "t", "key": "id", "errors.tolerance": "all", "errors.table": "t_dead"}
    raw[option] = "bad\x00name"
    with pytest.raises(ConfigError, match=f"option '{option}' contains a NUL") as info:
        UpsertOptions.from_options(raw)
    assert "\x00" not in str(info.value)


def test_a_table_name_is_shown_so_that_it_names_one_table_only() -> None:
    # the dead-letter table's `target` column and every message show a table this way: "a.b" (one
    # table whose name holds a dot) and a.b (table b of schema a) were the same text before
    from sinks.postgres.options import TableName, parse_table_name

    dotted, qualified = parse_table_name('"a.b"'), parse_table_name("a.b")
    assert dotted != qualified and str(dotted) != str(qualified)
    assert (str(dotted), str(qualified)) == ('"a.b"', "a.b")
    for name in (dotted, qualified, TableName("My Schema", 'T"x'), TableName(None, "orders")):
        assert parse_table_name(str(name)) == name
    assert str(TableName("public", "orders")) == "public.orders"  # plain names read as before
