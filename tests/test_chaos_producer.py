"""The chaos producer spreads the records over every run: it never runs ahead of the kills (found on
2026-11-23: a 100-kill run had written all records by kill 53, so later kills met no new data and
each waited out its timeout), and it writes each run's chunk one slice per batch the query plans
(found the same day: slices on a timer merged into one batch on a slow start, and a fault point
three batches ahead was never reached)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from connectors.toolkit import chaos


@pytest.fixture
def writes(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    seen: list[tuple[int, int]] = []

    def fake_produce(bootstrap, topic, recs, partitions):
        seen.append((int(recs[0]["id"][1:]), len(recs)))

    monkeypatch.setattr(chaos.workload, "produce_records", fake_produce)
    return seen


class Query:
    """Plans batches the way Spark does: a new ``offsets/n`` in the checkpoint."""

    def __init__(self, root: Path) -> None:
        self.dir = root / "offsets"
        self.dir.mkdir(parents=True)
        self.n = -1

    def plan(self) -> None:
        self.n += 1
        (self.dir / str(self.n)).write_text("v1\n{}\n{}\n")


def _producer(tmp_path: Path, records: int, kills: int) -> tuple[chaos.workload.Producer, Query]:
    query = Query(tmp_path / "ck")
    producer = chaos.workload.Producer(
        "127.0.0.1:1", "t", records=records, chunks=kills + 1, checkpoint=str(tmp_path / "ck"), seed=7, pieces=4
    )
    return producer, query


def _settle(p: chaos.workload.Producer, expect: int, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while p.written < expect and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.3)  # and nothing more comes
    assert p.written == expect


def test_one_slice_per_planned_batch_and_never_ahead_of_the_kills(writes, tmp_path: Path) -> None:
    p, query = _producer(tmp_path, records=500, kills=4)  # 5 runs: chunks of 100, slices of 25
    p.start()
    _settle(p, 0)  # nothing before the first run's query starts
    for run in range(1, 5):
        p.release()
        _settle(p, 100 * (run - 1) + 25)  # what the last run owed, and the first slice of this one
        for k in (2, 3, 4):
            query.plan()  # the slice got a batch: the next one comes
            _settle(p, 100 * (run - 1) + 25 * k)
        query.plan()
        _settle(p, 100 * run)  # the chunk is spent: the producer waits for the next run
    p.release(every=True)
    assert p.done.wait(5)
    assert p.error is None and p.written == 500
    ids = [i for start, n in writes for i in range(start, start + n)]
    assert ids == list(range(500))  # every id once, in order
    assert {n for _, n in writes[:-1]} == {25}  # in slices while the kills go on
    assert writes[-1] == (400, 100)  # the draining run's chunk at once


def test_a_run_killed_early_leaves_its_chunk_owed_to_the_next(writes, tmp_path: Path) -> None:
    p, _ = _producer(tmp_path, records=400, kills=3)
    p.start()
    p.release()
    _settle(p, 25)  # the run dies before planning a batch: no more slices
    p.release()  # the first chunk's 75 owed records come at once, then the second chunk's first slice
    _settle(p, 125)
    assert writes == [(0, 25), (25, 75), (100, 25)]
    p.release(every=True)  # the kills are over: all that is left, at once
    assert p.done.wait(5) and p.written == 400
    assert writes[-1] == (125, 275)
