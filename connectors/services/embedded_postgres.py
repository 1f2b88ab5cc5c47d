"""Embedded Postgres: a throwaway cluster from the system binaries (initdb + postgres) in a temp dir."""

from __future__ import annotations

import contextlib
import glob
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

from connectors.services import _proc
from connectors.services.base import PostgresService
from eos_core.errors import ServiceError

__all__ = ["PG_BIN_GLOBS", "SECURITY", "EmbeddedPostgres", "pg_bin_dir", "postgres_ready"]

SECURITY = ("tls", "plaintext")
"""``tls``: ``ssl=on`` with a certificate of a CA made at start, hostssl-only scram-sha-256 (a plaintext
connection is refused), a DSN with ``sslmode=verify-full``; ``plaintext``: scram-sha-256 without TLS."""
_HBA_TLS = """# spark-eos embedded cluster: TLS only, SCRAM passwords
local     all all                scram-sha-256
hostssl   all all 127.0.0.1/32   scram-sha-256
hostssl   all all ::1/128        scram-sha-256
hostssl   replication all 127.0.0.1/32 scram-sha-256
hostnossl all all all            reject
"""

START_TIMEOUT = 60.0
STANDBY_NAME = "eos_standby"  # a standby's application_name, what a primary's synchronous_standby_names lists
_TOOLS = ("initdb", "pg_ctl", "postgres")
# Where distributions put the server binaries when they are not on PATH (Debian, RHEL/PGDG, Homebrew).
PG_BIN_GLOBS = [
    "/usr/lib/postgresql/*/bin",
    "/usr/pgsql-*/bin",
    "/opt/homebrew/opt/postgresql@*/bin",
    "/usr/local/opt/postgresql@*/bin",
]
_PORT_ATTEMPTS = 3


def _has_tools(d: Path) -> bool:
    return all(os.access(d / t, os.X_OK) for t in _TOOLS)


def pg_bin_dir(explicit: str | None = None) -> Path:
    """The directory holding initdb, pg_ctl and postgres: ``explicit``, ``EOS_PG_BIN``, PATH, then known places."""
    named = explicit or os.environ.get("EOS_PG_BIN")
    if named:
        if _has_tools(Path(named)):
            return Path(named)
        source = "bin_dir" if explicit else "EOS_PG_BIN"
        raise ServiceError(
            f"{source}={named!r} does not hold the PostgreSQL server binaries {', '.join(_TOOLS)}; point it at "
            "their directory (e.g. /usr/lib/postgresql/15/bin).",
            bin_dir=named,
        )
    on_path = shutil.which("initdb")
    if on_path:
        d = Path(on_path).resolve().parent
        if _has_tools(d):
            return d
        d = Path(on_path).parent
        if _has_tools(d):
            return d
    found = sorted((Path(p) for g in PG_BIN_GLOBS for p in glob.glob(g)), key=_version_key, reverse=True)
    for d in found:
        if _has_tools(d):
            return d
    raise ServiceError(
        f"the embedded Postgres needs the PostgreSQL server binaries ({', '.join(_TOOLS)}) and found none on PATH "
        f"or in {', '.join(PG_BIN_GLOBS)}. Install them (e.g. 'apt-get install postgresql-15'), set EOS_PG_BIN to "
        "their directory, or set EOS_POSTGRES_DSN to a running server with max_prepared_transactions > 0."
    )


def _version_key(p: Path) -> tuple[int, ...]:
    digits = "".join(c if c.isdigit() else " " for c in str(p)).split()
    return tuple(int(x) for x in digits)


def postgres_ready(dsn: str, timeout: float) -> tuple[bool, str]:
    """(ready, last error) after trying ``SELECT 1`` for up to ``timeout`` seconds."""
    import psycopg

    deadline = time.monotonic() + timeout
    last = ""
    while True:
        try:
            with psycopg.connect(dsn, connect_timeout=2, autocommit=True) as conn:
                conn.execute("SELECT 1")
            return True, ""
        except psycopg.Error as e:
            last = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if time.monotonic() >= deadline:
            return False, last
        time.sleep(0.1)


class EmbeddedPostgres(PostgresService):
    """A PostgreSQL cluster in a temp dir on 127.0.0.1, run as an unprivileged user when we are root.

    fsync stays on (crash tests rely on the WAL), ``max_prepared_transactions`` defaults to 64. The
    superuser ``eos_admin`` logs in with a random password (scram-sha-256), over TLS only with
    ``security="tls"``, the default (the CA's certificate: ``ca_path``; ``reissue_certificate()`` gives the
    server a new one of the same CA while it runs; ``"plaintext"``: no TLS). ``hardened`` (default): PUBLIC
    may not connect, create temporary tables or use schema public, as on a managed service; ``add_role``
    makes a least-privileged app role holding exactly what it is granted. ``crash()`` is
    ``pg_ctl stop -m immediate``; ``start()`` recovers on the same directory and port; ``stop()``
    stops cleanly and deletes the temp directory unless ``keep=True`` (a named ``base_dir`` is kept).
    ``settings``: more ``postgresql.conf`` lines; ``replica_of``: a hot standby of that running server
    (``connectors.services.postgres_standby``), with its superuser's ``password``.
    """

    kind = "embedded"

    def __init__(
        self,
        *,
        port: int | None = None,
        bin_dir: str | None = None,
        max_prepared_transactions: int = 64,
        max_connections: int = 200,
        start_timeout: float = START_TIMEOUT,
        base_dir: str | None = None,
        detached: bool = False,
        keep: bool = False,
        # not "eos": a role named like the 2PC sink's protocol schema would put that schema on its
        # search path ("$user"), and the sink refuses unqualified tables then
        user: str = "eos_admin",
        security: str = "tls",
        hardened: bool = True,
        settings: Mapping[str, str] | None = None,
        password: str | None = None,
        replica_of: EmbeddedPostgres | None = None,
    ) -> None:
        if security not in SECURITY:
            raise ServiceError(f"EmbeddedPostgres(security={security!r}): use one of {', '.join(SECURITY)}")
        self.security = security
        self.bin_dir = pg_bin_dir(bin_dir)
        if port is not None and _proc.port_in_use(port):
            raise ServiceError(
                f"cannot start the embedded Postgres on 127.0.0.1:{port}: the port is in use. "
                "Stop what holds it, pick another port, or leave the port unset to get a free one.",
                port=port,
            )
        self.run_as = _proc.run_as_for_root()
        self.user = user
        self.password = password or secrets.token_urlsafe(18)
        self.settings = dict(settings or {})
        self.max_prepared_transactions = max_prepared_transactions
        self.max_connections = max_connections
        self.start_timeout = start_timeout
        self._detached = detached
        # A directory the caller named is never deleted: it may hold more than our cluster.
        self._keep = keep or base_dir is not None
        self.proc: subprocess.Popen[bytes] | None = None
        self.pid = 0
        self.port = port or 0
        started = time.monotonic()
        if not base_dir:
            _proc.sweep_stale("eos-pg-")
        self.base = Path(base_dir) if base_dir else Path(tempfile.mkdtemp(prefix="eos-pg-"))
        self.base.mkdir(parents=True, exist_ok=True)
        if not detached and not base_dir:
            _proc.claim_dir(self.base)
        self.data_dir = self.base / "data"
        self.log_path = self.base / "postgres.log"
        if not detached:
            _proc.register_cleanup(id(self), self.stop)
        try:
            if replica_of is None:
                self._initdb()
            else:
                self._base_backup(replica_of)
            for attempt in range(1 if port is not None else _PORT_ATTEMPTS):
                self.port = port if port is not None else _proc.free_port()
                if self._launch(last_attempt=port is not None or attempt == _PORT_ATTEMPTS - 1):
                    break
        except BaseException:
            self.stop()
            raise
        # as a managed database is: PUBLIC may not connect, create temporary tables or use public (a standby
        # has it from its primary)
        if hardened and replica_of is None:
            from connectors.services.pg_security import harden

            harden(self.dsn)
        self.start_seconds = time.monotonic() - started

    # ---- the DSN -------------------------------------------------------------------------------
    @property
    def dsn(self) -> str:  # type: ignore[override]
        tls = f"?sslmode=verify-full&sslrootcert={self.ca_path}" if self.security == "tls" else ""
        return f"postgresql://{self.user}:{self.password}@127.0.0.1:{self.port}/postgres{tls}"

    @property
    def ca_path(self) -> Path:
        """The certificate of the CA that issued the server's (what ``sslrootcert`` names)."""
        return self.base / "ca" / "ca.pem"

    @property
    def tls_files(self) -> tuple[Path, Path] | None:
        """The server's certificate and key (a TLS-ending test proxy may present them: they are for
        127.0.0.1 and localhost), None without TLS."""
        if self.security != "tls":
            return None
        return self.base / "tls" / "server.pem", self.base / "tls" / "server.key"

    def _issue(self) -> None:
        from connectors.services.tls import CertificateAuthority

        CertificateAuthority(self.base / "ca").issue(self.base / "tls", owner=self.run_as)

    def reissue_certificate(self) -> None:
        """A new server certificate of the same CA, taken up by a reload while the server runs: open
        sessions go on, new ones see the new certificate (a rotation clients that trust the CA survive)."""
        if self.security != "tls":
            raise ServiceError("reissue_certificate(): this embedded Postgres runs without TLS (security='plaintext')")
        self._issue()
        _proc.run([self._tool("pg_ctl"), "reload", "-D", str(self.data_dir)], run_as=self.run_as, timeout=30)

    def certificate_serial(self) -> int:
        """The serial number of the certificate the server presents now (a new one after a reissue)."""
        from cryptography import x509

        return int(x509.load_pem_x509_certificate((self.base / "tls" / "server.pem").read_bytes()).serial_number)

    # ---- lifecycle -----------------------------------------------------------------------------
    def _tool(self, name: str) -> str:
        return str(self.bin_dir / name)

    def _initdb(self) -> None:
        owner = self.run_as
        pwfile = self.base / "pwfile"
        pwfile.write_text(self.password + "\n")
        os.chmod(pwfile, 0o600)
        os.chmod(self.base, 0o700)
        if owner is not None:
            for p in (self.base, pwfile):
                os.chown(p, owner.uid, owner.gid)
        try:
            # --no-sync: the files initdb writes only need to survive a process crash, which the page
            # cache guarantees; the server itself runs with fsync=on.
            _proc.run(
                [
                    self._tool("initdb"),
                    "-D",
                    str(self.data_dir),
                    "-U",
                    self.user,
                    f"--pwfile={pwfile}",
                    "--auth=scram-sha-256",
                    "-E",
                    "UTF8",
                    "--locale=C",
                    "--no-sync",
                ],
                run_as=owner,
            )
        except ServiceError as e:
            who = f" (as user {owner.user}: every directory above {self.base} must be reachable by it)" if owner else ""
            raise ServiceError(f"initdb failed{who}: {e}") from e
        finally:
            pwfile.unlink(missing_ok=True)
        settings = {
            "listen_addresses": "'127.0.0.1'",
            "unix_socket_directories": f"'{self.base}'",
            "fsync": "on",
            "synchronous_commit": "on",
            "full_page_writes": "on",
            "max_prepared_transactions": str(self.max_prepared_transactions),
            "max_connections": str(self.max_connections),
            "shared_buffers": "32MB",
            "logging_collector": "off",
            "log_min_messages": "warning",
            "log_line_prefix": "'%m [%p] '",
        }
        if self.security == "tls":
            self._issue()
            settings.update(ssl="on", **self._tls_settings())
            (self.data_dir / "pg_hba.conf").write_text(_HBA_TLS)  # initdb's file: its owner and mode stay
        self._configure({**settings, **self.settings})

    def _configure(self, settings: Mapping[str, str]) -> None:
        with open(self.data_dir / "postgresql.conf", "a") as conf:
            conf.write("\n# spark-eos embedded cluster\n")
            conf.writelines(f"{k} = {v}\n" for k, v in settings.items())

    def _base_backup(self, primary: EmbeddedPostgres) -> None:
        """The data directory as a streaming-replication standby of ``primary``: ``pg_basebackup`` (WAL
        streamed), its CA and certificate copied, ``standby.signal``, ``primary_conninfo`` naming this
        server ``application_name`` (what ``synchronous_standby_names`` lists) with a password file."""
        owner = self.run_as
        os.chmod(self.base, 0o700)
        for part in ("ca", "tls"):
            if (primary.base / part).exists():
                shutil.copytree(primary.base / part, self.base / part)
        passfile = self.base / "passfile"
        passfile.write_text(f"127.0.0.1:{primary.port}:*:{primary.user}:{primary.password}\n")
        os.chmod(passfile, 0o600)
        if owner is not None:
            for root, dirs, files in os.walk(self.base):
                for name in [root, *(os.path.join(root, f) for f in dirs + files)]:
                    os.chown(name, owner.uid, owner.gid)
        tls = f" sslmode=verify-full sslrootcert={self.ca_path}" if self.security == "tls" else ""
        conninfo = f"host=127.0.0.1 port={primary.port} user={primary.user} passfile={passfile}{tls}"
        _proc.run(
            [self._tool("pg_basebackup"), "-D", str(self.data_dir), "-d", conninfo, "-X", "stream", "--no-sync"],
            run_as=owner,
            timeout=120,
        )
        (self.data_dir / "standby.signal").touch()
        if owner is not None:
            os.chown(self.data_dir / "standby.signal", owner.uid, owner.gid)
        settings = {
            "unix_socket_directories": f"'{self.base}'",
            "primary_conninfo": f"'{conninfo} application_name={STANDBY_NAME}'",
            **self.settings,
        }
        if self.security == "tls":
            settings.update(self._tls_settings())  # its own copy, not the primary's files
        self._configure(settings)

    def _tls_settings(self) -> dict[str, str]:
        assert self.tls_files is not None
        cert, key = self.tls_files
        return {"ssl_cert_file": f"'{cert}'", "ssl_key_file": f"'{key}'"}

    def _launch(self, *, last_attempt: bool) -> bool:
        log = open(self.log_path, "ab")  # the child inherits the descriptor
        try:
            self.proc = _proc.spawn(
                [self._tool("postgres"), "-D", str(self.data_dir), "-p", str(self.port)],
                log=log,
                run_as=self.run_as,
                tie_to_parent=not self._detached,
            )
        finally:
            log.close()
        self.pid = self.proc.pid
        ok, last = self._wait_ready(self.start_timeout)
        if ok:
            return True
        exited = self.proc.poll() is not None
        self._kill()
        logs = _proc.tail(self.log_path)
        if exited and "in use" in logs.lower() and not last_attempt:
            return False  # another process took the free port between our probe and the bind
        what = "exited during start" if exited else f"did not accept connections within {self.start_timeout:.0f}s"
        raise ServiceError(
            f"embedded Postgres on 127.0.0.1:{self.port} {what}; last error: {last or '-'}; "
            f"log {self.log_path}:\n{logs}",
            port=self.port,
        )

    def _wait_ready(self, timeout: float) -> tuple[bool, str]:
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                return False, last
            ok, last = postgres_ready(self.dsn, min(2.0, max(0.1, deadline - time.monotonic())))
            if ok:
                return True, ""
        return False, last

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _pg_ctl_stop(self, mode: str) -> None:
        _proc.run(
            [self._tool("pg_ctl"), "stop", "-D", str(self.data_dir), "-m", mode, "-w", "-t", "30"],
            run_as=self.run_as,
            timeout=60,
        )

    def _reap(self) -> None:
        # The postmaster's backends share its process group; wait until none is left.
        if self.proc is not None:
            _proc.stop_group(self.proc, self.pid, grace=10.0, sig=0)
        self.proc = None

    def _kill(self) -> None:
        if self.proc is not None:
            _proc.stop_group(self.proc, self.pid, grace=0.0, sig=signal.SIGKILL)
        self.proc = None

    def crash(self, how: str = "immediate") -> None:
        """Stop without a shutdown checkpoint; prepared transactions live on in the WAL.

        ``how="immediate"``: ``pg_ctl stop -m immediate`` (SIGQUIT to the postmaster, which quits its
        backends). ``how="sigkill"``: SIGKILL to the postmaster and every server process at once, as
        a machine crash would (minus the page cache).
        """
        if how not in ("immediate", "sigkill"):
            raise ServiceError(f"crash(how={how!r}): use 'immediate' or 'sigkill'")
        if not self.running():
            raise ServiceError(f"embedded Postgres on port {self.port} is not running; nothing to crash")
        if how == "immediate":
            self._pg_ctl_stop("immediate")
            self._reap()
            return
        tree = _proc.process_tree(self.pid)
        for pid in tree:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self._reap()
        _proc.wait_until(lambda: not any(_proc.pid_alive(p) for p in tree), 10.0, 0.05)

    def start(self) -> None:
        """Start on the same data directory and port (WAL recovery after a crash); a no-op when running."""
        if self.running():
            return
        if not self.data_dir.exists():
            raise ServiceError(f"embedded Postgres data directory {self.data_dir} is gone (stopped for good)")
        if not self._detached:
            _proc.register_cleanup(id(self), self.stop)
        if _proc.port_in_use(self.port):
            raise ServiceError(
                f"cannot restart the embedded Postgres: port {self.port} is now taken by another process"
            )
        self._launch(last_attempt=True)

    def restart(self, down: float = 0.0) -> None:
        """A clean (fast) stop, keeping the data directory, ``down`` seconds stopped, then ``start()``."""
        if self.running():
            self._pg_ctl_stop("fast")
            self._reap()
        time.sleep(down)
        self.start()

    def stop(self) -> None:
        """Stop cleanly (``pg_ctl stop -m fast``; SIGKILL after a bound) and delete the directory unless kept."""
        _proc.unregister_cleanup(id(self))
        if self.running():
            try:
                self._pg_ctl_stop("fast")
            except ServiceError:
                pass  # fall through to the kill below; the directory goes anyway
            if self.proc is not None:
                _proc.stop_group(self.proc, self.pid, grace=10.0)
        self.proc = None
        if not self._keep:
            shutil.rmtree(self.base, ignore_errors=True)
