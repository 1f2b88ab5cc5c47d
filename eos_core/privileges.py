"""What a connector needs of Kafka's ACLs and Postgres' privileges, as records its options make.

Each connector declares its needs as a function of its parsed options (``kafka_acls(opts)``,
``postgres_grants(opts)`` beside the connector); docs/security.md is generated from them, ``spark-eos
doctor`` checks a principal and a role against them, and a connector refuses at start, before it writes,
with the same words: what is missing, why, and the command that grants it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = [
    "AclBinding",
    "KafkaAcl",
    "PgGrant",
    "acl_command",
    "acl_held",
    "acl_table",
    "describe_missing",
    "distinct",
    "grant_command",
    "grant_table",
]

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


def distinct(acls: Iterable[KafkaAcl]) -> list[KafkaAcl]:
    """``acls`` each once (one ``why`` of those alike kept: Kafka refuses a request binding an ACL twice)."""
    seen: dict[tuple[str, str, str, bool], KafkaAcl] = {}
    for acl in acls:
        seen.setdefault((acl.resource, acl.name, acl.operation, acl.prefixed), acl)
    return list(seen.values())


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
    # psycopg here, not at the top: every Kafka client imports this module for its ACL advice, and a Kafka-only
    # process (the source's planner, a Kafka sink's task) would load psycopg for nothing (0.15 s a process)
    from psycopg import sql

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


@dataclass(frozen=True)
class AclBinding:
    """An ACL the cluster holds (as DescribeAcls lists it): ``permission`` ALLOW or DENY of ``operation`` (or
    ``ALL``) on ``resource`` ``name`` (``*``: every one; ``prefixed``: every one starting with it) for
    ``principal`` (``User:<name>``, ``User:*``)."""

    resource: str
    name: str
    prefixed: bool
    principal: str
    operation: str
    permission: str = "ALLOW"


# Kafka's implied operations: READ, WRITE, DELETE, ALTER imply DESCRIBE; ALTER_CONFIGS implies DESCRIBE_CONFIGS
_IMPLIED = {"DESCRIBE": {"READ", "WRITE", "DELETE", "ALTER"}, "DESCRIBE_CONFIGS": {"ALTER_CONFIGS"}}


def _covers(b: AclBinding, need: KafkaAcl, principal: str) -> bool:
    if b.resource != need.resource or b.principal not in (f"User:{principal}", "User:*"):
        return False
    if b.operation != "ALL" and b.operation != need.operation and b.operation not in _IMPLIED.get(need.operation, ()):
        return False
    if need.resource == "cluster" or b.name == "*":
        return True
    if b.prefixed:
        return need.name.startswith(b.name)
    return not need.prefixed and b.name == need.name


def acl_held(need: KafkaAcl, bindings: Iterable[AclBinding], principal: str) -> bool:
    """Whether ``bindings`` let ``principal`` do what ``need`` asks: an ALLOW that covers it (the operation, ALL
    or one that implies it; the literal name, ``*``, or a prefix of the name, a prefixed need only by a prefix
    of its prefix) and no DENY that covers it (a DENY wins, as in Kafka's authorizer)."""
    listed = list(bindings)
    allowed = any(b.permission == "ALLOW" and _covers(b, need, principal) for b in listed)
    return allowed and not any(b.permission == "DENY" and _covers(b, need, principal) for b in listed)


def acl_table(acls: Sequence[KafkaAcl], principal: str = "<app>") -> str:
    """A markdown table of ``acls``: resource, name, operation, why, and the command that grants it."""
    rows = ["| resource | name | operation | needed to | grant it |", "|---|---|---|---|---|"]
    for a in acls:
        name = "" if a.resource == "cluster" else f"`{a.name}`" + (" (prefix)" if a.prefixed else "")
        command = acl_command(a, principal).replace("|", "\\|")
        rows.append(f"| {a.resource.replace('_', ' ')} | {name} | {a.operation} | {a.why} | `{command}` |")
    return "\n".join(rows)


def grant_table(grants: Sequence[PgGrant], role: str = "app") -> str:
    """A markdown table of ``grants``: object, name, privilege, why (and while what is missing), the GRANT."""
    rows = ["| object | name | privilege | needed to | grant it |", "|---|---|---|---|---|"]
    for g in grants:
        when = f"; only while {g.unless[0]} `{g.unless[1]}` does not exist" if g.unless else ""
        name = f"`{g.name}`" if g.name else "the DSN's database"
        rows.append(f"| {g.object} | {name} | {g.privilege} | {g.why}{when} | `{grant_command(g, role)}` |")
    return "\n".join(rows)
