"""``postgres-2pc`` options: the option specs and their parsed, checked form (``TwoPhaseOptions``)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from connectors.core.errors import ConfigError
from connectors.core.options import REQUIRED, Option, OptionSet
from sinks.postgres.options import (
    CONNECTION_OPTIONS,
    ERRORS_OPTIONS,
    FAULTS_OPTION,
    SCHEMA_EVOLUTION_OPTION,
    ConnectionOptions,
    ErrorsPolicy,
    TableName,
    UpsertOptions,
    parse_table_name,
)
from sinks.postgres.twophase.decisions import (
    DEFAULT_SCHEMA,
)
from sinks.postgres.twophase.gid import check_sink_id

FORMAT = "postgres-2pc"
BATCH_IDENTITY = "batch-jobs"  # owner identity of df.write with caller-given batch ids
log = logging.getLogger(__name__)

TWOPC_OPTIONS = OptionSet(
    FORMAT,
    (
        *CONNECTION_OPTIONS,
        Option("table", "str", REQUIRED, "target table, optionally schema-qualified"),
        Option(
            "sink.id",
            "str",
            None,
            "name of this sink in the decision log and in every gid; REQUIRED for streaming; unique per query, stable across its restarts",
        ),
        Option(
            "batch.id",
            "int",
            None,
            "batch writes (df.write): the caller's batch number; re-running the same batch id is a no-op",
            min=0,
        ),
        Option(
            "mode",
            "choice",
            "append",
            "append: insert the rows; upsert: version-guarded upsert by key (options of postgres-upsert)",
            choices=("append", "upsert"),
        ),
        Option("key", "list", (), "upsert mode: key columns (the table needs a unique/primary key on them)"),
        Option("version", "str", None, "upsert mode: version column; a row replaces only a lower version"),
        Option("delete.column", "str", None, "upsert mode: boolean column, true deletes the key"),
        Option(
            "delete.tombstones", "bool", False, "upsert mode: rows whose non-key columns are all null delete the key"
        ),
        Option("columns", "json", None, "JSON object renaming DataFrame columns to table columns"),
        SCHEMA_EVOLUTION_OPTION,
        Option(
            "table.create",
            "bool",
            False,
            "create the table from the DataFrame schema when missing (upsert: key as primary key)",
        ),
        Option(
            "eos.schema",
            "str",
            DEFAULT_SCHEMA,
            "schema of the protocol tables (sink_batches, sink_parts, sink_owners, staging)",
        ),
        Option(
            "visibility",
            "choice",
            "batch",
            "batch: a batch appears in one transaction (tasks stage, the driver publishes); partition: each task "
            "writes straight into the table inside its prepared transaction and its rows appear as its COMMIT "
            "PREPARED runs (no staging, no publish: Flink's XA sink)",
            choices=("batch", "partition"),
        ),
        Option(
            "checkpointLocation",
            "str",
            None,
            "the query's checkpoint location (Spark passes writeStream.option('checkpointLocation') to the sink; "
            "with twopc_batch pass it yourself): each decision is bound to what the query planned in "
            "offsets/<batch>, so a restored older savepoint is refused instead of skipped. Required for streaming",
        ),
        Option(
            "decisions.retain",
            "int",
            10000,
            "published decisions kept per sink (the newest always stays); a checkpoint restored from further back is refused",
            min=1,
        ),
        Option(
            "prepared.timeout",
            "duration",
            3600.0,
            "batch jobs: an undecided prepared transaction of another batch older than this belongs to a dead job and "
            "is rolled back by the next job of the sink (keep it above your longest job's write time)",
            min=1,
        ),
        Option(
            "prepared.warn.age",
            "duration",
            300.0,
            "log a warning when a prepared transaction of the sink is older than this",
            min=0,
        ),
        Option(
            "commit.attempts",
            "int",
            5,
            "tries of each COMMIT PREPARED on connection loss before CommitUnknown",
            min=1,
            max=100,
        ),
        *ERRORS_OPTIONS,
        FAULTS_OPTION,
    ),
    ignored=("path", "queryName"),  # Spark passes the writer's own options along
)


@dataclass(frozen=True)
class TwoPhaseOptions:
    """Parsed options of ``postgres-2pc``."""

    connection: ConnectionOptions
    table: TableName
    sink_id: str | None
    batch_id: int | None
    mode: str
    upsert: UpsertOptions | None
    rename: tuple[tuple[str, str], ...]
    table_create: bool
    eos_schema: str
    warn_age: float
    commit_attempts: int
    faults: str | None
    checkpoint: str | None = None
    retain: int = 10000
    prepared_timeout: float = 3600.0
    visibility: str = "batch"
    lock_timeout: float = 60.0
    schema_evolution: str = "none"
    errors: ErrorsPolicy = field(default_factory=ErrorsPolicy)

    @classmethod
    def from_options(cls, raw: Mapping[str, Any]) -> TwoPhaseOptions:
        values = TWOPC_OPTIONS.parse(dict(raw))
        sink_id = values.get("sink_id")
        if sink_id is not None:
            check_sink_id(sink_id)
        mode = values["mode"]
        upsert = None
        if mode == "upsert":
            if not values.get("key"):
                raise ConfigError(f"{FORMAT}: mode=upsert needs option 'key' (the key columns)", option="key")
            upsert = UpsertOptions.from_values(values, FORMAT)
        else:
            for opt, attr in (("key", "key"), ("version", "version"), ("delete.column", "delete_column")):
                if values.get(attr):
                    raise ConfigError(
                        f"{FORMAT}: option '{opt}' only applies to mode=upsert (mode is append)", option=opt
                    )
        columns = values.get("columns") or {}
        if not isinstance(columns, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in columns.items()
        ):
            raise ConfigError(
                f"{FORMAT}: option 'columns' must be a JSON object of strings, got {columns!r}", option="columns"
            )
        conn_fields = {
            "dsn",
            "host",
            "port",
            "dbname",
            "user",
            "password",
            "connect_timeout",
            "statement_timeout",
            "lock_timeout",
            "keepalives_idle",
            "keepalives_interval",
            "keepalives_count",
            "tcp_user_timeout",
            "retry_attempts",
            "retry_backoff",
            "retry_max_backoff",
        }
        return cls(
            connection=ConnectionOptions(**{k: v for k, v in values.items() if k in conn_fields}),
            table=parse_table_name(values["table"]),
            sink_id=sink_id,
            batch_id=values.get("batch_id"),
            mode=mode,
            upsert=upsert,
            rename=tuple(sorted(columns.items())),
            table_create=bool(values["table_create"]),
            eos_schema=values["eos_schema"],
            warn_age=float(values["prepared_warn_age"]),
            commit_attempts=int(values["commit_attempts"]),
            faults=values.get("faults"),
            checkpoint=values.get("checkpoint_location"),
            retain=int(values["decisions_retain"]),
            prepared_timeout=float(values["prepared_timeout"]),
            visibility=values["visibility"],
            schema_evolution=values["schema_evolution"],
            lock_timeout=float(values["lock_timeout"]),
            errors=ErrorsPolicy.from_values(values, FORMAT),
        )
