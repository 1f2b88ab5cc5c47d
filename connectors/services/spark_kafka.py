"""Spark's own Kafka connector (``format("kafka")``, the JVM ``spark-sql-kafka-0-10``) as a peer of kafka-eos.

The differential suite (``integration/spark_peer/``) reads the same topics with Spark's source and
with kafka-eos in one Spark session. Maven Central serves no ``spark-sql-kafka-0-10_2.13`` for
PySpark 4.3 (checked 2026-11: 4.3.0 is missing), so the peer runs on the nearest Spark 4.x it serves,
``SPARK_KAFKA_VERSION``, in its own environment (``make peer-venv``: PySpark of that version from PyPI).

``connector_jars()`` fetches the connector and its runtime dependencies that PySpark does not ship
(``spark-token-provider-kafka-0-10``, ``kafka-clients`` and ``commons-pool2`` at the versions the
connector's pom names; ``kafka-clients``' own dependencies, lz4, snappy, zstd and slf4j, are in
``pyspark/jars``) once, with the Apache Ivy PySpark ships and the embedded broker's jar machinery
(``connectors.services.apache_kafka``), into ``${XDG_CACHE_HOME:-~/.cache}/spark-eos/spark-sql-kafka-<version>/``.
They are given to Spark with ``spark.jars`` (``session_conf()``): ``spark.jars.packages`` resolves
through ``~/.m2`` first, where a pom without its jar makes the resolution fail.

Spark's ``spark-avro`` (``from_avro``/``to_avro``, the JVM's Avro reader: the oracle and the benchmark peer of the
``avro`` formats, issue 49) is fetched the same way into its own cache entry, ``spark-avro-<version>/``
(``avro_jars()``); PySpark ships the Avro library it needs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from connectors.services import maven
from eos_core.errors import ServiceError

__all__ = [
    "ARTIFACTS",
    "AVRO_ARTIFACTS",
    "SPARK_KAFKA_VERSION",
    "avro_jars",
    "connector_jars",
    "ivy_module",
    "session_conf",
]

SPARK_KAFKA_VERSION = "4.2.0"
# (organisation, module, revision) of each jar, fetched without its dependencies: what
# spark-sql-kafka-0-10_2.13-4.2.0.pom names with compile scope and PySpark 4.2 does not ship.
ARTIFACTS: dict[str, tuple[tuple[str, str, str], ...]] = {
    "4.2.0": (
        ("org.apache.spark", "spark-sql-kafka-0-10_2.13", "4.2.0"),
        ("org.apache.spark", "spark-token-provider-kafka-0-10_2.13", "4.2.0"),
        ("org.apache.kafka", "kafka-clients", "3.9.2"),
        ("org.apache.commons", "commons-pool2", "2.13.1"),
    ),
}


# spark-avro of the same Spark (its avro dependency is in pyspark/jars)
AVRO_ARTIFACTS: dict[str, tuple[tuple[str, str, str], ...]] = {
    "4.2.0": (("org.apache.spark", "spark-avro_2.13", "4.2.0"),),
}


def ivy_module(version: str = SPARK_KAFKA_VERSION, *, artifacts: dict[str, Any] = ARTIFACTS) -> str:
    """The ivy.xml of the resolution: the connector's jars (or ``artifacts``'), each intransitive (Spark's own
    jars are PySpark's)."""
    if version not in artifacts:
        what = "Spark's Kafka connector" if artifacts is ARTIFACTS else "spark-avro"
        raise ServiceError(
            f"no jar list for {what} {version!r}; known: {', '.join(sorted(artifacts))}",
            version=version,
        )
    deps = "\n".join(
        f'    <dependency org="{org}" name="{name}" rev="{rev}" transitive="false" conf="default->default"/>'
        for org, name, rev in artifacts[version]
    )
    return f"""<ivy-module version="2.0">
  <info organisation="spark-eos" module="spark-kafka-peer"/>
  <configurations><conf name="default"/></configurations>
  <dependencies>
{deps}
  </dependencies>
</ivy-module>
"""


def connector_jars(
    version: str = SPARK_KAFKA_VERSION, *, cache: Path | None = None, timeout: float = maven.RESOLVE_TIMEOUT
) -> list[Path]:
    """The jars of Spark's Kafka connector ``version``, fetched with Ivy the first time (then cached).

    As for the broker's jars, the cache entry is built in a temp dir and renamed into place under a
    lock, and is complete when its marker exists.
    """
    return _jars(version, ARTIFACTS, f"spark-sql-kafka-{version}", cache, timeout)


def avro_jars(
    version: str = SPARK_KAFKA_VERSION, *, cache: Path | None = None, timeout: float = maven.RESOLVE_TIMEOUT
) -> list[Path]:
    """The jars of ``spark-avro`` ``version`` (``from_avro``), fetched the first time, then cached."""
    return _jars(version, AVRO_ARTIFACTS, f"spark-avro-{version}", cache, timeout)


def _jars(version: str, artifacts: dict[str, Any], stem: str, cache: Path | None, timeout: float) -> list[Path]:
    module = ivy_module(version, artifacts=artifacts)
    root = cache or maven.cache_root()
    target = root / stem
    if not (target / maven.MARKER).is_file():
        root.mkdir(parents=True, exist_ok=True)
        maven.resolve_module(module, root, target.name, version, timeout)
    jars = sorted(target.glob("*.jar"))
    wanted = [name for _, name, _ in artifacts[version]]
    missing = [n for n in wanted if not any(j.name.startswith(n + "-") for j in jars)]
    if missing:
        raise ServiceError(f"the jar cache {target} lacks {', '.join(missing)}; delete the directory to fetch again")
    return jars


def session_conf(version: str = SPARK_KAFKA_VERSION, *, avro: bool = False) -> dict[str, str]:
    """The Spark conf that puts Spark's Kafka connector ``version`` (and with ``avro`` its ``spark-avro``) on the
    driver's and executors' class path."""
    jars = [*connector_jars(version), *(avro_jars(version) if avro else ())]
    return {"spark.jars": ",".join(str(p) for p in jars)}
