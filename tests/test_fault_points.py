"""Every fault point is declared by the connector that fires it (``FAULT_POINTS`` beside its code), and the
code fires exactly what it declares; the chaos toolkit and the demo draw from the declarations only. That a
declared point is reached in a real query: integration/test_fault_points.py."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import sinks.kafka
import sinks.postgres.twophase
import sinks.postgres.upsert
import sources.kafka
from connectors import demo
from connectors.toolkit import chaos
from eos_core import faults

ROOT = Path(__file__).resolve().parent.parent

DECLARED: dict[str, tuple[str, ...]] = {
    "sources/kafka": sources.kafka.FAULT_POINTS.fired,
    "sinks/postgres/twophase": sinks.postgres.twophase.FAULT_POINTS.fired,
    "sinks/postgres/upsert.py": sinks.postgres.upsert.FAULT_POINTS.fired,
    "sinks/kafka": tuple(p for points in sinks.kafka.FAULT_POINTS.values() for p in points.fired),
    "eos_core/faults.py": faults.FOREACH_BATCH.fired,  # around_batch: a foreachBatch function's two points
}


def _fired_in(path: Path) -> set[str]:
    """The points the code at ``path`` (a file or a package) fires: ``faults.point("name", ...)`` calls."""
    found = set()
    for file in [path] if path.is_file() else sorted(path.rglob("*.py")):
        for node in ast.walk(ast.parse(file.read_text(), str(file))):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            first = node.args[0]
            if name == "point" and isinstance(first, ast.Constant) and isinstance(first.value, str):
                found.add(first.value)
    return found


@pytest.mark.parametrize("place", sorted(DECLARED))
def test_each_connector_fires_exactly_the_points_it_declares(place: str) -> None:
    assert _fired_in(ROOT / place) == set(DECLARED[place])


def test_no_other_module_of_the_wheel_fires_a_point_of_its_own() -> None:
    places = [ROOT / p for p in DECLARED]
    others = {
        str(f.relative_to(ROOT)): sorted(fired)
        for top in ("connectors", "eos_core", "sources", "sinks")
        for f in sorted((ROOT / top).rglob("*.py"))
        if not any(f == p or p in f.parents for p in places)
        for fired in [_fired_in(f)]
        if fired
    }
    assert others == {}, f"fault points fired outside the connectors that declare them: {others}"


def test_every_point_of_the_vocabulary_is_declared_by_a_connector() -> None:
    declared = {p for points in DECLARED.values() for p in points}
    assert declared == set(faults.POINTS)


def test_the_chaos_schedule_and_the_demo_draw_from_the_declarations() -> None:
    # the chaos kinds draw the source's mid-read point, then their sink's, in protocol order
    assert chaos.fault_points("2pc") == ("source.read.mid", *sinks.postgres.twophase.FAULT_POINTS.fired)
    assert chaos.fault_points("kafka-partition")[1:] == sinks.kafka.FAULT_POINTS["partition"].drawn
    assert chaos.fault_points("other") == ("source.read.mid",)
    assert chaos.schedule.hold_point("2pc") == "sink.after_prepare"
    assert chaos.schedule.hold_point("foreachbatch") == chaos.schedule.hold_point("other") == "source.read.start"
    # the demo: its sink's points from the hold point on (work done, not yet committed), then mid-read
    assert demo.fault_points("ledger")[0] == "sink.after_prepare" == sinks.postgres.twophase.FAULT_POINTS.hold
    assert demo.fault_points("balances") == ("pipeline.batch", "sink.after_commit", "source.read.mid")
    with pytest.raises(ValueError, match="no sink kind"):
        chaos.fault_points("nosuch")


def test_a_declaration_names_only_known_points_and_holds_at_one_it_fires() -> None:
    with pytest.raises(ValueError, match="unknown fault points"):
        faults.Points(("sink.nowhere",))
    with pytest.raises(ValueError, match="must be among fired"):
        faults.Points(("sink.before_write",), hold="sink.after_write")
    points = faults.Points(("sink.before_write", "sink.after_write", "sink.after_commit"), hold="sink.after_write")
    assert points.from_hold() == ("sink.after_write", "sink.after_commit") and points.kills == points.fired
