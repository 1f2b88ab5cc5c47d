"""The kill schedule: the fault points each sink kind passes through (derived from what the source and the
sinks declare), and the seeded plan of faults."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from connectors.toolkit.chaos import kinds
from connectors.toolkit.chaos.config import KAFKA_SINK_KINDS, ChaosConfig
from eos_core.faults import FOREACH_BATCH, Points

__all__ = [
    "KillPlan",
    "chunks",
    "declared",
    "fault_points",
    "hold_point",
    "hold_spec",
    "next_batch",
    "plan_kills",
    "planned_kills",
]


def declared(kind: str) -> tuple[Points, Points | None]:
    """The fault points a job of sink kind (or reference pipeline) ``kind`` passes through, as its source and
    its sink declare them (``FAULT_POINTS`` beside their code): the source's, and the sink's (None for a
    job with a sink of its own, ``other``)."""
    from sources.kafka import FAULT_POINTS as source

    if kind == "2pc":
        from sinks.postgres.twophase import FAULT_POINTS as twophase

        return source, twophase
    if kind in ("upsert", "stateful"):  # the stateful pipeline writes through the upsert sink's adapter
        from sinks.postgres.upsert import FAULT_POINTS as upsert

        return source, upsert
    if kind in KAFKA_SINK_KINDS:
        from sinks.kafka import FAULT_POINTS as kafka

        return source, kafka[KAFKA_SINK_KINDS[kind]]
    if kind == "foreachbatch":  # a user's foreachBatch (any writer inside), between app_runner's two points
        return source, FOREACH_BATCH
    if kind == "other":
        return source, None
    raise ValueError(f"{kind!r} is no sink kind or reference pipeline")


def fault_points(kind: str) -> tuple[str, ...]:
    """The points a chaos run's kills draw from for ``kind``: the source's, then the sink's."""
    source, sink = declared(kind)
    return source.kills + (sink.kills if sink else ())


def hold_point(kind: str) -> str:
    """Where a held task waits: the sink's task-side hold point, else the source's read task (every
    kafka-eos job has one)."""
    source, sink = declared(kind)
    hold = (sink.hold if sink else None) or source.hold
    assert hold is not None
    return hold


@dataclass(frozen=True)
class KillPlan:
    """One fault of the schedule. ``kind``: a kind of ``kinds.KINDS`` as ``--faults`` names it: ``kill``
    (a SIGKILL of the group after ``delay`` seconds from the query's start), ``fault-point`` (a fault
    ``point``), ``executor-loss``, ``pg-restart``, ...

    A fault kill fires at the point in the ``skip``-th batch after the last committed one (sink
    points carry the batch id; source points fire in the first batch that reaches them); on a fresh
    checkpoint, from batch 1 (batch 0 runs on the empty topic).
    """

    index: int
    kind: str
    delay: float
    point: str | None = None
    early: bool = False  # a kill during start-up (before the query runs)
    skip: int = 0

    def spec(self, last_commit: int | None) -> str:
        if not self.point:
            return ""
        # on a fresh checkpoint batch 0 is the empty first batch (the query starts before the producer
        # writes): a kill there proves nothing, so the first target is batch 1
        batch = next_batch(last_commit) + self.skip
        cond = f":batch={batch}" if self.point.startswith(("sink.", "pipeline.")) else ""
        return f"{self.point}{cond}:action=kill-group:once"

    def describe(self) -> str:
        return f"{self.index}: {self.kind}" + (f" {self.point}" if self.point else "")


def next_batch(last_commit: int | None) -> int:
    return 1 if last_commit is None else last_commit + 1


def plan_kills(
    pipeline: str, kills: int, seed: int, *, max_delay: float = 4.0, faults: Mapping[str, int] | None = None
) -> list[KillPlan]:
    """The seeded schedule of ``kills`` faults, each kind drawn with the weights of ``faults``
    (``kinds.parse_faults``; default ``kill:1,fault-point:1``: about half SIGKILLs at random
    moments, half random fault points, as every chaos run drew them before ``--faults``)."""
    rng = random.Random(seed)
    points = fault_points(pipeline)
    weights = kinds.parse_faults(faults)
    total = sum(weights.values())
    plans = []
    for i in range(kills):
        u, acc, chosen = rng.random(), 0.0, list(weights)[-1]
        for name, weight in weights.items():
            acc += weight / total
            if u < acc:
                chosen = name
                break
        if chosen == "kill":
            early = rng.random() < 0.15
            delay = rng.uniform(0.5, 10.0) if early else rng.uniform(0.0, max_delay)  # after the 1st new commit
            plans.append(KillPlan(i, chosen, round(delay, 2), early=early))
        elif chosen == "fault-point":
            plans.append(KillPlan(i, chosen, 0.0, point=rng.choice(points), skip=rng.randrange(3)))
        else:
            plans.append(KillPlan(i, chosen, 0.0))
    return plans


def chunks(plans: Sequence[KillPlan]) -> int:
    """Chunks of the records: one per fault (two for a fault from outside: before it and after its heal, and
    a third for a kind fed while it is on) and one for the draining run."""
    return sum(_chunks_of(kinds.KINDS[p.kind]) for p in plans) + 1


def _chunks_of(kind: kinds.FaultKind) -> int:
    return (3 if kind.feed else 2) if kind.from_outside else 1


def hold_spec(point: str, batch: int | None, seconds: float, *, log_others: bool = False) -> str:
    """A fault spec holding the first task at ``point`` (of ``batch``) ``seconds``; ``log_others`` also
    logs every other task that passes the point in that batch (a speculative copy shows there)."""
    cond = f":batch={batch}" if batch is not None else ""
    spec = f"{point}{cond}:action=sleep:seconds={seconds:g}:once"
    if log_others:
        spec += f";{point}{cond}:action=sleep:seconds=0"
    return spec


def planned_kills(cfg: ChaosConfig) -> list[KillPlan]:
    """The seed's kill schedule, or the kills ``cfg.only_kills`` keeps of it (indices stay the seed's)."""
    plans = plan_kills(cfg.points, cfg.kills, cfg.seed, faults=cfg.faults)
    return plans if cfg.only_kills is None else [p for p in plans if p.index in cfg.only_kills]
