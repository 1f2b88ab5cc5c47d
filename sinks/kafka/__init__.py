"""The ``kafka-eos`` sink: the Kafka format on writes, exactly once into Kafka.

librdkafka cannot resume another process's transaction, so no task may leave its rows prepared for the
driver to commit, as ``postgres-2pc`` does. What Kafka gives instead: a ``transactional.id`` fences
every older producer with that id (aborting its open transaction), and a transaction can carry
consumer-group offsets, committed atomically with its records. Each writer of the sink keeps a
*marker* that way ("batch n of lineage L is written", ``markers``), and everyone who writes first
fences the writer's id and reads its marker.

Protocol, ``visibility=batch`` (the default: ``read_committed`` readers never see part of a batch):

- task ``write`` of batch n, partition p: read the publish's marker; if it says batch n of this
  lineage is published, write nothing. Otherwise send the rows (screened, see below) to the staging
  topic with an idempotent producer, each with a header naming this task attempt and where the record
  goes, and return the offsets they landed at.
- driver ``commit(messages, n)``: fence the publish's transactional id (an older driver's open
  publish is aborted), read the marker; if batch n is published, do nothing; else in ONE transaction
  read each task's staged records back by offset and attempt, send them to their topics, add the
  marker (offset n + 1 of the publish's group) and commit.

Protocol, ``visibility=partition`` (no second write; each task's rows appear when it commits):

- task ``write`` of batch n, partition p: fence slot p's transactional id (every older attempt of p,
  speculative or failed, is aborted), read slot p's marker; if it says batch n, check that the rows
  are the rows it wrote (K2) and write nothing; else in ONE transaction send the rows and the marker
  (offset n + 1 of slot p's group, with the rows' count and digest) and commit. A producer the Python
  worker kept from the slot's last task is not fenced again: at the task's first row it proves it is
  still the slot's newest producer by putting the slot's marker, as read, in a new transaction (the
  coordinator refuses a fenced one; a new producer then initialises, and the slot's marker must still
  be the one met). Retried attempts always initialise.
- driver ``commit``: nothing is left to do (the tasks committed); it logs what they wrote. A partly
  written batch (some slots' markers say n when the tasks start): the other slots stage, and the
  driver publishes their rows with their markers in one transaction once every slot that wrote n
  ran in the replay and skipped (K2). The first survey of a driver process fences every slot the sink
  has, and reads the slots' markers stable; a slot it cannot read fails the batch (retriably).

Markers are read by a consumer of the marker group that never joins it (``committed()``; ``read_committed``
for a stable read), never ``AdminClient.list_consumer_group_offsets``, which librdkafka 2.16 crashes in on a
coordinator error (#5040): such an error is retried, then retriable (``markers.read_marker``).

Invariants (the code and the tests that keep each one cite its number):

- K1 A marker binds a batch number to the batch's lineage (a digest of what Spark planned in
  ``offsets/n``) and to the query (its checkpoint's id): a writer that meets a marker of another
  query, of a later batch, or of batch n with another lineage refuses before writing, never skips
  (an older savepoint restored, a fresh checkpoint under an old sink id, two queries sharing one).
- K2 A task slot skips batch n only for the rows it wrote: with ``visibility=partition`` a replay
  that gives the slot other rows (the partitioning or the query changed between the crash and the
  restart) is refused with what to do; the marker holds their count and digest, a digest of the rows
  as a multiset (a shuffle's partition may come in another order). A replay without one of the
  slots that wrote the batch (fewer tasks) is refused before the publish: nothing of it is visible.
  A query that is not deterministic (``rand()``, ``uuid()``, a clock-reading UDF, a stream-static join
  whose table changed) cannot meet this: its partly written batch is refused on every replay, and only
  ``visibility=batch`` writes such a query's replay once. The first survey of a driver process fences
  every task slot, so a slot of a crashed driver absent from the replay cannot commit beside it.
- K3 Nothing the data can cause fails after rows are visible: a row the broker would refuse (size,
  no key on a compacted topic, unknown topic or partition, one of Kafka's internal topics) is found
  before the transaction commits and either fails the batch with nothing visible or, with
  ``errors.tolerance=all``, goes to ``errors.topic`` in the same transaction; an ``errors.topic`` the
  broker would refuse a dead letter on (compacted: a dead letter may have no key; internal) is refused
  at start. A row's own headers are written as they are (the staging header is the last of a staged
  record's, and only it is taken off).
- K4 Every transaction has a bounded life and an owner: the writer that runs next with the same id
  fences and aborts it, or the broker aborts it after ``kafka.transaction.timeout.ms``, counted from
  the task's first row; a producer the sink lets go with a transaction open aborts it; every wait of
  the sink is bounded by ``kafkaProducer.timeoutMs``.

Modules, by role: ``options``, ``records`` (the columns, Arrow rows, sizes, the row digest), ``screen``
(K3), ``markers`` (names and markers, K1), ``plan`` (the driver-built plan, the commit message, the
marker rules), ``client`` (producers and look-ups), ``writer`` (tasks), ``committer`` (driver),
``spark`` (the writers Spark builds, the driver's checks, the foreachBatch adapter).
"""

from __future__ import annotations

from eos_core.faults import Points
from sinks.kafka.options import CONTEXT, OPTIONS, KafkaSinkOptions, parse_options
from sinks.kafka.plan import KafkaSinkMessage, KafkaSinkPlan, LineageMismatch
from sinks.kafka.screen import DataRefused
from sinks.kafka.spark import KafkaBatchWriter, KafkaStreamWriter, kafka_batch

__all__ = [
    "CONTEXT",
    "FAULT_POINTS",
    "OPTIONS",
    "DataRefused",
    "KafkaBatchWriter",
    "KafkaSinkMessage",
    "KafkaSinkOptions",
    "KafkaSinkPlan",
    "KafkaStreamWriter",
    "LineageMismatch",
    "kafka_batch",
    "parse_options",
]

FAULT_POINTS = {
    "batch": Points(
        (
            "sink.before_write",  # writer: a task before its first row
            "sink.after_write",  # writer: rows staged
            "sink.commit.before_decision",  # committer: before the publish
            "sink.publish.mid",  # committer: k staged records in the open publish (condition k=)
            "sink.after_commit",  # committer: the publish committed, before Spark's commits/n
        ),
        hold="sink.after_write",
    ),
    "partition": Points(
        (
            "sink.before_write",
            "sink.after_write",  # writer: rows sent in the task's open transaction
            "sink.task.after_commit",  # writer: the task's transaction (rows + marker) committed
            "sink.commit.before_decision",  # committer: only in the replay of a partly written batch
            "sink.publish.mid",  # committer: likewise
            "sink.after_commit",
        ),
        hold="sink.after_write",
        # the publish runs only to finish a partly written batch: a kill drawn there would rarely fire
        drawn=("sink.before_write", "sink.after_write", "sink.task.after_commit", "sink.after_commit"),
    ),
}
"""The fault points the ``kafka-eos`` sink fires, by visibility, in protocol order (``eos_core.faults``)."""
