"""Gids of the two-phase sink: format, parse, escaping, limits and invariants."""

from __future__ import annotations

import pickle

import pytest

from eos_core.errors import ConfigError
from sinks.postgres.twophase.gid import (
    MAX_GID_BYTES,
    MAX_SINK_ID_BYTES,
    Gid,
    check_sink_id,
    escape_sink_id,
    new_nonce,
    parse_gid,
    sink_prefix,
    unescape_sink_id,
)

NONCE = "0123456789ab"


def test_format_and_parse_round_trip() -> None:
    g = Gid("orders", 12, 3, NONCE, 40)
    assert str(g) == "eos:orders:12:3:0123456789ab:40"
    assert parse_gid(str(g)) == g
    assert str(g).startswith(sink_prefix("orders"))


@pytest.mark.parametrize("sink_id", ["a:b", "50%", "naïve sink", "x" * 10, "a/b@c+d=e", "日本", "eos:x:1:2"])
def test_escaping_round_trips_and_keeps_separators_unambiguous(sink_id: str) -> None:
    g = Gid(sink_id, 7, 1, NONCE, 2)
    text = str(g)
    assert text.count(":") == 5
    assert unescape_sink_id(escape_sink_id(sink_id)) == sink_id
    assert parse_gid(text) == g


def test_prefix_of_one_sink_never_matches_another() -> None:
    # 'a' must not see the gids of 'a:b' or 'ab': the prefix ends with the separator.
    other = [str(Gid("a:b", 1, 0, NONCE, 0)), str(Gid("ab", 1, 0, NONCE, 0))]
    assert not any(t.startswith(sink_prefix("a")) for t in other)


def test_longest_gid_fits_postgres_limit() -> None:
    longest_id = "x" * MAX_SINK_ID_BYTES
    g = Gid(longest_id, 2**63 - 1, 2**31 - 1, NONCE, 2**63 - 1)
    assert len(str(g).encode()) <= MAX_GID_BYTES


@pytest.mark.parametrize(
    ("sink_id", "fragment"),
    [
        ("", "required"),
        ("   ", "required"),
        (None, "required"),
        (" a", "spaces"),
        ("a\nb", "control"),
        ("x" * (MAX_SINK_ID_BYTES + 1), "too long"),
        ("é" * 50, "too long"),
    ],
)
def test_bad_sink_ids_are_config_errors_naming_the_option(sink_id: object, fragment: str) -> None:
    with pytest.raises(ConfigError) as err:
        check_sink_id(sink_id)
    assert "sink.id" in str(err.value) and fragment in str(err.value)


@pytest.mark.parametrize(
    "kwargs",
    [{"batch": -1}, {"partition": -1}, {"attempt": -2}, {"nonce": "XYZ"}, {"nonce": "0123"}, {"batch": True}],
)
def test_invariants(kwargs: dict) -> None:
    base = {"sink_id": "s", "batch": 1, "partition": 0, "nonce": NONCE, "attempt": 0}
    base.update(kwargs)
    with pytest.raises(ValueError):
        Gid(**base)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "eos:s:1:0:0123456789ab",
        "eos:s:x:0:0123456789ab:1",
        "pgx:s:1:0:0123456789ab:1",
        "eos:s:1:0:0123456789AB:1",
        "eos:%ZZ:1:0:0123456789ab:1",
    ],
)
def test_foreign_gids_parse_to_none(text: str) -> None:
    assert parse_gid(text) is None


def test_nonces_are_fresh_and_valid() -> None:
    nonces = {new_nonce() for _ in range(100)}
    assert len(nonces) == 100
    for n in nonces:
        Gid("s", 0, 0, n, 0)


def test_gid_pickles() -> None:
    g = Gid("a:b", 1, 2, NONCE, 3)
    assert pickle.loads(pickle.dumps(g)) == g
