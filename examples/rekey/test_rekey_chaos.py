"""The Kafka -> Kafka job under chaos (fixture ``eos_chaos``): the kafka-eos sink with
visibility=partition, SIGKILLed at the point where one task's transaction has committed and the
batch has not (the replay skips that slot's rows, the other slots stage theirs and the driver
publishes them). One fault, so that CI can afford it (each kill costs a restart of Spark); the
README's commands run more. Every payment is written (``drop_tests=false``), so the exact checker reads the output topic back read_committed and compares it with the source by
payment id: each payment once, unchanged, no transaction left open, the sink's last marker equal to
Spark's last commit. No Postgres is started: the job writes only to Kafka.

CI runs this test (integration/test_chaos_kafka_sink.py); ``pytest test_rekey_chaos.py`` here runs it
on your machine."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

TOPIC_CHECKS = (
    "records.duplicates",
    "records.losses",
    "records.payload",
    "end.open_transactions",
    "end.marker_vs_commit",
    "end.visibility",
)


def test_every_payment_once_in_the_rekeyed_topic_under_kills_at_the_sinks_steps(eos_chaos, tmp_path: Path) -> None:
    report = eos_chaos(
        "rekey_job:build",
        generator="rekey_job:records",
        records=80,
        kills=1,
        seed=46,
        max_offsets=40,
        sink_kind="kafka-partition",
        options={"drop_tests": "false"},
        payload=("account", "cents", "currency"),
        report_dir=tmp_path / "report",
    )
    assert report.ok, report.table()
    # seed 46: a kill right after one task's transaction of batch 1 committed
    assert report.get("chaos.kills").counts == {"planned": 1, "sigkilled": 1, "fault_point_kills": 1}, report.table()
    (fired,) = [e for p in tmp_path.glob("chaos-*/faults.jsonl") for e in map(json.loads, p.read_text().splitlines())]
    assert fired["point"] == "sink.task.after_commit" and fired["action"] == "kill-group", fired
    assert report.info["source_records"] == report.info["sink_records"] == 80, report.info
    assert all(report.get(name).ok for name in TOPIC_CHECKS), report.table()
    # the report shows the topic checker's findings: one row in report.html, one JUnit case each
    page = (tmp_path / "report" / "report.html").read_text()
    assert "EXACTLY-ONCE HELD" in page and all(f"<td>{name}</td>" in page for name in TOPIC_CHECKS), page[:3000]
    suite = ET.parse(tmp_path / "report" / "junit.xml").getroot().find("testsuite")
    assert suite is not None and suite.get("failures") == "0", report.table()
    assert set(TOPIC_CHECKS) <= {case.get("name") for case in suite.iter("testcase")}


def test_every_avro_payment_once_in_the_avro_topic_under_a_kill(eos_chaos, tmp_path: Path) -> None:
    """The same job on Avro payments in a Schema Registry's wire format (``--option format=avro``): the run writes
    them with payment.avsc, the job reads and writes Avro, and the checker reads both topics back with
    confluent-kafka's deserializer. Needs a registry: EOS_SCHEMA_REGISTRY_URL (``spark-eos services up
    --with-registry`` sets it) or ``schema_registry=``."""
    report = eos_chaos(
        "rekey_job:build",
        generator="rekey_job:records",
        records=60,
        kills=1,
        seed=46,
        max_offsets=30,
        sink_kind="kafka-partition",
        options={"drop_tests": "false", "format": "avro"},
        payload=("account", "cents", "currency"),
        value_format="avro",
        schema="payment.avsc",
    )
    assert report.ok, report.table()
    assert report.get("chaos.kills").counts["sigkilled"] == 1, report.table()
    assert report.info["source_records"] == report.info["sink_records"] == 60, report.info
    assert all(report.get(name).ok for name in TOPIC_CHECKS), report.table()
