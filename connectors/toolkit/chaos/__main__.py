"""``python -m connectors.toolkit.chaos``: the ``spark-eos chaos`` command."""

import sys

from connectors.toolkit.chaos.cli import main

sys.exit(main())
