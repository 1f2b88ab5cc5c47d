"""The exactly-once checker for integration tests: re-exports ``connectors.checker``."""

from connectors.checker import *  # noqa: F403
from connectors.checker import __all__  # noqa: F401
