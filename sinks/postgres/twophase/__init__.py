"""The ``postgres-2pc`` sink: tasks PREPARE their rows, the driver commits them with the batch.

Protocol (docs/postgres-2pc.md and docs/lifecycle.md have the diagram and the operator's view):

- task ``write`` of batch n, partition p: refuse if another query owns the sink id; under the
  sink's advisory lock, meet the decision of batch n if there is one (skip it, refuse it, or take
  it back: see I1, I3), then resolve stale prepared gids (roll forward those a decision names, roll
  back dead attempts', keep every attempt of this batch attempt); then in one transaction write the
  rows and a marker row in ``sink_parts`` and ``PREPARE TRANSACTION
  'eos:<sink>:<n>:<p>:<nonce>:<task attempt>'``. ``visibility=batch`` writes into a staging table of
  the task attempt's own, created in that transaction; ``visibility=partition`` writes into the
  table itself.
- driver ``commit(messages, n)``: under the lock, if no decision exists, check that every gid is
  still prepared and insert the decision (claiming the sink for this query) in its own
  transaction; COMMIT PREPARED each gid (a missing one proven by its marker); for
  ``visibility=batch`` publish: ONE transaction moves the staged rows into the table (append:
  INSERT; upsert: the version-guarded merge; complete mode: replace), drops the staging tables and
  marks the decision published. Then roll back stray gids. Every step is idempotent.
- driver ``abort(messages, n)``: roll back the batch's prepared gids unless a decision names them.

Invariants (the code and tests that keep each one cite its number):

- I1 A decision binds a batch number to the batch's lineage in its checkpoint (a digest of what
  Spark planned in ``offsets/n``): a decided number met with another lineage, or an undecided one
  below the last decided batch, is refused before anything is written, never skipped.
- I2 Nothing the data can cause fails after the decision: a refusal by the table surfaces in the
  task (``visibility=partition``) or, at publish, takes the batch back with no trace (nothing was
  visible); a fixed query restarted from the checkpoint writes the batch anew.
- I3 The decision says where the batch's rows are (its staging token); a replay with other columns
  takes an unpublished batch back and writes it with the columns it has now; a direct batch
  (rows possibly visible) is always rolled forward.
- I4 Every prepared transaction has a bounded life and an owner who resolves it: the next task
  or commit of the sink (streaming), the next job past ``prepared.timeout`` (batch jobs), a losing
  twin itself right after its PREPARE, ``spark-eos sinks recover`` by hand.

Modules, by role (Flink's sink shape): ``options`` (specs, parsed options), ``plan`` (driver-built
plan, staging names, the task's commit message), ``writer`` (task side), ``committer`` (driver side),
``guards`` (I1/I3 checks both sides share), ``spark`` (the Spark writers); the data source is in
``sinks.postgres.datasources``, the foreachBatch adapter in ``sinks.postgres.adapters``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from eos_core import lazy
from eos_core.faults import Points

if TYPE_CHECKING:
    from sinks.postgres.adapters import twopc_batch
    from sinks.postgres.datasources import Postgres2pcDataSource
    from sinks.postgres.refusal import DataRefused
    from sinks.postgres.twophase.committer import Committer
    from sinks.postgres.twophase.guards import LineageMismatch, LostBatches, Superseded
    from sinks.postgres.twophase.options import FORMAT, TWOPC_OPTIONS, TwoPhaseOptions
    from sinks.postgres.twophase.plan import DIRECT, TwoPhaseMessage, TwoPhasePlan
    from sinks.postgres.twophase.spark import TwoPhaseBatchWriter, TwoPhaseStreamWriter

# each name imported when first asked for (eos_core.lazy): Spark's planner processes pass through this package
# on the way to the data source (sinks.postgres.datasources) and need none of the protocol
__getattr__ = lazy.exports(
    __name__,
    {
        "twopc_batch": "sinks.postgres.adapters",
        "Postgres2pcDataSource": "sinks.postgres.datasources",
        "DataRefused": "sinks.postgres.refusal",
        "Committer": "sinks.postgres.twophase.committer",
        "LineageMismatch": "sinks.postgres.twophase.guards",
        "LostBatches": "sinks.postgres.twophase.guards",
        "Superseded": "sinks.postgres.twophase.guards",
        "FORMAT": "sinks.postgres.twophase.options",
        "TWOPC_OPTIONS": "sinks.postgres.twophase.options",
        "TwoPhaseOptions": "sinks.postgres.twophase.options",
        "DIRECT": "sinks.postgres.twophase.plan",
        "TwoPhaseMessage": "sinks.postgres.twophase.plan",
        "TwoPhasePlan": "sinks.postgres.twophase.plan",
        "TwoPhaseBatchWriter": "sinks.postgres.twophase.spark",
        "TwoPhaseStreamWriter": "sinks.postgres.twophase.spark",
    },
)

__all__ = [
    "DIRECT",
    "FAULT_POINTS",
    "FORMAT",
    "TWOPC_OPTIONS",
    "Committer",
    "DataRefused",
    "LineageMismatch",
    "LostBatches",
    "Postgres2pcDataSource",
    "Superseded",
    "TwoPhaseBatchWriter",
    "TwoPhaseMessage",
    "TwoPhaseOptions",
    "TwoPhasePlan",
    "TwoPhaseStreamWriter",
    "twopc_batch",
]

FAULT_POINTS = Points(
    (
        "sink.before_write",  # writer: a task before its first row
        "sink.after_write",  # writer: rows and marker written, before PREPARE
        "sink.after_prepare",  # writer: PREPARE TRANSACTION done, before the task returns
        "sink.commit.before_decision",  # committer
        "sink.commit.after_decision",  # committer: the decision durable, no COMMIT PREPARED yet
        "sink.commit.after_k",  # committer: after k of the batch's COMMIT PREPAREDs
        "sink.after_commit",  # committer: every gid committed (published), before Spark's commits/n
    ),
    hold="sink.after_prepare",  # a task held here keeps a prepared transaction open
)
"""The fault points ``postgres-2pc`` fires, in protocol order (``eos_core.faults``)."""
