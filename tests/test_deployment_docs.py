"""Issue 32 item 6: the refusal of a server without prepared transactions points at the managed-Postgres
recipe, and that section (and the other platforms') exist in docs/deployment.md."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from eos_core.errors import ConfigError
from sinks.postgres.twophase.decisions import check_max_prepared

DOC = Path(__file__).resolve().parent.parent / "docs" / "deployment.md"


class _Conn:
    def __init__(self, limit: int) -> None:
        self.limit = limit

    def execute(self, *_: object) -> _Conn:
        return self

    def fetchone(self) -> tuple[int]:
        return (self.limit,)


def _anchors() -> set[str]:
    heads = re.findall(r"^#{1,6} (.+)$", DOC.read_text(), re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in heads}


@pytest.mark.parametrize(("limit", "writers"), [(0, None), (4, 8)])
def test_max_prepared_transactions_refusal_points_at_the_managed_postgres_section(
    limit: int, writers: int | None
) -> None:
    with pytest.raises(ConfigError) as info:
        check_max_prepared(_Conn(limit), writers)  # type: ignore[arg-type]
    m = re.search(r"docs/deployment\.md#([\w-]+)", str(info.value))
    assert m and m.group(1) in _anchors(), str(info.value)


def test_deployment_has_the_platform_sections() -> None:
    assert {
        "databricks",
        "emr-and-dataproc",
        "kubernetes",
        "managed-postgres",
        "coming-from-spark-jdbc-kafka-connects-jdbc-sink-or-flink",
    } <= _anchors()
    text = DOC.read_text()
    for needle in (
        "pk.mode",
        "insert.mode",
        "auto.evolve",
        "delete.enabled",
        "errors.deadletterqueue.topic.name",
        "PgBouncer",
        "VACUUM",
        "dbtable",
    ):
        assert needle in text, needle
