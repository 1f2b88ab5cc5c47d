"""Issue 32 items 3 and 8, against Postgres: ``spark-eos sinks status`` with a misspelled sink id says so
in one line and exits 64 (it used to show an empty sink and exit 0), and takes ``--dsn`` from
``EOS_POSTGRES_DSN`` as ``verify`` does."""

from __future__ import annotations

import uuid

import psycopg
import pytest

from connectors import cli
from sinks.postgres.twophase.decisions import ProtocolTables


@pytest.fixture
def known_sink(postgres_service) -> tuple[str, str]:  # type: ignore[no-untyped-def]
    schema = f"eos_walk_{uuid.uuid4().hex[:8]}"
    sink_id = "payments-raw"
    tables = ProtocolTables(schema)
    with psycopg.connect(postgres_service.dsn, autocommit=True) as conn:
        tables.ensure(conn)
        with conn.transaction():
            tables.check_owner(conn, sink_id, "query-1", claim=True, run_id="r1")
    yield schema, sink_id
    with psycopg.connect(postgres_service.dsn, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


def test_sinks_status_refuses_a_misspelled_sink_id(
    postgres_service,  # type: ignore[no-untyped-def]
    known_sink: tuple[str, str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    schema, sink_id = known_sink
    monkeypatch.setenv("EOS_POSTGRES_DSN", postgres_service.dsn)  # no --dsn: the env, as verify
    code = cli.main(["sinks", "status", "--sink-id", "payments-rwa", "--eos-schema", schema])
    out, err = capsys.readouterr()
    assert code == 64 and out == "" and err.count("\n") == 1 and "Traceback" not in err, (out, err)
    assert "no sink 'payments-rwa' in this database" in err and "did you mean 'payments-raw'?" in err, err
    assert f"Sinks in schema {schema!r}: payments-raw" in err, err
    # the right id: its status, exit 0
    assert cli.main(["sinks", "status", "--sink-id", sink_id, "--eos-schema", schema]) == 0
    out = capsys.readouterr().out
    assert f"sink {sink_id}: last decided batch None, owner query-1" in out, out
