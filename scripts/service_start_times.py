"""Start time of each embedded service (Apache Kafka, tansu, PostgreSQL), measured N times: `python scripts/service_start_times.py`."""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from connectors.services.apache_kafka import ApacheKafka
from connectors.services.embedded_kafka import EmbeddedKafka
from connectors.services.embedded_postgres import EmbeddedPostgres

__all__ = ["main"]


def _measure(runs: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {
        "kafka (apache) new+start": [],
        "kafka (apache) restart": [],
        "kafka (apache) after crash": [],
        "kafka (tansu) start": [],
        "postgres initdb+start": [],
        "postgres crash recovery": [],
    }
    for _ in range(runs):
        t = time.monotonic()
        with ApacheKafka() as a:  # format + start; the jars are fetched before the first run
            out["kafka (apache) new+start"].append(time.monotonic() - t)
            a.restart()  # clean stop, then start(): start_seconds is the start alone
            out["kafka (apache) restart"].append(a.start_seconds)
            a.crash()
            t = time.monotonic()
            a.start()
            out["kafka (apache) after crash"].append(time.monotonic() - t)
        with EmbeddedKafka() as k:
            out["kafka (tansu) start"].append(k.start_seconds)
        with EmbeddedPostgres() as p:
            out["postgres initdb+start"].append(p.start_seconds)
            p.crash()
            t = time.monotonic()
            p.start()
            out["postgres crash recovery"].append(time.monotonic() - t)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=3, help="starts per service (default 3)")
    args = parser.parse_args(argv)
    from connectors.services.apache_kafka import resolve_jars

    resolve_jars()  # a first fetch is not a start
    results = _measure(args.runs)
    print(
        f"{'service':<26}{'median s':>10}{'min s':>8}{'max s':>8}   (until the health check passes; {args.runs} runs)"
    )
    for name, values in results.items():
        print(f"{name:<26}{statistics.median(values):>10.2f}{min(values):>8.2f}{max(values):>8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
