"""Unit tests for sqlstate classification and the bounded retry loop (no database)."""

from __future__ import annotations

import pickle

import psycopg
import pytest
from psycopg import errors as pgerr

from eos_core.errors import ConfigError, FatalError, RetriableError
from sinks.postgres import connection
from sinks.postgres.connection import classify, connect, retrying
from sinks.postgres.options import ConnectionOptions


@pytest.mark.parametrize("state", ["40001", "40P01", "08006", "08003", "08000", "57P01", "57P02", "57P03"])
def test_retriable_sqlstates(state: str) -> None:
    err = classify(pgerr.lookup(state)("boom"))
    assert isinstance(err, RetriableError)
    assert state in err.message and "boom" in err.message and err.sqlstate == state


@pytest.mark.parametrize("state", ["23505", "42P01", "22P02", "42703", "23502", "53100", "57014"])
def test_fatal_sqlstates(state: str) -> None:
    err = classify(pgerr.lookup(state)("bad thing"), "writing t")
    assert isinstance(err, FatalError) and not isinstance(err, RetriableError)
    assert err.message.startswith("writing t: ") and state in err.message and "bad thing" in err.message


def test_operational_error_without_sqlstate_is_retriable() -> None:
    assert isinstance(classify(psycopg.OperationalError("server closed the connection unexpectedly")), RetriableError)
    assert isinstance(classify(psycopg.InterfaceError("the connection is closed")), RetriableError)
    assert isinstance(classify(psycopg.ProgrammingError("misuse")), FatalError)
    assert isinstance(classify(ValueError("x")), FatalError)


def test_classified_errors_pickle() -> None:
    err = classify(pgerr.lookup("40P01")("deadlock"))
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is RetriableError and back.message == err.message and back.sqlstate == "40P01"


def test_retrying_recovers_from_retriable(monkeypatch: pytest.MonkeyPatch) -> None:
    sleeps: list[float] = []
    monkeypatch.setattr(connection.time, "sleep", sleeps.append)
    calls = iter([pgerr.lookup("40001")("ser"), pgerr.lookup("08006")("reset"), None])

    def fn() -> str:
        exc = next(calls)
        if exc is not None:
            raise exc
        return "ok"

    assert retrying(fn, attempts=5, base_delay=1.0, max_delay=1.5) == "ok"
    assert len(sleeps) == 2 and 0.5 <= sleeps[0] <= 1.0 and 0.75 <= sleeps[1] <= 1.5  # doubled, then capped


def test_retrying_gives_up_with_the_original_chained(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(connection.time, "sleep", lambda s: None)
    original = pgerr.lookup("40P01")("deadlock detected")
    count = 0

    def fn() -> None:
        nonlocal count
        count += 1
        raise original

    with pytest.raises(RetriableError) as err:
        retrying(fn, attempts=3)
    assert count == 3 and "gave up after 3 attempts" in err.value.message and err.value.__cause__ is original


def test_retrying_raises_fatal_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(connection.time, "sleep", lambda s: pytest.fail("must not retry"))
    original = pgerr.lookup("23505")("duplicate key")
    with pytest.raises(FatalError) as err:
        retrying(lambda: (_ for _ in ()).throw(original), attempts=5)
    assert "23505" in err.value.message and err.value.__cause__ is original
    config = ConfigError("bad option")
    with pytest.raises(ConfigError) as cerr:
        retrying(lambda: (_ for _ in ()).throw(config), attempts=5)
    assert cerr.value is config


def test_connect_unreachable_is_clear_and_hides_password() -> None:
    opts = ConnectionOptions(host="127.0.0.1", port=1, user="app", password="s3cret", dbname="db", connect_timeout=2)
    with pytest.raises(RetriableError) as err:
        connect(opts)
    text = str(err.value)
    assert "cannot connect to app@127.0.0.1:1/db" in text and "s3cret" not in text
