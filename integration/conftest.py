"""Integration test harness: the shared fixtures live in plugin modules under integration/fixtures."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest_plugins = [
    "integration.fixtures.services",
    "integration.fixtures.kafka",
    "integration.fixtures.postgres",
    "integration.fixtures.spark",
    "integration.fixtures.cluster",
]
# The docker engineer's fixtures join when their module exists.
if (Path(__file__).parent / "fixtures" / "docker.py").exists():
    pytest_plugins.append("integration.fixtures.docker")


_container_test_seconds: list[float] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if "docker" in report.keywords:
        _container_test_seconds.append(report.duration)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """What containers cost in this run: engine start, image builds, the container fault tests."""
    from connectors.services import docker as engines
    from integration.harness import dockerd

    if not engines.engine_log and not _container_test_seconds:
        return
    tr = terminalreporter
    tr.section("containers: extra time")
    for e in engines.engine_log:
        what = "private dockerd started" if e["owned"] else "user's engine found"
        tr.write_line(f"engine   {e['host']}: {what} in {e['seconds']:.1f}s")
    for b in dockerd.build_log:
        tr.write_line(f"image    {b['image']}: {'built' if b['built'] else 'cached'} in {b['seconds']:.1f}s")
    tr.write_line(f"tests    -m docker: {sum(_container_test_seconds):.0f}s (setup, call, teardown)")
