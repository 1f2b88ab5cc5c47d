"""The operator commands of spark-eos, a module per command group (``spark-eos sinks``: ``sinks``,
``spark-eos kafka-sink``: ``kafka_sink``), and the shell every group's ``add_subparser`` and ``main``
share (``connectors.services.manage`` and ``connectors.toolkit.chaos.cli`` use it too). The work is done
by the layer below: ``sinks.postgres.status``, ``sinks.kafka.status``."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["group", "standalone"]


def group(
    subparsers: Any, name: str, help: str, dest: str, add_commands: Callable[[Any], None]
) -> argparse.ArgumentParser:
    """Add the command group ``name`` (its subcommands by ``add_commands``, chosen one in ``args.<dest>``) to a
    CLI's subparsers: ``spark-eos <name> ...``. Each leaf sets ``func(args) -> exit code``."""
    p: argparse.ArgumentParser = subparsers.add_parser(name, help=help)
    add_commands(p.add_subparsers(dest=dest, required=True))
    return p


def standalone(
    prog: str, doc: str | None, dest: str, add_commands: Callable[[Any], None], argv: Sequence[str] | None
) -> int:
    """Run a command group on its own (``python -m ...``): parse ``argv`` and run the chosen leaf's ``func``."""
    parser = argparse.ArgumentParser(prog=prog, description=(doc or "").split("\n")[0])
    add_commands(parser.add_subparsers(dest=dest, required=True))
    args = parser.parse_args(list(argv) if argv is not None else None)
    return int(args.func(args))
