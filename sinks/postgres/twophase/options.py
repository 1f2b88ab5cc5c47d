"""``postgres-2pc`` options: the option specs and their parsed, checked form (``TwoPhaseOptions``).

The options it shares with ``postgres-upsert`` (connection, table, the upsert mode's key, version
and deletes, columns, schema evolution, errors, faults) are that sink's specs, reused.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from eos_core.errors import ConfigError
from eos_core.options import OptionSet, group, option, reuse, spec_of
from sinks.postgres.formats import TWOPC
from sinks.postgres.options import (
    ConnectionOptions,
    ErrorsPolicy,
    TableName,
    UpsertOptions,
)
from sinks.postgres.twophase.decisions import (
    DEFAULT_SCHEMA,
)
from sinks.postgres.twophase.gid import check_sink_id

FORMAT = TWOPC
BATCH_IDENTITY = "batch-jobs"  # owner identity of df.write with caller-given batch ids
log = logging.getLogger(__name__)


def _upsert_mode(attr: str, **changes: Any) -> Any:
    """An option of the upsert sink that only mode=upsert uses, described as such."""
    return reuse(UpsertOptions, attr, description=f"upsert mode: {spec_of(UpsertOptions, attr).description}", **changes)


def _sink_id(value: str, context: str) -> str:
    return check_sink_id(value)


@dataclass(frozen=True, kw_only=True)
class TwoPhaseOptions:
    """Parsed options of ``postgres-2pc``."""

    connection: ConnectionOptions = group(ConnectionOptions)
    table: TableName = reuse(UpsertOptions, "table")
    sink_id: str | None = option(
        "sink.id",
        "str",
        None,
        "name of this sink in the decision log and in every gid; REQUIRED for streaming; unique per query, stable across its restarts",
        convert=_sink_id,
    )
    batch_id: int | None = option(
        "batch.id",
        "int",
        None,
        "batch writes (df.write): the caller's batch number; re-running the same batch id is a no-op",
        min=0,
        max=2**63 - 1,  # a bigint in the decision log
    )
    mode: str = option(
        "mode",
        "choice",
        "append",
        "append: insert the rows; upsert: version-guarded upsert by key (options of postgres-upsert)",
        choices=("append", "upsert"),
    )
    key: tuple[str, ...] = _upsert_mode("key", default=())
    version: str | None = _upsert_mode("version")
    delete_column: str | None = _upsert_mode("delete_column")
    delete_tombstones: bool = _upsert_mode("delete_tombstones")
    columns: tuple[tuple[str, str], ...] | None = reuse(UpsertOptions, "columns")
    schema_evolution: str = reuse(UpsertOptions, "schema_evolution")
    table_create: bool = reuse(
        UpsertOptions,
        "table_create",
        description="create the table from the DataFrame schema when missing (upsert: key as primary key)",
    )
    eos_schema: str = option(
        "eos.schema",
        "str",
        DEFAULT_SCHEMA,
        "schema of the protocol tables (sink_batches, sink_parts, sink_owners, staging)",
    )
    visibility: str = option(
        "visibility",
        "choice",
        "batch",
        "batch: a batch appears in one transaction (tasks stage, the driver publishes); partition: each task "
        "writes straight into the table inside its prepared transaction and its rows appear as its COMMIT "
        "PREPARED runs (no staging, no publish: Flink's XA sink)",
        choices=("batch", "partition"),
    )
    checkpoint: str | None = option(
        "checkpointLocation",
        "str",
        None,
        "the query's checkpoint location (Spark passes writeStream.option('checkpointLocation') to the sink; "
        "with twopc_batch pass it yourself): each decision is bound to what the query planned in "
        "offsets/<batch>, so a restored older savepoint is refused instead of skipped. Required for streaming",
    )
    retain: int = option(
        "decisions.retain",
        "int",
        10000,
        "published decisions kept per sink (the newest always stays); a checkpoint restored from further back is refused",
        min=1,
    )
    prepared_timeout: float = option(
        "prepared.timeout",
        "duration",
        3600.0,
        "batch jobs: an undecided prepared transaction of another batch older than this belongs to a dead job and "
        "is rolled back by the next job of the sink (keep it above your longest job's write time)",
        min=1,
    )
    warn_age: float = option(
        "prepared.warn.age",
        "duration",
        300.0,
        "log a warning when a prepared transaction of the sink is older than this",
        min=0,
    )
    commit_attempts: int = option(
        "commit.attempts",
        "int",
        5,
        "tries of each COMMIT PREPARED on connection loss before CommitUnknown",
        min=1,
        max=100,
    )
    errors: ErrorsPolicy = group(ErrorsPolicy)
    faults: str | None = reuse(UpsertOptions, "faults")

    @classmethod
    def from_options(cls, raw: Mapping[str, Any]) -> TwoPhaseOptions:
        return TWOPC_OPTIONS.build(dict(raw))

    @property
    def staged(self) -> bool:
        """``visibility=batch``: tasks stage their rows, the driver publishes the batch in one transaction."""
        return self.visibility == "batch"

    @property
    def direct(self) -> bool:
        """``visibility=partition``: each task writes into the table in its prepared transaction."""
        return self.visibility == "partition"

    @property
    def lock_timeout(self) -> float:
        """``lock.timeout``, a connection option of both sinks (it bounds every lock wait of a session)."""
        return self.connection.lock_timeout

    @property
    def rename(self) -> tuple[tuple[str, str], ...]:
        """``columns`` as (DataFrame column, table column) pairs."""
        return self.columns or ()

    @functools.cached_property
    def upsert(self) -> UpsertOptions | None:
        """mode=upsert: these options as the upsert sink's (checked as that sink checks them)."""
        if self.mode != "upsert":
            return None
        upsert = UpsertOptions(**{f.name: getattr(self, f.name) for f in dataclasses.fields(UpsertOptions)})
        upsert.validate(FORMAT)
        return upsert

    def validate(self, context: str) -> None:
        """The checks across options (``OptionSet.build`` runs them)."""
        if self.mode == "upsert":
            if not self.key:
                raise ConfigError(f"{context}: mode=upsert needs option 'key' (the key columns)", option="key")
            self.upsert  # noqa: B018  (built and checked now, not in a task)
            return
        for opt, value in (("key", self.key), ("version", self.version), ("delete.column", self.delete_column)):
            if value:
                raise ConfigError(f"{context}: option '{opt}' only applies to mode=upsert (mode is append)", option=opt)


TWOPC_OPTIONS = OptionSet(
    FORMAT, TwoPhaseOptions, ignored=("path", "queryName")
)  # Spark passes the writer's own options along
