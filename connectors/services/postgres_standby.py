"""A replicated Postgres: an embedded primary and a hot standby fed by streaming replication, synchronous
or asynchronous, with the failover an operator (or a managed service) performs: the primary lost, the
standby promoted, clients that name both servers reconnecting to the one that takes writes.

With ``synchronous=True`` the primary lists the standby in ``synchronous_standby_names``: a commit, a
``PREPARE TRANSACTION`` and a ``COMMIT PREPARED`` return only once the standby has flushed their WAL, so a
promoted standby holds every one of them (a prepared transaction lives in the WAL). Asynchronous, the
standby may lag: what the primary committed last can be missing on the promoted standby.
"""

from __future__ import annotations

import time
from typing import Any

from connectors.services.base import PostgresService
from connectors.services.embedded_postgres import STANDBY_NAME, EmbeddedPostgres, postgres_ready
from eos_core.errors import ServiceError

__all__ = ["ReplicatedPostgres"]

REPLICATION_TIMEOUT = 60.0


class ReplicatedPostgres(PostgresService):
    """``primary`` and ``standby`` (both ``EmbeddedPostgres``, TLS by default, one superuser, one CA).

    ``dsn`` names both servers with ``target_session_attrs=read-write`` (libpq picks the one that takes
    writes; after ``failover()`` that is the promoted standby); ``primary_dsn``/``standby_dsn`` name one.
    ``failover(how)`` kills the primary (``pg_ctl stop -m immediate`` or SIGKILL of every server process) and
    promotes the standby; ``hold_replication()``/``resume_replication()`` stop and start the standby (an
    asynchronous primary goes on committing alone meanwhile; a synchronous one makes its commits wait).
    """

    kind = "embedded"

    def __init__(self, *, synchronous: bool = True, security: str = "tls", max_prepared_transactions: int = 64) -> None:
        self.synchronous = synchronous
        started = time.monotonic()
        # the standby must allow as many prepared transactions as the primary (Postgres refuses to start
        # a hot standby with fewer); both keep the WAL a standby needs to catch up after a stop
        common = {"wal_keep_size": "'256MB'", "max_wal_senders": "5"}
        self.primary = EmbeddedPostgres(
            security=security,
            max_prepared_transactions=max_prepared_transactions,
            settings=common,
        )
        try:
            self.standby = EmbeddedPostgres(
                security=security,
                max_prepared_transactions=max_prepared_transactions,
                password=self.primary.password,
                settings={**common, "hot_standby": "on"},
                replica_of=self.primary,
            )
        except BaseException:
            self.primary.stop()
            raise
        self.user, self.password, self.security = self.primary.user, self.primary.password, security
        self.promoted = False
        try:
            if synchronous:  # once the standby exists: before, every commit (the primary's own setup) would wait
                self._execute(self.primary.dsn, f"ALTER SYSTEM SET synchronous_standby_names = '{STANDBY_NAME}'")
                self._execute(self.primary.dsn, "SELECT pg_reload_conf()")
            self.wait_replicating()
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - started

    # ---- DSNs ---------------------------------------------------------------------------------------
    @property
    def dsn(self) -> str:  # type: ignore[override]
        hosts = f"127.0.0.1:{self.primary.port},127.0.0.1:{self.standby.port}"
        tls = f"&sslmode=verify-full&sslrootcert={self.primary.ca_path}" if self.security == "tls" else ""
        return f"postgresql://{self.user}:{self.password}@{hosts}/postgres?target_session_attrs=read-write{tls}"

    @property
    def port(self) -> int:  # type: ignore[override]
        return self.writable().port

    @property
    def primary_dsn(self) -> str:
        return self.primary.dsn

    @property
    def standby_dsn(self) -> str:
        return self.standby.dsn

    def writable(self) -> EmbeddedPostgres:
        """The server that takes writes now: the primary, or the standby once promoted."""
        return self.standby if self.promoted else self.primary

    # ---- replication --------------------------------------------------------------------------------
    def _execute(self, dsn: str, sql: str) -> None:
        import psycopg

        with psycopg.connect(dsn, connect_timeout=5, autocommit=True) as conn:
            conn.execute(sql)

    def _query(self, dsn: str, sql: str) -> Any:
        import psycopg

        with psycopg.connect(dsn, connect_timeout=5, autocommit=True) as conn:
            row = conn.execute(sql).fetchone()
        return row[0] if row else None

    def replication_state(self) -> dict[str, Any] | None:
        """The primary's view of the standby (``pg_stat_replication``): state, sync_state, lag in bytes."""
        import psycopg

        with psycopg.connect(self.primary.dsn, connect_timeout=5, autocommit=True) as conn:
            row = conn.execute(
                "SELECT state, sync_state, pg_wal_lsn_diff(pg_current_wal_lsn(), replay_lsn)::bigint "
                "FROM pg_stat_replication WHERE application_name = %s",
                (STANDBY_NAME,),
            ).fetchone()
        return None if row is None else {"state": row[0], "sync_state": row[1], "replay_lag_bytes": row[2]}

    def wait_replicating(self, timeout: float = REPLICATION_TIMEOUT) -> dict[str, Any]:
        """Until the standby streams (synchronously, in that mode) and has replayed everything the primary
        wrote; its state then."""
        deadline = time.monotonic() + timeout
        state: dict[str, Any] | None = None
        while time.monotonic() < deadline:
            state = self.replication_state()
            if (
                state is not None
                and state["state"] == "streaming"
                and state["replay_lag_bytes"] == 0
                and state["sync_state"] == ("sync" if self.synchronous else "async")
            ):
                return state
            time.sleep(0.1)
        raise ServiceError(
            f"the Postgres standby on port {self.standby.port} is not in sync after {timeout:.0f}s: {state}"
        )

    def hold_replication(self) -> None:
        """Stop the standby (immediately): an asynchronous primary commits alone from now on."""
        self.standby.crash()

    def resume_replication(self) -> None:
        self.standby.start()
        self.wait_replicating()

    # ---- failover -----------------------------------------------------------------------------------
    def failover(self, how: str = "sigkill", timeout: float = 60.0) -> dict[str, Any]:
        """The primary killed (``how``: "sigkill" or "immediate"), the standby (started first if it was held,
        with only the WAL it had) promoted and taking writes. The proof: the old primary's pid, the promoted
        standby out of recovery, the failover DSN reaching it."""
        from connectors.services import _proc

        if self.promoted:
            raise ServiceError("failover(): the standby was promoted already; this pair has no standby left")
        old = self.primary.pid
        self.primary.crash(how)
        self.standby.start()  # a no-op unless it was held
        standby = self.standby
        _proc.run(
            [standby._tool("pg_ctl"), "promote", "-D", str(standby.data_dir), "-w", "-t", str(int(timeout))],
            run_as=standby.run_as,
            timeout=timeout + 10,
        )
        deadline = time.monotonic() + timeout
        while self._query(standby.dsn, "SELECT pg_is_in_recovery()"):
            if time.monotonic() > deadline:
                raise ServiceError(f"the Postgres standby on port {standby.port} is still in recovery after promotion")
            time.sleep(0.1)
        self.promoted = True
        ok, _ = postgres_ready(self.dsn, 10)
        return {
            "old_primary_pid": old,
            "old_primary_gone": not _proc.pid_alive(old),
            "new_primary_port": standby.port,
            "dsn_reaches_new_primary": ok,
        }

    # ---- lifecycle ----------------------------------------------------------------------------------
    def running(self) -> bool:
        return self.writable().running()

    def stop(self) -> None:
        for server in (self.standby, self.primary):
            server.stop()
