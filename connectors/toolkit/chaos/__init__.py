"""Chaos runs: a job killed N times at random moments and fault points while a producer writes, then checked.

    spark-eos chaos --pipeline 2pc --kills 100 --seed 7 --records 100000 [--json]
    spark-eos chaos --app myjob:build --sink-kind 2pc --kills 5 --payload key,amount
    python -m connectors.toolkit.chaos --pipeline 2pc --kills 5 --seed 1 --records 5000

A package by phase, each module importing only those listed before it:

- ``config``: what was asked (``ChaosConfig``), the pipelines and sink kinds;
- ``kinds``: the fault kinds of ``--faults`` and the kit that injects them (``FaultKit``);
- ``inputs``: what a run refuses before anything starts;
- ``schedule``: the fault points each sink kind passes through, the seeded plan of faults;
- ``workload``: the records (the default ones, the user's generator or file) and the producer thread;
- ``runs``: the fault loop, the job's runs and their log;
- ``verdict``: the exact checker on what the run wrote, the run's own checks, the reference oracle;
- ``experiment``: one run of it all (``run``), minimisation, the reproducing command, the results;
- ``cli``: ``spark-eos chaos`` and ``python -m connectors.toolkit.chaos``;
- ``proxy``, ``cluster``, ``avro``: the TCP proxy of the network faults, the two-host cluster of
  ``slow-task``, Avro record files.

Everything random comes from ``--seed``: the same seed gives the same schedule of kinds, points and delays
(the exact batch a kill hits still depends on timing).
"""

from __future__ import annotations

from connectors.toolkit.chaos.cli import add_subparser, main
from connectors.toolkit.chaos.config import KAFKA_SINK_KINDS, PIPELINES, SINK_KINDS, ChaosConfig
from connectors.toolkit.chaos.experiment import minimise, reproduce_command, run, write_results
from connectors.toolkit.chaos.inputs import CLI_NAMES, PLUGIN_NAMES, refuse_for_sink_kind
from connectors.toolkit.chaos.runs import REFUSED_EXIT, raise_refusal, read_runs, wait_for
from connectors.toolkit.chaos.schedule import FAULT_POINTS, KillPlan, plan_kills
from connectors.toolkit.chaos.workload import (
    Record,
    create_topic,
    generate_records,
    load_generator,
    load_workload,
    make_records,
    produce_records,
    produce_user_records,
    read_records_file,
    to_record,
    topics_of,
)

__all__ = [
    "CLI_NAMES",
    "FAULT_POINTS",
    "KAFKA_SINK_KINDS",
    "PIPELINES",
    "PLUGIN_NAMES",
    "REFUSED_EXIT",
    "SINK_KINDS",
    "ChaosConfig",
    "KillPlan",
    "Record",
    "add_subparser",
    "create_topic",
    "generate_records",
    "load_generator",
    "load_workload",
    "main",
    "make_records",
    "minimise",
    "plan_kills",
    "produce_records",
    "produce_user_records",
    "raise_refusal",
    "read_records_file",
    "read_runs",
    "refuse_for_sink_kind",
    "reproduce_command",
    "run",
    "to_record",
    "topics_of",
    "wait_for",
    "write_results",
]
