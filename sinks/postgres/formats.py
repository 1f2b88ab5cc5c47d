"""The Postgres sinks' format names: a leaf every module of theirs imports, the data sources' among them."""

from __future__ import annotations

__all__ = ["TWOPC", "UPSERT"]

TWOPC = "postgres-2pc"
UPSERT = "postgres-upsert"
