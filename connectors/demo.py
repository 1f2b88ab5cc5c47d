"""``spark-eos demo``: the three reference pipelines, killed and restarted, then the exactly-once verdict.

1. Kafka and Postgres: what EOS_KAFKA_BOOTSTRAP / EOS_POSTGRES_DSN name, else embedded processes.
2. A topic of seeded payment events (progress bar), keyed by account.
3. ``ledger`` (two-phase commit), ``balances`` (keyed state -> upsert) and ``transfers`` (Kafka ->
   Kafka through the ``kafka-eos`` sink) run side by side, each as ``spark-eos run`` in its own
   process group, from TOML configs written to the work dir. The demo kills them ``--kills`` times
   in total, round-robin over the pipelines, alternating a SIGKILL of the whole process group at a
   random moment and a random protocol fault point (the group kills itself there), and restarts
   each from its checkpoint.
4. A last run of each drains the topic (available-now); the checkers compare the ledger and the
   transfers topic with the source topic record by record, recompute every balance, find each
   malformed record once in each pipeline's dead letters, check that no prepared transaction and
   no Kafka transaction is left open and that each sink's decision log or marker ends where
   Spark's commit log ends. Exit 0 only if all hold.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Kill", "fault_points", "main", "plan"]

TRACKS = ("ledger", "transfers", "balances")
"""The pipelines, in the order the kill schedule deals kills to them."""

SINK_KINDS = {"ledger": "2pc", "transfers": "kafka", "balances": "foreachbatch"}
"""What each pipeline writes with, as the chaos toolkit names it: postgres-2pc, the kafka-eos sink at its default
visibility=batch, and the upsert sink's adapter inside a foreachBatch between two driver-side points."""


def fault_points(name: str) -> tuple[str, ...]:
    """The points the demo's fault kills draw from for pipeline ``name``, from what its sink and the source
    declare: the sink's from its hold point on (a task's rows written, the driver's decision and publish,
    before Spark's commits/n: the moments whose recovery the demo shows), then mid-read in the source."""
    from connectors.toolkit.chaos.schedule import declared

    source, sink = declared(SINK_KINDS[name])
    assert sink is not None
    return sink.from_hold() + source.kills


PUBLISH_MID_ROWS = 200
"""sink.publish.mid is drawn only when a batch may hold this many records (it fires at the 100th)."""


@dataclass(frozen=True)
class Kill:
    pipeline: str
    kind: str  # "kill" | "fault-point", as the chaos toolkit's --faults names them
    point: str = ""
    skip: int = 0
    delay: float = 0.0

    def spec(self, last_commit: int | None) -> str:
        batch = (-1 if last_commit is None else last_commit) + 1 + self.skip
        cond = "" if self.point.startswith("source.") else f":batch={batch}"
        return f"{self.point}{cond}:action=kill-group:once"

    def label(self) -> str:
        return "SIGKILL (process group)" if self.kind == "kill" else f"fault {self.point}"


def kills_of(kills: int, name: str) -> int:
    """How many of ``kills`` the schedule deals to pipeline ``name`` (round-robin over TRACKS)."""
    i = TRACKS.index(name)
    return len(range(i, kills, len(TRACKS)))


def batch_rows(records: int, kills: int) -> int:
    """max_offsets_per_trigger of a pipeline killed ``kills`` times: enough batches that every kill
    lands mid-stream."""
    return max(20, records // (4 * (kills + 1)))


def plan(kills: int, seed: int, records: int = 6000) -> dict[str, list[Kill]]:
    """The seeded kill schedule: round-robin over ledger, transfers, balances; alternating a SIGKILL and
    a fault point, so 6 kills give each pipeline one of each."""
    rng = random.Random(seed)
    out: dict[str, list[Kill]] = {name: [] for name in TRACKS}
    for i in range(kills):
        name = TRACKS[i % len(TRACKS)]
        if i % 2 == 0:
            out[name].append(Kill(name, "kill", delay=round(rng.uniform(0.0, 2.0), 2)))
        else:
            points = fault_points(name)
            if batch_rows(records, kills_of(kills, name)) < PUBLISH_MID_ROWS:
                points = tuple(p for p in points if p != "sink.publish.mid")
            out[name].append(Kill(name, "fault-point", point=rng.choice(points), skip=rng.randrange(2)))
    return out


@dataclass
class Track:
    """What happened to one pipeline during the demo."""

    name: str
    kills: list[dict[str, Any]] = field(default_factory=list)
    recoveries: int = 0
    seconds: float = 0.0
    final: str = ""
    final_ok: bool = False
    error: str = ""


class Bar:
    def __init__(self, total: int, label: str) -> None:
        self.total, self.label, self.tty = total, label, sys.stderr.isatty()
        self.last = -1

    def show(self, done: int) -> None:
        pct = int(100 * done / max(1, self.total))
        if self.tty:
            fill = pct * 30 // 100
            sys.stderr.write(f"\r  {self.label} [{'#' * fill}{'.' * (30 - fill)}] {done}/{self.total}")
            sys.stderr.flush()
        elif pct // 25 != self.last // 25:
            sys.stderr.write(f"  {self.label}: {done}/{self.total}\n")
        self.last = pct

    def end(self) -> None:
        if self.tty:
            sys.stderr.write("\n")


POISON = (b"{not json", b"\x00\xffbinary", b"[1, 2]", b"", b'"a string"')
"""Malformed records the demo mixes into the topic: none is a JSON object."""


def say(text: str) -> None:
    print(text, flush=True)


def _config(
    path: str,
    name: str,
    bootstrap: str,
    topic: str,
    dsn: str,
    table: str,
    checkpoint: str,
    max_offsets: int,
    kafka_config: str = "",
) -> None:
    """The pipeline's TOML config; ``table`` is the output topic for transfers (which has no dsn);
    ``kafka_config``: the app principal's client properties on a secured Kafka."""
    sink = f'topic = "{table}"' if name == "transfers" else f'dsn = "{dsn}"\ntable = "{table}"'
    body = f"""# written by spark-eos demo
pipeline = "{name}"

[source]
bootstrap = "{bootstrap}"
kafka_config = "{kafka_config}"
topic = "{topic}"
max_offsets_per_trigger = {max_offsets}

[sink]
{sink}
sink_id = "{table}"

[spark]
master = "local[2,2]"
trigger = "1s"
checkpoint = "{checkpoint}"
shuffle_partitions = 2

[restart]
strategy = "none"

[balances]
ttl = "1d"
last_n = 5
"""
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(body)


def _drive(
    track: Track,
    kills: list[Kill],
    cfg_path: str,
    checkpoint: str,
    workdir: str,
    timeout: float,
    secrets: dict[str, str] | None = None,
) -> None:
    from connectors.toolkit import checker
    from connectors.toolkit.harness import PipelineProcess, describe_exit, python_argv

    name = track.name
    log_path = os.path.join(workdir, f"{name}.log")
    base_env = dict(os.environ, EOS_FAULTS_LOG=os.path.join(workdir, f"faults-{name}.jsonl"), **(secrets or {}))
    base_env.pop("EOS_FAULTS", None)
    argv = python_argv("connectors.cli", "run", name, "--config", cfg_path, "--no-progress")
    started = time.monotonic()
    try:
        for i, kill in enumerate(kills):
            env = dict(base_env)
            before = checker.last_commit(checkpoint)
            if kill.kind == "fault-point":
                env["EOS_FAULTS"] = kill.spec(before)
                env["EOS_FAULTS_STATE"] = os.path.join(workdir, "fault-state", f"{name}-{i}")
            proc = PipelineProcess(argv, env, log_path).start()
            how = kill.label()
            try:
                if kill.kind == "kill":
                    # let it make progress first (a restart must really resume), then pull the plug
                    deadline = time.monotonic() + timeout
                    target = (-1 if before is None else before) + 2  # two new batches: real progress
                    while (
                        proc.alive() and time.monotonic() < deadline and checker.committed_through(checkpoint) < target
                    ):
                        time.sleep(0.2)
                    time.sleep(kill.delay)
                    proc.kill_group()
                else:
                    try:
                        proc.wait(timeout)
                    except Exception:
                        how += " (not reached; SIGKILL instead)"
                        proc.kill_group()
                out = proc.wait(60)
            finally:
                if proc.alive():
                    proc.stop()
            after = checker.last_commit(checkpoint)
            if i > 0 and after != before:
                track.recoveries += 1  # the previous kill's restart resumed and committed new batches
            track.kills.append(
                {
                    "how": how,
                    "exit": describe_exit(out.returncode),
                    "killed": out.killed,
                    "commits": f"{before} -> {after}",
                }
            )
        before = checker.last_commit(checkpoint)
        final = PipelineProcess([*argv, "--trigger", "available-now"], base_env, log_path)
        out = final.run(timeout * 2)
        after = checker.last_commit(checkpoint)
        if kills and after != before:
            track.recoveries += 1
        track.final, track.final_ok = describe_exit(out.returncode), out.returncode == 0
        if out.returncode != 0:
            track.error = out.log_tail[-1500:]
    except Exception as exc:  # reported in the verdict; the demo must fail loudly, not hang
        track.error = f"{type(exc).__name__}: {exc}"
    finally:
        track.seconds = time.monotonic() - started


def _services(stack: list[Any]) -> tuple[Any, str, str]:
    """The services the demo runs on, secured as users deploy them when embedded: Apache Kafka with SASL_SSL
    and ACLs (the demo's own clients as its admin, through ``EOS_KAFKA_CONFIG``; the pipelines as an app
    principal, ``_app_principal``) and TLS Postgres with an app role. -> (kafka, dsn, what)."""
    from connectors import services
    from eos_core.kafka_config import CONFIG_ENV

    t = time.monotonic()
    secured = {}
    if services.choose("kafka") == "embedded" and services.embedded_kafka_kind() == "apache":
        secured["security"] = services.embedded_kafka_security(default="sasl_ssl")
    kafka = services.kafka(**secured)
    stack.append(kafka)
    properties = kafka.client_properties() if getattr(kafka, "secured", False) else None
    if properties is not None:
        os.environ[CONFIG_ENV] = str(properties)  # the demo's producer, topic admin and checkers: the admin
    pg = services.postgres()
    stack.append(pg)
    version = getattr(kafka, "version", None)  # the embedded Apache Kafka's
    broker = " (tansu)" if kafka.is_tansu else (f" (Apache Kafka {version})" if version else "")
    if properties is not None:
        broker += ", SASL_SSL + ACLs, the pipelines as an app principal"
    dsn, shown = pg.dsn, pg.dsn_redacted
    if pg.kind == "embedded" and pg.secured:
        from connectors.services.pg_security import owner_grants
        from eos_core.conninfo import redact_dsn

        # the pipelines run as an app role, as users deploy them: it owns the tables they make, nothing else
        # (a Postgres the user named is not given roles)
        role = pg.add_role(f"eos_demo_{os.getpid()}_{int(time.time())}", owner_grants())
        dsn, shown = role.dsn, f"{redact_dsn(role.dsn)} (an app role, not a superuser)"
    what = (
        f"Kafka {kafka.kind}{broker} at {kafka.bootstrap}; Postgres {pg.kind} at {shown} ({time.monotonic() - t:.1f}s)"
    )
    return kafka, dsn, what


def _row(label: str, value: Any, ok: bool | None = None) -> str:
    mark = "" if ok is None else ("  ok" if ok else "  FAIL")
    return f"  {label:<22} {value}{mark}"


def _check_args(args: argparse.Namespace) -> None:
    for opt in ("records", "partitions"):
        if getattr(args, opt) < 1:
            raise SystemExit(f"spark-eos demo: --{opt} must be at least 1, got {getattr(args, opt)}")
    if args.kills < 0:
        raise SystemExit(f"spark-eos demo: --kills must be >= 0, got {args.kills}")
    if args.poison < 0:
        raise SystemExit(f"spark-eos demo: --poison must be >= 0, got {args.poison}")


def _fill_topic(args: argparse.Namespace, bootstrap: str, topic: str) -> tuple[list[dict[str, Any]], list[Any]]:
    """The seeded payment events and the malformed records, produced into ``topic``: (events, poison)."""
    from connectors.pipelines.events import generate, produce
    from connectors.toolkit.chaos import create_topic

    create_topic(bootstrap, topic, args.partitions)
    events = generate(args.records, seed=args.seed)
    bar = Bar(len(events), "producing")
    # poison records in the middle of the stream, where the kills land too
    poison = [(i % args.partitions, POISON[i % len(POISON)]) for i in range(args.poison)]
    half = len(events) // 2
    produce(bootstrap, topic, events[:half], partitions=args.partitions, raw=poison, progress=bar.show)
    produce(bootstrap, topic, events[half:], partitions=args.partitions, progress=lambda n: bar.show(half + n))
    bar.end()
    return events, poison


def _app_principal(kafka: Any, workdir: str) -> tuple[Any, str]:
    """On a secured Kafka, a principal for the pipelines holding no ACL yet, and its client properties file
    (the pipelines' ``source.kafka_config``); (None, "") otherwise."""
    if not getattr(kafka, "secured", False):
        return None, ""
    principal = kafka.add_principal(f"eos-demo-{os.getpid()}-{int(time.time())}", [])
    return principal, str(principal.properties(Path(workdir) / "app.properties"))


def _run_pipelines(
    args: argparse.Namespace, workdir: str, kafka: Any, topic: str, dsn: str, tables: dict[str, str], wall: float
) -> tuple[list[tuple[Track, str]], dict[str, list[Any]]]:
    """The pipelines side by side, each killed by its share of the schedule and drained at the end:
    ([(track, checkpoint)], schedule). ``tables``: each pipeline's table (transfers: output topic)."""
    from connectors import postgres_options
    from connectors.pipelines import load_config
    from connectors.pipelines.privileges import pipeline_acls

    schedule = plan(args.kills, args.seed, args.records)
    principal, kafka_config = _app_principal(kafka, workdir)
    acls = []
    tracks, threads = [], []
    # the pipelines' config (a file) names the server without the password: they get it from
    # PGPASSWORD, which libpq reads in every process, so no option, plan or command line holds it
    connection = postgres_options(dsn)
    secrets = {"PGPASSWORD": connection["password"]} if "password" in connection else {}
    for name, table in tables.items():
        checkpoint = os.path.join(workdir, f"checkpoint-{name}")
        cfg_path = os.path.join(workdir, f"{name}.toml")
        max_offsets = batch_rows(args.records, len(schedule[name]))
        _config(cfg_path, name, kafka.bootstrap, topic, connection["dsn"], table, checkpoint, max_offsets, kafka_config)
        acls += pipeline_acls(load_config(cfg_path))
        track = Track(name)
        tracks.append((track, checkpoint))
        threads.append(
            threading.Thread(
                target=_drive,
                args=(track, schedule[name], cfg_path, checkpoint, workdir, 240.0, secrets),
                name=f"demo-{name}",
                daemon=True,
            )
        )
    if principal is not None:  # exactly what the pipelines declare, granted before any of them starts
        kafka.grant(principal.name, acls)
    say(
        "[3/4] running ledger (postgres-2pc), balances (transformWithStateInPandas -> postgres-upsert) and transfers "
        "(kafka-eos sink, visibility=batch); kills: "
        + (", ".join(f"{k.pipeline}: {k.label()}" for ks in schedule.values() for k in ks) or "none")
    )
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        for t in threads:
            t.join(15)
        done = sum(len(tr.kills) for tr, _ in tracks)
        if any(t.is_alive() for t in threads):
            say(f"      ... {done}/{args.kills} kills done, {time.monotonic() - wall:.0f}s")
    for track, _ in tracks:
        for k in track.kills:
            say(f"      {track.name:<9} {k['how']:<36} -> {k['exit']:<18} commits {k['commits']}")
        say(f"      {track.name:<9} {'final drain (available-now)':<36} -> {track.final}")
    return tracks, schedule


def _verdict(args: argparse.Namespace, summary: tuple[dict[str, Any], dict[str, bool], float]) -> bool:
    """The verdict (``_summary``'s), printed: a table, or JSON with --json; whether exactly-once held."""
    report, held, proc_time = summary
    if args.json:
        print(json.dumps(report, indent=2, default=str))
    else:
        say(_verdict_table(report, held, proc_time))
    return bool(report["ok"])


def _summary(
    workdir: str,
    wall: float,
    events: list[dict[str, Any]],
    poison: list[Any],
    tracks: list[tuple[Track, str]],
    schedule: dict[str, list[Any]],
    rep_l: Any,
    rep_b: Any,
    rep_t: Any,
) -> tuple[dict[str, Any], dict[str, bool], float]:
    """The checkers' reports and the runs as one verdict: its figures (what --json prints), each table line's
    own check, and the longest pipeline's process time."""
    from eos_core import faults

    fired = [e for tr, _ in tracks for e in faults.fired(os.path.join(workdir, f"faults-{tr.name}.jsonl"))]
    crashes = sum(1 for tr, _ in tracks for k in tr.kills if k["killed"])
    planned = sum(len(v) for v in schedule.values())
    runs_ok = all(tr.final_ok and not tr.error for tr, _ in tracks)
    agg = rep_b.get("aggregates")
    dup, lost = rep_l.get("records.duplicates"), rep_l.get("records.losses")
    ph, pay = rep_l.get("records.phantoms"), rep_l.get("records.payload")
    t_dup, t_lost = rep_t.get("records.duplicates"), rep_t.get("records.losses")
    t_ph, t_pay = rep_t.get("records.phantoms"), rep_t.get("records.payload")
    t_poison, t_positions = rep_t.get("poison.dead_letter_topic"), rep_t.get("records.positions")
    t_open = [rep_t.get("end.open_transactions"), rep_t.get("end.open_transactions.dead_letters")]
    prepared = rep_l.get("end.prepared")
    poison_l, poison_b = rep_l.get("poison.dead_letters"), rep_b.get("poison.dead_letters")
    decision = rep_l.get("end.decision_vs_commit")
    ok = rep_l.ok and rep_b.ok and rep_t.ok and runs_ok and crashes == planned
    elapsed = time.monotonic() - wall
    proc_time = max(tr.seconds for tr, _ in tracks)
    report: dict[str, Any] = {
        "ok": ok,
        "events": len(events),
        "ledger_rows": rep_l.info.get("sink_rows"),
        "duplicates": dup.counts["duplicates"],
        "missing": lost.counts["losses"],
        "phantoms": ph.counts["phantoms"],
        "payload_mismatches": pay.counts["payload"],
        "accounts": agg.counts["keys"],
        "balances_wrong": agg.counts["wrong"] + agg.counts["missing"] + agg.counts["phantom"],
        "transfers": _transfers_summary(rep_t),
        "poison": len(poison),
        "poison_dead_letters": {
            "ledger": poison_l.counts["poison"] - poison_l.counts["missing"],
            "balances": poison_b.counts["poison"] - poison_b.counts["missing"],
            "transfers": t_poison.counts["poison"] - t_poison.counts["missing"],
        },
        "poison_extra_copies": poison_l.counts["extra"] + poison_b.counts["extra"] + t_poison.counts["extra"],
        "crashes_injected": crashes,
        "kills_planned": planned,
        "fault_points_fired": len(fired),
        "restarts": sum(len(tr.kills) for tr, _ in tracks),
        "recoveries": sum(tr.recoveries for tr, _ in tracks),
        "prepared_left": prepared.counts["prepared"],
        "decision_vs_commit": decision.summary,
        "wall_seconds": round(elapsed, 1),
        "events_per_second": round(len(events) / proc_time, 1),
        "workdir": workdir,
        "kills": {tr.name: tr.kills for tr, _ in tracks},
    }
    held = {  # each line's own check, where the report holds a count and not the checker's verdict
        "duplicates": dup.ok and t_dup.ok,
        "missing": lost.ok and t_lost.ok,
        "altered": ph.ok and pay.ok and t_ph.ok and t_pay.ok,
        "poison": poison_l.ok and poison_b.ok and t_poison.ok and t_positions.ok,
        "open": all(c.ok for c in t_open),
        "decision": decision.ok,
        "markers": rep_t.get("end.marker_vs_commit").ok,
    }
    return report, held, proc_time


def _transfers_summary(rep_t: Any) -> dict[str, Any]:
    """The transfers pipeline's figures (its output is a topic, read back read_committed)."""
    t_open = [rep_t.get("end.open_transactions"), rep_t.get("end.open_transactions.dead_letters")]
    return {
        "records": rep_t.info.get("sink_records"),
        "duplicates": rep_t.get("records.duplicates").counts["duplicates"],
        "missing": rep_t.get("records.losses").counts["losses"],
        "phantoms": rep_t.get("records.phantoms").counts["phantoms"],
        "payload_mismatches": rep_t.get("records.payload").counts["payload"],
        "positions_ok": rep_t.get("records.positions").ok,
        "open_transactions": sum(c.counts["open_partitions"] for c in t_open),
        "marker_vs_commit": rep_t.get("end.marker_vs_commit").summary,
        "marker_ok": rep_t.get("end.marker_vs_commit").ok,
    }


def _verdict_table(report: dict[str, Any], held: dict[str, bool], proc_time: float) -> str:
    """The verdict as the table the demo prints: one row per claim, each with its own check."""
    tr, crashes, planned = report["transfers"], report["crashes_injected"], report["kills_planned"]
    fired = report["fault_points_fired"]
    lines = [
        "",
        "  exactly-once verdict",
        "  " + "-" * 58,
        _row("events produced", report["events"]),
        _row("ledger rows", report["ledger_rows"], report["ledger_rows"] == report["events"]),
        _row("transfers records", f"{tr['records']} (read_committed)", tr["records"] == report["events"]),
        _row("duplicates", f"ledger {report['duplicates']}, transfers {tr['duplicates']}", held["duplicates"]),
        _row("missing", f"ledger {report['missing']}, transfers {tr['missing']}", held["missing"]),
        _row(
            "phantoms / altered",
            f"ledger {report['phantoms']} / {report['payload_mismatches']}, transfers "
            f"{tr['phantoms']} / {tr['payload_mismatches']}",
            held["altered"],
        ),
        _row(
            "poison records",
            f"{report['poison']} produced; in the dead letters once each: ledger "
            f"{report['poison_dead_letters']['ledger']}, balances {report['poison_dead_letters']['balances']} "
            f"(tables), transfers {report['poison_dead_letters']['transfers']} (topic)",
            held["poison"],
        ),
        _row(
            "balances matching",
            f"{report['accounts'] - report['balances_wrong']}/{report['accounts']} accounts",
            report["balances_wrong"] == 0,
        ),
        _row(
            "crashes injected",
            f"{crashes} of {planned} planned ({fired} at fault points, {crashes - fired} SIGKILL from outside)",
            crashes == planned,
        ),
        _row(
            "recoveries",
            f"{report['restarts']} restarts from the checkpoint, {report['recoveries']} of them "
            "committed new batches before the next kill or the end",
        ),
        _row("prepared txns left", report["prepared_left"], report["prepared_left"] == 0),
        _row("open Kafka txns", f"{tr['open_transactions']} (transfers output and dead-letter topics)", held["open"]),
        _row("decision log", report["decision_vs_commit"], held["decision"]),
        _row("transfers markers", tr["marker_vs_commit"], held["markers"]),
        _row(
            "throughput",
            f"{report['events_per_second']} events/s per pipeline, end to end incl. JVM starts and restarts "
            f"({proc_time:.0f}s)",
        ),
        _row("wall time", f"{report['wall_seconds']:.0f}s"),
        "  " + "-" * 58,
        "  verdict: " + ("EXACTLY-ONCE HELD" if report["ok"] else "EXACTLY-ONCE VIOLATED (see above and the work dir)"),
    ]
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    from connectors.pipelines import PipelineConfig, balances, ledger, transfers
    from connectors.toolkit import checker

    _check_args(args)
    wall = time.monotonic()
    workdir = args.workdir or tempfile.mkdtemp(prefix="spark-eos-demo-")
    os.makedirs(workdir, exist_ok=True)
    say(f"spark-eos demo: {args.records} payment events, {args.kills} kills, seed {args.seed}  (work dir {workdir})")
    stack: list[Any] = []
    try:
        kafka, dsn, what = _services(stack)
        bootstrap = kafka.bootstrap
        say(f"[1/4] services: {what}")
        tag = f"demo_{args.seed}_{int(time.time())}"
        topic, ledger_table, balances_table = f"payments_{tag}", f"ledger_{tag}", f"balances_{tag}"
        events, poison = _fill_topic(args, bootstrap, topic)
        say(
            f"[2/4] topic {topic}: {len(events)} events over {args.partitions} partitions, keyed by account, and "
            f"{len(poison)} malformed records (the pipelines divert them to dead-letter tables and a dead-letter "
            "topic)"
        )
        tables = {"ledger": ledger_table, "transfers": f"transfers_{tag}", "balances": balances_table}
        tracks, schedule = _run_pipelines(args, workdir, kafka, topic, dsn, tables, wall)
        say("[4/4] checking exactly-once")
        ckpt = {track.name: path for track, path in tracks}
        rep_l = checker.verify(
            bootstrap=bootstrap,
            topic=topic,
            dsn=dsn,
            table=ledger_table,
            payload_fields=("account", "amount"),
            sink_id=ledger_table,
            checkpoint=ckpt["ledger"],
            dead_letters=f"{ledger_table}_dead_letters",
            poison_position=ledger.poison_position,
        )
        rep_b = checker.verify(
            bootstrap=bootstrap,
            topic=topic,
            dsn=dsn,
            table="",
            decisions=False,
            aggregates={
                "table": balances_table,
                "key": "account",
                "value": "amount",
                "columns": {"balance": "sum", "events": "count"},
            },
            dead_letters=f"{balances_table}_dead_letters",
            poison_position=balances.poison_position,
        )
        # the transfers run's config, as the demo wrote it (its sink id is its output topic)
        rep_t = transfers.verify(
            PipelineConfig(
                pipeline="transfers",
                bootstrap=bootstrap,
                topic=topic,
                sink_topic=tables["transfers"],
                sink_id=tables["transfers"],
                checkpoint=ckpt["transfers"],
            )
        )
        ok = _verdict(args, _summary(workdir, wall, events, poison, tracks, schedule, rep_l, rep_b, rep_t))
        for track, _ in tracks:
            if track.error:
                say(f"\n{track.name} did not finish cleanly:\n{track.error}")
        if not ok:
            say("\nchecker details:\n" + rep_l.table() + "\n" + rep_b.table() + "\n" + rep_t.table())
        if ok and not args.keep and not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
        return 0 if ok else 1
    finally:
        for service in reversed(stack):
            try:
                service.stop()
            except Exception as exc:  # never hide the verdict behind a cleanup error
                print(f"warning: stopping {service!r} failed: {exc}", file=sys.stderr)
