"""The error tree of spark-eos: every failure is config, retriable, fatal or commit-unknown."""

from __future__ import annotations

import re

__all__ = [
    "CommitUnknown",
    "ConfigError",
    "DataLossError",
    "EosError",
    "FatalError",
    "RetriableError",
    "ServiceError",
    "error_cause",
]


class EosError(Exception):
    """Base of every spark-eos error.

    Errors cross process boundaries (executor -> driver, Python worker -> JVM), so each one is
    picklable: the message is the only positional argument and extra fields are keyword-only and
    restored by ``__reduce__``.
    """

    def __init__(self, message: str, **fields: object) -> None:
        super().__init__(message)
        self.message = message
        self.fields = dict(fields)
        for key, value in fields.items():
            setattr(self, key, value)

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild, (type(self), self.message, self.fields))

    def __str__(self) -> str:
        return self.message


def _rebuild(cls: type[EosError], message: str, fields: dict[str, object]) -> EosError:
    return cls(message, **fields)


class ConfigError(EosError, ValueError):
    """Bad input from the user: an option, a column, a table. Raised on the driver before any write.

    The message names the option (or column/table), the bad value and what would be valid.
    """


class RetriableError(EosError):
    """A transient failure (connection reset, serialization failure, deadlock): retry with backoff."""


class FatalError(EosError):
    """A known, permanent failure: retrying cannot help; the message says what to fix."""


class CommitUnknown(FatalError):
    """The outcome of a commit cannot be proven either way; never guessed, always surfaced."""


class ServiceError(EosError):
    """An external service (Kafka, Postgres, Docker) could not be started, reached or checked."""


class DataLossError(FatalError):
    """Records that a query was due to read are gone (topic deleted, retention, offsets reset)."""


_OUR_ERRORS = "|".join(
    ("CommitUnknown", "ConfigError", "DataLossError", "EosError", "FatalError", "RetriableError", "ServiceError")
)
# "ConfigError: ..." anywhere, or any exception class of our packages as a traceback's last line names it
# ("sinks.kafka.plan.LineageMismatch: ...")
_OUR_LINE = re.compile(
    rf"(?:(?:^|[\s(])(?:eos_core|sources|sinks|connectors)(?:\.\w+)*\.(\w+)|(?:^|[\s.(])({_OUR_ERRORS})): (\S.*)"
)
_SPARK_CLASS = re.compile(r"^\s*(?:\w+(?:\.\w+)*(?:Exception|Error): )?(?:\[[A-Z0-9_.]+\] )?")


def error_cause(exc: BaseException | str) -> str:
    """The cause of a failure that crossed Spark, in one line: ``"ConfigError: <our message>"``.

    A spark-eos error raised inside a query (in a Python worker, a data source's planning, the sink's
    commit) reaches the driver wrapped: a ``StreamingQueryException`` or ``AnalysisException``
    (``[PYTHON_DATA_SOURCE_ERROR] ...``) whose text holds Java and Python stack traces with our line
    last. This finds the last spark-eos error line in ``exc`` (its text and its causes) and returns
    it; when there is none, the exception's type and the first line of its text without Spark's error
    class prefix.

        try:
            query.awaitTermination()
        except StreamingQueryException as exc:
            sys.exit(connectors.error_cause(exc))
    """
    texts: list[str] = []
    seen: set[int] = set()
    cur: BaseException | str | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, str):
            texts.append(cur)
            break
        for attr in ("desc", "message"):  # pyspark's CapturedException keeps the JVM text in desc
            value = getattr(cur, attr, None)
            if isinstance(value, str) and value:
                texts.append(value)
        texts.append(str(cur))
        if isinstance(cur, EosError):
            return f"{type(cur).__name__}: {' '.join(cur.message.split())}"
        cur = cur.__cause__ or cur.__context__
    found = None
    for text in texts:
        for line in text.splitlines():
            m = _OUR_LINE.search(line)
            if m:
                found = f"{m.group(1) or m.group(2)}: {m.group(3).strip()}"
        if found:
            return found
    for text in texts:
        raised = _raised(text)
        if raised:
            return raised
    for text in texts:
        for line in text.splitlines():
            line = _SPARK_CLASS.sub("", line, count=1).strip().removesuffix(_TRACEBACK).rstrip(": ")
            if line:
                return f"{type(exc).__name__}: {line}" if isinstance(exc, BaseException) else line
    return type(exc).__name__ if isinstance(exc, BaseException) else ""


_TRACEBACK = "Traceback (most recent call last):"
_EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*): (\S.*)")  # a traceback's last line: "module.Class: message"
_CAUSED_BY = re.compile(r"^\s*Caused by: ([\w.$]+): (\S.*)")


def _raised(text: str) -> str:
    """The exception a Python traceback in ``text`` ends with (the last one: the worker's), as
    ``"module.Class: message"``; else the root of a Java trace (its last ``Caused by:``); else ""."""
    found, in_traceback = "", False
    for line in text.splitlines():
        if line.rstrip().endswith(_TRACEBACK):
            in_traceback = True
            continue
        if in_traceback and line and not line[0].isspace():
            m = _EXCEPTION_LINE.match(line)
            if m:
                found = f"{m.group(1)}: {m.group(2).strip()}"
            in_traceback = False
    if found:
        return found
    for line in text.splitlines():
        m = _CAUSED_BY.match(line)
        if m:
            found = f"{m.group(1)}: {m.group(2).strip()}"
    return found
