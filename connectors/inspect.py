"""``spark-eos inspect``: what a streaming checkpoint holds, and the two-phase sink's view of it.

Reads Spark's checkpoint layout directly (no Spark needed): ``metadata`` (query id), ``offsets/n``
(the write-ahead log: batch metadata, then one line per source with its end offsets, the source's
operator state), ``commits/n`` (batch n completed), ``state/<op>/<partition>/`` (state store
files: ``<version>.zip``/``.changelog`` for RocksDB, ``.delta``/``.snapshot`` for the HDFS-backed
store). With a DSN it adds the sink's decision log (``eos.sink_batches``) and prepared gids.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

from eos_core.checkpoint import STATE_FILE, numbered, read_log_file
from eos_core.conninfo import check_conninfo
from eos_core.errors import ConfigError

__all__ = ["inspect", "read_log_file", "render"]


def _state(checkpoint: str) -> dict[str, Any]:
    root = os.path.join(checkpoint, "state")
    operators: list[dict[str, Any]] = []
    for op in numbered(root):
        op_dir = os.path.join(root, str(op))
        parts = numbered(op_dir)
        versions: set[int] = set()
        kinds: set[str] = set()
        snapshots: set[int] = set()
        for p in parts:
            for name in os.listdir(os.path.join(op_dir, str(p))):
                m = STATE_FILE.match(name)
                if m:
                    versions.add(int(m.group(1)))
                    kinds.add(m.group(2))
                    if m.group(2) in ("zip", "snapshot"):
                        snapshots.add(int(m.group(1)))
        operators.append(
            {
                "operator": op,
                "partitions": len(parts),
                "versions": [min(versions), max(versions)] if versions else [],
                "snapshot_versions": sorted(snapshots)[-5:],
                "files": sorted(kinds),
                "changelog": "changelog" in kinds,
            }
        )
    return {"operators": operators}


def inspect(
    checkpoint: str, *, dsn: str | None = None, sink_id: str | None = None, eos_schema: str = "eos"
) -> dict[str, Any]:
    """Everything ``spark-eos inspect`` shows, as a JSON-able dict."""
    if not os.path.isdir(checkpoint):
        what = "is not a directory" if os.path.exists(checkpoint) else "does not exist"
        raise ConfigError(
            f"inspect: checkpoint {checkpoint!r} {what}; give the query's checkpoint directory "
            "(its checkpointLocation, the one holding offsets/ and commits/)",
            option="CHECKPOINT",
        )
    if not os.path.isdir(os.path.join(checkpoint, "offsets")):
        raise ConfigError(
            f"inspect: {checkpoint!r} is not a streaming checkpoint (no offsets/ directory); give the query's "
            "checkpointLocation",
            option="CHECKPOINT",
        )
    if dsn:
        check_conninfo(dsn, option="--dsn", context="inspect")
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", eos_schema):
        raise ConfigError(
            f"inspect: --eos-schema {eos_schema!r} is not a plain identifier (letters, digits, _)",
            option="--eos-schema",
        )
    info: dict[str, Any] = {"checkpoint": os.path.abspath(checkpoint)}
    meta = os.path.join(checkpoint, "metadata")
    if os.path.exists(meta):
        with open(meta, encoding="utf-8") as fh:
            info["query_id"] = json.loads(fh.read().strip() or "{}").get("id")
    commits = set(numbered(os.path.join(checkpoint, "commits")))
    batches = []
    provider = None
    conf: dict[str, Any] = {}
    for n in numbered(os.path.join(checkpoint, "offsets")):
        try:
            _, lines = read_log_file(os.path.join(checkpoint, "offsets", str(n)))
            head = json.loads(lines[0]) if lines else {}
            sources = [json.loads(x) if x.strip() not in ("", "-") else None for x in lines[1:]]
        except (ValueError, IndexError) as exc:
            batches.append({"batch": n, "error": f"unreadable offsets/{n}: {exc}", "committed": n in commits})
            continue
        conf = head.get("conf", conf)
        provider = conf.get("spark.sql.streaming.stateStore.providerClass", provider)
        batches.append(
            {
                "batch": n,
                "committed": n in commits,
                "timestamp_ms": head.get("batchTimestampMs"),
                "sources": sources,
            }
        )
    info["batches"] = batches
    info["last_planned"] = batches[-1]["batch"] if batches else None
    info["last_committed"] = max(commits) if commits else None
    info["uncommitted"] = [b["batch"] for b in batches if not b["committed"]]
    info["state_store"] = {
        "provider": provider,
        **_state(checkpoint),
        "changelog_checkpointing": conf.get("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled"),
    }
    if dsn:
        info["sink"] = _sink(dsn, sink_id, eos_schema)
    return info


def _sink(dsn: str, sink_id: str | None, schema: str) -> dict[str, Any]:
    import psycopg

    out: dict[str, Any] = {"decisions": [], "in_doubt": []}
    with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
        exists = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (f"{schema}.sink_batches",)).fetchone()
        if exists and exists[0]:
            rows = conn.execute(
                f"SELECT sink_id, batch_id, cardinality(gids), decided_at FROM {schema}.sink_batches "
                "WHERE %s::text IS NULL OR sink_id = %s ORDER BY sink_id, batch_id DESC LIMIT 200",
                (sink_id, sink_id),
            ).fetchall()
            out["decisions"] = [{"sink_id": r[0], "batch": r[1], "gids": r[2], "decided_at": str(r[3])} for r in rows]
        from sinks.postgres.twophase.gid import GID_PREFIX, sink_prefix

        prefix = sink_prefix(sink_id) if sink_id else f"{GID_PREFIX}:"  # the sink's exact (escaped) prefix
        rows = conn.execute(
            "SELECT gid, prepared, now() - prepared FROM pg_prepared_xacts WHERE starts_with(gid, %s) "
            "AND database = current_database() ORDER BY prepared",
            (prefix,),
        ).fetchall()
        out["in_doubt"] = [{"gid": r[0], "prepared": str(r[1]), "age": str(r[2])} for r in rows]
    return out


def _table(rows: list[tuple[Any, ...]]) -> str:
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(f"{c!s:<{w}}" for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def render(info: dict[str, Any], *, as_json: bool = False, last: int = 20) -> str:
    """The report as JSON or as readable tables (the last ``last`` batches)."""
    if as_json:
        return json.dumps(info, indent=2, sort_keys=True, default=str)
    out = [
        f"checkpoint  {info['checkpoint']}",
        f"query id    {info.get('query_id')}",
        f"batches     planned up to {info['last_planned']}, committed up to {info['last_committed']}"
        + (f", uncommitted {info['uncommitted']} (replayed on restart)" if info["uncommitted"] else ""),
    ]
    rows: list[tuple[Any, ...]] = [("batch", "commit", "source offsets (operator state)")]
    for b in info["batches"][-last:]:
        offsets = b.get("error") or "; ".join(json.dumps(s, sort_keys=True) for s in b["sources"] if s is not None)
        rows.append((b["batch"], "yes" if b["committed"] else "NO", offsets[:150]))
    out += ["", _table(rows)]
    st = info["state_store"]
    out += [
        "",
        f"state store {st['provider'] or '(none: stateless query)'}"
        + (f"; changelog checkpointing {st['changelog_checkpointing']}" if st.get("changelog_checkpointing") else ""),
    ]
    for op in st["operators"]:
        out.append(
            f"  operator {op['operator']}: {op['partitions']} partitions, versions {op['versions']}, "
            f"files {','.join(op['files'])}, snapshots {op['snapshot_versions']}"
        )
    sink = info.get("sink")
    if sink is not None:
        out += ["", "sink decision log (latest first)"]
        if sink["decisions"]:
            out.append(
                _table(
                    [("sink", "batch", "gids", "decided at")]
                    + [(d["sink_id"], d["batch"], d["gids"], d["decided_at"]) for d in sink["decisions"][:last]]
                )
            )
        else:
            out.append("  (no decisions)")
        out.append(f"in-doubt prepared transactions: {len(sink['in_doubt'])}")
        out += [f"  {d['gid']}  prepared {d['prepared']}  age {d['age']}" for d in sink["in_doubt"]]
    return "\n".join(out)
