"""A client and a Kafka listener that disagree on TLS fail within seconds, naming kafka.security.protocol.

librdkafka reports neither case as an error of its own: a client without TLS meets a TLS listener's close at
its first request (ApiVersion), logged as a disconnect, and the call waiting for metadata times out as if the
broker were down; a TLS client meeting a plaintext listener gets a transport error librdkafka keeps retrying.
The servers here are loopback sockets: one speaks TLS (a certificate of a throwaway CA) and closes a
connection whose handshake fails, the other reads a request and closes, as Kafka's listeners do.
"""

from __future__ import annotations

import socket
import ssl
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import KafkaError

from eos_core import kafka_clients
from eos_core.errors import FatalError


class _Server:
    """Accepts connections on loopback until closed; each one is handed to ``serve`` on a thread."""

    def __init__(self, tls: ssl.SSLContext | None) -> None:
        self.tls, self.accepted = tls, 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._loop, daemon=True).start()

    def _loop(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(5)
            try:
                if self.tls is not None:
                    with self.tls.wrap_socket(conn, server_side=True):
                        pass  # a handshake that completes, then a close
                else:
                    conn.recv(65536)  # a plaintext listener reads the request, sees no Kafka in it, closes
            except (OSError, ssl.SSLError):
                pass

    def close(self) -> None:
        self.sock.close()


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> object:
    from connectors.services.tls import CertificateAuthority

    base = tmp_path_factory.mktemp("tls")
    return CertificateAuthority(base / "ca").issue(base / "server")


@pytest.fixture
def tls_listener(certificate: object) -> Iterator[_Server]:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(certificate.cert), str(certificate.key))  # type: ignore[attr-defined]
    server = _Server(context)
    yield server
    server.close()


@pytest.fixture
def plaintext_listener() -> Iterator[_Server]:
    server = _Server(None)
    yield server
    server.close()


def _connect(conf: dict[str, str], timeout: float = 30.0) -> tuple[str, float]:
    watch = kafka_clients.Watch(conf, "kafka-eos source")
    client = kafka_clients.admin(conf, watch)
    began = time.monotonic()
    deadline = began + timeout
    while True:  # as the connectors retry: connect, then ask the watch before trying again
        try:
            kafka_clients.connect(client, watch, min(5.0, deadline - time.monotonic()))
        except FatalError as exc:
            return str(exc), time.monotonic() - began
        except Exception:
            watch.check(client)
        assert time.monotonic() < deadline, "no FatalError: the mismatch was taken for a broker that is down"


def test_a_client_without_tls_at_a_tls_listener_fails_within_seconds_naming_the_protocol(
    tls_listener: _Server,
) -> None:
    said, took = _connect({"bootstrap.servers": f"127.0.0.1:{tls_listener.port}"})
    assert tls_listener.accepted >= 2  # the client's own connection, then the probe's
    assert took < 10, took
    assert f"127.0.0.1:{tls_listener.port} speaks TLS" in said and "security.protocol PLAINTEXT" in said, said
    assert "set kafka.security.protocol to SSL or SASL_SSL" in said, said


def test_sasl_without_tls_at_a_tls_listener_names_what_it_sent(tls_listener: _Server) -> None:
    conf = {
        "bootstrap.servers": f"127.0.0.1:{tls_listener.port}",
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "app",
        "sasl.password": "s3cret-never-shown",
    }
    said, took = _connect(conf)
    assert took < 10 and "security.protocol SASL_PLAINTEXT" in said and "SASL_SSL" in said, said
    assert "s3cret-never-shown" not in said


def test_a_tls_client_at_a_plaintext_listener_fails_within_seconds_naming_the_protocol(
    plaintext_listener: _Server,
) -> None:
    conf = {"bootstrap.servers": f"127.0.0.1:{plaintext_listener.port}", "security.protocol": "SSL"}
    said, took = _connect(conf)
    assert took < 10, took
    assert "is not TLS" in said and "security.protocol SSL" in said and "PLAINTEXT or SASL_PLAINTEXT" in said, said


def test_a_listener_that_closes_without_tls_stays_a_broker_that_is_down(plaintext_listener: _Server) -> None:
    """A plaintext client whose first request is closed by a listener that does not speak TLS (a broker going
    away) is not a mismatch: the probe finds no TLS and the failure stays the caller's to retry."""
    watch = kafka_clients.Watch({"bootstrap.servers": f"127.0.0.1:{plaintext_listener.port}"}, "test")
    line = (
        f"FAIL [rdkafka#consumer-1] [thrd:127.0.0.1:{plaintext_listener.port}/bootstrap]: "
        f"127.0.0.1:{plaintext_listener.port}/bootstrap: Disconnected: connection closed by peer: receive 0 "
        "after POLLIN (after 3ms in state APIVERSION_QUERY)"
    )
    watch.on_log(line)
    assert plaintext_listener.accepted == 1  # the probe ran ...
    watch.check()  # ... and found no TLS: no FatalError
    watch.on_log(line)
    assert plaintext_listener.accepted == 1  # once per client


def test_librdkafkas_own_words_for_a_plaintext_listener_are_a_refusal() -> None:
    watch = kafka_clients.Watch({"bootstrap.servers": "b:9093", "security.protocol": "SASL_SSL"}, "kafka-eos sink")
    watch.on_error(
        KafkaError(
            KafkaError._TRANSPORT,
            "sasl_ssl://b:9093/bootstrap: SSL handshake failed: Disconnected: SSL connection closed by peer: "
            "connecting to a PLAINTEXT broker listener? (after 3ms in state SSL_HANDSHAKE)",
        )
    )
    with pytest.raises(FatalError, match="the listener at b:9093 is not TLS") as caught:
        watch.check()
    assert "kafka-eos sink:" in str(caught.value)


def test_a_broker_that_refuses_connections_is_no_refusal() -> None:
    watch = kafka_clients.Watch({"bootstrap.servers": "127.0.0.1:1"}, "test")
    watch.on_error(KafkaError(KafkaError._TRANSPORT, "127.0.0.1:1/bootstrap: Connect to ipv4#127.0.0.1:1 failed"))
    watch.on_log("FAIL [x] [thrd:127.0.0.1:1/bootstrap]: 127.0.0.1:1/bootstrap: Connect to ipv4#127.0.0.1:1 failed")
    watch.check()  # no FatalError


@pytest.mark.parametrize("make", [kafka_clients.consumer, kafka_clients.producer, kafka_clients.admin])
def test_every_client_made_here_answers_check_with_the_refusal_its_watch_recorded(make: Any) -> None:
    """A retry loop holding only the client (the sink's marker readers, the publish's reader, the source's
    kept consumers) asks ``kafka_clients.check(client)`` between its tries."""
    conf = {"bootstrap.servers": "127.0.0.1:1", "group.id": "g", "security.protocol": "SASL_SSL"}
    conf |= {"sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "app", "sasl.password": "secret-pw"}
    settings = conf if make is kafka_clients.consumer else {k: v for k, v in conf.items() if k != "group.id"}
    watch = kafka_clients.Watch(settings, "kafka-eos sink marker reader")
    client = make(settings, watch)
    kafka_clients.check(client)  # nothing refused yet
    watch.on_error(KafkaError(KafkaError._AUTHENTICATION, "SASL authentication error: invalid credentials"))
    with pytest.raises(FatalError, match="refused the login of principal 'app' with SCRAM-SHA-512") as caught:
        kafka_clients.check(client)
    assert "secret-pw" not in str(caught.value)
    kafka_clients.check(object())  # a client made elsewhere has no watch to ask


def test_an_admin_client_refreshes_its_metadata_every_few_seconds_unless_told_otherwise(monkeypatch) -> None:
    """librdkafka sends DescribeTopics, CreateTopics, the ACL and the config requests to the controller its metadata
    last named: with its 5-minute refresh, a dead one held them for their whole timeout (crash matrix F31)."""
    made: list[dict[str, Any]] = []

    class _Admin:
        def __init__(self, conf: dict[str, Any]) -> None:
            made.append(conf)

    monkeypatch.setattr(kafka_clients, "AdminClient", _Admin)
    watch = kafka_clients.Watch({"bootstrap.servers": "127.0.0.1:1"}, "test")
    kafka_clients.admin({"bootstrap.servers": "127.0.0.1:1"}, watch)
    kafka_clients.admin({"bootstrap.servers": "127.0.0.1:1", "topic.metadata.refresh.interval.ms": 60000}, watch)
    assert [c["topic.metadata.refresh.interval.ms"] for c in made] == [5000, 60000]
