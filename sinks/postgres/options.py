"""Options of the Postgres sinks: connection (dsn or host/port/...), table, key, version, deletes.

Public API (shared by ``postgres-upsert`` and ``postgres-2pc``); each option is declared once, as a
field of its options class (``eos_core.options.option``):

- ``ConnectionOptions``: ``dsn`` | ``host``/``port``/``dbname``/``user``/``password`` (secret),
  ``connect_timeout``, ``statement_timeout``, ``retry.attempts``, ``retry.backoff``,
  ``retry.max.backoff``. ``CONNECTION_OPTIONS`` are its specs; ``connection_options(raw)`` picks
  them out of a map.
- ``ErrorsPolicy``: ``errors.tolerance``, ``errors.table``, ``errors.max``.
- ``UpsertOptions``: the connection and errors options, ``table`` (schema-qualified ok), ``key``
  (list), ``version``, ``delete.column``, ``delete.tombstones``, ``table.create``, ``columns`` (JSON
  rename map), ``schema.evolution``, ``faults`` (a fault spec, see ``eos_core.faults``).
  ``UPSERT_OPTIONS`` is its option set; ``postgres-2pc`` reuses these specs.
- ``ConnectionOptions.from_options(raw)`` / ``UpsertOptions.from_options(raw)``: frozen dataclasses;
  ``ConnectionOptions.conninfo()`` is the libpq conninfo; its repr/str never show the password.
- ``parse_table_name(text) -> (schema | None, name)`` and ``quote_ident``/``qualified``.
- ``redact_conninfo`` / ``redact``: re-exported from ``eos_core.options``, the one place of redaction.

A ``dsn`` that libpq would reject (or misread) is a ``ConfigError`` naming the option, the form and
the fix; libpq's own message is never passed on, since it quotes pieces of the string (the password).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from eos_core.conninfo import check_conninfo, conninfo_error, redact_conninfo
from eos_core.errors import ConfigError, FatalError
from eos_core.options import REQUIRED, OptionSet, group, option, option_specs, redact

__all__ = [
    "CONNECTION_OPTIONS",
    "SPARK_OPTIONS",
    "UPSERT_OPTIONS",
    "ConnectionOptions",
    "ErrorsPolicy",
    "TableName",
    "UpsertOptions",
    "connection_options",
    "option_text",
    "parse_table_name",
    "quote_ident",
    "redact",
    "redact_conninfo",
]

SPARK_OPTIONS = ("path", "checkpointLocation")
"""Options Spark itself adds to a sink's option map; accepted and ignored."""


KEEPALIVE_DEFAULTS: dict[str, int] = {
    "keepalives_idle": 30,  # seconds
    "keepalives_interval": 10,  # seconds
    "keepalives_count": 3,
    "tcp_user_timeout": 60_000,  # milliseconds, as libpq takes it
}
"""libpq's keepalive settings the sinks use when neither an option nor the dsn sets them: a silent peer
is given up after 30 + 3 x 10 = 60 s, unacknowledged data after 60 s."""


def _jdbc_url(value: str, _context: str) -> str:
    """A JDBC URL (Spark JDBC's ``url``: ``jdbc:postgresql://host:port/db?user=...``) as the libpq URL it
    names; any other dsn as it is."""
    return value[len("jdbc:") :] if value[:16].lower() == "jdbc:postgresql:" else value


@dataclass(frozen=True, kw_only=True)
class ConnectionOptions:
    """Where and how to connect; ``repr``/``str`` never show the password."""

    dsn: str | None = option(
        "dsn",
        "str",
        None,
        "libpq conninfo ('host=... dbname=...') or URL ('postgresql://user@host:5432/db'); `url`, as in Spark's "
        "JDBC source, takes a JDBC URL too ('jdbc:postgresql://host:5432/db')",
        secret=True,
        aliases=("url",),
        convert=_jdbc_url,
    )
    host: str | None = option("host", "str", None, "server host (when no dsn is given; default localhost)")
    port: int | None = option("port", "int", None, "server port (default 5432)", min=1, max=65535)
    dbname: str | None = option("dbname", "str", None, "database name")
    user: str | None = option("user", "str", None, "user name")
    password: str | None = option("password", "str", None, "password (never logged or shown)", secret=True)
    connect_timeout: float = option(
        "connect_timeout", "duration", 10.0, "give up connecting after this long", min=0.001
    )
    statement_timeout: float = option(
        "statement_timeout",
        "duration",
        0.0,
        "cancel any statement running longer (0: no limit, the default: a batch's statements grow with the batch; "
        "every wait inside one is bounded by lock.timeout and the keepalive options)",
        min=0,
    )
    lock_timeout: float = option(
        "lock.timeout",
        "duration",
        60.0,
        "how long any statement of the sink waits for a lock (Postgres lock_timeout): the sink's own advisory lock "
        "(postgres-2pc), row and table locks in the target (with postgres-2pc visibility=partition a sibling's "
        "prepared transaction holding the same key never lets go before the batch commits); past it the wait "
        "fails naming what waited",
        min=0.001,
    )
    keepalives_idle: float | None = option(
        "keepalives_idle",
        "duration",
        None,
        "TCP keepalive: probe a connection silent for this long (default 30s, or the dsn's keepalives_idle)",
        min=1,
    )
    keepalives_interval: float | None = option(
        "keepalives_interval",
        "duration",
        None,
        "TCP keepalive: between unanswered probes (default 10s, or the dsn's); a peer that answers none of "
        "keepalives_count probes is given up",
        min=1,
    )
    keepalives_count: int | None = option(
        "keepalives_count",
        "int",
        None,
        "TCP keepalive: unanswered probes before the connection is given up (default 3, or the dsn's)",
        min=1,
        max=1000,
    )
    tcp_user_timeout: float | None = option(
        "tcp_user_timeout",
        "duration",
        None,
        "give up a connection whose sent data stays unacknowledged this long (a server or network gone during "
        "COMMIT PREPARED or a publish; default 60s, or the dsn's tcp_user_timeout; Linux)",
        min=0.001,
    )
    retry_attempts: int = option(
        "retry.attempts",
        "int",
        5,
        "tries of one task transaction on retriable failures (deadlock, serialization, connection loss)",
        min=1,
        max=100,
    )
    retry_backoff: float = option(
        "retry.backoff", "duration", 0.2, "first backoff between tries; doubles each time", min=0
    )
    retry_max_backoff: float = option("retry.max.backoff", "duration", 5.0, "upper bound of one backoff", min=0)

    def __post_init__(self) -> None:
        for name in ("host", "dbname", "user", "password"):
            value = getattr(self, name)
            if isinstance(value, str) and "\x00" in value:
                raise ConfigError(
                    f"postgres: option '{name}' contains a NUL character, which libpq cannot pass on (it would cut "
                    "the value short there); the value is not shown",
                    option=name,
                )
        check_conninfo(self.dsn, option="dsn", context="postgres")

    @classmethod
    def from_options(cls, raw: Mapping[str, Any], context: str = "postgres") -> ConnectionOptions:
        return OptionSet(context, cls).build(connection_options(raw))

    def conninfo(self) -> str:
        """The libpq conninfo string: the dsn with host/port/... given separately taking precedence."""
        params: dict[str, Any] = {}
        for name in ("host", "port", "dbname", "user", "password"):
            value = getattr(self, name)
            if value is not None:
                params[name] = value
        if not self.dsn and "host" not in params:
            params["host"] = "localhost"
        params["connect_timeout"] = max(1, round(self.connect_timeout))
        try:
            in_dsn = conninfo_to_dict(self.dsn) if self.dsn else {}
        except psycopg.ProgrammingError:  # never quoted (nor chained): the check below names the problem
            in_dsn = None
        if in_dsn is None:
            raise conninfo_error(self.dsn or "", option="dsn", context="postgres")
        # Every wait on the network has a bound: a peer that stops answering (a host gone, a network cut
        # during COMMIT PREPARED or a publish) is given up by the kernel after the keepalives when idle and
        # after tcp_user_timeout with data unacknowledged. An option given wins, else the dsn's, else ours.
        params["keepalives"] = 1
        for name, default in KEEPALIVE_DEFAULTS.items():
            value = getattr(self, name)
            if value is not None:
                params[name] = int(value * 1000) if name == "tcp_user_timeout" else max(1, round(value))
            elif name not in in_dsn:
                params[name] = default
        # lock_timeout is set by connect() after the login, not here: a startup "options" parameter is refused
        # by poolers such as PgBouncer unless configured, so it is only sent when statement_timeout is asked for
        if self.statement_timeout:
            own = in_dsn.get("options") or ""  # the user's own server options (search_path, ...) stay
            setting = f"-c statement_timeout={int(self.statement_timeout * 1000)}"
            params["options"] = f"{own} {setting}" if own else setting
        conninfo: str | None = None
        try:
            conninfo = make_conninfo(self.dsn or "", **params)
        except psycopg.ProgrammingError:  # its text can quote the password: never passed on (nor chained)
            pass
        if conninfo is None:
            raise conninfo_error(self.dsn or "", option="dsn", context="postgres")
        return conninfo

    def describe(self) -> str:
        """Where we connect, for messages: user@host:port/dbname, never the password."""
        info = conninfo_to_dict(self.conninfo())
        host = info.get("host") or info.get("hostaddr") or "localhost"
        return f"{info.get('user') or '(default user)'}@{host}:{info.get('port') or 5432}/{info.get('dbname') or '(default db)'}"

    def __repr__(self) -> str:
        return f"ConnectionOptions({self.describe()}, password={redact(self.password or self._dsn_password())})"

    __str__ = __repr__

    def _dsn_password(self) -> str | None:
        if not self.dsn:
            return None
        try:
            return conninfo_to_dict(self.dsn).get("password")  # type: ignore[return-value]
        except Exception:
            return None


CONNECTION_OPTIONS = option_specs(ConnectionOptions)
_CONN_KEYS = {o.name for o in CONNECTION_OPTIONS}


def connection_options(raw: Mapping[str, Any]) -> dict[str, Any]:
    """The subset of ``raw`` that are connection options (case-insensitive keys)."""
    return {k: v for k, v in raw.items() if str(k).lower() in _CONN_KEYS}


_IDENT = r'(?:"(?:[^"]|"")+"|[^".\s]+)'
_TABLE_RE = re.compile(rf"^\s*({_IDENT})(?:\s*\.\s*({_IDENT}))?\s*$")


def _unquote_ident(text: str) -> str:
    if text.startswith('"'):
        return text[1:-1].replace('""', '"')
    return text.lower()  # Postgres folds unquoted identifiers to lower case


def quote_ident(name: str) -> str:
    """Quote an identifier for SQL (always quoted: column names keep their exact spelling)."""
    return '"' + name.replace('"', '""') + '"'


@dataclass(frozen=True)
class TableName:
    """A table name; ``schema`` None means the first existing one on the search_path."""

    schema: str | None
    name: str

    @property
    def sql(self) -> str:
        return (quote_ident(self.schema) + "." if self.schema else "") + quote_ident(self.name)

    def derived(self, suffix: str) -> TableName:
        """A sibling table name (same schema) with a suffix, kept within Postgres' 63-byte limit."""
        import hashlib

        name = self.name + suffix
        if len(name.encode()) > 63:
            digest = hashlib.sha1(self.name.encode()).hexdigest()[:8]
            name = self.name.encode()[: 63 - len(suffix) - 9].decode(errors="ignore") + "_" + digest + suffix
        return TableName(self.schema, name)

    def __str__(self) -> str:
        """As a user writes it: a plain lower-case part bare, any other part quoted, so the text names one
        table only (table ``"a.b"`` is not table ``b`` of schema ``a``) and ``parse_table_name`` reads it back."""
        return ".".join(_shown(p) for p in (self.schema, self.name) if p is not None)


_PLAIN_IDENT = re.compile(r"^[a-z_][a-z0-9_$]*$")


def _shown(part: str) -> str:
    return part if _PLAIN_IDENT.match(part) else quote_ident(part)


def parse_table_name(text: str, option: str = "table") -> TableName:
    """Parse ``table``, ``schema.table`` or quoted ``"Schema"."Table"``; unquoted parts fold to lower case."""
    if "\x00" in (text or ""):
        raise ConfigError(
            f"postgres: option '{option}' contains a NUL character, which no Postgres identifier can hold; "
            f"remove it (the value was {text.replace(chr(0), '<NUL>')!r})",
            option=option,
        )
    m = _TABLE_RE.match(text or "")
    if not m:
        raise ConfigError(
            f"postgres: option '{option}' has an invalid value {text!r}; expected table or schema.table "
            '(double-quote names with dots or upper case: "My.Schema"."T")',
            option=option,
        )
    first, second = m.group(1), m.group(2)
    if second is None:
        return TableName(None, _unquote_ident(first))
    return TableName(_unquote_ident(first), _unquote_ident(second))


_MAX_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(%?)\s*$")


def _parse_max(text: object, context: str) -> tuple[int | None, float | None]:
    if text is None or str(text).strip() == "":
        return None, None
    m = _MAX_RE.match(str(text))
    if m is None:
        raise ConfigError(
            f"{context}: option 'errors.max' has an invalid value {text!r}; expected a row count per task "
            "(e.g. 100) or a share of the task's rows (e.g. 0.01 or 1%)",
            option="errors.max",
        )
    number, percent = m.group(1), m.group(2)
    if percent:
        if float(number) > 100:
            raise ConfigError(
                f"{context}: option 'errors.max' {text!r} is a share above 100%; use at most 100% (every row may "
                "be diverted) or a row count (e.g. 100)",
                option="errors.max",
            )
        return None, float(number) / 100
    if "." in number:
        value = float(number)
        if value > 1:
            raise ConfigError(
                f"{context}: option 'errors.max' {text!r} is a fraction above 1; use a row count (e.g. 100) "
                "or a share (0.01 or 1%)",
                option="errors.max",
            )
        return None, value
    return int(number), None


def _errors_table(text: str, context: str) -> TableName:
    return parse_table_name(text, option="errors.table")


@dataclass(frozen=True, kw_only=True)
class ErrorsPolicy:
    """``errors.tolerance`` / ``errors.table`` / ``errors.max`` of a sink."""

    tolerance: str = option(
        "errors.tolerance",
        "choice",
        "none",
        "none: a row the target refuses (type, length, NOT NULL, CHECK, unique, foreign key) fails the task, "
        "naming it; all: it goes to errors.table in the same transaction as the good rows",
        choices=("none", "all"),
    )
    table: TableName | None = option(
        "errors.table",
        "str",
        None,
        "the dead-letter table for errors.tolerance=all (created when missing)",
        convert=_errors_table,
    )
    limit: tuple[int | None, float | None] | None = option(
        "errors.max",
        "str",
        None,
        "with errors.tolerance=all: fail a task that diverts more rows than this, before it commits: a count "
        "(100) or a share of the task's rows (0.01 or 1%); postgres-2pc visibility=batch: of the batch's rows, "
        "checked as it is published (the batch is then taken back); default no limit",
        convert=_parse_max,
    )

    @property
    def max_count(self) -> int | None:
        """Refused rows a task may divert; None: no limit."""
        return self.limit[0] if self.limit else None

    @property
    def max_fraction(self) -> float | None:
        """Or this share of the task's rows."""
        return self.limit[1] if self.limit else None

    @property
    def divert(self) -> bool:
        return self.tolerance == "all"

    def validate(self, context: str) -> None:
        if self.tolerance == "all" and self.table is None:
            raise ConfigError(
                f"{context}: errors.tolerance=all needs option 'errors.table', the dead-letter table refused rows "
                "go to (created when missing), e.g. errors.table=public.orders_refused",
                option="errors.table",
            )
        if self.tolerance == "none" and self.table is not None:
            raise ConfigError(
                f"{context}: option 'errors.table' is set but errors.tolerance is none (refused rows fail the "
                "query); set errors.tolerance=all to divert them, or drop errors.table",
                option="errors.tolerance",
            )
        if (self.max_count is not None or self.max_fraction is not None) and self.tolerance != "all":
            raise ConfigError(
                f"{context}: option 'errors.max' only applies with errors.tolerance=all", option="errors.max"
            )

    def check(self, refused: int, rows: int, where: str, unit: str = "task", *, partial: bool = False) -> None:
        """FatalError when a task (or a ``unit``: a batch) diverted more than ``errors.max`` allows
        (raised before its commit). ``partial``: ``refused`` is the count so far, the search for more
        stops here (both limits only grow with it)."""
        if self.max_count is not None and refused > self.max_count:
            limit = f"errors.max={self.max_count} rows"
        elif self.max_fraction is not None and rows and refused / rows > self.max_fraction:
            limit = f"errors.max={self.max_fraction:.4%} of the {unit}'s rows"
        else:
            return
        raise FatalError(
            f"{where}: the target refused {'at least ' if partial else ''}{refused} of {rows} rows, more than {limit}; "
            f"nothing of this {unit} was "
            f"written. The first refusals are in the {unit}'s log; fix the data or the table, or raise errors.max",
            option="errors.max",
        )


def _table_name(text: str, context: str) -> TableName:
    return parse_table_name(text)


def _renames(columns: Any, context: str) -> tuple[tuple[str, str], ...]:
    """The ``columns`` JSON object as sorted (DataFrame column, table column) pairs, or a ConfigError."""
    if not isinstance(columns, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and v for k, v in columns.items()
    ):
        raise ConfigError(
            f"{context}: option 'columns' must be a JSON object of DataFrame column -> table column names "
            f'(strings), e.g. {{"userId": "user_id"}}; got {columns!r}',
            option="columns",
        )
    targets = list(columns.values())
    if len(set(targets)) != len(targets):
        raise ConfigError(
            f"{context}: option 'columns' maps two columns to one table column: {columns!r}", option="columns"
        )
    return tuple(sorted(columns.items()))


@dataclass(frozen=True, kw_only=True)
class UpsertOptions:
    """Parsed options of the upsert sink (also the upsert mode of the two-phase sink)."""

    connection: ConnectionOptions = group(ConnectionOptions)
    table: TableName = option(
        "table",
        "str",
        REQUIRED,
        'target table, optionally schema-qualified (schema.table; quote mixed case: "My"."T")',
        convert=_table_name,
        aliases=("dbtable",),
    )
    key: tuple[str, ...] = option(
        "key",
        "list",
        REQUIRED,
        "comma-separated key columns (DataFrame names); the table needs a unique or primary key on them",
    )
    version: str | None = option(
        "version",
        "str",
        None,
        "column whose value orders writes of one key: a row replaces only a lower version; equal is a no-op",
    )
    delete_column: str | None = option(
        "delete.column", "str", None, "boolean column: true deletes the key (honouring the version guard)"
    )
    delete_tombstones: bool = option(
        "delete.tombstones",
        "bool",
        False,
        "a row whose non-key columns (except version) are all null deletes the key, as a Kafka tombstone",
    )
    table_create: bool = option(
        "table.create",
        "bool",
        False,
        "create the table from the DataFrame schema (key as primary key) when it does not exist",
    )
    columns: tuple[tuple[str, str], ...] | None = option(
        "columns",
        "json",
        None,
        'JSON object renaming DataFrame columns to table columns, e.g. {"userId": "user_id"}',
        convert=_renames,
    )
    schema_evolution: str = option(
        "schema.evolution",
        "choice",
        "none",
        "none: DataFrame columns the table lacks are refused before anything is written, with the ALTER TABLE "
        "that adds them; add-columns: the sink adds them as nullable columns (under its DDL lock). A type change, "
        "drop or rename is never made: refused with the statement to run",
        choices=("none", "add-columns"),
    )
    errors: ErrorsPolicy = group(ErrorsPolicy)
    faults: str | None = option(
        "faults", "str", None, "fault spec for tests (see eos_core.faults); EOS_FAULTS adds to it"
    )

    @property
    def rename(self) -> dict[str, str]:
        return dict(self.columns or ())

    @property
    def deletes(self) -> bool:
        return self.delete_column is not None or self.delete_tombstones

    @classmethod
    def from_options(cls, raw: Mapping[str, Any]) -> UpsertOptions:
        """Parse and check the raw option map."""
        return UPSERT_OPTIONS.build(raw)

    def validate(self, context: str) -> None:
        """The checks across options (``OptionSet.build`` runs them; ``context`` names the sink)."""
        key = self.key
        if not key:
            raise ConfigError(f"{context}: option 'key' is empty; name one or more key columns", option="key")
        if len(set(key)) != len(key):
            raise ConfigError(f"{context}: option 'key' names a column twice: {','.join(key)}", option="key")
        for opt, col in (("version", self.version), ("delete.column", self.delete_column)):
            if col is not None and col in key:
                raise ConfigError(
                    f"{context}: option '{opt}' names the key column {col!r}; pick a non-key column", option=opt
                )
        if self.version is not None and self.delete_column is not None and self.version == self.delete_column:
            raise ConfigError(
                f"{context}: options 'version' and 'delete.column' name the same column {self.version!r}",
                option="delete.column",
            )


UPSERT_OPTIONS = OptionSet("postgres-upsert", UpsertOptions, ignored=SPARK_OPTIONS)


def option_text(value: Any) -> str:
    """A Python keyword argument's value as the option string Spark passes (foreachBatch adapters)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    if isinstance(value, dict):
        return json.dumps(value)
    return str(value)
