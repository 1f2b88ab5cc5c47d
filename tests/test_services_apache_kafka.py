"""The embedded Apache Kafka without a broker: its configuration, the jar cache and the broker choice."""

from __future__ import annotations

import base64
import json
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path

import pytest

from connectors.services import _proc, embedded_kafka_kind, manage, maven
from connectors.services import apache_kafka as ak
from eos_core.errors import ServiceError


# ---- server.properties ----------------------------------------------------------------------------
def test_broker_properties_single_node_kraft(tmp_path: Path) -> None:
    props = ak.broker_properties(port=9092, controller_port=9093, data_dir=tmp_path / "data")
    assert props["process.roles"] == "broker,controller" and props["node.id"] == "1"
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:9092,CONTROLLER://127.0.0.1:9093"
    assert props["advertised.listeners"] == "PLAINTEXT://127.0.0.1:9092"
    assert props["controller.quorum.voters"] == "1@127.0.0.1:9093"
    assert props["log.dirs"] == str(tmp_path / "data")
    # one replica everywhere and small internal topics: a single node must serve transactions and groups
    for key in ("offsets.topic.replication.factor", "transaction.state.log.replication.factor"):
        assert props[key] == "1"
    assert props["transaction.state.log.min.isr"] == "1"
    assert int(props["offsets.topic.num.partitions"]) <= 8
    assert int(props["transaction.state.log.num.partitions"]) <= 8
    assert props["group.initial.rebalance.delay.ms"] == "0" and props["num.partitions"] == "1"
    assert "auto.create.topics.enable" not in props  # Kafka's default
    assert set(ak.MANAGED_KEYS) & set(props) >= {"listeners", "log.dirs", "node.id", "process.roles"}


def test_config_overrides_defaults_and_converts_values(tmp_path: Path) -> None:
    props = ak.broker_properties(
        port=1,
        controller_port=2,
        data_dir=tmp_path,
        config={
            "log.segment.bytes": 1048576,
            "log.retention.check.interval.ms": "1000",
            "auto.create.topics.enable": False,
            "num.partitions": "3",  # a default of ours, overridden
        },
    )
    assert props["log.segment.bytes"] == "1048576"
    assert props["log.retention.check.interval.ms"] == "1000"
    assert props["auto.create.topics.enable"] == "false"
    assert props["num.partitions"] == "3"


@pytest.mark.parametrize("key", ["listeners", "log.dirs", "node.id", "controller.quorum.voters", "process.roles"])
def test_config_cannot_override_what_the_service_manages(key: str) -> None:
    with pytest.raises(ServiceError, match=rf"config\['{key}'\] is set by the embedded Apache Kafka itself"):
        ak.validate_config({key: "x"})


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"log segment": "1"}, "is not a Kafka broker setting name"),
        ({"": "1"}, "is not a Kafka broker setting name"),
        ({"log.segment.bytes": None}, r"a broker setting is a string .* not NoneType"),
        ({"log.segment.bytes": [1]}, r"not list"),
        ({"log.segment.bytes": "1\0"}, "NUL"),
    ],
)
def test_config_refuses_bad_entries(config: dict[str, object], message: str) -> None:
    with pytest.raises(ServiceError, match=message):
        ak.validate_config(config)


def test_ports_are_checked(tmp_path: Path) -> None:
    with pytest.raises(ServiceError, match="both 5; the broker needs two ports"):
        ak.broker_properties(port=5, controller_port=5, data_dir=tmp_path)
    with pytest.raises(ServiceError, match="port=70000 is not a TCP port"):
        ak.broker_properties(port=70000, controller_port=5, data_dir=tmp_path)


def test_advertised_port_is_the_address_clients_are_given(tmp_path: Path) -> None:
    # F9's broker listens on 9092 and sends every client to a proxy on 19092
    props = ak.broker_properties(port=9092, controller_port=9093, data_dir=tmp_path, advertised_port=19092)
    assert props["advertised.listeners"] == "PLAINTEXT://127.0.0.1:19092"
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:9092,CONTROLLER://127.0.0.1:9093"  # it still listens on port
    assert props["controller.quorum.voters"] == "1@127.0.0.1:9093"
    default = ak.broker_properties(port=9092, controller_port=9093, data_dir=tmp_path, advertised_port=None)
    assert default["advertised.listeners"] == "PLAINTEXT://127.0.0.1:9092"
    for bad in (0, 70000, -1, True, "19092"):
        with pytest.raises(ServiceError, match=rf"advertised_port={bad!r} is not a TCP port"):
            ak.broker_properties(port=9092, controller_port=9093, data_dir=tmp_path, advertised_port=bad)  # type: ignore[arg-type]
    with pytest.raises(ServiceError, match="advertised_port and controller_port are both 9093"):
        ak.broker_properties(port=9092, controller_port=9093, data_dir=tmp_path, advertised_port=9093)
    with pytest.raises(ServiceError, match=r"config\['advertised.listeners'\] is set by the embedded Apache Kafka"):
        ak.validate_config({"advertised.listeners": "PLAINTEXT://127.0.0.1:1"})


def test_a_bad_advertised_port_fails_before_anything_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_jars(*args: object, **kwargs: object) -> None:
        raise AssertionError("jars must not be looked up for a broker that cannot work")

    monkeypatch.setattr(ak, "kafka_jars", no_jars)
    with pytest.raises(ServiceError, match="advertised_port=0 is not a TCP port"):
        ak.ApacheKafka(advertised_port=0)


def test_a_bad_config_fails_before_anything_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_jars(*args: object, **kwargs: object) -> None:
        raise AssertionError("jars must not be looked up for a config that cannot work")

    monkeypatch.setattr(ak, "kafka_jars", no_jars)
    with pytest.raises(ServiceError, match=r"config\['log.dirs'\]"):
        ak.ApacheKafka(config={"log.dirs": "/tmp/elsewhere"})


def test_render_properties_escapes_like_java_properties() -> None:
    text = ak.render_properties({"a.b": "x=y:z", "odd key": " lead\\back\nline", "c": "#not a comment"}, "hi\nthere")
    assert text.splitlines() == [
        "# hi",
        "# there",
        "a.b=x=y:z",  # separators in a value need no escape
        "odd\\ key=\\ lead\\\\back\\nline",
        "c=\\#not a comment",
    ]


def test_log4j_config_writes_to_the_file_only(tmp_path: Path) -> None:
    text = ak.log4j2_properties(tmp_path / "server.log", "info")
    lines = dict(line.split("=", 1) for line in text.splitlines())
    assert lines["appender.file.fileName"] == str(tmp_path / "server.log")
    assert lines["rootLogger.level"] == "INFO"
    assert "Console" not in text and "stdout" not in text.lower()
    with pytest.raises(ServiceError, match="log_level='LOUD' is not one of"):
        ak.log4j2_properties(tmp_path / "x", "loud")


def test_jvm_options(tmp_path: Path) -> None:
    opts = ak.jvm_options(heap="512m", log4j_config=tmp_path / "l.properties", base=tmp_path)
    assert "-Xmx512m" in opts and "-Xms256m" in opts and "-XX:+UseSerialGC" in opts
    assert f"-Dlog4j2.configurationFile={tmp_path / 'l.properties'}" in opts
    assert "-Xms128m" in ak.jvm_options(heap="128m", log4j_config=tmp_path, base=tmp_path)
    assert "-Xms256m" in ak.jvm_options(heap="2g", log4j_config=tmp_path, base=tmp_path)
    with pytest.raises(ServiceError, match="heap='lots' is not a JVM memory size"):
        ak.jvm_options(heap="lots", log4j_config=tmp_path, base=tmp_path)


def test_cluster_id_is_a_kafka_uuid() -> None:
    for _ in range(50):
        cid = ak.cluster_id()
        assert len(cid) == 22 and not cid.startswith("-")
        assert len(base64.urlsafe_b64decode(cid + "==")) == 16


# ---- versions, places, programs -----------------------------------------------------------------
def test_kafka_version() -> None:
    assert ak.kafka_version(environ={}) == ak.KAFKA_VERSION
    assert ak.kafka_version(environ={"EOS_KAFKA_VERSION": "4.1.1"}) == "4.1.1"
    assert ak.kafka_version("4.2.0", environ={"EOS_KAFKA_VERSION": "4.1.1"}) == "4.2.0"
    with pytest.raises(ServiceError, match=r"EOS_KAFKA_VERSION='latest' is not a Kafka version"):
        ak.kafka_version(environ={"EOS_KAFKA_VERSION": "latest"})
    with pytest.raises(ServiceError, match=r"needs Kafka 4.x or later.*EOS_KAFKA_BOOTSTRAP"):
        ak.kafka_version("3.9.0", environ={})


def test_cache_root(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert maven.cache_root({"XDG_CACHE_HOME": str(tmp_path)}) == tmp_path / "spark-eos"
    monkeypatch.setenv("HOME", str(tmp_path))
    assert maven.cache_root({}) == tmp_path / ".cache" / "spark-eos"


def test_proxy_options() -> None:
    assert maven.proxy_options({}) == []
    opts = maven.proxy_options({"https_proxy": "http://proxy.corp:3128", "NO_PROXY": "localhost,.corp.example"})
    assert "-Dhttps.proxyHost=proxy.corp" in opts and "-Dhttps.proxyPort=3128" in opts
    assert "-Dhttp.nonProxyHosts=*localhost|localhost|*corp.example|corp.example" in opts
    assert maven.proxy_options({"HTTP_PROXY": "proxy:8080"}) == ["-Dhttp.proxyHost=proxy", "-Dhttp.proxyPort=8080"]


def test_java_and_ivy_missing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    with pytest.raises(ServiceError, match="is not an executable file"):
        maven.java_binary(str(tmp_path / "java"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ServiceError, match=r"needs Java 17.*apt-get install.*EOS_KAFKA_BOOTSTRAP"):
        maven.java_binary(environ={})
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(
        ServiceError, match=r"no Apache Ivy jar.*pip install pyspark.*EOS_KAFKA_JARS.*EOS_KAFKA_BOOTSTRAP"
    ):
        maven.ivy_jar()


def test_ivy_files_are_xml(tmp_path: Path) -> None:
    module = ET.fromstring(ak.ivy_module("4.1.1"))
    deps = {(d.get("org"), d.get("name"), d.get("rev")) for d in module.iter("dependency")}
    assert ("org.apache.kafka", "kafka_2.13", "4.1.1") in deps
    assert any(name == "log4j-slf4j-impl" for _, name, _ in deps)  # the broker logs through SLF4J
    settings = ET.fromstring(maven.ivy_settings(tmp_path / 'a"b', "https://mirror.example/m2"))
    assert settings.find("caches").get("defaultCacheDir") == str(tmp_path / 'a"b')  # type: ignore[union-attr]
    assert settings.find("resolvers/ibiblio").get("root") == "https://mirror.example/m2/"  # type: ignore[union-attr]
    argv = maven.ivy_command("java", Path("ivy.jar"), Path("s.xml"), Path("i.xml"), tmp_path)
    assert argv[argv.index("-retrieve") + 1] == f"{tmp_path}/[artifact]-[revision](-[classifier]).[ext]"
    assert argv[argv.index("-confs") + 1] == "default"


# ---- the jar cache, with Ivy replaced by a fake --------------------------------------------------
class FakeIvy:
    """Stands in for ``_run_ivy``: writes the jars a resolution of ``version`` retrieves, counts runs."""

    def __init__(self, *, delay: float = 0.0, fail: bool = False, jars: Sequence[str] | None = None) -> None:
        self.calls = 0
        self.delay = delay
        self.fail = fail
        self.jars = jars
        self._lock = threading.Lock()

    def __call__(self, argv: Sequence[str], *, log_path: Path, timeout: float, **_: str) -> None:
        with self._lock:
            self.calls += 1
        time.sleep(self.delay)
        if self.fail:
            raise ServiceError("fetching the Apache Kafka jars with Ivy failed (exit code 1): fake")
        target = Path(argv[argv.index("-retrieve") + 1]).parent
        version = ET.parse(argv[argv.index("-ivy") + 1]).getroot().find("dependencies/dependency").get("rev")  # type: ignore[union-attr]
        target.mkdir(parents=True)
        names = self.jars or [
            f"kafka_2.13-{version}.jar",
            f"kafka-clients-{version}.jar",
            "log4j-core-2.25.5.jar",
            "log4j-slf4j-impl-2.25.5.jar",
        ]
        for name in names:
            (target / name).write_bytes(b"PK")


def test_resolve_once_then_from_the_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake = FakeIvy()
    monkeypatch.setattr(maven, "_run_ivy", fake)
    jars = ak.resolve_jars("4.1.1", cache=tmp_path)
    assert jars == tmp_path / "kafka-4.1.1" and fake.calls == 1
    marker = json.loads((jars / ak.MARKER).read_text())
    assert marker["version"] == "4.1.1" and "kafka_2.13-4.1.1.jar" in marker["jars"]
    assert "-retrieve" in marker["command"]
    assert ak.resolve_jars("4.1.1", cache=tmp_path) == jars and fake.calls == 1  # the marker says: done
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kafka-4.1.1", "kafka-4.1.1.lock"]  # no temp dir left


def test_concurrent_resolvers_fetch_once(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake = FakeIvy(delay=0.5)
    monkeypatch.setattr(maven, "_run_ivy", fake)
    results: list[Path | BaseException] = []

    def resolve() -> None:
        try:
            results.append(ak.resolve_jars("4.1.1", cache=tmp_path))
        except BaseException as e:
            results.append(e)

    threads = [threading.Thread(target=resolve) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert results == [tmp_path / "kafka-4.1.1"] * 3 and fake.calls == 1


def test_a_failed_resolution_leaves_nothing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(maven, "_run_ivy", FakeIvy(fail=True))
    with pytest.raises(ServiceError, match="Ivy failed"):
        ak.resolve_jars("4.1.1", cache=tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["kafka-4.1.1.lock"]
    monkeypatch.setattr(maven, "_run_ivy", FakeIvy(jars=["kafka_2.13-4.1.1.jar", "kafka-clients-4.1.1.jar"]))
    with pytest.raises(ServiceError, match=r"lacks log4j-core-, log4j-slf4j-impl-\*\.jar"):
        ak.resolve_jars("4.1.1", cache=tmp_path)
    fake = FakeIvy()
    monkeypatch.setattr(maven, "_run_ivy", fake)
    assert (ak.resolve_jars("4.1.1", cache=tmp_path) / ak.MARKER).is_file() and fake.calls == 1


def test_a_stale_temp_dir_of_a_dead_resolver_is_removed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / ".kafka-4.1.1-dead").mkdir()
    (tmp_path / "kafka-4.1.1").mkdir()  # no marker: not a finished resolution
    monkeypatch.setattr(maven, "_run_ivy", FakeIvy())
    jars = ak.resolve_jars("4.1.1", cache=tmp_path)
    assert (jars / ak.MARKER).is_file() and not (tmp_path / ".kafka-4.1.1-dead").exists()


def test_the_real_ivy_runner_reports_failures(tmp_path: Path) -> None:
    java = maven.java_binary()
    with pytest.raises(ServiceError, match=r"(?s)Ivy failed \(exit code 1\).*EOS_MAVEN_REPO.*EOS_KAFKA_JARS"):
        hint = "Alternatively set EOS_KAFKA_JARS"
        maven._run_ivy(
            [java, "-cp", str(tmp_path), "NoSuchClass"], log_path=tmp_path / "ivy.log", timeout=60, hint=hint
        )


def test_named_jar_directory(tmp_path: Path) -> None:
    with pytest.raises(ServiceError, match=r"EOS_KAFKA_JARS='.*' does not hold the Kafka broker jars"):
        ak.kafka_jars(environ={"EOS_KAFKA_JARS": str(tmp_path)})
    for name in ("kafka_2.13-4.1.1.jar", "kafka_2.13-4.1.1-sources.jar", "kafka-clients-4.1.1.jar"):
        (tmp_path / name).write_bytes(b"PK")
    assert ak.kafka_jars(environ={"EOS_KAFKA_JARS": str(tmp_path)}) == (tmp_path, "4.1.1")
    with pytest.raises(ServiceError, match=r"holds Kafka 4\.1\.1, not 4\.2\.0"):
        ak.kafka_jars("4.2.0", environ={"EOS_KAFKA_JARS": str(tmp_path)})


# ---- which broker, and the CLI's record of it -----------------------------------------------------
def test_embedded_kafka_kind() -> None:
    assert embedded_kafka_kind({}) == "apache"
    assert embedded_kafka_kind({"EOS_KAFKA_EMBEDDED": " Tansu "}) == "tansu"
    assert embedded_kafka_kind({"EOS_KAFKA_EMBEDDED": "apache"}) == "apache"
    with pytest.raises(ServiceError, match=r"EOS_KAFKA_EMBEDDED='redpanda' is not one of apache, tansu"):
        embedded_kafka_kind({"EOS_KAFKA_EMBEDDED": "redpanda"})


def test_services_up_accepts_a_broker_choice() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    manage.add_subparser(parser.add_subparsers(dest="command"))
    assert parser.parse_args(["services", "up", "--kafka-broker", "tansu"]).kafka_broker == "tansu"
    assert parser.parse_args(["services", "up"]).kafka_broker is None


def test_a_recorded_jvm_is_recognised_by_its_arguments() -> None:
    proc = _proc.spawn(["sleep", "30"])
    try:
        entry = {"pid": proc.pid, "program": "/bin/sleep"}
        assert manage._is_ours(entry)
        assert manage._is_ours({**entry, "cmdline_contains": "30"})
        assert not manage._is_ours({**entry, "cmdline_contains": "/tmp/other/server.properties"})
    finally:
        _proc.stop_group(proc, proc.pid, grace=1.0)
    assert not manage._is_ours({"pid": proc.pid, "program": "/bin/sleep"})


def test_the_broker_names_its_own_class_archive_not_one_inherited(monkeypatch: pytest.MonkeyPatch) -> None:
    """Spark's archive in JDK_JAVA_OPTIONS (connectors/services/spark_cds.py) would be read as the base of the
    broker's first recording, and its JVM would refuse to start: the broker's environment drops it."""
    spark = "-XX:TieredStopAtLevel=1 -XX:SharedArchiveFile=/c/spark-1.jsa -Xlog:cds=off -Xlog:cds+dynamic=off -Xmx1g"
    monkeypatch.setenv("JDK_JAVA_OPTIONS", spark)
    assert ak._broker_env()["JDK_JAVA_OPTIONS"] == "-XX:TieredStopAtLevel=1 -Xmx1g"
    assert ak.without_class_archives("-XX:ArchiveClassesAtExit=/c/x.jsa -Xss1m") == "-Xss1m"
    monkeypatch.delenv("JDK_JAVA_OPTIONS")
    assert "JDK_JAVA_OPTIONS" not in ak._broker_env()
