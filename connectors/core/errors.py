"""The error tree of spark-eos: every failure is config, retriable, fatal or commit-unknown."""

from __future__ import annotations

__all__ = [
    "CommitUnknown",
    "ConfigError",
    "DataLossError",
    "EosError",
    "FatalError",
    "RetriableError",
    "ServiceError",
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
