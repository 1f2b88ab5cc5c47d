"""The class-data-sharing archive of Spark's classes (connectors/services/spark_cds.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from connectors.services import spark_cds


def test_enable_names_the_archive_after_the_options_already_set(monkeypatch, tmp_path: Path) -> None:
    built: list[str] = []

    def build(base: str) -> Path:
        built.append(base)
        return tmp_path / "spark-x.jsa"

    monkeypatch.setattr(spark_cds, "build_archive", build)
    env = {"JDK_JAVA_OPTIONS": "-XX:+UseSerialGC"}
    assert spark_cds.enable(env) == tmp_path / "spark-x.jsa"
    assert built == ["-XX:+UseSerialGC"]  # the dump runs with the options its users run with
    assert env["JDK_JAVA_OPTIONS"] == f"-XX:+UseSerialGC -XX:SharedArchiveFile={tmp_path}/spark-x.jsa {spark_cds.QUIET}"
    # a second call, or a user's own archive: kept as it is, nothing built
    before = dict(env)
    assert spark_cds.enable(env) is None and env == before and len(built) == 1


def test_a_failed_build_or_eos_spark_cds_0_leaves_the_options_as_they_were(monkeypatch) -> None:
    monkeypatch.setattr(spark_cds, "build_archive", lambda base: None)
    env: dict[str, str] = {}
    assert spark_cds.enable(env) is None and env == {}
    monkeypatch.setattr(spark_cds, "build_archive", lambda base: pytest.fail("EOS_SPARK_CDS=0: nothing is built"))
    env = {"EOS_SPARK_CDS": "0"}
    assert spark_cds.enable(env) is None and env == {"EOS_SPARK_CDS": "0"}


def test_the_archive_is_named_by_the_jdk_and_every_jar(monkeypatch, tmp_path: Path) -> None:
    """A Spark upgraded or reinstalled (a jar of another size or time) gets an archive of its own."""
    home = tmp_path / "spark"
    (home / "jars").mkdir(parents=True)
    jar = home / "jars" / "spark-core.jar"
    jar.write_bytes(b"x" * 10)
    monkeypatch.setattr(spark_cds, "_java_version", lambda: "openjdk 17.0.15")
    first = spark_cds._digest(home)
    assert spark_cds._digest(home) == first
    os.utime(jar, ns=(1, 1))
    second = spark_cds._digest(home)
    assert second != first
    monkeypatch.setattr(spark_cds, "_java_version", lambda: "openjdk 21.0.1")
    assert spark_cds._digest(home) not in (first, second)


def test_an_existing_archive_is_used_without_a_build(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(spark_cds, "_digest", lambda home: "abc")
    path = tmp_path / "spark-eos" / "cds" / "spark-abc.jsa"
    path.parent.mkdir(parents=True)
    path.write_bytes(b"archive")
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("no build expected"))
    assert spark_cds.build_archive() == path


def test_a_build_that_writes_no_archive_gives_none_and_leaves_nothing(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(spark_cds, "_digest", lambda home: "abc")
    monkeypatch.setattr(spark_cds.sys, "executable", shutil.which("false") or "/bin/false")
    assert spark_cds.build_archive() is None
    assert [p.name for p in (tmp_path / "spark-eos" / "cds").iterdir()] == ["spark-abc.jsa.lock"]


def test_a_jvm_that_cannot_use_the_archive_starts_and_says_nothing(tmp_path: Path) -> None:
    """The Kafka broker's JVM gets the same JDK_JAVA_OPTIONS: an archive of other classes is ignored quietly."""
    junk = tmp_path / "other.jsa"
    junk.write_bytes(b"not an archive")
    env = {k: v for k, v in os.environ.items() if k != "JDK_JAVA_OPTIONS"}
    env["JDK_JAVA_OPTIONS"] = spark_cds.archive_options(junk)
    out = subprocess.run(["java", "-version"], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = [line for line in out.stderr.splitlines() if not line.startswith("NOTE: Picked up")]
    assert not [line for line in lines if "cds" in line.lower() or "archive" in line.lower()], out.stderr


def test_spark_jvms_of_the_suite_load_sparks_classes_from_the_archive(tmp_path: Path) -> None:
    """conftest.py enabled it: a spark-submit JVM maps SparkSubmit from the archive, not from its jar."""
    options = os.environ.get("JDK_JAVA_OPTIONS", "")
    if os.environ.get(spark_cds.CDS_ENV) == "0":  # a user's choice, never CI's: then no archive is named
        assert "-XX:SharedArchiveFile=" not in options, options
        return
    assert "-XX:SharedArchiveFile=" in options, options
    home = spark_cds.spark_home()
    # to files, one per JVM: spark-submit reads the launcher JVM's standard output as the command to run
    env = dict(os.environ, JDK_JAVA_OPTIONS=f"{options} -Xlog:class+load=info:file={tmp_path}/load-%p.log")
    out = subprocess.run(
        [str(home / "bin" / "spark-submit"), "--version"], capture_output=True, text=True, env=env, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    loaded = [
        line
        for log in tmp_path.glob("load-*.log")
        for line in log.read_text().splitlines()
        if "org.apache.spark.deploy.SparkSubmit " in line
    ]
    assert len(loaded) == 1 and "shared objects file (top)" in loaded[0], loaded
