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
