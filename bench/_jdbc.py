"""The PostgreSQL JDBC driver for the benchmarks' Spark JDBC peers, fetched from Maven Central once.

``jdbc_jar()`` returns the path of ``org.postgresql:postgresql:JDBC_VERSION``: ``EOS_JDBC_JAR`` when
set, else the copy in ``${XDG_CACHE_HOME:-~/.cache}/spark-eos/postgresql-jdbc-<version>/``, fetched
there the first time with the Apache Ivy that PySpark ships, by the same resolver code as the
embedded Kafka's jars (``connectors.services.apache_kafka``: Maven Central, or ``EOS_MAVEN_REPO``; a
proxy from ``https_proxy``). A copy already in ``~/.m2`` is used as it is. So the JDBC peer is never
skipped for want of a jar: a machine that cannot fetch it fails with the reason.
"""

from __future__ import annotations

import os
from pathlib import Path

from connectors.services import apache_kafka as _ivy

__all__ = ["JDBC_VERSION", "jdbc_jar"]

JDBC_VERSION = "42.7.14"
ENV = "EOS_JDBC_JAR"


def _module(version: str) -> str:
    return f"""<ivy-module version="2.0">
  <info organisation="spark-eos" module="bench-jdbc"/>
  <configurations><conf name="default"/></configurations>
  <dependencies>
    <dependency org="org.postgresql" name="postgresql" rev="{version}" transitive="false" conf="default->master"/>
  </dependencies>
</ivy-module>
"""


def jdbc_jar(version: str = JDBC_VERSION, *, cache: Path | None = None, timeout: float = 300.0) -> str:
    """The path of the PostgreSQL JDBC jar ``version`` (fetched into the cache the first time)."""
    explicit = os.environ.get(ENV, "").strip()
    if explicit:
        if not os.path.isfile(explicit):
            raise FileNotFoundError(
                f"{ENV}={explicit!r} is not a file; point it at postgresql-<version>.jar or unset it"
            )
        return explicit
    name = f"postgresql-{version}.jar"
    m2 = Path.home() / ".m2/repository/org/postgresql/postgresql" / version / name
    if m2.is_file():
        return str(m2)
    root = cache or _ivy.cache_root()
    target = root / f"postgresql-jdbc-{version}"
    if not (target / _ivy.MARKER).is_file():
        root.mkdir(parents=True, exist_ok=True)

        def check(jars: Path) -> None:
            if not (jars / name).is_file():
                raise FileNotFoundError(
                    f"Ivy resolved org.postgresql:postgresql:{version} but left no {name} in {jars}"
                )

        _ivy.resolve_module(_module(version), root, target.name, version, timeout, check=check)
    return str(target / name)


if __name__ == "__main__":
    print(jdbc_jar())
