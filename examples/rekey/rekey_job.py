"""An example Kafka -> Spark -> Kafka job: payments re-keyed by account, exactly once, through the
``kafka-eos`` Kafka sink.

The payment service writes each payment as JSON, keyed by the payment's id:
``{"id": "p000042", "account": "acct07", "cents": 1250, "currency": "USD", "test": false}``. Consumers
downstream want each account's payments in order, on one partition, in euros. The job drops test
payments, converts the amount to euro cents (fixed rates, rounded down), tags a size band,
re-keys each payment by its account (the sink's partitioner hashes the key as Java's does), keeps
where it came from in a header (``src``: the source partition and offset) and writes it with the
``kafka-eos`` sink: each payment once in the output topic for a ``read_committed`` reader, whatever
crashes. ``build`` returns the query unstarted; ``records(seed, n)`` is the workload generator.

Under the chaos toolkit the job writes ``job.out_topic`` (a topic the run makes) with
``visibility=job.visibility`` (``--sink-kind kafka``: batch, ``kafka-partition``: partition), so one
job is tested in both modes. It drops test payments, so its output is not one record per source
record and the verdict comes from the reference-run oracle (``--oracle append``); with ``--option
drop_tests=false`` every payment is written and the exact checker compares the topic with the source
record by record (README.md has the commands; ``pytest test_rekey_chaos.py`` runs that one).

With ``--option format=avro`` the payments are Avro in a Schema Registry's wire format (``payment.avsc``; the
chaos run writes them so with ``--value-format avro --schema payment.avsc``): the job reads them decoded
(``value.format=avro``, the fields as columns: ``value.layout=flat``) and writes its output in Avro too (the
sink registers the output's schema under ``<out topic>-value``), in the same run's registry
(``job.registry_options``).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

from connectors.toolkit.app_runner import Job

# euro per mille of each currency's unit: cents * rate // 1000 is the amount in euro cents
RATES = {"EUR": 1000, "USD": 920, "GBP": 1170, "CHF": 1040}


def records(seed: int, n: int) -> Iterator[dict[str, Any]]:
    """``n`` payments (key: the payment id, value: a JSON object); about 1 in 10 is a test payment."""
    rng = random.Random(seed)
    for i in range(n):
        payment = {
            "id": f"p{i:06d}",
            "account": f"acct{rng.randrange(30):02d}",
            "cents": rng.randint(100, 200_000),
            "currency": rng.choice(sorted(RATES)),
            "test": rng.random() < 0.1,
        }
        yield {"key": payment["id"], "value": payment}


def build(spark: Any, job: Job) -> Any:
    from pyspark.sql import functions as F

    avro = job.options.get("format", "json") == "avro"
    reader = (
        spark.readStream.format("kafka-eos")
        .options(**job.kafka_options)
        .option("subscribe", job.topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", job.max_offsets)
    )
    if avro:  # each payment decoded with its writer schema; its fields are columns beside Kafka's
        reader = reader.options(**job.registry_options).option("value.format", "avro").option("value.layout", "flat")
    raw = reader.load()
    if avro:
        p = F.struct("id", "account", "cents", "currency", "test")
    else:
        p = F.from_json(
            F.col("value").cast("string"), "id string, account string, cents long, currency string, test boolean"
        )
    bad = F.concat(F.lit("malformed payment at offset "), F.col("offset").cast("string"))
    rate = F.create_map(*[x for cur, r in sorted(RATES.items()) for x in (F.lit(cur), F.lit(r))])
    payments = raw.select(
        F.when(p["id"].isNull(), F.raise_error(bad)).otherwise(p["id"]).alias("id"),
        p["account"].alias("account"),
        p["cents"].alias("cents"),
        p["currency"].alias("currency"),
        p["test"].alias("test"),
        F.concat_ws(":", F.col("partition").cast("string"), F.col("offset").cast("string")).alias("src"),
    )
    if job.options.get("drop_tests", "true") != "false":
        payments = payments.where(~F.col("test"))
    eur = (F.col("cents") * rate[F.col("currency")]).cast("long") / 1000
    enriched = payments.withColumn("eur_cents", F.floor(eur).cast("long")).withColumn(
        "band", F.when(F.col("eur_cents") >= 100_000, "large").otherwise("small")
    )
    value = F.struct("id", "account", "cents", "currency", "eur_cents", "band")
    out = enriched.select(
        F.col("account").alias("key"),  # re-keyed: each account's payments on one partition, in order
        (value if avro else F.to_json(value)).alias("value"),
        F.array(F.struct(F.lit("src").alias("key"), F.col("src").cast("binary").alias("value"))).alias("headers"),
    )
    writer = (
        out.writeStream.format("kafka-eos")
        .options(**job.kafka_options)
        .option("topic", job.out_topic)
        .option("sink.id", job.sink_id)
        .option("visibility", job.visibility)
    )
    if avro:  # the output's schema derived from the value struct, registered under <out topic>-value
        writer = writer.options(**job.registry_options).option("value.format", "avro")
    return writer
