"""Connecting to Postgres, sorting its errors into retriable or fatal, and retrying with backoff.

Public API:

- ``connect(opts, *, autocommit=False) -> psycopg.Connection``: a ConnectionError/OperationalError
  becomes a ``RetriableError`` naming user@host:port/db (never the password); a bad login or a
  conninfo libpq rejects is a ``ConfigError``. The driver's text is scrubbed of the password and of
  every 3+ character fragment of it (``eos_core.conninfo.scrub``), and the driver exception is not
  chained: its own text may quote the password.
- ``classify(exc) -> RetriableError | FatalError``: retriable are serialization failure (40001),
  deadlock (40P01), connection exceptions (08*), admin/crash shutdown (57P01/57P02/57P03),
  cannot-connect-now, a lock wait past ``lock.timeout`` (55P03) and OperationalErrors without a
  sqlstate (a dropped socket); everything else is fatal. The message carries the Postgres message
  and its sqlstate (``.sqlstate`` is set) and, for a lock wait or a lost connection, the options
  that bound the wait.
- Every wait is bounded (``ConnectionOptions.conninfo``): connecting by ``connect_timeout``, a
  lock by ``lock.timeout`` (the session's ``lock_timeout``), a peer that stops answering by TCP
  keepalives (``keepalives_idle`` + ``keepalives_interval`` x ``keepalives_count``, 60 s) and
  ``tcp_user_timeout`` (60 s). ``statement_timeout`` is off unless set: a statement that works
  (rather than waits) may take as long as its batch needs.
- ``RetryPolicy`` (attempts, base delay, max delay; ``RetryPolicy.of(opts)`` from the connection
  options ``retry.*``) and ``policy.run(fn, what)``: call ``fn()`` until it succeeds or a fatal
  error; bounded exponential backoff with jitter; the last retriable error is re-raised with the
  attempt count; the original exception is always chained (never hidden). ``retrying(fn, ...)``
  is the same with the policy spelled out.
- ``close_quietly(conn)`` / ``rollback_quietly(conn)``: cleanup that logs and never masks the
  error that caused it.
- ``postgres_options(dsn) -> dict``: the sink options for a connection string with the password
  taken out of ``dsn`` into the ``password`` option, which Spark redacts by its key in every plan,
  UI page and event log (a password inside a ``postgresql://user:pw@`` URL it would print).
- ``ddl_lock(conn)``: a transaction holding the server-wide DDL advisory lock, for
  ``CREATE ... IF NOT EXISTS``. Postgres does not make that statement safe against itself: two
  sessions creating the same table at once both pass the "not exists" check and one fails with
  a unique violation on ``pg_type`` (two queries, or two replicas of one job, starting together).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TypeVar

import psycopg

from eos_core.conninfo import check_conninfo, redact_conninfo, scrub
from eos_core.errors import ConfigError, EosError, FatalError, RetriableError
from sinks.postgres.options import ConnectionOptions

__all__ = [
    "RETRIABLE_SQLSTATES",
    "RetryPolicy",
    "classify",
    "close_quietly",
    "connect",
    "ddl_lock",
    "postgres_options",
    "retrying",
    "rollback_quietly",
    "setup_connect",
    "sqlstate_of",
]

log = logging.getLogger(__name__)
T = TypeVar("T")

RETRIABLE_SQLSTATES: dict[str, str] = {
    "40001": "serialization failure",
    "40P01": "deadlock detected",
    "57P01": "admin shutdown",
    "57P02": "crash shutdown",
    "57P03": "cannot connect now",
    "55P03": "lock not available",
}
_RETRIABLE_CLASSES = ("08",)  # connection exceptions
LOCK_HINT = (
    "; the statement waited longer than option 'lock.timeout' for a lock another session holds (pg_locks and "
    "pg_stat_activity name it): end that session, or raise 'lock.timeout'"
)
LOST_HINT = (
    " (a server that stops answering is given up after options tcp_user_timeout, with data unacknowledged, or "
    "keepalives_idle + keepalives_interval x keepalives_count when idle: raise them on a slow network)"
)


def sqlstate_of(exc: BaseException) -> str | None:
    state = getattr(exc, "sqlstate", None)
    if state is None and isinstance(exc, EosError):
        state = exc.fields.get("sqlstate")
    return state if isinstance(state, str) else None


def connect(
    opts: ConnectionOptions, *, autocommit: bool = False, application_name: str = "spark-eos"
) -> psycopg.Connection:
    """Open a connection; failures are RetriableError (server down) or ConfigError (bad login, bad dsn).

    Errors are raised outside the ``except`` block, so no driver exception rides along as
    ``__context__`` (its text is the one thing that may quote the password).
    """
    conninfo = opts.conninfo()  # a dsn libpq rejects is a ConfigError already (ConnectionOptions)
    failure: psycopg.Error | None = None
    try:
        conn = psycopg.connect(conninfo, autocommit=autocommit, application_name=application_name)
    except psycopg.Error as exc:
        failure = exc
    else:
        try:  # every lock wait of the session is bounded: option lock.timeout
            conn.execute(
                "SELECT set_config('lock_timeout', %s, false)", (f"{max(1, int(opts.lock_timeout * 1000))}ms",)
            )
            if not autocommit:
                conn.commit()
        except BaseException:
            close_quietly(conn)
            raise
        return conn
    assert failure is not None
    message = scrub(str(failure).strip(), opts.password, conninfo=conninfo)
    if opts.dsn:
        message = scrub(message, conninfo=opts.dsn)
    state = failure.sqlstate
    tls = _tls_refusal(message)
    if tls:
        raise ConfigError(f"postgres: cannot connect to {opts.describe()}: {message}; {tls}", option="dsn")
    low = message.lower()
    if state == "42501" or "permission denied for database" in low:
        # no CONNECT on the database (a hardened one grants it per role); libpq gives no sqlstate at login
        from psycopg.conninfo import conninfo_to_dict

        from eos_core.privileges import PgGrant, describe_missing, grant_command

        params = conninfo_to_dict(conninfo)
        role, database = str(params.get("user") or "?"), str(params.get("dbname") or "?")
        need = PgGrant("database", None, "CONNECT", "log in")
        raise ConfigError(
            describe_missing(
                f"role {role!r}",
                grants=[need],
                context=f"postgres: cannot connect to {opts.describe()}",
                fix=[grant_command(need, role, database)],
            ),
            option="dsn",
            sqlstate=state,
        )
    if (
        state in ("28P01", "28000", "3D000")
        or isinstance(failure, psycopg.ProgrammingError)
        or any(m in low for m in _LOGIN_REFUSALS)
    ):
        # bad password, no such role/database; or libpq refused the connection options
        raise ConfigError(
            f"postgres: cannot connect to {opts.describe()}: {message}"
            + (f" (sqlstate {state})" if state else "")
            + (
                "; the server takes TLS connections only: add sslmode=verify-full and sslrootcert=<the CA's "
                "certificate> to the dsn"
                if "no encryption" in low
                else "; check the dsn/user/password/dbname options"
            ),
            option="dsn",
            sqlstate=state,
        )
    raise RetriableError(
        f"postgres: cannot connect to {opts.describe()}: {message}"
        + (f" (sqlstate {state})" if state else "")
        + "; check that the server runs and the dsn/host/port options",
        sqlstate=state,
    )


# A refused login, as libpq words it (it gives no sqlstate for a failure during the login): never retried
_LOGIN_REFUSALS = (
    "password authentication failed",
    "pg_hba.conf rejects connection",
    "no pg_hba.conf entry",
    "does not exist",  # the role or the database
    "server does not support ssl",
    "password is missing",
    "no password supplied",
)
_TLS_REFUSALS = (
    ("certificate verify failed", "the server's certificate is not signed by a CA the client trusts"),
    ("signature failure", "the server's certificate is not signed by the CA the client trusts (one of that name)"),
    ("unable to get local issuer", "the server's certificate is not signed by a CA the client trusts"),
    ("self-signed certificate", "the server's certificate is self-signed, not of a CA the client trusts"),
    ("does not match host name", "the server's certificate is not for the host the client connects to"),
    ("root certificate file", "the CA certificate file the client is to trust cannot be read"),
    ("certificate has expired", "the server's certificate has expired"),
)


def _tls_refusal(message: str) -> str:
    """The fix for a TLS handshake the client refused (never retried: it fails the same way each time)."""
    low = message.lower()
    for marker, what in _TLS_REFUSALS:
        if marker in low:
            return (
                f"{what}: point sslrootcert (in the dsn, or PGSSLROOTCERT) at the CA that issued the server's "
                "certificate, connect by the name the certificate holds, or have the server's certificate renewed"
            )
    return ""


def postgres_options(dsn: str, option: str = "dsn") -> dict[str, str]:
    """``{"dsn": <dsn without its password>, "password": <it>}`` (no ``password`` key when the dsn has
    none): how to hand a connection string to the sinks so that no plan shows the password.

    Spark prints a sink's options in its plans (``explain``, the SQL page, the event log) and hides
    the value of a key that matches ``spark.redaction.regex`` (``password`` does; ``dsn`` does not).
    A dsn libpq would reject is a ConfigError naming ``option`` (never quoting the string)."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    check_conninfo(dsn, option=option, context="postgres")
    params = conninfo_to_dict(dsn)
    password = params.pop("password", None)
    out = {"dsn": make_conninfo("", **params)}
    if password:
        out["password"] = str(password)
    return out


def classify(exc: BaseException, context: str = "") -> EosError:
    """Sort ``exc`` into a RetriableError or a FatalError (EosErrors pass through unchanged)."""
    if isinstance(exc, EosError):
        return exc
    prefix = f"{context}: " if context else ""
    if not isinstance(exc, psycopg.Error):
        return FatalError(f"{prefix}{type(exc).__name__}: {exc}")
    state = exc.sqlstate
    diag = getattr(exc, "diag", None)
    text = (getattr(diag, "message_primary", None) or str(exc)).strip()
    detail = getattr(diag, "message_detail", None)
    hint = getattr(diag, "message_hint", None)
    text = redact_conninfo(text)
    if detail:
        text += f" DETAIL: {detail}"
    if hint:
        text += f" HINT: {hint}"
    if state is None:
        # A dropped socket or a server that went away: psycopg raises OperationalError without a
        # sqlstate; InterfaceError ("the connection is closed") belongs there too.
        if isinstance(exc, (psycopg.OperationalError, psycopg.InterfaceError)):
            return RetriableError(f"{prefix}postgres connection lost: {text}{LOST_HINT}", sqlstate=None)
        return FatalError(f"{prefix}postgres error: {text}", sqlstate=None)
    if state in RETRIABLE_SQLSTATES or state.startswith(_RETRIABLE_CLASSES):
        reason = RETRIABLE_SQLSTATES.get(state, "connection exception")
        hint = LOCK_HINT if state == "55P03" else LOST_HINT if state.startswith(_RETRIABLE_CLASSES) else ""
        return RetriableError(f"{prefix}postgres {reason}: {text} (sqlstate {state}){hint}", sqlstate=state)
    return FatalError(f"{prefix}postgres error: {text} (sqlstate {state})", sqlstate=state)


def retrying(
    fn: Callable[[], T],
    *,
    attempts: int = 5,
    base_delay: float = 0.2,
    max_delay: float = 5.0,
    what: str = "postgres write",
    on_retry: Callable[[int, EosError], None] | None = None,
) -> T:
    """Run ``fn`` until it succeeds, retrying RetriableErrors (after ``classify``) with backoff.

    Fatal errors are raised at once. After ``attempts`` tries the last retriable error is raised
    with the count in its message. The original exception is always the ``__cause__``.
    """
    attempt = 0
    while True:
        attempt += 1
        try:
            return fn()
        except Exception as exc:
            err = classify(exc, what)
            if not isinstance(err, RetriableError):
                if err is exc:
                    raise
                raise err from exc
            if attempt >= attempts:
                final = RetriableError(f"{err.message} (gave up after {attempt} attempts)", **err.fields)
                raise final from exc
            delay = min(max_delay, base_delay * (2 ** (attempt - 1)))
            delay *= 0.5 + random.random() / 2  # jitter: tasks that failed together do not retry in lockstep
            log.warning("%s: attempt %d/%d failed, retrying in %.2fs: %s", what, attempt, attempts, delay, err.message)
            if on_retry is not None:
                on_retry(attempt, err)
            time.sleep(delay)


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently to retry a retriable Postgres error (see ``retrying``)."""

    attempts: int = 5
    base_delay: float = 0.2
    max_delay: float = 5.0

    @classmethod
    def of(cls, opts: ConnectionOptions) -> RetryPolicy:
        """The policy the user set with ``retry.attempts``, ``retry.backoff``, ``retry.max.backoff``."""
        return cls(opts.retry_attempts, opts.retry_backoff, opts.retry_max_backoff)

    def run(self, fn: Callable[[], T], what: str, on_retry: Callable[[int, EosError], None] | None = None) -> T:
        return retrying(
            fn,
            attempts=self.attempts,
            base_delay=self.base_delay,
            max_delay=self.max_delay,
            what=what,
            on_retry=on_retry,
        )


def setup_connect(opts: ConnectionOptions, application_name: str) -> psycopg.Connection:
    """An autocommit connection for the driver's setup (table checks, protocol tables) that rides out a
    server that is briefly unreachable (restarting, failing over) as the tasks do: ``retry.attempts``
    tries with ``retry.backoff`` doubling up to ``retry.max.backoff``; a bad login or dsn fails at once."""
    return RetryPolicy.of(opts).run(
        lambda: connect(opts, autocommit=True, application_name=application_name), f"{application_name} connect"
    )


DDL_LOCK = 0x656F735F736368  # any constant, shared by every spark-eos version: serialises our DDL


@contextmanager
def ddl_lock(conn: psycopg.Connection) -> Iterator[psycopg.Connection]:
    """Run the block in a transaction that holds the DDL advisory lock (released at its end).

    The lock is transaction-scoped, so a crash never leaves it held. On a connection already in
    a transaction the block is a savepoint and the lock lasts until that transaction ends.
    """
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (DDL_LOCK,))
        yield conn


def rollback_quietly(conn: psycopg.Connection | None) -> None:
    """Roll back, logging (never raising) a failure: the caller is already handling an error."""
    if conn is None or conn.closed:
        return
    try:
        conn.rollback()
    except Exception as exc:
        log.warning("rollback after an error failed too (the first error is reported): %s", exc)


def close_quietly(conn: psycopg.Connection | None) -> None:
    """Close, logging (never raising) a failure."""
    if conn is None:
        return
    try:
        conn.close()
    except Exception as exc:
        log.warning("closing a postgres connection failed: %s", exc)
