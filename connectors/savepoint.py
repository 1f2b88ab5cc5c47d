"""Savepoints: a retained, consistent copy of a stopped query's checkpoint, and putting it back.

``create`` copies ``metadata``, ``sources/``, ``commits/0..c`` (c = last committed batch), the
write-ahead log ``offsets/0..p`` (p = last planned batch: a planned batch must replay with the same
offsets, since a two-phase sink may already hold its decision) and the state store files up to
version p + 1, then writes ``_savepoint.json`` (a manifest with every file's size); ``batch=b``: as of
committed batch b (c = b, p = b + 1), to replay the later batches (a database that lost them: the
2PC sink's refusal names b). ``restore``
checks the manifest and copies the savepoint into a new or empty checkpoint directory. Trigger
interval, cluster and parallelism of the restored query may change; the query's shape may not.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from typing import Any

from eos_core.checkpoint import STATE_FILE, numbered

__all__ = ["MANIFEST", "create", "moved_on", "restore"]

MANIFEST = "_savepoint.json"


def _keep(rel: str, last_commit: int, last_planned: int) -> bool:
    parts = rel.split(os.sep)
    name = parts[-1]
    if name.endswith(".crc") or (name.startswith(".") and name.endswith(".tmp")):
        return False  # Hadoop checksum and temp files: Spark rewrites/ignores them
    top = parts[0]
    if top in ("offsets", "commits") and len(parts) == 2:
        if not name.isdigit():
            return False
        return int(name) <= (last_commit if top == "commits" else last_planned)
    if top == "state":
        m = STATE_FILE.match(name)
        return m is None or int(m.group(1)) <= last_planned + 1
    return True


def create(checkpoint: str, dest: str, *, force: bool = False, batch: int | None = None) -> dict[str, Any]:
    """Copy ``checkpoint`` to ``dest`` up to its last committed batch, or as of committed ``batch`` (the
    later batches replay from the savepoint: batch + 1 with its planned offsets); returns the manifest."""
    if not os.path.isdir(os.path.join(checkpoint, "commits")):
        raise ValueError(f"{checkpoint!r} is not a streaming checkpoint with committed batches (no commits/)")
    commits = numbered(os.path.join(checkpoint, "commits"))
    offsets = numbered(os.path.join(checkpoint, "offsets"))
    if not commits:
        raise ValueError(f"{checkpoint!r} has no committed batch yet; run the query until one batch commits")
    last_commit = commits[-1]
    last_planned = max([last_commit, *offsets])
    if batch is not None:
        if batch not in commits or batch not in offsets:
            raise ValueError(
                f"--batch {batch}: {checkpoint!r} keeps committed batches {commits[0]}..{last_commit}; a savepoint "
                "as of a batch needs that batch's commit and offsets (Spark keeps the last "
                "spark.sql.streaming.minBatchesToRetain, 100 by default)"
            )
        last_commit, last_planned = batch, min(batch + 1, last_planned)
    if os.path.exists(dest):
        if not force:
            raise FileExistsError(f"savepoint destination {dest!r} exists; pass --force to replace it")
        shutil.rmtree(dest)
    tmp = f"{dest}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    files: dict[str, int] = {}
    for root, _dirs, names in os.walk(checkpoint):
        for name in names:
            src = os.path.join(root, name)
            rel = os.path.relpath(src, checkpoint)
            if not _keep(rel, last_commit, last_planned):
                continue
            target = os.path.join(tmp, rel)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            shutil.copy2(src, target)
            files[rel] = os.path.getsize(target)
    manifest = {
        "source": os.path.abspath(checkpoint),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "last_commit": last_commit,
        "last_planned": last_planned,
        **({"as_of_batch": batch} if batch is not None else {}),
        "files": len(files),
        "bytes": sum(files.values()),
        "sizes": files,
    }
    with open(os.path.join(tmp, MANIFEST), "w", encoding="utf-8") as fh:
        json.dump(manifest, fh, indent=1, sort_keys=True)
    os.replace(tmp, dest)  # the savepoint appears complete or not at all
    return manifest


def restore(savepoint: str, checkpoint: str, *, force: bool = False) -> dict[str, Any]:
    """Copy a savepoint into ``checkpoint`` (new or empty, or replaced with ``force``); returns its manifest."""
    path = os.path.join(savepoint, MANIFEST)
    if not os.path.exists(path):
        raise ValueError(
            f"{savepoint!r} is not a spark-eos savepoint (no {MANIFEST}); make one with 'savepoint create'"
        )
    with open(path, encoding="utf-8") as fh:
        manifest: dict[str, Any] = json.load(fh)
    for rel, size in manifest["sizes"].items():
        got = os.path.join(savepoint, rel)
        if not os.path.exists(got) or os.path.getsize(got) != size:
            raise ValueError(f"savepoint {savepoint!r} is damaged: {rel} missing or not {size} bytes")
    if os.path.exists(checkpoint) and os.listdir(checkpoint):
        if not force:
            raise FileExistsError(
                f"checkpoint {checkpoint!r} exists and is not empty; restore into a new directory or pass --force"
            )
        shutil.rmtree(checkpoint)
    tmp = f"{checkpoint.rstrip(os.sep)}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(savepoint, tmp, ignore=shutil.ignore_patterns(MANIFEST))
    if os.path.exists(checkpoint):
        os.rmdir(checkpoint)
    os.replace(tmp, checkpoint)
    warning = moved_on(manifest)
    if warning:
        manifest["warning"] = warning
    return manifest


def moved_on(manifest: dict[str, Any]) -> str | None:
    """A warning when the checkpoint the savepoint was taken from went on past it (an older savepoint)."""
    source = manifest.get("source")
    if "as_of_batch" in manifest:
        return None  # taken as of a batch on purpose (batches a database lost, replayed); a 2PC sink checks still
    if not source or not os.path.isdir(os.path.join(source, "commits")):
        return None
    commits = numbered(os.path.join(source, "commits"))
    last = manifest["last_commit"]
    if not commits or commits[-1] <= last:
        return None
    return (
        f"this savepoint ends at batch {last}, but the checkpoint it was taken from ({source}) has committed up to "
        f"batch {commits[-1]} since. A postgres-2pc sink of that query has decided those batches, so the restored "
        "query will be refused before it writes anything (its batches would be numbered again with other offsets). "
        "Restore the latest savepoint instead; or give the restored query a new 'sink.id' and a new or emptied "
        "table; or rewind the sink (delete the rows of the later batches, then `spark-eos sinks release`). "
        "postgres-upsert needs nothing: its version guard makes the replay idempotent"
    )
