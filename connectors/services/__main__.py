"""``python -m connectors.services up|down|status|env`` (the same as ``spark-eos services``)."""

from __future__ import annotations

import sys

from connectors.services.manage import main

if __name__ == "__main__":
    sys.exit(main())
