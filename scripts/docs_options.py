"""The option tables and privilege tables of docs/ pages, generated from the option specs and the connectors'
privilege declarations (so a page cannot drift).

    .venv/bin/python scripts/docs_options.py          # rewrite the tables in place
    .venv/bin/python scripts/docs_options.py --check  # exit 1, naming the page, when one drifted

A page marks each table with ``<!-- options: NAME -->`` ... ``<!-- /options -->`` (NAME a key of ``SPECS``)
or ``<!-- privileges: NAME -->`` ... ``<!-- /privileges -->`` (NAME a key of ``PRIVILEGES``: a connector and
options whose ACLs or grants ``connectors.doctor.needs`` gives). ``tests/test_docs.py`` runs the check.
"""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SPECS = {
    "kafka-eos": "sources.kafka.option_specs:OPTIONS",
    "postgres-upsert": "sinks.postgres.options:UPSERT_OPTIONS",
    "postgres-2pc": "sinks.postgres.twophase.options:TWOPC_OPTIONS",
    "kafka-eos sink": "sinks.kafka.options:OPTIONS",
}
BLOCK = re.compile(r"(<!-- (options|privileges): ([\w. =,:-]+?) -->\n)(.*?)(<!-- /(?:options|privileges) -->)", re.S)
# name -> (connector, its options): the option sets docs/security.md tabulates
PRIVILEGES: dict[str, tuple[str, dict[str, str]]] = {
    "source": ("kafka-eos", {"subscribe": "orders"}),
    "source group": (
        "kafka-eos",
        {
            "subscribe": "orders",
            "kafka.group.id": "orders-app",
            "startingOffsets": "group",
            "commitOffsetsToGroup": "true",
        },
    ),
    "sink partition": ("kafka-eos-sink", {"topic": "enriched", "sink.id": "enrich", "visibility": "partition"}),
    "sink batch": ("kafka-eos-sink", {"topic": "enriched", "sink.id": "enrich"}),
    "sink dead letters": (
        "kafka-eos-sink",
        {"topic": "enriched", "sink.id": "enrich", "errors.tolerance": "all", "errors.topic": "enriched-refused"},
    ),
    "upsert": ("postgres-upsert", {"table": "public.orders", "key": "id"}),
    "upsert deletes": (
        "postgres-upsert",
        {"table": "public.orders", "key": "id", "version": "ver", "delete.column": "deleted"},
    ),
    "upsert more": (
        "postgres-upsert",
        {
            "table": "public.orders",
            "key": "id",
            "table.create": "true",
            "schema.evolution": "add-columns",
            "errors.tolerance": "all",
            "errors.table": "public.orders_refused",
        },
    ),
    "2pc batch": ("postgres-2pc", {"table": "public.ledger", "sink.id": "ledger"}),
    "2pc partition": ("postgres-2pc", {"table": "public.ledger", "sink.id": "ledger", "visibility": "partition"}),
    "2pc upsert": (
        "postgres-2pc",
        {"table": "public.balances", "sink.id": "balances", "mode": "upsert", "key": "account"},
    ),
}


def table(name: str) -> str:
    module, attr = SPECS[name].split(":")
    return str(getattr(importlib.import_module(module), attr).markdown())


def privileges(name: str) -> str:
    from connectors.doctor import needs
    from eos_core.privileges import acl_table, grant_table

    connector, options = PRIVILEGES[name]
    bootstrap = {"kafka.bootstrap.servers": "b:9"} if connector.startswith("kafka") else {}
    acls, grants, _ = needs(connector, {**bootstrap, **options})
    shown = ", ".join(f"`{k}={v}`" for k, v in options.items())
    return f"`{connector}` with {shown}:\n\n" + (acl_table(acls) if acls else grant_table(grants))


def render(text: str) -> str:
    """``text`` with every marked block replaced by its generated table."""

    def block(m: re.Match[str]) -> str:
        made = table(m.group(3)) if m.group(2) == "options" else privileges(m.group(3))
        return f"{m.group(1)}{made}\n{m.group(5)}"

    return BLOCK.sub(block, text)


def pages() -> list[Path]:
    return sorted(p for p in (ROOT / "docs").glob("*.md") if BLOCK.search(p.read_text()))


def main(argv: list[str]) -> int:
    sys.path.insert(0, str(ROOT))
    drifted = []
    for page in pages():
        text = page.read_text()
        new = render(text)
        if new != text:
            drifted.append(page)
            if "--check" not in argv:
                page.write_text(new)
    if drifted and "--check" in argv:
        names = ", ".join(str(p.relative_to(ROOT)) for p in drifted)
        print(f"generated tables out of date in {names}: run .venv/bin/python scripts/docs_options.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
