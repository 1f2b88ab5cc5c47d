"""A replicated embedded Apache Kafka: three KRaft nodes (each a broker and a controller) on 127.0.0.1.

Production Kafka is at least three brokers, topics with three replicas and ``min.insync.replicas=2``;
the commonest operator action on it, a rolling restart, moves every partition leader and every group
and transaction coordinator. ``KafkaCluster`` is that, from the same Maven Central jars as the single
node (``ApacheKafka``, one per node, in a directory of the cluster's): the nodes share a cluster id, a
controller quorum of all three, and with ``security="sasl_ssl"`` one CA, one certificate and one set of
super users, so a principal or an ACL made through any node holds on all of them. Topics and the
internal topics (group offsets, transaction state) get ``nodes`` replicas and ``nodes - 1`` in sync
are required (2 of 3), unclean leader election off.

Each node is crashed (SIGKILL), stopped (a controlled shutdown) and started on its own (``node(i)``);
``rolling_restart()`` restarts them one after another and waits between them, as an operator does,
until every partition has all its replicas in sync again. ``leader``, ``transaction_coordinator``,
``group_coordinator`` and ``active_controller`` tell which node to hit for a fault, and let a test prove
that the fault moved what it should have.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from connectors.services import _proc
from connectors.services.apache_kafka import START_TIMEOUT, ApacheKafka, cluster_id, validate_config
from connectors.services.base import KafkaService
from connectors.services.kafka_security import SECURITY, Secured
from eos_core.errors import ServiceError

__all__ = ["KafkaCluster", "java_string_hash", "replicated_config"]

_TMP_PREFIX = "eos-kafka-cluster-"
# the internal topics' partition counts of every embedded node (apache_kafka.DEFAULT_CONFIG): the coordinator
# of a group or a transactional id is the leader of the partition its id hashes to
_OFFSETS_TOPIC, _TXN_TOPIC = "__consumer_offsets", "__transaction_state"


def replicated_config(nodes: int) -> dict[str, str]:
    """The settings that make a cluster of ``nodes`` replicate: every topic and internal topic on all nodes,
    all but one of them in sync to acknowledge a write (``acks=all``), no unclean leader election."""
    isr = str(max(1, nodes - 1))
    rf = str(nodes)
    return {
        "default.replication.factor": rf,
        "min.insync.replicas": isr,
        "offsets.topic.replication.factor": rf,
        "transaction.state.log.replication.factor": rf,
        "transaction.state.log.min.isr": isr,
        "share.coordinator.state.topic.replication.factor": rf,
        "share.coordinator.state.topic.min.isr": isr,
        "unclean.leader.election.enable": "false",
    }


def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode`` (UTF-16 code units, 32-bit overflow): how Kafka places a group or a
    transactional id on a partition of its internal topic (``Utils.abs(id.hashCode()) % partitions``)."""
    h = 0
    data = text.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def _partition_of(key: str, partitions: int) -> int:
    h = java_string_hash(key)
    return 0 if h == -(1 << 31) else abs(h) % partitions


class KafkaCluster(KafkaService):
    """``nodes`` (3) embedded Apache Kafka nodes in one KRaft cluster; ``bootstrap`` names all of them.

    ``config`` goes to every node on top of ``replicated_config``; ``heap`` is each node's. The nodes start
    together (a quorum of three elects a leader once two are up) and the cluster is ready when each of them
    is (``ApacheKafka``'s health check: metadata, a transactional producer, a group commit). ``stop()`` stops
    them and deletes the cluster's directory unless ``keep=True`` or ``base_dir`` is named.
    """

    kind = "embedded"
    is_tansu = False

    def __init__(
        self,
        *,
        nodes: int = 3,
        config: Mapping[str, object] | None = None,
        security: str = "plaintext",
        heap: str = "384m",
        version: str | None = None,
        log_level: str = "INFO",
        start_timeout: float = START_TIMEOUT,
        base_dir: str | None = None,
        keep: bool = False,
    ) -> None:
        if security not in SECURITY:
            raise ServiceError(f"security={security!r}: one of {', '.join(SECURITY)}")
        if isinstance(nodes, bool) or not isinstance(nodes, int) or not 2 <= nodes <= 9:
            raise ServiceError(f"nodes={nodes!r}: a replicated cluster has 2 to 9 nodes (3 is what users run)")
        self.security = security
        self.config = {**replicated_config(nodes), **validate_config(config)}
        self._keep = keep or base_dir is not None
        if not base_dir:
            _proc.sweep_stale(_TMP_PREFIX)
        self.base = Path(base_dir) if base_dir else Path(tempfile.mkdtemp(prefix=_TMP_PREFIX))
        self.base.mkdir(parents=True, exist_ok=True)
        if not base_dir:
            _proc.claim_dir(self.base)
        self.tls = Secured(self.base / "secured") if security == "sasl_ssl" else None
        ports = _distinct_ports(2 * nodes)
        self.ports, self.controller_ports = ports[:nodes], ports[nodes:]
        self.voters = ",".join(f"{i + 1}@127.0.0.1:{p}" for i, p in enumerate(self.controller_ports))
        self.cluster = cluster_id()
        self.bootstrap = ",".join(f"127.0.0.1:{p}" for p in self.ports)
        self.nodes: list[ApacheKafka] = []
        started = time.monotonic()
        _proc.register_cleanup(id(self), self.stop)
        try:
            # spawned here (a broker dies with the thread that started it), then awaited together: each node
            # is healthy only once a quorum of them runs
            for i in range(nodes):
                self.nodes.append(self._node(i, heap, version, log_level, start_timeout))
            self._await([n.await_start for n in self.nodes])
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - started
        self.version = self.nodes[0].version

    def _node(self, i: int, heap: str, version: str | None, log_level: str, start_timeout: float) -> ApacheKafka:
        return ApacheKafka(
            port=self.ports[i],
            controller_port=self.controller_ports[i],
            config=self.config,
            version=version,
            heap=heap,
            log_level=log_level,
            start_timeout=start_timeout,
            base_dir=str(self.base / f"node-{i + 1}"),
            security=self.security,
            node_id=i + 1,
            voters=self.voters,
            cluster=self.cluster,
            secured=self.tls,
            wait=False,
        )

    def _await(self, waits: Sequence[Any]) -> None:
        """Run each of ``waits`` (a node's ``await_start``) at once; the first failure, naming the nodes'."""
        with ThreadPoolExecutor(max(1, len(waits))) as pool:
            futures = [pool.submit(w) for w in waits]
        errors = [f.exception() for f in futures if f.exception() is not None]
        if errors:
            raise ServiceError(f"the {len(self.nodes)}-node Kafka cluster did not start: {errors[0]}")

    # ---- clients ---------------------------------------------------------------------------------
    def client_config(self) -> dict[str, str]:
        return {} if self.tls is None else self.tls.client_config()

    def java_config(self) -> dict[str, str]:
        return {} if self.tls is None else self.tls.java_config()

    def client_properties(self) -> Path | None:
        return self.nodes[0].client_properties() if self.nodes else None

    def admin(self) -> Any:
        """An admin client of the cluster as its admin (setting up and checking)."""
        from confluent_kafka.admin import AdminClient

        return AdminClient({"bootstrap.servers": self.bootstrap, **self.client_config(), "log_level": 0})

    # ---- nodes -----------------------------------------------------------------------------------
    def node(self, node_id: int) -> ApacheKafka:
        """The node of Kafka's ``node.id`` ``node_id`` (1-based, as leaders and coordinators are named)."""
        if not 1 <= node_id <= len(self.nodes):
            raise ServiceError(f"node {node_id}: this cluster's nodes are 1 to {len(self.nodes)}")
        return self.nodes[node_id - 1]

    def running(self) -> bool:
        return bool(self.nodes) and all(n.running() for n in self.nodes)

    def start_all(self) -> None:
        """Start every node that is down (each waits until healthy), e.g. after a test left one crashed."""
        down = [n for n in self.nodes if not n.running()]
        for n in down:
            n.start(wait=False)  # from this thread, which outlives them
        self._await([n.await_start for n in down])

    # ---- where things are ------------------------------------------------------------------------
    def partitions(self, topics: Iterable[str] | None = None, timeout: float = 10.0) -> dict[tuple[str, int], Any]:
        """``(topic, partition) -> PartitionMetadata`` (leader, replicas, isrs) of ``topics`` (all by default,
        the internal ones too), as the cluster's metadata says now."""
        admin = self.admin()
        out: dict[tuple[str, int], Any] = {}
        names = list(topics) if topics is not None else [None]
        for name in names:
            md = admin.list_topics(topic=name, timeout=timeout) if name else admin.list_topics(timeout=timeout)
            for topic, t in md.topics.items():
                if t.error is not None:
                    raise ServiceError(f"topic {topic}: {t.error}")
                for pid, p in t.partitions.items():
                    out[(topic, pid)] = p
        return out

    def leader(self, topic: str, partition: int = 0, timeout: float = 10.0) -> int:
        """The node that leads ``topic``'s ``partition`` now (-1 when none does)."""
        return int(self.partitions([topic], timeout)[(topic, partition)].leader)

    def transaction_coordinator(self, transactional_id: str) -> int:
        """The node that coordinates ``transactional_id``'s transactions: the leader of its partition of
        ``__transaction_state``."""
        return self._coordinator(_TXN_TOPIC, transactional_id)

    def group_coordinator(self, group: str) -> int:
        """The node that coordinates consumer group ``group`` (its offsets): the leader of its partition of
        ``__consumer_offsets``."""
        return self._coordinator(_OFFSETS_TOPIC, group)

    def _coordinator(self, topic: str, key: str) -> int:
        parts = self.partitions([topic])
        return int(parts[(topic, _partition_of(key, len(parts)))].leader)

    def active_controller(self) -> int:
        """The node leading the KRaft controller quorum now: the newest leader epoch any node has recorded
        (``__cluster_metadata-0/quorum-state``); -1 when none is known."""
        best = (-1, -1)
        for n in self.nodes:
            with contextlib.suppress(OSError, ValueError, KeyError):
                state = json.loads((n.log_dir / "__cluster_metadata-0" / "quorum-state").read_text())
                epoch, leader = int(state["leaderEpoch"]), int(state["leaderId"])
                best = max(best, (epoch, leader))
        return best[1]

    def out_of_sync(self, timeout: float = 10.0) -> list[tuple[str, int]]:
        """The partitions (internal topics' too) some of whose replicas are not in sync now, or that have no leader."""
        return sorted(
            key for key, p in self.partitions(timeout=timeout).items() if p.leader < 0 or len(p.isrs) < len(p.replicas)
        )

    def wait_in_sync(self, timeout: float = 120.0) -> None:
        """Wait until every partition has every replica in sync (what an operator waits for between nodes)."""
        deadline = time.monotonic() + timeout
        behind: list[tuple[str, int]] = []
        while time.monotonic() < deadline:
            try:
                behind = self.out_of_sync(timeout=min(10.0, max(1.0, deadline - time.monotonic())))
            except Exception as e:  # a node restarting answers a metadata request with an error: ask again
                behind = [(f"metadata: {e}", -1)]
            if not behind:
                return
            time.sleep(0.5)
        raise ServiceError(
            f"replicas not back in sync within {timeout:.0f}s: {', '.join(f'{t}-{p}' for t, p in behind[:10])}"
        )

    # ---- operator actions ------------------------------------------------------------------------
    def rolling_restart(
        self, order: Sequence[int] | None = None, *, pause: float = 0.0, timeout: float = 180.0
    ) -> list[dict[str, Any]]:
        """Restart the nodes one after another (a controlled shutdown, then a start on the same data), waiting
        before each for every replica to be in sync, as an operator's rolling restart does. Returns, per node,
        its old and new JVM pids and the seconds it was down."""
        done = []
        for node_id in order or range(1, len(self.nodes) + 1):
            self.wait_in_sync(timeout)
            n = self.node(node_id)
            old = n.pid
            began = time.monotonic()
            n.restart()
            done.append(
                {"node": node_id, "old_pid": old, "new_pid": n.pid, "down_s": round(time.monotonic() - began, 2)}
            )
            if pause:
                time.sleep(pause)
        self.wait_in_sync(timeout)
        return done

    def stop(self) -> None:
        """Stop every node (a clean shutdown each) and delete the cluster's directory unless kept; idempotent."""
        _proc.unregister_cleanup(id(self))
        with ThreadPoolExecutor(max(1, len(self.nodes))) as pool:
            list(pool.map(lambda n: n.stop(), self.nodes))
        if not self._keep:
            shutil.rmtree(self.base, ignore_errors=True)

    def __repr__(self) -> str:
        return f"KafkaCluster(bootstrap={self.bootstrap!r}, nodes={len(self.nodes)})"


def _distinct_ports(n: int) -> list[int]:
    ports: list[int] = []
    while len(ports) < n:
        p = _proc.free_port()
        if p not in ports:
            ports.append(p)
    return ports
