"""CPU seconds per component of a load, from ``/proc`` (Linux): less sensitive to other work on the
machine than wall time, so it explains a ratio measured on a busy machine.

``CpuMeter(spark, dsn)``: ``snapshot()`` returns the CPU seconds used so far by the Spark JVM
(``jvm``), its descendants (``python workers``: daemons, workers, planners), the PostgreSQL server
(``postgres``: the postmaster and its backends, found as the parent of a backend of ``dsn``; only a
server on this host) and this process with its other children (``driver``: the benchmark's own
processes, e.g. the limit's two loaders). A process's time counts while it lives (utime + stime) and,
once it has exited and been reaped, in its parent's cutime + cstime: a subtree's sum of both is its
total. ``None`` components are unavailable (no /proc, a remote server).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

__all__ = ["COMPONENTS", "CpuMeter", "listener_pid"]

COMPONENTS = ("jvm", "python workers", "postgres", "driver")
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _table() -> dict[int, tuple[int, int, int]]:
    """pid -> (ppid, own ticks, reaped children's ticks)."""
    out: dict[int, tuple[int, int, int]] = {}
    for d in Path("/proc").glob("[0-9]*"):
        try:
            text = (d / "stat").read_text()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2 :].split()
        ut, st, cut, cst = (int(x) for x in fields[11:15])
        out[int(d.name)] = (int(fields[1]), ut + st, cut + cst)
    return out


def _subtree(table: dict[int, tuple[int, int, int]], root: int) -> set[int]:
    kids: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        kids.setdefault(ppid, []).append(pid)
    seen: set[int] = set()
    stack = [root]
    while stack:
        pid = stack.pop()
        if pid in table and pid not in seen:
            seen.add(pid)
            stack.extend(kids.get(pid, []))
    return seen


class CpuMeter:
    def __init__(self, spark: Any, dsn: str | None) -> None:
        import psycopg

        self.available = Path("/proc/self/stat").exists()
        proc = getattr(spark.sparkContext._gateway, "proc", None)
        self.jvm = proc.pid if proc is not None else None
        self.postmaster: int | None = None
        if self.available and dsn is not None:  # None: no Postgres in the load
            with psycopg.connect(dsn, autocommit=True) as conn:
                row = conn.execute("SELECT pg_backend_pid()").fetchone()
                table = _table()  # while the backend lives
            if row and row[0] in table:  # else the server runs elsewhere
                self.postmaster = table[row[0]][0]

    def snapshot(self) -> dict[str, float | None]:
        if not self.available:
            return dict.fromkeys(COMPONENTS)
        table = _table()
        me = os.getpid()
        out: dict[str, float | None] = dict.fromkeys(COMPONENTS)
        workers: set[int] = set()
        if self.jvm is not None and self.jvm in table:
            workers = _subtree(table, self.jvm) - {self.jvm}
            out["jvm"] = table[self.jvm][1] / _TICK
            out["python workers"] = (table[self.jvm][2] + sum(sum(table[p][1:]) for p in workers)) / _TICK
        if self.postmaster is not None:
            out["postgres"] = sum(sum(table[p][1:]) for p in _subtree(table, self.postmaster)) / _TICK
        mine = _subtree(table, me) - workers - ({self.jvm} if self.jvm else set())
        out["driver"] = sum(sum(table[p][1:]) for p in mine) / _TICK
        return out

    @staticmethod
    def used(before: dict[str, float | None], after: dict[str, float | None]) -> dict[str, float | None]:
        return {k: (None if before[k] is None or after[k] is None else after[k] - before[k]) for k in COMPONENTS}  # type: ignore[operator]


def listener_pid(address: str) -> int | None:
    """The pid of the process listening on ``address``'s port on this host (a broker), else None."""
    port = int(address.rsplit(":", 1)[1])
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as fh:
                for line in fh.readlines()[1:]:
                    cols = line.split()
                    if int(cols[1].rsplit(":", 1)[1], 16) == port and cols[3] == "0A":  # LISTEN
                        inodes.add(f"socket:[{cols[9]}]")
        except OSError:
            continue
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if any(os.readlink(f"/proc/{pid}/fd/{fd}") in inodes for fd in os.listdir(f"/proc/{pid}/fd")):
                return int(pid)
        except OSError:
            continue
    return None
