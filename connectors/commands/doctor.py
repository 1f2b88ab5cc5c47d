"""``spark-eos doctor CONNECTOR -o KEY=VALUE ...``: whether the principal and the role of a connector's options
hold every ACL and privilege the connector declares for them (docs/security.md lists them), and the settings
exactly-once needs; each missing one with the command that grants or sets it (``connectors.doctor`` checks).

Exit status: 0 when everything is held, 1 when something is missing or could not be checked."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

__all__ = ["add_subparser", "main"]

_MARK = {"ok": "ok     ", "missing": "MISSING", "warn": "note   ", "unchecked": "UNCHECKED"}


def _options(args: argparse.Namespace) -> dict[str, str]:
    options: dict[str, str] = {}
    for item in args.option:
        key, sep, value = item.partition("=")
        if not sep or not key:
            from eos_core.errors import ConfigError

            raise ConfigError(f"spark-eos doctor: -o {item!r}: give KEY=VALUE (e.g. -o subscribe=orders)", option="-o")
        options[key] = value
    if args.bootstrap:
        options.setdefault("kafka.bootstrap.servers", args.bootstrap)
    if args.dsn:
        options.setdefault("dsn", args.dsn)
    return options


def _run(args: argparse.Namespace) -> int:
    from connectors.doctor import check
    from eos_core.kafka_config import client_settings

    admin = client_settings(args.admin_config) if args.admin_config else None
    found = check(args.connector, _options(args), kafka=client_settings(), admin=admin)
    if args.json:
        print(json.dumps([f.__dict__ for f in found], indent=2))
    else:
        for f in found:
            print(f"{_MARK[f.status]}  {f.what}" + (f"  ({f.detail})" if f.detail else ""))
            if f.fix:
                print(f"           fix: {f.fix}")
        missing = sum(f.status in ("missing", "unchecked") for f in found)
        print(f"{len(found)} checked, {missing} missing or unchecked", file=sys.stderr)
    return 1 if any(f.status in ("missing", "unchecked") for f in found) else 0


def _add(sub: Any) -> None:
    from connectors.doctor import CONNECTORS

    p = sub.add_parser(
        "doctor",
        help="check that a connector's principal and role hold what it needs (ACLs, grants, settings)",
        description="Check that the principal and the role of a connector's options hold every ACL and "
        "privilege the connector declares for them (docs/security.md), and the settings exactly-once needs; "
        "print each missing one with the command that grants or sets it. Exit 1 when one is missing.",
    )
    p.add_argument(
        "connector", choices=CONNECTORS, help="the connector (kafka-eos-sink: the kafka-eos format's writes)"
    )
    p.add_argument("-o", "--option", action="append", default=[], metavar="KEY=VALUE", help="an option of it")
    p.add_argument("--bootstrap", default=os.environ.get("EOS_KAFKA_BOOTSTRAP"), help="kafka.bootstrap.servers")
    p.add_argument("--dsn", default=os.environ.get("EOS_POSTGRES_DSN"), help="the Postgres sinks' dsn (as the role)")
    p.add_argument(
        "--admin-config",
        metavar="FILE",
        help="a Kafka client properties file of a principal that may describe the cluster's ACLs and configs "
        "(when the connector's own may not)",
    )
    p.add_argument("--json", action="store_true", help="the findings as JSON")
    p.set_defaults(func=_run)


def add_subparser(sub: Any) -> None:
    _add(sub)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="spark-eos")
    _add(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["doctor", *(argv or sys.argv[1:])])
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
