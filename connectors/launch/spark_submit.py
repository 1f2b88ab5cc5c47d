"""The file to give ``spark-submit`` to run a spark-eos command as its driver (client mode)::

    spark-submit --master spark://host:7077 --archives eos-env.zip#environment \\
        "$(spark-eos submit-file)" run ledger --config ledger.yaml

``spark-submit`` runs a file, not a module, and puts the file's directory first on ``sys.path``;
this directory holds nothing that could shadow a module of the standard library there (the
package's own ``connectors/inspect.py`` would). See docs/deployment.md.
"""

from __future__ import annotations

import sys

from connectors.cli import main

if __name__ == "__main__":
    sys.exit(main())
