"""Least-privileged Postgres roles for apps: ``Role`` (a login that is not a superuser and owns nothing it was not
granted), made, granted, revoked and given a new password through the admin DSN of any Postgres service.

A hardened database (``harden``) is one a managed service or a careful DBA hands out: ``PUBLIC`` may neither
connect to it nor create temporary tables in it, nor use schema ``public``; each app role then holds
exactly the privileges it is granted (``eos_core.privileges.PgGrant``), CONNECT included.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable
from typing import Any

from eos_core.privileges import PgGrant, grant_command

__all__ = ["Role", "add_role", "harden", "owner_grants"]


def owner_grants() -> list[PgGrant]:
    """What an app role needs to make and own its tables, nothing else: CONNECT, TEMPORARY and CREATE on the
    database (the 2PC sink's protocol schema, the upsert sink's staging), USAGE and CREATE on schema public."""
    on_database = [PgGrant("database", None, p) for p in ("CONNECT", "TEMPORARY", "CREATE")]
    return on_database + [PgGrant("schema", "public", p) for p in ("USAGE", "CREATE")]


def _dsn_as(admin_dsn: str, user: str, password: str) -> str:
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    params = conninfo_to_dict(admin_dsn)
    params.update(user=user, password=password)
    return make_conninfo("", **params)


def _database(admin_dsn: str) -> str:
    from psycopg.conninfo import conninfo_to_dict

    return str(conninfo_to_dict(admin_dsn).get("dbname") or "postgres")


def _run(admin_dsn: str, statements: Iterable[Any]) -> None:
    import psycopg

    with psycopg.connect(admin_dsn, autocommit=True, connect_timeout=10) as conn:
        for stmt in statements:
            conn.execute(stmt)


def harden(admin_dsn: str) -> None:
    """Take from ``PUBLIC`` what a fresh database gives every role: CONNECT and TEMPORARY on the database of
    ``admin_dsn``, USAGE and CREATE on schema ``public`` (Postgres 15 takes CREATE already)."""
    from psycopg import sql

    db = sql.Identifier(_database(admin_dsn))
    _run(
        admin_dsn,
        [
            sql.SQL("REVOKE CONNECT, TEMPORARY ON DATABASE {} FROM PUBLIC").format(db),
            sql.SQL("REVOKE ALL ON SCHEMA public FROM PUBLIC"),
        ],
    )


def _exists(conn: Any, kind: str, name: str | None) -> bool:
    if kind == "schema":
        row = conn.execute("SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = %s)", (name,)).fetchone()
    else:
        from psycopg import sql

        row = conn.execute(
            "SELECT to_regclass(%s) IS NOT NULL", (sql.Identifier(*(name or "").split(".", 1)).as_string(None),)
        ).fetchone()
    return bool(row and row[0])


class Role:
    """A login role (``NOSUPERUSER NOCREATEDB NOCREATEROLE``) of the server behind ``admin_dsn``: ``dsn`` logs in
    as it (the admin DSN's host, port, database and TLS settings, its own user and password)."""

    def __init__(self, name: str, password: str, admin_dsn: str) -> None:
        self.name, self.password, self._admin = name, password, admin_dsn

    @property
    def dsn(self) -> str:
        return _dsn_as(self._admin, self.name, self.password)

    @property
    def database(self) -> str:
        return _database(self._admin)

    def grant(self, grants: Iterable[PgGrant]) -> None:
        """Grant ``grants`` (each as ``eos_core.privileges.grant_command`` writes it)."""
        _run(self._admin, [grant_command(g, self.name, self.database) for g in grants])

    def grant_present(self, grants: Iterable[PgGrant]) -> list[PgGrant]:
        """Grant those of ``grants`` whose object exists (what a sink creates it owns, and needs no grant on);
        returns the others. The ones with ``unless`` are left out once their object exists, as a sink asks."""
        import psycopg

        with psycopg.connect(self._admin, autocommit=True, connect_timeout=10) as conn:
            present: list[PgGrant] = []
            absent: list[PgGrant] = []
            for g in grants:
                exists = _exists(conn, g.object, g.name) if g.object != "database" else True
                waived = g.unless is not None and _exists(conn, *g.unless)
                (present if exists and not waived else absent).append(g)
        self.grant(present)
        return absent

    def revoke(self, grants: Iterable[PgGrant]) -> None:
        """Revoke ``grants`` (a revocation under a running client: its next statement on the object fails)."""
        _run(self._admin, [grant_command(g, self.name, self.database, revoke=True) for g in grants])

    def set_password(self, password: str) -> None:
        """A rotation: new logins need ``password``; sessions open with the old one go on."""
        from psycopg import sql

        _run(
            self._admin,
            [sql.SQL("ALTER ROLE {} PASSWORD {}").format(sql.Identifier(self.name), sql.Literal(password))],
        )
        self.password = password

    def __repr__(self) -> str:
        return f"Role({self.name!r})"  # never the password


def add_role(admin_dsn: str, name: str, grants: Iterable[PgGrant] = (), password: str | None = None) -> Role:
    """A new login role ``name`` (a random password unless given) holding exactly ``grants``; an existing role
    of that name is refused by the server."""
    from psycopg import sql

    role = Role(name, password or secrets.token_urlsafe(18), admin_dsn)
    _run(
        admin_dsn,
        [
            sql.SQL("CREATE ROLE {} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION PASSWORD {}").format(
                sql.Identifier(name), sql.Literal(role.password)
            )
        ],
    )
    role.grant(grants)
    return role
