"""What a connector needs of Kafka's ACLs and Postgres' privileges, as records its options make.

Each connector declares its needs as a function of its parsed options (``kafka_acls(opts)``,
``postgres_grants(opts)`` beside the connector); docs/security.md is generated from them, ``spark-eos
doctor`` checks a principal and a role against them, and a connector refuses at start, before it writes,
with the same words: what is missing, why, and the command that grants it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from psycopg import sql

__all__ = ["KafkaAcl", "PgGrant", "acl_command", "describe_missing", "grant_command"]

KAFKA_RESOURCES = ("topic", "group", "transactional_id", "cluster")
KAFKA_OPERATIONS = ("READ", "WRITE", "CREATE", "DESCRIBE", "DESCRIBE_CONFIGS", "IDEMPOTENT_WRITE", "ALTER")
PG_OBJECTS = ("database", "schema", "table", "sequence")
PG_PRIVILEGES = ("CONNECT", "TEMPORARY", "CREATE", "USAGE", "SELECT", "INSERT", "UPDATE", "DELETE", "TRUNCATE", "OWNER")
"""``OWNER``: not a privilege but what ALTER TABLE needs: to own the table (or be a member of its owner)."""


@dataclass(frozen=True)
class KafkaAcl:
    """An ACL a connector's principal needs: ``operation`` on the ``resource`` named ``name`` (or every one
    whose name starts with ``name``: ``prefixed``); ``why``: what of the connector needs it."""

    resource: str
    name: str
    operation: str
    prefixed: bool = False
    why: str = ""

    def __post_init__(self) -> None:
        if self.resource not in KAFKA_RESOURCES or self.operation not in KAFKA_OPERATIONS:
            raise ValueError(f"not an ACL spark-eos knows: {self}")

    def describe(self) -> str:
        what = f"{'prefix ' if self.prefixed else ''}{self.name!r}" if self.resource != "cluster" else ""
        return f"{self.operation} on {self.resource.replace('_', ' ')} {what}".rstrip()


@dataclass(frozen=True)
class PgGrant:
    """A privilege a connector's role needs: ``privilege`` on the ``object`` named ``name`` (a table:
    ``schema.table``; ``name`` None: the database the DSN names); ``why``: what of the connector needs it.

    ``unless``: (object, name) of what makes the grant unneeded once it exists (CREATE on a schema, to create
    a table an admin may create beforehand instead); ``create``: the statement that creates it then."""

    object: str
    name: str | None
    privilege: str
    why: str = ""
    unless: tuple[str, str] | None = None
    create: str = ""

    def __post_init__(self) -> None:
        if self.object not in PG_OBJECTS or self.privilege not in PG_PRIVILEGES:
            raise ValueError(f"not a privilege spark-eos knows: {self}")

    def describe(self) -> str:
        where = f"{self.object} {self.name or '(the database of the dsn)'}"
        if self.privilege == "OWNER":
            return f"ownership of {where}"
        return f"{self.privilege} on {where}" + (
            f", while {self.unless[0]} {self.unless[1]} does not exist" if self.unless else ""
        )


def acl_command(acl: KafkaAcl, principal: str, bootstrap: str = "<bootstrap>") -> str:
    """The ``kafka-acls.sh`` command that grants ``acl`` to ``User:<principal>``."""
    kinds = {"topic": "--topic", "group": "--group", "transactional_id": "--transactional-id", "cluster": "--cluster"}
    target = kinds[acl.resource] + ("" if acl.resource == "cluster" else f" '{acl.name}'")
    pattern = " --resource-pattern-type prefixed" if acl.prefixed else ""
    operation = acl.operation.replace("_", "").title() if acl.operation != "IDEMPOTENT_WRITE" else "IdempotentWrite"
    if acl.operation == "DESCRIBE_CONFIGS":
        operation = "DescribeConfigs"
    return (
        f"kafka-acls.sh --bootstrap-server {bootstrap} --command-config admin.properties --add "
        f"--allow-principal User:{principal} --operation {operation} {target}{pattern}"
    )


def grant_command(grant: PgGrant, role: str, database: str = "<database>", *, revoke: bool = False) -> str:
    """The SQL that grants ``grant`` to ``role`` (``revoke``: takes it back), identifiers quoted."""
    ident = sql.Identifier
    name = grant.name
    if grant.privilege == "OWNER":
        parts = (name or "").split(".")
        return sql.SQL("ALTER TABLE {} OWNER TO {};").format(ident(*parts), ident(role)).as_string(None)
    if grant.object == "database":
        target = sql.SQL("DATABASE {}").format(ident(name or database))
    elif grant.object == "schema":
        target = sql.SQL("SCHEMA {}").format(ident(name or "public"))
    else:
        parts = (name or "").split(".")
        target = sql.SQL("TABLE {}" if grant.object == "table" else "SEQUENCE {}").format(ident(*parts))
    form = "REVOKE {} ON {} FROM {};" if revoke else "GRANT {} ON {} TO {};"
    stmt = sql.SQL(form).format(sql.SQL(grant.privilege), target, ident(role))
    return stmt.as_string(None)


def describe_missing(
    who: str, acls: Sequence[KafkaAcl] = (), grants: Sequence[PgGrant] = (), *, context: str, fix: Iterable[str] = ()
) -> str:
    """One refusal, on one line (an error's cause is found by its line), naming every missing ACL or privilege
    of ``who``, why each is needed, and the commands that grant them."""
    listed: list[KafkaAcl | PgGrant] = [*acls, *grants]
    needs = "; ".join(f"{n.describe()} ({n.why})" for n in listed)
    commands = " ".join(fix)
    return f"{context}: {who} lacks {needs}" + (f". Grant it: {commands}" if commands else "")
