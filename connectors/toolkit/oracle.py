"""The reference-run oracle: a chaos run's final table against the same job run without faults.

The chaos loop (``connectors.toolkit.chaos``, ``--oracle``) runs the user's job once more, on the
same topic(s), with ``availableNow``, a fresh checkpoint and no fault, into a reference table
(``<table>_ref1``), and a second time into ``<table>_ref2``. This module compares tables:

- ``append``: the rows as multisets (a row twice in one and once in the other is a difference);
- ``upsert``: by ``key`` (each key once on both sides; missing keys, extra keys, changed rows).

``ignore`` names columns allowed to differ (processing time, run ids); they are left out. Float and
Decimal values compare within ``tolerance`` (relative and absolute, ``math.isclose``); everything
else compares exactly. In ``append`` mode rows are grouped by their exact columns, and within a group
the numeric columns are matched in sorted order.

``judge`` first compares the two reference runs with the same rules: when two fault-free runs of the
job disagree, the job is non-deterministic in a way the comparison cannot absorb and the verdict is
"cannot judge" (``Check`` ``oracle.reference_deterministic`` failed, ``undecided`` set), never a pass.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any

from connectors.toolkit.checker import Check, Report

__all__ = ["CANNOT_JUDGE", "MODES", "compare", "differences", "judge", "parse_mode"]

MODES = ("append", "upsert")
CANNOT_JUDGE = "CANNOT JUDGE"
_SAMPLE = 5  # differing rows shown per kind

Row = Mapping[str, Any]


def parse_mode(spec: str, *, option: str = "--oracle") -> tuple[str, tuple[str, ...]]:
    """``append`` or ``upsert:col1,col2`` -> (mode, key columns). A bad spec names ``option``."""
    mode, _, cols = spec.partition(":")
    key = tuple(c.strip() for c in cols.split(",") if c.strip())
    if mode not in MODES:
        raise ValueError(f"{option} {spec!r}: expected append or upsert:KEY[,KEY...]")
    if mode == "upsert" and not key:
        raise ValueError(f"{option} {spec!r}: upsert needs the key columns, e.g. upsert:window_start,sensor")
    if mode == "append" and key:
        raise ValueError(f"{option} {spec!r}: append compares whole rows as multisets and takes no key")
    return mode, key


def _numeric(v: Any) -> bool:
    return isinstance(v, (float, Decimal)) and not isinstance(v, bool)


def _close(a: Any, b: Any, tolerance: float) -> bool:
    if _numeric(a) and _numeric(b):
        fa, fb = float(a), float(b)
        if math.isnan(fa) or math.isnan(fb):
            return math.isnan(fa) and math.isnan(fb)
        return a == b or math.isclose(fa, fb, rel_tol=tolerance, abs_tol=tolerance)
    return bool(a == b)


def _rows_equal(a: Row, b: Row, columns: Sequence[str], tolerance: float) -> list[str]:
    """The columns on which ``a`` and ``b`` differ."""
    return [c for c in columns if not _close(a.get(c), b.get(c), tolerance)]


def _hashable(v: Any) -> Any:
    if isinstance(v, dict):
        return tuple(sorted((k, _hashable(x)) for k, x in v.items()))
    if isinstance(v, (list, tuple)):
        return tuple(_hashable(x) for x in v)
    return v


def _show(row: Row | None, columns: Sequence[str]) -> str:
    if row is None:
        return "(none)"
    return "{" + ", ".join(f"{c}={row.get(c)!r}" for c in columns) + "}"


def _columns(got: Sequence[Row], want: Sequence[Row], ignore: Sequence[str], name: str) -> list[str]:
    cols_got = {c for r in got for c in r}
    cols_want = {c for r in want for c in r}
    if got and want and cols_got != cols_want:
        raise ValueError(
            f"{name}: the tables have different columns (only in the run: {sorted(cols_got - cols_want)}, "
            f"only in the reference: {sorted(cols_want - cols_got)}); pass them in ignore= / --ignore-columns "
            "if they may differ"
        )
    return sorted((cols_got | cols_want) - set(ignore))


def compare(
    got: Sequence[Row],
    want: Sequence[Row],
    *,
    mode: str,
    key: Sequence[str] = (),
    tolerance: float = 0.0,
    ignore: Sequence[str] = (),
    name: str = "oracle.table",
    what: tuple[str, str] = ("the chaos run", "the reference run"),
) -> Check:
    """One Check: ``got`` (e.g. the chaos run's rows) against ``want`` (the reference run's)."""
    if mode not in MODES:
        raise ValueError(f"mode {mode!r}: expected one of {', '.join(MODES)}")
    if tolerance < 0:
        raise ValueError(f"tolerance {tolerance!r}: must be >= 0")
    columns = _columns(got, want, ignore, name)
    missing_key = [k for k in key if k not in columns]
    if missing_key:
        raise ValueError(f"key column(s) {missing_key} are not in the table (columns: {columns})")
    if mode == "upsert":
        if not key:
            raise ValueError("upsert compares by key: name the key column(s)")
        return _by_key(got, want, key, columns, tolerance, name, what)
    return _multiset(got, want, columns, tolerance, name, what)


def _index(rows: Sequence[Row], key: Sequence[str]) -> tuple[dict[Any, Row], list[Any]]:
    out: dict[Any, Row] = {}
    dups = []
    for r in rows:
        k = tuple(_hashable(r.get(c)) for c in key)
        if k in out:
            dups.append(k)
        out[k] = r
    return out, dups


def _by_key(
    got: Sequence[Row],
    want: Sequence[Row],
    key: Sequence[str],
    columns: Sequence[str],
    tolerance: float,
    name: str,
    what: tuple[str, str],
) -> Check:
    g, gdup = _index(got, key)
    w, wdup = _index(want, key)
    missing = [k for k in w if k not in g]
    extra = [k for k in g if k not in w]
    changed = [(k, _rows_equal(g[k], w[k], columns, tolerance)) for k in w if k in g]
    changed = [(k, cols) for k, cols in changed if cols]
    ok = not (missing or extra or changed or gdup or wdup)
    summary = (
        f"by key ({', '.join(key)}): {len(missing)} keys missing from {what[0]}, {len(extra)} extra, "
        f"{len(changed)} differ, {len(gdup)} duplicate keys ({len(want)} reference rows, {len(got)} rows)"
    )
    if wdup:
        summary += f"; {what[1]} itself has {len(wdup)} duplicate keys: the key does not identify a row"
    diff = [f"key {k}: {what[0]} {_show(g[k], cols)} vs {what[1]} {_show(w[k], cols)}" for k, cols in changed[:_SAMPLE]]
    return Check(
        name,
        ok,
        summary,
        counts={"missing": len(missing), "extra": len(extra), "differ": len(changed), "duplicate_keys": len(gdup)},
        ids={
            "missing": [list(k) for k in missing[:_SAMPLE]],
            "extra": [list(k) for k in extra[:_SAMPLE]],
            "differ": diff,
            "duplicate_keys": [list(k) for k in gdup[:_SAMPLE]],
        },
    )


def _multiset(
    got: Sequence[Row],
    want: Sequence[Row],
    columns: Sequence[str],
    tolerance: float,
    name: str,
    what: tuple[str, str],
) -> Check:
    loose = [c for c in columns if tolerance > 0 and any(_numeric(r.get(c)) for r in [*got, *want])]
    exact = [c for c in columns if c not in loose]

    def groups(rows: Sequence[Row]) -> dict[Any, list[tuple[Any, ...]]]:
        out: dict[Any, list[tuple[Any, ...]]] = {}
        for r in rows:
            out.setdefault(tuple(_hashable(r.get(c)) for c in exact), []).append(tuple(r.get(c) for c in loose))
        return out

    g, w = groups(got), groups(want)
    missing: Counter[Any] = Counter()
    extra: Counter[Any] = Counter()
    for k in set(g) | set(w):
        gs = sorted(g.get(k, []), key=lambda t: tuple(float(x) if _numeric(x) else math.inf for x in t))
        ws = sorted(w.get(k, []), key=lambda t: tuple(float(x) if _numeric(x) else math.inf for x in t))
        unmatched_w = list(ws)
        for t in gs:
            hit = next(
                (
                    i
                    for i, u in enumerate(unmatched_w)
                    if all(_close(a, b, tolerance) for a, b in zip(t, u, strict=True))
                ),
                None,
            )
            if hit is None:
                extra[(k, t)] += 1
            else:
                unmatched_w.pop(hit)
        for u in unmatched_w:
            missing[(k, u)] += 1

    def show(entry: tuple[Any, Any], n: int) -> str:
        k, t = entry
        row = dict(zip(exact, k, strict=True)) | dict(zip(loose, t, strict=True))
        return _show(row, columns) + (f" x{n}" if n > 1 else "")

    n_missing, n_extra = sum(missing.values()), sum(extra.values())
    ok = not (n_missing or n_extra)
    return Check(
        name,
        ok,
        f"as multisets: {n_missing} reference rows missing from {what[0]}, {n_extra} rows extra "
        f"({len(want)} reference rows, {len(got)} rows)",
        counts={"missing": n_missing, "extra": n_extra},
        ids={
            "missing": [show(e, n) for e, n in list(missing.items())[:_SAMPLE]],
            "extra": [show(e, n) for e, n in list(extra.items())[:_SAMPLE]],
        },
    )


def judge(
    got: Sequence[Row],
    references: Sequence[Sequence[Row]],
    *,
    mode: str,
    key: Sequence[str] = (),
    tolerance: float = 0.0,
    ignore: Sequence[str] = (),
    table: str = "",
) -> Report:
    """The oracle's report: the reference runs agree with each other, then the chaos run with the first.

    With two reference runs that disagree, ``oracle.reference_deterministic`` fails, the report's
    ``info["verdict"]`` is ``CANNOT JUDGE`` and the chaos run is not compared (nothing to compare to).
    """
    if not references:
        raise ValueError("judge needs at least one reference run's rows")
    opts: dict[str, Any] = {"mode": mode, "key": key, "tolerance": tolerance, "ignore": ignore}
    report = Report(info={"oracle": mode + (":" + ",".join(key) if key else ""), "reference_rows": len(references[0])})
    first = references[0]
    for i, other in enumerate(references[1:], start=2):
        check = compare(
            other, first, name="oracle.reference_deterministic", what=(f"reference run {i}", "reference run 1"), **opts
        )
        if not check.ok:
            check.summary = (
                f"{CANNOT_JUDGE}: two fault-free runs of the job differ, so the job is non-deterministic in a way "
                f"the comparison cannot absorb (add the differing columns to --ignore-columns or raise "
                f"--tolerance if they may differ). {check.summary}"
            )
            report.add(check)
            report.info["verdict"] = CANNOT_JUDGE
            return report
        report.add(check)
    if not first:
        report.add(
            Check(
                "oracle.reference_nonempty",
                False,
                f"{CANNOT_JUDGE}: the reference run wrote no row to {table or 'the table'}; an empty oracle proves "
                "nothing (does the job read the run's topic from the earliest offset?)",
            )
        )
        report.info["verdict"] = CANNOT_JUDGE
        return report
    table_check = compare(got, first, name="oracle.table", **opts)
    report.add(table_check)
    if not table_check.ok:  # the report's side-by-side view of the first differing rows
        report.info["oracle_diff"] = differences(got, first, **opts)
    return report


def differences(
    got: Sequence[Row],
    want: Sequence[Row],
    *,
    mode: str,
    key: Sequence[str] = (),
    tolerance: float = 0.0,
    ignore: Sequence[str] = (),
    limit: int = 10,
) -> dict[str, Any]:
    """The first ``limit`` rows where ``got`` (the chaos run) and ``want`` (the reference run) differ, as
    rows to show side by side: ``{"what": "differ"|"missing"|"extra"|"duplicate key", "chaos": row|None,
    "reference": row|None, "differ": [columns]}``, rows limited to the compared columns."""
    columns = _columns(got, want, ignore, "oracle.table")

    def cut(row: Row | None) -> dict[str, Any] | None:
        return None if row is None else {c: row.get(c) for c in columns}

    rows: list[dict[str, Any]] = []
    if mode == "upsert":
        g, gdup = _index(got, key)
        w, _ = _index(want, key)
        for k in w:
            if k not in g:
                rows.append(
                    {"what": "missing", "key": list(k), "chaos": None, "reference": cut(w[k]), "differ": columns}
                )
            else:
                bad = _rows_equal(g[k], w[k], columns, tolerance)
                if bad:
                    rows.append(
                        {"what": "differ", "key": list(k), "chaos": cut(g[k]), "reference": cut(w[k]), "differ": bad}
                    )
        for k in g:
            if k not in w:
                rows.append({"what": "extra", "key": list(k), "chaos": cut(g[k]), "reference": None, "differ": columns})
        for k in gdup:
            rows.append(
                {
                    "what": "duplicate key",
                    "key": list(k),
                    "chaos": cut(g[k]),
                    "reference": cut(w.get(k)),
                    "differ": list(key),
                }
            )
    else:
        unmatched = list(want)
        for row in got:
            hit = next((i for i, u in enumerate(unmatched) if not _rows_equal(row, u, columns, tolerance)), None)
            if hit is None:
                rows.append({"what": "extra", "chaos": cut(row), "reference": None, "differ": columns})
            else:
                unmatched.pop(hit)
        rows += [{"what": "missing", "chaos": None, "reference": cut(u), "differ": columns} for u in unmatched]
    return {
        "mode": mode,
        "key": list(key),
        "tolerance": tolerance,
        "columns": columns,
        "rows": rows[:limit],
        "total": len(rows),
    }
