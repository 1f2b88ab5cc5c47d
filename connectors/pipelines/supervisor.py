"""``spark-eos run``: start a pipeline, show its progress, restart it by its strategy when it fails.

Progress (one live line on a terminal, else a line every few seconds; JSON lines with
``log.format = "json"``): batch id, input rows/s, batch duration, Kafka lag (latest offsets minus
the batch's end offsets) and the two-phase sink's prepared transactions pending (``ledger`` only:
``balances`` upserts and ``transfers`` writes Kafka transactions, which no progress line counts).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

from connectors.pipelines import PipelineConfig, prepare, session, start
from connectors.pipelines.restart import parse_strategy
from eos_core import faults
from eos_core.conninfo import scrub
from eos_core.errors import error_cause
from eos_core.kafka_config import client_settings

__all__ = ["Log", "kafka_lag", "prepared_pending", "run"]


class Log:
    """Structured logs: ``text`` (``time level event k=v``) or ``json`` (one object per line) on stderr."""

    def __init__(self, fmt: str = "text", out: TextIO | None = None, live: bool = True) -> None:
        self.fmt, self.out = fmt, out or sys.stderr
        self.live = live and fmt == "text" and self.out.isatty()
        self._line_open = False
        self._last_plain = 0.0

    def event(self, event: str, level: str = "info", **fields: Any) -> None:
        self._end_line()
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
        if self.fmt == "json":
            self.out.write(json.dumps({"ts": stamp, "level": level, "event": event, **fields}, default=str) + "\n")
        else:
            kv = " ".join(f"{k}={v}" for k, v in fields.items())
            self.out.write(f"{stamp} {level:<5} {event} {kv}".rstrip() + "\n")
        self.out.flush()

    def progress(self, **fields: Any) -> None:
        if self.fmt == "json":
            self.event("progress", **fields)
            return
        text = (
            f"batch {fields.get('batch')}  {fields.get('rows_per_s', 0):>8.1f} rows/s  "
            f"duration {fields.get('duration_ms', 0)} ms  lag {fields.get('kafka_lag', '?')}  "
            f"prepared {fields.get('prepared', '-')}  committed {fields.get('committed_rows', 0)} rows"
        )
        if self.live:
            self.out.write("\r" + text.ljust(110))
            self.out.flush()
            self._line_open = True
        elif time.monotonic() - self._last_plain > 5:
            self._last_plain = time.monotonic()
            self.event("progress", **fields)

    def _end_line(self) -> None:
        if self._line_open:
            self.out.write("\n")
            self._line_open = False


def kafka_lag(bootstrap: str, end_offsets: str | dict[str, Any] | None, kafka_config: str = "") -> int | None:
    """Records in Kafka beyond the batch's end offsets (``{"topic": {"0": n}}``); None if unknown.
    ``kafka_config``: the cluster's client properties (default: those ``EOS_KAFKA_CONFIG`` names)."""
    if not end_offsets:
        return None
    ends = json.loads(end_offsets) if isinstance(end_offsets, str) else end_offsets
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            **client_settings(kafka_config or None),
            "bootstrap.servers": bootstrap,
            "group.id": "spark-eos-lag",
            "enable.auto.commit": False,
        }
    )
    try:
        lag = 0
        for topic, parts in ends.items():
            for part, off in parts.items():
                _, high = consumer.get_watermark_offsets(TopicPartition(topic, int(part)), timeout=5)
                lag += max(0, high - int(off))
        return lag
    except Exception:
        return None
    finally:
        consumer.close()


def prepared_pending(dsn: str, sink_id: str) -> int | None:
    """Prepared transactions of ``sink_id`` right now (their gids start with ``eos:<escaped sink id>:``)."""
    try:
        import psycopg

        from sinks.postgres.twophase.gid import sink_prefix

        with psycopg.connect(dsn, autocommit=True, connect_timeout=5) as conn:
            row = conn.execute(
                "SELECT count(*) FROM pg_prepared_xacts WHERE starts_with(gid, %s) AND database = current_database()",
                (sink_prefix(sink_id),),
            ).fetchone()
            return int(row[0]) if row else 0
    except Exception:
        return None


def _watch(query: Any, cfg: PipelineConfig, log: Log, on_batch: Callable[[], None], poll: float) -> None:
    last_batch = -1
    committed = 0
    while query.isActive:
        query.awaitTermination(poll)
        fresh = [p for p in (query.recentProgress or []) if p.get("batchId", -1) > last_batch]
        if not fresh:
            continue
        progress = fresh[-1]
        last_batch = progress["batchId"]
        rows = sum(int(p.get("numInputRows") or 0) for p in fresh)
        committed += rows
        if rows:
            on_batch()
        sources = progress.get("sources") or [{}]
        log.progress(
            batch=last_batch,
            rows=rows,
            rows_per_s=float(progress.get("processedRowsPerSecond") or 0.0),
            duration_ms=(progress.get("durationMs") or {}).get("triggerExecution", 0),
            kafka_lag=kafka_lag(cfg.bootstrap, sources[0].get("endOffset"), cfg.kafka_config),
            prepared=prepared_pending(cfg.dsn, cfg.effective_sink_id) if cfg.pipeline == "ledger" else "-",
            committed_rows=committed,
        )


def run(
    cfg: PipelineConfig,
    *,
    log: Log | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    poll: float = 1.0,
) -> int:
    """Run ``cfg`` until it ends (available-now drained: 0) or the restart strategy gives up (2)."""
    # executor Python workers get their own process group from PySpark's daemon: a kill-group fault
    # must take the pipeline's whole group (driver, JVM, workers), like a machine losing power. Set
    # only while the pipeline runs: a caller that runs it in-process (tests) must not keep it.
    previous = os.environ.get(faults.ENV_PGID)
    os.environ[faults.ENV_PGID] = str(os.getpgrp())
    try:
        return _run(cfg, log=log, clock=clock, sleep=sleep, poll=poll)
    finally:
        if previous is None:
            os.environ.pop(faults.ENV_PGID, None)
        else:
            os.environ[faults.ENV_PGID] = previous


def _master_of(spark: Any, cfg: PipelineConfig) -> str:
    """The master the session runs on (spark-submit's when the config names none)."""
    try:
        return str(spark.sparkContext.master)
    except AttributeError:  # a stand-in session
        return cfg.master or "local[*]"


def _run(
    cfg: PipelineConfig, *, log: Log | None, clock: Callable[[], float], sleep: Callable[[float], None], poll: float
) -> int:
    log = log or Log(cfg.log_format, live=cfg.progress)
    strategy = parse_strategy(cfg.restart)
    prepare(cfg)
    spark = session(cfg)
    restarts = 0
    target = {"sink_topic": cfg.sink_topic} if cfg.pipeline == "transfers" else {"table": cfg.table}
    log.event(
        "pipeline.start",
        pipeline=cfg.pipeline,
        topic=cfg.topic,
        **target,
        checkpoint=cfg.checkpoint,
        trigger=cfg.trigger,
        master=_master_of(spark, cfg),
        restart=str(strategy),
    )
    while True:
        error: BaseException | None = None
        try:
            query = start(spark, cfg)
            log.event("query.started", id=query.id, run_id=query.runId, restarts=restarts)
            _watch(query, cfg, log, lambda: strategy.on_healthy(clock()), poll)
            error = query.exception()
        except Exception as exc:  # a query that cannot even start (e.g. Kafka unreachable)
            error = exc
        if error is None:
            log.event("pipeline.done", pipeline=cfg.pipeline, restarts=restarts)
            return 0
        # the error text carries the query's plan: Spark redacts it (connectors.register), and a
        # password of the pipeline's dsn is taken out here too before anything is logged
        message = scrub(str(error), conninfo=cfg.dsn).replace("\n", " ")[:2000]
        cause = scrub(error_cause(error), conninfo=cfg.dsn)[:1000]  # our error's line, not Spark's wrapping
        delay = strategy.on_failure(clock())
        if delay is None:
            log.event(
                "pipeline.failed", level="error", error=cause, detail=message, restarts=restarts, strategy=str(strategy)
            )
            print(
                f"error: pipeline {cfg.pipeline} failed and the restart strategy {strategy} gives up: {cause}",
                file=sys.stderr,
            )
            return 2
        restarts += 1
        log.event("pipeline.restart", level="warn", error=cause[:500], delay_s=delay, restart=restarts)
        sleep(delay)
        # like Flink restarting the job: a fresh SparkContext (and Python workers), nothing carried over
        # from the failed attempt (no cached plan, connection or Python worker of the old query)
        try:
            spark.stop()
        except Exception as exc:  # a context that died with the query; the new one is what matters
            log.event("spark.stop_failed", level="warn", error=scrub(str(exc), conninfo=cfg.dsn)[:300])
        spark = session(cfg)
