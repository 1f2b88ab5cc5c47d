"""postgres-2pc without services: options, picklable messages/plans/errors, recovery planning rules."""

from __future__ import annotations

import pickle
from datetime import datetime, timezone
from typing import Any

import pytest

from eos_core.errors import CommitUnknown, ConfigError
from sinks.postgres.twophase import TwoPhaseMessage, TwoPhaseOptions, recovery, twopc_batch
from sinks.postgres.twophase.decisions import Decision, Prepared, ProtocolTables, sink_lock_key
from sinks.postgres.twophase.gid import Gid

DSN = "postgresql://u:secret@127.0.0.1:5/db"
NONCE_A, NONCE_B = "aaaaaaaaaaaa", "bbbbbbbbbbbb"


def test_options_parse_with_defaults_and_redact_the_password() -> None:
    o = TwoPhaseOptions.from_options({"dsn": DSN, "table": "s.t", "sink.id": "orders", "checkpointLocation": "/x"})
    assert (o.mode, o.eos_schema, o.batch_id, o.upsert, o.table.schema) == ("append", "eos", None, None, "s")
    assert "secret" not in repr(o)
    assert pickle.loads(pickle.dumps(o)) == o


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        ({"mode": "upsert"}, "'key'"),
        ({"key": "id"}, "only applies to mode=upsert"),
        ({"mode": "merge"}, "one of append, upsert"),
        ({"batch.id": "-1"}, "batch.id"),
        ({"sink.id": "a\tb"}, "sink.id"),
        ({"sinkid": "x"}, "did you mean 'sink.id'"),
        ({"prepared.warn.age": "soon"}, "prepared.warn.age"),
    ],
)
def test_bad_options_name_the_option(raw: dict[str, str], fragment: str) -> None:
    with pytest.raises(ConfigError) as err:
        TwoPhaseOptions.from_options({"dsn": DSN, "table": "t", "sink.id": "s", **raw})
    assert fragment in str(err.value)


def test_upsert_mode_reuses_the_upsert_options() -> None:
    o = TwoPhaseOptions.from_options(
        {"dsn": DSN, "table": "t", "sink.id": "s", "mode": "upsert", "key": "id", "version": "v"}
    )
    assert o.upsert is not None and o.upsert.key == ("id",) and o.upsert.version == "v"


def test_foreach_batch_adapter_checks_options_at_once() -> None:
    with pytest.raises(ConfigError, match=r"sink\.id"):
        twopc_batch(dsn=DSN, table="t")
    with pytest.raises(ConfigError, match="do not pass it"):
        twopc_batch(dsn=DSN, table="t", sink_id="s", **{"batch.id": 3})
    with pytest.raises(ConfigError, match="checkpointLocation") as err:
        twopc_batch(dsn=DSN, table="t", sink_id="s")
    assert err.value.option == "checkpointLocation"
    fn = twopc_batch(dsn=DSN, table="t", sink_id="s", checkpointLocation="/ckpt/q")
    assert callable(fn) and "s" in fn.__name__


def test_messages_errors_and_tables_pickle() -> None:
    m = TwoPhaseMessage(
        sink_id="s",
        batch_id=3,
        partition=1,
        attempt=0,
        gid=str(Gid("s", 3, 1, NONCE_A, 7)),
        rows=10,
        skipped=False,
        identity="query:q",
        run_id="r",
        nonce=NONCE_A,
        lineage="ab" * 16,
    )
    assert pickle.loads(pickle.dumps(m)) == m
    err = pickle.loads(pickle.dumps(CommitUnknown("x", gid="g")))
    assert isinstance(err, CommitUnknown) and err.gid == "g"
    assert pickle.loads(pickle.dumps(ProtocolTables("my schema"))).schema == "my schema"


def test_sink_lock_key_is_stable_and_signed_64_bit() -> None:
    k = sink_lock_key("orders")
    assert k == sink_lock_key("orders") != sink_lock_key("orders2")
    assert -(2**63) <= k < 2**63


class _FakeTables:
    def __init__(self, decisions: dict[int, tuple[str, ...]]) -> None:
        self._d = decisions

    def decisions(self, conn: Any, sink_id: str, batch_ids: Any) -> dict[int, Decision]:
        return {b: Decision(sink_id, b, g, 0) for b, g in self._d.items()}


def _prepared(*gids: Gid, age: float = 1.0) -> list[Prepared]:
    now = datetime.now(timezone.utc)
    return [Prepared(g, now, age, "db") for g in gids]


def test_recovery_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    decided = Gid("s", 1, 0, NONCE_A, 1)
    loser = Gid("s", 1, 1, NONCE_A, 2)  # batch 1 is decided without it
    dead = Gid("s", 2, 0, NONCE_A, 3)  # undecided, another batch attempt
    sibling = Gid("s", 2, 1, NONCE_B, 4)  # undecided, the running attempt
    # this partition's other attempt of the running batch attempt (a retry's predecessor, or a
    # speculative twin that Spark may still accept): kept, the commit drops the one not accepted
    own_other_attempt = Gid("s", 2, 0, NONCE_B, 5)
    gids = [decided, loser, dead, sibling, own_other_attempt]
    monkeypatch.setattr(recovery, "list_prepared", lambda conn, sink: _prepared(*gids))
    tables = _FakeTables({1: (str(decided),)})
    plan = {a.gid: a.action for a in recovery.plan_resolution(None, tables, "s", keep_nonce=NONCE_B)}  # type: ignore[arg-type]
    assert plan == {
        str(decided): "commit",
        str(loser): "rollback",
        str(dead): "rollback",
        str(sibling): "keep",
        str(own_other_attempt): "keep",
    }
    # the commit-side stray cleanup of batch 1 only looks at batches <= 1
    plan = {a.gid: a.action for a in recovery.plan_resolution(None, tables, "s", upto_batch=1)}  # type: ignore[arg-type]
    assert plan == {str(decided): "commit", str(loser): "rollback"}
    # abort of batch 2 and batch-job cleanup only touch batch 2
    plan = {a.gid: a.action for a in recovery.plan_resolution(None, tables, "s", only_batch=2)}  # type: ignore[arg-type]
    assert set(plan) == {str(dead), str(sibling), str(own_other_attempt)} and set(plan.values()) == {"rollback"}


def test_batch_jobs_roll_back_other_batches_undecided_gids_only_past_the_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    young = Gid("s", 7, 0, NONCE_A, 1)  # another job, maybe still running
    old = Gid("s", 8, 0, NONCE_A, 2)  # a job that died after PREPARE an hour ago
    mine = Gid("s", 9, 0, NONCE_B, 3)
    prepared = _prepared(young) + _prepared(old, age=4000.0) + _prepared(mine)
    monkeypatch.setattr(recovery, "list_prepared", lambda conn, sink: prepared)
    tables = _FakeTables({})
    actions = recovery.plan_resolution(None, tables, "s", keep_nonce=NONCE_B, only_batch=9, stale_after=3600.0)  # type: ignore[arg-type]
    plan = {a.gid: a for a in actions}
    assert set(plan) == {str(old), str(mine)}
    assert plan[str(old)].action == "rollback" and "prepared.timeout" in plan[str(old)].reason
    assert plan[str(mine)].action == "keep"


def _offsets(checkpoint: Any, batch: int, offset: int) -> None:
    (checkpoint / "offsets").mkdir(parents=True, exist_ok=True)
    (checkpoint / "offsets" / str(batch)).write_text(f'v1\n{{"batchWatermarkMs":0}}\n{{"orders":{{"0":{offset}}}}}\n')


def test_a_stream_past_batches_its_decision_log_lacks_is_refused_naming_them_and_the_replay(tmp_path: Any) -> None:
    """Issue 46: Spark runs batch n only after committing n - 1, and commits a batch only after the sink's
    decision: a decision log that ends before n - 1 lost committed batches (an asynchronous failover)."""
    from sinks.postgres.twophase.guards import LostBatches, check_none_lost

    ck = tmp_path / "ck"
    for batch, offset in ((4, 40), (5, 50), (6, 60), (7, 70)):
        _offsets(ck, batch, offset)
    opts = TwoPhaseOptions.from_options({"dsn": DSN, "table": "t", "sink.id": "orders", "checkpointLocation": str(ck)})
    for last in (None, 6, 7):  # a new sink id; the batch after the last decision; a replay of the last one
        check_none_lost(opts, 7, last)
    with pytest.raises(LostBatches) as refused:
        check_none_lost(opts, 7, 4)
    text = str(refused.value)
    assert "the database lost batches 5..6" in text and "ends at batch 4" in text, text
    assert '{"orders":{"0":40}} (offsets/4) to {"orders":{"0":60}} (offsets/5..offsets/6)' in text, text
    assert "savepoint create <checkpoint> <savepoint> --batch 4" in text and "sinks release --sink-id orders" in text
    assert "secret" not in text and refused.value.lost == [5, 6]
    # where the checkpoint cannot be read (an executor), the files are named instead
    elsewhere = TwoPhaseOptions.from_options({"dsn": DSN, "table": "t", "sink.id": "o", "checkpointLocation": "/gone"})
    with pytest.raises(LostBatches, match=r"the database lost batch 6\b.*the checkpoint's offsets/6\. "):
        check_none_lost(elsewhere, 7, 5)
    # foreachBatch (twopc_batch gives batch.id): the user's function may skip a batch; nothing refused
    adapter = TwoPhaseOptions.from_options(
        {"dsn": DSN, "table": "t", "sink.id": "orders", "checkpointLocation": str(ck), "batch.id": "7"}
    )
    assert adapter.batch_id == 7
    check_none_lost(adapter, 7, 4)
