"""Integration test harness: the shared fixtures live in plugin modules under integration/fixtures."""

from __future__ import annotations

from pathlib import Path

pytest_plugins = [
    "integration.fixtures.services",
    "integration.fixtures.kafka",
    "integration.fixtures.postgres",
    "integration.fixtures.spark",
]
# The docker engineer's fixtures join when their module exists.
if (Path(__file__).parent / "fixtures" / "docker.py").exists():
    pytest_plugins.append("integration.fixtures.docker")
