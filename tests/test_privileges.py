"""The privileges each Postgres sink declares for its options (issue 44), and the commands that grant them."""

from __future__ import annotations

from eos_core.privileges import KafkaAcl, PgGrant, acl_command, describe_missing, grant_command
from sinks.postgres.options import UpsertOptions
from sinks.postgres.privileges import twophase_grants, upsert_grants
from sinks.postgres.twophase.options import TwoPhaseOptions


def _held(grants: list[PgGrant]) -> set[tuple[str, str | None, str]]:
    return {(g.object, g.name, g.privilege) for g in grants if g.unless is None}


def test_upsert_needs_select_and_temporary_which_were_undocumented() -> None:
    plain = _held(upsert_grants(UpsertOptions.from_options({"table": "t", "key": "id"})))
    assert plain == {
        ("database", None, "CONNECT"),
        ("database", None, "TEMPORARY"),
        ("schema", "public", "USAGE"),
        ("table", "public.t", "INSERT"),
        ("table", "public.t", "SELECT"),
        ("table", "public.t", "UPDATE"),
    }
    deletes = upsert_grants(
        UpsertOptions.from_options({"table": "s.t", "key": "id", "version": "v", "delete.column": "gone"})
    )
    assert ("table", "s.t", "DELETE") in _held(deletes)
    assert {p for o, n, p in _held(deletes) if n == "s.t__eos_tombstones"} == {"SELECT", "INSERT", "UPDATE", "DELETE"}
    create = [g for g in deletes if g.privilege == "CREATE"]
    assert [(g.name, g.unless) for g in create] == [("s", ("table", "s.t__eos_tombstones"))]


def test_2pc_needs_create_on_the_database_only_while_its_schema_is_missing() -> None:
    staged = twophase_grants(TwoPhaseOptions.from_options({"table": "t", "sink.id": "s"}))
    on_db = [g for g in staged if g.object == "database" and g.privilege == "CREATE"]
    assert len(on_db) == 1 and on_db[0].unless == ("schema", "eos") and "CREATE SCHEMA eos" in on_db[0].create
    assert ("schema", "eos", "CREATE") in _held(staged)  # visibility=batch: each task's staging table
    assert ("database", None, "TEMPORARY") in _held(staged)
    direct = twophase_grants(TwoPhaseOptions.from_options({"table": "t", "sink.id": "s", "visibility": "partition"}))
    assert ("schema", "eos", "CREATE") not in _held(direct) and ("database", None, "TEMPORARY") not in _held(direct)
    assert {p for o, n, p in _held(direct) if n == "eos.sink_batches"} == {"SELECT", "INSERT", "UPDATE", "DELETE"}
    assert ("table", "public.t", "DELETE") in _held(
        twophase_grants(TwoPhaseOptions.from_options({"table": "t", "sink.id": "s"}), complete=True)
    )
    assert ("table", "public.t", "DELETE") not in _held(staged)


def test_options_that_need_more_declare_it() -> None:
    opts = {"table": "t", "key": "id", "table.create": "true", "schema.evolution": "add-columns"}
    grants = upsert_grants(UpsertOptions.from_options({**opts, "errors.tolerance": "all", "errors.table": "x.bad"}))
    assert ("table", "public.t", "OWNER") in _held(grants)
    assert ("table", "x.bad", "INSERT") in _held(grants) and ("schema", "x", "USAGE") in _held(grants)
    assert {(g.name, g.unless) for g in grants if g.privilege == "CREATE"} == {
        ("public", ("table", "public.t")),
        ("x", ("table", "x.bad")),
    }


def test_the_commands_grant_revoke_and_quote() -> None:
    g = PgGrant("table", "s.Odd Name", "INSERT")
    assert grant_command(g, "app") == 'GRANT INSERT ON TABLE "s"."Odd Name" TO "app";'
    assert grant_command(g, "app", revoke=True) == 'REVOKE INSERT ON TABLE "s"."Odd Name" FROM "app";'
    assert grant_command(PgGrant("database", None, "TEMPORARY"), "app", "db") == (
        'GRANT TEMPORARY ON DATABASE "db" TO "app";'
    )
    assert grant_command(PgGrant("table", "public.t", "OWNER"), "app") == 'ALTER TABLE "public"."t" OWNER TO "app";'
    acl = KafkaAcl("transactional_id", "orders-", "WRITE", prefixed=True)
    assert acl_command(acl, "app", "b:9093").endswith(
        "--allow-principal User:app --operation Write --transactional-id 'orders-' --resource-pattern-type prefixed"
    )
    text = describe_missing(
        "role 'app'", grants=[PgGrant("database", None, "TEMPORARY", "stage")], context="c", fix=["X;"]
    )
    assert text == "c: role 'app' lacks TEMPORARY on database (the database of the dsn) (stage). Grant it: X;"
    assert "\n" not in text


def test_the_kafka_connectors_declare_their_acls_by_option_set() -> None:
    from sinks.kafka.options import parse_options as sink_options
    from sinks.kafka.privileges import sink_acls, staging_size
    from sources.kafka.options import parse_options as source_options
    from sources.kafka.privileges import source_acls

    def ops(acls: list[KafkaAcl]) -> set[tuple[str, str, str, bool]]:
        return {(a.resource, a.name, a.operation, a.prefixed) for a in acls}

    base = {"kafka.bootstrap.servers": "b:9"}
    assert ops(source_acls(source_options({**base, "subscribe": "a,b"}, streaming=True))) == {
        ("topic", "a", "READ", False),
        ("topic", "b", "READ", False),
    }
    grouped = source_options(
        {
            **base,
            "assign": '{"a":[0]}',
            "kafka.group.id": "g",
            "startingOffsets": "group",
            "commitOffsetsToGroup": "true",
        },
        streaming=True,
    )
    assert ("group", "g", "DESCRIBE", False) in ops(source_acls(grouped))
    assert ("group", "g", "READ", False) in ops(source_acls(grouped))
    sink = {**base, "topic": "out", "sink.id": "orders", "batch.id": "1"}
    partition = ops(sink_acls(sink_options({**sink, "visibility": "partition"}, streaming=False)))
    assert partition == {
        ("topic", "out", "WRITE", False),
        ("topic", "out", "DESCRIBE_CONFIGS", False),
        ("topic", "out", "READ", False),  # the marker: a TxnOffsetCommit against it
        ("transactional_id", "spark-eos:orders:", "WRITE", True),
        ("group", "spark-eos:orders:", "READ", True),
        # a replay of a batch a crash left partly written stages the other slots' rows (F26, "one task committed")
        *(("topic", "spark-eos-staging", op, False) for op in ("WRITE", "READ", "DESCRIBE_CONFIGS", "CREATE")),
    }
    batch = ops(sink_acls(sink_options(sink, streaming=False)))
    assert batch == partition  # visibility=batch stages every batch: the same ACLs
    letters = ops(sink_acls(sink_options({**sink, "errors.tolerance": "all", "errors.topic": "bad"}, streaming=False)))
    assert {("topic", "bad", "WRITE", False), ("topic", "bad", "DESCRIBE_CONFIGS", False)} <= letters
    assert staging_size(1048588) == 1049612  # the broker's default max.message.bytes plus the staging header


def test_an_acl_is_held_as_kafkas_authorizer_decides() -> None:
    from eos_core.privileges import AclBinding, acl_held

    read = KafkaAcl("topic", "orders", "READ")
    describe = KafkaAcl("topic", "orders", "DESCRIBE")
    ids = KafkaAcl("transactional_id", "spark-eos:s:", "WRITE", prefixed=True)

    def held(need: KafkaAcl, *bindings: AclBinding) -> bool:
        return acl_held(need, bindings, "app")

    assert held(read, AclBinding("topic", "orders", False, "User:app", "READ"))
    assert held(describe, AclBinding("topic", "orders", False, "User:app", "WRITE"))  # WRITE implies DESCRIBE
    assert not held(read, AclBinding("topic", "orders", False, "User:app", "WRITE"))
    assert held(read, AclBinding("topic", "ord", True, "User:app", "READ"))  # a prefix of the name
    assert held(read, AclBinding("topic", "*", False, "User:*", "ALL"))
    assert not held(read, AclBinding("topic", "orders", False, "User:other", "READ"))
    assert not held(read, AclBinding("group", "orders", False, "User:app", "READ"))
    assert held(ids, AclBinding("transactional_id", "spark-eos:", True, "User:app", "WRITE"))
    assert not held(ids, AclBinding("transactional_id", "spark-eos:s:task:0", False, "User:app", "WRITE"))
    assert not held(  # a DENY wins
        read,
        AclBinding("topic", "orders", False, "User:app", "READ"),
        AclBinding("topic", "*", False, "User:*", "READ", "DENY"),
    )
