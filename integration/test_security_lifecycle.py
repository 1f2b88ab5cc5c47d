"""Rotation and revocation under a running query, as lifecycle rows (issue 44, item 6).

Each row runs a streaming query as an app identity holding exactly what its connectors declare, does what an
operator does to a running pipeline, proves the action happened, and ends in exactly-once results checked by
the exact checker, or a clear refusal that changes nothing followed by a restart that resumes exactly once:

- the SCRAM password of the query's Kafka principal rotated (Kafka -> Spark -> Kafka);
- an ACL the Kafka sink needs (WRITE on its topic) revoked mid-stream, then granted again;
- the Postgres password of the sink's role rotated (Kafka -> Spark -> postgres-2pc);
- the Postgres server's certificate re-issued by the same CA.

A rotation leaves open sessions alone (Kafka does not re-authenticate a connection unless the broker sets
``connections.max.reauth.ms``; Postgres checks a password at login only), but each micro-batch's tasks open
connections of their own: the next batch after a rotation is refused at its first login and the query fails
within seconds, fatal, naming the login, with nothing of the batch visible; restarted with the new password it
resumes exactly once (docs/security.md, "Rotating a password").
"""

from __future__ import annotations

import socket
import ssl
import struct
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from connectors import error_cause
from connectors.services.apache_kafka import ApacheKafka
from connectors.toolkit import checker
from connectors.toolkit.chaos import create_topic, make_records, produce_records
from eos_core.kafka_config import CONFIG_ENV
from eos_core.privileges import KafkaAcl

pytestmark = [pytest.mark.integration]

FAIL_FAST = 20.0  # seconds from the first write that needs the refused login or ACL to the query's failure
SCHEMA = "id STRING, key STRING, amount LONG"


def _wait(query: Any, done: Callable[[], bool], what: str, timeout: float = 120.0) -> bool:
    """True once ``done()``; False as soon as the query has failed; an AssertionError after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if done():
            return True
        if not query.isActive or query.exception() is not None:
            return False
        time.sleep(0.3)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def _ended(query: Any, timeout: float = 60.0) -> str:
    """The cause of the query's failure, waited for."""
    deadline = time.monotonic() + timeout
    while query.exception() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert query.exception() is not None, "the query did not fail"
    return error_cause(str(query.exception()))


# ---- Kafka -> Spark -> Kafka on a SASL_SSL broker with ACLs --------------------------------------------------


def _kafka_pipeline(secured_kafka: ApacheKafka, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Two topics and a principal holding exactly the source's and the kafka-eos sink's declared ACLs."""
    from sinks.kafka.options import parse_options as sink_options
    from sinks.kafka.privileges import sink_acls
    from sources.kafka.options import parse_options as source_options
    from sources.kafka.privileges import source_acls

    properties = secured_kafka.client_properties()
    assert properties is not None
    monkeypatch.setenv(CONFIG_ENV, str(properties))  # the checker and the producers: as the admin
    tag = uuid.uuid4().hex[:8]
    src, out = f"life-in-{tag}", f"life-out-{tag}"
    for topic in (src, out):
        create_topic(secured_kafka.bootstrap, topic, 2)
    source = {"subscribe": src, "startingOffsets": "earliest"}
    sink = {"topic": out, "sink.id": f"life-{tag}"}
    needs = source_acls(source_options({"kafka.bootstrap.servers": "b:9", **source}, streaming=True))
    needs += sink_acls(
        sink_options({"kafka.bootstrap.servers": "b:9", "checkpointLocation": "/cp", **sink}, streaming=True)
    )
    app = secured_kafka.add_principal(f"life-{tag}", needs)
    return {"src": src, "out": out, "source": source, "sink": sink, "app": app, "needs": needs}


def _start_kafka(spark: Any, p: dict[str, Any], checkpoint: Path) -> Any:
    options = p["app"].kafka_options()
    return (
        spark.readStream.format("kafka-eos")
        .options(**options, **p["source"])
        .load()
        .selectExpr("key", "value")
        .writeStream.format("kafka-eos")
        .options(**options, **p["sink"])
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="1 second")
        .start()
    )


def _out(secured_kafka: ApacheKafka, p: dict[str, Any]) -> list[dict[str, Any]]:
    return checker.read_topic(secured_kafka.bootstrap, p["out"])


def _exactly_once(expected: list[dict[str, Any]], rows: list[dict[str, Any]]) -> None:
    checks = checker.compare_records(expected, rows, payload_fields=("key", "amount"))
    assert all(c.ok for c in checks), [c.summary for c in checks]


def test_a_scram_password_rotated_under_a_running_query_then_a_restart_with_the_new_one_resumes_exactly_once(
    secured_kafka: ApacheKafka, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = _kafka_pipeline(secured_kafka, monkeypatch)
    app, records = p["app"], make_records(90, seed=44, prefix="rot-")
    produce_records(secured_kafka.bootstrap, p["src"], records[:30], partitions=2)
    query = _start_kafka(spark, p, tmp_path / "cp")
    try:
        assert _wait(query, lambda: len(_out(secured_kafka, p)) >= 30, "the first 30 records"), _ended(query)
        old = app.kafka_options()
        new_password = "rotated-" + uuid.uuid4().hex
        secured_kafka.set_password(app.name, new_password)
        app.password = new_password
        # the rotation happened: a new client with the old password is refused at once, the new one logs in
        began = time.monotonic()
        with pytest.raises(Exception) as refused:
            spark.read.format("kafka-eos").options(**old, subscribe=p["src"]).load().count()
        assert time.monotonic() - began < FAIL_FAST
        assert f"refused the login of principal '{app.name}'" in error_cause(str(refused.value))
        new = app.kafka_options()
        assert spark.read.format("kafka-eos").options(**new, subscribe=p["src"]).load().count() == 30
        # the running query: the next batch's tasks open new connections with the old password; the first one
        # refused fails the query, fatal, naming the login, within seconds (never retried), nothing of it visible
        produce_records(secured_kafka.bootstrap, p["src"], records[30:60], partitions=2)
        began = time.monotonic()
        assert not _wait(query, lambda: len(_out(secured_kafka, p)) > 30, "the query's failure"), "old password used"
        cause = _ended(query)
        assert time.monotonic() - began < FAIL_FAST, cause
        assert f"refused the login of principal '{app.name}'" in cause and "RetriableError" not in cause, cause
        assert len(_out(secured_kafka, p)) == 30
    finally:
        query.stop()
    assert new_password not in str(query.exception() or "") and app.password == new_password
    produce_records(secured_kafka.bootstrap, p["src"], records[60:], partitions=2)
    again = _start_kafka(spark, p, tmp_path / "cp")  # the new password, the same checkpoint
    try:
        assert _wait(again, lambda: len(_out(secured_kafka, p)) >= 90, "all 90 records"), _ended(again)
    finally:
        again.stop()
    _exactly_once(records, _out(secured_kafka, p))


def test_a_broker_certificate_reissued_by_the_same_ca_under_a_running_query_changes_nothing(
    secured_kafka: ApacheKafka, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 44, item 6 on Kafka: the broker's listener takes a new certificate of the same CA while a Kafka ->
    Kafka query runs as an app principal (a dynamic reconfiguration: open connections go on, new ones verify
    the new certificate against the CA the clients trust); the query goes on and ends exactly once."""
    p = _kafka_pipeline(secured_kafka, monkeypatch)
    records = make_records(60, seed=49, prefix="kcert-")
    produce_records(secured_kafka.bootstrap, p["src"], records[:30], partitions=2)
    query = _start_kafka(spark, p, tmp_path / "cp")
    try:
        assert _wait(query, lambda: len(_out(secured_kafka, p)) >= 30, "the first 30 records"), _ended(query)
        before = secured_kafka.certificate_serial()
        secured_kafka.reissue_certificate()
        assert secured_kafka.certificate_serial() != before, "the broker still presents its old certificate"
        # a client that connects now verifies the new certificate (the action happened for new connections)
        assert spark.read.format("kafka-eos").options(**p["app"].kafka_options(), subscribe=p["src"]).load().count()
        produce_records(secured_kafka.bootstrap, p["src"], records[30:], partitions=2)
        assert _wait(query, lambda: len(_out(secured_kafka, p)) >= 60, "the next 30 records"), _ended(query)
    finally:
        query.stop()
    assert query.exception() is None, query.exception()
    _exactly_once(records, _out(secured_kafka, p))


def test_an_acl_revoked_mid_stream_fails_the_query_at_once_and_a_restart_after_the_grant_resumes_exactly_once(
    secured_kafka: ApacheKafka, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = _kafka_pipeline(secured_kafka, monkeypatch)
    app, records = p["app"], make_records(60, seed=45, prefix="acl-")
    write = KafkaAcl("topic", p["out"], "WRITE")
    assert any((a.resource, a.name, a.operation) == ("topic", p["out"], "WRITE") for a in p["needs"])
    produce_records(secured_kafka.bootstrap, p["src"], records[:30], partitions=2)
    query = _start_kafka(spark, p, tmp_path / "cp")
    try:
        assert _wait(query, lambda: len(_out(secured_kafka, p)) >= 30, "the first 30 records"), _ended(query)
        secured_kafka.revoke(app.name, [write])
        produce_records(secured_kafka.bootstrap, p["src"], records[30:], partitions=2)
        began = time.monotonic()
        assert not _wait(query, lambda: len(_out(secured_kafka, p)) > 30, "the query's failure"), (
            "written without WRITE"
        )
        cause = _ended(query)
        assert time.monotonic() - began < FAIL_FAST, cause
        # the action happened, and is named: the ACL, the principal and the command that grants it
        assert f"principal User:{app.name} lacks WRITE on topic '{p['out']}'" in cause, cause
        assert "RetriableError" not in cause and "kafka-acls" in cause, cause
    finally:
        query.stop()
    assert len(_out(secured_kafka, p)) == 30  # nothing of the refused batch is visible
    secured_kafka.grant(app.name, [write])
    again = _start_kafka(spark, p, tmp_path / "cp")
    try:
        assert _wait(again, lambda: len(_out(secured_kafka, p)) >= 60, "all 60 records"), _ended(again)
    finally:
        again.stop()
    _exactly_once(records, _out(secured_kafka, p))


# ---- Kafka -> Spark -> postgres-2pc on a TLS-only, hardened Postgres ------------------------------------------


def _pg_pipeline(kafka_service: Any, postgres_service: Any) -> dict[str, Any]:
    """A topic, a table an admin made, and a role holding exactly postgres-2pc's declared grants."""
    from sinks.postgres.privileges import twophase_grants
    from sinks.postgres.twophase.options import TwoPhaseOptions

    tag = uuid.uuid4().hex[:8]
    topic, table, eos = f"life-pg-{tag}", f"life_{tag}", f"eos_{tag}"
    create_topic(kafka_service.bootstrap, topic, 2, settings=kafka_service.client_config())
    kafka_service.grant_topic(topic)
    options = {"table": f"public.{table}", "eos.schema": eos, "sink.id": f"life-{tag}"}
    with psycopg.connect(postgres_service.admin_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE public.{table} (id text, key text, amount bigint)")
        conn.execute(f"CREATE SCHEMA {eos}")
    role = postgres_service.add_role(f"life_{tag}")
    role.grant_present(twophase_grants(TwoPhaseOptions.from_options(options)))  # it makes the protocol tables
    return {"topic": topic, "table": table, "options": options, "role": role}


def _start_pg(spark: Any, kafka_service: Any, p: dict[str, Any], checkpoint: Path) -> Any:
    from pyspark.sql import functions as F

    return (
        spark.readStream.format("kafka-eos")
        .options(**kafka_service.app_options, subscribe=p["topic"], startingOffsets="earliest")
        .load()
        .select(F.from_json(F.col("value").cast("string"), SCHEMA).alias("r"))
        .select("r.*")
        .writeStream.format("postgres-2pc")
        .options(dsn=p["role"].dsn, **p["options"])
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="1 second")
        .start()
    )


def _rows(postgres_service: Any, p: dict[str, Any]) -> list[dict[str, Any]]:
    with psycopg.connect(postgres_service.admin_dsn, autocommit=True) as conn:
        return checker.read_table(conn, p["table"])


def _produce(kafka_service: Any, topic: str, records: list[dict[str, Any]]) -> None:
    produce_records(kafka_service.bootstrap, topic, records, partitions=2, settings=kafka_service.client_config())


def _pg_exactly_once(postgres_service: Any, p: dict[str, Any], records: list[dict[str, Any]]) -> None:
    _exactly_once(records, _rows(postgres_service, p))
    with psycopg.connect(postgres_service.admin_dsn, autocommit=True) as conn:
        assert checker.prepared_gids(conn, p["options"]["sink.id"]) == []  # nothing left prepared


def test_a_postgres_password_rotated_under_a_running_query_then_a_restart_with_the_new_one_resumes_exactly_once(
    kafka_service: Any, postgres_service: Any, spark: Any, tmp_path: Path
) -> None:
    p = _pg_pipeline(kafka_service, postgres_service)
    role, records = p["role"], make_records(90, seed=46, prefix="pgrot-")
    _produce(kafka_service, p["topic"], records[:30])
    query = _start_pg(spark, kafka_service, p, tmp_path / "cp")
    try:
        assert _wait(query, lambda: len(_rows(postgres_service, p)) >= 30, "the first 30 rows"), _ended(query)
        old_dsn, old_password = role.dsn, role.password
        role.set_password("rotated-" + uuid.uuid4().hex)
        # the rotation happened: the old password is refused at login, the new one logs in
        with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
            psycopg.connect(old_dsn, connect_timeout=5)
        psycopg.connect(role.dsn, connect_timeout=5).close()
        _produce(kafka_service, p["topic"], records[30:60])
        began = time.monotonic()
        # the next batch's tasks log in with the old password: refused, named, never retried; nothing visible
        assert not _wait(query, lambda: len(_rows(postgres_service, p)) > 30, "the query's failure"), "old password"
        cause = _ended(query)
        assert time.monotonic() - began < FAIL_FAST, cause
        assert "password authentication failed" in cause and "check the dsn/user/password" in cause, cause
        assert old_password not in cause and role.password not in cause
        assert len(_rows(postgres_service, p)) == 30
    finally:
        query.stop()
    _produce(kafka_service, p["topic"], records[60:])
    again = _start_pg(spark, kafka_service, p, tmp_path / "cp")  # the new password, the same checkpoint
    try:
        assert _wait(again, lambda: len(_rows(postgres_service, p)) >= 90, "all 90 rows"), _ended(again)
    finally:
        again.stop()
    _pg_exactly_once(postgres_service, p, records)


def _presented_serial(host: str, port: int) -> int:
    """The serial number of the certificate the server presents to a new TLS connection (SSLRequest, then TLS)."""
    from cryptography import x509

    with socket.create_connection((host, port), timeout=10) as raw:
        raw.sendall(struct.pack("!ii", 8, 80877103))
        assert raw.recv(1) == b"S", "the server refused TLS"
        context = ssl.create_default_context()
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE  # only read what it presents
        with context.wrap_socket(raw, server_hostname=host) as tls:
            der = tls.getpeercert(binary_form=True)
    assert der is not None
    return int(x509.load_der_x509_certificate(der).serial_number)


def test_a_server_certificate_reissued_by_the_same_ca_under_a_running_query_changes_nothing(
    kafka_service: Any, postgres_service: Any, spark: Any, tmp_path: Path
) -> None:
    p = _pg_pipeline(kafka_service, postgres_service)
    records = make_records(60, seed=47, prefix="cert-")
    info = psycopg.conninfo.conninfo_to_dict(postgres_service.admin_dsn)
    host, port = str(info.get("host") or "127.0.0.1"), int(info.get("port") or 5432)
    _produce(kafka_service, p["topic"], records[:30])
    query = _start_pg(spark, kafka_service, p, tmp_path / "cp")
    try:
        assert _wait(query, lambda: len(_rows(postgres_service, p)) >= 30, "the first 30 rows"), _ended(query)
        before = _presented_serial(host, port)
        postgres_service.reissue_certificate()
        after = _presented_serial(host, port)
        assert after != before, "the server still presents its old certificate"  # the action happened
        _produce(kafka_service, p["topic"], records[30:])
        # new connections verify the new certificate against the same CA (sslmode=verify-full): the query goes on
        assert _wait(query, lambda: len(_rows(postgres_service, p)) >= 60, "the next 30 rows"), _ended(query)
    finally:
        query.stop()
    _pg_exactly_once(postgres_service, p, records)
