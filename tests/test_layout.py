"""The layers' dependencies point one way (CONTRIBUTING.md "Layout"), checked on every import.

1. connectors users import: ``sources/``, ``sinks/`` and the core of ``connectors/`` (errors,
   options, faults, checkpoint, ``register``); they import nothing else of ours.
2. the product around them (the rest of ``connectors/``: CLI, pipelines, savepoints, the chaos
   toolkit, services): imports layer 1 and itself, never the repo's test machinery.
3. the repo's own machinery (``integration/``, ``tests/``, ``bench/``): may import anything; nothing
   in the wheel imports it.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORE = {"connectors", "connectors.errors", "connectors.options", "connectors.faults", "connectors.checkpoint"}
OURS = ("connectors", "sources", "sinks", "integration", "tests", "bench")


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}  # "from connectors import faults"
    return {m for m in found if m.split(".")[0] in OURS}


def _layer(module: str) -> int:
    top = module.split(".")[0]
    if top in ("sources", "sinks") or module in CORE:
        return 1
    return 2 if top == "connectors" else 3


def _known(name: str) -> str | None:
    """The module ``name`` denotes (``from connectors import faults`` names connectors.faults)."""
    for candidate in (name, name.rsplit(".", 1)[0]):
        path = ROOT / Path(*candidate.split("."))
        if path.with_suffix(".py").exists() or (path / "__init__.py").exists():
            return candidate
    return None


def test_every_import_points_down_or_sideways() -> None:
    wrong = []
    for top in ("connectors", "sources", "sinks"):
        for path in sorted((ROOT / top).rglob("*.py")):
            here = _module(path)
            for name in _imports(path):
                target = _known(name)
                if target is None or target == here:
                    continue
                if _layer(target) > _layer(here):
                    wrong.append(f"{here} (layer {_layer(here)}) imports {target} (layer {_layer(target)})")
    assert not wrong, "\n".join(sorted(set(wrong)))


def test_the_check_sees_imports_inside_functions() -> None:
    runner = _imports(ROOT / "connectors" / "app_runner.py")
    assert "connectors.faults" in runner and _layer("connectors.app_runner") == 2
    assert _layer("sinks.postgres.twophase.writer") == 1 and _layer("integration.harness.runner") == 3
