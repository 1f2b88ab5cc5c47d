"""Benchmark: what one read of a ``kafka-eos`` sink marker costs, each way it can be read (issue 45, item 1).

Run: ``.venv/bin/python -m bench.marker_reads [--quick] [--reads N] [--groups 8,64,200] [--bootstrap HOST:PORT]``. One broker
(``--bootstrap``, else a throwaway embedded Apache Kafka); a marker committed as the sink commits it; then the
median and 90th percentile of ``--reads`` reads (30) of it by

- ``admin, kept``: ``AdminClient.list_consumer_group_offsets(require_stable=True)`` on a kept client (the old
  way: librdkafka 2.16 crashes the process on a coordinator error in its answer, #5040);
- ``admin, new``: the same on a new admin client each read (what a task paid: its look-ups' client is new);
- ``consumer, kept`` / ``consumer, new``: ``read_marker`` (a consumer of the marker group, ``committed()``,
  ``read_committed``), kept for the process or made for the read;
- ``child process``: the admin read in a new Python process (a crash there is an exit status), 5 reads;

and the time ``read_markers`` takes for ``--groups`` marker groups at once (the slots' survey; 16 readers at once).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable

from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from sinks.kafka.client import TxnProducer
from sinks.kafka.markers import Marker, marker_offsets, read_marker, read_markers

_CHILD = """
import sys
from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition
from confluent_kafka.admin import AdminClient
bootstrap, group, topic = sys.argv[1:4]
admin = AdminClient({"bootstrap.servers": bootstrap})
f = admin.list_consumer_group_offsets(
    [ConsumerGroupTopicPartitions(group, [TopicPartition(topic, 0)])], require_stable=True, request_timeout=10)
print(f[group].result(15).topic_partitions[0].offset)
"""


def _time(fn: Callable[[], object], n: int) -> str:
    fn()
    took = []
    for _ in range(n):
        begun = time.perf_counter()
        fn()
        took.append((time.perf_counter() - begun) * 1000)
    took.sort()
    return f"median {statistics.median(took):7.1f} ms, p90 {took[max(0, int(n * 0.9) - 1)]:7.1f} ms (n={n})"


def run(bootstrap: str, reads: int, groups: list[int]) -> None:
    conf = {"bootstrap.servers": bootstrap}
    topic, group = f"bench-markers-{uuid.uuid4().hex[:6]}", f"spark-eos:bench-{uuid.uuid4().hex[:6]}:publish"
    admin = AdminClient(conf)
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    time.sleep(1)
    producer = TxnProducer(conf, group, timeout=30, context="bench")
    producer.init()
    producer.begin()
    producer.commit([(marker_offsets(topic, Marker(3, "L", "q", 1, "d", "batch")), group)])
    producer.close()

    def admin_read(client: AdminClient) -> int:
        req = [ConsumerGroupTopicPartitions(group, [TopicPartition(topic, 0)])]
        f = client.list_consumer_group_offsets(req, require_stable=True, request_timeout=10)
        return int(f[group].result().topic_partitions[0].offset)

    def child() -> None:
        argv = [sys.executable, "-c", _CHILD, bootstrap, group, topic]
        subprocess.run(argv, check=True, capture_output=True, timeout=60)

    print(f"one marker read ({bootstrap}):")
    print(f"  admin, kept      {_time(lambda: admin_read(admin), reads)}")
    print(f"  admin, new       {_time(lambda: admin_read(AdminClient(conf)), reads)}")
    print(f"  consumer, kept   {_time(lambda: read_marker(conf, group, topic, timeout=10), reads)}")
    print(f"  consumer, new    {_time(lambda: read_marker(conf, group, topic, timeout=10, cached=False), reads)}")
    print(f"  child process    {_time(child, 5)}")
    for n in groups:
        names = [f"spark-eos:bench-{uuid.uuid4().hex[:6]}:task:{i}" for i in range(n)]
        begun = time.perf_counter()
        read_markers(conf, names, topic, timeout=30)
        print(f"read_markers of {n:4d} groups: {time.perf_counter() - begun:6.2f} s")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.marker_reads", description=__doc__.split("\n\n")[0])
    p.add_argument("--reads", type=int, default=30)
    p.add_argument("--groups", default="8,64,200")
    p.add_argument("--bootstrap")
    p.add_argument("--quick", action="store_true", help="10 reads, 8 and 64 groups")
    args = p.parse_args(argv)
    if args.quick:
        args.reads, args.groups = 10, "8,64"
    groups = [int(g) for g in args.groups.split(",") if g]
    if args.bootstrap:
        run(args.bootstrap, args.reads, groups)
        return 0
    from connectors.services.apache_kafka import ApacheKafka

    broker = ApacheKafka(heap="256m")
    try:
        run(broker.bootstrap, args.reads, groups)
    finally:
        broker.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
