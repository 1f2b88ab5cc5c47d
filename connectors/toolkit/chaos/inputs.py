"""What a chaos run refuses before anything starts: fault kinds that cannot apply to the job's sink or to the
services it was given; the names of the inputs a refusal names (the command line's or the pytest plugin's)."""

from __future__ import annotations

import re
from collections.abc import Mapping

from connectors.toolkit.chaos import kinds
from connectors.toolkit.chaos.config import KAFKA_SINK_KINDS, ChaosConfig
from eos_core.errors import ConfigError

_TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")  # what Kafka accepts as a topic name


# the names of the inputs a refusal names: the command line's, or the pytest plugin's (eos_chaos)
CLI_NAMES = {"sink_kind": "--sink-kind", "faults": "--faults", "dsn": "--dsn", "dead_letters": "--dead-letters"}


PLUGIN_NAMES = {
    "sink_kind": "sink_kind=",
    "faults": "faults=",
    "dsn": "EOS_POSTGRES_DSN",
    "dead_letters": "dead_letters=",
}


def refuse_for_sink_kind(
    sink_kind: str,
    weights: Mapping[str, int],
    *,
    dsn: str | None,
    dead_letters: str | None,
    names: Mapping[str, str] = CLI_NAMES,
) -> None:
    """Refuse (ConfigError naming the input and the fix) what cannot apply to a job writing with the
    ``kafka-eos`` sink (``sink_kind`` kafka / kafka-partition): such a run gives the job no Postgres
    unless ``dsn`` names one, so a Postgres fault has nothing to act on (``pg-restart``, ``pg-crash``,
    ``pg-stop`` never: they need a server spark-eos runs); its dead letters are a Kafka topic."""
    if sink_kind not in KAFKA_SINK_KINDS:
        return
    kind = f"{names['sink_kind']} {sink_kind}"
    for fault in (k for k in (*kinds.PG_SERVER, *kinds.PG_NET) if weights.get(k, 0) > 0):
        if fault in kinds.PG_NET and dsn:
            continue  # a proxy in front of the Postgres the job names (job.dsn): the job may read it
        why = (
            "the run gives the job no Postgres (none is started for a job writing with the kafka-eos sink)"
            if not dsn
            else "it would stop and start a Postgres that the run does not use (the job writes to Kafka)"
        )
        fix = (
            f" (or, to cut the connections of a Postgres your job reads, name it with {names['dsn']})"
            if not dsn
            else ""
        )
        raise ConfigError(
            f"{names['faults']} {fault}: {kind}: {why}; drop {fault}{fix}; the Postgres faults are for jobs that "
            "write to Postgres (2pc, upsert, foreachbatch, other)"
        )
    if dead_letters and not _TOPIC_NAME.fullmatch(dead_letters.replace("{table}", "t")):
        raise ConfigError(
            f"{names['dead_letters']} {dead_letters!r}: with {kind} the dead letters are the sink's errors.topic, "
            "a Kafka topic the run creates: letters, digits, '.', '_' and '-' only (e.g. {table}_dlq)"
        )


def check_fault_setup(cfg: ChaosConfig) -> dict[str, int]:
    weights = cfg.weights
    if cfg.app:  # first: a Kafka sink job's own refusals say more than the general ones
        refuse_for_sink_kind(cfg.sink_kind, weights, dsn=cfg.dsn, dead_letters=cfg.dead_letters)
    kinds.refuse_unsupported(
        weights, kafka_named=cfg.kafka_named, postgres_named=cfg.postgres_named, dsn=cfg.dsn, partitions=cfg.partitions
    )
    server = [k for k in kinds.PG_SERVER if k in weights]
    if server and (cfg.postgres_service is None or getattr(cfg.postgres_service, "kind", "env") == "env"):
        raise ConfigError(
            f"--faults {server[0]}: needs the Postgres service spark-eos runs (ChaosConfig.postgres_service: an "
            "embedded or container one), to stop and start it"
        )
    return weights
