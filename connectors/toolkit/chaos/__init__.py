"""Chaos runs: a job killed N times at random moments and fault points while a producer writes, then checked.

    spark-eos chaos --pipeline 2pc --kills 100 --seed 7 --records 100000 [--json]
    spark-eos chaos --app myjob:build --sink-kind 2pc --kills 5 --payload key,amount
    python -m connectors.toolkit.chaos --pipeline 2pc --kills 5 --seed 1 --records 5000

A package by phase, each module importing only those listed before it:

- ``config``: what was asked (``ChaosConfig``, frozen), the pipelines and sink kinds;
- ``kinds``: one ``FaultKind`` record per ``--faults`` kind, what each needs of the setup, the refusals;
- ``kit``: the ``FaultKit`` that sets up what the kinds drawn need and injects them;
- ``schedule``: the fault points each sink kind passes through, the seeded plan of faults (``KillPlan``);
- ``workload``: the records (the default ones, the user's generator or file) and the producer thread;
- ``inputs``: the one front door (``prepare``): what the command line or the pytest plugin was given,
  checked and refused once, its services found, as a ``ChaosConfig``;
- ``runs``: the fault loop, the job's runs and their log, and a run's ``RunState``;
- ``verdict``: the exact checker on what the run wrote, the run's own checks, the reference oracle;
- ``experiment``: one experiment (``run``), its minimisation, the reproducing command, the files it leaves;
- ``cli``: ``spark-eos chaos`` and ``python -m connectors.toolkit.chaos``;
- ``proxy``, ``cluster``, ``avro``: the TCP proxy of the network faults, the two-host cluster of
  ``slow-task``, Avro record files.

Everything random comes from ``--seed``: the same seed gives the same schedule of kinds, points and delays
(the exact batch a kill hits still depends on timing).
"""

from __future__ import annotations

from connectors.toolkit.chaos.cli import add_subparser, main
from connectors.toolkit.chaos.config import KAFKA_SINK_KINDS, PIPELINES, SINK_KINDS, ChaosConfig
from connectors.toolkit.chaos.experiment import Experiment, conduct, minimise, reproduce_command, run, write_results
from connectors.toolkit.chaos.inputs import CLI_NAMES, PLUGIN_NAMES, prepare
from connectors.toolkit.chaos.kinds import KINDS, FaultKind, parse_faults
from connectors.toolkit.chaos.runs import REFUSED_EXIT, RunState, raise_refusal, read_runs, wait_for
from connectors.toolkit.chaos.schedule import KillPlan, fault_points, plan_kills
from connectors.toolkit.chaos.workload import (
    Record,
    create_topic,
    generate_records,
    load_generator,
    make_records,
    produce_records,
    produce_user_records,
    read_records_file,
    to_record,
    topics_of,
)

__all__ = [
    "CLI_NAMES",
    "KAFKA_SINK_KINDS",
    "KINDS",
    "PIPELINES",
    "PLUGIN_NAMES",
    "REFUSED_EXIT",
    "SINK_KINDS",
    "ChaosConfig",
    "Experiment",
    "FaultKind",
    "KillPlan",
    "Record",
    "RunState",
    "add_subparser",
    "conduct",
    "create_topic",
    "fault_points",
    "generate_records",
    "load_generator",
    "main",
    "make_records",
    "minimise",
    "parse_faults",
    "plan_kills",
    "prepare",
    "produce_records",
    "produce_user_records",
    "raise_refusal",
    "read_records_file",
    "read_runs",
    "reproduce_command",
    "run",
    "to_record",
    "topics_of",
    "wait_for",
    "write_results",
]
