"""What a chaos run left, checked: the exact checker on the table or topic, the run's own checks (every fault
happened, the drain ended), and the reference-run oracle's verdict."""

from __future__ import annotations

import dataclasses
import os
from collections import Counter
from typing import Any

from connectors.toolkit import checker, oracle
from connectors.toolkit.app_runner import out_topic_of, sink_id_of
from connectors.toolkit.chaos.config import KAFKA_SINK_KINDS, ChaosConfig
from connectors.toolkit.chaos.runs import RunLog, Runs, RunState, runner_argv
from connectors.toolkit.chaos.workload import make_out_topics
from connectors.toolkit.harness import PipelineProcess, describe_exit
from eos_core import faults

__all__ = ["checked", "output_rows", "reference_verdict", "verify_output", "written"]


def verify_output(cfg: ChaosConfig, state: RunState, checkpoint: str) -> checker.Report:
    """The exact checker for what the run wrote: a Kafka sink job's topic (``topic_checker.verify_topic``:
    read back read_committed, by record id against the source or, with the oracle, only its end state; no
    transaction of the sink left open; the sink's last marker = Spark's last commits/n; its markers of the
    visibility the --sink-kind names), else the table (``checker.verify``)."""
    codec = cfg.codec  # --value-format avro: the topics' values read with the registry's deserializer
    try:
        return _verify_output(cfg, state, checkpoint, codec.decode if codec is not None else None)
    finally:
        if codec is not None:
            codec.close()


def _verify_output(cfg: ChaosConfig, state: RunState, checkpoint: str, decode: Any) -> checker.Report:
    topic, table = state.topic, state.table
    if cfg.kafka_sink:
        from connectors.toolkit.topic_checker import verify_topic

        return verify_topic(
            bootstrap=state.bootstrap,
            source_topic=topic,
            sink_topic=out_topic_of(table),
            sink_id=sink_id_of(table),
            checkpoint=checkpoint,
            id_field=cfg.id_field,
            payload_fields=cfg.payload_fields,
            errors_topic=cfg.dead_letters_for(table),
            records=not cfg.oracle,
            visibility=KAFKA_SINK_KINDS[cfg.sink_kind],
            decode=decode,
        )
    is_2pc = cfg.points == "2pc"
    return checker.verify(
        bootstrap=state.bootstrap,
        topic=topic,
        dsn=cfg.dsn,
        table="" if cfg.pipeline == "stateful" or cfg.oracle else table,
        id_field=cfg.id_field,
        payload_fields=cfg.payload_fields if cfg.app else ("key", "amount"),
        sink_id=sink_id_of(table) if is_2pc else None,
        checkpoint=checkpoint,
        decisions=is_2pc,
        aggregates={"table": table, "key": "key", "value": "amount"} if cfg.pipeline == "stateful" else None,
        dead_letters=cfg.dead_letters_for(table),
        decode=decode,
    )


def checked(
    cfg: ChaosConfig, state: RunState, checkpoint: str, fault_log: str, runs: Runs, last: Any
) -> checker.Report:
    """The checker's report on the chaos run's end state, plus its own checks (every fault happened, the drain ended)."""
    report = verify_output(cfg, state, checkpoint)
    fault_kills = sum(1 for e in faults.fired(fault_log) if e.get("action") == "kill-group")
    if state.workload is not None:  # the user's records (with --oracle, not JSON for the checker: not "poison")
        report.info["source_records"] = len(state.workload)
        if cfg.oracle:
            report.info.pop("poison_records", None)
    if runs.kill_steps:
        # a fault point that was never reached (its run killed from outside after 90 s) proves nothing
        unreached = runs.unreached
        report.add(
            checker.Check(
                "chaos.kills",
                runs.sigkilled == runs.kill_steps and runs.sigkilled > 0 and not unreached,
                f"{runs.sigkilled} of {runs.kill_steps} planned kills ended the pipeline by SIGKILL "
                f"({fault_kills} from fault points, logged)"
                + (
                    f"; {len(unreached)} fault points NOT reached (killed from outside instead): the batch they "
                    "aim at never ran"
                    if unreached
                    else ""
                ),
                {
                    "planned": runs.kill_steps,
                    "sigkilled": runs.sigkilled,
                    "fault_point_kills": fault_kills,
                    **({"unreached": len(unreached)} if unreached else {}),
                },
                {"unreached": unreached} if unreached else {},
            )
        )
    if runs.proofs:
        bad = [p for p in runs.proofs if not p["ok"]]
        by_kind = Counter(p["fault"] for p in runs.proofs)
        report.add(
            checker.Check(
                "chaos.faults",
                not bad,
                f"{len(runs.proofs) - len(bad)} of {len(runs.proofs)} faults other than kills proven in the "
                f"fault log and followed by a commit or a restart ({', '.join(f'{k} {n}' for k, n in sorted(by_kind.items()))})",
                {
                    "planned": len(runs.proofs),
                    "proven": len(runs.proofs) - len(bad),
                    **dict(by_kind),
                },
                {"unproven": [f"{p['index']}: {p['fault']}: {p['proof']}" for p in bad]},
            )
        )
    report.add(
        checker.Check(
            "chaos.final_run",
            last.returncode == 0,
            f"the draining run ended with {describe_exit(last.returncode)} after {last.seconds:.0f}s",
            {"returncode": last.returncode},
        ),
    )
    return report


def written(cfg: ChaosConfig, table: str) -> str:
    """What the run writing ``table`` writes, as a report names it: the table, or a Kafka sink job's topic."""
    return f"topic {out_topic_of(table)}" if cfg.kafka_sink else table


def output_rows(cfg: ChaosConfig, bootstrap: str, table: str) -> list[dict[str, Any]]:
    """What the run writing ``table`` left, as the oracle compares it: the table's rows, or a Kafka sink
    job's topic read read_committed (``topic_checker.topic_rows``; with ``upsert``, each key's last record)."""
    if cfg.kafka_sink:
        from connectors.toolkit.topic_checker import topic_rows

        latest = cfg.oracle_key if cfg.oracle == "upsert" else None
        codec = cfg.codec
        try:
            return topic_rows(
                bootstrap, out_topic_of(table), latest_by=latest, decode=codec.decode if codec is not None else None
            )
        finally:
            if codec is not None:
                codec.close()
    import psycopg

    with psycopg.connect(cfg.dsn, autocommit=True) as conn:
        return checker.read_table(conn, table)


def reference_verdict(
    cfg: ChaosConfig, state: RunState, env: dict[str, str], root: str, runlog: RunLog | None = None
) -> checker.Report:
    """The oracle's report on the chaos run's table against ``cfg.reference_runs`` runs of the job without
    any fault (``state.reference_rows`` once read: a minimisation's trials reuse them)."""
    if state.reference_rows is None:
        tables = _reference_runs(cfg, state, env, root, runlog)
        if isinstance(tables, checker.Report):
            return tables  # a reference run failed: nothing to judge against
        state.reference_rows = [output_rows(cfg, state.bootstrap, t) for t in tables]
    else:
        tables = []
    got = output_rows(cfg, state.bootstrap, state.table)
    report = oracle.judge(
        got,
        state.reference_rows,
        mode=cfg.oracle or "append",
        key=cfg.oracle_key,
        tolerance=cfg.tolerance,
        ignore=cfg.ignore_columns,
        table=written(cfg, state.table),
    )
    report.info["sink_rows"] = len(got)
    if tables and cfg.kafka_sink:
        report.info["reference_topics"] = [out_topic_of(t) for t in tables]
    elif tables:
        report.info["reference_tables"] = tables
    return report


def _reference_runs(
    cfg: ChaosConfig, state: RunState, env: dict[str, str], root: str, runlog: RunLog | None
) -> list[str] | checker.Report:
    """Run the job ``cfg.reference_runs`` times without any fault, on the same topics, each from a fresh
    checkpoint with availableNow into ``<table>_ref<i>``: the tables (topics) written, or a CANNOT JUDGE
    report when one of them failed."""
    clean = {k: v for k, v in env.items() if k not in ("EOS_FAULTS", "EOS_FAULTS_STATE")}
    # the whole workload in one batch (the job's result must not depend on how it is batched; the
    # chaos run batched it its own way already), which keeps a reference run short
    one_batch = dataclasses.replace(cfg, max_offsets=max(cfg.max_offsets, state.records * len(state.topics or "x")))
    drain = max(cfg.timeout * 3, state.records / 20)
    tables = []
    for i in range(1, cfg.reference_runs + 1):
        ref_table = f"{state.table}_ref{i}"
        make_out_topics(cfg, state.bootstrap, ref_table)
        ref_checkpoint = os.path.join(cfg.workdir, f"reference{i}", "checkpoint")
        log = os.path.join(cfg.workdir, f"reference{i}.log")
        argv = runner_argv(one_batch, state, ref_table, ref_checkpoint, "available-now", drain)
        proc = PipelineProcess(argv, clean, log, root)
        if runlog is None:
            out = proc.run(drain + 60)
        else:
            proc.start()
            entry = runlog.started(proc, "reference", ref_checkpoint, table=ref_table)
            try:
                out = proc.wait(drain + 60)
            except Exception:
                out = proc.stop()
            runlog.ended(entry, out.returncode, "drained" if out.returncode == 0 else "failed")
        if out.returncode != 0:
            return checker.Report(
                checks=[
                    checker.Check(
                        "oracle.reference_run",
                        False,
                        f"{oracle.CANNOT_JUDGE}: reference run {i} (no faults) ended with "
                        f"{describe_exit(out.returncode)}; see {log}",
                    )
                ],
                info={"verdict": oracle.CANNOT_JUDGE},
            )
        tables.append(ref_table)
    return tables
