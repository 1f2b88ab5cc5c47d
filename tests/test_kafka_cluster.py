"""connectors.services.kafka_cluster without a cluster: its settings, its arguments, Kafka's placement hash."""

from __future__ import annotations

import pytest

from connectors.services import kafka_cluster
from connectors.services.apache_kafka import broker_properties
from connectors.services.kafka_cluster import KafkaCluster, java_string_hash, replicated_config
from eos_core.errors import ServiceError


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", 0),
        ("hello", 99162322),
        ("Aa", 2112),
        ("BB", 2112),  # Java's textbook collision
        ("polygenelubricants", -(1 << 31)),  # Integer.MIN_VALUE: Kafka's Utils.abs makes it partition 0
        ("é€", 233 * 31 + 0x20AC),  # UTF-16 code units, not UTF-8 bytes
        ("😀", 0xD83D * 31 + 0xDE00),  # a surrogate pair counts as two units
    ],
)
def test_the_placement_hash_is_javas_string_hash(text: str, expected: int) -> None:
    assert java_string_hash(text) == expected


def test_an_id_hashing_to_the_smallest_int_lands_on_partition_0() -> None:
    assert kafka_cluster._partition_of("polygenelubricants", 4) == 0
    assert kafka_cluster._partition_of("hello", 4) == 99162322 % 4


def test_three_nodes_replicate_everything_thrice_and_need_two_in_sync() -> None:
    cfg = replicated_config(3)
    assert cfg["default.replication.factor"] == cfg["offsets.topic.replication.factor"] == "3"
    assert cfg["transaction.state.log.replication.factor"] == "3"
    assert cfg["min.insync.replicas"] == cfg["transaction.state.log.min.isr"] == "2"
    assert cfg["unclean.leader.election.enable"] == "false"


def test_a_node_of_a_quorum_names_its_id_and_every_voter(tmp_path) -> None:
    voters = "1@127.0.0.1:9001,2@127.0.0.1:9002,3@127.0.0.1:9003"
    props = broker_properties(
        port=9102, controller_port=9002, data_dir=tmp_path, config=replicated_config(3), node_id=2, voters=voters
    )
    assert props["node.id"] == "2" and props["controller.quorum.voters"] == voters
    assert props["default.replication.factor"] == "3"  # the cluster's settings over the single node's defaults
    single = broker_properties(port=9102, controller_port=9002, data_dir=tmp_path)
    assert single["node.id"] == "1" and single["controller.quorum.voters"] == "1@127.0.0.1:9002"


@pytest.mark.parametrize("nodes", [1, 10, True, "3"])
def test_a_cluster_has_two_to_nine_nodes(nodes: object) -> None:
    with pytest.raises(ServiceError, match="2 to 9 nodes"):
        KafkaCluster(nodes=nodes)  # type: ignore[arg-type]


def test_a_cluster_refuses_an_unknown_security() -> None:
    with pytest.raises(ServiceError, match="security='tls'"):
        KafkaCluster(security="tls")
