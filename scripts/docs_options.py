"""The option tables of docs/ pages, generated from the option specs (so a page cannot drift).

    .venv/bin/python scripts/docs_options.py          # rewrite the tables in place
    .venv/bin/python scripts/docs_options.py --check  # exit 1, naming the page, when one drifted

A page marks each table with ``<!-- options: NAME -->`` ... ``<!-- /options -->``; NAME is a key
of ``SPECS``. ``tests/test_docs.py`` runs the check.
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
BLOCK = re.compile(r"(<!-- options: ([\w. -]+?) -->\n)(.*?)(<!-- /options -->)", re.S)


def table(name: str) -> str:
    module, attr = SPECS[name].split(":")
    return str(getattr(importlib.import_module(module), attr).markdown())


def render(text: str) -> str:
    """``text`` with every marked block replaced by its generated table."""
    return BLOCK.sub(lambda m: f"{m.group(1)}{table(m.group(2))}\n{m.group(4)}", text)


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
        print(f"option tables out of date in {names}: run .venv/bin/python scripts/docs_options.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
