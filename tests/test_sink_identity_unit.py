"""A staging table's comment names its sink exactly (issue 27 item 1), without a database."""

from __future__ import annotations

import pytest

from sinks.postgres.twophase.gid import Gid
from sinks.postgres.twophase.plan import stage_comment, stage_owner

IDS = ["orders", "orders: eu", "orders: eu: 50%_'\"ü日本", "a: b: c", "x:", "eos:x:1:2"]


@pytest.mark.parametrize("sink_id", IDS)
def test_a_task_tables_comment_names_its_sink_and_gid_exactly(sink_id: str) -> None:
    gid = str(Gid(sink_id, 7, 1, "0123456789ab", 3))
    assert stage_owner(f"{stage_comment(sink_id)}: {gid}") == (sink_id, gid)  # as the writer comments it
    assert stage_owner(stage_comment(sink_id)) == (sink_id, None)  # a shared table of spark-eos 0.1


def test_a_prefix_of_the_comment_is_never_another_sink() -> None:
    eu = str(Gid("orders: eu", 0, 0, "0123456789ab", 0))
    owner = stage_owner(f"{stage_comment('orders: eu')}: {eu}")
    assert owner is not None and owner[0] != "orders"
    assert stage_owner(stage_comment("orders: eu")) == ("orders: eu", None)  # "eu" is no gid of "orders"
    wrong = str(Gid("orders", 0, 0, "0123456789ab", 0))  # a gid of another sink after the sink id
    assert stage_owner(f"{stage_comment('orders: eu')}: {wrong}") == (f"orders: eu: {wrong}", None)
    assert stage_owner("some other comment") is None
