"""A package's names imported when first asked for (PEP 562), for the packages Spark's planner processes pass through.

Spark unpickles a Python data source's class in planner processes of its own, several per query start; each
imports the class's packages on the way to its module. A package that imports all it exports makes every one
of them pay for the readers, writers and clients only tasks use. Such a package says where each name lives::

    __getattr__ = lazy.exports(__name__, {"KafkaStreamReader": "sources.kafka.readers", ...})

and keeps the imports for type checkers under ``if TYPE_CHECKING:``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["exports"]


def exports(package: str, where: Mapping[str, str]) -> Callable[[str], Any]:
    """The module ``__getattr__`` of ``package``: each name of ``where`` from the module it names, imported then."""

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(module), name)

    return __getattr__
