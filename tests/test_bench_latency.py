"""The streaming benchmark's latency arithmetic: a record is visible at the first poll that sees it."""

from __future__ import annotations

import pytest

from bench.streaming import Poller, percentile


def test_latency_is_the_first_poll_seeing_the_id_minus_its_produce_time() -> None:
    poller = Poller("unused", "t", 8)  # partition 0 holds ids 0..3, partition 1 ids 4..7
    assert poller.ranges == [(0, 4), (4, 8)]
    poller.seen = [(10.0, [-1, 4]), (11.0, [1, 5]), (12.5, [3, 7])]
    stamps = [9.0, 9.5, 10.0, 12.0, 9.0, 10.5, 11.0, 12.0]
    got = poller.latencies(stamps)
    want = [11.0 - 9.0, 11.0 - 9.5, 12.5 - 10.0, 12.5 - 12.0, 10.0 - 9.0, 11.0 - 10.5, 12.5 - 11.0, 12.5 - 12.0]
    assert got == pytest.approx(want)


def test_an_id_never_seen_fails_instead_of_being_left_out() -> None:
    poller = Poller("unused", "t", 4)
    poller.seen = [(1.0, [1, 2])]  # id 3 of partition 1 never became visible
    with pytest.raises(RuntimeError, match=r"ids 3\.\.3 never"):
        poller.latencies([0.0] * 4)


def test_percentile_is_the_nearest_rank() -> None:
    values = [float(v) for v in range(100, 0, -1)]
    assert percentile(values, 0.5) == 50.0
    assert percentile(values, 0.99) == 99.0
    assert percentile(values, 1.0) == 100.0
    assert percentile([7.0], 0.99) == 7.0
