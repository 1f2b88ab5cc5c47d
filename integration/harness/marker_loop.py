"""``python -m integration.harness.marker_loop BOOTSTRAP SINK_ID TOPIC STOP_FILE``: read a ``kafka-eos``
sink's markers in a loop, as the sink (``read_marker``, ``read_slot_markers``), the CLI's ``kafka-sink status``
(``sink_markers``) and the topic checker (``marker_batches``) read them, until ``STOP_FILE`` exists; then print
what happened as one JSON line: reads that answered, retriable failures with their messages, and any other
error. Run as a child so that a read that kills its process (librdkafka#5040's SIGSEGV) shows as its exit
status, not as the test's death."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from confluent_kafka.admin import AdminClient

from connectors.toolkit.topic_checker import marker_batches
from eos_core.errors import RetriableError, ServiceError
from sinks.kafka.markers import publish_name, read_marker, read_slot_markers
from sinks.kafka.status import sink_markers


def main(bootstrap: str, sink_id: str, topic: str, stop_file: str) -> dict[str, Any]:
    conf = {"bootstrap.servers": bootstrap, "log_level": 0}
    admin = AdminClient(conf)
    out: dict[str, Any] = {"answered": Counter(), "retriable": Counter(), "messages": [], "other": []}
    reads: dict[str, Callable[[], object]] = {
        "read_marker": lambda: read_marker(conf, publish_name(sink_id), topic, timeout=1.0),
        "read_marker_fresh": lambda: read_marker(conf, publish_name(sink_id), topic, timeout=1.0, cached=False),
        "read_slot_markers": lambda: read_slot_markers(admin, conf, sink_id, topic, timeout=1.0),
        "status": lambda: sink_markers(bootstrap, sink_id, topic),
        "topic_checker": lambda: marker_batches(bootstrap, sink_id, topic, timeout=1.0),
    }
    lock = threading.Lock()

    def loop(name: str, read: Callable[[], object]) -> None:  # each way of reading on a thread of its own
        while not os.path.exists(stop_file):
            try:
                found = read()
                with lock:
                    out["answered"][name] += 1
                    out.setdefault("last", {})[name] = repr(found)[:200]
            except (RetriableError, ServiceError) as exc:  # ServiceError: the CLI's "the cluster did not answer"
                with lock:
                    out["retriable"][name] += 1
                    if len(out["messages"]) < 400:
                        out["messages"].append([time.time(), str(exc)[:400]])
            except Exception as exc:  # reported: the test fails on any
                with lock:
                    out["other"].append(f"{name}: {type(exc).__name__}: {str(exc)[:300]}")
            time.sleep(0.02)

    threads = [threading.Thread(target=loop, args=item, daemon=True) for item in reads.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return out


if __name__ == "__main__":
    print(json.dumps(main(*sys.argv[1:5])), flush=True)
