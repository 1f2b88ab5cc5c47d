"""The shared fixtures keep their contract: Spark settings, registered formats, unique names, fresh dirs."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

import connectors
from connectors.services.base import PostgresService

pytestmark = pytest.mark.integration


def test_spark_session_settings_and_formats(spark: Any) -> None:
    conf = spark.sparkContext.getConf()
    assert spark.sparkContext.master == "local[2,2]"
    assert conf.get("spark.ui.enabled") == "false"
    assert spark.conf.get("spark.sql.shuffle.partitions") == "2"
    assert os.environ["PYSPARK_PYTHON"] == sys.executable
    # Every format of the package is registered: each resolves to a Python data source.
    for name in connectors.FORMATS:
        assert spark._jsparkSession.sessionState().dataSourceManager().dataSourceExists(name), name
    # Python workers run this interpreter.
    assert spark.sparkContext.parallelize([0], 1).map(lambda _: __import__("sys").executable).collect() == [
        sys.executable
    ]


def test_postgres_fixtures(
    postgres_service: PostgresService, pg_conn: psycopg.Connection, new_table: Callable[..., str], tmp_checkpoint: str
) -> None:
    assert pg_conn.autocommit
    row = pg_conn.execute(
        "SELECT current_setting('max_prepared_transactions')::int, "
        "(SELECT rolsuper FROM pg_roles WHERE rolname = current_user)"
    ).fetchone()
    # the app role, not a superuser, on a secured server; the admin's DSN is the superuser's
    assert row is not None and row[0] > 0 and row[1] is (not postgres_service.secured)
    with psycopg.connect(postgres_service.admin_dsn, autocommit=True) as admin:
        assert admin.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user").fetchone() == (True,)
    a, b = new_table(), new_table(prefix="orders")
    assert a != b and b.startswith("orders_") and a == a.lower()
    pg_conn.execute(f"CREATE TABLE {a} (id int)")  # a valid, unused identifier
    pg_conn.execute(f"DROP TABLE {a}")
    assert os.path.isdir(tmp_checkpoint) and os.listdir(tmp_checkpoint) == []
    assert "***" in postgres_service.dsn_redacted or ":" not in postgres_service.dsn.split("@")[0].split("//")[-1]
