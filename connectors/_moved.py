"""Old import paths of modules that moved in 0.2, kept for one release with a DeprecationWarning."""

from __future__ import annotations

import importlib
import sys
import warnings

__all__ = ["MOVED", "alias"]

# old path -> new path; each old module is a two-line file that calls ``alias``. Gone in 0.3.
MOVED = {
    "connectors.errors": "eos_core.errors",
    "connectors.faults": "eos_core.faults",
    "connectors.options": "eos_core.options",
    "connectors.app_runner": "connectors.toolkit.app_runner",
    "connectors.checker": "connectors.toolkit.checker",
    "connectors.chaos": "connectors.toolkit.chaos",
    "connectors.harness": "connectors.toolkit.harness",
    "connectors.pytest_plugin": "connectors.toolkit.pytest_plugin",
    "connectors.toolkit.fault_kinds": "connectors.toolkit.chaos.kinds",
    "connectors.toolkit.proxy": "connectors.toolkit.chaos.proxy",
    "connectors.toolkit.cluster": "connectors.toolkit.chaos.cluster",
    "connectors.toolkit.avro": "connectors.toolkit.chaos.avro",
}


def alias(old: str) -> None:
    """Make ``old`` the module it moved to (the same object: classes, state and monkeypatches are shared)."""
    new = MOVED[old]
    warnings.warn(
        f"{old} moved to {new} in spark-eos 0.2; import it from there (the old path goes in 0.3)",
        DeprecationWarning,
        stacklevel=3,
    )
    sys.modules[old] = importlib.import_module(new)
