"""One chaos experiment: set up, the fault loop, the drain, the verdict; minimisation and the reproducing command."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

from connectors.toolkit import checker, oracle
from connectors.toolkit.app_runner import out_topic_of
from connectors.toolkit.chaos import kinds
from connectors.toolkit.chaos.config import ChaosConfig
from connectors.toolkit.chaos.inputs import check_fault_setup
from connectors.toolkit.chaos.runs import FaultLoop, RunLog, drain, run_root, steps
from connectors.toolkit.chaos.schedule import KillPlan, chunks, plan_kills, planned_kills
from connectors.toolkit.chaos.verdict import checked, reference_verdict
from connectors.toolkit.chaos.workload import Producer, create_topic, load_workload, make_out_topics, topics_of
from connectors.toolkit.harness import password_apart


def run(cfg: ChaosConfig) -> checker.Report:
    """Run the chaos experiment described by ``cfg`` and return the checker's report."""
    root = run_root(cfg)
    weights = check_fault_setup(cfg)
    tag = f"chaos_{cfg.pipeline}_{cfg.seed}_{int(time.time())}"
    topic, table = tag, tag
    os.makedirs(cfg.workdir, exist_ok=True)
    fault_log = os.path.join(cfg.workdir, "faults.jsonl")
    load_workload(cfg)
    plans = planned_kills(cfg)
    env = dict(os.environ, EOS_FAULTS_LOG=fault_log, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.update(password_apart(cfg.dsn)[1])  # the runs' --dsn carries no password (runner_argv)
    env.pop("EOS_FAULTS", None)
    with kinds.FaultKit(
        weights, bootstrap=cfg.bootstrap, dsn=cfg.dsn, postgres=cfg.postgres_service, env=env, workdir=cfg.workdir
    ) as kit:
        if kit.cluster is not None:  # our cluster's executors run on this machine: this interpreter
            env.setdefault("PYSPARK_PYTHON", sys.executable)
        named = cfg.bootstrap
        cfg.bootstrap = kit.bootstrap  # a broker of the run's own when the faults need one
        try:
            report = run_with(cfg, kit, plans, env, topic, table, root)
        finally:
            cfg.bootstrap = named
    report.info.update(
        {
            **({"faults": kinds.format_faults(weights)} if weights != kinds.DEFAULT else {}),
            **({"master": kit.master} if kit.master != cfg.master else {}),
        }
    )
    return report


def run_with(
    cfg: ChaosConfig,
    kit: kinds.FaultKit,
    plans: list[KillPlan],
    env: dict[str, str],
    topic: str,
    table: str,
    root: str,
) -> checker.Report:
    import psycopg

    checkpoint = os.path.join(cfg.workdir, "checkpoint")
    fault_log = os.path.join(cfg.workdir, "faults.jsonl")
    cfg.topics = topics_of(cfg.workload or [], topic)
    for name in cfg.topics.values():
        create_topic(cfg.bootstrap, name, cfg.partitions)
    make_out_topics(cfg, table)
    runlog = RunLog(os.path.join(cfg.workdir, "runs.jsonl"))
    # chunks of the records released over the run (one per fault, two around a fault from outside,
    # one for the draining run), each trickled while its run goes on
    producer = Producer(cfg, topic, chunks(plans), checkpoint)
    started = time.monotonic()
    producer.start()
    loop = FaultLoop(cfg, kit, env, topic, table, root, producer, runlog)
    runs = loop.runs
    try:
        steps(cfg, loop, plans, producer)
    except BaseException:
        producer.stop()  # a refused job or an error: the producer writes no more
        raise
    producer.release(every=True)
    producer.done.wait()
    if producer.error:
        raise producer.error
    last = drain(cfg, kit, env, topic, table, root, runlog)
    processes = runlog.count  # the chaos runs and the draining run
    wall = time.monotonic() - started
    if cfg.dsn:
        with psycopg.connect(cfg.dsn, autocommit=True):
            pass
    report = checked(cfg, topic, table, checkpoint, fault_log, runs, last)
    if cfg.oracle:
        report.extend(reference_verdict(cfg, topic, table, env, root, runlog))
    report.info.update(
        {
            "pipeline": cfg.pipeline,
            **({"app": cfg.app, "sink_kind": cfg.sink_kind} if cfg.app else {}),
            **({"out_topic": out_topic_of(table)} if cfg.kafka_sink else {}),
            "seed": cfg.seed,
            "records": cfg.records,
            "kills": cfg.planned,
            "restarts": processes - 1,
            **({"only_kills": list(cfg.only_kills)} if cfg.only_kills is not None else {}),
            "kill_kinds": dict(sorted(runs.kinds.items())),
            "exits": dict(runs.outcomes),
            **({"extra_kills": runs.extra_kills} if runs.extra_kills else {}),
            "wall_seconds": round(wall, 1),
            "records_per_second": round(cfg.records / wall, 1),
            "workdir": cfg.workdir,
            "topic": topic,
            "table": table,
        }
    )
    return report


def reproduce_command(cfg: ChaosConfig, kills: Sequence[int] | None) -> str:
    """The ``spark-eos chaos`` command that re-runs ``cfg`` with only ``kills`` of its schedule (None: all)."""
    import shlex

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
    if cfg.weights != kinds.DEFAULT:
        argv += ["--faults", kinds.format_faults(cfg.weights)]
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
    argv += [a for k, v in cfg.options.items() for a in ("--option", f"{k}={v}")]
    return shlex.join(argv)


def minimise(cfg: ChaosConfig, report: checker.Report) -> dict[str, Any]:
    """Re-run a failing seed dropping its kills one at a time (a kill stays dropped when the run
    still fails without it); the smallest failing schedule, each kill's kind and point, and the
    command that reproduces it. Trials reuse the reference runs' tables (same records, no faults).
    Also put in ``report.info["minimised"]``."""
    keep = [p.index for p in planned_kills(cfg)]
    trials: list[dict[str, Any]] = []
    for index in list(keep):
        if len(keep) == 1:
            break
        trial = [k for k in keep if k != index]
        tcfg = dataclasses.replace(
            cfg,
            only_kills=tuple(trial),
            events=[],
            progress=False,
            workdir=os.path.join(cfg.workdir, f"minimise-{len(trials)}"),
        )
        tcfg.workload, tcfg.topics = None, {}
        result = run(tcfg)
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


def write_results(report: checker.Report, cfg: ChaosConfig) -> None:
    """Leave ``report.json`` and ``events.jsonl`` (one line per kill: kind, point, exit) in the workdir."""
    report.info["events"] = len(cfg.events)
    with open(os.path.join(cfg.workdir, "report.json"), "w", encoding="utf-8") as fh:
        fh.write(report.to_json())
    with open(os.path.join(cfg.workdir, "events.jsonl"), "w", encoding="utf-8") as fh:
        fh.writelines(json.dumps(e) + "\n" for e in cfg.events)
