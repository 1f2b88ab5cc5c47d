"""The Schema Registry service (Apicurio Registry, Confluent's API), as tests and `spark-eos services` run it:
on loopback only, spoken to by confluent-kafka's own client and Avro serdes, crashed and started again, and
kept by `services up --with-registry` until `services down`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from connectors.services import _proc
from connectors.services.schema_registry import URL_ENV, ApicurioRegistry, confluent_client, registry_answers

pytestmark = [pytest.mark.integration]

PAYMENT = (
    '{"type": "record", "name": "Payment", "namespace": "shop", "fields": ['
    '{"name": "id", "type": "string"}, {"name": "amount", "type": "long"}]}'
)


@pytest.fixture
def registry(schema_registry: object) -> ApicurioRegistry:
    if not isinstance(schema_registry, ApicurioRegistry):
        pytest.fail(f"{URL_ENV} names a registry of the user's: these tests run the embedded one (unset it)")
    return schema_registry


def _listening(pids: list[int]) -> list[str]:
    """The local addresses of the TCP sockets in LISTEN state that ``pids`` hold (from /proc)."""
    inodes = set()
    for pid in pids:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            cols = line.split()
            if cols[3] == "0A" and cols[9] in inodes:  # 0A: LISTEN
                found.append(cols[1])
    return found


def _loopback(hex_address: str) -> bool:
    host = hex_address.split(":")[0]
    if len(host) == 8:  # IPv4, little-endian: 0100007F is 127.0.0.1
        return host.endswith("7F")
    return host in ("00000000000000000000000001000000", "0000000000000000FFFF00000100007F")  # ::1, ::ffff:127.0.0.1


def test_the_registry_listens_on_loopback_only_and_speaks_confluents_api(registry: ApicurioRegistry) -> None:
    from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    from connectors.services.schema_registry import confluent_client

    addresses = _listening(_proc.process_tree(registry.pid))
    assert addresses and all(_loopback(a) for a in addresses), addresses  # no management port on 0.0.0.0:9000
    assert registry.url.startswith("http://127.0.0.1:") and registry.url.endswith("/apis/ccompat/v7")

    with confluent_client(registry.url) as client:
        ctx = SerializationContext("payments", MessageField.VALUE)
        encoded = AvroSerializer(client, PAYMENT)({"id": "p-1", "amount": 42}, ctx)
        assert encoded is not None
        latest = client.get_latest_version("payments-value")
        # Confluent's wire format: magic byte 0, the schema id (big-endian), then the Avro body
        assert encoded[0] == 0 and int.from_bytes(encoded[1:5], "big") == latest.schema_id
        assert AvroDeserializer(client)(encoded, ctx) == {"id": "p-1", "amount": 42}
        assert client.get_schema(latest.schema_id).schema_str.replace(" ", "") == PAYMENT.replace(" ", "")


def test_a_crashed_registry_is_gone_and_back_and_a_stopped_one_keeps_its_schemas_and_its_archive(
    registry: ApicurioRegistry,
) -> None:
    from confluent_kafka.schema_registry import Schema

    with confluent_client(registry.url) as client:
        sid = client.register_schema("orders-value", Schema(PAYMENT, "AVRO"))
    old = registry.pid
    registry.crash()
    assert not _proc.pid_alive(old) and not registry_answers(registry.url, timeout=1.0)
    registry.start()
    assert registry.pid != old and registry_answers(registry.url)
    with confluent_client(registry.url) as client:  # registered again after a crash that lost it
        sid = client.register_schema("orders-value", Schema(PAYMENT, "AVRO"))
    # a clean stop (restart: SIGTERM, then a new JVM) keeps the schemas (its H2 file) and leaves the class-data
    # archive later starts map
    registry.restart()
    assert registry.archive.is_file() and registry_answers(registry.url), registry.archive
    with confluent_client(registry.url) as client:
        assert "orders-value" in client.get_subjects() and client.get_schema(sid).schema_str


def test_services_up_with_registry_keeps_it_until_down(tmp_path: Path) -> None:
    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "connectors.cli", "services", *args, "--state-dir", str(tmp_path)]
        return subprocess.run(argv, capture_output=True, text=True, timeout=300)

    up = cli("up", "--no-kafka", "--no-postgres", "--with-registry")
    assert up.returncode == 0, up.stdout + up.stderr
    assert "registry  url http://127.0.0.1:" in up.stdout and "Apicurio Registry" in up.stdout, up.stdout
    try:
        env = cli("env")
        url = next(ln.split("=", 1)[1] for ln in env.stdout.splitlines() if ln.startswith(f"export {URL_ENV}="))
        assert registry_answers(url), env.stdout  # outlived the command that started it
        status = cli("status")
        assert status.returncode == 0 and "registry  up" in status.stdout, status.stdout
    finally:
        down = cli("down")
    assert down.returncode == 0 and "registry  stopped" in down.stdout, down.stdout + down.stderr
    assert not registry_answers(url, timeout=1.0)
    assert cli("status").returncode == 3
