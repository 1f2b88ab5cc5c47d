"""Issue 32 item 6: the Postgres sinks take the option names users bring from Spark's JDBC source
(``url``, ``dbtable``; ``user`` and ``password`` are already ours), declared once on the option spec,
and refuse an alias given with a different value than the option it names."""

from __future__ import annotations

import pytest

from eos_core.errors import ConfigError
from eos_core.options import OptionSet, option
from sinks.postgres.options import UPSERT_OPTIONS
from sinks.postgres.twophase.options import TWOPC_OPTIONS

JDBC = {
    "url": "jdbc:postgresql://db.example:5432/shop",
    "dbtable": "public.payments",
    "user": "app",
    "password": "Hunter-2-secret",
    "key": "id",
}


@pytest.mark.parametrize("options", [UPSERT_OPTIONS, TWOPC_OPTIONS], ids=["upsert", "2pc"])
def test_spark_jdbc_names_are_accepted(options: OptionSet) -> None:
    raw = dict(JDBC) if options is UPSERT_OPTIONS else {**JDBC, "sink.id": "s", "key": None}
    parsed = options.build(raw)
    conn = parsed.connection
    assert conn.dsn == "postgresql://db.example:5432/shop"  # the JDBC URL as the libpq URL it names
    assert (conn.user, conn.password) == ("app", "Hunter-2-secret")
    assert (parsed.table.schema, parsed.table.name) == ("public", "payments")
    assert "dbname=shop" in conn.conninfo() and "host=db.example" in conn.conninfo()


def test_alias_and_option_with_the_same_value_are_fine() -> None:
    parsed = UPSERT_OPTIONS.build({**JDBC, "table": "public.payments"})
    assert parsed.table.name == "payments"


def test_alias_and_option_with_different_values_are_refused_without_showing_them() -> None:
    with pytest.raises(ConfigError) as info:
        UPSERT_OPTIONS.build({**JDBC, "table": "orders"})
    assert "options 'dbtable' and 'table' both set 'table'" in str(info.value) and "give one" in str(info.value)
    with pytest.raises(ConfigError) as info:
        UPSERT_OPTIONS.build({**JDBC, "dsn": "postgresql://u:Other-Secret@db/shop"})
    text = str(info.value)
    assert "options 'url' and 'dsn' both set 'dsn'" in text or "options 'dsn' and 'url' both set 'dsn'" in text
    assert "Secret" not in text and "shop" not in text


def test_an_alias_is_suggested_and_documented() -> None:
    with pytest.raises(ConfigError, match="did you mean 'dbtable'"):
        UPSERT_OPTIONS.build({**JDBC, "dbtabel": "x"})
    table = UPSERT_OPTIONS.markdown()
    assert "| `dsn` (also `url`) |" in table and "| `table` (also `dbtable`) |" in table


def test_an_alias_that_collides_with_an_option_is_a_declaration_error() -> None:
    from dataclasses import dataclass

    @dataclass(frozen=True)
    class Bad:
        a: str | None = option("a", "str", None, aliases=("b",))
        b: str | None = option("b", "str", None)

    with pytest.raises(TypeError, match="duplicate option names"):
        OptionSet("bad", Bad)
