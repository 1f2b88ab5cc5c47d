"""CPU seconds per kind of process while a command runs: where a suite's (or a benchmark's) CPU goes.

Run: ``.venv/bin/python scripts/cpu_census.py [--every S] [--out FILE] -- COMMAND ...`` (for the suite:
``scripts/cpu_census.py -- make test``). Every ``--every`` seconds (default 2) it reads ``/proc/<pid>/stat`` of every
process on the machine (run nothing else beside it) and keeps each one's latest user+system time. What a process
spent after its last reading, or one that lived less than an interval, reaches its parent's reaped-children time
(``cutime``) when the parent waits for it, and is counted as "unseen children of" the parent's kind. At the end it
prints, per kind (Spark's JVMs, Kafka's broker, the registry, Postgres, PySpark's planner processes by worker module,
Python workers, the runners, pytest), the CPU seconds, the number of processes, and the share of the whole; with
``--out`` the same as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")
# the first pattern a command line contains names its kind
KINDS = (
    ("kafka.Kafka", "java: Kafka broker"),
    ("apicurio", "java: Apicurio registry"),
    ("org.apache.spark.deploy.master", "java: Spark standalone master"),
    ("org.apache.spark.deploy.worker", "java: Spark standalone worker"),
    ("CoarseGrainedExecutorBackend", "java: Spark executor"),
    ("pyspark", "java: Spark driver"),
    ("postgres", "postgres"),
    ("pyspark.daemon pyspark.sql.", None),  # by its worker module, below
    ("connectors.launch.pyspark_daemon", "python: Spark worker (preloading daemon)"),
    ("pyspark.daemon", "python: Spark worker (PySpark's daemon)"),
    ("python_streaming_source_runner", "python: streaming source runner"),
    ("integration.harness.runner", "python: crash harness runner"),
    ("connectors.toolkit", "python: chaos toolkit"),
    ("pytest", "python: pytest"),
    ("exec(eval(sys.stdin", "python: pytest worker (xdist)"),
    ("dockerd", "docker"),
    ("containerd", "docker"),
)


def kind_of(cmdline: str, exe: str) -> str:
    for pattern, kind in KINDS:
        if pattern in cmdline:
            if kind is None:
                module = cmdline.split("pyspark.daemon ", 1)[1].split()[0]
                return f"python: planner {module.rsplit('.', 1)[-1]}"
            if kind.startswith("java:") and "java" not in exe:
                continue
            return kind
    return f"other: {Path(exe).name or '?'}"


class Seen:
    """A process as last read: its kind, parent, own CPU seconds and its reaped children's (cutime + cstime)."""

    __slots__ = ("children", "kind", "own", "ppid")

    def __init__(self, kind: str, ppid: int, own: float, children: float) -> None:
        self.kind, self.ppid, self.own, self.children = kind, ppid, own, children


def sample(seen: dict[int, Seen]) -> None:
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            fields = stat[stat.rindex(")") + 2 :].split()
            ppid = int(fields[1])
            own = (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime
            children = (int(fields[13]) + int(fields[14])) / TICKS  # cutime, cstime: children it has reaped
            known = seen.get(pid)
            if known is None or not known.kind:
                raw = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                seen[pid] = Seen(kind_of(raw, raw.split(" ", 1)[0]) if raw else "", ppid, own, children)
            else:
                known.own, known.children = own, children
        except (OSError, ValueError, IndexError):
            continue


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="scripts/cpu_census.py", description=(__doc__ or "").splitlines()[0])
    p.add_argument("--every", type=float, default=2.0)
    p.add_argument("--out", type=Path)
    p.add_argument("command", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        p.error("give the command to run after --")
    seen: dict[int, Seen] = {}
    sample(seen)
    before = {pid: (p.own, p.children) for pid, p in seen.items()}  # what ran before the command is not its
    began = time.monotonic()
    proc = subprocess.Popen(command)
    while proc.poll() is None:
        time.sleep(args.every)
        sample(seen)
    wall = time.monotonic() - began
    alive = {int(e.name) for e in os.scandir("/proc") if e.name.isdigit()}
    totals: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    reaped_seen: dict[int, float] = defaultdict(float)  # per parent: what its ended children were seen to spend
    for pid, p in seen.items():
        own0, children0 = before.get(pid, (0.0, 0.0))
        spent = p.own - own0
        if spent > 0:
            totals[p.kind or "other: ?"] += spent
            counts[p.kind or "other: ?"] += 1
        if pid not in alive:
            reaped_seen[p.ppid] += spent + p.children - children0
    # a parent's reaped children spent its cutime growth; what the readings did not see of it (children that lived
    # less than an interval, and each one's last interval) is counted under the parent's kind
    for pid, p in seen.items():
        unseen = p.children - before.get(pid, (0.0, 0.0))[1] - reaped_seen.get(pid, 0.0)
        if unseen > 0.5:
            totals[f"unseen children of: {p.kind or 'other: ?'}"] += unseen
    whole = sum(totals.values()) or 1.0
    print(f"\nCPU census: {whole:,.0f} CPU-s over {wall:,.0f} s wall ({whole / wall:.2f} cores busy on average)")
    for kind, spent in sorted(totals.items(), key=lambda kv: -kv[1]):
        print(f"{spent:10,.0f} s {100 * spent / whole:5.1f} %  {counts[kind]:6d} processes  {kind}")
    if args.out:
        args.out.write_text(json.dumps({"wall": wall, "cpu": dict(totals), "processes": dict(counts)}, indent=1))
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
