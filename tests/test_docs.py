"""The documentation cannot drift: option tables equal the option specs, relative links resolve."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted([ROOT / "README.md", ROOT / "CONTRIBUTING.md", *(ROOT / "docs").glob("*.md")])


def _generator():  # scripts/ is not a package
    spec = importlib.util.spec_from_file_location("docs_options", ROOT / "scripts" / "docs_options.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_option_table_is_the_one_its_spec_generates() -> None:
    gen = _generator()
    marked = {m for p in gen.pages() for m in re.findall(r"<!-- options: ([\w. -]+?) -->", p.read_text())}
    assert marked == set(gen.SPECS), f"pages mark {sorted(marked)}, specs are {sorted(gen.SPECS)}"
    for page in gen.pages():
        text = page.read_text()
        assert gen.render(text) == text, f"{page.name}: option table out of date; run scripts/docs_options.py"


def test_every_privilege_table_is_the_one_the_connectors_declare() -> None:
    """docs/security.md's ACL and GRANT tables are what each connector declares for those options (issue 44):
    a connector that needs one more privilege changes the page, or this fails."""
    gen = _generator()
    marked = {m for p in gen.pages() for m in re.findall(r"<!-- privileges: ([\w. =,:-]+?) -->", p.read_text())}
    assert marked == set(gen.PRIVILEGES), f"pages mark {sorted(marked)}, declared sets are {sorted(gen.PRIVILEGES)}"
    page = ROOT / "docs" / "security.md"
    text = page.read_text()
    assert gen.render(text) == text, "docs/security.md: a privilege table is out of date; run scripts/docs_options.py"


def _anchors(text: str) -> set[str]:
    heads = re.findall(r"^#{1,6} (.+)$", text, re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in heads}


def test_relative_links_point_at_pages_and_headings_that_exist() -> None:
    broken = []
    for page in PAGES:
        text = page.read_text()
        for target in re.findall(r"\]\(([^)#\s]*)(?:#([^)\s]+))?\)", text):
            path, anchor = target
            if path.startswith(("http://", "https://", "mailto:")):
                continue
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: {path} does not exist")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest.read_text()):
                broken.append(f"{page.relative_to(ROOT)}: no heading #{anchor} in {dest.relative_to(ROOT)}")
    assert not broken, "\n".join(broken)
