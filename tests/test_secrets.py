"""Secrets stay secret (issue 14, point 7): no piece of a password in any error, log line or CLI output.

Malformed DSNs (spaces, quotes, ``=``, ``@``, ``/``, ``%``, NUL), well-formed keyword and URI DSNs and the
``password`` option. libpq's conninfo parser quotes the offending piece of the string (``missing "="
after "xK7"``, ``unexpected spaces found in "Zq9 xK7"``), so its text must never reach the user; what
reaches them names the option instead. No services needed: connections go to 127.0.0.1 port 1.
"""

from __future__ import annotations

import logging
import pickle
import re
import traceback
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote, unquote

import psycopg
import pytest

import connectors.services
import connectors.services.base
import sinks.postgres.options
from connectors import cli
from eos_core import conninfo as core
from eos_core import options as core_options
from eos_core.errors import ConfigError, EosError, RetriableError
from sinks.postgres import status
from sinks.postgres.connection import connect
from sinks.postgres.options import ConnectionOptions, UpsertOptions

# (dsn, the password its writer meant, the form) -- every password is made of tokens (Zq9, xK7, wQ2)
# that occur in no message of spark-eos, so any 3-character piece of one in the output is a leak.
MALFORMED = [
    pytest.param(
        "host=127.0.0.1 port=1 user=u password=Zq9 xK7 wQ2 dbname=d",
        "Zq9 xK7 wQ2",
        "keyword",
        id="keyword-unquoted-spaces",
    ),
    pytest.param(
        "host=127.0.0.1 port=1 password='Zq9 xK7 wQ2 dbname=d", "Zq9 xK7 wQ2", "keyword", id="keyword-unbalanced-quote"
    ),
    pytest.param(
        "host=127.0.0.1 port=1 password=Zq9xK7wQ2 = user=u", "Zq9xK7wQ2 =", "keyword", id="keyword-stray-equals"
    ),
    pytest.param(
        "host=127.0.0.1 port=1 password=Zq9 xK7=wQ2 user=u",
        "Zq9 xK7=wQ2",
        "keyword",
        id="keyword-equals-in-unquoted-value",
    ),
    pytest.param("host=127.0.0.1 port=1 password=Zq9\x00xK7 user=u", "Zq9\x00xK7", "keyword", id="keyword-nul"),
    pytest.param("postgresql://u:Zq9 xK7@127.0.0.1:1/db", "Zq9 xK7", "URI", id="uri-raw-space"),
    pytest.param("postgresql://u:Zq9@xK7wQ2@127.0.0.1:1/db", "Zq9@xK7wQ2", "URI", id="uri-at-in-password"),
    pytest.param("postgresql://u:Zq9/xK7wQ2@127.0.0.1:1/db", "Zq9/xK7wQ2", "URI", id="uri-slash-in-password"),
    pytest.param("postgresql://u:Zq9%zzxK7@127.0.0.1:1/db", "Zq9%zzxK7", "URI", id="uri-bad-percent-escape"),
    pytest.param("postgresql://u@127.0.0.1:1/db?password=Zq9 xK7", "Zq9 xK7", "URI", id="uri-query-raw-space"),
]

# Well-formed: they parse, and connecting fails (nothing listens on port 1).
WELL_FORMED = [
    pytest.param(
        {"dsn": "host=127.0.0.1 port=1 user=u dbname=d password='Zq9 xK7\\'wQ2=\\\\'"},
        "Zq9 xK7'wQ2=\\",
        id="keyword-dsn",
    ),
    pytest.param({"dsn": "postgresql://u:Zq9%20xK7%40wQ2%2F@127.0.0.1:1/d"}, "Zq9 xK7@wQ2/", id="uri-dsn"),
    pytest.param(
        {"host": "127.0.0.1", "port": "1", "user": "u", "password": "Zq9 xK7'wQ2=\\"},
        "Zq9 xK7'wQ2=\\",
        id="password-option",
    ),
    pytest.param(
        {"dsn": "postgresql://u:wrong@127.0.0.1:1/d", "password": "Zq9 'xK7"}, "Zq9 'xK7", id="password-option-over-dsn"
    ),
]


def pieces(password: str) -> set[str]:
    """Every piece of 3+ characters of the password (raw, percent-encoded, percent-decoded) that
    holds a letter or digit of its own (``%2F`` alone is the encoding of '/', not the password)."""
    found: set[str] = set()
    for form in {password, quote(password, safe=""), unquote(password)}:
        escape = {i + k for m in re.finditer(r"%[0-9A-Fa-f]{2}", form) for i in [m.start()] for k in range(3)}
        for n in range(3, len(form) + 1):
            for i in range(len(form) - n + 1):
                if any(form[j].isalnum() and j not in escape for j in range(i, i + n)):
                    found.add(form[i : i + n])
    return found


def assert_no_leak(password: str, *texts: str) -> None:
    bad = pieces(password)
    for text in texts:
        leaked = sorted(p for p in bad if p in text)
        assert not leaked, f"password pieces {leaked} in: {text!r}"


def error_texts(err: BaseException) -> Iterator[str]:
    """str, repr, args, fields, the whole chain (cause and context) and the formatted traceback."""
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield str(current)
        yield repr(current)
        yield repr(current.args)
        yield from (str(a) for a in current.args)
        yield repr(getattr(current, "fields", {}))
        for chained in (current.__cause__, current.__context__):
            if chained is not None:
                yield from error_texts(chained)
        current = None
    yield "".join(traceback.format_exception(type(err), err, None))  # as printed (frames show only code)
    back = pickle.loads(pickle.dumps(err))  # errors cross processes: the copy must be clean too
    assert type(back) is type(err) and str(back) == str(err)
    yield str(back)
    yield repr(back)


def log_texts(caplog: pytest.LogCaptureFixture) -> list[str]:
    texts = []
    for record in caplog.records:
        texts.append(record.getMessage())
        texts.append(repr(record.args))
        if record.exc_info:
            texts.append("".join(traceback.format_exception(*record.exc_info)))
    return texts


@pytest.fixture
def debug_logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.DEBUG)  # the root logger, so psycopg's own debug lines are captured too
    return caplog


# ---- malformed DSNs -------------------------------------------------------------------------------


@pytest.mark.parametrize(("dsn", "password", "form"), MALFORMED)
def test_malformed_dsn_is_a_config_error_naming_the_option_not_the_password(
    dsn: str, password: str, form: str, debug_logs: pytest.LogCaptureFixture
) -> None:
    with pytest.raises(ConfigError) as info:
        ConnectionOptions.from_options({"dsn": dsn, "connect_timeout": "2"})
    err = info.value
    text = str(err)
    assert err.option == "dsn" and "option 'dsn'" in text
    assert f"{form} form" in text, "says which form it read the dsn as"
    assert "withheld" in text, "says that libpq's own message is not shown"
    assert ("percent-encode" in text) if form == "URI" else ("single-quote" in text and "as \\'" in text)
    assert err.__cause__ is None and err.__context__ is None  # no driver exception rides along
    assert_no_leak(password, *error_texts(err), *log_texts(debug_logs))


@pytest.mark.parametrize(("dsn", "password", "form"), MALFORMED)
def test_malformed_dsn_through_the_sink_options_and_the_status_api(
    dsn: str, password: str, form: str, debug_logs: pytest.LogCaptureFixture
) -> None:
    raised: list[BaseException] = []
    for attempt in (
        lambda: UpsertOptions.from_options({"dsn": dsn, "table": "t", "key": "id"}),
        lambda: status.sink_status(dsn, "x"),
        lambda: status.recover(dsn, "x"),
        lambda: status.release(dsn, "x"),
    ):
        with pytest.raises(ConfigError, match=r"option 'dsn'") as info:
            attempt()
        raised.append(info.value)
    assert_no_leak(password, *(t for e in raised for t in error_texts(e)), *log_texts(debug_logs))


@pytest.mark.parametrize("command", [["status"], ["status", "--json"], ["recover", "--apply"], ["release", "--yes"]])
@pytest.mark.parametrize(("dsn", "password", "form"), MALFORMED)
def test_cli_sinks_prints_one_clean_line_for_a_malformed_dsn(
    dsn: str,
    password: str,
    form: str,
    command: list[str],
    capsys: pytest.CaptureFixture[str],
    debug_logs: pytest.LogCaptureFixture,
) -> None:
    code = cli.main(["sinks", command[0], "--dsn", dsn, "--sink-id", "x", *command[1:]])
    out, err = capsys.readouterr()
    assert code == cli.EXIT_CONFIG  # a bad argument, as for every spark-eos command
    assert out == "" and err.endswith("\n") and err.count("\n") == 1, f"one line on stderr: {err!r}"
    assert "Traceback" not in err and f"sinks {command[0]}: config error:" in err and "option 'dsn'" in err
    assert "withheld" in err and ("percent-encode" in err if form == "URI" else "single-quote" in err)
    assert_no_leak(password, out, err, *log_texts(debug_logs))


def test_cli_falls_back_to_the_dsn_diagnosis_for_a_raw_driver_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], debug_logs: pytest.LogCaptureFixture
) -> None:
    """A command that hands --dsn to psycopg (inspect): the driver's text never gets out; the DSN is
    diagnosed before any connection, a usage error (exit 64)."""
    (tmp_path / "offsets").mkdir()
    dsn = "host=127.0.0.1 port=1 password=Zq9 xK7 wQ2 user=u"
    with pytest.raises(psycopg.ProgrammingError, match="xK7"):  # what libpq says: a piece of the password
        psycopg.conninfo.conninfo_to_dict(dsn)
    code = cli.main(["inspect", str(tmp_path), "--dsn", dsn])
    out, err = capsys.readouterr()
    assert code == 64 and err.count("\n") == 1 and "option '--dsn'" in err and "Traceback" not in err
    assert_no_leak("Zq9 xK7 wQ2", out, err, *log_texts(debug_logs))


# ---- well-formed DSNs and the password option: the server is not there ---------------------------


@pytest.mark.parametrize(("raw", "password"), WELL_FORMED)
def test_connecting_to_a_closed_port_never_shows_the_password(
    raw: dict[str, str], password: str, debug_logs: pytest.LogCaptureFixture
) -> None:
    opts = ConnectionOptions.from_options({**raw, "connect_timeout": "2"})
    assert_no_leak(password, repr(opts), str(opts), opts.describe())
    with pytest.raises(RetriableError) as info:
        connect(opts)
    err = info.value
    assert "cannot connect to u@127.0.0.1:1/" in str(err) and "dsn" in str(err)
    assert err.__cause__ is None and err.__context__ is None
    assert_no_leak(password, *error_texts(err), *log_texts(debug_logs))


@pytest.mark.parametrize(
    ("dsn", "password"),
    [
        ("host=127.0.0.1 port=1 user=u dbname=d password='Zq9 xK7\\'wQ2'", "Zq9 xK7'wQ2"),
        ("postgresql://u:Zq9%20xK7%40wQ2@127.0.0.1:1/d", "Zq9 xK7@wQ2"),
    ],
    ids=["keyword-dsn", "uri-dsn"],
)
def test_cli_sinks_status_to_a_closed_port(
    dsn: str, password: str, capsys: pytest.CaptureFixture[str], debug_logs: pytest.LogCaptureFixture
) -> None:
    code = cli.main(["sinks", "status", "--dsn", dsn, "--sink-id", "x"])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and err.count("\n") == 1 and "Traceback" not in err
    assert "sinks status: error: RetriableError: postgres: cannot connect to u@127.0.0.1:1/d" in err
    assert_no_leak(password, out, err, *log_texts(debug_logs))


def test_password_option_with_a_nul_is_refused_without_showing_it(debug_logs: pytest.LogCaptureFixture) -> None:
    """libpq would silently cut the password at the NUL (and log in with the first piece)."""
    with pytest.raises(ConfigError) as info:
        ConnectionOptions.from_options({"host": "127.0.0.1", "password": "Zq9\x00xK7wQ2"})
    err = info.value
    assert err.option == "password" and "option 'password'" in str(err) and "NUL" in str(err)
    assert_no_leak("Zq9\x00xK7wQ2", *error_texts(err), *log_texts(debug_logs))


def test_bad_password_option_value_is_never_shown_by_the_option_parser() -> None:
    with pytest.raises(ConfigError) as info:
        UpsertOptions.from_options(
            {"table": "t", "key": "id", "password": "Zq9 'xK7=", "dsn": "postgresql://u@h/d?password=Zq9 'xK7="}
        )
    assert info.value.option == "dsn"
    assert_no_leak("Zq9 'xK7=", *error_texts(info.value))


# ---- the one redaction ----------------------------------------------------------------------------


def test_scrub_removes_the_password_and_each_fragment_raw_and_percent_encoded() -> None:
    said = 'missing "=" after "ss word" in "pa ss word"; also pa%20ss%20word and ss%20word'
    clean = core.scrub(said, "pa ss word")
    assert "word" not in clean and "pa ss" not in clean and "pa%20ss" not in clean, clean
    assert clean.startswith('missing "=" after "ss ***"')  # 2-character pieces cannot be told from text
    # read from a malformed conninfo, leniently: the password its writer meant, not libpq's reading
    assert "wQ2" not in core.scrub("xK7 wQ2", conninfo="host=h password=Zq9 xK7 wQ2 dbname=d")
    assert core.scrub("nothing secret", None, "") == "nothing secret"


@pytest.mark.parametrize(("dsn", "password", "form"), MALFORMED)
def test_redaction_of_malformed_dsns(dsn: str, password: str, form: str) -> None:
    assert core.redact_dsn(dsn) == "<unparsable DSN>"
    assert core.conninfo_problem(dsn) is not None
    assert_no_leak(password, core.scrub(f"connecting with {dsn} failed", conninfo=dsn))


def test_one_redaction_behind_every_public_name() -> None:
    assert sinks.postgres.options.redact_conninfo is core.redact_conninfo
    assert sinks.postgres.options.redact is core_options.redact
    assert connectors.services.base.redact_dsn is core.redact_dsn
    assert connectors.services.redact_dsn is core.redact_dsn
    assert core.redact_dsn("postgresql://u:Zq9%20x@h/d") == "postgresql://u:***@h/d"
    assert core.redact_conninfo("host=h password='a b' user=u") == "host=h password=*** user=u"
    assert issubclass(ConfigError, EosError)
