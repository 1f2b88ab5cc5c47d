"""The exactly-once checker for integration tests: re-exports ``connectors.toolkit.checker``."""

from connectors.toolkit.checker import *  # noqa: F403
from connectors.toolkit.checker import __all__  # noqa: F401
