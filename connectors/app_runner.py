"""Deprecated alias of ``connectors.toolkit.app_runner`` (moved in 0.2; this path goes in 0.3)."""

from connectors._moved import alias

alias(__name__)
