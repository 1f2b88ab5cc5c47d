"""The layers' dependencies point one way (docs/architecture.md "Layers"), checked on every import.

The rule is stated by package, not by a list of files:

1. connectors users import: ``sources``, ``sinks`` and ``eos_core``, plus the ``connectors``
   package itself (``register``). ``eos_core`` imports only ``eos_core``; ``sinks`` import only
   themselves and ``eos_core``; ``sources`` also ``sinks`` (the ``kafka-eos`` format writes through
   the Kafka sink), so the two never import each other both ways (``register`` imports the formats).
2. the product around them: every other ``connectors`` package (``toolkit``, ``pipelines``,
   ``services``, ``launch``, the CLI, savepoints): imports layer 1 and itself, never layer 3.
3. the repo's own machinery (``integration``, ``tests``, ``bench``): may import anything; nothing in
   the wheel imports it.

And no import circle between modules of the wheel (imports inside functions included: a circle
there is still two modules that each need the other).
"""

from __future__ import annotations

import ast
import importlib
import re
import sys
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
OURS = ("connectors", "eos_core", "sources", "sinks", "integration", "tests", "bench")
WHEEL = ("connectors", "eos_core", "sources", "sinks")


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
            found |= {f"{node.module}.{a.name}" for a in node.names}  # "from eos_core import faults"
    return {m for m in found if m.split(".")[0] in OURS}


def _in(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _layer(module: str) -> int:
    if module == "connectors" or any(_in(module, p) for p in ("sources", "sinks", "eos_core")):
        return 1
    return 2 if _in(module, "connectors") else 3


def _known(name: str) -> str | None:
    """The module ``name`` denotes (``from eos_core import faults`` names eos_core.faults)."""
    for candidate in (name, name.rsplit(".", 1)[0]):
        path = ROOT / Path(*candidate.split("."))
        if path.with_suffix(".py").exists() or (path / "__init__.py").exists():
            return candidate
    return None


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for top in WHEEL:
        for path in sorted((ROOT / top).rglob("*.py")):
            here = _module(path)
            targets = {_known(name) for name in _imports(path)}
            graph[here] = {t for t in targets if t is not None and t != here}
    return graph


def _allowed(here: str, target: str) -> bool:
    if _in(here, "eos_core"):
        return _in(target, "eos_core")
    if here == "connectors":  # register(): the formats and the errors it re-exports
        return _layer(target) == 1
    if _in(here, "sinks"):
        return _in(target, "sinks") or _in(target, "eos_core")
    if _in(here, "sources"):
        return any(_in(target, p) for p in ("sources", "sinks", "eos_core"))
    return _layer(target) <= 2


def test_every_import_points_down_or_sideways() -> None:
    wrong = [
        f"{here} (layer {_layer(here)}) imports {target} (layer {_layer(target)})"
        for here, targets in _graph().items()
        for target in targets
        if not _allowed(here, target)
    ]
    assert not wrong, "\n".join(sorted(set(wrong)))


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                on.discard(w)
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                found.append(sorted(part))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _without_package_inits(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    # ``pkg/__init__`` re-exporting its own modules, which import ``pkg.x``, is the package's face,
    # not a circle of two modules that need each other: drop edges from a module to its own parents.
    return {h: {t for t in ts if not _in(h, t)} for h, ts in graph.items()}


def test_no_import_circle_between_modules() -> None:
    circles = _cycles(_without_package_inits(_graph()))
    assert not circles, "import circles:\n" + "\n".join(" <-> ".join(c) for c in circles)


def test_the_check_sees_imports_inside_functions() -> None:
    runner = _imports(ROOT / "connectors" / "toolkit" / "app_runner.py")
    assert "eos_core.faults" in runner and _layer("connectors.toolkit.app_runner") == 2
    assert _layer("sinks.postgres.twophase.writer") == 1 and _layer("integration.harness.runner") == 3
    assert not _allowed("sinks.postgres.upsert", "connectors.toolkit.checker")
    assert not _allowed("eos_core.errors", "connectors.services")
    assert not _allowed("sinks.kafka.options", "sources.kafka.option_specs")
    assert _allowed("sources.kafka.datasource", "sinks.kafka.spark")


def test_the_circle_check_finds_a_circle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


@pytest.mark.parametrize("old", ["connectors.errors", "connectors.checker", "connectors.pytest_plugin"])
def test_old_import_paths_still_work_for_one_release_and_warn(old: str) -> None:
    from connectors._moved import MOVED

    saved = sys.modules.pop(old, None)
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            module = importlib.import_module(old)
        assert module is importlib.import_module(MOVED[old])
        assert any(issubclass(w.category, DeprecationWarning) and MOVED[old] in str(w.message) for w in seen)
    finally:
        sys.modules.pop(old, None)
        if saved is not None:
            sys.modules[old] = saved


def test_the_architecture_drawing_names_every_package_of_the_wheel() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text()
    drawing = text[text.index("## Layers") : text.index("## One micro-batch")]
    packages = {_module(p.parent) for top in WHEEL for p in (ROOT / top).rglob("__init__.py")}
    missing = sorted(p for p in packages if p not in drawing)
    assert not missing, f"docs/architecture.md's drawing of the layers misses {missing}"
    import re

    named = set(re.findall(r"\b((?:connectors|sources|sinks)(?:\.[a-z_]+)+)", drawing))
    gone = sorted(n for n in named if _known(n) is None)
    assert not gone, f"docs/architecture.md's drawing names what does not exist: {gone}"


def test_chaos_finds_the_checkout_it_runs_from() -> None:
    # chaos --pipeline runs integration/harness/runner.py of the clone: a move of the module must not lose it
    from connectors.toolkit.chaos.runs import repo_root as _repo_root

    assert Path(_repo_root()) == ROOT


# ---- sizes, private names, and the layout CONTRIBUTING describes --------------------------------------------

MAX_MODULE_LINES = 1000
MAX_FUNCTION_LINES = 80


def _wheel_files() -> list[Path]:
    return [p for top in WHEEL for p in sorted((ROOT / top).rglob("*.py"))]


def test_no_module_of_the_wheel_is_over_a_thousand_lines() -> None:
    long = {str(p.relative_to(ROOT)): n for p in _wheel_files() if (n := len(p.read_text().splitlines())) > 1000}
    assert not long, f"modules over {MAX_MODULE_LINES} lines (a package by phase reads better): {long}"


def test_no_function_of_the_wheel_is_over_eighty_lines() -> None:
    long = {
        f"{p.relative_to(ROOT)}:{node.lineno} {node.name}": n
        for p in _wheel_files()
        for node in ast.walk(ast.parse(p.read_text(), str(p)))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and (n := (node.end_lineno or node.lineno) - node.lineno + 1) > MAX_FUNCTION_LINES
    }
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {long}"


def _toolkit_aliases(tree: ast.AST) -> dict[str, str]:
    """Names bound to modules of connectors.toolkit by the imports of ``tree``."""
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("connectors.toolkit"):
            for a in node.names:
                if _known(f"{node.module}.{a.name}") == f"{node.module}.{a.name}":
                    names[a.asname or a.name] = f"{node.module}.{a.name}"
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("connectors.toolkit") and a.asname:
                    names[a.asname] = a.name
    return names


def test_tests_reach_no_private_name_of_the_toolkit() -> None:
    """The toolkit is what users run on their own jobs: what the tests need of it is public."""
    found = []
    for top in ("tests", "integration", "examples"):
        for p in sorted((ROOT / top).rglob("*.py")):
            tree = ast.parse(p.read_text(), str(p))
            aliases = _toolkit_aliases(tree)
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("connectors.toolkit"):
                    found += [
                        f"{p.relative_to(ROOT)}: {node.module}.{a.name}"
                        for a in node.names
                        if a.name.startswith("_") and not a.name.startswith("__")
                    ]
                if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                    root = node.value
                    while isinstance(root, ast.Attribute):
                        root = root.value
                    if isinstance(root, ast.Name) and root.id in aliases:
                        found.append(f"{p.relative_to(ROOT)}:{node.lineno}: {root.id}...{node.attr}")
    assert not found, "tests reach private names of the toolkit:\n" + "\n".join(found)


def test_contributing_names_every_package_of_the_wheel() -> None:
    text = (ROOT / "CONTRIBUTING.md").read_text()
    section = text[text.index("## Layout") : text.index("## Containers")]
    packages = sorted({p.parent.relative_to(ROOT) for top in WHEEL for p in (ROOT / top).rglob("__init__.py")})
    missing = [str(p) for p in packages if len(p.parts) > 1 and f"{p.name}/" not in section]
    assert not missing, f"CONTRIBUTING.md's layout misses the packages {missing}"
    gone = [
        m
        for m in re.findall(r"`((?:connectors|sinks|sources|eos_core)/[\w/]+\.py)`", section)
        if not (ROOT / m).exists()
    ]
    assert not gone, f"CONTRIBUTING.md's layout names files that do not exist: {gone}"
