"""Named fault points: off unless EOS_FAULTS or a connector's ``faults`` option enables them.

A spec is one or more rules separated by ``;``, each ``point[:key=value]...[:once]``, e.g.::

    sink.after_prepare:batch=3:partition=0:action=kill-group:once

Keys other than the reserved ones below are conditions, compared as strings with the context the
code passes at the point (``batch``, ``partition``, ``attempt``, ``k`` ...). Reserved keys:

- ``action``: ``raise`` (default; raises FaultInjected), ``kill`` (SIGKILL this process),
  ``kill-group`` (SIGKILL the process group named by EOS_FAULTS_PGID, else this process's group:
  the driver JVM, its Python workers and the query process all go at once), ``exit`` (``os._exit(code)``, code from ``code=``, default 17),
  ``sleep`` (``seconds=``, default 5; a stall).
- ``once``: fire on the first match only, across processes; ``times=N``: at most N times.

Every firing is first appended (and fsynced) to the JSON-lines file named by EOS_FAULTS_LOG, so
a test can prove that the fault it asked for really happened, even when the action kills the
process. ``once``/``times`` state lives in EOS_FAULTS_STATE (default: a directory under the
system temp dir keyed by the spec), because the process that fires is often the one it kills.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from eos_core.errors import ConfigError, EosError

__all__ = [
    "ENV_LOG",
    "ENV_PGID",
    "ENV_SPEC",
    "ENV_STATE",
    "FOREACH_BATCH",
    "POINTS",
    "FaultInjected",
    "FaultRule",
    "Points",
    "append_log",
    "around_batch",
    "fired",
    "parse_spec",
    "point",
]

ENV_SPEC = "EOS_FAULTS"
ENV_LOG = "EOS_FAULTS_LOG"
ENV_STATE = "EOS_FAULTS_STATE"
ENV_PGID = "EOS_FAULTS_PGID"

POINTS: dict[str, str] = {
    "source.plan": "driver, after the source computed a batch's end offsets (latestOffset)",
    "source.read.start": "executor, before a Kafka read task polls its first record",
    "source.read.mid": "executor, after a Kafka read task yielded half of its range",
    "sink.before_write": "executor, before a sink task writes its first row",
    "sink.after_write": "executor, rows written (Kafka: in the task's transaction, rows=transaction, or staged, rows=staged), "
    "before PREPARE / COMMIT of the task transaction",
    "sink.after_prepare": "executor, after PREPARE TRANSACTION, before the task returns",
    "sink.commit.before_decision": "driver, in commit(), before the decision row is written (Kafka: before the publish)",
    "sink.commit.after_decision": "driver, decision durable, before any COMMIT PREPARED",
    "sink.commit.after_k": "driver, after k of the batch's COMMIT PREPAREDs (condition k=)",
    "sink.after_commit": "driver, every gid committed (Kafka: the publish committed), before Spark writes commits/n",
    "sink.task.after_commit": "executor, Kafka sink visibility=partition: the task's transaction (rows + marker) "
    "committed, before the task returns",
    "sink.publish.mid": "driver, Kafka sink visibility=batch: k staged records published into the open "
    "transaction (condition k=)",
    "pipeline.batch": "driver, in a foreachBatch pipeline before the batch is written",
}
ACTIONS = ("raise", "kill", "kill-group", "exit", "sleep")


@dataclass(frozen=True)
class Points:
    """The fault points a connector fires, as the connector declares them beside its code (``FAULT_POINTS``
    of each sink and of the source; a test checks that the code fires exactly these): ``fired``, in the
    order one batch meets them; ``hold``, the task-side one a task waits at when a chaos run holds it (it
    has done its work and not yet returned); ``drawn``, the ones a chaos run's kills draw from (default:
    all). The chaos toolkit and the demo derive their lists from these."""

    fired: tuple[str, ...]
    hold: str | None = None
    drawn: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        unknown = [
            p for p in (*self.fired, *(self.drawn or ()), *([self.hold] if self.hold else [])) if p not in POINTS
        ]
        if unknown:
            raise ValueError(f"unknown fault points {unknown}")
        if (self.hold and self.hold not in self.fired) or not set(self.drawn or ()) <= set(self.fired):
            raise ValueError(f"hold {self.hold!r} and drawn {self.drawn} must be among fired {self.fired}")

    @property
    def kills(self) -> tuple[str, ...]:
        """The points a chaos run's kills draw from."""
        return self.fired if self.drawn is None else self.drawn

    def from_hold(self) -> tuple[str, ...]:
        """The drawn points from the hold point on (all of them without one): where a batch's work is done
        and not yet committed."""
        if self.hold is None:
            return self.kills
        after = self.fired[self.fired.index(self.hold) :]
        return tuple(p for p in self.kills if p in after)


FOREACH_BATCH = Points(("pipeline.batch", "sink.after_commit"))
"""What ``around_batch`` fires: the points around a foreachBatch function, on the driver."""


def around_batch(func: Callable[[Any, int], Any]) -> Callable[[Any, int], None]:
    """``func`` (a foreachBatch function) between two fault points, on the driver: ``pipeline.batch`` before
    it runs and ``sink.after_commit`` after it returned, before Spark writes ``commits/n`` (the moment a
    non-idempotent foreachBatch write is replayed). Both carry ``batch=batch_id``."""

    def run_batch(df: Any, batch_id: int) -> None:
        point("pipeline.batch", batch=batch_id)
        func(df, batch_id)
        point("sink.after_commit", batch=batch_id)

    run_batch.__name__ = getattr(func, "__name__", "foreach_batch")
    return run_batch


_RESERVED = {"action", "once", "times", "code", "seconds"}


class FaultInjected(EosError):
    """Raised by a fault point whose action is ``raise``."""


@dataclass(frozen=True)
class FaultRule:
    point: str
    conditions: tuple[tuple[str, str], ...] = ()
    action: str = "raise"
    times: int | None = None  # None: every match
    code: int = 17
    seconds: float = 5.0
    text: str = field(default="", compare=False)

    def matches(self, name: str, context: dict[str, object]) -> bool:
        if name != self.point:
            return False
        return all(k in context and str(context[k]) == v for k, v in self.conditions)

    @property
    def key(self) -> str:
        return hashlib.sha1(self.text.encode()).hexdigest()[:16]


def parse_spec(spec: str) -> tuple[FaultRule, ...]:
    """Parse a fault spec; unknown points, actions or malformed parts are ConfigErrors."""
    rules = []
    for text in (part.strip() for part in spec.replace("\n", ";").split(";")):
        if not text:
            continue
        name, *parts = text.split(":")
        name = name.strip()
        if name not in POINTS:
            raise ConfigError(
                f"fault spec {text!r}: unknown fault point {name!r}; known points: {', '.join(sorted(POINTS))}",
                option="faults",
            )
        conditions: list[tuple[str, str]] = []
        kwargs: dict[str, object] = {}
        for part in parts:
            part = part.strip()
            if part == "once":
                kwargs["times"] = 1
                continue
            if "=" not in part:
                raise ConfigError(
                    f"fault spec {text!r}: part {part!r} is neither 'once' nor key=value", option="faults"
                )
            k, v = (s.strip() for s in part.split("=", 1))
            if k == "action":
                if v not in ACTIONS:
                    raise ConfigError(
                        f"fault spec {text!r}: unknown action {v!r}; expected one of {', '.join(ACTIONS)}",
                        option="faults",
                    )
                kwargs["action"] = v
            elif k in ("times", "code"):
                if not v.isdigit():
                    raise ConfigError(f"fault spec {text!r}: {k} must be a whole number, got {v!r}", option="faults")
                kwargs[k] = int(v)
            elif k == "seconds":
                try:
                    kwargs[k] = float(v)
                except ValueError:
                    raise ConfigError(
                        f"fault spec {text!r}: seconds must be a number, got {v!r}", option="faults"
                    ) from None
            else:
                conditions.append((k, v))
        rules.append(FaultRule(point=name, conditions=tuple(conditions), text=text, **kwargs))  # type: ignore[arg-type]
    return tuple(rules)


@lru_cache(maxsize=32)
def _rules(spec: str) -> tuple[FaultRule, ...]:
    return parse_spec(spec)


def _state_dir(spec: str) -> str:
    path = os.environ.get(ENV_STATE) or os.path.join(
        tempfile.gettempdir(), "eos-faults-" + hashlib.sha1(spec.encode()).hexdigest()[:12]
    )
    os.makedirs(path, exist_ok=True)
    return path


def _claim(rule: FaultRule, spec: str) -> bool:
    """Take one of the rule's firings; False when all are used. Safe across processes (O_EXCL)."""
    if rule.times is None:
        return True
    state = _state_dir(spec)
    for i in range(rule.times):
        try:
            fd = os.open(os.path.join(state, f"{rule.key}.{i}"), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            continue
        os.close(fd)
        return True
    return False


def _log(rule: FaultRule, name: str, context: dict[str, object]) -> None:
    path = os.environ.get(ENV_LOG)
    if not path:
        return
    entry = {"point": name, "rule": rule.text, "action": rule.action, "pid": os.getpid(), "time": time.time()}
    entry.update({k: v if isinstance(v, (int, float, str, bool)) or v is None else str(v) for k, v in context.items()})
    append_log(path, entry)


def append_log(path: str, entry: Mapping[str, Any]) -> None:
    """Append one JSON line to the fault log at ``path`` and fsync it: a firing here, or a fault the chaos
    toolkit injects from outside (``connectors.toolkit.chaos.kinds``)."""
    line = (json.dumps(dict(entry), sort_keys=True, default=str) + "\n").encode()
    fd = os.open(path, os.O_CREAT | os.O_APPEND | os.O_WRONLY, 0o644)
    try:
        os.write(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)


def point(name: str, *, spec: str | None = None, **context: object) -> None:
    """Fire the first enabled rule for ``name`` that matches ``context``; a no-op when none is set.

    ``spec`` is a connector's ``faults`` option; the EOS_FAULTS environment variable adds to it.
    """
    if name not in POINTS:
        raise ValueError(f"unknown fault point {name!r}")  # a programming error, not user input
    specs = [s for s in (spec, os.environ.get(ENV_SPEC)) if s]
    for one in specs:
        for rule in _rules(one):
            if rule.matches(name, context) and _claim(rule, one):
                _log(rule, name, context)
                _act(rule, name, context)
                return


def _act(rule: FaultRule, name: str, context: dict[str, object]) -> None:
    if rule.action == "raise":
        raise FaultInjected(f"fault injected at {name} ({rule.text})", point=name)
    if rule.action == "sleep":
        time.sleep(rule.seconds)
        return
    if rule.action == "exit":
        os._exit(rule.code)
    if rule.action == "kill-group":
        # PySpark's daemon moves executor Python workers into a process group of their own, so a
        # pipeline names its group in EOS_FAULTS_PGID: a fault in a worker then takes the whole
        # query (driver, JVM, every worker) down, as the action promises.
        target = os.environ.get(ENV_PGID)
        os.killpg(int(target) if target else os.getpgrp(), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(60)  # SIGKILL is asynchronous: never run past the point


def fired(log_path: str) -> list[dict[str, object]]:
    """The firings recorded in a fault log (empty when the file does not exist)."""
    try:
        with open(log_path, encoding="utf-8") as fh:
            return [json.loads(line) for line in fh if line.strip()]
    except FileNotFoundError:
        return []
