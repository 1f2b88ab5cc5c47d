"""The service interface: a Kafka bootstrap address and a Postgres DSN, whoever provides them."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from eos_core.conninfo import redact_dsn  # the one redaction of spark-eos; re-exported here
from eos_core.errors import ServiceError

if TYPE_CHECKING:
    from connectors.services.kafka_security import Principal
    from connectors.services.pg_security import Role
    from eos_core.privileges import KafkaAcl, PgGrant

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

    # ---- clients: who sets up and checks (a super user of a secured broker), and the apps' principals ----
    def client_config(self) -> dict[str, str]:
        """librdkafka's settings of a client beside ``bootstrap.servers``: the admin's login of a secured
        broker (setting up and checking; apps get principals of their own, ``add_principal``), none without."""
        return {}

    def java_config(self) -> dict[str, str]:
        """The Java client's settings of ``client_config`` (a ``kafka.*`` option each, prefix left out)."""
        return {}

    def client_properties(self) -> Path | None:
        """A Java client properties file of ``java_config`` (``EOS_KAFKA_CONFIG``, ``--kafka-config``); None
        without security."""
        return None

    @property
    def secured(self) -> bool:
        """The broker authenticates its clients (SASL) and enforces ACLs: apps need principals."""
        return bool(self.client_config())

    def options(self) -> dict[str, str]:
        """A connector's ``kafka.*`` options that reach this broker as its admin (setting up and checking)."""
        return {"kafka.bootstrap.servers": self.bootstrap, **{f"kafka.{k}": v for k, v in self.java_config().items()}}

    def _admin(self) -> Any:
        from confluent_kafka.admin import AdminClient

        if not self.secured:
            raise ServiceError(f"principals and ACLs need a secured broker; {self.bootstrap} runs without security")
        return AdminClient({"bootstrap.servers": self.bootstrap, **self.client_config(), "log_level": 0})

    def add_principal(self, name: str, acls: Iterable[KafkaAcl] = (), password: str | None = None) -> Principal:
        """A SCRAM-SHA-512 principal ``User:<name>`` (a random password unless given) holding exactly ``acls``."""
        import secrets

        from connectors.services.kafka_security import Principal

        principal = Principal(name, password or secrets.token_urlsafe(18), self)
        self.set_password(name, principal.password)
        self.grant(name, acls)
        return principal

    def set_password(self, name: str, password: str) -> None:
        """Create principal ``name``'s SCRAM credential, or replace it (a rotation: open sessions go on)."""
        from confluent_kafka.admin import (  # type: ignore[attr-defined]
            ScramCredentialInfo,
            ScramMechanism,
            UserScramCredentialUpsertion,
        )

        info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096)
        admin = self._admin()  # kept alive until the futures are done
        done = admin.alter_user_scram_credentials([UserScramCredentialUpsertion(name, info, password.encode())])
        for future in done.values():
            future.result(30)

    def grant(self, name: str, acls: Iterable[KafkaAcl]) -> None:
        """Add ``acls`` (allow) for ``User:<name>``; one alike another is added once."""
        from connectors.services.kafka_security import binding
        from eos_core.privileges import distinct

        acls = distinct(acls)
        bindings = [binding(name, acl) for acl in acls]
        if bindings:
            admin = self._admin()
            for future in admin.create_acls(bindings, request_timeout=30).values():
                future.result(30)
            self._await_acls(admin, name, acls, held=True)

    def revoke(self, name: str, acls: Iterable[KafkaAcl]) -> None:
        """Remove ``acls`` of ``User:<name>`` (a revocation under a running client)."""
        from confluent_kafka.admin import AclBindingFilter  # type: ignore[attr-defined]

        from connectors.services.kafka_security import binding

        acls = list(acls)
        filters = [binding(name, acl, AclBindingFilter) for acl in acls]
        if filters:
            admin = self._admin()
            for future in admin.delete_acls(filters, request_timeout=30).values():
                future.result(30)
            self._await_acls(admin, name, acls, held=False)

    @staticmethod
    def _await_acls(admin: Any, name: str, acls: list[KafkaAcl], *, held: bool, timeout: float = 15.0) -> None:
        """Wait until the broker's authorizer answers with ``acls`` (not) held: the controller's commit of an ACL
        change reaches the broker's authorizer a moment later, and a request in between is judged by the old."""
        import time

        from confluent_kafka.admin import AclBindingFilter  # type: ignore[attr-defined]

        from connectors.services.kafka_security import binding

        deadline = time.monotonic() + timeout
        for acl in acls:
            while True:
                found = admin.describe_acls(binding(name, acl, AclBindingFilter), request_timeout=10).result(15)
                if bool(found) == held:
                    break
                if time.monotonic() > deadline:
                    raise ServiceError(
                        f"the ACL {acl.describe()} of User:{name} was not {'added' if held else 'removed'}"
                    )
                time.sleep(0.05)

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

    @property
    def secured(self) -> bool:
        """The DSN asks for a verified TLS connection (``sslmode=verify-full``)."""
        return "sslmode=verify-full" in self.dsn

    def add_role(self, name: str, grants: Iterable[PgGrant] = (), password: str | None = None) -> Role:
        """A least-privileged login role holding exactly ``grants`` (``connectors.services.pg_security``),
        made through this service's admin DSN."""
        from connectors.services.pg_security import add_role

        return add_role(self.dsn, name, grants, password)

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
