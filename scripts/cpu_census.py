"""CPU seconds per kind of process while a command runs: where a suite's (or a benchmark's) CPU goes.

Run: ``.venv/bin/python scripts/cpu_census.py [--every S] [--out FILE] -- COMMAND ...`` (for the suite:
``scripts/cpu_census.py -- make test``). Every ``--every`` seconds (default 2) it reads ``/proc/<pid>/stat`` of every
process on the machine (run nothing else beside it) and keeps each one's latest user+system time; a process that ends between two readings loses at most its
last interval (read the figures as lower bounds). At the end it prints, per kind (Spark's JVMs, Kafka's broker,
the registry, Postgres, PySpark's planner processes by worker module, Python workers, the runners, pytest), the
CPU seconds, the number of processes, and the share of the whole; with ``--out`` the same as JSON.
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


def sample(seen: dict[int, tuple[str, float]]) -> None:
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            fields = stat[stat.rindex(")") + 2 :].split()
            cpu = (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime
            if pid not in seen or seen[pid][0] == "":
                raw = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                exe = raw.split(" ", 1)[0]
                seen[pid] = (kind_of(raw, exe) if raw else "", cpu)
            else:
                seen[pid] = (seen[pid][0], cpu)
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
    seen: dict[int, tuple[str, float]] = {}
    sample(seen)
    before = {pid: cpu for pid, (_, cpu) in seen.items()}  # what ran before the command is not its
    began = time.monotonic()
    proc = subprocess.Popen(command)
    while proc.poll() is None:
        time.sleep(args.every)
        sample(seen)
    wall = time.monotonic() - began
    totals: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    for pid, (kind, cpu) in seen.items():
        spent = cpu - before.get(pid, 0.0)
        if spent > 0:
            totals[kind or "other: ?"] += spent
            counts[kind or "other: ?"] += 1
    whole = sum(totals.values()) or 1.0
    print(f"\nCPU census: {whole:,.0f} CPU-s over {wall:,.0f} s wall ({whole / wall:.2f} cores busy on average)")
    for kind, spent in sorted(totals.items(), key=lambda kv: -kv[1]):
        print(f"{spent:10,.0f} s {100 * spent / whole:5.1f} %  {counts[kind]:6d} processes  {kind}")
    if args.out:
        args.out.write_text(json.dumps({"wall": wall, "cpu": dict(totals), "processes": dict(counts)}, indent=1))
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
