"""BalanceProcessor's state logic against fake state handles that expire values and map entries on
their own clocks, as Spark's TTL does (each write restarts that value's or entry's TTL)."""

from __future__ import annotations

import json
from typing import Any

import pandas as pd

from connectors.pipelines.balances import BalanceProcessor


class Clock:
    def __init__(self) -> None:
        self.now = 0.0


class FakeValue:
    def __init__(self, clock: Clock, ttl: float) -> None:
        self.clock, self.ttl, self.item, self.at = clock, ttl, None, 0.0

    def _live(self) -> bool:
        return self.item is not None and self.clock.now - self.at < self.ttl

    def exists(self) -> bool:
        return self._live()

    def get(self) -> Any:
        return self.item if self._live() else None

    def update(self, value: Any) -> None:
        self.item, self.at = value, self.clock.now

    def put(self, values: Any) -> None:
        self.update(list(values))

    def clear(self) -> None:
        self.item = None


class FakeMap:
    def __init__(self, clock: Clock, ttl: float) -> None:
        self.clock, self.ttl, self.entries = clock, ttl, {}

    def _live(self) -> dict:
        return {k: v for k, (v, at) in self.entries.items() if self.clock.now - at < self.ttl}

    def getValue(self, key: tuple) -> Any:
        return self._live().get(key)

    def updateValue(self, key: tuple, value: tuple) -> None:
        self.entries[key] = (value, self.clock.now)

    def iterator(self):
        return iter(self._live().items())

    def clear(self) -> None:
        self.entries = {}


class FakeHandle:
    def __init__(self, clock: Clock) -> None:
        self.clock = clock

    def getValueState(self, name: str, schema: str, ttl_ms: int) -> FakeValue:
        return FakeValue(self.clock, ttl_ms / 1000)

    def getListState(self, name: str, schema: str, ttl_ms: int) -> FakeValue:
        return FakeValue(self.clock, ttl_ms / 1000)

    def getMapState(self, name: str, key_schema: str, value_schema: str, ttl_ms: int) -> FakeMap:
        return FakeMap(self.clock, ttl_ms / 1000)


def _events(*rows: tuple[int, str, int]) -> list[pd.DataFrame]:
    return [
        pd.DataFrame(
            {
                "src_offset": [o for o, _, _ in rows],
                "id": [f"e{o}" for o, _, _ in rows],
                "counterparty": [c for _, c, _ in rows],
                "amount": [a for _, _, a in rows],
            }
        )
    ]


def _run(proc: BalanceProcessor, rows: list[pd.DataFrame]) -> dict:
    (out,) = list(proc.handleInputRows(("acct-1",), iter(rows), None))
    rec = out.iloc[0].to_dict()
    rec["counterparties"] = json.loads(rec["counterparties"])
    rec["recent"] = [r["id"] for r in json.loads(rec["recent"])]
    return rec


def _processor(ttl_s: float, last_n: int = 2) -> tuple[BalanceProcessor, Clock]:
    clock = Clock()
    proc = BalanceProcessor(int(ttl_s * 1000), last_n)
    proc.init(FakeHandle(clock))
    return proc, clock


def test_an_active_account_keeps_counterparties_it_has_not_paid_for_longer_than_the_ttl() -> None:
    proc, clock = _processor(ttl_s=10)
    _run(proc, _events((0, "cp-a", 5), (1, "cp-b", 7)))
    for t in (6, 12, 18):  # cp-b untouched for 18 s > TTL, but the account is active every 6 s
        clock.now = t
        out = _run(proc, _events((t, "cp-a", 1)))
    assert out["counterparties"] == {"cp-a": 8, "cp-b": 7}
    assert (out["balance"], out["events"], out["version"]) == (15, 5, 18)
    assert out["recent"] == ["e12", "e18"]


def test_an_idle_account_starts_from_zero_with_no_leftover_counterparties() -> None:
    proc, clock = _processor(ttl_s=10)
    _run(proc, _events((0, "cp-a", 5), (1, "cp-b", 7)))
    clock.now = 11  # idle past the TTL: everything of the account is gone
    out = _run(proc, _events((40, "cp-c", 3)))
    assert out["counterparties"] == {"cp-c": 3}
    assert (out["balance"], out["events"], out["version"]) == (3, 1, 40)
    assert out["recent"] == ["e40"]


def test_surviving_remnants_are_cleared_when_the_balance_expired() -> None:
    """Spark evicts expired state lazily: a map entry can outlive the balance it belongs to."""
    proc, clock = _processor(ttl_s=10)
    _run(proc, _events((0, "cp-a", 5)))
    clock.now = 11
    proc.counterparties.entries[("cp-old",)] = ((99,), 5.0)  # still live at t=11 on its own clock
    out = _run(proc, _events((3, "cp-b", 2)))
    assert out["counterparties"] == {"cp-b": 2}
    assert out["balance"] == 2
