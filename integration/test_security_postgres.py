"""The Postgres sinks as users deploy them (issue 44, finding 3): a server with ``ssl=on`` that takes TLS
connections only (hostssl, scram-sha-256, ``sslmode=verify-full``), a hardened database (``PUBLIC`` may not
connect, create temporary tables or create in ``public``), and app roles that are not superusers, own nothing
and hold exactly the privileges the sink declares for its options (``sinks.postgres.privileges``).

Before: ``postgres-2pc`` ran ``CREATE SCHEMA IF NOT EXISTS`` whenever its protocol tables were missing, which
Postgres refuses without CREATE on the database even when an admin made the schema; ``postgres-upsert`` needed
SELECT on the target and TEMPORARY on the database, neither documented, and a hardened database refused it.
Now each runs with its declared grants, and a role lacking any one of them is refused at start, before
anything is written, naming the privilege, why, and the GRANT.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from connectors import error_cause
from connectors.services.embedded_postgres import EmbeddedPostgres
from connectors.services.pg_security import Role, harden
from eos_core.privileges import PgGrant, grant_command
from sinks.postgres.options import UpsertOptions
from sinks.postgres.privileges import twophase_grants, upsert_grants
from sinks.postgres.twophase.options import TwoPhaseOptions

pytestmark = [pytest.mark.integration]


@pytest.fixture(scope="module")
def hardened() -> Iterator[EmbeddedPostgres]:
    pg = EmbeddedPostgres(security="tls")
    try:
        harden(pg.dsn)
        yield pg
    finally:
        pg.stop()


def _admin(pg: EmbeddedPostgres, *statements: str) -> None:
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        for s in statements:
            conn.execute(s)  # type: ignore[arg-type]


def _rows(pg: EmbeddedPostgres, table: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        return conn.execute(f"SELECT * FROM {table} ORDER BY 1").fetchall()  # type: ignore[arg-type]


def _refusal(write: Any, what: object = "") -> str:
    with pytest.raises(Exception) as info:
        write()
        pytest.fail(f"not refused: {what}")
    return error_cause(info.value)


def test_the_server_takes_tls_only_and_the_app_role_is_neither_superuser_nor_owner(hardened: EmbeddedPostgres) -> None:
    with pytest.raises(psycopg.OperationalError, match="no encryption"):
        psycopg.connect(hardened.dsn.replace("sslmode=verify-full", "sslmode=disable"), connect_timeout=5)
    role = hardened.add_role(f"probe_{uuid.uuid4().hex[:6]}")
    with pytest.raises(psycopg.OperationalError, match="permission denied for database"):
        psycopg.connect(role.dsn, connect_timeout=5)  # hardened: not even CONNECT without a grant
    role.grant([PgGrant("database", None, "CONNECT")])
    with psycopg.connect(role.dsn, connect_timeout=5) as conn:
        ssl, superuser = conn.execute(
            "SELECT ssl, rolsuper FROM pg_stat_ssl, pg_roles WHERE pid = pg_backend_pid() AND rolname = current_user"
        ).fetchone()  # type: ignore[misc]
        assert ssl is True and superuser is False


def _each_revoked(role: Role, grants: list[PgGrant], write: Any, table: str, hardened: EmbeddedPostgres) -> int:
    """Revoke each needed grant in turn: the write is refused naming it and its GRANT, and writes nothing."""
    asked = 0
    for g in grants:
        if g.unless is not None or g.privilege == "OWNER":
            continue  # needed only while its object is missing / for an option not set here
        before = _rows(hardened, table)
        role.revoke([g])
        try:
            cause = _refusal(write, g)
        finally:
            role.grant([g])
        assert "ConfigError" in cause and f"role '{role.name}' lacks {g.describe()}" in cause, (g, cause)
        assert grant_command(g, role.name, "postgres") in cause, (g, cause)
        assert _rows(hardened, table) == before, g  # refused before anything was written
        asked += 1
    return asked


def test_postgres_upsert_runs_with_its_declared_grants_and_refuses_each_missing_one(
    hardened: EmbeddedPostgres, spark: Any
) -> None:
    table = f"up_{uuid.uuid4().hex[:8]}"
    _admin(hardened, f"CREATE TABLE public.{table} (id bigint PRIMARY KEY, v text, ver bigint)")
    options = {"table": f"public.{table}", "key": "id", "version": "ver"}
    grants = upsert_grants(UpsertOptions.from_options(options))
    privileges = {(g.object, g.privilege) for g in grants if g.unless is None}
    assert {("database", "TEMPORARY"), ("table", "SELECT"), ("table", "UPDATE")} <= privileges  # the undocumented
    role = hardened.add_role(f"upsert_{uuid.uuid4().hex[:6]}", grants)

    def write(rows: list[tuple[int, str, int]]) -> Any:
        df = spark.createDataFrame(rows, "id long, v string, ver long")
        return lambda: df.write.format("postgres-upsert").options(dsn=role.dsn, **options).mode("append").save()

    write([(1, "a", 1), (2, "b", 1)])()
    write([(1, "a2", 2), (2, "old", 0)])()  # a newer version replaces, an older one does not
    assert _rows(hardened, f"public.{table}") == [(1, "a2", 2), (2, "b", 1)]
    assert _each_revoked(role, grants, write([(3, "c", 1)]), f"public.{table}", hardened) >= 6


def test_postgres_2pc_runs_in_a_protocol_schema_an_admin_made_without_create_on_the_database(
    hardened: EmbeddedPostgres, spark: Any
) -> None:
    table, eos = f"tp_{uuid.uuid4().hex[:8]}", f"eos_{uuid.uuid4().hex[:6]}"
    role_name = f"twopc_{uuid.uuid4().hex[:6]}"
    options = {"table": f"public.{table}", "eos.schema": eos}
    grants = twophase_grants(TwoPhaseOptions.from_options({**options, "sink.id": "s"}))
    create_db = next(g for g in grants if g.object == "database" and g.privilege == "CREATE")
    assert create_db.unless == ("schema", eos)  # needed only while the protocol schema is missing
    _admin(hardened, f"CREATE TABLE public.{table} (id bigint, v text)", f"CREATE SCHEMA {eos}")
    role = hardened.add_role(role_name)
    absent = role.grant_present(grants)  # the protocol tables are not there yet: the role makes (and owns) them
    assert create_db in absent and {g.name for g in absent if g.object == "table"} == {
        f"{eos}.{t}" for t in ("sink_batches", "sink_parts", "sink_owners")
    }, absent

    def write(batch: int, rows: list[tuple[int, str]]) -> Any:
        df = spark.createDataFrame(rows, "id long, v string")
        w = df.write.format("postgres-2pc").options(dsn=role.dsn, **options)
        return lambda: w.option("sink.id", f"s{batch}").option("batch.id", str(batch)).mode("append").save()

    write(1, [(1, "a"), (2, "b")])()  # the role creates the protocol tables in the schema, owning only them
    write(1, [(1, "a"), (2, "b")])()  # the same batch again: a no-op
    assert _rows(hardened, f"public.{table}") == [(1, "a"), (2, "b")]
    with psycopg.connect(hardened.dsn) as conn:
        owners = conn.execute("SELECT DISTINCT tableowner FROM pg_tables WHERE schemaname = %s", (eos,)).fetchall()
        assert owners == [(role_name,)], owners
    batches = iter(range(100, 200))
    asked = _each_revoked(role, grants, _NextBatch(write, batches), f"public.{table}", hardened)
    assert asked >= 10


class _NextBatch:
    """A write of a new sink id and batch each call: a refusal is asked of a sink that has not planned yet."""

    def __init__(self, write: Any, batches: Iterator[int]) -> None:
        self.write, self.batches = write, batches

    def __call__(self) -> None:
        self.write(next(self.batches), [(9, "z")])()


def test_a_certificate_the_client_does_not_trust_is_a_config_error_naming_sslrootcert(
    hardened: EmbeddedPostgres, spark: Any, tmp_path: Any
) -> None:
    from connectors.services.tls import CertificateAuthority

    other = CertificateAuthority(tmp_path / "other")
    dsn = hardened.dsn.replace(str(hardened.ca_path), str(other.cert_path))
    df = spark.createDataFrame([(1, "a")], "id long, v string")
    cause = _refusal(
        lambda: (
            df.write.format("postgres-upsert").options(dsn=dsn, table="public.nosuch", key="id").mode("append").save()
        )
    )
    assert "ConfigError" in cause and "sslrootcert" in cause and "certificate" in cause, cause


def test_doctor_names_each_privilege_a_role_lacks(
    hardened: EmbeddedPostgres, capsys: pytest.CaptureFixture[str]
) -> None:
    """``spark-eos doctor postgres-2pc``: a role checked against what the sink declares for its options, each
    privilege revoked in turn named with its GRANT; max_prepared_transactions and TLS are reported."""
    from connectors import cli

    table = f"doc_{uuid.uuid4().hex[:8]}"
    _admin(hardened, f"CREATE TABLE public.{table} (id bigint, v text)")
    options = {"table": f"public.{table}", "sink.id": "doc", "visibility": "partition"}
    grants = [g for g in twophase_grants(TwoPhaseOptions.from_options(options)) if g.unless is None]
    role = hardened.add_role(f"doc_{uuid.uuid4().hex[:6]}")
    role.grant_present(grants)
    argv = ["doctor", "postgres-2pc", "--dsn", role.dsn, *[f"-o{k}={v}" for k, v in options.items()]]

    def doctor() -> tuple[int, str]:
        code = cli.main(argv)
        return code, capsys.readouterr().out

    code, text = doctor()  # the protocol tables are not there yet: the role may create them (CREATE on eos? no)
    missing = [line for line in text.splitlines() if line.startswith("MISSING")]
    assert any("CREATE on database" in line for line in missing), text  # the eos schema does not exist
    _admin(hardened, "CREATE SCHEMA IF NOT EXISTS eos", f"GRANT USAGE, CREATE ON SCHEMA eos TO {role.name}")
    code, text = doctor()
    assert code == 0, text
    assert "max_prepared_transactions 64 > 0" in text and "the connection is TLS" in text, text
    present = [g for g in grants if g.object in ("database",) or (g.name or "").startswith("public")]
    for g in present:
        role.revoke([g])
        try:
            code, text = doctor()
        finally:
            role.grant([g])
        missing = [line for line in text.splitlines() if line.startswith("MISSING")]
        assert code == 1 and any(g.describe() in line for line in missing), (g, text)
        assert grant_command(g, role.name, "postgres") in text, (g, text)
