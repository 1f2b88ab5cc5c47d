"""The decision log of the two-phase sink: protocol tables, the sink lock, owners and prepared gids."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime

import psycopg
from psycopg import sql

from eos_core.errors import ConfigError, FatalError
from sinks.postgres.connection import ddl_lock
from sinks.postgres.twophase.gid import Gid, parse_gid, sink_prefix

__all__ = [
    "DEFAULT_SCHEMA",
    "Decision",
    "Owner",
    "Prepared",
    "ProtocolTables",
    "check_max_prepared",
    "list_prepared",
    "max_prepared_transactions",
    "protocol_schemas",
    "schemas_knowing",
    "sink_lock",
    "sink_lock_key",
]

DEFAULT_SCHEMA = "eos"
_LATER_COLUMNS = ("lineage", "nonce", "stage", "checkpoint")
_DECISION_COLUMNS = "batch_id, gids, rows, decided_at, published_at, owner, lineage, nonce, stage, checkpoint"


def _decision(sink_id: str, r: tuple) -> Decision:
    return Decision(sink_id, int(r[0]), tuple(r[1]), int(r[2]), r[3], r[4], r[5], r[6], r[7], r[8], r[9])


@dataclass(frozen=True)
class Decision:
    """A row of ``sink_batches``: batch ``batch_id`` of the sink is committed with exactly ``gids``."""

    sink_id: str
    batch_id: int
    gids: tuple[str, ...]
    rows: int
    decided_at: datetime | None = None
    published_at: datetime | None = None
    owner: str | None = None
    lineage: str | None = None  # digest of offsets/n in the deciding query's checkpoint (I1); None: batch job
    nonce: str | None = None  # the batch attempt that wrote the decided gids
    stage: str | None = None  # where the rows wait until published (I3); None: straight into the target
    checkpoint: str | None = None  # the deciding query's checkpoint location, for messages

    @property
    def published(self) -> bool:
        return self.published_at is not None


@dataclass(frozen=True)
class Owner:
    """A row of ``sink_owners``: which writer identity (a streaming query's id, or batch jobs) owns a sink id."""

    sink_id: str
    identity: str
    run_id: str | None
    claimed_at: datetime | None = None


@dataclass(frozen=True)
class Prepared:
    """One prepared transaction of the sink, as ``pg_prepared_xacts`` shows it."""

    gid: Gid
    prepared_at: datetime
    age_seconds: float
    database: str


def sink_lock_key(sink_id: str) -> int:
    """The advisory-lock key of a sink (signed 64-bit, stable across processes and versions)."""
    return int.from_bytes(hashlib.sha1(("eos-sink:" + sink_id).encode()).digest()[:8], "big", signed=True)


SINK_LOCK_TIMEOUT = 60.0
"""Seconds a session without a ``lock_timeout`` of its own waits for the sink lock (the sinks' sessions
have one: option ``lock.timeout``, default 60 s)."""

_HOLDER = (
    "SELECT a.pid, a.application_name, a.client_addr::text, a.state, "
    "extract(epoch FROM now() - a.state_change)::float8 FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
    "WHERE l.locktype = 'advisory' AND l.granted AND l.classid::bigint = %s AND l.objid::bigint = %s "
    "AND l.objsubid = 1 AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
)


@contextmanager
def sink_lock(conn: psycopg.Connection, sink_id: str) -> Iterator[None]:
    """Hold the sink's session advisory lock on an autocommit connection.

    Every step that rolls back a gid or writes a decision runs under it, so "no decision names
    this gid" and "roll it back" are one atomic step against "decide the batch", and a decision only
    ever names gids that are still prepared when it is written.

    The wait is bounded by the session's ``lock_timeout`` (option ``lock.timeout``), or by
    ``SINK_LOCK_TIMEOUT`` on a session without one: a holder that never lets go (a stopped driver
    whose connection stays open) fails the wait with a ``RetriableError`` naming the holder's pid.
    """
    from eos_core.errors import RetriableError  # here: this function's change stays in one place

    key = sink_lock_key(sink_id)
    bound = f"{int(SINK_LOCK_TIMEOUT * 1000)}ms"
    failure: psycopg.errors.LockNotAvailable | None = None
    try:
        # the subquery sets the bound (for this statement only) before the lock is asked for
        conn.execute(
            "SELECT pg_advisory_lock(%s) FROM (SELECT set_config('lock_timeout', CASE current_setting('lock_timeout') "
            "WHEN '0' THEN %s ELSE current_setting('lock_timeout') END, true)) bound",
            (key, bound),
        )
    except psycopg.errors.LockNotAvailable as exc:
        failure = exc
    if failure is not None:
        waited = conn.execute("SELECT current_setting('lock_timeout')").fetchone()
        holder = conn.execute(_HOLDER, ((key >> 32) & 0xFFFFFFFF, key & 0xFFFFFFFF)).fetchone()
        held = (
            f"held by pid {holder[0]} (application {holder[1]!r}, client {holder[2] or 'local'}, {holder[3]} for "
            f"{holder[4]:.0f}s)"
            if holder
            else "held by another session (gone by now)"
        )
        setting = waited[0] if waited and waited[0] != "0" else bound
        raise RetriableError(
            f"postgres-2pc: waited {setting} (option 'lock.timeout') for the lock of sink {sink_id!r}, {held}. "
            "A task, committer or `spark-eos sinks` command of this sink holds it while it decides or recovers; "
            "one that is stopped (a frozen driver) holds it until its connection closes: end that session "
            "(SELECT pg_terminate_backend(pid)), or raise 'lock.timeout'",
            sink_id=sink_id,
            sqlstate="55P03",
        ) from failure
    try:
        yield
    finally:
        if not conn.closed and not conn.broken:
            conn.execute("SELECT pg_advisory_unlock(%s)", (key,))


def list_prepared(conn: psycopg.Connection, sink_id: str) -> list[Prepared]:
    """The prepared transactions of this sink in the connected database, oldest first."""
    rows = conn.execute(
        "SELECT gid, prepared, extract(epoch FROM now() - prepared)::float8, database FROM pg_prepared_xacts "
        "WHERE starts_with(gid, %s) AND database = current_database() ORDER BY prepared, gid",
        (sink_prefix(sink_id),),
    ).fetchall()
    out = []
    for gid_text, prepared, age, database in rows:
        gid = parse_gid(gid_text)
        if gid is not None and gid.sink_id == sink_id:
            out.append(Prepared(gid, prepared, float(age), database))
    return out


def max_prepared_transactions(conn: psycopg.Connection) -> int:
    return int(conn.execute("SELECT current_setting('max_prepared_transactions')::int").fetchone()[0])  # type: ignore[index]


def check_max_prepared(conn: psycopg.Connection, writers: int | None = None, where: str = "") -> int:
    """Refuse to run when prepared transactions are off or too few for ``writers`` concurrent tasks."""
    limit = max_prepared_transactions(conn)
    fix = (
        "set max_prepared_transactions in postgresql.conf (or `-c max_prepared_transactions=64` on the command line, "
        "`ALTER SYSTEM SET max_prepared_transactions = 64`) to at least the number of concurrent writer tasks "
        "(plus other users of prepared transactions), then restart Postgres (a managed Postgres such as RDS or "
        "Cloud SQL: its parameter group or flags, docs/deployment.md#managed-postgres)"
    )
    if limit == 0:
        raise ConfigError(
            f"postgres-2pc{where}: the server has max_prepared_transactions = 0, so PREPARE TRANSACTION is disabled; {fix}",
            option="max_prepared_transactions",
        )
    if writers is not None and writers > limit:
        raise ConfigError(
            f"postgres-2pc{where}: {writers} writer tasks would prepare concurrently but the server allows only "
            f"max_prepared_transactions = {limit}; {fix}, or write with fewer partitions (df.coalesce({limit}))",
            option="max_prepared_transactions",
        )
    return limit


def protocol_schemas(conn: psycopg.Connection, schema: str | None = None) -> list[str]:
    """The schemas of the connected database holding the three protocol tables (only ``schema``, when given)."""
    rows = conn.execute(
        "SELECT schemaname FROM pg_tables WHERE tablename IN ('sink_batches', 'sink_parts', 'sink_owners') "
        "AND (%s::text IS NULL OR schemaname = %s) GROUP BY schemaname HAVING count(*) = 3 ORDER BY schemaname",
        (schema, schema),
    ).fetchall()
    return [str(r[0]) for r in rows]


def schemas_knowing(conn: psycopg.Connection, sink_id: str) -> tuple[list[str], list[str]]:
    """The protocol schemas that know the sink (a decision, marker or owner of it), and those this
    role may not read (they might). Read-only; for operator commands pointed at the wrong schema."""
    knowing, unreadable = [], []
    for schema in protocol_schemas(conn):
        try:
            if ProtocolTables(schema).knows(conn, sink_id):
                knowing.append(schema)
        except psycopg.errors.InsufficientPrivilege:
            if not conn.autocommit:
                conn.rollback()
            unreadable.append(schema)
    return knowing, unreadable


class ProtocolTables:
    """The protocol tables in one schema (``eos`` by default): decisions, markers and owners."""

    def __init__(self, schema: str = DEFAULT_SCHEMA) -> None:
        if not schema or "\x00" in schema:
            raise ConfigError(f"postgres-2pc: option 'eos.schema' has an invalid value {schema!r}", option="eos.schema")
        self.schema = schema
        s = sql.Identifier(schema)
        self.batches = sql.SQL("{}.sink_batches").format(s)
        self.parts = sql.SQL("{}.sink_parts").format(s)
        self.owners = sql.SQL("{}.sink_owners").format(s)

    def __reduce__(self) -> tuple[object, ...]:
        return (ProtocolTables, (self.schema,))

    # -- schema ------------------------------------------------------------------------------

    def ensure(self, conn: psycopg.Connection) -> None:
        """Create the schema and tables when missing (safe to run concurrently and repeatedly)."""
        s = sql.Identifier(self.schema)
        exists = conn.execute(
            "SELECT count(*) FROM pg_tables WHERE schemaname = %s AND tablename IN ('sink_batches','sink_parts','sink_owners')",
            (self.schema,),
        ).fetchone()
        if exists and exists[0] == 3 and self._current(conn):
            if not conn.autocommit:
                conn.commit()
            return
        with ddl_lock(conn):
            # only when missing: Postgres asks for CREATE on the database before it sees the schema exists, and
            # a role an admin made the schema for has none
            if not conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (self.schema,)).fetchone():
                conn.execute(sql.SQL("CREATE SCHEMA {}").format(s))
            conn.execute(
                sql.SQL(
                    "CREATE TABLE IF NOT EXISTS {} ("
                    " sink_id text NOT NULL, batch_id bigint NOT NULL, gids text[] NOT NULL,"
                    " rows bigint NOT NULL DEFAULT 0, owner text,"
                    " decided_at timestamptz NOT NULL DEFAULT clock_timestamp(), published_at timestamptz,"
                    " PRIMARY KEY (sink_id, batch_id))"
                ).format(self.batches)
            )
            conn.execute(
                sql.SQL(
                    "CREATE TABLE IF NOT EXISTS {} ("
                    " gid text PRIMARY KEY, sink_id text NOT NULL, batch_id bigint NOT NULL,"
                    " partition_id int NOT NULL, rows bigint NOT NULL,"
                    " written_at timestamptz NOT NULL DEFAULT clock_timestamp())"
                ).format(self.parts)
            )
            conn.execute(
                sql.SQL("CREATE INDEX IF NOT EXISTS sink_parts_batch ON {} (sink_id, batch_id)").format(self.parts)
            )
            conn.execute(
                sql.SQL(
                    "CREATE TABLE IF NOT EXISTS {} ("
                    " sink_id text PRIMARY KEY, identity text NOT NULL, run_id text,"
                    " claimed_at timestamptz NOT NULL DEFAULT clock_timestamp(),"
                    " updated_at timestamptz NOT NULL DEFAULT clock_timestamp())"
                ).format(self.owners)
            )
            # Columns added after 0.1 (decision lineage, attempt and staging place): tables made
            # by an older version gain them; their old rows keep NULL ("not recorded").
            for column in _LATER_COLUMNS:
                conn.execute(
                    sql.SQL("ALTER TABLE {} ADD COLUMN IF NOT EXISTS {} text").format(
                        self.batches, sql.Identifier(column)
                    )
                )

    def present(self, conn: psycopg.Connection) -> bool:
        """The three protocol tables exist in this schema (a catalog read: no DDL, no lock)."""
        return len(protocol_schemas(conn, self.schema)) == 1

    def current(self, conn: psycopg.Connection) -> bool:
        """The tables have every column this version reads (tables of 0.1 gain them when a sink starts)."""
        return self._current(conn)

    def knows(self, conn: psycopg.Connection, sink_id: str) -> bool:
        """This schema holds a decision, a marker or the owner of the sink (exact sink id)."""
        row = conn.execute(
            sql.SQL(
                "SELECT EXISTS (SELECT 1 FROM {} WHERE sink_id = %s) OR EXISTS (SELECT 1 FROM {} WHERE sink_id = %s) "
                "OR EXISTS (SELECT 1 FROM {} WHERE sink_id = %s)"
            ).format(self.batches, self.parts, self.owners),
            (sink_id, sink_id, sink_id),
        ).fetchone()
        return bool(row and row[0])

    def decided_batches(self, conn: psycopg.Connection, sink_id: str, batch_ids: Iterable[int]) -> set[int]:
        """Which of ``batch_ids`` the sink decided in this schema (reads only the columns of every version)."""
        rows = conn.execute(
            sql.SQL("SELECT batch_id FROM {} WHERE sink_id = %s AND batch_id = ANY(%s)").format(self.batches),
            (sink_id, sorted(set(batch_ids))),
        ).fetchall()
        return {int(r[0]) for r in rows}

    def _current(self, conn: psycopg.Connection) -> bool:
        row = conn.execute(
            "SELECT count(*) FROM information_schema.columns WHERE table_schema = %s AND table_name = 'sink_batches' "
            "AND column_name = ANY(%s)",
            (self.schema, list(_LATER_COLUMNS)),
        ).fetchone()
        return bool(row and row[0] == len(_LATER_COLUMNS))

    # -- decisions ---------------------------------------------------------------------------

    def decision(
        self, conn: psycopg.Connection, sink_id: str, batch_id: int, *, for_update: bool = False
    ) -> Decision | None:
        found = self.decisions(conn, sink_id, (batch_id,), for_update=for_update)
        return found.get(batch_id)

    def decisions(
        self, conn: psycopg.Connection, sink_id: str, batch_ids: Iterable[int], *, for_update: bool = False
    ) -> dict[int, Decision]:
        ids = sorted(set(batch_ids))
        if not ids:
            return {}
        query = sql.SQL(f"SELECT {_DECISION_COLUMNS} FROM {{}} WHERE sink_id = %s AND batch_id = ANY(%s)").format(
            self.batches
        )
        if for_update:
            query = query + sql.SQL(" FOR UPDATE")
        rows = conn.execute(query, (sink_id, ids)).fetchall()
        return {int(r[0]): _decision(sink_id, r) for r in rows}

    def recent(self, conn: psycopg.Connection, sink_id: str, limit: int = 20) -> list[Decision]:
        rows = conn.execute(
            sql.SQL(f"SELECT {_DECISION_COLUMNS} FROM {{}} WHERE sink_id = %s ORDER BY batch_id DESC LIMIT %s").format(
                self.batches
            ),
            (sink_id, limit),
        ).fetchall()
        return [_decision(sink_id, r) for r in rows]

    def last_batch(self, conn: psycopg.Connection, sink_id: str) -> int | None:
        row = conn.execute(
            sql.SQL("SELECT max(batch_id) FROM {} WHERE sink_id = %s").format(self.batches), (sink_id,)
        ).fetchone()
        return None if row is None or row[0] is None else int(row[0])

    def insert_decision(
        self,
        conn: psycopg.Connection,
        sink_id: str,
        batch_id: int,
        gids: Iterable[str],
        rows: int,
        owner: str | None,
        *,
        lineage: str | None = None,
        nonce: str | None = None,
        stage: str | None = None,
        checkpoint: str | None = None,
    ) -> None:
        """Insert (inside the caller's transaction) the decision row; the primary key makes it unique."""
        conn.execute(
            sql.SQL(
                "INSERT INTO {} (sink_id, batch_id, gids, rows, owner, lineage, nonce, stage, checkpoint) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)"
            ).format(self.batches),
            (sink_id, batch_id, sorted(gids), rows, owner, lineage, nonce, stage, checkpoint),
        )

    def undecide(
        self, conn: psycopg.Connection, decision: Decision, discard: Callable[[list[str]], None] | None = None
    ) -> bool:
        """Take back an unpublished decision with no trace, in ONE transaction: the decision row, its
        staged rows (``discard(gids)`` removes them) and its markers. Safe only because
        nothing of the batch is visible yet; False when it was published meanwhile (then nothing
        changed). The decided gids still prepared become strays of an undecided batch: the caller
        (or the next recovery) rolls them back."""
        with conn.transaction():
            gone = conn.execute(
                sql.SQL(
                    "DELETE FROM {} WHERE sink_id = %s AND batch_id = %s AND published_at IS NULL RETURNING gids"
                ).format(self.batches),
                (decision.sink_id, decision.batch_id),
            ).fetchone()
            if gone is None:
                return False
            gids = list(gone[0])
            if gids and discard is not None:
                discard(gids)
            if gids:
                conn.execute(sql.SQL("DELETE FROM {} WHERE gid = ANY(%s)").format(self.parts), (gids,))
        return True

    def prune_decisions(self, conn: psycopg.Connection, sink_id: str, below_batch: int) -> int:
        """Forget published decisions of batches below ``below_batch`` (the newest one always stays, so
        "batch n <= the last decided batch but not decided" keeps meaning "not this lineage")."""
        cur = conn.execute(
            sql.SQL(
                "DELETE FROM {0} WHERE sink_id = %s AND batch_id < %s AND published_at IS NOT NULL "
                "AND batch_id < (SELECT max(batch_id) FROM {0} WHERE sink_id = %s)"
            ).format(self.batches),
            (sink_id, below_batch, sink_id),
        )
        return max(cur.rowcount, 0)

    def prune(self, conn: psycopg.Connection, sink_id: str, keep: int, below: int | None = None) -> tuple[int, int]:
        """Forget the sink's published decisions older than its ``keep`` newest ones (and below batch
        ``below`` when given), with their markers, in one transaction; returns (decisions, markers)
        removed. An unpublished decision, and the markers of its batch, always stay."""
        if keep < 1:
            raise ConfigError(f"postgres-2pc: --keep must be at least 1, got {keep}", option="keep")
        with conn.transaction():
            row = conn.execute(
                sql.SQL("SELECT batch_id FROM {} WHERE sink_id = %s ORDER BY batch_id DESC OFFSET %s LIMIT 1").format(
                    self.batches
                ),
                (sink_id, keep - 1),
            ).fetchone()
            if row is None:
                return 0, 0  # no more than ``keep`` decisions
            floor = int(row[0]) if below is None else min(int(row[0]), below)
            gone = conn.execute(
                sql.SQL("DELETE FROM {} WHERE sink_id = %s AND batch_id < %s AND published_at IS NOT NULL").format(
                    self.batches
                ),
                (sink_id, floor),
            )
            decisions = max(gone.rowcount, 0)
            gone = conn.execute(
                sql.SQL(
                    "DELETE FROM {0} p WHERE p.sink_id = %s AND p.batch_id < %s AND NOT EXISTS (SELECT 1 FROM {1} b "
                    "WHERE b.sink_id = p.sink_id AND b.batch_id = p.batch_id AND b.published_at IS NULL)"
                ).format(self.parts, self.batches),
                (sink_id, floor),
            )
            return decisions, max(gone.rowcount, 0)

    def mark_published(self, conn: psycopg.Connection, sink_id: str, batch_id: int) -> None:
        conn.execute(
            sql.SQL("UPDATE {} SET published_at = clock_timestamp() WHERE sink_id = %s AND batch_id = %s").format(
                self.batches
            ),
            (sink_id, batch_id),
        )

    # -- markers -----------------------------------------------------------------------------

    def insert_marker(self, conn: psycopg.Connection, gid: Gid, rows: int) -> None:
        """The marker row written inside the prepared transaction: committed iff the gid committed."""
        conn.execute(
            sql.SQL("INSERT INTO {} (gid, sink_id, batch_id, partition_id, rows) VALUES (%s, %s, %s, %s, %s)").format(
                self.parts
            ),
            (str(gid), gid.sink_id, gid.batch, gid.partition, rows),
        )

    def marker_exists(self, conn: psycopg.Connection, gid: str) -> bool:
        row = conn.execute(sql.SQL("SELECT 1 FROM {} WHERE gid = %s").format(self.parts), (gid,)).fetchone()
        return row is not None

    def prune_markers(self, conn: psycopg.Connection, sink_id: str, below_batch: int) -> None:
        """Markers only prove commits of batches that may still be replayed; older ones can go."""
        conn.execute(
            sql.SQL("DELETE FROM {} WHERE sink_id = %s AND batch_id < %s").format(self.parts), (sink_id, below_batch)
        )

    # -- owners (fencing) --------------------------------------------------------------------

    def owner(self, conn: psycopg.Connection, sink_id: str, *, for_update: bool = False) -> Owner | None:
        query = sql.SQL("SELECT identity, run_id, claimed_at FROM {} WHERE sink_id = %s").format(self.owners)
        if for_update:
            query = query + sql.SQL(" FOR UPDATE")
        row = conn.execute(query, (sink_id,)).fetchone()
        return None if row is None else Owner(sink_id, row[0], row[1], row[2])

    def check_owner(
        self, conn: psycopg.Connection, sink_id: str, identity: str, *, claim: bool, run_id: str | None = None
    ) -> None:
        """Refuse a writer whose identity differs from the sink's owner; with ``claim``, become the owner.

        ``claim`` must run inside a transaction (the decision's): the row lock serialises claims.
        """
        current = self.owner(conn, sink_id, for_update=claim)
        if current is not None and current.identity != identity:
            raise FatalError(
                f"postgres-2pc: sink id {sink_id!r} belongs to {current.identity} (claimed {current.claimed_at}), "
                f"not to this writer ({identity}). Two queries (or a query restarted with a NEW checkpoint) must not "
                "share a sink id: the batch numbers would collide and batches would be skipped as already written. "
                "Give this query its own 'sink.id'; if the old query is gone for good and you really mean to reuse the "
                f"id, run `spark-eos sinks release --sink-id {sink_id} --dsn ...` first",
                sink_id=sink_id,
            )
        if not claim:
            return
        if current is None:
            conn.execute(
                sql.SQL(
                    "INSERT INTO {} (sink_id, identity, run_id) VALUES (%s, %s, %s) ON CONFLICT (sink_id) DO NOTHING"
                ).format(self.owners),
                (sink_id, identity, run_id),
            )
            again = self.owner(conn, sink_id, for_update=True)
            if again is not None and again.identity != identity:  # lost a race against another claimant
                self.check_owner(conn, sink_id, identity, claim=False)
        elif run_id and current.run_id != run_id:
            conn.execute(
                sql.SQL("UPDATE {} SET run_id = %s, updated_at = clock_timestamp() WHERE sink_id = %s").format(
                    self.owners
                ),
                (run_id, sink_id),
            )

    def release(self, conn: psycopg.Connection, sink_id: str) -> int:
        """Forget the sink id: owner, decisions and markers (one transaction); returns the decisions removed.

        Refused while a decided batch is unpublished: its rows wait in staging and only its
        decision says so (I3); the next run of the query (or ``sinks recover``) publishes it."""
        with conn.transaction():
            pending = conn.execute(
                sql.SQL(
                    "SELECT batch_id FROM {} WHERE sink_id = %s AND published_at IS NULL ORDER BY batch_id FOR UPDATE"
                ).format(self.batches),
                (sink_id,),
            ).fetchall()
            if pending:
                raise FatalError(
                    f"postgres-2pc: sink id {sink_id!r} has decided batches that are not published yet "
                    f"({', '.join(str(r[0]) for r in pending)}): their rows wait in staging and only the decision "
                    "says so. Run the query once more (its next batch publishes them, or takes them back when the "
                    "target refuses them), then release; nothing was changed",
                    sink_id=sink_id,
                )
            conn.execute(sql.SQL("DELETE FROM {} WHERE sink_id = %s").format(self.owners), (sink_id,))
            conn.execute(sql.SQL("DELETE FROM {} WHERE sink_id = %s").format(self.parts), (sink_id,))
            cur = conn.execute(sql.SQL("DELETE FROM {} WHERE sink_id = %s").format(self.batches), (sink_id,))
            return max(cur.rowcount, 0)
