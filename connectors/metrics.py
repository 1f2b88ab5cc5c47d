"""Per-batch metrics of spark-eos queries, as JSON log lines and in Prometheus' text format.

One line in the job::

    connectors.metrics.install(spark, dsn=os.environ["EOS_POSTGRES_DSN"], sink_id="payments-raw",
                               textfile="/var/lib/node_exporter/textfile/spark_eos.prom")

registers a ``StreamingQueryListener`` that, after every micro-batch of every query of the session,
reads Spark's progress report and (with ``dsn``) the sink's own records in Postgres, and exports:

- source, per query: records read in the batch, Kafka lag per partition (the topic's end, which
  ``kafka-eos`` reports as ``latestOffset``, minus the batch's end offset), the time to plan the batch
  (``latestOffset``: fetching the partitions' end offsets from Kafka) and the batch's duration;
- sink: rows written (the decision log's count for ``postgres-2pc``, else the batch's input rows),
  dead letters of the batch (with ``errors_table``), the batch's write time (Spark's ``addBatch``:
  the tasks' reads and writes and the driver's commit), the 2PC publish time (from the decision to
  the ``COMMIT PREPARED`` of the last transaction, by the decision log's timestamps), and the sink's
  prepared transactions now with the age of the oldest.

Nothing is hooked into the connectors: the listener reads what Spark and the protocol tables record.
Outputs: a JSON line per batch on the ``spark_eos.metrics`` logger (or a stream), a Prometheus text
file rewritten atomically after each batch (for node_exporter's textfile collector), and optionally
an HTTP endpoint serving the same text at ``/metrics``. Metrics are never allowed to fail a query:
an error reading Postgres is logged once per batch and the Spark-side metrics are still exported.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TextIO

__all__ = ["BatchMetrics", "EosMetrics", "install", "prometheus_text"]

log = logging.getLogger("spark_eos.metrics")


@dataclass
class BatchMetrics:
    """What one micro-batch of one query did (one JSON log line; one sample per Prometheus series)."""

    query: str
    query_id: str
    batch_id: int
    timestamp: str
    source_records: int
    source_lag: dict[str, dict[str, int]] = field(default_factory=dict)  # topic -> partition -> offsets behind
    source_latest_offset_ms: int = 0
    batch_ms: int = 0
    sink_id: str | None = None
    sink_rows: int = 0
    sink_dead_letters: int | None = None
    sink_write_ms: int = 0
    sink_publish_ms: float | None = None
    prepared_transactions: int | None = None
    prepared_oldest_age_s: float | None = None

    def to_json(self) -> str:
        return json.dumps({"event": "spark_eos.batch", **self.__dict__}, sort_keys=True)


def _offsets(value: Any) -> dict[str, dict[str, int]]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return {}
    if not isinstance(value, dict):
        return {}
    out: dict[str, dict[str, int]] = {}
    for topic, parts in value.items():
        if isinstance(parts, dict):
            out[str(topic)] = {str(p): int(o) for p, o in parts.items() if isinstance(o, int) and o >= 0}
    return out


def from_progress(progress: Mapping[str, Any], sink_id: str | None = None) -> BatchMetrics:
    """The Spark-side metrics of one progress report (``StreamingQueryProgress.json`` parsed)."""
    durations = progress.get("durationMs") or {}
    lag: dict[str, dict[str, int]] = {}
    for source in progress.get("sources") or []:
        end, latest = _offsets(source.get("endOffset")), _offsets(source.get("latestOffset"))
        for topic, parts in latest.items():
            for p, top in parts.items():
                done = end.get(topic, {}).get(p)
                if done is not None:
                    lag.setdefault(topic, {})[p] = max(0, top - done)
    rows = int(progress.get("numInputRows") or 0)
    return BatchMetrics(
        query=str(progress.get("name") or progress.get("id") or ""),
        query_id=str(progress.get("id") or ""),
        batch_id=int(progress.get("batchId", -1)),
        timestamp=str(progress.get("timestamp") or ""),
        source_records=rows,
        source_lag=lag,
        source_latest_offset_ms=int(durations.get("latestOffset") or 0),
        batch_ms=int(durations.get("triggerExecution") or 0),
        sink_id=sink_id,
        sink_rows=rows,
        sink_write_ms=int(durations.get("addBatch") or 0),
    )


def _sink_side(metrics: BatchMetrics, dsn: str, *, eos_schema: str, errors_table: str | None) -> None:
    """Add the sink's records in Postgres: decided rows and publish time, dead letters, prepared gids."""
    from sinks.postgres import deadletter
    from sinks.postgres.connection import connect
    from sinks.postgres.options import ConnectionOptions, parse_table_name
    from sinks.postgres.twophase.decisions import ProtocolTables
    from sinks.postgres.twophase.gid import sink_prefix

    assert metrics.sink_id is not None
    with connect(ConnectionOptions(dsn=dsn), autocommit=True, application_name="spark-eos metrics") as conn:
        tables = ProtocolTables(eos_schema)
        if tables.present(conn):
            decision = tables.decision(conn, metrics.sink_id, metrics.batch_id)
            if decision is not None:
                metrics.sink_rows = decision.rows
                if decision.decided_at is not None and decision.published_at is not None:
                    metrics.sink_publish_ms = round(
                        (decision.published_at - decision.decided_at).total_seconds() * 1000, 1
                    )
        if errors_table:
            table = parse_table_name(errors_table, option="errors_table")
            metrics.sink_dead_letters = deadletter.per_batch(conn, table, [metrics.batch_id]).get(metrics.batch_id, 0)
        row = conn.execute(
            "SELECT count(*), COALESCE(EXTRACT(EPOCH FROM now() - min(prepared)), 0) FROM pg_prepared_xacts "
            "WHERE starts_with(gid, %s) AND database = current_database()",
            (sink_prefix(metrics.sink_id),),
        ).fetchone()
        if row is not None:
            metrics.prepared_transactions = int(row[0])
            metrics.prepared_oldest_age_s = round(float(row[1]), 1)


_HELP = {
    "spark_eos_source_records": ("gauge", "records the query read in its last batch"),
    "spark_eos_source_lag_offsets": (
        "gauge",
        "offsets between the topic's end and the last batch's end, per partition",
    ),
    "spark_eos_source_latest_offset_ms": ("gauge", "time to fetch the partitions' end offsets for the last batch"),
    "spark_eos_batch_duration_ms": ("gauge", "duration of the last batch (Spark's triggerExecution)"),
    "spark_eos_batch_id": ("gauge", "id of the last completed batch"),
    "spark_eos_sink_rows": ("gauge", "rows the sink wrote in the last batch"),
    "spark_eos_sink_rows_total": ("counter", "rows the sink wrote since this listener started"),
    "spark_eos_sink_dead_letters": ("gauge", "rows of the last batch diverted to the dead-letter table"),
    "spark_eos_sink_write_ms": ("gauge", "write time of the last batch (Spark's addBatch: tasks and commit)"),
    "spark_eos_sink_publish_ms": ("gauge", "postgres-2pc: from the batch's decision to its last COMMIT PREPARED"),
    "spark_eos_sink_prepared_transactions": ("gauge", "prepared transactions of the sink now"),
    "spark_eos_sink_prepared_oldest_age_seconds": ("gauge", "age of the sink's oldest prepared transaction"),
}


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def prometheus_text(latest: Mapping[str, BatchMetrics], totals: Mapping[str, int] | None = None) -> str:
    """The Prometheus text exposition of the last batch of each query (``latest``: query id -> metrics)."""
    samples: dict[str, list[str]] = {name: [] for name in _HELP}

    def add(name: str, labels: dict[str, str], value: float | int | None) -> None:
        if value is None:
            return
        text = ",".join(f'{k}="{_label(v)}"' for k, v in labels.items())
        samples[name].append(f"{name}{{{text}}} {value}")

    for qid, m in sorted(latest.items()):
        q = {"query": m.query, "query_id": qid}
        add("spark_eos_batch_id", q, m.batch_id)
        add("spark_eos_batch_duration_ms", q, m.batch_ms)
        add("spark_eos_source_records", q, m.source_records)
        add("spark_eos_source_latest_offset_ms", q, m.source_latest_offset_ms)
        for topic, parts in sorted(m.source_lag.items()):
            for p, lag in sorted(parts.items(), key=lambda kv: int(kv[0])):
                add("spark_eos_source_lag_offsets", {**q, "topic": topic, "partition": p}, lag)
        s = {**q, "sink_id": m.sink_id or ""}
        add("spark_eos_sink_rows", s, m.sink_rows)
        add("spark_eos_sink_rows_total", s, (totals or {}).get(qid))
        add("spark_eos_sink_dead_letters", s, m.sink_dead_letters)
        add("spark_eos_sink_write_ms", s, m.sink_write_ms)
        add("spark_eos_sink_publish_ms", s, m.sink_publish_ms)
        add("spark_eos_sink_prepared_transactions", s, m.prepared_transactions)
        add("spark_eos_sink_prepared_oldest_age_seconds", s, m.prepared_oldest_age_s)
    lines: list[str] = []
    for name, (kind, text) in _HELP.items():
        if samples[name]:
            lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}", *samples[name]]
    return "\n".join(lines) + "\n"


class EosMetrics:
    """The exporter behind the listener: ``record(progress)`` per batch; ``text()`` the Prometheus page."""

    def __init__(
        self,
        *,
        dsn: str | None = None,
        sink_id: str | Mapping[str, str] | None = None,
        eos_schema: str = "eos",
        errors_table: str | None = None,
        textfile: str | None = None,
        json_stream: TextIO | None = None,
        http_port: int | None = None,
    ) -> None:
        self.dsn, self.sink_id, self.eos_schema, self.errors_table = dsn, sink_id, eos_schema, errors_table
        self.textfile, self.json_stream = textfile, json_stream
        self.latest: dict[str, BatchMetrics] = {}
        self.totals: dict[str, int] = {}
        self._lock = threading.Lock()
        self.server: Any = None
        self.listener: Any = None  # install(): the registered listener (spark.streams.removeListener(it))
        self.streams: Any = None  # install(): the session's StreamingQueryManager the listener is registered with
        if http_port is not None:
            self.server = _serve(self, http_port)

    def _sink_of(self, progress: Mapping[str, Any]) -> str | None:
        if isinstance(self.sink_id, Mapping):
            return self.sink_id.get(str(progress.get("name"))) or self.sink_id.get(str(progress.get("id")))
        return self.sink_id

    def record(self, progress: Mapping[str, Any]) -> BatchMetrics:
        metrics = from_progress(progress, self._sink_of(progress))
        if self.dsn and metrics.sink_id:
            try:
                _sink_side(metrics, self.dsn, eos_schema=self.eos_schema, errors_table=self.errors_table)
            except Exception as exc:  # metrics never fail the query
                from eos_core.conninfo import scrub

                log.warning(
                    "spark-eos metrics: reading the sink's records failed: %s", scrub(str(exc), conninfo=self.dsn)
                )
        with self._lock:
            self.latest[metrics.query_id] = metrics
            self.totals[metrics.query_id] = self.totals.get(metrics.query_id, 0) + metrics.sink_rows
            text = prometheus_text(self.latest, self.totals)
        line = metrics.to_json()
        if self.json_stream is not None:
            print(line, file=self.json_stream, flush=True)
        else:
            log.info(line)
        if self.textfile:
            tmp = f"{self.textfile}.{os.getpid()}.tmp"
            with open(tmp, "w") as f:
                f.write(text)
            os.replace(tmp, self.textfile)
        return metrics

    def text(self) -> str:
        with self._lock:
            return prometheus_text(self.latest, self.totals)

    def close(self) -> None:
        """Stop serving ``/metrics`` and remove the listener from its session. Over Spark Connect the listener runs
        in the client, on a thread of PySpark's that keeps the process alive until the listener is removed (or
        the session stopped): call this (or ``spark.stop()``) when the job's queries are done."""
        if self.streams is not None and self.listener is not None:
            try:
                self.streams.removeListener(self.listener)
            except Exception:  # a stopped session, a server gone: nothing left to remove it from
                log.debug("spark-eos metrics: the listener could not be removed", exc_info=True)
            self.streams = None
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None


def _serve(metrics: EosMetrics, port: int) -> Any:
    """``GET /metrics`` on 127.0.0.1:``port`` (0: a free port, see ``server.server_address``)."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?")[0] != "/metrics":
                self.send_error(404)
                return
            body = metrics.text().encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_args: Any) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, name="spark-eos-metrics-http", daemon=True).start()
    return server


def install(
    spark: Any,
    *,
    dsn: str | None = None,
    sink_id: str | Mapping[str, str] | None = None,
    eos_schema: str = "eos",
    errors_table: str | None = None,
    textfile: str | None = None,
    json_stream: TextIO | None = None,
    http_port: int | None = None,
) -> EosMetrics:
    """Register the metrics listener on ``spark``; returns the exporter (``.text()``, ``.latest``, ``.close()``).
    On a Spark Connect session the listener runs in the client: ``.close()`` it when the queries are done, or the
    client process does not exit (a thread of PySpark's Connect client waits for the listener's events).

    ``sink_id``: the ``sink.id`` of the session's query, or ``{query name: sink id}`` for several;
    with ``dsn`` the sink's decisions, dead letters (``errors_table``) and prepared transactions are
    read after each batch. ``textfile``: rewrite this Prometheus text file after each batch.
    ``json_stream``: print the JSON lines there instead of logging them on ``spark_eos.metrics``.
    ``http_port``: serve ``/metrics`` on 127.0.0.1 (0 picks a free port).
    """
    from pyspark.sql.streaming.listener import StreamingQueryListener

    exporter = EosMetrics(
        dsn=dsn,
        sink_id=sink_id,
        eos_schema=eos_schema,
        errors_table=errors_table,
        textfile=textfile,
        json_stream=json_stream,
        http_port=http_port,
    )

    class Listener(StreamingQueryListener):
        def onQueryStarted(self, event: Any) -> None:
            return None

        def onQueryProgress(self, event: Any) -> None:
            started = time.monotonic()
            try:
                exporter.record(json.loads(event.progress.json))
            except Exception:  # never let metrics break the query's listener bus
                log.exception("spark-eos metrics: a batch's metrics could not be exported")
            log.debug("spark-eos metrics: exported in %.1f ms", (time.monotonic() - started) * 1000)

        def onQueryIdle(self, event: Any) -> None:
            return None

        def onQueryTerminated(self, event: Any) -> None:
            return None

    exporter.listener = Listener()
    spark.streams.addListener(exporter.listener)
    exporter.streams = spark.streams
    return exporter
