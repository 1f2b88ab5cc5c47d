"""One chaos experiment: its services for the faults, the fault loop, the drain, the verdict; the minimisation of
a failing one, the command that reproduces it, and the files it leaves."""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from connectors.toolkit import checker, oracle
from connectors.toolkit.app_runner import out_topic_of
from connectors.toolkit.chaos import kinds
from connectors.toolkit.chaos.config import ChaosConfig
from connectors.toolkit.chaos.kit import FaultKit
from connectors.toolkit.chaos.runs import FaultLoop, RunLog, Runs, RunState, drain, run_root, steps
from connectors.toolkit.chaos.schedule import chunks, plan_kills, planned_kills
from connectors.toolkit.chaos.verdict import checked, reference_verdict
from connectors.toolkit.chaos.workload import Producer, create_topic, load, make_out_topics, topics_of
from connectors.toolkit.harness import password_apart
from eos_core.kafka_config import CONFIG_ENV

__all__ = ["Experiment", "conduct", "minimise", "reproduce_command", "run", "write_results"]


class Experiment:
    """A chaos experiment on ``cfg`` and the trials of its minimisation. It owns each run's ``RunState``
    (``state``: the last run's) and the reference runs' rows, read once and reused by every trial."""

    def __init__(self, cfg: ChaosConfig) -> None:
        self.cfg = cfg
        self.state: RunState | None = None
        self.references: list[list[dict[str, Any]]] | None = None

    def run(self, cfg: ChaosConfig | None = None) -> checker.Report:
        """Run ``cfg`` (default: the experiment's own; a trial passes its own) and return the report."""
        cfg = cfg or self.cfg
        root = run_root(cfg)
        tag = f"chaos_{cfg.pipeline}_{cfg.seed}_{int(time.time())}"
        os.makedirs(cfg.workdir, exist_ok=True)
        workload = load(cfg)
        state = RunState(
            bootstrap=cfg.bootstrap,
            topic=tag,
            table=tag,
            records=cfg.records if workload is None else len(workload),
            workload=workload,
            reference_rows=self.references,
        )
        self.state = state
        fault_log = os.path.join(cfg.workdir, "faults.jsonl")
        env = dict(
            os.environ, EOS_FAULTS_LOG=fault_log, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", "")
        )
        env.update(password_apart(cfg.dsn)[1])  # the runs' --dsn carries no password (runner_argv)
        env.pop("EOS_FAULTS", None)
        if cfg.schema_registry:  # the job's registry (job.registry_options): never on a command line (user:password@)
            from connectors.services.schema_registry import URL_ENV

            env[URL_ENV] = cfg.schema_registry
        kit = FaultKit(
            cfg.faults,
            bootstrap=cfg.bootstrap,
            dsn=cfg.dsn,
            postgres=cfg.postgres_service,
            env=env,
            workdir=cfg.workdir,
            master=cfg.master,
        )
        with kit:
            if kit.cluster is not None:  # our cluster's executors run on this machine: this interpreter
                env.setdefault("PYSPARK_PYTHON", sys.executable)
            state.bootstrap = kit.bootstrap  # a broker of the run's own when the faults need one
            if kit.kafka_config is not None:  # ... and its client properties, in the jobs' environment too
                env.pop(CONFIG_ENV, None)
                env.update({CONFIG_ENV: kit.kafka_config} if kit.kafka_config else {})
            report = _run_with(cfg, state, kit, env, root)
        self.references = state.reference_rows
        report.info.update(
            {
                **({"faults": kinds.format_faults(cfg.faults)} if dict(cfg.faults) != kinds.DEFAULT else {}),
                **({"master": kit.master} if kit.master != cfg.master else {}),
                **({"own_broker": kit.broker.security} if kit.broker is not None else {}),  # its listener
                **({"kafka_nodes": len(kit.broker.nodes)} if hasattr(kit.broker, "nodes") else {}),  # a cluster's
            }
        )
        return report

    def minimise(self, report: checker.Report) -> dict[str, Any]:
        """Re-run a failing seed dropping its kills one at a time (a kill stays dropped when the run still
        fails without it); the smallest failing schedule, each kill's kind and point, and the command that
        reproduces it, also put in ``report.info["minimised"]``. Trials reuse the reference runs' rows."""
        cfg = self.cfg
        keep = [p.index for p in planned_kills(cfg)]
        trials: list[dict[str, Any]] = []
        for index in list(keep):
            if len(keep) == 1:
                break
            trial = [k for k in keep if k != index]
            tcfg = dataclasses.replace(
                cfg,
                only_kills=tuple(trial),
                progress=False,
                workdir=os.path.join(cfg.workdir, f"minimise-{len(trials)}"),
            )
            result = self.run(tcfg)
            fails = not result.ok and result.info.get("verdict") != oracle.CANNOT_JUDGE
            trials.append({"kills": trial, "fails": fails, "workdir": tcfg.workdir})
            if fails:
                keep = trial
        plans = {p.index: p for p in plan_kills(cfg.points, cfg.kills, cfg.seed, faults=cfg.faults)}
        found = {
            "kills": keep,
            "schedule": [plans[i].describe() for i in keep],
            "trials": trials,
            "command": reproduce_command(cfg, keep),
        }
        report.info["minimised"] = found
        return found


def run(cfg: ChaosConfig) -> checker.Report:
    """Run the chaos experiment described by ``cfg`` and return the checker's report."""
    return Experiment(cfg).run()


def minimise(cfg: ChaosConfig, report: checker.Report) -> dict[str, Any]:
    """``Experiment.minimise`` of a run of ``cfg`` that failed with ``report``."""
    return Experiment(cfg).minimise(report)


def conduct(cfg: ChaosConfig) -> checker.Report:
    """What ``spark-eos chaos`` and ``eos_chaos`` do with a prepared config: run it, minimise it when it failed
    and ``cfg.minimise`` asks, leave ``report.json`` and ``events.jsonl`` in the workdir, and ``report.html``
    and ``junit.xml`` in ``cfg.report_dir``."""
    experiment = Experiment(cfg)
    report = experiment.run()
    assert experiment.state is not None
    events = experiment.state.events
    if cfg.minimise and not report.ok and report.info.get("verdict") != oracle.CANNOT_JUDGE:
        if cfg.progress:
            print(f"minimising: re-running seed {cfg.seed} dropping kills one at a time", file=sys.stderr)
        experiment.minimise(report)
    write_results(report, cfg.workdir, events)
    if cfg.report_dir:
        from connectors.toolkit import report as report_files

        written = report_files.write(
            report, cfg.workdir, cfg.report_dir, command=reproduce_command(cfg, cfg.only_kills)
        )
        if cfg.progress:
            print(f"report: {' '.join(written)}", file=sys.stderr)
    return report


def _run_with(cfg: ChaosConfig, state: RunState, kit: FaultKit, env: dict[str, str], root: str) -> checker.Report:
    codec = cfg.codec  # one per run: the producer's thread and the registrations; closed with the run
    try:
        return _run_with_codec(cfg, state, kit, env, root, codec)
    finally:
        if codec is not None:
            codec.close()


def _run_with_codec(
    cfg: ChaosConfig, state: RunState, kit: FaultKit, env: dict[str, str], root: str, codec: Any
) -> checker.Report:
    checkpoint = os.path.join(cfg.workdir, "checkpoint")
    fault_log = os.path.join(cfg.workdir, "faults.jsonl")
    plans = planned_kills(cfg)
    state.topics = topics_of(state.workload or [], state.topic)
    for name in state.topics.values():
        create_topic(state.bootstrap, name, cfg.partitions)
        if codec is not None:  # --value-format avro: the subject exists before the job plans (it reads latest)
            codec.register(name)
    make_out_topics(cfg, state.bootstrap, state.table)
    runlog = RunLog(os.path.join(cfg.workdir, "runs.jsonl"))
    # chunks of the records released over the run (one per fault, two around a fault from outside,
    # one for the draining run), each trickled while its run goes on
    producer = Producer(
        state.bootstrap,
        state.topic,
        records=state.records,
        chunks=chunks(plans),
        checkpoint=checkpoint,
        workload=state.workload,
        topics=state.topics,
        seed=cfg.seed,
        partitions=cfg.partitions,
        timeout=cfg.timeout,
        codec=codec,
    )
    started = time.monotonic()
    producer.start()
    loop = FaultLoop(cfg, state, kit, env, root, producer, runlog)
    try:
        steps(cfg, state, loop, plans, producer)
    except BaseException:
        producer.stop()  # a refused job or an error: the producer writes no more
        raise
    producer.release(every=True)
    producer.done.wait()
    if producer.error:
        raise producer.error
    last = drain(cfg, state, kit, env, root, runlog)
    wall = time.monotonic() - started
    if cfg.dsn:
        import psycopg

        with psycopg.connect(cfg.dsn, autocommit=True):
            pass
    report = checked(cfg, state, checkpoint, fault_log, loop.runs, last)
    if cfg.oracle:
        report.extend(reference_verdict(cfg, state, env, root, runlog))
    report.info.update(_run_info(cfg, state, loop.runs, runlog.count, wall))
    return report


def _run_info(cfg: ChaosConfig, state: RunState, runs: Runs, processes: int, wall: float) -> dict[str, Any]:
    """The run's figures in the report: what ran, how often it restarted, how fast."""
    return {
        "pipeline": cfg.pipeline,
        **({"app": cfg.app, "sink_kind": cfg.sink_kind} if cfg.app else {}),
        **({"out_topic": out_topic_of(state.table)} if cfg.kafka_sink else {}),
        "seed": cfg.seed,
        "records": state.records,
        "kills": cfg.planned,
        "restarts": processes - 1,  # the chaos runs and the draining run, less the first
        **({"only_kills": list(cfg.only_kills)} if cfg.only_kills is not None else {}),
        "kill_kinds": dict(sorted(runs.kinds.items())),
        "exits": dict(runs.outcomes),
        **({"extra_kills": runs.extra_kills} if runs.extra_kills else {}),
        "wall_seconds": round(wall, 1),
        "records_per_second": round(state.records / wall, 1),
        "workdir": cfg.workdir,
        "topic": state.topic,
        "table": state.table,
    }


def reproduce_command(cfg: ChaosConfig, kills: Sequence[int] | None) -> str:
    """The ``spark-eos chaos`` command that re-runs ``cfg`` with only ``kills`` of its schedule (None: all)."""
    gen = cfg.generator
    if callable(gen):
        gen = f"{gen.__module__}:{gen.__qualname__}"
    argv = ["spark-eos", "chaos", *(("--app", cfg.app) if cfg.app else ("--pipeline", cfg.pipeline))]
    if cfg.app:
        argv += ["--sink-kind", cfg.sink_kind]
    argv += [
        *(("--generator", gen) if gen else ()),
        *(("--records-file", cfg.records_file) if cfg.records_file else ()),
    ]
    argv += ["--seed", str(cfg.seed), "--kills", str(cfg.kills)]
    argv += ["--only-kills", ",".join(map(str, kills))] if kills is not None else []
    if dict(cfg.faults) != kinds.DEFAULT:
        argv += ["--faults", kinds.format_faults(cfg.faults)]
    argv += ["--records", str(cfg.records), "--partitions", str(cfg.partitions), "--max-offsets", str(cfg.max_offsets)]
    if cfg.oracle:
        argv += ["--oracle", cfg.oracle + (":" + ",".join(cfg.oracle_key) if cfg.oracle_key else "")]
        argv += [*(("--tolerance", repr(cfg.tolerance)) if cfg.tolerance else ())]
        argv += [*(("--ignore-columns", ",".join(cfg.ignore_columns)) if cfg.ignore_columns else ())]
    if cfg.app and cfg.id_field != "id":
        argv += ["--id-field", cfg.id_field]
    if cfg.payload_fields:
        argv += ["--payload", ",".join(cfg.payload_fields)]
    if cfg.dead_letters:
        argv += ["--dead-letters", cfg.dead_letters]
    if cfg.app_kafka_config:
        argv += ["--app-kafka-config", cfg.app_kafka_config]
    if cfg.value_format != "json":  # the registry itself stays EOS_SCHEMA_REGISTRY_URL's: it may hold a password
        argv += ["--value-format", cfg.value_format, *(("--schema", cfg.schema_file) if cfg.schema_file else ())]
    argv += [a for k, v in cfg.options.items() for a in ("--option", f"{k}={v}")]
    return shlex.join(argv)


def write_results(report: checker.Report, workdir: str, events: Sequence[Mapping[str, Any]]) -> None:
    """Leave ``report.json`` and ``events.jsonl`` (one line per fault: kind, point, exit) in ``workdir``."""
    report.info["events"] = len(events)
    with open(os.path.join(workdir, "report.json"), "w", encoding="utf-8") as fh:
        fh.write(report.to_json())
    with open(os.path.join(workdir, "events.jsonl"), "w", encoding="utf-8") as fh:
        fh.writelines(json.dumps(dict(e)) + "\n" for e in events)
