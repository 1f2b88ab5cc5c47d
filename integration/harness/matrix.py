"""One crash-matrix pipeline under test: its topic, table, checkpoint, fault log, runs and checks."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from connectors.toolkit import checker
from connectors.toolkit.harness import Outcome, PipelineProcess, password_apart
from eos_core import faults
from eos_core.privileges import KafkaAcl, distinct

__all__ = ["REPO", "Pipeline"]

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@dataclass
class Pipeline:
    """The runner for one sink against one topic/table, run again and again from one checkpoint."""

    sink: str
    bootstrap: str
    topic: str
    dsn: str  # what the pipeline connects to (maybe a proxy)
    check_dsn: str  # what the checker reads (always direct)
    table: str
    workdir: str
    max_offsets: int = 200
    master: str = "local[2,2]"
    outcomes: list[Outcome] = field(default_factory=list)
    proxy: Any = None  # a TcpProxy between the pipeline and Postgres, when the test needs one
    options: tuple[str, ...] = ()  # sink options key=value of every run (e.g. visibility=partition)
    dead_letters: str | None = None  # the errors.table of the sink, when it diverts refused rows
    kafka_config: str | None = None  # the job's Kafka client properties (an app principal's), if the broker is secured
    remote: str | None = None  # a Spark Connect server (sc://...) the runner runs the query in, as its client

    def __post_init__(self) -> None:
        os.makedirs(self.workdir, exist_ok=True)

    @property
    def checkpoint(self) -> str:
        return os.path.join(self.workdir, "checkpoint")

    @property
    def fault_log(self) -> str:
        return os.path.join(self.workdir, "faults.jsonl")

    @property
    def log_path(self) -> str:
        return os.path.join(self.workdir, "pipeline.log")

    @property
    def sink_id(self) -> str:
        return self.table

    def argv(
        self,
        *,
        trigger: str = "available-now",
        master: str | None = None,
        checkpoint: str | None = None,
        sink_id: str | None = None,
        fail_on_data_loss: str = "true",
        extra: Sequence[str] = (),
        bootstrap: str | None = None,
    ) -> list[str]:
        args = [
            sys.executable,
            "-m",
            "integration.harness.runner",
            "--sink",
            self.sink,
            "--bootstrap",
            bootstrap or self.bootstrap,
            "--topic",
            self.topic,
            "--dsn",
            password_apart(self.dsn)[0],
            "--table",
            self.table,
            "--checkpoint",
            checkpoint or self.checkpoint,
            "--sink-id",
            sink_id or self.sink_id,
            "--max-offsets",
            str(self.max_offsets),
            "--trigger",
            trigger,
            "--master",
            master or self.master,
            "--fail-on-data-loss",
            fail_on_data_loss,
            "--timeout",
            "400",
        ]
        if self.kafka_config:
            args += ["--kafka-config", self.kafka_config]
        if self.remote:
            args += ["--remote", self.remote]
        for kv in (*self.options, *extra):
            args += ["--extra", kv]
        return args

    def kafka_acls(self) -> list[KafkaAcl]:
        """The Kafka ACLs the runner's connectors declare for this pipeline's options (the kafka-eos source's, and
        with ``sink="kafka"`` the kafka-eos sink's): what its principal holds on a secured broker, nothing more.
        The runner's own set-up (the Kafka sink's topic, when missing) is the toolkit's, as EOS_KAFKA_CONFIG's."""
        from sources.kafka.options import parse_options as parse_source
        from sources.kafka.privileges import source_acls

        kafka = {"kafka.bootstrap.servers": self.bootstrap}
        acls = source_acls(parse_source({**kafka, "subscribe": self.topic}, streaming=True))
        if self.sink == "kafka":
            from sinks.kafka.options import parse_options as parse_sink
            from sinks.kafka.privileges import sink_acls

            options = dict(kv.split("=", 1) for kv in self.options)
            raw = {**kafka, **options, "topic": self.table, "sink.id": self.sink_id, "checkpointLocation": "/c"}
            acls += sink_acls(parse_sink(raw, streaming=True))
        return distinct(acls)

    def env(self, fault_spec: str | None, state: str) -> dict[str, str]:
        env = dict(os.environ)
        env.pop(faults.ENV_SPEC, None)
        if fault_spec:
            env[faults.ENV_SPEC] = fault_spec
        env[faults.ENV_LOG] = self.fault_log
        # once/times state per step, never shared with another test that uses the same spec text
        env[faults.ENV_STATE] = os.path.join(self.workdir, "fault-state", state)
        env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
        env.update(password_apart(self.dsn)[1])  # the command line's --dsn has none: ps shows it to everyone
        return env

    def process(
        self, fault_spec: str | None = None, *, state: str | None = None, own_log: bool = False, **argv: Any
    ) -> PipelineProcess:
        """A runner process (not started). ``own_log``: its own log file, for runs side by side
        (a shared log would interleave them and each outcome's tail would show the others)."""
        step = state or f"run{len(self.outcomes)}"
        log = os.path.join(self.workdir, f"pipeline-{step}.log") if own_log else self.log_path
        return PipelineProcess(self.argv(**argv), self.env(fault_spec, step), log, REPO)

    def run(self, fault_spec: str | None = None, *, timeout: float = 420.0, **argv: Any) -> Outcome:
        """Run to its end (drained, killed by a fault, or failed) and record the outcome."""
        out = self.process(fault_spec, **argv).run(timeout)
        self.outcomes.append(out)
        return out

    def fired(self, point: str | None = None, **conditions: Any) -> list[dict[str, Any]]:
        return [
            e
            for e in faults.fired(self.fault_log)
            if (point is None or e.get("point") == point)
            and all(str(e.get(k)) == str(v) for k, v in conditions.items())
        ]

    def report(
        self,
        *,
        expect_faults: Sequence[str] | None = None,
        min_faults: int = 0,
        decisions: bool | None = None,
        aggregates: Mapping[str, Any] | None = None,
    ) -> checker.Report:
        if self.sink == "kafka":
            from connectors.toolkit.topic_checker import verify_topic

            errors = next((kv.split("=", 1)[1] for kv in self.options if kv.startswith("errors.topic=")), None)
            return verify_topic(
                bootstrap=self.bootstrap,
                source_topic=self.topic,
                sink_topic=self.table,
                sink_id=self.sink_id,
                checkpoint=self.checkpoint,
                payload_fields=("key", "amount"),
                errors_topic=errors,
                fault_log=self.fault_log,
                expect_faults=expect_faults,
                min_faults=min_faults,
            )
        stateful = self.sink == "stateful"
        return checker.verify(
            bootstrap=self.bootstrap,
            topic=self.topic,
            dsn=self.check_dsn,
            table="" if stateful else self.table,
            payload_fields=("key", "amount"),
            sink_id=self.sink_id if self.sink == "2pc" else None,
            checkpoint=self.checkpoint,
            decisions=(self.sink == "2pc") if decisions is None else decisions,
            aggregates=aggregates or ({"table": self.table, "key": "key", "value": "amount"} if stateful else None),
            fault_log=self.fault_log,
            expect_faults=expect_faults,
            min_faults=min_faults,
            dead_letters=self.dead_letters,
        )

    def describe(self) -> str:
        runs = ", ".join(str(o) for o in self.outcomes)
        return f"{self.sink} pipeline {self.table} (runs: {runs}); log tail:\n{self.outcomes[-1].log_tail if self.outcomes else ''}"


def pipeline_maker(broker: Any, app: tuple[Any, str | None], dsn: str, workdir: Any, prefix: str) -> Any:
    """``make(fid, max_offsets=N)``: a ``2pc`` pipeline of a module's own broker (or cluster) on a new topic and
    table ``<prefix>_<fid>_<hex>``, run as the module's app principal (``app``: ``module_principal``'s pair),
    which is granted exactly the ACLs the pipeline's connectors declare."""
    import uuid

    principal, properties = app

    def make(fid: str, *, max_offsets: int) -> Pipeline:
        name = f"{prefix}_{fid}_{uuid.uuid4().hex[:8]}"
        where = str(workdir / name)
        pipe = Pipeline("2pc", broker.bootstrap, name, dsn, dsn, name, where, max_offsets, kafka_config=properties)
        if principal is not None:
            broker.grant(principal.name, pipe.kafka_acls())
        return pipe

    return make
