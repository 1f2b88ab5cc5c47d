"""Reading a Spark streaming checkpoint: its query id and what batch n planned (``offsets/n``).

A sink binds each decision to the batch's *lineage*: a digest of the source offsets Spark wrote
to ``offsets/n`` before running batch n. A crash replay re-reads that file, so its lineage is the
same; an older savepoint restored (or a checkpoint swapped) plans batch n anew, so its lineage
differs, and a sink that decided batch n before can tell the two apart instead of skipping it.

Locations: local paths and ``file:`` URIs are read directly; any other scheme (``hdfs://``,
``s3a://``, ``gs://``, ``abfs://``, ...) goes through ``pyarrow.fs`` (``s3a``/``s3n`` map to
``s3``), which takes its credentials from the environment (``AWS_*``, ``GOOGLE_*``, the Hadoop
client configuration for HDFS), not from Spark's Hadoop configuration.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlparse

from eos_core.errors import ConfigError, FatalError

__all__ = [
    "STATE_FILE",
    "Lineage",
    "batch_lineage",
    "display",
    "last_planned",
    "numbered",
    "planned_lineage",
    "query_id",
    "read_log_file",
]

_SCHEME_ALIASES = {"s3a": "s3", "s3n": "s3", "gcs": "gs"}


@dataclass(frozen=True)
class Lineage:
    """What identifies batch ``batch`` in one checkpoint lineage: a digest of its source offsets."""

    batch: int
    digest: str  # sha256 of the offsets/n source lines, 32 hex characters
    sources: str  # the source lines themselves (shortened), for error messages

    def __str__(self) -> str:
        return f"batch {self.batch} planned as {self.sources} (lineage {self.digest[:12]})"


def display(location: str | None) -> str | None:
    """The location as it may appear in messages and the decision log: no user info, no query string
    (``s3://KEY:SECRET@bucket``, SAS tokens)."""
    if location is None:
        return None
    parsed = urlparse(location)
    if not parsed.scheme or len(parsed.scheme) == 1:
        return location
    netloc = parsed.netloc.rsplit("@", 1)[-1]
    return parsed._replace(netloc=netloc, query="", params="", fragment="").geturl()


def _local(location: str) -> str | None:
    parsed = urlparse(location)
    if parsed.scheme in ("", "file") or (len(parsed.scheme) == 1 and os.name == "nt"):
        return unquote(parsed.path) if parsed.scheme == "file" else location
    if parsed.scheme == "dbfs":  # Databricks mounts DBFS at /dbfs on every node
        return "/dbfs/" + (parsed.netloc + parsed.path).lstrip("/")
    return None


def _remote_fs(location: str) -> tuple[Any, str]:
    try:
        from pyarrow import fs as pafs
    except ImportError as exc:  # pragma: no cover - pyarrow is a dependency
        raise ConfigError(f"checkpoint {location!r}: reading it needs pyarrow", option="checkpointLocation") from exc
    parsed = urlparse(location)
    scheme = _SCHEME_ALIASES.get(parsed.scheme, parsed.scheme)
    uri = location.replace(parsed.scheme + "://", scheme + "://", 1)
    try:
        filesystem, path = pafs.FileSystem.from_uri(uri)
    except Exception as exc:
        raise ConfigError(
            f"checkpoint location {display(location)!r} (option 'checkpointLocation'): cannot open its filesystem "
            f"from Python ({type(exc).__name__}); the sink reads offsets/<batch> to bind each decision to its "
            "batch. Make the scheme reachable through pyarrow.fs (HDFS: libhdfs and the Hadoop client "
            "configuration; S3: AWS credentials in the environment), or use a checkpoint location on a "
            "filesystem both can reach",
            option="checkpointLocation",
        ) from None
    return filesystem, path


def _read_text(location: str, *parts: str) -> str | None:
    """The file under ``location`` as text, or None when it does not exist."""
    local = _local(location)
    if local is not None:
        try:
            with open(os.path.join(local, *parts), encoding="utf-8") as fh:
                return fh.read()
        except FileNotFoundError:
            return None
    filesystem, base = _remote_fs(location)
    path = "/".join([base.rstrip("/"), *parts])
    try:
        with filesystem.open_input_stream(path) as fh:
            return bytes(fh.read()).decode("utf-8")
    except FileNotFoundError:
        return None
    except OSError as exc:
        if "not found" in str(exc).lower() or "no such file" in str(exc).lower():
            return None
        raise


def _names(location: str, directory: str) -> list[str]:
    local = _local(location)
    if local is not None:
        try:
            return os.listdir(os.path.join(local, directory))
        except FileNotFoundError:
            return []
    from pyarrow import fs as pafs

    filesystem, base = _remote_fs(location)
    infos = filesystem.get_file_info(pafs.FileSelector(base.rstrip("/") + "/" + directory, allow_not_found=True))
    return [i.base_name for i in infos]


def numbered(location: str, directory: str = "") -> list[int]:
    """The numbered entries (``offsets/<n>``, ``commits/<n>``, state versions) of a directory, sorted;
    [] when it does not exist."""
    return sorted(int(n) for n in _names(location, directory) if n.isdigit())


STATE_FILE = re.compile(r"^(\d+)\.(zip|changelog|delta|snapshot)$")
"""A state store file of version n (HDFS-backed: delta/snapshot; RocksDB: zip/changelog)."""


def _file_source_batch(location: str, source: int, log_offset: int) -> list[str]:
    """The files Spark's file source took into batch ``log_offset`` (its ``sources/<i>/`` metadata log,
    compacted every few batches into ``<k>.compact`` holding the entries of every batch up to k)."""
    directory = f"sources/{source}"
    text = _read_text(location, directory, str(log_offset))
    entries: list[str] = []
    if text is not None:
        entries = text.splitlines()[1:]
    else:
        compacts = sorted(
            int(n.split(".")[0]) for n in _names(location, directory) if n.endswith(".compact") and n[:-8].isdigit()
        )
        for k in (k for k in compacts if k >= log_offset):
            body = _read_text(location, directory, f"{k}.compact")
            if body is not None:
                entries = [e for e in body.splitlines()[1:] if _batch_of(e) == log_offset]
                break
    return sorted(_canonical(e) for e in entries if e.strip())


def _batch_of(entry: str) -> int | None:
    try:
        value = json.loads(entry).get("batchId")
    except (ValueError, AttributeError):
        return None
    return int(value) if isinstance(value, int) else None


def read_log_file(path: str) -> tuple[str, list[str]]:
    """A checkpoint log file on a local path: its version line (``v1``) and the following lines."""
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    return _split_log(text, path)


def _split_log(text: str, where: str) -> tuple[str, list[str]]:
    lines = text.splitlines()
    if not lines or not lines[0].startswith("v"):
        raise ValueError(f"{where}: not a Spark checkpoint log file (no version line)")
    return lines[0], lines[1:]


def last_planned(location: str) -> int | None:
    """The highest batch number in ``offsets/``, or None for a checkpoint that planned nothing yet."""
    numbers = numbered(location, "offsets")
    return numbers[-1] if numbers else None


def batch_lineage(location: str, batch: int) -> Lineage:
    """The lineage of ``batch``: Spark wrote ``offsets/<batch>`` before running it, so it must exist."""
    text = _read_text(location, "offsets", str(batch))
    if text is None:
        raise FatalError(
            f"checkpoint {display(location)!r} has no offsets/{batch} although Spark is running batch {batch}: the "
            "sink's option 'checkpointLocation' must be the query's own checkpoint location (pass it with "
            "writeStream.option('checkpointLocation', ...), not only as spark.sql.streaming.checkpointLocation)",
            option="checkpointLocation",
        )
    _, lines = _split_log(text, f"{display(location)}/offsets/{batch}")
    # Line 1 is batch metadata (timestamp, watermark, conf): it changes when a batch is re-planned
    # with the same offsets, which is still the same input. Only the source lines identify it.
    sources = [_canonical(line) for line in lines[1:]]
    joined = "\n".join(sources)
    identity = [joined]
    for i, line in enumerate(sources):
        # Spark's file source logs only a counter ({"logOffset": n}) in offsets/n; what the batch
        # read is the file list of its own log entry, which differs when a batch is planned anew.
        offset = _log_offset(line)
        if offset is not None:
            identity.extend(_file_source_batch(location, i, offset))
    digest = hashlib.sha256("\n".join(identity).encode("utf-8")).hexdigest()[:32]
    shown = joined if len(joined) <= 160 else joined[:157] + "..."
    return Lineage(batch, digest, shown)


def planned_lineage(location: str, batch_id: int | None, *, context: str) -> Lineage:
    """The lineage of ``batch_id``, or of the batch Spark planned last when None: a sink's writer is built
    on the driver after Spark wrote ``offsets/<n>`` for the batch it runs. ConfigError naming
    ``checkpointLocation`` when the location has no ``offsets/``."""
    batch = batch_id if batch_id is not None else last_planned(location)
    if batch is None:
        raise ConfigError(
            f"{context}: no offsets/ under the checkpoint location {display(location)!r} (option "
            "'checkpointLocation'), although Spark plans each batch there before it builds the sink's writer: this "
            "is not the location Spark uses, or the sink cannot reach it from Python. A path without a scheme is "
            "read as a local path; Spark resolves it against fs.defaultFS (HDFS on YARN), so give the full URI "
            "(hdfs://..., s3a://...)",
            option="checkpointLocation",
        )
    return batch_lineage(location, batch)


def _log_offset(line: str) -> int | None:
    try:
        value = json.loads(line)
    except ValueError:
        return None
    if isinstance(value, dict) and set(value) == {"logOffset"} and isinstance(value["logOffset"], int):
        return int(value["logOffset"])
    return None


def _canonical(line: str) -> str:
    text = line.strip()
    try:
        return json.dumps(json.loads(text), sort_keys=True, separators=(",", ":"))
    except ValueError:
        return text  # "-" (a source with no offset yet) or a source's own non-JSON format


def query_id(location: str) -> str | None:
    """The query id Spark keeps in ``metadata`` (stable across restarts of one checkpoint)."""
    text = _read_text(location, "metadata")
    if not text:
        return None
    try:
        value = json.loads(text.strip().splitlines()[0]).get("id")
    except (ValueError, IndexError, AttributeError):
        return None
    return str(value) if value else None
