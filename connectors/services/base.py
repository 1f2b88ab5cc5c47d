"""The service interface: a Kafka bootstrap address and a Postgres DSN, whoever provides them."""

from __future__ import annotations

from typing import Any, Literal, TypeVar

from eos_core.conninfo import redact_dsn  # the one redaction of spark-eos; re-exported here
from eos_core.errors import ServiceError

__all__ = ["KafkaService", "Kind", "PostgresService", "redact_dsn"]

Kind = Literal["env", "container", "embedded"]
_K = TypeVar("_K", bound="KafkaService")
_P = TypeVar("_P", bound="PostgresService")


class KafkaService:
    """A reachable Kafka(-protocol) broker: ``bootstrap`` is ``host:port``.

    ``is_tansu`` tells tests where broker behaviour differs from Apache Kafka (high watermark = base
    offset of the last record batch + 1; aborted transactional records are never stored).
    """

    bootstrap: str
    kind: Kind
    is_tansu: bool

    def stop(self) -> None:
        """Stop the broker if this object started it; a no-op for a broker named by the user."""

    def __enter__(self: _K) -> _K:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(bootstrap={self.bootstrap!r}, kind={self.kind!r}, is_tansu={self.is_tansu})"


class PostgresService:
    """A reachable PostgreSQL with ``max_prepared_transactions`` > 0; ``dsn`` logs in as a superuser.

    ``crash()``/``start()``/``restart()`` exist only where spark-eos runs the server (embedded or a
    container); for a server named by the user they raise ServiceError.
    """

    dsn: str
    kind: Kind
    port: int
    host: str = "127.0.0.1"

    @property
    def dsn_redacted(self) -> str:
        return redact_dsn(self.dsn)

    def stop(self) -> None:
        """Stop the server cleanly if this object started it; a no-op for a server named by the user."""

    def crash(self) -> None:
        """Stop the server like a power cut (``pg_ctl stop -m immediate``): no checkpoint, WAL replay on start."""
        raise ServiceError(self._not_ours("crash"))

    def start(self) -> None:
        """Start the server again on the same data directory and port, and wait until it accepts connections."""
        raise ServiceError(self._not_ours("start"))

    def restart(self, down: float = 0.0) -> None:
        """A clean stop, ``down`` seconds without a server (connections refused), then ``start()``."""
        raise ServiceError(self._not_ours("restart"))

    def _not_ours(self, what: str) -> str:
        return (
            f"cannot {what} the Postgres at {self.dsn_redacted}: it is {self.kind!r}, not run by spark-eos. "
            "Unset EOS_POSTGRES_DSN (or set EOS_SERVICES=embedded) to let spark-eos run its own."
        )

    def __enter__(self: _P) -> _P:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(dsn={self.dsn_redacted!r}, kind={self.kind!r}, port={self.port})"
