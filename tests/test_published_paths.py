"""Every module path the docs ever published still imports, directly or through a deprecation alias
(``connectors._moved``): a job written against an earlier page must not fail at its first line."""

from __future__ import annotations

import importlib
import re
import sys
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("connectors", "sinks", "sources", "eos_core")
_DOTTED = "(?:" + "|".join(PACKAGES) + r")(?:\.[A-Za-z_][A-Za-z_0-9]*)*"
_IMPORT = re.compile(rf"^\s*(?:from\s+({_DOTTED})\s+import\s+([A-Za-z_][A-Za-z_0-9]*)|import\s+({_DOTTED}))", re.M)
_TICKED = re.compile(rf"`({_DOTTED})`")

# Paths the docs of a release published (`git log -p -- '*.md'`) that today's pages no longer show: each must
# import as its page said. (`connectors.core` never reached a release: it lived inside 0.2's unreleased
# section, renamed `eos_core` before 0.2, and is not here.)
EARLIER = (
    "connectors.app_runner.Job",  # 0.1's toolkit docs: `from connectors.app_runner import Job`
    "connectors.checker",
    "connectors.errors",
    "connectors.faults",
    "connectors.options",
    "connectors.chaos",
    "connectors.harness",
    "connectors.pytest_plugin",
    "connectors.metrics",
    "connectors.toolkit.fault_kinds",
    "connectors.toolkit.proxy",
    "connectors.toolkit.cluster",
    "connectors.toolkit.avro",
)


def _pages() -> list[Path]:
    pages = [ROOT / "CHANGELOG.md", ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    pages += sorted((ROOT / "examples").rglob("*.md")) + sorted((ROOT / "examples").rglob("*.py"))
    return pages


def published_paths() -> list[str]:
    """Every dotted path of our packages that a page imports from or names in backticks, and ``EARLIER``."""
    found: set[str] = set(EARLIER)
    for page in _pages():
        text = page.read_text(encoding="utf-8")
        for frm, name, plain in _IMPORT.findall(text):
            found.add(f"{frm}.{name}" if frm else plain)
        found.update(_TICKED.findall(text))
    return sorted(found)


def _resolve(path: str) -> object:
    """The object ``path`` names: its longest prefix that imports as a module, the rest as attributes."""
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        name = ".".join(parts[:i])
        try:
            obj: object = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name is not None and not name.startswith(exc.name + ".") and exc.name != name:
                raise  # the module exists but imports something missing: a real failure
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(path)


def test_the_scan_finds_the_pages_imports() -> None:
    paths = published_paths()
    assert "connectors.toolkit.app_runner.Job" in paths and "connectors.app_runner.Job" in paths
    assert "sources.kafka.datasource.write_options" in paths  # a backticked name of the CHANGELOG
    assert len(paths) > 40


@pytest.mark.parametrize("path", published_paths())
def test_every_published_path_imports(path: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        assert _resolve(path) is not None


def test_connectors_app_runner_is_the_toolkits_with_a_warning() -> None:
    saved = sys.modules.pop("connectors.app_runner", None)
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            from connectors.app_runner import Job
        from connectors.toolkit.app_runner import Job as Moved

        assert Job is Moved
        assert any(
            issubclass(w.category, DeprecationWarning) and "connectors.toolkit.app_runner" in str(w.message)
            for w in seen
        )
    finally:
        sys.modules.pop("connectors.app_runner", None)
        if saved is not None:
            sys.modules["connectors.app_runner"] = saved
