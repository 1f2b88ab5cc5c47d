"""The driver's setup connection rides out a briefly unreachable Postgres (issue 27, item 10)."""

from __future__ import annotations

from typing import Any

import pytest

from eos_core.errors import ConfigError, RetriableError
from sinks.postgres import connection
from sinks.postgres.options import ConnectionOptions


def _flaky(monkeypatch: pytest.MonkeyPatch, failures: int, error: Exception) -> list[dict[str, Any]]:
    calls: list[dict[str, Any]] = []

    def connect(opts: ConnectionOptions, **kw: Any) -> str:
        calls.append(kw)
        if len(calls) <= failures:
            raise error
        return "a connection"

    monkeypatch.setattr(connection, "connect", connect)
    return calls


def test_setup_retries_a_server_that_is_down_for_a_moment(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _flaky(monkeypatch, 2, RetriableError("postgres: connection refused (server starting?)"))
    opts = ConnectionOptions.from_options({"dsn": "host=h", "retry.attempts": "4", "retry.backoff": "1ms"})
    assert connection.setup_connect(opts, "spark-eos test setup") == "a connection"
    assert len(calls) == 3 and all(c["autocommit"] and c["application_name"] == "spark-eos test setup" for c in calls)


def test_setup_gives_up_after_retry_attempts_naming_what_waited(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    calls = _flaky(monkeypatch, 10, RetriableError("postgres: connection refused"))
    opts = ConnectionOptions.from_options({"dsn": "host=h", "retry.attempts": "3", "retry.backoff": "1ms"})
    with pytest.raises(RetriableError) as info:
        connection.setup_connect(opts, "spark-eos test setup")
    assert len(calls) == 3 and "gave up after 3 attempts" in str(info.value)
    assert "spark-eos test setup connect: attempt 1/3 failed" in caplog.text


def test_setup_fails_at_once_on_a_bad_login(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _flaky(monkeypatch, 10, ConfigError("postgres: password authentication failed for user u"))
    opts = ConnectionOptions.from_options({"dsn": "host=h", "retry.attempts": "5", "retry.backoff": "1ms"})
    with pytest.raises(ConfigError):
        connection.setup_connect(opts, "spark-eos test setup")
    assert len(calls) == 1


FAILED = 'connection failed: connection to server at "127.0.0.1", port 5432 failed: '


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ('FATAL:  password authentication failed for user "app"', "check the dsn/user/password/dbname"),
        (
            'FATAL:  permission denied for database "postgres"\nDETAIL:  User does not have CONNECT privilege.',
            'GRANT CONNECT ON DATABASE "postgres" TO "app";',
        ),
        (
            'FATAL:  pg_hba.conf rejects connection for host "127.0.0.1", user "app", database "postgres", no encryption',
            "add sslmode=verify-full and sslrootcert",
        ),
        ("SSL error: certificate verify failed", "point sslrootcert"),
        ("SSL error: provider signature failure", "point sslrootcert"),
        ('server certificate for "db" does not match host name "127.0.0.1"', "connect by the name the certificate"),
        ('FATAL:  role "app" does not exist', "check the dsn/user/password/dbname"),
    ],
)
def test_a_refused_login_or_tls_handshake_is_a_config_error_at_once(
    monkeypatch: pytest.MonkeyPatch, text: str, named: str
) -> None:
    """Issue 44: libpq gives no sqlstate for a failure during the login, and every one of these was a
    RetriableError ('check that the server runs'), retried by the sink and by a restart strategy."""
    import psycopg

    def refuse(*a: Any, **kw: Any) -> None:
        raise psycopg.OperationalError(FAILED + text)

    monkeypatch.setattr(psycopg, "connect", refuse)
    opts = ConnectionOptions.from_options({"dsn": "host=127.0.0.1 user=app dbname=postgres password=s3cret-pw"})
    with pytest.raises(ConfigError) as info:
        connection.connect(opts)
    assert named in str(info.value) and "s3cret-pw" not in str(info.value), str(info.value)


def test_a_server_that_is_not_there_stays_retriable(monkeypatch: pytest.MonkeyPatch) -> None:
    import psycopg

    def refuse(*a: Any, **kw: Any) -> None:
        raise psycopg.OperationalError(FAILED + "Connection refused\n\tIs the server running on that host?")

    monkeypatch.setattr(psycopg, "connect", refuse)
    with pytest.raises(RetriableError):
        connection.connect(ConnectionOptions.from_options({"dsn": "host=127.0.0.1 user=app"}))
