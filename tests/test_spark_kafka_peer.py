"""The peer connector's jar resolution (connectors/services/spark_kafka.py): what is fetched, and a clear refusal."""

from __future__ import annotations

import pytest

from connectors.services import spark_kafka
from eos_core.errors import ServiceError


def test_ivy_module_fetches_the_connector_and_its_non_spark_jars_intransitively() -> None:
    xml = spark_kafka.ivy_module("4.2.0")
    for name in ("spark-sql-kafka-0-10_2.13", "spark-token-provider-kafka-0-10_2.13", "kafka-clients", "commons-pool2"):
        assert f'name="{name}"' in xml
    assert xml.count('transitive="false"') == 4  # Spark's own jars and kafka-clients' deps come with PySpark
    assert 'rev="3.9.2"' in xml and 'rev="2.13.1"' in xml  # what spark-sql-kafka-0-10_2.13-4.2.0.pom names


def test_unknown_connector_version_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(ServiceError, match=r"no jar list for Spark's Kafka connector '4\.3\.0'; known: 4\.2\.0"):
        spark_kafka.ivy_module("4.3.0")


def test_spark_avro_is_fetched_into_a_cache_entry_of_its_own() -> None:
    xml = spark_kafka.ivy_module("4.2.0", artifacts=spark_kafka.AVRO_ARTIFACTS)
    assert 'name="spark-avro_2.13" rev="4.2.0"' in xml and xml.count("<dependency") == 1  # avro itself: PySpark's
    with pytest.raises(ServiceError, match=r"no jar list for spark-avro '4\.3\.0'; known: 4\.2\.0"):
        spark_kafka.ivy_module("4.3.0", artifacts=spark_kafka.AVRO_ARTIFACTS)
