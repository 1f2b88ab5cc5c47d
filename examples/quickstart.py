"""Quick start: JSON payments from a Kafka topic into a Postgres table, exactly once.

Run it as the README's Quick start shows (``integration/test_quickstart_readme.py`` runs those very
lines, parsed from the README):

    spark-eos services up
    eval "$(spark-eos services env)"
    python examples/quickstart.py --produce 1000

It reads its addresses from ``EOS_KAFKA_BOOTSTRAP`` and ``EOS_POSTGRES_DSN``, and the Kafka cluster's
security settings from the Java client properties file ``EOS_KAFKA_CONFIG`` names (what ``spark-eos
services env`` exports for the embedded SASL_SSL broker and TLS Postgres; set them to your own Kafka and
Postgres instead), keeps the password out of the ``dsn`` option (``connectors.postgres_options`` moves one
to the ``password`` option, which Spark hides in every plan; libpq's passfile, which ``services env``
exports as ``PGPASSFILE``, or ``PGPASSWORD`` keep it out of the DSN altogether), runs the query with an
available-now trigger and blocks until it has drained the topic. Run it again after producing more:
the query resumes from its checkpoint and writes only the new records.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile


def produce(bootstrap: str, topic: str, count: int, partitions: int = 2) -> None:
    """Create ``topic`` if needed and append ``count`` payments; ids continue after the topic's records."""
    from confluent_kafka import Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    from eos_core.kafka_config import client_settings

    cluster = {"bootstrap.servers": bootstrap, **client_settings()}  # EOS_KAFKA_CONFIG's security settings
    admin = AdminClient(cluster)
    if topic not in admin.list_topics(timeout=15).topics:
        admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])[topic].result(15)
    consumer = Consumer({**cluster, "group.id": "quickstart-count"})
    meta = consumer.list_topics(topic, timeout=15).topics[topic]
    first = sum(consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=15)[1] for p in meta.partitions)
    consumer.close()
    producer = Producer({**cluster, "enable.idempotence": True})
    for i in range(first, first + count):
        account = f"acct-{i % 10}"
        payment = {"id": i, "account": account, "amount": (i * 37) % 1000}
        producer.produce(topic, key=account, value=json.dumps(payment))
        producer.poll(0)
    if producer.flush(30):
        sys.exit(f"quickstart: could not deliver every record to {topic} at {bootstrap}")
    print(f"produced payments {first}..{first + count - 1} to topic {topic}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--topic", default="payments", help="the topic to read (default payments)")
    p.add_argument("--table", default="payments", help="the table to write (default payments; created)")
    p.add_argument("--sink-id", default="quickstart-payments", help="the sink.id (unique per query, stable)")
    p.add_argument(
        "--checkpoint",
        default=os.path.join(tempfile.gettempdir(), "spark-eos-quickstart", "checkpoint"),
        help="the query's checkpoint (default $TMPDIR/spark-eos-quickstart/checkpoint; remove it when you "
        "point the query at new services)",
    )
    p.add_argument("--produce", type=int, default=0, metavar="N", help="first append N payments to the topic")
    args = p.parse_args(argv)
    try:
        bootstrap = os.environ["EOS_KAFKA_BOOTSTRAP"]
        dsn = os.environ["EOS_POSTGRES_DSN"]
    except KeyError as missing:
        sys.exit(
            f'quickstart: {missing.args[0]} is not set: run eval "$(spark-eos services env)" first, or export '
            "EOS_KAFKA_BOOTSTRAP=host:port and EOS_POSTGRES_DSN=postgresql://user@host:port/db (password in "
            "PGPASSWORD)"
        )
    if args.produce:
        produce(bootstrap, args.topic, args.produce)

    # Spark's Python workers must import pyspark and spark-eos: run them on this interpreter (a venv
    # need not be activated). On a cluster, set PYSPARK_PYTHON to the environment you ship instead.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.errors import StreamingQueryException
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    import connectors

    spark = SparkSession.builder.appName("spark-eos-quickstart").getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    connectors.register(spark)  # kafka-eos, postgres-upsert, postgres-2pc; hides passwords in plans

    payment = F.from_json(F.col("value").cast("string"), "id long, account string, amount long")
    events = (
        spark.readStream.format("kafka-eos")
        .options(**connectors.kafka_options(bootstrap))  # + EOS_KAFKA_CONFIG's settings, hidden in plans
        .option("subscribe", args.topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", 50_000)
        .load()
        .select(
            payment["id"].alias("id"),
            payment["account"].alias("account"),
            payment["amount"].alias("amount"),
            F.col("partition").alias("src_partition"),
            F.col("offset").alias("src_offset"),
        )
    )
    query = (
        events.writeStream.format("postgres-2pc")
        .options(**connectors.postgres_options(dsn))  # the dsn without its password + the password option
        .option("table", args.table)
        .option("table.create", "true")
        .option("sink.id", args.sink_id)  # unique per query, stable across restarts
        .option("checkpointLocation", args.checkpoint)
        .trigger(availableNow=True)  # drain what the topic holds now, then stop; processingTime="5 seconds" runs on
        .start()
    )
    try:
        query.awaitTermination()  # block: without it the script (and the query) would end at once
    except StreamingQueryException as exc:
        print(f"quickstart: the query failed: {connectors.query_error(exc)}", file=sys.stderr)
        return 2
    finally:
        spark.stop()
    print(f"query drained {args.topic} into table {args.table} (checkpoint {args.checkpoint})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
