"""Run every benchmark in quick mode: ``python -m bench`` (pass --full for full sizes)."""

from __future__ import annotations

import importlib
import pkgutil
import sys

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    full = "--full" in args
    import bench

    failed = []
    for mod in sorted(m.name for m in pkgutil.iter_modules(bench.__path__) if not m.name.startswith("_")):
        print(f"\n=== bench.{mod} {'(full)' if full else '--quick'} ===", flush=True)
        try:
            rc = importlib.import_module(f"bench.{mod}").main([] if full else ["--quick"])
        except Exception as exc:  # one failing bench must not hide the others' figures
            print(f"bench.{mod} failed: {exc!r}", flush=True)
            rc = 1
        if rc:
            failed.append(mod)
    if failed:
        print(f"\nfailed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
