"""kafka-eos's driver-side offset look-ups across a broker restart and added partitions (no broker: a fake admin).

On a real broker (integration/test_kafka_broker_faults.py, F21 and F24) librdkafka's ListOffsets fails at once
while a restarted broker has no leader yet, with the leader epoch of before the restart, or for a partition
its cached metadata does not have yet; fetchOffset.numRetries x fetchOffset.retryIntervalMs (3 x 10 ms) used
to give up within milliseconds and fail the query.
"""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from eos_core.errors import ServiceError
from sources.kafka import client as client_module
from sources.kafka.client import KafkaMetadataClient
from sources.kafka.offsets import TopicPartition

TP = TopicPartition("t", 0)


class _Future:
    def __init__(self, offset: int | None, error: int | None) -> None:
        self.offset, self.error = offset, error

    def result(self, timeout: float | None = None) -> Any:
        if self.error is not None:
            raise KafkaException(KafkaError(self.error))
        return type("Info", (), {"offset": self.offset})()


class _Admins:
    """Hands out admin clients; each answers ListOffsets with the next error code of the script (None: offset 7),
    then with ``forever``; with ``stale``, the first client answers that error always (its metadata is old)."""

    def __init__(self, script: list[int | None], stale: int | None = None, forever: int | None = None) -> None:
        self.script, self.stale, self.forever = list(script), stale, forever
        self.made = 0
        self.calls = 0

    def make(self) -> Any:
        self.made += 1
        number = self.made
        admins = self

        class Admin:
            def list_offsets(self, request: dict[Any, Any], **kwargs: Any) -> dict[Any, _Future]:
                admins.calls += 1
                if admins.stale is not None and number == 1:
                    code: int | None = admins.stale  # the first client's metadata lacks the partition
                else:
                    code = admins.script.pop(0) if admins.script else admins.forever
                return {ctp: _Future(7, code) for ctp in request}

        return Admin()


@pytest.fixture
def no_sleep(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    slept: list[float] = []
    monkeypatch.setattr(client_module.time, "sleep", slept.append)
    return slept


def _client(monkeypatch: pytest.MonkeyPatch, admins: _Admins, timeout_ms: int = 120_000) -> KafkaMetadataClient:
    c = KafkaMetadataClient(
        {"bootstrap.servers": "127.0.0.1:1"},
        timeout_ms=timeout_ms,
        retries=3,
        retry_interval_ms=10,
        read_committed=False,
    )

    def admin() -> Any:
        if c._admin is None:
            c._admin = admins.make()
        return c._admin

    monkeypatch.setattr(c, "admin", admin)
    return c


@pytest.mark.parametrize(
    "code",
    [
        KafkaError._NOENT,
        KafkaError.FENCED_LEADER_EPOCH,
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.OFFSET_NOT_AVAILABLE,
        KafkaError._TRANSPORT,
    ],
)
def test_offsets_wait_for_a_restarted_broker_within_poll_timeout(
    monkeypatch: pytest.MonkeyPatch, no_sleep: list[float], code: int
) -> None:
    # more failures than fetchOffset.numRetries: a broker restart takes seconds, not 3 x 10 ms
    admins = _Admins([code] * 8)
    c = _client(monkeypatch, admins)
    assert c.latest([TP]) == {TP: 7}
    assert admins.calls == 9 and admins.made == 9  # each look-up with a fresh client (fresh metadata)
    assert len(no_sleep) == 8 and all(s <= 0.25 for s in no_sleep)


def test_a_leader_that_never_comes_fails_after_poll_timeout_per_attempt(
    monkeypatch: pytest.MonkeyPatch, no_sleep: list[float]
) -> None:
    admins = _Admins([], forever=KafkaError.FENCED_LEADER_EPOCH)
    c = _client(monkeypatch, admins, timeout_ms=30)
    with pytest.raises(ServiceError, match=r"fetching offsets failed .* after 4 attempt\(s\).*FENCED_LEADER_EPOCH"):
        c.latest([TP])


def test_a_partition_the_cached_metadata_lacks_is_asked_for_by_a_fresh_client(
    monkeypatch: pytest.MonkeyPatch, no_sleep: list[float]
) -> None:
    admins = _Admins([], stale=KafkaError._UNKNOWN_PARTITION)  # partitions just added
    c = _client(monkeypatch, admins)
    assert c.latest([TP]) == {TP: 7}
    assert admins.made == 2 and admins.calls == 2


def test_other_errors_are_not_waited_for(monkeypatch: pytest.MonkeyPatch, no_sleep: list[float]) -> None:
    admins = _Admins([KafkaError.TOPIC_AUTHORIZATION_FAILED] * 10)
    c = _client(monkeypatch, admins)
    with pytest.raises(ServiceError, match="TOPIC_AUTHORIZATION_FAILED"):
        c.latest([TP])
    assert admins.calls == 1  # fatal: neither waited for nor retried


def test_closing_a_consumer_is_bounded_when_librdkafka_hangs(caplog: pytest.LogCaptureFixture) -> None:
    """A query's stop waits for its source's stop(): a consumer whose close() hangs (librdkafka has no close
    timeout) must not hold it."""
    import threading
    import time

    from sources.kafka.client import _close_within

    released = threading.Event()

    class Hanging:
        def close(self) -> None:
            released.wait(30)

    t0 = time.monotonic()
    _close_within(Hanging(), "the metadata consumer", 0.3)  # type: ignore[arg-type]
    assert time.monotonic() - t0 < 5
    assert "closing the metadata consumer took over" in caplog.text
    released.set()
