"""A task's batches stream into COPY once and can be read again, whole, by a retried COPY."""

from __future__ import annotations

import pyarrow as pa
import pytest

from sinks.postgres.staging import Replayable


def _batches(n: int, consumed: list[int]):  # type: ignore[no-untyped-def]
    for i in range(n):
        consumed.append(i)
        yield pa.RecordBatch.from_pydict({"id": pa.array(range(i * 10, i * 10 + 10), pa.int64())})


def _ids(batches) -> list[int]:  # type: ignore[no-untyped-def]
    return [v for b in batches for v in b.column(0).to_pylist()]


@pytest.mark.parametrize("limit", [1 << 30, 100], ids=["memory", "spilled"])
def test_first_pass_streams_and_a_retry_after_a_failure_sees_every_row(limit: int) -> None:
    consumed: list[int] = []
    rep = Replayable(_batches(5, consumed), limit=limit)
    it = iter(rep)
    next(it)
    assert consumed == [0], "the first pass must hand batches on as they come, not read ahead"
    next(it)
    it.close()  # the COPY failed after two batches
    assert _ids(rep) == list(range(50))  # the retry: what was sent, then the rest
    assert _ids(rep) == list(range(50))  # and again
    assert rep.spilled == (limit == 100)


def test_a_clean_first_pass_then_a_retry_reads_the_copy() -> None:
    consumed: list[int] = []
    rep = Replayable(_batches(3, consumed))
    assert _ids(rep) == list(range(30))
    assert _ids(rep) == list(range(30)) and consumed == [0, 1, 2]  # the source was read once
