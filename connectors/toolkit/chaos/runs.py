"""The fault loop: the job's runs, each fault of the schedule injected into them, and the log of every run."""

from __future__ import annotations

import json
import os
import re
import sys
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from connectors.toolkit import checker
from connectors.toolkit.app_runner import out_topic_of
from connectors.toolkit.chaos import kinds
from connectors.toolkit.chaos.config import KAFKA_SINK_KINDS, ChaosConfig
from connectors.toolkit.chaos.kit import FaultKit, firings
from connectors.toolkit.chaos.schedule import KillPlan, hold_point, hold_spec, next_batch
from connectors.toolkit.chaos.workload import Producer, Record
from connectors.toolkit.harness import PipelineProcess, describe_exit, password_apart, python_argv
from eos_core import faults
from eos_core.errors import ConfigError

__all__ = [
    "REFUSED_EXIT",
    "FaultLoop",
    "Progress",
    "RunLog",
    "RunState",
    "Runs",
    "drain",
    "raise_refusal",
    "read_runs",
    "repo_root",
    "run_root",
    "runner_argv",
    "steps",
    "wait_for",
]


@dataclass
class RunState:
    """What one chaos run finds and makes as it goes, owned by its experiment (``ChaosConfig`` is what was
    asked): the broker the job's runs use (the one named, or the fault kit's own), the run's source topic and
    table, the user's records (None: the producer makes them as it goes) and how many it writes, the run's
    topics by name (``""`` the main one), what each fault did (``events``), and the reference runs' rows
    (read once; a minimisation's trials reuse them: the same records, no faults)."""

    bootstrap: str
    topic: str
    table: str
    records: int
    workload: list[Record] | None = None
    topics: dict[str, str] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)
    reference_rows: list[list[dict[str, Any]]] | None = None


def repo_root() -> str:
    """The checkout this package runs from (connectors/toolkit/chaos/ -> the checkout), for --pipeline."""
    root = str(Path(__file__).resolve().parents[3])
    if not os.path.exists(os.path.join(root, "integration", "harness", "runner.py")):
        raise SystemExit(
            "chaos pipelines run integration/harness/runner.py from a spark-eos source checkout; "
            f"none found next to {root}. Run chaos from a clone (pip install -e .)."
        )
    return root


class Progress:
    def __init__(self, total: int, enabled: bool) -> None:
        self.total, self.enabled, self.started = total, enabled and sys.stderr.isatty(), time.monotonic()
        self.plain = enabled and not self.enabled
        self.last_plain = 0.0

    def show(self, done: int, text: str) -> None:
        if not (self.enabled or self.plain):
            return
        width = 30
        fill = int(width * done / max(1, self.total))
        line = f"[{'#' * fill}{'.' * (width - fill)}] {done}/{self.total} faults  {text}  {time.monotonic() - self.started:.0f}s"
        if self.enabled:
            sys.stderr.write("\r" + line[:150].ljust(150))
            sys.stderr.flush()
        elif time.monotonic() - self.last_plain > 20 or done == self.total:
            self.last_plain = time.monotonic()
            sys.stderr.write(line + "\n")
            sys.stderr.flush()

    def end(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")


def runner_argv(
    cfg: ChaosConfig,
    state: RunState,
    table: str,
    checkpoint: str,
    trigger: str,
    timeout: float | None = None,
    *,
    dsn: str | None = None,
    master: str | None = None,
    conf: Mapping[str, str] | None = None,
) -> list[str]:
    """The command line of one run of the job writing ``table`` from the run's topics: ``dsn`` the job's (a
    proxy's when Postgres is cut), ``master`` and ``conf`` what the faults need (default: ``cfg.master``,
    nothing)."""
    topic = state.topic
    confs = [a for k, v in (conf or {}).items() for a in ("--conf", f"{k}={v}")]
    dsn_arg, master = password_apart(dsn or cfg.dsn)[0], master or cfg.master
    common = ["--bootstrap", state.bootstrap, "--topic", topic, "--dsn", dsn_arg, "--table", table]
    common += ["--checkpoint", checkpoint, "--max-offsets", str(cfg.max_offsets), "--trigger", trigger]
    common += ["--master", master, "--timeout", str(timeout or cfg.timeout)]
    kafka_config = job_kafka_config(cfg)
    if kafka_config:
        common += ["--kafka-config", kafka_config]
    if not cfg.app:
        return python_argv("integration.harness.runner", "--sink", cfg.pipeline, *common, "--sink-id", table, *confs)
    options = [a for k, v in cfg.options.items() for a in ("--option", f"{k}={v}")]
    options += [a for k, v in state.topics.items() if k for a in ("--topics", f"{k}={v}")]
    if cfg.kafka_sink:
        options += ["--out-topic", out_topic_of(table), "--visibility", KAFKA_SINK_KINDS[cfg.sink_kind]]
    if cfg.connect:
        options.append("--connect")
    return python_argv("connectors.toolkit.app_runner", "--app", cfg.app, *common, *options, *confs)


def job_kafka_config(cfg: ChaosConfig) -> str | None:
    """The Kafka client properties the job runs with: ``--app-kafka-config``, else the toolkit's own
    (``EOS_KAFKA_CONFIG``); on a broker of the run's own (``cfg.bootstrap`` empty) that broker's, which the
    fault kit names in ``EOS_KAFKA_CONFIG`` while it runs (none on a plaintext one; no app principal there)."""
    from eos_core.kafka_config import CONFIG_ENV

    return (cfg.app_kafka_config if cfg.bootstrap else None) or os.environ.get(CONFIG_ENV) or None


def started(proc: PipelineProcess) -> bool:
    return proc.logged("RUNNER STARTED")


def run_root(cfg: ChaosConfig) -> str:
    """Where the pipeline's runner is imported from: the user's project for --app, else the checkout."""
    if cfg.app:
        return os.getcwd()  # the user's module is imported from here (and from PYTHONPATH)
    return repo_root()


class RunLog:
    """Every process of a chaos run, one JSON line each in ``runs.jsonl``: its role (``chaos``, ``drain``,
    ``reference``), pid, start and end (epoch seconds), exit, checkpoint and log; the report's timeline."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.count = 0

    def started(self, proc: PipelineProcess, role: str, checkpoint: str, **extra: Any) -> dict[str, Any]:
        self.count += 1
        return {
            "run": self.count,
            "role": role,
            "pid": proc.pid,
            "start": round(time.time(), 3),
            "checkpoint": checkpoint,
            "log": proc.log_path,
            **extra,
        }

    def ended(self, entry: dict[str, Any], returncode: int | None, ended_by: str) -> None:
        entry.update(end=round(time.time(), 3), exit=describe_exit(returncode), ended_by=ended_by)
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(entry, sort_keys=True) + "\n")


def read_runs(workdir: str) -> list[dict[str, Any]]:
    """The ``runs.jsonl`` of a chaos run's workdir (empty when there is none)."""
    try:
        with open(os.path.join(workdir, "runs.jsonl"), encoding="utf-8") as fh:
            return [json.loads(line) for line in fh if line.strip()]
    except FileNotFoundError:
        return []


@dataclass
class Runs:
    """What the fault loop saw: exits by kind, kill kinds, runs that ended by SIGKILL, each fault's proof."""

    outcomes: Counter[str] = field(default_factory=Counter)
    kinds: Counter[str] = field(default_factory=Counter)
    sigkilled: int = 0
    kill_steps: int = 0
    unreached: list[str] = field(default_factory=list)  # fault points not reached in time: killed from outside
    proofs: list[dict[str, Any]] = field(default_factory=list)  # one per fault that is not a kill
    extra_kills: int = 0  # runs ended by SIGKILL for the next fault's own run, or at the schedule's end


class FaultLoop:
    """The fault loop: runs of the job, each fault of the schedule injected into the live run (a run
    starts when none is live; a ``kill`` kind ends it; a kind armed in a run's environment, ``fresh_run``,
    gets a run of its own)."""

    def __init__(
        self,
        cfg: ChaosConfig,
        state: RunState,
        kit: FaultKit,
        env: dict[str, str],
        root: str,
        producer: Producer,
        runlog: RunLog,
    ) -> None:
        self.cfg, self.state, self.kit, self.env, self.root = cfg, state, kit, env, root
        self.producer, self.runlog = producer, runlog
        self.checkpoint = os.path.join(cfg.workdir, "checkpoint")
        self.fault_log = os.path.join(cfg.workdir, "faults.jsonl")
        self.log_path = os.path.join(cfg.workdir, "pipeline.log")
        # a run may carry several faults: the runner's own timeout (a safety net) covers them all
        self.argv = runner_argv(
            cfg,
            state,
            state.table,
            self.checkpoint,
            "processing:0.5",
            cfg.timeout * (cfg.planned + 2),
            dsn=kit.job_dsn,
            master=kit.master,
            conf=kit.conf,
        )
        self.live: PipelineProcess | None = None
        self.entry: dict[str, Any] = {}
        self.runs = Runs()

    # ---- runs
    def _start(self, faults_spec: str = "", index: int | None = None) -> PipelineProcess:
        run_env = dict(self.env)
        if faults_spec:
            run_env["EOS_FAULTS"] = faults_spec
            run_env["EOS_FAULTS_STATE"] = os.path.join(self.cfg.workdir, "state", str(index))
        proc = PipelineProcess(self.argv, run_env, self.log_path, self.root)
        proc.start()
        self.live = proc
        self.entry = self.runlog.started(
            proc, "chaos", self.checkpoint, master=self.kit.master, faults=faults_spec or None
        )
        return proc

    def _ended(self, proc: PipelineProcess, ended_by: str, timeout: float = 60) -> Any:
        try:
            out = proc.wait(timeout)
        finally:
            if proc.alive():
                proc.stop()
        self.runlog.ended(self.entry, out.returncode, ended_by)
        self.live = None
        raise_refusal(out)  # the job does not fit the run (app_runner said why): stop here, say why
        return out

    def _alive(self) -> PipelineProcess | None:
        if self.live is not None and not self.live.alive():
            self._ended(self.live, "exited by itself")
        return self.live

    def end_live(self, why: str) -> None:
        """SIGKILL the live run's group (the next fault needs a run of its own, or the schedule is over)."""
        proc = self._alive()
        if proc is None:
            return
        proc.kill_group()
        self._ended(proc, why)
        self.runs.extra_kills += 1

    def _commit_after(self, proc: PipelineProcess, before: int | None) -> bool:
        wait_commit_after(proc, self.checkpoint, before, self.cfg.timeout)
        return checker.committed_through(self.checkpoint) > (-1 if before is None else before)

    # ---- one fault
    def step(self, plan: KillPlan) -> dict[str, Any]:
        kind = kinds.KINDS[plan.kind]
        if kind.fresh_run and self._alive() is not None:
            self.end_live(f"SIGKILL: fault {plan.index} ({kind.name}) needs a run of its own")
        if kind.how == "kill":
            return self._kill(plan)
        if kind.how == "held":
            return self._held(plan, kind)
        return self._disturb(plan, kind)

    def _kill(self, plan: KillPlan) -> dict[str, Any]:
        cfg, producer = self.cfg, self.producer
        self.runs.kill_steps += 1
        fresh = self._alive() is None
        spec = plan.spec(checker.last_commit(self.checkpoint)) if plan.point else ""
        proc = self._start(spec, plan.index) if fresh else self.live
        assert proc is not None
        how = plan.kind
        if not plan.point:
            if plan.early and fresh:
                producer.release()
            else:
                # strike while batches flow: after the run's first new commit, so that every
                # restart makes progress even on a slow machine (no livelock of replays)
                before = checker.last_commit(self.checkpoint)
                wait_started(proc, cfg.timeout)
                producer.release()
                wait_commit_after(proc, self.checkpoint, before, cfg.timeout)
            time.sleep(plan.delay)
            proc.kill_group()
        else:
            wait_started(proc, cfg.timeout)  # start-up on a loaded machine can take a minute
            producer.release()  # trickled from now on: the batches up to the fault's batch come
            try:
                proc.wait(90)
            except Exception:  # the point was not reached in time (e.g. no new data): kill from outside
                how = f"{plan.kind}->kill"  # not reached in time: killed from outside
                proc.kill_group()
                self.runs.unreached.append(f"{plan.index}: {spec.split(':action')[0]}")
        out = self._ended(proc, f"fault {plan.index}: {how}" + (f" {plan.point}" if plan.point else ""))
        if out.killed:
            self.runs.sigkilled += 1
        fired = firings(self.fault_log, spec) if spec else []
        ok = out.killed and (not plan.point or bool(fired))
        return {
            "how": how,
            "out": out,
            "ok": ok,
            "spec": spec or None,
            "proof": describe_exit(out.returncode)
            + (f"; {spec.split(':action')[0]} fired (pid {fired[0]['pid']})" if fired else ""),
        }

    def _held(self, plan: KillPlan, kind: kinds.FaultKind) -> dict[str, Any]:
        """A run whose first task at the sink's hold point waits (``kind.hold``) while ``hold.act`` happens
        to it: its executor is killed, or Spark's speculation runs a copy of it elsewhere."""
        assert kind.hold is not None
        cfg, hold = self.cfg, kind.hold
        batch = next_batch(checker.last_commit(self.checkpoint))
        point = hold_point(cfg.points)
        spec = hold_spec(point, batch, hold.seconds, log_others=hold.log_others)
        held_rule, _, others_rule = spec.partition(";")
        proc = self._start(spec, plan.index)
        wait_started(proc, cfg.timeout)
        self.producer.release()
        fired = wait_for(lambda: firings(self.fault_log, held_rule), cfg.timeout, proc.alive)
        proof: dict[str, Any] = {"hold_point": point, "batch": batch, "spec": spec}
        if not fired:
            proof.update(ok=False, proof=f"no task was held at {point} in batch {batch} ({self._status(proc)})")
            self._log(plan, proof)
            return {"how": kind.name, "ok": False, "proof": proof["proof"], "detail": proof}
        held = fired[0]
        acted = hold.act(self.kit, held, others_rule)
        proof.update(acted)
        proof["proof"] = (
            f"task {held.get('partition')} of batch {batch} held at {point} (pid {held.get('pid')}); {acted['proof']}"
        )
        recovered = self._commit_after(proc, batch - 1)
        proof["recovered"] = recovered or not proc.alive()
        self._log(plan, proof)
        return {
            "how": kind.name,
            "ok": bool(proof["ok"]) and proof["recovered"],
            "proof": proof["proof"] + self._after(proc, recovered),
            "detail": proof,
        }

    def _disturb(self, plan: KillPlan, kind: kinds.FaultKind) -> dict[str, Any]:
        cfg = self.cfg
        proc = self._alive() or self._start()
        wait_started(proc, cfg.timeout)
        before = checker.last_commit(self.checkpoint)
        self.producer.release()
        self._commit_after(proc, before)  # batches flow: the fault meets the job at work
        # new records while the fault is on (a kind that wants the job writing into it), and after the heal:
        # the run must get past the fault (a job that kept up during it, as on a cluster that lost a node,
        # would otherwise have nothing left to commit after it)
        proof = self.kit.disturb(kind.name, self.producer.release if kind.feed else lambda: None)
        self.producer.release()
        healed_at = checker.last_commit(self.checkpoint)
        recovered = self._commit_after(proc, healed_at) if proc.alive() else False
        proof["recovered"] = recovered or not proc.alive()
        self._log(plan, proof)
        ok = bool(proof["ok"]) and proof["recovered"]
        return {"how": kind.name, "ok": ok, "proof": proof["proof"] + self._after(proc, recovered), "detail": proof}

    def _after(self, proc: PipelineProcess, recovered: bool) -> str:
        if recovered:
            return "; the job committed a batch after it"
        if not proc.alive():
            return f"; the run then ended ({self._status(proc)}); the next run restarts from the checkpoint"
        return f"; NO batch committed within {self.cfg.timeout:.0f} s after it (the job hangs)"

    def _status(self, proc: PipelineProcess) -> str:
        return describe_exit(proc.proc.poll() if proc.proc is not None else None)

    def _log(self, plan: KillPlan, proof: Mapping[str, Any]) -> None:
        entry = {**proof, "point": f"chaos.{plan.kind}", "action": plan.kind, "fault": plan.index, "pid": os.getpid()}
        faults.append_log(self.fault_log, {**entry, "time": time.time()})

    def finish(self) -> None:
        if self._alive() is not None:
            self.end_live("SIGKILL: the schedule is over; a draining run follows")


def wait_for(predicate: Any, timeout: float, alive: Any) -> Any:
    """Poll ``predicate`` until truthy (its value), ``alive()`` is false or ``timeout`` passes (None)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if not alive():
            return predicate() or None
        time.sleep(0.2)
    return None


def wait_commit_after(proc: PipelineProcess, checkpoint: str, before: int | None, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while checker.committed_through(checkpoint) <= (-1 if before is None else before):
        if not proc.alive() or time.monotonic() > deadline:
            return
        time.sleep(0.2)


def wait_started(proc: PipelineProcess, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not started(proc):
        if not proc.alive() or time.monotonic() > deadline:
            return
        time.sleep(0.2)


def steps(cfg: ChaosConfig, state: RunState, loop: FaultLoop, plans: list[KillPlan], producer: Producer) -> None:
    """Inject each fault of the schedule into the job's runs; what each did goes to ``state.events``."""
    runs, progress = loop.runs, Progress(cfg.planned, cfg.progress)
    for plan in plans:
        step = loop.step(plan)
        how, out = step["how"], step.get("out")
        exit_text = describe_exit(out.returncode) if out is not None else "still running"
        runs.kinds[f"{how}:{plan.point}" if plan.point else how] += 1
        if out is not None:
            runs.outcomes[exit_text] += 1
        else:
            runs.proofs.append({"index": plan.index, "fault": plan.kind, "ok": step["ok"], "proof": step["proof"]})
        state.events.append(
            {
                "kill": plan.index,
                "kind": how,
                "point": plan.point,
                "delay": plan.delay,
                "exit": exit_text,
                "seconds": round(out.seconds, 1) if out is not None else None,
                "fault": plan.kind,
                "ok": step["ok"],
                "proof": step["proof"],
                "run": loop.runlog.count,
            }
        )
        progress.show(
            plan.index + 1,
            f"records {producer.written}/{state.records}  last: {how} {plan.point or ''} -> {exit_text}",
        )
        if producer.error:
            raise producer.error
    loop.finish()
    progress.end()


def drain(cfg: ChaosConfig, state: RunState, kit: FaultKit, env: dict[str, str], root: str, runlog: RunLog) -> Any:
    """The last run: availableNow from the checkpoint until the topic is drained; how it ended. It carries no
    fault, so it runs on the job's own master (``cfg.master``), not on the local-cluster or standalone cluster
    that ``executor-loss`` or ``slow-task`` ran the job's other runs on (executor JVMs of its own to start):
    a restart from the checkpoint on another master with as many task slots, as an operator may do."""
    checkpoint = os.path.join(cfg.workdir, "checkpoint")
    drain = max(cfg.timeout * 3, state.records / 20)  # the backlog left may be large on a slow machine
    argv = runner_argv(cfg, state, state.table, checkpoint, "available-now", drain, dsn=kit.job_dsn, master=cfg.master)
    final = PipelineProcess(argv, env, os.path.join(cfg.workdir, "pipeline.log"), root)
    final.start()
    entry = runlog.started(final, "drain", checkpoint, master=cfg.master)
    try:
        last = final.wait(drain + 60)
    except Exception:
        last = final.stop()
    runlog.ended(entry, last.returncode, "drained" if last.returncode == 0 else "failed")
    raise_refusal(last)
    return last


REFUSED_EXIT = 64  # app_runner's exit when the job does not fit the run (``RUNNER REFUSED: why``)


def raise_refusal(out: Any) -> None:
    """A run the job refused (``app_runner``: RUNNER REFUSED, exit 64; e.g. --sink-kind kafka on a job whose
    sink is not kafka-eos) as a ConfigError with the runner's reason: no later run would fare better."""
    if out is None or out.returncode != REFUSED_EXIT:
        return
    found = re.findall(r"RUNNER REFUSED: ([^\n]*)", out.log_tail or "")
    if found:
        raise ConfigError(found[-1])
